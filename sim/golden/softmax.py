"""Golden model of ``hdl/ndp/softmax.SoftmaxUnit``: partial (FlashAttention-style) softmax of FP16 score rows.

For each row ``r`` of ``P`` (R x L FP16 bit patterns, ``L = nb * lanes``) the unit returns the unnormalized
exponentials ``E[r, j]``, the row maximum ``m_r`` and the FP32 sum ``sum_r`` of the ``E[r, j]`` (the
"anchor" the host uses to merge partial softmaxes). The order of operations is exactly the RTL's
(``docs/ndp_softmax.md``):

1. ``m_r``: per lane ``l`` a running ``FPMax`` over the row's beats, ``acc_l = max(P[r, l], P[r, l])`` then
   ``acc_l = max(P[r, q*lanes + l], acc_l)`` for ``q = 1..nb-1``; then a pairwise tree over the lanes
   (level ``k`` combines neighbours ``(2i, 2i+1)`` of level ``k-1``). FPMax is a maximum in a total order
   (``-0 < +0``) that returns the canonical NaN if any operand is NaN, so the result does not depend on the
   order, but the model mirrors it anyway.
2. ``E[r, j] = exp16(add16(P[r, j], -m_r))``: the difference rounded to FP16 (FPAdd), then FPExp.
3. ``sum_r``: every ``E`` converted exactly to FP32; per beat ``q`` a pairwise FP32 tree over the lanes gives
   ``s_q``; ``s_q`` is added into phase accumulator ``q mod PHASES`` (``PHASES`` = FP32 FPAdd latency = 4,
   every accumulator starts at +0); finally a pairwise FP32 tree over the phases,
   ``(A0 + A1) + (A2 + A3)``.

Every operation is :mod:`sim.golden.fp16` / :mod:`sim.golden.fp32` / :mod:`sim.golden.exp` (or the same numpy IEEE
operation), which are bit-exact to the RTL units, so the model is bit-exact to the RTL whatever the data.
"""

import numpy as np

from hdl.fp.add import FPAdd
from hdl.fp.format import FP16, FP32
from . import fp16
from .bits import as_bits, canonicalize_nan, to_float64
from .exp import exp as exp16

__all__ = ["PHASES", "softmax_rows", "row_max", "to_float64", "accuracy"]

#: Phase accumulators of the FP32 sum: one per cycle of FP32 FPAdd latency, so consecutive beats never wait
#: for each other (source: hdl/fp/add.py FPAdd.latency).
PHASES = FPAdd.latency

_NEG = np.uint16(FP16.sign_mask)  # sign bit: negation is a sign flip (exact, no rounding)


def _check(p_bits, lanes):
    p = as_bits(p_bits, FP16, "p_bits")
    if p.ndim != 2 or p.shape[0] < 1 or p.shape[1] < 1:
        raise ValueError(f"p_bits must be a non-empty 2-D (R, L) array, got shape {p.shape}")
    if not isinstance(lanes, (int, np.integer)) or lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two >= 1, got {lanes}")
    if p.shape[1] % lanes:
        raise ValueError(f"row length L={p.shape[1]} must be a multiple of lanes={lanes}")
    return p


def _tree(values, op):
    """Pairwise reduction over axis -1 (a power-of-two length): level k combines (2i, 2i+1) of level k-1."""
    while values.shape[-1] > 1:
        values = op(values[..., 0::2], values[..., 1::2])
    return values[..., 0]


def row_max(p_bits, lanes: int) -> np.ndarray:
    """``m_r`` as the RTL computes it (running per-lane FPMax, then a pairwise lane tree): uint16 (R,).

    FPMax is the maximum in a total order (``-0 < +0``; a NaN operand gives the canonical NaN), so any
    evaluation order gives the same bits: computed as one vectorized maximum of the order's integer key
    (injective on non-NaN patterns), the canonical NaN for rows holding a NaN."""
    p = _check(p_bits, lanes)
    key = np.where(p & 0x8000, -(p & 0x7FFF).astype(np.int32) - 1, p.astype(np.int32))
    nan = (((p >> FP16.frac_bits) & FP16.exp_max) == FP16.exp_max) & ((p & ((1 << FP16.frac_bits) - 1)) != 0)
    m = np.take_along_axis(p, np.argmax(key, axis=1)[:, None], axis=1)[:, 0]
    return np.where(nan.any(axis=1), np.uint16(FP16.qnan_bits), m).astype(np.uint16)


