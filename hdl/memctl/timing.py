"""DRAM organisation and timing parameter sets (frozen, validated), with named presets.

All timing values are integer clock cycles (nCK) of the device's command clock ``tck_ps``. Each value carries
its source in a comment. Values given by a standard in nanoseconds are converted with :func:`_nck`, the JEDEC
rule nCK = ceil(t / tCK) (minimum constraints) -- except the refresh interval tREFI, a *maximum* average
interval, which is rounded down so that refreshing every tREFI cycles never falls behind the standard.

Sources used below:

* [L3]      The L3 paper's simulator set-up ([L3] in docs/references.md), Table 2 ("DIMM / DIMM-PIM: DDR4-3200",
            "BL=4:CCD=4:RRD=4/8:RCD=22:RAS=52:RP=22:RC=74:CL=22:WL=16:CDLR=4/12:WR=24:CCDL=8:RTP=12").
* [JESD79-4] JEDEC JESD79-4 DDR4 SDRAM: speed-bin table DDR4-3200AA (22-22-22), timing-parameter table
            (tRRD_S/L, tFAW per page size, tWTR_S/L, tWR, tRTP), refresh table (tREFI, tRFC1 per density).
* [JESD209-5B] JEDEC JESD209-5B LPDDR5/LPDDR5X: AC timing table (tRCD, tRPab, tRPpb, tRAS, tRRD, tFAW, tWR,
            tWTR_S/L, tRBTP, tCCD in BG mode), RL/WL tables, refresh table (tREFIab, tRFCab per density).
* [Ramulator2] CMU-SAFARI/ramulator2 src/dram/impl/DDR4.cpp (preset "DDR4_3200AA": nCL=nRCD=nRP=22, nRAS=52,
            nRC=74, nWR=24, nRTP=12, nCWL=16, nCCDS=4, nCCDL=8, nWTRS=4, nWTRL=12, x8 nRRDS=4, nRRDL=8, nFAW=34,
            nCS=2) and src/dram/impl/LPDDR5.cpp (tRFCab 16 Gb = 280 ns, tREFI = 3906 ns, nCS = 2,
            RD->WR = nCL + nBL + 2 - nCWL).
* [gem5]    gem5 src/python/gem5/components/memory/dram_interfaces/lpddr5.py, LPDDR5_6400_1x16_BG_BL16
            (BG mode BL16: burst 2 CK, tCCD_L 4 CK; "greater of" rules for tRCD/tRP/tRAS/tWR/tWTR/tRRD;
            tFAW 20 ns in BG mode; tCS = 2 CK; beats_per_clock = 8 at WCK:CK = 4:1).
"""

from dataclasses import dataclass, fields
from typing import NamedTuple

