"""Pipelined IEEE 754 multiplier."""

from amaranth.hdl import Module
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from .format import FloatFormat, FP16
from .pipeline import Pipeline, stream_layout, _stage_gating
from .round import decode, Normalizer, round_special

__all__ = ["FPMul"]


class FPMul(wiring.Component):
    """``z = a * b``, round-to-nearest-even into ``out_fmt`` (default: ``fmt``). One result per cycle.

    Input payload: ``a`` in bits ``[0, w)``, ``b`` in ``[w, 2w)`` (``w = fmt.width``), then ``user``.
    Output payload: ``z`` (``out_fmt.width`` bits), then ``user``. Latency :attr:`latency` = 3 cycles:
    decode + significand product | normalize | round. With ``out_fmt=FP32`` and ``fmt=FP16`` the product is
    exact (22 significant bits fit in 24), which is how the FP32-accumulating MAC forms its product.
    NaN results are the canonical quiet NaN of ``out_fmt``; ``0 * inf`` is NaN.
    """

    latency = 3

    def __init__(self, *, fmt: FloatFormat = FP16, out_fmt: FloatFormat | None = None, user_width: int = 0,
                 stage_domains=None,
                 load_first: bool = True):
        self.fmt = fmt
        self.out_fmt = out_fmt or fmt
        self.user_width = user_width
        self.stage_domains, self.stage_load = _stage_gating(stage_domains, self.latency)
        self.load_first = load_first
        super().__init__({
            "i": In(stream.Signature(stream_layout({"a": fmt.width, "b": fmt.width}, user_width))),
            "o": Out(stream.Signature(stream_layout({"z": self.out_fmt.width}, user_width))),
        })

    def elaborate(self, platform):
        m = Module()
        fmt, ofmt = self.fmt, self.out_fmt
        exp_width = max(fmt.exp_bits, ofmt.exp_bits) + 4
        sig_width = 2 * fmt.precision
        user = self.i.payload.user if self.user_width else None
        p = Pipeline(m, self.i, self.o, user=user, stage_domains=self.stage_domains, stage_load=self.stage_load,
                     load_first=self.load_first)

        a = decode(fmt, self.i.payload.a)
        b = decode(fmt, self.i.payload.b)
        # value = prod * 2**(ea + eb - 2*bias - 2*F); the rounder wants the exponent of prod's MSB position.
        exp = a.exp + b.exp + (ofmt.bias + sig_width - 1 - 2 * fmt.bias - 2 * fmt.frac_bits)
        s1 = p.stage(
            sign=a.sign ^ b.sign,
            nan=a.is_nan | b.is_nan | (a.is_inf & b.is_zero) | (a.is_zero & b.is_inf),
            inf=a.is_inf | b.is_inf,
            prod=a.sig * b.sig,
            exp=exp,
        )

        m.submodules.normalize = norm = Normalizer(sig_width=sig_width, exp_width=exp_width)
        m.d.comb += [norm.sig.eq(s1.prod), norm.exp.eq(s1.exp)]
        s2 = p.stage(sign=s1.sign, nan=s1.nan, inf=s1.inf, sig=norm.sig_out, exp=norm.exp_out)

        z = round_special(m, ofmt, sig_width=sig_width, exp_width=exp_width, sign=s2.sign, exp=s2.exp, sig=s2.sig,
                          nan=s2.nan, inf=s2.inf)
        s3 = p.stage(z=z)
        p.output(z=s3.z)
        return m
