"""Golden model of ``hdl/ndp/pe_array.PEArray``: GEMV/GEMM with the RTL's exact order of operations.

Three dataflows (``docs/ndp_pe_array.md``), all built from one primitive, the *phase sums*
``P[b, s, n] = sum over k with k mod S == s of X[b, k] * A[k, n]``, each accumulated sequentially in k from +0
with :func:`sim.golden.fp16.mac` semantics (product rounded to the accumulator format, then the add rounded):

* **row** (``N`` a multiple of ``lanes``, the GEMM PEs: lane = output column): with ``nb = N / lanes >=
  MIN_NB`` one phase (``S = 1``); for ``nb < MIN_NB`` the array splits K over ``S = min(ceil(MIN_NB / nb), K)``
  phases and ``Y = ((P_0 + P_1) + P_2) + ... + P_{S-1}`` (adds in the accumulator format).
* **row, half** (``N = lanes / 2``, K even): a beat holds two rows of A, the lower lanes the even k, the upper
  lanes the odd k; each half is a row dataflow over its k's with ``S = min(MIN_NB, K / 2)`` phases, and
  ``Y = lower + upper`` (one more add in the accumulator format).
* **trans** (the GEMV PEs: lane = contraction index; A stored k-major in blocks of ``lanes`` rows): lane ``l``
  accumulates ``k = l, l + lanes, ...`` (``S = lanes`` phases, or ``S = K`` when ``K = lanes / 2``), and the
  lanes are reduced by a pairwise tree (level ``j`` adds neighbours ``(2i, 2i+1)`` of level ``j - 1``).
* **row, group** (``group`` = W; X is B x lanes, A is W x lanes): segment s of W lanes multiplies its own
  inputs ``X[b, s W : (s + 1) W]``: per segment the row dataflow of a (B, W) @ (W, W) product with the K split
  of a whole job (``nb = 1``: ``S = min(MIN_NB, W)`` phases).
* **trans, pair** (one input row, N even: the GEMV PEs at two A beats per cycle, PE rows 0 and 1 on columns 2j
  and 2j + 1): every column's operations are the trans ones, so the result is the trans result.

Vectorized over (b, k, n) with numpy's IEEE float16/float32 operations (each sequential sum is one
``np.add.accumulate``), so it is bit-exact to the RTL whatever the data (NaNs are canonical, signed zeros follow
IEEE: ``+0 + -0 = +0``).
"""

import numpy as np

from hdl.fp.format import FP16, FP32
from . import fp16
from .bits import as_bits, canonicalize_nan, to_float64

__all__ = ["gemm", "gemv", "gemm_mode", "gemm_group", "to_float64", "accuracy", "phases", "MIN_NB", "MODES", "mode_of"]

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


#: The PE array's dataflows (``hdl.ndp.pe_array.PEMode`` names).
MODES = ("row", "row_half", "trans", "trans_half", "trans_pair", "row_group")


def mode_of(k: int, n: int, lanes: int, trans: bool) -> str:
    """The dataflow a (K, N) job runs in on a ``lanes``-lane array (raises ValueError for shapes it cannot)."""
    if trans:
        if k % lanes == 0:
            return "trans"
        if 2 * k == lanes and n % 2 == 0:
            return "trans_half"
        raise ValueError(f"TRANS needs K ({k}) a multiple of lanes ({lanes}), or K = lanes / 2 with N even")
    if n % lanes == 0:
        return "row"
    if 2 * n == lanes and k % 2 == 0:
        return "row_half"
    raise ValueError(f"row mode needs N ({n}) a multiple of lanes ({lanes}), or N = lanes / 2 with K even")


def _phase_sums(x, a, S, acc):
    """``P[b, s, n]`` (accumulator-format float array (B, S, N)): phase ``s`` sums the ``k`` with
    ``k mod S == s`` sequentially from +0. A phase with fewer k is padded with -0, the exact identity of IEEE
    addition (x + -0 = x for every x, +0 and NaN included). K goes in chunks (the accumulator carried over) so
    the temporaries stay small."""
    ftype = np.float16 if acc == "fp16" else np.float32
    B, K, N = x.shape[0], x.shape[1], a.shape[1]
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
    return carry[:, :, 0, :]


def _reduce_phases(p):
    """``((P_0 + P_1) + P_2) + ...`` over axis 1."""
    with np.errstate(all="ignore"):
        y = p[:, 0, :]
        for s in range(1, p.shape[1]):
            y = y + p[:, s, :]
    return y


def _tree(p):
    """Pairwise tree over axis 1 (a power-of-two length): level j adds neighbours (2i, 2i+1) of level j - 1."""
    with np.errstate(all="ignore"):
        while p.shape[1] > 1:
            p = p[:, 0::2, :] + p[:, 1::2, :]
    return p[:, 0, :]


def _bits_out(y, acc):
    dtype = _acc_dtype(acc)
    bits = np.ascontiguousarray(y).view(dtype)
    return canonicalize_nan(bits, FP16 if acc == "fp16" else FP32)


