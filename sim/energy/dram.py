"""DRAM energy of a command trace by the DRAMPower method, from the datasheet currents of :mod:`sim.energy.specs`.

Reads the same ``sim.dram.trace.TraceCommand`` lists the JEDEC checker reads (RTL traces decoded by
``decode_trace``; the fast model's by :func:`sim.energy.record.record_stream`). Per die and rail of voltage V, with
currents in mA and times in command clocks of tCK (DRAMPower 4's ``MemoryPowerModel``; Micron TN-41-01):

* ACT  ``V (IDD0 - IDD3N) tRAS``            PRE (per bank closed, PREA closes every open bank)
  ``V (IDD0 - IDD2N) (tRC - tRAS)``         (the pair is IDD0's tRC loop less the standby it contains);
* RD   ``V (IDD4R - IDD3N) tBurst``,   WR  ``V (IDD4W - IDD3N) tBurst``   (tBurst = org.burst_cycles);
* REF  ``V (IDD5B - IDD3N) tRFC``;
* background per rank and cycle: ``V IDD3N`` while a bank of the rank is open or a refresh of it runs
  (tRFC from the REF: the REF term above is an increment over IDD3N), otherwise ``V IDD2N``.

Every term is multiplied by the spec's dies per rank. PIM all-bank commands (no datasheet figure exists) are
charged as every bank's command: ACT_AB = banks x ACT and opens every bank, RD_AB / WR_AB = banks x RD / WR
(upper bound: the in-die transfer does not drive the DQ pins). Power-down and self-refresh are not modelled:
the controller never enters them. Energies are in pJ (mA x V x ns).
"""

from dataclasses import dataclass, asdict

from hdl.memctl.commands import Cmd

from .specs import PowerSpec, power_spec

__all__ = ["CommandEnergy", "DRAMEnergy", "command_energy", "trace_energy", "owed_refresh_pj"]


@dataclass(frozen=True)
class CommandEnergy:
    """Per-rank energies (pJ) of one command, and background energies per command clock."""

    act: float
    pre: float
    rd: float
    wr: float
    ref: float
    act_stby: float   # per cycle, a bank open (or refreshing)
    pre_stby: float   # per cycle, every bank closed


def command_energy(config, spec: PowerSpec | None = None) -> CommandEnergy:
    """The DRAMPower per-command and per-cycle energies of one rank of ``config`` (a DRAMConfig)."""
    spec = power_spec(config) if spec is None else spec
    tm, org = config.timing, config.org
    tck_ns = tm.tck_ps / 1000.0
    k = spec.dies_per_rank * tck_ns

    def s(fn):
        return k * sum(r.volts * fn(r) for r in spec.rails)

    return CommandEnergy(
        act=s(lambda r: (r.idd0 - r.idd3n) * tm.tRAS),
        pre=s(lambda r: (r.idd0 - r.idd2n) * (tm.tRC - tm.tRAS)),
        rd=s(lambda r: (r.idd4r - r.idd3n) * org.burst_cycles),
        wr=s(lambda r: (r.idd4w - r.idd3n) * org.burst_cycles),
        ref=s(lambda r: (r.idd5b - r.idd3n) * tm.tRFC),
        act_stby=s(lambda r: r.idd3n),
        pre_stby=s(lambda r: r.idd2n),
    )


@dataclass
class DRAMEnergy:
    """Energy of one channel's command trace over ``cycles`` command clocks, by term (pJ), with the counts."""

    act_pj: float
    pre_pj: float
    rd_pj: float
    wr_pj: float
    ref_pj: float
    act_stby_pj: float
    pre_stby_pj: float
    acts: int            # bank activations (an ACT_AB counts every bank)
    pres: int            # bank precharges (a PREA counts every bank it closes)
    rds: int             # bursts read (an RD_AB counts every bank)
    wrs: int
    refs: int
    active_cycles: int   # rank-cycles with a bank open or a refresh running, summed over ranks
    idle_cycles: int     # rank-cycles with every bank closed
    cycles: int          # the window, command clocks
    dq_bits: int         # bits moved on the DQ bus (RD / WR / WR_AB bursts)

    @property
    def command_pj(self) -> float:
        return self.act_pj + self.pre_pj + self.rd_pj + self.wr_pj + self.ref_pj

    @property
    def background_pj(self) -> float:
        return self.act_stby_pj + self.pre_stby_pj

    @property
    def total_pj(self) -> float:
        return self.command_pj + self.background_pj

    def pj_per_bit(self) -> float:
        return self.total_pj / self.dq_bits if self.dq_bits else float("nan")

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(command_pj=self.command_pj, background_pj=self.background_pj, total_pj=self.total_pj,
                 pj_per_bit=self.pj_per_bit())
        return d


