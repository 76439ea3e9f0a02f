"""Host side of integral attention (PLoRA V-B): pre-scale the query, merge the devices' partial outputs.

Each device ``i`` holds a share of the KV cache and runs :func:`firmware.ndp.kernels.attention_integral`,
returning the unnormalized partial output ``o_i = sum_j exp(p_ij - m_i) V_j`` (FP16), its row maximum ``m_i``
(FP16) and the FP32 sum ``s_i = sum_j exp(p_ij - m_i)``. The exact global output is the FlashAttention
rescaling

    M = max_i m_i,   w_i = exp(m_i - M),   out = (sum_i w_i o_i) / (sum_i w_i s_i).

:func:`merge_partials` evaluates it in a fixed order in IEEE float32 (numpy float32 arithmetic: one rounding
per operation, no fused multiply-add), so the output is bit-identical whatever order the partials arrive in:

1. sort the partials by their key (e.g. the device index), ascending;
2. ``M = max_i m_i`` (exact: a maximum of FP16 values);
3. per partial, in key order: ``w_i = float32(exp(float64(m_i) - float64(M)))`` (the difference is exact in
   float64; float64 ``exp`` then one rounding to float32; so ``w_i`` is the correctly rounded float32 of
   ``exp`` except in rare ties of libm's double ``exp``), then ``num = num + w_i * o_i`` and
   ``den = den + w_i * s_i``, each product and each sum rounded to float32 (``num``, ``den`` start at +0);
4. ``out = num / den`` (float32), returned as float32; :func:`to_fp16_bits` rounds it to FP16 (RNE).

The query scale ``1/sqrt(d)`` is not applied by the hardware (the SOFTMAX descriptor has no scale):
:func:`prepare_query` folds it into q before the GEMV.
"""

import numpy as np

__all__ = ["prepare_query", "merge_partials", "to_fp16_bits", "reference_attention"]


def _as_f64(name, value):
    arr = np.asarray(value)
    if arr.dtype == np.uint16:
        arr = arr.view(np.float16)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be numeric (or FP16 bits as uint16), got dtype {arr.dtype}")
    return arr.astype(np.float64)


def prepare_query(q, scale: float | None = None) -> np.ndarray:
    """``q * scale`` rounded to FP16 bits (uint16), ``scale`` defaulting to ``1/sqrt(d)``, ``d = q.shape[-1]``.

    ``q``: FP16 bits (uint16) or floats, (d,) or (R, d). The product is formed in float64 and rounded once to
    FP16 (round-to-nearest-even)."""
    qf = _as_f64("q", q)
    if qf.ndim not in (1, 2) or qf.shape[-1] < 1:
        raise ValueError(f"q must be (d,) or (R, d), got shape {qf.shape}")
    if scale is None:
        scale = 1.0 / np.sqrt(qf.shape[-1])
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    with np.errstate(over="ignore"):
        return (qf * float(scale)).astype(np.float16).view(np.uint16)


def _partials(partials):
    if isinstance(partials, dict):
        items = [(k, *v) for k, v in partials.items()]
    else:
        items = list(partials)
    if not items:
        raise ValueError("merge_partials needs at least one partial")
    for i, p in enumerate(items):
        if not isinstance(p, (tuple, list)) or len(p) != 4:
            raise ValueError(f"partial {i} must be (key, o_bits, m_bits, sum_bits), got {type(p).__name__} "
                             f"of length {len(p) if hasattr(p, '__len__') else '?'}")
    keys = [p[0] for p in items]
    if len(set(keys)) != len(keys):
        raise ValueError(f"partial keys must be distinct, got {keys}")
    try:
        items.sort(key=lambda p: p[0])
    except TypeError:
        raise ValueError(f"partial keys must be mutually comparable, got {keys}") from None
    out = []
    for key, o, m, s in items:
        o, m, s = np.asarray(o), np.asarray(m), np.asarray(s)
        if o.dtype != np.uint16 or m.dtype != np.uint16 or s.dtype != np.uint32:
            raise ValueError(f"partial {key!r}: o_bits and m_bits must be uint16 (FP16 bits), sum_bits uint32 "
                             f"(FP32 bits); got {o.dtype}, {m.dtype}, {s.dtype}")
        if o.ndim < 1 or m.shape != o.shape[:-1] or s.shape != m.shape:
            raise ValueError(f"partial {key!r}: shapes must be o (..., d), m (...), sum (...); got "
                             f"{o.shape}, {m.shape}, {s.shape}")
        mf = m.view(np.float16).astype(np.float32)
        sf = s.view(np.float32)
        if not np.all(np.isfinite(mf)) or not np.all(np.isfinite(sf)) or np.any(sf <= 0):
            raise ValueError(f"partial {key!r}: the anchors must be finite with sum > 0 (got m={mf}, sum={sf})")
        out.append((o.view(np.float16).astype(np.float32), mf, sf))
    shape = out[0][0].shape
    if any(p[0].shape != shape for p in out):
        raise ValueError(f"all partial outputs must have one shape, got {[p[0].shape for p in out]}")
    return out


def merge_partials(partials) -> np.ndarray:
    """The attention output from the devices' partials, in float32 (module docstring: the exact order).

    ``partials``: a list of ``(key, o_bits, m_bits, sum_bits)`` or a dict ``{key: (o_bits, m_bits,
    sum_bits)}``; keys distinct and sortable (e.g. device indices); ``o_bits`` uint16 (d,) or (R, d) FP16 bits
    of the unnormalized partial output, ``m_bits`` uint16 () or (R,) the FP16 row maxima, ``sum_bits`` uint32
    () or (R,) the FP32 sums. Returns float32 (d,) or (R, d); the result depends only on the set of
    (key, partial) pairs, not on their order in ``partials``."""
    parts = _partials(partials)
    big = parts[0][1]
    for _, m, _ in parts[1:]:
        big = np.maximum(big, m)
    num = np.zeros(parts[0][0].shape, np.float32)
    den = np.zeros(big.shape, np.float32)
    for o, m, s in parts:
        w = np.exp(m.astype(np.float64) - big.astype(np.float64)).astype(np.float32)
        num = (num + (w[..., None] * o).astype(np.float32)).astype(np.float32)
        den = (den + (w * s).astype(np.float32)).astype(np.float32)
    return (num / den[..., None]).astype(np.float32)


def to_fp16_bits(values) -> np.ndarray:
    """float32 values rounded to FP16 (RNE) bits, uint16."""
    return np.asarray(values, np.float32).astype(np.float16).view(np.uint16)


def reference_attention(q, K, V, scale: float | None = None) -> np.ndarray:
    """``softmax(q K^T * scale) V`` in float64 (numerically stable: max subtracted). ``q`` (d,) or (R, d),
    ``K``/``V`` (L, d); floats or FP16 bits (uint16). ``scale`` defaults to ``1/sqrt(d)``."""
    qf, kf, vf = _as_f64("q", q), _as_f64("K", K), _as_f64("V", V)
    if qf.ndim not in (1, 2) or kf.ndim != 2 or vf.shape != kf.shape or qf.shape[-1] != kf.shape[1]:
        raise ValueError(f"shapes must be q (d,) or (R, d), K (L, d), V (L, d); got {qf.shape}, {kf.shape}, "
                         f"{vf.shape}")
    if scale is None:
        scale = 1.0 / np.sqrt(kf.shape[1])
    p = (qf @ kf.T) * scale
    e = np.exp(p - p.max(axis=-1, keepdims=True))
    return (e @ vf) / e.sum(axis=-1, keepdims=True)
