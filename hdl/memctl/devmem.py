"""The CXL NDP device's memory system: N DRAM channels behind a two-port arbiter (synthesizable).

PLoRA IV-B / Fig. 5 (docs/references.md): ~1.1 TB/s of LPDDR5X behind an arbiter and several memory
controllers. Here: ``channels`` = N LPDDR5X-8533 channels (64 at the paper's scale: 64 x 17.06 GB/s = 1.09 TB/s),
each with its own :class:`MemoryController`, and two requesters that see one byte address space and the same data:

* the NDP core's **wide port** (``ndp_req`` / ``ndp_rsp``): one *line* = N x 64 bytes, one 64-byte piece in every
  channel; the interface the core uses with a :class:`MemoryController` today (``{addr, write, wdata, tag}``
  requests, ``{rdata, tag}`` responses, one per read, **in request order**), with ``addr`` a line address;
* the CXL.mem **host port** (``host_req`` / ``host_rsp``): 64-byte lines ``{addr, write, wdata, tag}`` with a
  pass-through ``tag`` (the requester's PASID and/or transaction tag), one response per read, in request order.

Address interleaving (design choice, docs/devmem.md): device byte address ``A`` -> 64-byte *granule*
``g = A >> 6``; channel ``g mod N``, channel granule ``g div N``, whose two 32-byte LPDDR5X BL16 bursts are two neighbouring columns
of one row (:meth:`DeviceMemory.channel_burst`). The granule is the CXL.mem line: a host line is one granule in
one channel and one row (one ACT per 64 bytes, not one per 32 as with a 32-byte interleave),
and an NDP line ``L`` is granule ``L`` of every channel (byte addresses ``[L N 64, (L + 1) N 64)``), so a
sequential NDP stream is a sequential burst stream in every channel.

Architecture::

    ndp_req ─┐                       ┌─> channel 0: request FIFO ─> splitter ─> MemoryController ─> DRAM pins
             ├─ arbiter (round robin,├─> channel 1: ...                          │ (responses, tagged with
    host_req ┘  reserves ROB slots)  └─> ...                                     v  port / slot / burst)
                                                        per channel: NDP ROB memory, host ROB memory
    ndp_rsp  <── in-order NDP reassembly (slot ring shared by all channels: every NDP line has one slot)
    host_rsp <── in-order host reassembly (host order FIFO of {channel, slot, tag}, per-channel host slot rings)

* **Arbiter**: one grant per cycle. A grant pushes one 64-byte entry into the request FIFO of every channel it
  touches (NDP: all N; host: one), all in the same cycle, so every channel sees the requests in one global order
  (the grant order) and, because the controller never lets a request pass an older one to the same burst,
  **same-address ordering across the two ports is the grant order**. An NDP read needs a free NDP slot, a host read
  a free host slot of its channel and a host-order entry; writes need no slot. When both ports can be granted the
  one not granted last wins (round robin per grant): a requester waits at most one grant of the other once its
  channels have FIFO space, neither starves, and the arbiter is work-conserving.
* **Channels** (:class:`DeviceChannel`): a ``fifo_depth``-entry request FIFO, a splitter that hands the entry's
  bursts to the controller one per cycle, the controller (``"fr-fcfs"`` by default; it may return reads out of
  order, the tags say where they go), and the two reorder-buffer memories. Read data goes straight into the slot
  reserved for it at grant time, so a controller's ``o`` is always ready: no channel ever waits for a requester,
  the channels cannot deadlock however the two response ports are backpressured, and buffering is bounded by
  ``ndp_slots`` lines and ``host_slots`` lines per channel.
* **Reassembly**: the NDP line in the oldest slot is handed over once all N x (64 / burst bytes) bursts have
  arrived; the host line at the head of the host-order FIFO once its bursts have arrived. Each response port has
  one output register (a read-port register of the ROB memories), held under backpressure.

Latency (unloaded, read; acceptance on ``*_req`` in cycle t to the response on ``*_rsp``): the controller's
latency of the last burst of the line plus :attr:`DeviceMemory.extra_cycles` (FIFO, splitter, ROB write and
output register) -- measured by the tests.
"""

from amaranth.hdl import Module, Signal, Const, Cat, Mux, Array, Instance, ClockSignal, ResetSignal, Value
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.lib.memory import Memory
from amaranth.lib.fifo import SyncFIFO
from amaranth.utils import ceil_log2, exact_log2

