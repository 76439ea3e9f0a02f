"""The CXL.io MMIO register map of the NDP device and the layout of its HDM submission/completion queues.

This module is the **one** definition of both: the RTL (:class:`hdl.cxl.csr.CSRBank`), firmware encoders and the
host driver read every offset, width, access type and reset value from a :class:`RegisterMap`, and every queue
address from :class:`QueueLayout`. ``docs/cxl_regmap.md`` holds the same tables for people;
``tests/hdl/cxl/test_regmap.py`` checks the two agree.

Source: [PLoRA] Section IV-C ("Issuing and protocol"; docs/references.md): "The GPU writes the
operand and descriptor into an HDM submission queue over CXL.mem, writes a per-descriptor valid flag last, then
rings a CXL.io MMIO doorbell. CXL.io and CXL.mem are not mutually ordered, so the doorbell is only a wakeup hint
and the in-HDM valid flag is the ordering point"; and (line ~94, "Coherence and completion"): "The device writes
the result and then a completion flag to HDM, which the GPU polls or takes as an MSI-X interrupt. Per-requester
queues bound to a PASID isolate concurrent GPUs, and per-queue base and limit registers check every device-side
address." Everything below that the paper leaves open (offsets, widths, the valid-word encoding, the completion
record) is this project's choice.

Register map (byte offsets in the device's MMIO BAR; every register occupies one naturally aligned 8-byte slot;
only 64-bit aligned accesses are defined -- see :class:`hdl.cxl.csr.CSRBank`):

* global registers at ``0x00 .. 0x3f`` (:data:`GLOBAL_REGISTERS`);
* queue ``q`` at ``QUEUE_BASE + q * QUEUE_STRIDE`` (:data:`QUEUE_REGISTERS`, offsets relative to that base).

A register narrower than 64 bits reads its upper bits as 0 and ignores them on writes (reserved, RsvdZ).
"""

from dataclasses import dataclass

from ..ndp.descriptor import DESCRIPTOR_BITS, FLIT_BYTES

__all__ = [
    "ACCESS", "REG_BYTES", "Register", "check_registers", "RegisterMap",
    "DEV_ID_MAGIC", "QUEUE_BASE", "QUEUE_STRIDE", "MAX_QUEUES", "PASID_BITS", "CTRL_ENABLE", "CTRL_IRQ_ENABLE",
    "MAX_SQ_ENTRIES", "COUNTER_BITS", "QWIN_ALIGN", "DEFAULT_DATA_PASID", "queue_pasid", "GLOBAL_REGISTERS", "QUEUE_REGISTERS",
    "SLOT_HEADER_BYTES", "DESC_OFFSET", "DESC_BYTES", "VALID_OFFSET", "VALID_TAG", "valid_word",
    "CPL_HEADER_BYTES", "CPL_SEQ_OFFSET", "CPL_STATUS_OFFSET", "CPL_RESULT_BYTES_OFFSET", "CPL_FLAG_OFFSET",
    "CPL_FLAG_TAG", "completion_flag", "QueueLayout",
    "qwin_enabled", "placement_ok",
]

#: Access types: read-only (writes are errors), read-write, write-only (reads are errors; a write is an event),
#: read / write-1-to-clear.
ACCESS = ("RO", "RW", "WO", "RW1C")
REG_BYTES = 8                      # every register: one naturally aligned 64-bit slot

DEV_ID_MAGIC = 0x4E44_5049_4D43_0001   # ASCII "NDPIMC" + version 0x0001 (project choice)
MAX_QUEUES = 64                    # INT_STATUS / INT_ENABLE hold one bit per queue in one 64-bit register
QUEUE_BASE = 0x100                 # first per-queue block (globals below it, room to grow)
QUEUE_STRIDE = 0x80                # 16 register slots per queue, 10 used
PASID_BITS = 20                    # PCIe PASID width
CTRL_ENABLE = 1 << 0               # CTRL bit 0: the queue is enabled (the device pulls descriptors)
CTRL_IRQ_ENABLE = 1 << 1           # CTRL bit 1: the queue's completions raise the interrupt
COUNTER_BITS = 32                  # DOORBELL (tail), HEAD and ERRORS: free-running 32-bit counts
MAX_SQ_ENTRIES = 1 << 16           # SQ_ENTRIES: 0 (disabled) or a power of two up to this
QWIN_ALIGN = 64                    # QWIN_BASE / QWIN_LIMIT: multiples of one CXL.mem line (the filter's grain)
#: Host-side defaults of the scripted driver (project choice, not a device property): the PASID of plain data
#: stores / loads, and the PASID ``configure`` binds queue q to when none is given (q + 1, so no queue shares the
#: data PASID 0).
DEFAULT_DATA_PASID = 0


