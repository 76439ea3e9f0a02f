"""``make bench-pim``: the DIMM-PIM (L3) fused attention kernel -- model tables, RTL runs, simulation speed.

``python -m sim.bench.pim [--no-accuracy] [--rtl] [--paper-rtl] [--rankset-rtl] [--speed] [--all-rtl]
[--calibrate [micro,tiny,paper]] [--json build/bench/pim.json]`` prints

(a) per head and rank (PAPER, d = 128), L = 64 .. 128K, :class:`PIMPerfModel` with ``fixed_cycles`` measured on
    the PAPER RTL (``data/pim_rtl_calibration.json``): RD_ABs, rows, refresh, cycles, utilization, period;
(b) the system's aggregate internal PIM bandwidth next to the CPU-side 406 GB/s ([L3] Table 2);
(c) the command-level rankset model ([L3] 5.1) at 2 and 4 ranks per channel;
(d) accuracy vs float64 with FP16 (the paper's) and FP32 bank-PU context accumulators, up to 128K tokens;
(e) ``--rtl``: TINY through the RTL (fast Verilator build), bit-exact, against :class:`PIMSequenceModel`;
(h) ``--speed``: cycles/s of the fused TINY top, 12 heads of L = 2048, inline and fast builds;
(i) ``--paper-rtl``: the PAPER rank (128 bank PUs) at L = 1K and 4K, bit-exact, build / run seconds, model;
(j) ``--rankset-rtl``: two rank PUs and the host controller on one channel ([L3] 5.1), next to the model;
(k) ``--rankset-rtl``: four TINY ranks on one channel, three computing while the host writes into the fourth, on
    both command paths (each rank PU driving its own rank, and the shared bus): the computing ranks' rate;

and writes every figure to ``build/bench/pim.json`` (keys ``paper_rtl_bitexact``, ``paper_rtl_cycles``,
``model_rtl_max_rel_err``, ``rankset_compute_preserved_rtl``, ``sim_cycles_per_s`` {``fused_tiny``,
``memory_system`` (from the DRAM bench's build/bench/dram.json when present)}, ...). ``--calibrate`` measures the
RTL datapath latencies (gap, tail, fixed_cycles) the models use and writes them to the data file.
"""

import argparse
import re
import time

import numpy as np

from hdl.memctl.commands import Cmd
from hdl.pim.config import PAPER
from sim.perf.pim import PIMPerfModel, calibrate, rankset_sim, steady_residuals, system_bandwidth

__all__ = ["rtl_head_cycles", "main", "LENGTHS"]

LENGTHS = (64, 256, 1024, 4096, 16384, 32768, 65536, 131072)


def head_table(config, lengths, model=None, rtl=None):
    """Per-head table; ``rtl``: ``{L: RTL head cycles}`` printed next to the model."""
    m = model or PIMPerfModel(config)
    rtl = rtl or {}
    tck_ns = config.dram.timing.tck_ps / 1000
    print(f"(a) fused kernel per head and rank, {config.name} (d = {config.head_dim}, {config.banks} banks x "
          f"{config.chips} chips; DDR4-3200, tCK = {tck_ns} ns = 1600 MHz); fixed_cycles = {m.fixed_cycles}")
    print(f"{'L':>7s} {'RD_AB':>6s} {'rows':>5s} {'refresh':>11s} {'cycles':>8s} {'ideal':>8s} {'util':>6s} "
          f"{'us/head':>8s} {'period':>9s} {'ideal+ref':>9s} {'util':>6s} {'GFLOP/s':>8s} {'RTL cyc':>8s}")
    for L in lengths:
        if L > config.max_tokens:
            continue
        h = m.head(L)
        per = m.heads_period(L)
        ideal_r = m.ideal_cycles(L)
        rc = rtl.get(L)
        print(f"{L:7d} {h.rd_ab:6d} {h.rows:5d} {h.refresh_mode:>7s} {h.refs:3d} {h.cycles:8d} "
              f"{h.ideal_cycles:8.0f} {h.utilization:6.3f} {h.time_us:8.2f} {per:9.0f} {ideal_r:9.0f} "
              f"{ideal_r / per:6.3f} {m.gflops(L, per):8.1f} {rc if rc is not None else '-':>8}")
    print("  cycles = DRAM command stream (first ACT_AB .. last PREA) + fixed_cycles; ideal = RD_ABs x tCCD_L;\n"
          "  period = steady-state cycles per head with refresh; ideal+ref = ideal / (1 - tRFC/tREFI);\n"
          "  refresh 'between' = REFs only between heads (docs/pim.md), 'in_head' = the head outlasts the\n"
          f"  {config.max_postponed_refresh}-REF postponement window, REFs at row boundaries (count shown).")