from .commands import command_layout
from .controller import MemoryController
from .timing import LPDDR5X_8533

__all__ = ["DeviceMemory", "DeviceChannel", "dram_pins_signature", "module_instance", "channel_burst_address",
           "GRANULE_BYTES", "MAX_CHANNELS"]

#: Interleave granule = the CXL.mem line (CXL 2.0 / 3.0 cache-line size, 64 bytes): a host access is one granule.
GRANULE_BYTES = 64
#: Channels of the paper's device (hdl/memctl/timing.py LPDDR5X_8533_ORG: 64 x 17.06 GB/s = 1.09 TB/s).
MAX_CHANNELS = 64

NDP, HOST = 0, 1


def dram_pins_signature(org) -> wiring.Signature:
    """The pins between a controller and a DRAM channel (controller side): command, write data, read data."""
    return wiring.Signature({
        "cmd": Out(command_layout(org)),
        "wdata": Out(org.clock_bits),
        "rdata": In(org.clock_bits),
        "rdata_valid": In(1),
    })


def module_instance(component, module_name: str) -> Instance:
    """``component`` as an instance of the separately generated Verilog module ``module_name`` (its ports named as
    Amaranth names a top's ports: the signature path joined by ``__``, plus ``clk`` / ``rst``).

    Used for hierarchical Verilog: a design with N identical channels is written as one channel module plus N
    instances, so Verilog generation, Verilator and Yosys handle the channel once instead of N times."""
    ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
    for path, member, value in component.signature.flatten(component):
        name = "__".join(str(p) for p in path)
        ports[("i_" if member.flow == In else "o_") + name] = Value.cast(value)
    return Instance(module_name, **ports)


def channel_burst_address(amap, bursts_per_granule: int, entry, sub):
    """Controller burst address (``amap``: the channel's :class:`AddressMap`) of burst ``sub`` of channel granule
    ``entry`` (ints or numpy arrays): ``sub`` in the low bits of the ``col`` field, the granule address in the
    other bits, so a granule's bursts are neighbouring columns of one row."""
    off, sb = amap.offsets["col"], exact_log2(bursts_per_granule)
    low = entry & ((1 << off) - 1)
    return low | (sub << off) | ((entry >> off) << (off + sb))


def _pow2(n):
    return n >= 1 and n & (n - 1) == 0


