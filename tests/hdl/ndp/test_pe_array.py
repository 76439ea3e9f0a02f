# amaranth: UnusedElaboratable=no
"""PEArray (hdl/ndp/pe_array.py): bit-exact vs sim/golden/pe_array.gemm, cycle formula, accuracy vs float64."""

import time

import numpy as np
import pytest

from hdl.ndp.pe_array import PEArray
from sim.backends import Traffic, stream_ports
from sim.golden import fp16
from sim.golden.pe_array import gemm, gemv, accuracy
from fp_util import FP16_EDGE

# Small on Amaranth's simulator, larger on Verilator (K multiple of lanes or not, nb < 8 stalls, B = batch).
CONFIGS = {
    "amaranth": dict(lanes=2, batch=2, max_k=16, max_n=32),
    "verilator": dict(lanes=4, batch=4, max_k=512, max_n=256),
}
JOBS = {  # (B, K, N)
    "amaranth": [(1, 5, 16), (2, 4, 4), (2, 3, 18), (1, 1, 2)],
    "verilator": [(1, 512, 256), (4, 200, 96), (3, 37, 12), (2, 1, 4), (4, 64, 256), (1, 130, 32)],
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


def stimulus(pe, jobs, rng):
    cmds, xs, as_, want = [], [], [], []
    for i, (b, k, n) in enumerate(jobs):
        x, a = operands(rng, b, k, n, special=(i == 0))
        kb = -(-k // pe.lanes)
        xp = np.zeros((b, kb * pe.lanes), np.uint16)
        xp[:, :k] = x
        cmds.append(pe.cmd_layout.const({"rows": b, "k": k, "nb": n // pe.lanes}).as_value().value)
        xs += lane_words(xp, pe.lanes)
        as_ += lane_words(a, pe.lanes)
        want.append(gemm(x, a, acc=pe.acc, lanes=pe.lanes).ravel())
    return {"cmd": cmds, "x": xs, "a": as_}, np.concatenate(want)


@pytest.mark.parametrize("acc", ["fp16", "fp32"])
def test_pe_array_matches_golden(backend, acc):
    """Several GEMV/GEMM jobs back to back: full rate (cycle formula) and random valid gaps + backpressure."""
    pe = PEArray(acc=acc, **CONFIGS[backend.name])
    jobs = JOBS[backend.name]
    rng = np.random.default_rng(7 if acc == "fp16" else 8)
    inputs, want = stimulus(pe, jobs, rng)
    n_out = sum(b * n // pe.lanes for b, _, n in jobs)
    dtype = np.uint16 if acc == "fp16" else np.uint32

    full = backend.run_streams(pe, inputs, {"y": n_out})
    got = unpack_lanes(full.outputs["y"], pe.lanes, pe.acc_width, dtype)
    assert np.array_equal(got, want), f"{int((got != want).sum())} mismatches at full rate"
    assert full.cycles == sum(pe.cycles(b, k, n // pe.lanes) for b, k, n in jobs)

    for seed, (vp, rp) in enumerate([(0.7, 0.7), (0.95, 0.3)]):
        tr = Traffic.random(stream_ports(pe), seed=seed, valid_prob=vp, ready_prob=rp)
        run = backend.run_streams(pe, inputs, {"y": n_out}, traffic=tr)
        got = unpack_lanes(run.outputs["y"], pe.lanes, pe.acc_width, dtype)
        assert np.array_equal(got, want), f"{int((got != want).sum())} mismatches (valid {vp}, ready {rp})"
        assert run.cycles > full.cycles


def test_full_rate_cycles_and_utilization(backend):
    """One A beat per cycle for nb >= 8, and (K split over S phases) for nb < 8 once S*nb >= 8; fixed drain
    latency, or the K-split reduction per output beat."""
    pe = PEArray(acc="fp32", **CONFIGS[backend.name])
    rng = np.random.default_rng(3)
    shapes = [(pe.batch, 8, 8 * pe.lanes), (1, 6, pe.lanes), (2, 16, 2 * pe.lanes)] \
        if backend.name == "amaranth" else \
        [(pe.batch, 256, 256), (1, 512, 256), (2, 100, 3 * pe.lanes), (1, 512, pe.lanes), (4, 64, 2 * pe.lanes)]
    for b, k, n in shapes:
        inputs, want = stimulus(pe, [(b, k, n)], rng)
        nb = n // pe.lanes
        S = pe.phases(k, nb)
        # Only the first result beat: the cycle it appears in is last A beat + drain_latency (no split), or
        # the job's length less the reductions of the other beats (split).
        first = backend.run_streams(pe, inputs, {"y": 1})
        x_beats = b * -(-k // pe.lanes)
        if S == 1:
            last_a = x_beats + 1 + (k - 1) * max(nb, pe.min_nb) + nb - 1
            assert first.cycles == last_a + pe.drain_latency + 1
        else:
            assert first.cycles == pe.cycles(b, k, nb) - (b * nb - 1) * pe.reduce_cycles(S)
            if S * nb >= pe.min_nb:     # one A beat per cycle: the compute phase is K * nb cycles
                assert pe.cycles(b, k, nb) == (x_beats + k * nb + pe.loop_latency
                                               + b * nb * pe.reduce_cycles(S) + 1)
        run = backend.run_streams(pe, inputs, {"y": b * nb})
        assert run.cycles == pe.cycles(b, k, nb)
        got = unpack_lanes(run.outputs["y"], pe.lanes, pe.acc_width, np.uint32)
        assert np.array_equal(got, want)
        macs = b * k * n
        print(f"\n[{backend.name}] B={b} K={k} N={n} lanes={pe.lanes} batch={pe.batch}: {run.cycles} cycles, "
              f"{macs / run.cycles:.2f} MACs/cycle of {pe.lanes * pe.batch} "
              f"(K split over {S} phases; compute phase "
              f"{macs / (k * (nb if S > 1 else max(nb, pe.min_nb))):.2f}), "
              f"{run.cycles / max(run.wall_seconds, 1e-9) / 1e3:.1f}k cycles/s")


def test_golden_order_of_operations():
    """gemm is the plain sequential loop of fp16.mac from +0, element by element."""
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
    # +0 start: a single -0 product gives +0 (IEEE: -0 + +0 = +0).
    assert gemm(np.array([[0x8000]], np.uint16), np.array([[0x3C00]], np.uint16))[0, 0] == 0
    with pytest.raises(ValueError, match="do not chain"):
        gemm(x, a.T)
    with pytest.raises(ValueError, match="acc must be one of"):
        gemm(x, a, acc="bf16")


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
    with pytest.raises(ValueError, match="multiple of lanes"):
        PEArray(lanes=4, max_n=6)
    with pytest.raises(ValueError, match="acc must be one of"):
        PEArray(acc="bf16")
    with pytest.raises(ValueError, match="batch"):
        PEArray(batch=0)


def test_degenerate_config_and_lint(tmp_path):
    """lanes=1, batch=1, nb=1 (every beat waits for its own write-back) works and the Verilog is lint-clean."""
    from sim.backends import get_backend
    from sim.backends.verilog import write_verilog, lint
    pe = PEArray(lanes=1, batch=1, acc="fp16", max_k=3, max_n=1)
    rng = np.random.default_rng(5)
    jobs = [(1, 3, 1), (1, 1, 1)]
    inputs, want = stimulus(pe, jobs, rng)
    run = get_backend("amaranth").run_streams(pe, inputs, {"y": 2})
    assert np.array_equal(unpack_lanes(run.outputs["y"], 1, 16, np.uint16), want)
    assert run.cycles == pe.cycles(1, 3, 1) + pe.cycles(1, 1, 1)
    paths = write_verilog(tmp_path, {"pe_min": lambda: pe,
                                     "pe_array": lambda: PEArray(lanes=4, batch=2, acc="fp32", max_k=100,
                                                                 max_n=64)})
    assert lint(paths) == []
