"""Energy of NDP descriptors and kernels (the PLoRA device's core on its LPDDR5X device memory), calibrated like
their cycles: the same counts the performance model (sim/perf/ndp.py) prices, each at a stated, sourced energy.

A descriptor program on :class:`sim.perf.ndp.NDPPerfModel` is charged, in pJ:

* **device memory (DRAM)**: the program's operand lines (and a STORE's lines, written) at their device addresses,
  as the device memory's fast model schedules them (:func:`sim.energy.record.record_ndp_stream` on
  :class:`sim.perf.devmem.DeviceMemoryPerfModel`: one channel's command stream, command for command the RTL's --
  tests/sim/energy/test_devmem_energy.py), priced by :func:`sim.energy.dram.trace_energy` over the program's
  window (the performance model's cycles, in memory clocks), times the channels (every channel does the same);
  every rank of every channel is charged background for the whole window;
* **datapath** (:mod:`sim.energy.ops`, Horowitz ISSCC 2014, 45 nm): every multiply-add of a GEMV / GEMM (operand
  elements x the input rows that use each of them: 1 for a GEMV, ``input_dim0`` for a GEMM, ``input_dim0 /
  group_segments`` for a grouped one -- the PE array's rows, ``NDPPerfModel._shape``) as one FP16 multiply and one
  add in the accumulator's format (``config.acc``: FP32 on every preset); a SOFTMAX's elements (per element a max
  compare and a subtract in FP16, one exponential :data:`sim.energy.pim.EXP_OPS`, one FP32 sum add; per row
  nothing more is charged: docs/ndp_softmax.md's units);
* **SRAM buffers** (:func:`sim.energy.ops.sram_read_pj` at each buffer's size, ``hdl/ndp/config.py``): the DRAM
  ring takes every operand line once and the PE array reads it once per pass of ``pe_batch`` rows; the input ring
  takes the input once and gives it once; the return ring takes and gives every returned element; a KEEP / CHAIN
  result goes through the state buffer (once in, once out). A write is charged as a read of the same array
  (assumption [A-SRAMW]: Horowitz gives reads only).

Not charged: the core's control logic, clock tree and leakage (no sourced figure; the 45 nm per-op figures are
dynamic energies), the CXL link (the host charges it: host/energy.py), the memory controller and PHY.
"""

from dataclasses import dataclass, asdict
from functools import lru_cache

import numpy as np

from firmware.ndp.descriptor import DescType, DescOp

from .dram import trace_energy
from .ops import op_pj, sram_read_pj
from .pim import EXP_OPS

__all__ = ["NDPEnergy", "descriptor_counts", "program_counts", "program_energy", "kernel_energy",
           "device_stream_energy", "lines_of", "bench_figures", "BENCH_SHAPES"]

#: per-element operations of a SOFTMAX (module docstring; docs/ndp_softmax.md: FPMax, FPAdd FP16, FPExp, FPAdd FP32)
SOFTMAX_OPS = {"fp16_add": 2, "fp32_add": 1, **EXP_OPS}


def _desc(e):
    return e[0] if isinstance(e, tuple) else e


