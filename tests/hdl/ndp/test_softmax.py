# amaranth: UnusedElaboratable=no
"""SoftmaxUnit (hdl/ndp/softmax.py): bit-exact vs sim/golden/softmax.softmax_rows, cycle formula, handshakes."""

import numpy as np
import pytest

from hdl.ndp.softmax import SoftmaxUnit
from sim.backends import Traffic, stream_ports
from sim.golden.softmax import softmax_rows
from fp_util import FP16_EDGE

# Small on Amaranth's simulator, larger on Verilator.
CONFIGS = {
    "amaranth": dict(lanes=2, max_len=32, max_rows=24),
    "verilator": dict(lanes=4, max_len=256, max_rows=32),
}
JOBS = {  # (R, nb): nb below and above nb_min, one-beat rows, full-length rows
    "amaranth": [(3, 5), (2, 1), (4, 2), (1, 16), (2, 7)],
    "verilator": [(5, 9), (3, 1), (16, 2), (2, 64), (7, 4), (1, 3), (4, 33)],
}
NEG_INF, POS_INF, QNAN = 0xFC00, 0x7C00, 0x7E00  # FP16 encodings


def lane_words(mat, lanes) -> list:
    flat = np.asarray(mat).reshape(-1, lanes).astype(object)
    return [sum(int(v) << (16 * i) for i, v in enumerate(row)) for row in flat]


def unpack_lanes(words, lanes) -> np.ndarray:
    return np.array([[(w >> (16 * i)) & 0xFFFF for i in range(lanes)] for w in words], np.uint16).ravel()


def unpack_anchor(words):
    return (np.array([w & 0xFFFF for w in words], np.uint16),
            np.array([(w >> 16) & 0xFFFFFFFF for w in words], np.uint32))


def score_rows(rng, rows, length, *, special):
    """Scores ~ N(0, 3^2) in FP16; ``special`` adds edge rows/values: huge and tiny magnitudes, -inf, +inf,
    NaN, repeated values, signed zeros and the curated FP16 edge encodings."""
    p = (3 * rng.standard_normal((rows, length))).astype(np.float16).view(np.uint16)
    if not special:
        return p
    kinds = ["edge", "huge", "tiny", "equal", "zeros", "neginf", "mixed"]
    for r in range(rows):
        kind = kinds[r % len(kinds)]
        if kind == "edge":
            pick = rng.random(length) < 0.3
            p[r, pick] = rng.choice(FP16_EDGE, int(pick.sum()))
        elif kind == "huge":        # |p| up to 65504: differences overflow to -inf, exp -> 0
            p[r] = (rng.uniform(-6.5e4, 6.5e4, length)).astype(np.float16).view(np.uint16)
        elif kind == "tiny":        # subnormal and tiny normal scores: p - m rounds to tiny, exp ~ 1
            p[r] = rng.integers(0, 0x0800, length).astype(np.uint16) | \
                (rng.integers(0, 2, length).astype(np.uint16) << 15)
        elif kind == "equal":
            p[r] = p[r, 0]
        elif kind == "zeros":
            p[r] = rng.choice(np.array([0x0000, 0x8000], np.uint16), length)
        elif kind == "neginf":      # a few -inf among finite; all -inf if the row is short
            p[r, rng.random(length) < 0.5] = NEG_INF
        else:
            p[r, rng.integers(0, length)] = rng.choice([POS_INF, QNAN, NEG_INF])
    return p


def stimulus(unit, jobs, rng, *, special_first=True):
    cmds, beats, e_all, m_all, s_all = [], [], [], [], []
    for i, (rows, nb) in enumerate(jobs):
        p = score_rows(rng, rows, nb * unit.lanes, special=special_first and i == 0)
        e, m, s = softmax_rows(p, unit.lanes)
        cmds.append(unit.cmd_layout.const({"rows": rows, "nb": nb}).as_value().value)
        beats += lane_words(p, unit.lanes)
        e_all.append(e.ravel())
        m_all.append(m)
        s_all.append(s)
    return {"cmd": cmds, "i": beats}, (np.concatenate(e_all), np.concatenate(m_all), np.concatenate(s_all))


def check(unit, run, want, what):
    e, m, s = want
    got_e = unpack_lanes(run.outputs["o"], unit.lanes)
    got_m, got_s = unpack_anchor(run.outputs["anchor"])
    assert np.array_equal(got_e, e), f"{what}: {int((got_e != e).sum())} E mismatches"
    assert np.array_equal(got_m, m), f"{what}: {int((got_m != m).sum())} max mismatches"
    assert np.array_equal(got_s, s), f"{what}: {int((got_s != s).sum())} sum mismatches"


def test_softmax_matches_golden(backend):
    """Several jobs back to back (edge values in the first): full rate, then random gaps and backpressure."""
    unit = SoftmaxUnit(**CONFIGS[backend.name])
    jobs = JOBS[backend.name]
    inputs, want = stimulus(unit, jobs, np.random.default_rng(17))
    expected = {"o": sum(r * nb for r, nb in jobs), "anchor": sum(r for r, _ in jobs)}
    full = backend.run_streams(unit, inputs, expected)
    check(unit, full, want, "full rate")
    # Back-to-back jobs overlap (the next job's input pass runs under the previous exp pass).
    assert full.cycles <= sum(unit.cycles(r, nb) for r, nb in jobs)
    patterns = [(0.7, 0.7), (0.95, 0.3), (0.4, 0.9)]
    for seed, (vp, rp) in enumerate(patterns):
        tr = Traffic.random(stream_ports(unit), seed=seed, valid_prob=vp, ready_prob=rp)
        run = backend.run_streams(unit, inputs, expected, traffic=tr)
        check(unit, run, want, f"valid {vp} ready {rp}")
        assert run.cycles > full.cycles


