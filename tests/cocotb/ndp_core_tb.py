"""cocotb testbench for the ``ndp_core`` Verilog top: the testbench is the GPU and the device memory.

Reads ``$NDP_CORE_TB_VECTORS`` (JSON written by ``test_cocotb_ndp_core.py``)::

    {"desc": [int], "x": [int], "y": [int], "cpl": [int], "memory": {"burst address": int},
     "latency": int, "addr_bits": int, "burst_bits": int, "seed": int}

* GPU side: pushes the descriptors into ``desc`` and the input beats into ``x`` with seeded random valid gaps,
  and applies seeded random backpressure on ``y`` and ``cpl``.
* Memory side: accepts ``mem_req`` with random backpressure; a write updates the burst dictionary, a read is
  answered on ``mem_rsp`` ``latency`` cycles later, in request order (what the in-order controller guarantees).
* Clock enable: ``ce`` is low one cycle in 16 (the core at 15/16 of the memory clock, CORE_CLOCK_RATIO).
* Checks ``y`` and ``cpl`` payloads, in order, against the golden core's streams, and that the core returns
  to idle (no pending memory request) at the end.
"""

import collections
import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ReadOnly


class _Source:
    def __init__(self, dut, name, items, rng, prob):
        self.valid, self.payload, self.ready = (getattr(dut, f"{name}__{s}") for s in ("valid", "payload", "ready"))
        self.items, self.rng, self.prob, self.pos, self.presenting = items, rng, prob, 0, False

    def drive(self):
        if not self.presenting and self.pos < len(self.items) and self.rng.random() < self.prob:
            self.presenting = True
            self.payload.value = self.items[self.pos]
        self.valid.value = int(self.presenting)

    def sample(self):
        return self.presenting and self.ready.value == 1

    def advance(self, accepted):
        if accepted:
            self.presenting, self.pos = False, self.pos + 1


@cocotb.test()
async def ndp_core_matches_golden(dut):
    with open(os.environ["NDP_CORE_TB_VECTORS"]) as f:
        vec = json.load(f)
    rng = random.Random(vec["seed"])
    memory = {int(k): v for k, v in vec["memory"].items()}
    abits, bbits, lat = vec["addr_bits"], vec["burst_bits"], vec["latency"]
    want_y, want_cpl = vec["y"], vec["cpl"]

    Clock(dut.clk, 10, unit="ns").start()
    for s in ("desc", "x"):
        getattr(dut, f"{s}__valid").value = 0
    for s in ("y", "cpl", "mem_req"):
        getattr(dut, f"{s}__ready").value = 0
    dut.mem_rsp__valid.value = 0
    dut.mem_rsp__payload.value = 0
    dut.ce.value = 1
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    desc = _Source(dut, "desc", vec["desc"], rng, 0.5)
    x = _Source(dut, "x", vec["x"], rng, 0.7)
    pending = collections.deque()            # (cycle ready, rdata) in request order
    got_y, got_cpl = [], []
    cycle, max_cycles = 0, 200_000
    while len(got_cpl) < len(want_cpl):
        assert cycle < max_cycles, f"only {len(got_cpl)} of {len(want_cpl)} completions after {max_cycles} cycles"
        dut.ce.value = int(cycle % 16 != 15)
        desc.drive()
        x.drive()
        y_ready, c_ready, m_ready = rng.random() < 0.6, rng.random() < 0.5, rng.random() < 0.8
        dut.y__ready.value = int(y_ready)
        dut.cpl__ready.value = int(c_ready)
        dut.mem_req__ready.value = int(m_ready)
        rsp = bool(pending) and pending[0][0] <= cycle
        dut.mem_rsp__valid.value = int(rsp)
        if rsp:
            dut.mem_rsp__payload.value = pending[0][1]       # tag bits (above rdata) 0
        await ReadOnly()
        d_acc, x_acc = desc.sample(), x.sample()
        if y_ready and dut.y__valid.value == 1:
            got_y.append(dut.y__payload.value.to_unsigned())
        if c_ready and dut.cpl__valid.value == 1:
            got_cpl.append(dut.cpl__payload.value.to_unsigned())
        rsp_taken = rsp and dut.mem_rsp__ready.value == 1
        if m_ready and dut.mem_req__valid.value == 1:
            p = dut.mem_req__payload.value.to_unsigned()
            addr, write = p & ((1 << abits) - 1), (p >> abits) & 1
            if write:
                memory[addr] = (p >> (abits + 1)) & ((1 << bbits) - 1)
            else:
                pending.append((cycle + lat, memory.get(addr, 0)))
        await RisingEdge(dut.clk)
        cycle += 1
        desc.advance(d_acc)
        x.advance(x_acc)
        if rsp_taken:
            pending.popleft()

    assert got_cpl == want_cpl, f"completions differ: got {[hex(v) for v in got_cpl]} want {[hex(v) for v in want_cpl]}"
    bad = [k for k, (g, w) in enumerate(zip(got_y, want_y)) if g != w]
    assert len(got_y) == len(want_y) and not bad, f"{len(bad)} y beats differ (first {bad[:5]}); " \
                                                   f"{len(got_y)} of {len(want_y)} received"
    assert not pending, f"{len(pending)} read responses never taken"
    dut._log.info("ndp_core: %d descriptors, %d y beats in %d cycles, all bit-exact", len(want_cpl), len(got_y), cycle)
