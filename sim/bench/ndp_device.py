"""The NDP core's exact slice on the LPDDR5X device memory system, bit-exact against the golden core, with the
NDP performance model's cycles beside the RTL's (issue 11: "an E4 at D = 4096, R = 8, batch 1 and an attention
share of 4K tokens ... on the paper geometry (or its exact slice) over the LPDDR5X memory system").

The design is :class:`sim.ndp.system.NDPDeviceSystem`: ``hdl.ndp.config.slice_preset(channels)`` (the paper's
per-lane datapath with 8 lanes per channel, the same 2 PE rows and bytes per MAC, buffers scaled by
``channels / 64``) on ``channels`` LPDDR5X-8533 channels behind the device memory's arbiter, one FR-FCFS
controller and one DRAM channel model each, under the core's clock enable (15 of 16 CK: 1 GHz against
1066.7 MHz). The DRAM models keep data (``storage``) on an organisation of the LPDDR5X-8533 timing set with
fewer rows (:data:`DATA_ROWS` per bank: only capacity changes; row is the address's top field, so the access
pattern of a kernel is the same as on the full die, see :func:`main`'s ``--timing-only`` run). The program
STOREs the operands (through the core's own STORE descriptors), then runs the kernel; the golden core
(sim/golden/ndp_core.py) runs the same program, and every returned beat and completion is compared bit for bit;
every channel's DRAM command trace is checked against the timing set (sim/dram/checker.py).

The model (``sim.perf.ndp.NDPPerfModel`` on ``DeviceMemoryModel(channels)``) gives core cycles; the RTL counts
CK cycles, so the model's figure is converted with ``CORE_CLOCK_RATIO`` (CK = core x 16 / 15).

``python -m sim.bench.ndp_device [--backend verilator|amaranth] [--kernel e4|attention|e3|e2|gemv|attention_batch|
attention_grouped|all]
[--channels 2] [--timing-only] [--no-split] [--preload]`` (``--timing-only``: the full LPDDR5X-8533 die, no data,
the kernel alone from an idle device; ``--preload``: the operands in the DRAM models' initial contents, the kernel
alone, bit-exact: the shortest run, e.g. ``--channels 1 --kernel e4 --preload``, on Amaranth's simulator 56 s;
``--channels 1 --kernel attention --preload`` ~20 min there)
prints the figures and writes ``build/bench/ndp_device.json``. Verilator: a cold build of the 2-channel system
takes a few minutes of CPU; each run seconds. Amaranth's simulator (the flat design: it cannot run the hierarchical
build's module instances) runs the one-channel slice at ~110-130 cycles per second.
"""

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from hdl.memctl.timing import DRAMConfig, LPDDR5X_8533
from hdl.ndp.config import CORE_CLOCK_RATIO, slice_preset

__all__ = ["DATA_ROWS", "data_config", "slice_config", "kernel_program", "run", "main"]

#: Rows per bank of the data-keeping DRAM models (design choice for simulation: capacity only; 32 rows of
#: 2 ranks x 16 banks x 2 KiB = 2 MiB per channel, enough for the 4K-token attention share's 2 MiB of K^T and V
#: on two channels).
DATA_ROWS = 32
#: the issue's two shapes, an E3 (D = 4096, R = 16, batch 1) and the E2 LOADs of that adapter, and a GEMV over
#: 1 MiB of device-resident data (E4 D = 4096, R = 128, batch 1: the GEMV PEs at two beats per cycle)
CASES = ("e4", "attention", "e3", "e2", "gemv", "attention_batch", "attention_grouped")
#: ``--kernel all``: every case but ``attention_grouped``, which needs four channels' capacity (``make
#: bench-ndp-device`` runs it on its own with ``--channels 4``)
ALL_CASES = CASES[:-1]
#: ``attention_batch`` (issue 29 item 1): a decode batch of 8 (request, KV head) shares at head dim 128 as one
#: descriptor stream (firmware kernels.attention_batch): shares of 16, 64, 256 and 1,024 tokens, each with one
#: query row (GQA 1) and with a group of 4 (GQA 4), and shares of half a beat (``"half"``: ``lanes / 2`` tokens,
#: one half-beat tile where the SFU is at most half a beat wide, kernels.half_beat_shares)
BATCH_SHARES = ((16, 1), (64, 1), (256, 1), (1024, 1), (16, 4), (64, 4), (256, 4), (1024, 4), ("half", 1),
                ("half", 4))