def queue_pasid(queue: int) -> int:
    """The driver's default PASID of queue ``queue`` (``queue + 1``)."""
    return queue + 1


@dataclass(frozen=True)
class Register:
    """One MMIO register. ``offset`` is the absolute byte offset; ``queue`` is None for a global register, else
    the queue whose block holds it. ``name`` is the register's name without the queue (``"SQ_BASE"``)."""

    name: str
    offset: int
    access: str
    reset: int
    width: int
    doc: str
    queue: int | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier() or self.name.upper() != self.name:
            raise ValueError(f"register name must be an upper-case identifier, got {self.name!r}")
        if self.access not in ACCESS:
            raise ValueError(f"register {self.name}: access must be one of {ACCESS}, got {self.access!r}")
        if not isinstance(self.width, int) or not 1 <= self.width <= 64:
            raise ValueError(f"register {self.name}: width must be 1..64, got {self.width!r}")
        if not isinstance(self.offset, int) or self.offset < 0:
            raise ValueError(f"register {self.name}: offset must be a non-negative int, got {self.offset!r}")
        if self.offset % REG_BYTES:
            raise ValueError(f"register {self.name}: offset {self.offset:#x} is misaligned (not a multiple of "
                             f"{REG_BYTES})")
        if not isinstance(self.reset, int) or not 0 <= self.reset < 1 << self.width:
            raise ValueError(f"register {self.name}: reset {self.reset!r} does not fit {self.width} bits")

    @property
    def full_name(self) -> str:
        """``"DEV_ID"`` or ``"Q2.SQ_BASE"``."""
        return self.name if self.queue is None else f"Q{self.queue}.{self.name}"

    @property
    def mask(self) -> int:
        return (1 << self.width) - 1

    @property
    def readable(self) -> bool:
        return self.access != "WO"

    @property
    def writable(self) -> bool:
        return self.access != "RO"


def check_registers(registers) -> None:
    """Raise ValueError if ``registers`` overlap (same 8-byte slot) or repeat a (name, queue)."""
    by_offset, by_name = {}, set()
    for r in registers:
        if not isinstance(r, Register):
            raise ValueError(f"not a Register: {r!r}")
        key = (r.name, r.queue)
        if key in by_name:
            raise ValueError(f"duplicate register {r.full_name}")
        by_name.add(key)
        slot = r.offset // REG_BYTES
        if slot in by_offset:
            raise ValueError(f"registers {by_offset[slot].full_name} and {r.full_name} overlap at offset "
                             f"{r.offset:#x}")
        by_offset[slot] = r


# (name, offset, access, reset, width, doc); reset/width may be callables of num_queues.
GLOBAL_REGISTERS = (
    ("DEV_ID", 0x00, "RO", DEV_ID_MAGIC, 64, "device identification magic (\"NDPIMC\", version 1)"),
    ("NUM_QUEUES", 0x08, "RO", lambda n: n, 8, "number of submission/completion queue pairs"),
    ("INT_STATUS", 0x10, "RW1C", 0, lambda n: n,
     "bit q: queue q posted a completion since the bit was last cleared; write 1 to clear"),
    ("INT_ENABLE", 0x18, "RW", 0, lambda n: n, "bit q: queue q may raise the interrupt line"),
    ("QUEUE_STRIDE", 0x20, "RO", QUEUE_STRIDE, 16, "bytes between consecutive queue register blocks"),
    ("QWIN_BASE", 0x28, "RW", 0, 64,
     "first byte of the reserved HDM queue window (a multiple of 64; locked while any queue is enabled)"),
    ("QWIN_LIMIT", 0x30, "RW", 0, 64,
     "end (exclusive) of the queue window (a multiple of 64); QWIN_LIMIT <= QWIN_BASE: no queue window"),
    ("HMEM_REJECTS", 0x38, "RO", 0, COUNTER_BITS,
     "count of host CXL.mem accesses the address filter rejected (saturating)"),
)

