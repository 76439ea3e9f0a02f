"""The fused decode-attention kernel through the real RTL (sim/pim/fused.py: RankPU + bank PUs + DRAMChannel):
outputs bit-exact to sim/golden/pim_attention.py, zero DRAM timing violations (device model AND the independent
checker on the command trace), several heads back to back, padding (L not a multiple of the chunk), refresh
between heads (eager and postponed), cycle counts against the all-bank ideal.

The system is built once per module on the ``micro`` channel (2 chips x 4 banks, head dim 16: the same RTL as
TINY with every size smaller; TINY's Verilog takes minutes to generate and compile). TINY runs bit-exact in
``make bench-pim`` (``sim/bench/pim.tiny_bit_exact``) and for cycle counts in ``sim/pim/fused.rtl_cycles``."""


import numpy as np
import pytest

from hdl.memctl.commands import Cmd
from hdl.pim.mapping import head_layout, kv_store_image, score_reads, context_reads
from hdl.pim.rank_pu import RankPU, head_cycle_bound
from sim.backends import Traffic, get_backend, stream_ports
from sim.dram.checker import describe
from sim.golden.pim_attention import make_inputs, pim_attention
from sim.perf.pim import PIMSequenceModel, SeqLaunch
from sim.pim.fused import PIMChannelSystem, ideal_cycles, micro, run_fused, tiny_rows

CFG = micro(16)
TM = CFG.dram.timing
SHORT, LONG = 60, 256


def _store():
    """Heads 0, 1: L = 60 at rows 0..3; head 2: L = 256 at rows 4..11 (one image, one build)."""
    short = head_layout(CFG, SHORT, 2, row_base=0, rows=4)
    long = head_layout(CFG, LONG, 1, row_base=4, rows=12)
    KV = {}
    img = {}
    for h in range(2):
        _, K, V = make_inputs(CFG, SHORT, seed=10 + h)
        KV[h] = (K, V, short.k_row0[h], short.v_row0[h])
    _, K, V = make_inputs(CFG, LONG, seed=12)
    KV[2] = (K, V, long.k_row0[0], long.v_row0[0])
    img.update(kv_store_image(CFG, np.stack([KV[0][0], KV[1][0]]), np.stack([KV[0][1], KV[1][1]]), short))
    img.update(kv_store_image(CFG, KV[2][0], KV[2][1], long))
    return KV, img


KV, IMAGE = _store()


class _Layout:
    """run_fused's layout argument for the stored heads above (k_row0 / v_row0 by head)."""
    k_row0 = tuple(KV[h][2] for h in range(3))
    v_row0 = tuple(KV[h][3] for h in range(3))


@pytest.fixture(scope="module")
def system():
    return PIMChannelSystem(CFG, IMAGE)


@pytest.fixture(scope="module")
def verilator():
    return get_backend("verilator")


def _run(backend, system, jobs, *, traffic=None, postpone=None):
    """jobs: [(head, L, q seed)] -> (FusedRun, goldens)."""
    qs = np.array([make_inputs(CFG, 4, seed=s)[0] for _, _, s in jobs])
    Ls = [L for _, L, _ in jobs]
    heads = [h for h, _, _ in jobs]
    K = np.zeros((3, LONG, CFG.head_dim), np.uint16)   # unused by run_fused when component/layout are given
    run = run_fused(backend, CFG, K, K, qs, L=Ls, heads_order=heads, component=system, layout=_Layout,
                    traffic=traffic, postpone=postpone)
    golds = [pim_attention(CFG, q, KV[h][0][:L], KV[h][1][:L]) for (h, L, _), q in zip(jobs, qs)]
    return run, golds


def _check(run, golds, jobs):
    assert run.violations == [], describe(run.violations)
    last = run.done[-1]
    assert last["violations"] == 0 and last["errors"] == 0 and last["dropped"] == 0, last
    for i, (g, job) in enumerate(zip(golds, jobs)):
        np.testing.assert_array_equal(run.out[i], g.out, err_msg=f"launch {i} (head, L, seed) = {job}")