#: ``attention_grouped``: the same 8 shares (16 .. 1,024 tokens, GQA 1 and 4, head dim 128) in the grouped
#: dataflow PAPER's host issues for them (firmware kernels.attention_grouped; docs/ndp_core.md "Grouped
#: attention"): every entry the tokens of ``lanes / W`` KV heads, NARROW tiles of W / 2 tokens (and twice the
#: heads) for the 16- and 64-token shares, W tiles from 256 (on PAPER the host's choice at every one of these
#: shares for Llama-2-7B, sim/bench/ndp.py ``attention_batch``). Run where the slice has the grouped dataflow
#: and the capacity: ``--channels 4`` (32 lanes, W = 8; 5.6 MiB of K and V against the 8 MiB of four
#: data-keeping channels)
GROUPED_SHARES = ((16, 1, True), (64, 1, True), (256, 1, False), (1024, 1, False), (16, 4, True), (64, 4, True),
                  (256, 4, False), (1024, 4, False))


def data_config(rows: int = DATA_ROWS) -> DRAMConfig:
    org = replace(LPDDR5X_8533.org, name=f"lpddr5x-8533-{rows}rows", rows=rows)
    return DRAMConfig(name=org.name, org=org, timing=LPDDR5X_8533.timing)


def slice_config(channels: int, rows: int = DATA_ROWS):
    """The exact slice, its device capacity that of the data-keeping channels."""
    org = data_config(rows).org
    per_channel = org.ranks * org.bank_groups * org.banks_per_group * org.rows * org.columns \
        * org.device_width * org.devices_per_rank // 8
    return replace(slice_preset(channels), device_bytes=channels * per_channel)


def _rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def kernel_program(case: str, cfg, seed: int = 0, shares=None):
    """(stores, kernel) programs of ``case`` (``"e4"``: D = 4096, R = 8, batch 1; ``"attention"``: head dim 128,
    4,096 tokens, one query row; ``"e3"``: D = 4096, R = 16, batch 1; ``"e2"``: the LOADs of that adapter;
    ``"gemv"``: E4 at D = 4096, R = 128, batch 1; ``"attention_batch"``: the shares ``[(tokens, GQA group), ...]``
    (default :data:`BATCH_SHARES`) as one stream) with random FP16 data."""
    from firmware.ndp import kernels as K
    rng = np.random.default_rng(seed)
    if case in ("e4", "e3", "e2", "gemv"):
        d, r = 4096, {"e4": 8, "gemv": 128}.get(case, 16)
        lay = K.lora_layout(d, r, config=cfg)
        a, b = _rand(rng, (d, r), d ** -0.5), _rand(rng, (r, d), r ** -0.5)
        x = _rand(rng, (1, d))
        kern = (K.lora_e4(x, lay, config=cfg) if case in ("e4", "gemv") else K.lora_e3(x, lay, config=cfg) if case == "e3"
                else K.lora_e2_loads(lay, config=cfg))
        return K.lora_store(a, b, lay, config=cfg).program, kern.program
    if case == "attention":
        hd, l, g = 128, 4096, 1
        kv = K.kv_layout(hd, l, config=cfg, rows=g)
        k, v = _rand(rng, (l, hd), 0.5), _rand(rng, (l, hd), 0.5)
        return (K.kv_store(k, v, kv, config=cfg).program,
                K.attention_integral(_rand(rng, (g, hd)), kv, config=cfg).program)
    if case == "attention_batch":
        hd, base, stores, entries = 128, 0, [], []
        for l, g in (shares or BATCH_SHARES):
            if l == "half":
                l = cfg.lanes // 2 if K.half_beat_shares(cfg) else cfg.lanes
            kv = K.kv_layout(hd, l, config=cfg, rows=g, base=base)
            base = kv["end"]
            k, v = _rand(rng, (l, hd), 0.5), _rand(rng, (l, hd), 0.5)
            stores += K.kv_store(k, v, kv, config=cfg).program
            entries.append((_rand(rng, (g, hd)), kv))
        return stores, K.attention_batch(entries, config=cfg).program
    if case == "attention_grouped":
        hd, base, stores, entries = 128, 0, [], []
        for l, g, narrow in (shares or GROUPED_SHARES):
            kv = K.kv_group_layout(hd, l, config=cfg, rows=g, base=base, narrow=narrow)
            base = kv["end"]
            heads = kv["group"]
            k, v = _rand(rng, (heads, l, hd), 0.5), _rand(rng, (heads, l, hd), 0.5)
            stores += K.kv_group_store(k, v, kv, config=cfg).program
            entries.append((_rand(rng, (g, heads, hd)), kv))
        return stores, K.attention_batch(entries, config=cfg).program
    raise ValueError(f"unknown case {case!r}; allowed: {', '.join(CASES)}")


