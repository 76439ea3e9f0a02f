"""Golden model of the CXL NDP device (``sim/cxl/system.CXLSystem``) at transaction level.

:class:`GoldenDevice` executes the same *scripted* input streams the RTL system takes (``mmio`` CXL.io register
accesses and ``hmem`` CXL.mem line accesses of the GPU, as built by :class:`host.cxl_driver.Driver`) and produces
the same output streams (``mmio_rsp``, ``hmem_rsp``, ``events``) plus the final device memory. No timing: the
model only decides an *order* of the three agents (register bank, GPU memory stream, queue engine):

* All MMIO requests are applied first, in order (the RTL takes one per cycle, long before the GPU's memory
  stream is done; a script whose outcome depends on the MMIO / CXL.mem interleaving is racy, see
  ``docs/cxl_device.md``). Reads of the dynamic registers (HEAD, ERRORS, INT_STATUS) therefore return their
  values before any descriptor ran; compare them with :data:`DYNAMIC_REGISTERS` in mind.
* The ``hmem`` requests are served in order. A request whose ``after`` exceeds the number of completion records
  written so far makes the queue engine run until it does; if the engine cannot get there (nothing left it can
  execute) the RTL would wait forever: :class:`GoldenHang`.
* After the last ``hmem`` request the engine runs until nothing is executable.

The queue engine (one descriptor at a time; round-robin over the queues, or the order given by ``order=``, e.g.
the RTL's ``events``) follows the device semantics of ``docs/cxl_device.md`` / ``docs/cxl_regmap.md``: queue
``q`` can execute while enabled with ``SQ_ENTRIES != 0`` and ``HEAD != tail`` and the valid word of slot
``HEAD % SQ_ENTRIES`` equals ``valid_word(HEAD)``; the descriptor's operand range is checked with
:func:`hdl.cxl.device.line_window_ok` (whole 64-byte lines) against ``[WIN_BASE, WIN_LIMIT)`` (fail: status :data:`WINDOW_VIOLATION`, the
core never sees it, KEEP/CHAIN state untouched), else :class:`sim.golden.ndp_core.GoldenCore` executes it as
owner :func:`hdl.cxl.device.owner_of` (queue, PASID) on the staged input (the slot's input area as the GPU wrote
the ``x`` stream: a READ_COMPUTE's rows padded to whole beats); the returned beats are written
to the result area (whole 64-byte lines, the tail of the last line zero) and then the 64-byte completion header
``{seq, status, result_bytes = beats * beat bytes, completion_flag(index)}`` (all other header bytes zero).

Kept results and partials belong to the queue (and PASID) that made them: a CHAIN / ACC of another queue
completes with FOREIGN_STATE (or NO_CHAIN_INPUT). The state slots are shared (a KEEP of a new owner may evict
another's state) and so is device memory, so the results of a program whose queues interact through them
depend on the execution order; give the RTL's order (``order=rtl_events``) to check such a run exactly. The model checks that the given order is one the device could have taken (per queue in index order,
each descriptor valid and rung when it runs) and raises :class:`GoldenOrderError` otherwise.
"""

from dataclasses import dataclass, field

import numpy as np

from hdl.cxl.regmap import (PASID_BITS, RegisterMap, QueueLayout, valid_word, completion_flag, CTRL_ENABLE, COUNTER_BITS,
                            MAX_SQ_ENTRIES, DESC_OFFSET, DESC_BYTES, VALID_OFFSET, CPL_SEQ_OFFSET,
                            CPL_STATUS_OFFSET, CPL_RESULT_BYTES_OFFSET, CPL_FLAG_OFFSET, CPL_HEADER_BYTES)
from hdl.cxl.regmap import placement_ok, QWIN_ALIGN
from hdl.cxl.device import line_window_ok, owner_of
from hdl.cxl.filter import FilterModel
from hdl.ndp.config import NDPConfig
from hdl.ndp.descriptor import DESCRIPTOR_BITS, DESCRIPTOR_LAYOUT, DescType, ErrorCode
from .ndp_core import GoldenCore

__all__ = ["LINE_BYTES", "WINDOW_VIOLATION", "AFTER_BITS", "DYNAMIC_REGISTERS", "Fields", "port_fields",
           "default_mem_addr_bits", "Event", "Access", "GoldenHang", "GoldenOrderError", "GoldenRun",
           "GoldenDevice", "status_name", "encode_descriptor", "decode_descriptor"]

