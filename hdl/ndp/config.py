"""Configuration of one PLoRA near-data-processing (NDP) core: a frozen, validated dataclass with presets.

Sources used below:

* [PLoRA]   /work/shared/papers/plora.txt. Section IV-B (line ~86): "the instruction buffer holds instructions until
            they issue ... The Compute Unit holds an input buffer for GPU data, a DRAM buffer for device-resident
            data, and an output buffer ... We follow Samsung's HPCA'24 CXL-PNM device [60], with 1.1 TB/s
            bandwidth, 512 GB capacity, and 4.9 TFLOPS, while our NDP cores use 2 TFLOPS". Evaluation set-up
            (line ~177): "NDP core synthesized in Verilog: 3 MB of SRAM (input, DRAM and output buffers) and 1024
            FP16 multiply-add units delivering 2048 GFLOPS at 1 GHz"; device-count sweep "of 512 GB each".
            Section V-A (line ~108): "the per-adapter batch size B_i, 0 to 256".
* [issue]   The project issue for the NDP core: 1024 FP16 MACs at 1 GHz, 3 MB *each* of input, DRAM and output
            buffer. (The paper's line ~177 can also be read as 3 MB in total; see PAPER below.)
"""

from dataclasses import dataclass, fields

__all__ = ["NDPConfig", "ACCUMULATORS", "TINY", "PAPER", "NDP_PRESETS", "ndp_preset"]

#: Accumulator formats of the FP16 MACs (the names of :class:`hdl.fp.FPMAC`'s ``acc`` parameter).
ACCUMULATORS = ("fp16", "fp32")

# Ranges accepted by NDPConfig, field -> (min, max) inclusive.
_RANGES = {
    "macs": (1, 1 << 16),
    "clock_mhz": (1, 10_000),
    "input_buffer_bytes": (64, 1 << 32),
    "dram_buffer_bytes": (64, 1 << 32),
    "output_buffer_bytes": (64, 1 << 32),
    "max_batch": (1, (1 << 20) - 1),          # a batch is a 20-bit descriptor dimension (input dim0)
    "instr_buffer_depth": (2, 1024),
    "lanes": (1, 1 << 12),
    "pe_batch": (1, 1 << 10),
    "align_bytes": (2, 1 << 12),
    "device_bytes": (1, 1 << 64),             # base + bytes is checked against this; 2**64 = whole address space
}


