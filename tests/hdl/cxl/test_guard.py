# amaranth: UnusedElaboratable=no
"""Queue isolation checks (:mod:`hdl.cxl.guard`) in simulation, on both backends (``backend`` fixture).

* :class:`MemoryGuard`: random requests inside, outside and straddling the window edges (unaligned, aligned,
  empty and top-of-space windows), under random valid gaps and backpressure on ``o`` and ``violation``: the
  forwarded stream must equal the Python filter (:func:`burst_ok`) of the input, the violation reports the
  dropped requests' address/direction/tag, in order; full rate = one request per cycle, latency 1.
* :class:`WindowCheck` vs :func:`window_ok` on random and edge cases (2**64 wrap, zero size, exact limit),
  raw and from a 204-bit descriptor (SOFTMAX always passes).
"""

import random
from dataclasses import replace

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, Mux
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hdl.cxl.guard import MemoryGuard, WindowCheck, window_ok, burst_ok
from hdl.memctl.controller import MemoryController
from hdl.memctl.timing import DDR4_3200_TINY
from hdl.ndp.descriptor import DESCRIPTOR_LAYOUT, DescType, DescOp
from firmware.ndp.descriptor import decode, gemv, softmax, load, store
from sim.backends import Traffic, stream_ports

M64 = (1 << 64) - 1


# -- MemoryGuard ------------------------------------------------------------------------------------------

WINDOW_LAYOUT = data.StructLayout({"win_base": 64, "win_limit": 64})


class WindowedGuard(wiring.Component):
    """``guard`` with its window loaded from an input stream ``win`` (``{win_base, win_limit}``; the backends
    drive stream ports only, and one build then serves every window). ``i`` is held off until the first
    ``win`` item is in (1 cycle at full rate)."""

    def __init__(self, guard):
        self.guard = guard
        super().__init__({
            "win": In(stream.Signature(WINDOW_LAYOUT)),
            "i": In(stream.Signature(guard.request_layout)),
            "o": Out(stream.Signature(guard.request_layout)),
            "violation": Out(stream.Signature(guard.violation_layout)),
        })

    def elaborate(self, platform):
        m = Module()
        g = m.submodules.guard = self.guard
        loaded = Signal()
        m.d.comb += self.win.ready.eq(1)
        with m.If(self.win.valid):
            m.d.sync += [loaded.eq(1), g.win_base.eq(self.win.payload.win_base),
                         g.win_limit.eq(self.win.payload.win_limit)]
        m.d.comb += [g.i.valid.eq(self.i.valid & loaded), g.i.payload.eq(self.i.payload),
                     self.i.ready.eq(g.i.ready & loaded)]
        wiring.connect(m, g.o, wiring.flipped(self.o))
        wiring.connect(m, g.violation, wiring.flipped(self.violation))
        return m


def pack(layout, **fields):
    return sum(int(v) << layout[k].offset for k, v in fields.items())


