"""Input checking and NaN canonicalization shared by the golden models."""

import numpy as np

from hdl.fp.format import FloatFormat

__all__ = ["as_bits", "canonicalize_nan", "to_float64"]


def as_bits(value, fmt: FloatFormat, name: str) -> np.ndarray:
    """``value`` as an array of raw ``fmt`` bit patterns; raises on any other dtype."""
    dtype = np.uint16 if fmt.width == 16 else np.uint32
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if not 0 <= int(value) < (1 << fmt.width):
            raise ValueError(f"{name}: {fmt.name} bit pattern must be in [0, {1 << fmt.width}), got {value}")
        return np.asarray(value, dtype=dtype)
    arr = np.asarray(value)
    if arr.dtype != dtype:
        raise TypeError(
            f"{name}: expected raw {fmt.name} bit patterns as {np.dtype(dtype).name}, got dtype {arr.dtype} "
            f"(use .view({np.dtype(dtype).name}) on float data)")
    return arr


def canonicalize_nan(bits: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Replace every NaN by ``fmt``'s canonical quiet NaN (what the RTL and SoftFloat return)."""
    exp = (bits >> fmt.frac_bits) & fmt.exp_max
    frac = bits & ((1 << fmt.frac_bits) - 1)
    is_nan = (exp == fmt.exp_max) & (frac != 0)
    return np.where(is_nan, bits.dtype.type(fmt.qnan_bits), bits).astype(bits.dtype)


def broadcast(*arrays, names):
    try:
        return np.broadcast_arrays(*arrays)
    except ValueError:
        shapes = ", ".join(f"{n}{a.shape}" for n, a in zip(names, arrays))
        raise ValueError(f"operand shapes do not broadcast: {shapes}") from None


def to_float64(bits) -> np.ndarray:
    """FP16 (uint16) or FP32 (uint32) bit patterns as float64 values."""
    bits = np.asarray(bits)
    if bits.dtype == np.uint16:
        return bits.view(np.float16).astype(np.float64)
    if bits.dtype == np.uint32:
        return bits.view(np.float32).astype(np.float64)
    raise TypeError(f"expected uint16 or uint32 bit patterns, got dtype {bits.dtype}")