def _union_length(intervals, lo, hi) -> int:
    """Cycles of [lo, hi) covered by the union of half-open intervals."""
    total = 0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def trace_energy(commands, config, spec: PowerSpec | None = None, *, start_cycle: int = 0,
                 end_cycle: int | None = None) -> DRAMEnergy:
    """Energy of ``commands`` (TraceCommand, issue order) on one channel of ``config`` over the window
    ``[start_cycle, end_cycle)`` (default: up to the cycle after the last command). Every rank of the
    organisation is charged background for the whole window, used or not."""
    spec = power_spec(config) if spec is None else spec
    e = command_energy(config, spec)
    org, tm = config.org, config.timing
    commands = list(commands)
    if end_cycle is None:
        end_cycle = (commands[-1].cycle + 1) if commands else start_cycle
    R, G, K = org.ranks, org.bank_groups, org.banks_per_group
    NB = G * K
    opened = [[None] * NB for _ in range(R)]      # cycle each open bank was activated
    busy = [[] for _ in range(R)]                  # per rank, [start, end) of open banks and refreshes
    acts = pres = rds = wrs = refs = 0
    dq_bursts = 0
    for c in commands:
        k, r = c.kind, c.rank
        ob = opened[r]
        if k is Cmd.ACT:
            ob[c.bg * K + c.bank] = c.cycle
            acts += 1
        elif k is Cmd.ACT_AB:
            for b in range(NB):
                ob[b] = c.cycle
            acts += NB
        elif k is Cmd.PRE:
            b = c.bg * K + c.bank
            if ob[b] is not None:
                busy[r].append((ob[b], c.cycle))
                ob[b] = None
                pres += 1
        elif k is Cmd.PREA:
            for b in range(NB):
                if ob[b] is not None:
                    busy[r].append((ob[b], c.cycle))
                    ob[b] = None
                    pres += 1
        elif k is Cmd.RD:
            rds += 1
            dq_bursts += 1
        elif k is Cmd.WR:
            wrs += 1
            dq_bursts += 1
        elif k is Cmd.RD_AB:
            rds += NB
        elif k is Cmd.WR_AB:
            wrs += NB
            dq_bursts += 1
        elif k is Cmd.REF:
            refs += 1
            busy[r].append((c.cycle, c.cycle + tm.tRFC))
    for r in range(R):
        for b in range(NB):
            if opened[r][b] is not None:
                busy[r].append((opened[r][b], end_cycle))
    window = end_cycle - start_cycle
    active = sum(_union_length(busy[r], start_cycle, end_cycle) for r in range(R))
    idle = R * window - active
    return DRAMEnergy(
        act_pj=acts * e.act, pre_pj=pres * e.pre, rd_pj=rds * e.rd, wr_pj=wrs * e.wr, ref_pj=refs * e.ref,
        act_stby_pj=active * e.act_stby, pre_stby_pj=idle * e.pre_stby,
        acts=acts, pres=pres, rds=rds, wrs=wrs, refs=refs, active_cycles=active, idle_cycles=idle,
        cycles=window, dq_bits=dq_bursts * org.burst_bits,
    )


def owed_refresh_pj(energy: DRAMEnergy, config, spec: PowerSpec | None = None) -> float:
    """Energy of the refreshes due in the window but not issued in it: the controller postpones up to
    ``max_postponed_refresh`` REFs per rank while requests wait, so a short busy stream can end owing some.
    ``ranks x cycles / tREFI - refs`` (at least 0) REFs, each its increment plus tRFC of active instead of
    precharge standby; 0 when the stream issued every REF due."""
    spec = power_spec(config) if spec is None else spec
    e = command_energy(config, spec)
    tm = config.timing
    owed = max(0.0, config.org.ranks * energy.cycles / tm.tREFI - energy.refs)
    return owed * (e.ref + tm.tRFC * (e.act_stby - e.pre_stby))
