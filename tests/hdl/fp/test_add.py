import numpy as np
import pytest

from hdl.fp import FPAdd, FP16, FP32
from sim.golden import fp16, fp32
from fp_util import operand_pairs, pack, field, run_unit, hexdiff, vector_count


@pytest.mark.parametrize("fmt", [FP16, FP32], ids=lambda f: f.name)
def test_add_matches_golden(backend, fmt):
    rng = np.random.default_rng(21 + fmt.width)
    a, b = operand_pairs(rng, vector_count(backend), fmt)
    run = run_unit(backend, FPAdd(fmt=fmt), pack([(a, fmt.width), (b, fmt.width)]), seed=fmt.width)
    got = field(run.outputs["o"], 0, fmt.width, a.dtype)
    want = (fp16 if fmt is FP16 else fp32).add(a, b)
    assert np.array_equal(got, want), hexdiff({"a": a, "b": b}, got, want)


@pytest.mark.parametrize("fmt", [FP16, FP32], ids=lambda f: f.name)
def test_full_rate_is_one_result_per_cycle(backend, fmt):
    n = 400
    rng = np.random.default_rng(22)
    a, b = operand_pairs(rng, n, fmt)
    a, b = a[-n:], b[-n:]
    run = run_unit(backend, FPAdd(fmt=fmt), pack([(a, fmt.width), (b, fmt.width)]), traffic="full")
    assert run.cycles == n + FPAdd.latency
    want = (fp16 if fmt is FP16 else fp32).add(a, b)
    assert np.array_equal(field(run.outputs["o"], 0, fmt.width, a.dtype), want)


def test_stall_holds_output(backend):
    """With the output never ready for a long stretch, nothing is lost or duplicated."""
    from sim.backends import Traffic
    n = 64
    a = np.arange(n, dtype=np.uint16) + np.uint16(0x3C00)
    b = np.full(n, 0x3C00, dtype=np.uint16)
    ready = np.zeros(200, dtype=bool)
    ready[150:] = True
    run = run_unit(backend, FPAdd(), pack([(a, 16), (b, 16)]), traffic=Traffic(ready={"o": ready}))
    assert np.array_equal(field(run.outputs["o"], 0, 16, np.uint16), fp16.add(a, b))