__all__ = [
    "DRAMOrg", "DRAMTiming", "DRAMConfig", "PRESETS", "preset",
    "DDR4_3200", "DDR4_3200_TINY", "LPDDR5X_8533", "LPDDR5X_8533_TINY",
    "PeakBandwidth", "peak_bandwidth_gbps", "refresh_efficiency",
]


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def _check_int(owner: str, name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{owner}: {name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value}")


@dataclass(frozen=True, kw_only=True)
class DRAMOrg:
    """Organisation of one channel."""

    name: str
    channels: int          # channels of the whole memory system
    ranks: int             # ranks per channel
    bank_groups: int       # bank groups per rank
    banks_per_group: int
    rows: int              # rows per bank
    columns: int           # column addresses per row of one device
    device_width: int      # DQ bits per device (x8 -> 8)
    devices_per_rank: int  # devices that together drive the channel's DQ bus
    burst_length: int      # beats per burst (BL8, BL16)
    beats_per_clock: int   # DQ beats per command clock (2 for DDR4; 8 for LPDDR5 with WCK:CK = 4:1)

    def __post_init__(self):
        who = f"DRAMOrg {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DRAMOrg: name must be a non-empty str, got {self.name!r}")
        for f in fields(self):
            if f.name != "name":
                _check_int(who, f.name, getattr(self, f.name), 1)
        # Addressing splits a flat address into bit fields: these counts must be powers of two.
        for name in ("ranks", "bank_groups", "banks_per_group", "rows", "columns", "burst_length"):
            v = getattr(self, name)
            if not _is_pow2(v):
                raise ValueError(f"{who}: {name} must be a power of two, got {v}")
        if self.columns % self.burst_length:
            raise ValueError(f"{who}: columns ({self.columns}) not divisible by burst_length ({self.burst_length})")
        if self.burst_length % self.beats_per_clock:
            raise ValueError(f"{who}: burst_length ({self.burst_length}) not divisible by "
                             f"beats_per_clock ({self.beats_per_clock})")

    @property
    def banks(self) -> int:
        return self.bank_groups * self.banks_per_group

    @property
    def bus_width(self) -> int:
        return self.device_width * self.devices_per_rank

    @property
    def burst_bits(self) -> int:
        return self.bus_width * self.burst_length

    @property
    def burst_bytes(self) -> int:
        return self.burst_bits // 8

    @property
    def bursts_per_row(self) -> int:
        return self.columns // self.burst_length

    @property
    def burst_cycles(self) -> int:
        """Command-clock cycles one burst occupies the DQ bus."""
        return self.burst_length // self.beats_per_clock

    @property
    def clock_bits(self) -> int:
        """DQ bits transferred per command clock."""
        return self.bus_width * self.beats_per_clock

    @property
    def row_bytes(self) -> int:
        """Bytes of one row across the rank (the page size of one device times devices_per_rank)."""
        return self.columns * self.bus_width // 8

    @property
    def channel_bytes(self) -> int:
        """Capacity of one channel in bytes."""
        return self.ranks * self.banks * self.rows * self.row_bytes

    @property
    def system_bytes(self) -> int:
        """Capacity of all channels in bytes."""
        return self.channels * self.channel_bytes


@dataclass(frozen=True, kw_only=True)
class DRAMTiming:
    """JEDEC timing constraints in command-clock cycles."""

    name: str
    tck_ps: int
    CL: int       # RD to first read data
    CWL: int      # WR to first write data
    tRCD: int     # ACT to RD/WR, same bank
    tRP: int      # PRE to ACT, same bank (also PREA unless tRPab is given)
    tRAS: int     # ACT to PRE, same bank
    tRC: int      # ACT to ACT, same bank
    tCCD_S: int   # column to column, different bank group
    tCCD_L: int   # column to column, same bank group
    tRRD_S: int   # ACT to ACT, different bank group, same rank
    tRRD_L: int   # ACT to ACT, same bank group
    tFAW: int     # window holding at most four ACTs per rank
    tWTR_S: int   # end of write data to RD, different bank group
    tWTR_L: int   # end of write data to RD, same bank group
    tWR: int      # end of write data to PRE
    tRTP: int     # RD to PRE
    tREFI: int    # average refresh interval
    tRFC: int     # REF to any command of the rank
    tRTRS: int    # rank-to-rank switch on the DQ bus: idle cycles between bursts of different ranks
    # Added by the timing owner (defaults keep older constructors working):
    tRPab: int | None = None  # PREA to ACT/REF (all-bank precharge); None -> same as tRP (DDR4)
    tRTW: int = 2             # same-rank read-to-write DQ bubble: idle cycles between the end of read data and
    #                           the start of write data (JESD79-4 RD->WR = CL + BL/2 - CWL + 2 nCK; [Ramulator2]
    #                           DDR4 and LPDDR5 both use "+ 2")

    _POSITIVE = ("tck_ps", "CL", "CWL", "tRCD", "tRP", "tRAS", "tRC", "tCCD_S", "tCCD_L", "tRRD_S", "tRRD_L",
                 "tFAW", "tWTR_S", "tWTR_L", "tWR", "tRTP", "tREFI", "tRFC", "tRPab")
    _NON_NEGATIVE = ("tRTRS", "tRTW")  # bus bubbles may legitimately be 0

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DRAMTiming: name must be a non-empty str, got {self.name!r}")
        if self.tRPab is None:
            object.__setattr__(self, "tRPab", self.tRP)
        who = f"DRAMTiming {self.name!r}"
        for name in self._POSITIVE:
            _check_int(who, name, getattr(self, name), 1)
        for name in self._NON_NEGATIVE:
            _check_int(who, name, getattr(self, name), 0)
        # Consistency constraints implied by the JEDEC definitions.
        if self.tRC < self.tRAS + self.tRP:
            raise ValueError(f"{who}: tRC ({self.tRC}) < tRAS ({self.tRAS}) + tRP ({self.tRP})")
        if self.tRPab < self.tRP:
            raise ValueError(f"{who}: tRPab ({self.tRPab}) < tRP ({self.tRP})")
        if self.tCCD_L < self.tCCD_S:
            raise ValueError(f"{who}: tCCD_L ({self.tCCD_L}) < tCCD_S ({self.tCCD_S})")
        if self.tRRD_L < self.tRRD_S:
            raise ValueError(f"{who}: tRRD_L ({self.tRRD_L}) < tRRD_S ({self.tRRD_S})")
        if self.tWTR_L < self.tWTR_S:
            raise ValueError(f"{who}: tWTR_L ({self.tWTR_L}) < tWTR_S ({self.tWTR_S})")
        if self.tREFI <= self.tRFC:
            raise ValueError(f"{who}: tREFI ({self.tREFI}) <= tRFC ({self.tRFC})")
        # Deliberately NOT checked: tFAW >= 4 * tRRD_S. JEDEC does not imply it -- when it fails, tFAW simply
        # never binds. LPDDR5X-8533 is a real case: tFAW = 20 ns = 4 x tRRD (5 ns), but after rounding each to
        # nCK, tFAW = 22 < 4 * 6.