def _model_check(run, jobs, postpone=None):
    """The PIM model (sim/perf/pim.PIMSequenceModel with the RTL-measured gap / tail of
    data/pim_rtl_calibration.json) against this RTL run: the same command trace, cycle for cycle (all-bank rules,
    overlap and refresh decisions), and every head's cycles within 1 % (first head: first command to its last
    result; then done to done). Returns the largest relative error."""
    model = PIMSequenceModel.calibrated(CFG)
    pp = postpone or [None] * len(jobs)
    m = model.run([SeqLaunch(L, _Layout.k_row0[h], _Layout.v_row0[h], p) for (h, L, _), p in zip(jobs, pp)])
    key = lambda t, k, r, c: (t, k, r, c) if k is Cmd.RD_AB else (t, k, r) if k is Cmd.ACT_AB else (t, k)
    rtl = [key(c.cycle, c.kind, c.row, c.col) for c in run.trace if c.rank == 0]
    assert [key(*x) for x in m.commands] == rtl, "model and RTL command traces differ"
    first = next(c.cycle for c in run.trace if c.rank == 0)
    done = [d["cycle"] for d in run.done]
    rtl_heads = [done[0] - first + 1] + list(np.diff(done))
    err = max(abs(a - b) / a for a, b in zip(rtl_heads, m.head_cycles()))
    assert err <= 0.01, (rtl_heads, m.head_cycles())
    assert [d["refreshes"] for d in run.done] == [h.refreshes for h in m.heads]
    return err


def _print_cycles(run, jobs):
    prev = None
    for i, ((h, L, _), rec) in enumerate(zip(jobs, run.done)):
        gap = rec["cycle"] - prev if prev is not None else rec["cycle"]
        print(f"launch {i}: head {h} L {L:4d}: done at {rec['cycle']:7d} (+{gap:6d}), all-bank ideal "
              f"{ideal_cycles(CFG, L):6d}")
        prev = rec["cycle"]


