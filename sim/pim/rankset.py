"""Ranksets in RTL ([L3] 5.1, docs/references.md): two rank PUs and the host memory controller on one channel.

:class:`RanksetSystem` is one DDR4 channel with two ranks. Each rank has its buffer-chip rank PU
(:class:`hdl.pim.rank_pu.RankPU`, ``shared_bus=True``) and its ``chips x banks`` bank PUs; the host memory
controller (:class:`hdl.memctl.controller.MemoryController`, with the spoofed SPD timing of
:func:`hdl.pim.spd.spoofed_timing`) writes through the buffer chip's re-layout unit
(:class:`sim.pim.spoof_system.RankBufferChip`); the :class:`sim.dram.device.DRAMChannel` device model (real
timing, storage) sees one command bus and one DQ bus. Design choices (docs/pim_perf.md, "Ranksets in RTL"):

* **One command bus, the host first.** The host controller's commands are fixed in time (DDR has no
  back-pressure), so the buffer chips forward them in their cycle; a rank PU issues only in a cycle the host
  leaves free (``grant``), rank 0's PU before rank 1's. A rank PU that is not granted waits; its timing
  counters keep counting.
* **Ownership.** A rank is owned either by its rank PU (compute mode) or by the host (host mode). Rank
  ``host_rank`` starts in host mode, the other in compute mode; a rank PU takes its rank with the first launch
  it accepts. Host commands to a compute-mode rank are dropped by the buffer chip: a REF silently (the rank PU
  manages that rank's refresh, [L3] 4.4), anything else with the sticky error bit 3 in the rank's ``done``
  records. In host mode the rank PU snoops the host's commands to its rank (REFs count as its own; rows may be
  open: its first command will be a PREA, no earlier than the write-recovery / tRAS bound).
* **RD_AB data** leaves the device ``CL`` after its RD_AB on the channel's all-bank data path; the top
  remembers which rank issued each RD_AB (a ``CL``-stage delay line) and gives the data to that rank's PU and
  bank PUs. RD_AB moves nothing on the DQ bus; the host's writes use it.
* The chip -> buffer-chip result link of each rank is its own (each rank has its buffer chip).

Streams: ``launch0`` / ``launch1`` (in, :func:`hdl.pim.rank_pu.launch_layout`), ``result0`` / ``result1``
(out, 16), ``done0`` / ``done1`` (out, :data:`sim.pim.fused.done_layout`; ``errors`` bit 3: a host command other
than REF reached a compute-mode rank), ``host`` / ``host_o`` (the controller's request / response streams),
``trace`` (every command on the bus, collect whole), ``errors`` (device-model violation reports, collect whole).
Measurement: :func:`rankset_rtl`.
"""

from dataclasses import dataclass

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

__all__ = ["RanksetSystem", "RanksetRTL", "rankset_rtl", "host_write_requests"]


