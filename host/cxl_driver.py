"""Scripted host (GPU) driver of the CXL NDP device: builds the device's input streams, runs them on the RTL
(``sim.cxl.system.CXLSystem`` on a simulation backend) or on the golden model
(:class:`sim.golden.cxl_device.GoldenDevice`), and decodes the outputs into completion records and data.

[PLoRA] IV-C: the GPU writes operand and descriptor into an HDM
submission queue over CXL.mem, writes a per-descriptor valid flag last, then rings a CXL.io MMIO doorbell; the
device writes the result and then a completion flag. Every offset comes from :mod:`hdl.cxl.regmap`.

A simulated GPU cannot branch on what it reads, so the driver builds *scripts*: the ``mmio`` stream (CXL.io
register accesses, one response each) and the ``hmem`` stream (CXL.mem 64-byte line reads/writes, served in
order; a request with ``after = n`` is held until the device has written ``n`` completion records, counted over
all queues -- the scripted form of "poll the completion flag"). The two streams are **not** ordered with respect
to each other (neither are CXL.io and CXL.mem): MMIO requests run at full rate from the first cycle, so
doorbells normally arrive *before* the descriptors they announce ("early"; the valid word orders), unless the run
delays the MMIO stream (``mmio_delay``, which makes every doorbell late).

``after`` is computed by the driver (``after=None``, the default for :meth:`Driver.read`,
:meth:`Driver.read_completion`, :meth:`Driver.store` and slot re-use in :meth:`Driver.submit`) as a *barrier*:
the number of submissions whose valid word precedes the request in the hmem stream and that some doorbell of the
script covers. Only those can complete before the request is served, so when the count reaches that number all of
them have completed. Barriers are resolved in :meth:`Driver.streams`, after the whole script is known.

Typical use::

    drv = Driver(RegisterMap(2), QueueLayout.for_config(cfg), config=cfg, depth=1024)
    drv.configure(0, sq_base=0, entries=4, cq_base=0x4000, win_base=0x8000, win_limit=0x10000)
    drv.store(0x8000, a_bits)                           # operand into the window
    s = drv.submit(0, gemv(0x8000, 16, 24), x_bits)     # input, descriptor, valid word, doorbell
    h = drv.read_completion(0, s.index)                 # gated read of the record (header + result area)
    run = drv.run(get_backend("verilator"))             # or drv.run("golden")
    rec = run.completion(h); rec.status, rec.result_bits(24)

:meth:`Driver.check` runs the RTL, then the golden model in the RTL's execution order, and compares everything.
"""

from dataclasses import dataclass, field

import numpy as np

from hdl.cxl.regmap import (PASID_BITS, DEFAULT_DATA_PASID, queue_pasid, QWIN_ALIGN,
                            RegisterMap, QueueLayout, valid_word, completion_flag, CTRL_ENABLE, CTRL_IRQ_ENABLE,
                            COUNTER_BITS, MAX_SQ_ENTRIES, DESC_OFFSET, DESC_BYTES, VALID_OFFSET, CPL_SEQ_OFFSET,
                            CPL_STATUS_OFFSET, CPL_RESULT_BYTES_OFFSET, CPL_FLAG_OFFSET, CPL_HEADER_BYTES)
from hdl.ndp.config import NDPConfig
from firmware.ndp.descriptor import Descriptor
from hdl.ndp.descriptor import DescType
from sim.golden.cxl_device import (LINE_BYTES, WINDOW_VIOLATION, AFTER_BITS, DYNAMIC_REGISTERS, Fields,
                                   port_fields, default_mem_addr_bits, Event, GoldenDevice, GoldenRun,
                                   status_name, encode_descriptor)

__all__ = ["Driver", "Submission", "ReadHandle", "CompletionHandle", "CompletionRecord", "MmioResponse",
           "DeviceRun", "compare_runs", "system_for", "MEMORIES", "backend_named", "WINDOW_VIOLATION", "LINE_BYTES",
           "status_name"]

_MASK32 = (1 << COUNTER_BITS) - 1
_OUT_PORTS = ("mmio_rsp", "hmem_rsp", "events", "core_req")


