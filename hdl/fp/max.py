"""Pipelined binary16 maximum and comparison (softmax's running max)."""

from amaranth.hdl import Module, Mux, Cat, Const
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from .format import FloatFormat, FP16
from .pipeline import Pipeline, stream_layout
from .round import decode

__all__ = ["FPMax"]


class FPMax(wiring.Component):
    """``max(a, b)`` and the IEEE comparisons of ``a`` and ``b`` in binary16. One result per cycle.

    Input payload: ``a`` in bits ``[0, 16)``, ``b`` in ``[16, 32)``, then ``user``. Output payload:
    ``z`` in bits ``[0, 16)``, ``a_lt_b`` bit 16, ``a_eq_b`` bit 17, ``unordered`` bit 18, then ``user``.
    Latency :attr:`latency` = 1 cycle (compare | register).

    ``a_lt_b`` and ``a_eq_b`` are IEEE comparisons: false when either operand is NaN, and ``-0 == +0``.
    ``unordered`` is set when either operand is NaN. ``z`` is the canonical quiet NaN (0x7E00) when either
    operand is NaN (a NaN score poisons softmax rather than vanishing); otherwise the larger operand in the
    total order with ``-0 < +0`` (so ``max(-0, +0) = +0`` either way round), and ``a`` when the bits are equal.
    No arithmetic is performed, so nothing is rounded.
    """

    latency = 1

    def __init__(self, *, fmt: FloatFormat = FP16, user_width: int = 0):
        if fmt != FP16:
            raise ValueError(f"FPMax supports fmt=FP16 only, got {getattr(fmt, 'name', fmt)!r}")
        self.fmt = fmt
        self.user_width = user_width
        super().__init__({
            "i": In(stream.Signature(stream_layout({"a": fmt.width, "b": fmt.width}, user_width))),
            "o": Out(stream.Signature(stream_layout(
                {"z": fmt.width, "a_lt_b": 1, "a_eq_b": 1, "unordered": 1}, user_width))),
        })

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        W = fmt.width
        user = self.i.payload.user if self.user_width else None
        p = Pipeline(m, self.i, self.o, user=user)

        a_bits, b_bits = self.i.payload.a, self.i.payload.b
        a = decode(fmt, a_bits)
        b = decode(fmt, b_bits)
        # Total-order key: an unsigned compare of the keys orders -inf < ... < -0 < +0 < ... < +inf.
        # Negative values invert all bits (sign becomes 0, larger magnitude -> smaller key); positive values
        # set the sign bit.
        def key(x):
            return Mux(x[W - 1], ~x, Cat(x[:W - 1], Const(1, 1)))
        a_key, b_key = key(a_bits), key(b_bits)
        unordered = a.is_nan | b.is_nan
        both_zero = a.is_zero & b.is_zero
        s1 = p.stage(
            z=Mux(unordered, fmt.qnan_bits, Mux(b_key > a_key, b_bits, a_bits)),
            a_lt_b=~unordered & ~both_zero & (a_key < b_key),
            a_eq_b=~unordered & (both_zero | (a_bits == b_bits)),
            unordered=unordered,
        )
        p.output(z=s1.z, a_lt_b=s1.a_lt_b, a_eq_b=s1.a_eq_b, unordered=s1.unordered)
        return m
