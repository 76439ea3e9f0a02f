"""An independent JEDEC timing checker for command traces of one channel.

Written from the constraint table of :class:`hdl.memctl.timing.DRAMTiming` (JESD79-4 / JESD209-5 names), not
from any device model, so that a device model and a controller can both be judged against it.

Rules (all distances in command-clock cycles; "end of write data" of a WR at cycle t is t + CWL + burst_cycles):

* address fields in range for the command (ADDRESS); the command is then ignored.
* per-bank state: ACT needs the bank precharged (BANK_OPEN); RD/WR need an open row (BANK_CLOSED) and are then
  ignored; PRE of a precharged bank is a NOP (JESD79-4: "treated as a NOP"), PREA precharges the open banks.
* ACT:  tRP after PRE (tRPab after PREA), tRC after ACT (same bank), tRRD_L / tRRD_S after the last ACT in the
  same / another bank group of the rank, tFAW after the 4th-last ACT of the rank.
* RD/WR: tRCD after ACT (same bank), tCCD_L / tCCD_S after the last column command in the same / another bank
  group of the rank; RD: tWTR_L / tWTR_S after the end of write data in the same / another bank group.
* PRE/PREA (per open bank): tRAS after ACT, tRTP after RD, tWR after the end of write data.
* REF: every bank precharged (BANK_OPEN), tRP / tRPab after the last precharge of each bank.
* any command to a rank: tRFC after its last REF (T_RFC).
* refresh postponement (T_REFI): at every cycle t, REFs issued to a rank (up to and including t)
  >= floor(t / tREFI) - 8. The violation is reported at the first cycle where this fails.
* DQ bus (BUS): read data occupies [t + CL, t + CL + burst_cycles), write data [t + CWL, ... ); bursts must not
  overlap; bursts of different ranks need tRTRS idle cycles between them; a same-rank read burst followed by a
  write burst needs tRTW idle cycles (JESD79-4 RD->WR = CL + BL/2 - CWL + 2 nCK).
* PIM all-bank commands: ACT_AB is an ACT in every bank of the rank (all must be precharged; tRP/tRC per bank;
  tRRD_L against every bank group). For tRRD/tFAW it counts as FOUR activates: it fills the rank's four-activate
  window, so the next ACT/ACT_AB of the rank waits tFAW after it. This is a deliberately conservative choice (an
  all-bank activate draws at least the current of four activates; JEDEC has no all-bank ACT). RD_AB/WR_AB are a
  RD/WR in every bank (all must be open): tRCD per bank, tCCD_L against every bank group (so consecutive
  all-bank column commands are tCCD_L apart), RD_AB obeys tWTR_L after any write data of the rank. RD_AB moves
  no data on the DQ bus; WR_AB uses the DQ bus like a WR. PRE after them obeys tRTP / tWR in every bank.

* WRITE DATA TIMING (tWL = CWL; optional, :class:`PinViolation` ``WRITE_DATA``): given ``write_strobe``, the
  cycles in which write data is driven at the device pins (its data strobe), every WR / WR_AB at cycle t needs
  data in every cycle of [t + CWL, t + CWL + burst_cycles), and no write data may be driven outside such a window.
  A command bus trace alone cannot see this; a buffer chip in the data path (DIMM-PIM re-layout) can break it.
  See :func:`check_write_data`.

``injected`` (optional): indices into ``commands`` of commands injected on purpose by a test (e.g. illegal
commands meant to make a device model flag a violation). They are checked and their violations reported with
``injected=True``, but they never change the checker's state, so the rest of the trace is judged as if they had
not been issued.
"""

import enum
from collections import Counter
from dataclasses import dataclass

from hdl.memctl.commands import Cmd, Violation

from .trace import TraceCommand

__all__ = ["TimingViolation", "PinViolation", "check_trace", "check_write_data", "describe"]

_NEG = -(1 << 60)  # "never happened"


class PinViolation(enum.Enum):
    """Pin-level data rules, beyond the command rules of :class:`hdl.memctl.commands.Violation` (whose 5-bit code
    the device model also uses). Reported in ``TimingViolation.violation`` like a ``Violation``."""
    WRITE_DATA = 32  # write data not driven exactly in [t + CWL, t + CWL + burst_cycles) of a WR / WR_AB


