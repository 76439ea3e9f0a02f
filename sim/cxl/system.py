"""Test top: the CXL NDP device (``hdl/cxl/device.py``) on a fixed-latency 64-byte-burst memory, with a scripted
GPU's polling abstracted as a gate on its CXL.mem accesses.

Ports (streams): ``mmio`` / ``mmio_rsp`` (the device's), ``hmem`` ``{addr, write, wdata, pasid, after,
mmio_after}`` -> the device's ``hmem`` ``{addr, write, wdata, pasid}`` once ``after`` completion records have been
posted (over all queues; what a GPU polling its completion flags would wait for) and ``mmio_after`` MMIO responses
have been delivered (what a host that reads a register back to flush its posted MMIO writes, e.g. a queue's
configuration, would wait for), ``hmem_rsp`` ``{rdata, err}``, ``events`` and ``core_req`` (the device's; collect
them whole).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out

from hdl.cxl.device import CXLDevice, event_layout, core_req_layout
from hdl.cxl.csr import mmio_request_layout, MMIO_RESPONSE_LAYOUT
from hdl.cxl.regmap import PASID_BITS
from sim.ndp.memory import BurstMemory

__all__ = ["CXLSystem", "AFTER_BITS", "gate_host", "device_ports"]

AFTER_BITS = 16


def device_ports(regmap, mem_addr_bits) -> dict:
    """The ports of a CXL device test top (module docstring): the device's own plus the gated ``hmem``."""
    return {
        "mmio": In(stream.Signature(mmio_request_layout(regmap.addr_bits))),
        "mmio_rsp": Out(stream.Signature(MMIO_RESPONSE_LAYOUT)),
        "hmem": In(stream.Signature(data.StructLayout({
            "addr": mem_addr_bits, "write": 1, "wdata": 512, "pasid": PASID_BITS, "after": AFTER_BITS,
            "mmio_after": AFTER_BITS}))),
        "hmem_rsp": Out(stream.Signature(data.StructLayout({"rdata": 512, "err": 1}))),
        "events": Out(stream.Signature(event_layout())),
        "core_req": Out(stream.Signature(core_req_layout(mem_addr_bits))),
    }


class CXLSystem(wiring.Component):
    """``CXLDevice(config, num_queues)`` on a ``BurstMemory`` of ``depth`` 64-byte lines (``init``: lines)."""

    def __init__(self, *, config, num_queues: int, depth: int = 4096, latency: int = 8, init=()):
        self.mem_addr_bits = (depth - 1).bit_length()
        self.device = CXLDevice(config=config, num_queues=num_queues, mem_addr_bits=self.mem_addr_bits)
        self.memory = BurstMemory(burst_bits=512, depth=depth, addr_bits=self.mem_addr_bits, latency=latency,
                                  init=init)
        self.regmap = self.device.regmap
        self.layout = self.device.layout
        self.config = config
        self.depth = depth
        super().__init__(device_ports(self.regmap, self.mem_addr_bits))

    def elaborate(self, platform):
        m = Module()
        m.submodules.device = dev = self.device
        m.submodules.memory = mem = self.memory
        wiring.connect(m, wiring.flipped(self.mmio), dev.mmio)
        wiring.connect(m, wiring.flipped(self.mmio_rsp), dev.mmio_rsp)
        wiring.connect(m, wiring.flipped(self.hmem_rsp), dev.hmem_rsp)
        wiring.connect(m, wiring.flipped(self.events), dev.events)
        wiring.connect(m, wiring.flipped(self.core_req), dev.core_req)
        wiring.connect(m, dev.mem_req, mem.i)
        wiring.connect(m, mem.o, dev.mem_rsp)
        gate_host(m, self, dev)
        return m


def gate_host(m, top, dev):
    """The scripted GPU's polling: ``top.hmem`` requests reach ``dev.hmem`` once ``after`` completion records
    (``dev.events``) and ``mmio_after`` MMIO responses (``top.mmio_rsp``) have gone by (module docstring)."""
    done = Signal(AFTER_BITS + 1)
    with m.If(dev.events.valid):
        m.d.sync += done.eq(done + 1)
    mmio_done = Signal(AFTER_BITS + 1)
    with m.If(top.mmio_rsp.valid & top.mmio_rsp.ready):
        m.d.sync += mmio_done.eq(mmio_done + 1)
    gate = (done >= top.hmem.payload.after) & (mmio_done >= top.hmem.payload.mmio_after)
    m.d.comb += [
        dev.hmem.valid.eq(top.hmem.valid & gate),
        dev.hmem.payload.addr.eq(top.hmem.payload.addr),
        dev.hmem.payload.write.eq(top.hmem.payload.write),
        dev.hmem.payload.wdata.eq(top.hmem.payload.wdata),
        dev.hmem.payload.pasid.eq(top.hmem.payload.pasid),
        top.hmem.ready.eq(dev.hmem.ready & gate),
    ]
