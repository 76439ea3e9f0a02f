"""Configuration of one DIMM-PIM channel ([L3] 4; docs/references.md): a frozen, validated dataclass.

Sources:

* [L3]      (docs/references.md) Table 2 ("DIMM / DIMM-PIM: DDR4-3200, 2 Ranks x 4 Bank Groups x 4 Banks", "16 Channels x
            2 DIMM", "406GB/s (CPU)"), Table 3 ("Head Embedding D_h = 128", "N_pre = 2 (16-bit floating point)"),
            section 4.4 ("the bank row buffer provides 64-bit data for one RD ... four multipliers ... the shared
            buffer also broadcasts 64-bit data", "a 256KB buffer ... about a token size of 128K", "up to 8 REF
            commands can be delayed"), section 6.1 set-up facts ("adder unit of eight FP16 adders", "softmax unit
            pipelined over chunks of sixteen FP16 elements (one per logic bank)", "re-layout unit works on two
            64-bit bursts").
* [JESD79-4] DDR4: x8 devices, BL8, refresh postponement of up to 8 REF commands (tREFI x 9 window).
* DRAM timing and organisation: :mod:`hdl.memctl.timing` (DDR4_3200 carries its own per-field sources).

Geometry derived from the DRAM organisation (``dram.org``):

* ``chips`` = ``org.devices_per_rank`` x8 devices per rank; each bank of each chip has a bank PU.
* ``chip_burst_bits`` = ``device_width * burst_length`` = 64 bits per chip per RD (4 FP16 elements).
* ``banks`` = ``org.banks`` logic banks (the same bank index across the chips of a rank); a softmax chunk holds
  one score per logic bank.
* ``elems_per_chip`` = ``head_dim / chips`` elements of every K / V vector live in one chip (after re-layout).
"""

from dataclasses import dataclass, replace

from hdl.memctl.timing import DRAMConfig, DRAMOrg, DDR4_3200, DDR4_3200_TIMING

__all__ = ["PIMConfig", "PAPER", "TINY", "PIM_PRESETS", "pim_preset", "CONTEXT_ACCUMULATORS"]

FP16_BITS = 16
#: Bank-PU context accumulator formats (PIMConfig.context_acc).
CONTEXT_ACCUMULATORS = ("fp16", "fp32")


