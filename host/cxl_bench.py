"""``python -m host.cxl_bench``: the CXL NDP device on the fixed-latency burst memory and on the LPDDR5X device
memory (``system_for(..., memory="lpddr5x", channels=N)``), through the scripted driver, Verilator.

Per system: the cost of its Verilator build (Verilog generation and C++ compile, cold when the build cache is
empty, e.g. ``VERILATOR_BUILD_DIR=$(mktemp -d)``), the cycles of one GEMV (K x N FP16 operand in device memory)
as the marginal cost of a descriptor in a run of ``--gemvs`` back-to-back GEMVs against a run of one (so the
host's preload and the first descriptor's set-up cancel), the operand bandwidth that gives against the channels'
peak and against the core's, and the simulation speed. Every run is checked bit for bit against the golden device
(``Driver.check``: on the LPDDR5X systems also zero timing violations and zero DRAM model reports per channel).
Writes ``build/bench/cxl_devmem.json``.
"""

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

__all__ = ["DEPTH", "gemv_script", "run", "main"]

DEPTH = 2048                    # 64-byte lines: 128 KiB of device memory
def _config(dram_buffer_bytes: int = 2048, lanes: int = 8):
    """The NDP core of the device tests (tests/hdl/cxl/test_cxl_device.py): TINY (8 lanes x 2 PE rows) with
    512-byte input / output buffers and a 2 KiB DRAM ring (the largest operand of one descriptor); another ring
    size or ``lanes`` (x 2 PE rows: 2 x lanes bytes per core cycle) is another design and another build."""
    from hdl.ndp.config import TINY
    name = "cxl-test" if (dram_buffer_bytes, lanes) == (2048, 8) else f"cxl-test-ring{dram_buffer_bytes}-l{lanes}"
    return replace(TINY, name=name, input_buffer_bytes=512, output_buffer_bytes=512, macs=2 * lanes,
                   lanes=lanes, dram_buffer_bytes=dram_buffer_bytes, device_bytes=DEPTH * 64)


def gemv_script(n_gemvs: int, k: int, n: int, memory: str, channels: int, seed: int = 0, ring: int = 2048,
                lanes: int = 8):
    """A driver script: one queue; the K x N operand stored by the host; ``n_gemvs`` GEMVs submitted together
    (one doorbell each); every completion read back. Returns ``(driver, completion handles)``."""
    from hdl.cxl.regmap import RegisterMap, QueueLayout
    from firmware.ndp.descriptor import gemv
    from host.cxl_driver import Driver
    cfg = _config(ring, lanes)
    rng = np.random.default_rng(seed)
    d = Driver(RegisterMap(1), QueueLayout.for_config(cfg), config=cfg, depth=DEPTH, memory=memory,
               channels=channels)
    win = 0x8000
    d.configure(0, sq_base=0, entries=8, cq_base=0x2800, win_base=win, win_limit=DEPTH * 64)
    d.store(win, (rng.standard_normal((k, n)) * k ** -0.5).astype(np.float16).view(np.uint16))
    subs = [d.submit(0, gemv(win, k, n), rng.standard_normal((1, k)).astype(np.float16).view(np.uint16))
            for _ in range(n_gemvs)]
    return d, [d.read_completion(0, s.index, result_bytes=2 * n) for s in subs]


def _build(system):
    """(executable, Verilog seconds, compile seconds or None when found in the build cache, Verilog bytes)."""
    from sim.backends.verilog import verilog_text
    from sim.backends.verilator import build_executable, BUILD_ROOT
    from sim.backends import stream_ports
    t0 = time.perf_counter()
    text = verilog_text(system, "top")
    t1 = time.perf_counter()
    before = set(BUILD_ROOT.glob("*")) if BUILD_ROOT.exists() else set()
    exe = build_executable(text, stream_ports(system))
    t2 = time.perf_counter()
    fresh = (set(BUILD_ROOT.glob("*")) - before) != set()
    return exe, t1 - t0, (t2 - t1) if fresh else None, len(text)


