"""Section 5.1's communication costs on the timeline of a PIM phase (constructed cases): the monolithic DIMM-PIM
stops every rank for any transfer, a rank that receives cannot compute, every transfer pays its set-up, and L3's
rankset transfers hide what the monolithic design pays."""

import numpy as np
import pytest

from host.l3.config import l3_setup
from host.l3.pim_side import HANDOVER, PIMSide

X = 400_000.0            # full-rate cycles of one class's decodes in one layer (250 us at DDR4-3200)


def _sides(model="gpt-175b", ranksets=4):
    s = l3_setup(model, ranksets=ranksets)
    return PIMSide(s, comm=True), PIMSide(s, comm=False)


def test_setup_is_the_pcie_round_trip_and_the_jedec_handover():
    on, _ = _sides()
    tm = on.timing.model.tm
    # tRPab + tRCD + CWL + burst + tWR + tRP + tRCD of DDR4-3200 (L3 Table 2): 132 cycles of 0.625 ns
    assert HANDOVER.count("tRCD") == 2
    assert on.handover_cycles == tm.tRPab + 2 * tm.tRCD + tm.CWL + 4 + tm.tWR + tm.tRP == 132
    assert on.setup_s == pytest.approx(1e-6 + 132 * 0.625e-9)
    assert on.write_Bps == pytest.approx(min(4 * 31.5077e9, 16 * 24.96e9), rel=1e-3)   # PCIe-bound


def test_monolithic_pim_computes_nothing_while_any_transfer_runs():
    _, off = _sides()
    S, bw = off.setup_s, off.write_Bps
    cyc = np.array([X, X / 2, X / 4, 0.0])
    nd = np.array([2, 1, 1, 0])
    wb = np.array([0.0, 0.0, 0.0, 8e6])                   # a prefill write into the idle rankset 3
    p = off.timeline(cyc, nd, wb)
    t_in = S + 4 * off.qkv_bytes / bw
    t_wr = S + 8e6 / bw
    t_out = S + 4 * off.out_bytes / off.read_Bps
    assert (p.t_in, p.write, p.t_out) == pytest.approx((t_in, t_wr, t_out))
    # every transfer stops every rank, even the write into a rankset that computes nothing: all in series
    assert p.total == pytest.approx(t_in + X * off.tck + t_wr + t_out)
    np.testing.assert_allclose(p.stalled[:3], t_wr)      # the write ran while ranksets 0-2 had work: all stalled
    np.testing.assert_allclose(p.compute, cyc * off.tck)  # they computed at full rate, only between transfers
    assert p.transfers == 3                               # one transfer per kind
    assert p.busy == pytest.approx(p.total)


def test_a_receiving_rankset_cannot_compute_the_others_can():
    on, _ = _sides()
    S, bw = on.setup_s, on.write_Bps
    cyc = np.array([X, X, 0.0, 0.0])
    nd = np.array([1, 1, 0, 0])
    t_in = S + on.qkv_bytes / bw
    t_out = S + on.out_bytes / on.read_Bps
    base = on.timeline(cyc, nd, np.zeros(4))
    # decode Q/K/V land rankset by rankset: rankset 1 computes only after its own arrived, rankset 0 meanwhile
    assert base.total == pytest.approx(2 * t_in + X * on.tck + t_out)
    assert base.t_in == pytest.approx(2 * t_in) and base.transfers == 4
    # prefill KV into rankset 0 (computing): only rankset 0 stops, for exactly the write; rankset 1 goes on
    wb = np.array([20e6, 0.0, 0.0, 0.0])
    t_wr = S + 20e6 / bw
    w = on.timeline(cyc, nd, wb)
    assert w.stalled[0] == pytest.approx(t_wr) and w.stalled[1] == 0.0
    np.testing.assert_allclose(w.compute, cyc * on.tck)
    assert w.total == pytest.approx(t_in + t_wr + X * on.tck + t_out)       # rankset 0 ends last now
    # the same write into an idle rankset costs no compute at all
    idle = on.timeline(cyc, nd, np.array([0.0, 0.0, 20e6, 0.0]))
    assert idle.stalled.sum() == 0.0
    assert idle.total == pytest.approx(base.total)
    # a mutant that lets the receiving rankset compute would end as the base case: this one does not
    assert w.total > base.total + 0.9 * t_wr - t_in


