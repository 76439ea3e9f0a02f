"""The all-bank command rules of a DIMM-PIM rank: one table shared by the RTL sequencer, the firmware program and
the performance models.

A rank running the fused kernel issues four command kinds, all to every bank of the rank at once: ``ACT_AB``
(activate one row in every bank), ``RD_AB`` (every bank reads one burst into its bank PU; nothing on the DQ bus),
``PREA`` (precharge all) and ``REF``. :func:`allbank_gaps` gives, for each kind, the minimum distance in command
clocks from each earlier command of the same rank; a command is legal once every distance has passed
(:class:`AllBankState`). The distances are the rules of the independent checker (``sim/dram/checker.py``) for
these commands, with two conservative choices that the RTL also makes (``docs/pim_rank_pu_sequencer.md``):

* ``ACT_AB`` after ``ACT_AB``: ``max(tRC, tRRD_L, tFAW)`` -- one ACT_AB opens a row in all four banks of every
  bank group, which fills the rank's four-activate window, so the next one waits tFAW (JESD79-4 tFAW: at most
  four ACTs per rank in any tFAW window).
* ``REF`` after ``ACT_AB``: ``tRC`` (the memory controller's rule as well; JESD79-4 needs only tRP after the
  PREA that closes the row).

Users:

* :class:`hdl.pim.rank_pu.PIMSequencer` builds its hardware wait counters from :func:`allbank_gaps` (one counter
  per command kind, loaded on every issue with the distance the issued command imposes);
* ``firmware/pim_stream.py`` (:func:`all_bank_schedule`: greedy program of a channel) uses :class:`AllBankState`;
* ``sim/perf/pim.py`` (the fused-kernel model and the rankset simulation) uses :class:`AllBankState` and
  :func:`row_timing`.

Refresh due times: :func:`refresh_due` (refresh ``k`` of rank ``r`` of ``R``, staggered like the memory
controller's timers). Pure Python: no Amaranth, no simulator.
"""

from hdl.memctl.commands import Cmd

__all__ = ["ALLBANK_KINDS", "allbank_gaps", "AllBankState", "row_timing", "refresh_due", "NEVER"]

#: The command kinds of the all-bank program, in the order of :func:`allbank_gaps`' table.
ALLBANK_KINDS = (Cmd.ACT_AB, Cmd.RD_AB, Cmd.PREA, Cmd.REF)

#: "Never issued" time of :class:`AllBankState` (far enough in the past that no rule binds).
NEVER = -(1 << 40)


def allbank_gaps(timing) -> dict:
    """``{next kind: {previous kind: minimum cycles}}`` for the all-bank commands of one rank (module docstring).

    ``timing``: a :class:`hdl.memctl.timing.DRAMTiming`. A pair that is not listed does not constrain (e.g.
    RD_AB after PREA: the ACT_AB in between does)."""
    tm = timing
    return {
        Cmd.ACT_AB: {Cmd.PREA: tm.tRPab, Cmd.ACT_AB: max(tm.tRC, tm.tRRD_L, tm.tFAW), Cmd.REF: tm.tRFC},
        Cmd.RD_AB: {Cmd.ACT_AB: tm.tRCD, Cmd.RD_AB: tm.tCCD_L, Cmd.REF: tm.tRFC},
        Cmd.PREA: {Cmd.ACT_AB: tm.tRAS, Cmd.RD_AB: tm.tRTP, Cmd.REF: tm.tRFC},
        Cmd.REF: {Cmd.PREA: tm.tRPab, Cmd.ACT_AB: tm.tRC, Cmd.REF: tm.tRFC},
    }


class AllBankState:
    """The issue times of one rank's last command of each kind, and the legality rule of :func:`allbank_gaps`.

    ``legal(kind)``: the earliest cycle at which ``kind`` may issue; ``issue(kind, t)`` records an issue."""

    __slots__ = ("gaps", "last")

    def __init__(self, timing, gaps=None):
        self.gaps = allbank_gaps(timing) if gaps is None else gaps
        self.last = {k: NEVER for k in ALLBANK_KINDS}

    def legal(self, kind) -> int:
        last = self.last
        return max(last[prev] + gap for prev, gap in self.gaps[kind].items())

    def issue(self, kind, t: int) -> None:
        self.last[kind] = t

    def copy(self) -> "AllBankState":
        s = AllBankState.__new__(AllBankState)
        s.gaps, s.last = self.gaps, dict(self.last)
        return s


def row_timing(state: AllBankState, n: int, *, earliest: int = 0, first_rd: int = 0):
    """One row of ``n`` RD_ABs as early as the rules allow: ``ACT_AB``, ``n`` RD_ABs ``tCCD_L`` apart, ``PREA``.

    ``earliest``: the ACT_AB's lower bound; ``first_rd``: the first RD_AB's lower bound (e.g. data it waits for).
    Updates ``state`` and returns ``(act, first RD_AB, last RD_AB, prea)`` cycles. The RD_ABs of a row are
    ``tCCD_L`` apart because nothing else constrains them (the RD_AB -> RD_AB rule is the only one that binds
    once the row is open)."""
    if n < 1:
        raise ValueError(f"a row needs at least one RD_AB, got n = {n}")
    act = max(earliest, state.legal(Cmd.ACT_AB))
    state.issue(Cmd.ACT_AB, act)
    rd0 = max(first_rd, state.legal(Cmd.RD_AB))
    rd_gap = state.gaps[Cmd.RD_AB][Cmd.RD_AB]
    last = rd0 + (n - 1) * rd_gap
    state.issue(Cmd.RD_AB, last)
    prea = state.legal(Cmd.PREA)
    state.issue(Cmd.PREA, prea)
    return act, rd0, last, prea


def refresh_due(k: int, rank: int, ranks: int, tREFI: int) -> int:
    """Cycle at which refresh ``k`` (k = 1, 2, ...) of ``rank`` (of ``ranks``) becomes due: ``k tREFI +
    rank (tREFI div ranks)`` (ranks staggered like the memory controller's timers)."""
    return k * tREFI + rank * (tREFI // ranks)
