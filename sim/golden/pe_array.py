"""Golden model of ``hdl/ndp/pe_array.PEArray``: GEMV/GEMM with the RTL's exact order of operations.

``Y[b, n]`` accumulates sequentially in k starting from +0: ``acc_0 = +0``,
``acc_{k+1} = mac(X[b, k], A[k, n], acc_k)`` with :func:`sim.golden.fp16.mac` (product rounded to the
accumulator format, then the add rounded). With ``lanes`` given and ``nb = N / lanes < MIN_NB`` the array
splits K over ``S = min(ceil(MIN_NB / nb), K)`` phases: phase s accumulates the k with ``k mod S == s`` in
the same sequential way, and ``Y = ((p_0 + p_1) + p_2) + ... + p_{S-1}`` (adds in the accumulator format). Vectorized over (b, n), a Python loop over k, so it is bit-exact
to the RTL whatever the data (NaNs are canonical, signed zeros follow IEEE: ``+0 + -0 = +0``).
"""

import numpy as np

from hdl.fp.format import FP16
from . import fp16, fp32
from .bits import as_bits, to_float64

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
    parts = []
    for s in range(S):
        p = np.zeros((x.shape[0], a.shape[1]), dtype=dtype)  # +0
        for k in range(s, x.shape[1], S):
            p = fp16.mac(x[:, k, None], a[k, None, :], p, acc=acc)
        parts.append(p)
    y = parts[0]
    add = fp16.add if acc == "fp16" else fp32.add
    for p in parts[1:]:
        y = add(y, p)
    return y


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