@dataclass(frozen=True, kw_only=True)
class DRAMConfig:
    name: str
    org: DRAMOrg
    timing: DRAMTiming

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DRAMConfig: name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.org, DRAMOrg):
            raise ValueError(f"DRAMConfig {self.name!r}: org must be a DRAMOrg, got {type(self.org).__name__}")
        if not isinstance(self.timing, DRAMTiming):
            raise ValueError(f"DRAMConfig {self.name!r}: timing must be a DRAMTiming, "
                             f"got {type(self.timing).__name__}")
        # Back-to-back column commands (tCCD_S apart) must not overlap on the DQ bus.
        if self.org.burst_cycles > self.timing.tCCD_S:
            raise ValueError(f"DRAMConfig {self.name!r}: burst_cycles ({self.org.burst_cycles}) > "
                             f"tCCD_S ({self.timing.tCCD_S}): consecutive bursts would overlap on the DQ bus")

    @property
    def data_rate_mts(self) -> float:
        """DQ transfers per second per pin, in MT/s."""
        return self.org.beats_per_clock * 1e6 / self.timing.tck_ps


class PeakBandwidth(NamedTuple):
    channel: float  # GB/s (10**9 bytes per second) of one channel's DQ bus
    system: float   # GB/s of all `org.channels` channels


def peak_bandwidth_gbps(config: DRAMConfig) -> PeakBandwidth:
    """Peak DQ bandwidth in GB/s (decimal), per channel and for the whole system."""
    bytes_per_clock = config.org.clock_bits / 8
    channel = bytes_per_clock / config.timing.tck_ps * 1000.0  # bytes/ps -> GB/s
    return PeakBandwidth(channel=channel, system=channel * config.org.channels)


def refresh_efficiency(config: DRAMConfig) -> float:
    """Fraction of time a rank is not blocked by all-bank refresh: 1 - tRFC / tREFI."""
    return 1.0 - config.timing.tRFC / config.timing.tREFI