def test_fused_kernel(backend, system, verilator):
    """Heads back to back, L with padding (7, 13, 33: not multiples of the chunk), random handshakes."""
    if backend.name == "verilator":
        backend = verilator   # the module's instance: it holds the executable of `system` (no regeneration)
    if backend.name == "amaranth":
        jobs = [(0, 24, 1), (1, 7, 2)]
    else:
        jobs = [(0, 60, 1), (1, 13, 2), (0, 33, 3), (1, 1, 4), (2, 200, 5), (1, 59, 6), (0, 48, 7)]
    traffic = Traffic.random(stream_ports(system), seed=5)
    run, golds = _run(backend, system, jobs, traffic=traffic)
    _check(run, golds, jobs)
    _print_cycles(run, jobs)
    # every command of the program is in the trace: per head ceil(L/B) bpt score and ceil(L/G) context RD_ABs
    n_rd = sum(-(-L // CFG.banks) * CFG.bursts_per_token + -(-L // CFG.token_sets) for _, L, _ in jobs)
    assert sum(c.kind is Cmd.RD_AB for c in run.trace) == n_rd


def test_fused_cycles_and_bounds(verilator, system):
    """One head from reset, full-rate streams: score RD_ABs exactly tCCD_L apart within a row, the context
    phase too once the probabilities flow; the head inside the refresh-decision bound; ratio to the ideal."""
    jobs = [(2, LONG, 9)]
    run, golds = _run(verilator, system, jobs)
    _check(run, golds, jobs)
    rd = [c.cycle for c in run.trace if c.kind is Cmd.RD_AB]
    nS = -(-LONG // CFG.banks) * CFG.bursts_per_token
    cpr = CFG.columns_per_row
    for phase in (rd[:nS], rd[nS:]):
        gaps = np.diff(phase)
        in_row = [g for i, g in enumerate(gaps) if (i + 1) % cpr]
        assert set(in_row) == {TM.tCCD_L}, sorted(set(in_row))
        # a row change costs tRTP + tRPab + tRCD (PREA, ACT_AB, first RD_AB), nothing more
        assert set(g for i, g in enumerate(gaps) if (i + 1) % cpr == 0) <= {TM.tRTP + TM.tRPab + TM.tRCD}
    first = run.trace[0].cycle
    head = run.done[0]["cycle"] - first + 1
    bound = head_cycle_bound(CFG, LONG, drain=RankPU.drain_bound(CFG))
    ideal = ideal_cycles(CFG, LONG)
    print(f"L = {LONG}: {head} cycles, all-bank ideal {ideal} (ratio {head / ideal:.3f}); score->context gap "
          f"{rd[nS] - rd[nS - 1]} cycles; refresh-decision bound {bound}")
    assert ideal < head <= bound
    assert _model_check(run, jobs) == 0
    # the model at more lengths: one head from reset each (padding: 17 and 101 are not multiples of the chunk)
    for L in (1, 17, 101):
        jobs = [(2, L, 10 + L)]
        run, golds = _run(verilator, system, jobs)
        _check(run, golds, jobs)
        assert _model_check(run, jobs) == 0


def _refs(run):
    return [c.cycle for c in run.trace if c.kind is Cmd.REF and c.rank == 0]


def test_refresh_between_heads_eager(verilator, system):
    """postpone = 0: the first head boundary after each tREFI refreshes; every REF sits between two heads."""
    jobs = [(h % 2, SHORT, 20 + h) for h in range(32)]
    run, golds = _run(verilator, system, jobs, postpone=[0] * len(jobs))
    _check(run, golds, jobs)
    assert _model_check(run, jobs, postpone=[0] * len(jobs)) == 0
    refs = _refs(run)
    assert len(refs) >= 1 and refs[0] >= TM.tREFI, refs
    assert run.done[-1]["urgent"] == 0
    # between heads: the last command before each REF is a PREA and no row is open until the next ACT_AB
    kinds = [c.kind for c in run.trace if c.rank == 0]
    for i, k in enumerate(kinds):
        if k is Cmd.REF:
            assert kinds[i - 1] in (Cmd.PREA, Cmd.REF) and (i + 1 == len(kinds) or kinds[i + 1] in (Cmd.ACT_AB,
                                                                                                  Cmd.REF))
    print(f"eager: {len(jobs)} heads, {run.done[-1]['cycle']} cycles, REFs at {refs}")


def test_refresh_postponed(verilator, system):
    """postpone = 8 (default): no REF until the next head would cross the JESD79-4 limit (9 tREFI after
    reset); then REFs at head boundaries keep the channel legal -- the checker's T_REFI rule and the device's
    counter both stay at zero over > 10 tREFI."""
    n = 10 * TM.tREFI // 2300 + 4
    jobs = [(2, LONG, 40 + h) for h in range(n)]
    run, golds = _run(verilator, system, jobs)
    _check(run, golds, jobs)
    assert _model_check(run, jobs) == 0
    refs = _refs(run)
    end = run.done[-1]["cycle"]
    assert end > 10 * TM.tREFI
    assert refs and refs[0] > 8 * TM.tREFI - head_cycle_bound(CFG, LONG, drain=RankPU.drain_bound(CFG)), refs
    assert run.done[-1]["urgent"] == 0
    print(f"postponed: {n} heads, {end} cycles, REFs at {refs}")


def test_fused_intermediates_amaranth(system):
    """softmax=False test mode: the rank adder tree's scores s_t (with -inf padding) bit-exact, and the
    context path fed with the golden probabilities."""
    sysd = PIMChannelSystem(CFG, IMAGE, softmax=False)
    L = 13
    q = make_inputs(CFG, 4, seed=3)[0]
    g = pim_attention(CFG, q, KV[1][0][:L], KV[1][1][:L])
    G = CFG.token_sets
    pw = [int.from_bytes(g.p[v * G:(v + 1) * G].astype("<u2").tobytes(), "little") for v in range(-(-L // G))]
    K = np.zeros((3, LONG, CFG.head_dim), np.uint16)
    run = run_fused("amaranth", CFG, K, K, q, L=L, heads_order=[1], component=sysd, layout=_Layout, softmax=False,
                    p_words=pw)
    assert run.violations == []
    np.testing.assert_array_equal(run.scores, g.score)
    np.testing.assert_array_equal(run.out[0], g.out)


def _rows_of(L, phase):
    n = -(-L // CFG.banks) * CFG.bursts_per_token if phase == "S" else -(-L // CFG.token_sets)
    return n, -(-n // CFG.columns_per_row)


def test_overlapped_heads_steady_state(verilator, system):
    """Heads overlapped (S0 S1 C0 S2 C1 ..., [L3] 4.3): 8 back-to-back heads at full rate take no more than
    their RD_ABs at tCCD_L + 48 cycles per row change + one fill / tail + 4 cycles per launch, and every
    steady-state head costs exactly its RD_ABs + its two row changes; then a mix of lengths (head 2's L = 200
    does not fit the rank buffer with a neighbour: sequential fallback) under random result / done
    backpressure and launch gaps stays bit-exact with zero violations."""
    from sim.pim.fused import phase_order
    L = SHORT
    jobs = [(h % 2, L, 60 + h) for h in range(8)]
    run, golds = _run(verilator, system, jobs)
    _check(run, golds, jobs)
    assert _model_check(run, jobs) == 0
    order = phase_order(CFG, [L] * len(jobs))
    assert order[:3] == [(0, "S"), (1, "S"), (0, "C")]
    tr = [c for c in run.trace if c.rank == 0]
    rd = [c.cycle for c in tr if c.kind is Cmd.RD_AB]
    n_rd = sum(_rows_of(L, ph)[0] for _, ph in order)
    rows = sum(_rows_of(L, ph)[1] for _, ph in order)
    assert len(rd) == n_rd and sum(c.kind is Cmd.ACT_AB for c in tr) == rows
    row_change = TM.tRTP + TM.tRPab + TM.tRCD - TM.tCCD_L   # 48 (DDR4-3200)
    span = run.done[-1]["cycle"] - tr[0].cycle + 1
    fill_tail = TM.tRCD + 150     # first ACT_AB -> RD_AB, last context RD_AB -> last result (micro: 66)
    assert span <= n_rd * TM.tCCD_L + (rows - 1) * row_change + fill_tail + 4 * len(jobs), span
    # steady state: every RD_AB gap is tCCD_L in a row or exactly one row change -- no score->context gap
    assert set(np.diff(rd)) <= {TM.tCCD_L, TM.tCCD_L + row_change}
    per_head = np.diff([d["cycle"] for d in run.done])[1:-1]
    want = (_rows_of(L, "S")[0] + _rows_of(L, "C")[0]) * TM.tCCD_L + 2 * row_change
    assert set(per_head) == {want}, (per_head, want)
    print(f"8 x L = {L}: {span} cycles, per head {want} (all-bank ideal {ideal_cycles(CFG, L)})")

    jobs = [(0, 60, 70), (1, 13, 71), (0, 33, 72), (1, 1, 73), (2, 200, 74), (1, 59, 75), (0, 48, 76), (1, 7, 77),
            (0, 24, 78), (1, 60, 79)]
    rng = np.random.default_rng(8)
    traffic = Traffic(valid={"launch": rng.random(4099) < 0.8},
                      ready={"result": rng.random(4099) < 0.5, "done": rng.random(4099) < 0.5})
    run, golds = _run(verilator, system, jobs, traffic=traffic)
    _check(run, golds, jobs)
    # heads did overlap: a score RD_AB of one head directly followed by a context RD_AB of another (S1 C0)
    region = {}
    for h, Lh in ((0, SHORT), (1, SHORT), (2, LONG)):
        for r in score_reads(CFG, Lh, _Layout.k_row0[h]).row.tolist():
            region[r] = ("K", h)
        for r in context_reads(CFG, Lh, _Layout.v_row0[h]).row.tolist():
            region[r] = ("V", h)
    seq = [region[c.row] for c in run.trace if c.kind is Cmd.RD_AB]
    ss = sum(a[0] == "K" and b[0] == "V" and a[1] != b[1] for a, b in zip(seq, seq[1:]))
    assert ss >= 3, seq
    print(f"mixed lengths, random backpressure: {ss} overlapped score phases, done at {run.done[-1]['cycle']}")


def test_fast_build_equals_inline(verilator, system):
    """The Verilator fast build (one compiled bank-PU module with public_flat_rd inputs and -fno-dfg, the KV cache
    a run-time image; what the TINY / PAPER benches use) gives the inline build's outputs, trace and done records,
    bit for bit; a changed image needs no rebuild and changes the outputs."""
    fast = PIMChannelSystem(CFG, IMAGE, fast=True)
    assert fast.verilator_flags() == ["-fno-dfg"] and system.verilator_flags() == []
    assert "/*verilator public_flat_rd*/" in fast.verilog_modules()[0]
    jobs = [(0, 60, 1), (2, 101, 2), (1, 5, 3)]
    a, golds = _run(verilator, system, jobs)
    b, _ = _run(verilator, fast, jobs)
    _check(b, golds, jobs)
    assert [(c.cycle, c.kind, c.row, c.col) for c in b.trace] == [(c.cycle, c.kind, c.row, c.col) for c in a.trace]
    assert b.done == a.done and b.cycles == a.cycles
    exe = verilator._exes[fast]
    fast.set_image({addr: v ^ 1 << 10 for addr, v in IMAGE.items()})   # an exponent bit of one element per word
    c, _ = _run(verilator, fast, jobs[:1])
    assert verilator._exes[fast] == exe and not np.array_equal(c.out[0], golds[0].out)
