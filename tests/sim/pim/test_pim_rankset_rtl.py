# amaranth: UnusedElaboratable=no
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
keyed by the Verilog text (the KV image is the device model's init), ~75 s CPU more when cold.

The rank PU's own command path (issue 31 item 1; docs/pim_perf.md "The command path of a rank"):
``RanksetSystem(micro(16, ranks=4), command_path="per_rank")`` -- four ranks, each rank PU driving its own rank
(one device model per rank), the channel's C/A bus carrying the host's commands: ranks 0-2 compute 4 heads of
L = 64 each while the host writes a 16-token head into rank 3, which then computes it. Checks: every head
bit-exact, 0 violations of the JEDEC checker on each rank's own trace and of the four device models, the
computing ranks' RD_AB rate with the host writing / without held to ``RanksetModel("per_rank")`` (1.0) and the
compute preserved to its (R - 1) / R = 0.75 ([L3] 5.1), within 0.01. Mutants: the per-rank checker catches a
RD_AB moved one cycle early and another rank's commands on a rank's path. On the same build, refresh: each
computing rank's PU refreshes its rank on its own path past tREFI, the host's REFs reach only the host-mode rank.
Cost: ~80 s wall cold (build), ~20 s warm; the four-rank TINY run is
``make bench-pim`` (j)."""

from dataclasses import replace

import pytest

from hdl.memctl.commands import Cmd, Violation
from sim.perf.pim import rankset_sim
from sim.pim.fused import micro
from sim.pim.rankset import (RanksetSystem, rankset_rtl, rankset_image, check_rank_traces, split_image,
                             with_ranks, rank_dram_config)

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


# ---- the rank PU's own command path (per_rank), four ranks -------------------------------------------------------

CFG4 = micro(16, ranks=4)


@pytest.fixture(scope="module")
def per_rank_system():
    """One build for every per-rank test: the system and the backend that holds its executable."""
    from sim.backends import get_backend
    lay, Ks, Vs, img = rankset_image(CFG4, 64)
    return RanksetSystem(CFG4, img, command_path="per_rank"), lay, Ks, Vs, get_backend("verilator")


@pytest.fixture(scope="module")
def measured_per_rank(per_rank_system):
    system, be = per_rank_system[0], per_rank_system[-1]
    return rankset_rtl(CFG4, L=64, heads=4, write_L=16, backend=be, system=system)


def test_rankset_per_rank_rtl(measured_per_rank):
    from host.l3.pim_timing import RanksetModel, pim_timing
    r = measured_per_rank
    model = RanksetModel(pim_timing(), "per_rank")
    print(f"micro 4-rank per_rank: window {r.window}, {r.writes} WRs, {r.write_gbps:.2f} GB/s, preserved "
          f"{r.preserved:.4f}, rank rates {r.rank_rates}, head cycles {r.head_cycles_comm} (host writing) / "
          f"{r.head_cycles_quiet} (alone); RD_ABs {r.rd_ab_with_comm} / {r.rd_ab_all_compute} / {r.rd_ab_alone}; "
          f"runs {r.runs}")
    assert r.ranks == 4 and r.command_path == "per_rank"
    assert r.bitexact and r.violations == 0 and r.errors == 0, r.runs
    assert r.writes == 64 and 0 < r.write_gbps <= r.dq_peak_gbps
    assert len(r.rank_rates) == 3 and min(r.rd_ab_rank_comm) > 0
    # the computing ranks' rate while the host writes into rank 3, against the model
    assert abs(r.compute_rate - model.compute_rate(4, writer=True)) <= BOUND, r.rank_rates
    assert abs(r.head_rate - model.compute_rate(4, writer=True)) <= BOUND, (r.head_cycles_comm, r.head_cycles_quiet)
    assert abs(r.preserved - model.preserved(4)) <= BOUND, r.preserved          # [L3] 5.1: 75 %
    # each rank's own path carried only its rank's commands; the host's writes reached rank 3 only
    comm = r.traces["comm"]
    assert all(c.rank == k for k in range(4) for c in comm[k])
    assert sum(c.kind is Cmd.WR for c in comm[3]) == r.writes
    assert not any(c.kind in (Cmd.WR, Cmd.ACT, Cmd.PRE) for k in range(3) for c in comm[k])
    # on its own path a computing rank issues the same commands in the same cycles with and without the host, so
    # its heads end in the same cycles (mutation check, run once: the same run on command_path="shared" keeps the
    # window rates 1.0 and preserved 0.75 at micro, but its head cycles differ (rate 0.9988) and no computing rank's
    # trace is equal)
    assert all(comm[k] == r.traces["quiet"][k] for k in range(3))
    assert r.head_cycles_comm == r.head_cycles_quiet
    assert all(v["cycles"] > r.window for v in r.runs.values())


def test_rankset_per_rank_checker_mutants(measured_per_rank):
    """The per-rank JEDEC check passes the measured traces and fails on two mutants: a RD_AB one cycle early
    (tCCD_L) and rank 1's commands on rank 0's path (what one command path for two ranks without arbitration
    would carry)."""
    tr = [list(t) for t in measured_per_rank.traces["comm"]]
    dram = CFG4.dram
    assert check_rank_traces(tr, dram) == {}
    tccd = CFG4.dram.timing.tCCD_L
    i = next(k for k in range(1, len(tr[0])) if tr[0][k].kind is tr[0][k - 1].kind is Cmd.RD_AB
             and tr[0][k].cycle - tr[0][k - 1].cycle == tccd)
    early = [list(t) for t in tr]
    early[0][i] = replace(early[0][i], cycle=early[0][i].cycle - 1)
    bad = check_rank_traces(early, dram)
    assert list(bad) == [0] and any(v.violation is Violation.T_CCD_L for v in bad[0])
    mixed = [sorted(tr[0] + [replace(c, rank=0, cycle=c.cycle + 1) for c in tr[1]], key=lambda c: c.cycle)] + tr[1:]
    assert 0 in check_rank_traces(mixed, dram)


def test_rankset_per_rank_refresh(per_rank_system):
    """Refresh on the rank's own path ([L3] 4.4): ranks 0-2 compute 40 heads each (~2 tREFI, every launch with
    ``postpone = 0``: refresh at the next head boundary once one REF is owed) while rank 3 stays in host mode.
    Every REF on a computing rank's path is its rank PU's (as many as the PU counts; the host's REFs to those
    ranks are dropped), the host's REFs reach rank 3 only, every head bit-exact, 0 violations."""
    import numpy as np
    from sim.dram.trace import decode_trace
    from sim.golden.pim_attention import make_inputs, pim_attention
    from sim.pim.fused import encode_launch, decode_done
    system, lay, Ks, Vs, be = per_rank_system
    tm, d, H = CFG4.dram.timing, CFG4.head_dim, 40
    qs = [make_inputs(CFG4, 4, seed=300 + i)[0] for i in range(2)]
    gold2 = [pim_attention(CFG4, qs[j], Ks[j], Vs[j]).out for j in range(2)]
    gold = [gold2[i % 2] for i in range(H)]
    inputs = {f"launch{r}": [encode_launch(CFG4, 64, lay[r].k_row0[i % 2], lay[r].v_row0[i % 2], qs[i % 2],
                                           postpone=0) for i in range(H)] for r in range(3)}
    inputs.update({"launch3": [], "host": []})
    exp = {"host_o": 0, "result3": 0, "done3": 0}
    exp.update({f"result{r}": d * H for r in range(3)})
    exp.update({f"done{r}": H for r in range(3)})
    exp.update({s: None for s in system.trace_streams() + system.error_streams()})
    res = be.run_streams(system, inputs, exp, max_cycles=200_000)
    org = CFG4.dram.org
    per = [decode_trace(res.outputs[f"trace{r}"], org) for r in range(4)]
    # the host's REF timer of rank 3 first fires at tREFI + 3 tREFI / 4 (hdl/memctl/controller.py: staggered)
    assert res.cycles > tm.tREFI + 3 * tm.tREFI // 4 + tm.tRFC
    assert check_rank_traces(per, CFG4.dram, end_cycle=res.cycles) == {}
    assert not any(res.outputs[s] for s in system.error_streams())
    for r in range(3):
        out = np.array(res.outputs[f"result{r}"], np.uint16).reshape(-1, d)
        assert all(np.array_equal(o, g) for o, g in zip(out, gold)) and len(out) == H
        dn = decode_done(res.outputs[f"done{r}"])
        refs = [c.cycle for c in per[r] if c.kind is Cmd.REF]
        assert len(refs) >= 1 and len(refs) == dn[-1]["refreshes"], (r, refs, dn[-1])
        assert min(refs) >= tm.tREFI and dn[-1]["errors"] == 0 and dn[-1]["violations"] == 0
    host3 = [c for c in per[3] if c.kind is Cmd.REF]
    print(f"per-rank refresh: {res.cycles} cycles; REF cycles, ranks 0-2 (their PUs): "
          f"{[[c.cycle for c in per[r] if c.kind is Cmd.REF] for r in range(3)]}; rank 3 (the host): "
          f"{[c.cycle for c in host3]}")
    assert len(host3) >= 1 and all(c.kind is Cmd.REF for c in per[3])     # rank 3: the host's REFs only


def test_rankset_system_options():
    """No build: the parameters and the per-rank image split."""
    with pytest.raises(ValueError, match="command_path"):
        RanksetSystem(CFG, command_path="per-dimm")
    with pytest.raises(ValueError, match="host_rank"):
        RanksetSystem(CFG4, host_rank=4)
    with pytest.raises(ValueError, match=">= 2 ranks"):
        RanksetSystem(with_ranks(CFG, 1))
    org = CFG4.dram.org
    per = org.banks * org.rows * org.bursts_per_row
    imgs = split_image(org, {5: 1, per + 7: 2, 3 * per: 3, 2 * per + 1: 0})
    assert imgs == [{5: 1}, {7: 2}, None, {0: 3}]
    with pytest.raises(ValueError, match="outside"):
        split_image(org, {4 * per: 1})
    one = rank_dram_config(CFG4.dram)
    assert one.org.ranks == 1 and one.timing == CFG4.dram.timing and one.org.rows == org.rows
    assert with_ranks(CFG4, 4) is CFG4 and with_ranks(CFG, 4).dram.org.ranks == 4
