"""Berkeley SoftFloat (``softfloatpy``) references for the golden FP models, element by element.

Used by the golden-model tests and ``ndpim fp-report``. SoftFloat is built with its default-NaN
specialization (every NaN result is 0x7E00 / 0x7FC00000), which is also the golden models' and the RTL's
canonical NaN, so results compare as raw bits, NaNs included.
"""

import numpy as np

__all__ = ["REFERENCES", "reference"]


def _sf():
    import softfloatpy as sf
    sf.set_rounding_mode(sf.RoundingMode.NEAR_EVEN)
    return sf


def _f16(sf, x):
    return sf.Float16.from_bytes(int(x).to_bytes(2, "big"))


def _f32(sf, x):
    return sf.Float32.from_bytes(int(x).to_bytes(4, "big"))


def _bits(v):
    return int.from_bytes(v.to_bytes(), "big")


def _max_cmp(sf, a, b):
    fa, fb = _f16(sf, a), _f16(sf, b)
    lt, eq = sf.f16_lt_quiet(fa, fb), sf.f16_eq(fa, fb)
    if sf.f16_is_nan(fa) or sf.f16_is_nan(fb):
        z = 0x7E00
    elif lt:
        z = b
    elif sf.f16_lt_quiet(fb, fa):
        z = a
    else:  # equal: +0 is the larger of the two zeros
        z = a if not (a & 0x8000) else b
    return int(z) | (int(lt) << 16) | (int(eq) << 17) | (int(sf.f16_is_nan(fa) or sf.f16_is_nan(fb)) << 18)


REFERENCES = {
    "f16_add": lambda sf, a, b: _bits(sf.f16_add(_f16(sf, a), _f16(sf, b))),
    "f16_mul": lambda sf, a, b: _bits(sf.f16_mul(_f16(sf, a), _f16(sf, b))),
    "f16_div": lambda sf, a, b: _bits(sf.f16_div(_f16(sf, a), _f16(sf, b))),
    "f16_mul_f32": lambda sf, a, b: _bits(sf.f32_mul(sf.f16_to_f32(_f16(sf, a)), sf.f16_to_f32(_f16(sf, b)))),
    "f32_add": lambda sf, a, b: _bits(sf.f32_add(_f32(sf, a), _f32(sf, b))),
    "f16_to_f32": lambda sf, a: _bits(sf.f16_to_f32(_f16(sf, a))),
    "f32_to_f16": lambda sf, a: _bits(sf.f32_to_f16(_f32(sf, a))),
    "mac_fp16": lambda sf, a, b, c: _bits(sf.f16_add(sf.f16_mul(_f16(sf, a), _f16(sf, b)), _f16(sf, c))),
    "mac_fp32": lambda sf, a, b, c: _bits(sf.f32_add(
        sf.f32_mul(sf.f16_to_f32(_f16(sf, a)), sf.f16_to_f32(_f16(sf, b))), _f32(sf, c))),
    "max_cmp": _max_cmp,
}


def reference(name: str, *operands) -> np.ndarray:
    """SoftFloat's result for every element of ``operands`` (raw bit arrays), as a uint64 array."""
    if name not in REFERENCES:
        raise ValueError(f"unknown SoftFloat reference {name!r}; allowed: {sorted(REFERENCES)}")
    sf = _sf()
    fn = REFERENCES[name]
    return np.array([fn(sf, *vals) for vals in zip(*operands)], dtype=np.uint64)
