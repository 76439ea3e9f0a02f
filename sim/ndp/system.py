"""Simulation tops: the NDP core on a fixed-latency burst memory, or on the real controller + DRAM model.

Both expose the core's streams ``desc``, ``x``, ``y``, ``cpl``; :class:`NDPMemorySystem` adds the DRAM command
``trace`` and the device's ``errors`` (see :class:`sim.dram.system.MemorySystem`).
"""

from amaranth.hdl import Module
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from hdl.ndp.core import NDPCore, completion_layout
from hdl.ndp.descriptor import DESCRIPTOR_LAYOUT
from sim.dram.system import MemorySystem, error_layout
from hdl.memctl.commands import trace_layout
from .memory import BurstMemory

__all__ = ["NDPBurstSystem", "NDPMemorySystem"]


def _core_ports(core):
    return {
        "desc": In(stream.Signature(DESCRIPTOR_LAYOUT)),
        "x": In(stream.Signature(core.beat_bits)),
        "y": Out(stream.Signature(core.beat_bits)),
        "cpl": Out(stream.Signature(completion_layout())),
    }


def _connect_core(m, self, core):
    for name in ("desc", "x", "y", "cpl"):
        wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(core, name))


class NDPBurstSystem(wiring.Component):
    """:class:`NDPCore` on a :class:`BurstMemory` of ``depth`` bursts of ``burst_bits`` (``init``: bursts)."""

    def __init__(self, *, config, burst_bits: int = 512, depth: int = 1024, latency: int = 8, init=()):
        addr_bits = (depth - 1).bit_length()
        self.core = NDPCore(config=config, mem_burst_bits=burst_bits, mem_addr_bits=addr_bits)
        self.memory = BurstMemory(burst_bits=burst_bits, depth=depth, addr_bits=addr_bits, latency=latency,
                                  init=init)
        super().__init__(_core_ports(self.core))

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.submodules.memory = mem = self.memory
        _connect_core(m, self, core)
        wiring.connect(m, core.mem_req, mem.i)
        wiring.connect(m, mem.o, core.mem_rsp)
        return m


class NDPMemorySystem(wiring.Component):
    """:class:`NDPCore` on the project's :class:`MemoryController` (``"in-order"``: responses in request
    order) and the cycle-accurate DRAM channel model of ``dram_config``. ``device_kwargs`` as for
    :class:`MemorySystem` (e.g. ``{"init": {flat burst address: int}}``); other keywords go to the controller.
    """

    def __init__(self, *, config, dram_config, device_kwargs=None, **controller_kwargs):
        controller_kwargs.setdefault("tag_width", 0)
        if controller_kwargs.setdefault("policy", "in-order") != "in-order":
            raise ValueError("the NDP core needs read responses in request order: policy must be 'in-order'")
        self.mem = MemorySystem(controller_config=dram_config, device_kwargs=device_kwargs, **controller_kwargs)
        ctl = self.mem.controller
        self.core = NDPCore(config=config, mem_burst_bits=dram_config.org.burst_bits,
                            mem_addr_bits=ctl.amap.addr_bits, mem_tag_width=ctl.tag_width)
        ports = _core_ports(self.core)
        ports["trace"] = Out(stream.Signature(trace_layout(dram_config.org)))
        ports["errors"] = Out(stream.Signature(error_layout()))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.submodules.mem = mem = self.mem
        _connect_core(m, self, core)
        wiring.connect(m, core.mem_req, mem.i)
        wiring.connect(m, mem.o, core.mem_rsp)
        wiring.connect(m, wiring.flipped(self.trace), mem.trace)
        wiring.connect(m, wiring.flipped(self.errors), mem.errors)
        return m