def bandwidth_table(config, model=None):
    s = system_bandwidth(config)
    print(f"\n(b) system (L3 Table 2: 16 channels x 2 DIMMs x {config.ranks} ranks = {s['ranks']} ranks)")
    print(f"  PIM internal peak = ranks x {config.banks} banks x {config.chips} chips x 64 bit / tCCD_L "
          f"({config.dram.timing.tCCD_L} nCK = {config.dram.timing.tCCD_L * config.dram.timing.tck_ps / 1000} ns)"
          f" = {s['pim_peak']:8.1f} GB/s (paper: {s['paper_pim']:.0f} GB/s)")
    print(f"  with refresh (x (1 - tRFC/tREFI))                         = {s['pim_refresh']:8.1f} GB/s")
    print(f"  CPU DQ bus = 16 ch x 3200 MT/s x 8 B (JESD79-4 DDR4-3200)  = {s['bus']:8.1f} GB/s "
          f"(paper: {s['paper_cpu']:.0f} GB/s)")
    print(f"  PIM / CPU = {s['ratio']:.1f}x")
    m = model or PIMPerfModel(config)
    tck_s = config.dram.timing.tck_ps * 1e-12
    print(f"  fused kernel on all {s['ranks']} ranks (one head per rank at a time, model period, fixed_cycles = "
          f"{m.fixed_cycles}):")
    print(f"  {'L':>7s} {'heads/s':>10s} {'KV GB/s':>9s} {'of peak':>7s}")
    for L in (4096, 32768, 131072):
        per = m.heads_period(L)
        heads_s = s["ranks"] / (per * tck_s)
        kv = heads_s * 2 * L * config.head_dim * 2 / 1e9          # K and V, FP16
        print(f"  {L:7d} {heads_s:10.0f} {kv:9.1f} {kv / s['pim_peak']:7.3f}")


def rankset_table(config, writes=4096, L=32768):
    print(f"\n(c) ranksets (section 5.1): one rank per channel receives {writes} WR bursts "
          f"({writes * config.dram.org.burst_bytes >> 10} KiB of KV) while the others compute; shared command bus")
    print(f"{'ranks':>5s} {'window':>7s} {'write GB/s':>10s} {'DQ peak':>8s} {'preserved':>9s} {'(R-1)/R':>8s} "
          f"{'bus loss':>8s} {'cmd bus':>7s}")
    for R in (2, 4):
        r = rankset_sim(config, R, writes=writes, L=L)
        print(f"{R:5d} {r.window_cycles:7d} {r.write_gbps:10.2f} {r.dq_peak_gbps:8.1f} {r.preserved:9.4f} "
              f"{(R - 1) / R:8.4f} {r.contention_loss:8.4f} {r.cmd_bus_busy:7.3f}")
    print("  preserved = RD_ABs of the computing ranks / RD_ABs of all ranks without communication (same window);\n"
          "  bus loss = RD_ABs the computing ranks lose to the writer's commands; cmd bus = busy fraction.")


def accuracy_table(config, lengths):
    """(d) Accuracy vs float64 of the fused kernel with FP16 (the paper's) and FP32 bank-PU context accumulators
    (``PIMConfig.context_acc``). Returns ``{acc: {dist: {L: norm_rel}}}``."""
    from dataclasses import replace
    from sim.golden.pim_attention import accuracy_table as acc
    print(f"\n(d) accuracy of the fused kernel vs float64 attention of the same FP16 inputs, {config.name}: FP16 "
          f"(default) and FP32 bank-PU context accumulators")
    print(f"{'dist':>7s} {'L':>7s} {'fp16 norm':>10s} {'fp16 mean':>10s} {'fp32 norm':>10s} {'fp32 mean':>10s}")
    Ls = [L for L in lengths if L <= config.max_tokens]
    res = {a: acc(replace(config, context_acc=a), Ls) for a in ("fp16", "fp32")}
    out = {a: {} for a in res}
    for r16, r32 in zip(res["fp16"], res["fp32"]):
        dist, L = r16[0], r16[1]
        print(f"{dist:>7s} {L:7d} {r16[2]:10.2e} {r16[3]:10.2e} {r32[2]:10.2e} {r32[3]:10.2e}")
        out["fp16"].setdefault(dist, {})[L] = r16[2]
        out["fp32"].setdefault(dist, {})[L] = r32[2]
    print("  norm = max|out - ref| / max|ref|; mean = mean|out - ref| / mean|ref|")
    return out


# ---- RTL calibration of the models (data/pim_rtl_calibration.json) ------------------------------------------