LINE_BYTES = 64                 # one CXL.mem line = one device memory burst
WINDOW_VIOLATION = ErrorCode.WINDOW_VIOLATION.value   # status of a descriptor whose operand leaves its window
AFTER_BITS = 16                 # width of hmem.after
EVENT_QUEUE_BITS = 8
EVENT_STATUS_BITS = 8
#: Registers whose value depends on how far the device has got (a scripted read of them is racy).
DYNAMIC_REGISTERS = ("HEAD", "ERRORS", "INT_STATUS", "HMEM_REJECTS")

_MASK32 = (1 << COUNTER_BITS) - 1
_DESC_MASK = (1 << DESCRIPTOR_BITS) - 1


def status_name(status: int) -> str:
    """``"OK"``, an :class:`ErrorCode` name, ``"WINDOW_VIOLATION"`` or the number."""
    if status == WINDOW_VIOLATION:
        return "WINDOW_VIOLATION"
    try:
        return ErrorCode(status).name
    except ValueError:
        return str(status)


def _descriptor_fields():
    """``[(Descriptor field name, bit offset, width)]`` from ``DESCRIPTOR_LAYOUT`` (the one bit-position source)."""
    from amaranth.lib import data

    def walk(layout, off, path):
        for name, f in layout:
            if isinstance(f.shape, data.StructLayout):
                yield from walk(f.shape, off + f.offset, path + (name,))
            else:
                yield path + (name,), off + f.offset, f.width
    names = {("header", "type"): "type", ("header", "op"): "op", ("header", "dtype"): "dtype",
             ("header", "flags"): "flags", ("header", "reserved"): "reserved", ("base_addr",): "base_addr"}
    out = []
    for path, off, width in walk(DESCRIPTOR_LAYOUT, 0, ()):
        out.append((names.get(path, "_".join(path)), off, width))
    return tuple(out)


_DESC_FIELDS = _descriptor_fields()


def decode_descriptor(raw: int):
    """``firmware.ndp.descriptor.decode`` of the low 204 bits of ``raw``, by plain shifts (fast)."""
    from firmware.ndp.descriptor import Descriptor
    raw &= _DESC_MASK
    return Descriptor(**{name: (raw >> off) & ((1 << w) - 1) for name, off, w in _DESC_FIELDS})


def encode_descriptor(desc) -> int:
    """``Descriptor.encode()`` by plain shifts (fast)."""
    out = 0
    for name, off, _ in _DESC_FIELDS:
        v = getattr(desc, name)
        out |= (v if isinstance(v, int) else v.value) << off
    return out


class Fields:
    """A flat payload format: ``[(name, width), ...]`` packed from the LSB up (an Amaranth ``StructLayout``'s
    order). :meth:`pack` / :meth:`unpack` work on plain ints (much faster than ``data.Const``)."""

    def __init__(self, spec):
        self.spec = tuple((str(n), int(w)) for n, w in spec)
        self.names = tuple(n for n, _ in self.spec)
        offs, off = [], 0
        for _, w in self.spec:
            offs.append(off)
            off += w
        self.offsets = tuple(offs)
        self.width = off
        self._masks = tuple((1 << w) - 1 for _, w in self.spec)

    @classmethod
    def from_layout(cls, layout) -> "Fields":
        """From an ``amaranth.lib.data.StructLayout`` of plain (unsigned) fields."""
        spec = []
        expect = 0
        for name, f in layout:
            if f.offset != expect:
                raise ValueError(f"layout field {name} at offset {f.offset}, expected {expect}")
            spec.append((name, f.width))
            expect += f.width
        return cls(spec)

    def __eq__(self, other):
        return isinstance(other, Fields) and self.spec == other.spec

    def __repr__(self):
        return f"Fields({list(self.spec)})"

    def pack(self, *values, **kw) -> int:
        if kw:
            values = tuple(kw[n] for n in self.names)
        if len(values) != len(self.spec):
            raise ValueError(f"{self!r}: expected {len(self.spec)} values, got {len(values)}")
        out = 0
        for v, off, mask, (name, _) in zip(values, self.offsets, self._masks, self.spec):
            v = int(v)
            if not 0 <= v <= mask:
                raise ValueError(f"field {name}: {v:#x} does not fit {mask.bit_length()} bits")
            out |= v << off
        return out

    def unpack(self, word: int) -> tuple:
        word = int(word)
        return tuple((word >> off) & mask for off, mask in zip(self.offsets, self._masks))


