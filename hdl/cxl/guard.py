"""Per-queue address isolation for the CXL NDP device: a descriptor window check and a memory-request guard.

[PLoRA] (Section IV-C; docs/references.md) binds each requester queue to a PASID and isolates queues
with base and limit registers: the descriptor "supplies the address the base and limit registers below check".
This module holds the two checks; the registers themselves (one ``[win_base, win_limit)`` window per queue)
live in the CSR block. See ``docs/cxl_isolation.md`` for where each check sits, its latency and the formal
proof of :class:`MemoryGuard`.

Windows are half-open byte ranges ``[win_base, win_limit)`` of 64-bit device byte addresses; an empty window
(``win_limit <= win_base``) admits nothing (but a SOFTMAX descriptor, which has no operand). All range
arithmetic is done one bit wider than its operands, so nothing wraps at ``2**64``: a range whose end is past
``2**64 - 1`` is never inside a window (``win_limit`` cannot exceed ``2**64 - 1``).

* :class:`WindowCheck` (combinational) / :func:`window_ok` (its Python mirror): a descriptor's device range
  ``[base_addr, base_addr + operand_bytes)`` against the window of its queue; descriptors without an operand
  (READ_COMPUTE SOFTMAX) always pass.
* :class:`MemoryGuard` / :func:`burst_ok`: a stream stage on the ``{addr, write, wdata, tag}`` request stream
  of :class:`hdl.memctl.controller.MemoryController` that forwards only requests whose burst
  ``[addr * burst_bytes, (addr + 1) * burst_bytes)`` lies inside the window, and drops, counts and reports
  every other one. This is the check that holds whatever the core (or a bug in it) issues.
"""

import numpy as np
from amaranth.hdl import Module, Signal, Value
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..ndp.descriptor import ADDR_BITS, FIELD_BITS, DescType, DescOp

__all__ = ["WINDOW_BITS", "window_ok", "burst_ok", "WindowCheck", "MemoryGuard",
           "guard_request_layout", "violation_layout"]

#: Width of a window register and of a device byte address.
WINDOW_BITS = ADDR_BITS  # 64

_MASK64 = (1 << WINDOW_BITS) - 1


def _check_u64(name, value):
    value = int(value)
    if not 0 <= value <= _MASK64:
        raise ValueError(f"{name} must be a 64-bit unsigned value, got {value:#x}")
    return value


def _window_ok_scalar(base_addr, size, win_base, win_limit, has_operand):
    if not has_operand:
        return True
    base_addr = _check_u64("base_addr", base_addr)
    size = int(size)
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    win_base = _check_u64("win_base", win_base)
    win_limit = _check_u64("win_limit", win_limit)
    return win_base <= base_addr and base_addr + size <= win_limit   # Python ints: no wrap


def window_ok(base_addr, size, win_base, win_limit, has_operand=True):
    """Python mirror of :class:`WindowCheck`: ``True`` iff the byte range ``[base_addr, base_addr + size)``
    lies inside ``[win_base, win_limit)`` (``win_base <= base_addr`` and ``base_addr + size <= win_limit``,
    exact integer arithmetic: a range that wraps past ``2**64`` fails), or ``has_operand`` is false.

    Scalars give a ``bool``; any argument may instead be a numpy array (or sequence), broadcast together, which
    gives a ``bool`` array (elementwise, computed on Python integers, so uint64 inputs never wrap).
    """
    args = (base_addr, size, win_base, win_limit, has_operand)
    if all(np.ndim(a) == 0 for a in args):
        return _window_ok_scalar(*(a.item() if isinstance(a, np.generic) else a for a in args))
    ufunc = np.frompyfunc(lambda *xs: _window_ok_scalar(*(int(x) for x in xs)), 5, 1)
    return ufunc(*(np.asarray(a, dtype=object) for a in args)).astype(bool)


def burst_ok(addr, burst_bytes, win_base, win_limit):
    """Python mirror of :meth:`MemoryGuard.window_check`: the burst at burst address ``addr`` covers bytes
    ``[addr * burst_bytes, (addr + 1) * burst_bytes)``; ``True`` iff that range is inside the window."""
    return _window_ok_scalar(int(addr) * burst_bytes, burst_bytes, win_base, win_limit, True)