def _calibration_configs():
    from sim.pim.fused import micro, tiny_rows, paper_rows
    return {"micro": (lambda: micro(16), (16, 64, 256)),
            "tiny": (lambda: tiny_rows(64), (64, 256, 1024)),
            "paper": (lambda: paper_rows(32), (256, 1024, 4096))}


#: ``paper-a<N>``: PAPER with ``N`` rank-PU adders (``PIMConfig.rank_adders``; the paper's 8 is ``paper``), the
#: geometries ``ndpim dse --rank-adders`` prices (its calibration key differs only in ``-a<N>``).
_PAPER_ADDERS = re.compile(r"^paper-a(\d+)$")


def calibration_config(name):
    """``(make, lengths)`` of a ``--calibrate`` name: ``micro``, ``tiny``, ``paper`` or ``paper-a<N>`` (PAPER with
    ``rank_adders = N``, validated by :class:`PIMConfig`; the same rows and lengths as ``paper``)."""
    from dataclasses import replace
    table = _calibration_configs()
    if name in table:
        return table[name]
    m = _PAPER_ADDERS.match(name)
    if not m:
        raise ValueError(f"unknown calibration configuration {name!r}; choose one of {sorted(table)} or "
                         f"paper-a<N> (PAPER with N rank adders)")
    n = int(m.group(1))
    make, lengths = table["paper"]
    base = make()
    cfg = replace(base, rank_adders=n, name=f"{base.name}-a{n}")     # PIMConfig validates N (>= chips)
    return (lambda: cfg), lengths


def measure_calibration(config, lengths, backend="verilator", component=None):
    """The RTL's datapath latencies for ``config`` (fast Verilator build, timing-only storage: cycle counts do not
    depend on data): single heads of ``lengths`` from reset give ``gap`` (last score RD_AB -> first context
    RD_AB: the probabilities, when that is longer than a row change), ``tail`` (last context RD_AB -> the head's
    last result) and ``fixed_cycles`` of :class:`PIMPerfModel` (:func:`calibrate`). Every length must give the
    same gap / tail, and :class:`PIMSequenceModel` with them must reproduce each head's command trace and done
    cycle. Returns the calibration entry (with the per-L RTL figures)."""
    from sim.perf.pim import PIMSequenceModel
    from sim.pim.fused import PIMChannelSystem, rtl_cycles
    tm = config.dram.timing
    comp = component if component is not None else PIMChannelSystem(config, None, fast=True)
    res = rtl_cycles(config, lengths, backend=backend, component=comp)
    gaps = {L: r["gap"] for L, r in res.items()}
    tails = {L: r["tail"] for L, r in res.items()}
    if len(set(gaps.values())) != 1 or len(set(tails.values())) != 1:
        raise RuntimeError(f"{config.name}: RTL gap / tail depend on L: {gaps}, {tails}")
    gap, tail = gaps[lengths[0]], tails[lengths[0]]
    if gap <= tm.tRTP + tm.tRPab + tm.tRCD:
        raise RuntimeError(f"{config.name}: gap {gap} is a row change, not the datapath: choose lengths whose "
                           f"context phase starts in a new row")
    cal, resid = calibrate(PIMPerfModel(config), [(L, r["head_cycles"]) for L, r in res.items()])
    # a head of one chunk (L <= B): the softmax unit skips the running rescale, the probabilities come sooner
    one = rtl_cycles(config, (1,), backend=backend, component=comp)[1]
    gap1 = one["gap"]
    if gap1 <= tm.tRTP + tm.tRPab + tm.tRCD:
        raise RuntimeError(f"{config.name}: one-chunk gap {gap1} is a row change, not the datapath")
    res[1] = one
    seq = PIMSequenceModel(config, gap=gap, tail=tail, gap1=gap1)
    for L, r in res.items():
        m = seq.run([L]).heads[0]
        if m.done - m.first_cmd + 1 != r["head_cycles"]:
            raise RuntimeError(f"{config.name}: sequence model {m.done - m.first_cmd + 1} != RTL "
                               f"{r['head_cycles']} cycles at L = {L}")
    return {"config": config.name, "gap": int(gap), "gap1": int(gap1), "tail": int(tail),
            "fixed_cycles": int(cal.fixed_cycles),
            "fixed_residuals": [int(x) for x in resid], "lengths": list(lengths),
            "rtl_head_cycles": {str(L): int(r["head_cycles"]) for L, r in res.items()},
            "rtl_steady_cycles": {str(L): float(r["steady_cycles"]) for L, r in res.items()}}


