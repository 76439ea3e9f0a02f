# amaranth: UnusedElaboratable=no
import numpy as np
import pytest

from hdl.fp import FPMul, FP16, FP32
from sim.golden import fp16
from fp_util import operand_pairs, pack, field, run_unit, hexdiff, vector_count


def test_fp16_mul_matches_golden(backend):
    rng = np.random.default_rng(11)
    a, b = operand_pairs(rng, vector_count(backend))
    run = run_unit(backend, FPMul(), pack([(a, 16), (b, 16)]), seed=1)
    got = field(run.outputs["o"], 0, 16, np.uint16)
    want = fp16.mul(a, b)
    assert np.array_equal(got, want), hexdiff({"a": a, "b": b}, got, want)


def test_fp16_to_fp32_product_is_exact(backend):
    rng = np.random.default_rng(12)
    a, b = operand_pairs(rng, vector_count(backend, 2000, 50_000))
    run = run_unit(backend, FPMul(fmt=FP16, out_fmt=FP32), pack([(a, 16), (b, 16)]), seed=2)
    got = field(run.outputs["o"], 0, 32, np.uint32)
    want = fp16.mul_wide(a, b)
    assert np.array_equal(got, want), hexdiff({"a": a, "b": b}, got, want)


def test_full_rate_is_one_result_per_cycle(backend):
    n = 500
    rng = np.random.default_rng(13)
    a, b = rng.integers(0, 1 << 16, (2, n)).astype(np.uint16)
    run = run_unit(backend, FPMul(), pack([(a, 16), (b, 16)]), traffic="full")
    assert run.cycles == n + FPMul.latency
    assert np.array_equal(field(run.outputs["o"], 0, 16, np.uint16), fp16.mul(a, b))


def test_user_sideband_travels_with_its_result(backend):
    n = 300
    rng = np.random.default_rng(14)
    a, b = rng.integers(0, 1 << 16, (2, n)).astype(np.uint16)
    tags = np.arange(n) % 128
    run = run_unit(backend, FPMul(user_width=7), pack([(a, 16), (b, 16), (tags, 7)]), seed=4)
    assert np.array_equal(field(run.outputs["o"], 16, 7, np.uint16), tags)
    assert np.array_equal(field(run.outputs["o"], 0, 16, np.uint16), fp16.mul(a, b))


def test_bad_parameters():
    with pytest.raises(ValueError, match="user_width must be >= 0"):
        FPMul(user_width=-1)