class WindowCheck(wiring.Component):
    """Combinational window check of one descriptor's device range (see :func:`window_ok`).

    Ports (all ``In`` but ``ok``): ``base_addr`` (64), ``size`` (``size_bits``, the operand's byte size, 20 by
    default as in the descriptor), ``has_operand`` (1; 0 for SOFTMAX, which then always passes), ``win_base``
    (64), ``win_limit`` (64); ``ok`` (Out, 1). No clock: the result is valid in the cycle of its inputs.

    :meth:`check` is the same function on Amaranth values, for use inside another module;
    :meth:`descriptor_fields` extracts ``(base_addr, size, has_operand)`` from a ``DESCRIPTOR_LAYOUT`` view.
    """

    def __init__(self, *, size_bits: int = FIELD_BITS):
        if not 1 <= size_bits <= WINDOW_BITS:
            raise ValueError(f"size_bits must be in 1..{WINDOW_BITS}, got {size_bits}")
        self.size_bits = size_bits
        super().__init__({
            "base_addr": In(WINDOW_BITS),
            "size": In(size_bits),
            "has_operand": In(1),
            "win_base": In(WINDOW_BITS),
            "win_limit": In(WINDOW_BITS),
            "ok": Out(1),
        })

    @staticmethod
    def check(base_addr, size, win_base, win_limit, has_operand=1) -> Value:
        """``~has_operand | ((win_base <= base_addr) & (base_addr + size <= win_limit))``, with the end computed
        one bit wider than the wider of ``base_addr`` and ``size`` (so it never wraps)."""
        base_addr, size = Value.cast(base_addr).as_unsigned(), Value.cast(size).as_unsigned()
        end = base_addr + size      # Amaranth widens a sum by one bit: no wrap
        inside = (Value.cast(win_base).as_unsigned() <= base_addr) & (end <= Value.cast(win_limit).as_unsigned())
        return ~Value.cast(has_operand).bool() | inside

    @staticmethod
    def descriptor_fields(desc):
        """``(base_addr, operand bytes, has_operand)`` of a ``DESCRIPTOR_LAYOUT`` view (the raw descriptor:
        has_operand is "not READ_COMPUTE SOFTMAX", matching ``firmware.ndp.descriptor.Descriptor``)."""
        softmax = (desc.header.type == DescType.READ_COMPUTE.value) & (desc.header.op == DescOp.SOFTMAX.value)
        return desc.base_addr, desc.operand.bytes, ~softmax

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.ok.eq(self.check(self.base_addr, self.size, self.win_base, self.win_limit,
                                          self.has_operand))
        return m


def guard_request_layout(addr_bits: int, data_bits: int, tag_width: int = 0) -> data.StructLayout:
    """The memory request layout: ``MemoryController.request_layout`` with ``data_bits`` of ``wdata``."""
    return data.StructLayout({"addr": addr_bits, "write": 1, "wdata": data_bits, "tag": tag_width})


def violation_layout(addr_bits: int, tag_width: int = 0) -> data.StructLayout:
    """One violation report: the dropped request's burst address, direction and tag."""
    return data.StructLayout({"addr": addr_bits, "write": 1, "tag": tag_width})


