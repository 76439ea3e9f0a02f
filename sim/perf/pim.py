"""Fast performance model of the DIMM-PIM fused attention kernel (L3 sections 4.2-4.4, 5.1, Table 2).

Per rank and head (:class:`PIMPerfModel`): the kernel's DRAM command stream is ``ceil(L / B) * bpt`` score
RD_ABs over the head's K rows, then ``ceil(L / G)`` context RD_ABs over its V rows (:mod:`hdl.pim.mapping`), one
``ACT_AB`` ... ``PREA`` per row. Its cycle count is evaluated row by row (O(rows), no per-cycle loop) with the
legality rules of :func:`firmware.pim_stream.all_bank_schedule` (which follow the independent checker
``sim/dram/checker.py``; an ACT_AB counts as four activates, so consecutive ACT_ABs of a rank are tFAW apart):

* row with ``n`` RD_ABs, ACT_AB at ``a``: RD_AB ``i`` at ``a + tRCD + i tCCD_L``; ``PREA`` at
  ``max(a + tRAS, last RD_AB + tRTP)``; next ACT_AB at ``max(PREA + tRPab, a + max(tRC, tRRD_L, tFAW))``;
* refresh: ``"between"`` heads only (docs/pim.md; REF needs ``tRPab`` after PREA and ``tRC`` after ACT_AB, the
  next ACT_AB ``tRFC`` after REF; a REF may be postponed ``max_postponed_refresh`` tREFI), or ``"in_head"`` at the
  first row boundary after a REF is due (the all_bank_schedule rule). ``"auto"`` picks ``"between"`` when the
  head is short enough for the postponement limit, else ``"in_head"``;
* ``fixed_cycles``: the rank PU's pipeline fill / drain (score -> softmax -> normalization -> context -> final
  aggregation) that the DRAM command stream does not show. It is a **calibration hook**: 0 until fitted to RTL
  cycle counts of single heads with :func:`calibrate` (``sim.pim.fused.rtl_cycles``).
* ``overlap`` (default ``True``, the rank PU's behaviour): consecutive heads overlap (S0 S1 C0 S2 C1 ...,
  ``docs/pim_rank_pu_sequencer.md``) when two heads' ``ceil(L / B) B`` exponentials fit the rank buffer
  (``2 ceil(L / B) B <= config.max_tokens``): back to back, a head then costs only its rows
  (:meth:`PIMPerfModel.steady_head_cycles`); ``fixed_cycles`` is paid once per run of heads, not per head.
  Otherwise (or ``overlap=False``) every head pays ``fixed_cycles``.

The all-bank DRAM-bound ideal is ``RD_ABs x tCCD_L / (1 - tRFC / tREFI)``: every bank of every chip delivers 64
bits per tCCD_L, less refresh. System figures (:func:`system_bandwidth`) scale to channels x DIMMs x ranks (L3
Table 2: 16 channels x 2 DIMMs x 2 ranks). :func:`rankset_sim` is a command-level simulation of section 5.1
(one rankset receives KV writes while the others compute, sharing a channel's command bus).
Units: cycles are DRAM command-clock cycles (nCK, ``tck_ps`` = 625 ps at DDR4-3200: 1600 MHz); bandwidth in GB/s
(10^9 bytes per second).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hdl.memctl.commands import Cmd
from hdl.pim.allbank import ALLBANK_KINDS, AllBankState, row_timing
from hdl.pim.mapping import region_rows, score_reads, context_reads
from sim.dram.trace import TraceCommand

__all__ = ["PIMPerfModel", "HeadTiming", "PIMSequenceModel", "SeqLaunch", "SeqHead", "SeqRun",
           "paper_model", "paper_sequence_model", "calibration_key", "load_calibration", "CALIBRATION_FILE", "calibrate", "steady_residuals", "system_bandwidth", "bus_bandwidth_gbps",
           "rankset_sim", "RanksetResult", "L3_CHANNELS", "L3_DIMMS_PER_CHANNEL", "L3_CPU_BANDWIDTH_GBPS",
           "L3_PIM_BANDWIDTH_TBPS"]

#: [L3] Table 2: "Memory 16 Channels x 2 DIMM"; each DIMM "2 Ranks x 4 Bank Groups x 4 Banks" (org.ranks = 2).
L3_CHANNELS = 16
L3_DIMMS_PER_CHANNEL = 2
#: [L3] Table 2 "Bandwidth 406GB/s (CPU) 13.0TB/s (DIMM-PIM)"; section 2 "16-channel DDR4-3200 memory (406GB/s)".
L3_CPU_BANDWIDTH_GBPS = 406.0
L3_PIM_BANDWIDTH_TBPS = 13.0

_NEG = -(1 << 40)

#: RTL-measured datapath latencies per rank-PU geometry (written by ``python -m sim.bench.pim --calibrate``,
#: read by :func:`load_calibration`; tests/hdl/pim hold the micro / TINY entries to the RTL).
CALIBRATION_FILE = Path(__file__).resolve().parents[2] / "data" / "pim_rtl_calibration.json"


def calibration_key(config) -> str:
    """The datapath geometry the RTL latencies depend on (not the rows, columns or buffer size): chips, banks,
    head dim, rank adders, context accumulator format, DRAM timing."""
    acc = getattr(config, "context_acc", "fp16")
    return (f"c{config.chips}-b{config.banks}-d{config.head_dim}-a{config.rank_adders}-{acc}-"
            f"{config.dram.timing.name}")


def load_calibration(config, path=None) -> dict:
    """``{"gap", "tail", "fixed_cycles", ...}`` measured on the RTL for ``config``'s geometry
    (:func:`calibration_key`). Raises ValueError naming the command that measures it when absent."""
    path = Path(path) if path is not None else CALIBRATION_FILE
    data = json.loads(path.read_text()) if path.exists() else {}
    key = calibration_key(config)
    if key not in data.get("configs", {}):
        raise ValueError(f"no RTL calibration for {config.name!r} (key {key!r}) in {path}; measure it with "
                         f"`python -m sim.bench.pim --calibrate` (known: {sorted(data.get('configs', {}))})")
    return data["configs"][key]


def _runs(reads, row0):
    out = []
    for r in (reads.row + row0).tolist():
        if out and out[-1][0] == r:
            out[-1][1] += 1
        else:
            out.append([r, 1])
    return [n for _, n in out]


class _Rank:
    """Command-level state of one rank running all-bank row streams (the rules of :mod:`hdl.pim.allbank`)."""

    def __init__(self, tm, due0):
        self.tm = tm
        self.ab = AllBankState(tm)
        self.due = due0
        self.refs = 0
        self.rds = 0
        self.first = None

    @property
    def prea(self):
        return self.ab.last[Cmd.PREA]

    def row(self, n, earliest=0):
        act, _, _, p = row_timing(self.ab, n, earliest=earliest)
        if self.first is None:
            self.first = act
        self.rds += n
        return p

    def refresh(self):
        t = self.ab.legal(Cmd.REF)
        self.ab.issue(Cmd.REF, t)
        self.due += self.tm.tREFI
        self.refs += 1
        return t

    def stream(self, runs, *, in_head_refresh, earliest=0):
        """Rows of ``runs`` (RD_ABs per row); REF at a row boundary when due (and more rows follow)."""
        for i, n in enumerate(runs):
            p = self.row(n, earliest if i == 0 else 0)
            if in_head_refresh and i + 1 < len(runs) and p >= self.due:
                self.refresh()
        return self.prea


@dataclass(frozen=True)
class HeadTiming:
    """One head on one rank. Cycles (nCK) from the first ACT_AB: ``command_cycles`` = cycle of the last command
    (final PREA) of the DRAM stream + 1; ``cycles`` = that + ``fixed_cycles``; ``ideal_cycles`` = the
    DRAM-bound all-bank ideal of one head, RD_ABs x tCCD_L (no refresh); ``refresh_mode`` as chosen."""
    L: int
    score_rd_ab: int
    context_rd_ab: int
    rows: int
    refs: int
    command_cycles: int
    cycles: int
    ideal_cycles: float
    refresh_mode: str
    tck_ps: int

    @property
    def rd_ab(self) -> int:
        return self.score_rd_ab + self.context_rd_ab

    @property
    def utilization(self) -> float:
        """Ideal / modelled cycles."""
        return self.ideal_cycles / self.cycles

    @property
    def time_us(self) -> float:
        return self.cycles * self.tck_ps * 1e-6


class PIMPerfModel:
    """Per-rank performance of the fused kernel of ``config`` (a :class:`hdl.pim.config.PIMConfig`).

    ``fixed_cycles``: calibrated pipeline fill / drain cycles per head (module docstring); ``refresh``:
    ``"auto"``, ``"between"``, ``"in_head"`` or ``"off"``."""

    REFRESH_MODES = ("auto", "between", "in_head", "off")

    def __init__(self, config, *, fixed_cycles: int = 0, refresh: str = "auto", overlap: bool = True):
        if refresh not in self.REFRESH_MODES:
            raise ValueError(f"refresh must be one of {self.REFRESH_MODES}, got {refresh!r}")
        if not 0 <= fixed_cycles < 1 << 30:
            raise ValueError(f"fixed_cycles must be in [0, 2**30), got {fixed_cycles}")
        self.config = config
        self.fixed_cycles = int(fixed_cycles)
        self.refresh = refresh
        self.overlap = bool(overlap)
        self.tm = config.dram.timing

    def with_fixed_cycles(self, fixed_cycles):
        return PIMPerfModel(self.config, fixed_cycles=fixed_cycles, refresh=self.refresh, overlap=self.overlap)

    @classmethod
    def calibrated(cls, config, **kwargs) -> "PIMPerfModel":
        """The model with ``fixed_cycles`` measured on the RTL of ``config``'s geometry (:func:`load_calibration`)."""
        return cls(config, fixed_cycles=int(load_calibration(config)["fixed_cycles"]), **kwargs)

    def overlaps(self, L) -> bool:
        """Back-to-back heads of ``L`` tokens overlap in the rank PU (both heads' e_t fit the rank buffer)."""
        B = self.config.banks
        return self.overlap and 2 * (-(-L // B) * B) <= self.config.max_tokens

    # ---- command counts ------------------------------------------------------------------------------------
    def score_rd_ab(self, L):
        return -(-L // self.config.banks) * self.config.bursts_per_token

    def context_rd_ab(self, L):
        return -(-L // self.config.token_sets)

    def head_runs(self, L):
        """RD_ABs per row, in issue order: the K rows then the V rows of one head (hdl.pim.mapping)."""
        kr, _ = region_rows(self.config, L)
        return _runs(score_reads(self.config, L), 0) + _runs(context_reads(self.config, L), kr)

    def refresh_efficiency(self):
        return 1.0 - self.tm.tRFC / self.tm.tREFI

    def ideal_cycles(self, L, *, refresh=True):
        """All-bank DRAM-bound cycles per head: one RD_AB (64 bits per bank per chip) per tCCD_L; with
        ``refresh``, divided by ``1 - tRFC / tREFI`` (the steady-state ideal to compare :meth:`heads_period`
        with)."""
        c = (self.score_rd_ab(L) + self.context_rd_ab(L)) * self.tm.tCCD_L
        return c / self.refresh_efficiency() if refresh else float(c)

    # ---- one head --------------------------------------------------------------------------------------------
    def _mode(self, L, runs):
        if self.refresh != "auto":
            return self.refresh
        r = _Rank(self.tm, 1 << 60)
        end = r.stream(runs, in_head_refresh=False) + 1 + self.fixed_cycles
        # between heads: the owed REFs are issued before the head, so it may last max_postponed tREFI
        return "between" if end <= self.config.max_postponed_refresh * self.tm.tREFI else "in_head"

    def head(self, L) -> HeadTiming:
        """Latency of one head from its first ACT_AB (refresh owed at its start: none; in-head REFs counted)."""
        if not 1 <= L <= self.config.max_tokens:
            raise ValueError(f"L = {L} outside [1, config.max_tokens = {self.config.max_tokens}]")
        runs = self.head_runs(L)
        mode = self._mode(L, runs)
        r = _Rank(self.tm, self.tm.tREFI)
        end = r.stream(runs, in_head_refresh=mode == "in_head") + 1
        return HeadTiming(L=L, score_rd_ab=self.score_rd_ab(L), context_rd_ab=self.context_rd_ab(L),
                          rows=len(runs), refs=r.refs, command_cycles=end, cycles=end + self.fixed_cycles,
                          ideal_cycles=self.ideal_cycles(L, refresh=False), refresh_mode=mode, tck_ps=self.tm.tck_ps)

    def head_cycles(self, L) -> int:
        return self.head(L).cycles

    def steady_head_cycles(self, L) -> int:
        """Cycles per head of a rank running heads of ``L`` tokens back to back, refresh not due (compare with
        ``rtl_cycles``' ``steady_cycles``): overlapped heads (:meth:`overlaps`) cost their rows only (each row
        ``tRCD + (n - 1) tCCD_L + tRTP + tRPab`` when tRAS / tRC do not bind: 48 cycles more than its RD_ABs at
        DDR4-3200), sequential heads also ``fixed_cycles``."""
        runs = self.head_runs(L)
        r = _Rank(self.tm, 1 << 60)
        gap = 0 if self.overlaps(L) else self.fixed_cycles
        r.stream(runs, in_head_refresh=False)
        p0 = r.prea
        r.stream(runs, in_head_refresh=False, earliest=p0 + 1 + gap)
        return r.prea - p0

    def heads_period(self, L, heads=None) -> float:
        """Average cycles per head of a rank running heads of ``L`` tokens back to back (steady state, refresh
        included: between heads, all owed REFs before a head that would otherwise exceed the postponement
        limit; or in-head). Overlapped heads (:meth:`overlaps`) follow each other's rows directly; otherwise the
        next head starts ``fixed_cycles`` after the previous one's last PREA."""
        runs = self.head_runs(L)
        mode = self._mode(L, runs)
        tm = self.tm
        gap = 0 if self.overlaps(L) else self.fixed_cycles
        one = self.head(L).command_cycles + gap
        if heads is None:
            heads = max(4, -(-40 * tm.tREFI // one))
        r = _Rank(tm, tm.tREFI)
        start = 0
        for _ in range(heads):
            if mode == "between":
                now = max(start, r.prea + 1)
                owed = max(0, (now - r.due) // tm.tREFI + 1)
                owed_after = (now + one - r.due) // tm.tREFI + 1
                if owed and owed_after > self.config.max_postponed_refresh:
                    for _k in range(owed):
                        r.refresh()
            r.stream(runs, in_head_refresh=mode == "in_head", earliest=start)
            start = r.prea + 1 + gap
        return (start - r.first) / heads

    def gflops(self, L, period=None):
        """Useful FP16 operations per second of one rank (2 d L for q K^T plus 2 d L for p V), GFLOP/s."""
        period = self.heads_period(L) if period is None else period
        return 4 * self.config.head_dim * L / (period * self.tm.tck_ps * 1e-12) * 1e-9


def paper_model(**kwargs) -> PIMPerfModel:
    """The PIM performance model of the paper's rank (:data:`hdl.pim.config.PAPER`: 8 x8 chips x 16 banks, head
    dim 128, DDR4-3200) with ``fixed_cycles`` measured on the PAPER rank's RTL (``data/pim_rtl_calibration.json``,
    written by ``python -m sim.bench.pim --calibrate paper``): the model the host's L3 system model uses.
    ``kwargs``: :class:`PIMPerfModel`'s (``refresh``, ``overlap``)."""
    from hdl.pim.config import PAPER
    return PIMPerfModel.calibrated(PAPER, **kwargs)


def paper_sequence_model(**kwargs) -> "PIMSequenceModel":
    """:class:`PIMSequenceModel` of the paper's rank with the datapath latencies measured on its RTL (the
    command-for-command model; :func:`paper_model` is the fast per-head one)."""
    from hdl.pim.config import PAPER
    return PIMSequenceModel.calibrated(PAPER, **kwargs)


def calibrate(model: PIMPerfModel, rtl_points):
    """Fit ``fixed_cycles`` to RTL measurements ``[(L, rtl_cycles), ...]`` (cycles of one head from its first
    ACT_AB to the output, refresh off or not due). Returns ``(calibrated model, residuals)`` with residual =
    rtl - model per point; the fit is the rounded mean of ``rtl - command_cycles``."""
    pts = [(int(L), int(c)) for L, c in rtl_points]
    if not pts:
        raise ValueError("calibrate needs at least one (L, rtl_cycles) point")
    base = PIMPerfModel(model.config, fixed_cycles=0, refresh=model.refresh)
    diffs = [c - base.head(L).command_cycles for L, c in pts]
    fixed = max(0, int(round(float(np.mean(diffs)))))
    cal = base.with_fixed_cycles(fixed)
    return cal, [c - cal.head(L).cycles for L, c in pts]


def steady_residuals(model: PIMPerfModel, rtl_points):
    """rtl - :meth:`PIMPerfModel.steady_head_cycles` per RTL steady-state point ``[(L, cycles per head), ...]``
    (``rtl_cycles``' ``steady_cycles``)."""
    return [float(c) - model.steady_head_cycles(int(L)) for L, c in rtl_points]


# ---- the rank PU's command sequence, head by head (RTL-level model) --------------------------------------------

@dataclass(frozen=True)
class SeqLaunch:
    """One kernel launch as the rank PU takes it (``hdl.pim.rank_pu.launch_layout``): ``L`` tokens, the first row
    of the head's K and V regions, the refresh hint ``postpone`` (None: ``config.max_postponed_refresh``)."""
    L: int
    k_row0: int = 0
    v_row0: int | None = None
    postpone: int | None = None


@dataclass
class SeqHead:
    """One launch in :meth:`PIMSequenceModel.run` (cycles as the device model counts them, 0 = first cycle after
    reset): ``accept`` (the sequencer takes the launch), ``first_cmd``, the first / last RD_AB of the score and
    context phases, ``done`` (the cycle the head's last result element is taken: ``PIMChannelSystem``'s ``done``
    record), ``refreshes`` / ``urgent`` (REFs issued so far / of them inside a head, at ``done``)."""
    L: int
    accept: int = 0
    first_cmd: int = 0
    score_first: int = 0
    score_last: int = 0
    context_first: int = 0
    context_last: int = 0
    done: int = 0
    refreshes: int = 0
    urgent: int = 0


@dataclass
class SeqRun:
    heads: list                     # SeqHead per launch, launch order
    commands: list                  # (cycle, Cmd, row, col) of the rank's commands, cycle order

    @property
    def done(self):
        return [h.done for h in self.heads]

    def head_cycles(self):
        """Per launch: the first head from its first command (inclusive), every other one from the previous
        head's ``done`` -- the per-head cycle counts the RTL tests compare."""
        out, prev = [], None
        for h in self.heads:
            out.append(h.done - h.first_cmd + 1 if prev is None else h.done - prev)
            prev = h.done
        return out


class PIMSequenceModel:
    """The command sequence of one rank PU (``hdl.pim.rank_pu.PIMSequencer`` + the fused-kernel datapath of
    ``RankPU``) for a list of launches, command by command in closed form per row (O(rows + REFs), no per-cycle
    loop): the sequencer's states (IDLE / PLAN / REFRESH / RUN, one cycle per decision), the all-bank rules of
    :mod:`hdl.pim.allbank` (the counters of the RTL), the overlap decision (S0 S1 C0 S2 C1 ... when both heads'
    exponentials fit the rank buffer), the refresh decisions between heads (the hardware's head bound, the
    launch's ``postpone``, pull-in limit) and urgent in-head refresh, the RankPU's 2-entry launch queue. The
    datapath enters through two latencies measured on the RTL (:func:`datapath_latencies`):

    * ``gap``: last score RD_AB of a head -> the earliest cycle its first context RD_AB may issue (the
      probabilities: CL, bank PU, link, adder tree, chunk softmax, normalizer); ``gap1`` the same for a head of
      one chunk (``L <= B``: the softmax unit has no running rescale to do, so it is shorter);
    * ``tail``: last context RD_AB -> ``done`` (CL, bank PU, context readout, aggregation, ``d`` results).

    Assumes the result / done streams always ready and launches presented at ``arrivals`` (default: all at
    cycle 0, i.e. full rate). ``launch_queue=False``: the launches reach the sequencer directly (no RankPU
    launch queue; a :class:`PIMSequencer` test bench) -- then ``gap`` / ``tail`` describe the bench. Used to hold the RTL to the model (tests/hdl/pim) and for per-head figures with
    refresh and overlap; :class:`PIMPerfModel` is the faster steady-state / single-head model."""

    IDLE, PLAN, REFRESH, RUN = range(4)

    def __init__(self, config, *, gap: int, tail: int, gap1: int | None = None, overlap: bool = True,
                 drain: int | None = None, launch_queue: bool = True):
        from hdl.pim.rank_pu import RankPU, head_cycle_bound, _urgent_margin
        gap1 = gap if gap1 is None else gap1
        for name, v in (("gap", gap), ("tail", tail), ("gap1", gap1)):
            if not isinstance(v, (int, np.integer)) or not 0 <= v < 1 << 20:
                raise ValueError(f"{name} must be an int in [0, 2**20), got {v!r}")
        self.config = config
        self.tm = config.dram.timing
        self.gap, self.tail, self.gap1 = int(gap), int(tail), int(gap1)
        self.overlap = bool(overlap)
        self.launch_queue = bool(launch_queue)
        self.drain = RankPU.drain_bound(config) if drain is None else int(drain)
        self.margin = _urgent_margin(self.tm)
        self._bound = lambda L: head_cycle_bound(config, L, drain=self.drain)

    @classmethod
    def calibrated(cls, config, **kwargs) -> "PIMSequenceModel":
        """The model with ``gap`` / ``tail`` measured on the RTL of ``config``'s geometry (:func:`load_calibration`)."""
        c = load_calibration(config)
        return cls(config, gap=int(c["gap"]), tail=int(c["tail"]), gap1=int(c.get("gap1", c["gap"])), **kwargs)

    # -- helpers ------------------------------------------------------------------------------------------------
    def _slots(self, L):
        B = self.config.banks
        return -(-L // B) * B

    def _phase_rows(self, L, kind, row0):
        cfg = self.config
        n = -(-L // cfg.banks) * cfg.bursts_per_token if kind == "S" else -(-L // cfg.token_sets)
        cpr = cfg.columns_per_row
        rows = []
        for i in range(0, n, cpr):
            rows.append((row0 + i // cpr, min(cpr, n - i)))
        return rows

    def run(self, launches, *, arrivals=None) -> SeqRun:
        """``launches``: :class:`SeqLaunch` (or ``L`` ints: K at row 0, V after it) in launch order. Returns
        a :class:`SeqRun` (per-launch :class:`SeqHead` and the command list)."""
        from hdl.pim.mapping import region_rows
        cfg, tm = self.config, self.tm
        maxpp = cfg.max_postponed_refresh
        L_ = []
        for x in launches:
            if not isinstance(x, SeqLaunch):
                x = SeqLaunch(int(x))
            if not 1 <= x.L <= cfg.max_tokens:
                raise ValueError(f"L = {x.L} outside [1, config.max_tokens = {cfg.max_tokens}]")
            v0 = x.v_row0 if x.v_row0 is not None else x.k_row0 + region_rows(cfg, x.L)[0]
            L_.append(SeqLaunch(x.L, x.k_row0, v0, maxpp if x.postpone is None else x.postpone))
        launches = L_
        n = len(launches)
        arrivals = [0] * n if arrivals is None else [int(a) for a in arrivals]
        heads = [SeqHead(L=x.L) for x in launches]
        cmds = []
        ab = AllBankState(tm)
        st = {"row": None, "refs": 0, "c": 0}
        urgent_refs = []
        enq, take = [], []

        def avail(i):
            """Cycle from which launch i is at the head of the RankPU's launch queue (SyncFIFO, depth 2)."""
            if not self.launch_queue:     # presented directly: the cycle after the previous one was taken
                return max(arrivals[i], take[i - 1] + 1 if i else 0)
            while len(enq) <= i:
                j = len(enq)
                e = arrivals[j]
                if j >= 1:
                    e = max(e, enq[j - 1] + 1)
                if j >= 2:
                    e = max(e, take[j - 2] + 1)
                enq.append(e)
            return enq[i] + 1

        def deadline():
            return (maxpp + 1 + st["refs"]) * tm.tREFI

        def owed(t):
            return max(0, (t - 1) // tm.tREFI) - st["refs"]

        def urgent_from():
            return deadline() - self.margin + 1

        def issue(kind, t, row=0, col=0):
            ab.issue(kind, t)
            cmds.append((t, kind, row, col))
            st["c"] = t + 1

        def ref_at(c, urgent):
            """close_row_then_ref from cycle c: PREA if a row is open, then REF. Returns the REF cycle."""
            if st["row"] is not None:
                issue(Cmd.PREA, max(c, ab.legal(Cmd.PREA)))
                st["row"] = None
                c = st["c"]
            t = max(c, ab.legal(Cmd.REF))
            issue(Cmd.REF, t)
            st["refs"] += 1
            if urgent:
                urgent_refs.append(t)
            return t

        def step(kind, earliest=0, row=0, col=0):
            """Issue ``kind`` at the first legal cycle >= the FSM's cycle, unless the urgent refresh comes first
            (then refresh, return None: the caller retries)."""
            x = max(st["c"], earliest, ab.legal(kind))
            u = urgent_from()
            if u <= x:
                ref_at(max(st["c"], u), True)
                return None
            issue(kind, x, row, col)
            return x

        def run_phase(h, kind):
            """RUN: the phase's rows; returns (first RD_AB, last RD_AB)."""
            x = launches[h]
            rows = self._phase_rows(x.L, kind, x.k_row0 if kind == "S" else x.v_row0)
            g = self.gap1 if x.L <= cfg.banks else self.gap
            p_first = heads[h].score_last + g if kind == "C" else 0
            first = last = None
            for row, m in rows:
                col = 0
                while col < m:
                    if st["row"] != row:
                        if st["row"] is not None:
                            if step(Cmd.PREA) is None:
                                continue
                            st["row"] = None
                        if step(Cmd.ACT_AB, row=row) is None:
                            continue
                        st["row"] = row
                        if heads[h].first_cmd is None:
                            heads[h].first_cmd = st["c"] - 1
                    t0 = step(Cmd.RD_AB, p_first if first is None else 0, row, col)
                    if t0 is None:
                        continue
                    if first is None:
                        first = t0
                    col += 1
                    # the rest of the row: tCCD_L apart until the urgent refresh (if it comes inside the row)
                    gap = ab.gaps[Cmd.RD_AB][Cmd.RD_AB]
                    u = urgent_from()
                    k = m - col if u > t0 + (m - col) * gap else max(0, (u - 1 - t0) // gap)
                    for j in range(1, k + 1):
                        cmds.append((t0 + j * gap, Cmd.RD_AB, row, col + j - 1))
                    if k:
                        ab.issue(Cmd.RD_AB, t0 + k * gap)
                        st["c"] = t0 + k * gap + 1
                        col += k
                    last = ab.last[Cmd.RD_AB]
            return first, last

        def refresh_state(c, bound, postpone):
            """REFRESH from cycle c: REFs while the head would not fit before the deadline (or too many are
            owed, or urgent). Returns the first RUN cycle."""
            while True:
                need = ((deadline() < c + bound and owed(c) > -maxpp) or owed(c) > postpone
                        or deadline() < c + self.margin)
                if not need:
                    return c + 1
                ref_at(c, False)
                c = st["c"]

        def accept(h, c):
            take.append(c)
            heads[h].accept = c
            heads[h].first_cmd = None
            return c + 1      # PLAN

        state, c = self.IDLE, 0
        nxt, sc, pend = 0, None, None
        bound_of = {}
        while True:
            if state == self.IDLE:
                if nxt >= n:
                    break
                a = max(c, avail(nxt))
                u = urgent_from()
                if u <= a:               # idle refresh (rows are closed in IDLE)
                    c = max(c, u)
                    st["c"] = c
                    ref_at(c, False)
                    c = st["c"]
                    continue
                c = a
                sc = nxt
                c = accept(nxt, c)
                nxt += 1
                state = self.PLAN
            if state == self.PLAN:
                x = launches[sc]
                bound_of[sc] = self._bound(x.L)
                c += 1
                bound = bound_of[sc] + (bound_of[pend] if pend is not None else 0)
                st["c"] = c
                c = refresh_state(c, bound, x.postpone)
                st["c"] = c
                state = self.RUN
                h = sc
                heads[h].score_first, heads[h].score_last = run_phase(h, "S")
            # score phase of `sc` ended: decision at the next cycle
            d = st["c"]
            while urgent_from() <= d:
                st["c"] = d
                ref_at(d, True)
                d = st["c"]
            if pend is not None:
                ctx_h, pend = pend, sc
            elif nxt < n and self.overlap and avail(nxt) <= d and \
                    self._slots(launches[sc].L) + self._slots(launches[nxt].L) <= cfg.max_tokens:
                pend = sc
                sc = nxt
                c = accept(nxt, d)
                nxt += 1
                state = self.PLAN
                continue
            else:
                ctx_h = sc
            st["c"] = d + 1
            while True:
                hh = heads[ctx_h]
                hh.context_first, hh.context_last = run_phase(ctx_h, "C")
                hh.done = hh.context_last + self.tail
                d = st["c"]
                while urgent_from() <= d:
                    st["c"] = d
                    ref_at(d, True)
                    d = st["c"]
                if pend is None:
                    break
                if nxt < n and self.overlap and avail(nxt) <= d and \
                        self._slots(launches[pend].L) + self._slots(launches[nxt].L) <= cfg.max_tokens:
                    sc = nxt
                    c = accept(nxt, d)
                    nxt += 1
                    state = self.PLAN
                    break
                ctx_h, pend = pend, None
                st["c"] = d + 1
            if state == self.PLAN:
                continue
            # context ended, nothing pending: close the row, then IDLE
            while st["row"] is not None:
                if step(Cmd.PREA) is not None:
                    st["row"] = None
            c = st["c"] + 1
            state = self.IDLE
        cmds.sort(key=lambda x: x[0])
        refs = [t for t, k, _, _ in cmds if k is Cmd.REF]
        for hh in heads:
            # the done record's counters: REFs issued before the done cycle
            hh.refreshes = sum(1 for t in refs if t < hh.done)
            hh.urgent = sum(1 for t in urgent_refs if t < hh.done)
            if hh.first_cmd is None:
                hh.first_cmd = hh.score_first
        return SeqRun(heads=heads, commands=cmds)


# ---- system bandwidth ----------------------------------------------------------------------------------------

def bus_bandwidth_gbps(config, channels=L3_CHANNELS):
    """CPU-side DQ bandwidth: channels x data rate x 8 bytes (DDR4-3200: 3200 MT/s x 64-bit bus), GB/s."""
    org = config.dram.org
    mts = org.beats_per_clock * 1e6 / config.dram.timing.tck_ps          # MT/s per pin
    return channels * mts * 1e6 * org.bus_width / 8 / 1e9


def system_bandwidth(config, channels=L3_CHANNELS, dimms=L3_DIMMS_PER_CHANNEL):
    """Aggregate internal PIM bandwidth: channels x DIMMs x ranks x banks x chips x 64 bits per tCCD_L.

    Returns a dict (GB/s): ``pim_peak`` (no refresh), ``pim_refresh`` (x (1 - tRFC / tREFI)), ``bus`` (the CPU's
    DQ bandwidth), ``ratio`` = pim_peak / bus, and the paper's ``paper_cpu`` / ``paper_pim``."""
    org, tm = config.dram.org, config.dram.timing
    ranks = channels * dimms * org.ranks
    bits = ranks * org.banks * config.chips * config.chip_burst_bits
    peak = bits / 8 / (tm.tCCD_L * tm.tck_ps * 1e-12) / 1e9
    bus = bus_bandwidth_gbps(config, channels)
    return {"ranks": ranks, "pim_peak": peak, "pim_refresh": peak * (1 - tm.tRFC / tm.tREFI), "bus": bus,
            "ratio": peak / bus, "paper_cpu": L3_CPU_BANDWIDTH_GBPS, "paper_pim": L3_PIM_BANDWIDTH_TBPS * 1000}


# ---- ranksets (section 5.1) ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RanksetResult:
    ranks: int
    window_cycles: int          # cycles the receiving rank took for its writes
    writes: int                 # WR bursts written to the receiving rank
    write_gbps: float           # achieved write bandwidth (GB/s) into the receiving rank
    dq_peak_gbps: float         # the channel's DQ bus peak
    rd_ab_with_comm: int        # RD_ABs of the computing ranks within the window
    rd_ab_all_compute: int      # RD_ABs of all ranks in the same window without communication
    rd_ab_alone: int            # RD_ABs of the computing ranks in the window without the writer (bus contention)
    cmd_bus_busy: float         # fraction of command-bus cycles used during the window

    @property
    def preserved(self) -> float:
        """Fraction of the channel's PIM compute (RD_AB rate) kept during the transfer."""
        return self.rd_ab_with_comm / self.rd_ab_all_compute

    @property
    def contention_loss(self) -> float:
        """Fraction of the computing ranks' RD_ABs lost to the writer's command-bus use."""
        return 1 - self.rd_ab_with_comm / self.rd_ab_alone


class _Agent:
    """A rank's in-order command program with its legality rules (one command per cycle on the shared bus)."""

    def __init__(self, tm, org, prog):
        self.tm, self.org, self.prog, self.pos = tm, org, prog, 0
        nb = org.banks
        self.b_act = [_NEG] * nb
        self.b_pre = [_NEG] * nb
        self.b_wr = [_NEG] * nb
        self.g_wr = [_NEG] * org.bank_groups
        self.g_act = [_NEG] * org.bank_groups
        self.wr = self.act_any = _NEG
        self.faw = [_NEG] * 4
        self.ab = AllBankState(tm)      # all-bank commands: hdl/pim/allbank.py
        self.count = {}

    def next(self):
        return self.prog[self.pos] if self.pos < len(self.prog) else None

    def legal(self, c):
        tm = self.tm
        kind, b = c[0], c[1]
        g = b // self.org.banks_per_group if b >= 0 else 0
        if kind in ALLBANK_KINDS:
            return self.ab.legal(kind)
        if kind is Cmd.ACT:
            return max(self.b_pre[b] + tm.tRP, self.b_act[b] + tm.tRC, self.act_any + tm.tRRD_S,
                       self.g_act[g] + tm.tRRD_L, self.faw[0] + tm.tFAW)
        if kind is Cmd.WR:
            return max(self.b_act[b] + tm.tRCD, self.wr + tm.tCCD_S, self.g_wr[g] + tm.tCCD_L)
        if kind is Cmd.PRE:
            return max(self.b_act[b] + tm.tRAS,
                       self.b_wr[b] + tm.CWL + self.org.burst_cycles + tm.tWR)
        raise AssertionError(kind)

    def issue(self, c, t):
        kind, b = c[0], c[1]
        self.pos += 1
        self.count[kind] = self.count.get(kind, 0) + 1
        if kind in ALLBANK_KINDS:
            self.ab.issue(kind, t)
        elif kind is Cmd.ACT:
            g = b // self.org.banks_per_group
            self.b_act[b] = self.act_any = self.g_act[g] = t
            self.faw = self.faw[1:] + [t]
        elif kind is Cmd.WR:
            g = b // self.org.banks_per_group
            self.b_wr[b] = self.wr = self.g_wr[g] = t
        elif kind is Cmd.PRE:
            self.b_pre[b] = t


def _write_program(org, n_writes):
    """Host KV writes into one rank at full DQ rate: sets of one bank per bank group opened together, their rows
    written column-interleaved across the bank groups (tCCD_S apart), the next set's ACTs issued halfway
    through the current set's rows (row switches hidden), PREs after the last column."""
    G, K, cpr = org.bank_groups, org.banks_per_group, org.bursts_per_row
    sets = -(-n_writes // (G * cpr))
    prog, left = [], n_writes
    banks = lambda s: [g * K + (s % K) for g in range(G)]
    row = lambda s: s // K
    prog += [(Cmd.ACT, b, row(0), 0) for b in banks(0)]
    for s in range(sets):
        for col in range(cpr):
            for b in banks(s):
                if left:
                    prog.append((Cmd.WR, b, row(s), col))
                    left -= 1
            if col == cpr // 2 and s + 1 < sets:
                # a set of bank s+1 uses the next bank of every group: its ACTs overlap this set's writes
                prog += [(Cmd.ACT, b, row(s + 1), 0) for b in banks(s + 1)]
        prog += [(Cmd.PRE, b, row(s), 0) for b in banks(s)]
    return prog


def _pim_program(config, L, heads):
    rows = [(int(r), int(c)) for reads, r0 in ((score_reads(config, L), 0),
                                               (context_reads(config, L), region_rows(config, L)[0]))
            for r, c in zip(reads.row + r0, reads.col)]
    prog = []
    for _ in range(heads):
        last = None
        for r, c in rows:
            if r != last:
                if last is not None:
                    prog.append((Cmd.PREA, -1, 0, 0))
                prog.append((Cmd.ACT_AB, -1, r, 0))
                last = r
            prog.append((Cmd.RD_AB, -1, r, c))
        prog.append((Cmd.PREA, -1, 0, 0))
    return prog


def _bus_sim(tm, org, agents, until_agent=None, stop_at=None, record=None):
    """Greedy earliest-legal list scheduling on one command bus (ties: lowest agent). Returns (end cycle of
    ``until_agent``'s program or of all, per-agent issue cycles of RD_AB)."""
    bus, rd_cycles, busy = 0, [[] for _ in agents], 0
    end = None
    while True:
        best = None
        for i, a in enumerate(agents):
            c = a.next()
            if c is None:
                continue
            t = max(a.legal(c), bus)
            if best is None or t < best[0]:
                best = (t, i, c)
        if best is None:
            break
        t, i, c = best
        if (end is not None and t > end) or (stop_at is not None and t > stop_at):
            break
        agents[i].issue(c, t)
        if record is not None:
            b = max(c[1], 0)
            record.append(TraceCommand(t, c[0], i, b // org.banks_per_group, b % org.banks_per_group, c[2], c[3]))
        busy += 1
        bus = t + 1
        if c[0] is Cmd.RD_AB:
            rd_cycles[i].append(t)
        if until_agent is not None and i == until_agent and agents[i].next() is None:
            end = t
    return end if end is not None else bus - 1, rd_cycles, busy


def rankset_sim(config, ranks, *, writes=4096, L=32768, trace=None):
    """Section 5.1 on one channel with ``ranks`` ranks: rank 0 (its rankset) receives ``writes`` WR bursts of
    host KV data at the DQ bus rate while ranks 1.. run the fused kernel (heads of ``L`` tokens), all sharing
    the command bus (one command per cycle, greedy earliest-legal, the writer first on ties). Compared with
    (a) all ``ranks`` computing without communication and (b) ranks 1.. computing without the writer, over the
    writer's window. Refresh is left out (it costs every rank the same ``tRFC / tREFI``). ``trace``: a list that
    receives the with-communication command trace (:class:`sim.dram.trace.TraceCommand`, rank = agent index) for
    the JEDEC checker."""
    tm, org = config.dram.timing, config.dram.org
    if not 2 <= ranks <= 8:
        raise ValueError(f"ranks must be in [2, 8], got {ranks}")
    wprog = _write_program(org, writes)
    heads = 1
    pprog = _pim_program(config, L, heads)
    mk = lambda prog: _Agent(tm, org, prog)
    window, rd, busy = _bus_sim(tm, org, [mk(wprog)] + [mk(pprog) for _ in range(ranks - 1)], until_agent=0,
                                record=trace)
    with_comm = sum(sum(1 for t in r if t <= window) for r in rd[1:])
    _, rd_all, _ = _bus_sim(tm, org, [mk(pprog) for _ in range(ranks)], stop_at=window)
    all_compute = sum(sum(1 for t in r if t <= window) for r in rd_all)
    _, rd_alone, _ = _bus_sim(tm, org, [mk(pprog) for _ in range(ranks - 1)], stop_at=window)
    alone = sum(sum(1 for t in r if t <= window) for r in rd_alone)
    if len(rd_alone[0]) == sum(c[0] is Cmd.RD_AB for c in pprog) and rd_alone[0][-1] < window:
        raise ValueError(f"L = {L} too short for the {window}-cycle write window")
    dq_peak = org.clock_bits / 8 / (tm.tck_ps * 1e-12) / 1e9
    wgbps = writes * org.burst_bytes / ((window + 1) * tm.tck_ps * 1e-12) / 1e9
    return RanksetResult(ranks=ranks, window_cycles=window + 1, writes=writes, write_gbps=wgbps, dq_peak_gbps=dq_peak,
                         rd_ab_with_comm=with_comm, rd_ab_all_compute=all_compute, rd_ab_alone=alone,
                         cmd_bus_busy=busy / (window + 1))