def edge_requests(rng, n, g, win_base, win_limit):
    """``n`` random requests, most within a few bursts of a window edge, the rest anywhere."""
    top = (1 << g.addr_bits) - 1
    edges = [win_base // g.burst_bytes, win_limit // g.burst_bytes, 0, top]
    reqs = []
    for _ in range(n):
        if rng.random() < 0.8:
            addr = min(top, max(0, rng.choice(edges) + rng.randint(-3, 3)))
        else:
            addr = rng.randint(0, top)
        reqs.append(dict(addr=addr, write=rng.randint(0, 1), wdata=rng.getrandbits(g.data_bits),
                         tag=rng.getrandbits(g.tag_width)))
    return reqs


def run_guard(backend, g, win_base, win_limit, reqs, traffic=None):
    dut = WindowedGuard(g)
    ok = [r for r in reqs if burst_ok(r["addr"], g.burst_bytes, win_base, win_limit)]
    bad = [r for r in reqs if not burst_ok(r["addr"], g.burst_bytes, win_base, win_limit)]
    if traffic == "random":
        traffic = Traffic.random(stream_ports(dut), seed=len(reqs), valid_prob=0.7, ready_prob=0.5)
    run = backend.run_streams(dut, {"win": [pack(WINDOW_LAYOUT, win_base=win_base, win_limit=win_limit)],
                                    "i": [pack(g.request_layout, **r) for r in reqs]},
                              {"o": len(ok), "violation": len(bad)}, traffic=traffic)
    assert run.outputs["o"] == [pack(g.request_layout, **r) for r in ok]
    assert run.outputs["violation"] == [pack(g.violation_layout, addr=r["addr"], write=r["write"], tag=r["tag"])
                                        for r in bad]
    return run, ok, bad


WINDOWS_16 = [                              # (win_base, win_limit) for addr_bits=16, 64-byte bursts
    (64 * 1000 + 5, 64 * 3000 - 3),         # unaligned both ends: edge bursts straddle and are dropped
    (64 * 1000, 64 * 3000),                 # aligned: edge bursts fit exactly
    (64 * 2000, 64 * 2000),                 # empty
    (64 * 2000 + 1, 64 * 2001 + 63),        # 126 bytes, yet no whole burst fits (2001 ends at limit + 1)
    (0, M64),                               # everything
    (64 * 60000, 1 << 40),                  # limit past the device
]


@pytest.mark.parametrize("window", WINDOWS_16)
def test_guard_filters_random_edges(backend, window):
    g = MemoryGuard(16, 64, data_bits=64, tag_width=3)
    reqs = edge_requests(random.Random(window[0] ^ window[1]), 300, g, *window)
    run_guard(backend, g, *window, reqs, traffic="random")


def test_guard_top_of_byte_space_and_byte_bursts(backend):
    """64-bit burst addresses of 1 byte: the window is exact to the byte, and the last byte of the space,
    ``2**64 - 1``, ends at ``2**64``, which no 64-bit limit admits (no wrap to 0)."""
    rng = random.Random(7)
    for win in [((1 << 64) - 40, M64), (100, 200)]:
        g = MemoryGuard(64, 1, tag_width=1)
        reqs = edge_requests(rng, 150, g, *win)
        reqs += [dict(addr=a, write=1, wdata=5, tag=1) for a in (M64, win[0], win[1] - 1, win[1])]
        _, ok, bad = run_guard(backend, g, *win, reqs, traffic="random")
        ok_addrs = {r["addr"] for r in ok}
        assert ok_addrs <= set(range(*win)) and {win[0], win[1] - 1} <= ok_addrs
        assert {M64, win[1]} <= {r["addr"] for r in bad}


def test_guard_full_rate_latency(backend):
    """All valid, all ready: one request per cycle; the last is out ``latency`` cycles after it went in
    (+1 cycle: the wrapper loads the window first)."""
    g = MemoryGuard(16, 64, data_bits=64, tag_width=3)
    win = (64 * 100, 64 * 200)
    reqs = edge_requests(random.Random(9), 100, g, *win)
    run, ok, bad = run_guard(backend, g, *win, reqs)
    assert ok and bad
    assert run.cycles == 1 + len(reqs) + MemoryGuard.latency
    run, _, _ = run_guard(backend, MemoryGuard(16, 64, data_bits=64, tag_width=3), *win, reqs[:1])
    assert run.cycles == 1 + 1 + MemoryGuard.latency


def test_guard_for_controller_layout():
    ctrl = MemoryController(config=DDR4_3200_TINY, tag_width=5)
    g = MemoryGuard.for_controller(ctrl)
    g._MustUse__silence = ctrl._MustUse__silence = True      # layout check only, never elaborated
    assert g.request_layout == ctrl.request_layout
    assert g.burst_bytes * 8 == DDR4_3200_TINY.org.burst_bits


def test_guard_counter_saturates_and_window_change():
    """Amaranth simulator: ``violations`` counts drops and saturates; a new window applies to the next
    request accepted."""
    g = MemoryGuard(16, 64, data_bits=8, count_bits=3)
    seen = []

    async def bench(ctx):
        ctx.set(g.o.ready, 1)
        ctx.set(g.violation.ready, 1)
        ctx.set(g.win_base, 0)
        ctx.set(g.win_limit, 64 * 10)
        ctx.set(g.i.valid, 1)
        for k in range(12):             # bursts 0..11: 10 in, 2 out
            ctx.set(g.i.payload, {"addr": k, "write": 0, "wdata": k, "tag": 0})
            await ctx.tick()
        assert ctx.get(g.violations) == 2
        ctx.set(g.win_limit, 0)         # now everything is outside
        for k in range(8):
            ctx.set(g.i.payload, {"addr": k, "write": 1, "wdata": 0, "tag": 0})
            await ctx.tick()
            seen.append(ctx.get(g.violations))
        ctx.set(g.i.valid, 0)
        await ctx.tick()
        assert ctx.get(g.violations) == 7

    sim = Simulator(g)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [3, 4, 5, 6, 7, 7, 7, 7]


@pytest.mark.parametrize("kwargs, match", [
    (dict(addr_bits=0, burst_bytes=64), "addr_bits"), (dict(addr_bits=16, burst_bytes=48), "power of two"),
    (dict(addr_bits=59, burst_bytes=64), "exceeds"), (dict(addr_bits=16, burst_bytes=64, count_bits=0), "count"),
])
def test_guard_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MemoryGuard(**kwargs)


# -- WindowCheck ------------------------------------------------------------------------------------------

class WindowCheckStream(wiring.Component):
    """Stream wrapper around :class:`WindowCheck` (one registered stage) for the backends. Input
    ``{base_addr, size, has_operand, desc, from_desc, win_base, win_limit}``: the range is the raw fields, or
    with ``from_desc`` the 204-bit descriptor's through :meth:`WindowCheck.descriptor_fields`."""

    in_layout = data.StructLayout({"base_addr": 64, "size": 20, "has_operand": 1, "desc": DESCRIPTOR_LAYOUT,
                                   "from_desc": 1, "win_base": 64, "win_limit": 64})

    def __init__(self):
        super().__init__({"i": In(stream.Signature(self.in_layout)), "o": Out(stream.Signature(1))})

    def elaborate(self, platform):
        m = Module()
        wc = m.submodules.wc = WindowCheck()
        p = self.i.payload
        d_base, d_size, d_has = WindowCheck.descriptor_fields(p.desc)
        m.d.comb += [wc.base_addr.eq(Mux(p.from_desc, d_base, p.base_addr)),
                     wc.size.eq(Mux(p.from_desc, d_size, p.size)),
                     wc.has_operand.eq(Mux(p.from_desc, d_has, p.has_operand)),
                     wc.win_base.eq(p.win_base), wc.win_limit.eq(p.win_limit),
                     self.i.ready.eq(~self.o.valid | self.o.ready)]
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [self.o.valid.eq(1), self.o.payload.eq(wc.ok)]
        return m


def edge_windows():
    """(base_addr, size, win_base, win_limit, has_operand) edge cases and their expected result."""
    t = M64
    return [
        ((t - 3, 8, 0, t, 1), False),               # base + size wraps past 2**64
        ((t - 7, 8, 0, t, 1), False),               # ends exactly at 2**64 > any limit
        ((t - 8, 8, 0, t, 1), True),                # ends at 2**64 - 1 == limit
        ((t - 3, 8, 5, 6, 0), True),                # no operand (SOFTMAX): always
        ((1000, 24, 1000, 1024, 1), True),          # exact base and exact limit
        ((1000, 25, 1000, 1024, 1), False),         # one byte past the limit
        ((999, 24, 1000, 1024, 1), False),          # one byte below the base
        ((1024, 0, 1000, 1024, 1), True),           # zero size at the limit
        ((1025, 0, 1000, 1024, 1), False),          # zero size past the limit
        ((1000, 0, 1000, 1000, 1), True),           # zero size in an empty window (formula; the decoder
                                                    # rejects zero-size operands anyway)
        ((1000, 1, 1000, 1000, 1), False),          # empty window
        ((1000, 1, 2000, 1000, 1), False),          # inverted window
        ((0, (1 << 20) - 1, 0, (1 << 20) - 1, 1), True),
        ((t, 0, t, t, 1), True),
        ((t, 1, 0, t, 1), False),
        ((0, 0, 0, 0, 1), True),
    ]


def random_windows(rng, n):
    out = []
    for _ in range(n):
        base = rng.choice([rng.getrandbits(64), rng.getrandbits(30), M64 - rng.getrandbits(21)])
        size = rng.choice([0, 1, rng.getrandbits(20), (1 << 20) - 1])
        has = rng.random() < 0.85
        kind = rng.random()
        if kind < 0.6:      # window edges near the range edges
            wb = max(0, min(M64, base + rng.randint(-2, 2)))
            wl = max(0, min(M64, base + size + rng.randint(-2, 2)))
        else:
            wb, wl = sorted((rng.getrandbits(64), rng.getrandbits(64)))
        out.append((base, size, wb, wl, int(has)))
    return out


def test_window_ok_edges_and_numpy():
    for args, want in edge_windows():
        assert window_ok(*args) is want, args
    cases = random_windows(random.Random(1), 500) + [a for a, _ in edge_windows()]
    cols = [np.array([c[k] for c in cases], dtype=np.uint64) for k in range(5)]
    vec = window_ok(cols[0], cols[1], cols[2], cols[3], cols[4].astype(bool))
    assert vec.dtype == bool and list(vec) == [window_ok(*c) for c in cases]
    assert window_ok(np.uint64(M64), np.uint64(1), 0, M64) is False
    with pytest.raises(ValueError):
        window_ok(1 << 64, 0, 0, 0)


def test_window_check_raw(backend):
    cases = [a for a, _ in edge_windows()] + random_windows(random.Random(2), 400)
    dut = WindowCheckStream()
    items = [pack(dut.in_layout, base_addr=b, size=s, has_operand=h, win_base=wb, win_limit=wl)
             for b, s, wb, wl, h in cases]
    run = backend.run_streams(dut, {"i": items}, {"o": len(items)},
                              traffic=Traffic.random(stream_ports(dut), seed=3))
    assert run.outputs["o"] == [int(window_ok(*c)) for c in cases]


def test_window_check_descriptor(backend):
    """From the raw 204-bit descriptor: base_addr + operand.bytes, SOFTMAX (READ_COMPUTE) always passes,
    against the firmware's ``Descriptor.has_operand``."""
    rng = random.Random(4)
    descs = [gemv(4096, 8, 8), softmax(2, 8), load(M64 - 15, 2, 4), load(M64 - 16, 2, 4), store(1 << 40, 1, 32)]
    for _ in range(300):
        d = decode(rng.getrandbits(204))
        r = rng.random()
        if r < 0.3:
            d = replace(d, type=DescType.READ_COMPUTE, op=DescOp.SOFTMAX)
        elif r < 0.5:
            d = replace(d, type=rng.choice([1, 2, 3]), op=rng.choice([0, 1, 2]))
        descs.append(d)
    cases = []
    for d in descs:
        if rng.random() < 0.5:
            wb, wl = d.base_addr + rng.randint(-1, 1), d.base_addr + d.operand_bytes + rng.randint(-1, 1)
        else:
            wb, wl = sorted((rng.getrandbits(64), rng.getrandbits(64)))
        cases.append((d, max(0, min(M64, wb)), max(0, min(M64, wl))))
    dut = WindowCheckStream()
    items = [pack(dut.in_layout, desc=d.encode(), from_desc=1, base_addr=rng.getrandbits(64), size=5,
                  has_operand=rng.randint(0, 1), win_base=wb, win_limit=wl) for d, wb, wl in cases]
    run = backend.run_streams(dut, {"i": items}, {"o": len(items)},
                              traffic=Traffic.random(stream_ports(dut), seed=5))
    want = [int(window_ok(d.base_addr, d.operand_bytes, wb, wl, d.has_operand)) for d, wb, wl in cases]
    assert run.outputs["o"] == want
    assert 0 < sum(want) < len(want)
    assert all(w == 1 for (d, _, _), w in zip(cases, want) if not d.has_operand)