@dataclass(frozen=True, kw_only=True)
class NDPConfig:
    """One NDP core. Every field is validated on construction (ValueError names the field and its range).

    * ``macs``: FP16 multiply-accumulate units of the compute unit (PEs).
    * ``clock_mhz``: core clock.
    * ``input_buffer_bytes`` / ``dram_buffer_bytes`` / ``output_buffer_bytes``: the compute unit's three SRAM
      buffers (GPU-supplied input, device-resident operand, results). A descriptor whose input / operand /
      result does not fit its buffer is rejected by the decoder.
    * ``max_batch``: largest GEMM batch (input rows; a GEMM is a batch of GEMVs sharing the operand).
    * ``acc``: MAC accumulator format, ``"fp16"`` or ``"fp32"``.
    * ``instr_buffer_depth``: descriptors the instruction buffer holds before the decoder.
    * ``device_bytes``: device memory capacity; ``base_addr + operand bytes`` beyond it is rejected.
    * ``lanes`` x ``pe_batch`` = ``macs``: geometry of the PE array (:class:`hdl.ndp.pe_array.PEArray`): FP16
      elements per beat (the width of every core-internal data path) and PE rows (GEMM rows computed per pass
      over the operand; a batch ``B > pe_batch`` takes ``ceil(B / pe_batch)`` passes). GEMV/GEMM operand
      dimensions and softmax lengths must be multiples of ``lanes``.
    * ``align_bytes``: the memory burst (access granule): ``base_addr`` must be a multiple of it, and a STORE
      writes whole bursts (its byte size must be a multiple of it).
    """

    name: str
    macs: int
    clock_mhz: int
    input_buffer_bytes: int
    dram_buffer_bytes: int
    output_buffer_bytes: int
    max_batch: int
    acc: str = "fp32"             # design choice: FP32 accumulation of FP16 products (FPMAC acc="fp32")
    instr_buffer_depth: int = 16
    device_bytes: int = 1 << 64
    lanes: int = 0                # 0: macs // pe_batch
    pe_batch: int = 1
    align_bytes: int = 64         # DDR4/LPDDR5X burst of one x64 channel: 8 beats x 8 bytes (BL8, JESD79-4)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"NDPConfig: name must be a non-empty str, got {self.name!r}")
        who = f"NDPConfig {self.name!r}"
        if self.lanes == 0 and isinstance(self.macs, int) and isinstance(self.pe_batch, int) and self.pe_batch > 0:
            object.__setattr__(self, "lanes", self.macs // self.pe_batch)
        for f in fields(self):
            if f.name not in _RANGES:
                continue
            value = getattr(self, f.name)
            lo, hi = _RANGES[f.name]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{who}: {f.name} must be an int in {lo}..{hi}, got {value!r}")
        for f in ("lanes", "align_bytes"):
            v = getattr(self, f)
            if v & (v - 1):
                raise ValueError(f"{who}: {f} must be a power of two, got {v}")
        if self.lanes * self.pe_batch != self.macs:
            raise ValueError(f"{who}: lanes ({self.lanes}) x pe_batch ({self.pe_batch}) must equal macs "
                             f"({self.macs})")
        if self.max_batch < self.pe_batch:
            raise ValueError(f"{who}: max_batch ({self.max_batch}) must be >= pe_batch ({self.pe_batch})")
        for f in ("input_buffer_bytes", "dram_buffer_bytes", "output_buffer_bytes"):
            if getattr(self, f) % (2 * self.lanes):
                raise ValueError(f"{who}: {f} must be a multiple of one beat (2 x lanes = {2 * self.lanes} "
                                 f"bytes), got {getattr(self, f)}")
        if self.acc not in ACCUMULATORS:
            raise ValueError(f"{who}: acc must be one of {ACCUMULATORS}, got {self.acc!r}")

    @property
    def peak_flops(self) -> float:
        """Peak FP16 FLOP/s: one multiply and one add per MAC per cycle."""
        return 2.0 * self.macs * self.clock_mhz * 1e6

    @property
    def buffer_bytes(self) -> int:
        """SRAM of the three compute-unit buffers together."""
        return self.input_buffer_bytes + self.dram_buffer_bytes + self.output_buffer_bytes


#: Small core for tests: buffers of a few KB so that "too large" descriptors are easy to build.
TINY = NDPConfig(
    name="tiny",
    macs=16,                       # 8 lanes x 2 PE rows: a GEMM of max_batch 4 takes 2 passes
    lanes=8,                       # 8 FP16 = 16 B per cycle = one 64 B DDR4 burst per 4 cycles (BL8, tCCD_S 4)
    pe_batch=2,
    clock_mhz=1000,
    input_buffer_bytes=2048,
    dram_buffer_bytes=4096,
    output_buffer_bytes=2048,
    max_batch=4,
    acc="fp32",
    instr_buffer_depth=4,
    device_bytes=1 << 24,          # 16 MiB: random base addresses overflow it often
)

#: The paper's NDP core: 1024 FP16 MACs x 2 FLOP x 1 GHz = 2.05 TFLOPS ([PLoRA] IV-B "2 TFLOPS", line ~177
#: "1024 FP16 multiply-add units delivering 2048 GFLOPS at 1 GHz"); 3 MiB each of input, DRAM and output buffer
#: ([issue]; [PLoRA] line ~177 "3 MB of SRAM (input, DRAM and output buffers)" could also mean 1 MiB each --
#: either way every buffer holds the largest operand a 20-bit byte size can describe, 2**20 - 1 bytes);
#: GEMM batch up to 256 ([PLoRA] V-A, "B_i, 0 to 256"); 512 GB device ([PLoRA] IV-B, the CXL-PNM device [60],
#: and the evaluation's "512 GB each").
PAPER = NDPConfig(
    name="paper",
    macs=1024,
    lanes=64,                      # design choice (the paper gives only the MAC count): 64 lanes x 16 PE rows;
    pe_batch=16,                   # K, N multiples of 64 (LoRA ranks 64 and 128 directly). See docs/ndp_core.md
    clock_mhz=1000,
    input_buffer_bytes=3 << 20,
    dram_buffer_bytes=3 << 20,
    output_buffer_bytes=3 << 20,
    max_batch=256,
    acc="fp32",
    instr_buffer_depth=64,         # design choice (not in the paper): one 256 B flit per entry, 16 KiB of SRAM
    device_bytes=512 << 30,
)

NDP_PRESETS = {c.name: c for c in (TINY, PAPER)}


def ndp_preset(name: str) -> NDPConfig:
    """The preset called ``name`` (``"tiny"`` or ``"paper"``)."""
    try:
        return NDP_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown NDP preset {name!r}; allowed: {sorted(NDP_PRESETS)}") from None
