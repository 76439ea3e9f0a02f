"""Configuration of one PLoRA near-data-processing (NDP) core: a frozen, validated dataclass with presets.

Sources used below:

* [PLoRA]   docs/references.md. Section IV-B: "the instruction buffer holds instructions until
            they issue ... The Compute Unit holds an input buffer for GPU data, a DRAM buffer for device-resident
            data, and an output buffer ... We follow Samsung's HPCA'24 CXL-PNM device [60], with 1.1 TB/s
            bandwidth, 512 GB capacity, and 4.9 TFLOPS, while our NDP cores use 2 TFLOPS";
            (evaluation set-up) "NDP core synthesized in Verilog: 3 MB of SRAM (input, DRAM and output buffers) and 1024
            FP16 multiply-add units delivering 2048 GFLOPS at 1 GHz"; device-count sweep "of 512 GB each".
            Section V-A: "the per-adapter batch size B_i, 0 to 256".
* [issue11] Project issue 11 ("the NDP device at the paper's scale"): "1024 FP16 MACs at 1 GHz, 3 MB of
            buffers"; LPDDR5X-8533 device memory of 64 x16 channels (hdl/memctl/timing.py LPDDR5X_8533: 1024 B
            per memory clock CK = 1066.7 MHz, 1.09 TB/s).
"""

from dataclasses import dataclass, fields, replace

__all__ = ["NDPConfig", "ACCUMULATORS", "TINY", "PAPER", "NDP_PRESETS", "ndp_preset", "slice_preset",
           "CHANNEL_LANES", "PAPER_CHANNELS", "CORE_CLOCK_RATIO"]

#: Accumulator formats of the FP16 MACs (the names of :class:`hdl.fp.FPMAC`'s ``acc`` parameter).
ACCUMULATORS = ("fp16", "fp32")

#: FP16 lanes per LPDDR5X-8533 x16 channel: one channel delivers 16 B per CK (32-byte BL16 burst every 2 CK,
#: hdl/memctl/timing.py) = 8 FP16 per cycle, so 8 lanes x ``pe_batch`` rows is the exact one-channel slice of
#: the paper geometry (design choice, docs/ndp_core.md "Geometry").
CHANNEL_LANES = 8
#: Channels of the paper's device memory (hdl/memctl/timing.py LPDDR5X_8533: 64 channels, 1.09 TB/s).
PAPER_CHANNELS = 64
#: Core clock / memory clock: 1000 MHz ([PLoRA], "at 1 GHz") over LPDDR5X-8533's CK 1066.67 MHz =
#: 15/16 exactly. The one-domain RTL simulation runs the core under a 15-of-16 clock enable (docs/ndp_core.md).
CORE_CLOCK_RATIO = (15, 16)

# Ranges accepted by NDPConfig, field -> (min, max) inclusive.
_RANGES = {
    "macs": (1, 1 << 16),
    "clock_mhz": (1, 10_000),
    "input_buffer_bytes": (64, 1 << 32),
    "dram_buffer_bytes": (64, 1 << 32),
    "output_buffer_bytes": (64, 1 << 32),
    "state_buffer_bytes": (64, 1 << 32),
    "partial_buffer_bytes": (64, 1 << 32),
    "max_batch": (1, (1 << 20) - 1),          # a batch is a 20-bit descriptor dimension (input dim0)
    "instr_buffer_depth": (2, 1024),
    "lanes": (1, 1 << 12),
    "pe_batch": (1, 1 << 10),
    "sfu_lanes": (1, 1 << 12),
    "align_bytes": (2, 1 << 16),
    "state_slots": (1, 64),
    "sfu_fifo": (0, 1 << 12),
    "acc_columns": (16, 1 << 16),
    "max_k": (1, 1 << 20),
    "device_bytes": (1, 1 << 64),             # base + bytes is checked against this; 2**64 = whole address space
}


