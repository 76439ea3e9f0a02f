"""Ranksets in RTL ([L3] 5.1, docs/references.md): ``N`` rank PUs and the host memory controller on one channel.

:class:`RanksetSystem` is one DDR4 channel with ``N >= 2`` ranks (:func:`with_ranks`). Each rank has its
buffer-chip rank PU (:class:`hdl.pim.rank_pu.RankPU`, ``shared_bus=True``: the ``grant`` / ``host_cmd`` /
``owner`` ports) and its ``chips x banks`` bank PUs; the host memory controller
(:class:`hdl.memctl.controller.MemoryController`, with the spoofed SPD timing of :func:`hdl.pim.spd.spoofed_timing`)
writes through the buffer chip's re-layout unit (:class:`sim.pim.spoof_system.RankBufferChip`). Two command
topologies (``command_path``, :data:`COMMAND_PATHS`; docs/pim_perf.md "The command path of a rank"):

* ``"per_rank"`` -- **the rank PU drives its rank** ([L3] 4: the rank PU sits on the DIMM buffer chip, issues its
  rank's DRAM commands and takes over its refresh, 4.4). The channel's C/A bus carries the host controller's
  commands only; the buffer chip of the addressed rank forwards a host command to its DRAM in the same cycle when
  the rank is in host mode. Each rank has its own command path from its buffer chip to its DRAM (one
  :class:`sim.dram.device.DRAMChannel` per rank, a 1-rank channel of the same DRAM: :func:`rank_dram_config`);
  a rank PU in compute mode issues there every cycle it wants (``grant`` tied high). The DQ bus is the channel's
  (host write data to every rank's device, the addressed one takes it; read data from whichever drives it).
  RD_AB data comes from the rank's own device.
* ``"shared"`` -- **one command bus, the host first** (this project's earlier model, kept as an option): the
  host controller's commands are fixed in time (DDR has no back-pressure), so the buffer chips forward them in
  their cycle; a rank PU issues only in a cycle the host leaves free (``grant``), rank 0's PU before rank 1's
  before ... A rank PU that is not granted waits; its timing counters keep counting. One device model for the
  channel; RD_AB data leaves it ``CL`` after its RD_AB on the channel's all-bank data path; the top remembers
  which rank issued each RD_AB (a ``CL``-stage delay line) and gives the data to that rank's PU and bank PUs.

Both: **ownership.** A rank is owned either by its rank PU (compute mode) or by the host (host mode). Rank
``host_rank`` (default: the last) starts in host mode, the others in compute mode; a rank PU takes its rank with
the first launch it accepts. Host commands to a compute-mode rank are dropped by the buffer chip: a REF silently
(the rank PU manages that rank's refresh, [L3] 4.4), anything else with the sticky error bit 3 in the rank's
``done`` records. In host mode the rank PU snoops the host's commands to its rank (REFs count as its own; rows may
be open: its first command will be a PREA, no earlier than the write-recovery / tRAS bound). RD_AB moves nothing on
the DQ bus; the host's writes use it. The chip -> buffer-chip result link of each rank is its own.

Streams: ``launch<r>`` (in, :func:`hdl.pim.rank_pu.launch_layout`), ``result<r>`` (out, 16), ``done<r>`` (out,
:data:`sim.pim.fused.done_layout`; ``errors`` bit 3: a host command other than REF reached a compute-mode rank),
``host`` / ``host_o`` (the controller's request / response streams); ``"shared"``: ``trace`` (every command on
the bus, collect whole), ``errors`` (device-model violation reports, collect whole); ``"per_rank"``: ``trace<r>``
(every command on rank ``r``'s own path, rank field ``r``) and ``errors<r>`` (rank ``r``'s device model).
Measurement: :func:`rankset_rtl`.
"""

from dataclasses import dataclass, field, replace

import numpy as np
from amaranth.hdl import Module, Signal, Cat, Mux, Array, Value
from amaranth.hdl import Shape
from amaranth.lib import wiring, stream
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hdl.memctl.commands import Cmd, command_layout, trace_layout
from hdl.memctl.controller import MemoryController
from hdl.memctl.timing import DRAMConfig
from hdl.pim.config import PIMConfig
from hdl.pim.rank_pu import RankPU, launch_layout
from hdl.pim.spd import spoofed_timing
from sim.dram.device import DRAMChannel
from sim.dram.system import error_layout
from sim.pim.fused import add_bank_pus, done_layout, bank_pu_verilog
from sim.pim.spoof_system import RankBufferChip

