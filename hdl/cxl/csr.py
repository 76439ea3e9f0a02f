"""The CXL.io MMIO register bank (CSRs) of the NDP device, generated from a :class:`hdl.cxl.regmap.RegisterMap`.

[PLoRA] IV-C (docs/references.md): "CXL.io MMIO for control ... then rings a CXL.io MMIO
doorbell"; line ~94: "Per-requester queues bound to a PASID isolate concurrent GPUs, and per-queue base and limit
registers check every device-side address", "a completion flag ... which the GPU polls or takes as an MSI-X
interrupt". Offsets, widths, access types and reset values all come from the register map; nothing here repeats
them.

Ports (``n = regmap.num_queues``):

* ``mmio`` (in, stream of :func:`mmio_request_layout`): ``{addr, write, wdata}``; ``addr`` is a byte address
  in the register window, only 64-bit aligned accesses of a whole register are defined.
* ``rsp`` (out, stream of :data:`MMIO_RESPONSE_LAYOUT`): ``{rdata, err}``, exactly one per request, in order;
  a request accepted in cycle t is answered in cycle t + 1 (one request per cycle at full rate;
  ``mmio.ready = ~rsp.valid | rsp.ready``, no combinational path from ``mmio`` to any output). A write's
  response has ``rdata = 0``. ``err = 1`` (and nothing changes) for: an unmapped or misaligned address, a write
  to an RO register, a read of a WO register (DOORBELL), and a write to SQ_ENTRIES of a value that is not 0 or
  a power of two <= ``MAX_SQ_ENTRIES`` (the queue engine may rely on a power of two).
  Queue window rules (``docs/cxl_isolation.md``; Python mirror :func:`hdl.cxl.regmap.placement_ok`): a write to
  QWIN_BASE / QWIN_LIMIT is an error if the value is not a multiple of ``QWIN_ALIGN`` (64) or any queue is
  enabled (the window is locked while queues run); a write to SQ_BASE, SQ_ENTRIES, CQ_BASE, WIN_BASE, WIN_LIMIT
  or CTRL of queue q is an error if, with a queue window programmed (QWIN_LIMIT > QWIN_BASE), it would leave q
  enabled with its ring or completion area (extents from ``layout``) not inside the window or its data window
  overlapping it.
* ``qwin_base`` / ``qwin_limit`` (out, 64): the queue window registers (for the address filter).
* ``hmem_rejects`` (in, COUNTER_BITS): the value HMEM_REJECTS reads as (the address filter's counter).
* ``queue[q]`` (out, :meth:`CSRBank.queue_layout`): the current value of every RW register of queue q, fields
  named after the registers in lower case (``sq_base``, ``sq_entries``, ``cq_base``, ``win_base``,
  ``win_limit``, ``pasid``, ``ctrl.enable``, ``ctrl.irq_enable``).
* ``int_enable`` / ``int_status`` (out, n bits): the global registers.
* ``doorbell[q]`` (out, :data:`DOORBELL_LAYOUT`): ``valid`` is high for one cycle, the cycle after a write to
  queue q's DOORBELL was accepted; ``tail`` holds the last value written (the written bits, COUNTER_BITS wide).
* ``head[q]`` / ``errors[q]`` (in): the values HEAD and ERRORS of queue q read as (driven by the queue engine).
* ``int_set`` (in, n bits): bit q set in a cycle sets INT_STATUS bit q at the end of it; a set wins over a
  write-1-to-clear of the same bit in the same cycle (an interrupt is never lost).
* ``irq`` (out): ``(INT_STATUS & INT_ENABLE & {CTRL[q].irq_enable}) != 0``, from registers only.

A read returns the register value at the cycle of acceptance (it sees every write and ``int_set`` of earlier
cycles); writes to bits above a register's width are ignored and those bits read as 0.
"""

from amaranth.hdl import Module, Signal, Cat, Const, Value, Mux, Array
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out

