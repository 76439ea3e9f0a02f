# amaranth: UnusedElaboratable=no
"""PEArray (hdl/ndp/pe_array.py): the four dataflows bit-exact vs sim/golden/pe_array.gemm_mode on both backends,
jobs overlapped back to back, cycle formula, accuracy vs float64."""

import time

import numpy as np
import pytest

from hdl.ndp.pe_array import PEArray, PEMode
from sim.backends import Traffic, stream_ports
from sim.golden import fp16
from sim.golden.pe_array import gemm, gemv, gemm_mode, gemm_group, accuracy, mode_of
from sim.golden.ndp_core import trans_layout
from fp_util import FP16_EDGE

# Small on Amaranth's simulator; the one-channel slice geometry (8 lanes x 2 rows) on Verilator.
CONFIGS = {
    "amaranth": dict(lanes=4, batch=2, max_k=32, acc_columns=16),
    "verilator": dict(lanes=8, batch=2, max_k=256, acc_columns=16),
}
JOBS = {  # (mode, B, K, N): every dataflow, K split (nb < 8), hazard stalls (TRANS N < 8), back to back
    "amaranth": [("row", 1, 5, 8), ("trans", 2, 8, 3), ("row_half", 2, 6, 2), ("trans_half", 1, 2, 4),
                 ("row", 2, 3, 4), ("trans", 1, 12, 9), ("row_half", 1, 2, 2)],
    "verilator": [("trans", 2, 64, 16), ("row", 2, 40, 64), ("row", 1, 17, 8), ("row_half", 2, 20, 4),
                  ("trans_half", 2, 4, 6), ("trans", 1, 8, 1), ("trans", 2, 16, 12), ("row", 2, 1, 128),
                  ("row_half", 1, 2, 4), ("trans", 2, 24, 16), ("row", 1, 200, 16)],
}


def lane_words(mat, lanes, width=16) -> list:
    """Rows of ``mat`` cut into beats of ``lanes`` elements, lane l in bits [width*l, width*l + width)."""
    flat = np.asarray(mat).reshape(-1, lanes).astype(object)
    return [sum(int(v) << (width * i) for i, v in enumerate(row)) for row in flat]


def unpack_lanes(words, lanes, width, dtype) -> np.ndarray:
    mask = (1 << width) - 1
    return np.array([[(w >> (width * i)) & mask for i in range(lanes)] for w in words], dtype=dtype).ravel()


def operands(rng, b, k, n, *, special=False):
    """FP16 X (B, K) and A (K, N): mixed-sign moderate values; ``special`` sprinkles edge encodings in."""
    def moderate(shape, lo, hi):
        exp = rng.integers(lo, hi, shape).astype(np.uint16)
        return (rng.integers(0, 2, shape).astype(np.uint16) << 15) | (exp << 10) | \
            rng.integers(0, 1024, shape).astype(np.uint16)
    x, a = moderate((b, k), 12, 17), moderate((k, n), 10, 16)
    if special:
        for m in (x, a):
            pick = rng.random(m.shape) < 0.05
            m[pick] = rng.choice(FP16_EDGE, int(pick.sum()))
    return x, a


def a_beats(mode, a, lanes, group):
    """The A beats of a job in ``mode`` (row-major A for the row modes, TRANS layout otherwise)."""
    if mode.startswith("row"):
        return lane_words(a.reshape(-1), lanes)
    return lane_words(trans_layout(a, lanes, group), lanes)