def _to_bytes(data, what) -> bytes:
    """bytes / bytearray as is; numpy arrays (uint16 FP16 bits or float16, any shape) little-endian."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    arr = np.asarray(data)
    if arr.dtype == np.float16:
        arr = arr.view(np.uint16)
    if arr.dtype.kind not in "ui" or arr.size and (arr.min() < 0 or arr.max() > 0xFFFF):
        raise ValueError(f"{what}: expected bytes or FP16 bit patterns (uint16), got dtype {arr.dtype}")
    return arr.astype("<u2").reshape(-1).tobytes()


def _padded_rows(data, desc, lanes):
    """A READ_COMPUTE's GPU input as the core's ``x`` stream takes it: each of the ``input_dim0`` rows padded
    with zeros to whole beats of ``lanes`` elements (uint16 1-D). Inputs of another size pass unchanged (a
    script may write anything into an input area)."""
    arr = np.asarray(data)
    if arr.dtype == np.float16:
        arr = arr.view(np.uint16)
    rows, cols = desc.input_dim0, desc.input_dim1
    if arr.size != rows * cols or cols % lanes == 0:
        return arr
    w = -(-cols // lanes) * lanes
    out = np.zeros((rows, w), np.uint16)
    out[:, :cols] = arr.reshape(rows, cols)
    return out.reshape(-1)


def _lines(raw: bytes) -> list:
    """``raw`` zero-padded to whole 64-byte lines, as 512-bit little-endian ints."""
    n = -(-len(raw) // LINE_BYTES)
    raw = raw + bytes(n * LINE_BYTES - len(raw))
    return [int.from_bytes(raw[i * LINE_BYTES:(i + 1) * LINE_BYTES], "little") for i in range(n)]


def _aligned(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 or v % LINE_BYTES:
        raise ValueError(f"{name} must be a non-negative multiple of {LINE_BYTES}, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class Submission:
    """A submitted descriptor: queue, free-running index, the descriptor (or raw int) and its input bytes."""
    queue: int
    index: int
    descriptor: object
    input: bytes | None = field(repr=False)
    valid_pos: int = field(repr=False)      # position of the valid-word write in the hmem stream


@dataclass(frozen=True)
class ReadHandle:
    """A gated read of ``n_bytes`` at byte ``addr`` (``lines`` hmem reads, responses from ``first``)."""
    id: int
    addr: int
    n_bytes: int
    lines: int
    first: int


@dataclass(frozen=True)
class CompletionHandle(ReadHandle):
    """A read of completion record ``index`` of ``queue`` (header line + ``lines - 1`` lines of result area)."""
    queue: int = 0
    index: int = 0


@dataclass(frozen=True)
class CompletionRecord:
    """A decoded completion record. ``done``: the flag equals ``completion_flag(index)`` (the record is the one
    the read waited for); ``result``: the first ``result_bytes`` bytes of the result area that were read."""
    queue: int
    index: int
    seq: int
    status: int
    result_bytes: int
    flag: int
    result: bytes = field(repr=False)

    @property
    def done(self) -> bool:
        return self.flag == completion_flag(self.index)

    @property
    def ok(self) -> bool:
        return self.done and self.status == 0

    @property
    def status_name(self) -> str:
        return status_name(self.status)

    def result_bits(self, n: int | None = None) -> np.ndarray:
        """The result as FP16 bits (uint16), the first ``n`` elements (all ``result_bytes / 2`` if None)."""
        arr = np.frombuffer(self.result, dtype="<u2").astype(np.uint16)
        return arr if n is None else arr[:n]

    @classmethod
    def from_bytes(cls, queue, index, raw: bytes) -> "CompletionRecord":
        """Decode a record from its bytes (header line first, then whatever of the result area was read)."""
        u = lambda off, n: int.from_bytes(raw[off:off + n], "little")  # noqa: E731
        rb = u(CPL_RESULT_BYTES_OFFSET, 8)
        return cls(queue, index, u(CPL_SEQ_OFFSET, 8), u(CPL_STATUS_OFFSET, 4), rb, u(CPL_FLAG_OFFSET, 8),
                   bytes(raw[CPL_HEADER_BYTES:CPL_HEADER_BYTES + rb]))


@dataclass(frozen=True)
class MmioResponse:
    """One MMIO response, with the register access it answers (``register`` None: unmapped address)."""
    rdata: int
    err: int
    write: bool
    addr: int
    register: str | None

    @property
    def dynamic(self) -> bool:
        """A read whose value depends on device progress (HEAD, ERRORS, INT_STATUS)."""
        return not self.write and self.register is not None and self.register.split(".")[-1] in DYNAMIC_REGISTERS


@dataclass
class DeviceRun:
    """The decoded outputs of one run. ``memory`` (final device memory) and ``golden`` only for the golden
    model; ``cycles``/``wall_seconds`` and ``core_req`` (``(queue, burst addr, write)``) only for the RTL."""
    backend: str
    mmio: list
    reads: list
    events: list
    read_err: list = field(default_factory=list)   # per handle: True if the filter rejected any of its lines
    core_req: list | None = None
    cycles: int | None = None
    wall_seconds: float | None = None
    memory: bytearray | None = field(default=None, repr=False)
    golden: GoldenRun | None = field(default=None, repr=False)
    handles: list = field(default_factory=list, repr=False)
    #: RTL on a system with DRAM channels (``collect_all()``, e.g. ``CXLDeviceMemSystem``): the collected
    #: ``trace{c}`` / ``errors{c}`` payloads; ``channel_problems``: their timing violations and DRAM model reports
    #: (``system.channel_problems``; empty: every channel clean). None on the burst memory and the golden model.
    channels: dict | None = field(default=None, repr=False)
    channel_problems: list | None = None

    def data(self, handle: ReadHandle) -> bytes:
        """The bytes a read returned (zeros for lines the address filter rejected)."""
        return self.reads[handle.id]

    def rejected(self, handle: ReadHandle) -> bool:
        """True if the device's address filter rejected (some line of) this read: ``hmem_rsp.err``."""
        return self.read_err[handle.id]

    def bits(self, handle: ReadHandle) -> np.ndarray:
        return np.frombuffer(self.data(handle), dtype="<u2").astype(np.uint16)

    def completion(self, handle: CompletionHandle) -> CompletionRecord:
        if not isinstance(handle, CompletionHandle):
            raise ValueError(f"not a completion handle: {handle!r}")
        return CompletionRecord.from_bytes(handle.queue, handle.index, self.data(handle))

    def events_by_queue(self) -> dict:
        out = {}
        for e in self.events:
            out.setdefault(e.queue, []).append((e.index, e.status))
        return out