@dataclass(frozen=True, kw_only=True)
class NDPConfig:
    """One NDP core. Every field is validated on construction (ValueError names the field and its range).

    * ``macs``: FP16 multiply-accumulate units of the compute unit (PEs); ``lanes`` x ``pe_batch`` = ``macs``:
      FP16 elements per beat (the width of every core-internal data path) and PE rows (GEMM rows computed
      per pass over the operand; a batch ``B > pe_batch`` takes ``ceil(B / pe_batch)`` passes).
    * ``clock_mhz``: core clock.
    * ``input_buffer_bytes``: the input ring (GPU inputs and CHAIN copies of descriptors in flight).
    * ``dram_buffer_bytes``: the DRAM ring (operands read from device memory, ahead of the compute).
    * ``output_buffer_bytes``: the return ring (results on their way back to the GPU).
    * ``state_buffer_bytes`` / ``partial_buffer_bytes``: kept FP16 results / partial sums (accumulator format)
      that survive a descriptor, split evenly into ``state_slots`` slots, one per owner (requester queue).
    * ``acc_columns``: PE accumulator words per bank (row mode: N / lanes virtual columns; TRANS: N columns).
    * ``max_k``: largest contraction K per descriptor (the PE array's x memory per bank).
    * ``sfu_lanes``: width of the softmax SFU (a divisor of ``lanes``: the core feeds it through a gearbox).
    * ``max_batch``: largest GEMM batch (input rows).
    * ``acc``: MAC accumulator format, ``"fp16"`` or ``"fp32"``.
    * ``instr_buffer_depth``: descriptors the instruction buffer holds before the decoder.
    * ``device_bytes``: device memory capacity; ``base_addr + operand bytes`` beyond it is rejected.
    * ``align_bytes``: the memory line (access granule): ``base_addr`` must be a multiple of it, and a STORE
      writes whole lines (its byte size must be a multiple of it).
    * ``gemv_pairs``: one-row TRANS jobs (GEMV) take two A beats per cycle, PE rows 0 and 1 on adjacent columns
      (``hdl.ndp.pe_array.PEMode.TRANS_PAIR``; bit-identical results); needs ``pe_batch >= 2``.
    * ``group_lanes``: W, the segment width of the grouped dataflow (descriptor flag GROUP,
      ``hdl.ndp.pe_array.PEMode.ROW_GROUP``): a beat is ``lanes / W`` segments of W lanes and the rows of a
      GROUP descriptor's input and result are W long, packed ``lanes / W`` to a beat; lane l of a GROUP GEMM
      multiplies the input row of *its own segment*. Decode attention of ``lanes / W`` KV heads of head dim W
      at once (docs/ndp_core.md, "Grouped attention"). 0 (no GROUP), or a power of two with
      ``sfu_lanes <= W <= lanes / 4`` (a SOFTMAX row of ``lanes / 2`` is the half-beat share's).
    * ``group_narrow``: GROUP descriptors may also carry the flag NARROW: segments of W / 2 (``2 lanes / W`` of
      them per beat), chosen per descriptor, so one core runs short shares as tiles of W / 2 tokens of twice the
      heads and long ones (or GQA groups) at W (docs/ndp_core.md, "Narrow tiles"). Needs ``group_lanes`` >= 2 and
      ``sfu_lanes <= W / 2`` (a NARROW SOFTMAX row is W / 2 long).
    * ``sfu_fifo``: depth, in SFU words (``sfu_lanes`` FP16), of a FIFO between the core's input feeder and the
      SFU (0: none, the feeder hands words straight to the SFU). The SFU takes a row only into one of its two row
      slots, so without it the feeder (in order for the PE array and the SFU) waits on the SFU's progress, and the
      next descriptor's PE input behind it; a FIFO of a SOFTMAX's rows lets the feeder move on (docs/ndp_core.md).
    """

    name: str
    macs: int
    clock_mhz: int
    input_buffer_bytes: int
    dram_buffer_bytes: int
    output_buffer_bytes: int
    max_batch: int
    state_buffer_bytes: int = 1024
    partial_buffer_bytes: int = 512
    state_slots: int = 2
    acc_columns: int = 16
    max_k: int = 256
    sfu_lanes: int = 0            # 0: lanes
    acc: str = "fp32"             # design choice: FP32 accumulation of FP16 products (FPMAC acc="fp32")
    instr_buffer_depth: int = 16
    device_bytes: int = 1 << 64
    lanes: int = 0                # 0: macs // pe_batch
    pe_batch: int = 1
    align_bytes: int = 64         # DDR4 burst of one x64 channel: 8 beats x 8 bytes (BL8, JESD79-4)
    gemv_pairs: bool = False
    group_lanes: int = 0          # 0: no grouped dataflow (PEMode.ROW_GROUP, the GROUP flag)
    sfu_fifo: int = 0             # 0: no FIFO in front of the SFU
    group_narrow: bool = False    # GROUP descriptors may also take segments of group_lanes / 2 (flag NARROW)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"NDPConfig: name must be a non-empty str, got {self.name!r}")
        who = f"NDPConfig {self.name!r}"
        if self.lanes == 0 and isinstance(self.macs, int) and isinstance(self.pe_batch, int) and self.pe_batch > 0:
            object.__setattr__(self, "lanes", self.macs // self.pe_batch)
        if self.sfu_lanes == 0 and isinstance(self.lanes, int):
            object.__setattr__(self, "sfu_lanes", self.lanes)
        for f in fields(self):
            if f.name not in _RANGES:
                continue
            value = getattr(self, f.name)
            lo, hi = _RANGES[f.name]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{who}: {f.name} must be an int in {lo}..{hi}, got {value!r}")
        for f in ("lanes", "sfu_lanes", "align_bytes", "state_slots"):
            v = getattr(self, f)
            if v & (v - 1):
                raise ValueError(f"{who}: {f} must be a power of two, got {v}")
        if self.lanes * self.pe_batch != self.macs:
            raise ValueError(f"{who}: lanes ({self.lanes}) x pe_batch ({self.pe_batch}) must equal macs "
                             f"({self.macs})")
        if self.sfu_lanes > self.lanes:
            raise ValueError(f"{who}: sfu_lanes ({self.sfu_lanes}) must divide lanes ({self.lanes})")
        if self.max_batch < self.pe_batch:
            raise ValueError(f"{who}: max_batch ({self.max_batch}) must be >= pe_batch ({self.pe_batch})")
        beat = 2 * self.lanes
        for f in ("input_buffer_bytes", "dram_buffer_bytes", "output_buffer_bytes"):
            if getattr(self, f) % beat or getattr(self, f) % self.align_bytes:
                raise ValueError(f"{who}: {f} must be a multiple of one beat (2 x lanes = {beat} bytes) and of "
                                 f"align_bytes ({self.align_bytes}), got {getattr(self, f)}")
        if self.state_buffer_bytes % (beat * self.state_slots):
            raise ValueError(f"{who}: state_buffer_bytes must be a multiple of state_slots x one beat "
                             f"({self.state_slots * beat}), got {self.state_buffer_bytes}")
        if self.partial_buffer_bytes % (4 * self.state_slots):
            raise ValueError(f"{who}: partial_buffer_bytes must be a multiple of state_slots x 4, got "
                             f"{self.partial_buffer_bytes}")
        if not isinstance(self.gemv_pairs, bool):
            raise ValueError(f"{who}: gemv_pairs must be a bool, got {self.gemv_pairs!r}")
        if self.gemv_pairs and self.pe_batch < 2:
            raise ValueError(f"{who}: gemv_pairs needs pe_batch >= 2 (PE rows 0 and 1), got {self.pe_batch}")
        if self.acc not in ACCUMULATORS:
            raise ValueError(f"{who}: acc must be one of {ACCUMULATORS}, got {self.acc!r}")
        g = self.group_lanes
        if isinstance(g, bool) or not isinstance(g, int) or (g and (g & (g - 1) or not
                                                                   self.sfu_lanes <= g <= self.lanes // 4)):
            raise ValueError(f"{who}: group_lanes must be 0 or a power of two in sfu_lanes "
                             f"({self.sfu_lanes})..lanes / 4 ({self.lanes // 4}), got {g!r}")
        if not isinstance(self.group_narrow, bool):
            raise ValueError(f"{who}: group_narrow must be a bool, got {self.group_narrow!r}")
        if self.group_narrow and not (g >= 2 and self.sfu_lanes <= g // 2):
            raise ValueError(f"{who}: group_narrow needs group_lanes >= 2 and sfu_lanes ({self.sfu_lanes}) <= "
                             f"group_lanes / 2, got group_lanes={g}")

    @property
    def group_segments(self) -> int:
        """Segments of a beat in the grouped dataflow: ``lanes / group_lanes`` (0 without it)."""
        return self.lanes // self.group_lanes if self.group_lanes else 0

    def group_width(self, narrow: bool = False) -> int:
        """Segment width of a GROUP descriptor: ``group_lanes``, or half of it with the flag NARROW
        (``group_narrow``)."""
        if narrow and not self.group_narrow:
            raise ValueError(f"NDPConfig {self.name!r}: NARROW needs group_narrow")
        return self.group_lanes >> int(bool(narrow))

    @property
    def group_widths(self) -> tuple:
        """The segment widths GROUP descriptors may take, widest first (empty without the grouped dataflow)."""
        if not self.group_lanes:
            return ()
        return (self.group_lanes, self.group_lanes // 2) if self.group_narrow else (self.group_lanes,)

    @property
    def peak_flops(self) -> float:
        """Peak FP16 FLOP/s: one multiply and one add per MAC per cycle."""
        return 2.0 * self.macs * self.clock_mhz * 1e6

    @property
    def buffer_bytes(self) -> int:
        """SRAM of the compute-unit buffers together (input, DRAM, output, state, partial)."""
        return (self.input_buffer_bytes + self.dram_buffer_bytes + self.output_buffer_bytes
                + self.state_buffer_bytes + self.partial_buffer_bytes)

    @property
    def acc_bytes(self) -> int:
        """Bytes of one accumulator (the partial buffer's element)."""
        return 4 if self.acc == "fp32" else 2

    @property
    def kept_slot_bytes(self) -> int:
        """Bytes of one owner's kept (FP16) result: state_buffer_bytes / state_slots."""
        return self.state_buffer_bytes // self.state_slots

    @property
    def partial_slot_elems(self) -> int:
        """Accumulator-format elements of one owner's partial: partial_buffer_bytes / state_slots / acc_bytes."""
        return self.partial_buffer_bytes // self.state_slots // self.acc_bytes


#: Small core for tests: the one-channel slice geometry (8 lanes x 2 PE rows) with buffers of a few KB so that
#: "too large" descriptors are easy to build.
TINY = NDPConfig(
    name="tiny",
    macs=16,                       # 8 lanes x 2 PE rows: a GEMM of max_batch 4 takes 2 passes
    lanes=8,                       # 8 FP16 = 16 B per cycle: one LPDDR5X channel's peak (CHANNEL_LANES)
    pe_batch=2,
    clock_mhz=1000,
    input_buffer_bytes=2048,
    dram_buffer_bytes=4096,
    output_buffer_bytes=2048,
    state_buffer_bytes=1024,       # 2 slots x 512 B
    partial_buffer_bytes=512,      # 2 slots x 64 FP32
    state_slots=2,
    acc_columns=16,
    max_k=256,
    sfu_lanes=8,
    max_batch=4,
    acc="fp32",
    instr_buffer_depth=4,
    device_bytes=1 << 24,          # 16 MiB: random base addresses overflow it often
)

#: The paper's NDP core. 1024 FP16 MACs x 2 FLOP x 1 GHz = 2.05 TFLOPS ([PLoRA] IV-B "2 TFLOPS"
#: "1024 FP16 multiply-add units delivering 2048 GFLOPS at 1 GHz"). Geometry (design choice, docs/ndp_core.md):
#: 512 lanes x 2 PE rows, so one A beat is 512 FP16 = 1 KB = one memory clock of the 64-channel LPDDR5X device
#: (1024 B per CK, [issue11]): GEMV (batch 1) consumes two beats per core cycle on the two PE rows (gemv_pairs),
#: so it is bound by the memory, and a batch >= 2 reuses every beat twice, so GEMM of even batch runs at the MAC
#: rate. Buffers: 3 MiB of SRAM in total ([PLoRA] "3 MB
#: of SRAM (input, DRAM and output buffers)"; [issue11] "3 MB of buffers"), split (design choice): DRAM ring
#: 1 MiB (the largest operand a 20-bit byte size describes, 2**20 - 1 bytes), input ring 512 KiB, return ring
#: 512 KiB, kept results 512 KiB and FP32 partials 512 KiB over 4 owner slots. Batch up to 256 ([PLoRA] V-A,
#: "B_i, 0 to 256"); 512 GB device ([PLoRA] IV-B, the CXL-PNM device [60], and the evaluation's "512 GB each").
PAPER = NDPConfig(
    name="paper",
    macs=1024,
    lanes=512,
    pe_batch=2,
    clock_mhz=1000,
    input_buffer_bytes=512 << 10,
    dram_buffer_bytes=1 << 20,
    output_buffer_bytes=512 << 10,
    state_buffer_bytes=512 << 10,
    partial_buffer_bytes=512 << 10,
    state_slots=4,                 # design choice: 4 concurrent requesters keep state without evicting each other
    acc_columns=32,                # design choice: N / lanes <= 32 (row mode), N <= 32 ... see docs/ndp_core.md
    max_k=16384,                   # D up to 14336 ([issue11] item 3) in one descriptor when the operand fits
    sfu_lanes=64,                  # design choice: softmax is < 1 % of the attention MACs (docs/ndp_core.md); 64 =
                                   # group_lanes / 2, so a NARROW tile's softmax row is one SFU word (issue 29)
    max_batch=256,
    acc="fp32",
    instr_buffer_depth=64,         # design choice (not in the paper): one 256 B flit per entry, 16 KiB of SRAM
    device_bytes=512 << 30,
    align_bytes=4096,              # one NDP line of the 64-channel device memory: a 64-byte CXL.mem granule (two
                                   # 32-byte BL16 bursts) of every channel (hdl/memctl/devmem.py)
    gemv_pairs=True,               # design choice ([issue11] item 1: GEMV at >= 95 % of the delivered bandwidth):
                                   # one 1 KiB beat per 1 GHz cycle is 93.75 % of the memory's 1024 B per
                                   # 1066.7 MHz CK, so a GEMV takes two beats per cycle on the two PE rows
    group_lanes=128,               # design choice (issue 29): segments of 128 lanes = the head dim of every model
                                   # the host serves (Llama-2-7B/13B, Llama-3-8B, Qwen: head_dim 128 in their
                                   # config.json, host/models), so a beat holds 4 KV heads; a grouped softmax
                                   # row is two SFU words
    group_narrow=True,             # design choice (issue 29): NARROW tiles of 64 tokens x 8 KV heads for short
                                   # shares (a 64-token share is not padded to 128), chosen per descriptor; the
                                   # 128-lane tiles stay for long shares and GQA groups (docs/ndp_core.md)
    sfu_fifo=32,                   # design choice (issue 29): a grouped SOFTMAX of a GQA group of 4 is 4 x 4 = 16
                                   # rows of two SFU words (docs/ndp_core.md); 32 x 1,024 bits = 4 KiB of flops
)

NDP_PRESETS = {c.name: c for c in (TINY, PAPER)}


def ndp_preset(name: str) -> NDPConfig:
    """The preset called ``name`` (``"tiny"`` or ``"paper"``)."""
    try:
        return NDP_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown NDP preset {name!r}; allowed: {sorted(NDP_PRESETS)}") from None


def slice_preset(channels: int) -> NDPConfig:
    """The exact slice of :data:`PAPER` for ``channels`` LPDDR5X channels (1, 2, 4, ..., 64): the same per-lane
    datapath with ``8 x channels`` lanes, the same 2 PE rows (so the same bytes per MAC), and every buffer, the
    SFU width, the memory line and the device capacity scaled by ``channels / 64``. ``slice_preset(64)`` equals
    PAPER except for its name."""
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1 \
            or channels > PAPER_CHANNELS or channels & (channels - 1):
        raise ValueError(f"channels must be a power of two in 1..{PAPER_CHANNELS}, got {channels!r}")
    f = PAPER_CHANNELS // channels
    lanes = CHANNEL_LANES * channels
    return replace(
        PAPER, name=f"slice{channels}", macs=lanes * PAPER.pe_batch, lanes=lanes,
        input_buffer_bytes=PAPER.input_buffer_bytes // f, dram_buffer_bytes=PAPER.dram_buffer_bytes // f,
        output_buffer_bytes=PAPER.output_buffer_bytes // f, state_buffer_bytes=PAPER.state_buffer_bytes // f,
        partial_buffer_bytes=PAPER.partial_buffer_bytes // f, sfu_lanes=max(1, PAPER.sfu_lanes // f),
        group_lanes=max(1, PAPER.group_lanes // f), align_bytes=PAPER.align_bytes // f, device_bytes=PAPER.device_bytes // f)
