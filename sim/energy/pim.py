"""Energy of one DIMM-PIM decode-attention head (the fused kernel, sim/perf/pim.py), calibrated like its cycles.

A head of ``L`` tokens on one rank (:class:`sim.perf.pim.PIMPerfModel`) is charged, in pJ:

* **DRAM commands** -- the head's all-bank stream as the performance model schedules it (``head_runs``: one
  ``ACT_AB`` ... ``PREA`` per row, ``hdl.pim.allbank.row_timing``; the RTL issues the same stream, command for
  command: tests/hdl/pim/test_pim_fused_kernel.py), each command priced by :func:`sim.energy.dram.command_energy`
  with the all-bank rule of docs/energy.md (ACT_AB = banks x ACT, RD_AB = banks x RD, PREA = every open bank's
  PRE); REFs the head issues inside it (``refresh="in_head"``), each its REF increment;
* **DRAM background** of the rank over the head's window: active standby while the rows are open (ACT_AB to
  PREA, from the same schedule) or a refresh runs, precharge standby otherwise; the rank's other rank of the
  DIMM is charged by the host (it idles or runs its own heads);
* **datapath** (:mod:`sim.energy.ops`, Horowitz ISSCC 2014 at 45 nm): the bank PUs' ``q K^T`` and ``p V``
  multiply-adds, ``L d`` each, in FP16 (docs/pim_bank_pu.md, [L3] Table 3 "16-bit floating point
  throughout"; ``context_acc="fp32"`` accumulates the context in FP32), the rank PU's chip reduction (``chips -
  1`` FP16 adds per score and per context element of every token set), the softmax (per token: a max compare,
  a subtract and an FP32 sum add, and one exponential, :data:`EXP_OPS`), and the normalization (``d`` FP16
  multiplies);
* **rank buffer** (SRAM, :func:`sim.energy.ops.sram_read_pj` at the rank buffer's size): every exponential is
  written once and read once (``2 L`` FP16 accesses; a write is charged as a read, assumption [A-SRAMW]).

The RTL-side figure (:func:`trace_head_energy`) takes the RTL's command trace of the same head and the same
operation counts; they differ only where the RTL's trace or window differs from the model's (tests/sim/energy).
"""

from dataclasses import dataclass, asdict, replace

from hdl.memctl.commands import Cmd
from hdl.pim.allbank import AllBankState, row_timing
from sim.dram.trace import TraceCommand

from .dram import command_energy, trace_energy
from .ops import op_pj, sram_read_pj
from .specs import power_spec

__all__ = ["EXP_OPS", "PIMHeadEnergy", "head_ops", "head_commands", "head_energy", "trace_head_energy",
           "launch_energy", "trace_launch_energy",
           "pim_power_spec"]

#: One FP16 exponential, charged as the operations of the project's exp unit (docs/fp_exp.md, hdl/fp/exp.py:
#: "four multipliers" -- 29 x 29 and 12 x 18 constant products and the two table products -- and the
#: range-reduction / normalization adds): 4 x int32 multiply + 2 x int32 add (Horowitz figures; the
#: multipliers are at most 29 bits wide, so an upper bound). No published per-exp figure at 45 nm is used.
EXP_OPS = {"int32_mul": 4, "int32_add": 2}


def pim_power_spec(config):
    """The DRAM power spec of a PIM rank: the DDR4 die's currents (sim.energy.specs) charged on the rank's
    ``chips`` dies (the PAPER rank: 8 x8 chips, the spec's own 8; the test geometries fewer)."""
    spec = power_spec(config.dram)
    return replace(spec, dies_per_rank=int(config.chips))


def head_ops(config, L: int) -> dict:
    """Operation counts of one head of ``L`` tokens (module docstring): ``{op name: count}`` plus
    ``sram_bits`` (rank buffer traffic) and ``flops`` (useful FP16 operations, 4 d L as sim.perf.pim.gflops)."""
    _check_L(config, L)
    d, chips = config.head_dim, config.chips
    ctx_add = "fp32_add" if getattr(config, "context_acc", "fp16") == "fp32" else "fp16_add"
    ops = {"fp16_mul": 2 * L * d + d, "fp16_add": L * d, "fp32_add": 0}
    ops[ctx_add] += L * d
    # rank PU: every score summed over the chips; every context element over the chips
    ops["fp16_add"] += (chips - 1) * (L + d)
    # softmax per token: max compare + subtract (FP16), sum (FP32), one exponential
    ops["fp16_add"] += 2 * L
    ops["fp32_add"] += L
    for k, n in EXP_OPS.items():
        ops[k] = ops.get(k, 0) + n * L
    return {"ops": ops, "sram_bits": 2 * L * 16, "flops": 4 * d * L}


