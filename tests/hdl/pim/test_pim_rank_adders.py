"""Rank-PU parameters outside the calibration's measured set, on the RTL. More rank-PU adders than chips leave the
head's cycles unchanged (the micro channel: 2 chips, so 4 adders are 2 more than the score tree and the per-chip
accumulator lanes use; hdl/pim/adder_unit.py). The PAPER counts 16 / 32 / 64 were measured the same way against 8
by ``python -m sim.bench.pim --calibrate paper-a<N>`` (data/pim_rtl_calibration.json, docs/dse.md); this holds the
effect on a channel small enough for a test. And a larger rank buffer leaves a single head's cycles unchanged."""

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


def test_a_larger_rank_buffer_leaves_a_single_heads_rtl_cycles_unchanged():
    """The calibration key leaves the rank buffer out: a head's datapath latencies do not depend on it (measured
    here on micro with twice the buffer). The buffer still bounds the longest head and which heads overlap
    (PIMPerfModel.overlaps), which is why ndpim dse does not sweep it (host/dse/space.py NOT_SWEPT)."""
    base = micro(16)
    big = replace(base, rank_buffer_bytes=2 * base.rank_buffer_bytes, name=f"{base.name}-buf2x")
    cal = load_calibration(base)
    L = 64
    r = rtl_cycles(big, (L,), heads=3, component=PIMChannelSystem(big, None, fast=True))[L]
    assert r["head_cycles"] == cal["rtl_head_cycles"][str(L)]
    assert (r["gap"], r["tail"]) == (cal["gap"], cal["tail"])
