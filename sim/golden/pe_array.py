"""Golden model of ``hdl/ndp/pe_array.PEArray``: GEMV/GEMM with the RTL's exact order of operations.

``Y[b, n]`` accumulates sequentially in k starting from +0: ``acc_0 = +0``,
``acc_{k+1} = mac(X[b, k], A[k, n], acc_k)`` with :func:`sim.golden.fp16.mac` (product rounded to the
accumulator format, then the add rounded). With ``lanes`` given and ``nb = N / lanes < MIN_NB`` the array
splits K over ``S = min(ceil(MIN_NB / nb), K)`` phases: phase s accumulates the k with ``k mod S == s`` in
the same sequential way, and ``Y = ((p_0 + p_1) + p_2) + ... + p_{S-1}`` (adds in the accumulator format).
Vectorized over (b, k, n) with numpy's IEEE float16/float32 operations (each sequential sum is one
``np.add.accumulate``), so it is bit-exact to the RTL whatever the data (NaNs are canonical, signed zeros follow
IEEE: ``+0 + -0 = +0``).
"""

import numpy as np

from hdl.fp.format import FP16, FP32
from . import fp16
from .bits import as_bits, canonicalize_nan, to_float64

__all__ = ["gemm", "gemv", "to_float64", "accuracy", "phases", "MIN_NB"]

#: The PE array's accumulator loop length (hdl.ndp.pe_array.PEArray.min_nb = 1 + FPMAC latency 7).
MIN_NB = 8


def phases(k: int, n: int, lanes) -> int:
    """K-split phases S of a (K, N) job on a PE array with ``lanes`` lanes (1 when ``lanes`` is None)."""
    if lanes is None:
        return 1
    nb = n // lanes
    return 1 if nb >= MIN_NB else min(-(-MIN_NB // nb), k)


def _acc_dtype(acc):
    if acc not in fp16.ACCUMULATORS:
        raise ValueError(f"acc must be one of {fp16.ACCUMULATORS}, got {acc!r}")
    return np.uint16 if acc == "fp16" else np.uint32


def gemm(x_bits, a_bits, *, acc: str = "fp16", lanes: int | None = None) -> np.ndarray:
    """``Y = X @ A`` on raw bits: X (B, K) uint16, A (K, N) uint16 -> Y (B, N) in the accumulator format.

    Returns uint16 for ``acc="fp16"``, uint32 (binary32 bits) for ``acc="fp32"``. ``lanes``: the PE array's
    lanes (N must be a multiple), which decides the K split for small N (module docstring); None: no split.
    """
    dtype = _acc_dtype(acc)
    x = as_bits(x_bits, FP16, "X")
    a = as_bits(a_bits, FP16, "A")
    if x.ndim != 2 or a.ndim != 2 or x.shape[1] != a.shape[0]:
        raise ValueError(f"shapes do not chain: X{x.shape} @ A{a.shape} (need (B, K) @ (K, N))")
    if lanes is not None and (lanes < 1 or a.shape[1] % lanes):
        raise ValueError(f"N ({a.shape[1]}) must be a positive multiple of lanes ({lanes})")
    S = phases(x.shape[1], a.shape[1], lanes)
    B, K, N = x.shape[0], x.shape[1], a.shape[1]
    # The same IEEE operations as ``fp16.mac`` step by step, vectorized: the products (fp32: exact in binary32;
    # fp16: rounded to binary16, as FPMul), then each phase's sequential sum from +0 as ``np.add.accumulate``
    # (strictly left to right, one rounding per add in the accumulator format). A phase with fewer k is padded
    # with -0, the exact identity of IEEE addition (x + -0 = x for every x, +0 and NaN included). K goes in
    # chunks (the accumulator carried over) so the temporaries stay small. NaN payloads are canonicalized once
    # at the end: a NaN operand always gives a NaN, and no non-NaN result depends on a NaN's payload, so this
    # equals canonicalizing after every operation.
    ftype = np.float16 if acc == "fp16" else np.float32
    steps = -(-K // S) if K else 0
    chunk = max(1, min(steps, (1 << 20) // max(1, B * S * N)))       # k steps per chunk (of S products each)
    with np.errstate(all="ignore"):
        xf = x.view(np.float16).astype(ftype)
        af = a.view(np.float16).astype(ftype)
        carry = np.zeros((B, S, 1, N), dtype=ftype)                 # +0 per phase
        for j0 in range(0, steps, chunk):
            j1 = min(steps, j0 + chunk)
            k0, k1 = j0 * S, min(K, j1 * S)
            terms = np.full((B, j1 - j0, S, N), -0.0, dtype=ftype)
            terms.reshape(B, (j1 - j0) * S, N)[:, :k1 - k0, :] = xf[:, k0:k1, None] * af[None, k0:k1, :]
            terms = np.concatenate([carry, terms.transpose(0, 2, 1, 3)], axis=2)   # (B, S, 1 + steps, N)
            carry = np.add.accumulate(terms, axis=2)[:, :, -1:, :]
        y = carry[:, 0, 0, :]
        for s in range(1, S):
            y = y + carry[:, s, 0, :]                                 # ((p_0 + p_1) + p_2) + ...
    bits = np.ascontiguousarray(y).view(dtype)
    return canonicalize_nan(bits, FP16 if acc == "fp16" else FP32)


def gemv(x_bits, a_bits, *, acc: str = "fp16", lanes: int | None = None) -> np.ndarray:
    """``y = x @ A`` for one input row x (K,) -> (N,)."""
    x = as_bits(x_bits, FP16, "x")
    if x.ndim != 1:
        raise ValueError(f"x must be 1-D (K,), got shape {x.shape}")
    return gemm(x[None, :], a_bits, acc=acc, lanes=lanes)[0]


def accuracy(x_bits, a_bits, *, acc: str = "fp16", y_bits=None) -> dict:
    """Error of the PE array's result against the float64 product of the same FP16 inputs.

    ``y_bits`` defaults to :func:`gemm`'s result. Returns ``max_rel``/``mean_rel`` (``|y - ref| / |ref|``
    over outputs with ``ref != 0``), ``max_norm``/``mean_norm`` (``|y - ref| / sum_k |X[b,k] A[k,n]|``, the
    error relative to the sum's magnitude, which stays meaningful under cancellation), ``nonfinite`` (the
    number of inf/NaN outputs, excluded from the statistics) and ``outputs``.
    """
    x = to_float64(as_bits(x_bits, FP16, "X"))
    a = to_float64(as_bits(a_bits, FP16, "A"))
    y = to_float64(gemm(x_bits, a_bits, acc=acc) if y_bits is None else y_bits)
    ref = x @ a
    scale = np.abs(x) @ np.abs(a)
    ok = np.isfinite(y) & np.isfinite(ref)
    err = np.abs(y - ref)
    nz = ok & (ref != 0)
    rel = err[nz] / np.abs(ref[nz])
    pos = ok & (scale != 0)
    norm = err[pos] / scale[pos]
    stat = lambda v, f: float(f(v)) if v.size else 0.0  # noqa: E731
    return {
        "acc": acc, "outputs": int(y.size), "nonfinite": int((~ok).sum()),
        "max_rel": stat(rel, np.max), "mean_rel": stat(rel, np.mean),
        "max_norm": stat(norm, np.max), "mean_norm": stat(norm, np.mean),
    }
