"""Legal all-bank PIM command programs for one channel: ACT_AB row / RD_AB col 0..n-1 / PREA per row, with REF.

:func:`all_bank_schedule` builds the program by greedy earliest-legal list scheduling: each rank has a queue of
commands (per row: ``ACT_AB row``, ``RD_AB col 0 .. n-1``, ``PREA``; a ``REF`` is inserted at the first row
boundary after each refresh becomes due), and in every step the rank whose next command is legal earliest issues
it (ties: lowest rank), one command per cycle on the shared command bus. The legality rules are the all-bank
rules of :mod:`hdl.pim.allbank` (the same table the RTL sequencer's counters and the performance model use:
the independent checker's rules plus two conservative extras, ACT_AB fills the four-activate window and REF waits
tRC after ACT_AB). Refresh ``k`` (k = 1, 2, ...) of rank ``r`` is due at :func:`hdl.pim.allbank.refresh_due`
(``k * tREFI + r * (tREFI // ranks)``, ranks staggered like the controller's timers).

RD_AB moves no data on the DQ bus, so ranks only interact through the command bus.

:func:`player_entries` turns a schedule into :class:`sim.dram.player.CommandPlayer` ``i`` payloads (ending with a
marked NOP). Used by the DRAM performance model's calibration (tests/sim/perf) and by the DIMM-PIM rank PU.
"""

from dataclasses import dataclass

from hdl.memctl.commands import Cmd
from hdl.pim.allbank import AllBankState, refresh_due

__all__ = ["ScheduledCommand", "all_bank_schedule", "player_entries", "schedule_end"]


@dataclass(frozen=True, slots=True)
class ScheduledCommand:
    cycle: int
    kind: Cmd
    rank: int = 0
    row: int = 0
    col: int = 0


def _rank_program(rows, n):
    """Per-rank command list (kind, row, col) without refreshes; REFs are inserted at row boundaries."""
    for row in rows:
        yield (Cmd.ACT_AB, row, 0)
        for c in range(n):
            yield (Cmd.RD_AB, row, c)
        yield (Cmd.PREA, row, 0)


def all_bank_schedule(config, rows, bursts_per_row=None, *, ranks=(0,), refresh=True, start=0):
    """Greedy earliest-legal all-bank streaming program.

    ``rows``: number of rows (rows ``0, 1, ...`` modulo ``org.rows``) or a sequence of row indices, streamed by
    every rank in ``ranks``; ``bursts_per_row``: RD_AB per row (default: the whole row, ``org.bursts_per_row``);
    ``refresh``: insert REFs per tREFI; ``start``: earliest cycle of the first command.
    Returns a list of :class:`ScheduledCommand` in cycle order (distinct cycles).
    """
    org, tm = config.org, config.timing
    n = org.bursts_per_row if bursts_per_row is None else int(bursts_per_row)
    if not 1 <= n <= org.bursts_per_row:
        raise ValueError(f"bursts_per_row must be in 1..{org.bursts_per_row}, got {n}")
    if isinstance(rows, int):
        rows = [r % org.rows for r in range(rows)]
    rows = [int(r) for r in rows]
    for r in rows:
        if not 0 <= r < org.rows:
            raise ValueError(f"row {r} outside 0..{org.rows - 1}")
    ranks = list(ranks)
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < org.ranks for r in ranks):
        raise ValueError(f"ranks must be distinct ranks of 0..{org.ranks - 1}, got {ranks}")
    R = org.ranks
    st = {}
    for r in ranks:
        st[r] = dict(prog=list(_rank_program(rows, n)), pos=0, ab=AllBankState(tm),
                     next_due=refresh_due(1, r, R, tm.tREFI), pending_ref=False)

    def next_cmd(s):
        if s["pending_ref"]:
            return (Cmd.REF, 0, 0)
        if s["pos"] < len(s["prog"]):
            return s["prog"][s["pos"]]
        return None

    out = []
    bus_free = start
    while True:
        best = None
        for r in ranks:
            s = st[r]
            c = next_cmd(s)
            if c is None:
                continue
            t = max(s["ab"].legal(c[0]), bus_free)
            if best is None or t < best[0]:
                best = (t, r, c)
        if best is None:
            break
        t, r, (kind, row, col) = best
        s = st[r]
        out.append(ScheduledCommand(t, kind, r, row if kind is Cmd.ACT_AB else 0, col if kind is Cmd.RD_AB else 0))
        bus_free = t + 1
        s["ab"].issue(kind, t)
        if kind is Cmd.REF:
            s["next_due"] += tm.tREFI
            s["pending_ref"] = False  # at most one REF per row boundary
            continue
        s["pos"] += 1
        if kind is Cmd.PREA:
            # Row boundary: refresh if one is due (and more rows follow).
            if refresh and s["pos"] < len(s["prog"]) and t >= s["next_due"]:
                s["pending_ref"] = True
    return out


def schedule_end(schedule) -> int:
    """Cycle of the last command of a schedule."""
    return schedule[-1].cycle if schedule else 0


def player_entries(player, schedule, *, tail=40):
    """:class:`CommandPlayer` ``i`` payloads for ``schedule``, ending with a marked NOP ``tail`` cycles after the
    last command (its issue cycle comes back on ``marks``)."""
    out, last = [], 0
    for c in schedule:
        out.append(player.encode(c.kind, delay=c.cycle - last, rank=c.rank, row=c.row, col=c.col))
        last = c.cycle
    out.append(player.encode(Cmd.NOP, delay=tail, mark=1))
    return out
