"""Spoofed timing the DIMM-PIM advertises to the host memory controller ([L3] 4.1; docs/references.md).

The re-layout unit (:mod:`hdl.pim.relayout`) delays the write data by ``latency`` command clocks inside the buffer
chip. So that the data still reaches the DRAM pins exactly CWL after the WR [JESD79-4: "CWL is the delay, in clock
cycles, between the internal Write command and the availability of the first bit of input data"], the host must
launch it ``latency`` clocks earlier, and every rule the host measures from the *end of the write data* must be
``latency`` longer, because the real end of the write data at the DRAM is ``latency`` clocks later than the host
believes [L3 4.1: "for the timing parameter tWL ... the provided parameter value is smaller (e.g., one cycle) ...
for the latency of subsequent commands, such as tWR ... the provided value should be increased"]:

* ``CWL``    - latency  (the host drives write data earlier; the buffer chip adds it back)
* ``tWR``    + latency  (end of write data -> PRE)      [JESD79-4: tWR / tWTR are referenced from the
* ``tWTR_S`` + latency  (end of write data -> RD, other bank group)      first rising clock edge after the last
* ``tWTR_L`` + latency  (end of write data -> RD, same bank group)       write data]

The paper names tWL and tWR; tWTR_S/L are measured from the same (now ``latency`` later) end of write data, so
leaving them real lets the host issue a RD one clock inside tWTR at the DRAM (``tests/sim/pim/test_pim_spoof.py``
shows it). Precedent in DDR4 itself: the 2tCK write-preamble mode (JESD79-4, as reproduced in DDR4 datasheets)
also moves the write data and asks for tWTR +1 clock and WR +1 or +2. Nothing else changes: every other write
rule of the host (tCCD, read-to-write turnaround ``CL + BL/2 - CWL + 2``) only gets more conservative with a
smaller CWL.

Where the values live on a real DDR4 DIMM: tWRmin, tWTR_Smin, tWTR_Lmin are SPD bytes 41..45 [JEDEC 21-C Annex L,
SPD for DDR4: byte 41 upper nibble of tWRmin, 42 tWRmin, 43 upper nibbles of tWTR_S (bits 3:0) / tWTR_L
(bits 7:4), 44 tWTR_Smin, 45 tWTR_Lmin; medium timebase 125 ps], see :func:`spd_write_bytes`. CWL is not an SPD
byte: the host programs it into MR2[5:3] (settings 9, 10, 11, 12, 14, 16, 18, 20) through the command bus, which
the buffer chip forwards -- so the buffer chip programs the DRAMs' MR2 with the real CWL while the host MC runs
with CWL - latency (see docs/pim_relayout.md for the caveat: CWL 15 is not an MR2 setting).
"""

import dataclasses

from hdl.memctl.timing import DRAMConfig, DRAMTiming

__all__ = ["SPOOFED_FIELDS", "spoofed_timing", "spoofed_config", "SPD_MTB_PS", "spd_write_bytes",
           "spd_write_nck"]

#: The timing fields the SPD spoof changes, with the sign of the change.
SPOOFED_FIELDS = {"CWL": -1, "tWR": +1, "tWTR_S": +1, "tWTR_L": +1}

#: DDR4 SPD medium timebase [JEDEC 21-C Annex L: MTB = 1/8 ns].
SPD_MTB_PS = 125


def spoofed_timing(real: DRAMTiming, latency: int) -> DRAMTiming:
    """The timing the host MC must use when the write data passes ``latency`` extra clocks in the buffer chip:
    ``CWL - latency``, ``tWR / tWTR_S / tWTR_L + latency``, all else equal. ``latency = 0`` returns equal values."""
    if not isinstance(real, DRAMTiming):
        raise ValueError(f"real must be a DRAMTiming, got {type(real).__name__}")
    if isinstance(latency, bool) or not isinstance(latency, int) or not 0 <= latency < real.CWL:
        raise ValueError(f"latency = {latency!r} outside [0, {real.CWL - 1}] (CWL - latency must stay >= 1)")
    changes = {f: getattr(real, f) + sign * latency for f, sign in SPOOFED_FIELDS.items()}
    return dataclasses.replace(real, name=f"{real.name}-spd-spoof{latency}", **changes)


def spoofed_config(config: DRAMConfig, latency: int) -> DRAMConfig:
    """``config`` with :func:`spoofed_timing` (same organisation)."""
    return DRAMConfig(name=f"{config.name}-spd-spoof{latency}", org=config.org,
                      timing=spoofed_timing(config.timing, latency))


def _mtb(timing, field):
    ps = getattr(timing, field) * timing.tck_ps
    if ps % SPD_MTB_PS:
        raise ValueError(f"{field} = {getattr(timing, field)} nCK x {timing.tck_ps} ps is not a multiple of the "
                         f"{SPD_MTB_PS} ps SPD timebase (a fine-timebase correction would be needed)")
    mtb = ps // SPD_MTB_PS
    if mtb >= 1 << 12:
        raise ValueError(f"{field} = {ps} ps does not fit the 12-bit SPD field")
    return mtb


def spd_write_bytes(timing: DRAMTiming) -> dict[int, int]:
    """SPD bytes 41..45 (tWRmin, tWTR_Smin, tWTR_Lmin in medium timebase units) that advertise ``timing``."""
    wr, wtr_s, wtr_l = (_mtb(timing, f) for f in ("tWR", "tWTR_S", "tWTR_L"))
    return {41: wr >> 8, 42: wr & 0xFF, 43: (wtr_s >> 8) | ((wtr_l >> 8) << 4), 44: wtr_s & 0xFF,
            45: wtr_l & 0xFF}


def spd_write_nck(spd: dict, tck_ps: int) -> dict[str, int]:
    """What a host MC derives from those bytes: nCK = ceil(t / tCK) [JEDEC rounding of minimum times]."""
    ps = {"tWR": ((spd[41] & 0xF) << 8 | spd[42]) * SPD_MTB_PS,
          "tWTR_S": ((spd[43] & 0xF) << 8 | spd[44]) * SPD_MTB_PS,
          "tWTR_L": ((spd[43] >> 4) << 8 | spd[45]) * SPD_MTB_PS}
    return {k: -(-v // tck_ps) for k, v in ps.items()}
