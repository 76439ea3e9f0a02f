"""Test/bench top: a :class:`MemoryController` driving a cycle-accurate DRAM channel model.

Not synthesizable as a whole (the DRAM model is a simulation model); used with the stream backends
(``get_backend("verilator").run_streams(system, {"i": reqs}, {"o": n_reads, "trace": None, "errors": None})``).
"""

from amaranth.hdl import Module, Signal, Value
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out

from hdl.memctl.commands import Cmd, Violation, trace_layout, CYCLE_BITS
from hdl.memctl.controller import MemoryController

__all__ = ["MemorySystem", "error_layout"]


def error_layout() -> data.StructLayout:
    """One device error report: the violated constraint and the cycle of the offending command."""
    return data.StructLayout({"code": Violation, "cycle": CYCLE_BITS})


class MemorySystem(wiring.Component):
    """``MemoryController`` + ``DRAMChannel`` (``sim/dram/device.py``) with a command trace and error reports.

    Parameters (keyword-only): ``controller_config`` (timing the controller schedules with);
    ``device_config`` (timing the device model enforces; default: the same -- differs e.g. for a DIMM-PIM
    whose SPD advertises spoofed timing); ``device_kwargs`` (passed to the device, e.g. ``{"storage": False}``
    for a timing-only model whose reads return their own flat burst address -- much faster to convert to
    Verilog -- or ``{"init": {...}}``); ``device_factory`` (callable ``(config, **device_kwargs) -> device``,
    default :class:`sim.dram.device.DRAMChannel`); every other keyword goes to
    :class:`MemoryController` (``queue_depth``, ``policy``, ``addr_order``, ``tag_width``,
    ``max_postponed_refresh``, ``response_depth``).

    Ports:

    * ``i``, ``o``: the controller's request and read-response streams.
    * ``trace``: Out(stream of ``trace_layout(org)``): every non-NOP command on the bus with the cycle it was
      on the bus (cycle 0 = first cycle after reset). Collect it whole (count ``None``); it must always be
      ready: ``ready`` is ignored, records offered while not ready are lost.
    * ``errors``: Out(stream of :func:`error_layout`): one record for every cycle in which the device reports
      a violation (``violation`` high). Also never stalls.
    """

    def __init__(self, *, controller_config, device_config=None, device_factory=None, device_kwargs=None,
                 **controller_kwargs):
        device_config = controller_config if device_config is None else device_config
        if device_config.org != controller_config.org:
            raise ValueError("device_config and controller_config must share the organisation "
                             f"({device_config.org.name!r} vs {controller_config.org.name!r})")
        self.controller_config = controller_config
        self.device_config = device_config
        self.controller = MemoryController(config=controller_config, **controller_kwargs)
        device_kwargs = dict(device_kwargs or {})
        if device_factory is None:
            from .device import DRAMChannel
            device_factory = DRAMChannel
            # The controller never issues all-bank commands: no RD_AB data path in the model (rules still checked).
            device_kwargs.setdefault("all_bank", False)
        self.device = device_factory(device_config, **device_kwargs)
        org = controller_config.org
        super().__init__({
            "i": In(stream.Signature(self.controller.request_layout)),
            "o": Out(stream.Signature(self.controller.response_layout)),
            "trace": Out(stream.Signature(trace_layout(org))),
            "errors": Out(stream.Signature(error_layout())),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.controller = ctl = self.controller
        m.submodules.device = dev = self.device
        wiring.connect(m, wiring.flipped(self.i), ctl.i)
        wiring.connect(m, wiring.flipped(self.o), ctl.o)
        m.d.comb += [
            Value.cast(dev.cmd).eq(Value.cast(ctl.cmd)),
            dev.wdata.eq(ctl.wdata),
            ctl.rdata.eq(dev.rdata),
            ctl.rdata_valid.eq(dev.rdata_valid),
        ]
        # Own cycle counter: cycle 0 is the first cycle after reset (the same count as the device's).
        cycle = Signal(CYCLE_BITS)
        m.d.sync += cycle.eq(cycle + 1)
        m.d.comb += [
            self.trace.valid.eq(ctl.cmd.kind != Cmd.NOP),
            Value.cast(self.trace.payload.cmd).eq(Value.cast(ctl.cmd)),
            self.trace.payload.cycle.eq(cycle),
        ]
        if hasattr(dev, "violation"):
            m.d.comb += [
                self.errors.valid.eq(dev.violation),
                self.errors.payload.code.eq(dev.violation_code),
                self.errors.payload.cycle.eq(dev.violation_cycle if hasattr(dev, "violation_cycle") else cycle),
            ]
        return m
