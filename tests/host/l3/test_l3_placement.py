"""Rankset placement (L3 5.1) and the PIM phase: layers alternate ranksets, heads spread over channels, classes
balanced; transfers and the command-bus rate (the timeline of a phase: test_l3_comm.py)."""

import numpy as np
import pytest

from host.l3.config import l3_setup
from host.l3.pim_side import PIMSide, RanksetPlacement


def test_layers_alternate_ranksets_and_balance():
    p = RanksetPlacement(8, 4)
    c = p.place(0, 1000)
    layers = np.arange(96)
    rs = p.rankset(np.full(96, 0), layers)
    assert np.array_equal(rs, (layers + c) % 4)                 # layer by layer, alternating
    assert np.all(np.diff(rs) % 4 == 1)
    np.testing.assert_array_equal(p.layers_per_rankset(0, 96), [24, 24, 24, 24])
    assert set(p.layers_per_rankset(0, 66).tolist()) <= {16, 17}   # within one layer when R does not divide


def test_heads_spread_over_channels():
    np.testing.assert_array_equal(RanksetPlacement.heads_per_channel(96, 16), np.full(16, 6))
    np.testing.assert_array_equal(RanksetPlacement.heads_per_channel(72, 4), np.full(4, 18))
    h = RanksetPlacement.heads_per_channel(10, 4)
    assert h.sum() == 10 and h.max() - h.min() <= 1
    assert l3_setup("opt-66b").heads_per_rank == 18 and l3_setup("gpt-175b").heads_per_rank == 6


def test_balanced_classes_follow_the_load():
    p = RanksetPlacement(6, 3)
    got = [p.place(i, t) for i, t in enumerate([900, 100, 100, 50, 500, 10])]
    assert got[:3] == [0, 1, 2]                                   # empty classes first
    assert got == [0, 1, 2, 1, 2, 1]                              # then always the least-loaded class
    np.testing.assert_array_equal(p.load, np.bincount(got, weights=[900, 100, 100, 50, 500, 10],
                                                      minlength=3).astype(int))
    p.grow([1, 2], [150, 130])
    assert p.load.sum() == 900 + 150 + 130 + 50 + 500 + 10
    p.release([0, 4])
    assert p.load.sum() == 150 + 130 + 50 + 10 and p.cls[0] == -1
    # balanced placement keeps the classes within one request of each other; random placement does not
    rng = np.random.default_rng(0)
    toks = rng.integers(1000, 2000, 400)
    bal, rnd = RanksetPlacement(400, 4), RanksetPlacement(400, 4, policy="random", seed=1)
    for i, t in enumerate(toks):
        bal.place(i, int(t))
        rnd.place(i, int(t))
    assert bal.load.max() - bal.load.min() <= toks.max()
    assert rnd.load.max() - rnd.load.min() > toks.max()
    with pytest.raises(ValueError):
        RanksetPlacement(4, 4, policy="hash")


def test_transfers_and_sync_offload():
    s = l3_setup("gpt-175b")
    pim = PIMSide(s)
    vec = 96 * 128 * 2
    assert pim.qkv_bytes == 3 * vec and pim.out_bytes == vec
    bw = s.host_link_gbps * 1e9
    assert float(pim.transfer_in(10)) == pytest.approx(10 * 3 * vec / bw + s.host_link.rtt_ns * 1e-9)
    assert float(pim.transfer_in(0)) == 0.0
    assert pim.sync_offload([100]) == pytest.approx(96 * 100 * 2 * 96 * 128 * 2 / pim.write_Bps)


def test_command_bus_rate_counts_the_busy_ranksets():
    """On the shared command path (the labelled option) the busy ranksets share the channel's bus; on the rank
    PUs' own paths (the default, L3 4 / 5.1) a computing rankset keeps its rate however many compute."""
    s16 = l3_setup("gpt-175b", ranksets=16)
    pim = PIMSide(s16, command_path="shared")
    L = np.full(2, 8001)
    few = pim.phase(L, [0, 1])                                    # two busy ranksets of 16: the bus is not full
    assert few.compute.max() == pytest.approx(pim.class_cycles(L, [0, 1]).max() * pim.tck)
    many = pim.phase(np.full(16, 8001), np.arange(16))            # all 16 busy: 16 x 0.121 commands per cycle
    assert many.compute.max() > 1.9 * few.compute.max()
    own = PIMSide(s16)
    assert own.command_path == "per_rank"
    assert own.phase(np.full(16, 8001), np.arange(16)).compute.max() == pytest.approx(
        own.phase(L, [0, 1]).compute.max())
