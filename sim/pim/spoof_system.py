"""Test top for the spoofed SPD timing of the DIMM-PIM write path (L3 section 4.1, docs/pim_relayout.md).

    host MemoryController (timing = host_timing, default the SPOOFED timing)
      -> RankBufferChip: commands forwarded with 0 extra cycles; write data through Relayout (+latency);
         read data forwarded with 0 extra cycles
      -> DRAMChannel (the REAL timing of config.dram)

Not synthesizable as a whole (the DRAM model is a simulation model). Collect ``trace``, ``errors`` and
``wstrobe`` whole (count ``None``) with :mod:`sim.backends`; all three ignore ``ready``.
"""

from amaranth.hdl import Module, Signal, Value, Cat
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from hdl.memctl.commands import Cmd, command_layout, trace_layout, CYCLE_BITS
from hdl.memctl.controller import MemoryController
from hdl.memctl.timing import DRAMConfig, DRAMTiming
from hdl.pim.config import PIMConfig
from hdl.pim.relayout import Relayout
from hdl.pim.spd import spoofed_timing
from sim.dram.device import DRAMChannel
from sim.dram.system import error_layout

__all__ = ["RankBufferChip", "SpoofSystem"]


class RankBufferChip(wiring.Component):
    """The data/command pass-through of the rank PU buffer chip, as far as the host write path is concerned.

    * Commands: ``dram_cmd = host_cmd`` in the same cycle (0 extra cycles).
    * Write data: the buffer chip sees every WR / WR_AB on the command bus and knows the host's CWL (the value its
      SPD made the host use), so it opens a capture window of ``burst_cycles`` clocks at ``T + host_cwl`` -- the
      clocks in which the host's DQS toggles. That window is the data-valid bit of :class:`Relayout`; its output
      (``latency`` clocks later) drives ``dram_wdata`` and ``dram_wstrobe`` (the device-pin data strobe).
      With ``relayout=False`` the data passes with 0 extra cycles (a plain registered-DIMM-like reference).
    * Read data: ``host_rdata = dram_rdata`` in the same cycle (reads are not re-laid out).
    """

    def __init__(self, config: PIMConfig, *, host_cwl: int, relayout: bool = True):
        org = config.dram.org
        if isinstance(host_cwl, bool) or not isinstance(host_cwl, int) or host_cwl < 1:
            raise ValueError(f"host_cwl must be an int >= 1, got {host_cwl!r}")
        self.config = config
        self.host_cwl = host_cwl
        self.relayout = Relayout(config) if relayout else None
        self.latency = config.relayout_latency if relayout else 0
        super().__init__({
            "host_cmd": In(command_layout(org)),
            "host_wdata": In(org.clock_bits),
            "host_rdata": Out(org.clock_bits),
            "host_rdata_valid": Out(1),
            "dram_cmd": Out(command_layout(org)),
            "dram_wdata": Out(org.clock_bits),
            "dram_wstrobe": Out(1),
            "dram_rdata": In(org.clock_bits),
            "dram_rdata_valid": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        org = self.config.dram.org
        BC, CWL = org.burst_cycles, self.host_cwl
        m.d.comb += [
            Value.cast(self.dram_cmd).eq(Value.cast(self.host_cmd)),
            self.host_rdata.eq(self.dram_rdata),
            self.host_rdata_valid.eq(self.dram_rdata_valid),
        ]
        # window[k] = a WR was on the command bus k + 1 cycles ago.
        window = Signal(CWL + BC - 1)
        is_wr = (self.host_cmd.kind == Cmd.WR) | (self.host_cmd.kind == Cmd.WR_AB)
        m.d.sync += window.eq(Cat(is_wr, window[:-1]))
        host_strobe = window[CWL - 1:CWL - 1 + BC].any()
        if self.relayout is None:
            m.d.comb += [self.dram_wdata.eq(self.host_wdata), self.dram_wstrobe.eq(host_strobe)]
        else:
            m.submodules.relayout = rl = self.relayout
            m.d.comb += [
                rl.i.payload.eq(self.host_wdata), rl.i.valid.eq(host_strobe), rl.o.ready.eq(1),
                self.dram_wdata.eq(rl.o.payload), self.dram_wstrobe.eq(rl.o.valid),
            ]
        return m


class SpoofSystem(wiring.Component):
    """Host controller -> :class:`RankBufferChip` -> ``DRAMChannel`` with the real timing of ``config.dram``.

    Parameters (keyword-only): ``config`` (a :class:`PIMConfig`: organisation, real timing, re-layout latency);
    ``host_timing`` (the timing the host controller schedules with; default ``spoofed_timing(real,
    config.relayout_latency)``, or ``real`` when ``relayout=False``); ``relayout`` (re-layout unit in the write
    path); ``device_kwargs`` (e.g. ``{"storage": False}``); every other keyword goes to
    :class:`MemoryController`.

    Ports: ``i`` / ``o`` (the controller's request / response streams); ``trace`` (every non-NOP command at the
    device pins, with its cycle); ``errors`` (device-model violation reports, :func:`sim.dram.system.error_layout`);
    ``wstrobe`` (the cycle number of every cycle in which write data is driven at the device pins).
    """

    def __init__(self, *, config: PIMConfig, host_timing: DRAMTiming | None = None, relayout: bool = True,
                 device_kwargs=None, **controller_kwargs):
        if not isinstance(config, PIMConfig):
            raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
        real = config.dram
        if host_timing is None:
            host_timing = spoofed_timing(real.timing, config.relayout_latency) if relayout else real.timing
        self.config = config
        self.device_config = real
        self.controller_config = DRAMConfig(name=f"{real.name}-host", org=real.org, timing=host_timing)
        self.controller = MemoryController(config=self.controller_config, **controller_kwargs)
        self.buffer_chip = RankBufferChip(config, host_cwl=host_timing.CWL, relayout=relayout)
        self.device = DRAMChannel(real, **dict(device_kwargs or {}))
        org = real.org
        super().__init__({
            "i": In(stream.Signature(self.controller.request_layout)),
            "o": Out(stream.Signature(self.controller.response_layout)),
            "trace": Out(stream.Signature(trace_layout(org))),
            "errors": Out(stream.Signature(error_layout())),
            "wstrobe": Out(stream.Signature(CYCLE_BITS)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.controller = ctl = self.controller
        m.submodules.buffer_chip = buf = self.buffer_chip
        m.submodules.device = dev = self.device
        wiring.connect(m, wiring.flipped(self.i), ctl.i)
        wiring.connect(m, wiring.flipped(self.o), ctl.o)
        m.d.comb += [
            Value.cast(buf.host_cmd).eq(Value.cast(ctl.cmd)),
            buf.host_wdata.eq(ctl.wdata),
            ctl.rdata.eq(buf.host_rdata),
            ctl.rdata_valid.eq(buf.host_rdata_valid),
            Value.cast(dev.cmd).eq(Value.cast(buf.dram_cmd)),
            dev.wdata.eq(buf.dram_wdata),
            buf.dram_rdata.eq(dev.rdata),
            buf.dram_rdata_valid.eq(dev.rdata_valid),
        ]
        cycle = Signal(CYCLE_BITS)  # cycle 0 = first cycle after reset, as the device's
        m.d.sync += cycle.eq(cycle + 1)
        m.d.comb += [
            self.trace.valid.eq(buf.dram_cmd.kind != Cmd.NOP),
            Value.cast(self.trace.payload.cmd).eq(Value.cast(buf.dram_cmd)),
            self.trace.payload.cycle.eq(cycle),
            self.errors.valid.eq(dev.violation),
            self.errors.payload.code.eq(dev.violation_code),
            self.errors.payload.cycle.eq(dev.violation_cycle),
            self.wstrobe.valid.eq(buf.dram_wstrobe),
            self.wstrobe.payload.eq(cycle),
        ]
        return m
