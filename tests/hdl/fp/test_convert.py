# amaranth: UnusedElaboratable=no
import numpy as np
import pytest

from hdl.fp import FP16, FP32
from hdl.fp.convert import FPConvert
from sim.golden import fp16
from fp_util import FP16_EDGE, FP32_EDGE, random_fp16, random_fp32, pack, field, run_unit, hexdiff, vector_count


def fp32_rounding_vectors(rng, repeats=2) -> np.ndarray:
    """binary32 values on the binary16 rounding boundaries, for every exponent from underflow to overflow.

    For each binary32 exponent whose values round to a binary16 subnormal, normal, or overflow (and a few
    below the smallest subnormal), the bits that binary16 drops are set to: zero (exact), half minus one ulp,
    exactly half (a tie), half plus one ulp, all ones, and random -- each with both parities of the kept
    LSB (so ties go up and down). Plus the overflow threshold 65520 (0x477FF000) and its neighbours.
    """
    out = []
    for e32 in range(100, 146):  # 2**-27 .. 2**18
        # Dropped significand bits (of the 24 with the hidden bit): 13 for binary16 normals (e32 >= 113),
        # one more per binary16-subnormal binade below that.
        d = 13 + max(0, 113 - e32)
        if d > 24:
            d = 24  # everything is below the guard position anyway: round to zero or the smallest subnormal
        half = 1 << (d - 1)
        for _ in range(repeats):
            for pattern in ("zero", "half-1", "half", "half+1", "ones", "random"):
                dropped = {"zero": 0, "half-1": half - 1, "half": half, "half+1": half + 1,
                           "ones": (1 << d) - 1, "random": int(rng.integers(0, 1 << d))}[pattern]
                for parity in (0, 1):
                    if d < 24:
                        kept = (1 << (23 - d)) | int(rng.integers(0, 1 << (23 - d)))
                        kept = (kept & ~1) | parity if d < 23 else 1
                    else:
                        kept = 0
                    sig = (kept << d) | dropped
                    if not sig >> 23:
                        continue  # not a normal binary32 significand
                    for sign in (0, 1):
                        out.append((sign << 31) | (e32 << 23) | (sig & 0x7FFFFF))
    out += [0x477FF000, 0x477FEFFF, 0x477FF001, 0x477FE000, 0x477FFFFF, 0x47800000, 0x7F7FFFFF,
            0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000, 0x33C00000, 0x387FE000, 0x387FDFFF, 0x387FF000]
    return np.array(out, dtype=np.uint32)


def test_fp32_rounding_vectors_hit_the_boundaries():
    v = fp32_rounding_vectors(np.random.default_rng(0))
    assert v.size > 1000
    # Each of: exact ties among subnormal and normal results, overflow and underflow must be present.
    mag = (v & 0x7FFFFFFF).view(np.float32).astype(np.float64)
    assert np.count_nonzero(mag == 65520.0) >= 1
    z = fp16.from_f32(v) & 0x7FFF
    assert np.count_nonzero(z == 0x7C00) > 50 and np.count_nonzero(z == 0) > 50
    assert np.count_nonzero((z > 0) & (z < 0x400)) > 300


def test_fp16_to_fp32_matches_golden(backend):
    rng = np.random.default_rng(41)
    # The compiled simulator converts every binary16 value; Amaranth's the edge cases and random ones.
    if backend.name == "verilator":
        a = np.arange(1 << 16, dtype=np.uint16)
    else:
        a = np.concatenate([FP16_EDGE, random_fp16(rng, vector_count(backend, 4000))])
    run = run_unit(backend, FPConvert(src=FP16, dst=FP32), pack([(a, 16)]), seed=41)
    got = field(run.outputs["o"], 0, 32, np.uint32)
    want = fp16.to_f32(a)
    assert np.array_equal(got, want), hexdiff({"a": a}, got, want)


def test_fp32_to_fp16_matches_golden(backend):
    rng = np.random.default_rng(42)
    n = vector_count(backend, 1000, 100_000)
    # Uniform bit patterns mostly overflow or underflow; also draw values inside binary16's range.
    in_range = ((rng.integers(0, 2, n).astype(np.uint32) << 31) | (rng.integers(100, 144, n).astype(np.uint32)
                                                                   << 23) | rng.integers(0, 1 << 23, n)
                ).astype(np.uint32)
    a = np.concatenate([FP32_EDGE, fp32_rounding_vectors(rng), random_fp32(rng, n), in_range])
    run = run_unit(backend, FPConvert(src=FP32, dst=FP16), pack([(a, 32)]), seed=42)
    got = field(run.outputs["o"], 0, 16, np.uint16)
    want = fp16.from_f32(a)
    assert np.array_equal(got, want), hexdiff({"a": a}, got, want)


@pytest.mark.parametrize("src,dst", [(FP16, FP32), (FP32, FP16)], ids=["fp16-fp32", "fp32-fp16"])
def test_full_rate_is_one_result_per_cycle(backend, src, dst):
    n = 500
    rng = np.random.default_rng(43)
    a = (random_fp16 if src is FP16 else random_fp32)(rng, n)
    run = run_unit(backend, FPConvert(src=src, dst=dst), pack([(a, src.width)]), traffic="full")
    assert run.cycles == n + FPConvert.latency
    want = fp16.to_f32(a) if src is FP16 else fp16.from_f32(a)
    assert np.array_equal(field(run.outputs["o"], 0, dst.width, want.dtype), want)


def test_user_sideband_travels_with_its_result(backend):
    n = 300
    rng = np.random.default_rng(44)
    a = random_fp32(rng, n)
    tags = rng.integers(0, 1 << 5, n)
    run = run_unit(backend, FPConvert(src="fp32", dst="fp16", user_width=5), pack([(a, 32), (tags, 5)]),
                   seed=44)
    assert np.array_equal(field(run.outputs["o"], 16, 5, np.uint16), tags)
    assert np.array_equal(field(run.outputs["o"], 0, 16, np.uint16), fp16.from_f32(a))


def test_bad_parameters():
    for src, dst in ((FP16, FP16), (FP32, FP32), ("fp32", "fp32")):
        with pytest.raises(ValueError, match=r"does not support .*; allowed: fp16->fp32, fp32->fp16"):
            FPConvert(src=src, dst=dst)
    with pytest.raises(ValueError, match="unknown float format 'bf16'"):
        FPConvert(src="bf16", dst=FP32)
    with pytest.raises(ValueError, match="user_width must be >= 0"):
        FPConvert(user_width=-1)
