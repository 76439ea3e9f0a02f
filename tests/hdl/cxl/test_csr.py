# amaranth: UnusedElaboratable=no
"""CXL MMIO register bank (``hdl.cxl.csr.CSRBank``) against a small Python model of the bank, on both backends.

The backends drive stream ports only, so the tests run the bank inside :class:`BankHarness`, which turns every
side input and output into streams. One command stream ``cmd`` orders everything: an MMIO request (passed to
the bank), a new HEAD/ERRORS value of a queue, an ``int_set`` pulse, or a snapshot of the bank's output ports.
Commands take effect in the order they are accepted, so a sequential model predicts every response, every
doorbell pulse, every change of ``irq`` (stamped with the number of commands accepted before it is seen) and
every snapshot, under random valid gaps and backpressure on ``rsp``.
"""

import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out

from hdl.cxl.regmap import RegisterMap, QueueLayout, MAX_SQ_ENTRIES, QUEUE_BASE, placement_ok
from hdl.cxl.csr import CSRBank
from sim.backends import Traffic, stream_ports

KIND_MMIO, KIND_RO, KIND_INT, KIND_SNAP = range(4)
STAMP_BITS = 16


def cmd_layout(bank):
    # KIND_RO: queue = addr, head = wdata[:32], errors = wdata[32:]; KIND_INT: mask = wdata; KIND_SNAP: queue = addr.
    return data.StructLayout({"kind": 2, "addr": bank.addr_bits, "write": 1, "wdata": 64})


