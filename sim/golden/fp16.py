"""Golden models of the binary16 units of ``hdl/fp``: uint16 bit patterns in, uint16 (or uint32) out.

Add, multiply, divide and conversions are single IEEE operations with round-to-nearest-even, which numpy's
float16/float32 arithmetic performs exactly (binary32 holds any binary16 sum, product or quotient closely
enough that its second rounding is innocuous: 24 >= 2 * 11 + 2). NaN results are canonical quiet NaNs, as in
the RTL and SoftFloat's default-NaN specialization.
"""

import numpy as np

from hdl.fp.format import FP16, FP32
from .bits import as_bits, canonicalize_nan, broadcast

__all__ = ["add", "mul", "div", "to_f32", "from_f32", "max_cmp", "mac", "ACCUMULATORS"]

ACCUMULATORS = ("fp16", "fp32")


def _binary(op, a, b):
    a = as_bits(a, FP16, "a")
    b = as_bits(b, FP16, "b")
    a, b = broadcast(a, b, names="ab")
    with np.errstate(all="ignore"):
        z = op(a.view(np.float16), b.view(np.float16)).astype(np.float16).view(np.uint16)
    return canonicalize_nan(z, FP16)


def add(a, b) -> np.ndarray:
    """``a + b`` (FPAdd, fp16)."""
    return _binary(np.add, a, b)


def mul(a, b) -> np.ndarray:
    """``a * b`` (FPMul, fp16 -> fp16)."""
    return _binary(np.multiply, a, b)


def div(a, b) -> np.ndarray:
    """``a / b`` (FPDiv)."""
    return _binary(np.divide, a, b)


def mul_wide(a, b) -> np.ndarray:
    """``a * b`` exactly in binary32 (FPMul with ``out_fmt=FP32``): uint32 bit patterns."""
    a = as_bits(a, FP16, "a")
    b = as_bits(b, FP16, "b")
    a, b = broadcast(a, b, names="ab")
    with np.errstate(all="ignore"):
        z = (a.view(np.float16).astype(np.float32) * b.view(np.float16).astype(np.float32)).view(np.uint32)
    return canonicalize_nan(z, FP32)


def to_f32(a) -> np.ndarray:
    """binary16 -> binary32, exact (FPConvert fp16 -> fp32)."""
    a = as_bits(a, FP16, "a")
    return canonicalize_nan(a.view(np.float16).astype(np.float32).view(np.uint32), FP32)


def from_f32(a) -> np.ndarray:
    """binary32 -> binary16, round-to-nearest-even (FPConvert fp32 -> fp16)."""
    a = as_bits(a, FP32, "a")
    with np.errstate(all="ignore"):
        z = a.view(np.float32).astype(np.float16).view(np.uint16)
    return canonicalize_nan(z, FP16)


def max_cmp(a, b):
    """FPMax: ``(max, a_lt_b, a_eq_b, unordered)``.

    ``a_lt_b``/``a_eq_b`` are IEEE comparisons (so ``-0 == +0``); ``max`` orders ``-0 < +0`` and is the
    canonical NaN when either operand is NaN, so a NaN score poisons softmax instead of vanishing.
    """
    a = as_bits(a, FP16, "a")
    b = as_bits(b, FP16, "b")
    a, b = broadcast(a, b, names="ab")
    fa, fb = a.view(np.float16), b.view(np.float16)
    unordered = np.isnan(fa) | np.isnan(fb)
    lt = fa < fb
    eq = fa == fb
    # Total order on non-NaN values: a sign-magnitude key makes -0 sort below +0.
    ka = np.where(a & 0x8000, -(a & 0x7FFF).astype(np.int32) - 1, a.astype(np.int32))
    kb = np.where(b & 0x8000, -(b & 0x7FFF).astype(np.int32) - 1, b.astype(np.int32))
    z = np.where(unordered, np.uint16(FP16.qnan_bits), np.where(kb > ka, b, a)).astype(np.uint16)
    return z, lt, eq, unordered


def mac(a, b, c, *, acc: str = "fp16") -> np.ndarray:
    """FPMAC: ``c + a * b``; the product is rounded to the accumulator format, then added to ``c`` in it.

    ``acc="fp16"``: ``c`` and the result are uint16 (two roundings, as the papers' FP16 MACs).
    ``acc="fp32"``: ``c`` and the result are uint32; the product is exact, so only the add rounds.
    """
    if acc == "fp16":
        return add(mul(a, b), c)
    if acc == "fp32":
        from . import fp32
        return fp32.add(mul_wide(a, b), as_bits(c, FP32, "c"))
    raise ValueError(f"acc must be one of {ACCUMULATORS}, got {acc!r}")
