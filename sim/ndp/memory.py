"""A fixed-latency burst memory with the memory controller's stream interface (for fast core tests).

Not a DRAM model: it answers every read ``latency`` cycles after acceptance, in order, one request per cycle,
so tests of the NDP core's data path run quickly on both simulator backends. The timing-accurate path is
:class:`sim.ndp.system.NDPMemorySystem` (the real controller and the DRAM channel model).
"""

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFOBuffered

__all__ = ["BurstMemory"]


class BurstMemory(wiring.Component):
    """``depth`` bursts of ``burst_bits``; ``init``: initial bursts (ints). Ports ``i`` (requests
    ``{addr, write, wdata, tag}``) and ``o`` (read responses ``{rdata, tag}``), the layouts of
    :class:`hdl.memctl.controller.MemoryController` with ``addr_bits`` / ``tag_width``. Addresses wrap modulo
    ``depth`` (a power of two)."""

    def __init__(self, *, burst_bits: int, depth: int, addr_bits: int, latency: int = 8, tag_width: int = 0,
                 init=()):
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two >= 2, got {depth}")
        if not 1 <= latency <= 64:
            raise ValueError(f"latency must be in 1..64, got {latency}")
        self.burst_bits, self.depth, self.latency = burst_bits, depth, latency
        self.init = list(init)
        self.request_layout = data.StructLayout({"addr": addr_bits, "write": 1, "wdata": burst_bits,
                                                 "tag": tag_width})
        self.response_layout = data.StructLayout({"rdata": burst_bits, "tag": tag_width})
        super().__init__({
            "i": In(stream.Signature(self.request_layout)),
            "o": Out(stream.Signature(self.response_layout)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = memory.Memory(shape=unsigned(self.burst_bits), depth=self.depth, init=self.init)
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=(wr,))
        fifo_depth = self.latency + 4      # every read in the delay line has room, plus slack for the consumer
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=self.burst_bits, depth=fifo_depth)
        outstanding = Signal(range(fifo_depth + 2))
        addr = self.i.payload.addr[:(self.depth - 1).bit_length()]
        room = outstanding < fifo_depth
        m.d.comb += [
            self.i.ready.eq(room),
            wr.addr.eq(addr), wr.data.eq(self.i.payload.wdata),
            wr.en.eq(self.i.valid & room & self.i.payload.write),
            rd.addr.eq(addr), rd.en.eq(1),
        ]
        accept_rd = self.i.valid & room & ~self.i.payload.write
        # delay line: the read data appears one cycle after the request; latency - 1 more register stages
        valid = [Signal(name=f"v{k}") for k in range(self.latency)]
        stage = [Signal(self.burst_bits, name=f"d{k}") for k in range(self.latency)]
        m.d.sync += valid[0].eq(accept_rd)
        for k in range(1, self.latency):
            m.d.sync += [valid[k].eq(valid[k - 1]), stage[k].eq(stage[k - 1] if k > 1 else rd.data)]
        last = rd.data if self.latency == 1 else stage[self.latency - 1]
        m.d.comb += [fifo.w_en.eq(valid[self.latency - 1]), fifo.w_data.eq(last)]
        m.d.comb += [
            self.o.valid.eq(fifo.r_rdy), self.o.payload.rdata.eq(fifo.r_data), fifo.r_en.eq(self.o.ready),
        ]
        popped = self.o.valid & self.o.ready
        m.d.sync += outstanding.eq(outstanding + accept_rd - popped)
        return m