def descriptor_counts(d, config, line_bytes: int) -> dict:
    """Work of one descriptor ``d`` on an NDP core of ``config`` whose device memory has ``line_bytes`` lines:
    ``read_lines``, ``write_lines``, ``macs``, ``softmax_elems``, ``sram`` ({buffer attribute: bits}) and
    ``flops`` (2 per multiply-add, 5 per softmax element: max, subtract, exp, sum, and its share of the merge)."""
    if line_bytes < 1:
        raise ValueError(f"line_bytes must be >= 1, got {line_bytes}")
    out = {"read_lines": 0, "write_lines": 0, "macs": 0, "softmax_elems": 0, "flops": 0,
           "sram": {"dram_buffer_bytes": 0, "input_buffer_bytes": 0, "output_buffer_bytes": 0,
                    "state_buffer_bytes": 0}}
    s = out["sram"]
    ret_bits = d.returned_elems(config=config) * 16 if hasattr(d, "returned_elems") else 0
    if d.type == DescType.LOAD:
        out["read_lines"] = -(-d.operand_bytes // line_bytes)
        s["dram_buffer_bytes"] = 2 * d.operand_bytes * 8
    elif d.type == DescType.STORE:
        out["write_lines"] = -(-d.input_bytes // line_bytes)
        s["input_buffer_bytes"] = 2 * d.input_bytes * 8
    elif d.op == DescOp.SOFTMAX:
        n = d.input_dim0 * d.input_dim1
        out["softmax_elems"] = n
        out["flops"] = 5 * n
        s["input_buffer_bytes"] = 2 * d.input_bytes * 8
    else:
        grouped = d.grouped(config)
        rows = d.input_dim0 // config.group_segments if grouped else (1 if d.op == DescOp.GEMV else d.input_dim0)
        elems = d.operand_bytes // 2
        out["read_lines"] = -(-d.operand_bytes // line_bytes)
        out["macs"] = elems * rows
        out["flops"] = 2 * out["macs"]
        passes = -(-rows // config.pe_batch)
        s["dram_buffer_bytes"] = (1 + passes) * d.operand_bytes * 8
        s["input_buffer_bytes"] = 2 * d.input_bytes * 8
        if d.keep or d.chain:
            s["state_buffer_bytes"] = 2 * d.output_elems(config=config) * 16
    s["output_buffer_bytes"] += 2 * ret_bits
    return out


def program_counts(program, config, line_bytes: int) -> dict:
    """:func:`descriptor_counts` summed over ``program`` (Descriptors or (Descriptor, input[, owner]) entries)."""
    tot = {"read_lines": 0, "write_lines": 0, "macs": 0, "softmax_elems": 0, "flops": 0, "sram": {}}
    for e in program:
        c = descriptor_counts(_desc(e), config, line_bytes)
        for k in ("read_lines", "write_lines", "macs", "softmax_elems", "flops"):
            tot[k] += c[k]
        for k, v in c["sram"].items():
            tot["sram"][k] = tot["sram"].get(k, 0) + v
    return tot


def lines_of(program, line_bytes):
    """(line addresses, write flags) of the device-memory requests of ``program`` (entries or descriptors), in
    program order."""
    addrs, writes = [], []
    for e in program:
        d = _desc(e)
        if d.type == DescType.STORE:
            n, w = -(-d.input_bytes // line_bytes), True
        elif d.type == DescType.LOAD or (d.type == DescType.READ_COMPUTE and d.op != DescOp.SOFTMAX):
            n, w = -(-d.operand_bytes // line_bytes), False
        else:
            continue
        base = d.base_addr // line_bytes
        addrs.append(np.arange(base, base + n, dtype=np.int64))
        writes.append(np.full(n, w))
    if not addrs:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    return np.concatenate(addrs), np.concatenate(writes)


@lru_cache(maxsize=None)
def _devmem(channels: int):
    from sim.perf.devmem import DeviceMemoryPerfModel
    return DeviceMemoryPerfModel(channels=channels)


def device_stream_energy(devmem, lines, writes, window_cycles: int):
    """(``DRAMEnergy`` of one channel, memory cycles of the stream) of NDP ``lines`` (``writes``: per line) on
    ``devmem`` (a :class:`sim.perf.devmem.DeviceMemoryPerfModel`) over ``max(stream, window_cycles)`` memory
    clocks; the device spends ``devmem.channels`` times it."""
    from .record import record_ndp_stream
    lines = np.asarray(lines, np.int64) % (1 << devmem.line_addr_bits)
    if lines.size:
        res, cmds = record_ndp_stream(devmem, lines, np.asarray(writes, bool) if np.any(writes) else None)
        stream = int(res.cycles)
    else:
        cmds, stream = [], 0
    end = max(stream, int(window_cycles), 1)
    return trace_energy(cmds, devmem.config, end_cycle=end), stream


@dataclass
class NDPEnergy:
    """One program's energy on one device (pJ) by term, with its window and work."""

    dram_pj: float            # every channel of the device memory: commands and background
    dram_command_pj: float
    dram_background_pj: float
    datapath_pj: float
    sram_pj: float
    cycles: float             # the window, core cycles
    seconds: float
    read_bits: int            # operand bits read from the device memory
    write_bits: int
    flops: int
    macs: int

    @property
    def total_pj(self) -> float:
        return self.dram_pj + self.datapath_pj + self.sram_pj

    @property
    def power_w(self) -> float:
        return self.total_pj * 1e-12 / self.seconds if self.seconds > 0 else 0.0

    def pj_per_bit(self) -> float:
        b = self.read_bits + self.write_bits
        return self.total_pj / b if b else float("nan")

    def pj_per_flop(self) -> float:
        return self.total_pj / self.flops if self.flops else float("nan")

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(total_pj=self.total_pj, power_w=self.power_w, pj_per_bit=self.pj_per_bit(),
                 pj_per_flop=self.pj_per_flop())
        return d


def work_pj(counts, config) -> tuple:
    """(datapath pJ, SRAM pJ) of :func:`program_counts`' ``counts`` on ``config``."""
    acc_add = "fp32_add" if config.acc == "fp32" else "fp16_add"
    dp = counts["macs"] * (op_pj("fp16_mul") + op_pj(acc_add))
    dp += counts["softmax_elems"] * sum(n * op_pj(k) for k, n in SOFTMAX_OPS.items())
    sram = sum(sram_read_pj(bits, getattr(config, buf)) for buf, bits in counts["sram"].items() if bits)
    return dp, sram


def program_energy(model, program, *, cycles: float | None = None, devmem=None) -> NDPEnergy:
    """Energy of ``program`` on ``model`` (an :class:`sim.perf.ndp.NDPPerfModel` whose memory is the device memory,
    :class:`sim.perf.ndp.DeviceMemoryModel`, or any model when ``devmem`` is given) over ``cycles`` core cycles
    (default: the model's :meth:`program_cycles`)."""
    cfg = model.config
    if devmem is None:
        ch = getattr(model.memory, "channels", None)
        if ch is None:
            raise ValueError(f"program_energy needs the device memory: the model's memory is "
                             f"{type(model.memory).__name__}; pass devmem= (a sim.perf.devmem.DeviceMemoryPerfModel) "
                             f"or use a model on sim.perf.ndp.DeviceMemoryModel")
        devmem = _devmem(int(ch))
    line_bytes = devmem.line_bytes
    if cycles is None:
        cycles = model.program_cycles(program)
    if not (np.isfinite(cycles) and cycles >= 0):
        raise ValueError(f"cycles must be a finite number >= 0, got {cycles!r}")
    counts = program_counts(program, cfg, line_bytes)
    lines, writes = lines_of(program, line_bytes)
    ratio = model.memory.ratio
    window_mem = int(np.ceil(cycles / ratio))
    e, stream = device_stream_energy(devmem, lines, writes, window_mem)
    n = devmem.channels
    dp, sram = work_pj(counts, cfg)
    mem_cycles = max(window_mem, stream)
    tck = devmem.config.timing.tck_ps * 1e-12
    return NDPEnergy(dram_pj=n * e.total_pj, dram_command_pj=n * e.command_pj, dram_background_pj=n * e.background_pj,
                     datapath_pj=dp, sram_pj=sram, cycles=float(cycles), seconds=mem_cycles * tck,
                     read_bits=counts["read_lines"] * line_bytes * 8, write_bits=counts["write_lines"] * line_bytes * 8,
                     flops=int(counts["flops"]), macs=int(counts["macs"]))


_KERNELS = {"e2": 2, "e3": 3, "e4": 3, "attention": 3, "attention_grouped": 3}


def kernel_energy(model, name: str, *args) -> NDPEnergy:
    """Energy of the firmware's kernel ``name`` of shape ``args`` (``NDPPerfModel.kernel_program``'s: e3 / e4
    (d, rank, batch); attention / attention_grouped (head_dim, tokens, GQA group)) over its modelled cycles."""
    if name not in _KERNELS:
        raise ValueError(f"unknown kernel {name!r}; allowed: {', '.join(_KERNELS)}")
    if len(args) != _KERNELS[name] or any(isinstance(a, bool) or int(a) != a or a < 1 for a in args):
        raise ValueError(f"kernel {name!r} takes {_KERNELS[name]} positive integers, got {args!r}")
    args = tuple(int(a) for a in args)
    prog = model.kernel_program(name, *args)
    return program_energy(model, prog, cycles=model.kernel_cycles(name, *args))


#: The shapes of :func:`bench_figures` (the PLoRA host's: Llama-2-7B's d_model 4096 and head_dim 128 with 32 KV
#: heads, host/models; LoRA rank 16; a decode batch of 1 (GEMV) and 8 (GEMM); decode attention over 1,024 tokens,
#: the GQA group of 4 of Llama-3-8B, grouped kernel; one PIM head of 1,024 tokens).
BENCH_SHAPES = {"gemv": ("e3", 4096, 16, 1), "gemm": ("e3", 4096, 16, 8),
                "attention": ("attention_grouped", 128, 1024, 4), "pim_head_tokens": 1024}


def bench_figures(ndp_model=None, pim_model=None) -> dict:
    """Flat dict of per-kernel figures: for the NDP kernels of :data:`BENCH_SHAPES` (``ndp_<kernel>_``) and one PIM
    decode-attention head (``pim_head_``): ``pj_per_bit`` (per bit read from DRAM), ``pj_per_flop``, ``total_pj``,
    ``dram_pj``, ``datapath_pj``, ``sram_pj``, ``seconds`` (every value a number; the shapes are
    :data:`BENCH_SHAPES`). Defaults: ``NDPPerfModel.paper()``,
    ``sim.perf.pim.paper_model()``."""
    if ndp_model is None:
        from sim.perf.ndp import NDPPerfModel
        ndp_model = NDPPerfModel.paper()
    if pim_model is None:
        from sim.perf.pim import paper_model
        pim_model = paper_model()
    from .pim import head_energy
    out = {}
    for key, shape in BENCH_SHAPES.items():
        if key == "pim_head_tokens":
            continue
        e = kernel_energy(ndp_model, *shape)
        for k in ("pj_per_bit", "pj_per_flop", "total_pj", "dram_pj", "datapath_pj", "sram_pj", "seconds"):
            v = e.as_dict()[k]
            out[f"ndp_{key}_{k}"] = float(v)
    h = head_energy(pim_model, BENCH_SHAPES["pim_head_tokens"])
    hd = h.as_dict()
    for k in ("pj_per_bit", "pj_per_flop", "total_pj", "dram_pj", "datapath_pj", "sram_pj"):
        out[f"pim_head_{k}"] = float(hd[k])
    out["pim_head_seconds"] = h.seconds
    out["pim_head_tokens"] = BENCH_SHAPES["pim_head_tokens"]
    return out
