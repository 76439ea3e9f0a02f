"""Datasheet supply currents and voltages of the two DRAMs, per die, each value with its source.

A :class:`Rail` holds one supply's IDD currents (mA) in the JEDEC measurement states; a :class:`PowerSpec` holds
the rails of one die and how many dies a rank of the ``hdl.memctl.timing`` organisation charges. The energy
method that reads them is :mod:`sim.energy.dram` (DRAMPower's), the outside check :mod:`sim.energy.reference`.

Sources (docs/energy.md lists them with the assumptions):

* [MT40A1G8] Micron 8Gb DDR4 SDRAM (MT40A1G8, x8) datasheet, IDD/IPP current limits table, DDR4-3200 column,
  as transcribed in DRAMsim3's configs/DDR4_8Gb_x8_3200.ini (umd-memsys/DRAMsim3: IDD0 57, IPP0 3.0, IDD2P 25,
  IDD2N 37, IDD3P 43, IDD3N 52, IDD4W 150, IDD4R 168, IDD5AB 250 mA). We did not re-read the PDF itself.
* [JESD79-4] JEDEC DDR4: VDD = 1.2 V, VPP = 2.5 V.
* [Y52P] Micron LPDDR5X SDRAM Y52P, MT62F1G32D2 family (315b/441b/561b/563b y52p sdp-ddp-qdp-8dp lpddr5x,
  Rev. H 03/2025), 16 Gb die, Table 18 "WT IDD Parameters - Single Die", x16 mode, 7500 Mb/s column, maxima
  over process/temperature/voltage, BG mode, DVFSC/DVFSQ disabled, BL16: VDD2H IDD02H 53, IDD2N2H 32.5,
  IDD3N2H 40, IDD4R2H 390, IDD4W2H 265, IDD52H 205, IDD2P2H 3.9; VDD1 IDD01 3.8, IDD2N1 1.5, IDD3N1 2.8,
  IDD4R1 18.0, IDD4W1 16.5; VDDQ IDD3NQ 0.6, IDD4RQ 111.9 (typical), IDD4WQ 0.6 mA; rails (p.1) VDD1 1.80 V,
  VDD2H 1.05 V, VDDQ 0.50 V. Read from a public transcription of the sheet (not the PDF itself).

ASSUMPTIONS (no public figure in the sources above; each is labelled where it is used):

* [A-IPP] DDR4 VPP: only IPP0 is in [MT40A1G8]'s transcription; IPP in every other state is taken as 0, as
  DRAMPower's own DDR4 memspec does (tukl-msd/DRAMPower memspecs/MICRON_4Gb_DDR4-2400_8bit_A.json gives only
  ipp0 and ipp6). VPP is then charged to ACT/PRE only (VPP x IPP0 x tRC per activation): an upper bound for the
  activation's VPP share and none in standby, read, write or refresh.
* [A-IDD51] LPDDR5X VDD1 refresh current: not in [Y52P]'s transcription; taken = IDD01 (a refresh is a burst of
  row activations).
* [A-Q] LPDDR5X VDDQ in the activate/precharge/refresh states: not given; taken = IDD3NQ (0.6 mA), so VDDQ
  adds only standby and the read/write increments.
* [A-RATE] LPDDR5X burst currents are for 7500 Mb/s; at 8533 Mb/s the burst excess (IDD4 - IDD3N) is scaled by
  8533/7500 (constant energy per bit); standby, activate and refresh currents are rate-independent as given.
* [A-X16] The rank of two byte-mode x8 dies (hdl.memctl.timing LPDDR5X_8533_ORG) is charged as ONE x16-mode die
  of [Y52P]: it opens the same 2 KB page and moves the same 32 B per BL16 burst per command. The second die's
  standby and refresh are not charged (standby and refresh energy low by up to 2x; access energy as measured).
* Power-down (IDD2P/IDD3P) currents are listed but unused: the controller never powers a rank down.
"""

from dataclasses import dataclass, field

__all__ = ["Rail", "PowerSpec", "DDR4_3200_8GB_X8", "LPDDR5X_8533_16GB", "POWER_SPECS", "power_spec"]


@dataclass(frozen=True, kw_only=True)
class Rail:
    """One supply of one die: its voltage and the JEDEC IDD measurement currents drawn from it, in mA."""

    name: str
    volts: float
    idd0: float    # one bank ACT-PRE loop at tRC
    idd2n: float   # precharge standby (all banks closed)
    idd3n: float   # active standby (a bank open)
    idd4r: float   # burst reads
    idd4w: float   # burst writes
    idd5b: float   # all-bank refresh at tRFC
    idd2p: float = 0.0  # precharge power-down (unused: no power-down)
    idd3p: float = 0.0  # active power-down (unused)

    def __post_init__(self):
        for f in ("volts", "idd0", "idd2n", "idd3n", "idd4r", "idd4w", "idd5b", "idd2p", "idd3p"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"Rail {self.name!r}: {f} must be a number >= 0, got {v!r}")


