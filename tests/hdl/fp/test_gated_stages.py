# amaranth: UnusedElaboratable=no
"""Clock-gated pipeline stages (hdl/fp/pipeline.py: ``stage_domains``, ``gated_domain``) under Verilator: two FP
units whose stages share gated clocks, driven by independent random traffic with backpressure, give the golden
bits; a gate that misses one unit's loads is caught."""

import numpy as np
import pytest
from amaranth.hdl import Cat, Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.fp import FPAdd, FPMul, FP16
from hdl.fp.pipeline import gated_domain
from sim.backends import Traffic, get_backend, stream_ports
from sim.golden import fp16
from fp_util import operand_pairs, pack, field


class _SharedGates(wiring.Component):
    """Two units of ``cls``; stage k of both in the gated domain ``s<k>``, enabled when either loads stage k
    (``only_first``: a broken gate, enabled by the first unit's loads alone)."""

    def __init__(self, cls, *, only_first=False, load_first=True):
        self.cls, self.only_first, self.load_first = cls, only_first, load_first
        proto = cls(fmt=FP16)
        layout_i, layout_o = proto.i.payload.shape(), proto.o.payload.shape()
        super().__init__({"i0": In(stream.Signature(layout_i)), "i1": In(stream.Signature(layout_i)),
                          "o0": Out(stream.Signature(layout_o)), "o1": Out(stream.Signature(layout_o))})

    def elaborate(self, platform):
        m = Module()
        doms = [f"s{k + 1}" for k in range(self.cls.latency)]
        units = [self.cls(fmt=FP16, stage_domains=doms, load_first=self.load_first) for _ in range(2)]
        for j, u in enumerate(units):
            m.submodules[f"u{j}"] = u
            wiring.connect(m, wiring.flipped(getattr(self, f"i{j}")), u.i)
            wiring.connect(m, u.o, wiring.flipped(getattr(self, f"o{j}")))
        for k, d in enumerate(doms):
            gated_domain(m, d, units[0].stage_load[k] if self.only_first else Cat(u.stage_load[k] for u in units).any())
        return m


def _run(dut, seed, n=600):
    rng = np.random.default_rng(seed)
    a, b = operand_pairs(rng, 2 * n, FP16)
    a, b = a[-2 * n:], b[-2 * n:]
    ops = {"i0": (a[:n], b[:n]), "i1": (a[n:], b[n:])}
    tr = Traffic.random(stream_ports(dut), seed=seed, valid_prob=0.5, ready_prob=0.6)
    run = get_backend("verilator").run_streams(
        dut, {k: pack([(x, 16), (y, 16)]) for k, (x, y) in ops.items()}, {"o0": n, "o1": n}, traffic=tr)
    return ops, run


@pytest.mark.parametrize("cls, golden", [(FPAdd, fp16.add), (FPMul, fp16.mul)], ids=["add", "mul"])
def test_shared_gated_stages_match_golden(cls, golden):
    """Both units' stages on shared gated clocks: in many ticks one unit loads and the other does not (and may be
    stalled by its output); every result is the golden one, with the first stage written only when it loads
    or in every tick (``load_first``)."""
    for load_first in (True, False):
        ops, run = _run(_SharedGates(cls, load_first=load_first), seed=3)
        for port, (x, y) in zip(("o0", "o1"), ops.values()):
            got = field(run.outputs[port], 0, 16, np.uint16)
            assert np.array_equal(got, golden(x, y)), (cls.__name__, load_first, port)


def test_a_gate_missing_loads_is_caught():
    """The mutant: the shared clocks enabled by unit 0's loads only; unit 1's results are wrong."""
    ops, run = _run(_SharedGates(FPAdd, only_first=True), seed=3)
    (x0, y0), (x1, y1) = ops.values()
    assert np.array_equal(field(run.outputs["o0"], 0, 16, np.uint16), fp16.add(x0, y0))
    assert not np.array_equal(field(run.outputs["o1"], 0, 16, np.uint16), fp16.add(x1, y1))


def test_stage_domains_checked():
    with pytest.raises(ValueError, match="stage_domains must name 4 clock domains"):
        FPAdd(stage_domains=["s1", "s2"])
    with pytest.raises(ValueError, match="stage_domains must name 3 clock domains"):
        FPMul(stage_domains=["s1", "", "s3"])
