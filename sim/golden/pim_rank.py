"""Golden model of the DIMM-PIM rank PU arithmetic (hdl/pim/adder_unit.py, hdl/pim/softmax_unit.py).

Every function performs the operations of docs/pim.md in exactly the RTL's order with the bit-exact golden FP
ops (:mod:`sim.golden.fp16`, :mod:`sim.golden.fp32`, :mod:`sim.golden.exp`), so results compare bit for bit.
All inputs / outputs are raw bit patterns (uint16 FP16, uint32 FP32). Vectorized over tokens and over any
leading (head) axes; the running update loops over chunks only.
"""

import numpy as np

from hdl.fp.format import FP16, FP32
from . import fp16, fp32
from .bits import as_bits, canonicalize_nan
from .exp import exp as exp16

__all__ = ["CHUNK", "NEG_INF", "score_tree", "chunk_softmax", "normalize", "aggregate", "scale_bits", "mul32",
           "split_z"]

#: Scores per chunk: one per logic bank (PIMConfig.chunk, 16 for both presets).
CHUNK = 16
NEG_INF = np.uint16(0xFC00)
_NEG = np.uint16(FP16.sign_mask)


def mul32(a, b) -> np.ndarray:
    """``a * b`` in binary32, RNE (FPMul fmt=FP32)."""
    a = as_bits(a, FP32, "a")
    b = as_bits(b, FP32, "b")
    with np.errstate(all="ignore"):
        z = (a.view(np.float32) * b.view(np.float32)).view(np.uint32)
    return canonicalize_nan(np.asarray(z, np.uint32), FP32)


def _tree(values, op):
    """Balanced pairwise reduction over axis -1 (power-of-two length): pairs (0,1), (2,3), ... per level."""
    n = values.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"tree length must be a power of two, got {n}")
    while values.shape[-1] > 1:
        values = op(values[..., 0::2], values[..., 1::2])
    return values[..., 0]


def _max16(a, b):
    return fp16.max_cmp(a, b)[0]


def score_tree(partials) -> np.ndarray:
    """Adder unit, tree mode: ``s_t`` from ``partials[..., C]`` (uint16, chip index last), balanced add16 tree."""
    p = as_bits(partials, FP16, "partials")
    return _tree(p, fp16.add).astype(np.uint16)