def calibrate_rtl(names=("micro", "tiny", "paper"), backend="verilator", path=None):
    """``--calibrate``: measure :func:`measure_calibration` for the named configurations and write them into
    ``data/pim_rtl_calibration.json`` (other entries kept)."""
    import json
    import subprocess
    from sim.perf.pim import CALIBRATION_FILE, calibration_key
    path = CALIBRATION_FILE if path is None else path
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("source", "python -m sim.bench.pim --calibrate (RTL: sim.pim.fused.PIMChannelSystem, "
                              "fast Verilator build, single heads from reset)")
    configs = data.setdefault("configs", {})
    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                             cwd=path.parent.parent).stdout.strip()
    except OSError:
        rev = ""
    print("\n(calibration) RTL datapath latencies")
    for name in names:
        make, lengths = calibration_config(name)
        cfg = make()
        t0 = time.time()
        entry = measure_calibration(cfg, lengths, backend)
        entry.update({"measured_at_commit": rev, "seconds": round(time.time() - t0, 1)})
        configs[calibration_key(cfg)] = entry
        print(f"  {name:6s} {calibration_key(cfg)}: gap {entry['gap']} (one chunk {entry['gap1']}), tail "
              f"{entry['tail']}, fixed_cycles "
              f"{entry['fixed_cycles']} (residuals {entry['fixed_residuals']}), RTL head cycles "
              f"{entry['rtl_head_cycles']} ({entry['seconds']} s)")
        path.parent.mkdir(parents=True, exist_ok=True)      # after each: a long list keeps what it measured
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"  written to {path}")
    return data


# ---- RTL simulation speed of the fused TINY top (issue 14 item 6, PIM part) --------------------------------------

def _timed_build(backend, comp):
    """(Verilog generation seconds, compile seconds) of ``comp``'s Verilator executable (0 when cached)."""
    from sim.backends.verilog import verilog_text
    t0 = time.perf_counter()
    text = verilog_text(comp, "top")
    t1 = time.perf_counter()
    backend.executable(comp, verilog=text)      # with the backend's own build options; cached for the run
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def fused_tiny_speed(backend="verilator", variants=("inline", "fast"), heads=12, L=2048, rows=64):
    """``PIMChannelSystem(tiny_rows(64))`` running ``heads`` heads of ``L`` tokens (two stored heads, alternating):
    cycles per second of the stream run, per build variant -- ``inline`` (every bank PU generated and inlined,
    the DRAM model's own storage) and ``fast`` (one compiled bank-PU module, run-time KV image). Every variant
    must give the same outputs (bit-exact to the golden kernel) and the same cycle count. Returns
    ``{variant: {...}}``."""
    from hdl.pim.mapping import head_layout, kv_store_image
    from sim.backends import get_backend
    from sim.golden.pim_attention import make_inputs, pim_attention
    from sim.pim.fused import PIMChannelSystem, run_fused, tiny_rows
    be = get_backend(backend) if isinstance(backend, str) else backend
    cfg = tiny_rows(rows)
    lay = head_layout(cfg, L, 2)
    KV = [make_inputs(cfg, L, seed=100 + h)[1:] for h in range(2)]
    K = np.stack([k for k, _ in KV])
    V = np.stack([v for _, v in KV])
    img = kv_store_image(cfg, K, V, lay)
    qs = np.array([make_inputs(cfg, 4, seed=200 + i)[0] for i in range(heads)])
    order = [i % 2 for i in range(heads)]
    gold = np.array([pim_attention(cfg, q, K[h], V[h]).out for q, h in zip(qs, order)])
    out = {}
    print(f"\n(h) RTL simulation speed: fused TINY top ({cfg.name}: {cfg.chips} chips x {cfg.banks} banks, "
          f"{cfg.chips * cfg.banks} bank PUs), {heads} heads of L = {L}, {backend}")
    print(f"  {'variant':>8s} {'gen s':>7s} {'compile s':>9s} {'cycles':>8s} {'run s':>7s} {'cpu s':>7s} "
          f"{'cycles/s':>10s} {'bit-exact':>9s}")
    for v in variants:
        comp = PIMChannelSystem(cfg, img, fast=(v == "fast"))
        gen, comp_s = _timed_build(be, comp)
        run = run_fused(be, cfg, K, V, qs, heads_order=order, component=comp, layout=lay)
        ok = bool(np.array_equal(run.out, gold)) and not run.violations and run.device_violations == 0
        rate = run.cycles / run.cpu_seconds
        out[v] = {"gen_s": gen, "compile_s": comp_s, "cycles": run.cycles, "run_s": run.wall_seconds,
                  "cpu_s": run.cpu_seconds, "cycles_per_s": rate, "cycles_per_wall_s": run.cycles / run.wall_seconds,
                  "bitexact": ok, "done": [d["cycle"] for d in run.done]}
        print(f"  {v:>8s} {gen:7.1f} {comp_s:9.1f} {run.cycles:8d} {run.wall_seconds:7.2f} {run.cpu_seconds:7.2f} "
              f"{rate:10.0f} {str(ok):>9s}")
    cyc = {v: r["cycles"] for v, r in out.items()}
    if len(set(cyc.values())) != 1 or any(r["done"] != out[variants[0]]["done"] for r in out.values()):
        raise SystemExit(f"fused TINY speed: variants disagree on cycles: {cyc}")
    if not all(r["bitexact"] for r in out.values()):
        raise SystemExit("fused TINY speed: a variant is not bit-exact")
    print("  gen / compile: Verilog generation and Verilator + C++ build of this variant (0 when cached); the "
          "run excludes both; cycles/s = cycles / CPU seconds of the harness (independent of the machine's load)")
    return out


