# amaranth: UnusedElaboratable=no
"""BankPU (hdl/pim/bank_pu.py): bit-exact vs sim/golden/pim_bank, latency / interval / cycle model, handshakes,
the clock-gated variant (Verilator)."""

from dataclasses import replace

import numpy as np
import pytest

from amaranth.hdl import Cat, Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.fp.pipeline import gated_domain
from hdl.pim.bank_pu import BankPU, MODE_SCORE, MODE_CONTEXT, GATE_DOMAINS
from hdl.pim.config import TINY, PAPER
from sim.backends import SimulationTimeout, Traffic, stream_ports
from sim.golden import pim_bank
from fp_util import FP16_EDGE

S, C = MODE_SCORE, MODE_CONTEXT
BPT = TINY.bursts_per_token     # 4 bursts per token per chip (score jobs)

# Mixed job sequences (mode, items): score tokens of bpt bursts, one-item jobs (back-to-back `first`
# items), context jobs of many tokens, both mode switches.
JOBS = [(S, BPT), (S, BPT), (S, 1), (S, 1), (C, 5), (C, 1), (C, 17), (S, BPT), (S, 2), (C, 3), (S, BPT),
        (S, 1), (S, 1), (S, 1), (S, 1), (S, 1), (S, 1), (C, 2), (C, 8)]


@pytest.fixture(scope="module")
def unit():
    return BankPU(TINY)


def fp16_data(rng, shape, *, edge_frac):
    """FP16 patterns ~ N(0, 1), with ``edge_frac`` of them replaced by curated edge encodings (+-0,
    subnormals, +-max, +-inf, NaN, ...)."""
    x = rng.standard_normal(shape).astype(np.float16).view(np.uint16)
    pick = rng.random(shape) < edge_frac
    x[pick] = rng.choice(FP16_EDGE, int(pick.sum()))
    return x


def stimulus(unit, jobs, rng, *, edge_frac=0.1):
    """Item payloads (ints) for ``jobs`` and the golden ``o`` words; also checks the item-level golden
    against the vectorized ``score_partial`` / ``context_acc``."""
    n = unit.lanes
    rows, bcasts, sels, modes, firsts, lasts = [], [], [], [], [], []
    for mode, items in jobs:
        row = fp16_data(rng, (items, n), edge_frac=edge_frac)
        bcast = fp16_data(rng, (items, n), edge_frac=edge_frac)
        sel = rng.integers(0, unit.config.token_sets, items)
        rows.append(row), bcasts.append(bcast), sels.append(sel)
        modes += [mode] * items
        firsts += [1] + [0] * (items - 1)
        lasts += [0] * (items - 1) + [1]
    row, bcast, sel = np.concatenate(rows), np.concatenate(bcasts), np.concatenate(sels)
    want = pim_bank.run_items(row, bcast, sel, modes, firsts, lasts, acc=unit.context_acc)
    # The vectorized golden functions agree with the item-level one, job by job.
    for (mode, _), r, b, s, (w, wm) in zip(jobs, rows, bcasts, sels, want):
        assert wm == mode
        if mode == S:
            assert int(pim_bank.score_partial(b, r)) == w
        else:
            acc = pim_bank.context_acc(b[np.arange(len(s)), s], r, acc=unit.context_acc)
            assert sum(int(x) << (16 * j) for j, x in enumerate(acc)) == w
    payloads = []
    for i in range(len(modes)):
        payloads.append(unit.i_layout.const({
            "row": words(row[i]), "bcast": words(bcast[i]), "sel": int(sel[i]),
            "mode": modes[i], "first": firsts[i], "last": lasts[i]}).as_value().value)
    return payloads, [w | (wm << (16 * n)) for w, wm in want]


def words(elems) -> int:
    return sum(int(v) << (16 * j) for j, v in enumerate(elems))