@dataclass(frozen=True)
class TimingViolation:
    cycle: int                    # cycle the violation happened at (the command's cycle; for T_REFI the deadline)
    command: TraceCommand | None  # the offending command (T_REFI: the first command after the deadline, or None)
    violation: Violation | PinViolation
    message: str
    constraint: str = ""          # "tRCD", "DQ bus", ...
    required: int | None = None   # required distance in cycles
    actual: int | None = None     # actual distance in cycles
    index: int | None = None      # position of `command` in the trace
    injected: bool = False

    def __str__(self):
        return self.message


def describe(violations) -> str:
    """A printable report: one line per violation and a count per code."""
    violations = list(violations)
    if not violations:
        return "no timing violations"
    lines = [("[injected] " if v.injected else "") + v.message for v in violations]
    counts = Counter(v.violation.name for v in violations)
    lines.append(f"{len(violations)} violation(s): " + ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())))
    return "\n".join(lines)


def check_trace(commands, config, *, injected=None, end_cycle=None, write_strobe=None) -> list[TimingViolation]:
    """Check a command trace of one channel of ``config`` (a DRAMConfig). Returns violations in trace order.

    ``commands``: TraceCommand objects in issue order (cycles non-decreasing; otherwise ValueError).
    ``end_cycle``: the cycle the trace was captured up to, for the refresh-postponement check (default: the
    last command's cycle).
    ``write_strobe`` (optional): the cycles in which write data is driven at the device pins; adds the WRITE DATA
    TIMING rule (:func:`check_write_data`), whose violations follow the command violations, in cycle order.
    """
    if write_strobe is not None:
        commands = list(commands)
        out = check_trace(commands, config, injected=injected, end_cycle=end_cycle)
        return out + check_write_data(commands, config, write_strobe, injected=injected)
    org, tm = config.org, config.timing
    R, BG, BPG = org.ranks, org.bank_groups, org.banks_per_group
    NB = BG * BPG
    ROWS, COLS = org.rows, org.bursts_per_row
    BC = org.burst_cycles
    CL, CWL = tm.CL, tm.CWL
    tRCD, tRP, tRPab, tRAS, tRC = tm.tRCD, tm.tRP, tm.tRPab, tm.tRAS, tm.tRC
    tCCD_S, tCCD_L, tRRD_S, tRRD_L, tFAW = tm.tCCD_S, tm.tCCD_L, tm.tRRD_S, tm.tRRD_L, tm.tFAW
    tWTR_S, tWTR_L, tWR, tRTP = tm.tWTR_S, tm.tWTR_L, tm.tWR, tm.tRTP
    tREFI, tRFC, tRTRS, tRTW = tm.tREFI, tm.tRFC, tm.tRTRS, tm.tRTW
    WEND = CWL + BC  # WR cycle -> end of its write data
    MAXGAP = max(tRTRS, tRTW)
    MINLAT = min(CL, CWL)

    injected = frozenset(injected) if injected else frozenset()

    # Per bank (index r * NB + bg * BPG + bank)
    open_row = [-1] * (R * NB)
    act_t = [_NEG] * (R * NB)
    pre_t = [_NEG] * (R * NB)
    pre_rp = [tRP] * (R * NB)
    rd_t = [_NEG] * (R * NB)
    wr_end = [_NEG] * (R * NB)
    # Per (rank, bank group) (index r * BG + bg): last ACT, last column command, last end of write data.
    bg_act = [_NEG] * (R * BG)
    bg_col = [_NEG] * (R * BG)
    bg_wre = [_NEG] * (R * BG)
    # Per rank, "max over the other bank groups" in O(1): times only grow, so the newest update is the maximum.
    # last[r] = newest value, lbg[r] = its bank group (-1: all bank groups), oth[r] = max over bank groups != lbg.
    act_last, act_lbg, act_oth = [_NEG] * R, [-2] * R, [_NEG] * R
    col_last, col_lbg, col_oth = [_NEG] * R, [-2] * R, [_NEG] * R
    wre_last, wre_lbg, wre_oth = [_NEG] * R, [-2] * R, [_NEG] * R
    faw = [[_NEG] * 4 for _ in range(R)]  # last four ACT cycles per rank, oldest first
    ref_t = [_NEG] * R
    n_ref = [0] * R
    deadline = [9 * tREFI] * R  # first cycle at which REFs issued must be >= 1 (then 2 at 10 * tREFI, ...)
    next_deadline = 9 * tREFI
    bursts = []  # recent DQ bursts: (start, end, rank, is_write, cycle, kind)

    out = []
    emit = out.append

    def viol(t, c, i, code, constraint, required, ref_what, ref_cycle):
        got = t - ref_cycle
        emit(TimingViolation(
            t, c, code,
            f"cycle {t}: {c} \u2014 {constraint}: {required} cycles required after {ref_what} at cycle "
            f"{ref_cycle}, got {got}",
            constraint, required, got, i, i in injected))

    def state(t, c, i, code, text):
        emit(TimingViolation(t, c, code, f"cycle {t}: {c} \u2014 {text}", code.name, None, None, i, i in injected))

    def refresh_deadlines(t, c, i, inclusive):
        nonlocal next_deadline
        for r in range(R):
            while deadline[r] < t or (inclusive and deadline[r] == t):
                d = deadline[r]
                emit(TimingViolation(
                    d, c, Violation.T_REFI,
                    f"cycle {d}: rank{r} \u2014 tREFI: {d // tREFI} refresh intervals elapsed with {n_ref[r]} "
                    f"REF(s) issued; at most 8 may be postponed",
                    "tREFI", None, None, i, False))
                deadline[r] = d + tREFI
        next_deadline = min(deadline)

    def bus(t, c, i, start, r, is_wr, add):
        nonlocal bursts
        # Drop bursts that can no longer conflict with any later burst.
        if len(bursts) > 6:
            lim = t + MINLAT - MAXGAP
            bursts = [b for b in bursts if b[1] > lim]
        end = start + BC
        for (s2, e2, r2, w2, c2, k2) in bursts:
            if s2 <= start:
                fs, fe, fr, fw, ss = s2, e2, r2, w2, start
                sr, sw = r, is_wr
            else:
                fs, fe, fr, fw, ss = start, end, r, is_wr, s2
                sr, sw = r2, w2
            if fr != sr:
                gap, why = tRTRS, f"rank switch (tRTRS = {tRTRS})"
            elif not fw and sw:
                gap, why = tRTW, f"read-to-write turnaround (tRTW = {tRTW})"
            else:
                gap, why = 0, "overlap"
            if ss < fe + gap:
                mine = "write" if is_wr else "read"
                other = "write" if w2 else "read"
                emit(TimingViolation(
                    t, c, Violation.BUS,
                    f"cycle {t}: {c} \u2014 DQ bus: {mine} data [{start}, {end}) vs {other} data [{s2}, {e2}) of "
                    f"{k2.name} rank{r2} at cycle {c2}: {why} needs {gap} idle cycles between bursts, got "
                    f"{ss - fe}",
                    "DQ bus", gap, ss - fe, i, i in injected))
                break
        if add:
            bursts.append((start, end, r, is_wr, t, c.kind))

    ACT, RD, WR, PRE, PREA, REF = Cmd.ACT, Cmd.RD, Cmd.WR, Cmd.PRE, Cmd.PREA, Cmd.REF
    ACT_AB, RD_AB, WR_AB, NOP = Cmd.ACT_AB, Cmd.RD_AB, Cmd.WR_AB, Cmd.NOP
    V = Violation

    last_t = _NEG
    for i, c in enumerate(commands):
        t = c.cycle
        if t < last_t:
            raise ValueError(f"trace not in cycle order: command {i} ({c}) at cycle {t} after cycle {last_t}")
        last_t = t
        if t > next_deadline:
            refresh_deadlines(t, c, i, False)
        k = c.kind
        if k is NOP:
            continue
        upd = i not in injected if injected else True
        r = c.rank

        # -- address fields -----------------------------------------------------------------------------------
        if not 0 <= r < R:
            state(t, c, i, V.ADDRESS, f"rank {r} out of range (ranks = {R})")
            continue
        if k is ACT or k is RD or k is WR or k is PRE:
            g, b = c.bg, c.bank
            if not (0 <= g < BG and 0 <= b < BPG):
                state(t, c, i, V.ADDRESS, f"bank group {g} / bank {b} out of range ({BG} x {BPG})")
                continue
        if (k is ACT or k is ACT_AB) and not 0 <= c.row < ROWS:
            state(t, c, i, V.ADDRESS, f"row {c.row} out of range (rows = {ROWS})")
            continue
        if (k is RD or k is WR or k is RD_AB or k is WR_AB) and not 0 <= c.col < COLS:
            state(t, c, i, V.ADDRESS, f"column burst {c.col} out of range (bursts per row = {COLS})")
            continue

        # -- refresh in progress ------------------------------------------------------------------------------
        if t < ref_t[r] + tRFC:
            viol(t, c, i, V.T_RFC, "tRFC", tRFC, "REF", ref_t[r])

        rb = r * NB
        if k is RD or k is WR:
            rg = r * BG + g
            bi = rb + g * BPG + b
            if open_row[bi] < 0:
                state(t, c, i, V.BANK_CLOSED, "bank has no open row")
                continue
            if t < act_t[bi] + tRCD:
                viol(t, c, i, V.T_RCD, "tRCD", tRCD, "ACT", act_t[bi])
            if t < bg_col[rg] + tCCD_L:
                viol(t, c, i, V.T_CCD_L, "tCCD_L", tCCD_L, "a column command in the same bank group", bg_col[rg])
            o = col_last[r] if col_lbg[r] != g else col_oth[r]
            if t < o + tCCD_S:
                viol(t, c, i, V.T_CCD_S, "tCCD_S", tCCD_S, "a column command in another bank group", o)
            if k is RD:
                if t < bg_wre[rg] + tWTR_L:
                    viol(t, c, i, V.T_WTR_L, "tWTR_L", tWTR_L, "the end of write data in the same bank group",
                         bg_wre[rg])
                o = wre_last[r] if wre_lbg[r] != g else wre_oth[r]
                if t < o + tWTR_S:
                    viol(t, c, i, V.T_WTR_S, "tWTR_S", tWTR_S, "the end of write data in another bank group", o)
                bus(t, c, i, t + CL, r, False, upd)
                if upd:
                    rd_t[bi] = t
            else:
                bus(t, c, i, t + CWL, r, True, upd)
                if upd:
                    e = t + WEND
                    wr_end[bi] = e
                    bg_wre[rg] = e
                    if wre_lbg[r] != g:
                        wre_oth[r] = wre_last[r]
                    wre_last[r], wre_lbg[r] = e, g
            if upd:
                bg_col[rg] = t
                if col_lbg[r] != g:
                    col_oth[r] = col_last[r]
                col_last[r], col_lbg[r] = t, g
            continue

        if k is ACT:
            rg = r * BG + g
            bi = rb + g * BPG + b
            if open_row[bi] >= 0:
                state(t, c, i, V.BANK_OPEN, f"bank already has row {open_row[bi]} open")
            if t < pre_t[bi] + pre_rp[bi]:
                viol(t, c, i, V.T_RP, "tRP" if pre_rp[bi] == tRP else "tRPab", pre_rp[bi],
                     "PRE" if pre_rp[bi] == tRP else "PREA", pre_t[bi])
            if t < act_t[bi] + tRC:
                viol(t, c, i, V.T_RC, "tRC", tRC, "ACT of the same bank", act_t[bi])
            if t < bg_act[rg] + tRRD_L:
                viol(t, c, i, V.T_RRD_L, "tRRD_L", tRRD_L, "an ACT in the same bank group", bg_act[rg])
            o = act_last[r] if act_lbg[r] != g else act_oth[r]
            if t < o + tRRD_S:
                viol(t, c, i, V.T_RRD_S, "tRRD_S", tRRD_S, "an ACT in another bank group", o)
            w = faw[r]
            if t < w[0] + tFAW:
                viol(t, c, i, V.T_FAW, "tFAW", tFAW, "the fourth-last ACT of the rank", w[0])
            if upd:
                open_row[bi] = c.row
                act_t[bi] = t
                bg_act[rg] = t
                if act_lbg[r] != g:
                    act_oth[r] = act_last[r]
                act_last[r], act_lbg[r] = t, g
                w.pop(0)
                w.append(t)
            continue

        if k is PRE:
            bi = rb + g * BPG + b
            if open_row[bi] < 0:
                continue  # precharging an idle bank is a NOP
            if t < act_t[bi] + tRAS:
                viol(t, c, i, V.T_RAS, "tRAS", tRAS, "ACT", act_t[bi])
            if t < rd_t[bi] + tRTP:
                viol(t, c, i, V.T_RTP, "tRTP", tRTP, "RD", rd_t[bi])
            if t < wr_end[bi] + tWR:
                viol(t, c, i, V.T_WR, "tWR", tWR, "the end of write data", wr_end[bi])
            if upd:
                open_row[bi] = -1
                pre_t[bi] = t
                pre_rp[bi] = tRP
            continue

        # -- rank-wide commands: reduce the per-bank state to the binding values --------------------------------
        banks = range(rb, rb + NB)
        if k is PREA:
            ras = rtp = wrr = _NEG
            for bi in banks:
                if open_row[bi] >= 0:
                    ras = max(ras, act_t[bi])
                    rtp = max(rtp, rd_t[bi])
                    wrr = max(wrr, wr_end[bi])
            if t < ras + tRAS:
                viol(t, c, i, V.T_RAS, "tRAS", tRAS, "ACT", ras)
            if t < rtp + tRTP:
                viol(t, c, i, V.T_RTP, "tRTP", tRTP, "RD", rtp)
            if t < wrr + tWR:
                viol(t, c, i, V.T_WR, "tWR", tWR, "the end of write data", wrr)
            if upd:
                for bi in banks:
                    # JEDEC states tRPab from PREA to ACT for the rank: applied to every bank (conservative).
                    open_row[bi] = -1
                    pre_t[bi] = t
                    pre_rp[bi] = tRPab
            continue

        if k is REF or k is ACT_AB:
            opened = [bi - rb for bi in banks if open_row[bi] >= 0]
            if opened:
                fb = opened[0]
                state(t, c, i, V.BANK_OPEN,
                      f"{len(opened)} bank(s) open, first bg{fb // BPG} bank{fb % BPG} (row {open_row[rb + fb]})")
            rp_end, rp_at, rp_len = _NEG, _NEG, tRP
            for bi in banks:
                e = pre_t[bi] + pre_rp[bi]
                if e > rp_end:
                    rp_end, rp_at, rp_len = e, pre_t[bi], pre_rp[bi]
            if t < rp_end:
                viol(t, c, i, V.T_RP, "tRP" if rp_len == tRP else "tRPab", rp_len,
                     "PRE" if rp_len == tRP else "PREA", rp_at)
            if k is REF:
                if upd:
                    ref_t[r] = t
                    n_ref[r] += 1
                    deadline[r] = max(deadline[r], (n_ref[r] + 9) * tREFI)
                    next_deadline = min(deadline)
                continue
            # ACT_AB
            a = max(act_t[bi] for bi in banks)
            if t < a + tRC:
                viol(t, c, i, V.T_RC, "tRC", tRC, "ACT of the same bank", a)
            a = max(bg_act[r * BG:(r + 1) * BG])
            if t < a + tRRD_L:
                viol(t, c, i, V.T_RRD_L, "tRRD_L", tRRD_L, "an ACT in the same bank group", a)
            w = faw[r]
            if t < w[0] + tFAW:
                viol(t, c, i, V.T_FAW, "tFAW", tFAW, "the fourth-last ACT of the rank", w[0])
            if upd:
                row = c.row
                for bi in banks:
                    open_row[bi] = row
                    act_t[bi] = t
                for rg in range(r * BG, (r + 1) * BG):
                    bg_act[rg] = t
                act_last[r], act_lbg[r], act_oth[r] = t, -1, t
                w[:] = [t, t, t, t]  # an all-bank ACT fills the four-activate window
            continue

        if k is RD_AB or k is WR_AB:
            closed = [bi - rb for bi in banks if open_row[bi] < 0]
            if closed:
                fb = closed[0]
                state(t, c, i, V.BANK_CLOSED, f"{len(closed)} bank(s) have no open row, first bg{fb // BPG} "
                                               f"bank{fb % BPG}")
                continue
            a = max(act_t[bi] for bi in banks)
            if t < a + tRCD:
                viol(t, c, i, V.T_RCD, "tRCD", tRCD, "ACT", a)
            a = col_last[r]  # the newest column command of the rank, in some bank group = the same group
            if t < a + tCCD_L:
                viol(t, c, i, V.T_CCD_L, "tCCD_L", tCCD_L, "a column command in the same bank group", a)
            if k is RD_AB:
                a = wre_last[r]
                if t < a + tWTR_L:
                    viol(t, c, i, V.T_WTR_L, "tWTR_L", tWTR_L, "the end of write data in the same bank group", a)
                if upd:
                    for bi in banks:
                        rd_t[bi] = t
            else:
                bus(t, c, i, t + CWL, r, True, upd)
                if upd:
                    e = t + WEND
                    for bi in banks:
                        wr_end[bi] = e
                    for rg in range(r * BG, (r + 1) * BG):
                        bg_wre[rg] = e
                    wre_last[r], wre_lbg[r], wre_oth[r] = e, -1, e
            if upd:
                for rg in range(r * BG, (r + 1) * BG):
                    bg_col[rg] = t
                col_last[r], col_lbg[r], col_oth[r] = t, -1, t
            continue

        raise ValueError(f"command {i}: unsupported command kind {k!r}")

    end = last_t if end_cycle is None else max(end_cycle, last_t)
    if end >= next_deadline:
        refresh_deadlines(end, None, None, True)
    return out


