# amaranth: UnusedElaboratable=no
import numpy as np
import pytest

from hdl.fp import FP32
from hdl.fp.max import FPMax
from sim.golden import fp16
from fp_util import FP16_EDGE, operand_pairs, pack, field, run_unit, hexdiff, vector_count


def _check(backend, a, b, *, seed, **kwargs):
    run = run_unit(backend, FPMax(), pack([(a, 16), (b, 16)]), seed=seed, **kwargs)
    out = run.outputs["o"]
    z, lt, eq, un = fp16.max_cmp(a, b)
    for name, lo, width, want in (("z", 0, 16, z), ("a_lt_b", 16, 1, lt), ("a_eq_b", 17, 1, eq),
                                  ("unordered", 18, 1, un)):
        got = field(out, lo, width, np.uint16)
        want = np.asarray(want).astype(np.uint16)
        assert np.array_equal(got, want), f"{name}: " + hexdiff({"a": a, "b": b}, got, want)
    return run


def test_max_matches_golden(backend):
    rng = np.random.default_rng(51)
    a, b = operand_pairs(rng, vector_count(backend))
    # Equal operands and equal magnitudes of opposite sign (the eq / -0 vs +0 paths).
    extra = np.concatenate([FP16_EDGE, rng.integers(0, 1 << 16, 200).astype(np.uint16)])
    a = np.concatenate([a, extra, extra])
    b = np.concatenate([b, extra, extra ^ np.uint16(0x8000)])
    _check(backend, a, b, seed=51)


def test_full_rate_is_one_result_per_cycle(backend):
    n = 500
    rng = np.random.default_rng(52)
    a, b = operand_pairs(rng, n)
    a, b = a[-n:], b[-n:]
    run = _check(backend, a, b, seed=0, traffic="full")
    assert run.cycles == n + FPMax.latency


def test_user_sideband_travels_with_its_result(backend):
    n = 300
    rng = np.random.default_rng(53)
    a, b = rng.integers(0, 1 << 16, (2, n)).astype(np.uint16)
    tags = rng.integers(0, 1 << 11, n)
    run = run_unit(backend, FPMax(user_width=11), pack([(a, 16), (b, 16), (tags, 11)]), seed=53)
    assert np.array_equal(field(run.outputs["o"], 19, 11, np.uint16), tags)
    assert np.array_equal(field(run.outputs["o"], 0, 16, np.uint16), fp16.max_cmp(a, b)[0])


def test_output_layout():
    dut = FPMax(user_width=3)
    dut._MustUse__silence = True  # only its signature is inspected
    layout = dut.o.payload.shape()
    assert {name: (f.offset, f.width) for name, f in layout} == {
        "z": (0, 16), "a_lt_b": (16, 1), "a_eq_b": (17, 1), "unordered": (18, 1), "user": (19, 3)}


def test_bad_parameters():
    with pytest.raises(ValueError, match="FPMax supports fmt=FP16 only, got 'fp32'"):
        FPMax(fmt=FP32)
    with pytest.raises(ValueError, match="user_width must be >= 0"):
        FPMax(user_width=-1)
