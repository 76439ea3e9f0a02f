"""CXL device top, driven interactively (Amaranth simulator testbench, a GPU that reacts to what it reads):
the interrupt line and its write-1-to-clear, an early doorbell that must not execute an unwritten slot, and
HEAD/ERRORS as the driver sees them over MMIO."""

from dataclasses import replace

import numpy as np
from amaranth.sim import Simulator

from hdl.ndp.config import TINY
from hdl.ndp.descriptor import ErrorCode
from hdl.cxl.regmap import valid_word, completion_flag, SLOT_HEADER_BYTES, CTRL_ENABLE, CTRL_IRQ_ENABLE
from firmware.ndp.descriptor import gemv
from sim.cxl.system import CXLSystem
from sim.golden.ndp_core import GoldenCore, beats

DEPTH = 4096
CFG = replace(TINY, name="tiny-cxl", device_bytes=DEPTH * 64)
SQ, CQ, A_ADDR = 0x10000, 0x20000, 0x1000


async def _push(ctx, port, payload):
    """Offer one stream item and wait until it is taken."""
    ctx.set(port.valid, 1)
    ctx.set(port.payload, payload)
    while True:
        taken = ctx.get(port.ready)
        await ctx.tick()
        if taken:
            break
    ctx.set(port.valid, 0)


async def _pull(ctx, port, limit=5000):
    ctx.set(port.ready, 1)
    for _ in range(limit):
        if ctx.get(port.valid):
            value = ctx.get(port.payload)
            await ctx.tick()
            ctx.set(port.ready, 0)
            return value
        await ctx.tick()
    raise AssertionError(f"no response within {limit} cycles")


def test_irq_early_doorbell_and_counters():
    dut = CXLSystem(config=CFG, num_queues=2, depth=DEPTH)
    rm = dut.regmap
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((16, 32)) * 0.3).astype(np.float16).view(np.uint16)
    xs = [rng.standard_normal((1, 16)).astype(np.float16).view(np.uint16) for _ in range(2)]
    golden = GoldenCore(CFG, DEPTH * 64)
    golden.write(A_ADDR, a)
    want = [golden.run([(gemv(A_ADDR, 16, 32), x)])[0] for x in xs]
    seen = {}

    async def mmio(ctx, name, value=None, q=None):
        write = value is not None
        await _push(ctx, dut.mmio, {"addr": rm.offset(name, q), "write": int(write), "wdata": value or 0})
        rsp = await _pull(ctx, dut.mmio_rsp)
        assert rsp.err == 0, name
        return rsp.rdata

    async def line(ctx, addr, data=None):
        write = data is not None
        await _push(ctx, dut.hmem, {"addr": addr // 64, "write": int(write),
                                     "wdata": int.from_bytes(data, "little") if write else 0, "after": 0})
        if not write:
            return (await _pull(ctx, dut.hmem_rsp)).rdata.to_bytes(64, "little")

    async def submit_slot(ctx, k, x):
        slot = SQ + (k % 4) * dut.layout.slot_bytes
        await line(ctx, slot + SLOT_HEADER_BYTES, x.tobytes().ljust(64, b"\0"))
        hdr = bytearray(64)
        hdr[0:26] = gemv(A_ADDR, 16, 32).encode().to_bytes(26, "little")
        await line(ctx, slot, bytes(hdr))                       # descriptor ...
        hdr[32:40] = valid_word(k).to_bytes(8, "little")
        await line(ctx, slot, bytes(hdr))                       # ... then the valid word, last

    async def wait_irq(ctx, level, limit=3000):
        for n in range(limit):
            if ctx.get(dut.device.irq) == level:
                return n
            await ctx.tick()
        raise AssertionError(f"irq did not become {level} within {limit} cycles")

    async def bench(ctx):
        ab = a.tobytes()
        for i in range(0, len(ab), 64):
            await line(ctx, A_ADDR + i, ab[i:i + 64])
        for name, value in (("SQ_BASE", SQ), ("SQ_ENTRIES", 4), ("CQ_BASE", CQ), ("WIN_BASE", 0),
                            ("WIN_LIMIT", 0x8000), ("CTRL", CTRL_ENABLE | CTRL_IRQ_ENABLE)):
            await mmio(ctx, name, value, 0)
        await mmio(ctx, "INT_ENABLE", 1)
        assert ctx.get(dut.device.irq) == 0

        # 1. normal submission: the interrupt rises after the completion record is written
        await submit_slot(ctx, 0, xs[0])
        await mmio(ctx, "DOORBELL", 1, 0)
        await wait_irq(ctx, 1)
        assert await mmio(ctx, "INT_STATUS") == 1
        assert await mmio(ctx, "HEAD", q=0) == 1
        hdr = await line(ctx, CQ)
        assert int.from_bytes(hdr[32:40], "little") == completion_flag(0)
        assert int.from_bytes(hdr[8:12], "little") == ErrorCode.OK.value
        res = await line(ctx, CQ + 64)
        assert res == b"".join(w.to_bytes(16, "little") for w in beats(want[0].result, CFG.lanes))
        await mmio(ctx, "INT_STATUS", 1)                        # write 1 to clear
        await wait_irq(ctx, 0, limit=4)

        # 2. early doorbell: rung before the slot is written; the device must not run it yet
        await mmio(ctx, "DOORBELL", 2, 0)
        for _ in range(300):
            await ctx.tick()
        assert await mmio(ctx, "HEAD", q=0) == 1
        assert ctx.get(dut.device.irq) == 0
        await submit_slot(ctx, 1, xs[1])
        seen["early_wait"] = await wait_irq(ctx, 1)
        assert await mmio(ctx, "HEAD", q=0) == 2
        assert await mmio(ctx, "ERRORS", q=0) == 0
        res = await line(ctx, CQ + dut.layout.cpl_bytes + 64)
        assert res == b"".join(w.to_bytes(16, "little") for w in beats(want[1].result, CFG.lanes))
        seen["done"] = True

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()                    # until the testbench returns (every wait in it is bounded)
    assert seen.get("done"), "testbench did not finish"
