"""DIMM-PIM fused-kernel performance model (sim/perf/pim.py): command-level exactness against
firmware/pim_stream.all_bank_schedule, counts, refresh modes, calibration, system bandwidth, ranksets."""

from dataclasses import replace

import pytest

from firmware.pim_stream import all_bank_schedule, schedule_end
from hdl.memctl.commands import Cmd
from hdl.pim.config import PAPER, TINY
from sim.dram.checker import check_trace
from sim.perf.pim import PIMPerfModel, _Rank, calibrate, rankset_sim, system_bandwidth, bus_bandwidth_gbps


@pytest.mark.parametrize("rows,n,refresh", [(3, 128, False), (40, 128, True), (60, 37, True), (5, 1, True),
                                            (100, 128, True), (30, 64, False)])
def test_row_stream_matches_all_bank_schedule(rows, n, refresh):
    """The model's RD_AB stream lands on the schedule's last cycle exactly, REFs included."""
    tm = PAPER.dram.timing
    s = all_bank_schedule(PAPER.dram, rows, n, refresh=refresh)
    r = _Rank(tm, tm.tREFI)
    assert r.stream([n] * rows, in_head_refresh=refresh) == schedule_end(s)
    assert r.refs == sum(c.kind is Cmd.REF for c in s)
    assert r.rds == sum(c.kind is Cmd.RD_AB for c in s)


def test_head_stream_matches_schedule_of_full_rows():
    """L = 4096 on PAPER: 8 K rows + 8 V rows of 128 RD_ABs each = the 16-row all-bank program."""
    m = PIMPerfModel(PAPER, refresh="in_head")
    h = m.head(4096)
    assert (h.score_rd_ab, h.context_rd_ab, h.rows) == (1024, 1024, 16)
    assert h.command_cycles == schedule_end(all_bank_schedule(PAPER.dram, 16, 128)) + 1


def test_counts_and_partial_rows():
    m = PIMPerfModel(PAPER)
    assert m.score_rd_ab(1) == 4 and m.context_rd_ab(1) == 1
    assert m.score_rd_ab(131072) == 32768 and m.context_rd_ab(131072) == 32768
    assert m.head_runs(100) == [28, 25]
    t = PIMPerfModel(TINY)
    assert t.head_runs(200) == [32, 20, 32, 18]


def test_refresh_modes_and_utilization():
    m = PIMPerfModel(PAPER)
    tm = PAPER.dram.timing
    short, long_ = m.head(16384), m.head(32768)
    assert short.refresh_mode == "between" and short.refs == 0
    assert long_.refresh_mode == "in_head" and long_.refs == long_.command_cycles // tm.tREFI
    # one row of 128 RD_ABs costs tRCD + 127 tCCD_L + tRTP + tRPab: the stream is ~95% of the ideal
    assert 0.95 < short.utilization < 0.96
    per = m.heads_period(4096)
    assert 0.95 < m.ideal_cycles(4096) / per < 0.97
    assert m.heads_period(4096) > m.head(4096).cycles  # refresh costs in steady state
    with pytest.raises(ValueError, match="max_tokens"):
        m.head(131073)
    with pytest.raises(ValueError, match="refresh"):
        PIMPerfModel(PAPER, refresh="x")


def test_calibration_hook():
    truth = PIMPerfModel(PAPER, fixed_cycles=57)
    pts = [(L, truth.head(L).cycles) for L in (64, 256, 1000)]
    cal, res = calibrate(PIMPerfModel(PAPER), pts)
    assert cal.fixed_cycles == 57 and res == [0, 0, 0]
    with pytest.raises(ValueError):
        calibrate(PIMPerfModel(PAPER), [])


def test_system_bandwidth_table2():
    s = system_bandwidth(PAPER)
    assert s["ranks"] == 64
    assert s["pim_peak"] == pytest.approx(13107.2)         # L3 Table 2: 13.0 TB/s (DIMM-PIM)
    assert abs(s["pim_peak"] / 1000 - 13.0) < 0.15
    assert bus_bandwidth_gbps(PAPER) == pytest.approx(409.6)  # 16 x 3200 MT/s x 8 B; L3: "406GB/s (CPU)"
    assert abs(s["bus"] - 406) / 406 < 0.01


@pytest.mark.parametrize("ranks", [2, 4])
def test_rankset_fraction(ranks):
    r = rankset_sim(PAPER, ranks, writes=1024, L=4096)
    ideal = (ranks - 1) / ranks
    assert ideal - 0.01 < r.preserved <= ideal + 0.002
    assert 0 <= r.contention_loss < 0.01
    assert r.write_gbps > 0.9 * r.dq_peak_gbps


@pytest.mark.parametrize("ranks", [2, 4])
def test_rankset_trace_is_legal(ranks):
    """The writer + PIM command trace passes the independent JEDEC checker (sim/dram/checker.py)."""
    trace = []
    rankset_sim(PAPER, ranks, writes=600, L=2048, trace=trace)
    org = replace(PAPER.dram.org, ranks=ranks)
    assert {c.kind for c in trace} >= {Cmd.ACT, Cmd.WR, Cmd.PRE, Cmd.ACT_AB, Cmd.RD_AB, Cmd.PREA}
    assert check_trace(trace, replace(PAPER.dram, org=org)) == []