class DeviceChannel(wiring.Component):
    """One channel of :class:`DeviceMemory`: request FIFO -> burst splitter -> :class:`MemoryController` -> ROB.

    Ports:

    * ``i``: In(stream of :attr:`entry_layout` = ``{addr, write, wdata, port, slot}``): one 64-byte entry (its
      channel granule address, data for a write, the requester (0 NDP, 1 host) and, for a read, its ROB slot).
    * ``ndp_raddr`` / ``ndp_ren`` -> ``ndp_rdata`` and ``host_raddr`` / ``host_ren`` -> ``host_rdata``: synchronous
      read ports of the NDP and host ROB memories (data the cycle after ``ren``; held while ``ren`` is low).
    * ``done_valid`` / ``done_port`` / ``done_slot`` / ``done_sub``: a read burst was written into a ROB slot
      this cycle (``done_sub``: which burst of the entry).
    * ``dram``: :func:`dram_pins_signature` (the controller's pins).
    """

    def __init__(self, *, config, ndp_slots: int, host_slots: int, fifo_depth: int = 2, **controller_kwargs):
        org = config.org
        self.config = config
        self.subs = GRANULE_BYTES // org.burst_bytes       # bursts per entry
        self.sub_bits = exact_log2(self.subs)
        self.ndp_slots, self.host_slots, self.fifo_depth = ndp_slots, host_slots, fifo_depth
        self.slot_bits = max(1, ceil_log2(max(ndp_slots, host_slots)))
        tag_width = self.sub_bits + self.slot_bits + 1
        controller_kwargs.setdefault("policy", "fr-fcfs")
        self.controller = MemoryController(config=config, tag_width=tag_width, **controller_kwargs)
        self.entry_addr_bits = self.controller.amap.addr_bits - self.sub_bits
        #: The entry's bursts are neighbouring columns of one row (one ACT per entry): the burst index goes into
        #: the lowest bits of the controller address's ``col`` field, the entry address fills the other bits.
        self.col_offset = self.controller.amap.offsets["col"]
        self.entry_bits = GRANULE_BYTES * 8
        self.entry_layout = data.StructLayout({
            "addr": self.entry_addr_bits, "write": 1, "wdata": self.entry_bits, "port": 1,
            "slot": self.slot_bits})
        super().__init__({
            "i": In(stream.Signature(self.entry_layout)),
            "ndp_raddr": In(range(ndp_slots)),
            "ndp_ren": In(1),
            "ndp_rdata": Out(self.entry_bits),
            "host_raddr": In(range(host_slots)),
            "host_ren": In(1),
            "host_rdata": Out(self.entry_bits),
            "done_valid": Out(1),
            "done_port": Out(1),
            "done_slot": Out(self.slot_bits),
            "done_sub": Out(max(1, self.sub_bits)),
            "dram": Out(dram_pins_signature(org)),
        })

    def elaborate(self, platform):
        m = Module()
        org = self.config.org
        S, SB, BB = self.subs, self.sub_bits, org.burst_bits
        m.submodules.controller = ctl = self.controller
        m.submodules.fifo = fifo = SyncFIFO(width=self.entry_layout.size, depth=self.fifo_depth)
        m.d.comb += [
            fifo.w_data.eq(self.i.payload.as_value()),
            fifo.w_en.eq(self.i.valid),
            self.i.ready.eq(fifo.w_rdy),
            self.dram.cmd.eq(ctl.cmd),
            self.dram.wdata.eq(ctl.wdata),
            ctl.rdata.eq(self.dram.rdata),
            ctl.rdata_valid.eq(self.dram.rdata_valid),
        ]

        # ---- splitter: the entry's bursts to the controller, one per cycle, no bubble between entries
        cur = Signal(self.entry_layout)
        cur_valid = Signal()
        sub = Signal(max(1, SB))
        last = (sub == S - 1) if S > 1 else Const(1)
        take = ~cur_valid | (ctl.i.ready & last)
        m.d.comb += fifo.r_en.eq(take)
        with m.If(take):
            m.d.sync += [cur_valid.eq(fifo.r_rdy), cur.as_value().eq(fifo.r_data), sub.eq(0)]
        with m.Elif(ctl.i.ready):
            m.d.sync += sub.eq(sub + 1)
        tag = Cat(sub[:SB], cur.slot, cur.port) if SB else Cat(cur.slot, cur.port)
        m.d.comb += [
            ctl.i.valid.eq(cur_valid),
            ctl.i.payload.addr.eq(Cat(cur.addr[:self.col_offset], sub[:SB], cur.addr[self.col_offset:])
                                  if SB else cur.addr),
            ctl.i.payload.write.eq(cur.write),
            ctl.i.payload.wdata.eq(cur.wdata.word_select(sub[:SB], BB) if SB else cur.wdata),
            ctl.i.payload.tag.eq(tag),
        ]

        # ---- reorder-buffer memories (slots reserved at grant: the controller's responses are always taken)
        rtag = ctl.o.payload.tag
        r_sub = rtag[:SB] if SB else Const(0, 1)
        r_slot = rtag[SB:SB + self.slot_bits]
        r_port = rtag[SB + self.slot_bits]
        m.d.comb += [
            ctl.o.ready.eq(1),
            self.done_valid.eq(ctl.o.valid),
            self.done_port.eq(r_port),
            self.done_slot.eq(r_slot),
            self.done_sub.eq(r_sub),
        ]
        for name, depth, port_id, raddr, ren, rdata in (
                ("ndp_rob", self.ndp_slots, NDP, self.ndp_raddr, self.ndp_ren, self.ndp_rdata),
                ("host_rob", self.host_slots, HOST, self.host_raddr, self.host_ren, self.host_rdata)):
            mem = Memory(shape=self.entry_bits, depth=depth, init=[])
            m.submodules[name] = mem
            wp = mem.write_port(granularity=BB) if S > 1 else mem.write_port()
            rp = mem.read_port()
            hit = ctl.o.valid & (r_port == port_id)
            m.d.comb += [
                wp.addr.eq(r_slot),
                wp.data.eq(Cat(*([ctl.o.payload.rdata] * S))),
                wp.en.eq(Mux(hit, (Const(1, S) << r_sub) if S > 1 else 1, 0)),
                rp.addr.eq(raddr),
                rp.en.eq(ren),
                rdata.eq(rp.data),
            ]
        return m


