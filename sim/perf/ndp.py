"""NDP performance model: cycles of descriptor programs and kernels of the NDP core (hdl/ndp/core.py), at any
geometry, on a pluggable memory model; whole-device seconds for the PLoRA host (host/plora/ndp_model.py).

The model (docs/ndp_perf.md) follows the core's units (docs/ndp_core.md, "Control unit: descriptors overlap")
descriptor by descriptor, in program order:

* **memory engine**: a descriptor's operand lines are read back to back as soon as the DRAM ring has room
  (ring space is freed when a descriptor's last PE pass has consumed it); its lines arrive after the memory
  model's stream time (first request -> last response), and successive descriptors' streams continue at the
  memory's asymptotic line rate;
* **PE array** (hdl/ndp/pe_array.py, docs/ndp_pe_array.md): per pass of at most ``pe_batch`` rows, the A beats
  of the dataflow (GEMV PEs ``TRANS``: ``(K / lanes) N`` beats; GEMM PEs ``ROW``: ``K N / lanes`` beats, with the
  K-split stall for ``N / lanes < 8``; ``PEArray.job``), one beat per cycle (``TRANS_PAIR``, a one-row TRANS
  job of even N on a ``gemv_pairs`` core: two beats per cycle), never ahead of the memory; the
  drain of pass j (``TRANS``: ``rows N`` scalars through the adder tree; ``ROW``: ``rows nb`` beats through the
  phase reduction) overlaps pass j + 1, and pass j + 2 computes only once pass j's drain is done (two
  accumulator banks: COMPUTE runs at most one job ahead of the one DRAIN stage); SOFTMAX takes
  ``SoftmaxUnit.cycles(R, L / sfu_lanes)``;
* **input unit** (in order): the GPU's x, or a CHAIN's copy of the kept result once its producer (the owner's
  last KEEP) has written it, enters the input ring at one beat per cycle;
* **input feeder** (in order, hdl/ndp/core.py's x feeder): hands each job its input, the PE array's and the
  SFU's alike; an SFU job holds it until the SFU has taken the SOFTMAX's last word (the SFU takes a row only
  into one of its two row slots), unless a FIFO in front of the SFU (``NDPConfig.sfu_fifo``) takes them;
* **SFU** (its own unit): SOFTMAX takes ``SoftmaxUnit.cycles(R, L / sfu_lanes)`` from its first word, and its
  outputs wait for the output writer;
* **output writer** (in order): every descriptor's results are written in program order (a PE job's first
  output waits for the writer to be done with the previous job and the previous descriptor; the PE array's one
  DRAIN stage is held meanwhile, a TRANS job's adder tree holding its words); a CHAIN's producer is "written" when
  the writer is done with it;
* **return**: result beats leave on ``y`` at one beat per cycle, then the completion, in order.

A decode batch's attention runs on a device as one descriptor stream (firmware ``kernels.attention_batch``):
:meth:`NDPPerfModel.attention_batch_s` prices it as every (request, KV head) pair at its steady-state cost in the
stream plus the first pair's unhidden latency once, within 3 % of the recurrence over the whole program.

Fixed latencies of the RTL that the shape formulas do not give (decode to the first read, the gap between two
descriptors' compute, result to completion, the CHAIN copy's start, the return unit's hand-over) are the
:class:`Calibration` constants, measured from the RTL by ``python -m sim.perf.ndp --calibrate``
(data/ndp_rtl_calibration.json, with the shapes and cycles measured), never typed in.

Memory models (pluggable, ``stream(lines)`` in memory cycles and ``ratio`` = core cycles per memory cycle):
:class:`BurstMemoryModel` (sim/ndp/memory.py's fixed-latency memory), :class:`ControllerMemoryModel` (the
project's memory controller + DRAM channel through :class:`sim.perf.dram.DRAMPerfModel`),
:class:`DeviceMemoryModel` (the paper's 64-channel LPDDR5X-8533 device memory: one NDP line is one 64-byte
granule of every channel, each channel streams its granules; ``sim.perf.devmem.stream_cycles`` when it is
importable, else one ``DRAMPerfModel`` channel).
"""

import argparse
import hashlib
import json
import sys
import warnings
from dataclasses import dataclass, asdict, fields, replace
from functools import lru_cache
from math import ceil
from pathlib import Path

import numpy as np

from hdl.ndp.config import NDPConfig, PAPER, TINY, CORE_CLOCK_RATIO, PAPER_CHANNELS
from hdl.ndp.pe_array import PEArray, PEMode
from hdl.ndp.softmax import SoftmaxUnit
from hdl.ndp.descriptor import DescType, DescOp

__all__ = ["Calibration", "BurstMemoryModel", "ControllerMemoryModel", "DeviceMemoryModel", "NDPPerfModel",
           "CALIBRATION_PATH", "load_calibration", "calibrate", "TABLE_PATH", "TABLE_SOURCES", "table_fingerprint",
           "load_kernel_table", "write_kernel_table"]

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION_PATH = ROOT / "data" / "ndp_rtl_calibration.json"
#: Precomputed kernel times of the paper's device (:meth:`NDPPerfModel.paper`), written by ``ndpim plora
#: kernel-table`` (host/plora/kernel_table.py: every kernel shape the PLoRA host's sweeps ask for).
TABLE_PATH = ROOT / "data" / "ndp_kernel_table.json"
#: :meth:`NDPPerfModel.paper` reads :data:`TABLE_PATH` (off while the table is being written)
USE_TABLE = True
#: The files whose contents decide a kernel's modelled cycles (this model, the device memory's stream times, the
#: firmware's tiling and descriptors, the core's configuration and cycle formulas, the FP units' pipeline depths).
#: The table holds a hash of them with the model's parameters and the memory controller's queue depth
#: (:func:`table_fingerprint`); a table whose hash differs is not used.
TABLE_SOURCES = ("sim/perf/ndp.py", "sim/perf/devmem.py", "sim/perf/dram.py", "sim/perf/dram_kernel.c",
                 "firmware/ndp/kernels.py", "firmware/ndp/descriptor.py", "hdl/ndp/config.py",
                 "hdl/ndp/pe_array.py", "hdl/ndp/softmax.py", "hdl/ndp/descriptor.py", "hdl/memctl/timing.py",
                 "hdl/memctl/devmem.py", "hdl/memctl/addrmap.py") + tuple(
    # the FP units' pipeline depths enter the PE array's and the softmax unit's cycle formulas
    sorted(str(f.relative_to(ROOT)) for f in (ROOT / "hdl" / "fp").glob("*.py")))
FP16_BYTES = 2


@dataclass(frozen=True)
class Calibration:
    """Fixed latencies of the RTL core (core cycles), measured by :func:`calibrate`.

    * ``start``: cycle 0 (first request offered) -> the first operand read is issued (decode, state check);
    * ``gap``: cycles between the last A beat of one PE job and the first of the next (control hand-over, not
      hidden by the overlap);
    * ``lead``: an operand's first line (or the input) available -> the first A beat of the descriptor;
    * ``chain``: a kept result written -> the CHAIN copy into the input ring starts;
    * ``post_trans`` / ``post_row`` / ``post_load`` / ``post_softmax``: the descriptor's last result written by
      the drain formula -> its first returned beat / its completion (output writer, return unit); negative
      when the return overlaps the drain;
    * ``ret_wait``: the return ring's freed space -> the output writer writes into it again;
    * ``ret_gap``: the return unit's hand-over from one descriptor to the next (its completion cycle, the start
      of the return ring reader): the earliest a descriptor's return can follow the previous completion;
    * ``pair_free``: a TRANS_PAIR job's last word entered the adder tree -> the PE array's one DRAIN stage takes
      the next job (of any descriptor);
    * ``copy``: the input unit's overhead per descriptor (a copy of n beats takes n + ``copy`` cycles);
    * ``cpl``: the output writer done with a descriptor -> its completion (before its returned beats);
    * ``lead_sfu``: a SOFTMAX's input copied -> the SFU's first word (``lead``'s counterpart; may be negative);
    * ``hold``: the SFU's last word taken -> the input feeder free for the next job;
    * ``wpe``: slack of a PE job's first output against the output writer (may be negative);
    * ``xf_pe``: the input feeder free -> a PE job's first A beat (beyond its x beats);
    * ``wjob``: a PE job's (pass's) last result -> the next PE job's first at the output writer, of any
      descriptor (the writer finishes a job, its post-add and conversion included, before it takes the next
      job's results; the adder tree and the DRAIN stage wait meanwhile).

    The post_* constants and ``cpl`` are relative to the writer's events (docs/ndp_perf.md); ``post_*``,
    ``lead_sfu`` and ``wpe`` are fitted in -64..64, the others in 0..64.
    """

    start: float = 0.0
    gap: float = 0.0
    lead: float = 0.0
    chain: float = 0.0
    post_trans: float = 0.0
    post_row: float = 0.0
    post_load: float = 0.0
    post_softmax: float = 0.0
    ret_wait: float = 0.0
    ret_gap: float = 0.0
    pair_free: float = 0.0
    copy: float = 0.0
    cpl: float = 0.0
    lead_sfu: float = 0.0
    hold: float = 0.0
    wpe: float = 0.0
    xf_pe: float = 0.0
    wjob: float = 0.0


