"""Pipelined IEEE 754 binary16 divider (restoring significand division, a few quotient bits per stage)."""

from amaranth.hdl import Module, Signal, Mux, Cat, Const
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from .format import FloatFormat, FP16
from .pipeline import Pipeline, stream_layout
from .round import decode, Normalizer, round_special

__all__ = ["FPDiv"]


class FPDiv(wiring.Component):
    """``z = a / b`` in binary16, round-to-nearest-even, subnormal inputs and outputs. One result per cycle.

    Input payload: ``a`` in bits ``[0, 16)``, ``b`` in ``[16, 32)``, then ``user``; output ``z`` then ``user``.

    Latency :attr:`latency` = 7 cycles:

    1. decode, special cases, and normalization of subnormal operands (:class:`Normalizer`'s shift), so both
       significands ``ma``, ``mb`` are 11-bit integers with the MSB set and ``ma / mb`` lies in ``(1/2, 2)``;
    2. - 5. a restoring divider computing ``Q = floor(ma * 2**12 / mb)``, :attr:`QUOTIENT_BITS` = 13 quotient
       bits, :attr:`BITS_PER_STAGE` = 4 per stage (4, 4, 4, 1); the last stage also forms the sticky bit
       (nonzero remainder). ``Q`` has 12 or 13 significant bits: the 11 of the result plus a guard bit
       (and a round bit when ``a/b >= 1``), so with the sticky bit the rounding is exact;
    6. :class:`Normalizer` (a shift of at most one);
    7. the shared :class:`Rounder` (subnormal results, overflow to infinity, ties to even) and specials.

    Specials: any NaN operand, ``0/0`` and ``inf/inf`` give the canonical quiet NaN (0x7E00); ``inf/finite``
    and ``nonzero/0`` give infinity; ``0/nonzero`` and ``finite/inf`` give zero; the sign is always
    ``sign(a) ^ sign(b)`` (except for NaN).
    """

    latency = 7
    QUOTIENT_BITS = 13
    BITS_PER_STAGE = 4

    def __init__(self, *, fmt: FloatFormat = FP16, user_width: int = 0):
        if fmt != FP16:
            raise ValueError(f"FPDiv supports fmt=FP16 only, got {getattr(fmt, 'name', fmt)!r}")
        self.fmt = fmt
        self.user_width = user_width
        super().__init__({
            "i": In(stream.Signature(stream_layout({"a": fmt.width, "b": fmt.width}, user_width))),
            "o": Out(stream.Signature(stream_layout({"z": fmt.width}, user_width))),
        })

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        P = fmt.precision
        QB = self.QUOTIENT_BITS  # = P + 2: Q = floor(ma * 2**(QB - 1) / mb) in [2**(QB-2), 2**QB)
        exp_width = fmt.exp_bits + 3
        user = self.i.payload.user if self.user_width else None
        p = Pipeline(m, self.i, self.o, user=user)

        # --- stage 1: decode, specials, normalize subnormal significands -----------------------------------
        a = decode(fmt, self.i.payload.a)
        b = decode(fmt, self.i.payload.b)
        m.submodules.norm_a = norm_a = Normalizer(sig_width=P, exp_width=exp_width)
        m.submodules.norm_b = norm_b = Normalizer(sig_width=P, exp_width=exp_width)
        m.d.comb += [
            norm_a.sig.eq(a.sig), norm_a.exp.eq(a.exp),
            norm_b.sig.eq(b.sig), norm_b.exp.eq(b.exp),
        ]
        # a / b = (ma / mb) * 2**(ea - eb); Q = floor(ma/mb * 2**(QB-1)) has weight 2**(ea - eb - (QB-1)),
        # so the biased exponent of Q's MSB position (bit QB-1) is ea - eb + bias.
        s = p.stage(
            sign=a.sign ^ b.sign,
            nan=a.is_nan | b.is_nan | (a.is_zero & b.is_zero) | (a.is_inf & b.is_inf),
            inf=a.is_inf | b.is_zero,
            zero=a.is_zero | b.is_inf,
            exp=norm_a.exp_out - norm_b.exp_out + fmt.bias,
            rem=norm_a.sig_out,  # partial remainder, invariant rem < 2 * divisor
            divisor=norm_b.sig_out,
            quot=Const(0, QB),
        )

        # --- stages 2 .. : restoring division, BITS_PER_STAGE quotient bits per stage ---------------------
        done = 0
        while done < QB:
            n = min(self.BITS_PER_STAGE, QB - done)
            rem, quot = s.rem, s.quot
            for k in range(n):
                # rem < 2 * divisor < 2**(P+1): P+1 bits hold it; the difference is taken one bit wider.
                diff = Signal(P + 2, name=f"q{done + k}_diff")
                m.d.comb += diff.eq(rem - s.divisor)
                bit = ~diff[P + 1]  # rem >= divisor
                rest = Mux(bit, diff[:P + 1], rem)  # < divisor
                quot = Cat(bit, quot[:QB - 1])
                rem = Cat(Const(0, 1), rest[:P])  # 2 * rest < 2 * divisor
                last_rest = rest
            done += n
            if done < QB:
                s = p.stage(sign=s.sign, nan=s.nan, inf=s.inf, zero=s.zero, exp=s.exp,
                            rem=rem[:P + 1], divisor=s.divisor, quot=quot)
            else:
                s = p.stage(sign=s.sign, nan=s.nan, inf=s.inf, zero=s.zero, exp=s.exp,
                            quot=quot, sticky=last_rest != 0)

        # --- normalize: Q's MSB is bit QB-1 (a/b >= 1) or QB-2 --------------------------------------------
        m.submodules.normalize = norm = Normalizer(sig_width=QB, exp_width=exp_width)
        m.d.comb += [norm.sig.eq(s.quot), norm.exp.eq(s.exp)]
        s = p.stage(sign=s.sign, nan=s.nan, inf=s.inf, zero=s.zero,
                    sig=norm.sig_out, exp=norm.exp_out, sticky=s.sticky)

        # --- round -------------------------------------------------------------------------------------------
        z = round_special(m, fmt, sig_width=QB, exp_width=exp_width, sign=s.sign, exp=s.exp, sig=s.sig,
                          sticky=s.sticky, nan=s.nan, inf=s.inf, zero=s.zero)
        s = p.stage(z=z)
        p.output(z=s.z)
        assert p.latency == self.latency, (p.latency, self.latency)
        return m