def test_every_transfer_pays_its_setup():
    on, off = _sides()
    cyc = np.full(4, X)
    nd = np.full(4, 3)
    wb = np.full(4, 1e6)
    t = {}
    for side in (on, off):
        S = side.setup_s
        t[side.comm, S] = side.timeline(cyc, nd, wb)
        side.setup_s = 0.0
        t[side.comm, 0.0] = side.timeline(cyc, nd, wb)
        side.setup_s = S
    S = on.setup_s
    # monolithic: 3 transfers, all on the critical path
    assert t[False, S].transfers == 3
    assert t[False, S].total - t[False, 0.0].total == pytest.approx(3 * S)
    # rankset transfers: 4 in + 4 out + 4 writes = 12 set-ups on the channel path
    assert t[True, S].transfers == 12
    assert t[True, S].t_in - t[True, 0.0].t_in == pytest.approx(4 * S)
    assert t[True, S].t_out - t[True, 0.0].t_out == pytest.approx(4 * S)
    assert t[True, S].write - t[True, 0.0].write == pytest.approx(4 * S)
    # the GPU's synchronous offload (5.1 off) pays one set-up per layer; L3's one per layer and receiving class
    nl, kvb = on.n_layers, on.kv_layer_bytes
    assert off.offload([100, 50], [0, 2]) == pytest.approx(nl * (S + 150 * kvb / off.write_Bps))
    assert on.offload([100, 50], [0, 2]) == pytest.approx(nl * (2 * S + 150 * kvb / on.write_Bps))
    assert on.offload([]) == 0.0


def test_l3_hides_what_the_monolithic_pim_pays():
    on, off = _sides()
    L = np.full(32, 4001)
    cls = np.arange(32) % 4
    chunk = [512]
    a, m = on.phase(L, cls, chunk, [1]), off.phase(L, cls, chunk, [1])
    W = 512 * on.kv_layer_bytes / on.write_Bps
    comp = on.class_cycles(L, cls).max() * on.tck
    # monolithic: Q/K/V in, compute, prefill write, outputs out, each transfer stopping all ranks
    assert m.total == pytest.approx(m.t_in + comp + m.write + m.t_out)
    assert m.write == pytest.approx(W + off.setup_s)
    np.testing.assert_allclose(m.stalled, m.write)
    # L3: the layer's prefill KV alternates ranksets (balanced: 1/4 each), only the receiver stops
    np.testing.assert_allclose(a.writes, (W + on.setup_s) / 4)
    np.testing.assert_allclose(a.stalled, a.writes)      # each write runs while its rankset has work left
    assert a.total < comp + W / 4 + a.t_in + a.t_out + 1e-9
    assert m.total - a.total > 0.7 * W
    # with no writes the Q/K/V dependency stays on L3's critical path too (5.1: "computational-dependent")
    a0, m0 = on.phase(L, cls), off.phase(L, cls)
    assert a0.total > comp + a0.t_in / 4 and m0.total == pytest.approx(m0.t_in + comp + m0.t_out)


def test_fused_decode_runs_use_the_same_timeline():
    for side in _sides(ranksets=8):
        L = np.array([3000, 5000, 7000, 9000, 11000, 100])
        cls = np.array([0, 1, 1, 2, 5, 5])
        tot, busy = side.run_totals(L, cls, 33)
        for j in (0, 16, 32):
            ph = side.phase(L + j, cls)
            assert tot[j] == pytest.approx(side.n_layers * ph.total)
            assert busy[j] == pytest.approx(side.n_layers * ph.busy)