def _system(cfg, channels, dram_config, storage, device_init=None, hierarchical=True):
    """The design; ``hierarchical``: the channels and DRAM models as instances of one generated module each (the
    Verilator build); Amaranth's simulator needs the flat design (it cannot run an instance)."""
    from sim.ndp.system import NDPDeviceSystem
    return NDPDeviceSystem(config=cfg, channels=channels, dram_config=dram_config,
                           device_kwargs=None if storage else {"storage": False}, device_init=device_init,
                           hierarchical=hierarchical)


def device_init(image: bytes, channels: int, dram_config) -> list:
    """The DRAM models' initial contents (``NDPDeviceSystem(device_init=...)``: one ``{flat burst address: int}``
    per channel) holding the device bytes ``image`` from address 0: each burst placed where the device memory's
    interleave (``DeviceMemory.locate``) and the controller's address map put it; all-zero bursts left out."""
    from hdl.memctl.devmem import DeviceMemory
    from sim.dram.device import flat_burst_address
    dm = DeviceMemory(config=dram_config, channels=channels)
    dm._MustUse__silence = True
    org, bb = dram_config.org, dram_config.org.burst_bytes
    inits = [{} for _ in range(channels)]
    for a in range(0, len(image) - len(image) % bb, bb):
        v = int.from_bytes(image[a:a + bb], "little")
        if v:
            c, burst, off = dm.locate(a)
            assert off == 0
            d = dm.amap.decode_py(burst)
            inits[c][flat_burst_address(org, d["rank"], d["bg"], d["bank"], d["row"], d["col"])] = v
    return inits


def _backend(name):
    if name == "verilator":
        from sim.devmem.backend import backend
        return backend("verilator")
    from sim.backends import get_backend
    return get_backend(name)


def _violations(run, channels, config):
    from sim.dram.checker import check_trace
    from sim.dram.trace import decode_trace
    n, org = 0, config.org
    for c in range(channels):
        n += len(check_trace(decode_trace(run.outputs[f"trace{c}"], org), config, end_cycle=run.cycles))
    return n