def test_anchor_backpressure(backend):
    """A nearly stalled anchor sink fills the anchor queue: the exp pass stops at row starts, nothing is lost;
    and a stalled ``o`` with a ready anchor sink."""
    unit = SoftmaxUnit(**CONFIGS[backend.name])
    rows = unit.anchor_depth + 4
    assert rows <= unit.max_rows
    jobs = [(rows, 1), (3, 2)]
    inputs, want = stimulus(unit, jobs, np.random.default_rng(23), special_first=False)
    expected = {"o": sum(r * nb for r, nb in jobs), "anchor": sum(r for r, _ in jobs)}
    ready = np.zeros(97, bool)
    ready[::97] = True                 # anchor accepted once every 97 cycles
    run = backend.run_streams(unit, inputs, expected, traffic=Traffic(ready={"anchor": ready}))
    check(unit, run, want, "anchor stalled")
    o_ready = np.zeros(31, bool)
    o_ready[::31] = True
    run = backend.run_streams(unit, inputs, expected, traffic=Traffic(ready={"o": o_ready}))
    check(unit, run, want, "o stalled")


def test_cycle_formula(backend):
    """Single jobs at full rate take exactly ``cycles(R, nb)``; for nb >= nb_min that is the closed form
    ``(R + 1) nb + max_latency + exp_latency + anchor_latency + 1`` (one row per nb cycles)."""
    unit = SoftmaxUnit(**CONFIGS[backend.name])
    if backend.name == "amaranth":
        shapes = [(4, unit.nb_min), (3, 8), (1, 1), (20, 1), (3, 2)]
    else:
        shapes = [(16, 64), (8, unit.nb_min), (16, unit.nb_min - 1), (32, 1), (24, 2), (1, 64), (3, 17)]
    rng = np.random.default_rng(31)
    fixed = unit.max_latency + unit.exp_latency + unit.anchor_latency + 1
    for rows, nb in shapes:
        inputs, want = stimulus(unit, [(rows, nb)], rng, special_first=False)
        run = backend.run_streams(unit, inputs, {"o": rows * nb, "anchor": rows})
        check(unit, run, want, f"R={rows} nb={nb}")
        assert run.cycles == unit.cycles(rows, nb), (rows, nb, run.cycles, unit.cycles(rows, nb))
        if nb >= unit.nb_min:
            assert run.cycles == (rows + 1) * nb + fixed
        print(f"\n[{backend.name}] lanes={unit.lanes} R={rows} nb={nb}: {run.cycles} cycles "
              f"({rows * nb * unit.lanes / run.cycles:.2f} scores/cycle of {unit.lanes})")


def test_latency_attributes():
    u = SoftmaxUnit(lanes=4, max_len=64, max_rows=4)
    assert u.exp_latency == 12 and u.max_latency == 3 and u.anchor_latency == 23 and u.nb_min == 4
    assert u.anchor_depth == 16 and u.cycles(4, 16) == 5 * 16 + 3 + 12 + 23 + 1
    # Steady state: one more row costs nb cycles.
    for nb in (4, 5, 16):
        assert u.cycles(4, nb) - u.cycles(3, nb) == nb
    with pytest.raises(ValueError, match="rows must be in 1..4"):
        u.cycles(5, 1)
    with pytest.raises(ValueError, match="nb must be in 1..16"):
        u.cycles(1, 17)


def test_bad_parameters():
    with pytest.raises(ValueError, match="lanes must be a power of two"):
        SoftmaxUnit(lanes=3, max_len=6, max_rows=1)
    with pytest.raises(ValueError, match="max_len must be a positive multiple of lanes=4"):
        SoftmaxUnit(lanes=4, max_len=6, max_rows=1)
    with pytest.raises(ValueError, match="max_len"):
        SoftmaxUnit(lanes=4, max_len=0, max_rows=1)
    with pytest.raises(ValueError, match="max_rows must be an integer >= 1"):
        SoftmaxUnit(lanes=4, max_len=8, max_rows=0)


def test_degenerate_config_and_lint(tmp_path):
    """lanes=1, max_len=1, max_rows=1 works; the Verilog of it and of a larger instance is lint-clean."""
    from sim.backends import get_backend
    from sim.backends.verilog import write_verilog, lint
    unit = SoftmaxUnit(lanes=1, max_len=1, max_rows=1)
    inputs, want = stimulus(unit, [(1, 1), (1, 1)], np.random.default_rng(2))
    run = get_backend("amaranth").run_streams(unit, inputs, {"o": 2, "anchor": 2})
    check(unit, run, want, "degenerate")
    paths = write_verilog(tmp_path, {
        "sm_min": lambda: SoftmaxUnit(lanes=1, max_len=1, max_rows=1),
        "ndp_softmax": lambda: SoftmaxUnit(lanes=4, max_len=4096, max_rows=64),
    })
    assert lint(paths) == []
