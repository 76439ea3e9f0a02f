"""``make bench-dram`` (second part): the device memory system of the CXL NDP device.

Prints and writes ``build/bench/devmem.json``:

* the exact-slice argument in RTL: sequential NDP line reads on 1, 2, 4 and 8 LPDDR5X-8533 channels (Verilator,
  hierarchical build, timing-only DRAM models, every channel's trace checked), per-channel efficiency, against
  the fast model and against the bare controller on the same per-channel stream;
* the paper-scale figures (64 channels) from the fast model: sequential and random NDP bandwidth;
* ``--verilog``: the 64-channel memory system's hierarchical Verilog, linted (``sim.backends.verilog.lint``);
* ``--synth``: Yosys cell counts per distinct module x instance count (sim/devmem/synth.py).

``python -m sim.devmem.bench [--lines N] [--channels 1,2,4,8] [--verilog] [--synth]``
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

from hdl.memctl.timing import LPDDR5X_8533, peak_bandwidth_gbps

__all__ = ["rtl_slice", "main"]

ROOT = Path(__file__).resolve().parents[2]


def rtl_slice(channels, lines, *, config=LPDDR5X_8533, **memory_kwargs):
    """Sequential NDP line reads ``0 .. lines - 1`` on a ``channels``-channel slice in RTL (Verilator, hierarchical,
    timing-only DRAM models). Returns ``(run, violations)``: the StreamRun and the number of checker violations
    plus device error reports over all channels."""
    from sim.devmem.system import DeviceMemorySystem
    from sim.devmem.backend import backend
    from sim.devmem.model import Codec
    from sim.dram.trace import decode_trace
    from sim.dram.checker import check_trace
    sys_ = DeviceMemorySystem(config=config, channels=channels, device_kwargs={"storage": False}, hierarchical=True,
                              **memory_kwargs)
    codec = Codec(sys_.memory)
    mask = (1 << sys_.memory.ndp_tag_width) - 1
    reqs = [codec.ndp(k, tag=k & mask) for k in range(lines)]
    run = backend("verilator").run_streams(sys_, {"ndp_req": reqs, "host_req": []},
                                           {"ndp_rsp": lines, **sys_.collect_all()})
    bad = 0
    for c in range(channels):
        cmds = decode_trace(run.outputs[f"trace{c}"], config.org)
        bad += len(check_trace(cmds, config, end_cycle=run.cycles - 1)) + len(run.outputs[f"errors{c}"])
    return run, bad


def rtl_ports(channels, ndp_lines, host_lines, *, config=LPDDR5X_8533):
    """Both ports saturated at once (sequential NDP lines, sequential host lines in another address range) on
    a ``channels``-channel slice; returns (run, violations). Host-only when ``ndp_lines`` is 0."""
    from sim.devmem.system import DeviceMemorySystem
    from sim.devmem.backend import backend
    from sim.devmem.model import Codec
    from sim.dram.trace import decode_trace
    from sim.dram.checker import check_trace
    sys_ = DeviceMemorySystem(config=config, channels=channels, device_kwargs={"storage": False}, hierarchical=True)
    mem = sys_.memory
    codec = Codec(mem)
    base = 1 << (mem.host_addr_bits - 1)  # host lines in the upper half of the address space
    ndp = [codec.ndp(k, tag=k & 0xFF) for k in range(ndp_lines)]
    host = [codec.host(base + k, tag=k & 0xFFFFFF) for k in range(host_lines)]
    run = backend("verilator").run_streams(sys_, {"ndp_req": ndp, "host_req": host},
                                           {"ndp_rsp": ndp_lines, "host_rsp": host_lines, **sys_.collect_all()})
    bad = 0
    for c in range(channels):
        cmds = decode_trace(run.outputs[f"trace{c}"], config.org)
        bad += len(check_trace(cmds, config, end_cycle=run.cycles - 1)) + len(run.outputs[f"errors{c}"])
    return run, bad


def verilog_64(out_dir):
    """Hierarchical Verilog of the 64-channel memory system (top + one channel module), linted."""
    from amaranth.back import verilog
    from hdl.memctl.devmem import DeviceMemory
    from sim.backends.verilog import lint
    t = time.time()
    mem = DeviceMemory(config=LPDDR5X_8533, channels=64, channel_module="devmem_channel")
    path = Path(out_dir) / "devmem_lpddr5x_8533.v"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(verilog.convert(mem, name="devmem_lpddr5x_8533") + "\n" + mem.channel_verilog())
    t_gen = time.time() - t
    t = time.time()
    problems = lint([path])
    return {"file": str(path), "bytes": path.stat().st_size, "generate_s": round(t_gen, 1),
            "lint_s": round(time.time() - t, 1), "lint_problems": problems}


def main(argv=None):
    from sim.perf.devmem import DeviceMemoryPerfModel
    from sim.perf.dram import DRAMPerfModel
    ap = argparse.ArgumentParser(prog="python -m sim.devmem.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--channels", default="1,2,4,8")
    ap.add_argument("--verilog", action="store_true")
    ap.add_argument("--synth", action="store_true")
    args = ap.parse_args(argv)
    cfg = LPDDR5X_8533
    org = cfg.org
    pk = peak_bandwidth_gbps(cfg).channel
    out = {"config": cfg.name, "lines": args.lines}
    t0 = time.time()
    print("Device memory system (LPDDR5X-8533 channels, NDP port, sequential line reads)\n")

    model = DeviceMemoryPerfModel(cfg, channels=1)
    lines = np.arange(args.lines)
    fast = model.ndp_stream_cycles(lines)
    bare = DRAMPerfModel(cfg, queue_depth=model.channel.queue_depth).stream_cycles(model.channel_bursts(lines))
    ideal = 2 * args.lines * model.bursts_per_granule * org.burst_cycles // 2
    print(f"{'channels':>8s} {'RTL cycles':>10s} {'fast':>8s} {'per-ch eff':>10s} {'GB/s':>8s} {'viol':>5s} "
          f"{'Verilator cyc/s':>15s} {'build+run s':>11s}")
    slices = []
    for n in (int(x) for x in args.channels.split(",")):
        t = time.time()
        run, bad = rtl_slice(n, args.lines)
        eff = ideal / run.cycles
        gbps = eff * pk * n
        slices.append({"channels": n, "rtl_cycles": run.cycles, "fast_cycles": fast, "per_channel_eff": eff,
                       "gbps": gbps, "violations": bad, "verilator_cycles_per_s": run.cycles / run.wall_seconds})
        print(f"{n:8d} {run.cycles:10d} {fast:8d} {100 * eff:9.2f}% {gbps:8.1f} {bad:5d} "
              f"{run.cycles / run.wall_seconds:15.3g} {time.time() - t:11.0f}", flush=True)
    same = len({s["rtl_cycles"] for s in slices}) == 1
    out["slices"] = slices
    out["slices_same_per_channel_efficiency"] = same
    out["bare_controller_cycles"] = int(bare)
    out["port_vs_channels_aggregate"] = bare / fast
    print(f"\nsame per-channel efficiency at every slice: {same}; fast model = RTL: "
          f"{all(s['fast_cycles'] == s['rtl_cycles'] for s in slices)}")
    print(f"bare controller on the same per-channel stream: {bare:.0f} cycles -> NDP port delivers "
          f"{100 * bare / fast:.2f} % of the channels' aggregate bandwidth")

    # The host port (RTL, the largest slice): alone, and sharing the channels with a saturating NDP stream.
    nmax = max(int(x) for x in args.channels.split(","))
    tck = cfg.timing.tck_ps * 1e-12
    run, bad = rtl_ports(nmax, 0, 8000)
    host_alone = 8000 * 64 / (run.cycles * tck) / 1e9
    nl = 2000
    run2, bad2 = rtl_ports(nmax, nl, 8000)
    from sim.devmem.model import grants_order
    order = grants_order(run2.outputs["grants"])
    both = min(max(i for i, p in enumerate(order) if p == 1), max(i for i, p in enumerate(order) if p == 0)) + 1
    g_host = sum(order[:both])
    out["host"] = {"channels": nmax, "host_alone_gbps": host_alone, "violations": bad + bad2,
                   "shared_cycles": run2.cycles, "shared_grants": both, "shared_host_grants": g_host}
    print(f"while both ports had requests ({both} grants): host {g_host}, NDP {both - g_host} grants "
          f"(round robin per grant when both can be granted)")
    print(f"\nhost port on {nmax} channels: 8000 sequential 64-byte reads alone {host_alone:.1f} GB/s "
          f"({run.cycles} cycles); with {nl} NDP lines at the same time: both done in {run2.cycles} cycles "
          f"(NDP alone: {nl * 2 * org.burst_cycles} cycles at peak); violations {bad + bad2}")

    m64 = DeviceMemoryPerfModel(cfg, channels=64)
    n = 20_000
    seq = m64.ndp_stream_cycles(np.arange(n))
    rnd = m64.ndp_stream_cycles(np.random.default_rng(1).integers(0, 1 << 27, n))
    out["paper_64"] = {"peak_gbps": m64.peak_gbps(), "seq_gbps": m64.bandwidth_gbps(n, seq),
                       "random_gbps": m64.bandwidth_gbps(n, rnd)}
    print(f"\n64 channels (fast model, exact by the slice argument), {n} lines of 4 KiB: sequential "
          f"{m64.bandwidth_gbps(n, seq):.1f} GB/s, random {m64.bandwidth_gbps(n, rnd):.1f} GB/s "
          f"(peak {m64.peak_gbps():.1f} GB/s)")

    if args.verilog:
        v = verilog_64(ROOT / "build" / "verilog")
        out["verilog_64"] = v
        print(f"\n64-channel Verilog: {v['bytes'] / 1e6:.1f} MB in {v['generate_s']} s, lint "
              f"{'clean' if not v['lint_problems'] else v['lint_problems'][:5]} ({v['lint_s']} s)")
    if args.synth:
        from hdl.memctl.devmem import DeviceMemory
        from sim.devmem.synth import devmem_cells
        t = time.time()
        cells = devmem_cells(DeviceMemory(config=cfg, channels=64, channel_module="devmem_channel"))
        out["synth_64"] = {k: (v if not isinstance(v, dict) else {a: b for a, b in v.items() if a != "by_type"})
                           for k, v in cells.items()}
        print(f"\nsynthesis (Yosys generic gates, per distinct module x instances, {time.time() - t:.0f} s): "
              f"channel {cells['channel']['cells']} cells ({cells['channel']['flops']} flops) x 64 + fabric "
              f"{cells['fabric']['cells']} ({cells['fabric']['flops']} flops) = {cells['total']['cells']} cells, "
              f"{cells['total']['flops']} flops")
    bench = ROOT / "build" / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    (bench / "devmem.json").write_text(json.dumps(out, indent=1, default=float))
    print(f"\nbench time {time.time() - t0:.0f} s; wrote build/bench/devmem.json")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
