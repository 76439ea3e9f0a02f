"""Test top: the CXL NDP device (``hdl/cxl/device.py``) on the device memory system of the paper: N LPDDR5X-8533
channels behind the NDP / host arbiter, one FR-FCFS controller and one DRAM channel model each
(:class:`sim.devmem.system.DeviceMemorySystem`, ``hdl/memctl/devmem.py``).

Same ports and attributes as :class:`sim.cxl.system.CXLSystem` (``mmio``, ``mmio_rsp``, ``hmem`` with its
``after`` / ``mmio_after`` gate, ``hmem_rsp``, ``events``, ``core_req``; ``regmap``, ``layout``,
``mem_addr_bits``, ``config``, ``depth``, ``device``), so :class:`host.cxl_driver.Driver` and
:class:`sim.e2e.stamped.StampedCXLSystem` drive it unchanged, plus per channel ``trace{c}`` (the DRAM command
trace, for :func:`sim.dram.checker.check_trace`) and ``errors{c}`` (the DRAM model's violation reports): collect
them whole (:meth:`CXLDeviceMemSystem.collect_all`; :meth:`CXLDeviceMemSystem.channel_problems` checks them).

Wiring (design choice, docs/cxl.md "On the LPDDR5X device memory"): the device's one 64-byte line port (the host's
CXL.mem requests, the queue engine's and the NDP core's, already arbitrated inside :class:`CXLDevice`, responses in
request order) goes to the memory system's 64-byte **host port**: one CXL line = one interleave granule = two
32-byte LPDDR5X BL16 bursts, the granules interleaved over the N channels (granule g in channel g mod N), read
responses in request order (what the device's response router needs). The memory's wide NDP port is idle: the
core's memory port is the device's 64-byte line port, one line per cycle at most (a wider core port is a change of
``hdl/cxl/device.py``'s arbiter and router, a separate step).

The NDP core runs under a clock enable (``clock``, default :data:`hdl.ndp.config.CORE_CLOCK_RATIO` = 15/16: the
1 GHz core on LPDDR5X's 1066.7 MHz CK, as :class:`sim.ndp.system.NDPDeviceSystem`); the front end (CSRs, filter,
queue engine, arbiter) and the memory run every CK.
"""

from dataclasses import replace

from amaranth.hdl import Module
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import Out

from hdl.cxl.device import CXLDevice, LINE_BYTES
from hdl.memctl.commands import trace_layout
from hdl.memctl.devmem import GRANULE_BYTES
from hdl.memctl.timing import DRAMConfig, LPDDR5X_8533
from hdl.ndp.clock import ClockEnable
from hdl.ndp.config import CORE_CLOCK_RATIO
from sim.dram.system import error_layout
from .system import gate_host, device_ports

__all__ = ["CXLDeviceMemSystem", "channel_problems", "dram_config_for", "MIN_ROWS", "HOST_SLOTS"]

#: Host-port reads in flight per channel (see :class:`CXLDeviceMemSystem`).
HOST_SLOTS = 32
#: Fewest rows per bank of the sized DRAM configuration (a row address of at least one bit).
MIN_ROWS = 2

assert LINE_BYTES == GRANULE_BYTES      # one CXL.mem line = one interleave granule of the device memory


