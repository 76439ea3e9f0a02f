"""Device-side address filter of the host's CXL.mem accesses: the reserved HDM queue window and the PASID check.

[PLoRA] IV-C ("Issuing and protocol"; docs/references.md): the GPU writes operand, descriptor
and valid flag into an HDM submission queue over CXL.mem; (line ~94, "Coherence and completion"): "Per-requester
queues bound to a PASID isolate concurrent GPUs". The reserved window and the filter that tells queue traffic from
ordinary data accesses by address are the issue's reading of that section; every rule below is this project's
choice (``docs/cxl_isolation.md``).

Every host access carries the requester's PASID (20 bits, the PCIe PASID width; the modelled CXL.mem request
carries it the way a PCIe TLP carries its PASID prefix). For a host access of line ``a`` (bytes
``[64 a, 64 a + 64)``) with PASID ``p``:

* queue q *owns* the line if q is enabled (CTRL.enable, SQ_ENTRIES != 0) and the line overlaps q's submission
  ring ``[SQ_BASE, SQ_BASE + SQ_ENTRIES * slot_bytes)`` or completion area ``[CQ_BASE, CQ_BASE + SQ_ENTRIES *
  cpl_bytes)``;
* a line some queue owns is **allowed** iff ``p`` equals the PASID of one of its owners;
* a line no queue owns is **rejected** if it overlaps the queue window ``[QWIN_BASE, QWIN_LIMIT)`` (reserved
  space outside every live queue area), else **allowed** (ordinary data: passes unchanged).

A rejected write is dropped; a rejected read is answered with zeros and the error bit (``reject`` on ``o``: the
device answers it without touching memory); both are counted (``rejects``, saturating).
"""

from amaranth.hdl import Module, Signal, Cat, Value
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out

from .regmap import PASID_BITS, QueueLayout, MAX_SQ_ENTRIES

__all__ = ["LINE_BYTES", "FILTER_QUEUE_LAYOUT", "filter_request_layout", "filter_output_layout",
           "host_access_ok", "FilterModel", "HostFilter"]

LINE_BYTES = 64                    # one CXL.mem line = one device burst (the filter's grain)
_LINE_SHIFT = 6

#: The queue registers the filter needs (from the CSR bank).
FILTER_QUEUE_LAYOUT = data.StructLayout({"sq_base": 64, "sq_entries": MAX_SQ_ENTRIES.bit_length(), "cq_base": 64,
                                         "pasid": PASID_BITS, "enable": 1})


def filter_request_layout(addr_bits: int, data_bits: int) -> data.StructLayout:
    """A host CXL.mem request: line address, write, write data, requester PASID."""
    return data.StructLayout({"addr": addr_bits, "write": 1, "wdata": data_bits, "pasid": PASID_BITS})


def filter_output_layout(addr_bits: int, data_bits: int) -> data.StructLayout:
    """A filtered request: ``reject`` = 1 only for a rejected read (answer zeros + error, no memory access)."""
    return data.StructLayout({"addr": addr_bits, "write": 1, "wdata": data_bits, "reject": 1})


def _overlap(lo, hi, a_lo, a_hi):
    return lo < a_hi and a_lo < hi and a_lo < a_hi


class FilterModel:
    """Python mirror of :class:`HostFilter` for fixed registers: ``queues`` = ``(sq_base, entries, cq_base, pasid,
    enable)`` per queue; :meth:`ok` decides one access (the live queue areas are computed once)."""

    def __init__(self, queues, qwin_base: int, qwin_limit: int, layout: QueueLayout):
        self.areas = []                   # (first byte, end, pasid) of every live queue area
        for sq_base, entries, cq_base, qpasid, enable in queues:
            if enable and entries:
                self.areas.append((sq_base, sq_base + entries * layout.slot_bytes, qpasid))
                self.areas.append((cq_base, cq_base + entries * layout.cpl_bytes, qpasid))
        self.qwin = (qwin_base, qwin_limit)

    def ok(self, line: int, pasid: int) -> bool:
        lo, hi = line * LINE_BYTES, (line + 1) * LINE_BYTES
        owners = [p for a_lo, a_hi, p in self.areas if _overlap(lo, hi, a_lo, a_hi)]
        if owners:
            return pasid in owners
        return not _overlap(lo, hi, *self.qwin)


def host_access_ok(line: int, pasid: int, queues, qwin_base: int, qwin_limit: int, layout: QueueLayout) -> bool:
    """Python mirror of :class:`HostFilter`: is a host access of ``line`` with ``pasid`` allowed? ``queues``:
    ``(sq_base, entries, cq_base, pasid, enable)`` per queue."""
    return FilterModel(queues, qwin_base, qwin_limit, layout).ok(line, pasid)


