# amaranth: UnusedElaboratable=no
import numpy as np
import pytest

from hdl.fp import FPMAC
from sim.golden import fp16
from sim.verify.fpcheck import mac_operands
from fp_util import pack, field, run_unit, hexdiff, vector_count


@pytest.mark.parametrize("acc", ["fp16", "fp32"])
def test_mac_matches_golden(backend, acc):
    rng = np.random.default_rng(31 if acc == "fp16" else 32)
    a, b, c = mac_operands(rng, vector_count(backend, 2000, 50_000), acc)
    w = 16 if acc == "fp16" else 32
    run = run_unit(backend, FPMAC(acc=acc), pack([(a, 16), (b, 16), (c, w)]), seed=w)
    got = field(run.outputs["o"], 0, w, c.dtype)
    want = fp16.mac(a, b, c, acc=acc)
    assert np.array_equal(got, want), hexdiff({"a": a, "b": b, "c": c}, got, want)


def test_mac_full_rate_and_sideband(backend):
    n = 300
    rng = np.random.default_rng(33)
    a, b, c = mac_operands(rng, n, "fp32")
    a, b, c = a[-n:], b[-n:], c[-n:]
    tags = np.arange(n) % 32
    run = run_unit(backend, FPMAC(acc="fp32", user_width=5), pack([(a, 16), (b, 16), (c, 32), (tags, 5)]),
                   traffic="full")
    assert run.cycles == n + FPMAC.latency
    assert np.array_equal(field(run.outputs["o"], 0, 32, np.uint32), fp16.mac(a, b, c, acc="fp32"))
    assert np.array_equal(field(run.outputs["o"], 32, 5, np.uint8), tags)


def test_bad_accumulator_name():
    with pytest.raises(ValueError, match=r"acc must be one of \['fp16', 'fp32'\], got 'bf16'"):
        FPMAC(acc="bf16")