from .regmap import (RegisterMap, QueueLayout, COUNTER_BITS, MAX_SQ_ENTRIES, QUEUE_BASE, QUEUE_STRIDE,
                     QWIN_ALIGN)

__all__ = ["mmio_request_layout", "MMIO_RESPONSE_LAYOUT", "DOORBELL_LAYOUT", "CTRL_LAYOUT", "CSRBank"]

#: One MMIO response: read data (0 for writes and errors) and the error bit.
MMIO_RESPONSE_LAYOUT = data.StructLayout({"rdata": 64, "err": 1})

#: One doorbell event of a queue.
DOORBELL_LAYOUT = data.StructLayout({"valid": 1, "tail": COUNTER_BITS})

#: Queue CTRL register fields (regmap CTRL_ENABLE = bit 0, CTRL_IRQ_ENABLE = bit 1).
CTRL_LAYOUT = data.StructLayout({"enable": 1, "irq_enable": 1})


def mmio_request_layout(addr_bits: int) -> data.StructLayout:
    """One MMIO request: byte address, write (1) or read (0), write data."""
    return data.StructLayout({"addr": addr_bits, "write": 1, "wdata": 64})


class CSRBank(wiring.Component):
    """The register bank of ``regmap`` (a :class:`RegisterMap`). ``addr_bits`` (default ``regmap.addr_bits``)
    is the width of ``mmio.payload.addr``; addresses at or above ``regmap.size`` are unmapped.

    ``value(name, queue=None)`` returns the signal (or view field) that holds a register's current value.
    """

    def __init__(self, regmap: RegisterMap, *, addr_bits: int | None = None, layout: QueueLayout | None = None):
        if not isinstance(regmap, RegisterMap):
            raise ValueError(f"regmap must be a RegisterMap, got {regmap!r}")
        if layout is None:
            layout = QueueLayout(0, 0)
        if not isinstance(layout, QueueLayout):
            raise ValueError(f"layout must be a QueueLayout, got {layout!r}")
        self.layout = layout
        if addr_bits is None:
            addr_bits = regmap.addr_bits
        if not isinstance(addr_bits, int) or not regmap.addr_bits <= addr_bits <= 64:
            raise ValueError(f"addr_bits must be {regmap.addr_bits}..64 for {regmap!r}, got {addr_bits!r}")
        self.regmap = regmap
        self.addr_bits = addr_bits
        n = regmap.num_queues
        self._queue_layout = self.queue_layout(regmap)
        super().__init__({
            "mmio": In(stream.Signature(mmio_request_layout(addr_bits))),
            "rsp": Out(stream.Signature(MMIO_RESPONSE_LAYOUT)),
            "queue": Out(self._queue_layout).array(n),
            "int_enable": Out(n),
            "int_status": Out(n),
            "doorbell": Out(DOORBELL_LAYOUT).array(n),
            "head": In(regmap.reg("HEAD", 0).width).array(n),
            "errors": In(regmap.reg("ERRORS", 0).width).array(n),
            "int_set": In(n),
            "irq": Out(1),
            "qwin_base": Out(64),
            "qwin_limit": Out(64),
            "hmem_rejects": In(regmap.reg("HMEM_REJECTS").width),
        })

    @staticmethod
    def queue_layout(regmap: RegisterMap) -> data.StructLayout:
        """The RW registers of one queue, one field each (CTRL as :data:`CTRL_LAYOUT`), in offset order."""
        fields = {}
        for r in regmap:
            if r.queue == 0 and r.access == "RW":
                fields[r.name.lower()] = CTRL_LAYOUT if r.name == "CTRL" else r.width
        assert CTRL_LAYOUT.size == regmap.reg("CTRL", 0).width
        return data.StructLayout(fields)

    def value(self, name: str, queue: int | None = None):
        """The port that carries register ``name`` (of ``queue``): a ``queue[q]`` field for per-queue RW
        registers, ``head[q]``/``errors[q]`` (inputs), ``doorbell[q]`` (event view), ``int_enable``,
        ``int_status``; a Const for the RO constants (DEV_ID, NUM_QUEUES, QUEUE_STRIDE)."""
        r = self.regmap.reg(name, queue)
        if r.queue is not None:
            if r.access == "RW":
                return self.queue[r.queue][name.lower()]
            return {"HEAD": self.head, "ERRORS": self.errors, "DOORBELL": self.doorbell}[name][r.queue]
        if name in ("INT_ENABLE", "INT_STATUS", "QWIN_BASE", "QWIN_LIMIT", "HMEM_REJECTS"):
            return getattr(self, name.lower())
        return Const(r.reset, r.width)

    def elaborate(self, platform):
        rm = self.regmap
        n = rm.num_queues
        m = Module()

        # Storage: one register per RW/RW1C register, reset from the map.
        store = {}
        for r in rm:
            if r.access in ("RW", "RW1C"):
                store[r.offset] = Signal(r.width, init=r.reset, name=r.full_name.replace(".", "_").lower())
        for q in range(n):
            for field, _ in self._queue_layout:
                r = rm.reg(field.upper(), q)
                m.d.comb += Value.cast(self.queue[q][field]).eq(store[r.offset])
        int_status = store[rm.offset("INT_STATUS")]
        int_enable = store[rm.offset("INT_ENABLE")]
        m.d.comb += [self.int_status.eq(int_status), self.int_enable.eq(int_enable)]
        qwb, qwl = store[rm.offset("QWIN_BASE")], store[rm.offset("QWIN_LIMIT")]
        m.d.comb += [self.qwin_base.eq(qwb), self.qwin_limit.eq(qwl)]

        # Read sources of the other registers.
        source = {}
        for r in rm:
            if r.offset in store:
                source[r.offset] = store[r.offset]
            elif r.name == "HEAD":
                source[r.offset] = self.head[r.queue]
            elif r.name == "ERRORS":
                source[r.offset] = self.errors[r.queue]
            elif r.name == "HMEM_REJECTS":
                source[r.offset] = self.hmem_rejects
            elif r.access == "RO":
                source[r.offset] = Const(r.reset, r.width)
        unknown = [r.full_name for r in rm if r.readable and r.offset not in source]
        assert not unknown, f"no read source for {unknown}"

        # Request decode.
        req = self.mmio.payload
        accept = Signal()
        m.d.comb += [self.mmio.ready.eq(~self.rsp.valid | self.rsp.ready),
                     accept.eq(self.mmio.valid & self.mmio.ready)]
        rdata = Signal(64)
        err = Signal()
        clear = Signal(n)            # INT_STATUS bits written with 1
        db_hit = Signal(n)           # DOORBELL of queue q written
        wdata = req.wdata
        entries_ok = (wdata == 0) | (((wdata & (wdata - 1)) == 0) & (wdata <= MAX_SQ_ENTRIES))
        # Queue window rules. The addressed queue's block (QUEUE_BASE and QUEUE_STRIDE are multiples of the
        # stride, so the block index is addr >> log2(stride) and the offset in the block its low bits); one shared
        # placement checker evaluates the queue's registers with the written one replaced by wdata.
        sb = QUEUE_STRIDE.bit_length() - 1
        assert QUEUE_STRIDE == 1 << sb and QUEUE_BASE % QUEUE_STRIDE == 0
        qsel = Signal(range(max(n, 2)))
        m.d.comb += qsel.eq((req.addr >> sb) - QUEUE_BASE // QUEUE_STRIDE)
        qcur = Array(self.queue[q] for q in range(n))[qsel]
        boff = req.addr[:sb]

        def cand(name, cur):
            r0 = rm.reg(name, 0)
            return Mux(req.write & (boff == r0.offset - QUEUE_BASE), wdata[:r0.width], cur)
        n_sq, n_ent, n_cq = cand("SQ_BASE", qcur.sq_base), cand("SQ_ENTRIES", qcur.sq_entries), \
            cand("CQ_BASE", qcur.cq_base)
        n_wb, n_wl = cand("WIN_BASE", qcur.win_base), cand("WIN_LIMIT", qcur.win_limit)
        n_en = cand("CTRL", qcur.ctrl.as_value())[0]
        lay = self.layout
        qwin_on = qwl > qwb
        sq_in = (qwb <= n_sq) & (n_sq + n_ent * lay.slot_bytes <= qwl)
        cq_in = (qwb <= n_cq) & (n_cq + n_ent * lay.cpl_bytes <= qwl)
        win_out = (n_wl <= n_wb) | (n_wl <= qwb) | (n_wb >= qwl)
        place_ok = Signal()
        m.d.comb += place_ok.eq(~n_en | ~qwin_on | (sq_in & cq_in & win_out))
        any_enabled = Cat(self.queue[q].ctrl.enable for q in range(n)).any()
        qwin_ok = (wdata[:QWIN_ALIGN.bit_length() - 1] == 0) & ~any_enabled
        placed = ("SQ_BASE", "SQ_ENTRIES", "CQ_BASE", "WIN_BASE", "WIN_LIMIT", "CTRL")

        # One comparator per register; read data is an AND-OR multiplexer (no case statements: Yosys splits a
        # Switch into per-signal processes whose cases Verilator's lint reports as incomplete).
        write, read = req.write, ~req.write
        mapped = Signal()
        hits, errs, reads = [], [], []
        for r in rm:
            hit = Signal(name=f"hit_{r.full_name.replace('.', '_').lower()}")
            m.d.comb += hit.eq(req.addr == r.offset)
            hits.append(hit)
            we = accept & write & hit
            if r.access == "RO":
                errs.append(write & hit)
            elif r.access == "WO":
                errs.append(read & hit)
                m.d.comb += db_hit[r.queue].eq(we)
                with m.If(we):
                    m.d.sync += self.doorbell[r.queue].tail.eq(wdata[:r.width])
            elif r.access == "RW1C":
                m.d.comb += clear.eq(Mux(we, wdata[:r.width], 0))
            elif r.name in ("QWIN_BASE", "QWIN_LIMIT"):
                errs.append(write & hit & ~qwin_ok)
                with m.If(we & qwin_ok):
                    m.d.sync += store[r.offset].eq(wdata[:r.width])
            elif r.name in placed:
                ok = place_ok & (entries_ok if r.name == "SQ_ENTRIES" else 1)
                errs.append(write & hit & ~ok)
                with m.If(we & ok):
                    m.d.sync += store[r.offset].eq(wdata[:r.width])
            else:
                with m.If(we):
                    m.d.sync += store[r.offset].eq(wdata[:r.width])
            if r.readable:
                reads.append(Mux(read & hit, source[r.offset], 0))
        m.d.comb += mapped.eq(Cat(hits).any())
        m.d.comb += [err.eq(Cat(*errs, ~mapped).any()), rdata.eq(_or(reads))]

        # INT_STATUS: set by int_set, cleared by a write of 1; a set wins.
        m.d.sync += int_status.eq((int_status & ~clear) | self.int_set)

        # Doorbell pulses: one cycle, the cycle after acceptance.
        for q in range(n):
            m.d.sync += self.doorbell[q].valid.eq(db_hit[q])

        # Response register.
        with m.If(self.mmio.ready):
            m.d.sync += self.rsp.valid.eq(self.mmio.valid)
            with m.If(self.mmio.valid):
                m.d.sync += [self.rsp.payload.rdata.eq(rdata), self.rsp.payload.err.eq(err)]

        irq_en = Cat(self.queue[q].ctrl.irq_enable for q in range(n))
        m.d.comb += self.irq.eq((int_status & int_enable & irq_en) != 0)
        return m


def _or(values):
    """Bitwise OR of ``values`` (a balanced tree)."""
    values = list(values)
    while len(values) > 1:
        values = [a | b for a, b in zip(values[::2], values[1::2])] + values[len(values) & ~1:]
    return values[0]