def test_overlapped_heads_steady_state():
    """Overlapped heads (the rank PU's S0 S1 C0 S2 C1 ...): per head only its rows, 48 cycles per row more than
    its RD_ABs at tCCD_L (DDR4-3200: tRCD + tRTP + tRPab - tCCD_L); fixed_cycles only when two heads' e_t do
    not fit the rank buffer (TINY: 4 KiB = 2K tokens, so L = 2K runs sequentially)."""
    tm = TINY.dram.timing
    m = PIMPerfModel(TINY, fixed_cycles=280)
    row_change = tm.tRCD + tm.tRTP + tm.tRPab - tm.tCCD_L
    assert row_change == 48
    for L in (64, 512, 1024):
        h = m.head(L)
        assert m.overlaps(L)
        assert m.steady_head_cycles(L) == h.rd_ab * tm.tCCD_L + h.rows * row_change
        assert m.heads_period(L, heads=8) <= m.steady_head_cycles(L) + 1
    assert not m.overlaps(2048)
    seq = PIMPerfModel(TINY, fixed_cycles=280, overlap=False)
    # sequential: the next ACT_AB fixed_cycles + 1 after the last PREA instead of tRPab
    assert seq.steady_head_cycles(1024) == m.steady_head_cycles(1024) + 280 + 1 - tm.tRPab
    assert m.steady_head_cycles(2048) > m.head(2048).command_cycles
    # PAPER: 256 KB rank buffer, so heads of up to 64K tokens overlap; at 2K the steady state is within 5 %
    # of the all-bank ideal (refresh excluded): 4 + 4 rows of 128 RD_ABs
    p = PIMPerfModel(PAPER, fixed_cycles=400)
    assert p.overlaps(2048) and not p.overlaps(65537)
    assert p.steady_head_cycles(2048) / p.ideal_cycles(2048, refresh=False) < 1.05


def test_sequence_model_arguments_and_single_heads():
    """PIMSequenceModel: bad arguments are named; a single head's command count is the mapping's; the calibrated
    micro model exists (data/pim_rtl_calibration.json) and matches the single-head cycles measured with it."""
    import json
    from sim.perf.pim import PIMSequenceModel, SeqLaunch, CALIBRATION_FILE, calibration_key, load_calibration
    from sim.pim.fused import micro
    with pytest.raises(ValueError, match="gap must be an int"):
        PIMSequenceModel(TINY, gap=-1, tail=0)
    m = PIMSequenceModel(TINY, gap=149, tail=130)
    with pytest.raises(ValueError, match=r"L = 0 outside \[1, config.max_tokens = 2048\]"):
        m.run([0])
    r = m.run([SeqLaunch(100), SeqLaunch(37, k_row0=4)])
    n_rd = sum(-(-L // 16) * 4 + -(-L // 4) for L in (100, 37))
    assert sum(k is Cmd.RD_AB for _, k, _, _ in r.commands) == n_rd
    assert all(b[0] > a[0] for a, b in zip(r.commands, r.commands[1:]))     # one command per cycle
    assert r.heads[0].done < r.heads[1].done
    cfg = micro(16)
    c = load_calibration(cfg)
    data = json.loads(CALIBRATION_FILE.read_text())["configs"][calibration_key(cfg)]
    seq = PIMSequenceModel.calibrated(cfg)
    for L, cyc in data["rtl_head_cycles"].items():
        h = seq.run([int(L)]).heads[0]
        assert h.done - h.first_cmd + 1 == cyc
    assert PIMPerfModel.calibrated(cfg).fixed_cycles == c["fixed_cycles"]
    with pytest.raises(ValueError, match="no RTL calibration"):
        load_calibration(replace(cfg, head_dim=32, name="x"))


def test_paper_model_is_the_paper_rtl_calibration():
    """paper_model() / paper_sequence_model(): the PAPER rank (128 bank PUs, d = 128) with the latencies measured
    on its RTL (`python -m sim.bench.pim --calibrate paper`, data/pim_rtl_calibration.json): fixed_cycles
    is the measured one (not 0), every single-head RTL measurement of that command is reproduced (the per-head
    model at the fit's lengths within 1 %, the sequence model exactly, incl. a one-chunk head), and the steady
    state of overlapped heads within 1 %."""
    import json
    from sim.perf.pim import paper_model, paper_sequence_model, CALIBRATION_FILE, calibration_key
    data = json.loads(CALIBRATION_FILE.read_text())["configs"][calibration_key(PAPER)]
    m = paper_model()
    assert m.config is PAPER and m.fixed_cycles == data["fixed_cycles"] > 0
    seq = paper_sequence_model()
    for L in data["lengths"]:
        rtl = data["rtl_head_cycles"][str(L)]
        assert abs(m.head(L).cycles - rtl) / rtl <= 0.01, (L, m.head(L).cycles, rtl)
        st = data["rtl_steady_cycles"][str(L)]
        assert abs(m.steady_head_cycles(L) - st) / st <= 0.01, (L, m.steady_head_cycles(L), st)
    for L, rtl in data["rtl_head_cycles"].items():
        h = seq.run([int(L)]).heads[0]
        assert h.done - h.first_cmd + 1 == rtl, (L, h.done - h.first_cmd + 1, rtl)
    assert "1" in data["rtl_head_cycles"]       # the one-chunk head (gap1) is measured
    assert paper_model(overlap=False).overlap is False