def _check_L(config, L):
    if isinstance(L, bool) or not isinstance(L, int) or not 1 <= L <= config.max_tokens:
        raise ValueError(f"L must be an int in 1..{config.max_tokens} (the rank buffer's tokens), got {L!r}")


def head_commands(model, L: int) -> list:
    """The head's all-bank command stream on rank 0 as the performance model schedules it (TraceCommand; from its
    first ACT_AB at cycle 0, no refresh): per row ``ACT_AB``, its RD_ABs ``tCCD_L`` apart, ``PREA``."""
    _check_L(model.config, L)
    st = AllBankState(model.tm)
    out = []
    gap = st.gaps[Cmd.RD_AB][Cmd.RD_AB]
    for n in model.head_runs(L):
        act, rd0, last, prea = row_timing(st, n)
        out.append(TraceCommand(act, Cmd.ACT_AB, 0))
        out += [TraceCommand(rd0 + i * gap, Cmd.RD_AB, 0) for i in range(n)]
        out.append(TraceCommand(prea, Cmd.PREA, 0))
    return out


@dataclass
class PIMHeadEnergy:
    """One head's energy (pJ) by term, with its window and work."""

    L: int
    dram_command_pj: float      # ACT_AB / RD_AB / PREA / REF
    dram_background_pj: float   # the head's rank over the window
    datapath_pj: float
    sram_pj: float
    cycles: int                 # the window, DRAM command clocks
    tck_ps: int
    flops: int
    kv_bits: int                # K and V bits the head reads (2 L d x 16)
    idle_pj_per_cycle: float = 0.0  # the rank's precharge standby per command clock

    @property
    def dram_increment_pj(self) -> float:
        """The DRAM energy beyond the rank's precharge standby over the window (what the head adds to an idle
        rank)."""
        return self.dram_pj - self.idle_pj_per_cycle * self.cycles

    @property
    def increment_pj(self) -> float:
        return self.dram_increment_pj + self.datapath_pj + self.sram_pj

    @property
    def dram_pj(self) -> float:
        return self.dram_command_pj + self.dram_background_pj

    @property
    def total_pj(self) -> float:
        return self.dram_pj + self.datapath_pj + self.sram_pj

    @property
    def seconds(self) -> float:
        return self.cycles * self.tck_ps * 1e-12

    def pj_per_bit(self) -> float:
        return self.total_pj / self.kv_bits

    def pj_per_flop(self) -> float:
        return self.total_pj / self.flops

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(dram_pj=self.dram_pj, total_pj=self.total_pj, increment_pj=self.increment_pj, pj_per_bit=self.pj_per_bit(),
                 pj_per_flop=self.pj_per_flop())
        return d


def _work_pj(config, L):
    w = head_ops(config, L)
    dp = sum(n * op_pj(k) for k, n in w["ops"].items())
    return w, dp, sram_read_pj(w["sram_bits"], config.rank_buffer_bytes)


def _one_rank(config):
    """The PIM DRAM configuration with one rank (a head's background is its own rank's)."""
    org = replace(config.dram.org, ranks=1)
    return replace(config.dram, org=org)


