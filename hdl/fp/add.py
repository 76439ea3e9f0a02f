"""Pipelined IEEE 754 adder (binary16 and binary32 from the same code)."""

from amaranth.hdl import Module, Signal, Mux, Cat, Const
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from .format import FloatFormat, FP16
from .pipeline import Pipeline, stream_layout, _stage_gating
from .round import decode, Normalizer, round_special

__all__ = ["FPAdd"]


class FPAdd(wiring.Component):
    """``z = a + b`` in ``fmt``, round-to-nearest-even. One result per cycle.

    Input payload: ``a`` in bits ``[0, w)``, ``b`` in ``[w, 2w)``, then ``user``; output ``z`` then ``user``.
    Latency :attr:`latency` = 4 cycles: order by magnitude | align and add/subtract | normalize | round.
    The smaller operand is aligned with a guard, a round and a sticky bit, which is exact for RNE: a shift
    of two or more leaves at most one bit of normalization for a subtraction. An exact zero sum of operands
    of opposite sign is +0; ``inf - inf`` is the canonical quiet NaN.
    """

    latency = 4

    def __init__(self, *, fmt: FloatFormat = FP16, user_width: int = 0, stage_domains=None,
                 load_first: bool = True):
        self.fmt = fmt
        self.user_width = user_width
        self.stage_domains, self.stage_load = _stage_gating(stage_domains, self.latency)
        self.load_first = load_first
        super().__init__({
            "i": In(stream.Signature(stream_layout({"a": fmt.width, "b": fmt.width}, user_width))),
            "o": Out(stream.Signature(stream_layout({"z": fmt.width}, user_width))),
        })

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        P = fmt.precision
        exp_width = fmt.exp_bits + 3
        user = self.i.payload.user if self.user_width else None
        p = Pipeline(m, self.i, self.o, user=user, stage_domains=self.stage_domains, stage_load=self.stage_load,
                     load_first=self.load_first)

        a = decode(fmt, self.i.payload.a)
        b = decode(fmt, self.i.payload.b)
        swap = b.magnitude > a.magnitude
        x = decode(fmt, Mux(swap, self.i.payload.b, self.i.payload.a))
        y = decode(fmt, Mux(swap, self.i.payload.a, self.i.payload.b))
        s1 = p.stage(
            nan=a.is_nan | b.is_nan | (a.is_inf & b.is_inf & (a.sign != b.sign)),
            inf=a.is_inf | b.is_inf,
            sign=x.sign,  # the larger magnitude decides the sign (and is the infinity if any)
            sub=x.sign ^ y.sign,
            exp=x.exp,
            x_sig=x.sig,
            y_sig=y.sig,
            diff=x.exp - y.exp,
        )

        # Align y below x with guard, round and sticky bits; sticky collects everything shifted further out.
        max_shift = P + 3
        shift = Signal(range(max_shift + 1))
        m.d.comb += shift.eq(Mux(s1.diff > max_shift, max_shift, s1.diff))
        y_ext = Cat(Const(0, 3), s1.y_sig)
        y_shifted = y_ext >> shift
        lost = (y_shifted << shift)[:P + 3] != y_ext
        y_aligned = y_shifted | lost
        x_ext = Cat(Const(0, 3), s1.x_sig)
        total = Signal(P + 4)
        m.d.comb += total.eq(Mux(s1.sub, x_ext - y_aligned, x_ext + y_aligned))
        s2 = p.stage(nan=s1.nan, inf=s1.inf, sign=s1.sign, sub=s1.sub, exp=s1.exp, total=total)

        # total's value is total * 2**(exp - bias - F - 3); its top bit is the carry position.
        m.submodules.normalize = norm = Normalizer(sig_width=P + 4, exp_width=exp_width)
        m.d.comb += [norm.sig.eq(s2.total), norm.exp.eq(s2.exp + 1)]
        exact_zero = s2.total == 0
        s3 = p.stage(
            nan=s2.nan, inf=s2.inf, sign=Mux(exact_zero & s2.sub, 0, s2.sign),
            sig=norm.sig_out, exp=norm.exp_out,
        )

        z = round_special(m, fmt, sig_width=P + 4, exp_width=exp_width, sign=s3.sign, exp=s3.exp, sig=s3.sig,
                          nan=s3.nan, inf=s3.inf)
        s4 = p.stage(z=z)
        p.output(z=s4.z)
        return m