class BankHarness(wiring.Component):
    """``CSRBank`` with its side ports as streams (see the module docstring). ``db`` and ``irq`` are traces:
    their ready is ignored (always collect them whole with ready high); ``snap`` answers KIND_SNAP in the cycle
    the command is accepted."""

    def __init__(self, regmap, **kw):
        self.bank = CSRBank(regmap, **kw)
        n = regmap.num_queues
        self.snap_layout = data.StructLayout({
            "queue": CSRBank.queue_layout(regmap), "int_enable": n, "int_status": n})
        super().__init__({
            "cmd": In(stream.Signature(cmd_layout(self.bank))),
            "rsp": Out(stream.Signature(self.bank.rsp.payload.shape())),
            "db": Out(stream.Signature(data.StructLayout({"queue": 8, "tail": 32, "stamp": STAMP_BITS}))),
            "irq": Out(stream.Signature(data.StructLayout({"irq": 1, "stamp": STAMP_BITS}))),
            "snap": Out(stream.Signature(self.snap_layout)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.bank = bank = self.bank
        n = bank.regmap.num_queues
        c = self.cmd.payload
        wiring.connect(m, wiring.flipped(self.rsp), bank.rsp)
        is_mmio = c.kind == KIND_MMIO
        m.d.comb += [
            bank.mmio.valid.eq(self.cmd.valid & is_mmio),
            bank.mmio.payload.addr.eq(c.addr),
            bank.mmio.payload.write.eq(c.write),
            bank.mmio.payload.wdata.eq(c.wdata),
            self.cmd.ready.eq(~is_mmio | bank.mmio.ready),
        ]
        take = self.cmd.valid & self.cmd.ready
        stamp = Signal(STAMP_BITS)
        with m.If(take):
            m.d.sync += stamp.eq(stamp + 1)
        for q in range(n):
            head, errors = Signal(32, name=f"head{q}"), Signal(32, name=f"errors{q}")
            with m.If(take & (c.kind == KIND_RO) & (c.addr == q)):
                m.d.sync += [head.eq(c.wdata[:32]), errors.eq(c.wdata[32:])]
            m.d.comb += [bank.head[q].eq(head), bank.errors[q].eq(errors)]
        with m.If(take & (c.kind == KIND_INT)):
            m.d.comb += bank.int_set.eq(c.wdata[:n])
        for q in range(n):
            with m.If(bank.doorbell[q].valid):
                m.d.comb += [self.db.valid.eq(1), self.db.payload.queue.eq(q),
                             self.db.payload.tail.eq(bank.doorbell[q].tail)]
        m.d.comb += self.db.payload.stamp.eq(stamp)
        prev = Signal()
        m.d.sync += prev.eq(bank.irq)
        m.d.comb += [self.irq.valid.eq(bank.irq != prev), self.irq.payload.irq.eq(bank.irq),
                     self.irq.payload.stamp.eq(stamp)]
        m.d.comb += [self.snap.valid.eq(self.cmd.valid & (c.kind == KIND_SNAP)),
                     self.snap.payload.int_enable.eq(bank.int_enable),
                     self.snap.payload.int_status.eq(bank.int_status)]
        for q in range(n):
            with m.If(c.addr == q):
                m.d.comb += self.snap.payload.queue.eq(bank.queue[q])
        return m


class BankModel:
    """Sequential model of a CSRBank: registers, RO inputs, RW1C, WO doorbells, errors."""

    def __init__(self, rm, addr_bits, layout=QueueLayout(0, 0)):
        self.rm, self.addr_bits, self.layout = rm, addr_bits, layout
        self.n = rm.num_queues
        self.store = {r.offset: r.reset for r in rm if r.access in ("RW", "RW1C")}
        self.head = [0] * self.n
        self.errors = [0] * self.n
        self.doorbells = []     # (queue, tail, stamp)
        self.irq_trace = []     # (irq, stamp)
        self.snaps = []
        self.responses = []
        self.count = 0
        self.last_irq = 0

    def value(self, name, q=None):
        return self.store[self.rm.offset(name, q)]

    def irq(self):
        en = sum(((self.value("CTRL", q) >> 1) & 1) << q for q in range(self.n))
        return int(self.value("INT_STATUS") & self.value("INT_ENABLE") & en != 0)

    def mmio(self, addr, write, wdata):
        r = self.rm.at(addr)
        if r is None:
            return 0, 1
        if not write:
            if r.access == "WO":
                return 0, 1
            if r.name == "HEAD":
                return self.head[r.queue], 0
            if r.name == "ERRORS":
                return self.errors[r.queue], 0
            return self.store.get(r.offset, r.reset), 0
        if r.access == "RO":
            return 0, 1
        if r.access == "WO":
            self.doorbells.append((r.queue, wdata & r.mask, self.count + 1))
        elif r.access == "RW1C":
            self.store[r.offset] &= ~wdata & r.mask
        elif r.name == "SQ_ENTRIES" and not (wdata == 0 or (wdata & (wdata - 1) == 0 and wdata <= MAX_SQ_ENTRIES)):
            return 0, 1
        elif r.name in ("QWIN_BASE", "QWIN_LIMIT") and (wdata % 64 or any(self.value("CTRL", q) & 1
                                                                            for q in range(self.n))):
            return 0, 1
        elif r.queue is not None and r.name in ("SQ_BASE", "SQ_ENTRIES", "CQ_BASE", "WIN_BASE", "WIN_LIMIT",
                                                "CTRL") and not self.placement(r, wdata & r.mask):
            return 0, 1
        else:
            self.store[r.offset] = wdata & r.mask
        return 0, 0

    def placement(self, r, v):
        q = r.queue
        vals = {name: self.value(name, q) for name in ("SQ_BASE", "SQ_ENTRIES", "CQ_BASE", "WIN_BASE", "WIN_LIMIT",
                                                       "CTRL")}
        vals[r.name] = v
        return placement_ok(self.layout, vals["SQ_BASE"], vals["SQ_ENTRIES"], vals["CQ_BASE"], vals["WIN_BASE"],
                            vals["WIN_LIMIT"], vals["CTRL"] & 1, self.value("QWIN_BASE"), self.value("QWIN_LIMIT"))

    def apply(self, kind, addr, write, wdata):
        if kind == KIND_MMIO:
            self.responses.append(self.mmio(addr, write, wdata))
        elif kind == KIND_RO:
            self.head[addr] = wdata & 0xFFFF_FFFF
            self.errors[addr] = wdata >> 32
        elif kind == KIND_INT:
            self.store[self.rm.offset("INT_STATUS")] |= wdata & ((1 << self.n) - 1)
        else:
            self.snaps.append(self.snapshot(addr))
        self.count += 1
        irq = self.irq()
        if irq != self.last_irq:
            self.irq_trace.append((irq, self.count))
            self.last_irq = irq

    def snapshot(self, q):
        qlay = CSRBank.queue_layout(self.rm)
        bits = 0
        for name, field in qlay:
            bits |= self.value(name.upper(), q) << field.offset
        bits |= self.value("INT_ENABLE") << qlay.size
        bits |= self.value("INT_STATUS") << (qlay.size + self.n)
        return bits


def encode_cmd(kind, addr, write, wdata, addr_bits):
    return kind | addr << 2 | write << (2 + addr_bits) | wdata << (3 + addr_bits)


def random_commands(rng, rm, addr_bits, count, qwin=False):
    """``qwin``: program a queue window [4 KiB, 12 KiB) first and write placement registers often (addresses in
    [0, 16 KiB)), so the queue window rules of CSRBank decide many writes."""
    regs = list(rm)
    n = rm.num_queues
    irq_regs = [rm.reg("INT_STATUS"), rm.reg("INT_ENABLE")] + [rm.reg("CTRL", q) for q in range(n)]
    cmds = []
    if qwin:
        cmds += [(KIND_MMIO, rm.offset("QWIN_BASE"), 1, 0x1000), (KIND_MMIO, rm.offset("QWIN_LIMIT"), 1, 0x3000)]
        placed = [rm.reg(name, q) for q in range(n) for name in ("SQ_BASE", "SQ_ENTRIES", "CQ_BASE", "WIN_BASE",
                                                                 "WIN_LIMIT", "CTRL")]
        regs = regs + placed * 3
    for _ in range(count):
        u = rng.random()
        if u < 0.08:
            cmds.append((KIND_RO, rng.randrange(n), 0, rng.getrandbits(64)))
            continue
        if u < 0.16:
            cmds.append((KIND_INT, 0, 0, rng.getrandbits(n)))
            continue
        if u < 0.22:
            cmds.append((KIND_SNAP, rng.randrange(n), 0, 0))
            continue
        v = rng.random()
        if v < 0.25:        # the interrupt registers, often enough for irq to toggle
            r = rng.choice(irq_regs)
            addr = r.offset
        elif v < 0.85:
            r = rng.choice(regs)
            addr = r.offset
        elif v < 0.9:
            addr = rng.choice(regs).offset + rng.randrange(1, 8)                 # misaligned
        elif v < 0.95:
            addr = rng.randrange(1 << addr_bits)                                  # anywhere
        else:
            addr = QUEUE_BASE + rng.randrange(n) * 0x80 + rng.randrange(10, 16) * 8   # hole in a queue block
        r = rm.at(addr)
        write = rng.random() < 0.55
        wdata = rng.getrandbits(64)
        if r is not None and write:
            if r.name == "SQ_ENTRIES":
                wdata = rng.choice([0, 1 << rng.randrange(17), MAX_SQ_ENTRIES << 1, rng.getrandbits(17),
                                    rng.getrandbits(64), 3])
            elif r.name in ("CTRL", "INT_ENABLE", "INT_STATUS"):
                wdata = rng.getrandbits(r.width) if rng.random() < 0.8 else wdata
            elif r.name in ("QWIN_BASE", "QWIN_LIMIT", "SQ_BASE", "CQ_BASE", "WIN_BASE", "WIN_LIMIT") \
                    and rng.random() < 0.8:     # a small address space, so the queue window rules decide
                wdata = 64 * rng.randrange(256) + (rng.randrange(64) if rng.random() < 0.1 else 0)
                if qwin and r.name.startswith("QWIN"):   # keep the window: rewrite it (locked?) or misalign
                    wdata = (0x1000 if r.name == "QWIN_BASE" else 0x3000) + (8 if rng.random() < 0.5 else 0)
                elif qwin and rng.random() < 0.8:        # mostly placements the rules accept
                    wdata = (0x1000 + 64 * rng.randrange(96) if r.name in ("SQ_BASE", "CQ_BASE")
                             else 0x3000 + 64 * rng.randrange(64))
            if qwin and r.name == "SQ_ENTRIES" and rng.random() < 0.7:
                wdata = rng.choice([1, 2, 4])
        cmds.append((KIND_MMIO, addr, int(write), wdata))
    if qwin:    # directed end: a valid queue 0, then a data window moved onto the queue window, QWIN locked
        for name, v in (("CTRL", 0), ("SQ_BASE", 0x1000), ("SQ_ENTRIES", 2), ("CQ_BASE", 0x2000),
                        ("WIN_BASE", 0x3000), ("WIN_LIMIT", 0x3400), ("CTRL", 1), ("WIN_BASE", 0x800),
                        ("WIN_LIMIT", 0x3400), ("SQ_ENTRIES", 64)):
            cmds.append((KIND_MMIO, rm.offset(name, 0), 1, v))
        cmds.append((KIND_MMIO, rm.offset("QWIN_BASE"), 1, 0))
    cmds.append((KIND_MMIO, rm.offset("INT_STATUS"), 0, 0))   # ends the run after every trace event
    return cmds


LAYOUT = QueueLayout(128, 64)      # slot 384 bytes, completion record 128 bytes: extents matter


def run_bank(backend, rm, cmds, *, addr_bits=None, traffic_seed=None, ready_prob=0.7, valid_prob=0.7):
    dut = BankHarness(rm, addr_bits=addr_bits, layout=LAYOUT)
    ab = dut.bank.addr_bits
    model = BankModel(rm, ab, LAYOUT)
    for c in cmds:
        model.apply(*c)
    traffic = None
    if traffic_seed is not None:
        tr = Traffic.random(stream_ports(dut), seed=traffic_seed, valid_prob=valid_prob, ready_prob=ready_prob)
        traffic = Traffic(valid=tr.valid, ready={"rsp": tr.ready["rsp"]})   # traces always ready
    run = backend.run_streams(dut, {"cmd": [encode_cmd(*c, ab) for c in cmds]},
                              {"rsp": len(model.responses), "db": None, "irq": None, "snap": None},
                              traffic=traffic)
    return dut, model, run


def check(run, model):
    got_rsp = [(v & ((1 << 64) - 1), v >> 64) for v in run.outputs["rsp"]]
    for k, (g, e) in enumerate(zip(got_rsp, model.responses)):
        assert g == e, f"response {k}: got (rdata={g[0]:#x}, err={g[1]}), expected (rdata={e[0]:#x}, err={e[1]})"
    assert len(got_rsp) == len(model.responses)
    got_db = [(v & 0xFF, (v >> 8) & 0xFFFF_FFFF, v >> 40) for v in run.outputs["db"]]
    assert got_db == model.doorbells
    got_irq = [(v & 1, v >> 1) for v in run.outputs["irq"]]
    assert got_irq == model.irq_trace
    assert run.outputs["snap"] == model.snaps


@pytest.mark.parametrize("seed", [1, 2])
def test_random_sequences_match_model(backend, seed):
    rm = RegisterMap(num_queues=4)
    cmds = random_commands(random.Random(seed), rm, rm.addr_bits, 600)
    _, model, run = run_bank(backend, rm, cmds, traffic_seed=seed)
    check(run, model)
    # The sequence exercised every behaviour.
    assert any(e for _, e in model.responses) and any(not e for _, e in model.responses)
    assert model.doorbells and len(model.irq_trace) >= 4 and model.snaps


def test_queue_window_rules_match_model(backend):
    """With a queue window programmed: placement writes accepted and refused (ring / completion area outside the
    window, data window overlapping it), QWIN locked while a queue is enabled, misaligned QWIN values refused."""
    rm = RegisterMap(num_queues=4)
    cmds = random_commands(random.Random(8), rm, rm.addr_bits, 1200, qwin=True)
    _, model, run = run_bank(backend, rm, cmds, traffic_seed=7)
    check(run, model)
    names = {}
    for c, (_, err) in zip([c for c in cmds if c[0] == KIND_MMIO], model.responses):
        r = rm.at(c[1])
        if r is not None and c[2]:
            names.setdefault((r.name, err), 0)
            names[(r.name, err)] += 1
    for name in ("SQ_BASE", "CQ_BASE", "WIN_BASE", "WIN_LIMIT", "CTRL"):
        assert names.get((name, 0)), (name, names)
    for name in ("SQ_BASE", "CQ_BASE", "CTRL"):
        assert names.get((name, 1)), (name, names)
    assert names.get(("WIN_BASE", 1)) or names.get(("WIN_LIMIT", 1)), names
    assert model.value("QWIN_LIMIT") == 0x3000 and names.get(("QWIN_BASE", 1))


def test_wide_address_unmapped_above_size(backend):
    """Three queues (INT bits not a power of two), an address wider than the window: above size is unmapped."""
    rm = RegisterMap(num_queues=3)
    ab = rm.addr_bits + 3
    rng = random.Random(7)
    cmds = random_commands(rng, rm, ab, 400)
    cmds[:0] = [(KIND_MMIO, rm.size + r.offset, w, 1) for r in list(rm)[:6] for w in (0, 1)]
    _, model, run = run_bank(backend, rm, cmds, addr_bits=ab, traffic_seed=8, ready_prob=0.3)
    check(run, model)
    assert all(e == (0, 1) for e in model.responses[:12])


def test_full_rate_one_response_per_cycle(backend):
    """Back-to-back requests: one per cycle, each answered the next cycle; doorbells pulse at full rate."""
    rm = RegisterMap(num_queues=4)
    cmds = [(KIND_MMIO, rm.offset("DOORBELL", q % 4), 1, 100 + q) for q in range(8)]
    cmds += [(KIND_MMIO, r.offset, 0, 0) for r in rm]
    dut, model, run = run_bank(backend, rm, cmds)
    check(run, model)
    assert run.cycles == len(cmds) + 1
    assert [d[2] for d in model.doorbells] == list(range(1, 9))


def test_irq_gating(backend):
    """irq needs INT_STATUS, INT_ENABLE and the queue's CTRL.irq_enable; a W1C clears, a set wins over it."""
    rm = RegisterMap(num_queues=4)
    W = lambda name, v, q=None: (KIND_MMIO, rm.offset(name, q), 1, v)  # noqa: E731
    cmds = [(KIND_INT, 0, 0, 0b10), W("INT_ENABLE", 0b10), W("CTRL", 0b10, 1),     # irq rises at the CTRL
            W("CTRL", 0b01, 1), W("CTRL", 0b11, 1), W("INT_STATUS", 0b01),         # falls, rises; W1C of bit 0
            W("INT_STATUS", 0b10), (KIND_INT, 0, 0, 0b01), W("INT_ENABLE", 0b11),  # falls; q0 not enabled in CTRL
            W("CTRL", 0b10, 0), (KIND_MMIO, rm.offset("INT_STATUS"), 0, 0)]
    _, model, run = run_bank(backend, rm, cmds, traffic_seed=11)
    check(run, model)
    assert model.irq_trace == [(1, 3), (0, 4), (1, 5), (0, 7), (1, 10)]
    assert model.responses[-1] == (0b01, 0)


def test_int_set_wins_over_clear():
    """Amaranth only: int_set and a W1C of the same bit in the same cycle leave the bit set."""
    from amaranth.sim import Simulator
    rm = RegisterMap(num_queues=2)
    dut = CSRBank(rm)

    async def bench(ctx):
        ctx.set(dut.rsp.ready, 1)
        ctx.set(dut.int_set, 0b11)
        await ctx.tick()
        ctx.set(dut.int_set, 0b01)
        ctx.set(dut.mmio.valid, 1)
        ctx.set(dut.mmio.payload.addr, rm.offset("INT_STATUS"))
        ctx.set(dut.mmio.payload.write, 1)
        ctx.set(dut.mmio.payload.wdata, 0b11)
        await ctx.tick()
        ctx.set(dut.mmio.valid, 0)
        ctx.set(dut.int_set, 0)
        assert ctx.get(dut.int_status) == 0b01
        assert ctx.get(dut.rsp.valid) and not ctx.get(dut.rsp.payload.err)
        # value() points at the live ports.
        assert ctx.get(dut.value("INT_STATUS")) == 0b01
        assert ctx.get(dut.value("SQ_ENTRIES", 1)) == 0
        assert ctx.get(dut.value("DEV_ID")) == rm.reg("DEV_ID").reset

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="RegisterMap"):
        CSRBank(4)
    rm = RegisterMap(num_queues=4)
    with pytest.raises(ValueError, match="addr_bits"):
        CSRBank(rm, addr_bits=rm.addr_bits - 1)
    with pytest.raises(ValueError, match="addr_bits"):
        CSRBank(rm, addr_bits=65)