# Relative to QUEUE_BASE + q * QUEUE_STRIDE.
QUEUE_REGISTERS = (
    ("SQ_BASE", 0x00, "RW", 0, 64, "device byte address of the submission ring (in the reserved HDM window)"),
    ("SQ_ENTRIES", 0x08, "RW", 0, 17,
     f"ring slots: 0 (queue disabled) or a power of two <= {MAX_SQ_ENTRIES}; other writes are errors"),
    ("CQ_BASE", 0x10, "RW", 0, 64, "device byte address of the completion area (one record per slot)"),
    ("WIN_BASE", 0x18, "RW", 0, 64, "first byte of the queue's data window"),
    ("WIN_LIMIT", 0x20, "RW", 0, 64,
     "end (exclusive) of the data window: every device address a descriptor produces is in [WIN_BASE, WIN_LIMIT)"),
    ("PASID", 0x28, "RW", 0, PASID_BITS, "PASID the queue is bound to"),
    ("CTRL", 0x30, "RW", 0, 2, "bit 0 enable, bit 1 interrupt enable"),
    ("DOORBELL", 0x38, "WO", 0, COUNTER_BITS,
     "new tail (free-running count of slots submitted); a wake-up hint only, the valid word orders"),
    ("HEAD", 0x40, "RO", 0, COUNTER_BITS, "free-running count of slots consumed by the device"),
    ("ERRORS", 0x48, "RO", 0, COUNTER_BITS, "free-running count of descriptors completed with a status other "
                                            "than OK"),
)

_GLOBAL_NAMES = {g[0] for g in GLOBAL_REGISTERS}
_QUEUE_NAMES = {q[0] for q in QUEUE_REGISTERS}
assert not _GLOBAL_NAMES & _QUEUE_NAMES
assert max(q[1] for q in QUEUE_REGISTERS) + REG_BYTES <= QUEUE_STRIDE
assert max(g[1] for g in GLOBAL_REGISTERS) + REG_BYTES <= QUEUE_BASE


class RegisterMap:
    """The MMIO register map of a device with ``num_queues`` queue pairs (1..:data:`MAX_QUEUES`).

    ``reg(name, queue=None)`` / ``offset(name, queue=None)`` look a register up (queue is required for a
    per-queue register and forbidden for a global one); ``at(offset)`` finds the register at a byte offset (or
    None); iterating yields every register in offset order; ``size`` is the span in bytes (a power of two, so
    the BAR decodes ``size.bit_length() - 1`` address bits).
    """

    def __init__(self, num_queues: int):
        if not isinstance(num_queues, int) or isinstance(num_queues, bool) or not 1 <= num_queues <= MAX_QUEUES:
            raise ValueError(f"num_queues must be an int in 1..{MAX_QUEUES}, got {num_queues!r}")
        self.num_queues = num_queues
        regs = []
        for name, off, access, reset, width, doc in GLOBAL_REGISTERS:
            reset = reset(num_queues) if callable(reset) else reset
            width = width(num_queues) if callable(width) else width
            regs.append(Register(name, off, access, reset, width, doc))
        for q in range(num_queues):
            for name, off, access, reset, width, doc in QUEUE_REGISTERS:
                regs.append(Register(name, QUEUE_BASE + q * QUEUE_STRIDE + off, access, reset, width, doc, q))
        check_registers(regs)
        self._regs = sorted(regs, key=lambda r: r.offset)
        self._by_key = {(r.name, r.queue): r for r in regs}
        self._by_offset = {r.offset: r for r in regs}
        end = QUEUE_BASE + num_queues * QUEUE_STRIDE
        self.size = 1 << (end - 1).bit_length()

    def __repr__(self):
        return f"RegisterMap(num_queues={self.num_queues})"

    def __iter__(self):
        return iter(self._regs)

    def __len__(self):
        return len(self._regs)

    @property
    def addr_bits(self) -> int:
        """Byte-address bits the register window decodes (``size == 2 ** addr_bits``)."""
        return self.size.bit_length() - 1

    def reg(self, name: str, queue: int | None = None) -> Register:
        if name in _GLOBAL_NAMES:
            if queue is not None:
                raise ValueError(f"{name} is a global register; it takes no queue (got queue={queue!r})")
        elif name in _QUEUE_NAMES:
            if queue is None:
                raise ValueError(f"{name} is a per-queue register; give queue=0..{self.num_queues - 1}")
            if not isinstance(queue, int) or isinstance(queue, bool) or not 0 <= queue < self.num_queues:
                raise ValueError(f"queue {queue!r} out of range 0..{self.num_queues - 1} for {name}")
        else:
            raise ValueError(f"unknown register name {name!r}; registers are "
                             f"{sorted(_GLOBAL_NAMES)} and per queue {sorted(_QUEUE_NAMES)}")
        return self._by_key[(name, queue)]

    def offset(self, name: str, queue: int | None = None) -> int:
        return self.reg(name, queue).offset

    def at(self, offset: int) -> Register | None:
        """The register at byte ``offset`` (exactly its start), or None if unmapped or misaligned."""
        return self._by_offset.get(offset)

    def queue_base(self, queue: int) -> int:
        if not isinstance(queue, int) or not 0 <= queue < self.num_queues:
            raise ValueError(f"queue {queue!r} out of range 0..{self.num_queues - 1}")
        return QUEUE_BASE + queue * QUEUE_STRIDE

    @staticmethod
    def global_names() -> tuple:
        return tuple(g[0] for g in GLOBAL_REGISTERS)

    @staticmethod
    def queue_names() -> tuple:
        return tuple(q[0] for q in QUEUE_REGISTERS)