def _nck(ns: float, tck_ps: int, min_nck: int = 1) -> int:
    """JEDEC 'greater of min_nck and ns' rounded up to whole clocks."""
    ps = round(ns * 1000)
    return max(min_nck, -(-ps // tck_ps))


def _nck_floor(ns: float, tck_ps: int) -> int:
    """A maximum interval (tREFI) rounded down to whole clocks."""
    return (round(ns * 1000)) // tck_ps


# ---------------------------------------------------------------------------------------------------------------
# DDR4-3200 (the L3 paper's DIMM / DIMM-PIM memory)
# ---------------------------------------------------------------------------------------------------------------

_DDR4_TCK_PS = 625  # DDR4-3200: 1600 MHz clock [JESD79-4 speed bin DDR4-3200AA, tCK(avg) = 0.625 ns]

DDR4_3200_TIMING = DRAMTiming(
    name="ddr4-3200",
    tck_ps=_DDR4_TCK_PS,
    CL=22,        # [L3] CL=22; = DDR4-3200AA CL 22 [JESD79-4], [Ramulator2] DDR4_3200AA nCL
    CWL=16,       # [L3] WL=16; CWL 16 for 2933-3200 [JESD79-4], [Ramulator2] nCWL
    tRCD=22,      # [L3] RCD=22 (13.75 ns) [JESD79-4 3200AA]
    tRP=22,       # [L3] RP=22 (13.75 ns) [JESD79-4 3200AA]; DDR4 PREA uses the same tRP
    tRAS=52,      # [L3] RAS=52 (32 ns) [JESD79-4]
    tRC=74,       # [L3] RC=74 = tRAS + tRP [JESD79-4 3200AA 45.75 ns]
    tCCD_S=4,     # [L3] CCD=4 [JESD79-4 tCCD_S = 4 nCK]
    tCCD_L=8,     # [L3] CCDL=8 [JESD79-4 tCCD_L = max(5 nCK, 5 ns) -> 8 at 3200]
    tRRD_S=4,     # [L3] RRD=4/8 [JESD79-4 1 KB page: max(4 nCK, 2.5 ns) -> 4]
    tRRD_L=8,     # [L3] RRD=4/8 [JESD79-4 1 KB page: max(4 nCK, 4.9 ns) -> 8]
    tFAW=_nck(21.0, _DDR4_TCK_PS, 20),  # = 34: [JESD79-4 1 KB page (x8) DDR4-3200: max(20 nCK, 21 ns)];
    #                                       [Ramulator2] nFAW x8 3200 = 34. Not in L3 Table 2.
    tWTR_S=4,     # [L3] CDLR=4/12 [JESD79-4 tWTR_S = max(2 nCK, 2.5 ns) -> 4]
    tWTR_L=12,    # [L3] CDLR=4/12 [JESD79-4 tWTR_L = max(4 nCK, 7.5 ns) -> 12]
    tWR=24,       # [L3] WR=24 [JESD79-4 tWR = 15 ns -> 24]
    tRTP=12,      # [L3] RTP=12 [JESD79-4 tRTP = max(4 nCK, 7.5 ns) -> 12]
    tREFI=_nck_floor(7800.0, _DDR4_TCK_PS),  # = 12480: [JESD79-4 tREFI = 7.8 us, 0-85 C, 1x refresh mode]
    tRFC=_nck(350.0, _DDR4_TCK_PS),  # = 560: [JESD79-4 tRFC1, 8 Gb = 350 ns] (Ramulator2's table has 360 ns
    #                                   for 8 Gb; we follow JEDEC / Micron 8 Gb DDR4 datasheets: 350 ns)
    tRTRS=2,      # not a JEDEC parameter: [Ramulator2] DDR4 nCS = 2 (rank switch); DRAMsim3 DDR4 configs tRTRS = 2
    tRTW=2,       # [JESD79-4] RD->WR = CL + BL/2 - CWL + 2 nCK (1 nCK write preamble); [Ramulator2] "+ 2"
)

# Organisation: L3 Table 2 host memory, 16 channels; 2 ranks x 4 BG x 4 banks [L3 "Hierarchy"]; x8 8 Gb devices
# [JESD79-4 addressing table, 8 Gb x8: BG0-1, BA0-1, A0-A15 row (65536), A0-A9 column (1024), 1 KB page];
# [Ramulator2] "DDR4_8Gb_x8" {4, 4, 1<<16, 1<<10}.
# NOTE: 16 ch x 2 ranks x 8 x 8 Gb = 256 GiB; the paper's 2 TB host capacity (2 DIMMs per channel) would need
# more ranks or denser dies -- capacity does not enter any timing or bandwidth figure.
DDR4_3200_ORG = DRAMOrg(
    name="ddr4-3200",
    channels=16,         # [L3] "16 Channels x 2 DIMM"
    ranks=2,             # [L3] "2 Ranks"
    bank_groups=4,       # [L3] "4 Bank Groups"; [JESD79-4] x8: 4 BG
    banks_per_group=4,   # [L3] "4 Banks"
    rows=65536,          # [JESD79-4] 8 Gb x8: 64K rows
    columns=1024,        # [JESD79-4] 8 Gb x8: 1K columns (1 KB page)
    device_width=8,      # x8 devices
    devices_per_rank=8,  # 64-bit non-ECC DIMM data bus
    burst_length=8,      # BL8 [JESD79-4]; [L3] "BL=4" counts clocks
    beats_per_clock=2,   # DDR
)

DDR4_3200 = DRAMConfig(name="ddr4-3200", org=DDR4_3200_ORG, timing=DDR4_3200_TIMING)

# Small organisation for simulating a device model's storage in tests; same timing.
DDR4_3200_TINY = DRAMConfig(
    name="ddr4-3200-tiny",
    org=DRAMOrg(name="ddr4-3200-tiny", channels=1, ranks=2, bank_groups=4, banks_per_group=4, rows=32,
                columns=256, device_width=8, devices_per_rank=8, burst_length=8, beats_per_clock=2),
    timing=DDR4_3200_TIMING,
)


# ---------------------------------------------------------------------------------------------------------------
# LPDDR5X-8533 (the CXL device memory: Samsung LPDDR CXL-PNM class, 512 GB, ~1.1 TB/s)
# ---------------------------------------------------------------------------------------------------------------
# Command clock CK = 8533 / 8 = 1066.6 MHz (WCK:CK = 4:1, DDR on WCK -> 8 beats per CK) -> tCK = 937.5 ps,
# stored as 938 ps (integer ps; 0.05 % slow, on the safe side). All ns -> nCK conversions use 938 ps.
# Mapping of LPDDR5 parameters onto our fields (BG mode, BL16):
#   CL   <- RL (read latency), CWL <- WL (write latency, set A)
#   tRP  <- tRPpb (per-bank PRE); tRPab <- tRPab (PREA). tRC <- tRAS + tRPpb (per-bank precharge).
#   tRRD_S = tRRD_L <- tRRD (LPDDR5 has a single tRRD in BG mode)
#   tCCD_S <- BL/n_min = 2 nCK (other bank group), tCCD_L <- BL/n_max = 4 nCK (same bank group)
#   tRTP <- RD-to-PRE = BL/n_min + tRBTP
#   tREFI <- tREFIab, tRFC <- tRFCab (all-bank refresh; per-bank refresh is not modelled)
#   tRTRS <- tCS-like rank switch bubble (not a JESD209-5 parameter)

_LP5X_TCK_PS = 938

LPDDR5X_8533_TIMING = DRAMTiming(
    name="lpddr5x-8533",
    tck_ps=_LP5X_TCK_PS,
    CL=23,        # RL at CK <= 1066 MHz, set 0 (no DBI / link ECC) [JESD209-5B RL table] (~21.6 ns, same access
    #               time as LPDDR5-6400's RL 17 @ 800 MHz [gem5])
    CWL=12,       # WL set A at CK <= 1066 MHz [JESD209-5B WL table]
    tRCD=_nck(18.0, _LP5X_TCK_PS, 2),   # = 20: max(18 ns, 2 nCK) [JESD209-5B]; [gem5]
    tRP=_nck(18.0, _LP5X_TCK_PS, 2),    # = 20: tRPpb = max(18 ns, 2 nCK) [JESD209-5B]; [gem5]
    tRAS=_nck(42.0, _LP5X_TCK_PS, 3),   # = 45: max(42 ns, 3 nCK) [JESD209-5B]; [gem5]
    tRC=_nck(42.0, _LP5X_TCK_PS, 3) + _nck(18.0, _LP5X_TCK_PS, 2),  # = 65: tRC = tRAS + tRPpb [JESD209-5B]
    tCCD_S=2,     # BG mode BL16: BL/n_min = 2 nCK [JESD209-5B]; [gem5] LPDDR5_*_BG_BL16 tBURST_MIN = 2 CK
    tCCD_L=4,     # BG mode BL16: BL/n_max = 4 nCK [JESD209-5B]; [gem5] tCCD_L = 4 CK
    tRRD_S=_nck(5.0, _LP5X_TCK_PS, 2),  # = 6: tRRD = max(5 ns, 2 nCK), BG mode [JESD209-5B]; [gem5]
    tRRD_L=_nck(5.0, _LP5X_TCK_PS, 2),  # = 6: same single tRRD
    tFAW=_nck(20.0, _LP5X_TCK_PS),      # = 22: 20 ns in BG / 16B mode [JESD209-5B]; [gem5] tXAW
    tWTR_S=_nck(6.25, _LP5X_TCK_PS, 4),  # = 7: max(6.25 ns, 4 nCK) [JESD209-5B]; [gem5] tWTR
    tWTR_L=_nck(12.0, _LP5X_TCK_PS, 4),  # = 13: max(12 ns, 4 nCK) [JESD209-5B]; [gem5] tWTR_L
    tWR=_nck(34.0, _LP5X_TCK_PS, 3),     # = 37: max(34 ns, 3 nCK) [JESD209-5B]; [gem5]
    tRTP=2 + _nck(7.5, _LP5X_TCK_PS, 2),  # = 10: RD->PRE = BL/n_min (2) + tRBTP, tRBTP = max(7.5 ns, 2 nCK)
    #               [JESD209-5B]. (gem5 reads tRBTP as 7.5 ns - 2 nCK, i.e. RD->PRE = 8; we keep the
    #               conservative reading.)
    tREFI=_nck_floor(3906.0, _LP5X_TCK_PS),  # = 4164: tREFIab = 3.906 us [JESD209-5B]; [Ramulator2] 3906 ns
    tRFC=_nck(280.0, _LP5X_TCK_PS),          # = 299: tRFCab for a 16 Gb (per channel) die = 280 ns
    #                                          [JESD209-5B]; [Ramulator2] tRFCab_TABLE 16 Gb = 280
    tRTRS=2,      # rank switch: [Ramulator2] LPDDR5 nCS = 2; [gem5] tCS = 2 CK
    tRPab=_nck(21.0, _LP5X_TCK_PS, 2),  # = 23: tRPab = max(21 ns, 2 nCK) [JESD209-5B] (used for PREA)
    tRTW=2,       # [Ramulator2] LPDDR5 RD16->WR16 = nCL + nBL16 + 2 - nCWL
)

# Organisation: 64 channels x16 at 8533 MT/s = 64 x 17.06 GB/s = 1.09 TB/s (the papers' ~1.1 TB/s device).
# Capacity 512 GB = 64 channels x 8 GB: 2 ranks (LPDDR5 allows 2 ranks per channel) x two 16 Gb byte-mode (x8)
# dies per rank. 16 Gb x8 byte-mode die: 4 BG x 4 banks, 128 K rows (R0-R16), 1 KB page (1024 columns)
# [JESD209-5B addressing table]. The 16 Gb die density also sets tRFCab above.
LPDDR5X_8533_ORG = DRAMOrg(
    name="lpddr5x-8533",
    channels=64,         # 64 x 17.06 GB/s = 1.09 TB/s, the CXL-PNM's ~1.1 TB/s
    ranks=2,
    bank_groups=4,       # BG mode [JESD209-5B]: 4 BG x 4 banks (required above 3200 MT/s for BL16)
    banks_per_group=4,
    rows=131072,         # 16 Gb byte-mode die [JESD209-5B]
    columns=1024,        # 1 KB page per x8 die
    device_width=8,      # byte mode
    devices_per_rank=2,  # two x8 dies form the x16 channel
    burst_length=16,     # BL16
    beats_per_clock=8,   # WCK:CK = 4:1, DDR on WCK [gem5 beats_per_clock = 8]
)

LPDDR5X_8533 = DRAMConfig(name="lpddr5x-8533", org=LPDDR5X_8533_ORG, timing=LPDDR5X_8533_TIMING)

LPDDR5X_8533_TINY = DRAMConfig(
    name="lpddr5x-8533-tiny",
    org=DRAMOrg(name="lpddr5x-8533-tiny", channels=1, ranks=2, bank_groups=4, banks_per_group=4, rows=32,
                columns=256, device_width=8, devices_per_rank=2, burst_length=16, beats_per_clock=8),
    timing=LPDDR5X_8533_TIMING,
)


PRESETS: dict = {c.name: c for c in (DDR4_3200, DDR4_3200_TINY, LPDDR5X_8533, LPDDR5X_8533_TINY)}


def preset(name: str) -> DRAMConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown DRAM preset {name!r}; allowed: {sorted(PRESETS)}") from None