def load_calibration(path=CALIBRATION_PATH) -> Calibration:
    """The calibration written by ``python -m sim.perf.ndp --calibrate`` (FileNotFoundError naming the command
    if it was never run)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} missing: run `python -m sim.perf.ndp --calibrate` (measures the RTL)")
    return Calibration(**json.loads(p.read_text())["constants"])


# ---- memory models -------------------------------------------------------------------------------------------

class BurstMemoryModel:
    """sim/ndp/memory.py ``BurstMemory``: one request per cycle, each answered ``latency`` cycles later."""

    def __init__(self, line_bytes: int, latency: int = 8):
        self.line_bytes, self.latency, self.ratio = int(line_bytes), int(latency), 1.0
        self.rate = 1.0
        self.key = ("burst", self.line_bytes, self.latency)

    def stream(self, lines: int) -> float:
        return float(self.latency + lines) if lines else 0.0


class _StreamCache:
    """stream(n) from a per-burst sequential stream model, cached; beyond ``cap`` lines extrapolated at the
    asymptotic rate measured between ``cap / 2`` and ``cap`` lines."""

    cap = 512

    def __init__(self, fn, bursts_per_line):
        self._fn, self._bpl = fn, bursts_per_line
        self._cache = {}
        half = self._exact(self.cap // 2)
        self.rate = (self._exact(self.cap) - half) / (self.cap - self.cap // 2)

    def _exact(self, n):
        if n not in self._cache:
            self._cache[n] = float(self._fn(n * self._bpl))
        return self._cache[n]

    def stream(self, lines):
        if lines <= 0:
            return 0.0
        if lines <= self.cap:
            return self._exact(lines)
        return self._exact(self.cap) + (lines - self.cap) * self.rate


class ControllerMemoryModel:
    """The project's memory controller (in-order, the NDP systems' policy) and one DRAM channel:
    ``DRAMPerfModel.sequential`` (cycle-exact against the controller RTL, docs/dram_perf.md). One NDP line =
    ``line_bytes / burst_bytes`` bursts."""

    def __init__(self, dram_config, line_bytes: int, *, ratio: float = 1.0):
        from sim.perf.dram import DRAMPerfModel
        burst = dram_config.org.burst_bytes
        self.line_bytes, self.ratio = int(line_bytes), float(ratio)
        self.key = ("controller", repr(dram_config), self.line_bytes, self.ratio)
        model = DRAMPerfModel(dram_config, policy="in-order")
        self._s = _StreamCache(model.sequential, max(1, self.line_bytes // burst))
        self.rate = self._s.rate

    def stream(self, lines):
        return self._s.stream(lines)


class DeviceMemoryModel:
    """The paper's device memory (issue 11 item 2): ``channels`` LPDDR5X-8533 channels, device addresses
    interleaved so that one NDP line (64 B per channel: two BL16 bursts of 32 B) is one granule of every
    channel; the channels stream in parallel, so n lines take one channel's stream of 2n bursts. Uses
    ``sim.perf.devmem.stream_cycles`` (the device memory fast model with its front end, on main) when it is
    importable, else ``DRAMPerfModel`` on one channel (in-order controller, no device front end). Memory clock
    = LPDDR5X CK; the core runs 15 of 16 CK (hdl/ndp/config.py CORE_CLOCK_RATIO)."""

    def __init__(self, channels: int = PAPER_CHANNELS):
        from hdl.memctl.timing import LPDDR5X_8533
        if isinstance(channels, bool) or not isinstance(channels, (int, np.integer)) or not 1 <= channels <= 4096:
            raise ValueError(f"channels must be an int in 1..4096, got {channels!r}")
        self.channels = int(channels)
        self.line_bytes = 64 * self.channels          # one 64-byte granule per channel (hdl/ndp/config.PAPER)
        self.ratio = CORE_CLOCK_RATIO[0] / CORE_CLOCK_RATIO[1]
        try:
            from sim.perf.devmem import stream_cycles            # lands on main from the devmem branch
            # every channel receives the same requests at the same cycles, so one channel's schedule is the
            # device's at any channel count (sim/perf/devmem.py's docstring; its slices test): the schedule of
            # the paper's 64-channel model serves any count (the RTL device memory is built for 1..64)
            fn = lambda n: stream_cycles(n, "seq", PAPER_CHANNELS)   # noqa: E731
            per_line = 1
            self.source = "sim.perf.devmem.stream_cycles (device memory fast model)"
        except ImportError:
            from sim.perf.dram import DRAMPerfModel
            fn = DRAMPerfModel(LPDDR5X_8533, policy="in-order").sequential
            per_line = 64 // LPDDR5X_8533.org.burst_bytes
            self.source = "sim.perf.dram.DRAMPerfModel (one LPDDR5X-8533 channel, in-order; devmem absent)"
        self._s = _StreamCache(fn, per_line)
        self.rate = self._s.rate
        self.key = ("device", self.channels, self.source)

    def stream(self, lines):
        return self._s.stream(lines)


# ---- the core model ----

_KERNEL_CACHES = {}     # NDPPerfModel.cache_key -> {kernel key: cycles}
_TABLES_LOADED = {}     # (cache_key, path) -> status------------------------------------------------------------------------------------

def _kind(d):
    if d.type == DescType.LOAD:
        return "load"
    if d.type == DescType.STORE:
        return "store"
    if d.op == DescOp.SOFTMAX:
        return "softmax"
    return "trans" if d.trans else "row"


def _sfu_accept(sfu, rows, nb):
    """Cycles (from the job's cmd) at which the SFU takes each of its ``rows x nb`` input words, every input
    valid and every output ready: the schedule of :meth:`hdl.ndp.softmax.SoftmaxUnit.cycles` (a row goes into
    one of two row slots, word q of row r >= 2 once row r - 2's exp pass has read word q)."""
    D = sfu.anchor_depth
    start, acc_t, words, last_in = [], [], [], 0
    for r in range(rows):
        t = last_in + 1
        for q in range(nb):
            if r >= 2:
                t = max(t, start[r - 2] + q + 1)
            t_q, t = t, t + 1
            words.append(t_q)
        last_in = t_q
        e = last_in + sfu.max_latency + 1
        if r >= 1:
            e = max(e, start[r - 1] + nb)
        if r >= D:
            e = max(e, acc_t[r - D] + 1)
        start.append(e)
        a = e + nb - 1 + sfu.exp_latency + sfu.anchor_latency
        if r >= 1:
            a = max(a, acc_t[r - 1] + 1)
        acc_t.append(a)
    return tuple(words)


class NDPPerfModel:
    """Cycles of NDP descriptor programs on ``config`` with memory ``memory`` (module docstring), and the
    PLoRA host's whole-device interface (seconds): :meth:`load_s`, :meth:`lora_e3_s`, :meth:`lora_e4_s`,
    :meth:`attention_s`, :attr:`descriptor_overhead_s`; :meth:`paper` is the paper's device."""

    kind = "calibrated"

    def __init__(self, config: NDPConfig = TINY, memory=None, calibration: Calibration | None = None, *,
                 overlap: bool = True, grouped_attention: bool = True):
        if not isinstance(config, NDPConfig):
            raise ValueError(f"config must be an NDPConfig, got {type(config).__name__}")
        self.config = config
        self.lanes = config.lanes
        self.memory = memory if memory is not None else BurstMemoryModel(config.align_bytes)
        self.cal = calibration if calibration is not None else load_calibration()
        self.overlap = bool(overlap)
        #: decode attention of ``lanes / group_lanes`` KV heads at once where the head dim is ``group_lanes``
        #: (firmware kernels.attention_grouped); False prices every (request, KV head) pair on its own
        #: (kernels.attention_integral), the design before it (the bench's "before")
        if not isinstance(grouped_attention, bool):
            raise ValueError(f"grouped_attention must be a bool, got {grouped_attention!r}")
        self.grouped_attention = grouped_attention
        #: the PE array's one DRAIN stage is shared by every descriptor's jobs (hdl/ndp/pe_array.py)
        self.drain_stage = True
        #: a mutant's knob: a TRANS job holds the DRAIN stage until its adder tree has emptied (the model before
        #: 2026-12-05); the RTL frees it once the job's last word entered the tree
        self.tree_hold = False
        #: a mutant's knob: False lets a PE job compute before the DRAIN stage has taken the job before it (the model
        #: before 2026-12-05, later); the RTL's two accumulator banks keep COMPUTE at most one job ahead of DRAIN
        self.two_banks = True
        self.pe = PEArray(lanes=config.lanes, batch=config.pe_batch, acc=config.acc, max_k=config.max_k,
                          acc_columns=config.acc_columns)
        sl = config.sfu_lanes
        self.sfu = SoftmaxUnit(lanes=sl, max_len=-(-config.max_k // sl) * sl,
                               max_rows=config.input_buffer_bytes // (2 * config.lanes))
        for u in (self.pe, self.sfu):
            u._MustUse__silence = True          # used for their cycle formulas only, never elaborated
        self.ring_lines = config.dram_buffer_bytes // self.memory.line_bytes
        self.ret_cap = config.output_buffer_bytes // (2 * config.lanes)       # return ring, beats
        self.hz = config.clock_mhz * 1e6
        # a memory model without a ``key`` (its parameters) is keyed by its identity, and its cache not shared
        mem_key = getattr(self.memory, "key", None)
        shared = mem_key is not None
        mem_key = mem_key if shared else (type(self.memory).__name__, id(self.memory))
        self.cache_key = ("ndp-perf", config, mem_key, self.memory.line_bytes, self.cal, self.overlap,
                          self.grouped_attention)
        # kernel cycles are shared by every instance of the same model in a process (the host builds one per run)
        self._kcache = _KERNEL_CACHES.setdefault(self.cache_key, {}) if shared else {}
        self._scache = {}
        self.table_status = "not loaded"

    @classmethod
    def paper(cls, calibration: Calibration | None = None, **kw) -> "NDPPerfModel":
        """The paper geometry (hdl/ndp/config.PAPER: 512 lanes x 2 rows at 1 GHz) on the 64-channel LPDDR5X-8533
        device memory, with the RTL calibration."""
        table = kw.pop("table", TABLE_PATH if USE_TABLE else None)
        m = cls(PAPER, DeviceMemoryModel(PAPER_CHANNELS), calibration, **kw)
        if table is not None:
            load_kernel_table(m, table)
        return m

    # ---- per descriptor -----------------------------------------------------------------------------------
    def shape(self, d) -> dict:
        """Per-descriptor quantities (core cycles / beats / lines); memoized on the fields they depend on (a
        kernel repeats its tiles' shapes). The returned dict is shared: read it, do not change it."""
        k = _kind(d)
        key = (k, d.operand_bytes, d.operand_dim0, d.operand_dim1, d.input_dim0, d.input_dim1, d.input_bytes,
               bool(d.chain), bool(d.keep), d.returned_elems(2, self.config), d.grouped(self.config),
               d.narrowed(self.config))
        got = self._scache.get(key)
        if got is None:
            got = self._scache[key] = self._shape(d, k)
        return got

    def _shape(self, d, k) -> dict:
        L, cfg, pe = self.lanes, self.config, self.pe
        lines = 0 if k in ("softmax", "store") else -(-d.operand_bytes // self.memory.line_bytes)
        out = {"kind": k, "lines": lines, "passes": 0, "pass": [], "x": 0, "x_first": None, "ret": 0,
               "chain": bool(d.chain), "keep": bool(d.keep)}
        if k in ("row", "trans"):
            grouped = d.grouped(cfg)
            # GROUP: R rows of K = n W are R / g PE rows of n packed beats (hdl/ndp/core.py), N = lanes (NARROW:
            # W / 2, 2 g)
            Wd = d.group_width(cfg) if grouped else 0
            B = d.input_dim0 // (L // Wd) if grouped else d.input_dim0
            K, N = d.operand_dim0, d.operand_dim1
            kw = K // Wd if grouped else -(-K // L)       # x words per PE row
            out["x"] = B * kw
            if k == "trans":
                mode = PEMode.TRANS if K % L == 0 else PEMode.TRANS_HALF
            elif grouped:
                mode = PEMode.ROW_GROUP
            else:
                mode = PEMode.ROW if N % L == 0 else PEMode.ROW_HALF
            nb = N // L if mode in (PEMode.ROW, PEMode.ROW_GROUP) else 1
            cols = {PEMode.ROW: nb, PEMode.ROW_GROUP: nb, PEMode.ROW_HALF: 1, PEMode.TRANS: N,
                    PEMode.TRANS_HALF: N}[mode]
            passes = []
            beats_first = 0
            for r0 in range(0, B, cfg.pe_batch):
                rows = min(cfg.pe_batch, B - r0)
                if mode in (PEMode.TRANS, PEMode.TRANS_HALF) and cols > cfg.acc_columns:
                    # column groups of acc_columns (the k-major layout's groups): one job each
                    groups = [min(cfg.acc_columns, cols - c0) for c0 in range(0, cols, cfg.acc_columns)]
                else:
                    groups = [cols]
                for g in groups:
                    # GEMV PEs at two beats per cycle (hdl/ndp/core.py: a one-row TRANS job, even columns)
                    pair = cfg.gemv_pairs and mode == PEMode.TRANS and rows == 1 and g % 2 == 0
                    j = pe.job(PEMode.TRANS_PAIR if pair else mode, rows, K, g)
                    beats, v = j["beats"], j["V"]          # A transfers (TRANS_PAIR: two beats each)
                    comp = beats + max(0, pe.min_nb - v) * ((beats - 1) // v) if v < pe.min_nb else beats
                    # drain: the job's results out of the PE array; occ: the cycles its single DRAIN stage is
                    # taken (the next job, of any descriptor, enters DRAIN after them): TRANS frees it once its
                    # last word entered the adder tree, TRANS_PAIR ``pair_free`` cycles later (calibrated: its
                    # two-column words leave the tree's root through the serializer), ROW once its words left
                    # lat: the last A beat -> the DRAIN stage may start (the accumulation's latency); fo: the
                    # DRAIN stage's start -> its first output (to the output writer)
                    if mode in (PEMode.TRANS, PEMode.TRANS_HALF):
                        # one scalar per cycle into the adder tree (TRANS_PAIR: rows 1); the results leave the
                        # tree's root tree_latency later, but the stage is free once the last word entered the tree
                        # (hdl/ndp/pe_array.py: d_busy drops on ~d_pending & ~t_valid; the tree's mode FIFO lets
                        # the next job drain behind it): TRANS_PAIR + the calibrated pair_free
                        drain = rows * g + pe.tree_latency
                        # (TRANS_HALF: a word gives two results; the tree takes rows x g / 2 words)
                        occ = drain if self.tree_hold else rows * g // (2 if mode == PEMode.TRANS_HALF else 1)
                        lat, fo = pe.loop_latency + 1, pe.tree_latency    # (DRAIN reads once the write-backs are done)
                    elif j["S"] == 1 and mode in (PEMode.ROW, PEMode.ROW_GROUP):
                        drain = occ = rows * j["words"]              # PEArray.cycles, nb >= 8
                        lat, fo = pe.drain_latency, 1
                    else:
                        # the K-split phases reduced one output beat at a time (PEArray.reduce_cycles)
                        red = pe.reduce_cycles(j["S"], mode == PEMode.ROW_HALF)
                        drain = rows * j["words"] * red
                        # the stage is free 2 cycles after the last beat's offer (its last phase-0 visit drops
                        # d_busy, then DRAIN takes the next job: hdl/ndp/pe_array.py)
                        occ = drain + 2
                        lat, fo = pe.loop_latency + 1, red
                    a_beats = j["beats"] * (2 if pair else 1)
                    per = 2 if mode == PEMode.TRANS_HALF else 1          # results per word into the tree
                    passes.append([comp, drain, a_beats if r0 == 0 else None, occ, pair, lat, fo, per])
                    beats_first += a_beats if r0 == 0 else 0
            # the first row pass sweeps the operand once, column group after column group (the k-major layout
            # stores the groups one after the other): job j needs the lines up to its share of the operand
            acc = 0
            for ps in passes:
                if ps[2] is not None:
                    acc += ps[2]
                    ps[2] = acc / beats_first
            passes = [tuple(ps) for ps in passes]
            out["x_first"] = min(B, cfg.pe_batch) * kw             # the first job's x (the rest load meanwhile)
            out["passes"] = len(passes)
            out["pass"] = passes
        elif k == "softmax":
            R, Lt = d.input_dim0, d.input_dim1
            out["x"] = R * Lt // L if d.grouped(cfg) else R * -(-Lt // L)       # (GROUP: packed rows)
            nb = -(-Lt // cfg.sfu_lanes)
            out["pass"] = [(self.sfu.cycles(R, nb), 0, None, 0, False)]
            out["passes"] = 1
            # the SFU's word acceptance (cycle of each of its R nb input words, from its first) and its first
            # output's latency, from its cycle formula's schedule (SoftmaxUnit.cycles)
            out["sfu_acc"] = _sfu_accept(self.sfu, R, nb)
            out["sfu_fo"] = _sfu_accept(self.sfu, 1, nb)[-1] + self.sfu.max_latency + 1 + self.sfu.exp_latency
        elif k == "load":
            beats = -(-d.operand_bytes // (2 * L))
            out["pass"] = [(beats, 0, 1.0, 0, False)]
            out["passes"] = 1
        else:                                              # store: x beats -> line writes
            out["x"] = -(-d.input_bytes // (2 * L))
            out["pass"] = [(out["x"], 0, None, 0, False)]
            out["passes"] = 1
        out["ret"] = -(-d.returned_elems(2, cfg) // L)
        return out

    def program_cycles(self, program) -> float:
        """Core cycles from the first request to the last completion of ``program`` (Descriptors, or
        (Descriptor, input[, owner]) entries; every descriptor assumed OK)."""
        descs = [e[0] if isinstance(e, tuple) else e for e in program]
        owners = [e[2] if isinstance(e, tuple) and len(e) == 3 else 0 for e in program]
        return self._run([self.shape(d) for d in descs], owners)

    def _run(self, shapes, owners=None, trace=None) -> float:
        """The units' recurrence over the program (module docstring); ``trace`` (a list): each descriptor's
        (written, completion) cycles are appended."""
        c, mem = self.cal, self.memory
        r = mem.ratio
        fifo = self.config.sfu_fifo
        t_issue_free = c.start                  # memory engine free to issue
        arrive_prev = 0.0
        comp_prev = -1e18                       # last A beat of the previous PE job
        pe_free = 0.0                           # the PE array's DRAIN stage free (one stage for every descriptor)
        c_free = 0.0                            # the PE array's COMPUTE stage free (the last job taken by DRAIN)
        last_out = -1e18                        # the last PE job's last result to the output writer
        done_prev = 0.0                         # previous completion
        in_free = 0.0                           # input unit free (in order)
        xf_free = 0.0                           # input feeder free (in order)
        sfu_free = 0.0                          # SFU free
        w_free = 0.0                            # output writer done with the previous descriptor
        cum = 0
        cum_ends, comp_ends = [], []
        kept_at = {}                            # owner -> its last KEEP written (a CHAIN's producer)
        for i, s in enumerate(shapes):
            owner = owners[i] if owners is not None else 0
            lines = s["lines"]
            kind = s["kind"]
            # ---- memory: ring space, then the stream
            if not self.overlap:
                t_issue_free = max(t_issue_free, done_prev + (c.start if i else 0.0))
            start = t_issue_free
            if lines:
                need_first = cum + 1 - self.ring_lines       # lines freed before the first line may issue
                need_last = cum + lines - self.ring_lines
                free_first = free_last = 0.0
                for j in range(len(cum_ends)):
                    if need_first > 0 and cum_ends[j] >= need_first and not free_first:
                        free_first = comp_ends[j] + 1
                    if need_last > 0 and cum_ends[j] >= need_last:
                        free_last = comp_ends[j] + 1
                        break
                start = max(start, free_first)
                arrive_first = start + mem.stream(1) * r
                arrive_end = max(start + mem.stream(lines) * r, arrive_prev + lines * mem.rate * r,
                                 free_last + mem.stream(1) * r)
                t_issue_free = max(start + lines * mem.rate * r, free_last + 1)
                arrive_prev = arrive_end
            else:
                arrive_first = arrive_end = start
            cum += lines
            # ---- input unit (in order): the GPU's x, or a CHAIN's copy once its producer is written
            x_first = s["x"] if s["x_first"] is None else s["x_first"]
            if kind == "load":
                x_ready = c.start
            else:
                src = kept_at.get(owner, w_free) + c.chain if s["chain"] else c.start
                cs = max(src, in_free)
                x_ready = cs + x_first + c.copy
                in_free = cs + s["x"] + c.copy
            if kind == "softmax":
                # ---- the SFU: the feeder hands it the words (after its cmd), its outputs wait for the writer
                comp = s["pass"][0][0]
                acc = s["sfu_acc"]
                t_in = max(xf_free, x_ready + c.lead_sfu, sfu_free)
                ts = max(t_in, w_free + 1 - s["sfu_fo"])
                end = ts + comp
                n = len(acc)
                # the feeder is free once the SFU (or the FIFO in front of it) has taken the last word
                xf_free = max(t_in + n, ts + acc[n - 1 - fifo] + 1 if n > fifo else 0.0) + c.hold
                sfu_free = end
                written = max(end, w_free + 1) + c.post_softmax
                comp_ends.append(comp_prev)
            else:
                # ---- PE passes (jobs) / LOAD / STORE
                pe_kind = kind in ("row", "trans")
                t = max(comp_prev + c.gap, arrive_first + c.lead, x_ready + c.lead,
                        xf_free + x_first + (c.xf_pe if pe_kind else 0.0))
                t0 = t
                drain_end = 0.0
                for n, ps in enumerate(s["pass"]):
                    comp, drain, frac, occ, pair = ps[:5]
                    if n:
                        t = max(t, c_free) + c.gap
                    if frac is not None and lines:
                        # the first sweep over the operand consumes the lines as they arrive (at most one beat per
                        # cycle): this job's share of them has arrived
                        end = max(t + comp, arrive_first + frac * (arrive_end - arrive_first) + 1)
                    else:
                        end = t + comp
                    if kind == "load":
                        # LOAD data goes straight to the return ring: its last beat needs the ring to have room,
                        # i.e. the previous results returned down to ret_cap - ret beats
                        end = max(end, done_prev + c.ret_wait - self.ret_cap + 2 * s["ret"])
                    if pe_kind and self.drain_stage:
                        lat, fo = ps[5], ps[6]
                        # two accumulator banks: the DRAIN stage takes this job once it is free, and only then
                        # may the next job compute (hdl/ndp/pe_array.py take_c / take_l). The DRAIN stage reads
                        # after the accumulation's write-backs (lat) and once free; the output writer finishes the
                        # previous job (its post-add and conversion) before it takes this one's results (wjob),
                        # and the previous descriptor before its first (wpe)
                        c_free = max(end, pe_free) if self.two_banks else end
                        if kind == "trans":
                            # TRANS: DRAIN reads a word per cycle into the adder tree, whose stages hold the
                            # words while the writer is busy; the results leave it one per cycle
                            d0 = max(end + lat, pe_free)
                            out0 = max(d0 + fo, last_out + c.wjob, w_free + c.wpe)
                            drain_end = last_out = out0 + drain - fo
                            # (the tree's stages hold up to fo words: TRANS_HALF's two results per word leave
                            # the last word 2 fo results behind the end)
                            pe_free = max(d0 + occ, drain_end - ps[7] * fo) + (c.pair_free if pair else 0.0)
                        else:
                            d0 = max(end + lat, last_out - fo + c.wjob, pe_free, w_free - fo + c.wpe)
                            pe_free = d0 + occ
                            drain_end = last_out = d0 + drain
                    elif pe_kind:
                        drain_end = max(end + ps[5], drain_end) + drain
                    else:
                        drain_end = max(end, drain_end) + drain
                    t = end
                if pe_kind or kind == "store":
                    xf_free = max(xf_free, t0 - c.lead)
                comp_prev = max(t, c_free) if pe_kind and self.drain_stage else t
                comp_ends.append(t)
                if kind != "load" and s["ret"]:
                    drain_end = max(drain_end, done_prev + c.ret_wait - self.ret_cap + 2 * s["ret"])
                written = max(max(drain_end, t) + getattr(c, "post_" + kind, 0.0), w_free + 1)
            cum_ends.append(cum)
            w_free = written
            if s["keep"]:
                kept_at[owner] = written
            done_prev = max(written + c.cpl, done_prev + (c.ret_gap if i else 0.0)) + s["ret"]
            if trace is not None:
                trace.append((written, done_prev))
        return done_prev

    def program_trace(self, program) -> list:
        """(written, completion) cycles of every descriptor of ``program`` (as :meth:`program_cycles`)."""
        descs = [e[0] if isinstance(e, tuple) else e for e in program]
        owners = [e[2] if isinstance(e, tuple) and len(e) == 3 else 0 for e in program]
        out = []
        self._run([self.shape(d) for d in descs], owners, out)
        return out

    # ---- kernels (firmware/ndp/kernels.py tiling) -----------------------------------------------------------
    def _kernel(self, name, *args):
        key = (name, args)
        if key not in self._kcache:
            self._kcache[key] = self.program_cycles(self.kernel_program(name, *args))
        return self._kcache[key]

    def kernel_program(self, name, *args):
        """The firmware's descriptor program of kernel ``name`` ('e2', 'e3', 'e4', 'attention') for shape
        ``args`` (e2: (d, r); e3 / e4: (d, r, batch); attention: (head_dim, tokens, group); attention_grouped:
        (head_dim, tokens, group[, entries[, narrow]]))."""
        from firmware.ndp import kernels as K
        cfg = self.config
        if name in ("e2", "e3", "e4"):
            d, r = args[0], args[1]
            lay = K.lora_layout(d, r, config=replace(cfg, device_bytes=1 << 62))
            if name == "e2":
                return K.lora_e2_loads(lay, config=cfg).program
            x = np.zeros((args[2], d), np.uint16)
            fn = K.lora_e3 if name == "e3" else K.lora_e4
            return fn(x, lay, config=cfg).program
        if name == "attention":
            hd, tokens, g = args
            lay = K.kv_layout(hd, tokens, config=replace(cfg, device_bytes=1 << 62), rows=g)
            return K.attention_integral(np.zeros((g, hd), np.uint16), lay, config=cfg).program
        if name == "attention_grouped":
            # n entries of the same shape as one batch stream (kernels.attention_batch); narrow: the NARROW tiles
            hd, tokens, g, *rest = args
            n, narrow = (rest + [1, 0][len(rest):])[:2]
            lay = K.kv_group_layout(hd, tokens, config=replace(cfg, device_bytes=1 << 62), rows=g,
                                    narrow=bool(narrow))
            q = np.zeros((g, lay["group"], hd), np.uint16)
            # the hosts issue the batch's grouped entries software-pipelined over two owners (docs/ndp_core.md)
            return K.attention_batch([(q, lay)] * n, config=cfg, pipelined=True).entries()
        raise ValueError(f"unknown kernel {name!r}; allowed: e2, e3, e4, attention, attention_grouped")

    def kernel_cycles(self, name, *args) -> float:
        return self._kernel(name, *[int(a) for a in args])

    # ---- the PLoRA host interface (seconds, whole device) ---------------------------------------------------
    @property
    def descriptor_overhead_s(self) -> float:
        """Fixed cost of one read-compute descriptor that the overlap does not hide: the calibrated gap between
        two descriptors' compute (the rest of a lone descriptor's latency overlaps the next one's reads)."""
        return self.cal.gap / self.hz

    def load_s(self, nbytes) -> float:
        """E2 device side: LOADs of ``nbytes`` in the firmware's chunks (firmware/ndp/kernels.py
        ``load_chunk_bytes``), back to back."""
        if not (np.isfinite(nbytes) and nbytes >= 0):
            raise ValueError(f"nbytes must be a finite number >= 0, got {nbytes!r}")
        if nbytes == 0:
            return 0.0
        from firmware.ndp.descriptor import load
        from firmware.ndp.kernels import load_chunk_bytes
        per = load_chunk_bytes(self.config)
        n = int(ceil(nbytes))
        n += n % 2
        full, rest = divmod(n, per)
        key = ("load", full, rest)
        if key not in self._kcache:
            # full chunks are identical: min(full, 8) of them simulated, the others at the steady cost of one
            tail = [load(0, 1, rest // 2)] if rest else []
            m = min(full, 8)
            t = self.program_cycles([load(0, 1, per // 2)] * m + tail)
            if full > m:
                t += (full - m) * (t - self.program_cycles([load(0, 1, per // 2)] * (m - 1) + tail))
            self._kcache[key] = t
        return self._kcache[key] / self.hz

    def _d(self, d, r):
        """``d`` padded to what the firmware's tiling takes (kernels.k_tiles / n_panels): a multiple of
        ``lanes / 2`` (with an even rank) or of ``lanes`` (zero rows of A / columns of B; the rank is never
        padded)."""
        h = self.lanes // 2
        dp = -(-d // h) * h
        if dp % self.lanes and r % 2:
            dp = -(-d // self.lanes) * self.lanes
        return dp

    def lora_e4_s(self, d_in, rank, batch) -> float:
        """``m = x A`` on the device (firmware kernels.lora_e4: K-tiles accumulating, batch chunks)."""
        d_in, rank = _pos("d_in", d_in), _pos("rank", rank)
        return self.kernel_cycles("e4", self._d(d_in, rank), rank, _pos("batch", batch)) / self.hz

    def lora_e3_s(self, d_in, d_out, rank, batch) -> float:
        """``y = x A B`` on the device (kernels.lora_e3). The firmware's LoRA layout has d_out = d_in; for
        d_out != d_in the two steps are priced separately: E4 over d_in plus the B panels over d_out."""
        d_in, d_out = _pos("d_in", d_in), _pos("d_out", d_out)
        rank, batch = _pos("rank", rank), _pos("batch", batch)
        d_in, d_out = self._d(d_in, rank), self._d(d_out, rank)
        if d_in == d_out:
            return self.kernel_cycles("e3", d_in, rank, batch) / self.hz
        # xA (KEEP) over d_in, then the B panels over d_out: E3(d_out) minus its own A step (E4(d_out))
        e3o = self.kernel_cycles("e3", d_out, rank, batch)
        e4o = self.kernel_cycles("e4", d_out, rank, batch)
        e4i = self.kernel_cycles("e4", d_in, rank, batch)
        return (e4i + max(0.0, e3o - e4o)) / self.hz

    def attention_s(self, tokens, head_dim, q_heads, kv_heads):
        """One layer's decode attention of one request over ``tokens`` KV positions on this device (vectorized
        over ``tokens``; 0 costs nothing), from an idle device: per KV head the integral kernel
        (kernels.attention_integral: per token tile scores, SOFTMAX, context) with the GQA group of ``q_heads /
        kv_heads`` query rows. Token counts are padded up to whole beats of ``lanes`` tokens (the kernel's unit;
        padded keys are masked by the host). A batch's shares run as one stream: :meth:`attention_batch_s`."""
        return self._attention_vec(tokens, head_dim, q_heads, kv_heads, self._attention_cycles)

    def attention_batch_s(self, tokens, head_dim, q_heads, kv_heads) -> float:
        """One layer's decode attention of a whole batch on this device, run as **one descriptor stream**
        (firmware ``kernels.attention_batch``: every request's share of every KV head, one after the other, so
        each pair's fixed costs overlap the next pair's reads; issue 29 item 1). ``tokens``: the requests'
        shares on this device (1-D; 0 costs nothing). Seconds =
        ``sum_r kv_heads * attention_stream_s(tokens_r) + attention_fixed_s(tokens)``: each pair at its
        steady-state cost in the stream (:meth:`attention_stream_s`), plus once the part of the first pair's time
        that nothing before it hides (:meth:`attention_fixed_s`)."""
        per = self.attention_stream_s(tokens, head_dim, q_heads, kv_heads)
        return float(np.sum(per)) + self.attention_fixed_s(tokens, head_dim, q_heads, kv_heads)

    def attention_stream_s(self, tokens, head_dim, q_heads, kv_heads):
        """Per request (vectorized over ``tokens``): its ``kv_heads`` (request, KV head) pairs at their
        steady-state cost inside a batch's descriptor stream -- a pair's cycles when the same pair runs before and
        after it (the increment of the stream by one pair). Tokens are padded to whole beats as in
        :meth:`attention_s`."""
        return self._attention_vec(tokens, head_dim, q_heads, kv_heads, self._attention_inc)

    def attention_fixed_s(self, tokens, head_dim, q_heads, kv_heads) -> float:
        """The part of a batch stream's time that the steady-state costs leave out: the first pair runs from an
        idle device (its first read's latency; the last pair's drain and return after the stream). Taken as the
        largest over the batch's shares (design choice: the stream's order is the host's; the largest is an upper
        bound over the first-pair choices); 0 for an empty batch."""
        extra = np.atleast_1d(self.attention_first_s(tokens, head_dim, q_heads, kv_heads))
        return float(extra.max()) if extra.size and np.any(np.atleast_1d(tokens) > 0) else 0.0

    def attention_first_s(self, tokens, head_dim, q_heads, kv_heads):
        """Per request (vectorized over ``tokens``): what one of its stream entries (a (request, KV head) pair, or
        a grouped entry of ``lanes / group_lanes`` KV heads, whichever kernel the stream uses for the share) costs
        from an idle device beyond its steady-state cost in the stream; :meth:`attention_fixed_s` is the largest
        over a batch. 0 for an empty share."""
        units = []
        inc = np.atleast_1d(self._attention_vec(tokens, head_dim, q_heads, kv_heads, self._attention_inc, units))
        lone = np.atleast_1d(self._attention_vec(tokens, head_dim, q_heads, kv_heads, self._attention_cycles,
                                                 kernel=units[0]))
        out = (lone - inc) / np.atleast_1d(units[1])
        return float(out[0]) if np.ndim(tokens) == 0 else out

    def _attention_vec(self, tokens, head_dim, q_heads, kv_heads, fn, units=None, kernel=None):
        """Per request: ``fn``'s cycles of its entries, in seconds (the grouped kernel, at the segment width where
        it is the cheapest, where it beats the per-pair one). ``units`` (a list): the kernel chosen per request (0:
        per pair, 1: grouped at W, 2: grouped at W / 2, NARROW) and its entries per request are appended;
        ``kernel``: that choice, imposed (an array from ``units``)."""
        head_dim, q_heads, kv_heads = _pos("head_dim", head_dim), _pos("q_heads", q_heads), _pos("kv_heads", kv_heads)
        if q_heads % kv_heads:
            raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
        tok = np.asarray(tokens, dtype=np.float64)
        if np.any(tok < 0) or not np.all(np.isfinite(tok)):
            raise ValueError("tokens must be finite and >= 0")
        g = q_heads // kv_heads
        from firmware.ndp.kernels import share_tokens
        cfg = self.config
        scalar = np.ndim(tokens) == 0
        tok = np.atleast_1d(tok)
        padded = np.atleast_1d(share_tokens(tok, cfg)).reshape(tok.shape)
        out = np.zeros_like(tok)
        for v in np.unique(padded):
            if v > 0:
                out[padded == v] = kv_heads * fn(head_dim, int(v), g) / self.hz
        grouped = np.zeros(tok.shape, np.int8)
        n_entries = np.full(tok.shape, float(kv_heads))
        fg = _GROUPED[fn.__name__].__get__(self)
        for code, W in enumerate(cfg.group_widths, 1):
            narrow = int(W < cfg.group_lanes)
            if not self.uses_grouped(head_dim, q_heads, kv_heads, narrow=bool(narrow)):
                continue
            # the grouped kernel (kv_heads / segs entries of segs heads, the share in whole tiles of W tokens;
            # NARROW: W / 2, twice the heads) where it is faster: the host issues, per share, the cheapest of the
            # kernels (all exact)
            segs = cfg.lanes // W
            pg = np.ceil(tok / W) * W
            for v in np.unique(pg):
                if v > 0:
                    sel = pg == v
                    tg = (kv_heads // segs) * fg(head_dim, int(v), g, narrow) / self.hz
                    use = (tg < out[sel]) if kernel is None else (np.asarray(kernel)[sel] == code)
                    idx = np.flatnonzero(sel)[use]
                    out[idx] = tg
                    grouped[idx] = code
                    n_entries[idx] = kv_heads // segs
        if units is not None:
            units += [grouped, n_entries]
        return float(out[0]) if scalar else out

    def uses_grouped(self, head_dim, q_heads, kv_heads, narrow: bool = False) -> bool:
        """Whether a layer's decode attention of this shape can run in the grouped dataflow
        (kernels.attention_grouped, ``lanes / group_lanes`` KV heads per entry; ``narrow``: the NARROW tiles,
        twice the heads): the model prices it so (``grouped_attention``), the head dim is n x the segment width
        (kernels.grouped_attention), the KV heads fill whole groups and a GQA group's rows fit the descriptor (rows
        x segments <= max_batch)."""
        from firmware.ndp.kernels import grouped_attention
        cfg = self.config
        if not (self.grouped_attention and grouped_attention(head_dim, cfg, narrow)):
            return False
        segs = cfg.lanes // cfg.group_width(narrow)
        return kv_heads % segs == 0 and (q_heads // kv_heads) * segs <= cfg.max_batch

    def _attg_inc(self, hd, tokens, g, narrow=0):
        """:meth:`_attention_inc` of one grouped entry (``lanes / group_lanes`` KV heads, ``tokens`` a multiple
        of W; ``narrow``: the NARROW tiles, W / 2): the stream of three entries minus that of two
        (kernels.attention_batch); beyond four tiles extrapolated per tile."""
        key = ("attg_inc", hd, tokens, g) + ((1,) if narrow else ())
        if key not in self._kcache:
            W = self.config.group_width(narrow)
            n = tokens // W
            if n <= 4:
                t = self._attg_kernel(hd, tokens, g, 3, narrow) - self._attg_kernel(hd, tokens, g, 2, narrow)
            else:
                t4 = self._attg_inc(hd, 4 * W, g, narrow)
                t3 = self._attg_inc(hd, 3 * W, g, narrow)
                t = t4 + (n - 4) * (t4 - t3)
            self._kcache[key] = t
        return self._kcache[key]

    def _attg_kernel(self, hd, tokens, g, n, narrow):
        """kernel_cycles of ``n`` grouped entries (the cache keys of the W tiles as before NARROW existed)."""
        args = (hd, tokens, g) + ((n,) if n != 1 or narrow else ()) + ((1,) if narrow else ())
        return self.kernel_cycles("attention_grouped", *args)

    def _attg_cycles(self, hd, tokens, g, narrow=0):
        """:meth:`_attention_cycles` of one grouped entry, from an idle device (``narrow``: the NARROW tiles)."""
        key = ("attg", hd, tokens, g) + ((1,) if narrow else ())
        if key not in self._kcache:
            W = self.config.group_width(narrow)
            n = tokens // W
            if n <= 4:
                t = self._attg_kernel(hd, tokens, g, 1, narrow)
            else:
                t4 = self._attg_kernel(hd, 4 * W, g, 1, narrow)
                t3 = self._attg_kernel(hd, 3 * W, g, 1, narrow)
                t = t4 + (n - 4) * (t4 - t3)
            self._kcache[key] = t
        return self._kcache[key]

    def _attention_inc(self, hd, tokens, g):
        """Core cycles one (request, KV head) pair of ``tokens`` adds to a stream of such pairs: the program of
        three pairs minus that of two (whole tiles beyond four extrapolated at the steady cost of a tile, as
        :meth:`_attention_cycles`)."""
        key = ("att_inc", hd, tokens, g)
        if key not in self._kcache:
            from firmware.ndp import kernels as K
            tile = K.token_tile(hd, tokens, g, self.config)
            n = -(-tokens // tile)
            if n <= 4:
                prog = self.kernel_program("attention", hd, tokens, g)
                t = self.program_cycles(prog * 3) - self.program_cycles(prog * 2)
            else:
                rest = tokens - (n - 1) * tile
                t4 = self._attention_inc(hd, 3 * tile + rest, g)
                t3 = self._attention_inc(hd, 2 * tile + rest, g)
                t = t4 + (n - 4) * (t4 - t3)
            self._kcache[key] = t
        return self._kcache[key]

    def _attention_cycles(self, hd, tokens, g):
        key = ("att", hd, tokens, g)
        if key not in self._kcache:
            cfg = self.config
            from firmware.ndp import kernels as K
            tile = K.token_tile(hd, tokens, g, cfg)
            n = -(-tokens // tile)
            if n <= 4:
                t = self.kernel_cycles("attention", hd, tokens, g)
            else:
                # whole tiles are identical: 4 tiles + the steady cost of the others (+ the last partial tile)
                rest = tokens - (n - 1) * tile
                t4 = self.kernel_cycles("attention", hd, 3 * tile + rest, g)
                t3 = self.kernel_cycles("attention", hd, 2 * tile + rest, g)
                t = t4 + (n - 4) * (t4 - t3)
            self._kcache[key] = t
        return self._kcache[key]


#: the grouped counterpart of each per-pair pricing function (NDPPerfModel._attention_vec)
_GROUPED = {"_attention_cycles": NDPPerfModel._attg_cycles, "_attention_inc": NDPPerfModel._attg_inc}


# ---- the precomputed kernel table ---------------------------------------------------------------------------

def table_fingerprint(model) -> str:
    """SHA-256 of the model's parameters (``cache_key``: configuration, memory model, calibration, overlap) and
    of every file of :data:`TABLE_SOURCES`: equal fingerprints give equal kernel times."""
    from hdl.memctl.controller import DEFAULT_QUEUE_DEPTH
    # of the controller's RTL only its queue depth enters the fast model (hdl/memctl/controller.py itself is not
    # hashed: its speed changes keep cycles equal, checked by the RTL-vs-fast-model tests)
    h = hashlib.sha256(repr((model.cache_key, DEFAULT_QUEUE_DEPTH)).encode())
    for rel in TABLE_SOURCES:
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes() + b"\0")
    return h.hexdigest()


def _enc(k):
    return [_enc(x) for x in k] if isinstance(k, tuple) else k


def _dec(k):
    return tuple(_dec(x) for x in k) if isinstance(k, list) else k


def load_kernel_table(model, path=TABLE_PATH) -> str:
    """Seed ``model``'s kernel cache from the table at ``path`` when its fingerprint is the model's; returns and
    sets ``model.table_status``: ``"loaded N"``, ``"missing"`` or ``"stale"`` (the sources or parameters changed
    since the table was written: a warning says how to write it again, and every kernel is computed)."""
    key = (model.cache_key, str(path))
    status = _TABLES_LOADED.get(key)
    if status is None:
        p = Path(path)
        if not p.is_file():
            status = "missing"
        else:
            doc = json.loads(p.read_text())
            if doc.get("fingerprint") != table_fingerprint(model):
                status = "stale"
                warnings.warn(f"{p}: NDP kernel table is stale (the model or its sources changed since it was "
                              "written); kernel times are computed instead, which is slower. Write it again with "
                              "`ndpim plora kernel-table`.", RuntimeWarning, stacklevel=3)
            else:
                for k, v in doc["entries"]:
                    model._kcache.setdefault(_dec(k), float(v))
                status = f"loaded {len(doc['entries'])}"
        _TABLES_LOADED[key] = status
    model.table_status = status
    return status


def kernel_cache_entries(model) -> list:
    """The model's kernel cache as JSON-able ``[key, cycles]`` pairs (the table's ``entries``)."""
    return [[_enc(k), float(v)] for k, v in model._kcache.items()]


def write_kernel_table(model, entries, path=TABLE_PATH, *, source: str = "") -> dict:
    """Write ``entries`` (``[key, cycles]`` pairs, e.g. merged :func:`kernel_cache_entries` of worker processes)
    as the kernel table of ``model`` to ``path``, sorted, with the model's fingerprint."""
    uniq = {json.dumps(k): [k, float(v)] for k, v in entries}
    doc = {"source": source or "sim.perf.ndp.write_kernel_table", "fingerprint": table_fingerprint(model),
           "model": repr(model.cache_key), "sources": list(TABLE_SOURCES),
           "entries": [uniq[k] for k in sorted(uniq)]}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return doc


def _pos(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return int(v)


# ---- calibration against the RTL ------------------------------------------------------------------------------

def calibration_programs(config):
    """The programs the calibration measures (shapes disjoint from the test's, tests/sim/perf/test_ndp_perf.py):
    lone descriptors of each dataflow and the same descriptors back to back."""
    from firmware.ndp.descriptor import gemv, gemm, softmax, load
    z = lambda s: np.zeros(s, np.uint16)                      # noqa: E731
    progs = {
        "trans_64x32": [(gemv(0, 64, 32, trans=True), z((1, 64)))],
        "trans_64x32_x4": [(gemv(0, 64, 32, trans=True), z((1, 64)))] * 4,
        "trans_64x16_x4": [(gemv(0, 64, 16, trans=True), z((1, 64)))] * 4,
        "row_b2_16x128": [(gemm(0, 2, 16, 128), z((2, 16)))],
        "row_b2_16x128_x4": [(gemm(0, 2, 16, 128), z((2, 16)))] * 4,
        "load_512": [(load(0, 1, 512), None)],
        "load_512_x4": [(load(0, 1, 512), None)] * 4,
        "keep_chain": [(gemv(0, 32, 32, keep=True), z((1, 32))), (softmax(1, 32, keep=True, chain=True), None),
                       (gemv(0, 32, 16, chain=True, trans=True), None)],
        "row_b4_16x64": [(gemm(0, 4, 16, 64), z((4, 16)))],
        "trans_b2_128x16": [(gemm(0, 2, 128, 16, trans=True), z((2, 128)))],
        "softmax_2x64": [(gemv(0, 16, 64, keep=True), z((1, 16))), (softmax(1, 64, chain=True), None)],
        "load_128_x3": [(load(0, 1, 128), None)] * 3,
        "load_960_x3": [(load(0, 1, 960), None)] * 3,
        "load_256_x8": [(load(0, 1, 256), None)] * 8,
        "trans_48x16_x8": [(gemv(0, 48, 16, trans=True), z((1, 48)))] * 8,
    }
    # short attention pairs back to back (kernels.attention_batch: 6 shares of one beat at head dim 32, GQA 1 and
    # 4): one pair's drains meet the next pair's in the PE array's one DRAIN stage
    from firmware.ndp import kernels as K
    for g in (1, 4):
        entries, base = [], 0
        for _ in range(6):
            kv = K.kv_layout(32, config.lanes, config=config, rows=g, base=base)
            base = kv["end"]
            entries.append((z((g, 32)), kv))
        progs[f"att_stream6x1beat_hd32_g{g}"] = K.attention_batch(entries, config=config).program
    # LoRA E4s of a block and a half (the half-block tail first, then the block, ACC) at batch 8: four passes of
    # two rows each, drain-bound, the writer finishing each pass before the next (the paper's D = 768 has this
    # structure at 512 lanes); and of 4.5 blocks, where the tail's drains meet the block's passes in the PE
    # array's two accumulator banks
    for d in (12, 36):
        lay = K.lora_layout(d, 16, config=config)
        progs[f"e4_d{d}_r16_b8"] = K.lora_e4(z((8, d)), lay, config=config).program
    return progs


def validation_programs(config):
    """Kernel programs (firmware/ndp/kernels.py) of shapes the calibration does not use, on ``config`` (the
    test DUT's 32 KiB memory): LoRA E4 / E3 at several D, R, batch (K-tiles accumulating, B panels on a kept
    result), attention over token tiles (GEMV and a GQA group of 2), E2 loads, E4s of 4 adapters back to back."""
    from firmware.ndp import kernels as K
    z = lambda s: np.zeros(s, np.uint16)                      # noqa: E731
    out = {}
    for d, r, b in ((64, 12, 1), (128, 8, 3), (256, 8, 1)):
        lay = K.lora_layout(d, r, config=config)
        out[f"e4_d{d}_r{r}_b{b}"] = K.lora_e4(z((b, d)), lay, config=config).program
    for d, r, b in ((64, 8, 2), (128, 16, 1)):
        lay = K.lora_layout(d, r, config=config)
        out[f"e3_d{d}_r{r}_b{b}"] = K.lora_e3(z((b, d)), lay, config=config).program
    lay = K.lora_layout(128, 16, config=config)
    out["e2_d128_r16"] = K.lora_e2_loads(lay, config=config).program
    # E2 of an adapter several LOAD chunks long (each as large as the return ring: LOADs take turns with returns)
    lay = K.lora_layout(256, 16, config=config)
    out["e2_d256_r16"] = K.lora_e2_loads(lay, config=config).program
    # E4 with the half-block tail first and balanced K-tiles (20.5 blocks of lanes rows; 8 blocks per tile at most)
    lay = K.lora_layout(164, 16, config=config)
    out["e4_d164_r16_b4"] = K.lora_e4(z((4, 164)), lay, config=config).program
    # the same structure at other D, R, batch: 2.5 and 12.5 blocks
    for d, r, b in ((20, 32, 8), (100, 32, 4)):
        lay = K.lora_layout(d, r, config=config)
        out[f"e4_d{d}_r{r}_b{b}"] = K.lora_e4(z((b, d)), lay, config=config).program
    for hd, l, g in ((16, 96, 1), (32, 64, 2)):
        kv = K.kv_layout(hd, l, config=config, rows=g)
        out[f"att_hd{hd}_l{l}_g{g}"] = K.attention_integral(z((g, hd)), kv, config=config).program
    # a decode batch's attention as one descriptor stream (kernels.attention_batch): 8 shares of 8..64 tokens,
    # one query row each, and the same with GQA groups of 4
    for g in (1, 4):
        entries, base = [], 0
        for l in (16, 64, 8, 32, 16, 24, 64, 8):
            kv = K.kv_layout(16, l, config=config, rows=g, base=base)
            base = kv["end"]
            entries.append((z((g, 16)), kv))
        out[f"att_batch8_hd16_g{g}"] = K.attention_batch(entries, config=config).program
    # streams of very short pairs (one- and two-beat shares, head dim 16 and 32): the DRAIN stage shared across
    # descriptors (the calibration's short-pair streams are one beat at head dim 32)
    for hd, l, n, g in ((16, 1, 8, 1), (16, 1, 8, 4), (32, 2, 4, 1), (32, 2, 4, 2)):
        entries, base = [], 0
        for _ in range(n):
            kv = K.kv_layout(hd, l * config.lanes, config=config, rows=g, base=base)
            base = kv["end"]
            entries.append((z((g, hd)), kv))
        out[f"att_stream{n}x{l}beat_hd{hd}_g{g}"] = K.attention_batch(entries, config=config).program
    lays, base = [], 0
    for _ in range(4):
        lays.append(K.lora_layout(64, 24, config=config, base=base))
        base = lays[-1]["end"]
    out["e4x4_d64_r24"] = [e for lay in lays for e in K.lora_e4(z((1, 64)), lay, config=config).program]
    return out


def rtl_group_config():
    """tests/hdl/ndp/test_core.py's grouped DUT: the tiny core with the grouped dataflow (segments of W = 2 of 8
    lanes, 4 per beat as PAPER's 128 of 512; a 2-lane SFU; GQA groups of 2) on the same burst memory."""
    cfg, mem = rtl_config()
    return replace(cfg, name="tiny-group", sfu_lanes=2, group_lanes=2, max_batch=8, sfu_fifo=8), mem


def rtl_narrow_config():
    """tests/hdl/ndp/test_core.py's NARROW DUT: twice the tiny datapath (16 lanes x 2 PE rows, so that a NARROW
    tile is 2 tokens) with segments of W = 4 or, per descriptor, W / 2 = 2 lanes (4 or 8 per beat, as PAPER's
    128 / 64 of 512; a 2-lane SFU; GQA groups of 2 at 8 heads) on the grouped DUT's burst memory."""
    cfg, mem = rtl_group_config()
    return replace(cfg, name="tiny-narrow", macs=32, lanes=16, sfu_lanes=2, group_lanes=4, group_narrow=True,
                   max_batch=16), mem


def _group_entries(config, B, l, n, rng, d=None, base=0, narrow=False):
    """``n`` grouped attention entries (kernels.kv_group_layout, one after the other from ``base``) of ``B`` query
    rows over ``l`` tokens at head dim ``d`` (default the group width W), random queries from ``rng``;
    ``narrow``: NARROW tiles."""
    from firmware.ndp import kernels as K
    d = d or config.group_lanes
    ents = []
    for _ in range(n):
        lay = K.kv_group_layout(d, l, config=config, rows=B, base=base, narrow=narrow)
        base = lay["end"]
        ents.append(((rng.standard_normal((B, lay["group"], d))).astype(np.float16).view(np.uint16), lay))
    return ents


def narrow_programs(config, seed=2, pipelined=False):
    """Streams with NARROW tiles on ``config`` (:func:`rtl_narrow_config`; head dim W, so a NARROW share has two
    context slices): shares of (query rows B, tokens, NARROW) = all NARROW; all NARROW, longer; NARROW and W-wide
    shares mixed in one stream. Not in the calibration. ``pipelined``: the order the hosts issue."""
    from firmware.ndp import kernels as K
    specs = {"att_narrow_b1l6_b2l4_b1l2": ((1, 6, True), (2, 4, True), (1, 2, True)),
             "att_narrow_b2l8_b1l16": ((2, 8, True), (1, 16, True)),
             "att_widths_b1l6n_b2l4_b2l4n_b1l8_b1l2n": ((1, 6, True), (2, 4, False), (2, 4, True), (1, 8, False),
                                                        (1, 2, True))}
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in specs.items():
        ents, base = [], 0
        for B, l, nar in spec:
            ents += _group_entries(config, B, l, 1, rng, base=base, narrow=nar)
            base = ents[-1][1]["end"]
        out[name] = K.attention_batch(ents, config=config, pipelined=pipelined).entries()
    return out


def _grouped_stream(config, specs, seed, pipelined, name):
    """{name(B, l, n[, d]): the descriptor entries of kernels.attention_batch over :func:`_group_entries`} per
    (B, l, n[, head dim]) of ``specs`` (one random stream for all)."""
    from firmware.ndp import kernels as K
    rng = np.random.default_rng(seed)
    return {name(*s): K.attention_batch(_group_entries(config, *s[:3], rng, *s[3:]), config=config,
                                        pipelined=pipelined).entries() for s in specs}


def grouped_programs(config, seed=0, pipelined=False):
    """Grouped attention streams (kernels.attention_batch of kv_group_layout entries; issue 29) on ``config``
    (:func:`rtl_group_config`): (query rows B, tokens per share, entries) = (1, 2, 8), (1, 8, 8), (2, 4, 6),
    (1, 16, 3), none of :func:`calibration_group_programs`' shapes. ``pipelined``: the same entries
    software-pipelined (``attention_batch(pipelined=True)``, the order the hosts issue)."""
    return _grouped_stream(config, ((1, 2, 8), (1, 8, 8), (2, 4, 6), (1, 16, 3)), seed, pipelined,
                           lambda B, l, n: f"att_grouped_b{B}_l{l}_x{n}")


def grouped_programs_2w(config, seed=1, pipelined=False):
    """Grouped attention streams at a head dim of 2 W (the scores' K = 2 W over two x words, two context slices;
    kernels.attention_grouped): (query rows B, tokens per share, entries) = (1, 4, 6), (2, 2, 4). Not issued at
    PAPER (W = 128 = the head dim) and not in the calibration: they price the W = 64 variant
    (docs/ndp_core.md)."""
    W = config.group_lanes
    return _grouped_stream(config, ((1, 4, 6, 2 * W), (2, 2, 4, 2 * W)), seed, pipelined,
                           lambda B, l, n, d: f"att_grouped_d{d}_b{B}_l{l}_x{n}")


def calibration_group_programs(config):
    """Grouped attention streams the calibration measures on the grouped DUT (:func:`rtl_group_config`), in the
    plain and the pipelined order: (query rows B, tokens per share, entries) = (1, 4, 5), (2, 2, 4), (1, 6, 3),
    none of :func:`grouped_programs`' shapes; and two mixed streams (:func:`mixed_programs`, :data:`CAL_MIXED`)."""
    out = {}
    for piped in (False, True):
        out.update(_grouped_stream(config, ((1, 4, 5), (2, 2, 4), (1, 6, 3)), 1, piped,
                                   lambda B, l, n: f"cal_grouped_b{B}_l{l}_x{n}{'_pipelined' if piped else ''}"))
    out.update({"cal_" + n: p for n, p in mixed_programs(config, CAL_MIXED).items()})
    return out


#: (B, l, n, GEMV K, GEMV N) of the calibration's mixed streams (:func:`mixed_programs`)
CAL_MIXED = ((1, 2, 5, 64, 16), (2, 2, 4, 32, 32))


def mixed_programs(config, shapes=((2, 2, 6, 64, 32), (2, 4, 4, 128, 16))):
    """Validation streams where the input feeder's wait on the SFU matters (the FIFO in front of it,
    ``NDPConfig.sfu_fifo``): a pipelined grouped stream (owners 0 and 1) with a GEMV of owner 2 right after each
    SOFTMAX, whose input comes behind the SOFTMAX's in the feeder. ``shapes``: (B, l, n, GEMV K, GEMV N) of each
    (:func:`calibration_group_programs` measures two others)."""
    from firmware.ndp import kernels as K
    from firmware.ndp.descriptor import gemv
    out = {}
    for B, l, n, k, nn in shapes:
        ents = _group_entries(config, B, l, n, np.random.default_rng(3))
        base = ents[-1][1]["end"]                  # the GEMV's operand after the KV
        prog = []
        for e in K.attention_batch(ents, config=config, pipelined=True).entries():
            prog.append(e)
            if e[0].op == DescOp.SOFTMAX:
                prog.append((gemv(base, k, nn, trans=True), np.zeros((1, k), np.uint16), 2))
        out[f"mixed_b{B}_l{l}_x{n}_gemv{k}x{nn}"] = prog
    return out


def rtl_cycles(program, config, dut, backend):
    """Cycles of ``program`` (entries (Descriptor, input[, owner]); owner 0 if absent) on the RTL ``dut``; every
    completion must be OK."""
    from sim.golden.ndp_core import x_beats
    n_y = sum(-(-e[0].returned_elems(2, config) // config.lanes) for e in program)
    reqs = [e[0].request(e[2] if len(e) == 3 else 0) for e in program]
    run = backend.run_streams(dut, {"desc": reqs, "x": x_beats(program, config)},
                              {"y": n_y, "cpl": len(program)}, max_cycles=2_000_000)
    status = [(w >> 16) & 0x1F for w in run.outputs["cpl"]]
    if any(status):
        raise RuntimeError(f"RTL program failed: statuses {status}")
    return run.cycles


def rtl_written(program, config, dut):
    """Cycle at which the RTL's output writer is done with each descriptor of ``program`` (the core's ``rp_out``
    pointer advancing), from a waveform of Amaranth's simulator (the same DUT as :func:`rtl_cycles`; the core's
    internal events are not on its ports). Returns (cycles of the run, [written cycle per descriptor])."""
    import tempfile
    from sim.e2e.waveform import VCDAmaranthBackend
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.vcd"
        total = rtl_cycles(program, config, dut, VCDAmaranthBackend(path))
        written = _vcd_advances(path, "rp_out")
    if len(written) != len(program):
        raise RuntimeError(f"waveform: {len(written)} rp_out advances for {len(program)} descriptors")
    return total, written


def _vcd_advances(path, name):
    """Cycles at which the signal ``name`` of the core (scope ``...core.core``) changes value (a VCD of
    :class:`sim.e2e.waveform.VCDAmaranthBackend`: 1 ns clock, rising edges at 0.5 ns + k ns)."""
    code, scope, out, t = None, [], [], 0
    with open(path) as f:
        for line in f:
            if line.startswith("$scope"):
                scope.append(line.split()[2])
            elif line.startswith("$upscope"):
                scope.pop()
            elif line.startswith("$var"):
                parts = line.split()
                if parts[4] == name and scope[-2:] == ["core", "core"] and code is None:
                    code = parts[3]
            elif line.startswith("#"):
                t = int(line[1:])
            elif code is not None and line.strip() and line[0] == "b":
                v, c = line.split()
                if c == code and t > 0:
                    out.append((t - 500_000) // 1_000_000)
    if code is None:
        raise RuntimeError(f"waveform {path}: no signal {name!r} in the core's scope")
    return out


def rtl_config():
    """(config, memory model) of tests/hdl/ndp/test_core.py's DUT: the tiny core (``tiny-test``: 32 KiB device,
    GEMVs at two beats per cycle like the paper geometry) on the 512-bit burst memory, latency 8."""
    from hdl.ndp.config import TINY as T
    depth, bits = 512, 512
    return (replace(T, name="tiny-test", device_bytes=depth * bits // 8, gemv_pairs=True),
            BurstMemoryModel(bits // 8, 8))


_DUT = []


def rtl_dut(dut=None):
    """(config, Verilator DUT, memory model): tests/hdl/ndp/test_core.py's ``NDPBurstSystem`` (the same Verilog,
    so the same cached Verilator build); ``dut``: an already built one of that configuration to reuse."""
    from sim.ndp.system import NDPBurstSystem
    cfg, mem = rtl_config()
    if dut is not None:
        got = dut.core.config
        if got != cfg or dut.memory.latency != mem.latency or dut.memory.burst_bits != 8 * mem.line_bytes \
                or dut.clock is not None:
            raise ValueError(f"dut must be the {cfg.name!r} core on {8 * mem.line_bytes}-bit bursts, latency "
                             f"{mem.latency}, no clock enable; got config {got.name!r}")
        return cfg, dut, mem
    if not _DUT:
        _DUT.append(NDPBurstSystem(config=cfg, burst_bits=mem.line_bytes * 8, depth=512))
    return cfg, _DUT[0], mem


#: Weight of the per-descriptor writer cycles against the program's total in :func:`fit`'s error (design choice:
#: the totals are what the model is held to; the writes pin the units' order of events, docs/ndp_perf.md).
WRITTEN_WEIGHT = 0.25
#: Constants fitted in -64..64 (the others in 0..64).
SIGNED = ("post_trans", "post_row", "post_load", "post_softmax", "lead_sfu", "wpe")


def fit(measured: dict, config, memory, starts=()) -> Calibration:
    """Constants minimizing the model's summed squared relative error over ``measured`` {name: (program, cycles[,
    config[, written]])}: a program on another core configuration names it; ``written``, the cycle the RTL's output
    writer was done with each descriptor (:func:`rtl_written`), adds the mean squared error of the model's
    per-descriptor writes (relative to the program's cycles) to the program's. Integer grid, coordinate descent;
    each constant in 0..64 cycles, :data:`SIGNED` in -64..64. The descent runs from 0 and from each of ``starts``
    (coordinate descent stops in local minima), and the best end point is kept."""
    results = [_descend(measured, config, memory, Calibration())]
    results += [_descend(measured, config, memory, st) for st in starts]
    return min(results, key=lambda r: r[1])[0]


def _descend(measured, config, memory, best):
    models = {}

    def model(cfg):
        if cfg not in models:
            models[cfg] = NDPPerfModel(cfg, memory, best)
        return models[cfg]
    runs = [(model(v[2] if len(v) > 2 else config), v[0], v[1], v[3] if len(v) > 3 else None)
            for v in measured.values()]

    def cost(cal):
        e = 0.0
        for m, p, cyc, wr in runs:
            m.cal = cal
            if wr is None:
                e += ((m.program_cycles(p) - cyc) / cyc) ** 2
            else:
                tr = m.program_trace(p)
                e += ((tr[-1][1] - cyc) / cyc) ** 2 \
                    + WRITTEN_WEIGHT * sum(((w - o) / cyc) ** 2 for (w, _), o in zip(tr, wr)) / len(wr)
        return e
    e = cost(best)
    names = [f.name for f in fields(Calibration)]
    for _ in range(30):
        improved = False
        for f in names:
            lo = -64 if f in SIGNED else 0
            for v in range(lo, 65):
                cand = replace(best, **{f: float(v)})
                ec = cost(cand)
                if ec < e - 1e-15:
                    best, e, improved = cand, ec, True
        if not improved:
            break
    return best, e


#: A start of the descent near the latencies the RTL's waveforms show (tests/hdl/ndp/test_core.py's DUT, Amaranth
#: VCD of the grouped streams: a CHAIN's copy starts one cycle after its producer's last write, a one-beat copy
#: takes three cycles, a completion follows the writer by three); the descent moves every constant from here.
WAVEFORM_START = Calibration(start=18, gap=1, lead=3, chain=1, ret_wait=10, ret_gap=4, pair_free=16, copy=2, cpl=3)


def calibrate(path=CALIBRATION_PATH, *, refit=False) -> dict:
    """Measure :func:`calibration_programs` (and :func:`calibration_group_programs` on the grouped DUT) on the RTL:
    the cycles on Verilator, the output writer's per-descriptor cycles from Amaranth's simulator's waveform
    (:func:`rtl_written`, the same cycles: checked); fit the constants (:func:`fit`), write ``path``. ``refit``:
    reuse the measurements already in ``path`` (same programs) and only fit again."""
    cfg, dut, mem = rtl_dut()
    gcfg, _ = rtl_group_config()
    progs = {n: (p, cfg) for n, p in calibration_programs(cfg).items()}
    progs.update({n: (p, gcfg) for n, p in calibration_group_programs(gcfg).items()})
    if refit:
        old = {r["name"]: r for r in json.loads(Path(path).read_text())["measured"]}
        measured = {n: (p, old[n]["rtl_cycles"], c, old[n]["rtl_written"]) for n, (p, c) in progs.items()}
    else:
        from sim.backends import get_backend
        from sim.ndp.system import NDPBurstSystem
        be = get_backend("verilator")
        gdut = NDPBurstSystem(config=gcfg, burst_bits=mem.line_bytes * 8, depth=512)
        measured = {}
        for n, (p, c) in progs.items():
            d = dut if c is cfg else gdut
            cyc = rtl_cycles(p, c, d, be)
            total, written = rtl_written(p, c, d)
            if total != cyc:
                raise RuntimeError(f"{n}: {cyc} cycles on Verilator but {total} on Amaranth's simulator")
            measured[n] = (p, cyc, c, written)
    starts = [WAVEFORM_START]
    try:
        starts.append(load_calibration(path))       # the previous constants (a field it lacks starts at 0)
    except (FileNotFoundError, TypeError, KeyError, ValueError):
        pass
    cal = fit(measured, cfg, mem, starts)
    rows = []
    for n, (p, c, conf, written) in measured.items():
        mc = NDPPerfModel(conf, mem, cal).program_cycles(p)
        rows.append({"name": n, "config": conf.name, "descriptors": [str(e[0] if isinstance(e, tuple) else e)
                                                                     for e in p],
                     "rtl_cycles": c, "rtl_written": written, "model_cycles": mc, "rel_err": (mc - c) / c})
    out = {"source": "python -m sim.perf.ndp --calibrate: tests/hdl/ndp/test_core.py's DUTs (tiny geometry 8 "
                     "lanes x 2 PE rows, 512-bit burst memory, latency 8; the grouped programs on its grouped "
                     "configuration): cycles on Verilator, the output writer's per-descriptor cycles from Amaranth's "
                     "simulator",
           "config": cfg.name, "group_config": gcfg.name,
           "memory": {"kind": "burst", "line_bytes": mem.line_bytes, "latency": mem.latency},
           "constants": asdict(cal), "fit_starts": [asdict(Calibration())] + [asdict(st) for st in starts],
           "measured": rows}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibrate", action="store_true", help="measure the RTL and write " + str(CALIBRATION_PATH))
    ap.add_argument("--refit", action="store_true", help="with --calibrate: reuse the RTL cycles in the file")
    a = ap.parse_args(argv)
    if a.calibrate:
        out = calibrate(refit=a.refit)
        print(json.dumps(out["constants"]))
        for r in out["measured"]:
            print(f"{r['name']:>20} rtl {r['rtl_cycles']:>6} model {r['model_cycles']:>8.1f} {100 * r['rel_err']:+.2f}%")
        return 0
    m = NDPPerfModel.paper()
    print(f"paper: E4 D=4096 R=16 batch 1: {m.lora_e4_s(4096, 16, 1) * 1e6:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
