"""Operand vectors for the FP units: curated IEEE edge cases and seeded random patterns, and payload packing.

Shared by the tests, ``ndpim fp-report`` and the benchmarks, so every campaign draws from the same generators.
"""

import numpy as np

from hdl.fp.format import FP16

__all__ = ["FP16_EDGE", "FP32_EDGE", "random_fp16", "random_fp32", "operand_pairs", "pack", "field"]

# Curated binary16 edge cases: zeros, smallest/largest subnormal and normal, one and neighbours,
# halfway patterns, infinities, quiet and signalling NaNs, both signs.
_FP16_EDGE_POS = [
    0x0000, 0x0001, 0x0002, 0x0003, 0x01FF, 0x0200, 0x03FF, 0x0400, 0x0401, 0x07FF, 0x0800,
    0x3BFF, 0x3C00, 0x3C01, 0x3E00, 0x4000, 0x4200, 0x5BFF, 0x7BFE, 0x7BFF, 0x7C00, 0x7C01, 0x7E00, 0x7FFF,
    0x1400, 0x1000, 0x0C00, 0x2400, 0x3800, 0x3555, 0x4900, 0x6400, 0x7000,
]
FP16_EDGE = np.array(_FP16_EDGE_POS + [x | 0x8000 for x in _FP16_EDGE_POS], dtype=np.uint16)

_FP32_EDGE_POS = [
    0x00000000, 0x00000001, 0x00000003, 0x007FFFFF, 0x00800000, 0x00800001, 0x3F7FFFFF, 0x3F800000,
    0x3F800001, 0x3FC00000, 0x33800000, 0x33000000, 0x38800000, 0x387FC000, 0x477FE000, 0x477FF000,
    0x477FEFFF, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x4B000000, 0x34FFFFFF,
]
FP32_EDGE = np.array(_FP32_EDGE_POS + [x | 0x80000000 for x in _FP32_EDGE_POS], dtype=np.uint32)


def random_fp16(rng, n) -> np.ndarray:
    return rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)


def random_fp32(rng, n) -> np.ndarray:
    return rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)


def operand_pairs(rng, n, fmt=FP16):
    """``n`` random pairs: uniform bit patterns, near-cancelling pairs, and close exponents, plus all
    pairs of the curated edge cases."""
    rand = random_fp16 if fmt is FP16 else random_fp32
    edge = FP16_EDGE if fmt is FP16 else FP32_EDGE
    a = rand(rng, n)
    b = rand(rng, n)
    q = n // 4
    # b = -a with a few low bits flipped: massive cancellation and exact zeros.
    b[:q] = a[:q] ^ rng.integers(0, 64, q).astype(a.dtype) ^ a.dtype.type(fmt.sign_mask)
    # exponents within a few steps: the guard/round/sticky corner cases.
    shift = fmt.frac_bits
    b[q:2 * q] = (a[q:2 * q] & ~a.dtype.type(((1 << 3) - 1) << shift)) | (
        rng.integers(0, 8, q).astype(a.dtype) << shift)
    ea, eb = np.meshgrid(edge, edge)
    return np.concatenate([ea.ravel(), a]), np.concatenate([eb.ravel(), b])


def pack(fields) -> list:
    """Pack ``[(array, width), ...]`` into stream payload ints, first field in the low bits."""
    out = None
    shift = 0
    for arr, width in fields:
        vals = [int(x) for x in np.asarray(arr).ravel()]
        if out is None:
            out = vals
        else:
            out = [o | (v << shift) for o, v in zip(out, vals)]
        shift += width
    return out


def field(payloads, lo, width, dtype) -> np.ndarray:
    mask = (1 << width) - 1
    return np.array([(int(p) >> lo) & mask for p in payloads], dtype=dtype)