def test_an_iteration_of_l3_no_comm_pays_them_and_l3_hides_them():
    # one priced iteration, the same batch, placement forced equal: sub-batch 0 = 4 decodes + a 512-token prefill
    # chunk, sub-batch 1 = 4 decodes; phase A runs GPU_0 beside PIM_1, which receives the chunk's KV
    from host.serving import Batch, RequestTable
    from host.l3.systems import make_system
    s = l3_setup("gpt-175b")
    n = 9
    table = RequestTable(id=np.arange(n), arrival_s=np.zeros(n), prompt_tokens=np.full(n, 16000),
                         output_tokens=np.full(n, 100))
    b = Batch(req=np.arange(n), new_tokens=[1] * 8 + [512], context=[16000] * 8 + [0], prefill=[False] * 8 + [True],
              completes_prefill=[False] * n, sub_batch=[0, 0, 0, 0, 1, 1, 1, 1, 0])
    cls = np.array([0, 1, 2, 3, 0, 1, 2, 3, 2])
    rec, dur = {}, {}
    for name in ("l3", "l3-no-comm"):
        sysobj = make_system(name, s, profile_batches=0)
        sysobj.emit_spans = False
        sysobj.bind(table)
        sysobj.place.cls[:] = cls
        r = sysobj.price(b, 0.0)
        rec[name], dur[name] = r.record, r.duration_s
        pim, nl = sysobj.pim, sysobj.pim.n_layers
        P1 = pim.phase(np.full(4, 16001), cls[4:8], [512], [2])
        P0 = pim.phase(np.full(4, 16001), cls[:4])
        assert rec[name]["t_pim1_s"] == pytest.approx(nl * P1.total)      # the phase timelines, every layer
        assert rec[name]["t_pim0_s"] == pytest.approx(nl * P0.total)
        G, P = (rec[name][f"t_gpu{i}_s"] for i in (0, 1)), (rec[name][f"t_pim{i}_s"] for i in (0, 1))
        G0, G1 = G
        Q0, Q1 = P
        assert dur[name] == pytest.approx(max(G0, Q1) + max(G1, Q0))
        if name == "l3-no-comm":
            off = pim.offload([512])
            # the GPU waits for the synchronous offload: one transfer per layer, set-up included
            assert rec[name]["t_gpu0_s"] - rec["l3"]["t_gpu0_s"] == pytest.approx(off)
            assert off == pytest.approx(nl * (pim.setup_s + 512 * pim.kv_layer_bytes / pim.write_Bps))
            # every rank stopped for the chunk's KV: PIM_1 pays the whole write
            np.testing.assert_allclose(P1.stalled, P1.write)
    # PIM_1 receives the chunk's KV (200 us a layer, each rankset computes ~280 us): L3 stops each rankset for a
    # quarter of it, the monolithic PIM stops all for all of it; L3 saves 3/4 of it less its extra set-ups
    W = 512 * pim.kv_layer_bytes / pim.write_Bps
    assert rec["l3-no-comm"]["t_pim1_s"] - rec["l3"]["t_pim1_s"] > nl * (0.75 * W - 9 * pim.setup_s)
    # PIM_0 (decodes only, one per rankset): the Q/K/V gate every rankset in both designs; L3's four rankset
    # transfers per kind pay three more set-ups in series than the monolithic one transfer (conservative for L3)
    S, q, o = pim.setup_s, pim.qkv_bytes / pim.write_Bps, pim.out_bytes / pim.read_Bps
    assert rec["l3"]["t_pim0_s"] - rec["l3-no-comm"]["t_pim0_s"] == pytest.approx(nl * 3 * (S - o), rel=1e-6)
    assert dur["l3-no-comm"] > dur["l3"]


def test_the_placement_variant_separates_placement_from_the_transfers():
    from host.serving import RequestTable
    from host.l3.systems import make_system
    s = l3_setup("gpt-89b")
    table = RequestTable(id=np.arange(4), arrival_s=np.zeros(4), prompt_tokens=np.full(4, 10),
                         output_tokens=np.full(4, 10))
    got = {}
    for name in ("l3", "l3-no-comm", "l3-no-comm-balanced"):
        sysobj = make_system(name, s, profile_batches=0)
        sysobj.bind(table)
        got[name] = (sysobj.name, sysobj.pim.comm, sysobj.place.policy)
    assert got == {"l3": ("l3", True, "balanced"), "l3-no-comm": ("l3-no-comm", False, "random"),
                   "l3-no-comm-balanced": ("l3-no-comm-balanced", False, "balanced")}
    with pytest.raises(ValueError):
        make_system("l3", s, placement="hash")
