"""``make bench-ndp``: NDP core cycle counts in RTL simulation (Verilator) on the real controller + DRAM model.

The core (tiny geometry: 8 lanes x 2 PE rows, one 64 B DDR4 burst per 4 cycles = 8 FP16 per cycle, so an
8-lane GEMV row matches the channel's peak rate) runs with larger buffers (``BENCH``) on the DDR4-3200 tiny
channel, timing-only DRAM (``storage=False``: timing does not depend on the data). Printed:

1. GEMV over device-resident data: core cycles vs the cycles the memory controller alone needs for the same
   sequential burst reads (``DRAMPerfModel``, in-order policy, cycle-exact against the controller RTL), i.e.
   the fraction of the controller's delivered bandwidth the core sustains (target >= 95 %).
2. Kernel grid: LoRA E4 (m = xA) and E3 (y = xAB) for D in 256..4096, R in 8..128, batch 1..32, and the
   attention integral (scores, softmax with anchors, context) for head dim 64 and shares of 512..4096 tokens
   (token tiles of scores, softmax, context).
3. Back to back: one E4 descriptor per adapter (32 adapters, rank 16, D = 4096) against the controller alone.

Every RTL row also prints the NDP performance model's cycles (sim/perf/ndp.py on the DDR4 controller's fast
model, calibrated on other shapes of the burst-memory DUT) and its error; section 0 runs the model's validation
kernels on the burst-memory DUT of tests/hdl/ndp/test_core.py.

4. The paper geometry (512 lanes x 2 PE rows at 1 GHz on 64 LPDDR5X-8533 channels, 1.09 TB/s), **model figures**
   (``NDPPerfModel.paper()``, not RTL): GEMV bandwidth as a fraction of the device's peak, GEMM as a fraction of
   the MAC peak, the back-to-back figure, and the efficiency of every LoRA / attention shape of issue 11 item 3.

Writes ``build/bench/ndp.json`` (``--quick``: only section 0 in RTL, then the paper-geometry model figures).
"""

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from hdl.ndp.config import TINY
from hdl.memctl.timing import DDR4_3200_TINY
from firmware.ndp.descriptor import gemv
from firmware.ndp import kernels
from sim.golden.ndp_core import x_beats
from sim.perf.dram import DRAMPerfModel
from sim.perf.ndp import NDPPerfModel, ControllerMemoryModel, validation_programs, rtl_dut, rtl_cycles

__all__ = ["BENCH", "run_program", "gemv_bandwidth", "main"]