# ---- the PAPER rank in RTL (issue 14 item 1) ------------------------------------------------------------------

def fused_rtl(config, lengths, *, backend="verilator", steady=4, label="", seed=300):
    """The fused kernel through the RTL of ``config`` (fast Verilator build: one compiled bank-PU module, the
    device model in timing mode with a run-time KV image): two stored heads of ``max(lengths)`` tokens; per L a
    single head from reset, then ``steady`` heads back to back (alternating the stored heads, overlapped when two
    fit the rank buffer). Checks: outputs bit-exact to the golden kernel, zero device-model and checker
    violations, no error bits; the command trace and per-head cycles against :class:`PIMSequenceModel` (the
    calibration of ``data/pim_rtl_calibration.json``). Returns a dict of the figures."""
    from hdl.pim.mapping import head_layout, kv_store_image
    from sim.backends import get_backend
    from sim.golden.pim_attention import make_inputs, pim_attention
    from sim.perf.pim import PIMSequenceModel, SeqLaunch
    from sim.pim.fused import PIMChannelSystem, run_fused, ideal_cycles
    be = get_backend(backend) if isinstance(backend, str) else backend
    cfg = config
    Lmax = max(lengths)
    lay = head_layout(cfg, Lmax, 2)
    t0 = time.perf_counter()
    KV = [make_inputs(cfg, Lmax, seed=seed + h)[1:] for h in range(2)]
    K, V = np.stack([k for k, _ in KV]), np.stack([v for _, v in KV])
    img = kv_store_image(cfg, K, V, lay)
    t_img = time.perf_counter() - t0
    comp = PIMChannelSystem(cfg, img, fast=True)
    gen, comp_s = _timed_build(be, comp)
    print(f"\n{label} {cfg.name} in RTL: {cfg.chips} chips x {cfg.banks} banks = {cfg.chips * cfg.banks} bank PUs, "
          f"d = {cfg.head_dim}, {cfg.columns_per_row} bursts per row; {backend}, fast build")
    print(f"  build: Verilog generation {gen:.1f} s, Verilator + C++ compile {comp_s:.1f} s (0 = cached); "
          f"KV image {t_img:.1f} s")
    try:
        seq = PIMSequenceModel.calibrated(cfg)
    except ValueError as e:
        print(f"  (no model calibration: {e})")
        seq = None
    out = {"config": cfg.name, "gen_s": gen, "compile_s": comp_s, "bitexact": True, "cycles": {},
           "steady_cycles": {}, "model_rel_err": None if seq is None else 0.0, "model_traces_equal": seq is not None,
           "runs": []}
    print(f"  {'L':>5s} {'heads':>5s} {'cycles/head':>11s} {'ideal':>7s} {'ratio':>6s} {'run cycles':>10s} "
          f"{'run s':>6s} {'cyc/cpu-s':>9s} {'bit-exact':>9s} {'viol':>4s} {'model err':>9s} {'trace':>5s}")
    for L in lengths:
        for n in (1, steady):
            qs = np.array([make_inputs(cfg, 4, seed=seed + 100 + L + i)[0] for i in range(n)])
            order = [i % 2 for i in range(n)]
            run = run_fused(be, cfg, K, V, qs, L=L, heads_order=order, component=comp, layout=lay)
            gold = np.array([pim_attention(cfg, q, K[h][:L], V[h][:L]).out for q, h in zip(qs, order)])
            ok = bool(np.array_equal(run.out, gold))
            viol = len(run.violations) + run.device_violations
            errs = sum(d["errors"] != 0 for d in run.done)
            first = next(c.cycle for c in run.trace if c.rank == 0)
            done = [d["cycle"] for d in run.done]
            heads_rtl = [done[0] - first + 1] + [int(x) for x in np.diff(done)]
            err = same = None
            if seq is not None:
                m = seq.run([SeqLaunch(L, lay.k_row0[h], lay.v_row0[h]) for h in order])
                key = lambda t, k, r, c: (t, k, r, c) if k is Cmd.RD_AB else (t, k)
                same = [key(*x) for x in m.commands] == \
                    [key(c.cycle, c.kind, c.row, c.col) for c in run.trace if c.rank == 0]
                err = max(abs(a - b) / a for a, b in zip(heads_rtl, m.head_cycles()))
                out["model_rel_err"] = max(out["model_rel_err"], err)
                out["model_traces_equal"] &= same
            per = heads_rtl[0] if n == 1 else float(np.mean(heads_rtl[1:-1]))
            (out["cycles"] if n == 1 else out["steady_cycles"])[L] = per
            out["bitexact"] &= ok and viol == 0 and errs == 0
            ideal = ideal_cycles(cfg, L)
            out["runs"].append({"L": L, "heads": n, "per_head": per, "head_cycles": heads_rtl,
                                "run_cycles": run.cycles, "wall_s": run.wall_seconds, "cpu_s": run.cpu_seconds,
                                "bitexact": ok,
                                "violations": viol, "errors": errs, "model_rel_err": err, "model_trace_equal": same})
            print(f"  {L:5d} {n:5d} {per:11.1f} {ideal:7d} {per / ideal:6.3f} {run.cycles:10d} "
                  f"{run.wall_seconds:6.1f} {run.cycles / run.cpu_seconds:9.0f} {str(ok):>9s} {viol:4d} "
                  f"{'-' if err is None else f'{err:.1e}':>9s} {'-' if same is None else str(same):>5s}")
    print("  cycles/head: one head from reset (first command .. last result taken), or back to back (done to "
          "done, first and last excluded); ideal = RD_ABs x tCCD_L; model err: PIMSequenceModel vs RTL, largest "
          "per-head relative error; trace: the model's command trace equals the RTL's, cycle for cycle")
    if not out["bitexact"]:
        raise SystemExit(f"{cfg.name} RTL: FAILED (mismatch, violation or error bit)")
    return out


