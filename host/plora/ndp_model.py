"""NDP device timing for the PLoRA host: the interface, an analytic stand-in, and the selection between them.

The host prices every NDP kernel through five members (whole device, seconds), the interface of the
calibrated model ``sim.perf.ndp.NDPPerfModel``:

* ``load_s(nbytes)``: the device side of E2 (the GPU reads ``nbytes`` of an adapter out of the device);
* ``lora_e3_s(d_in, d_out, rank, batch)``: ``y = x A B`` on the device (A: d_in x rank, B: rank x d_out);
* ``lora_e4_s(d_in, rank, batch)``: ``m = x A`` on the device;
* ``attention_s(tokens, head_dim, q_heads, kv_heads)``: one layer's decode attention of one request over its
  ``tokens`` resident on this device (integral execution: scores, softmax with anchors, context);
* ``descriptor_overhead_s``: the fixed cost of one read-compute descriptor.

:class:`NDPStandIn` is an analytic model of the same interface, used until (or instead of, with
``kind="standin"``) the calibrated model; :func:`make_ndp_model` picks one (``kind="auto"``: the calibrated
model when ``sim.perf.ndp`` is importable). The stand-in's assumptions, each a design choice of this file:

1. The device streams its operand at the whole internal bandwidth (1.1 TB/s) and computes at the NDP core's
   peak (2.048 TFLOPS); one descriptor costs ``max(operand bytes / bandwidth, flops / peak)`` plus a fixed
   descriptor overhead. (The RTL core's PE array uses 1/pe_batch of its MACs for a GEMV; the stand-in does
   not model that, the calibrated model does.)
2. ``buffers`` sets of operand buffers (default 1: the paper's "3 MB of SRAM (input, DRAM and output
   buffers)" is one set, and the RTL core does not overlap descriptors, docs/ndp_core.md "Limits"): with one
   set, descriptors run one after the other, each paying its data phase plus its fixed cost; with ``b >= 2``
   sets the next descriptors' fixed costs (decode, first DRAM access, SFU pipeline fill) hide behind the
   current data phase, up to ``b - 1`` of them: a kernel costs its first fixed cost plus, per descriptor,
   ``max(data, fixed / (b - 1))``.
3. One descriptor's operand is at most ``min(dram_buffer_bytes, 2**20 - 1)`` bytes (the 20-bit byte-size field
   of the 204-bit descriptor, PLoRA IV-C; docs/ndp_kernels.md); a larger operand is split over its output
   columns into several descriptors (no accumulation needed). A GEMM's input rows per descriptor are limited
   by the input buffer, the 20-bit field and ``max_batch``; each descriptor re-reads its operand from DRAM.
4. The softmax phase costs the RTL SFU's cycle formula (docs/ndp_core.md): ``L/lanes`` cycles to copy the kept
   scores, ``(R + 1) * ceil(L/lanes) + 29 + 5 log2(lanes)`` in the SFU, R = query rows sharing a KV head.
"""

from dataclasses import dataclass
from math import ceil, log2

import numpy as np

__all__ = ["NDPDeviceSpec", "PLORA_DEVICE", "NDPStandIn", "make_ndp_model", "NDP_MODEL_KINDS"]

FIELD_MAX_BYTES = (1 << 20) - 1      # 20-bit byte-size field of the descriptor (PLoRA IV-C, Fig. 4)
FP16_BYTES = 2
#: The paper's device memory: 64 LPDDR5X-8533 channels (hdl/ndp/config.PAPER_CHANNELS) for its stated 1.1 TB/s
#: (PLoRA IV-B).
PAPER_CHANNELS = 64
PLORA_BW_GBPS = 1100.0


