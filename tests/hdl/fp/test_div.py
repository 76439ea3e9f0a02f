# amaranth: UnusedElaboratable=no
import numpy as np
import pytest

from hdl.fp import FP32
from hdl.fp.div import FPDiv
from sim.golden import fp16
from fp_util import operand_pairs, pack, field, run_unit, hexdiff, vector_count


def _check(backend, a, b, *, seed, **kwargs):
    run = run_unit(backend, FPDiv(), pack([(a, 16), (b, 16)]), seed=seed, **kwargs)
    got = field(run.outputs["o"], 0, 16, np.uint16)
    want = fp16.div(a, b)
    assert np.array_equal(got, want), hexdiff({"a": a, "b": b}, got, want)
    return run


def _fp16(sign, exp, frac):
    return ((sign.astype(np.uint32) << 15) | (exp.astype(np.uint32) << 10) | frac.astype(np.uint32)).astype(
        np.uint16)


def test_div_matches_golden(backend):
    rng = np.random.default_rng(31)
    a, b = operand_pairs(rng, vector_count(backend))
    _check(backend, a, b, seed=31)


def test_div_subnormal_overflow_and_tie_results(backend):
    """Quotients steered into the subnormal range, underflow to zero, and the overflow threshold.

    Division has no exact ties among normal results, but subnormal results do: with ``b`` a power of two the
    quotient is exact and is shifted right into the subnormal range, dropping exactly-halfway bit patterns.
    """
    rng = np.random.default_rng(32)
    n = vector_count(backend, 2000, 50_000)
    sa, sb = rng.integers(0, 2, (2, n))
    fa, fb = rng.integers(0, 1 << 10, (2, n))
    ea = rng.integers(0, 31, n)  # including subnormal operands (exponent field 0)
    # Exponent difference ea - eb: -27..-13 gives subnormal results and underflow, +14..+17 the overflow edge.
    diff = np.where(rng.random(n) < 0.7, rng.integers(-27, -12, n), rng.integers(14, 18, n))
    eb = np.clip(ea - diff, 0, 30)
    ea = np.clip(eb + diff, 0, 30)
    # A third of the divisors are powers of two (exact quotients, so subnormal ties to even occur).
    fb = np.where(rng.random(n) < 1 / 3, 0, fb)
    a, b = _fp16(sa, ea, fa), _fp16(sb, eb, fb)
    _check(backend, a, b, seed=32)
    # The steering must reach the interesting cases, or this test proves little.
    want = fp16.div(a, b) & 0x7FFF
    assert np.count_nonzero((want > 0) & (want < 0x400)) > n // 4
    assert np.count_nonzero(want == 0x7C00) > n // 20
    assert np.count_nonzero(want == 0) > n // 20


def test_full_rate_is_one_result_per_cycle(backend):
    n = 500
    rng = np.random.default_rng(33)
    a, b = operand_pairs(rng, n)
    a, b = a[-n:], b[-n:]
    run = _check(backend, a, b, seed=0, traffic="full")
    assert run.cycles == n + FPDiv.latency


def test_user_sideband_travels_with_its_result(backend):
    n = 300
    rng = np.random.default_rng(34)
    a, b = rng.integers(0, 1 << 16, (2, n)).astype(np.uint16)
    tags = rng.integers(0, 1 << 9, n)
    run = run_unit(backend, FPDiv(user_width=9), pack([(a, 16), (b, 16), (tags, 9)]), seed=34)
    assert np.array_equal(field(run.outputs["o"], 16, 9, np.uint16), tags)
    assert np.array_equal(field(run.outputs["o"], 0, 16, np.uint16), fp16.div(a, b))


def test_bad_parameters():
    with pytest.raises(ValueError, match="FPDiv supports fmt=FP16 only, got 'fp32'"):
        FPDiv(fmt=FP32)
    with pytest.raises(ValueError, match="user_width must be >= 0"):
        FPDiv(user_width=-1)