@dataclass(frozen=True, kw_only=True)
class PowerSpec:
    """The rails of one die and the dies charged per rank (see each preset's comments)."""

    name: str
    rails: tuple
    dies_per_rank: int
    sources: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if not self.rails or not all(isinstance(r, Rail) for r in self.rails):
            raise ValueError(f"PowerSpec {self.name!r}: rails must be a non-empty tuple of Rail")
        if not isinstance(self.dies_per_rank, int) or self.dies_per_rank < 1:
            raise ValueError(f"PowerSpec {self.name!r}: dies_per_rank must be an int >= 1")

    def scaled(self, factor: float, current: str) -> "PowerSpec":
        """This spec with one current multiplied on every rail (for tests and sensitivity)."""
        from dataclasses import replace
        return replace(self, rails=tuple(replace(r, **{current: getattr(r, current) * factor})
                                         for r in self.rails))


DDR4_3200_8GB_X8 = PowerSpec(
    name="ddr4-3200",
    rails=(
        Rail(name="VDD", volts=1.2,   # [JESD79-4]
             idd0=57.0, idd2n=37.0, idd3n=52.0, idd4r=168.0, idd4w=150.0, idd5b=250.0,  # [MT40A1G8] DDR4-3200 x8
             idd2p=25.0, idd3p=43.0),  # [MT40A1G8]
        Rail(name="VPP", volts=2.5,   # [JESD79-4]
             idd0=3.0,                 # [MT40A1G8] IPP0
             idd2n=0.0, idd3n=0.0, idd4r=0.0, idd4w=0.0, idd5b=0.0),  # [A-IPP]
    ),
    dies_per_rank=8,  # hdl.memctl.timing DDR4_3200_ORG: 8 x8 devices per rank, every one sees every command
    sources={"currents": "Micron MT40A1G8 8Gb DDR4 datasheet, DDR4-3200 x8 (via DRAMsim3 DDR4_8Gb_x8_3200.ini)",
             "voltages": "JEDEC JESD79-4", "assumptions": "A-IPP"},
)

_LP5X_RATE = 8533 / 7500  # [A-RATE]: the sheet's 7500 Mb/s column scaled to 8533 Mb/s


def _burst(idd4: float, idd3n: float) -> float:
    return idd3n + (idd4 - idd3n) * _LP5X_RATE  # [A-RATE]


LPDDR5X_8533_16GB = PowerSpec(
    name="lpddr5x-8533",
    rails=(
        Rail(name="VDD1", volts=1.8,  # [Y52P] p.1
             idd0=3.8, idd2n=1.5, idd3n=2.8,                        # [Y52P] T18
             idd4r=_burst(18.0, 2.8), idd4w=_burst(16.5, 2.8),       # [Y52P] T18, [A-RATE]
             idd5b=3.8),                                              # [A-IDD51]
        Rail(name="VDD2H", volts=1.05,  # [Y52P] p.1
             idd0=53.0, idd2n=32.5, idd3n=40.0,                      # [Y52P] T18
             idd4r=_burst(390.0, 40.0), idd4w=_burst(265.0, 40.0),   # [Y52P] T18, [A-RATE]
             idd5b=205.0, idd2p=3.9),                                 # [Y52P] T18 (IDD52H all-bank refresh)
        Rail(name="VDDQ", volts=0.5,  # [Y52P] p.1
             idd0=0.6, idd2n=0.6, idd5b=0.6,                          # [A-Q]
             idd3n=0.6, idd4r=_burst(111.9, 0.6), idd4w=0.6),         # [Y52P] T18 (IDD4RQ typical), [A-RATE]
    ),
    dies_per_rank=1,  # [A-X16]
    sources={"currents": "Micron LPDDR5X Y52P (MT62F1G32D2 family) Rev. H, Table 18, x16, 7500 Mb/s",
             "voltages": "Micron Y52P p.1", "assumptions": "A-IDD51, A-Q, A-RATE, A-X16"},
)

POWER_SPECS = {"ddr4-3200": DDR4_3200_8GB_X8, "lpddr5x-8533": LPDDR5X_8533_16GB}


def power_spec(config) -> PowerSpec:
    """The spec of a ``hdl.memctl.timing.DRAMConfig`` (its TINY variants share the full device's currents)."""
    name = config.timing.name
    try:
        return POWER_SPECS[name]
    except KeyError:
        raise ValueError(f"no power spec for DRAM timing {name!r}; known: {sorted(POWER_SPECS)}") from None