def check(got, want, what):
    assert len(got) == len(want), f"{what}: {len(got)} results, want {len(want)}"
    bad = [k for k, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"{what}: {len(bad)} mismatches, first [{bad[0]}] got {got[bad[0]]:#x} want {want[bad[0]]:#x}"


def test_bank_pu_matches_golden(backend, unit):
    """Mixed score / context jobs with edge values: full rate (exact cycle model), then random valid gaps
    and backpressure."""
    inputs, want = stimulus(unit, JOBS, np.random.default_rng(5))
    full = backend.run_streams(unit, {"i": inputs}, {"o": len(want)})
    check(full.outputs["o"], want, "full rate")
    assert full.cycles == unit.cycles(JOBS), (full.cycles, unit.cycles(JOBS))
    for seed, (vp, rp) in enumerate([(0.7, 0.7), (0.95, 0.25), (0.3, 0.95)]):
        tr = Traffic.random(stream_ports(unit), seed=seed, valid_prob=vp, ready_prob=rp)
        run = backend.run_streams(unit, {"i": inputs}, {"o": len(want)}, traffic=tr)
        check(run.outputs["o"], want, f"valid {vp} ready {rp}")
        assert run.cycles > full.cycles


def test_bank_pu_long_jobs_verilator():
    """Verilator only: many long jobs (a 4K-token context job, 1024 score tokens) under random traffic."""
    from sim.backends import get_backend
    backend = get_backend("verilator")
    unit = BankPU(PAPER)
    jobs = [(S, BPT)] * 1024 + [(C, 4096), (S, 1), (C, 1)] + [(S, 1), (C, 3)] * 50
    inputs, want = stimulus(unit, jobs, np.random.default_rng(9), edge_frac=0.01)
    run = backend.run_streams(unit, {"i": inputs}, {"o": len(want)})
    check(run.outputs["o"], want, "full rate")
    assert run.cycles == unit.cycles(jobs)
    tr = Traffic.random(stream_ports(unit), seed=3, valid_prob=0.6, ready_prob=0.5)
    run = backend.run_streams(unit, {"i": inputs}, {"o": len(want)}, traffic=tr)
    check(run.outputs["o"], want, "random traffic")


def test_latency_and_interval(unit):
    """Single items give exactly ``latency[mode]``; consecutive items of a job issue every ``interval``
    cycles; at the real system's pace (one item per tCCD_L = 8 cycles) the PU never stalls its input."""
    from sim.backends import get_backend
    backend = get_backend("amaranth")
    assert unit.latency == {"score": 17, "context": 9} and unit.interval == 4 and unit.switch_gap == 9
    rng = np.random.default_rng(1)
    for mode, name in ((S, "score"), (C, "context")):
        inputs, want = stimulus(unit, [(mode, 1)], rng)
        run = backend.run_streams(unit, {"i": inputs}, {"o": 1})
        check(run.outputs["o"], want, name)
        assert run.cycles == unit.latency[name] + 1            # accepted in cycle 0, taken in cycle latency
        for n in (2, 6):                                        # one job of n items at full rate
            inputs, want = stimulus(unit, [(mode, n)], rng)
            run = backend.run_streams(unit, {"i": inputs}, {"o": 1})
            check(run.outputs["o"], want, f"{name} x{n}")
            assert run.cycles == unit.interval * (n - 1) + unit.latency[name] + 1
        # One item per 8 cycles: every item is accepted when it arrives (last one in cycle 8 (n - 1)).
        jobs = [(mode, BPT), (mode, 3), (mode, 1)]
        inputs, want = stimulus(unit, jobs, rng)
        every8 = np.zeros(8, bool)
        every8[0] = True
        run = backend.run_streams(unit, {"i": inputs}, {"o": len(want)}, traffic=Traffic(valid={"i": every8}))
        check(run.outputs["o"], want, f"{name} every 8")
        assert run.cycles == 8 * (len(inputs) - 1) + unit.latency[name] + 1
    # Mode switches: context after score waits switch_gap cycles; score after context does not.
    inputs, want = stimulus(unit, [(S, 1), (C, 1)], rng)
    assert backend.run_streams(unit, {"i": inputs}, {"o": 2}).cycles == unit.switch_gap + unit.latency["context"] + 1
    inputs, want = stimulus(unit, [(C, 1), (S, 1)], rng)
    assert backend.run_streams(unit, {"i": inputs}, {"o": 2}).cycles == 1 + unit.latency["score"] + 1
    # The cycle model agrees with these closed forms.
    assert unit.cycles([(S, 1)]) == 18 and unit.cycles([(C, 6)]) == 4 * 5 + 10
    assert unit.cycles([(S, 1), (C, 1)]) == 9 + 10 and unit.cycles([(C, 1), (S, 1)]) == 1 + 18


def test_output_backpressure(unit):
    """A nearly stalled ``o``: at most ``out_depth`` results pending, then ``i`` stalls; nothing lost or
    reordered (one-item jobs, the densest result stream)."""
    from sim.backends import get_backend
    backend = get_backend("amaranth")
    jobs = [(S, 1)] * 10 + [(C, 1)] * 6 + [(S, 2)] * 3
    inputs, want = stimulus(unit, jobs, np.random.default_rng(4))
    ready = np.zeros(41, bool)
    ready[0] = True
    run = backend.run_streams(unit, {"i": inputs}, {"o": len(want)}, traffic=Traffic(ready={"o": ready}))
    check(run.outputs["o"], want, "o stalled")
    # Full rate: one-item jobs issue every cycle until out_depth results are in flight.
    full = backend.run_streams(unit, {"i": inputs}, {"o": len(want)})
    check(full.outputs["o"], want, "full rate")
    assert full.cycles == unit.cycles(jobs)
    small = BankPU(TINY, out_depth=2)
    run = backend.run_streams(small, {"i": inputs}, {"o": len(want)})
    check(run.outputs["o"], want, "out_depth 2")
    assert run.cycles == small.cycles(jobs) > full.cycles


def test_single_lane_pu():
    """N = 1 (a 16-bit chip burst: 1 multiplier, 1 adder, no tree): both modes use the one adder as the
    accumulator; bit-exact with random traffic, exact cycle model."""
    from sim.backends import get_backend
    org = replace(TINY.dram.org, burst_length=2)
    cfg = replace(TINY, name="n1", dram=replace(TINY.dram, org=org), bank_pu_multipliers=1, bank_pu_adders=1)
    unit = BankPU(cfg)
    assert unit.lanes == 1 and unit.latency == {"score": 9, "context": 9} and unit.switch_gap == 1
    backend = get_backend("amaranth")
    jobs = [(S, 3), (C, 4), (S, 1), (S, 1), (C, 1), (S, 5)]
    inputs, want = stimulus(unit, jobs, np.random.default_rng(8))
    run = backend.run_streams(unit, {"i": inputs}, {"o": len(want)})
    check(run.outputs["o"], want, "n1 full rate")
    assert run.cycles == unit.cycles(jobs)
    tr = Traffic.random(stream_ports(unit), seed=1, valid_prob=0.6, ready_prob=0.4)
    run = backend.run_streams(unit, {"i": inputs}, {"o": len(want)}, traffic=tr)
    check(run.outputs["o"], want, "n1 random")


def test_golden_model():
    """The golden model on exactly representable data (small integers: every op exact) equals integer
    arithmetic, vectorized over leading axes; signed zeros and NaN follow the documented order."""
    rng = np.random.default_rng(0)
    q = rng.integers(-4, 5, (3, 16, BPT, 4))              # [heads, banks, bursts, 4]
    k = rng.integers(-4, 5, (3, 16, BPT, 4))
    f16 = lambda x: np.asarray(x, np.float16).view(np.uint16)
    got = pim_bank.score_partial(f16(q), f16(k))
    assert got.shape == (3, 16)
    assert np.array_equal(got.view(np.float16).astype(int), (q * k).sum(axis=(-1, -2)))
    p = rng.integers(-3, 4, (5, 7))                       # [banks, tokens]
    v = rng.integers(-3, 4, (5, 7, 4))
    got = pim_bank.context_acc(f16(p), f16(v))
    assert got.shape == (5, 4)
    assert np.array_equal(got.view(np.float16).astype(int), (p[..., None] * v).sum(axis=-2))
    # acc starts at +0: a sum of -0 products is +0 (+0 + -0), not -0.
    assert int(pim_bank.score_partial(f16([[-0.0, 0, 0, 0]]), f16([[1.0, 0, 0, 0]]))) == 0x0000
    assert int(pim_bank.context_acc(f16([1.0]), f16([[-0.0, 1, 2, 3]]))[0]) == 0x0000
    # Tree order, pairs (0, 1), (2, 3): (2048 - 2048) + (0.5 + 0.5) = 1, but (2048 + 0.5) + (-2048 + 0.5) = 0
    # (both halves round to +-2048).
    assert int(pim_bank.score_tree(f16([2048.0, -2048.0, 1.0, 1.0]), f16([1.0, 1.0, 0.5, 0.5]))) == 0x3C00
    assert int(pim_bank.score_tree(f16([2048.0, 1.0, -2048.0, 1.0]), f16([1.0, 0.5, 1.0, 0.5]))) == 0x0000
    nan = pim_bank.score_partial(f16([[np.inf, 0, 0, 0]]), f16([[0.0, 0, 0, 0]]))   # inf * 0
    assert int(nan) == 0x7E00


def test_bad_config():
    with pytest.raises(ValueError, match="bank_pu_adders = 3 must equal bank_pu_multipliers = 4"):
        BankPU(replace(TINY, bank_pu_adders=3))
    with pytest.raises(ValueError, match=r"out_depth = 1 outside \[2, 64\]"):
        BankPU(TINY, out_depth=1)
    with pytest.raises(ValueError, match="config must be a PIMConfig"):
        BankPU("tiny")
    with pytest.raises(ValueError, match="at least one item"):
        BankPU(TINY).cycles([(S, 0)])


def test_bank_pu_lint(tmp_path):
    """The Verilog of the PAPER and TINY bank PUs (and a 2-deep result queue, and the clock-gated variant) is
    lint-clean."""
    from sim.backends.verilog import write_verilog, lint
    paths = write_verilog(tmp_path, {
        "pim_bank_pu": lambda: BankPU(PAPER),
        "pim_bank_pu_d2": lambda: BankPU(TINY, out_depth=2),
        "pim_bank_pu_gated": lambda: BankPU(TINY, gated=True),
    })
    assert lint(paths) == []


FP32 = replace(TINY, name="tiny-fp32", context_acc="fp32")


def test_bank_pu_fp32_accumulators(backend):
    """context_acc = "fp32" (PIMConfig): exact FP16 x FP16 products summed in binary32, one rounding to FP16 per
    job; the score path unchanged. Bit-exact to the golden (edge values included) at full rate with the exact
    cycle model, and under random valid gaps / backpressure."""
    unit = BankPU(FP32)
    assert unit.latency == {"score": 17, "context": 11} and unit.switch_gap == 7 and unit.interval == 4
    inputs, want = stimulus(unit, JOBS, np.random.default_rng(15))
    full = backend.run_streams(unit, {"i": inputs}, {"o": len(want)})
    check(full.outputs["o"], want, "fp32 full rate")
    assert full.cycles == unit.cycles(JOBS), (full.cycles, unit.cycles(JOBS))
    tr = Traffic.random(stream_ports(unit), seed=4, valid_prob=0.8, ready_prob=0.4)
    run = backend.run_streams(unit, {"i": inputs}, {"o": len(want)}, traffic=tr)
    check(run.outputs["o"], want, "fp32 random traffic")
    # the two formats give different context results (the option is really wired), identical score results
    w16 = stimulus(BankPU(TINY), JOBS, np.random.default_rng(15))[1]
    modes = [w >> (16 * unit.lanes) for w in want]
    assert [a for a, m in zip(want, modes) if m == S] == [a for a, m in zip(w16, modes) if m == S]
    assert any(a != b for a, b, m in zip(want, w16, modes) if m == C)


def test_fp32_accumulators_are_more_accurate():
    """A 4096-token context job (p ~ softmax weights, V ~ N(1, 1)): the FP32 accumulator's result is within an
    FP16 rounding of the float64 sum, the FP16 accumulator's is not (golden; the RTL equals the golden)."""
    rng = np.random.default_rng(2)
    n = 4096
    p = (rng.random(n) / n * 2).astype(np.float16).view(np.uint16)
    v = (rng.standard_normal((n, 4)) + 1).astype(np.float16).view(np.uint16)
    ref = (p.view(np.float16).astype(np.float64)[:, None] * v.view(np.float16).astype(np.float64)).sum(0)
    err = {acc: np.abs(pim_bank.context_acc(p, v, acc=acc).view(np.float16).astype(np.float64) - ref).max()
           / np.abs(ref).max() for acc in ("fp16", "fp32")}
    assert err["fp32"] <= 2 ** -11 < err["fp16"], err


class _GatedPair(wiring.Component):
    """Two ``BankPU(TINY, gated=True)`` whose :data:`GATE_DOMAINS` clocks are shared (as the fast fused build shares
    them per chip), each enabled when either PU loads that domain (``only_first``: a broken gate, enabled by the
    first PU's loads alone)."""

    def __init__(self, *, only_first=False):
        self.only_first = only_first
        self.pus = [BankPU(TINY, gated=True) for _ in range(2)]
        sig = {}
        for j, pu in enumerate(self.pus):
            sig[f"i{j}"] = In(stream.Signature(pu.i_layout))
            sig[f"o{j}"] = Out(stream.Signature(pu.o_layout))
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        for j, pu in enumerate(self.pus):
            m.submodules[f"pu{j}"] = pu
            wiring.connect(m, wiring.flipped(getattr(self, f"i{j}")), pu.i)
            wiring.connect(m, pu.o, wiring.flipped(getattr(self, f"o{j}")))
        for k, d in enumerate(GATE_DOMAINS):
            en = self.pus[0].gate_en[k] if self.only_first else Cat(pu.gate_en[k] for pu in self.pus).any()
            gated_domain(m, d, en)
        return m


def test_gated_bank_pus_match_golden():
    """Verilator: two clock-gated bank PUs on shared gated clocks, each with its own random valid gaps and
    backpressure (so one PU's input register holds an item while the other's loads, and one pipeline runs
    while the other idles), give the golden results; the same in the same cycles as ungated PUs at full
    rate. A gate enabled by one PU's loads alone is caught."""
    from sim.backends import get_backend
    backend = get_backend("verilator")
    unit = BankPU(TINY)
    rng = np.random.default_rng(11)
    jobs = [JOBS, JOBS[::-1]]
    data = [stimulus(unit, j, rng) for j in jobs]
    inputs = {f"i{j}": d[0] for j, d in enumerate(data)}
    counts = {f"o{j}": len(d[1]) for j, d in enumerate(data)}
    dut = _GatedPair()
    full = backend.run_streams(dut, inputs, counts)
    for j, (_, want) in enumerate(data):
        check(full.outputs[f"o{j}"], want, f"full rate, PU {j}")
    assert full.cycles == max(unit.cycles(j) for j in jobs)
    for seed in range(3):
        tr = Traffic.random(stream_ports(dut), seed=seed, valid_prob=0.6, ready_prob=0.4)
        run = backend.run_streams(dut, inputs, counts, traffic=tr)
        for j, (_, want) in enumerate(data):
            check(run.outputs[f"o{j}"], want, f"random traffic {seed}, PU {j}")
    # PU 1's stages then keep stale values: wrong results, or its result queue misses `last` items and the run
    # never completes
    try:
        bad = backend.run_streams(_GatedPair(only_first=True), inputs, counts, max_cycles=2 * full.cycles)
    except SimulationTimeout as e:
        collected = str(e).split("collected ")[1].split(" of ")[0]
        assert f"'o0': {counts['o0']}" in collected and f"'o1': {counts['o1']}" not in collected, collected
    else:
        check(bad.outputs["o0"], data[0][1], "mutant, PU 0")
        assert bad.outputs["o1"] != data[1][1]


def test_gated_flag_checked():
    with pytest.raises(ValueError, match="gated must be True or False"):
        BankPU(TINY, gated=1)
    assert "gate_en" not in BankPU(TINY).signature.members and "gate_en" in BankPU(TINY, gated=True).signature.members
