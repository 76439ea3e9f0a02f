# amaranth: UnusedElaboratable=no
"""Formal proof (Yosys SAT k-induction, :mod:`sim.verify.formal`) of the host address filter
(:class:`hdl.cxl.filter.HostFilter`): no rejected access reaches memory, allowed ones pass unchanged.

For every input sequence -- any request stream on ``i`` (valid and payload free every cycle), any ``o``
backpressure, reset at any time, and arbitrary queue registers and queue window that stay stable -- proven
unbounded in time (2 queues, 8-bit line addresses, a 320-byte slot / 128-byte completion record layout):

1. forwarding: a request accepted in cycle t that the independent reference allows is on ``o`` in t+1, unchanged,
   with ``reject = 0``; a rejected read is on ``o`` in t+1 with ``reject = 1`` and ``wdata = 0``; a rejected write
   is not on ``o`` (dropped);
2. stream rules and nothing spurious: a stalled ``o`` item stays; any other ``o`` item is the one accepted in the
   previous cycle; ``rejects`` counts exactly the rejected requests (saturating);
3. progress: ``o.ready`` implies ``i.ready``.

With 1 and 2, every ``o`` item with ``reject = 0`` (the only ones the device sends to memory) is an allowed
request, unchanged. The reference restates the rule of ``docs/cxl_isolation.md`` on first / last bytes with 80-bit
arithmetic. A mutant filter (PASID check ignored) must fail the proof.
"""

import pytest
from amaranth.hdl import Elaboratable, Module, Signal, Assert, Assume, Cat

from hdl.cxl.filter import HostFilter, host_access_ok
from hdl.cxl.regmap import QueueLayout, PASID_BITS
from sim.verify.formal import prove

NQ, ADDR_BITS, DATA_BITS, COUNT_BITS = 2, 8, 8, 3
LAYOUT = QueueLayout(64, 64)


class FilterProperties(Elaboratable):
    def __init__(self, dut: HostFilter):
        self.dut = dut
        self.i_valid = Signal()
        self.i_payload = Signal(dut.request_layout.size)
        self.o_ready = Signal()
        self.cfg = Signal(NQ * dut.queue[0].as_value().shape().width + 128)

    @property
    def ports(self):
        return [self.i_valid, self.i_payload, self.o_ready, self.cfg]

    def elaborate(self, platform):
        m = Module()
        f = m.submodules.dut = self.dut
        i, o = f.i, f.o
        qw = f.queue[0].as_value().shape().width
        m.d.comb += [i.valid.eq(self.i_valid), i.payload.eq(self.i_payload), o.ready.eq(self.o_ready),
                     f.qwin_base.eq(self.cfg[NQ * qw:NQ * qw + 64]), f.qwin_limit.eq(self.cfg[NQ * qw + 64:])]
        for q in range(NQ):
            m.d.comb += f.queue[q].as_value().eq(self.cfg[q * qw:(q + 1) * qw])

        past = Signal()
        prev_cfg = Signal.like(self.cfg)
        m.d.sync += [past.eq(1), prev_cfg.eq(self.cfg)]
        m.d.comb += Assume(~past | (self.cfg == prev_cfg))

        def ref_ok(addr, pasid):
            first = Signal(80)
            last = Signal(80)
            m.d.comb += [first.eq(addr * 64), last.eq(addr * 64 + 63)]

            def touches(a_lo, size):      # some byte of [first, last] in [a_lo, a_lo + size), size > 0
                return (size != 0) & (last >= a_lo) & (first <= a_lo + size - 1)
            owned, match = [], []
            for q in range(NQ):
                r = f.queue[q]
                live = r.enable & (r.sq_entries != 0)
                own = live & (touches(r.sq_base, r.sq_entries * LAYOUT.slot_bytes)
                              | touches(r.cq_base, r.sq_entries * LAYOUT.cpl_bytes))
                owned.append(own)
                match.append(own & (r.pasid == pasid))
            qsize = Signal(80)
            m.d.comb += qsize.eq(Cat(f.qwin_limit, 0) - f.qwin_base)
            in_qwin = (f.qwin_limit > f.qwin_base) & touches(f.qwin_base, qsize)
            return Cat(match).any() | (~Cat(owned).any() & ~in_qwin)

        accepted = i.valid & i.ready
        ok = Signal()
        m.d.comb += ok.eq(ref_ok(i.payload.addr, i.payload.pasid))
        fwd, rrd, rwr = Signal(), Signal(), Signal()
        last = Signal(f.request_layout)
        stalled = Signal()
        o_prev = Signal(f.output_layout)
        cnt_prev = Signal(COUNT_BITS)
        m.d.sync += [fwd.eq(accepted & ok), rrd.eq(accepted & ~ok & ~i.payload.write),
                     rwr.eq(accepted & ~ok & i.payload.write), last.eq(i.payload),
                     stalled.eq(o.valid & ~o.ready), o_prev.eq(o.payload), cnt_prev.eq(f.rejects)]
        sat = cnt_prev == (1 << COUNT_BITS) - 1
        p = o.payload
        m.d.comb += [
            Assert(~fwd | (o.valid & ~p.reject & (p.addr == last.addr) & (p.write == last.write)
                           & (p.wdata == last.wdata))),
            Assert(~rrd | (o.valid & p.reject & (p.addr == last.addr) & ~p.write & (p.wdata == 0))),
            Assert(~rwr | ~o.valid),
            Assert(~stalled | (o.valid & (p.as_value() == o_prev.as_value()))),
            Assert(~o.valid | fwd | rrd | stalled),
            Assert(~(stalled & (fwd | rrd | rwr))),
            Assert(f.rejects == cnt_prev + ((rrd | rwr) & ~sat)),
            Assert(~o.ready | i.ready),
        ]
        return m


