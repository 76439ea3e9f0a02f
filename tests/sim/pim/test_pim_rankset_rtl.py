"""Ranksets in RTL ([L3] 5.1; sim/pim/rankset.py, issue 14 item 2) at the smallest case that shows the overlap:
``RanksetSystem(micro(16))`` -- one channel, two ranks of 2 chips x 4 banks (8 bank PUs each), the host memory
controller with the spoofed SPD timing writing through the buffer chip's re-layout unit, one command bus.

Rank 0 computes 4 heads of L = 64 while the host writes the KV cache of a 16-token head (64 WR bursts) into
rank 1; then rank 1's PU takes its rank and computes the head it received. Against two more runs of the same
build without host traffic (both ranks computing; rank 0 alone), RD_ABs counted in the write window
(:func:`sim.pim.rankset.rankset_rtl`). Checks: compute preserved > 0 while the host writes, every head
bit-exact (the written one included), 0 checker / device-model violations, no error bits, and the RTL's
preserved fraction and command-bus loss within 0.01 of the command-level model :func:`sim.perf.pim.rankset_sim`
of the same configuration and write count (measured: 0.5000 / 0 on both sides; micro has one bank group, so the
host writes every tCCD_L and a RD_AB needs one bus slot per tCCD_L too: nothing collides -- the contention case
is TINY's, ``make bench-pim`` (j), RTL 0.4988 vs model 0.4979).

Cost: ~17 s CPU with a warm Verilator cache (Verilog generation ~15 s, four runs of ~2.5K cycles); the build is
keyed by the Verilog text (the KV image is the device model's init), ~75 s CPU more when cold."""

import pytest

from hdl.memctl.commands import Cmd
from sim.perf.pim import rankset_sim
from sim.pim.fused import micro
from sim.pim.rankset import rankset_rtl

CFG = micro(16)
BOUND = 0.01


@pytest.fixture(scope="module")
def measured():
    r = rankset_rtl(CFG, L=64, heads=4, write_L=16, backend="verilator")
    # the model's heads must outlast the write window: L = 256 (micro's rank buffer), one head of 2K cycles
    m = rankset_sim(CFG, 2, writes=r.writes, L=256)
    return r, m


def test_rankset_rtl_overlap(measured):
    r, m = measured
    print(f"micro rankset: RTL window {r.window}, {r.writes} WRs, {r.write_gbps:.2f} GB/s of {r.dq_peak_gbps:.1f}, "
          f"preserved {r.preserved:.4f}, bus loss {r.contention_loss:.4f}, RD_ABs {r.rd_ab_with_comm} / "
          f"{r.rd_ab_all_compute} / {r.rd_ab_alone}; model window {m.window_cycles}, preserved {m.preserved:.4f}, "
          f"bus loss {m.contention_loss:.4f}; runs {r.runs}")
    assert r.bitexact and r.violations == 0 and r.errors == 0, r.runs
    assert r.writes == 64 and 0 < r.write_gbps <= r.dq_peak_gbps
    # rank 0 kept computing while rank 1 received: RD_ABs in the write window, as many as the two ranks
    # computing together leave to one of them
    assert r.rd_ab_with_comm > 0 and 0 < r.preserved <= 0.5 + BOUND
    assert abs(r.preserved - m.preserved) <= BOUND, (r.preserved, m.preserved)
    assert abs(r.contention_loss - m.contention_loss) <= BOUND, (r.contention_loss, m.contention_loss)
    assert all(v["cycles"] > r.window for v in r.runs.values())   # every run outlasts the window
