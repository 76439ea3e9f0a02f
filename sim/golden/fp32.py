"""Golden models of the binary32 units of ``hdl/fp``: uint32 bit patterns in and out."""

import numpy as np

from hdl.fp.format import FP32
from .bits import as_bits, canonicalize_nan, broadcast

__all__ = ["add"]


def add(a, b) -> np.ndarray:
    """``a + b`` (FPAdd, fp32)."""
    a = as_bits(a, FP32, "a")
    b = as_bits(b, FP32, "b")
    a, b = broadcast(a, b, names="ab")
    with np.errstate(all="ignore"):
        z = (a.view(np.float32) + b.view(np.float32)).view(np.uint32)
    return canonicalize_nan(z, FP32)
