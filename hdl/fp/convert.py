"""Pipelined conversion between IEEE 754 binary16 and binary32."""

from amaranth.hdl import Module
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from .format import FloatFormat, FP16, FP32, format_by_name
from .pipeline import Pipeline, stream_layout
from .round import decode, Normalizer, round_special

__all__ = ["FPConvert"]


class FPConvert(wiring.Component):
    """``z = convert(a)`` from ``src`` to ``dst`` format, round-to-nearest-even. One result per cycle.

    Supported: ``src=FP16, dst=FP32`` (exact; subnormal binary16 inputs become normal binary32) and
    ``src=FP32, dst=FP16`` (rounded by the shared :class:`Rounder`: overflow to infinity, subnormal results,
    underflow to zero, ties to even). ``src``/``dst`` may be :class:`FloatFormat` objects or names.

    Input payload: ``a`` in bits ``[0, src.width)``, then ``user``. Output payload: ``z`` in bits
    ``[0, dst.width)``, then ``user``. Latency :attr:`latency` = 2 cycles: decode + normalize (a subnormal
    significand is shifted up by its leading-zero count) | round and specials. NaN inputs give ``dst``'s
    canonical quiet NaN; infinities and zeros keep their sign.
    """

    latency = 2
    SUPPORTED = (("fp16", "fp32"), ("fp32", "fp16"))

    def __init__(self, *, src: FloatFormat | str = FP16, dst: FloatFormat | str = FP32, user_width: int = 0):
        src = format_by_name(src)
        dst = format_by_name(dst)
        if (src.name, dst.name) not in self.SUPPORTED or src not in (FP16, FP32) or dst not in (FP16, FP32):
            allowed = ", ".join(f"{s}->{d}" for s, d in self.SUPPORTED)
            raise ValueError(f"FPConvert does not support {src.name}->{dst.name}; allowed: {allowed}")
        self.src = src
        self.dst = dst
        self.user_width = user_width
        super().__init__({
            "i": In(stream.Signature(stream_layout({"a": src.width}, user_width))),
            "o": Out(stream.Signature(stream_layout({"z": dst.width}, user_width))),
        })

    def elaborate(self, platform):
        m = Module()
        src, dst = self.src, self.dst
        P = src.precision
        exp_width = max(src.exp_bits, dst.exp_bits) + 3
        user = self.i.payload.user if self.user_width else None
        p = Pipeline(m, self.i, self.o, user=user)

        a = decode(src, self.i.payload.a)
        # value = sig * 2**(exp - src.bias - src.frac_bits); in dst terms the biased exponent of sig's MSB
        # (bit P-1) is exp - src.bias + dst.bias.
        m.submodules.normalize = norm = Normalizer(sig_width=P, exp_width=exp_width)
        m.d.comb += [norm.sig.eq(a.sig), norm.exp.eq(a.exp + (dst.bias - src.bias))]
        s1 = p.stage(sign=a.sign, nan=a.is_nan, inf=a.is_inf, sig=norm.sig_out, exp=norm.exp_out)

        # The Rounder pads a narrower significand, so fp16 -> fp32 is exact and goes through the same path.
        z = round_special(m, dst, sig_width=P, exp_width=exp_width, sign=s1.sign, exp=s1.exp, sig=s1.sig,
                          nan=s1.nan, inf=s1.inf)
        s2 = p.stage(z=z)
        p.output(z=s2.z)
        assert p.latency == self.latency, (p.latency, self.latency)
        return m