@dataclass(frozen=True, kw_only=True)
class PIMConfig:
    """One DIMM-PIM channel: its DRAM (timing + organisation) and the PU parameters. Validated on construction."""

    name: str
    dram: DRAMConfig
    head_dim: int = 128               # [L3] Table 3: D_h = D_e / N_h = 128
    bank_pu_multipliers: int = 4      # [L3] 4.4: 64-bit row-buffer word / 16-bit elements = 4 multipliers
    bank_pu_adders: int = 4           # [L3] 6.1 set-up: "Bank PU: four multipliers and four adders"
    rank_adders: int = 8              # [L3] 6.1 set-up: "adder unit of eight FP16 adders"
    rank_buffer_bytes: int = 256 << 10  # [L3] 4.4: "a 256KB buffer is leveraged" (one FP16 per token: 128K)
    max_postponed_refresh: int = 8    # [L3] 4.4 / [JESD79-4]: up to 8 REF commands may be postponed
    relayout_beats: int = 2           # [L3] 6.1 set-up: "re-layout unit works on two 64-bit bursts"
    relayout_latency: int = 1         # one command-clock register stage in the buffer chip's write-data path;
    #                                   [L3] 4.1 "the provided [tWL] value is smaller (e.g., one cycle)"
    context_acc: str = "fp16"         # bank-PU context accumulators: "fp16" ([L3] Table 3: N_pre = 2, 16-bit
    #                                   floating point throughout; the default) or "fp32" (design option: exact
    #                                   FP16 x FP16 products summed in binary32, rounded to FP16 once per job;
    #                                   docs/pim_bank_pu.md "FP32 context accumulators")

    def __post_init__(self):
        org = self.dram.org
        checks = [
            ("dram.org.device_width", org.device_width, (8, 8), "the re-layout maps one FP16 element to one x8 chip"),
            ("dram.org.devices_per_rank", org.devices_per_rank, (1, 64), ""),
            ("head_dim", self.head_dim, (1, 1 << 12), ""),
            ("bank_pu_multipliers", self.bank_pu_multipliers, (1, 64), ""),
            ("bank_pu_adders", self.bank_pu_adders, (1, 64), ""),
            ("rank_adders", self.rank_adders, (1, 64), ""),
            ("rank_buffer_bytes", self.rank_buffer_bytes, (2, 1 << 32), ""),
            ("max_postponed_refresh", self.max_postponed_refresh, (0, 8), "JESD79-4 allows at most 8"),
            ("relayout_latency", self.relayout_latency, (1, 4), ""),
        ]
        if self.context_acc not in CONTEXT_ACCUMULATORS:
            raise ValueError(f"PIMConfig {self.name!r}: context_acc = {self.context_acc!r} must be one of "
                             f"{CONTEXT_ACCUMULATORS}")
        for name, value, (lo, hi), why in checks:
            if not lo <= value <= hi:
                raise ValueError(f"PIMConfig {self.name!r}: {name} = {value} outside [{lo}, {hi}]"
                                 + (f" ({why})" if why else ""))
        if self.chip_burst_bits != self.bank_pu_multipliers * FP16_BITS:
            raise ValueError(f"PIMConfig {self.name!r}: bank_pu_multipliers = {self.bank_pu_multipliers} must equal "
                             f"the chip burst ({self.chip_burst_bits} bits) / 16 = {self.chip_burst_bits // 16}")
        if self.head_dim % (self.chips * self.elems_per_burst):
            raise ValueError(f"PIMConfig {self.name!r}: head_dim = {self.head_dim} must be a multiple of chips x "
                             f"elements per burst = {self.chips * self.elems_per_burst}")
        if self.banks % self.bursts_per_token:
            raise ValueError(f"PIMConfig {self.name!r}: banks = {self.banks} must be a multiple of the bursts per "
                             f"token per chip = {self.bursts_per_token} (context mapping, section 4.2)")
        if self.token_sets > self.elems_per_burst:
            raise ValueError(f"PIMConfig {self.name!r}: token sets = banks / bursts per token = {self.token_sets} "
                             f"exceeds the {self.elems_per_burst} probabilities one 64-bit broadcast carries "
                             f"(head_dim must be >= {self.banks * self.chips} for this organisation)")
        if self.rank_adders < self.chips:
            # the score tree needs chips - 1 adders, but the final context aggregation (the adder unit's
            # accumulator mode, hdl/pim/adder_unit.py) adds lane c = chip c on adder c: one adder per chip
            raise ValueError(f"PIMConfig {self.name!r}: rank_adders = {self.rank_adders} < chips = "
                             f"{self.chips} (the adder unit's accumulator mode adds each chip's context lane "
                             f"on its own adder)")

    # -- derived geometry ---------------------------------------------------------------------------------------
    @property
    def chips(self) -> int:
        return self.dram.org.devices_per_rank

    @property
    def banks(self) -> int:
        return self.dram.org.banks

    @property
    def ranks(self) -> int:
        return self.dram.org.ranks

    @property
    def chip_burst_bits(self) -> int:
        return self.dram.org.device_width * self.dram.org.burst_length

    @property
    def elems_per_burst(self) -> int:
        """FP16 elements one chip delivers per RD (4 for x8 BL8)."""
        return self.chip_burst_bits // FP16_BITS

    @property
    def elems_per_chip(self) -> int:
        """Elements of one K / V vector held by one chip."""
        return self.head_dim // self.chips

    @property
    def bursts_per_token(self) -> int:
        """Bursts (columns) one token's K (or V) slice occupies in one chip."""
        return self.elems_per_chip // self.elems_per_burst

    @property
    def token_sets(self) -> int:
        """Context mapping: tokens read in parallel per all-bank RD (banks / bursts_per_token)."""
        return self.banks // self.bursts_per_token

    @property
    def chunk(self) -> int:
        """Scores per softmax chunk: one per logic bank [L3 6.1]."""
        return self.banks

    @property
    def columns_per_row(self) -> int:
        """Bursts per bank row (1 KB page / 8 bytes = 128 for DDR4 x8)."""
        return self.dram.org.bursts_per_row

    @property
    def max_tokens(self) -> int:
        """Tokens whose exponentials fit the rank PU buffer (one FP16 each)."""
        return self.rank_buffer_bytes * 8 // FP16_BITS


#: The paper's channel: DDR4-3200, x8, 8 chips per rank, 2 ranks x 4 BG x 4 banks [L3 Table 2]; head dim 128.
PAPER = PIMConfig(name="paper", dram=DDR4_3200)

#: A channel small enough for the Amaranth simulator: 2 x8 chips per rank (a 16-bit rank), 4 BG x 4 banks (so a
#: chunk is still 16 scores), 16 rows x 32 bursts per bank, head dim 32 (16 elements = 4 bursts per chip: the
#: per-chip geometry of PAPER, with 2 chips instead of 8), a 4 KiB rank buffer. Same DDR4-3200 timing as PAPER.
TINY = PIMConfig(
    name="tiny",
    dram=DRAMConfig(
        name="ddr4-3200-pim-tiny",
        org=DRAMOrg(name="ddr4-3200-pim-tiny", channels=1, ranks=2, bank_groups=4, banks_per_group=4, rows=16,
                    columns=256, device_width=8, devices_per_rank=2, burst_length=8, beats_per_clock=2),
        timing=DDR4_3200_TIMING),
    head_dim=32,
    rank_buffer_bytes=4 << 10,
)

PIM_PRESETS = {c.name: c for c in (PAPER, TINY)}


def pim_preset(name: str) -> PIMConfig:
    try:
        return PIM_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown PIM preset {name!r}; choose one of {sorted(PIM_PRESETS)}") from None