class RanksetSystem(wiring.Component):
    """Two rank PUs + the host controller on one channel (module docstring). ``config``: a :class:`PIMConfig`
    with two ranks; ``init``: the device's initial contents; ``host_rank``: the rank that starts in host mode;
    ``instance_pus``: bank PUs as instances of one compiled module (Verilator only; ``False``: inline, both
    engines); ``controller_kwargs``: for :class:`MemoryController` (default FR-FCFS, 16 entries)."""

    TRACE_DEPTH = 64

    def __init__(self, config: PIMConfig, init=None, *, host_rank: int = 1, instance_pus: bool = True,
                 **controller_kwargs):
        if not isinstance(config, PIMConfig):
            raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
        org = config.dram.org
        if org.ranks != 2:
            raise ValueError(f"RanksetSystem needs a channel of 2 ranks, {config.name!r} has {org.ranks}")
        if host_rank not in (0, 1):
            raise ValueError(f"host_rank = {host_rank!r} must be 0 or 1")
        self.config, self.org = config, org
        self.host_rank = host_rank
        self.instance_pus = bool(instance_pus)
        real = config.dram
        self.host_timing = spoofed_timing(real.timing, config.relayout_latency)
        self.controller = MemoryController(
            config=DRAMConfig(name=f"{real.name}-host", org=org, timing=self.host_timing), **controller_kwargs)
        self.buffer_chip = RankBufferChip(config, host_cwl=self.host_timing.CWL)
        self.rank_pus = [RankPU(config, rank=r, shared_bus=True, owned=(r != host_rank)) for r in range(2)]
        self.dram = DRAMChannel(real, init)
        ports = {}
        for r in range(2):
            ports[f"launch{r}"] = In(stream.Signature(launch_layout(config)))
            ports[f"result{r}"] = Out(stream.Signature(16))
            ports[f"done{r}"] = Out(stream.Signature(done_layout))
        ports.update({
            "host": In(stream.Signature(self.controller.request_layout)),
            "host_o": Out(stream.Signature(self.controller.response_layout)),
            "trace": Out(stream.Signature(trace_layout(org))),
            "errors": Out(stream.Signature(error_layout())),
        })
        super().__init__(ports)

    def verilog_modules(self):
        return [bank_pu_verilog(self.config)] if self.instance_pus else []

    def verilator_flags(self):
        return ["-fno-dfg"] if self.instance_pus else []     # one copy of the bank-PU code (fused.bank_pu_verilog)

    def elaborate(self, platform):
        m = Module()
        cfg, org, tm = self.config, self.org, self.config.dram.timing
        m.submodules.controller = ctl = self.controller
        m.submodules.buffer_chip = buf = self.buffer_chip
        m.submodules.dram = dev = self.dram
        rpus = self.rank_pus
        for r, rpu in enumerate(rpus):
            m.submodules[f"rank_pu{r}"] = rpu
        wiring.connect(m, wiring.flipped(self.host), ctl.i)
        wiring.connect(m, ctl.o, wiring.flipped(self.host_o))

        # ---- the command bus: the host's command first, then rank PU 0, then rank PU 1 ---------------------
        hc = ctl.cmd
        owner = Array([rpus[0].owner, rpus[1].owner])
        host_valid = hc.kind != Cmd.NOP
        to_pim = owner[hc.rank[:1]]
        fwd = Signal()
        m.d.comb += fwd.eq(host_valid & ~to_pim)
        bad = Signal()            # a host command other than REF to a compute-mode rank (dropped)
        m.d.comb += bad.eq(host_valid & to_pim & (hc.kind != Cmd.REF))
        bad_seen = [Signal(name=f"host_cmd_to_pim_rank{r}") for r in range(2)]
        for r in range(2):
            with m.If(bad & (hc.rank == r)):
                m.d.sync += bad_seen[r].eq(1)
        fwd_cmd = Signal.like(hc)
        with m.If(fwd):
            m.d.comb += fwd_cmd.eq(hc)
        m.d.comb += [
            rpus[0].grant.eq(~fwd),
            rpus[1].grant.eq(~fwd & (rpus[0].cmd.kind == Cmd.NOP)),
            rpus[0].host_cmd.eq(fwd_cmd),
            rpus[1].host_cmd.eq(fwd_cmd),
        ]
        bus = Signal.like(hc)
        with m.If(fwd):
            m.d.comb += bus.eq(hc)
        with m.Elif(rpus[0].cmd.kind != Cmd.NOP):
            m.d.comb += bus.eq(rpus[0].cmd)
        with m.Else():
            m.d.comb += bus.eq(rpus[1].cmd)
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
        pipe = [Signal(2, name=f"rdab_tag{k}") for k in range(tm.CL)]   # {valid, rank} of cycle t - k - 1
        m.d.sync += pipe[0].eq(Cat(bus.kind == Cmd.RD_AB, bus.rank[:1]))
        for k in range(1, tm.CL):
            m.d.sync += pipe[k].eq(pipe[k - 1])
        tag = pipe[tm.CL - 1]
        for r, rpu in enumerate(rpus):
            m.d.comb += rpu.ab_valid.eq(dev.ab_valid & tag[0] & (tag[1] == r))
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
    """:func:`rankset_rtl`'s measurement (cycles of the device model's clock)."""
    window: int                 # cycles 0 .. the host's last WR (the receiving rank's write window), inclusive
    writes: int                 # WR bursts the host sent to the receiving rank
    rd_ab_with_comm: int        # RD_ABs of the computing rank in the window, the other rank receiving
    rd_ab_all_compute: int      # RD_ABs of both ranks in the same window, both computing, no host traffic
    rd_ab_alone: int            # RD_ABs of the computing rank in the window, the other rank idle (host mode)
    write_gbps: float           # host write bandwidth into the receiving rank over the window
    dq_peak_gbps: float
    bitexact: bool              # every head of both runs (incl. the written head, computed afterwards)
    violations: int             # device-model counter + independent checker, all runs
    errors: int                 # rank-PU / buffer-chip error bits, all runs
    runs: dict                  # per run: cycles, wall seconds

    @property
    def preserved(self) -> float:
        return self.rd_ab_with_comm / self.rd_ab_all_compute

    @property
    def contention_loss(self) -> float:
        return 1 - self.rd_ab_with_comm / self.rd_ab_alone