def check_write_data(commands, config, write_strobe, *, injected=None) -> list[TimingViolation]:
    """WRITE DATA TIMING (tWL = CWL) at the device pins. Returns violations in cycle order.

    ``write_strobe``: the cycles in which write data is driven at the device pins (any order; duplicates
    ignored). Every WR / WR_AB at cycle t (except ``injected`` ones, whose windows are allowed but not required)
    needs data in each cycle of [t + CWL, t + CWL + burst_cycles): a window with cycles missing is one violation
    at the command's cycle. Each maximal run of consecutive strobe cycles outside every window is one violation
    at the run's first cycle, blamed on the newest WR / WR_AB issued before it (``None`` if there is none).
    Data one clock late therefore shows as the first window's missing cycle and the extra cycle after the last
    window of a run of back-to-back writes.
    """
    tm, BC = config.timing, config.org.burst_cycles
    CWL = tm.CWL
    injected = frozenset(injected) if injected else frozenset()
    strobe = sorted(set(int(x) for x in write_strobe))
    have = set(strobe)
    writes = [(i, c) for i, c in enumerate(commands) if c.kind is Cmd.WR or c.kind is Cmd.WR_AB]
    allowed = set()
    out = []
    for i, c in writes:
        s = c.cycle + CWL
        window = range(s, s + BC)
        allowed.update(window)
        if i in injected:
            continue
        missing = [x for x in window if x not in have]
        if missing:
            near = [x for x in strobe if s - BC < x < s + 2 * BC]
            actual = (near[0] - c.cycle) if near else None
            out.append(TimingViolation(
                c.cycle, c, PinViolation.WRITE_DATA,
                f"cycle {c.cycle}: {c} \u2014 write data timing (tWL = CWL = {CWL}): data expected at the pins in "
                f"[{s}, {s + BC}), no data strobe in cycle(s) {missing}"
                + (f"; nearest write data starts {actual} cycles after the command" if near else ""),
                "tWL (CWL)", CWL, actual, i, False))
    stray = [x for x in strobe if x not in allowed]
    runs = []
    for x in stray:
        if runs and x == runs[-1][1]:
            runs[-1][1] = x + 1
        else:
            runs.append([x, x + 1])
    w = 0
    last = None
    for a, b in runs:
        while w < len(writes) and writes[w][1].cycle < a:
            last = writes[w]
            w += 1
        i, c = last if last else (None, None)
        blame = f"last WR: {c} at cycle {c.cycle}, window [{c.cycle + CWL}, {c.cycle + CWL + BC})" if c else "no WR"
        out.append(TimingViolation(
            a, c, PinViolation.WRITE_DATA,
            f"cycle {a}: write data timing (tWL = CWL = {CWL}): write data driven in [{a}, {b}) outside every "
            f"write's data window ({blame})",
            "tWL (CWL)", CWL, (a - c.cycle) if c else None, i, False))
    out.sort(key=lambda v: v.cycle)
    return out