def paper_rtl(backend="verilator", lengths=(1024, 4096), rows=32):
    """(i) The PAPER rank in RTL (issue 14 item 1): ``paper_rows(32)`` = 8 x8 chips x 16 banks (128 bank PUs),
    head dim 128, DDR4-3200, the 1 KB page, 32 rows (two stored heads of 4K tokens)."""
    from sim.pim.fused import paper_rows
    return fused_rtl(paper_rows(rows), lengths, backend=backend, label="(i) the PAPER rank:")


def tiny_rtl(backend="verilator", lengths=(64, 256, 1024, 2048), rows=64):
    """(e) TINY (2 chips x 16 banks, d 32; 64 rows) in RTL against both models."""
    from sim.pim.fused import tiny_rows
    return fused_rtl(tiny_rows(rows), lengths, backend=backend, label="(e) TINY:", seed=500)


def rankset_rtl_table(backend="verilator", rows=32):
    """(j) [L3] 5.1 in RTL (:func:`sim.pim.rankset.rankset_rtl` on TINY geometry, two ranks) next to the
    command-level model :func:`rankset_sim` of the same configuration and write count."""
    from sim.pim.fused import tiny_rows
    from sim.pim.rankset import rankset_rtl, RanksetSystem
    cfg = tiny_rows(rows)
    t0 = time.perf_counter()
    r = rankset_rtl(cfg, backend=backend)
    wall = time.perf_counter() - t0
    model = rankset_sim(cfg, 2, writes=r.writes, L=4096)
    print(f"\n(j) ranksets in RTL ({cfg.name}: 2 ranks, each a rank PU + {cfg.chips * cfg.banks} bank PUs; the host "
          f"controller writes {r.writes} bursts into rank 1 while rank 0 computes; {backend}, {wall:.0f} s)")
    print(f"  {'':>14s} {'window':>7s} {'write GB/s':>10s} {'DQ peak':>8s} {'preserved':>9s} {'(R-1)/R':>8s} "
          f"{'bus loss':>8s}")
    print(f"  {'RTL':>14s} {r.window:7d} {r.write_gbps:10.2f} {r.dq_peak_gbps:8.1f} {r.preserved:9.4f} "
          f"{0.5:8.4f} {r.contention_loss:8.4f}")
    print(f"  {'model':>14s} {model.window_cycles:7d} {model.write_gbps:10.2f} {model.dq_peak_gbps:8.1f} "
          f"{model.preserved:9.4f} {0.5:8.4f} {model.contention_loss:8.4f}")
    print(f"  RD_ABs in the window: RTL {r.rd_ab_with_comm} (with writes) / {r.rd_ab_all_compute} (both ranks "
          f"computing) / {r.rd_ab_alone} (rank 0 alone); bit-exact {r.bitexact} (incl. the head written by the host, "
          f"computed by rank 1 afterwards), violations {r.violations}, error records {r.errors}")
    if not r.bitexact or r.violations or r.errors:
        raise SystemExit("rankset RTL: FAILED")
    return r, model


