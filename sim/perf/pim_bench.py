"""``make bench-pim``: DIMM-PIM fused attention (L3) per-head cycles, system bandwidth, ranksets, accuracy.

``python -m sim.perf.pim_bench [--no-accuracy]`` prints

(a) per head and rank (PAPER, d = 128), L = 64 .. 128K: RD_ABs, rows, refresh mode / REFs, model cycles, the
    DRAM-bound ideal, utilization, time per head at 1600 MHz, and the steady-state period with refresh;
(b) the system's aggregate internal PIM bandwidth next to the CPU-side 406 GB/s (L3 Table 2);
(c) the rankset table (section 5.1): PIM compute preserved during host KV writes at 2 and 4 ranks per channel;
(d) the fused kernel's accuracy against float64 attention (sim/golden/pim_attention).

RTL hook (``--rtl``): ``sim.pim.fused.rtl_cycles(config, L_list, backend=...)`` (the integration engineer's RTL
runner: ``{L: {"head_cycles": ...}}``, cycles of one head from its first ACT_AB to its last output element) is
run on its default RTL configuration (TINY with more rows) and printed next to the model, which is then
calibrated on it (:func:`sim.perf.pim.calibrate` fits ``fixed_cycles``). Skipped gracefully when the module or
function does not exist; without ``--rtl`` the RTL column shows "-".
"""

import argparse
import importlib
import time

from hdl.pim.config import PAPER
from sim.perf.pim import PIMPerfModel, calibrate, rankset_sim, steady_residuals, system_bandwidth

__all__ = ["rtl_head_cycles", "main", "LENGTHS"]

LENGTHS = (64, 256, 1024, 4096, 16384, 32768, 65536, 131072)
RTL_LENGTHS = (64, 256, 1024, 2048)
#: --- RTL hook: module and function of the RTL runner (sim/pim/fused.py); skipped gracefully when absent ---
RTL_MODULE, RTL_FUNCTION, RTL_CONFIG = "sim.pim.fused", "rtl_cycles", "tiny_rows"


def rtl_head_cycles(lengths, backend="verilator", steady=None):
    """``(config, {L: RTL head cycles})`` from the RTL runner, or ``(None, {})`` when it does not exist (yet) or
    fails. ``steady``: a dict filled with ``{L: RTL steady-state cycles per head}`` (overlapped heads)."""
    try:
        mod = importlib.import_module(RTL_MODULE)
        fn = getattr(mod, RTL_FUNCTION)
        config = getattr(mod, RTL_CONFIG)()
    except (ImportError, AttributeError) as e:
        print(f"  (RTL runner {RTL_MODULE}.{RTL_FUNCTION} not available: {e!r})")
        return None, {}
    try:
        res = fn(config, tuple(L for L in lengths if L <= config.max_tokens), backend=backend)
    except Exception as e:  # the RTL runner must not stop the bench
        print(f"  (RTL {RTL_MODULE}.{RTL_FUNCTION} failed: {e!r})")
        return None, {}
    if steady is not None:
        steady.update({L: v["steady_cycles"] for L, v in res.items() if "steady_cycles" in v})
    return config, {L: int(v["head_cycles"]) for L, v in res.items()}


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



def rtl_table(backend="verilator"):
    """(e) RTL head cycles next to the model, and the calibrated ``fixed_cycles``."""
    print(f"\n(e) RTL ({RTL_MODULE}.{RTL_FUNCTION}, {backend}) vs model")
    steady = {}
    config, rtl = rtl_head_cycles(RTL_LENGTHS, backend, steady=steady)
    if not rtl:
        return None
    cal, res = calibrate(PIMPerfModel(config), sorted(rtl.items()))
    print(f"  calibrated on {config.name}: fixed_cycles = {cal.fixed_cycles}; residuals (rtl - model) = "
          f"{dict(zip(sorted(rtl), res))}")
    head_table(config, sorted(rtl), model=cal, rtl=rtl)
    if steady:
        pts = sorted(steady.items())
        res = steady_residuals(cal, pts)
        print("  steady state (heads back to back; overlapped when two heads' e_t fit the rank buffer):")
        print(f"  {'L':>6s} {'overlap':>7s} {'RTL/head':>9s} {'model':>7s} {'rtl-model':>9s} {'ideal':>7s} "
              f"{'RTL/ideal':>9s}")
        for (L, c), r in zip(pts, res):
            ideal = cal.ideal_cycles(L, refresh=False)
            print(f"  {L:6d} {str(cal.overlaps(L)):>7s} {c:9.1f} {cal.steady_head_cycles(L):7d} {r:9.1f} "
                  f"{ideal:7.0f} {c / ideal:9.3f}")
    return cal