def compare_runs(a: DeviceRun, b: DeviceRun, *, events: str = "per-queue", mmio: bool = True) -> list:
    """Differences between two runs of the same script (empty list: equal). Reads must be bit-identical;
    ``events``: ``"exact"`` (same order), ``"per-queue"`` (each queue's sequence equal, interleaving free);
    ``mmio``: responses equal (read data of :data:`DYNAMIC_REGISTERS` excepted)."""
    out = []
    if len(a.reads) != len(b.reads):
        out.append(f"{len(a.reads)} vs {len(b.reads)} reads")
    if a.read_err != b.read_err:
        k = next((i for i, (x, y) in enumerate(zip(a.read_err, b.read_err)) if x != y), None)
        k = k or 0
        out.append(f"read errors differ (first at read {k}): {a.backend} {a.read_err[k:k + 4]} "
                   f"vs {b.backend} {b.read_err[k:k + 4]}")
    for h in a.handles:
        da, db = a.reads[h.id], b.reads[h.id]
        if da != db:
            diff = next(i for i in range(len(da)) if da[i] != db[i])
            what = (f"completion q{h.queue}#{h.index}" if isinstance(h, CompletionHandle)
                    else f"read [{h.addr:#x}, +{h.n_bytes})")
            out.append(f"{what}: first difference at byte {diff} (addr {h.addr + diff:#x}): "
                       f"{a.backend} {da[diff]:#04x} vs {b.backend} {db[diff]:#04x}")
    if events == "exact":
        if a.events != b.events:
            out.append(f"events differ: {a.backend} {a.events[:8]}... vs {b.backend} {b.events[:8]}...")
    elif events == "per-queue":
        ea, eb = a.events_by_queue(), b.events_by_queue()
        for q in sorted(set(ea) | set(eb)):
            if ea.get(q, []) != eb.get(q, []):
                out.append(f"q{q} events differ: {a.backend} {ea.get(q, [])} vs {b.backend} {eb.get(q, [])}")
    if mmio:
        if len(a.mmio) != len(b.mmio):
            out.append(f"{len(a.mmio)} vs {len(b.mmio)} MMIO responses")
        for k, (x, y) in enumerate(zip(a.mmio, b.mmio)):
            if x.err != y.err or (not x.dynamic and x.rdata != y.rdata):
                out.append(f"MMIO response {k} ({x.register or hex(x.addr)}, {'write' if x.write else 'read'}): "
                           f"{a.backend} ({x.rdata:#x}, err {x.err}) vs {b.backend} ({y.rdata:#x}, err {y.err})")
    return out


_SYSTEMS = {}
_BACKENDS = {}


def backend_named(name: str):
    """One backend object per name and process (a Verilator backend keeps its executables per object, so
    reusing it skips regenerating the Verilog of a system it has already run)."""
    be = _BACKENDS.get(name)
    if be is None:
        from sim.backends import get_backend
        be = _BACKENDS[name] = get_backend(name)
    return be


#: The device memories :func:`system_for` builds the device on.
MEMORIES = ("burst", "lpddr5x")


def _check_memory(memory, channels):
    if memory not in MEMORIES:
        raise ValueError(f"memory must be one of {', '.join(MEMORIES)}, got {memory!r}")
    if memory == "lpddr5x" and (isinstance(channels, bool) or not isinstance(channels, int) or channels < 1
                                or channels & (channels - 1) or channels > 64):
        raise ValueError(f"channels must be a power of two in 1..64, got {channels!r}")


def system_for(config: NDPConfig, num_queues: int, depth: int, latency: int = 8, *, memory: str = "burst",
               channels: int = 2, hierarchical: bool = True):
    """One device test top per parameter set (so a backend elaborates / builds it once per process).

    ``memory``: ``"burst"`` (default): ``sim.cxl.system.CXLSystem``, the device on a fixed-latency memory of
    ``depth`` 64-byte lines (``latency`` cycles); ``"lpddr5x"``: ``sim.cxl.devmem_system.CXLDeviceMemSystem``,
    the device on ``channels`` LPDDR5X-8533 channels (controllers + DRAM models, sized to hold ``depth`` lines;
    ``latency`` unused; ``hierarchical``: one channel and one DRAM-model module instantiated per channel, as
    Verilator builds it quickest, or flat, as Amaranth's simulator needs it). Both take the same driver scripts."""
    _check_memory(memory, channels)
    key = ((config, num_queues, depth, latency) if memory == "burst"
           else (config, num_queues, depth, memory, channels, hierarchical))
    sys_ = _SYSTEMS.get(key)
    if sys_ is None:
        if memory == "burst":
            from sim.cxl.system import CXLSystem
            sys_ = CXLSystem(config=config, num_queues=num_queues, depth=depth, latency=latency)
        else:
            from sim.cxl.devmem_system import CXLDeviceMemSystem
            sys_ = CXLDeviceMemSystem(config=config, num_queues=num_queues, depth=depth, channels=channels,
                                      hierarchical=hierarchical)
        _SYSTEMS[key] = sys_
    return sys_


def _system_fields(system) -> dict:
    out = {}
    for name in ("mmio", "mmio_rsp", "hmem", "hmem_rsp", "events", "core_req"):
        member = system.signature.members.get(name)
        if member is None:
            continue
        out[name] = Fields.from_layout(member.signature.members["payload"].shape)
    return out


class _QueueState:
    def __init__(self):
        self.configured = False
        self.sq_base = self.entries = self.cq_base = self.win_base = self.win_limit = self.pasid = 0
        self.submitted = 0       # next free-running index
        self.tail = 0            # last doorbell value written by the script


