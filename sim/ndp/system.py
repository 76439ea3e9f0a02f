"""Simulation tops: the NDP core on a fixed-latency burst memory, or on the real controller + DRAM model.

Both expose the core's streams ``desc``, ``x``, ``y``, ``cpl``; :class:`NDPMemorySystem` adds the DRAM command
``trace`` and the device's ``errors`` (see :class:`sim.dram.system.MemorySystem`). ``clock=(num, den)`` runs
the core under a clock enable high ``num`` of every ``den`` cycles (:class:`hdl.ndp.clock.ClockEnable`; the
memory side runs every cycle), e.g. ``CORE_CLOCK_RATIO`` = (15, 16) for the 1 GHz core on LPDDR5X's CK.
"""

from amaranth.hdl import Module
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from hdl.ndp.core import NDPCore, completion_layout
from hdl.ndp.clock import ClockEnable
from hdl.ndp.config import CORE_CLOCK_RATIO
from hdl.ndp.descriptor import REQUEST_LAYOUT
from sim.dram.system import MemorySystem, error_layout
from hdl.memctl.commands import trace_layout
from .memory import BurstMemory

__all__ = ["NDPBurstSystem", "NDPMemorySystem", "NDPDeviceSystem"]


def _core_ports(core):
    return {
        "desc": In(stream.Signature(REQUEST_LAYOUT)),
        "x": In(stream.Signature(core.beat_bits)),
        "y": Out(stream.Signature(core.beat_bits)),
        "cpl": Out(stream.Signature(completion_layout())),
    }


def _connect_core(m, self, core, clock=None):
    for name in ("desc", "x", "y", "cpl"):
        wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(core, name))
    if clock is not None:
        m.submodules.core_clock = ce = ClockEnable(*clock)
        m.d.comb += core.ce.eq(ce.ce)


class NDPBurstSystem(wiring.Component):
    """:class:`NDPCore` on a :class:`BurstMemory` of ``depth`` bursts of ``burst_bits`` (``init``: bursts)."""

    def __init__(self, *, config, burst_bits: int = 512, depth: int = 1024, latency: int = 8, init=(),
                 clock=None):
        addr_bits = (depth - 1).bit_length()
        self.clock = clock
        self.core = NDPCore(config=config, mem_burst_bits=burst_bits, mem_addr_bits=addr_bits)
        self.memory = BurstMemory(burst_bits=burst_bits, depth=depth, addr_bits=addr_bits, latency=latency,
                                  init=init)
        super().__init__(_core_ports(self.core))

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.submodules.memory = mem = self.memory
        _connect_core(m, self, core, self.clock)
        wiring.connect(m, core.mem_req, mem.i)
        wiring.connect(m, mem.o, core.mem_rsp)
        return m


class NDPMemorySystem(wiring.Component):
    """:class:`NDPCore` on the project's :class:`MemoryController` (``"in-order"``: responses in request
    order) and the cycle-accurate DRAM channel model of ``dram_config``. ``device_kwargs`` as for
    :class:`MemorySystem` (e.g. ``{"init": {flat burst address: int}}``); other keywords go to the controller.
    """

    def __init__(self, *, config, dram_config, device_kwargs=None, clock=None, **controller_kwargs):
        self.clock = clock
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
        _connect_core(m, self, core, self.clock)
        wiring.connect(m, core.mem_req, mem.i)
        wiring.connect(m, mem.o, core.mem_rsp)
        wiring.connect(m, wiring.flipped(self.trace), mem.trace)
        wiring.connect(m, wiring.flipped(self.errors), mem.errors)
        return m


class NDPDeviceSystem(wiring.Component):
    """:class:`NDPCore` on the device memory system (:class:`hdl.memctl.devmem.DeviceMemory`: ``channels``
    LPDDR5X channels behind the NDP / host arbiter, one DRAM channel model each, ``sim.devmem.system``): the core
    on the wide NDP port (one line = a 64-byte granule of every channel), the host port idle. ``clock`` defaults
    to :data:`hdl.ndp.config.CORE_CLOCK_RATIO` (the 1 GHz core on CK = 1066.7 MHz).

    Ports: the core's ``desc``, ``x``, ``y``, ``cpl``; per channel ``trace{c}`` / ``errors{c}`` (collect whole:
    :meth:`collect_all`). ``verilog_text`` gives the hierarchical build (one channel module, one DRAM model
    module) for :func:`sim.devmem.backend.backend`.
    """

    def __init__(self, *, config, channels, dram_config=None, device_kwargs=None, device_init=None,
                 clock=CORE_CLOCK_RATIO, hierarchical=True, **memory_kwargs):
        from hdl.memctl.timing import LPDDR5X_8533
        from sim.devmem.system import DeviceMemorySystem
        self.clock = clock
        memory_kwargs.setdefault("ndp_tag_width", 8)
        self.mem = DeviceMemorySystem(config=dram_config or LPDDR5X_8533, channels=channels,
                                      device_kwargs=device_kwargs, device_init=device_init,
                                      hierarchical=hierarchical, **memory_kwargs)
        dm = self.mem.memory
        self.channels = channels
        self.core = NDPCore(config=config, mem_burst_bits=dm.line_bits, mem_addr_bits=dm.ndp_addr_bits,
                            mem_tag_width=dm.ndp_tag_width)
        ports = _core_ports(self.core)
        for c in range(channels):
            ports[f"trace{c}"] = Out(stream.Signature(trace_layout(self.mem.config.org)))
            ports[f"errors{c}"] = Out(stream.Signature(error_layout()))
        super().__init__(ports)

    def collect_all(self) -> dict:
        return {k: None for c in range(self.channels) for k in (f"trace{c}", f"errors{c}")}

    def verilog_text(self, name="top") -> str:
        from amaranth.back import verilog
        from sim.devmem.system import no_inline
        text = verilog.convert(self, name=name)
        if self.mem.hierarchical:
            m = self.mem
            text += "\n" + no_inline(m.memory.channel_verilog(), m.CHANNEL_MODULE)
            text += "\n" + no_inline(verilog.convert(m.devices[0], name=m.DEVICE_MODULE), m.DEVICE_MODULE)
        return text

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.submodules.mem = mem = self.mem
        _connect_core(m, self, core, self.clock)
        wiring.connect(m, core.mem_req, mem.ndp_req)
        wiring.connect(m, mem.ndp_rsp, core.mem_rsp)
        m.d.comb += [mem.host_req.valid.eq(0), mem.host_rsp.ready.eq(1), mem.grants.ready.eq(1)]
        for c in range(self.channels):
            wiring.connect(m, wiring.flipped(getattr(self, f"trace{c}")), getattr(mem, f"trace{c}"))
            wiring.connect(m, wiring.flipped(getattr(self, f"errors{c}")), getattr(mem, f"errors{c}"))
        return m
