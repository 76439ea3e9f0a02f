"""Stream test bench top for the DRAM device model: plays a list of timed commands into a :class:`DRAMChannel`.

Streams (``amaranth.lib.stream``; the model side never waits on the test bench except through FIFOs):

* ``i`` (in, :meth:`CommandPlayer.entry_layout`): ``{delay, mark, cmd, wdata}``. The entry's command goes on the
  bus ``delay`` cycles after the previous entry's (the first entry: in cycle ``delay``; a delay of 0 counts as 1
  after the first entry). If the entry has not arrived by then, it issues in the cycle it arrives. A WR/WR_AB
  entry's ``wdata`` (``burst_bits``) is driven on the DQ pins ``CWL .. CWL + burst_cycles - 1`` cycles after the
  command (whether or not the command is legal). ``cmd.kind == NOP`` entries issue nothing (use them to wait);
  ``mark = 1`` emits the issue cycle on ``marks`` (end a run with a marked NOP a few dozen cycles after the last
  command, so that every report has drained).
* ``rdata`` (out, ``burst_bits``): one payload per read burst, assembled from the ``rdata`` pins.
* ``ab_rdata`` (out, ``banks * burst_bits``): one payload per RD_AB, from the ``ab_rdata`` pins.
* ``trace`` (out, ``trace_layout(org)``): every non-NOP command put on the bus, with its cycle.
* ``errors`` (out, :data:`error_layout`): ``{code, cycle}`` for every violation the model reports.
* ``marks`` (out, ``CYCLE_BITS``): the issue cycle of every ``mark`` entry.

Output FIFOs: ``rdata`` 8, ``ab_rdata`` 4, ``trace`` 32, ``errors`` 32, ``marks`` 4 entries; a payload arriving at
a full FIFO is dropped and counted in ``dropped`` (plain output).
"""

from amaranth import *
from amaranth.hdl import Shape
from amaranth.lib import wiring, data, stream
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered

from hdl.memctl.commands import Cmd, command_layout, trace_layout, Violation, CYCLE_BITS

from .device import DRAMChannel

__all__ = ["CommandPlayer", "error_layout", "DELAY_BITS"]

DELAY_BITS = 24

error_layout = data.StructLayout({"code": Violation, "cycle": CYCLE_BITS})


