"""The rank PU's command sequencer alone (hdl/pim/rank_pu.PIMSequencer): its RD_AB addresses are those of
hdl/pim/mapping (score_reads / context_reads), the program is legal for the independent checker, and the
dynamic refresh holds the JESD79-4 postponement limit even when a head is longer than the refresh window and
the probabilities arrive with random gaps (urgent refresh inside a head: PREA, REF, re-ACT). A shortened tREFI
(120 cycles, tRFC 30) makes refresh frequent in a short run."""

from dataclasses import replace

import numpy as np
from amaranth.hdl import Module, Signal, Cat
from amaranth.lib import wiring, stream
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.hdl import Shape

from hdl.memctl.commands import Cmd, trace_layout, CYCLE_BITS
from hdl.pim.mapping import score_reads, context_reads
from hdl.pim.rank_pu import PIMSequencer, launch_layout, rd_layout
from sim.backends import Traffic
from sim.dram.checker import check_trace, describe
from sim.dram.trace import decode_trace
from sim.pim.fused import micro, encode_launch, phase_order

BASE = micro(16, ranks=1)
CFG = replace(BASE, dram=replace(BASE.dram, timing=replace(BASE.dram.timing, tREFI=120, tRFC=30)))


class SequencerBench(wiring.Component):
    """PIMSequencer + a ``p`` token stream (one item = one context RD_AB's probabilities) + trace / rd
    records out."""

    def __init__(self, config):
        self.config = config
        self.seq = PIMSequencer(config, drain=64)
        super().__init__({
            "launch": In(stream.Signature(launch_layout(config))),
            "p": In(stream.Signature(1)),
            "rd": Out(stream.Signature(rd_layout(config))),
            "trace": Out(stream.Signature(trace_layout(config.dram.org))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.seq = seq = self.seq
        wiring.connect(m, wiring.flipped(self.launch), seq.launch)
        rq = m.submodules.rq = SyncFIFOBuffered(width=Shape.cast(rd_layout(self.config)).width, depth=4)
        fire = seq.rd.valid & seq.rd.ready
        m.d.comb += [seq.rd.ready.eq(rq.w_rdy), rq.w_en.eq(fire), rq.w_data.eq(seq.rd.payload),
                     self.rd.valid.eq(rq.r_rdy), self.rd.payload.eq(rq.r_data), rq.r_en.eq(self.rd.ready),
                     seq.p_avail.eq(self.p.valid), self.p.ready.eq(fire & seq.rd.payload.mode)]
        t = Signal(CYCLE_BITS)
        m.d.sync += t.eq(t + 1)
        tq = m.submodules.tq = SyncFIFOBuffered(width=Shape.cast(trace_layout(self.config.dram.org)).width,
                                                depth=16)
        m.d.comb += [tq.w_en.eq(seq.cmd.kind != Cmd.NOP), tq.w_data.eq(Cat(seq.cmd.as_value(), t)),
                     self.trace.valid.eq(tq.r_rdy), self.trace.payload.eq(tq.r_data), tq.r_en.eq(self.trace.ready)]
        return m


def test_sequencer_program_and_urgent_refresh(backend):
    heads = [(256, 0, 4, 8), (13, 12, 13, 0), (37, 14, 15, 8)]   # (L, k_row0, v_row0, postpone)
    dut = SequencerBench(CFG)
    q = np.zeros(CFG.head_dim, np.uint16)
    launches = [encode_launch(CFG, L, k0, v0, q, pp) for L, k0, v0, pp in heads]
    n_ctx = [-(-L // CFG.token_sets) for L, *_ in heads]
    n_rd = sum(len(score_reads(CFG, L)) + n for (L, *_), n in zip(heads, n_ctx))
    traffic = Traffic(valid={"p": np.random.default_rng(1).random(4099) < 0.25})
    run = backend.run_streams(dut, {"launch": launches, "p": [0] * sum(n_ctx)}, {"rd": n_rd, "trace": None},
                              traffic=traffic, max_cycles=200_000)
    trace = decode_trace(run.outputs["trace"], CFG.dram.org)
    viol = check_trace(trace, CFG.dram, end_cycle=run.cycles)
    assert viol == [], describe(viol)
    # RD_AB addresses = the mapping's read sequences, phase after phase: head 0 (L = 256 fills the rank buffer)
    # alone, then heads 1 and 2 overlapped (S1 S2 C1 C2)
    order = phase_order(CFG, [L for L, *_ in heads])
    assert order == [(0, "S"), (0, "C"), (1, "S"), (2, "S"), (1, "C"), (2, "C")]
    rds = [(c.row, c.col) for c in trace if c.kind is Cmd.RD_AB]
    want = []
    edges, n = {0}, 0
    for h, ph in order:
        L, k0, v0, _ = heads[h]
        reads = score_reads(CFG, L, k0) if ph == "S" else context_reads(CFG, L, v0)
        want += list(zip(reads.row.tolist(), reads.col.tolist()))
        n += len(reads.row)
        edges.add(n)
    assert rds == want
    # refresh: the limit held (checker) and some REFs had to be issued inside the long head (rows re-opened)
    inside = n_before = 0
    for c in trace:
        if c.kind is Cmd.RD_AB:
            n_before += 1
        elif c.kind is Cmd.REF and n_before not in edges:
            inside += 1
    refs = sum(c.kind is Cmd.REF for c in trace)
    assert refs >= run.cycles // CFG.dram.timing.tREFI - CFG.max_postponed_refresh
    assert inside >= 1, "expected urgent refreshes inside the long head"
    print(f"{run.cycles} cycles, {refs} REFs ({inside} inside a head phase) at",
          [c.cycle for c in trace if c.kind is Cmd.REF])


def test_sequencer_matches_the_model_with_urgent_refresh(backend):
    """The PIM model's sequencer (sim/perf/pim.PIMSequenceModel: the all-bank rules of hdl/pim/allbank.py, the
    overlap and refresh decisions) issues the same commands in the same cycles as the RTL sequencer, here with
    tREFI = 120 so that the long head needs urgent refreshes inside its phases (probabilities always there: no
    datapath, gap 0) and heads 1, 2 overlap."""
    from sim.perf.pim import PIMSequenceModel, SeqLaunch
    heads = [(256, 0, 4, 8), (13, 12, 13, 0), (37, 14, 15, 8)]
    dut = SequencerBench(CFG)
    q = np.zeros(CFG.head_dim, np.uint16)
    launches = [encode_launch(CFG, L, k0, v0, q, pp) for L, k0, v0, pp in heads]
    n_ctx = sum(-(-L // CFG.token_sets) for L, *_ in heads)
    n_rd = sum(len(score_reads(CFG, L)) for L, *_ in heads) + n_ctx
    run = backend.run_streams(dut, {"launch": launches, "p": [0] * n_ctx}, {"rd": n_rd, "trace": None},
                              max_cycles=200_000)
    trace = decode_trace(run.outputs["trace"], CFG.dram.org)
    model = PIMSequenceModel(CFG, gap=0, tail=0, drain=64, launch_queue=False)
    m = model.run([SeqLaunch(L, k0, v0, pp) for L, k0, v0, pp in heads])
    key = lambda t, k, r, c: (t, k, r, c) if k is Cmd.RD_AB else (t, k, r) if k is Cmd.ACT_AB else (t, k)
    # the trace is collected up to the run's completion (the last RD_AB record): the closing PREA may follow
    assert [key(*x) for x in m.commands if x[0] < run.cycles] == [key(c.cycle, c.kind, c.row, c.col) for c in trace]
    refs = [c.cycle for c in trace if c.kind is Cmd.REF]
    urgent = sum(1 for t in refs if m.heads[0].score_first < t < m.heads[0].context_last)
    assert urgent >= 2, refs
