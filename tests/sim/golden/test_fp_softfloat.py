"""The golden FP models against Berkeley SoftFloat (softfloatpy), bit for bit, NaNs included.

SoftFloat's default NaN (0x7E00 / 0x7FC00000, returned for every NaN result) is the canonical NaN of the
golden models and the RTL, so even NaN results compare as raw bits.
"""

import numpy as np
import pytest

from sim.verify.fpcheck import UNITS
from sim.verify.softfloat_ref import reference
from sim.golden import fp16, fp32
from fp_util import hexdiff

N_RANDOM = 100_000
CHECKED = [name for name, spec in UNITS.items() if spec.softfloat]


@pytest.mark.parametrize("name", CHECKED)
def test_golden_matches_softfloat(name):
    """>= 100,000 seeded random operand sets per op plus every pair of curated edge cases."""
    spec = UNITS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    ops = spec.vectors(rng, N_RANDOM)
    assert len(ops[0]) >= N_RANDOM
    got = spec.golden(*ops)
    want = reference(spec.softfloat, *ops)
    assert np.array_equal(got, want), hexdiff(dict(zip("abc", ops)), got, want)


def test_fp16_to_fp32_exhaustive():
    a = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert np.array_equal(fp16.to_f32(a), reference("f16_to_f32", a))


def test_fp32_to_fp16_ties():
    """Patterns exactly halfway between binary16 neighbours, across the whole normal range."""
    rng = np.random.default_rng(3216)
    a = rng.integers(0x38800000, 0x47800000, 50_000, dtype=np.uint64).astype(np.uint32)
    a = (a & ~np.uint32(0x1FFF)) | np.uint32(0x1000)
    assert np.array_equal(fp16.from_f32(a), reference("f32_to_f16", a))


CURATED = [
    ("f16_add", 0x0000, 0x8000, 0x0000),   # +0 + -0 = +0
    ("f16_add", 0x8000, 0x8000, 0x8000),   # -0 + -0 = -0
    ("f16_add", 0x3C00, 0xBC00, 0x0000),   # x - x = +0
    ("f16_add", 0x7C00, 0xFC00, 0x7E00),   # inf - inf = NaN
    ("f16_add", 0x7BFF, 0x7BFF, 0x7C00),   # overflow to inf
    ("f16_add", 0x3C00, 0x1000, 0x3C00),   # 1 + 2^-11 ties to even (down)
    ("f16_add", 0x3C01, 0x1000, 0x3C02),   # (1 + ulp) + 2^-11 ties to even (up)
    ("f16_add", 0x0001, 0x0001, 0x0002),   # subnormal + subnormal
    ("f16_add", 0x03FF, 0x0001, 0x0400),   # largest subnormal + smallest = smallest normal
    ("f16_mul", 0x0000, 0x7C00, 0x7E00),   # 0 * inf = NaN
    ("f16_mul", 0x8000, 0x3C00, 0x8000),   # -0 * 1 = -0
    ("f16_mul", 0x0400, 0x3800, 0x0200),   # smallest normal / 2: exact subnormal
    ("f16_mul", 0x0001, 0x3800, 0x0000),   # 2^-25 ties to even: underflow to +0
    ("f16_mul", 0x0001, 0x3801, 0x0001),   # just above the tie: smallest subnormal
    ("f16_mul", 0x7BFF, 0x4000, 0x7C00),   # overflow to inf
    ("f16_mul", 0x7D00, 0x3C00, 0x7E00),   # NaN in, canonical NaN out
    ("f16_div", 0x0000, 0x0000, 0x7E00),   # 0/0 = NaN
    ("f16_div", 0x3C00, 0x0000, 0x7C00),   # 1/0 = inf
    ("f16_div", 0xBC00, 0x0000, 0xFC00),   # -1/+0 = -inf
    ("f16_div", 0x7C00, 0x7C00, 0x7E00),   # inf/inf = NaN
    ("f16_div", 0x3C00, 0x4200, 0x3555),   # 1/3
    ("f16_div", 0x0001, 0x4000, 0x0000),   # 2^-25 ties to even: 0
]


@pytest.mark.parametrize("op, a, b, want", CURATED, ids=[f"{c[0]}-{c[1]:04x}-{c[2]:04x}" for c in CURATED])
def test_curated_edge_cases(op, a, b, want):
    """Named IEEE corner cases with their expected bits written out, independent of any generator."""
    golden = {"f16_add": fp16.add, "f16_mul": fp16.mul, "f16_div": fp16.div}[op]
    got = int(golden(np.uint16(a), np.uint16(b)))
    ref = int(reference(op, [a], [b])[0])
    assert got == want == ref, f"{op}({a:#06x}, {b:#06x}) = {got:#06x}, want {want:#06x} (SoftFloat {ref:#06x})"


@pytest.mark.parametrize("call", [
    lambda: fp16.add(np.zeros(3, np.float16), np.zeros(3, np.uint16)),
    lambda: fp16.mul(np.zeros(3, np.int64), np.zeros(3, np.uint16)),
    lambda: fp32.add(np.zeros(3, np.uint16), np.zeros(3, np.uint32)),
])
def test_wrong_dtype_is_rejected(call):
    with pytest.raises(TypeError, match="raw .* bit patterns"):
        call()


def test_bad_shapes_and_names_are_rejected():
    with pytest.raises(ValueError, match="do not broadcast"):
        fp16.add(np.zeros(3, np.uint16), np.zeros(4, np.uint16))
    with pytest.raises(ValueError, match="acc must be one of"):
        fp16.mac(np.uint16(0), np.uint16(0), np.uint16(0), acc="bf16")
    with pytest.raises(ValueError, match=r"must be in \[0, 65536\)"):
        fp16.add(70000, np.uint16(0))
    with pytest.raises(ValueError, match="unknown SoftFloat reference"):
        reference("f16_fma", [1], [2])
