"""More rank-PU adders than chips leave the head's cycles unchanged, on the RTL (the micro channel: 2 chips, so 4
adders are 2 more than the score tree and the per-chip accumulator lanes use; hdl/pim/adder_unit.py). The PAPER
counts 16 / 32 / 64 were measured the same way against 8 by ``python -m sim.bench.pim --calibrate paper-a<N>``
(data/pim_rtl_calibration.json, docs/dse.md); this holds the effect on a channel small enough for a test."""

from dataclasses import replace

from sim.perf.pim import load_calibration
from sim.pim.fused import PIMChannelSystem, micro, rtl_cycles


def test_extra_rank_adders_leave_the_rtl_head_cycles_unchanged():
    base = micro(16)
    more = replace(base, rank_adders=2 * base.chips, name=f"{base.name}-a{2 * base.chips}")
    cal = load_calibration(base)                   # micro's entry, measured on its RTL with rank_adders = chips
    assert base.rank_adders == base.chips
    L = 64
    r = rtl_cycles(more, (L,), heads=3, component=PIMChannelSystem(more, None, fast=True))[L]
    assert r["head_cycles"] == cal["rtl_head_cycles"][str(L)]
    assert (r["gap"], r["tail"]) == (cal["gap"], cal["tail"])