class HostFilter(wiring.Component):
    """The filter for ``num_queues`` queues of ``layout`` on ``addr_bits``-bit line addresses (see the module
    docstring for the rule).

    Ports: ``i`` In(stream of :func:`filter_request_layout`), ``o`` Out(stream of :func:`filter_output_layout`):
    allowed requests unchanged with ``reject = 0``, rejected reads with ``reject = 1`` (and ``wdata`` 0), in
    order; rejected writes never appear. ``queue[q]`` In(:data:`FILTER_QUEUE_LAYOUT`), ``qwin_base`` /
    ``qwin_limit`` In(64): the CSR values. ``rejects`` Out(``count_bits``): rejected requests (saturating).

    Timing (as :class:`hdl.cxl.guard.MemoryGuard`): one register stage, ``latency = 1``; ``i.ready = ~o.valid |
    o.ready`` (no path from ``i`` to ``o.valid``); full rate with ``o`` ready. Registers are sampled when a
    request is accepted. Cost per queue: four comparators on the line address plus two constant multiplies of
    SQ_ENTRIES (a power of two: shifts of the constant in practice), and one PASID comparator.
    """

    latency = 1

    def __init__(self, num_queues: int, addr_bits: int, layout: QueueLayout, *, data_bits: int = 8 * LINE_BYTES,
                 count_bits: int = 32):
        if not isinstance(num_queues, int) or not 1 <= num_queues <= 64:
            raise ValueError(f"num_queues must be in 1..64, got {num_queues!r}")
        if not isinstance(addr_bits, int) or not 1 <= addr_bits <= 64 - _LINE_SHIFT:
            raise ValueError(f"addr_bits must be in 1..{64 - _LINE_SHIFT}, got {addr_bits!r}")
        if not isinstance(layout, QueueLayout):
            raise ValueError(f"layout must be a QueueLayout, got {layout!r}")
        if not isinstance(data_bits, int) or data_bits < 1:
            raise ValueError(f"data_bits must be a positive int, got {data_bits!r}")
        if not isinstance(count_bits, int) or not 1 <= count_bits <= 64:
            raise ValueError(f"count_bits must be in 1..64, got {count_bits!r}")
        self.num_queues, self.addr_bits, self.layout = num_queues, addr_bits, layout
        self.data_bits, self.count_bits = data_bits, count_bits
        self.request_layout = filter_request_layout(addr_bits, data_bits)
        self.output_layout = filter_output_layout(addr_bits, data_bits)
        super().__init__({
            "i": In(stream.Signature(self.request_layout)),
            "o": Out(stream.Signature(self.output_layout)),
            "queue": In(FILTER_QUEUE_LAYOUT).array(num_queues),
            "qwin_base": In(64),
            "qwin_limit": In(64),
            "rejects": Out(count_bits),
        })

    def allowed(self, addr, pasid) -> Value:
        """The filter rule on Amaranth values (line address ``addr``, ``pasid``), from the current registers."""
        lo = Value.cast(addr).as_unsigned() << _LINE_SHIFT
        hi = lo + LINE_BYTES

        def overlap(a_lo, a_hi):
            return (lo < a_hi) & (a_lo < hi) & (a_lo < a_hi)
        owned, match = [], []
        for q in range(self.num_queues):
            r = self.queue[q]
            live = r.enable & (r.sq_entries != 0)
            own = live & (overlap(r.sq_base, r.sq_base + r.sq_entries * self.layout.slot_bytes)
                          | overlap(r.cq_base, r.cq_base + r.sq_entries * self.layout.cpl_bytes))
            owned.append(own)
            match.append(own & (r.pasid == pasid))
        return Cat(match).any() | (~Cat(owned).any() & ~overlap(self.qwin_base, self.qwin_limit))

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        ok = Signal()
        m.d.comb += [ok.eq(self.allowed(i.payload.addr, i.payload.pasid)), i.ready.eq(~o.valid | o.ready)]
        with m.If(o.ready):
            m.d.sync += o.valid.eq(0)
        with m.If(i.valid & i.ready):
            with m.If(ok):
                m.d.sync += [o.valid.eq(1), o.payload.addr.eq(i.payload.addr), o.payload.write.eq(i.payload.write),
                             o.payload.wdata.eq(i.payload.wdata), o.payload.reject.eq(0)]
            with m.Else():
                with m.If(~i.payload.write):
                    m.d.sync += [o.valid.eq(1), o.payload.addr.eq(i.payload.addr), o.payload.write.eq(0),
                                 o.payload.wdata.eq(0), o.payload.reject.eq(1)]
                with m.If(self.rejects != (1 << self.count_bits) - 1):
                    m.d.sync += self.rejects.eq(self.rejects + 1)
        return m