def _dut(cls=HostFilter):
    return cls(NQ, ADDR_BITS, LAYOUT, data_bits=DATA_BITS, count_bits=COUNT_BITS)


def test_filter_properties_proven():
    w = FilterProperties(_dut())
    r = prove(w, ports=w.ports, max_steps=6, timeout=240)
    assert r.passed, r.summary()


class _NoPasidCheck(HostFilter):
    def allowed(self, addr, pasid):
        return super().allowed(addr, self.queue[0].pasid)     # every request looks like queue 0's requester


def test_filter_mutant_fails_the_proof():
    w = FilterProperties(_dut(_NoPasidCheck))
    r = prove(w, ports=w.ports, max_steps=6, timeout=240)
    assert r.status == "counterexample", r.summary()


@pytest.mark.parametrize("seed", range(3))
def test_python_mirror_matches_the_rtl_rule(seed):
    """``host_access_ok`` (used by the golden device) against the RTL rule, exhaustively over line addresses for
    random register sets (Amaranth simulation of the combinational ``allowed``)."""
    import random
    from amaranth.sim import Simulator
    rng = random.Random(seed)
    dut = _dut()
    cases = []
    for _ in range(12):
        regs = [(64 * rng.randrange(0, 256), rng.choice([0, 1, 2, 4]), 64 * rng.randrange(0, 256),
                 rng.randrange(3), rng.random() < 0.8) for _ in range(NQ)]
        qb, ql = 64 * rng.randrange(0, 256), 64 * rng.randrange(0, 256)
        cases.append((regs, qb, ql))
    out = []

    async def bench(ctx):
        for regs, qb, ql in cases:
            for q, (sq, n, cq, pasid, en) in enumerate(regs):
                r = dut.queue[q]
                ctx.set(r.sq_base, sq), ctx.set(r.sq_entries, n), ctx.set(r.cq_base, cq)
                ctx.set(r.pasid, pasid), ctx.set(r.enable, en)
            ctx.set(dut.qwin_base, qb), ctx.set(dut.qwin_limit, ql)
            for line in range(1 << ADDR_BITS):
                pasid = rng.randrange(3)
                ctx.set(dut.i.payload.addr, line), ctx.set(dut.i.payload.pasid, pasid)
                ctx.set(dut.i.valid, 1), ctx.set(dut.o.ready, 1)
                await ctx.tick()
                got = ctx.get(dut.o.valid) and not ctx.get(dut.o.payload.reject)
                want = host_access_ok(line, pasid, regs, qb, ql, LAYOUT)
                out.append((got, want, line, pasid, regs, qb, ql))
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    bad = [x for x in out if x[0] != x[1]]
    assert not bad, bad[:3]
    assert any(x[1] for x in out) and any(not x[1] for x in out)