def trace_head_energy(config, commands, L: int, cycles: int) -> PIMHeadEnergy:
    """A head's energy from a command trace of rank 0 (the RTL's, or :func:`head_commands`) over ``cycles``
    command clocks (its window from the first command), plus the head's datapath and buffer work."""
    _check_L(config, L)
    if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 1:
        raise ValueError(f"cycles must be an int >= 1, got {cycles!r}")
    cmds = [c for c in commands if c.rank == 0]
    if not cmds:
        raise ValueError("no command of rank 0 in the trace")
    t0 = cmds[0].cycle
    cmds = [TraceCommand(c.cycle - t0, c.kind, 0, c.bg, c.bank, c.row, c.col) for c in cmds]
    one = _one_rank(config)
    spec = pim_power_spec(config)
    e = trace_energy(cmds, one, spec, end_cycle=max(cycles, cmds[-1].cycle + 1))
    w, dp, sram = _work_pj(config, L)
    return PIMHeadEnergy(L=L, dram_command_pj=e.command_pj, dram_background_pj=e.background_pj, datapath_pj=dp,
                         sram_pj=sram, cycles=max(cycles, cmds[-1].cycle + 1), tck_ps=config.dram.timing.tck_ps,
                         flops=w["flops"], kv_bits=2 * L * config.head_dim * 16,
                         idle_pj_per_cycle=command_energy(one, spec).pre_stby)


def head_energy(model, L: int) -> PIMHeadEnergy:
    """One head of ``L`` tokens on ``model`` (a :class:`sim.perf.pim.PIMPerfModel`) from an idle rank: its modelled
    command stream (:func:`head_commands`) over its modelled cycles (``model.head(L).cycles``, the calibrated
    fixed cycles included), in-head REFs (``model.head(L).refs``) added at their increment."""
    cfg = model.config
    h = model.head(L)
    cmds = head_commands(model, L)
    e = trace_head_energy(cfg, cmds, L, int(h.cycles))
    if h.refs:
        ce = command_energy(_one_rank(cfg), pim_power_spec(cfg))
        tm = cfg.dram.timing
        e.dram_command_pj += h.refs * ce.ref
        e.dram_background_pj += h.refs * tm.tRFC * (ce.act_stby - ce.pre_stby)
    return e


def _ops_pj(config, Ls):
    dp = sram = 0.0
    for L in Ls:
        _, d, s = _work_pj(config, int(L))
        dp, sram = dp + d, sram + s
    return dp, sram


def launch_energy(model, Ls, cycles: int) -> dict:
    """A launch batch of heads of lengths ``Ls`` run back to back on rank 0 of ``model``'s configuration over
    ``cycles`` command clocks (the batch's modelled window), every rank of the channel charged background: per
    head its modelled command stream's commands (:func:`head_commands`) and the cycles its rows are open (active
    standby), the rest of every rank's window in precharge standby; plus the heads' datapath and buffer work.
    Returns pJ by term: ``dram_command``, ``dram_background``, ``datapath``, ``sram``, ``total``."""
    cfg = model.config
    if isinstance(cycles, bool) or int(cycles) != cycles or cycles < 0:
        raise ValueError(f"cycles must be an int >= 0, got {cycles!r}")
    spec = pim_power_spec(cfg)
    ce = command_energy(cfg.dram, spec)
    cmd = active = 0.0
    for L in Ls:
        cmds = head_commands(model, int(L))
        e = trace_energy(cmds, _one_rank(cfg), spec, end_cycle=cmds[-1].cycle + 1)
        cmd += e.command_pj
        active += e.active_cycles
    R = cfg.dram.org.ranks
    window = max(int(cycles), int(active))
    bg = active * ce.act_stby + (R * window - active) * ce.pre_stby
    dp, sram = _ops_pj(cfg, Ls)
    return {"dram_command": cmd, "dram_background": bg, "datapath": dp, "sram": sram,
            "total": cmd + bg + dp + sram}


def trace_launch_energy(config, trace, Ls, cycles: int) -> dict:
    """:func:`launch_energy` of an RTL run: its command trace (every rank) from its first command over ``cycles``
    command clocks, and the same heads' datapath and buffer work."""
    trace = list(trace)
    if not trace:
        raise ValueError("empty command trace")
    t0 = trace[0].cycle
    cmds = [TraceCommand(c.cycle - t0, c.kind, c.rank, c.bg, c.bank, c.row, c.col) for c in trace]
    e = trace_energy(cmds, config.dram, pim_power_spec(config), end_cycle=max(int(cycles), cmds[-1].cycle + 1))
    dp, sram = _ops_pj(config, Ls)
    return {"dram_command": e.command_pj, "dram_background": e.background_pj, "datapath": dp, "sram": sram,
            "total": e.total_pj + dp + sram}
