"""The DRAM command set shared by the memory controllers, the DRAM device model and the timing checker.

Besides the JEDEC commands, the all-bank commands used by processing-in-memory address every bank of a rank
at once (as in Samsung's HBM-PIM all-bank mode and SK hynix AiM): ``ACT_AB`` opens the same row in every
bank, ``RD_AB`` reads the same column of every bank into its bank PU (nothing on the DQ bus), ``WR_AB``
writes one burst from the DQ bus into the same column of every bank.
"""

from amaranth.lib import enum

from amaranth.lib import data

__all__ = ["Cmd", "command_layout", "Violation", "trace_layout", "CYCLE_BITS"]

# Cycle stamps: 2**40 cycles of a 1.6 GHz DDR4 clock is ~11 minutes of simulated time.
CYCLE_BITS = 40


class Cmd(enum.Enum, shape=4):
    NOP = 0
    ACT = 1      # activate row `row` in (rank, bg, bank)
    RD = 2       # read burst `col` of the open row of (rank, bg, bank)
    WR = 3       # write burst `col` of the open row of (rank, bg, bank)
    PRE = 4      # precharge (rank, bg, bank)
    PREA = 5     # precharge every bank of `rank`
    REF = 6      # all-bank refresh of `rank` (every bank precharged)
    ACT_AB = 8   # PIM: activate `row` in every bank of `rank`
    RD_AB = 9    # PIM: read burst `col` of every bank of `rank` into the bank PUs (no DQ transfer)
    WR_AB = 10   # PIM: write the DQ burst into burst `col` of every bank of `rank`


def command_layout(org) -> data.StructLayout:
    """One command on the command/address bus of a channel of ``org`` (a :class:`DRAMOrg`)."""
    return data.StructLayout({
        "kind": Cmd,
        "rank": max(1, (org.ranks - 1).bit_length()),
        "bg": max(1, (org.bank_groups - 1).bit_length()),
        "bank": max(1, (org.banks_per_group - 1).bit_length()),
        "row": max(1, (org.rows - 1).bit_length()),
        "col": max(1, (org.bursts_per_row - 1).bit_length()),
    })


class Violation(enum.Enum, shape=5):
    """Why a command was illegal: the violated constraint (timing names as in JEDEC JESD79-4)."""
    NONE = 0
    T_RCD = 1         # RD/WR too soon after ACT of the bank
    T_RP = 2          # ACT/REF too soon after PRE of the bank
    T_RAS = 3         # PRE too soon after ACT of the bank
    T_RC = 4          # ACT too soon after the previous ACT of the bank
    T_CCD_S = 5       # column command too soon after one in another bank group
    T_CCD_L = 6       # column command too soon after one in the same bank group
    T_RRD_S = 7       # ACT too soon after an ACT in another bank group of the rank
    T_RRD_L = 8       # ACT too soon after an ACT in the same bank group
    T_FAW = 9         # fifth ACT inside the four-activate window of the rank
    T_WTR_S = 10      # RD too soon after write data ended, other bank group
    T_WTR_L = 11      # RD too soon after write data ended, same bank group
    T_WR = 12         # PRE too soon after write data ended (write recovery)
    T_RTP = 13        # PRE too soon after RD
    T_RFC = 14        # command to a rank still refreshing
    T_REFI = 15       # more than 8 refresh intervals postponed
    BUS = 16          # DQ bus conflict: read/write data or rank-switch (tRTRS) overlap
    BANK_CLOSED = 17  # RD/WR/PRE-less column access to a bank with no open row
    BANK_OPEN = 18    # ACT to a bank whose row is open, or REF/ACT_AB with a bank open
    ADDRESS = 19      # a field outside the organisation (rank, row, column)


def trace_layout(org) -> data.StructLayout:
    """One command-trace record: the command and the cycle it was on the bus (cycle 0 = after reset)."""
    return data.StructLayout({"cmd": command_layout(org), "cycle": CYCLE_BITS})