def default_mem_addr_bits(depth: int) -> int:
    """Burst-address bits of a memory of ``depth`` bursts (as :class:`sim.ndp.system.NDPBurstSystem`)."""
    return max(1, (depth - 1).bit_length())


def port_fields(regmap: RegisterMap, mem_addr_bits: int) -> dict:
    """The payload formats of the device's stream ports (``docs/cxl_device.md``)."""
    return {
        "mmio": Fields([("addr", regmap.addr_bits), ("write", 1), ("wdata", 64)]),
        "mmio_rsp": Fields([("rdata", 64), ("err", 1)]),
        "hmem": Fields([("addr", mem_addr_bits), ("write", 1), ("wdata", 8 * LINE_BYTES), ("pasid", PASID_BITS),
                        ("after", AFTER_BITS), ("mmio_after", AFTER_BITS)]),
        "hmem_rsp": Fields([("rdata", 8 * LINE_BYTES), ("err", 1)]),
        "events": Fields([("queue", EVENT_QUEUE_BITS), ("index", COUNTER_BITS), ("status", EVENT_STATUS_BITS)]),
        "core_req": Fields([("queue", EVENT_QUEUE_BITS), ("addr", mem_addr_bits), ("write", 1)]),
    }


@dataclass(frozen=True)
class Event:
    """One completion record written by the device: queue, free-running index, status."""
    queue: int
    index: int
    status: int

    def __repr__(self):
        return f"Event(q{self.queue}#{self.index} {status_name(self.status)})"


@dataclass(frozen=True)
class Access:
    """The bursts ``[first, end)`` the core may touch for one descriptor that reached it with status OK
    (``write``: a STORE). The RTL's ``core_req`` of that queue must stay inside the union of these."""
    queue: int
    index: int
    first: int
    end: int
    write: bool


class GoldenHang(RuntimeError):
    """The scripted streams make the device wait forever (an ``after`` no completion count can reach)."""


class GoldenOrderError(RuntimeError):
    """The forced execution order is not one the device could have taken."""


@dataclass
class GoldenRun:
    """What :meth:`GoldenDevice.run` produced: ``outputs`` in the RTL's format (``mmio_rsp``, ``hmem_rsp``,
    ``events``: lists of packed ints), ``events`` decoded, the final ``memory``, the core ``accesses``,
    ``pending`` (queue -> (HEAD, tail) of queues left with rung but never-valid slots) and the registers."""
    outputs: dict
    events: list
    memory: bytearray = field(repr=False)
    accesses: list = field(repr=False)
    pending: dict
    head: list
    errors: list
    int_status: int
    rejects: int = 0
    rejected: list = field(default_factory=list, repr=False)    # indices of the rejected hmem requests


_ATTR = {"DOORBELL": "tail", "SQ_ENTRIES": "entries"}
_PLACED = ("SQ_BASE", "SQ_ENTRIES", "CQ_BASE", "WIN_BASE", "WIN_LIMIT", "CTRL")


class _Queue:
    __slots__ = ("sq_base", "entries", "cq_base", "win_base", "win_limit", "pasid", "ctrl", "tail", "head",
                 "errors")

    def __init__(self):
        self.sq_base = self.entries = self.cq_base = self.win_base = self.win_limit = self.pasid = 0
        self.ctrl = self.tail = self.head = self.errors = 0