#: The tiny core's geometry with buffers (PE accumulator columns: row-mode N <= 128 x 8 = 1024; K <= 4096) large
#: enough for the bench shapes (design choice for the bench; the paper's core has 3 MiB buffers).
BENCH = replace(TINY, name="bench", input_buffer_bytes=64 << 10, dram_buffer_bytes=512 << 10,
                output_buffer_bytes=64 << 10, max_batch=32, acc_columns=128, max_k=4096, state_buffer_bytes=64 << 10,
                partial_buffer_bytes=16 << 10, device_bytes=DDR4_3200_TINY.org.rows
                * DDR4_3200_TINY.org.columns * DDR4_3200_TINY.org.banks * DDR4_3200_TINY.org.ranks
                * DDR4_3200_TINY.org.bus_width // 8)

_system = None
_backend = None


def _verilator():
    global _backend
    if _backend is None:
        from sim.backends import get_backend
        _backend = get_backend("verilator")     # one instance: it caches the compiled harness per component
    return _backend


def _dut():
    global _system
    if _system is None:
        from sim.ndp.system import NDPMemorySystem
        _system = NDPMemorySystem(config=BENCH, dram_config=DDR4_3200_TINY, device_kwargs={"storage": False})
    return _system


def run_program(program, *, config=BENCH):
    """Cycles of ``program`` (list of (Descriptor, input or None)) on the RTL core (owner 0); every completion
    must be OK and no DRAM timing violation may occur."""
    for d, _ in program:
        if d.validate(config).value:
            raise ValueError(f"descriptor {d} is rejected: {d.validate(config)!r}")
    # Result beats: count what the core returns (timing only: the data path is tested in tests/hdl/ndp).
    n_y = sum(-(-d.returned_elems() // config.lanes) for d, _ in program)
    run = _verilator().run_streams(
        _dut(), {"desc": [d.request(0) for d, _ in program], "x": x_beats(program, config)},
        {"y": n_y, "cpl": len(program), "trace": None, "errors": None}, max_cycles=5_000_000)
    status = [(w >> 16) & 0x1F for w in run.outputs["cpl"]]
    if any(status) or run.outputs["errors"]:
        raise RuntimeError(f"bench program failed: statuses {status}, DRAM errors {len(run.outputs['errors'])}")
    return run.cycles


def gemv_bandwidth(k, n):
    """(core cycles, controller-only cycles, bursts) of one GEMV with a K x N operand."""
    x = np.zeros((1, k), np.uint16)
    cycles = run_program([(gemv(0, k, n), x)])
    bursts = k * n * 2 // 64
    ctl = DRAMPerfModel(DDR4_3200_TINY, policy="in-order").sequential(bursts)
    return cycles, ctl, bursts


def back_to_back_program(d=4096, r=16, adapters=32, regions=8):
    """The program of :func:`back_to_back`: one LoRA E4 (batch 1) per adapter, A of adapter i in region i % regions."""
    lays, base = [], 0
    for _ in range(regions):
        lay = kernels.lora_layout(d, r, config=BENCH, base=base)
        lays.append(lay)
        base = lay["end"]
    return [e for i in range(adapters) for e in kernels.lora_e4(_rand((1, d)), lays[i % regions], config=BENCH).program]


def back_to_back(d=4096, r=16, adapters=32, regions=8):
    """Issue 11 item 4's stream of small descriptors: one LoRA E4 (batch 1) per adapter, ``adapters`` of rank
    ``r`` at D = ``d`` back to back (A of adapter i in layout region ``i % regions``: the bench device holds 2 MiB).
    Returns (core cycles, controller-only cycles for the same bursts, one E4 alone, its controller-only cycles)."""
    lays, base = [], 0
    for _ in range(regions):
        lay = kernels.lora_layout(d, r, config=BENCH, base=base)
        lays.append(lay)
        base = lay["end"]
    prog = [e for i in range(adapters) for e in kernels.lora_e4(_rand((1, d)), lays[i % regions], config=BENCH).program]
    model = DRAMPerfModel(DDR4_3200_TINY, policy="in-order")
    bursts = d * r * 2 // 64
    return (run_program(prog), model.sequential(adapters * bursts),
            run_program(kernels.lora_e4(_rand((1, d)), lays[0], config=BENCH).program), model.sequential(bursts))


def _rand(shape):
    return np.zeros(shape, np.uint16)


_MODEL = []


def ddr4_model():
    """The NDP performance model of the bench core on the DDR4-3200 tiny channel (in-order controller)."""
    if not _MODEL:
        _MODEL.append(NDPPerfModel(BENCH, ControllerMemoryModel(DDR4_3200_TINY, 64)))
    return _MODEL[0]


def _err(model, rtl):
    return (model - rtl) / rtl


# ---- paper geometry (model) ----------------------------------------------------------------------------------

#: issue 11 item 3's shapes.
PAPER_D = (768, 2048, 4096, 5120, 8192, 11008, 13824, 14336)
PAPER_R = (8, 16, 32, 64, 128)
PAPER_BATCH = (1, 4, 16, 64, 256)
PAPER_TOKENS = (1024, 4096, 16384, 32768)
PAPER_GQA = (1, 4, 8)
HEAD_DIM = 128
#: Decode attention of a batch on one device (issue 29 item 1): (name, KV heads, query heads, head dim) of the two
#: shapes the issue names (Llama-2-7B: 32 KV heads; Llama-3-8B: 8 KV heads, GQA groups of 4; head dim 128: the
#: models' config.json on their model cards, as host/models), the shares and the batches it reports
ATTN_MODELS = (("llama-2-7b", 32, 32, 128), ("llama-3-8b", 8, 32, 128))
ATTN_SHARES = (16, 64, 256, 1024, 4096)
ATTN_BATCHES = (1, 8, 32, 128)
#: LOAD sizes of ``load_eff`` (issue 29 item 3: 16 KiB .. 64 MiB)
LOAD_BYTES = tuple(16 << (10 + 2 * i) for i in range(7))
#: CXL 3.1 link of a PLoRA device, per direction (PLoRA VII-A: each device attached over CXL 3.1 at 128 GB/s;
#: the same figure as host/link's ``CXL31``, which sim/ may not import)
CXL_LINK_BPS = 128e9


def paper_figures(model=None) -> dict:
    """Model figures at the paper geometry (seconds from ``NDPPerfModel.paper()``): efficiency of a kernel =
    max(device bytes / device peak bandwidth, FLOPs / MAC peak) / model time."""
    from hdl.memctl.timing import LPDDR5X_8533, peak_bandwidth_gbps
    m = model or NDPPerfModel.paper()
    bw = peak_bandwidth_gbps(LPDDR5X_8533).channel * 1e9 * m.memory.channels   # 64 x 17.07 GB/s
    peak = m.config.peak_flops
    core_bw = 2 * m.lanes * m.config.clock_mhz * 1e6                           # one beat per core cycle

    def eff(nbytes, flops, t):
        return max(nbytes / bw, flops / peak) / t

    shapes = []
    for d in PAPER_D:
        for r in PAPER_R:
            shapes.append({"D": d, "R": r, "batch": 1, "kernel": "e2",
                           "efficiency": eff(4 * d * r, 0, m.load_s(4 * d * r))})
            for b in PAPER_BATCH:
                t4, t3 = m.lora_e4_s(d, r, b), m.lora_e3_s(d, d, r, b)
                shapes.append({"D": d, "R": r, "batch": b, "kernel": "e4",
                               "efficiency": eff(2 * d * r, 2 * b * d * r, t4)})
                shapes.append({"D": d, "R": r, "batch": b, "kernel": "e3",
                               "efficiency": eff(4 * d * r, 4 * b * d * r, t3)})
    for tok in PAPER_TOKENS:
        for g in PAPER_GQA:
            t = m.attention_s(tok, HEAD_DIM, g, 1)            # one KV head, its GQA group of g query heads
            shapes.append({"D": HEAD_DIM, "R": g, "batch": 1, "kernel": "attention", "tokens": tok, "gqa": g,
                           "efficiency": eff(4 * tok * HEAD_DIM, 4 * g * tok * HEAD_DIM, t)})
    # GEMV over device-resident data: E4 batch 1 at the largest shape (3.5 MiB of A in K-tiles)
    d, r = 14336, 128
    t = m.lora_e4_s(d, r, 1)
    gemv_bw = 2 * d * r / t
    # what the memory system delivers on the same bytes alone: the device memory model's stream of the operand's
    # lines (first request -> last response, refresh and row switches included), in seconds
    mem = m.memory
    lines = -(-2 * d * r // mem.line_bytes)
    mem_alone_s = mem.stream(lines) * mem.ratio / m.hz
    # GEMM: E4 at batch 256 (and 4) on D = 4096, R = 128
    g256 = 2 * 256 * 4096 * 128 / m.lora_e4_s(4096, 128, 256) / peak
    g4 = 2 * 4 * 4096 * 128 / m.lora_e4_s(4096, 128, 4) / peak
    # batch-4 GEMM at every D of the shape table (issue 29 item 2): each kernel alone from an idle device, and in
    # steady state (the same kernel back to back, as a LoRA wave issues one per adapter: one kernel's first read
    # and last drain overlap its neighbours'); the minimum is taken at R = 128 over every D, E4 and E3
    gemm_b4 = []
    for d in PAPER_D:
        for r in PAPER_R:
            for kind, f in (("e4", 2), ("e3", 4)):
                prog = m.kernel_program(kind, m._d(d, r), r, 4)
                one = m.program_cycles(prog) / m.hz
                steady = (m.program_cycles(prog * 4) - m.program_cycles(prog * 3)) / m.hz
                ideal = max(f * d * r / bw, f * 4 * d * r / peak)
                gemm_b4.append({"kernel": kind, "D": d, "R": r, "batch": 4, "alone": ideal / one,
                                "steady": ideal / steady})
    r128 = [g for g in gemm_b4 if g["R"] == 128]
    # E2 LOADs (issue 29 item 3): the device side alone (of the device's peak bandwidth), and the LOAD as the GPU
    # sees it, the device's return streaming onto the CXL link (of the lesser of the two bandwidths): the link
    # starts with the device's first returned granule (the time of a lone one-granule LOAD), the link's latency
    # is the host's to price
    load_eff = []
    first = m.load_s(kernels.store_granule(m.config))
    lesser = min(bw, CXL_LINK_BPS)
    for nb in LOAD_BYTES:
        tl = m.load_s(nb)
        load_eff.append({"bytes": nb, "device_s": tl, "device_efficiency": nb / bw / tl,
                         "efficiency": nb / lesser / max(tl, first + nb / CXL_LINK_BPS)})
    # decode attention of a batch (issue 29 item 1): every request's share on this device of every KV head as one
    # descriptor stream (NDPPerfModel.attention_batch_s), against the time the device memory takes to deliver the
    # shares' K and V bytes alone (its stream of those lines: refresh, row switches and first latency included);
    # "per_pair" is the same batch priced pair by pair from an idle device (attention_s, before the stream);
    # "per_head" the stream with every (request, KV head) pair its own kernel (kernels.attention_integral: the
    # design before the grouped kernel, NDPPerfModel(grouped_attention=False)); "kernel": what the host issues for
    # the share (per pair, W tiles or NARROW tiles of W / 2, the cheapest); "grouped": whether the host issues
    # the grouped kernel (4 KV heads per entry) for this share
    attention = []
    m_head = NDPPerfModel(m.config, m.memory, m.cal, overlap=m.overlap, grouped_attention=False)
    m_head._kcache = m._kcache          # (the per-head kernels' times are the same computation)
    for name, kvh, qh, hd in ATTN_MODELS:
        for share in ATTN_SHARES:
            for b in ATTN_BATCHES:
                tok = np.full(b, share)
                t_stream = m.attention_batch_s(tok, hd, qh, kvh)
                t_head = m_head.attention_batch_s(tok, hd, qh, kvh)
                t_pairs = float(np.sum(m.attention_s(tok, hd, qh, kvh)))
                units = []          # the kernel the host issues for the share (0 per pair, 1 W tiles, 2 NARROW)
                m._attention_vec(tok[:1], hd, qh, kvh, m._attention_inc, units)
                kv_bytes = b * kvh * share * hd * 2 * 2
                mem_s = m.memory.stream(-(-kv_bytes // m.memory.line_bytes)) * m.memory.ratio / m.hz
                # scores and context: 2 x (q_heads x share x head dim) MACs per request
                mac_s = 2 * 2 * b * qh * share * hd / peak
                attention.append({"model": name, "kv_heads": kvh, "q_heads": qh, "head_dim": hd,
                                  "share_tokens": share, "batch": b, "kv_bytes": kv_bytes, "device_s": t_stream,
                                  "memory_alone_s": mem_s, "mac_peak_s": mac_s, "efficiency": mem_s / t_stream,
                                  "roofline_efficiency": max(mem_s, mac_s) / t_stream,
                                  "efficiency_per_pair": mem_s / t_pairs, "efficiency_per_head": mem_s / t_head,
                                  "grouped": bool(t_stream < t_head),
                                  "kernel": ("per_pair", "grouped_w", "grouped_narrow")[int(units[0][0])]})
    # the same on a core-wide W = 64 (group_lanes = sfu_lanes = 64, no NARROW: 8 KV heads x 64 tokens per tile, the
    # head dim 128 as K = 2 W over two x words and two context slices; docs/ndp_core.md): not PAPER, because GQA
    # groups lose there; PAPER chooses the width per descriptor (NARROW)
    attention_w64 = []
    cfg64 = replace(m.config, name="paper-w64", group_lanes=64, sfu_lanes=64, sfu_fifo=32, group_narrow=False)
    m64 = NDPPerfModel(cfg64, m.memory, m.cal, overlap=m.overlap)
    for name, kvh, qh, hd in ATTN_MODELS:
        for share in ATTN_SHARES:
            for b in (1, 32):
                tok = np.full(b, share)
                kv_bytes = b * kvh * share * hd * 2 * 2
                mem_s = m.memory.stream(-(-kv_bytes // m.memory.line_bytes)) * m.memory.ratio / m.hz
                attention_w64.append({"model": name, "share_tokens": share, "batch": b,
                                      "efficiency": mem_s / m64.attention_batch_s(tok, hd, qh, kvh)})
    # back to back: 32 E4 descriptors (rank 16, D = 4096, batch 1, 128 KiB each) vs the same 4 MiB in the
    # largest descriptors the firmware issues (one E4 at D = 16384, R = 128: 8 K-tiles of 512 KiB)
    small = m.program_cycles([e for _ in range(32) for e in m.kernel_program("e4", 4096, 16, 1)])
    large = m.program_cycles(m.kernel_program("e4", 16384, 128, 1))
    return {"device_peak_bw_Bps": bw, "core_beat_bw_Bps": core_bw, "peak_flops": peak,
            "memory_model": m.memory.source, "calibration": m.cal.__dict__,
            "gemv_device_bw_frac": gemv_bw / bw, "gemv_shape": {"kernel": "e4", "D": d, "R": r, "batch": 1},
            "gemv_delivered_bw_frac": mem_alone_s / t, "gemv_memory_alone_s": mem_alone_s, "gemv_s": t,
            "gemv_core_bw_frac": gemv_bw / core_bw,
            "gemm_peak_frac": g256, "gemm_peak_frac_batch4": g4,
            "gemm_batch4_min_frac": min(g["steady"] for g in r128),
            "gemm_batch4_min_frac_alone": min(g["alone"] for g in r128),
            "gemm_batch4_min_frac_alone_d4096": min(g["alone"] for g in r128 if g["D"] >= 4096),
            "gemm_batch4_min_frac_all_ranks": min(g["steady"] for g in gemm_b4), "gemm_batch4": gemm_b4,
            "load_eff": load_eff, "attention_batch": attention, "attention_batch_w64": attention_w64,
            "gemm_shape": {"kernel": "e4", "D": 4096, "R": 128, "batch": 256},
            "back_to_back_frac": large / small, "back_to_back_cycles": {"32_small": small, "one_large": large},
            "shapes": shapes}


def attention_figure(attention: list, path) -> Path:
    """Attention efficiency against the share's length (``paper_figures()["attention_batch"]``): per model, the
    batch of 32 as one descriptor stream (grouped kernel, software-pipelined, where faster; one kernel per KV head)
    and the same pairs
    priced one by one from an idle device; PNG at
    ``path`` (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, *_ in ATTN_MODELS:
        rows = sorted((a for a in attention if a["model"] == name and a["batch"] == 32),
                      key=lambda a: a["share_tokens"])
        x = [a["share_tokens"] for a in rows]
        line, = ax.plot(x, [100 * a["efficiency"] for a in rows], marker="o",
                        label=f"{name}: batch stream, grouped kernel (W or NARROW tiles, pipelined) where faster")
        ax.plot(x, [100 * a["efficiency_per_head"] for a in rows], marker="s", linestyle=":",
                color=line.get_color(), label=f"{name}: batch stream, one kernel per KV head (before)")
        ax.plot(x, [100 * a["efficiency_per_pair"] for a in rows], marker="x", linestyle="--",
                color=line.get_color(), alpha=0.5, label=f"{name}: each request alone from an idle device")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens of a request's share on the device")
    ax.set_ylabel("% of the memory's time for the K, V bytes")
    ax.set_title("NDP decode attention, paper geometry (model), batch 32")
    ax.set_ylim(0, 105)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="ndpim bench ndp", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="section 0 (model vs RTL on the burst memory) and the paper-geometry model figures only")
    quick = ap.parse_args(list(argv or [])).quick
    t0 = time.time()
    out = {"rtl": {"source": "RTL-measured, Verilator, tiny slice (8 lanes x 2 PE rows): section 0 on the 512-bit "
                             "burst memory (tests/hdl/ndp/test_core.py's DUT), sections 1-3 on the DDR4-3200 tiny "
                             "channel (in-order controller, timing-only DRAM)"}}
    errs = []
    print("0. NDP performance model vs RTL (tiny slice on the burst memory; kernels not used for calibration)")
    cfg, dut, _ = rtl_dut()
    mem_model = NDPPerfModel(cfg, rtl_dut()[2])
    rows = []
    for name, prog in validation_programs(cfg).items():
        c = rtl_cycles(prog, cfg, dut, _verilator())
        mc = mem_model.program_cycles(prog)
        rows.append({"name": name, "descriptors": len(prog), "rtl_cycles": c, "model_cycles": mc,
                     "rel_err": _err(mc, c)})
        errs.append(_err(mc, c))
        print(f"   {name:>18} {len(prog):>3} desc  RTL {c:>6}  model {mc:>8.1f}  {100 * _err(mc, c):+.2f}%")
    out["rtl"]["validation_burst"] = rows
    # the grouped attention (issue 29) on the grouped DUT (tests/hdl/ndp/test_core.py's tiny-group core)
    from sim.perf.ndp import rtl_group_config, grouped_programs
    from sim.ndp.system import NDPBurstSystem
    gcfg, gmem = rtl_group_config()
    gdut = NDPBurstSystem(config=gcfg, burst_bits=gmem.line_bytes * 8, depth=512)
    gmodel = NDPPerfModel(gcfg, gmem)
    grows = []
    piped = grouped_programs(gcfg, pipelined=True)
    for name, prog in grouped_programs(gcfg).items():
        c = rtl_cycles(prog, gcfg, gdut, _verilator())
        mc = gmodel.program_cycles(prog)
        cp = rtl_cycles(piped[name], gcfg, gdut, _verilator())
        mp = gmodel.program_cycles(piped[name])
        grows.append({"name": name, "descriptors": len(prog), "rtl_cycles": c, "model_cycles": mc,
                      "rel_err": _err(mc, c), "rtl_cycles_pipelined": cp, "model_cycles_pipelined": mp,
                      "rel_err_pipelined": _err(mp, cp)})
        errs += [_err(mc, c), _err(mp, cp)]
        print(f"   {name:>18} {len(prog):>3} desc  RTL {c:>6}  model {mc:>8.1f}  {100 * _err(mc, c):+.2f}%  "
              f"pipelined: RTL {cp} ({100 * (cp - c) / c:+.1f}%)  model {mp:>8.1f}  {100 * _err(mp, cp):+.2f}%")
    out["rtl"]["validation_grouped"] = grows
    # the same at a head dim of 2 W (GROUP K = 2 W, two context slices): the structure of PAPER's NARROW tiles at
    # head dim 128 = 2 x 64 (and of the W = 64 variant), not calibrated on; its own figure (model_rtl_max_rel_err_2w)
    from sim.perf.ndp import grouped_programs_2w

    def both_orders(progs, piped, cfg_, dut_, model_, width):
        """RTL and model cycles of each stream in the plain and the pipelined order: (rows, errors)."""
        rows_, errs_ = [], []
        for name, prog in progs.items():
            for order, pr in (("plain", prog), ("pipelined", piped[name])):
                c = rtl_cycles(pr, cfg_, dut_, _verilator())
                mc = model_.program_cycles(pr)
                rows_.append({"name": name, "order": order, "descriptors": len(pr), "rtl_cycles": c,
                              "model_cycles": mc, "rel_err": _err(mc, c)})
                errs_.append(_err(mc, c))
                print(f"   {name:>{width}} {order:>9} {len(pr):>3} desc  RTL {c:>6}  model {mc:>8.1f}  "
                      f"{100 * _err(mc, c):+.2f}%")
        return rows_, errs_
    rows2w, errs2w = both_orders(grouped_programs_2w(gcfg), grouped_programs_2w(gcfg, pipelined=True), gcfg, gdut,
                                 gmodel, 24)
    out["rtl"]["validation_grouped_2w"] = rows2w
    # NARROW tiles (W / 2 per descriptor; PAPER's short shares) on the NARROW DUT (16 lanes, W = 4 / 2), plain and
    # pipelined, not calibrated on: part of model_rtl_max_rel_err (the hosts issue them at PAPER)
    from sim.perf.ndp import rtl_narrow_config, narrow_programs
    ncfg, nmem = rtl_narrow_config()
    ndut = NDPBurstSystem(config=ncfg, burst_bits=nmem.line_bytes * 8, depth=512)
    nrows, nerrs = both_orders(narrow_programs(ncfg), narrow_programs(ncfg, pipelined=True), ncfg, ndut,
                               NDPPerfModel(ncfg, nmem), 38)
    errs += nerrs
    out["rtl"]["validation_narrow"] = nrows
    out["model_rtl_max_rel_err_2w"] = max(abs(e) for e in errs2w)
    # pipelined streams with a GEMV after each SOFTMAX, on the grouped DUT with its FIFO in front of the SFU
    # (config.sfu_fifo) and without it: the GEMV's input waits behind the SOFTMAX's in the input feeder unless the
    # FIFO takes the SOFTMAX's rows (sim.perf.ndp.mixed_programs)
    from dataclasses import replace as _replace
    from sim.perf.ndp import mixed_programs
    mrows = []
    for fifo in (gcfg.sfu_fifo, 0):
        mcfg = _replace(gcfg, sfu_fifo=fifo)
        mdut = gdut if fifo == gcfg.sfu_fifo else NDPBurstSystem(config=mcfg, burst_bits=gmem.line_bytes * 8,
                                                                  depth=512)
        mm = NDPPerfModel(mcfg, gmem)
        for name, prog in mixed_programs(mcfg).items():
            c = rtl_cycles(prog, mcfg, mdut, _verilator())
            mc = mm.program_cycles(prog)
            mrows.append({"name": name, "sfu_fifo": fifo, "descriptors": len(prog), "rtl_cycles": c,
                          "model_cycles": mc, "rel_err": _err(mc, c)})
            errs.append(_err(mc, c))
            print(f"   {name:>26} sfu_fifo {fifo:>2}  RTL {c:>6}  model {mc:>8.1f}  {100 * _err(mc, c):+.2f}%")
    out["rtl"]["validation_mixed"] = mrows
    if not quick:
        m = ddr4_model()
        print("NDP core bench: tiny geometry (8 lanes x 2 PE rows, FP32 accumulation) on DDR4-3200 (tiny channel, "
              "in-order controller), Verilator")
        print("\n1. GEMV over device-resident data vs the memory controller alone (same sequential burst reads)")
        print(f"{'K':>6} {'N':>6} {'bursts':>7} {'core cyc':>9} {'ctl cyc':>9} {'of ctl BW':>9} {'model':>9} {'err':>7}")
        worst = 1.0
        rows = []
        for k, n in ((128, 1024), (256, 1024), (512, 256), (64, 64), (1024, 16)):
            cyc, ctl, b = gemv_bandwidth(k, n)
            mc = m.program_cycles([gemv(0, k, n)])
            errs.append(_err(mc, cyc))
            frac = ctl / cyc
            if n // BENCH.lanes >= 8 and b >= 1024:
                worst = min(worst, frac)
            rows.append({"K": k, "N": n, "bursts": b, "rtl_cycles": cyc, "ctl_cycles": ctl, "frac": frac,
                         "model_cycles": mc, "rel_err": _err(mc, cyc)})
            print(f"{k:>6} {n:>6} {b:>7} {cyc:>9} {ctl:>9.0f} {100 * frac:>8.1f}% {mc:>9.0f} "
                  f"{100 * _err(mc, cyc):>+6.2f}%")
        out["rtl"]["gemv_ddr4"] = rows
        print(f"   operands of >= 1024 bursts with N/lanes >= 8: worst {100 * worst:.1f}% of the controller's "
              f"bandwidth ({'meets' if worst >= 0.95 else 'MISSES'} the 95% target).")

        print("\n2. LoRA kernels (cycles; the adapter weights are device-resident)")
        print(f"{'kernel':>6} {'D':>5} {'R':>4} {'batch':>5} {'cycles':>9} {'model':>9} {'err':>7}")
        rows = []
        for d in (256, 1024, 4096):
            for r in (8, 32, 128):
                lay = kernels.lora_layout(d, r, config=BENCH)
                for b in (1, 4, 32):
                    x = _rand((b, d))
                    for name, fn in (("E4", kernels.lora_e4), ("E3", kernels.lora_e3)):
                        prog = fn(x, lay, config=BENCH).program
                        c, mc = run_program(prog), m.program_cycles(prog)
                        errs.append(_err(mc, c))
                        rows.append({"kernel": name, "D": d, "R": r, "batch": b, "rtl_cycles": c,
                                     "model_cycles": mc, "rel_err": _err(mc, c)})
                        print(f"{name:>6} {d:>5} {r:>4} {b:>5} {c:>9} {mc:>9.0f} {100 * _err(mc, c):>+6.2f}%")
        print("\n3. Attention integral over the device's KV share (head dim 64), per token tile: scores GEMV "
              "(KEEP), SOFTMAX (CHAIN, KEEP, anchors returned), context TRANS GEMV (CHAIN)")
        print(f"{'tokens':>6} {'tiles':>5} {'cycles':>9} {'model':>9} {'err':>7}")
        hd = 64
        for l in (512, 2048, 4096):
            kv = kernels.kv_layout(hd, l, config=BENCH)
            prog = kernels.attention_integral(_rand((1, hd)), kv, config=BENCH).program
            c, mc = run_program(prog), m.program_cycles(prog)
            errs.append(_err(mc, c))
            rows.append({"kernel": "attention", "D": hd, "tokens": l, "rtl_cycles": c, "model_cycles": mc,
                         "rel_err": _err(mc, c)})
            print(f"{l:>6} {len(kv['tiles']):>5} {c:>9} {mc:>9.0f} {100 * _err(mc, c):>+6.2f}%")
        out["rtl"]["kernels_ddr4"] = rows
        print("\n4. Descriptors back to back: 32 LoRA E4 (D = 4096, R = 16, batch 1, 128 KiB of A each), one "
              "descriptor per adapter, vs the controller alone on the same bursts")
        cyc, ctl, one, ctl1 = back_to_back()
        mc = m.program_cycles(back_to_back_program())
        errs.append(_err(mc, cyc))
        out["rtl"]["back_to_back_ddr4"] = {"cycles": cyc, "ctl_cycles": ctl, "frac": ctl / cyc, "one": one,
                                          "one_ctl": ctl1, "model_cycles": mc, "rel_err": _err(mc, cyc)}
        print(f"   32 back to back: {cyc} cycles, controller alone {ctl:.0f}: {100 * ctl / cyc:.1f}% of the "
              f"controller's bandwidth (one alone: {one} vs {ctl1:.0f}, {100 * ctl1 / one:.1f}%); model {mc:.0f} "
              f"({100 * _err(mc, cyc):+.2f}%)")
    out["model_rtl_max_rel_err"] = max(abs(e) for e in errs)
    print(f"\n   model vs RTL: max |error| {100 * out['model_rtl_max_rel_err']:.2f}% over {len(errs)} RTL runs "
          f"(RTL-measured, tiny slice; the NARROW streams among them); at a head dim of 2 W on the 8-lane DUT (the "
          f"structure of PAPER's NARROW tiles, not calibrated on): "
          f"{100 * out['model_rtl_max_rel_err_2w']:.2f}%")

    print("\n5. Paper geometry (512 lanes x 2 PE rows at 1 GHz, 64 LPDDR5X-8533 channels): MODEL figures "
          "(NDPPerfModel.paper(), not RTL)")
    pf = paper_figures()
    out.update({k: pf[k] for k in ("gemv_device_bw_frac", "gemv_delivered_bw_frac", "gemm_peak_frac",
                                   "back_to_back_frac", "gemm_batch4_min_frac", "load_eff", "attention_batch",
                                   "attention_batch_w64", "shapes")})
    out["paper_model"] = {k: v for k, v in pf.items() if k != "shapes"}
    out["figure_sources"] = {
        "model_rtl_max_rel_err": "RTL-measured (tiny slice, Verilator) vs the model on the same shapes",
        "model_rtl_max_rel_err_2w": "RTL-measured (tiny grouped slice, Verilator) vs the model on grouped streams at "
                                    "a head dim of 2 W (the structure of PAPER's NARROW tiles at head dim 128 = 2 x "
                                    "64, on the 8-lane DUT; not calibrated on)",
        "gemv_device_bw_frac": "model, paper geometry (E4 D=14336 R=128 batch 1; of 64 x LPDDR5X-8533 peak)",
        "gemv_delivered_bw_frac": "model, paper geometry (E4 D=14336 R=128 batch 1; of the device memory model's "
                                  "bandwidth on the same bytes read alone)",
        "gemm_peak_frac": "model, paper geometry (E4 D=4096 R=128 batch 256; of 2.048 TFLOPS)",
        "back_to_back_frac": "model, paper geometry (time of 4 MiB in 512 KiB K-tiles (E4 D=16384 R=128) / "
                             "time of 32 E4 of 128 KiB (D=4096 R=16))",
        "shapes": "model, paper geometry; efficiency = max(bytes / device peak BW, FLOPs / MAC peak) / time",
        "gemm_batch4_min_frac": "model, paper geometry: min over every D of the shape table at R = 128, batch 4, "
                                "E4 and E3, in steady state (the kernel back to back); paper_model.gemm_batch4 has "
                                "every (D, R) alone and in steady state",
        "attention_batch": "model, paper geometry: one layer's decode attention of a batch on one device as one "
                           "descriptor stream (grouped entries software-pipelined, as the hosts issue them); "
                           "efficiency = the device memory's time for the shares' K and V bytes "
                           "alone / device time (efficiency_per_pair: the pairs priced one by one from idle); "
                           "roofline_efficiency = max(that memory time, the MACs at the 2.048 TFLOPS peak) / device "
                           "time (a GQA group of 4 needs twice the MAC time of the memory time)",
        "attention_batch_w64": "model, the paper geometry with segments of 64 lanes (group_lanes = sfu_lanes = 64, "
                               "sfu_fifo 32: a tile is 8 KV heads x 64 tokens, head dim 128 = K 2 W over two x words, "
                               "two context slices; not PAPER), batch 1 and 32, efficiency as attention_batch",
        "load_eff": "model, paper geometry: E2 LOADs; efficiency = bytes / min(device peak BW, CXL 3.1 128 GB/s) / "
                    "max(device time, first granule's time + bytes / link BW); device_efficiency = bytes / device "
                    "peak BW / device time"}
    print(f"   GEMV (E4 D=14336 R=128 batch 1): {100 * pf['gemv_delivered_bw_frac']:.1f}% of the bandwidth the "
          f"memory system delivers on the same reads alone ({'meets' if pf['gemv_delivered_bw_frac'] >= 0.95 else 'MISSES'} "
          f"the 95% target); {100 * pf['gemv_device_bw_frac']:.1f}% of the device's peak "
          f"({pf['device_peak_bw_Bps'] / 1e12:.3f} TB/s); {100 * pf['gemv_core_bw_frac']:.1f}% of one beat per core "
          f"cycle ({pf['core_beat_bw_Bps'] / 1e12:.3f} TB/s; the GEMV PEs take two)")
    print(f"   GEMM (E4 D=4096 R=128): batch 256 {100 * pf['gemm_peak_frac']:.1f}%, batch 4 "
          f"{100 * pf['gemm_peak_frac_batch4']:.1f}% of {pf['peak_flops'] / 1e12:.3f} TFLOPS")
    print(f"   GEMM batch 4 at R = 128, every D (E4 and E3): min {100 * pf['gemm_batch4_min_frac']:.1f}% of the MAC "
          f"peak in steady state ({'meets' if pf['gemm_batch4_min_frac'] >= 0.90 else 'MISSES'} the 90% target); "
          f"alone from an idle device: min {100 * pf['gemm_batch4_min_frac_alone_d4096']:.1f}% for D >= 4096, "
          f"{100 * pf['gemm_batch4_min_frac_alone']:.1f}% over every D; every rank, steady: min "
          f"{100 * pf['gemm_batch4_min_frac_all_ranks']:.1f}%")
    print("   E2 LOADs: " + ", ".join(f"{le['bytes'] >> 10} KiB {100 * le['efficiency']:.0f}% "
                                    f"(device {100 * le['device_efficiency']:.0f}%)" for le in pf["load_eff"])
          + " of the lesser of the device and the CXL link (device: of the device's bandwidth)")
    print("   decode attention of a batch on one device, one descriptor stream (per pair from idle): of the memory's "
          "time for the K and V bytes")
    print(f"   {'model':>11} {'share':>6} " + " ".join(f"{'b=' + str(b):>15}" for b in ATTN_BATCHES))
    for name, *_ in ATTN_MODELS:
        for share in ATTN_SHARES:
            row = {a["batch"]: a for a in pf["attention_batch"] if a["model"] == name and a["share_tokens"] == share}
            print(f"   {name:>11} {share:>6} " + " ".join(
                f"{100 * row[b]['efficiency']:>6.1f}% ({100 * row[b]['efficiency_per_pair']:>4.1f}%)"
                for b in ATTN_BATCHES))
    print("   the same with segments of 64 lanes (group_lanes = sfu_lanes = 64; not PAPER), batch 1 / 32: " + "; ".join(
        f"{name} " + ", ".join(f"{share}: " + " / ".join(
            f"{100 * a['efficiency']:.1f}%" for a in pf["attention_batch_w64"]
            if a["model"] == name and a["share_tokens"] == share) for share in ATTN_SHARES)
        for name, *_ in ATTN_MODELS))
    print(f"   back to back: 32 E4 (R=16, D=4096) reach {100 * pf['back_to_back_frac']:.1f}% of the bandwidth of the "
          f"same 4 MiB in 512 KiB descriptors")
    print(f"   memory model: {pf['memory_model']}")
    print(f"   {'kernel':>9} {'D':>6} {'R':>4} " + " ".join(f"{'b=' + str(b):>7}" for b in PAPER_BATCH))
    by = {}
    for sh in pf["shapes"]:
        by.setdefault((sh["kernel"], sh["D"], sh["R"]), {})[sh.get("tokens", sh["batch"])] = sh["efficiency"]
    for (k, d, r), v in by.items():
        if k in ("e3", "e4") and r in (8, 128):
            print(f"   {k:>9} {d:>6} {r:>4} " + " ".join(f"{100 * v[b]:>6.1f}%" for b in PAPER_BATCH))
    print(f"   {'attention':>9} {'hd':>6} {'GQA':>4} " + " ".join(f"{str(t // 1024) + 'K':>7}" for t in PAPER_TOKENS))
    for (k, d, r), v in by.items():
        if k == "attention":
            print(f"   {k:>9} {d:>6} {r:>4} " + " ".join(f"{100 * v[t]:>6.1f}%" for t in PAPER_TOKENS))
    fig = attention_figure(pf["attention_batch"], "build/bench/ndp_attention.png")
    print(f"   attention efficiency against the share's length: {fig}")
    e2 = [sh["efficiency"] for sh in pf["shapes"] if sh["kernel"] == "e2"]
    print(f"   e2 (LOAD for the GPU): {100 * min(e2):.1f}% .. {100 * max(e2):.1f}%")
    path = Path("build/bench/ndp.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\nwrote {path} ({len(out['shapes'])} shapes); bench wall time {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