def dram_config_for(depth: int, channels: int, base: DRAMConfig = LPDDR5X_8533) -> DRAMConfig:
    """``base`` (its timing and its die's page, banks and ranks) with the fewest rows per bank (a power of two,
    at least :data:`MIN_ROWS`) such that ``channels`` channels hold ``depth`` 64-byte lines. Design choice for
    simulation: only capacity changes (the row is the address's top field, so an access pattern in the low
    addresses is the one it has on the full die), and the data-keeping DRAM models stay small."""
    org = base.org
    per_row = org.ranks * org.banks * org.row_bytes          # bytes of one row index over the channel's banks
    need = -(-depth * LINE_BYTES // (channels * per_row))
    rows = max(MIN_ROWS, 1 << max(0, need - 1).bit_length())
    if rows > org.rows:
        raise ValueError(f"depth {depth} lines ({depth * LINE_BYTES} bytes) exceeds {channels} channel(s) of "
                         f"{base.name} ({channels * org.channel_bytes} bytes)")
    if rows == org.rows:
        return base
    o = replace(org, name=f"{org.name}-{rows}rows", rows=rows)
    return DRAMConfig(name=o.name, org=o, timing=base.timing)


def channel_problems(dram_config, channels: int, outputs: dict, cycles: int) -> list:
    """:meth:`CXLDeviceMemSystem.channel_problems` of a system with ``channels`` channels of ``dram_config`` (a
    function of picklable arguments: a caller can run it in another process)."""
    from sim.dram.checker import check_trace
    from sim.dram.trace import decode_trace
    out = []
    for c in range(channels):
        tr, er = outputs.get(f"trace{c}"), outputs.get(f"errors{c}")
        if tr is None or er is None:
            out.append(f"channel {c}: trace / errors not collected")
            continue
        for v in check_trace(decode_trace(tr, dram_config.org), dram_config, end_cycle=cycles - 1):
            out.append(f"channel {c}: {v.message}")
        out += [f"channel {c}: DRAM model report {e:#x}" for e in er]
    return out


class CXLDeviceMemSystem(wiring.Component):
    """``CXLDevice(config, num_queues)`` on ``channels`` channels of ``dram_config`` (default: LPDDR5X-8533 sized
    by :func:`dram_config_for` to hold ``depth`` 64-byte lines) behind :class:`DeviceMemory`'s host port.

    Parameters (keyword-only): ``config`` (NDPConfig), ``num_queues``, ``depth`` (64-byte lines the device
    addresses: ``mem_addr_bits`` = their address width, as ``CXLSystem``), ``channels`` (a power of two in
    1..64), ``dram_config``, ``clock`` (core clock enable ratio, None: every cycle), ``device_kwargs`` (for every
    ``DRAMChannel``, e.g. ``{"storage": False}``), ``hierarchical`` (Verilog with one channel module and one
    DRAM model module, appended by :meth:`verilog_modules`: the default; False: flat), any other keyword to
    :class:`DeviceMemory` / its controllers (``host_slots``, ``host_outstanding``, ``queue_depth``, ``policy``...).
    """

    def __init__(self, *, config, num_queues: int, depth: int = 4096, channels: int = 2, dram_config=None,
                 clock=CORE_CLOCK_RATIO, device_kwargs=None, hierarchical: bool = True, **memory_kwargs):
        from sim.devmem.system import DeviceMemorySystem
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 2:
            raise ValueError(f"depth must be an int >= 2 (64-byte lines), got {depth!r}")
        self.mem_addr_bits = (depth - 1).bit_length()
        self.clock = clock
        dram_config = dram_config or dram_config_for(depth, channels)
        memory_kwargs.setdefault("ndp_tag_width", 0)     # the wide NDP port is idle
        memory_kwargs.setdefault("ndp_slots", 2)
        memory_kwargs.setdefault("host_tag_width", 0)    # the device routes responses by order, not by tag
        # The core's reads come through the host port: the per-channel host reads in flight must cover a channel's
        # read latency at its burst rate, as the NDP port's slots do (design choice: 32 = DeviceMemory's
        # ndp_slots default, 99.7 % of a channel's peak on sequential lines, docs/devmem.md; the default 8 host
        # slots carry 8 lines per ~40-60 CK of latency, below one channel's 16 B per CK).
        memory_kwargs.setdefault("host_slots", HOST_SLOTS)
        self.memory = DeviceMemorySystem(config=dram_config, channels=channels, device_kwargs=device_kwargs,
                                         hierarchical=hierarchical, **memory_kwargs)
        dm = self.memory.memory
        if dm.bytes < depth * LINE_BYTES:
            raise ValueError(f"depth {depth} lines ({depth * LINE_BYTES} bytes) exceeds the {dm.bytes}-byte "
                             f"memory of {channels} channel(s) of {dram_config.name}")
        self.device = CXLDevice(config=config, num_queues=num_queues, mem_addr_bits=self.mem_addr_bits,
                                mem_tag_width=dm.host_tag_width)
        self.regmap = self.device.regmap
        self.layout = self.device.layout
        self.config = config
        self.depth = depth
        self.channels = channels
        self.dram_config = dram_config
        ports = device_ports(self.regmap, self.mem_addr_bits)
        for c in range(channels):
            ports[f"trace{c}"] = Out(stream.Signature(trace_layout(dram_config.org)))
            ports[f"errors{c}"] = Out(stream.Signature(error_layout()))
        super().__init__(ports)

    def collect_all(self) -> dict:
        """``{"trace0": None, "errors0": None, ...}``: the expected-count entries that collect every channel's
        command trace and DRAM model reports whole."""
        return {k: None for c in range(self.channels) for k in (f"trace{c}", f"errors{c}")}

    def channel_problems(self, outputs: dict, cycles: int) -> list:
        """Messages for every DRAM timing violation (:func:`sim.dram.checker.check_trace` on each channel's
        trace, up to ``cycles``) and every DRAM model report in ``outputs`` (a run's collected ``trace{c}`` /
        ``errors{c}``); empty: every channel clean. A channel missing from ``outputs`` is a problem too."""
        return channel_problems(self.dram_config, self.channels, outputs, cycles)

    def verilog_modules(self) -> list:
        """The channel and DRAM model modules of the hierarchical build (``sim.backends.verilog.verilog_text``
        appends them to the top's Verilog), each marked ``no_inline_module`` for Verilator."""
        mem = self.memory
        if not mem.hierarchical:
            return []
        from amaranth.back import verilog
        from sim.devmem.system import no_inline
        return [no_inline(mem.memory.channel_verilog(), mem.CHANNEL_MODULE),
                no_inline(verilog.convert(mem.devices[0], name=mem.DEVICE_MODULE), mem.DEVICE_MODULE)]

    def design_key(self) -> str:
        """The configuration that determines this design (with the sources: ``sim.e2e.design_cache``)."""
        dm = self.memory.memory
        return (f"CXLDeviceMemSystem(config={self.config!r}, num_queues={self.regmap.num_queues}, "
                f"depth={self.depth}, channels={self.channels}, dram={self.dram_config!r}, clock={self.clock}, "
                f"hierarchical={self.memory.hierarchical}, host_slots={dm.host_slots}, "
                f"host_outstanding={dm.host_outstanding}, fifo_depth={dm.fifo_depth}, "
                f"controller={sorted(dm.controller_kwargs.items())!r}, "
                f"storage={[d.storage for d in self.memory.devices]})")

    def elaborate(self, platform):
        m = Module()
        m.submodules.device = dev = self.device
        m.submodules.memory = mem = self.memory
        if self.clock is not None:
            m.submodules.core_clock = ce = ClockEnable(*self.clock)
            m.d.comb += dev.core.ce.eq(ce.ce)
        wiring.connect(m, wiring.flipped(self.mmio), dev.mmio)
        wiring.connect(m, wiring.flipped(self.mmio_rsp), dev.mmio_rsp)
        wiring.connect(m, wiring.flipped(self.hmem_rsp), dev.hmem_rsp)
        wiring.connect(m, wiring.flipped(self.events), dev.events)
        wiring.connect(m, wiring.flipped(self.core_req), dev.core_req)

        # the device's line port -> the memory's 64-byte host port (line address zero-extended to the granule's)
        req, hreq = dev.mem_req, mem.host_req
        m.d.comb += [
            hreq.valid.eq(req.valid),
            hreq.payload.addr.eq(req.payload.addr),
            hreq.payload.write.eq(req.payload.write),
            hreq.payload.wdata.eq(req.payload.wdata),
            req.ready.eq(hreq.ready),
            dev.mem_rsp.valid.eq(mem.host_rsp.valid),
            dev.mem_rsp.payload.rdata.eq(mem.host_rsp.payload.rdata),
            mem.host_rsp.ready.eq(dev.mem_rsp.ready),
            # the wide NDP port idle
            mem.ndp_req.valid.eq(0),
            mem.ndp_rsp.ready.eq(1),
            mem.grants.ready.eq(1),
        ]
        for c in range(self.channels):
            wiring.connect(m, wiring.flipped(getattr(self, f"trace{c}")), getattr(mem, f"trace{c}"))
            wiring.connect(m, wiring.flipped(getattr(self, f"errors{c}")), getattr(mem, f"errors{c}"))

        # the scripted GPU's polling (as CXLSystem): hmem requests wait for completions / MMIO responses
        gate_host(m, self, dev)
        return m