# ---- HDM queue memory layout -------------------------------------------------------------------------------
#
# Submission ring at SQ_BASE: SQ_ENTRIES slots of QueueLayout.slot_bytes each. Slot i (i = submission count mod
# SQ_ENTRIES) = a 256-byte header (one CXL 3.1 flit: PLoRA IV-C "fits one 256-Byte CXL 3.1 flit") followed by
# the slot's input area (the GPU-supplied input of the descriptor, PLoRA IV-C "The GPU writes the operand and
# descriptor into an HDM submission queue").

SLOT_HEADER_BYTES = FLIT_BYTES     # 256: one flit
DESC_OFFSET = 0                    # descriptor: bytes 0..25 (204 bits, little-endian, hdl.ndp.descriptor)
DESC_BYTES = -(-DESCRIPTOR_BITS // 8)   # 26
VALID_OFFSET = 32                  # 64-bit valid word, written LAST by the requester (the ordering point)
VALID_TAG = 0x5641_4C44 << 32      # "VALD" in the upper 32 bits


def valid_word(index: int) -> int:
    """The valid word of the descriptor with free-running submission index ``index`` (its tail count before
    the doorbell that covers it). Tagging the word with the index instead of a single bit means the device never
    has to clear it: a stale word from the previous lap of the ring carries ``index - SQ_ENTRIES`` and does not
    match (project choice; NVMe gets the same from a phase bit)."""
    return VALID_TAG | (index & ((1 << COUNTER_BITS) - 1))


# Completion area at CQ_BASE: SQ_ENTRIES records of QueueLayout.cpl_bytes each; record i belongs to slot i.
# PLoRA IV-C: "The device writes the result and then a completion flag to HDM".
CPL_HEADER_BYTES = 64              # one CXL.mem cache line
CPL_SEQ_OFFSET = 0                 # u64: the descriptor's free-running submission index
CPL_STATUS_OFFSET = 8              # u32: hdl.ndp.descriptor.ErrorCode value (0 = OK)
CPL_RESULT_BYTES_OFFSET = 16       # u64: bytes of result written at the result area (0 for STORE / errors)
CPL_FLAG_OFFSET = 32               # u64: completion flag, written LAST by the device
CPL_FLAG_TAG = 0x4350_4C54 << 32   # "CPLT" in the upper 32 bits


def completion_flag(index: int) -> int:
    """The completion flag of the descriptor with submission index ``index`` (same tagging as :func:`valid_word`)."""
    return CPL_FLAG_TAG | (index & ((1 << COUNTER_BITS) - 1))


@dataclass(frozen=True)
class QueueLayout:
    """Sizes of one queue's slots: ``input_bytes`` of input area per submission slot, ``result_bytes`` of
    result area per completion record (multiples of 64; the largest input / result one descriptor may carry).

    Addresses (``base`` = SQ_BASE or CQ_BASE, ``entries`` = SQ_ENTRIES, ``index`` = free-running count):
    slot ``index % entries`` at ``base + (index % entries) * slot_bytes``.
    """

    input_bytes: int
    result_bytes: int

    def __post_init__(self):
        for f in ("input_bytes", "result_bytes"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 0 or v % 64:
                raise ValueError(f"{f} must be a non-negative multiple of 64, got {v!r}")

    @classmethod
    def for_config(cls, config) -> "QueueLayout":
        """Areas that hold the largest input / result an :class:`hdl.ndp.config.NDPConfig` accepts."""
        up = lambda n: -(-n // 64) * 64  # noqa: E731
        return cls(input_bytes=up(config.input_buffer_bytes), result_bytes=up(config.output_buffer_bytes))

    @property
    def slot_bytes(self) -> int:
        return SLOT_HEADER_BYTES + self.input_bytes

    @property
    def cpl_bytes(self) -> int:
        return CPL_HEADER_BYTES + self.result_bytes

    @staticmethod
    def _slot(index, entries):
        if not isinstance(entries, int) or entries <= 0 or entries & (entries - 1):
            raise ValueError(f"entries must be a power of two, got {entries!r}")
        return index % entries

    def slot_addr(self, sq_base: int, entries: int, index: int) -> int:
        return sq_base + self._slot(index, entries) * self.slot_bytes

    def desc_addr(self, sq_base, entries, index):
        return self.slot_addr(sq_base, entries, index) + DESC_OFFSET

    def valid_addr(self, sq_base, entries, index):
        return self.slot_addr(sq_base, entries, index) + VALID_OFFSET

    def input_addr(self, sq_base, entries, index):
        return self.slot_addr(sq_base, entries, index) + SLOT_HEADER_BYTES

    def sq_bytes(self, entries: int) -> int:
        self._slot(0, entries)
        return entries * self.slot_bytes

    def cpl_addr(self, cq_base: int, entries: int, index: int) -> int:
        return cq_base + self._slot(index, entries) * self.cpl_bytes

    def flag_addr(self, cq_base, entries, index):
        return self.cpl_addr(cq_base, entries, index) + CPL_FLAG_OFFSET

    def result_addr(self, cq_base, entries, index):
        return self.cpl_addr(cq_base, entries, index) + CPL_HEADER_BYTES

    def cq_bytes(self, entries: int) -> int:
        self._slot(0, entries)
        return entries * self.cpl_bytes


assert DESC_OFFSET + DESC_BYTES <= VALID_OFFSET and VALID_OFFSET + 8 <= SLOT_HEADER_BYTES
assert CPL_RESULT_BYTES_OFFSET + 8 <= CPL_FLAG_OFFSET and CPL_FLAG_OFFSET + 8 <= CPL_HEADER_BYTES


# ---- the reserved HDM queue window (device-side address filter) --------------------------------------------
#
# PLoRA IV-C: submission queues and completion areas live in a reserved HDM window, told apart from ordinary data
# accesses of the host by a device-side address filter; per-requester queues are bound to a PASID. The window is
# [QWIN_BASE, QWIN_LIMIT) (empty when QWIN_LIMIT <= QWIN_BASE: "no queue window", the reset state). The rules
# below are this project's; docs/cxl_isolation.md explains them.


def qwin_enabled(qwin_base: int, qwin_limit: int) -> bool:
    """A queue window is programmed (``QWIN_LIMIT > QWIN_BASE``)."""
    return qwin_limit > qwin_base


def placement_ok(layout: "QueueLayout", sq_base: int, entries: int, cq_base: int, win_base: int, win_limit: int,
                 enable: bool, qwin_base: int, qwin_limit: int) -> bool:
    """The CSR placement rule (Python mirror of :class:`hdl.cxl.csr.CSRBank`): with a queue window programmed,
    an *enabled* queue's submission ring ``[SQ_BASE, SQ_BASE + SQ_ENTRIES * slot_bytes)`` and completion area
    ``[CQ_BASE, CQ_BASE + SQ_ENTRIES * cpl_bytes)`` lie inside ``[QWIN_BASE, QWIN_LIMIT)`` and its data window
    ``[WIN_BASE, WIN_LIMIT)`` is empty or disjoint from it. A register write that would leave the queue violating
    it is refused (error response, nothing changes). Without a queue window (or for a disabled queue) it holds."""
    if not enable or not qwin_enabled(qwin_base, qwin_limit):
        return True
    sq_in = qwin_base <= sq_base and sq_base + entries * layout.slot_bytes <= qwin_limit
    cq_in = qwin_base <= cq_base and cq_base + entries * layout.cpl_bytes <= qwin_limit
    win_out = win_limit <= win_base or win_limit <= qwin_base or win_base >= qwin_limit
    return sq_in and cq_in and win_out