def rankset4_rtl_table(backend="verilator", rows=32):
    """(k) The rank PU's command path (issue 31 item 1; docs/pim_perf.md "The command path of a rank"): TINY
    geometry with four ranks (:func:`sim.pim.rankset.with_ranks`; 128 bank PUs), ranks 0-2 computing 4 heads of
    L = 512 each while the host writes a 128-token head into rank 3, on ``per_rank`` and ``shared`` command paths;
    the computing ranks' RD_AB rate in the write window and cycles to their last head, with the host writing /
    without. (The per-rank model, ``host.l3.pim_timing.RanksetModel("per_rank")``, not imported here since sim/
    imports nothing from host/, says 1.)"""
    from sim.pim.fused import tiny_rows
    from sim.pim.rankset import rankset_rtl, with_ranks
    cfg = with_ranks(tiny_rows(rows), 4)
    out = {}
    print(f"\n(k) the rank PU's command path ({cfg.name}: 4 ranks x {cfg.chips * cfg.banks} bank PUs; ranks 0-2 "
          f"compute 4 heads of L = 512 while the host writes 1024 bursts into rank 3; {backend})")
    print(f"  {'path':>9s} {'window':>7s} {'write GB/s':>10s} {'preserved':>9s} {'(R-1)/R':>8s} "
          f"{'rank rates (RD_AB, window)':>28s} {'head rate':>9s} {'wall s':>7s}")
    for path in ("per_rank", "shared"):
        t0 = time.perf_counter()
        r = rankset_rtl(cfg, backend=backend, command_path=path)
        wall = time.perf_counter() - t0
        rates = " ".join(f"{x:.4f}" for x in r.rank_rates)
        print(f"  {path:>9s} {r.window:7d} {r.write_gbps:10.2f} {r.preserved:9.4f} {0.75:8.4f} {rates:>28s} "
              f"{r.head_rate:9.4f} {wall:7.0f}")
        print(f"  {'':>9s} cycles to the last head with the host writing {r.head_cycles_comm} / without "
              f"{r.head_cycles_quiet}; bit-exact {r.bitexact}, violations {r.violations}, error records {r.errors}")
        if not r.bitexact or r.violations or r.errors:
            raise SystemExit(f"rankset RTL (4 ranks, {path}): FAILED")
        out[path] = {"window": r.window, "writes": r.writes, "write_gbps": r.write_gbps, "preserved": r.preserved,
                     "rank_rates": list(r.rank_rates), "compute_rate": r.compute_rate, "head_rate": r.head_rate,
                     "head_cycles_comm": list(r.head_cycles_comm), "head_cycles_quiet": list(r.head_cycles_quiet),
                     "rd_ab_with_comm": r.rd_ab_with_comm, "rd_ab_all_compute": r.rd_ab_all_compute,
                     "bitexact": r.bitexact, "violations": r.violations, "wall_s": round(wall, 1), "runs": r.runs}
    return out


def _memory_system_rate():
    """``sim_cycles_per_s.memory_system`` of the DRAM bench (``build/bench/dram.json``, devmem's ``make
    bench-dram``) when it has been run; None otherwise."""
    import json
    from pathlib import Path
    p = Path("build/bench/dram.json")
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    v = d.get("sim_cycles_per_s", {})
    return v.get("memory_system") if isinstance(v, dict) else None