def _operands(x_bits, a_bits):
    x = as_bits(x_bits, FP16, "X")
    a = as_bits(a_bits, FP16, "A")
    if x.ndim != 2 or a.ndim != 2 or x.shape[1] != a.shape[0]:
        raise ValueError(f"shapes do not chain: X{x.shape} @ A{a.shape} (need (B, K) @ (K, N))")
    return x, a


def gemm_group(x_bits, a_bits, *, acc: str = "fp16", lanes: int, group: int) -> np.ndarray:
    """The ``row_group`` dataflow: X (B, n lanes), A (K, lanes) with K = n W, W = ``group`` -> Y (B, lanes) in the
    accumulator format. X's row b is n x words; word j holds, in its segment s, elements [j W, (j + 1) W) of
    segment s's input row X_s[b] (module docs): ``Y[b, s W + c] = sum_k X_s[b, k] A[k, s W + c]``, each segment
    the row dataflow's K split over its K."""
    _acc_dtype(acc)
    x = as_bits(x_bits, FP16, "X")
    a = as_bits(a_bits, FP16, "A")
    W = group
    if isinstance(W, bool) or not isinstance(W, (int, np.integer)) or W < 1 or W & (W - 1) or lanes % W:
        raise ValueError(f"group must be a power of two dividing lanes ({lanes}), got {group!r}")
    K = a.shape[0] if a.ndim == 2 else 0
    if x.ndim != 2 or a.ndim != 2 or a.shape[1] != lanes or K < W or K % W or x.shape[1] != (K // W) * lanes:
        raise ValueError(f"row_group needs X (B, n {lanes}) and A (n {W}, {lanes}), got X{x.shape} A{a.shape}")
    n = K // W
    S = phases(K, lanes, lanes)
    xw = x.reshape(x.shape[0], n, lanes)            # (B, word j, lane)
    y = np.concatenate([_reduce_phases(_phase_sums(xw[:, :, s * W:(s + 1) * W].reshape(x.shape[0], K),
                                                   a[:, s * W:(s + 1) * W], S, acc))
                        for s in range(lanes // W)], axis=1)
    return _bits_out(y, acc)


def gemm_mode(x_bits, a_bits, *, acc: str = "fp16", lanes: int, mode: str) -> np.ndarray:
    """``Y = X @ A`` on raw bits in dataflow ``mode`` (:data:`MODES`) of a ``lanes``-lane array: X (B, K) uint16,
    A (K, N) uint16 (logical shape; the storage order of a TRANS operand does not change the arithmetic) ->
    Y (B, N), uint16 for ``acc="fp16"``, uint32 (binary32 bits) for ``acc="fp32"``. (``row_group``:
    :func:`gemm_group`.)"""
    _acc_dtype(acc)
    x, a = _operands(x_bits, a_bits)
    K, N = a.shape
    if isinstance(lanes, bool) or not isinstance(lanes, (int, np.integer)) or lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two >= 1, got {lanes!r}")
    if mode not in MODES or mode == "row_group":
        raise ValueError(f"mode must be one of {MODES[:-1]} (row_group: gemm_group), got {mode!r}")
    if mode == "trans_pair":
        if x.shape[0] != 1 or N % 2 or mode_of(K, N, lanes, True) != "trans":
            raise ValueError(f"trans_pair needs one input row (got {x.shape[0]}), N even (got {N}) and K a "
                             f"multiple of lanes (K={K}, lanes={lanes})")
        mode = "trans"
    if mode_of(K, N, lanes, mode.startswith("trans")) != mode:
        raise ValueError(f"shape (K={K}, N={N}) on {lanes} lanes runs as {mode_of(K, N, lanes, mode.startswith('trans'))!r}, "
                         f"not {mode!r}")
    if mode == "row":
        y = _reduce_phases(_phase_sums(x, a, phases(K, N, lanes), acc))
    elif mode == "row_half":
        S = min(MIN_NB, K // 2)
        lo = _reduce_phases(_phase_sums(x[:, 0::2], a[0::2, :], S, acc))
        hi = _reduce_phases(_phase_sums(x[:, 1::2], a[1::2, :], S, acc))
        with np.errstate(all="ignore"):
            y = lo + hi
    else:
        y = _tree(_phase_sums(x, a, min(lanes, K), acc))
    return _bits_out(y, acc)


def gemm(x_bits, a_bits, *, acc: str = "fp16", lanes: int | None = None) -> np.ndarray:
    """``Y = X @ A`` on raw bits in the row dataflow: X (B, K) uint16, A (K, N) uint16 -> Y (B, N) in the
    accumulator format (uint16 for ``acc="fp16"``, uint32 binary32 bits for ``acc="fp32"``). ``lanes``: the PE
    array's lanes (N must be a multiple), which decides the K split for small N; None: no split."""
    _acc_dtype(acc)
    x, a = _operands(x_bits, a_bits)
    if lanes is not None and (lanes < 1 or a.shape[1] % lanes):
        raise ValueError(f"N ({a.shape[1]}) must be a positive multiple of lanes ({lanes})")
    return _bits_out(_reduce_phases(_phase_sums(x, a, phases(x.shape[1], a.shape[1], lanes), acc)), acc)


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