@dataclass(frozen=True, kw_only=True)
class NDPDeviceSpec:
    """One PLoRA memory device with its NDP core (validated on construction)."""

    name: str = "plora"
    # PLoRA IV-B: "We follow Samsung's HPCA'24 CXL-PNM device [60], with 1.1 TB/s bandwidth, 512 GB capacity".
    internal_bw_gbps: float = 1100.0
    capacity_gb: float = 512.0
    # PLoRA set-up facts: "1024 FP16 multiply-add units delivering 2048 GFLOPS at 1 GHz".
    macs: int = 1024
    clock_ghz: float = 1.0
    # PLoRA set-up facts: "3 MB of SRAM (input, DRAM and output buffers)"; hdl/ndp/config.py PAPER splits it
    # 512 KiB input, 1 MiB DRAM (the operand ring), 512 KiB output (+ 512 KiB state, 512 KiB partial sums).
    input_buffer_bytes: int = 512 << 10
    dram_buffer_bytes: int = 1 << 20
    output_buffer_bytes: int = 512 << 10
    # PLoRA V-A: "the per-adapter batch size B_i, 0 to 256"; hdl/ndp/config.py PAPER max_batch.
    max_batch: int = 256
    # hdl/ndp/config.py PAPER: 512 lanes x 2 PE rows (the SFU formula of the stand-in uses the lanes; the
    # calibrated model derives its geometry from ``macs``, :meth:`ndp_config`).
    lanes: int = 512
    # Stand-in only: a fixed per-descriptor cost (docs/plora_host.md, the stand-in's assumptions; the calibrated
    # model has the RTL's per-unit costs instead).
    descriptor_overhead_cycles: int = 40
    # Sets of (input, DRAM, output) buffers: 1 = the paper's 3 MB of SRAM as one set (module docstring, 2.).
    buffers: int = 1

    def __post_init__(self):
        for f in ("internal_bw_gbps", "capacity_gb", "clock_ghz"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
                raise ValueError(f"NDPDeviceSpec.{f} must be a positive number, got {v!r}")
        for f in ("macs", "input_buffer_bytes", "dram_buffer_bytes", "output_buffer_bytes", "max_batch", "lanes",
                  "buffers"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"NDPDeviceSpec.{f} must be an int >= 1, got {v!r}")
        if self.lanes & (self.lanes - 1):
            raise ValueError(f"NDPDeviceSpec.lanes must be a power of two, got {self.lanes}")
        if isinstance(self.descriptor_overhead_cycles, bool) or self.descriptor_overhead_cycles < 0:
            raise ValueError(f"NDPDeviceSpec.descriptor_overhead_cycles must be >= 0, got "
                             f"{self.descriptor_overhead_cycles!r}")

    @property
    def internal_bw_Bps(self) -> float:
        return self.internal_bw_gbps * 1e9

    @property
    def peak_flops(self) -> float:
        """FP16 FLOP/s: one multiply and one add per MAC per cycle."""
        return 2.0 * self.macs * self.clock_ghz * 1e9

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_gb * 1e9

    @property
    def channels(self) -> int:
        """LPDDR5X-8533 channels of the device memory at this bandwidth: the paper's 64 channels scaled with
        ``internal_bw_gbps`` against the paper's 1.1 TB/s (PLoRA IV-B: "1.1 TB/s" is the 64-channel device of
        hdl/ndp/config.py, 1.09 TB/s delivered), rounded to a whole channel. The calibrated model times that
        many channels; runs report it (``ndp_geometry``)."""
        return max(1, int(round(PAPER_CHANNELS * self.internal_bw_gbps / PLORA_BW_GBPS)))

    def ndp_config(self):
        """The :class:`hdl.ndp.config.NDPConfig` of this device for the calibrated model: the paper's core
        (hdl/ndp/config.PAPER) with ``macs`` as ``lanes x macs / lanes`` PE rows, ``lanes`` = 512 from the paper's
        1,024 MACs up, else ``min(128, macs / 2)`` (design choice: the paper's beat of 512 lanes is one memory
        clock of the device (1 KiB per CK), so a larger core adds PE rows, which a batch uses, rather than lanes,
        which would pad short KV shares and small LoRA ranks to a wider beat; a smaller core has the beat of one
        head dim (128 lanes, PAPER's group_lanes) with rows for the rest, at least two so GEMVs still run two beats
        per cycle, ``gemv_pairs``. Checked by the property test: no kernel the host issues gets slower with more
        MACs, tests/host/plora/test_plora_ndp_model.py), the three buffers' sizes and ``max_batch``. Fields
        the RTL has no counterpart for raise ValueError naming them: ``buffers`` (the core has one set of
        buffers, its operand ring; change their sizes instead), ``clock_ghz`` (the core's clock is tied to the
        memory's CK, hdl/ndp/config.CORE_CLOCK_RATIO) and ``descriptor_overhead_cycles`` (a stand-in constant).
        ``lanes`` is the stand-in's (the calibrated geometry derives from ``macs``)."""
        from dataclasses import replace
        from hdl.ndp.config import PAPER
        bad = {f: getattr(self, f) for f in ("buffers", "clock_ghz", "descriptor_overhead_cycles")
               if getattr(self, f) != getattr(PLORA_DEVICE, f)}
        if bad:
            raise ValueError(f"the calibrated NDP model has no counterpart for {bad} (the RTL core has one buffer "
                             f"set, a clock tied to the memory's and no fixed descriptor cost); allowed: "
                             f"buffers=1, clock_ghz=1.0, descriptor_overhead_cycles=40, or ndp='standin' "
                             f"(--ndp-model standin)")
        m = self.macs
        if m < 4 or m & (m - 1):
            raise ValueError(f"the calibrated NDP model needs macs (= ndp TFLOPS x 500 at 1 GHz) a power of two >= 4 "
                             f"(lanes x macs / lanes PE rows), got {m}; e.g. --ndp-tflops 0.512, 1.024, 2.048, 4.096")
        lanes = PAPER.lanes if m >= 2 * PAPER.lanes else min(PAPER.group_lanes, m // 2)
        sfu = min(PAPER.sfu_lanes, lanes)
        group = PAPER.group_lanes if lanes >= 4 * PAPER.group_lanes else 0     # NDPConfig: group_lanes <= lanes / 4
        try:
            return replace(PAPER, name=f"plora-{lanes}x{m // lanes}-{self.channels}ch", macs=m, lanes=lanes,
                           pe_batch=m // lanes,
                           sfu_lanes=sfu, group_lanes=group, group_narrow=PAPER.group_narrow and group > 0,
                           input_buffer_bytes=self.input_buffer_bytes,
                           dram_buffer_bytes=self.dram_buffer_bytes, output_buffer_bytes=self.output_buffer_bytes,
                           max_batch=self.max_batch)     # (capacity: the host's bookkeeping, not the core's timing)
        except ValueError as exc:
            raise ValueError(f"device {self.name!r}: no NDP core of this geometry: {exc}") from None

    def scaled(self, *, tflops: float | None = None, bw_gbps: float | None = None,
               buffer_bytes: int | None = None, buffers: int | None = None) -> "NDPDeviceSpec":
        """This spec with the sensitivity knobs changed: NDP TFLOPS (through the MAC count at the same clock),
        internal bandwidth, the size of each of the three buffers, and the number of buffer sets."""
        kw = {} if buffers is None else {"buffers": int(buffers)}
        if tflops is not None:
            macs = int(round(tflops * 1e12 / (2.0 * self.clock_ghz * 1e9)))
            if macs < 1:
                raise ValueError(f"tflops must give at least one MAC, got {tflops}")
            kw["macs"] = macs
        if bw_gbps is not None:
            kw["internal_bw_gbps"] = float(bw_gbps)
        if buffer_bytes is not None:
            kw.update(input_buffer_bytes=int(buffer_bytes), dram_buffer_bytes=int(buffer_bytes),
                      output_buffer_bytes=int(buffer_bytes))
        from dataclasses import replace
        return replace(self, **kw)


#: The paper's device (PLoRA IV-B and set-up facts), 512 GB, 1.1 TB/s, 2.048 TFLOPS.
PLORA_DEVICE = NDPDeviceSpec()


def _pos(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return int(v)


class NDPStandIn:
    """Analytic NDP device timing (module docstring: assumptions). Same interface as the calibrated model."""

    kind = "standin"

    def __init__(self, spec: NDPDeviceSpec = PLORA_DEVICE):
        if not isinstance(spec, NDPDeviceSpec):
            raise ValueError(f"spec must be an NDPDeviceSpec, got {type(spec).__name__}")
        self.spec = spec
        self._bw = spec.internal_bw_Bps
        self._flops = spec.peak_flops
        self._ovh = spec.descriptor_overhead_cycles / (spec.clock_ghz * 1e9)
        self._operand_max = min(spec.dram_buffer_bytes, FIELD_MAX_BYTES)
        self._input_max = min(spec.input_buffer_bytes, FIELD_MAX_BYTES)

    @property
    def descriptor_overhead_s(self) -> float:
        return self._ovh

    # --- building blocks ------------------------------------------------------------------------------------
    def _operand_split(self, k, n):
        """Descriptors one K x N FP16 operand needs (split over N)."""
        return max(1, ceil(k * n * FP16_BYTES / self._operand_max))

    def _rows_per_desc(self, k):
        """Input rows (batch) one descriptor can take with K inputs each."""
        rows = min(self.spec.max_batch, self._input_max // (k * FP16_BYTES))
        if rows < 1:
            raise ValueError(f"an input row of {k} FP16 elements does not fit one descriptor "
                             f"({self._input_max} bytes)")
        return rows

    def _combine(self, groups) -> float:
        """Kernel time of descriptor groups ``[(count, data_s, fixed_s), ...]`` (module docstring, 2.)."""
        b = self.spec.buffers
        if b == 1:
            return sum(n * (d + f) for n, d, f in groups)
        first = next((f for n, d, f in groups if n > 0), 0.0)
        return first + sum(n * max(d, f / (b - 1)) for n, d, f in groups)

    def _gemm_groups(self, batch, k, n) -> list:
        splits = self._operand_split(k, n)
        rows = self._rows_per_desc(k)
        full, rest = divmod(batch, rows)
        out = []
        for b, count in ((rows, full), (rest, 1 if rest else 0)):
            if count:
                mem = k * n * FP16_BYTES / self._bw
                comp = 2.0 * b * k * n / self._flops
                out.append((count * splits, max(mem, comp) / splits, self._ovh))
        return out

    def gemm_s(self, batch, k, n) -> float:
        """``batch`` rows x (K x N) operand: per batch chunk, per operand split, one descriptor."""
        return self._gemm(_pos("batch", batch), _pos("k", k), _pos("n", n))

    def _gemm(self, batch, k, n) -> float:
        return self._combine(self._gemm_groups(batch, k, n))

    # --- the interface --------------------------------------------------------------------------------------
    def load_s(self, nbytes) -> float:
        """E2 device side: read ``nbytes`` out of DRAM for the GPU (LOAD descriptors of at most one operand)."""
        if not (np.isfinite(nbytes) and nbytes >= 0):
            raise ValueError(f"nbytes must be a finite number >= 0, got {nbytes!r}")
        if nbytes == 0:
            return 0.0
        n = ceil(nbytes / self._operand_max)
        return self._combine([(n, nbytes / n / self._bw, self._ovh)])

    def lora_e3_s(self, d_in, d_out, rank, batch) -> float:
        """``y = x A B``: GEMM(X, A) KEEP then GEMM(CHAIN, B) per batch chunk."""
        batch, d_in, d_out, rank = _pos("batch", batch), _pos("d_in", d_in), _pos("d_out", d_out), _pos("rank", rank)
        return self._combine(self._gemm_groups(batch, d_in, rank) + self._gemm_groups(batch, rank, d_out))

    def lora_e4_s(self, d_in, rank, batch) -> float:
        """``m = x A``: GEMM(X, A) per batch chunk."""
        return self._gemm(_pos("batch", batch), _pos("d_in", d_in), _pos("rank", rank))

    def attention_s(self, tokens, head_dim, q_heads, kv_heads):
        """One layer's decode attention of one request over ``tokens`` on this device (vectorized over
        ``tokens``; 0 tokens cost nothing). Per KV head and per chunk of tokens whose K^T fits one operand:
        scores GEMM (q_heads/kv_heads query rows), softmax (RTL SFU cycle formula), context GEMM."""
        head_dim, q_heads, kv_heads = _pos("head_dim", head_dim), _pos("q_heads", q_heads), _pos("kv_heads", kv_heads)
        if q_heads % kv_heads:
            raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
        tok = np.asarray(tokens, dtype=np.float64)
        if np.any(tok < 0) or not np.all(np.isfinite(tok)):
            raise ValueError("tokens must be finite and >= 0")
        g = q_heads // kv_heads
        lanes = self.spec.lanes
        chunk = max(1, self._operand_max // (head_dim * FP16_BYTES))
        n_chunks = np.ceil(tok / chunk)
        cyc = 1.0 / (self.spec.clock_ghz * 1e9)
        # scores (g rows x K^T) and context (g rows x V): each streams tokens x head_dim FP16 and does
        # 2 g tokens head_dim FLOPs; softmax: copy L/lanes beats, (g + 1) ceil(L/lanes) in the SFU, plus its
        # pipeline fill 29 + 5 log2(lanes) per descriptor
        gemm = np.maximum(tok * head_dim * FP16_BYTES / self._bw, 2.0 * g * tok * head_dim / self._flops)
        nb = np.ceil(tok / lanes)
        sfu_data = (nb + (g + 1) * nb) * cyc
        sfu_fixed = (29 + 5 * log2(lanes)) * cyc
        n = kv_heads * n_chunks                       # descriptors of each of the three kinds
        b = self.spec.buffers
        if b == 1:
            t = kv_heads * (2.0 * gemm + sfu_data) + n * (3 * self._ovh + sfu_fixed)
        else:
            per = lambda x: x / np.maximum(n_chunks, 1)
            t = self._ovh + n * (2.0 * np.maximum(per(gemm), self._ovh / (b - 1))
                                 + np.maximum(per(sfu_data), (self._ovh + sfu_fixed) / (b - 1)))
        t = np.where(tok > 0, t, 0.0)
        return float(t) if np.ndim(tokens) == 0 else t


NDP_MODEL_KINDS = ("auto", "calibrated", "standin")


def _calibrated(spec):
    from sim.perf.ndp import NDPPerfModel, DeviceMemoryModel     # the RTL-calibrated model (docs/ndp_perf.md)
    cfg = spec.ndp_config()                     # (raises for a field the RTL has no counterpart for)
    if spec == PLORA_DEVICE:
        return NDPPerfModel.paper()             # its kernel table
    return NDPPerfModel(cfg, DeviceMemoryModel(spec.channels))


def make_ndp_model(kind: str = "auto", spec: NDPDeviceSpec = PLORA_DEVICE):
    """The NDP timing model of device ``spec``: ``"calibrated"`` / ``"auto"`` (the same: ``sim.perf.ndp.NDPPerfModel``
    at the spec's geometry, :meth:`NDPDeviceSpec.ndp_config` on :attr:`NDPDeviceSpec.channels` LPDDR5X-8533
    channels, with the RTL calibration; the paper's device loads its kernel table, any other computes its kernels
    on first use) or ``"standin"`` (:class:`NDPStandIn` on ``spec``: only by name). A device the calibrated model
    cannot build (a field with no RTL counterpart) is an error naming the field, never a silent swap (issue 32).
    The returned object has ``kind`` (``"calibrated"`` or ``"standin"``) and ``geometry`` (a one-line description),
    which every run reports (summary ``ndp_model`` and ``ndp_geometry``, the sweep rows)."""
    if kind not in NDP_MODEL_KINDS:
        raise ValueError(f"unknown NDP model kind {kind!r}; allowed: {NDP_MODEL_KINDS}")
    if not isinstance(spec, NDPDeviceSpec):
        raise ValueError(f"spec must be an NDPDeviceSpec, got {type(spec).__name__}")
    if kind == "standin":
        model = NDPStandIn(spec)
        model.geometry = (f"stand-in: {spec.internal_bw_gbps:g} GB/s, {spec.peak_flops / 1e12:g} TFLOPS, "
                          f"{spec.buffers} buffer set(s)")
        return model
    model = _calibrated(spec)
    model.kind = "calibrated"
    cfg = model.config
    model.geometry = (f"calibrated: {cfg.lanes} lanes x {cfg.pe_batch} PE rows at {cfg.clock_mhz} MHz, "
                      f"{model.memory.channels} LPDDR5X-8533 channels")
    return model



#: The kernels :func:`monotone_violations` prices by default: the shapes the PLoRA host issues (LoRA E2 loads of
#: one adapter's A + B, E3 / E4 at ranks 8 / 64 on Llama-2-7B's d = 4096 and its MLP's 11,008 at per-adapter
#: batches 1, 4 and 64, decode attention of a KV share at Llama-2-7B's 32 / 32 and Llama-3-8B's 32 / 8 heads).
MONOTONE_KERNELS = tuple(
    [("load_s", (b,)) for b in (16 << 10, 1 << 20, 64 << 20)]
    + [(k, (d, r, b) if k == "lora_e4_s" else (d, d, r, b)) for k in ("lora_e4_s", "lora_e3_s")
       for d in (4096, 11008) for r in (8, 64) for b in (1, 4, 64)]
    + [(k, (t, 128, 32, kv)) for k in ("attention_s", "attention_stream_s") for kv in (32, 8)
       for t in (16, 64, 256, 1024, 4096)])


def monotone_violations(models, kernels=MONOTONE_KERNELS, *, rel_tol: float = 1e-9) -> list:
    """Kernels that a more capable device runs slower: ``models`` are NDP timing models ordered so that each is
    at least as capable as the one before (more bandwidth, more MACs or more channels, nothing else changed);
    ``kernels`` are ``(method, args)`` pairs. Returns ``[(method, args, i, t_before, t_after)]`` for every kernel
    whose time grows from model ``i - 1`` to model ``i`` by more than ``rel_tol`` (the property test of issue 32:
    more resources never make a kernel slower)."""
    out = []
    for name, args in kernels:
        prev = None
        for i, m in enumerate(models):
            t = float(np.sum(getattr(m, name)(*args)))
            if prev is not None and t > prev * (1.0 + rel_tol):
                out.append((name, args, i, prev, t))
            prev = t
    return out
