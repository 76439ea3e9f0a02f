"""cocotb testbench for the ``cxl_device`` Verilog top: the testbench is the GPU (CXL.io MMIO and CXL.mem line
accesses) and the device memory behind the controller port.

Reads ``$CXL_DEVICE_TB_VECTORS`` (JSON written by ``test_cocotb_cxl_device.py``)::

    {"mmio_setup": [[addr, value]], "lines": [[line address, int]], "submissions": [{"queue", "slot_lines":
     [[line address, int]], "valid": [line address, int], "doorbell": [addr, value]}], "expect": [{"queue",
     "cpl_line", "header": int, "result_lines": [[line address, int]]}], "latency": int, "addr_bits": int,
     "seed": int}

The GPU configures the queues over MMIO, writes the data lines, then for every submission writes the slot
(input, descriptor), the valid word last, and rings the doorbell; it polls each expected completion flag with
CXL.mem reads until it appears, then checks the completion header and the result lines bit for bit. The memory
answers reads in request order after ``latency`` cycles, with random backpressure on the request port.
"""

import collections
import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ReadOnly


class Device:
    """Per-cycle driver: one outstanding MMIO and one outstanding CXL.mem access at a time (the GPU side), and
    the memory model."""

    def __init__(self, dut, vec):
        self.dut, self.vec = dut, vec
        self.rng = random.Random(vec["seed"])
        self.memory = {}
        self.pending = collections.deque()
        self.cycle = 0
        self.abits = vec["addr_bits"]

    async def transact(self, port, payload, rsp_port):
        """Push one request on ``port``; return the payload of its response on ``rsp_port`` (None if none)."""
        dut = self.dut
        getattr(dut, f"{port}__payload").value = payload
        getattr(dut, f"{port}__valid").value = 1
        while True:
            await ReadOnly()
            accepted = getattr(dut, f"{port}__ready").value == 1
            await self.tick_after_readonly()
            if accepted:
                break
        getattr(dut, f"{port}__valid").value = 0
        if rsp_port is None:
            return None
        getattr(dut, f"{rsp_port}__ready").value = 1
        while True:
            await ReadOnly()
            if getattr(dut, f"{rsp_port}__valid").value == 1:
                value = getattr(dut, f"{rsp_port}__payload").value.to_unsigned()
                await self.tick_after_readonly()
                getattr(dut, f"{rsp_port}__ready").value = 0
                return value
            await self.tick_after_readonly()

    async def tick_after_readonly(self):
        await RisingEdge(self.dut.clk)


@cocotb.test()
async def cxl_device_matches_golden(dut):
    with open(os.environ["CXL_DEVICE_TB_VECTORS"]) as f:
        vec = json.load(f)
    Clock(dut.clk, 10, unit="ns").start()
    for s in ("mmio", "hmem"):
        getattr(dut, f"{s}__valid").value = 0
    for s in ("mmio_rsp", "hmem_rsp", "events", "core_req"):
        getattr(dut, f"{s}__ready").value = 1 if s in ("events", "core_req") else 0
    dut.mem_req__ready.value = 0
    dut.mem_rsp__valid.value = 0
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    dev = Device(dut, vec)
    abits = vec["addr_bits"]
    mem_sampler = cocotb.start_soon(_memory_process(dev))

    async def mmio_write(addr, value):
        rsp = await dev.transact("mmio", addr | (1 << vec["mmio_addr_bits"]) | (value << (vec["mmio_addr_bits"] + 1)),
                                 "mmio_rsp")
        assert (rsp >> 64) & 1 == 0, f"MMIO write {addr:#x} failed"

    # hmem payload {addr, write, wdata[512], pasid}; hmem_rsp {rdata[512], err}
    async def line_write(addr, value, pasid=0):
        await dev.transact("hmem", addr | (1 << abits) | (value << (abits + 1)) | (pasid << (abits + 513)), None)

    async def line_read(addr, pasid=0, err=0):
        rsp = await dev.transact("hmem", addr | (pasid << (abits + 513)), "hmem_rsp")
        assert rsp >> 512 == err, f"hmem read {addr:#x} (PASID {pasid:#x}): err {rsp >> 512}, expected {err}"
        return rsp & ((1 << 512) - 1)

    for addr, value in vec["mmio_setup"]:
        await mmio_write(addr, value)
    for addr, value in vec["lines"]:
        await line_write(addr, value)
    for sub in vec["submissions"]:
        for addr, value in sub["slot_lines"]:
            await line_write(addr, value, sub["pasid"])
        await line_write(*sub["valid"], sub["pasid"])        # the valid word, last
        for addr, value, pasid in sub.get("forged", ()):      # another requester overwrites the slot before the
            await line_write(addr, value, pasid)              # doorbell: dropped by the filter (else it would run)
        await mmio_write(*sub["doorbell"])
    for exp in vec["expect"]:
        flag = exp["header"] >> 256 & ((1 << 64) - 1)
        for _ in range(2000):                                # poll the completion flag
            hdr = await line_read(exp["cpl_line"], exp["pasid"])
            if (hdr >> 256) & ((1 << 64) - 1) == flag:
                break
        else:
            raise AssertionError(f"queue {exp['queue']}: completion flag {flag:#x} never appeared")
        assert hdr == exp["header"], f"completion header {hdr:#x} != {exp['header']:#x}"
        for addr, value in exp["result_lines"]:
            got = await line_read(addr, exp["pasid"])
            assert got == value, f"result line {addr:#x}: {got:#x} != {value:#x}"
            assert await line_read(addr, exp["pasid"] ^ 1, err=1) == 0     # wrong PASID: zeros + err
    mem_sampler.kill()
    dut._log.info("cxl_device: %d submissions completed and checked in %d cycles", len(vec["expect"]), dev.cycle)


async def _memory_process(dev):
    """The device memory, alone in driving the memory port: each cycle it drives ready / the head response,
    samples the handshakes read-only, then after the clock edge pops what was taken and counts the cycle."""
    dut = dev.dut
    while True:
        m_ready = dev.rng.random() < 0.8
        dut.mem_req__ready.value = int(m_ready)
        rsp = bool(dev.pending) and dev.pending[0][0] <= dev.cycle
        dut.mem_rsp__valid.value = int(rsp)
        if rsp:
            dut.mem_rsp__payload.value = dev.pending[0][1]
        await ReadOnly()
        if m_ready and dut.mem_req__valid.value == 1:
            p = dut.mem_req__payload.value.to_unsigned()
            addr, write = p & ((1 << dev.abits) - 1), (p >> dev.abits) & 1
            if write:
                dev.memory[addr] = (p >> (dev.abits + 1)) & ((1 << 512) - 1)
            else:
                dev.pending.append((dev.cycle + dev.vec["latency"], dev.memory.get(addr, 0)))
        rsp_taken = rsp and dut.mem_rsp__ready.value == 1
        await RisingEdge(dut.clk)
        dev.cycle += 1
        assert dev.cycle < 300_000, "testbench timeout"
        if rsp_taken:
            dev.pending.popleft()