def write_json(result, path):
    import json
    from pathlib import Path
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def conv(x):
        if isinstance(x, dict):
            return {str(k): conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        if isinstance(x, (np.integer,)):
            return int(x)
        if isinstance(x, (np.floating,)):
            return float(x)
        if isinstance(x, np.bool_):
            return bool(x)
        return x
    path.write_text(json.dumps(conv(result), indent=1) + "\n")
    print(f"\n(written {path})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-accuracy", action="store_true", help="skip the accuracy table (d)")
    ap.add_argument("--rtl", action="store_true", help="(e) TINY through the RTL against both models")
    ap.add_argument("--paper-rtl", action="store_true", help="(i) the PAPER rank (128 bank PUs) through the RTL")
    ap.add_argument("--rankset-rtl", action="store_true", help="(j) two rank PUs + the host on one "
                    "channel, (k) four ranks on both command paths, RTL")
    ap.add_argument("--speed", action="store_true", help="(h) cycles/s of the fused TINY top, both builds")
    ap.add_argument("--all-rtl", action="store_true", help="--rtl --paper-rtl --rankset-rtl --speed")
    ap.add_argument("--calibrate", nargs="?", const="micro,tiny,paper", default=None,
                    help="measure the RTL datapath latencies and write data/pim_rtl_calibration.json "
                         "(default configurations: micro,tiny,paper; paper-a<N>: PAPER with N rank adders)")
    ap.add_argument("--backend", default="verilator", help="RTL backend (default verilator)")
    ap.add_argument("--json", default="build/bench/pim.json", help="where to write the figures")
    args = ap.parse_args(argv)
    if args.all_rtl:
        args.rtl = args.paper_rtl = args.rankset_rtl = args.speed = True
    t0 = time.time()
    res = {"paper_rtl_bitexact": None, "paper_rtl_cycles": {}, "paper_rtl_steady_cycles": {},
           "model_rtl_max_rel_err": None, "model_rtl_traces_equal": None, "rankset_compute_preserved_rtl": None,
           "rankset_compute_preserved_model": None, "rankset_bus_loss_rtl": None, "rankset_bus_loss_model": None,
           "sim_cycles_per_s": {"fused_tiny": None, "memory_system": _memory_system_rate()}}
    if args.calibrate:
        calibrate_rtl(tuple(x for x in args.calibrate.split(",") if x), args.backend)
    try:
        paper_model = PIMPerfModel.calibrated(PAPER)
    except ValueError:
        paper_model = PIMPerfModel(PAPER)
    head_table(PAPER, LENGTHS, model=paper_model)
    res["paper_model_fixed_cycles"] = paper_model.fixed_cycles
    bandwidth_table(PAPER, paper_model)
    rankset_table(PAPER)
    if not args.no_accuracy:
        res["accuracy_norm_rel"] = accuracy_table(PAPER, LENGTHS)
    errs, same = [], []
    if args.rtl:
        t = tiny_rtl(args.backend)
        res["tiny_rtl"] = t
        if t["model_rel_err"] is not None:
            errs.append(t["model_rel_err"])
            same.append(t["model_traces_equal"])
    if args.paper_rtl:
        p = paper_rtl(args.backend)
        res.update({"paper_rtl_bitexact": p["bitexact"], "paper_rtl_cycles": p["cycles"],
                    "paper_rtl_steady_cycles": p["steady_cycles"],
                    "paper_rtl_build_s": {"verilog": p["gen_s"], "compile": p["compile_s"]},
                    "paper_rtl_runs": p["runs"]})
        if p["model_rel_err"] is not None:
            errs.append(p["model_rel_err"])
            same.append(p["model_traces_equal"])
    if errs:
        res["model_rtl_max_rel_err"] = max(errs)
        res["model_rtl_traces_equal"] = all(same)
    if args.rankset_rtl:
        r, m = rankset_rtl_table(args.backend)
        res.update({"rankset_compute_preserved_rtl": r.preserved, "rankset_compute_preserved_model": m.preserved,
                    "rankset_bus_loss_rtl": r.contention_loss, "rankset_bus_loss_model": m.contention_loss,
                    "rankset_rtl": {"window": r.window, "writes": r.writes, "write_gbps": r.write_gbps,
                                    "rd_ab_with_comm": r.rd_ab_with_comm, "rd_ab_all_compute": r.rd_ab_all_compute,
                                    "rd_ab_alone": r.rd_ab_alone, "bitexact": r.bitexact, "runs": r.runs}})
        res["rankset4_rtl"] = rankset4_rtl_table(args.backend)
    if args.speed:
        sp = fused_tiny_speed(args.backend)
        res["sim_cycles_per_s"]["fused_tiny"] = sp["fast"]["cycles_per_s"]
        res["sim_cycles_per_s"]["fused_tiny_inline"] = sp["inline"]["cycles_per_s"]
        res["fused_tiny_speed"] = sp
    if not (args.rtl or args.paper_rtl or args.rankset_rtl or args.speed):
        print("\n(e)-(j) RTL: run with --all-rtl (make bench-pim) or --rtl / --paper-rtl / --rankset-rtl / --speed")
    res["seconds"] = round(time.time() - t0, 1)
    write_json(res, args.json)
    print(f"\n({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
