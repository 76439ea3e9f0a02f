"""Pipelined multiply-accumulate: an FPMul feeding an FPAdd in the accumulator format."""

from amaranth.hdl import Module, Cat
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from .format import FP16, FP32
from .pipeline import stream_layout
from .mul import FPMul
from .add import FPAdd

__all__ = ["FPMAC", "ACCUMULATORS"]

ACCUMULATORS = {"fp16": FP16, "fp32": FP32}


class FPMAC(wiring.Component):
    """``z = c + a * b`` with FP16 ``a``, ``b`` and ``c``/``z`` in the accumulator format ``acc``.

    ``acc="fp16"`` (the papers' FP16 MAC): the product is rounded to FP16, then added to ``c`` and rounded
    again. ``acc="fp32"``: the product is formed exactly in FP32 (FPMul with ``out_fmt=FP32``) and only the
    FP32 add rounds. Input payload: ``a`` bits [0,16), ``b`` [16,32), ``c`` [32, 32+acc width), then ``user``.
    Output: ``z`` (acc width), then ``user``. Latency :attr:`latency` = FPMul's 3 + FPAdd's 4 = 7 cycles,
    one operation per cycle. The accumulation loop itself (feeding ``z`` back as ``c``) is closed by the PE
    that owns the accumulator registers, interleaving at least ``latency`` independent sums.
    """

    latency = FPMul.latency + FPAdd.latency

    def __init__(self, *, acc: str = "fp16", user_width: int = 0):
        if acc not in ACCUMULATORS:
            raise ValueError(f"acc must be one of {sorted(ACCUMULATORS)}, got {acc!r}")
        self.acc = acc
        self.acc_fmt = ACCUMULATORS[acc]
        self.user_width = user_width
        w = self.acc_fmt.width
        super().__init__({
            "i": In(stream.Signature(stream_layout({"a": 16, "b": 16, "c": w}, user_width))),
            "o": Out(stream.Signature(stream_layout({"z": w}, user_width))),
        })

    def elaborate(self, platform):
        m = Module()
        w = self.acc_fmt.width
        # c (and the caller's user bits) ride through the multiplier in its sideband.
        m.submodules.mul = mul = FPMul(fmt=FP16, out_fmt=self.acc_fmt, user_width=w + self.user_width)
        m.submodules.add = add = FPAdd(fmt=self.acc_fmt, user_width=self.user_width)
        side = Cat(self.i.payload.c, self.i.payload.user) if self.user_width else self.i.payload.c
        m.d.comb += [
            mul.i.valid.eq(self.i.valid),
            self.i.ready.eq(mul.i.ready),
            mul.i.payload.a.eq(self.i.payload.a),
            mul.i.payload.b.eq(self.i.payload.b),
            mul.i.payload.user.eq(side),
            add.i.valid.eq(mul.o.valid),
            mul.o.ready.eq(add.i.ready),
            add.i.payload.a.eq(mul.o.payload.z),
            add.i.payload.b.eq(mul.o.payload.user[:w]),
        ]
        if self.user_width:
            m.d.comb += add.i.payload.user.eq(mul.o.payload.user[w:])
        wiring.connect(m, wiring.flipped(self.o), add.o)
        return m
