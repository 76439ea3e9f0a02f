"""``make bench-dram``: DRAM peak / achieved bandwidth (RTL and fast model), latencies and simulation speed.

Also the RTL measurement helpers used by tests/sim/perf/test_dram_perf.py (components are built once per
configuration and reused, so Verilator converts and compiles each only once).
"""

import time

import numpy as np

from hdl.memctl.timing import DDR4_3200, DDR4_3200_TINY, LPDDR5X_8533, LPDDR5X_8533_TINY, peak_bandwidth_gbps, \
    refresh_efficiency
from sim.backends import get_backend

__all__ = ["rtl_stream", "rtl_all_bank", "pattern_addresses", "main"]

_systems = {}
_players = {}
_backends = {}


def _backend(name):
    return _backends.setdefault(name, get_backend(name))


def memory_system(cfg, policy="fr-fcfs", queue_depth=None):
    """The bench's RTL top: controller (default scheduling window unless ``queue_depth``) + timing-only device."""
    from sim.dram.system import MemorySystem
    from hdl.memctl.controller import DEFAULT_QUEUE_DEPTH
    q = DEFAULT_QUEUE_DEPTH if queue_depth is None else queue_depth
    key = (cfg.name, policy, q)
    if key not in _systems:
        _systems[key] = MemorySystem(controller_config=cfg, policy=policy, queue_depth=q, tag_width=16,
                                     device_kwargs={"storage": False})
    return _systems[key]


def command_player(cfg):
    from sim.dram.player import CommandPlayer
    if cfg.name not in _players:
        _players[cfg.name] = CommandPlayer(cfg, storage=False)
    return _players[cfg.name]


def pattern_addresses(amap, pattern, n, seed=1):
    if pattern == "seq":
        return np.arange(n, dtype=np.int64) % amap.bursts
    if pattern.startswith("stride"):
        return (np.arange(n, dtype=np.int64) * int(pattern[6:])) % amap.bursts
    if pattern == "random":
        return np.random.default_rng(seed).integers(0, amap.bursts, n)
    raise ValueError(pattern)


def rtl_stream(cfg, addrs, backend="verilator", max_cycles=None, policy="fr-fcfs", queue_depth=None):
    """Read requests for ``addrs`` offered back to back to the RTL memory system; returns the StreamRun."""
    sys_ = memory_system(cfg, policy, queue_depth)
    off = {name: f.offset for name, f in sys_.controller.request_layout}
    mask = (1 << 16) - 1
    reqs = [(int(a) << off["addr"]) | ((k & mask) << off["tag"]) for k, a in enumerate(addrs)]
    return _backend(backend).run_streams(sys_, {"i": reqs}, {"o": len(reqs), "trace": None, "errors": None},
                                         max_cycles=max_cycles)


def rtl_all_bank(cfg, rows, bursts=None, *, ranks=(0,), backend="verilator"):
    """Plays the firmware all-bank program on the device; returns (StreamRun, schedule)."""
    from firmware.pim_stream import all_bank_schedule, player_entries
    p = command_player(cfg)
    sched = all_bank_schedule(cfg, rows, bursts, ranks=ranks)
    run = _backend(backend).run_streams(p, {"i": player_entries(p, sched)},
                                        {"marks": 1, "trace": None, "errors": None})
    return run, sched


def _rate(run):
    """Simulated cycles per CPU second of a StreamRun (wall seconds when the backend gives no CPU time)."""
    sec = run.cpu_seconds if run.cpu_seconds else run.wall_seconds
    return run.cycles / sec if sec else float("inf")