class CommandPlayer(wiring.Component):
    """A :class:`DRAMChannel` of ``config`` driven by a timed command stream. ``init``/``storage``: see the model."""

    def __init__(self, config, init=None, *, storage: bool = True):
        self.config = config
        self.org = org = config.org
        self.dram = DRAMChannel(config, init, storage=storage)
        super().__init__({
            "i": In(stream.Signature(self.entry_layout(org))),
            "rdata": Out(stream.Signature(org.burst_bits)),
            "ab_rdata": Out(stream.Signature(org.banks * org.burst_bits)),
            "trace": Out(stream.Signature(trace_layout(org))),
            "errors": Out(stream.Signature(error_layout)),
            "marks": Out(stream.Signature(CYCLE_BITS)),
            "dropped": Out(16),
        })

    @staticmethod
    def entry_layout(org) -> data.StructLayout:
        return data.StructLayout({"delay": DELAY_BITS, "mark": 1, "cmd": command_layout(org),
                                  "wdata": org.burst_bits})

    def encode(self, kind=Cmd.NOP, *, delay=1, rank=0, bg=0, bank=0, row=0, col=0, wdata=0, mark=0) -> int:
        """One ``i`` payload as an int."""
        layout = self.entry_layout(self.org)
        cmd = {"kind": kind, "rank": rank, "bg": bg, "bank": bank, "row": row, "col": col}
        return layout.const({"delay": delay, "mark": mark, "cmd": cmd, "wdata": wdata}).as_value().value

    @staticmethod
    def decode_errors(payloads) -> list:
        """``errors`` payloads -> list of (Violation, cycle)."""
        cw = Shape.cast(Violation).width
        return [(Violation((p) & ((1 << cw) - 1)), p >> cw) for p in payloads]

    def elaborate(self, platform):
        m = Module()
        org, tm = self.org, self.config.timing
        BB, CB, BC = org.burst_bits, org.clock_bits, org.burst_cycles
        CWL = tm.CWL
        m.submodules.dram = dram = self.dram
        dropped = self.dropped

        def out_fifo(name, port, width, depth, w_en, w_data, buffered=True):
            fifo = (SyncFIFOBuffered if buffered else SyncFIFO)(width=width, depth=depth)
            m.submodules[f"{name}_fifo"] = fifo
            m.d.comb += [fifo.w_en.eq(w_en), fifo.w_data.eq(w_data),
                         port.valid.eq(fifo.r_rdy), port.payload.eq(fifo.r_data), fifo.r_en.eq(port.ready)]
            return fifo

        # ---- command issue -----------------------------------------------------------------------------------
        since = Signal(DELAY_BITS)   # cycles since the previous entry issued (since reset for the first)
        entry = self.i.payload
        issue = Signal()
        m.d.comb += [issue.eq(self.i.valid & (since >= entry.delay)), self.i.ready.eq(issue)]
        with m.If(issue):
            m.d.sync += since.eq(1)
        with m.Elif(since != (1 << DELAY_BITS) - 1):
            m.d.sync += since.eq(since + 1)
        with m.If(issue):
            m.d.comb += dram.cmd.eq(entry.cmd)
        cycle = dram.cycle
        is_write = (entry.cmd.kind == Cmd.WR) | (entry.cmd.kind == Cmd.WR_AB)

        # ---- write data onto the DQ pins ---------------------------------------------------------------------
        wq = m.submodules.wq = SyncFIFO(width=BB, depth=CWL + 1)
        m.d.comb += [wq.w_en.eq(issue & is_write), wq.w_data.eq(entry.wdata)]
        dl = Signal(CWL)  # bit j: a write issued j + 1 cycles ago
        m.d.sync += dl.eq(Cat(issue & is_write, dl[:-1]))
        wsh = Signal(BB)
        wcnt = Signal(range(BC + 1))
        with m.If(dl[CWL - 2]):      # issued CWL - 1 cycles ago: first beat next cycle
            m.d.comb += wq.r_en.eq(1)
            m.d.sync += [wsh.eq(wq.r_data), wcnt.eq(BC)]
        with m.Elif(wcnt != 0):
            m.d.sync += [wsh.eq(wsh >> CB), wcnt.eq(wcnt - 1)]
        with m.If(wcnt != 0):
            m.d.comb += dram.wdata.eq(wsh[:CB])

        # ---- read bursts -------------------------------------------------------------------------------------
        rbuf = [Signal(CB, name=f"rbuf_{i}") for i in range(BC - 1)]
        beat = Signal(range(BC))
        with m.If(dram.rdata_valid):
            m.d.sync += beat.eq(Mux(beat == BC - 1, 0, beat + 1))
            for i in range(BC - 1):
                with m.If(beat == i):
                    m.d.sync += rbuf[i].eq(dram.rdata)
        rd_fifo = out_fifo("rdata", self.rdata, BB, 8, dram.rdata_valid & (beat == BC - 1), Cat(*rbuf, dram.rdata))
        # RD_AB data: one FIFO per bank, in lockstep (Amaranth's simulator cannot compile a memory write port
        # thousands of bits wide).
        ab_fifos = []
        for b in range(org.banks):
            f = SyncFIFOBuffered(width=BB, depth=4)
            m.submodules[f"ab_fifo{b}"] = f
            m.d.comb += [f.w_en.eq(dram.ab_valid), f.w_data.eq(dram.ab_rdata.word_select(b, BB)),
                         self.ab_rdata.payload.word_select(b, BB).eq(f.r_data), f.r_en.eq(self.ab_rdata.ready)]
            ab_fifos.append(f)
        m.d.comb += self.ab_rdata.valid.eq(ab_fifos[0].r_rdy)
        ab_fifo = ab_fifos[0]

        # ---- trace, errors, marks ----------------------------------------------------------------------------
        tr_fifo = out_fifo("trace", self.trace, Shape.cast(trace_layout(org)).width, 32,
                           issue & (entry.cmd.kind != Cmd.NOP), Cat(entry.cmd.as_value(), cycle))
        er_fifo = out_fifo("errors", self.errors, Shape.cast(error_layout).width, 32,
                           dram.violation, Cat(dram.violation_code, dram.violation_cycle))
        mk_fifo = out_fifo("marks", self.marks, CYCLE_BITS, 4, issue & entry.mark, cycle)
        lost = Cat(f.w_en & ~f.w_rdy for f in (rd_fifo, ab_fifo, tr_fifo, er_fifo, mk_fifo)).any()
        with m.If(lost):
            m.d.sync += dropped.eq(dropped + 1)
        return m