class DeviceMemory(wiring.Component):
    """The device memory system: ``channels`` channels of ``config`` behind the NDP / host arbiter.

    Parameters (keyword-only, validated):

    * ``config``: a :class:`DRAMConfig` whose burst divides 64 bytes (default LPDDR5X-8533: 32-byte bursts).
    * ``channels``: N, a power of two in 1..64.
    * ``ndp_tag_width`` (0..32, default 8), ``host_tag_width`` (0..64, default 24: a 20-bit PASID plus a
      4-bit transaction tag, or any pass-through field).
    * ``ndp_slots``: NDP lines in flight (read requests granted and not yet handed over), a power of two in 2..256
      (default 32: 99.7 % of peak on sequential and 64 % on random line reads; see docs/devmem.md).
    * ``host_slots``: host reads in flight per channel, a power of two in 1..64 (default 8); ``host_outstanding``:
      host reads in flight in total, 1..256 (default 64: at ~60 cycles of read latency, 64 lines in flight carry
      one 64-byte line per cycle, 68 GB/s at 1066.7 MHz, the rate of a CXL x16 link).
    * ``fifo_depth``: entries of each channel's request FIFO, 1..16 (default 2).
    * ``channel_module``: ``None`` (default) elaborates every channel; a Verilog module name instead instantiates
      the channels as that module (:func:`module_instance`), whose Verilog is ``self.chans[0]`` converted under
      that name (:meth:`channel_verilog`): hierarchical Verilog for Verilator, lint and synthesis.
    * any other keyword goes to every :class:`MemoryController` (``queue_depth``, ``policy`` (default
      ``"fr-fcfs"``), ``addr_order``, ``max_postponed_refresh``, ``response_depth``).

    Ports: ``ndp_req`` / ``ndp_rsp`` (:attr:`ndp_request_layout` / :attr:`ndp_response_layout`; also available as
    :attr:`request_layout` / :attr:`response_layout`, the names the NDP core uses for a controller), ``host_req`` /
    ``host_rsp`` (:attr:`host_request_layout` / :attr:`host_response_layout`), ``dram[c]`` (channel c's pins,
    :func:`dram_pins_signature`).

    Line data: channel ``c``'s 64 bytes are bits ``[512 c, 512 (c + 1))`` of an NDP line; within them, burst ``k``
    of the channel's entry is bits ``[k burst_bits, (k + 1) burst_bits)`` (the byte order of the address space).
    """

    def __init__(self, *, config=LPDDR5X_8533, channels: int = MAX_CHANNELS, ndp_tag_width: int = 8,
                 host_tag_width: int = 24, ndp_slots: int = 32, host_slots: int = 8, host_outstanding: int = 64,
                 fifo_depth: int = 2, channel_module: str | None = None, **controller_kwargs):
        org = config.org
        if GRANULE_BYTES % org.burst_bytes:
            raise ValueError(f"the {org.burst_bytes}-byte bursts of {config.name!r} must divide the "
                             f"{GRANULE_BYTES}-byte interleave granule")
        if not isinstance(channels, int) or not _pow2(channels) or channels > MAX_CHANNELS:
            raise ValueError(f"channels must be a power of two in 1..{MAX_CHANNELS}, got {channels!r}")
        for name, v, lo, hi, pow2 in (("ndp_tag_width", ndp_tag_width, 0, 32, False),
                                      ("host_tag_width", host_tag_width, 0, 64, False),
                                      ("ndp_slots", ndp_slots, 2, 256, True),
                                      ("host_slots", host_slots, 1, 64, True),
                                      ("host_outstanding", host_outstanding, 1, 256, False),
                                      ("fifo_depth", fifo_depth, 1, 16, False)):
            if not isinstance(v, int) or not lo <= v <= hi or (pow2 and not _pow2(v)):
                what = "a power of two" if pow2 else "an int"
                raise ValueError(f"{name} must be {what} in {lo}..{hi}, got {v!r}")
        self.config = config
        self.channels = channels
        self.ndp_tag_width, self.host_tag_width = ndp_tag_width, host_tag_width
        self.ndp_slots, self.host_slots, self.host_outstanding = ndp_slots, host_slots, host_outstanding
        self.fifo_depth = fifo_depth
        self.channel_module = channel_module
        self.channel_bits = exact_log2(channels)
        self.chans = [DeviceChannel(config=config, ndp_slots=ndp_slots, host_slots=host_slots,
                                    fifo_depth=fifo_depth, **controller_kwargs) for _ in range(channels)]
        ch0 = self.chans[0]
        if channel_module:
            for ch in self.chans:
                ch._MustUse__silence = ch.controller._MustUse__silence = True  # a module instance
        self.controller_kwargs = dict(controller_kwargs)
        self.amap = ch0.controller.amap
        self.bursts_per_granule = ch0.subs
        self.entry_addr_bits = ch0.entry_addr_bits
        self.granule_bits = GRANULE_BYTES * 8
        #: NDP line: one granule of every channel.
        self.line_bytes = GRANULE_BYTES * channels
        self.line_bits = 8 * self.line_bytes
        self.ndp_addr_bits = self.entry_addr_bits
        self.host_addr_bits = self.entry_addr_bits + self.channel_bits
        #: Bytes of the whole address space: N x the channel's capacity.
        self.bytes = channels * org.channel_bytes
        self.ndp_request_layout = data.StructLayout({
            "addr": self.ndp_addr_bits, "write": 1, "wdata": self.line_bits, "tag": ndp_tag_width})
        self.ndp_response_layout = data.StructLayout({"rdata": self.line_bits, "tag": ndp_tag_width})
        self.request_layout, self.response_layout = self.ndp_request_layout, self.ndp_response_layout
        self.host_request_layout = data.StructLayout({
            "addr": self.host_addr_bits, "write": 1, "wdata": self.granule_bits, "tag": host_tag_width})
        self.host_response_layout = data.StructLayout({"rdata": self.granule_bits, "tag": host_tag_width})
        super().__init__({
            "ndp_req": In(stream.Signature(self.ndp_request_layout)),
            "ndp_rsp": Out(stream.Signature(self.ndp_response_layout)),
            "host_req": In(stream.Signature(self.host_request_layout)),
            "host_rsp": Out(stream.Signature(self.host_response_layout)),
            "dram": Out(dram_pins_signature(org)).array(channels),
        })

    #: Fixed cycles of the device memory system around a channel's controller on an unloaded read: grant ->
    #: request FIFO -> splitter (2) and ROB write -> pop -> output register (2).
    front_cycles = 2
    back_cycles = 2

    def read_latency(self, kind: str) -> int:
        """Unloaded read latency (acceptance on ``*_req`` to the response on ``*_rsp``) of a granule whose bank is
        ``kind`` (``"hit"``, ``"closed"``, ``"miss"``, as :meth:`MemoryController.read_latency`): the controller's
        latency of the first burst, ``tCCD_L`` per further burst of the granule (same bank group), plus
        :attr:`front_cycles` + :attr:`back_cycles`."""
        ctl = self.chans[0].controller
        return (self.front_cycles + ctl.read_latency(kind) + (self.bursts_per_granule - 1) * self.config.timing.tCCD_L
                + self.back_cycles)

    def channel_verilog(self) -> str:
        """Verilog of the channel module named ``channel_module`` (all channels are identical)."""
        if not self.channel_module:
            raise ValueError("channel_verilog() needs DeviceMemory(channel_module=<name>)")
        from amaranth.back import verilog
        return verilog.convert(self.chans[0], name=self.channel_module)

    # ---- address helpers (Python) -----------------------------------------------------------------------
    def channel_burst(self, entry, sub):
        """Controller burst address of burst ``sub`` of channel granule ``entry`` (:func:`channel_burst_address`)."""
        return channel_burst_address(self.amap, self.bursts_per_granule, entry, sub)

    def locate(self, byte_addr: int) -> tuple:
        """``(channel, controller burst address, byte offset in the burst)`` of a device byte address."""
        if not 0 <= byte_addr < self.bytes:
            raise ValueError(f"byte address {byte_addr:#x} outside 0..{self.bytes - 1:#x}")
        g, off = divmod(byte_addr, GRANULE_BYTES)
        bb = self.config.org.burst_bytes
        return g % self.channels, self.channel_burst(g // self.channels, off // bb), off % bb

    def elaborate(self, platform):
        m = Module()
        N, CB = self.channels, self.channel_bits
        DN, DH = self.ndp_slots, self.host_slots
        S = self.bursts_per_granule
        GB = self.granule_bits
        chans = self.chans
        for c, ch in enumerate(chans):
            m.submodules[f"ch{c}"] = (module_instance(ch, self.channel_module) if self.channel_module else ch)
            wiring.connect(m, ch.dram, wiring.flipped(self.dram[c]))
        nreq, hreq = self.ndp_req, self.host_req

        # ---- slot bookkeeping
        n_tail = Signal(range(DN))
        n_head = Signal(range(DN))
        n_count = Signal(range(DN + 1))
        h_tail = [Signal(range(DH), name=f"h_tail{c}") for c in range(N)]
        h_count = [Signal(range(DH + 1), name=f"h_count{c}") for c in range(N)]
        m.submodules.horder = horder = SyncFIFO(width=max(1, CB) + max(1, ceil_log2(DH)) + self.host_tag_width,
                                                depth=self.host_outstanding)

        # ---- arbiter
        hc = Signal(max(1, CB))
        m.d.comb += hc.eq(hreq.payload.addr[:CB] if CB else 0)
        w_rdy = Cat(ch.i.ready for ch in chans)
        h_count_a = Array(h_count)
        h_tail_a = Array(h_tail)
        ndp_ok = Signal()
        host_ok = Signal()
        m.d.comb += [
            ndp_ok.eq(nreq.valid & w_rdy.all() & (nreq.payload.write | (n_count != DN))),
            host_ok.eq(hreq.valid & w_rdy.bit_select(hc, 1)
                       & (hreq.payload.write | ((h_count_a[hc] != DH) & horder.w_rdy))),
        ]
        last_ndp = Signal()
        g_ndp = Signal()
        g_host = Signal()
        m.d.comb += [
            g_ndp.eq(ndp_ok & (~host_ok | ~last_ndp)),
            g_host.eq(host_ok & ~g_ndp),
            nreq.ready.eq(g_ndp),
            hreq.ready.eq(g_host),
        ]
        with m.If(g_ndp | g_host):
            m.d.sync += last_ndp.eq(g_ndp)
        g_ndp_rd = g_ndp & ~nreq.payload.write
        g_host_rd = g_host & ~hreq.payload.write
        h_entry = Signal(chans[0].entry_layout)
        m.d.comb += [
            h_entry.addr.eq(hreq.payload.addr[CB:]),
            h_entry.write.eq(hreq.payload.write),
            h_entry.wdata.eq(hreq.payload.wdata),
            h_entry.port.eq(HOST),
            h_entry.slot.eq(h_tail_a[hc]),
        ]
        for c, ch in enumerate(chans):
            mine = (hc == c) if CB else Const(1)
            m.d.comb += [
                ch.i.valid.eq(g_ndp | (g_host & mine)),
                ch.i.payload.as_value().eq(Mux(
                    g_ndp,
                    Cat(nreq.payload.addr, nreq.payload.write, nreq.payload.wdata[c * GB:(c + 1) * GB],
                        Const(NDP, 1), n_tail),
                    h_entry.as_value())),
            ]
        with m.If(g_ndp_rd):
            m.d.sync += n_tail.eq(n_tail + 1)
        # NDP tags, by slot
        tw = self.ndp_tag_width
        if tw:
            m.submodules.ndp_tags = ntags = Memory(shape=tw, depth=DN, init=[])
            ntw, ntr = ntags.write_port(), ntags.read_port()
            m.d.comb += [ntw.addr.eq(n_tail), ntw.data.eq(nreq.payload.tag), ntw.en.eq(g_ndp_rd)]
        hsb = max(1, ceil_log2(DH))
        m.d.comb += [
            horder.w_en.eq(g_host_rd),
            horder.w_data.eq(Cat(hc, h_tail_a[hc][:hsb] if DH > 1 else Const(0, 1), hreq.payload.tag)),
        ]

        # ---- arrivals: per slot, one bit per burst of every channel
        nv = [Signal(N * S, name=f"nv{s}") for s in range(DN)]
        hv = [[Signal(S, name=f"hv{c}_{s}") for s in range(DH)] for c in range(N)]

        # ---- NDP reassembly: the oldest slot, once complete, is read out of every channel's ROB
        o_valid = Signal()
        n_adv = ~o_valid | self.ndp_rsp.ready
        n_done = Signal()
        m.d.comb += n_done.eq((n_count != 0) & Array(nv)[n_head].all())
        n_pop = n_adv & n_done
        for ch in chans:
            m.d.comb += [ch.ndp_raddr.eq(n_head), ch.ndp_ren.eq(n_adv)]
        with m.If(n_adv):
            m.d.sync += o_valid.eq(n_done)
        with m.If(n_pop):
            m.d.sync += n_head.eq(n_head + 1)
        m.d.sync += n_count.eq(n_count + g_ndp_rd - n_pop)
        m.d.comb += [
            self.ndp_rsp.valid.eq(o_valid),
            self.ndp_rsp.payload.rdata.eq(Cat(ch.ndp_rdata for ch in chans)),
        ]
        if tw:
            m.d.comb += [ntr.addr.eq(n_head), ntr.en.eq(n_adv), self.ndp_rsp.payload.tag.eq(ntr.data)]

        # ---- host reassembly: the head of the host-order FIFO, once its bursts arrived
        head_c = horder.r_data[:max(1, CB)]
        head_s = horder.r_data[max(1, CB):max(1, CB) + hsb]
        head_tag = horder.r_data[max(1, CB) + hsb:]
        ho_valid = Signal()
        ho_c = Signal(max(1, CB))
        ho_tag = Signal(max(1, self.host_tag_width))
        h_adv = ~ho_valid | self.host_rsp.ready
        hv_flat = Array(Array(hv[c][s].all() for s in range(DH)) for c in range(N))
        h_done = Signal()
        m.d.comb += h_done.eq(horder.r_rdy & hv_flat[head_c if CB else 0][head_s if DH > 1 else 0])
        h_pop = h_adv & h_done
        m.d.comb += horder.r_en.eq(h_pop)
        for ch in chans:
            m.d.comb += [ch.host_raddr.eq(head_s if DH > 1 else 0), ch.host_ren.eq(h_adv)]
        with m.If(h_adv):
            m.d.sync += [ho_valid.eq(h_done), ho_c.eq(head_c)]
            if self.host_tag_width:
                m.d.sync += ho_tag.eq(head_tag)
        m.d.comb += [
            self.host_rsp.valid.eq(ho_valid),
            self.host_rsp.payload.rdata.eq(Array(ch.host_rdata for ch in chans)[ho_c] if CB
                                           else chans[0].host_rdata),
        ]
        if self.host_tag_width:
            m.d.comb += self.host_rsp.payload.tag.eq(ho_tag)

        # ---- per-channel host slot rings and arrival bits
        for c, ch in enumerate(chans):
            mine = (hc == c) if CB else Const(1)
            popped = h_pop & (((head_c == c) if CB else Const(1)))
            with m.If(g_host_rd & mine):
                m.d.sync += h_tail[c].eq(h_tail[c] + 1) if DH > 1 else []
            m.d.sync += h_count[c].eq(h_count[c] + (g_host_rd & mine) - popped)
            arrive = ch.done_valid
            for s in range(DH):
                for k in range(S):
                    hit = arrive & (ch.done_port == HOST) & ((ch.done_slot == s) if DH > 1 else 1) \
                        & ((ch.done_sub == k) if S > 1 else 1)
                    clr = popped & ((head_s == s) if DH > 1 else 1)
                    with m.If(hit):
                        m.d.sync += hv[c][s][k].eq(1)
                    with m.Elif(clr):
                        m.d.sync += hv[c][s][k].eq(0)
            for s in range(DN):
                for k in range(S):
                    hit = arrive & (ch.done_port == NDP) & (ch.done_slot == s) & ((ch.done_sub == k) if S > 1 else 1)
                    with m.If(hit):
                        m.d.sync += nv[s][c * S + k].eq(1)
        for s in range(DN):
            with m.If(n_pop & (n_head == s)):
                for c in range(N):
                    for k in range(S):
                        # an arrival for a slot being popped cannot happen (the slot is complete)
                        m.d.sync += nv[s][c * S + k].eq(0)
        return m
