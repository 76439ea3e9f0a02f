"""Decode, normalize and round: the front and back ends shared by every FP unit.

:class:`Rounder` is the one IEEE round-to-nearest-even rounder of the project (after berkeley-hardfloat's
``RoundRawFNToRecFN``): every unit that produces a floating-point number ends in it, so subnormal results,
overflow to infinity and ties-to-even are implemented exactly once.
"""

from types import SimpleNamespace

from amaranth.hdl import Module, Signal, Cat, Mux, Const, signed
from amaranth.utils import ceil_log2
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .format import FloatFormat

__all__ = ["decode", "Normalizer", "Rounder", "round_special"]


def decode(fmt: FloatFormat, bits) -> SimpleNamespace:
    """Field decode of a raw ``fmt`` value (combinational expressions, no state).

    ``sig`` is the significand with its hidden bit (``fmt.precision`` bits) and ``exp`` the effective biased
    exponent (1 for subnormals), so the value of a finite input is ``sig * 2**(exp - bias - frac_bits)``.
    """
    F, E = fmt.frac_bits, fmt.exp_bits
    frac = bits[:F]
    exp_field = bits[F:F + E]
    sign = bits[F + E]
    exp_zero = exp_field == 0
    exp_ones = exp_field == fmt.exp_max
    return SimpleNamespace(
        sign=sign,
        exp_field=exp_field,
        frac=frac,
        sig=Cat(frac, ~exp_zero),
        exp=Mux(exp_zero, 1, exp_field),
        is_zero=exp_zero & (frac == 0),
        is_sub=exp_zero & (frac != 0),
        is_inf=exp_ones & (frac == 0),
        is_nan=exp_ones & (frac != 0),
        magnitude=bits[:F + E],
    )


class Normalizer(wiring.Component):
    """Shifts ``sig`` left until its MSB is set and lowers ``exp`` by the same amount (combinational).

    A zero ``sig`` passes through with ``exp`` unchanged; :class:`Rounder` turns it into a signed zero.
    """

    def __init__(self, *, sig_width: int, exp_width: int):
        self.sig_width = sig_width
        self.exp_width = exp_width
        super().__init__({
            "sig": In(sig_width), "exp": In(signed(exp_width)),
            "sig_out": Out(sig_width), "exp_out": Out(signed(exp_width)),
        })

    def elaborate(self, platform):
        # A logarithmic shifter (the leading-zero count found by halving, as in most FP normalizers): for
        # s = P/2, P/4, ..., 1, shift left by s when the top s bits are zero; the shifts taken are the count's
        # bits. ceil(log2 W) levels of one zero test and one 2:1 mux, not a W-deep priority chain.
        m = Module()
        W = self.sig_width
        P = 1 << ceil_log2(W)
        v = Cat(Const(0, P - W), self.sig)             # MSB-aligned in P bits
        count = []
        s = P // 2
        while s >= 1:
            z = v[P - s:] == 0
            # each level a signal: the expression refers to v twice, so nesting them would double the
            # expression tree per level in the generated RTLIL / Verilog
            level = Signal(P, name=f"shift{s}")
            m.d.comb += level.eq(Mux(z, (v << s)[:P], v))
            v = level
            count.insert(0, z)
            s //= 2
        shift = Cat(*count) if count else Const(0, 1)
        m.d.comb += [
            self.sig_out.eq(v[P - W:]),
            # a zero sig shifts by 0: its exp passes unchanged
            self.exp_out.eq(self.exp - Mux(self.sig == 0, 0, shift)),
        ]
        return m