def bandwidth_table(config):
    s = system_bandwidth(config)
    print(f"\n(b) system (L3 Table 2: 16 channels x 2 DIMMs x {config.ranks} ranks = {s['ranks']} ranks)")
    print(f"  PIM internal peak = ranks x {config.banks} banks x {config.chips} chips x 64 bit / tCCD_L "
          f"({config.dram.timing.tCCD_L} nCK = {config.dram.timing.tCCD_L * config.dram.timing.tck_ps / 1000} ns)"
          f" = {s['pim_peak']:8.1f} GB/s (paper: {s['paper_pim']:.0f} GB/s)")
    print(f"  with refresh (x (1 - tRFC/tREFI))                         = {s['pim_refresh']:8.1f} GB/s")
    print(f"  CPU DQ bus = 16 ch x 3200 MT/s x 8 B (JESD79-4 DDR4-3200)  = {s['bus']:8.1f} GB/s "
          f"(paper: {s['paper_cpu']:.0f} GB/s)")
    print(f"  PIM / CPU = {s['ratio']:.1f}x")
    m = PIMPerfModel(config)
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
    from sim.golden.pim_attention import accuracy_table as acc
    print(f"\n(d) accuracy of the fused kernel (FP16 contract) vs float64 attention of the same FP16 inputs, "
          f"{config.name}")
    print(f"{'dist':>7s} {'L':>7s} {'norm rel':>10s} {'mean rel':>10s}")
    for dist, L, n, mr in acc(config, [L for L in lengths if L <= config.max_tokens]):
        print(f"{dist:>7s} {L:7d} {n:10.2e} {mr:10.2e}")
    print("  norm rel = max|out - ref| / max|ref|; mean rel = mean|out - ref| / mean|ref|")


def page_steady_state(backend="verilator", lengths=(256, 1024, 2048)):
    """(g) Heads back to back on the paper's 1 KB page (128 bursts per row; sim.pim.fused.tiny_page, timing-only
    storage): RTL cycles per head vs the all-bank ideal (RD_ABs x tCCD_L)."""
    from sim.pim.fused import rtl_cycles, tiny_page
    cfg = tiny_page()
    print(f"\n(g) steady state on the paper's 1 KB page ({cfg.name}: {cfg.columns_per_row} bursts per row, "
          f"{backend}): RTL cycles per head, heads back to back")
    print(f"  {'L':>6s} {'one head':>9s} {'per head':>9s} {'ideal':>7s} {'per/ideal':>9s} {'overlap':>7s} {'viol':>5s}")
    for L, v in rtl_cycles(cfg, lengths, backend=backend).items():
        print(f"  {L:6d} {v['head_cycles']:9d} {v['steady_cycles']:9.1f} {v['ideal']:7d} {v['steady_ratio']:9.4f} "
              f"{str(v['overlapped']):>7s} {v['violations'] + v['steady_violations']:5d}")
    print("  ideal = RD_ABs x tCCD_L (64 bits per bank per tCCD_L); the remainder is 48 cycles per row change "
          "(tRTP + tRPab + tRCD - tCCD_L)")


def tiny_bit_exact(backend="verilator"):
    """The whole TINY channel (2 chips x 16 banks, head dim 32: 32 bank PUs) with real DRAM storage: three heads
    (L = 100, 20, 37) bit-exact to the golden kernel, zero timing violations (minutes: Verilog + compile)."""
    import numpy as np
    from sim.golden.pim_attention import make_inputs, pim_attention
    from sim.pim.fused import run_fused, tiny_rows
    print(f"\n(f) TINY channel through the RTL ({backend}, real DRAM storage): bit-exact vs sim/golden/pim_attention")
    cfg = tiny_rows(8)
    _, K, V = make_inputs(cfg, 100, seed=1)
    qs = np.array([make_inputs(cfg, 4, seed=s)[0] for s in (2, 3, 4)])
    Ls = [100, 20, 37]
    run = run_fused(backend, cfg, K, V, qs, L=Ls, heads_order=[0, 0, 0])
    bad = sum(int((run.out[i] != pim_attention(cfg, q, K[:L], V[:L]).out).sum()) for i, (q, L) in
              enumerate(zip(qs, Ls)))
    print(f"  heads L = {Ls}: {bad} mismatching output elements, {len(run.violations)} checker violations, "
          f"device violations {run.done[-1]['violations']}, errors {run.done[-1]['errors']}")
    if bad or run.violations or run.done[-1]["violations"] or run.done[-1]["errors"]:
        raise SystemExit("TINY fused kernel: FAILED")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-accuracy", action="store_true", help="skip the accuracy table (d)")
    ap.add_argument("--rtl", action="store_true", help="run the RTL (sim.pim.fused.rtl_cycles) and calibrate (e)")
    ap.add_argument("--backend", default="verilator", help="RTL backend for --rtl (default verilator)")
    args = ap.parse_args(argv)
    t0 = time.time()
    head_table(PAPER, LENGTHS)
    bandwidth_table(PAPER)
    rankset_table(PAPER)
    if not args.no_accuracy:
        accuracy_table(PAPER, LENGTHS)
    if args.rtl:
        rtl_table(args.backend)
        page_steady_state(args.backend)
        tiny_bit_exact(args.backend)
    else:
        print("\n(e) RTL: run with --rtl to measure sim.pim.fused heads and calibrate fixed_cycles")
    print(f"\n({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
