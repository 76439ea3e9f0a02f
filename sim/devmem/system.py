"""Simulation top: :class:`hdl.memctl.devmem.DeviceMemory` driving one :class:`sim.dram.device.DRAMChannel` per
channel, with every channel's command trace and device error reports.

Not synthesizable as a whole (the DRAM models are simulation models). Use with the stream backends::

    sys_ = DeviceMemorySystem(config=LPDDR5X_8533_TINY, channels=2, device_kwargs={"storage": False})
    run = get_backend("verilator").run_streams(
        sys_, {"ndp_req": [...], "host_req": [...]},
        {"ndp_rsp": n_ndp_reads, "host_rsp": n_host_reads, **sys_.collect_all()})

then :func:`sim.dram.trace.decode_trace` / :func:`sim.dram.checker.check_trace` on ``run.outputs[f"trace{c}"]``.
"""

import re

from amaranth.hdl import Module, Signal, Value
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from hdl.memctl.commands import Cmd, trace_layout, CYCLE_BITS
from hdl.memctl.devmem import DeviceMemory, module_instance
from sim.dram.system import error_layout

__all__ = ["DeviceMemorySystem", "no_inline"]


def no_inline(text: str, module: str) -> str:
    """``text`` with Verilator's ``no_inline_module`` directive in module ``module``: Verilator then compiles the
    module once as a C++ class instantiated per channel, instead of inlining every copy into the top."""
    head = re.compile(r"^(module " + re.escape(module) + r"\([^;]*\);)", re.M)
    text, n = head.subn(lambda mo: mo.group(1) + "\n  /*verilator no_inline_module*/", text, count=1)
    if n != 1:
        raise ValueError(f"no module {module!r} in the Verilog text")
    return text


class DeviceMemorySystem(wiring.Component):
    """``DeviceMemory`` + ``channels`` DRAM channel models.

    Parameters (keyword-only): ``config`` (the :class:`DRAMConfig` of every channel), ``channels``,
    ``device_kwargs`` (for every :class:`DRAMChannel`, e.g. ``{"storage": False}`` for timing-only models whose
    reads return their own flat burst address), ``device_init`` (optional: per-channel ``init`` dicts, or one dict for
    every channel); ``hierarchical`` (see :meth:`verilog_text`);
    every other keyword goes to :class:`DeviceMemory` (and through it to the controllers).

    Ports: ``ndp_req`` / ``ndp_rsp`` / ``host_req`` / ``host_rsp`` (the memory system's), and per channel ``c``:
    ``trace{c}`` (every non-NOP command with its bus cycle, :func:`trace_layout`) and ``errors{c}`` (the
    device model's violation reports, :func:`sim.dram.system.error_layout`). Collect those whole (count
    ``None``): they never stall, records offered while not ready are lost. :meth:`collect_all` gives that dict.
    ``grants``: the port of every accepted request (0 NDP, 1 host), in acceptance order: the order in which
    same-address accesses of the two ports take effect (:class:`sim.devmem.model.DeviceMemoryModel` replays it).
    """

    #: Verilog module names of the hierarchical build (:meth:`verilog_text`).
    CHANNEL_MODULE = "devmem_channel"
    DEVICE_MODULE = "dram_channel"

    def __init__(self, *, config, channels, device_kwargs=None, device_init=None, hierarchical=False,
                 **memory_kwargs):
        from sim.dram.device import DRAMChannel
        if isinstance(device_init, dict):
            device_init = [device_init] * channels
        elif hierarchical and device_init is not None and any(d != device_init[0] for d in device_init):
            raise ValueError("a hierarchical build has one DRAM model module for every channel: device_init must "
                             "be one dict (the same contents in every channel)")
        self.hierarchical = hierarchical
        self.memory = DeviceMemory(config=config, channels=channels,
                                   channel_module=self.CHANNEL_MODULE if hierarchical else None, **memory_kwargs)
        self.channels = channels
        self.config = config
        kw = dict(device_kwargs or {})
        kw.setdefault("all_bank", False)  # controllers never issue all-bank commands
        if device_init is not None and len(device_init) != channels:
            raise ValueError(f"device_init needs one entry per channel ({channels}), got {len(device_init)}")
        self.devices = [DRAMChannel(config, **kw, **({"init": device_init[c]} if device_init else {}))
                        for c in range(channels)]
        if hierarchical:
            for dev in self.devices:
                dev._MustUse__silence = True
        ports = {
            "ndp_req": In(stream.Signature(self.memory.ndp_request_layout)),
            "ndp_rsp": Out(stream.Signature(self.memory.ndp_response_layout)),
            "host_req": In(stream.Signature(self.memory.host_request_layout)),
            "host_rsp": Out(stream.Signature(self.memory.host_response_layout)),
        }
        ports["grants"] = Out(stream.Signature(1))
        for c in range(channels):
            ports[f"trace{c}"] = Out(stream.Signature(trace_layout(config.org)))
            ports[f"errors{c}"] = Out(stream.Signature(error_layout()))
        super().__init__(ports)

    def collect_all(self) -> dict:
        """``{"trace0": None, "errors0": None, ...}``: the expected-count entries that collect every channel's
        trace and error reports."""
        out = {"grants": None}
        for c in range(self.channels):
            out[f"trace{c}"] = None
            out[f"errors{c}"] = None
        return out

    def verilog_text(self, name="top") -> str:
        """Verilog of the whole system. ``hierarchical=True``: the top with the channels and DRAM models as
        instances of one ``devmem_channel`` and one ``dram_channel`` module each, converted once (Verilog
        generation and the Verilator build then cost about the same for 8 channels as for 1); otherwise flat."""
        from amaranth.back import verilog
        text = verilog.convert(self, name=name)
        if self.hierarchical:
            text += "\n" + no_inline(self.memory.channel_verilog(), self.CHANNEL_MODULE)
            text += "\n" + no_inline(verilog.convert(self.devices[0], name=self.DEVICE_MODULE), self.DEVICE_MODULE)
        return text

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = mem = self.memory
        for name in ("ndp_req", "host_req"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(mem, name))
        for name in ("ndp_rsp", "host_rsp"):
            wiring.connect(m, getattr(mem, name), wiring.flipped(getattr(self, name)))
        cycle = Signal(CYCLE_BITS)
        m.d.sync += cycle.eq(cycle + 1)
        n_fire = self.ndp_req.valid & self.ndp_req.ready
        h_fire = self.host_req.valid & self.host_req.ready
        m.d.comb += [self.grants.valid.eq(n_fire | h_fire), self.grants.payload.eq(h_fire)]
        for c, dev in enumerate(self.devices):
            m.submodules[f"dram{c}"] = module_instance(dev, self.DEVICE_MODULE) if self.hierarchical else dev
            pins = mem.dram[c]
            m.d.comb += [
                Value.cast(dev.cmd).eq(Value.cast(pins.cmd)),
                dev.wdata.eq(pins.wdata),
                pins.rdata.eq(dev.rdata),
                pins.rdata_valid.eq(dev.rdata_valid),
            ]
            tr, er = getattr(self, f"trace{c}"), getattr(self, f"errors{c}")
            m.d.comb += [
                tr.valid.eq(pins.cmd.kind != Cmd.NOP),
                Value.cast(tr.payload.cmd).eq(Value.cast(pins.cmd)),
                tr.payload.cycle.eq(cycle),
                er.valid.eq(dev.violation),
                er.payload.code.eq(dev.violation_code),
                er.payload.cycle.eq(dev.violation_cycle),
            ]
        return m