__all__ = ["RanksetSystem", "RanksetRTL", "rankset_rtl", "host_write_requests", "COMMAND_PATHS", "with_ranks",
           "rank_dram_config", "split_image", "check_rank_traces", "rankset_image"]

#: The DIMM's command topology (docs/pim_perf.md, "The command path of a rank"): ``"per_rank"`` -- each rank's
#: buffer chip (its rank PU) drives its own rank's DRAM commands and refresh, the channel's C/A bus carries the
#: host's commands ([L3] 4: the rank PU on the DIMM buffer chip, its refresh takeover; 5.1: "one rank receiving
#: preserves 75 % of the DIMM-PIM's computational power" with four ranks); ``"shared"`` -- one command bus for the
#: host controller and every rank PU of the channel (the host first), this project's earlier model.
COMMAND_PATHS = ("shared", "per_rank")


def with_ranks(config: PIMConfig, ranks: int) -> PIMConfig:
    """``config`` with ``ranks`` ranks per channel (same chips, banks, rows, timing): e.g. TINY geometry with the
    four ranks of [L3] 5.1's example ("a DIMM-PIM with four ranks")."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= 8:
        raise ValueError(f"ranks = {ranks!r} must be an int in 1 .. 8")
    org = config.dram.org
    if org.ranks == ranks:
        return config
    org = replace(org, name=f"{org.name}-k{ranks}", ranks=ranks)
    return replace(config, name=f"{config.name}-k{ranks}", dram=replace(config.dram, name=org.name, org=org))


def rank_dram_config(dram: DRAMConfig) -> DRAMConfig:
    """One rank of ``dram`` as a 1-rank channel (same organisation and timing per rank): the device model behind
    one rank's own command path (``command_path="per_rank"``)."""
    org = replace(dram.org, name=f"{dram.org.name}-rank", ranks=1)
    return replace(dram, name=f"{dram.name}-rank", org=org)


