"""Burst-address to DRAM-coordinate mapping, as Amaranth logic and as a pure-Python/numpy function.

A *burst address* is a flat index in units of one burst (``org.burst_bytes`` bytes): address ``a`` and
``a + 1`` are neighbouring bursts. :class:`AddressMap` splits it into the fields ``rank``, ``bg`` (bank
group), ``bank`` (bank within the group), ``row`` and ``col`` (burst index within the row, i.e. the column
address divided by the burst length) by concatenating bit fields in a configurable order, least-significant
field first. Every field count must be a power of two, so decoding is pure wiring (no arithmetic).
"""

import numpy as np

from amaranth.hdl import Value

__all__ = ["AddressMap", "FIELDS", "DEFAULT_ORDER"]

FIELDS = ("rank", "bg", "bank", "row", "col")

#: Streaming-friendly order (LSB first): consecutive bursts rotate over the bank groups (so column commands
#: can issue every tCCD_S and the data bus runs at full rate), then walk the columns of one row in every bank
#: group (row hits), then the banks, the ranks and finally the rows.
DEFAULT_ORDER = ("bg", "col", "bank", "rank", "row")


def _log2(n: int, what: str) -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"AddressMap needs a power-of-two number of {what}, got {n}")
    return n.bit_length() - 1


class AddressMap:
    """Maps a flat burst address to ``(rank, bg, bank, row, col)`` for one channel of ``org``.

    ``order``: the five field names, least-significant first (default :data:`DEFAULT_ORDER`).

    Attributes: :attr:`addr_bits` (width of a burst address), :attr:`widths` (bits per field),
    :attr:`offsets` (LSB position of each field), :attr:`bursts` (addressable bursts of the channel).
    """

    def __init__(self, org, *, order=DEFAULT_ORDER):
        order = tuple(order)
        if sorted(order) != sorted(FIELDS):
            raise ValueError(f"address order must name each of {FIELDS} exactly once, got {order}")
        self.org = org
        self.order = order
        counts = {"rank": org.ranks, "bg": org.bank_groups, "bank": org.banks_per_group,
                  "row": org.rows, "col": org.bursts_per_row}
        self.counts = counts
        self.widths = {f: _log2(counts[f], f + "s" if f != "bg" else "bank groups") for f in FIELDS}
        self.offsets = {}
        pos = 0
        for f in order:
            self.offsets[f] = pos
            pos += self.widths[f]
        self.addr_bits = pos
        self.bursts = 1 << pos

    def decode(self, value) -> dict:
        """Amaranth: ``{field: Value}`` slices of the burst address ``value`` (zero-width fields are
        ``Const(0, 1)``-free empty slices; callers widen as needed)."""
        value = Value.cast(value)
        return {f: value[self.offsets[f]:self.offsets[f] + self.widths[f]] for f in FIELDS}

    def decode_py(self, addr):
        """Python/numpy: ``{field: int or ndarray}`` for an int or an integer array of burst addresses."""
        if isinstance(addr, (int, np.integer)):
            a = int(addr)
            if not 0 <= a < self.bursts:
                raise ValueError(f"burst address {a} outside 0..{self.bursts - 1}")
            return {f: (a >> self.offsets[f]) & ((1 << self.widths[f]) - 1) for f in FIELDS}
        a = np.asarray(addr, dtype=np.int64)
        if a.size and (a.min() < 0 or a.max() >= self.bursts):
            raise ValueError(f"burst addresses outside 0..{self.bursts - 1}")
        return {f: (a >> self.offsets[f]) & ((1 << self.widths[f]) - 1) for f in FIELDS}

    def encode_py(self, *, rank=0, bg=0, bank=0, row=0, col=0):
        """Inverse of :meth:`decode_py` (ints or numpy arrays)."""
        vals = {"rank": rank, "bg": bg, "bank": bank, "row": row, "col": col}
        out = 0
        for f in FIELDS:
            v = vals[f]
            if isinstance(v, (int, np.integer)) and not 0 <= int(v) < self.counts[f]:
                raise ValueError(f"{f}={v} outside 0..{self.counts[f] - 1}")
            out = out + (np.asarray(v, dtype=np.int64) << self.offsets[f] if not isinstance(v, (int, np.integer))
                         else int(v) << self.offsets[f])
        return out

    def __repr__(self):
        return f"AddressMap({self.org.name!r}, order={self.order})"