class GoldenDevice:
    """Transaction-level model of ``CXLSystem(config=..., num_queues=..., depth=...)``: device memory of ``depth``
    64-byte bursts (zeroed at reset), ``layout`` (default ``QueueLayout.for_config(config)``) and
    ``mem_addr_bits`` (default :func:`default_mem_addr_bits`). :meth:`run` starts from reset every time."""

    def __init__(self, *, config: NDPConfig, num_queues: int, depth: int, mem_addr_bits: int | None = None,
                 layout: QueueLayout | None = None):
        if not isinstance(config, NDPConfig):
            raise ValueError(f"config must be an NDPConfig, got {config!r}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive int (bursts), got {depth!r}")
        self.config = config
        self.regmap = RegisterMap(num_queues)
        self.num_queues = num_queues
        self.depth = depth
        self.memory_bytes = depth * LINE_BYTES
        self.mem_addr_bits = default_mem_addr_bits(depth) if mem_addr_bits is None else mem_addr_bits
        if (1 << self.mem_addr_bits) < depth:
            raise ValueError(f"mem_addr_bits {self.mem_addr_bits} cannot address {depth} bursts")
        self.layout = QueueLayout.for_config(config) if layout is None else layout
        self.fields = port_fields(self.regmap, self.mem_addr_bits)
        self.beat_bytes = 2 * config.lanes

    # ---- run ---------------------------------------------------------------------------------------------

    def run(self, inputs: dict, *, order=None) -> GoldenRun:
        """Execute ``inputs`` (``{"mmio": [packed ints], "hmem": [packed ints]}``). ``order``: the execution order
        to follow, a sequence of :class:`Event` or ``(queue, index)`` (e.g. the RTL's events); None: round-robin.
        Raises :class:`GoldenHang` if an ``after`` gate can never open."""
        self._reset()
        if order is not None:
            order = [(e.queue, e.index) if isinstance(e, Event) else (int(e[0]), int(e[1])) for e in order]
        self._order = order
        self._order_pos = 0
        mf, hf = self.fields["mmio"], self.fields["hmem"]
        mmio_rsp = [self._mmio(*mf.unpack(w)) for w in inputs.get("mmio", ())]
        hmem_rsp = []
        pos = [hf.names.index(n) for n in ("addr", "write", "wdata", "after", "pasid")]
        (oa, ma), (ow, _), (od, md), (oq, mq), (op, mp) = ((hf.offsets[i], (1 << hf.spec[i][1]) - 1)
                                                           for i in pos)
        rsp = self.fields["hmem_rsp"]
        for k, w in enumerate(inputs.get("hmem", ())):
            addr, write, wdata, after = (w >> oa) & ma, (w >> ow) & 1, (w >> od) & md, (w >> oq) & mq
            pasid = (w >> op) & mp
            if after > self._count:
                self._drain(until=after)
                if self._count < after:
                    raise GoldenHang(
                        f"hmem request {k} waits for {after} completions, but only {self._count} can be "
                        f"written ({self._stuck_text()})")
            if addr >= self.depth:
                raise ValueError(f"hmem request {k}: burst address {addr} beyond the {self.depth}-burst memory")
            a = addr * LINE_BYTES
            if not self._host_ok(addr, pasid):          # the address filter (hdl/cxl/filter.py)
                self._rejects = min(self._rejects + 1, _MASK32)
                self._rejected.append(k)
                if not write:
                    hmem_rsp.append(rsp.pack(0, 1))
            elif write:
                self.memory[a:a + LINE_BYTES] = wdata.to_bytes(LINE_BYTES, "little")
            else:
                hmem_rsp.append(rsp.pack(int.from_bytes(self.memory[a:a + LINE_BYTES], "little"), 0))
        self._drain(until=None)
        if order is not None and self._order_pos != len(order):
            q, i = order[self._order_pos]
            raise GoldenOrderError(f"forced order: q{q}#{i} (position {self._order_pos}) never became executable "
                                   f"({self._stuck_text()})")
        ef = self.fields["events"]
        pending = {q: (s.head, s.tail) for q, s in enumerate(self._q) if self._enabled(s) and s.head != s.tail}
        return GoldenRun(
            outputs={"mmio_rsp": mmio_rsp, "hmem_rsp": hmem_rsp,
                     "events": [ef.pack(e.queue, e.index, e.status) for e in self._events]},
            events=list(self._events), memory=self.memory, accesses=self._accesses, pending=pending,
            head=[s.head for s in self._q], errors=[s.errors for s in self._q], int_status=self._int_status,
            rejects=self._rejects, rejected=list(self._rejected))

    # ---- state -------------------------------------------------------------------------------------------

    def _reset(self):
        self.memory = bytearray(self.memory_bytes)
        self.core = GoldenCore(self.config, self.memory_bytes)
        self.core.memory = self.memory          # one device memory, shared with the core
        self._q = [_Queue() for _ in range(self.num_queues)]
        self._int_status = 0
        self._int_enable = 0
        self._qwin_base = self._qwin_limit = 0
        self._rejects = 0
        self._rejected = []
        self._filter = None
        self._count = 0
        self._events = []
        self._accesses = []
        self._rr = 0

    # ---- MMIO (CSRBank semantics) ------------------------------------------------------------------------

    def _mmio(self, addr, write, wdata):
        rsp = self.fields["mmio_rsp"]
        r = self.regmap.at(addr)
        if r is None:
            return rsp.pack(0, 1)
        if write:
            if r.access == "RO":
                return rsp.pack(0, 1)
            v = wdata & r.mask
            if r.name == "SQ_ENTRIES":
                if not (wdata == 0 or (wdata & (wdata - 1) == 0 and wdata <= MAX_SQ_ENTRIES)):
                    return rsp.pack(0, 1)
            if r.queue is None:
                if r.name == "INT_STATUS":
                    self._int_status &= ~v
                elif r.name == "INT_ENABLE":
                    self._int_enable = v
                elif r.name in ("QWIN_BASE", "QWIN_LIMIT"):
                    if v % QWIN_ALIGN or any(s.ctrl & CTRL_ENABLE for s in self._q):
                        return rsp.pack(0, 1)
                    setattr(self, "_" + r.name.lower(), v)
            else:
                if r.name in _PLACED:
                    s = self._q[r.queue]
                    vals = {n: getattr(s, _ATTR.get(n, n.lower())) for n in _PLACED}
                    vals[r.name] = v
                    if not placement_ok(self.layout, vals["SQ_BASE"], vals["SQ_ENTRIES"], vals["CQ_BASE"],
                                        vals["WIN_BASE"], vals["WIN_LIMIT"], vals["CTRL"] & CTRL_ENABLE,
                                        self._qwin_base, self._qwin_limit):
                        return rsp.pack(0, 1)
                setattr(self._q[r.queue], _ATTR.get(r.name, r.name.lower()), v)
            return rsp.pack(0, 0)
        if r.access == "WO":
            return rsp.pack(0, 1)
        if r.queue is None:
            v = {"INT_STATUS": self._int_status, "INT_ENABLE": self._int_enable, "QWIN_BASE": self._qwin_base,
                 "QWIN_LIMIT": self._qwin_limit, "HMEM_REJECTS": self._rejects}.get(r.name, r.reset)
        else:
            v = getattr(self._q[r.queue], _ATTR.get(r.name, r.name.lower()))
        return rsp.pack(v, 0)

    # ---- host address filter -----------------------------------------------------------------------------

    def _host_ok(self, line, pasid):
        if self._filter is None:          # the registers are final once the MMIO stream is applied
            self._filter = FilterModel([(s.sq_base, s.entries, s.cq_base, s.pasid, s.ctrl & CTRL_ENABLE)
                                        for s in self._q], self._qwin_base, self._qwin_limit, self.layout)
            # FilterModel.ok per memory line, tabulated once: a line overlaps [a_lo, a_hi) (a_lo < a_hi) iff
            # a_lo // 64 <= line <= (a_hi - 1) // 64 (only lines of the memory are ever asked)
            owners = {}
            for a_lo, a_hi, p in self._filter.areas:
                if a_lo < a_hi:
                    for ln in range(a_lo // LINE_BYTES, min((a_hi - 1) // LINE_BYTES + 1, self.depth)):
                        owners.setdefault(ln, []).append(p)
            qb, ql = self._filter.qwin
            self._owners = owners
            self._qwin_lines = (qb // LINE_BYTES, (ql - 1) // LINE_BYTES) if qb < ql else (1, 0)
        owners = self._owners.get(line)
        if owners is not None:
            return pasid in owners
        return not self._qwin_lines[0] <= line <= self._qwin_lines[1]

    # ---- queue engine ------------------------------------------------------------------------------------

    @staticmethod
    def _enabled(s):
        return bool(s.ctrl & CTRL_ENABLE) and s.entries != 0

    def _slot_line(self, s):
        a = self.layout.slot_addr(s.sq_base, s.entries, s.head)
        self._check_range(a, LINE_BYTES, "submission slot")
        return self.memory[a:a + LINE_BYTES]

    def _ready(self, q):
        s = self._q[q]
        if not self._enabled(s) or s.head == s.tail:
            return False
        line = self._slot_line(s)
        return int.from_bytes(line[VALID_OFFSET:VALID_OFFSET + 8], "little") == valid_word(s.head)

    def _stuck_text(self):
        parts = []
        for q, s in enumerate(self._q):
            if self._enabled(s) and s.head != s.tail:
                parts.append(f"q{q}: HEAD {s.head}, tail {s.tail}, slot not valid")
        return "; ".join(parts) or "no queue has rung work"

    def _drain(self, until):
        """Execute descriptors until ``self._count >= until`` (None: until nothing is executable)."""
        while until is None or self._count < until:
            if self._order is not None:
                if self._order_pos >= len(self._order):
                    return
                q, index = self._order[self._order_pos]
                if not 0 <= q < self.num_queues:
                    raise GoldenOrderError(f"forced order names queue {q}")
                s = self._q[q]
                if not self._ready(q):
                    return
                if s.head != index:
                    raise GoldenOrderError(f"forced order: q{q}#{index} at position {self._order_pos}, but the "
                                           f"queue's HEAD is {s.head}")
                self._order_pos += 1
                self._execute(q)
                continue
            for k in range(self.num_queues):
                q = (self._rr + k) % self.num_queues
                if self._ready(q):
                    self._rr = (q + 1) % self.num_queues
                    self._execute(q)
                    break
            else:
                return

    def _check_range(self, a, n, what):
        if a < 0 or a + n > self.memory_bytes or a % LINE_BYTES:
            raise ValueError(f"{what} at byte {a:#x} (+{n}) is misaligned or outside the "
                             f"{self.memory_bytes}-byte device memory (undefined in the RTL)")

    def _execute(self, q):
        cfg, lay = self.config, self.layout
        s = self._q[q]
        index = s.head
        line = self._slot_line(s)
        raw = int.from_bytes(line[DESC_OFFSET:DESC_OFFSET + DESC_BYTES], "little") & _DESC_MASK
        desc = decode_descriptor(raw)
        returned = b""
        if not line_window_ok(desc.base_addr, desc.operand_bytes, s.win_base, s.win_limit, desc.has_operand):
            status = WINDOW_VIOLATION
        else:
            verdict = desc.validate(cfg)
            inp = None
            if verdict == ErrorCode.OK and desc.has_input and not desc.chain:
                # the x stream as the GPU wrote it: a READ_COMPUTE's rows padded to whole beats
                a = lay.input_addr(s.sq_base, s.entries, index)
                n = min(desc.input_beats(cfg.lanes) * 2 * cfg.lanes if desc.type == DescType.READ_COMPUTE
                        else desc.input_bytes, lay.input_bytes)
                self._check_range(a, -(-n // LINE_BYTES) * LINE_BYTES, "input area")
                inp = np.frombuffer(bytes(self.memory[a:a + n]), dtype="<u2").astype(np.uint16)
                if desc.type == DescType.READ_COMPUTE:
                    w = -(-desc.input_dim1 // cfg.lanes) * cfg.lanes
                    inp = inp.reshape(desc.input_dim0, w)[:, :desc.input_dim1].reshape(-1)
            try:
                cpl = self.core.step(desc, inp, owner_of(q, s.pasid))
            except ValueError as e:   # an accepted operand past the test memory (the window reaches past it)
                raise ValueError(f"q{q}#{index}: {e} (a window beyond the device memory is undefined)") from e
            status = cpl.status.value
            if cpl.status == ErrorCode.OK and desc.has_operand:
                first = desc.base_addr // LINE_BYTES
                end = -(-(desc.base_addr + desc.operand_bytes) // LINE_BYTES)
                self._accesses.append(Access(q, index, first, end, desc.type == DescType.STORE))
            res = np.asarray(cpl.result, np.uint16)
            if res.size:
                lanes = cfg.lanes
                nb = -(-res.size // lanes)
                padded = np.zeros(nb * lanes, np.uint16)
                padded[:res.size] = res
                returned = padded.astype("<u2").tobytes()
        if returned:
            a = lay.result_addr(s.cq_base, s.entries, index)
            n = -(-len(returned) // LINE_BYTES) * LINE_BYTES
            self._check_range(a, n, "result area")
            self.memory[a:a + n] = returned + bytes(n - len(returned))
        header = bytearray(CPL_HEADER_BYTES)
        header[CPL_SEQ_OFFSET:CPL_SEQ_OFFSET + 8] = index.to_bytes(8, "little")
        header[CPL_STATUS_OFFSET:CPL_STATUS_OFFSET + 4] = status.to_bytes(4, "little")
        header[CPL_RESULT_BYTES_OFFSET:CPL_RESULT_BYTES_OFFSET + 8] = len(returned).to_bytes(8, "little")
        header[CPL_FLAG_OFFSET:CPL_FLAG_OFFSET + 8] = completion_flag(index).to_bytes(8, "little")
        a = lay.cpl_addr(s.cq_base, s.entries, index)
        self._check_range(a, CPL_HEADER_BYTES, "completion record")
        self.memory[a:a + CPL_HEADER_BYTES] = header
        s.head = (s.head + 1) & _MASK32
        if status != 0:
            s.errors = (s.errors + 1) & _MASK32
        self._int_status |= 1 << q
        self._count += 1
        self._events.append(Event(q, index, status))