class Rounder(wiring.Component):
    """Rounds ``(-1)**sign * sig * 2**(exp - bias - (sig_width - 1))`` to ``fmt``, ties to even.

    ``sig`` must be normalized (MSB set) or zero; ``sticky`` is the OR of any nonzero bits below ``sig``'s LSB.
    ``exp`` is the biased exponent of ``sig``'s MSB and may lie outside the format: below 1 the value is
    shifted into a subnormal (or zero) before rounding; at or above the all-ones exponent it becomes infinity.
    Rounding up may carry into the exponent, including from the largest subnormal to the smallest normal and
    from the largest finite to infinity. Combinational; ``bits`` is the packed result.
    """

    def __init__(self, *, fmt: FloatFormat, sig_width: int, exp_width: int):
        if sig_width < 1:
            raise ValueError(f"sig_width must be >= 1, got {sig_width}")
        if exp_width < fmt.exp_bits + 2:
            raise ValueError(f"exp_width must be >= {fmt.exp_bits + 2} for {fmt.name}, got {exp_width}")
        self.fmt = fmt
        self.sig_width = sig_width
        self.exp_width = exp_width
        super().__init__({
            "sign": In(1), "exp": In(signed(exp_width)), "sig": In(sig_width), "sticky": In(1),
            "bits": Out(fmt.width),
        })

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        F, E = fmt.frac_bits, fmt.exp_bits
        # Pad so that the hidden bit, F fraction bits and a guard bit are all present.
        pad = max(0, fmt.precision + 1 - self.sig_width)
        W = self.sig_width + pad
        sig = Signal(W)
        m.d.comb += sig.eq(self.sig << pad)
        is_zero = sig == 0

        # Denormalize: a value below the smallest normal is shifted to the subnormal scale (exponent 1).
        max_shift = W + 1
        shift = Signal(range(max_shift + 1))
        with m.If(self.exp < 1):
            with m.If(self.exp < 1 - max_shift):
                m.d.comb += shift.eq(max_shift)
            with m.Else():
                m.d.comb += shift.eq(1 - self.exp)
        shifted = Signal(W)
        m.d.comb += shifted.eq(sig >> shift)
        lost = (shifted << shift)[:W] != sig

        frac = shifted[W - 1 - F:W - 1]
        guard = shifted[W - 2 - F]
        rest = (shifted[:W - 2 - F] != 0) if W - 2 - F > 0 else Const(0, 1)
        sticky = rest | self.sticky | lost
        round_up = guard & (sticky | frac[0])

        exp_field = Signal(E)
        with m.If(~is_zero & (self.exp >= 1)):
            m.d.comb += exp_field.eq(self.exp)
        # Adding the increment to {exp, frac} carries correctly into the exponent and up to infinity.
        rounded = Signal(E + F + 1)
        m.d.comb += rounded.eq(Cat(frac, exp_field) + round_up)
        overflow = ~is_zero & (self.exp >= fmt.exp_max)
        with m.If(overflow):
            m.d.comb += self.bits.eq(Cat(Const(fmt.inf_bits, E + F), self.sign))
        with m.Else():
            m.d.comb += self.bits.eq(Cat(rounded[:E + F], self.sign))
        return m


def round_special(m, fmt: FloatFormat, *, sig_width: int, exp_width: int, sign, exp, sig, sticky=0,
                  nan, inf, zero=None):
    """The packed result of a unit: the shared :class:`Rounder` on ``(sign, exp, sig, sticky)``, overridden by
    the canonical NaN when ``nan``, a signed infinity when ``inf`` and (if given) a signed zero when ``zero``.
    Adds the rounder to ``m`` as ``round``; returns the combinational result."""
    m.submodules.round = rnd = Rounder(fmt=fmt, sig_width=sig_width, exp_width=exp_width)
    m.d.comb += [rnd.sign.eq(sign), rnd.exp.eq(exp), rnd.sig.eq(sig), rnd.sticky.eq(sticky)]
    result = rnd.bits
    if zero is not None:
        result = Mux(zero, Cat(Const(0, fmt.width - 1), sign), result)
    return Mux(nan, fmt.qnan_bits, Mux(inf, Cat(Const(fmt.inf_bits, fmt.width - 1), sign), result))