def rankset_rtl(config, *, L=512, heads=4, write_L=128, backend="verilator", system=None, seed=7):
    """[L3] 5.1 in RTL on :class:`RanksetSystem`: rank 0 computes ``heads`` heads of ``L`` tokens back to back
    while the host writes the KV cache of a ``write_L``-token head into rank 1 (host mode) at the bus rate; once
    the writes are done, rank 1's PU computes that head (its output proves the data arrived through the
    re-layout unit with the spoofed timing). Against two runs of the same build without host traffic: both ranks
    computing ``heads`` heads each (rank 1 on a copy of rank 0's heads), and rank 0 alone. RD_ABs are counted in
    the write window (cycle 0 .. the host's last WR), like :func:`sim.perf.pim.rankset_sim`. Every head is
    compared with the golden kernel, every trace with the JEDEC checker, every run with the device model's
    violation reports. ``config`` needs rows for two heads of ``L`` plus one of ``write_L`` per rank."""
    from hdl.pim.mapping import head_layout, kv_store_image, region_rows
    from sim.backends import get_backend, Traffic
    from sim.dram.checker import check_trace
    from sim.dram.trace import decode_trace
    from sim.golden.pim_attention import make_inputs, pim_attention
    from sim.pim.fused import encode_launch, decode_done
    be = get_backend(backend) if isinstance(backend, str) else backend
    cfg, org = config, config.dram.org
    lay = [head_layout(cfg, L, 2, rank=r) for r in range(2)]
    lay_w = head_layout(cfg, write_L, 1, rank=1, row_base=lay[1].rows_used)
    KV = [make_inputs(cfg, L, seed=seed + h)[1:] for h in range(2)]
    Ks, Vs = np.stack([k for k, _ in KV]), np.stack([v for _, v in KV])
    Kw, Vw = make_inputs(cfg, write_L, seed=seed + 10)[1:]
    img = {**kv_store_image(cfg, Ks, Vs, lay[0]), **kv_store_image(cfg, Ks, Vs, lay[1])}
    img_w = kv_store_image(cfg, Kw, Vw, lay_w)
    if system is None:
        system = RanksetSystem(cfg, img)
    qs = [make_inputs(cfg, 4, seed=seed + 100 + i)[0] for i in range(heads + 1)]
    launches = [[encode_launch(cfg, L, lay[r].k_row0[i % 2], lay[r].v_row0[i % 2], qs[i]) for i in range(heads)]
                for r in range(2)]
    l_w = [encode_launch(cfg, write_L, lay_w.k_row0[0], lay_w.v_row0[0], qs[heads])]
    gold = [pim_attention(cfg, qs[i], Ks[i % 2], Vs[i % 2]).out for i in range(heads)]
    gold_w = pim_attention(cfg, qs[heads], Kw, Vw).out
    d = cfg.head_dim
    writes = host_write_requests(system, img_w)
    stats = {"violations": 0, "errors": 0, "bitexact": True, "runs": {}}

    def run(name, launch0, launch1, host, want1, traffic=None):
        exp = {"result0": d * len(launch0), "done0": len(launch0), "result1": d * len(launch1),
               "done1": len(launch1), "host_o": 0, "trace": None, "errors": None}
        r = be.run_streams(system, {"launch0": launch0, "launch1": launch1, "host": host}, exp, traffic=traffic,
                           max_cycles=20 * heads * (8 * L + 2000) + 40 * len(host) + 50_000)
        tr = decode_trace(r.outputs["trace"], org)
        viol = len(check_trace(tr, cfg.dram, end_cycle=r.cycles)) + len(r.outputs["errors"])
        outs = [np.array(r.outputs[f"result{k}"], np.uint16).reshape(-1, d) for k in range(2)]
        dn = [decode_done(r.outputs[f"done{k}"]) for k in range(2)]
        ok = all(np.array_equal(o, g) for o, g in zip(outs[0], gold)) and \
            all(np.array_equal(o, g) for o, g in zip(outs[1], want1))
        errs = sum(x["errors"] != 0 or x["violations"] != 0 for dd in dn for x in dd)
        stats["bitexact"] &= bool(ok)
        stats["violations"] += viol
        stats["errors"] += errs
        stats["runs"][name] = {"cycles": r.cycles, "wall_s": round(r.wall_seconds, 3), "bitexact": bool(ok),
                               "violations": viol, "errors": errs}
        return tr

    # (1) rank 1 receives while rank 0 computes; rank 1's launch is presented 200 cycles after the host's last
    #     WR (found by a first run without it), then rank 1 computes the head it received
    probe = run("comm_probe", launches[0], [], writes, [])
    window = max(c.cycle for c in probe if c.rank == 1 and c.kind is Cmd.WR)
    pat = np.zeros(window + 201, dtype=bool)
    pat[-1] = True
    tr_comm = run("comm", launches[0], l_w, writes, [gold_w], traffic=Traffic(valid={"launch1": pat}))
    # (2) both ranks compute, no host traffic; (3) rank 0 alone
    tr_all = run("all_compute", launches[0], launches[1], [], gold)
    tr_alone = run("alone", launches[0], [], [], [])
    rd = lambda tr, ranks: sum(1 for c in tr if c.kind is Cmd.RD_AB and c.rank in ranks and c.cycle <= window)
    tm = cfg.dram.timing
    dq_peak = org.clock_bits / 8 / (tm.tck_ps * 1e-12) / 1e9
    wgbps = len(writes) * org.burst_bytes / ((window + 1) * tm.tck_ps * 1e-12) / 1e9
    return RanksetRTL(window=window + 1, writes=len(writes), rd_ab_with_comm=rd(tr_comm, (0,)),
                      rd_ab_all_compute=rd(tr_all, (0, 1)), rd_ab_alone=rd(tr_alone, (0,)), write_gbps=wgbps,
                      dq_peak_gbps=dq_peak, bitexact=stats["bitexact"], violations=stats["violations"],
                      errors=stats["errors"], runs=stats["runs"])