def run(case: str, *, channels: int = 2, backend: str = "verilator", seed: int = 0, timing_only: bool = False,
        dut=None, split: bool = True, preload: bool = False, shares=None) -> dict:
    """Run ``case`` on the slice; returns the figures (RTL CK cycles of the whole program and of the STOREs
    alone, the kernel's as their difference, the model's, bit-exactness, DRAM timing violations). ``split``:
    also run the STOREs alone for the kernel's own cycles (off: the whole program only, e.g. on Amaranth's
    simulator). ``preload``: the operands are the DRAM models' initial contents (:func:`device_init`, written by
    the golden core's STOREs) and only the kernel runs, from an idle device: the bit-exact check at a kernel's
    own length (the shortest run, e.g. for Amaranth's simulator); ``dut`` must then be None (the design holds the data)."""
    from sim.golden.ndp_core import GoldenCore, beats, x_beats
    from sim.perf.ndp import NDPPerfModel, DeviceMemoryModel
    dram = LPDDR5X_8533 if timing_only else data_config()
    cfg = slice_preset(channels) if timing_only else slice_config(channels)
    stores, kernel = kernel_program(case, cfg, seed, shares)
    image = None
    if preload and not timing_only:
        if dut is not None:
            raise ValueError("preload builds its own design (the data is in it): pass dut=None")
        g0 = GoldenCore(cfg, cfg.device_bytes)
        g0.run(stores)
        used = max(d.base_addr + d.input_bytes for d, _ in stores)
        image = bytes(g0.memory[:used])
    if timing_only or preload:
        stores = []             # the kernel alone, from an idle device (timing only: no data)
    dut = dut if dut is not None else _system(cfg, channels, dram, storage=not timing_only,
                                              device_init=device_init(image, channels, dram) if image else None,
                                              hierarchical=backend == "verilator")
    be = _backend(backend)
    out = {"case": case, "channels": channels, "lanes": cfg.lanes, "backend": backend,
           "dram": dram.name, "descriptors": len(kernel)}

    def sim(program, check):
        reqs = [d.request(0) for d, _ in program]
        n_y = sum(-(-d.returned_elems() // cfg.lanes) for d, _ in program)
        t0 = time.perf_counter()
        r = be.run_streams(dut, {"desc": reqs, "x": x_beats(program, cfg)},
                           {"y": n_y, "cpl": len(program), **dut.collect_all()}, max_cycles=5_000_000)
        wall = time.perf_counter() - t0
        status = [(w >> 16) & 0x1F for w in r.outputs["cpl"]]
        if any(status):
            raise RuntimeError(f"{case}: descriptors failed on the RTL: statuses {status}")
        if check:
            golden = GoldenCore(cfg, cfg.device_bytes)
            if image:
                golden.memory[:len(image)] = image
            cpl = golden.run(program)
            y = [w for c in cpl for w in beats(c.result, cfg.lanes)]
            out["bitexact"] = (r.outputs["y"] == y
                               and [w & 0xFFFF for w in r.outputs["cpl"]] == [c.seq for c in cpl])
            out["returned_beats"] = len(y)
        errs = [e for c in range(channels) for e in r.outputs[f"errors{c}"]]
        out.setdefault("device_errors", 0)
        out["device_errors"] += len(errs)
        out.setdefault("timing_violations", 0)
        out["timing_violations"] += _violations(r, channels, dram)
        return r.cycles, wall

    out["preload"] = bool(image)
    whole, wall_w = sim(stores + kernel, check=not timing_only)
    model = NDPPerfModel(slice_preset(channels), DeviceMemoryModel(channels))
    ck_per_core = CORE_CLOCK_RATIO[1] / CORE_CLOCK_RATIO[0]
    m_whole = model.program_cycles(stores + kernel) * ck_per_core
    # the memory system alone on the kernel's operand lines (the device memory model, exact to its RTL):
    # what the channels deliver on the same reads, to compare the kernel with
    lines = sum(model.shape(d)["lines"] for d, _ in kernel)
    out["memory_alone_ck"] = model.memory.stream(lines) if lines else 0.0
    if not split or not stores:
        out.update({"rtl_cycles_program": whole, "model_cycles_program": m_whole,
                    "model_rel_err_program": (m_whole - whole) / whole, "sim_wall_s": wall_w,
                    "sim_cycles_per_wall_s": whole / max(wall_w, 1e-9)})
        if not stores:
            out.update({"rtl_cycles_kernel": whole, "model_cycles_kernel": m_whole,
                        "model_rel_err_kernel": (m_whole - whole) / whole})
        return out
    base, wall_b = sim(stores, check=False)
    m_base = model.program_cycles(stores) * ck_per_core
    m_kernel = model.program_cycles(kernel) * ck_per_core
    rtl_kernel = whole - base
    out.update({"rtl_cycles_program": whole, "rtl_cycles_stores": base, "rtl_cycles_kernel": rtl_kernel,
                "model_cycles_program": m_whole, "model_cycles_stores": m_base,
                "model_cycles_kernel_alone": m_kernel, "model_cycles_kernel": m_whole - m_base,
                "model_rel_err_program": (m_whole - whole) / whole,
                "model_rel_err_kernel": ((m_whole - m_base) - rtl_kernel) / rtl_kernel,
                # wall time (a Verilator run is a child process); the first run of a process includes the build
                "sim_wall_s": wall_w + wall_b, "sim_cycles_per_wall_s": base / max(wall_b, 1e-9)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.bench.ndp_device", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="verilator", choices=["verilator", "amaranth"])
    ap.add_argument("--kernel", default="all", choices=["all", *CASES],
                    help="all: every case but attention_grouped (run it with --channels 4)")
    ap.add_argument("--channels", type=int, default=2)
    ap.add_argument("--timing-only", action="store_true",
                    help="the full LPDDR5X-8533 die without data (cycles only; no golden comparison)")
    ap.add_argument("--no-split", action="store_true",
                    help="run the whole program only (no STOREs-alone run for the kernel's own cycles)")
    ap.add_argument("--preload", action="store_true",
                    help="operands in the DRAM models' initial contents, the kernel alone (bit-exact check at the "
                         "kernel's length; the shortest run: --channels 1 --kernel e4 --preload takes ~1 min on Amaranth's "
                         "simulator, the 4K-token attention ~20 min)")
    ap.add_argument("--out", default="build/bench/ndp_device.json")
    a = ap.parse_args(argv)
    cases = list(ALL_CASES) if a.kernel == "all" else [a.kernel]
    res = []
    dram = LPDDR5X_8533 if a.timing_only else data_config()
    cfg = slice_preset(a.channels) if a.timing_only else slice_config(a.channels)
    for c in cases:         # a case the slice cannot hold is refused before any build, naming why
        try:
            kernel_program(c, cfg)
        except ValueError as e:
            ap.error(f"--kernel {c} does not fit --channels {a.channels}: {e}")
    # one build for every case (preload: one per case, the data is in the design)
    dut = None if a.preload and not a.timing_only else _system(cfg, a.channels, dram, storage=not a.timing_only,
                                                                hierarchical=a.backend == "verilator")
    for c in cases:
        r = run(c, channels=a.channels, backend=a.backend, timing_only=a.timing_only, dut=dut, split=not a.no_split,
                preload=a.preload)
        res.append(r)
        kern = (f"kernel {r['rtl_cycles_kernel']} CK (model {r['model_cycles_kernel']:.0f}, "
                f"{100 * r['model_rel_err_kernel']:+.2f} %), " if "rtl_cycles_kernel" in r else "")
        print(f"{c:>9} on slice{a.channels} ({r['lanes']} lanes, {r['dram']}), {a.backend}: {kern}"
              f"program {r['rtl_cycles_program']} CK "
              f"(model {100 * r['model_rel_err_program']:+.2f} %), bit-exact {r.get('bitexact', 'n/a')}, "
              f"timing violations {r['timing_violations']}, device errors {r['device_errors']}, "
              + (f"kernel at {100 * r['memory_alone_ck'] / r['rtl_cycles_kernel']:.1f} % of the memory's bandwidth "
                 f"on the same reads alone, " if r.get("memory_alone_ck") and "rtl_cycles_kernel" in r else "") +
              f"{r['sim_cycles_per_wall_s']:.0f} cycles per wall s (the first run includes building)", flush=True)
    p = Path(a.out)
    p.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(p.read_text()) if p.exists() else {}
    for r in res:
        old[f"{r['case']}_slice{r['channels']}_{r['backend']}{'_timing' if a.timing_only else ''}"
            f"{'_preload' if r.get('preload') else ''}"] = r
    p.write_text(json.dumps(old, indent=1) + "\n")
    print(f"wrote {p}")
    return 0 if all(r.get("bitexact", True) and not r["timing_violations"] and not r["device_errors"]
                    for r in res) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
