"""The host's closed-form DIMM-PIM timing against the performance model sim/perf/pim.py (PAPER geometry)."""

import numpy as np
import pytest

from hdl.pim.config import PAPER
from sim.perf.pim import PIMPerfModel, rankset_sim
from host.l3.pim_timing import (COMMAND_PATHS, PIMTiming, RanksetModel, pim_perf_model, pim_timing,
                                rankset_model)

LENGTHS = [1, 2, 15, 16, 17, 63, 64, 100, 511, 512, 513, 2048, 6000, 16383, 16384, 25000, 40000, 65535, 65536,
           65537, 100000, 131071, 131072]


def test_reads_the_model_through_one_function():
    m = pim_perf_model()
    assert m.config is PAPER and m.refresh == "auto" and m.overlap
    assert pim_timing().fixed_cycles == m.fixed_cycles


@pytest.mark.parametrize("fixed", [0, 400])
def test_steady_equals_model(fixed):
    model = PIMPerfModel(PAPER, fixed_cycles=fixed)
    t = PIMTiming(model)
    got = t.steady_cycles(np.array(LENGTHS))
    want = np.array([model.steady_head_cycles(L) for L in LENGTHS])
    np.testing.assert_array_equal(got, want)
    # a broken closed form (row cost without tRTP) is caught by the same comparison
    t._base -= 1
    assert np.any(t.steady_cycles(np.array(LENGTHS)) != want)


def test_refresh_included_matches_heads_period():
    t = pim_timing()
    rng = np.random.default_rng(3)
    Ls = rng.integers(1, PAPER.max_tokens + 1, 12)
    got = t.head_cycles(Ls)
    want = np.array([t.model.heads_period(int(L)) for L in Ls])
    assert np.max(np.abs(got / want - 1)) < 6e-3     # the model's period itself wobbles by ~0.5 % with L
    # without the refresh factor the error is the refresh overhead (~4 %): the check can fail
    assert np.max(np.abs(t.steady_cycles(Ls) / want - 1)) > 0.03


def test_rank_cycles_and_bounds():
    t = pim_timing()
    assert t.rank_cycles([]) == 0.0
    L = np.array([1000, 2000])
    assert t.rank_cycles(L, heads_each=3) == pytest.approx(t.fixed_cycles + 3 * t.head_cycles(L).sum())
    with pytest.raises(ValueError, match="outside"):
        t.steady_cycles([0])
    with pytest.raises(ValueError, match="outside"):
        t.steady_cycles([PAPER.max_tokens + 1])


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_rankset_model_against_rankset_sim(ranks):
    rs = rankset_model("shared")
    sim = rankset_sim(PAPER, ranks)
    assert rs.preserved(ranks) == pytest.approx(sim.preserved, rel=0.015)
    assert rs.channel_write_gbps == pytest.approx(sim.write_gbps)


def test_rankset_command_bus_saturates():
    rs = rankset_model("shared")
    assert rs.compute_rate(4) == 1.0 and rs.compute_rate(8) == 1.0
    assert rs.compute_rate(16) < 0.6             # 16 computing ranks need ~1.9 commands per cycle
    assert rs.compute_rate(1, writer=True) == 0.0


def test_rankset_per_rank_command_path():
    """The default command path: each rank PU drives its own rank ([L3] 4), so a computing rank keeps its rate
    however many ranks its channel computes or receives with; one rank of four receiving keeps 75 % of the
    channel's compute ([L3] 5.1). The RTL measurement it is held to: tests/sim/pim/test_pim_rankset_rtl.py."""
    rs = rankset_model()
    assert rs.command_path == "per_rank" and rankset_model("per_rank") is rs
    for k in (1, 2, 4, 8, 16, 32):
        assert rs.compute_rate(k) == 1.0
        assert rs.compute_rate(k, writer=True) == (0.0 if k == 1 else 1.0)
    assert rs.preserved(4) == pytest.approx(0.75)
    shared = rankset_model("shared")
    assert shared.compute_rate(16) < 0.6 < rs.compute_rate(16)       # the shared bus saturates, per rank does not
    assert rs.channel_write_gbps == shared.channel_write_gbps        # the host's writes use the channel either way
    from sim.pim.rankset import COMMAND_PATHS as RTL_PATHS     # the RTL's names are the model's
    assert set(RTL_PATHS) == set(COMMAND_PATHS)
    with pytest.raises(ValueError, match="command_path"):
        rankset_model("per-dimm")
    with pytest.raises(ValueError, match="command_path"):
        RanksetModel(pim_timing(), "bus")


def test_cli_pim_command_path_option():
    """``--pim-command-path`` on ``ndpim l3 run / sweep / figures``: parsed, refused outside COMMAND_PATHS, and
    passed on as the ``pim_command_path`` system option (absent: the default, per_rank)."""
    import argparse
    from host.l3.cli import add_parser, _system_kw
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="cmd"))
    base = ["l3", "run", "--model", "opt-66b", "--trace", "dolphin", "--system", "l3", "--out", "/tmp/x"]
    a = ap.parse_args(base + ["--pim-command-path", "shared"])
    assert _system_kw(a)["pim_command_path"] == "shared"
    assert "pim_command_path" not in _system_kw(ap.parse_args(base))
    for cmd in (["l3", "sweep", "--out", "/tmp/x"], ["l3", "figures", "--out", "/tmp/x"]):
        assert ap.parse_args(cmd + ["--pim-command-path", "per_rank"]).pim_command_path == "per_rank"
        with pytest.raises(SystemExit):
            ap.parse_args(cmd + ["--pim-command-path", "bus"])