class Driver:
    """Builds the scripted ``mmio``/``hmem`` streams for a device of ``regmap.num_queues`` queues (``regmap`` may
    also be the number of queues), queue ``layout`` (default ``QueueLayout.for_config(config)``) and an NDP core
    ``config``, on a device memory of ``depth`` 64-byte bursts (``mem_addr_bits``: its burst-address width).
    ``memory`` / ``channels``: the RTL system :meth:`run` uses by default (:meth:`system`, :func:`system_for`):
    ``"burst"`` (the fixed-latency memory, ``latency`` cycles) or ``"lpddr5x"`` (``channels`` LPDDR5X channels).

    Every method validates its arguments (ValueError). Handles returned by :meth:`read`, :meth:`read_completion`
    and :meth:`mmio_read` index the decoded outputs of :meth:`run`.
    """

    def __init__(self, regmap, layout: QueueLayout | None = None, *, config: NDPConfig, depth: int = 1024,
                 mem_addr_bits: int | None = None, latency: int = 8, memory: str = "burst", channels: int = 2):
        if isinstance(regmap, int) and not isinstance(regmap, bool):
            regmap = RegisterMap(regmap)
        if not isinstance(regmap, RegisterMap):
            raise ValueError(f"regmap must be a RegisterMap (or a queue count), got {regmap!r}")
        if not isinstance(config, NDPConfig):
            raise ValueError(f"config must be an NDPConfig, got {config!r}")
        layout = QueueLayout.for_config(config) if layout is None else layout
        if not isinstance(layout, QueueLayout):
            raise ValueError(f"layout must be a QueueLayout, got {layout!r}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive int (64-byte bursts), got {depth!r}")
        _check_memory(memory, channels)
        self.regmap, self.layout, self.config, self.depth, self.latency = regmap, layout, config, depth, latency
        self.memory, self.channels = memory, channels
        self.memory_bytes = depth * LINE_BYTES
        self.mem_addr_bits = default_mem_addr_bits(depth) if mem_addr_bits is None else mem_addr_bits
        self.num_queues = regmap.num_queues
        self._q = [_QueueState() for _ in range(self.num_queues)]
        self._mmio = []          # (addr, write, wdata, register full name or None)
        self._hmem = []          # [burst addr, write, wdata int, after int | None (barrier), pasid, mmio_after]
        self._fence = 0          # MMIO responses every new hmem request waits for (mmio_after)
        self.qwin = None         # (base, limit) once set_queue_window() programmed it
        self._handles = []       # ReadHandle / CompletionHandle, by id
        self._subs = []          # Submission, in script order
        self._reads = 0          # hmem reads so far (response index)
        self._areas = []         # (sq first, sq end, cq first, cq end, pasid) of the configured queues (_line_pasid)

    # ---- low level ---------------------------------------------------------------------------------------

    def _reg_addr(self, name, queue):
        if isinstance(name, int):
            return name, (self.regmap.at(name).full_name if self.regmap.at(name) else None)
        r = self.regmap.reg(name, queue)
        return r.offset, r.full_name

    def mmio_write(self, name, value: int, queue: int | None = None) -> int:
        """Write ``value`` to register ``name`` (of ``queue``), or to byte address ``name`` if an int (for
        error cases). Returns the index of its response."""
        addr, reg = self._reg_addr(name, queue)
        if not 0 <= addr < (1 << self.regmap.addr_bits):
            raise ValueError(f"MMIO address {addr:#x} does not fit {self.regmap.addr_bits} bits")
        if not 0 <= int(value) < 1 << 64:
            raise ValueError(f"MMIO value {value!r} does not fit 64 bits")
        self._mmio.append((addr, 1, int(value), reg))
        return len(self._mmio) - 1

    def mmio_read(self, name, queue: int | None = None) -> int:
        """Read register ``name`` (or byte address); returns the index of its response in ``run.mmio``.
        HEAD / ERRORS / INT_STATUS reads are racy (the MMIO stream does not wait for the device)."""
        addr, reg = self._reg_addr(name, queue)
        if not 0 <= addr < (1 << self.regmap.addr_bits):
            raise ValueError(f"MMIO address {addr:#x} does not fit {self.regmap.addr_bits} bits")
        self._mmio.append((addr, 0, 0, reg))
        return len(self._mmio) - 1

    def _check_after(self, after):
        if after is not None and (isinstance(after, bool) or not isinstance(after, int)
                                  or not 0 <= after < 1 << AFTER_BITS):
            raise ValueError(f"after must be None (barrier) or an int in 0..{(1 << AFTER_BITS) - 1}, got {after!r}")

    def _check_mem(self, addr, n, what):
        if addr + n > self.memory_bytes:
            raise ValueError(f"{what} [{addr:#x}, {addr + n:#x}) is beyond the {self.memory_bytes}-byte device "
                             f"memory")

    def _check_pasid(self, pasid):
        if pasid is not None and (isinstance(pasid, bool) or not isinstance(pasid, int)
                                  or not 0 <= pasid < 1 << PASID_BITS):
            raise ValueError(f"pasid must be None or an int in 0..{(1 << PASID_BITS) - 1}, got {pasid!r}")

    def _line_pasid(self, line):
        """Default PASID of a plain access to ``line``: that of the configured queue whose ring or completion area
        holds it, else :data:`DEFAULT_DATA_PASID`."""
        a = line * LINE_BYTES
        for sq_lo, sq_hi, cq_lo, cq_hi, pasid in self._areas:     # configured queues, in queue order
            if sq_lo <= a < sq_hi or cq_lo <= a < cq_hi:
                return pasid
        return DEFAULT_DATA_PASID

    def _update_areas(self):
        lay = self.layout
        self._areas = [(s.sq_base, s.sq_base + lay.sq_bytes(s.entries), s.cq_base, s.cq_base + lay.cq_bytes(s.entries),
                        s.pasid) for s in self._q if s.configured]

    def _op(self, line, write, wdata, after, pasid):
        self._hmem.append([line, write, wdata, after, self._line_pasid(line) if pasid is None else pasid,
                           self._fence])

    def store(self, addr: int, data, *, after: int | None = None, pasid: int | None = None) -> None:
        """Write ``data`` (bytes, or FP16 bits) at 64-byte aligned byte ``addr`` as whole lines (the last one
        zero-padded: there is no byte mask). ``after``: completions to wait for (None: barrier). ``pasid``: the
        requester ID the accesses carry (None: the PASID of the configured queue whose ring or completion area
        holds the line, else ``DEFAULT_DATA_PASID`` = 0)."""
        addr = _aligned("store addr", addr)
        self._check_after(after)
        self._check_pasid(pasid)
        raw = _to_bytes(data, "store data")
        self._check_mem(addr, len(raw), "store")
        for k, w in enumerate(_lines(raw)):
            self._op(addr // LINE_BYTES + k, 1, w, after, pasid)

    def read(self, addr: int, n_bytes: int, *, after: int | None = None, pasid: int | None = None) -> ReadHandle:
        """Read ``n_bytes`` at aligned ``addr`` (whole lines) once ``after`` completions are written (None:
        barrier: every submission made so far and covered by a doorbell of the script has completed).
        ``pasid`` as in :meth:`store`."""
        return self._read(addr, n_bytes, after, ReadHandle, {}, pasid)

    def _read(self, addr, n_bytes, after, cls, extra, pasid=None):
        addr = _aligned("read addr", addr)
        if isinstance(n_bytes, bool) or not isinstance(n_bytes, int) or n_bytes < 1:
            raise ValueError(f"n_bytes must be a positive int, got {n_bytes!r}")
        self._check_after(after)
        self._check_pasid(pasid)
        self._check_mem(addr, n_bytes, "read")
        lines = -(-n_bytes // LINE_BYTES)
        h = cls(len(self._handles), addr, n_bytes, lines, self._reads, **extra)
        for k in range(lines):
            self._op(addr // LINE_BYTES + k, 0, 0, after, pasid)
        self._reads += lines
        self._handles.append(h)
        return h

    # ---- queues ------------------------------------------------------------------------------------------

    def _queue(self, q):
        if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q < self.num_queues:
            raise ValueError(f"queue must be an int in 0..{self.num_queues - 1}, got {q!r}")
        return self._q[q]

    def configure(self, q: int, sq_base: int, entries: int, cq_base: int, win_base: int, win_limit: int,
                  pasid: int | None = None, irq: bool = False, fence: bool | None = None) -> None:
        """Program queue ``q`` (MMIO writes: SQ_BASE, SQ_ENTRIES, CQ_BASE, WIN_BASE, WIN_LIMIT, PASID, then CTRL
        enable last). The ring (``entries`` slots at ``sq_base``) and the completion area (at ``cq_base``) must
        be 64-byte aligned and inside the device memory. Reconfiguring a queue that has work is racy.
        ``pasid``: the PASID the queue is bound to (None: :func:`hdl.cxl.regmap.queue_pasid` = q + 1); the
        driver's later accesses to the queue's ring and completion area carry it by default. ``fence``: make every
        later hmem request wait until these MMIO writes are answered (:meth:`fence`; None: only once a queue window
        is programmed, when an early ring write would be rejected). The device may refuse the configuration (queue
        window rules, ``docs/cxl_isolation.md``); the driver does not check that: see the MMIO responses."""
        s = self._queue(q)
        pasid = queue_pasid(q) if pasid is None else pasid
        self._check_pasid(pasid)
        sq_base, cq_base = _aligned("sq_base", sq_base), _aligned("cq_base", cq_base)
        if isinstance(entries, bool) or not isinstance(entries, int) or entries < 1 or entries & (entries - 1) \
                or entries > MAX_SQ_ENTRIES:
            raise ValueError(f"entries must be a power of two in 1..{MAX_SQ_ENTRIES}, got {entries!r}")
        for name, v in (("win_base", win_base), ("win_limit", win_limit)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
                raise ValueError(f"{name} must be a 64-bit unsigned int, got {v!r}")
        self._check_mem(sq_base, self.layout.sq_bytes(entries), f"q{q} submission ring")
        self._check_mem(cq_base, self.layout.cq_bytes(entries), f"q{q} completion area")
        if s.configured and s.submitted:
            raise ValueError(f"queue {q} already has submissions; reconfiguring it is racy in a script")
        for name, v in (("SQ_BASE", sq_base), ("SQ_ENTRIES", entries), ("CQ_BASE", cq_base),
                        ("WIN_BASE", win_base), ("WIN_LIMIT", win_limit), ("PASID", pasid)):
            self.mmio_write(name, v, q)
        self.mmio_write("CTRL", CTRL_ENABLE | (CTRL_IRQ_ENABLE if irq else 0), q)
        s.configured = True
        s.sq_base, s.entries, s.cq_base, s.win_base, s.win_limit = sq_base, entries, cq_base, win_base, win_limit
        s.pasid = pasid
        self._update_areas()
        if fence or (fence is None and self.qwin is not None and self.qwin[1] > self.qwin[0]):
            self.fence()

    def fence(self) -> None:
        """Every hmem request recorded from now on waits until every MMIO request recorded so far has been
        answered (``mmio_after``; the scripted form of a host that reads a register back to flush its posted MMIO
        writes before it touches the queues). The golden model applies all MMIO first anyway."""
        self._fence = len(self._mmio)
        if self._fence >= 1 << AFTER_BITS:
            raise ValueError(f"{self._fence} MMIO requests do not fit mmio_after ({AFTER_BITS} bits)")

    def set_queue_window(self, base: int, limit: int) -> None:
        """Program the reserved HDM queue window ``[base, limit)`` (QWIN_BASE, QWIN_LIMIT; multiples of 64; before
        any queue is enabled, or the device refuses it). Afterwards :meth:`configure` fences by default."""
        for name, v in (("base", base), ("limit", limit)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64 or v % QWIN_ALIGN:
                raise ValueError(f"queue window {name} must be a 64-bit multiple of {QWIN_ALIGN}, got {v!r}")
        self.mmio_write("QWIN_BASE", base)
        self.mmio_write("QWIN_LIMIT", limit)
        self.qwin = (base, limit)

    def ring(self, q: int, tail: int | None = None) -> None:
        """Write queue ``q``'s DOORBELL: ``tail`` (default: every submission so far)."""
        s = self._queue(q)
        tail = s.submitted if tail is None else tail
        if isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail <= s.submitted:
            raise ValueError(f"tail must be an int in 0..{s.submitted} (submissions of queue {q}), got {tail!r}")
        self.mmio_write("DOORBELL", tail & _MASK32, q)
        s.tail = max(s.tail, tail)

    def submit(self, q: int, descriptor, input_bits=None, *, doorbell: bool = True, early_doorbell: bool = False,
               split_valid: bool = True, after: int | None = None, pasid: int | None = None) -> Submission:
        """Submit ``descriptor`` (a :class:`firmware.ndp.descriptor.Descriptor` or a raw int, bits 0..207) on
        queue ``q`` with GPU input ``input_bits`` (FP16 bits or bytes; None: leave the input area alone).

        hmem writes, in order: the input area (whole lines), the descriptor line with the valid word cleared
        (``split_valid``; the "descriptor first" write), the descriptor line with ``valid_word(index)`` (the
        ordering point). Re-using a ring slot (index >= entries) gates these writes with a barrier (``after``
        None) so the previous lap's descriptor has completed. ``doorbell``: then write DOORBELL = index + 1 (or,
        with ``early_doorbell``, before the hmem writes in script order; the two streams are unordered anyway);
        ``doorbell=False`` leaves it to a later :meth:`ring` (coalescing). ``pasid``: the PASID of these writes
        (None: the queue's; another value forges a requester, whose writes the device's filter drops)."""
        s = self._queue(q)
        if not s.configured:
            raise ValueError(f"queue {q} is not configured")
        self._check_after(after)
        self._check_pasid(pasid)
        pasid = s.pasid if pasid is None else pasid
        if isinstance(descriptor, int) and not isinstance(descriptor, bool):
            if not 0 <= descriptor < 1 << (8 * DESC_BYTES):
                raise ValueError(f"a raw descriptor must fit {8 * DESC_BYTES} bits")
            raw = descriptor
        else:
            if not isinstance(descriptor, Descriptor):
                raise ValueError(f"descriptor must be a Descriptor or an int, got {descriptor!r}")
            raw = encode_descriptor(descriptor)
        if input_bits is not None and isinstance(descriptor, Descriptor) and not isinstance(
                input_bits, (bytes, bytearray, memoryview)) and descriptor.type == DescType.READ_COMPUTE:
            input_bits = _padded_rows(input_bits, descriptor, self.config.lanes)
        inp = None if input_bits is None else _to_bytes(input_bits, "input_bits")
        if inp is not None and len(inp) > self.layout.input_bytes:
            raise ValueError(f"input of {len(inp)} bytes does not fit the {self.layout.input_bytes}-byte input "
                             f"area")
        index = s.submitted
        if index - s.tail >= 1 << COUNTER_BITS:
            raise ValueError("too many submissions")
        if early_doorbell and doorbell:
            self.mmio_write("DOORBELL", (index + 1) & _MASK32, q)
            s.tail = max(s.tail, index + 1)
        gate = after if after is not None else (None if index >= s.entries else 0)
        lay = self.layout
        if inp is not None:
            a = lay.input_addr(s.sq_base, s.entries, index)
            for k, w in enumerate(_lines(inp)):
                self._op(a // LINE_BYTES + k, 1, w, gate, pasid)
        slot = lay.slot_addr(s.sq_base, s.entries, index) // LINE_BYTES
        desc_line = (raw & ((1 << (8 * DESC_BYTES)) - 1)) << (8 * DESC_OFFSET)
        if split_valid:
            self._op(slot, 1, desc_line, gate, pasid)
        self._op(slot, 1, desc_line | (valid_word(index) << (8 * VALID_OFFSET)), gate, pasid)
        sub = Submission(q, index, descriptor, inp, len(self._hmem) - 1)
        self._subs.append(sub)
        s.submitted += 1
        if doorbell and not early_doorbell:
            self.ring(q)
        return sub

    def read_completion(self, q: int, index: int, *, after: int | None = None,
                        result_bytes: int | None = None, pasid: int | None = None) -> CompletionHandle:
        """Read completion record ``index`` of queue ``q``: its header line and ``result_bytes`` (default the
        whole result area) of results, gated by ``after`` (None: barrier). ``pasid``: None: the queue's."""
        s = self._queue(q)
        if not s.configured:
            raise ValueError(f"queue {q} is not configured")
        rb = self.layout.result_bytes if result_bytes is None else int(result_bytes)
        if not 0 <= rb <= self.layout.result_bytes:
            raise ValueError(f"result_bytes must be 0..{self.layout.result_bytes}, got {result_bytes!r}")
        addr = self.layout.cpl_addr(s.cq_base, s.entries, index)
        return self._read(addr, CPL_HEADER_BYTES + rb, after, CompletionHandle, {"queue": q, "index": index},
                          s.pasid if pasid is None else pasid)

    # ---- streams -----------------------------------------------------------------------------------------

    @property
    def submissions(self) -> list:
        return list(self._subs)

    def completing(self) -> list:
        """The submissions that will complete: those covered by their queue's last doorbell."""
        return [s for s in self._subs if s.index < self._q[s.queue].tail]

    def _afters(self) -> list:
        """Resolve barriers: for each hmem request, its ``after``."""
        valid = sorted(s.valid_pos for s in self.completing())
        out, k = [], 0
        for pos, op in enumerate(self._hmem):
            while k < len(valid) and valid[k] < pos:
                k += 1
            after = k if op[3] is None else op[3]
            if after >= 1 << AFTER_BITS:
                raise ValueError(f"hmem request {pos}: after = {after} does not fit {AFTER_BITS} bits")
            out.append(after)
        return out

    def streams(self, fields: dict | None = None) -> dict:
        """``{"mmio": [...], "hmem": [...]}``: the packed payloads (``fields`` as :func:`port_fields`)."""
        f = fields or port_fields(self.regmap, self.mem_addr_bits)
        mf, hf = f["mmio"], f["hmem"]
        afters = self._afters()
        # values were range-checked when recorded: pack by plain shifts
        oa, ow, od, oq, op_, om = (hf.offsets[hf.names.index(n)]
                                   for n in ("addr", "write", "wdata", "after", "pasid", "mmio_after"))
        return {"mmio": [mf.pack(a, w, d) for a, w, d, _ in self._mmio],
                "hmem": [(op[0] << oa) | (op[1] << ow) | (op[2] << od) | (after << oq) | (op[4] << op_)
                         | (op[5] << om) for op, after in zip(self._hmem, afters)]}

    def expected(self) -> dict:
        """Output counts of a run: one MMIO response per request, one hmem response per read line, one event
        per completing submission; ``core_req`` is collected whole."""
        return {"mmio_rsp": len(self._mmio), "hmem_rsp": self._reads, "events": len(self.completing()),
                "core_req": None}

    def max_cycles(self) -> int:
        """A generous bound on the cycles a run of this script needs (a run past it is a hang)."""
        words = sum(-(-len(s.input or b"") // LINE_BYTES) for s in self._subs)
        per_desc = 400 + 2 * self.config.dram_buffer_bytes // LINE_BYTES * 4 + \
            8 * (self.layout.input_bytes + self.layout.result_bytes) // LINE_BYTES
        return 20_000 + 40 * (len(self._mmio) + len(self._hmem) + words) + per_desc * len(self._subs)

    # ---- running -----------------------------------------------------------------------------------------

    def _decode(self, backend, outputs, fields, **extra) -> DeviceRun:
        rf, hf, ef = fields["mmio_rsp"], fields["hmem_rsp"], fields["events"]
        mmio = []
        for (addr, write, _, reg), w in zip(self._mmio, outputs.get("mmio_rsp", [])):
            rdata, err = rf.unpack(w)
            mmio.append(MmioResponse(rdata, err, bool(write), addr, reg))
        rsps = [hf.unpack(w) for w in outputs.get("hmem_rsp", [])]
        lines = [r[0].to_bytes(LINE_BYTES, "little") for r in rsps]
        errs = [bool(r[1]) for r in rsps]
        reads = [b"".join(lines[h.first:h.first + h.lines])[:h.n_bytes] for h in self._handles]
        read_err = [any(errs[h.first:h.first + h.lines]) for h in self._handles]
        events = [Event(*ef.unpack(w)) for w in outputs.get("events", [])]
        core_req = None
        if outputs.get("core_req") is not None and "core_req" in fields:
            core_req = [fields["core_req"].unpack(w) for w in outputs["core_req"]]
        return DeviceRun(backend, mmio, reads, events, read_err, core_req=core_req, handles=list(self._handles),
                         **extra)

    def golden(self) -> GoldenDevice:
        return GoldenDevice(config=self.config, num_queues=self.num_queues, depth=self.depth,
                            mem_addr_bits=self.mem_addr_bits, layout=self.layout)

    def run(self, backend, *, system=None, traffic=None, max_cycles: int | None = None, mmio_delay: int = 0,
            order=None) -> DeviceRun:
        """Run the script. ``backend``: ``"golden"`` (or a :class:`GoldenDevice`), ``"amaranth"`` /
        ``"verilator"`` or a :class:`sim.backends.Backend` (the RTL ``CXLSystem``, ``system`` or the cached one
        for this driver's parameters). ``traffic``: a :class:`sim.backends.Traffic` (``events`` and
        ``core_req`` are always kept ready: the device ignores their ``ready``); ``mmio_delay``: hold the whole
        MMIO stream for that many cycles (late doorbells);
        ``order``: for the golden model, the execution order to follow (e.g. an RTL run's ``events``)."""
        if isinstance(backend, str) and backend == "golden" or isinstance(backend, GoldenDevice):
            dev = backend if isinstance(backend, GoldenDevice) else self.golden()
            g = dev.run(self.streams(dev.fields), order=order)
            return self._decode("golden", g.outputs, dev.fields, memory=g.memory, golden=g)
        from sim.backends import Traffic, Backend
        if isinstance(backend, str):
            backend = backend_named(backend)
        if not isinstance(backend, Backend):
            raise ValueError(f"backend must be 'golden', a backend name or a Backend, got {backend!r}")
        system = system or self.system()
        self._check_system(system)
        fields = port_fields(self.regmap, self.mem_addr_bits)
        fields.update(_system_fields(system))
        inputs = self.streams(fields)
        limit = (max_cycles or self.max_cycles()) + mmio_delay
        traffic = traffic or Traffic()
        collect = getattr(system, "collect_all", None)
        chan = dict(collect()) if callable(collect) else {}
        # events / core_req (and a memory's trace / errors) are observation streams whose ready the device ignores:
        # never back-pressure them (a record offered while not ready would be lost)
        ready = {k: v for k, v in traffic.ready.items() if k not in ("events", "core_req") and k not in chan}
        valid = dict(traffic.valid)
        if mmio_delay:
            base = np.asarray(valid.get("mmio", np.ones(1, bool)), bool)
            reps = -(-(limit + 1) // base.size)
            pat = np.tile(base, reps)[:limit + 1]
            pat[:mmio_delay] = False
            valid["mmio"] = pat
        traffic = Traffic(valid=valid, ready=ready)
        expected = {k: v for k, v in self.expected().items() if k in fields}
        expected.update(chan)
        r = backend.run_streams(system, inputs, expected, traffic=traffic, max_cycles=limit)
        extra = {}
        if chan:
            extra["channels"] = {k: r.outputs.get(k) for k in chan}
            problems = getattr(system, "channel_problems", None)
            if callable(problems):
                extra["channel_problems"] = problems(extra["channels"], r.cycles)
        return self._decode(backend.name, r.outputs, fields, cycles=r.cycles, wall_seconds=r.wall_seconds, **extra)

    def system(self):
        """The RTL system :meth:`run` uses by default: :func:`system_for` with this driver's parameters
        (``memory``, ``channels``)."""
        return system_for(self.config, self.num_queues, self.depth, self.latency, memory=self.memory,
                          channels=self.channels)

    def _check_system(self, system):
        if getattr(system, "regmap", None) is not None and system.regmap.num_queues != self.num_queues:
            raise ValueError(f"system has {system.regmap.num_queues} queues, the driver {self.num_queues}")
        lay = getattr(system, "layout", None)
        if lay is not None and lay != self.layout:
            raise ValueError(f"system layout {lay} differs from the driver's {self.layout}")
        mab = getattr(system, "mem_addr_bits", None)
        if mab is not None and mab != self.mem_addr_bits:
            raise ValueError(f"system mem_addr_bits {mab} differs from the driver's {self.mem_addr_bits} "
                             f"(pass mem_addr_bits=)")

    def check(self, backend, **kw) -> tuple:
        """Run on the RTL ``backend``, then on the golden model in the RTL's execution order; return
        ``(rtl_run, golden_run, differences)`` (differences: :func:`compare_runs`, plus core requests outside
        the descriptors' operand ranges, plus on a system with DRAM channels every timing violation and DRAM
        model report: ``rtl.channel_problems``)."""
        rtl = self.run(backend, **kw)
        gold = self.run("golden", order=rtl.events)
        diffs = compare_runs(rtl, gold, events="exact")
        diffs += [msg for _, msg in self.core_req_violations(rtl, gold)]
        diffs += list(rtl.channel_problems or [])
        return rtl, gold, diffs

    def core_req_violations(self, rtl: DeviceRun, gold: DeviceRun) -> list:
        """``[(queue, message)]``: RTL core requests outside their queue's window, or outside every operand range
        of that queue's accepted descriptors (writes: of its STOREs)."""
        if rtl.core_req is None:
            return []
        ranges = {}
        for acc in gold.golden.accesses:
            ranges.setdefault((acc.queue, acc.write), []).append((acc.first, acc.end))
        out = []
        for q, addr, write in rtl.core_req:
            if not 0 <= q < self.num_queues:
                out.append((q, f"core request tagged with queue {q}"))
                continue
            s = self._q[q]
            lo, hi = addr * LINE_BYTES, (addr + 1) * LINE_BYTES
            if not (s.win_base <= lo and hi <= s.win_limit):
                out.append((q, f"core request q{q} {'write' if write else 'read'} burst {addr:#x} outside the "
                               f"window [{s.win_base:#x}, {s.win_limit:#x})"))
            elif not any(f <= addr < e for f, e in ranges.get((q, bool(write)), [])):
                out.append((q, f"core request q{q} {'write' if write else 'read'} burst {addr:#x} outside every "
                               f"accepted operand of the queue"))
        return out
