# amaranth: UnusedElaboratable=no
"""PIMSoftmaxUnit / PIMNormalizer (hdl/pim/softmax_unit.py): bit-exact vs sim/golden/pim_rank, throughput."""

import numpy as np
import pytest

from hdl.pim.config import PAPER, TINY
from hdl.pim.softmax_unit import PIMSoftmaxUnit, PIMNormalizer
from sim.backends import Traffic, stream_ports
from sim.golden.pim_rank import chunk_softmax, normalize, scale_bits

CH = 16
NEG_INF, POS_INF, QNAN = 0xFC00, 0x7C00, 0x7E00


def head_scores(rng, L, kind):
    """FP16 scores of one head of L tokens (padding to whole chunks is added by the caller)."""
    s = (3 * rng.standard_normal(L)).astype(np.float16).view(np.uint16)
    if kind == "wide":            # exponentials over ~23 binades: the FP32 chunk sums round (order matters)
        s = (rng.uniform(-16, 0, L) + 5).astype(np.float16).view(np.uint16)
    elif kind == "huge":            # differences overflow, exp -> 0 / subnormal
        s = rng.uniform(-6.5e4, 6.5e4, L).astype(np.float16).view(np.uint16)
    elif kind == "equal":
        s[:] = s[0]
    elif kind == "ties":
        s = rng.choice(np.array([0x3C00, 0xBC00, 0x0000, 0x8000, 0x4000], np.uint16), L)
    elif kind == "neginf":
        s[rng.random(L) < 0.5] = NEG_INF
        s[rng.integers(0, L)] = 0x3C00
    elif kind == "nan":
        s[rng.integers(0, L)] = QNAN
    elif kind == "posinf":
        s[rng.integers(0, L)] = POS_INF
    elif kind == "rising":        # the max moves every chunk: the running rescaling matters
        s = np.linspace(-40, 40, L).astype(np.float16).view(np.uint16)
    return s