def run(memory: str, channels: int, *, k: int, n: int, gemvs: int, backend: str = "verilator",
        ring: int = 2048, lanes: int = 8) -> dict:
    from host.cxl_driver import backend_named
    cfg = _config(ring, lanes)
    out = {"memory": memory, "channels": channels if memory == "lpddr5x" else None, "k": k, "n": n,
           "operand_bytes": 2 * k * n, "lanes": cfg.lanes, "dram_buffer_bytes": ring}
    d1, _ = gemv_script(1, k, n, memory, channels, ring=ring, lanes=lanes)
    system = d1.system()
    be = backend_named(backend)
    if backend == "verilator":
        exe, out["verilog_s"], out["compile_s"], out["verilog_bytes"] = _build(system)
        be._exes[system] = exe          # the backend's per-object cache: no second Verilog generation
    runs = {}
    for g in (1, gemvs):
        d, hs = gemv_script(g, k, n, memory, channels, ring=ring, lanes=lanes)
        rtl, gold, diffs = d.check(be)
        if diffs:
            raise RuntimeError(f"{memory} x{channels}, {g} GEMVs: RTL differs from the golden device: {diffs[:5]}")
        if not all(rtl.completion(h).ok for h in hs):
            raise RuntimeError(f"{memory}: a GEMV did not complete OK")
        runs[g] = rtl
    per = (runs[gemvs].cycles - runs[1].cycles) / (gemvs - 1)
    out.update({"cycles_1": runs[1].cycles, f"cycles_{gemvs}": runs[gemvs].cycles, "gemv_cycles": per,
                "operand_bytes_per_cycle": 2 * k * n / per,
                "sim_cycles_per_s": runs[gemvs].cycles / runs[gemvs].wall_seconds,
                "timing_violations": len(runs[gemvs].channel_problems or [])})
    if memory == "lpddr5x":
        org = system.dram_config.org
        peak = channels * org.burst_bytes / org.burst_cycles          # bytes per CK of the N channels
        out["channel_peak_bytes_per_cycle"] = peak
        out["fraction_of_channel_peak"] = out["operand_bytes_per_cycle"] / peak
        num, den = system.clock or (1, 1)
        out["core_peak_bytes_per_cycle"] = 2 * cfg.lanes * num / den   # one beat per enabled core cycle
        out["fraction_of_core_peak"] = out["operand_bytes_per_cycle"] / out["core_peak_bytes_per_cycle"]
    else:
        out["core_peak_bytes_per_cycle"] = 2 * cfg.lanes
        out["fraction_of_core_peak"] = out["operand_bytes_per_cycle"] / out["core_peak_bytes_per_cycle"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m host.cxl_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=32, help="GEMV input length K (default 32)")
    p.add_argument("--n", type=int, default=32, help="GEMV output length N (default 32: a 2 KiB operand)")
    p.add_argument("--ring", type=int, default=2048,
                   help="the core's DRAM ring in bytes, the largest operand (default 2048: the tests' core)")
    p.add_argument("--gemvs", type=int, default=5, help="GEMVs of the long run (default 5)")
    p.add_argument("--systems", default="burst,lpddr5x:1,lpddr5x:2",
                   help="comma-separated: burst, lpddr5x:<channels> (default burst,lpddr5x:1,lpddr5x:2)")
    p.add_argument("--lanes", type=int, default=8, help="the core's FP16 lanes (default 8: the tests' core)")
    p.add_argument("--backend", default="verilator", choices=("verilator", "amaranth"))
    p.add_argument("--out", default="build/bench/cxl_devmem.json")
    a = p.parse_args(argv)
    if a.gemvs < 2:
        p.error(f"--gemvs must be >= 2, got {a.gemvs}")
    results = []
    for spec in a.systems.split(","):
        mem, _, ch = spec.partition(":")
        r = run(mem, int(ch or 2), k=a.k, n=a.n, gemvs=a.gemvs, backend=a.backend, ring=a.ring,
                lanes=a.lanes)
        results.append(r)
        print(json.dumps(r), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