def main(argv=None):
    import argparse
    argparse.ArgumentParser(prog="ndpim bench dram", description=__doc__.splitlines()[0]).parse_args(
        list(argv or []))
    import json
    from pathlib import Path
    from sim.perf.dram import DRAMPerfModel
    from hdl.memctl.controller import DEFAULT_QUEUE_DEPTH
    t_start = time.time()
    out = {"queue_depth": DEFAULT_QUEUE_DEPTH, "presets": {}, "window": {}, "speed": {},
           "sim_cycles_per_s": {}}
    print(f"DRAM performance (one channel; fr-fcfs, queue {DEFAULT_QUEUE_DEPTH}; reads; timing-only device)\n")
    print(f"{'preset':18s} {'peak GB/s/ch':>12s} {'system GB/s':>12s} {'refresh eff':>11s}  hit/closed/miss cycles (ns)")
    for cfg in (DDR4_3200, LPDDR5X_8533, DDR4_3200_TINY, LPDDR5X_8533_TINY):
        pk = peak_bandwidth_gbps(cfg)
        m = DRAMPerfModel(cfg)
        lat = " / ".join(f"{m.read_latency(k)} ({m.read_latency_ns(k):.1f})" for k in ("hit", "closed", "miss"))
        print(f"{cfg.name:18s} {pk.channel:12.2f} {pk.system:12.1f} {100 * refresh_efficiency(cfg):10.2f}%  {lat}")
    n = 20_000
    for cfg in (DDR4_3200_TINY, LPDDR5X_8533_TINY):
        m = DRAMPerfModel(cfg)
        pk = peak_bandwidth_gbps(cfg).channel
        print(f"\n{cfg.name}: {n} reads per pattern; achieved GB/s (% of peak {pk:.2f})")
        print(f"  {'pattern':10s} {'RTL cycles':>10s} {'fast cycles':>11s} {'err':>7s} {'RTL GB/s':>9s} "
              f"{'fast GB/s':>9s} {'RTL %pk':>7s} {'Vl cycles/CPU s':>15s} {'fast cyc/s':>10s}")
        pts = out["presets"].setdefault(cfg.name, {})
        for pat in ("seq", "stride2", "stride4", "stride8", "stride32", "stride128", "random"):
            addrs = pattern_addresses(m.amap, pat, n)
            run = rtl_stream(cfg, addrs)
            t = time.process_time()
            fast = m.stream_cycles(addrs)
            tf = time.process_time() - t
            bw_r, bw_f = m.bandwidth_gbps(n, run.cycles), m.bandwidth_gbps(n, fast)
            pts[pat] = {"rtl_cycles": run.cycles, "fast_cycles": fast, "pct_peak": 100 * bw_r / pk,
                        "verilator_cycles_per_s": _rate(run), "fast_cycles_per_s": fast / tf}
            print(f"  {pat:10s} {run.cycles:10d} {fast:11.0f} {100 * (fast - run.cycles) / run.cycles:+6.2f}% "
                  f"{bw_r:9.2f} {bw_f:9.2f} {100 * bw_r / pk:6.1f}% {_rate(run):15.3g} "
                  f"{fast / tf:10.3g}")
        for ranks in ((0,), (0, 1)):
            rows = 128
            run, sched = rtl_all_bank(cfg, rows, ranks=ranks)
            last = sched[-1].cycle
            fast = m.all_bank_cycles(rows, ranks=len(ranks))
            print(f"  all-bank {len(ranks)} rank(s) x {rows} rows: RTL {last} fast {fast} cycles "
                  f"({100 * (fast - last) / last:+.2f}%), bank-internal {m.all_bank_bandwidth_gbps(rows, ranks=len(ranks)):.1f} GB/s "
                  f"({m.all_bank_bandwidth_gbps(rows, ranks=len(ranks)) / pk:.1f}x the DQ peak)")
        # Amaranth: a short run
        addrs = pattern_addresses(m.amap, "seq", 200)
        run = rtl_stream(cfg, addrs, backend="amaranth")
        pts["amaranth_cycles_per_s"] = _rate(run)
        print(f"  Amaranth simulator (stream harness): {run.cycles} cycles in {run.cpu_seconds:.2f} CPU s = "
              f"{_rate(run):.3g} cycles/s")

    # The scheduling window on the full ddr4-3200 preset: uniformly random reads, former vs current default.
    print(f"\nScheduling window, ddr4-3200 (full preset), {n} uniformly random reads, fr-fcfs:")
    m = DRAMPerfModel(DDR4_3200)
    addrs = pattern_addresses(m.amap, "random", n)
    for q in sorted({16, DEFAULT_QUEUE_DEPTH}):
        run = rtl_stream(DDR4_3200, addrs, queue_depth=q)
        fast = DRAMPerfModel(DDR4_3200, queue_depth=q).stream_cycles(addrs)
        eff = n * DDR4_3200.org.burst_cycles / run.cycles
        out["window"][q] = {"rtl_cycles": run.cycles, "fast_cycles": fast, "pct_peak": 100 * eff}
        print(f"  queue {q:3d}: RTL {run.cycles} cycles, fast {fast:.0f} ({100 * (fast - run.cycles) / run.cycles:+.2f}%)"
              f" = {100 * eff:.1f}% of peak")

    # Simulation speed of the memory system, self-driven tops (sim/dram/speed.py).
    from sim.dram.speed import SelfDrivenMemorySystem, ControllerOnly, DeviceOnly, verilator_cycles_per_s, \
        amaranth_cycles_per_s
    from sim.dram.trace import decode_trace
    cfg = LPDDR5X_8533_TINY
    trace = decode_trace(rtl_stream(cfg, pattern_addresses(DRAMPerfModel(cfg).amap, "seq", 50_000)).outputs["trace"],
                         cfg.org)
    span = trace[-1].cycle
    print(f"\nSimulation speed, {cfg.name}, sequential reads, self-driven tops (CPU time; the device model alone "
          f"replays the controller's {len(trace)}-command trace, {span} cycles):")
    # (name, key in sim_cycles_per_s, top, Verilator cycles, Amaranth cycles); the device model as the memory
    # systems build it (no RD_AB data path: a controller never issues all-bank commands), and with that path
    for name, key, mk, vl_n, am_n in (
            ("memory system", "memory_system", lambda: SelfDrivenMemorySystem(cfg), 1_000_000, 400),
            ("controller only", "controller_only", lambda: ControllerOnly(cfg), 1_000_000, 400),
            ("device model only", "device_model_only", lambda: DeviceOnly(cfg, trace, all_bank=False), span, 6_000),
            ("device model, RD_AB", "device_model_all_bank", lambda: DeviceOnly(cfg, trace), span, 6_000)):
        v = verilator_cycles_per_s(mk(), vl_n)
        a = amaranth_cycles_per_s(mk(), am_n)
        out["speed"][name] = {"verilator": v["cycles_per_s"], "amaranth": a["cycles_per_s"]}
        out["sim_cycles_per_s"][key] = v["cycles_per_s"]
        out["sim_cycles_per_s"][key + "_amaranth"] = a["cycles_per_s"]
        print(f"  {name:20s} Verilator {v['cycles_per_s']:10.3g} cycles/s   Amaranth {a['cycles_per_s']:8.3g} cycles/s")
    Path("build/bench").mkdir(parents=True, exist_ok=True)
    Path("build/bench/dram.json").write_text(json.dumps(out, indent=1, default=float))
    print(f"\nbench time {time.time() - t_start:.1f} s; wrote build/bench/dram.json")


if __name__ == "__main__":
    main()