def _chunks(scores, L, chunk):
    s = as_bits(scores, FP16, "scores")
    if s.ndim < 1:
        raise ValueError("scores must have a token axis (last)")
    if not 1 <= L <= s.shape[-1] + chunk - 1:
        raise ValueError(f"L = {L} must be in [1, tokens + chunk - 1 = {s.shape[-1] + chunk - 1}]")
    n = -(-L // chunk)
    T = n * chunk
    out = np.full(s.shape[:-1] + (T,), NEG_INF, np.uint16)
    k = min(T, s.shape[-1])
    out[..., :k] = s[..., :k]
    out[..., L:] = NEG_INF                       # padded tokens t >= L score -inf
    return out.reshape(s.shape[:-1] + (n, chunk)), n


def split_z(Z):
    """``Z = z_m * 2**s``: ``(z_m, s)`` with ``z_m = f16(mantissa of Z in [1, 2))`` (uint16) and ``s`` = the
    binary32 exponent field - 127 (int16, in [-127, 128])."""
    Z = as_bits(Z, FP32, "Z")
    zm32 = (np.uint32(FP32.bias << FP32.frac_bits) | (Z & np.uint32((1 << FP32.frac_bits) - 1))).astype(np.uint32)
    s = ((Z >> FP32.frac_bits) & np.uint32(FP32.exp_max)).astype(np.int16) - np.int16(FP32.bias)
    return fp16.from_f32(zm32).astype(np.uint16), s.astype(np.int16)


def chunk_softmax(scores, L: int, *, chunk: int = CHUNK) -> dict:
    """Softmax unit, per head: ``scores[..., T]`` (uint16, token axis last; tokens ``>= L`` and missing ones
    are padding = -inf) ->

    ``e`` uint16 ``[..., n * chunk]`` (``n = ceil(L / chunk)``), ``m`` uint16 ``[..., n]`` (per chunk),
    ``M`` uint16 ``[...]``, ``Z`` uint32 ``[...]``, ``z_m`` uint16, ``s`` int16 (see :func:`split_z`).
    """
    x, n = _chunks(scores, L, chunk)
    m = _tree(x, _max16)                                         # [..., n]
    e = exp16(fp16.add(x, (m ^ _NEG)[..., None])).astype(np.uint16)
    z = _tree(fp16.to_f32(e), fp32.add)                          # [..., n] FP32
    # Running update. M_j = max16(M_{j-1}, m_j) is exact (a total-order max, NaN absorbing), so the prefix
    # maxima are computed at once; a_j, b_j and the products z_j b_j do not depend on Z either. Only
    # Z_j = add32(mul32(Z_{j-1}, a_j), z_j b_j) is sequential: native binary32 ops (IEEE RNE, like fp32.add and
    # mul32); a NaN stays NaN, so canonicalizing once at the end gives the per-step canonical bits.
    key = np.where(m & _NEG, -(m & 0x7FFF).astype(np.int32) - 1, m.astype(np.int32))
    kmax = np.maximum.accumulate(key, axis=-1)
    Ms = np.where(kmax >= 0, kmax, (-(kmax + 1)) | FP16.sign_mask).astype(np.uint16)
    nan = np.logical_or.accumulate(np.isnan(m.view(np.float16)), axis=-1)
    Ms = np.where(nan, np.uint16(FP16.qnan_bits), Ms).astype(np.uint16)       # M after chunk j
    Mprev = Ms[..., :-1]
    Mp = Ms[..., 1:]
    a = fp16.to_f32(exp16(fp16.add(Mprev, Mp ^ _NEG))).view(np.float32)
    b = fp16.to_f32(exp16(fp16.add(m[..., 1:], Mp ^ _NEG)))
    zb = mul32(z[..., 1:], b).view(np.float32)
    Zf = z[..., 0].copy().view(np.float32)
    with np.errstate(all="ignore"):
        for j in range(n - 1):
            Zf = (Zf * a[..., j]) + zb[..., j]
    Z = canonicalize_nan(np.asarray(Zf, np.float32).view(np.uint32), FP32)
    M = Ms[..., -1]
    z_m, s = split_z(Z)
    return {"e": e.reshape(e.shape[:-2] + (-1,)), "m": m.astype(np.uint16), "M": np.asarray(M, np.uint16),
            "Z": np.asarray(Z, np.uint32), "z_m": z_m, "s": s}


def scale_bits(s) -> np.ndarray:
    """FP16 bits of ``2**-s`` (exact for -15 <= s <= 24, +inf below, +0 above), as the normalizer forms it."""
    s = np.asarray(s, np.int32)
    normal = ((FP16.bias - s) << FP16.frac_bits)
    sub = np.left_shift(1, np.clip(24 - s, 0, 10))
    out = np.where(s < -FP16.bias, FP16.inf_bits, np.where(s < FP16.bias, normal, np.where(s <= 24, sub, 0)))
    return out.astype(np.uint16)


def normalize(e, m, M, z_m, s, L: int, *, chunk: int = CHUNK) -> np.ndarray:
    """Normalization: ``p[..., n * chunk]`` (uint16) from ``e[..., n * chunk]``, ``m[..., n]`` and the head's
    ``M``, ``z_m``, ``s`` (shape ``[...]``); tokens ``>= L`` give +0."""
    e = as_bits(e, FP16, "e")
    m = as_bits(m, FP16, "m")
    n = m.shape[-1]
    if e.shape[-1] != n * chunk:
        raise ValueError(f"e has {e.shape[-1]} tokens, expected chunks x chunk = {n * chunk}")
    M = as_bits(np.asarray(M, np.uint16), FP16, "M")
    z_m = as_bits(np.asarray(z_m, np.uint16), FP16, "z_m")
    f = exp16(fp16.add(m, (M ^ _NEG)[..., None]))               # [..., n]
    g = fp16.div(f, z_m[..., None])
    sc = scale_bits(s)
    p = fp16.mul(fp16.mul(e.reshape(e.shape[:-1] + (n, chunk)), g[..., None]), sc[..., None, None])
    p = p.reshape(e.shape).copy()
    p[..., L:] = 0
    return p.astype(np.uint16)


def aggregate(acc) -> np.ndarray:
    """Adder unit, accumulator mode: ``acc[..., C, G, E]`` (uint16: chip, token set, element ``4k + j``) ->
    ``out[..., C * E]`` with ``r = add16(-0, acc[g=0])`` (= ``acc[g=0]``, NaN canonical), ``r = add16(r, acc[g])``."""
    a = as_bits(acc, FP16, "acc")
    if a.ndim < 3:
        raise ValueError(f"acc must be [..., chips, token sets, elements], got shape {a.shape}")
    r = fp16.add(_NEG, a[..., 0, :])
    for g in range(1, a.shape[-2]):
        r = fp16.add(r, a[..., g, :])
    return r.reshape(r.shape[:-2] + (-1,)).astype(np.uint16)