class MemoryGuard(wiring.Component):
    """Window guard on a memory request stream (requester -> ``i`` -> guard -> ``o`` -> memory controller).

    Parameters: ``addr_bits`` (burst-address width), ``burst_bytes`` (bytes per burst, a power of two; burst
    ``a`` covers bytes ``[a * burst_bytes, (a + 1) * burst_bytes)``; ``addr_bits + log2(burst_bytes) <= 64``),
    keyword-only ``data_bits`` (``wdata`` width, default ``8 * burst_bytes``), ``tag_width`` (default 0) and
    ``count_bits`` (width of the saturating violation counter, default 32).

    Ports:

    * ``i``: In(stream of :func:`guard_request_layout` ``{addr, write, wdata, tag}``): requests in.
    * ``o``: Out(stream of the same layout): the requests whose burst lies inside the window, unchanged and in
      order.
    * ``win_base``, ``win_limit``: In(64): the window ``[win_base, win_limit)`` in bytes (CSR-driven; a change
      applies to requests accepted on ``i`` after it -- see the docs for quiescing).
    * ``violation``: Out(stream of :func:`violation_layout` ``{addr, write, tag}``): one report per dropped
      request, in order.
    * ``violations``: Out(``count_bits``): dropped requests since reset (saturates at ``2**count_bits - 1``).

    Timing: one register stage. A request accepted on ``i`` in cycle ``t`` is offered on ``o`` (or, if
    outside the window, on ``violation``) from cycle ``t + 1`` (:attr:`latency` = 1). ``i.ready`` is
    ``(~o.valid | o.ready) & (~violation.valid | violation.ready)``: it depends on neither ``i.valid`` nor the
    payload, and there is no combinational path from ``i`` to ``o.valid``/``violation.valid``; with ``o`` and
    ``violation`` ready the guard takes one request every cycle. A stalled ``violation`` consumer stalls the
    guard (no report is ever lost).
    """

    latency = 1

    def __init__(self, addr_bits: int, burst_bytes: int, *, data_bits: int | None = None, tag_width: int = 0,
                 count_bits: int = 32):
        if not 1 <= addr_bits <= WINDOW_BITS:
            raise ValueError(f"addr_bits must be in 1..{WINDOW_BITS}, got {addr_bits}")
        if burst_bytes < 1 or burst_bytes & (burst_bytes - 1):
            raise ValueError(f"burst_bytes must be a power of two, got {burst_bytes}")
        shift = exact_log2(burst_bytes)
        if addr_bits + shift > WINDOW_BITS:
            raise ValueError(f"addr_bits + log2(burst_bytes) = {addr_bits + shift} exceeds the "
                             f"{WINDOW_BITS}-bit byte address")
        data_bits = 8 * burst_bytes if data_bits is None else data_bits
        if data_bits < 0 or tag_width < 0:
            raise ValueError("data_bits and tag_width must be >= 0")
        if not 1 <= count_bits <= 64:
            raise ValueError(f"count_bits must be in 1..64, got {count_bits}")
        self.addr_bits = addr_bits
        self.burst_bytes = burst_bytes
        self.burst_shift = shift
        self.data_bits = data_bits
        self.tag_width = tag_width
        self.count_bits = count_bits
        self.request_layout = guard_request_layout(addr_bits, data_bits, tag_width)
        self.violation_layout = violation_layout(addr_bits, tag_width)
        super().__init__({
            "i": In(stream.Signature(self.request_layout)),
            "o": Out(stream.Signature(self.request_layout)),
            "win_base": In(WINDOW_BITS),
            "win_limit": In(WINDOW_BITS),
            "violation": Out(stream.Signature(self.violation_layout)),
            "violations": Out(count_bits),
        })

    @classmethod
    def for_controller(cls, controller, **kwargs) -> "MemoryGuard":
        """A guard whose request layout is exactly ``controller.request_layout`` (a ``MemoryController``)."""
        org = controller.config.org
        return cls(controller.amap.addr_bits, org.burst_bits // 8, data_bits=org.burst_bits,
                   tag_width=controller.tag_width, **kwargs)

    def window_check(self, addr, win_base, win_limit) -> Value:
        """1 iff burst ``addr``'s byte range ``[addr << s, (addr + 1) << s)`` lies in ``[win_base, win_limit)``
        (``s = log2(burst_bytes)``; the end is computed in ``addr_bits + s + 1`` bits: no wrap)."""
        lo = Value.cast(addr).as_unsigned() << self.burst_shift
        hi = lo + self.burst_bytes
        return (win_base <= lo) & (hi <= win_limit)

    def elaborate(self, platform):
        m = Module()
        i, o, v = self.i, self.o, self.violation
        ok = Signal()
        m.d.comb += [
            ok.eq(self.window_check(i.payload.addr, self.win_base, self.win_limit)),
            i.ready.eq((~o.valid | o.ready) & (~v.valid | v.ready)),
        ]
        with m.If(o.ready):
            m.d.sync += o.valid.eq(0)
        with m.If(v.ready):
            m.d.sync += v.valid.eq(0)
        with m.If(i.valid & i.ready):
            with m.If(ok):
                m.d.sync += [o.valid.eq(1), o.payload.eq(i.payload)]
            with m.Else():
                m.d.sync += [v.valid.eq(1), v.payload.addr.eq(i.payload.addr),
                             v.payload.write.eq(i.payload.write), v.payload.tag.eq(i.payload.tag)]
                with m.If(self.violations != (1 << self.count_bits) - 1):
                    m.d.sync += self.violations.eq(self.violations + 1)
        return m