def stimulus(rng, heads):
    """heads: list of (L, kind). Returns input payload ints and the golden results per head."""
    items, gold = [], []
    for L, kind in heads:
        n = -(-L // CH)
        s = np.full(n * CH, 0x1234, np.uint16)             # padding slots hold garbage: pad forces -inf
        s[:L] = head_scores(rng, L, kind)
        g = chunk_softmax(s, L)
        gold.append(g)
        for t in range(n * CH):
            items.append(int(s[t]) | (int(t >= L) << 16) | (int(t // CH == n - 1) << 17))
    return items, gold


def check(run, gold, what):
    e = np.array([w & 0xFFFF for w in run.outputs["e"]], np.uint16)
    m = np.array([w & 0xFFFF for w in run.outputs["m"]], np.uint16)
    hd = run.outputs["head"]
    want_e = np.concatenate([g["e"] for g in gold])
    want_m = np.concatenate([g["m"] for g in gold])
    assert np.array_equal(e, want_e), f"{what}: {int((e != want_e).sum())} e mismatches"
    assert np.array_equal(m, want_m), f"{what}: m mismatches"
    for h, (w, g) in enumerate(zip(hd, gold)):
        s = (w >> 32) & 0x1FF
        s = s - 512 if s & 0x100 else s
        got = (w & 0xFFFF, (w >> 16) & 0xFFFF, s, (w >> 41) & 0xFFFFFFFF)
        assert got == (int(g["M"]), int(g["z_m"]), int(g["s"]), int(g["Z"])), f"{what}: head {h}: {got}"


HEADS = [(64, "wide"), (16, "wide"), (16, "wide"), (16, "wide"), (16, "wide"), (17, "neginf"), (48, "normal"), (16, "equal"), (40, "huge"), (33, "rising"), (1, "normal"),
         (32, "ties"), (20, "nan"), (16, "posinf"), (64, "rising")]


@pytest.fixture(scope="module")
def unit():
    return PIMSoftmaxUnit(TINY)


def test_softmax_unit_matches_golden(backend, unit):
    """Heads back to back (edge values, single real token + padding in the last chunk), full rate, then
    random valid gaps and backpressure on every output."""
    heads = HEADS if backend.name == "verilator" else HEADS[:9]
    items, gold = stimulus(np.random.default_rng(5), heads)
    exp = {"e": len(items), "m": len(items) // CH, "head": len(heads)}
    full = backend.run_streams(unit, {"i": items}, exp)
    check(full, gold, "full rate")
    patterns = [(0.7, 0.7), (0.95, 0.3)] if backend.name == "verilator" else [(0.8, 0.5)]
    for seed, (vp, rp) in enumerate(patterns):
        tr = Traffic.random(stream_ports(unit), seed=seed, valid_prob=vp, ready_prob=rp)
        run = backend.run_streams(unit, {"i": items}, exp, traffic=tr)
        check(run, gold, f"valid {vp} ready {rp}")
        assert run.cycles > full.cycles


def test_softmax_unit_throughput(backend, unit):
    """Full rate: one score per cycle, chunks and heads back to back: n more chunks cost exactly 16 n cycles;
    the first e of a chunk follows its last score after e_latency cycles."""
    rng = np.random.default_rng(9)
    runs = {}
    cases = {"32": [(32, "normal")], "96": [(96, "normal")],
             "3 heads": [(32, "normal"), (16, "normal"), (48, "normal")]}
    for name, heads in cases.items():
        items, gold = stimulus(rng, heads)
        exp = {"e": len(items), "m": len(items) // CH, "head": len(heads)}
        run = backend.run_streams(unit, {"i": items}, exp)
        check(run, gold, str(heads))
        runs[name] = run.cycles
    assert runs["96"] - runs["32"] == 96 - 32, runs
    assert runs["3 heads"] == runs["96"], runs          # heads back to back: no bubble between heads
    # e of token 0: its chunk's last score is accepted in cycle 15.
    items, _ = stimulus(rng, [(16, "normal")])
    # a probe of the first e only (the unit emits 16): no quiet window, the other items are expected
    first_e = backend.run_streams(unit, {"i": items}, {"e": 1}, quiet_cycles=0).cycles - 1
    assert first_e == 15 + unit.e_latency, first_e
    one = backend.run_streams(unit, {"i": items}, {"e": 16, "m": 1, "head": 1}).cycles - 1
    assert one - (first_e + 15) <= unit.head_latency, (one, first_e)
    print(f"\n[{backend.name}] e_latency {unit.e_latency}, head after last e {one - first_e - 15} cycles "
          f"(bound {unit.head_latency}); cycles {runs}")


def norm_items(gold, L, *, pad_garbage=True):
    n = gold["m"].shape[-1]
    items = []
    s9 = int(gold["s"]) & 0x1FF
    for t in range(n * CH):
        w = (int(gold["e"][t]) | (int(gold["m"][t // CH]) << 16) | (int(gold["M"]) << 32)
             | (int(gold["z_m"]) << 48) | (s9 << 64) | (int(t >= L) << 73))
        items.append(w)
    return items


def test_normalizer_matches_golden(backend):
    unit = PIMNormalizer(TINY)
    rng = np.random.default_rng(11)
    items, want = [], []
    for L, kind in [(40, "normal"), (17, "neginf"), (33, "rising"), (20, "huge"), (16, "nan")]:
        n = -(-L // CH)
        s = np.zeros(n * CH, np.uint16)
        s[:L] = head_scores(rng, L, kind)
        g = chunk_softmax(s, L)
        items += norm_items(g, L)
        want.append(normalize(g["e"], g["m"], g["M"], g["z_m"], g["s"], L))
    # Extreme head constants: the 2**-s constant over its whole range, z_m rounding to 2.0.
    for s in (-20, -15, 0, 14, 15, 17, 24, 25, 128):
        e = rng.integers(0, 0x3C01, CH).astype(np.uint16)
        g = {"e": e, "m": np.array([0x3C00], np.uint16), "M": np.uint16(0x4000), "z_m": np.uint16(0x4000),
             "s": np.int16(s)}
        items += norm_items(g, CH)
        want.append(normalize(e, g["m"], g["M"], g["z_m"], s, CH))
    want = np.concatenate(want)
    for tr in (None, Traffic.random(stream_ports(unit), seed=3)):
        run = backend.run_streams(unit, {"i": items}, {"o": len(items)}, traffic=tr)
        got = np.array(run.outputs["o"], np.uint16)
        assert np.array_equal(got, want), f"{int((got != want).sum())} p mismatches"
    run = backend.run_streams(unit, {"i": items[:1]}, {"o": 1})
    assert run.cycles - 1 == unit.latency == 24


def test_scale_bits():
    for s in range(-20, 30):
        want = 2.0 ** -s
        got = float(np.array([scale_bits(s)], np.uint16).view(np.float16)[0])
        if -15 <= s <= 24:
            assert got == want, s
        else:
            assert got == (np.inf if s < 0 else 0.0), s


def test_bad_config():
    with pytest.raises(ValueError, match="config must be a PIMConfig"):
        PIMSoftmaxUnit(None)


def test_softmax_lint(tmp_path):
    from sim.backends.verilog import write_verilog, lint
    paths = write_verilog(tmp_path, {"pim_softmax": lambda: PIMSoftmaxUnit(PAPER),
                                     "pim_normalizer": lambda: PIMNormalizer(PAPER)})
    assert lint(paths) == []