def softmax_rows(p_bits, lanes: int):
    """``(e_bits uint16 (R, L), m_bits uint16 (R,), sum_bits uint32 (R,))`` exactly as the RTL computes them."""
    p = _check(p_bits, lanes)
    rows, length = p.shape
    nb = length // lanes
    m = row_max(p, lanes)
    e = exp16(fp16.add(p, (m ^ _NEG)[:, None]))
    # The FP32 sum in the RTL's order with numpy's IEEE binary32 adds (as fp32.add), NaNs canonicalized once at
    # the end (a NaN operand always gives a NaN, and no other result depends on a NaN's payload).
    with np.errstate(all="ignore"):
        e32 = fp16.to_f32(e).view(np.float32).reshape(rows, nb, lanes)
        s = _tree(e32, np.add)  # (R, nb): lane tree per beat
        acc = np.zeros((rows, PHASES), np.float32)  # +0
        for q in range(nb):
            acc[:, q % PHASES] += s[:, q]
        total = canonicalize_nan(np.ascontiguousarray(_tree(acc, np.add)).view(np.uint32), FP32)
    return e.astype(np.uint16), m.astype(np.uint16), total.astype(np.uint32)


def accuracy(p_bits, lanes: int = 1, *, result=None) -> dict:
    """Error of :func:`softmax_rows` (or ``result = (e, m, sum)``) against float64 on the same FP16 inputs.

    Reference per row (finite rows only, i.e. every score finite): ``m = max P`` (must be exact),
    ``E = exp(P - m)``, ``sum = sum E``, softmax ``S = E / sum``. Returns:

    * ``m_exact``: all finite rows' ``m`` equal the float64 max (value equality, so ``-0 == +0``);
    * ``e_max_rel``/``e_mean_rel``: ``|E - E_ref| / E_ref`` over elements with ``E_ref >= 2**-14`` (FP16
      normal range; subnormal results carry less relative precision by construction);
      ``e_max_abs``: ``max |E - E_ref|`` over all elements (``E_ref <= 1``, so this is also relative to the max);
    * ``sum_max_rel``: ``|sum - sum_ref| / sum_ref`` (against the float64 sum of the exact exponentials);
    * ``sum_vs_e_max_rel``: ``|sum - sum(E)| / sum(E)``, the FP32 accumulation error alone;
    * ``softmax_max_abs``: ``max |E/sum - S_ref|``; ``softmax_max_rel``: relative, over ``S_ref >= 1e-3``;
    * ``rows``, ``finite_rows``.
    """
    p = _check(p_bits, lanes)
    e_bits, m_bits, s_bits = softmax_rows(p, lanes) if result is None else result
    x = to_float64(p)
    finite = np.all(np.isfinite(x), axis=1)
    out = {"rows": int(p.shape[0]), "finite_rows": int(finite.sum())}
    if not finite.any():
        return out | {k: float("nan") for k in ("e_max_rel", "e_mean_rel", "e_max_abs", "sum_max_rel",
                                                "sum_vs_e_max_rel", "softmax_max_abs", "softmax_max_rel")} \
            | {"m_exact": True}
    x = x[finite]
    e = to_float64(np.asarray(e_bits)[finite])
    m = to_float64(np.asarray(m_bits)[finite])
    s = to_float64(np.asarray(s_bits)[finite])
    m_ref = x.max(axis=1)
    e_ref = np.exp(x - m_ref[:, None])
    s_ref = e_ref.sum(axis=1)
    normal = e_ref >= 2.0 ** -14
    rel = np.abs(e - e_ref)[normal] / e_ref[normal]
    sm = e / s[:, None]
    sm_ref = e_ref / s_ref[:, None]
    big = sm_ref >= 1e-3
    return out | {
        "m_exact": bool(np.all(m == m_ref)),
        "e_max_rel": float(rel.max()), "e_mean_rel": float(rel.mean()),
        "e_max_abs": float(np.abs(e - e_ref).max()),
        "sum_max_rel": float(np.max(np.abs(s - s_ref) / s_ref)),
        "sum_vs_e_max_rel": float(np.max(np.abs(s - e.sum(axis=1)) / e.sum(axis=1))),
        "softmax_max_abs": float(np.abs(sm - sm_ref).max()),
        "softmax_max_rel": float((np.abs(sm - sm_ref)[big] / sm_ref[big]).max()),
    }