def stimulus(pe, jobs, rng):
    """Streams for ``jobs`` and the expected ``y`` words (row modes; ROW_HALF: the lower half lanes) and
    ``ys`` scalars (TRANS modes). Returns (inputs, y_want, y_mask, ys_want)."""
    L = pe.lanes
    cmds, xs, as_, wy, my, ws = [], [], [], [], [], []
    for i, (mode, b, k, n) in enumerate(jobs):
        narrow = mode == "row_group_narrow"     # ROW_GROUP at W = group / 2 (arrays built with narrow)
        mode = "row_group" if narrow else mode
        W = pe.group >> int(narrow)
        if mode == "row_group":             # X (B, n lanes): g rows of K = n W, a W-slice per word; A (K, lanes)
            x, _ = operands(rng, b, (k // W) * L, n, special=(i == 0))
            _, a = operands(rng, b, k, n, special=(i == 0))
        else:
            x, a = operands(rng, b, k, n, special=(i == 0))
        kb = -(-x.shape[1] // L)
        xp = np.zeros((b, kb * L), np.uint16)
        xp[:, :x.shape[1]] = x
        cols = {"row": n // L, "row_half": 1, "row_group": 1}.get(mode, n)
        cmd = {"mode": PEMode[mode.upper()], "rows": b, "k": k, "cols": cols}
        if pe.narrow:
            cmd["narrow"] = int(narrow)
        cmds.append(pe.cmd_layout.const(cmd).as_value().value)
        xs += lane_words(xp, L)
        beats = a_beats(mode, a, L, n)
        if pe.a_beats == 2:
            if mode == "trans_pair":        # two consecutive beats per transfer, the first in the low half
                beats = [lo | (hi << (16 * L)) for lo, hi in zip(beats[0::2], beats[1::2])]
            else:                           # one beat per transfer; the high half is noise the array ignores
                beats = [bt | (int(rng.integers(0, 1 << 62)) << (16 * L)) for bt in beats]
        as_ += beats
        if mode == "row_group":
            y = gemm_group(x, a, acc=pe.acc, lanes=L, group=W)
        else:
            y = gemm_mode(x, a, acc=pe.acc, lanes=L, mode=mode)
        if mode in ("row", "row_group"):
            wy.append(y.ravel())
            my.append(np.ones(y.size, bool))
        elif mode == "row_half":
            full = np.zeros((b, L), y.dtype)
            full[:, :L // 2] = y
            wy.append(full.ravel())
            m = np.zeros((b, L), bool)
            m[:, :L // 2] = True
            my.append(m.ravel())
        else:
            ws.append(y.ravel())
    dtype = np.uint16 if pe.acc == "fp16" else np.uint32
    cat = lambda v, t: np.concatenate(v) if v else np.zeros(0, t)  # noqa: E731
    return {"cmd": cmds, "x": xs, "a": as_}, cat(wy, dtype), cat(my, bool), cat(ws, dtype)


def run_jobs(backend, pe, jobs, rng, traffic=None):
    inputs, wy, my, ws = stimulus(pe, jobs, rng)
    run = backend.run_streams(pe, inputs, {"y": wy.size // pe.lanes, "ys": ws.size}, traffic=traffic,
                              max_cycles=500_000)
    dtype = np.uint16 if pe.acc == "fp16" else np.uint32
    gy = unpack_lanes(run.outputs["y"], pe.lanes, pe.acc_width, dtype)
    gs = np.array(run.outputs["ys"], dtype)
    return run, gy[my], wy[my], gs, ws


@pytest.mark.parametrize("acc", ["fp16", "fp32"])
def test_pe_array_matches_golden(backend, acc):
    """Every dataflow, jobs back to back (overlapped LOAD / COMPUTE / DRAIN): full rate and random valid gaps +
    backpressure, bit for bit."""
    pe = PEArray(acc=acc, **CONFIGS[backend.name])
    jobs = JOBS[backend.name]
    full, gy, wy, gs, ws = run_jobs(backend, pe, jobs, np.random.default_rng(7 if acc == "fp16" else 8))
    assert np.array_equal(gy, wy), f"{int((gy != wy).sum())} y mismatches at full rate"
    assert np.array_equal(gs, ws), f"{int((gs != ws).sum())} ys mismatches at full rate"
    for seed, (vp, rp) in enumerate([(0.7, 0.7), (0.95, 0.3)]):
        tr = Traffic.random(stream_ports(pe), seed=seed, valid_prob=vp, ready_prob=rp)
        run, gy, wy, gs, ws = run_jobs(backend, pe, jobs, np.random.default_rng(7 if acc == "fp16" else 8), tr)
        assert np.array_equal(gy, wy) and np.array_equal(gs, ws), f"mismatch (valid {vp}, ready {rp})"
        assert run.cycles > full.cycles


def exact_at_full_rate_and_random(backend, pe, jobs, seed, traffic_seed):
    """``jobs`` on ``pe`` bit-exact against the golden model at full rate and under random gaps (valid 0.75) and
    backpressure (ready 0.6)."""
    full, gy, wy, gs, ws = run_jobs(backend, pe, jobs, np.random.default_rng(seed))
    assert np.array_equal(gy, wy) and np.array_equal(gs, ws), \
        f"{int((gy != wy).sum())} y / {int((gs != ws).sum())} ys mismatches"
    tr = Traffic.random(stream_ports(pe), seed=traffic_seed, valid_prob=0.75, ready_prob=0.6)
    run, gy, wy, gs, ws = run_jobs(backend, pe, jobs, np.random.default_rng(seed), tr)
    assert np.array_equal(gy, wy) and np.array_equal(gs, ws), "mismatch under random traffic"


GROUP_JOBS = {  # ROW_GROUP (W = group: K = n W, N = lanes) between the other dataflows, back to back
    "amaranth": [("row_group", 1, 2, 4), ("row", 2, 5, 8), ("row_group", 2, 4, 4), ("trans", 1, 8, 3),
                 ("row_group", 1, 6, 4), ("row_group", 2, 2, 4)],
    "verilator": [("row_group", 2, 2, 8), ("row", 2, 40, 64), ("row_group", 1, 4, 8), ("row_group", 2, 8, 8),
                  ("trans", 2, 16, 12), ("row_half", 1, 2, 4), ("row_group", 2, 6, 8), ("row_group", 1, 2, 8)],
}


def test_row_group_matches_golden(backend):
    """``group`` = W: ROW_GROUP jobs (each segment of W lanes multiplies its own input row, K = W and K = n W
    over n x words) against ``gemm_group`` bit for bit, between jobs of the other dataflows, at full rate and under
    random gaps and backpressure; the golden model is not a plain row GEMM (a mutant that broadcasts one x to every
    segment differs), and at K = 2 W the second x word matters (a mutant reading word 0 twice differs)."""
    pe = PEArray(acc="fp32", group=2, **CONFIGS[backend.name])
    exact_at_full_rate_and_random(backend, pe, GROUP_JOBS[backend.name], 13, 9)
    rng = np.random.default_rng(1)
    L = pe.lanes
    x, _ = operands(rng, 2, L, L)
    _, a = operands(rng, 2, 2, L)
    one_x = np.repeat(x[:, :2], L // 2, axis=0).reshape(2, L)        # segment 0's inputs everywhere
    assert not np.array_equal(gemm_group(x, a, acc="fp32", lanes=L, group=2),
                              gemm_group(one_x, a, acc="fp32", lanes=L, group=2))
    x2, _ = operands(rng, 2, 2 * L, L)
    _, a2 = operands(rng, 2, 4, L)
    word0_twice = np.concatenate([x2[:, :L], x2[:, :L]], axis=1)
    assert not np.array_equal(gemm_group(x2, a2, acc="fp32", lanes=L, group=2),
                              gemm_group(word0_twice, a2, acc="fp32", lanes=L, group=2))
    with pytest.raises(ValueError, match="row_group needs"):
        gemm_group(x2, a2[:3], acc="fp32", lanes=L, group=2)     # K not a multiple of W
    with pytest.raises(ValueError, match="group"):
        PEArray(lanes=8, group=3)


NARROW_JOBS = {  # ROW_GROUP at W = lanes / 2 and (narrow) W = lanes / 4 per job, among the other dataflows
    "amaranth": [("row_group_narrow", 1, 2, 4), ("row_group", 2, 4, 4), ("row", 2, 5, 8),
                 ("row_group_narrow", 2, 6, 4), ("row_group", 1, 8, 4), ("row_group_narrow", 1, 4, 4)],
    "verilator": [("row_group_narrow", 2, 2, 8), ("row_group", 2, 8, 8), ("row", 2, 40, 64),
                  ("row_group_narrow", 1, 6, 8), ("trans", 2, 16, 12), ("row_group_narrow", 2, 8, 8),
                  ("row_group", 1, 4, 8), ("row_group_narrow", 1, 2, 8)],
}


def test_row_group_narrow_matches_golden(backend):
    """``narrow``: ROW_GROUP jobs at W = group (lanes / 2) and at W = group / 2, chosen per job by the cmd's
    ``narrow`` bit, against ``gemm_group`` at that W, bit for bit, at full rate and under random traffic; a mutant
    that ignores the bit (every job at W = group) differs; ``narrow`` needs a group of at least 2."""
    pe = PEArray(acc="fp32", group=CONFIGS[backend.name]["lanes"] // 2, narrow=True, **CONFIGS[backend.name])
    exact_at_full_rate_and_random(backend, pe, NARROW_JOBS[backend.name], 17, 10)
    W = pe.group
    assert pe.x_words(PEMode.ROW_GROUP, 2 * W, narrow=True) == 4 and pe.x_words(PEMode.ROW_GROUP, 2 * W) == 2
    rng = np.random.default_rng(2)
    L = pe.lanes
    x, _ = operands(rng, 2, 2 * L, L)
    _, a = operands(rng, 2, W, L)
    assert not np.array_equal(gemm_group(x, a, acc="fp32", lanes=L, group=W // 2),   # K = W: two words at W / 2
                              gemm_group(x[:, :L], a, acc="fp32", lanes=L, group=W))    # one word at W
    with pytest.raises(ValueError, match="narrow"):
        PEArray(lanes=8, group=1, narrow=True)


PAIR_JOBS = {  # TRANS_PAIR among the other dataflows (noise in the unused half), hazard stalls (N / 2 < 8)
    "amaranth": [("trans_pair", 1, 8, 4), ("row", 2, 5, 8), ("trans_pair", 1, 12, 2), ("trans", 2, 8, 3),
                 ("trans_pair", 1, 4, 6), ("trans_half", 1, 2, 4), ("trans", 1, 4, 3)],
    "verilator": [("trans_pair", 1, 64, 16), ("row", 2, 40, 64), ("trans_pair", 1, 8, 2), ("trans", 1, 16, 12),
                  ("trans_pair", 1, 256, 16), ("row_half", 2, 20, 4), ("trans_pair", 1, 24, 10),
                  ("trans", 2, 16, 12)],
}


def test_trans_pair_matches_golden_at_two_beats_per_cycle(backend):
    """``a_beats=2``: TRANS_PAIR jobs (PE rows 0 and 1 on columns 2j and 2j + 1) give the TRANS result bit for
    bit between jobs of every other dataflow, under random gaps and backpressure; a stream of TRANS_PAIR jobs
    takes one two-beat transfer per cycle (half the cycles of the same jobs in TRANS)."""
    pe = PEArray(acc="fp32", a_beats=2, **CONFIGS[backend.name])
    jobs = PAIR_JOBS[backend.name]
    full, gy, wy, gs, ws = run_jobs(backend, pe, jobs, np.random.default_rng(11))
    assert np.array_equal(gy, wy) and np.array_equal(gs, ws), \
        f"{int((gy != wy).sum())} y / {int((gs != ws).sum())} ys mismatches"
    tr = Traffic.random(stream_ports(pe), seed=5, valid_prob=0.8, ready_prob=0.6)
    run, gy, wy, gs, ws = run_jobs(backend, pe, jobs, np.random.default_rng(11), tr)
    assert np.array_equal(gy, wy) and np.array_equal(gs, ws), "mismatch under random traffic"
    L = pe.lanes
    stream_of = lambda mode: [(mode, 1, 4 * L, 16)] * 6          # noqa: E731
    runs = {}
    for mode in ("trans_pair", "trans"):
        run, _, _, gs, ws = run_jobs(backend, pe, stream_of(mode), np.random.default_rng(2))
        single, *_ = run_jobs(backend, pe, stream_of(mode)[:1], np.random.default_rng(2))
        assert np.array_equal(gs, ws)
        runs[mode] = run.cycles - single.cycles               # the five later jobs
    transfers = 4 * 16 // 2
    assert runs["trans_pair"] <= 5 * (transfers + 2), runs
    assert runs["trans"] >= 5 * 2 * transfers, runs
    with pytest.raises(ValueError, match="a_beats"):
        PEArray(lanes=4, batch=1, a_beats=2)


def test_row_cycle_formula_and_overlap(backend):
    """A ROW job alone takes exactly ``pe.cycles``; jobs back to back overlap: the drain of one and the load of
    the next hide under the other's compute, so a stream runs at one A beat per cycle plus one fill."""
    pe = PEArray(acc="fp32", **CONFIGS[backend.name])
    L = pe.lanes
    rng = np.random.default_rng(3)
    for job in [("row", 2, 8, 8 * L), ("row", 1, 6, L), ("row", 2, 16, 2 * L), ("row", 1, 9, 10 * L)]:
        run, gy, wy, _, _ = run_jobs(backend, pe, [job], rng)
        assert np.array_equal(gy, wy)
        assert run.cycles == pe.cycles(job[1], job[2], job[3] // L)
    for jobs, beats in (([("trans", 2, 4 * L, 8)] * 6, 6 * 4 * 8), ([("row", 2, 16, 8 * L)] * 6, 6 * 16 * 8)):
        run, gy, wy, gs, ws = run_jobs(backend, pe, jobs, rng)
        assert np.array_equal(gy, wy) and np.array_equal(gs, ws)
        single, *_ = run_jobs(backend, pe, jobs[:1], rng)
        per_job = beats // len(jobs)
        # the five later jobs cost their A beats only (+ at most a couple of cycles each)
        assert run.cycles - single.cycles <= (len(jobs) - 1) * (per_job + 2), (run.cycles, single.cycles)
        print(f"\n[{backend.name}] {len(jobs)} x {jobs[0]}: {run.cycles} cycles for {beats} A beats "
              f"(one job alone {single.cycles}); {run.cycles / max(run.wall_seconds, 1e-9) / 1e3:.1f}k cycles/s")


def test_golden_order_of_operations():
    """gemm is the plain sequential loop of fp16.mac from +0; the trans dataflow is per-lane sequential sums
    of k = l, l + lanes, ... then a pairwise lane tree; row_half adds the odd-k half onto the even-k half."""
    rng = np.random.default_rng(11)
    x, a = operands(rng, 2, 9, 3, special=True)
    for acc in ("fp16", "fp32"):
        y = gemm(x, a, acc=acc)
        for b in range(2):
            for n in range(3):
                s = np.zeros((), np.uint16 if acc == "fp16" else np.uint32)
                for k in range(9):
                    s = fp16.mac(x[b, k], a[k, n], s, acc=acc)
                assert y[b, n] == s
        assert np.array_equal(gemv(x[1], a, acc=acc), y[1])
    x, a = operands(rng, 2, 8, 3)
    acc = "fp32"
    y = gemm_mode(x, a, acc=acc, lanes=4, mode="trans")
    add = lambda p, q: (np.asarray(p).view(np.float32) + np.asarray(q).view(np.float32)).view(np.uint32)  # noqa
    for b in range(2):
        for n in range(3):
            lane = []
            for l in range(4):
                s = np.zeros((), np.uint32)
                for k in (l, l + 4):
                    s = fp16.mac(x[b, k], a[k, n], s, acc=acc)
                lane.append(s)
            assert y[b, n] == add(add(lane[0], lane[1]), add(lane[2], lane[3]))
    xh, ah = operands(rng, 1, 4, 2)
    yh = gemm_mode(xh, ah, acc=acc, lanes=4, mode="row_half")
    for n in range(2):
        # K = 4: two beats, S = min(8, 2) = 2 phases: each half is (p_0 + p_1) of single products
        ev = add(fp16.mac(xh[0, 0], ah[0, n], np.uint32(0), acc=acc), fp16.mac(xh[0, 2], ah[2, n], np.uint32(0),
                                                                                 acc=acc))
        od = add(fp16.mac(xh[0, 1], ah[1, n], np.uint32(0), acc=acc), fp16.mac(xh[0, 3], ah[3, n], np.uint32(0),
                                                                                 acc=acc))
        assert yh[0, n] == add(ev, od)
    # +0 start: a single -0 product gives +0 (IEEE: -0 + +0 = +0).
    assert gemm(np.array([[0x8000]], np.uint16), np.array([[0x3C00]], np.uint16))[0, 0] == 0
    assert [mode_of(16, 8, 8, False), mode_of(16, 4, 8, False), mode_of(16, 3, 8, True),
            mode_of(4, 6, 8, True)] == ["row", "row_half", "trans", "trans_half"]
    with pytest.raises(ValueError, match="do not chain"):
        gemm(x, a.T)
    with pytest.raises(ValueError, match="acc must be one of"):
        gemm(x, a, acc="bf16")
    with pytest.raises(ValueError, match="row mode needs N"):
        gemm_mode(x, a, acc="fp32", lanes=4, mode="row")
    with pytest.raises(ValueError, match="runs as"):
        gemm_mode(x, a[:, :2], acc="fp32", lanes=4, mode="row")
    with pytest.raises(ValueError, match="TRANS needs K"):
        mode_of(12, 8, 8, True)


def test_accuracy_k4096_gemv():
    """fp16 vs fp32 accumulation of a K=4096 GEMV against float64 (golden only; printed for the docs)."""
    rng = np.random.default_rng(4096)
    k, n = 4096, 256
    x = rng.standard_normal(k).astype(np.float16).view(np.uint16)
    a = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16).view(np.uint16)
    t0 = time.perf_counter()
    res = {acc: accuracy(x[None, :], a, acc=acc) for acc in ("fp16", "fp32")}
    print(f"\nK={k} GEMV, N={n}, X~N(0,1), A~N(0,1/K) ({time.perf_counter() - t0:.2f}s):")
    for acc, r in res.items():
        print(f"  acc={acc}: max_rel {r['max_rel']:.3e} mean_rel {r['mean_rel']:.3e} "
              f"max_norm {r['max_norm']:.3e} mean_norm {r['mean_norm']:.3e} nonfinite {r['nonfinite']}")
    assert res["fp16"]["nonfinite"] == res["fp32"]["nonfinite"] == 0
    assert res["fp32"]["max_norm"] < 1e-5 < res["fp16"]["mean_norm"]
    assert res["fp32"]["mean_rel"] * 100 < res["fp16"]["mean_rel"]


def test_bad_parameters():
    with pytest.raises(ValueError, match="power of two"):
        PEArray(lanes=3)
    with pytest.raises(ValueError, match="power of two"):
        PEArray(lanes=1)
    with pytest.raises(ValueError, match="acc_columns"):
        PEArray(lanes=4, acc_columns=0)
    with pytest.raises(ValueError, match="acc must be one of"):
        PEArray(acc="bf16")
    with pytest.raises(ValueError, match="batch"):
        PEArray(batch=0)


def test_small_configs_and_lint(tmp_path):
    """lanes=2, batch=1 (every TRANS beat waits for its own write-back) works; the Verilog is lint-clean."""
    from sim.backends import get_backend
    from sim.backends.verilog import write_verilog, lint
    pe = PEArray(lanes=2, batch=1, acc="fp16", max_k=6, acc_columns=2)
    jobs = [("row", 1, 3, 2), ("trans", 1, 4, 1), ("row_half", 1, 2, 1), ("trans_half", 1, 1, 2)]
    run, gy, wy, gs, ws = run_jobs(get_backend("amaranth"), pe, jobs, np.random.default_rng(5))
    assert np.array_equal(gy, wy) and np.array_equal(gs, ws)
    paths = write_verilog(tmp_path, {"pe_min": lambda: pe,
                                     "pe_array": lambda: PEArray(lanes=4, batch=2, acc="fp32", max_k=100,
                                                                 acc_columns=16)})
    assert lint(paths) == []