def split_image(org, init):
    """A channel image (``{flat burst address: int}`` or a sequence, :func:`sim.dram.device.flat_burst_address`)
    as one image per rank, addresses relative to the rank (``None`` for a rank with nothing)."""
    per = org.banks * org.rows * org.bursts_per_row
    out = [{} for _ in range(org.ranks)]
    if init is not None:
        items = init.items() if isinstance(init, dict) else enumerate(init)
        for a, v in items:
            a, v = int(a), int(v)
            if not 0 <= a < org.ranks * per:
                raise ValueError(f"init address {a} outside 0..{org.ranks * per - 1}")
            if v:
                out[a // per][a % per] = v
    return [img or None for img in out]


def check_rank_traces(traces, dram: DRAMConfig, *, end_cycle=None):
    """The JEDEC checker (:func:`sim.dram.checker.check_trace`) on each rank's own command trace (``traces``:
    one list of :class:`sim.dram.trace.TraceCommand` per rank, rank fields = the rank) against one rank of
    ``dram`` (:func:`rank_dram_config`). Returns ``{rank: [violations]}`` for the ranks with any."""
    from dataclasses import replace as dreplace
    from sim.dram.checker import check_trace
    one = rank_dram_config(dram)
    out = {}
    for r, tr in enumerate(traces):
        v = check_trace([dreplace(c, rank=0) for c in tr], one, end_cycle=end_cycle)
        if v:
            out[r] = v
    return out


def _or(values):
    values = list(values)
    acc = values[0]
    for v in values[1:]:
        acc = acc | v
    return acc



def _host_commands(m, hc, rpus, RB):
    """The host controller's command ``hc`` at the buffer chips: forwarded (``fwd``, ``fwd_cmd``) to a rank in host
    mode; dropped for a rank in compute mode (a REF silently, anything else sets that rank's sticky
    ``bad_seen`` bit). Returns ``(fwd, fwd_cmd, bad_seen)``."""
    N = len(rpus)
    owner = Array([rpu.owner for rpu in rpus])
    host_valid = hc.kind != Cmd.NOP
    to_pim = owner[hc.rank[:RB]]
    fwd = Signal()
    m.d.comb += fwd.eq(host_valid & ~to_pim)
    bad = Signal()            # a host command other than REF to a compute-mode rank (dropped)
    m.d.comb += bad.eq(host_valid & to_pim & (hc.kind != Cmd.REF))
    bad_seen = [Signal(name=f"host_cmd_to_pim_rank{r}") for r in range(N)]
    for r in range(N):
        with m.If(bad & (hc.rank == r)):
            m.d.sync += bad_seen[r].eq(1)
    fwd_cmd = Signal.like(hc)
    with m.If(fwd):
        m.d.comb += fwd_cmd.eq(hc)
    return fwd, fwd_cmd, bad_seen

class RanksetSystem(wiring.Component):
    """``N`` rank PUs + the host controller on one channel (module docstring). ``config``: a :class:`PIMConfig`
    with ``N >= 2`` ranks (:func:`with_ranks`); ``init``: the device's initial contents (flat burst addresses of
    the whole channel); ``host_rank``: the rank that starts in host mode (default: the last); ``command_path``:
    ``"shared"`` (one command bus for the host and every rank PU, :data:`COMMAND_PATHS`) or ``"per_rank"`` (each
    rank's buffer chip drives its own rank); ``instance_pus``: bank PUs as instances of one compiled module
    (Verilator only; ``False``: inline, both engines); ``controller_kwargs``: for :class:`MemoryController`
    (default FR-FCFS, 16 entries)."""

    TRACE_DEPTH = 64

    def __init__(self, config: PIMConfig, init=None, *, host_rank: int | None = None, instance_pus: bool = True,
                 command_path: str = "shared", **controller_kwargs):
        if not isinstance(config, PIMConfig):
            raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
        org = config.dram.org
        if org.ranks < 2:
            raise ValueError(f"RanksetSystem needs a channel of >= 2 ranks, {config.name!r} has {org.ranks}")
        if command_path not in COMMAND_PATHS:
            raise ValueError(f"command_path = {command_path!r} must be one of {COMMAND_PATHS}")
        N = org.ranks
        if host_rank is None:
            host_rank = N - 1
        if isinstance(host_rank, bool) or host_rank not in range(N):
            raise ValueError(f"host_rank = {host_rank!r} must be in 0 .. {N - 1}")
        self.config, self.org = config, org
        self.ranks = N
        self.host_rank = host_rank
        self.command_path = command_path
        self.instance_pus = bool(instance_pus)
        real = config.dram
        self.host_timing = spoofed_timing(real.timing, config.relayout_latency)
        self.controller = MemoryController(
            config=DRAMConfig(name=f"{real.name}-host", org=org, timing=self.host_timing), **controller_kwargs)
        self.buffer_chip = RankBufferChip(config, host_cwl=self.host_timing.CWL)
        self.rank_pus = [RankPU(config, rank=r, shared_bus=True, owned=(r != host_rank)) for r in range(N)]
        if command_path == "shared":
            self.dram = DRAMChannel(real, init)
            self.drams = None
        else:
            # one device model per rank (a 1-rank channel of the same DRAM): each rank's own command path
            self.rank_dram = rank_dram_config(real)
            self.dram = None
            self.drams = [DRAMChannel(self.rank_dram, img) for img in split_image(org, init)]
        ports = {}
        for r in range(N):
            ports[f"launch{r}"] = In(stream.Signature(launch_layout(config)))
            ports[f"result{r}"] = Out(stream.Signature(16))
            ports[f"done{r}"] = Out(stream.Signature(done_layout))
        ports.update({
            "host": In(stream.Signature(self.controller.request_layout)),
            "host_o": Out(stream.Signature(self.controller.response_layout)),
        })
        if command_path == "shared":
            ports.update({
                "trace": Out(stream.Signature(trace_layout(org))),
                "errors": Out(stream.Signature(error_layout())),
            })
        else:
            for r in range(N):
                ports[f"trace{r}"] = Out(stream.Signature(trace_layout(org)))
            for r in range(N):
                ports[f"errors{r}"] = Out(stream.Signature(error_layout()))
        super().__init__(ports)

    def trace_streams(self):
        """Names of the command-trace output streams: ``["trace"]`` (shared: the channel's bus) or ``["trace0",
        ...]`` (per_rank: each rank's own command path, rank field = the rank)."""
        return ["trace"] if self.command_path == "shared" else [f"trace{r}" for r in range(self.ranks)]

    def error_streams(self):
        return ["errors"] if self.command_path == "shared" else [f"errors{r}" for r in range(self.ranks)]

    def verilog_modules(self):
        return [bank_pu_verilog(self.config)] if self.instance_pus else []

    def verilator_flags(self):
        return ["-fno-dfg"] if self.instance_pus else []     # one copy of the bank-PU code (fused.bank_pu_verilog)

    def elaborate(self, platform):
        if self.command_path == "per_rank":
            return self._elaborate_per_rank()
        m = Module()
        cfg, org, tm = self.config, self.org, self.config.dram.timing
        N = self.ranks
        RB = max(1, (N - 1).bit_length())
        m.submodules.controller = ctl = self.controller
        m.submodules.buffer_chip = buf = self.buffer_chip
        m.submodules.dram = dev = self.dram
        rpus = self.rank_pus
        for r, rpu in enumerate(rpus):
            m.submodules[f"rank_pu{r}"] = rpu
        wiring.connect(m, wiring.flipped(self.host), ctl.i)
        wiring.connect(m, ctl.o, wiring.flipped(self.host_o))

        # ---- the command bus: the host's command first, then rank PU 0, then rank PU 1, ... ------------------
        hc = ctl.cmd
        fwd, fwd_cmd, bad_seen = _host_commands(m, hc, rpus, RB)
        grant = ~fwd
        for r in range(N):
            m.d.comb += rpus[r].grant.eq(grant)
            grant = grant & (rpus[r].cmd.kind == Cmd.NOP)
        m.d.comb += [rpu.host_cmd.eq(fwd_cmd) for rpu in rpus]
        bus = Signal.like(hc)
        with m.If(fwd):
            m.d.comb += bus.eq(hc)
        for r in range(N - 1):
            with m.Elif(rpus[r].cmd.kind != Cmd.NOP):
                m.d.comb += bus.eq(rpus[r].cmd)
        with m.Else():
            m.d.comb += bus.eq(rpus[N - 1].cmd)
        m.d.comb += Value.cast(dev.cmd).eq(Value.cast(bus))

        # ---- DQ: host write data through the re-layout unit; read data back to the controller ---------------
        m.d.comb += [
            Value.cast(buf.host_cmd).eq(Value.cast(fwd_cmd)),
            buf.host_wdata.eq(ctl.wdata),
            dev.wdata.eq(buf.dram_wdata),
            ctl.rdata.eq(dev.rdata),
            ctl.rdata_valid.eq(dev.rdata_valid),
        ]

        # ---- RD_AB data: to the rank that issued the RD_AB CL cycles ago -------------------------------------
        pipe = [Signal(1 + RB, name=f"rdab_tag{k}") for k in range(tm.CL)]   # {valid, rank} of cycle t - k - 1
        m.d.sync += pipe[0].eq(Cat(bus.kind == Cmd.RD_AB, bus.rank[:RB]))
        for k in range(1, tm.CL):
            m.d.sync += pipe[k].eq(pipe[k - 1])
        tag = pipe[tm.CL - 1]
        for r, rpu in enumerate(rpus):
            m.d.comb += rpu.ab_valid.eq(dev.ab_valid & tag[0] & (tag[1:] == r))
            add_bank_pus(m, cfg, rpu, dev.ab_rdata, instance=self.instance_pus, prefix=f"r{r}_")
            wiring.connect(m, wiring.flipped(getattr(self, f"launch{r}")), rpu.launch)
            self._result_and_done(m, rpu, getattr(self, f"result{r}"), getattr(self, f"done{r}"), dev,
                                  bad_seen[r], r)

        # ---- command trace and device errors ------------------------------------------------------------------
        tw = Shape.cast(trace_layout(org)).width
        tq = m.submodules.trace_q = SyncFIFOBuffered(width=tw, depth=self.TRACE_DEPTH)
        self._dropped = dropped = Signal(16)
        m.d.comb += [tq.w_en.eq(bus.kind != Cmd.NOP), tq.w_data.eq(Cat(bus.as_value(), dev.cycle)),
                     self.trace.valid.eq(tq.r_rdy), self.trace.payload.eq(tq.r_data), tq.r_en.eq(self.trace.ready)]
        with m.If(tq.w_en & ~tq.w_rdy):
            m.d.sync += dropped.eq(dropped + 1)
        m.d.comb += [
            self.errors.valid.eq(dev.violation),
            self.errors.payload.code.eq(dev.violation_code),
            self.errors.payload.cycle.eq(dev.violation_cycle),
        ]
        return m

    def _elaborate_per_rank(self):
        """``command_path="per_rank"``: the channel's C/A bus carries the host controller's commands only; the
        buffer chip of the addressed rank forwards a command to its rank (host mode) or drops it (compute mode,
        as on the shared bus); each rank PU drives its own rank's command path, never waiting for a grant."""
        m = Module()
        cfg, org = self.config, self.org
        N = self.ranks
        RB = max(1, (N - 1).bit_length())
        m.submodules.controller = ctl = self.controller
        m.submodules.buffer_chip = buf = self.buffer_chip
        rpus = self.rank_pus
        for r, rpu in enumerate(rpus):
            m.submodules[f"rank_pu{r}"] = rpu
            m.submodules[f"dram{r}"] = self.drams[r]
        wiring.connect(m, wiring.flipped(self.host), ctl.i)
        wiring.connect(m, ctl.o, wiring.flipped(self.host_o))

        # ---- the channel's C/A bus (the host's commands) -> the addressed rank's buffer chip ------------------
        hc = ctl.cmd
        fwd, fwd_cmd, bad_seen = _host_commands(m, hc, rpus, RB)
        # every buffer chip sees the channel's C/A (the rank PUs snoop their rank's host commands)
        m.d.comb += [rpu.host_cmd.eq(fwd_cmd) for rpu in rpus]
        m.d.comb += [rpu.grant.eq(1) for rpu in rpus]

        # ---- each rank's own command path: its rank PU (compute mode) or the forwarded host command ------------
        rank_cmd = [Signal(command_layout(org), name=f"rank_cmd{r}") for r in range(N)]
        for r, (rpu, dev) in enumerate(zip(rpus, self.drams)):
            # exclusive by construction: a rank PU issues only in compute mode, where the host's commands to its
            # rank are dropped (fwd is low)
            with m.If(fwd & (hc.rank == r)):
                m.d.comb += rank_cmd[r].eq(hc)
            with m.Else():
                m.d.comb += rank_cmd[r].eq(rpu.cmd)
            c = rank_cmd[r]
            m.d.comb += [dev.cmd.kind.eq(c.kind), dev.cmd.bg.eq(c.bg), dev.cmd.bank.eq(c.bank),
                         dev.cmd.row.eq(c.row), dev.cmd.col.eq(c.col)]     # the 1-rank device: rank 0

        # ---- DQ (the channel's): host write data through the re-layout unit to every rank (the addressed one
        #      takes it); read data from whichever rank drives it ----------------------------------------------------
        m.d.comb += [
            Value.cast(buf.host_cmd).eq(Value.cast(fwd_cmd)),
            buf.host_wdata.eq(ctl.wdata),
            ctl.rdata.eq(_or(dev.rdata for dev in self.drams)),
            ctl.rdata_valid.eq(_or(dev.rdata_valid for dev in self.drams)),
        ]
        m.d.comb += [dev.wdata.eq(buf.dram_wdata) for dev in self.drams]

        # ---- RD_AB data: each rank's own device to its PU and bank PUs ---------------------------------------
        for r, (rpu, dev) in enumerate(zip(rpus, self.drams)):
            m.d.comb += rpu.ab_valid.eq(dev.ab_valid)
            add_bank_pus(m, cfg, rpu, dev.ab_rdata, instance=self.instance_pus, prefix=f"r{r}_")
            wiring.connect(m, wiring.flipped(getattr(self, f"launch{r}")), rpu.launch)
            self._result_and_done(m, rpu, getattr(self, f"result{r}"), getattr(self, f"done{r}"), dev,
                                  bad_seen[r], r)

        # ---- per-rank command traces and device errors ------------------------------------------------------------
        tw = Shape.cast(trace_layout(org)).width
        self._dropped = []
        for r, dev in enumerate(self.drams):
            tq = m.submodules[f"trace_q{r}"] = SyncFIFOBuffered(width=tw, depth=self.TRACE_DEPTH)
            dropped = Signal(16, name=f"trace_dropped{r}")
            self._dropped.append(dropped)
            out = getattr(self, f"trace{r}")
            m.d.comb += [tq.w_en.eq(rank_cmd[r].kind != Cmd.NOP),
                         tq.w_data.eq(Cat(rank_cmd[r].as_value(), dev.cycle)),
                         out.valid.eq(tq.r_rdy), out.payload.eq(tq.r_data), tq.r_en.eq(out.ready)]
            with m.If(tq.w_en & ~tq.w_rdy):
                m.d.sync += dropped.eq(dropped + 1)
            err = getattr(self, f"errors{r}")
            m.d.comb += [err.valid.eq(dev.violation), err.payload.code.eq(dev.violation_code),
                         err.payload.cycle.eq(dev.violation_cycle)]
        return m

    def _result_and_done(self, m, rpu, result, done, dev, bad, r):
        d = self.config.head_dim
        nres = Signal(range(d), name=f"nres{r}")
        done_q = m.submodules[f"done_q{r}"] = SyncFIFOBuffered(width=done_layout.size, depth=4)
        fire = Signal(name=f"res_fire{r}")
        m.d.comb += [
            result.valid.eq(rpu.result.valid & done_q.w_rdy),
            result.payload.eq(rpu.result.payload),
            rpu.result.ready.eq(result.ready & done_q.w_rdy),
            fire.eq(result.valid & result.ready),
        ]
        with m.If(fire):
            m.d.sync += nres.eq(Mux(nres == d - 1, 0, nres + 1))
        rec = Signal(done_layout, name=f"done_rec{r}")
        m.d.comb += [rec.cycle.eq(dev.cycle), rec.violations.eq(dev.violations), rec.refreshes.eq(rpu.refreshes),
                     rec.urgent.eq(rpu.urgent_refreshes), rec.errors.eq(rpu.errors | (bad << 3))]
        m.d.comb += [done_q.w_en.eq(fire & (nres == d - 1)), done_q.w_data.eq(rec),
                     done.valid.eq(done_q.r_rdy), done.payload.eq(done_q.r_data), done_q.r_en.eq(done.ready)]


# ---- driver: the measurement of [L3] 5.1 in RTL ----------------------------------------------------------------

def host_write_requests(system, image):
    """Controller write requests that store ``image`` (``{flat burst address: int}``, the re-laid-out burst
    contents, e.g. ``kv_store_image``) through the buffer chip: the host sends each burst in the conventional
    layout (:func:`hdl.pim.mapping.host_write_bursts`); the re-layout unit turns it into the stored format."""
    from hdl.pim.mapping import host_write_bursts, unpack_rank_bursts
    cfg, org = system.config, system.org
    amap = system.controller.amap
    lay = system.controller.request_layout
    addrs = sorted(image)
    a = np.array(addrs, dtype=np.int64)
    col = a % org.bursts_per_row
    row = (a // org.bursts_per_row) % org.rows
    bi = (a // (org.bursts_per_row * org.rows)) % org.banks
    rank = a // (org.bursts_per_row * org.rows * org.banks)
    haddr = amap.encode_py(rank=rank, bg=bi // org.banks_per_group, bank=bi % org.banks_per_group, row=row,
                           col=col)
    words = host_write_bursts(cfg, unpack_rank_bursts(cfg, [image[x] for x in addrs]))
    # the order the host streams them: by host address (consecutive bursts rotate over the bank groups)
    order = np.argsort(haddr, kind="stable")
    return [lay.const({"addr": int(haddr[i]), "write": 1, "wdata": int(words[i]), "tag": 0}).as_value().value
            for i in order]


@dataclass
class RanksetRTL:
    """:func:`rankset_rtl`'s measurement (cycles of the device model's clock). Ranks ``0 .. N - 2`` compute, rank
    ``N - 1`` receives the host's writes (``N`` = the channel's ranks)."""
    window: int                 # cycles 0 .. the host's last WR (the receiving rank's write window), inclusive
    writes: int                 # WR bursts the host sent to the receiving rank
    rd_ab_with_comm: int        # RD_ABs of the computing ranks in the window, the last rank receiving
    rd_ab_all_compute: int      # RD_ABs of all ranks in the same window, all computing, no host traffic
    rd_ab_alone: int            # RD_ABs of rank 0 in the window, the other ranks idle (host mode)
    write_gbps: float           # host write bandwidth into the receiving rank over the window
    dq_peak_gbps: float
    bitexact: bool              # every head of every run (incl. the written head, computed afterwards)
    violations: int             # device-model counter + independent checker, all runs
    errors: int                 # rank-PU / buffer-chip error bits, all runs
    runs: dict                  # per run: cycles, wall seconds
    ranks: int = 2
    command_path: str = "shared"
    # per computing rank: RD_ABs in the window while the host writes / in the same window without host traffic
    # (the computing ranks alone; the receiving rank idle), and cycles from 0 to its last head's done record
    rd_ab_rank_comm: tuple = ()
    rd_ab_rank_quiet: tuple = ()
    head_cycles_comm: tuple = ()
    head_cycles_quiet: tuple = ()
    traces: dict = field(default_factory=dict, repr=False)   # per run: one command list per rank

    @property
    def preserved(self) -> float:
        """Compute kept while one rank receives, of all ranks computing (ideal (N - 1) / N)."""
        return self.rd_ab_with_comm / self.rd_ab_all_compute

    @property
    def contention_loss(self) -> float:
        """1 - the computing ranks' RD_ABs with the writes / (N - 1) x rank 0's alone."""
        return 1 - self.rd_ab_with_comm / ((self.ranks - 1) * self.rd_ab_alone)

    @property
    def rank_rates(self) -> tuple:
        """Per computing rank: its RD_AB rate in the write window with the host writing / without (the rate
        :class:`host.l3.pim_timing.RanksetModel` ``compute_rate(N, writer=True)`` predicts)."""
        return tuple(a / b for a, b in zip(self.rd_ab_rank_comm, self.rd_ab_rank_quiet))

    @property
    def compute_rate(self) -> float:
        """The slowest computing rank's :attr:`rank_rates`."""
        return min(self.rank_rates)

    @property
    def head_rate(self) -> float:
        """Cycles to the computing ranks' last done record without / with the host writing (slowest rank)."""
        return min(q / c for q, c in zip(self.head_cycles_quiet, self.head_cycles_comm))


def rankset_image(config, L, *, seed=7):
    """The stored heads of :func:`rankset_rtl`: two heads of ``L`` tokens on every rank (the same K / V on each).
    Returns ``(layouts per rank, K (2, L, d), V (2, L, d), the channel image)``: build a :class:`RanksetSystem`
    with the image to reuse its build for other runs on these heads."""
    from hdl.pim.mapping import head_layout, kv_store_image
    from sim.golden.pim_attention import make_inputs
    lay = [head_layout(config, L, 2, rank=r) for r in range(config.dram.org.ranks)]
    KV = [make_inputs(config, L, seed=seed + h)[1:] for h in range(2)]
    Ks, Vs = np.stack([k for k, _ in KV]), np.stack([v for _, v in KV])
    img = {}
    for lr in lay:
        img.update(kv_store_image(config, Ks, Vs, lr))
    return lay, Ks, Vs, img


def rankset_rtl(config, *, L=512, heads=4, write_L=128, backend="verilator", system=None, seed=7,
                command_path="shared"):
    """[L3] 5.1 in RTL on :class:`RanksetSystem` (``N`` = ``config``'s ranks, >= 2): ranks ``0 .. N - 2`` compute
    ``heads`` heads of ``L`` tokens back to back each while the host writes the KV cache of a ``write_L``-token
    head into rank ``N - 1`` (host mode) at the bus rate; once the writes are done, rank ``N - 1``'s PU computes
    that head (its output proves the data arrived through the re-layout unit with the spoofed timing). Against
    runs of the same build without host traffic: the computing ranks alone ("quiet", the rate reference), all
    ranks computing ``heads`` heads each (the receiving rank on a copy of rank 0's heads), and rank 0 alone.
    RD_ABs are counted in the write window (cycle 0 .. the host's last WR), like :func:`sim.perf.pim.rankset_sim`.
    Every head is compared with the golden kernel, every trace with the JEDEC checker (``per_rank``: each rank's
    own trace against one rank, :func:`check_rank_traces`), every run with the device models' violation reports.
    ``config`` needs rows for two heads of ``L`` plus one of ``write_L`` per rank. ``command_path``: of the system
    built here; a ``system`` passed in (built with :func:`rankset_image`'s image) brings its own."""
    from hdl.pim.mapping import head_layout, kv_store_image
    from sim.backends import get_backend, Traffic
    from sim.dram.checker import check_trace
    from sim.dram.trace import decode_trace
    from sim.golden.pim_attention import make_inputs, pim_attention
    from sim.pim.fused import encode_launch, decode_done
    be = get_backend(backend) if isinstance(backend, str) else backend
    cfg, org = config, config.dram.org
    N = org.ranks
    w = N - 1                              # the receiving rank
    comp = list(range(N - 1))              # the computing ranks
    lay, Ks, Vs, img = rankset_image(cfg, L, seed=seed)
    lay_w = head_layout(cfg, write_L, 1, rank=w, row_base=lay[w].rows_used)
    Kw, Vw = make_inputs(cfg, write_L, seed=seed + 10)[1:]
    img_w = kv_store_image(cfg, Kw, Vw, lay_w)
    if system is None:
        system = RanksetSystem(cfg, img, command_path=command_path)
    if system.ranks != N or system.host_rank != w:
        raise ValueError(f"system: {system.ranks} ranks, host rank {system.host_rank}; rankset_rtl needs {N} "
                         f"ranks, host rank {w}")
    path = system.command_path
    qs = [make_inputs(cfg, 4, seed=seed + 100 + i)[0] for i in range(heads + 1)]
    launches = [[encode_launch(cfg, L, lay[r].k_row0[i % 2], lay[r].v_row0[i % 2], qs[i]) for i in range(heads)]
                for r in range(N)]
    l_w = [encode_launch(cfg, write_L, lay_w.k_row0[0], lay_w.v_row0[0], qs[heads])]
    gold = [pim_attention(cfg, qs[i], Ks[i % 2], Vs[i % 2]).out for i in range(heads)]
    gold_w = pim_attention(cfg, qs[heads], Kw, Vw).out
    d = cfg.head_dim
    writes = host_write_requests(system, img_w)
    stats = {"violations": 0, "errors": 0, "bitexact": True, "runs": {}, "traces": {}}

    def run(name, launch, want, host, traffic=None):
        """``launch`` / ``want``: per rank, the launches and the golden outputs."""
        inputs = {f"launch{r}": launch[r] for r in range(N)}
        inputs["host"] = host
        exp = {"host_o": 0}
        for r in range(N):
            exp[f"result{r}"] = d * len(launch[r])
            exp[f"done{r}"] = len(launch[r])
        for s in system.trace_streams() + system.error_streams():
            exp[s] = None
        nh = max(len(x) for x in launch)
        res = be.run_streams(system, inputs, exp, traffic=traffic,
                             max_cycles=20 * nh * (8 * L + 2000) + 40 * len(host) + 50_000)
        if path == "shared":
            tr = decode_trace(res.outputs["trace"], org)
            viol = len(check_trace(tr, cfg.dram, end_cycle=res.cycles))
            per = [[c for c in tr if c.rank == r] for r in range(N)]
        else:
            per = [decode_trace(res.outputs[f"trace{r}"], org) for r in range(N)]
            if any(c.rank != r for r in range(N) for c in per[r]):
                raise AssertionError("a rank's command path carried another rank's command")
            viol = sum(len(v) for v in check_rank_traces(per, cfg.dram, end_cycle=res.cycles).values())
        viol += sum(len(res.outputs[s]) for s in system.error_streams())
        outs = [np.array(res.outputs[f"result{r}"], np.uint16).reshape(-1, d) for r in range(N)]
        dn = [decode_done(res.outputs[f"done{r}"]) for r in range(N)]
        ok = all(len(o) == len(g) and all(np.array_equal(a, b) for a, b in zip(o, g)) for o, g in zip(outs, want))
        errs = sum(x["errors"] != 0 or x["violations"] != 0 for dd in dn for x in dd)
        stats["bitexact"] &= bool(ok)
        stats["violations"] += viol
        stats["errors"] += errs
        stats["runs"][name] = {"cycles": res.cycles, "wall_s": round(res.wall_seconds, 3), "bitexact": bool(ok),
                               "violations": viol, "errors": errs}
        stats["traces"][name] = per
        return per, dn

    none = [[] for _ in range(N)]
    sel = lambda rs, x: [x[r] if r in rs else [] for r in range(N)]
    # (1) the last rank receives while the others compute; its launch is presented 200 cycles after the host's
    #     last WR (found by a first run without it), then it computes the head it received
    probe, _ = run("comm_probe", sel(comp, launches), sel(comp, [gold] * N), writes)
    window = max(c.cycle for c in probe[w] if c.kind is Cmd.WR)
    pat = np.zeros(window + 201, dtype=bool)
    pat[-1] = True
    tr_comm, dn_comm = run("comm", sel(comp, launches)[:w] + [l_w], sel(comp, [gold] * N)[:w] + [[gold_w]],
                           writes, traffic=Traffic(valid={f"launch{w}": pat}))
    # (2) the computing ranks without host traffic; (3) all ranks compute; (4) rank 0 alone
    tr_quiet, dn_quiet = run("quiet", sel(comp, launches), sel(comp, [gold] * N), [])
    tr_all, _ = run("all_compute", launches, [gold] * N, [])
    tr_alone = tr_quiet if N == 2 else run("alone", sel([0], launches), sel([0], [gold] * N), [])[0]
    rd = lambda tr, ranks: sum(1 for r in ranks for c in tr[r] if c.kind is Cmd.RD_AB and c.cycle <= window)
    tm = cfg.dram.timing
    dq_peak = org.clock_bits / 8 / (tm.tck_ps * 1e-12) / 1e9
    wgbps = len(writes) * org.burst_bytes / ((window + 1) * tm.tck_ps * 1e-12) / 1e9
    return RanksetRTL(window=window + 1, writes=len(writes), rd_ab_with_comm=rd(tr_comm, comp),
                      rd_ab_all_compute=rd(tr_all, range(N)), rd_ab_alone=rd(tr_alone, (0,)), write_gbps=wgbps,
                      dq_peak_gbps=dq_peak, bitexact=stats["bitexact"], violations=stats["violations"],
                      errors=stats["errors"], runs=stats["runs"], ranks=N, command_path=path,
                      rd_ab_rank_comm=tuple(rd(tr_comm, (r,)) for r in comp),
                      rd_ab_rank_quiet=tuple(rd(tr_quiet, (r,)) for r in comp),
                      head_cycles_comm=tuple(dn_comm[r][-1]["cycle"] + 1 for r in comp),
                      head_cycles_quiet=tuple(dn_quiet[r][-1]["cycle"] + 1 for r in comp), traces=stats["traces"])
