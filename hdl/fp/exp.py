"""Pipelined binary16 ``exp(x)`` by table-based range reduction, in fixed-point integer arithmetic.

The constants below are the single source of truth for the datapath: :class:`FPExp` builds its ROMs and
multipliers from them and the golden model ``sim/golden/exp.py`` imports them to mirror every integer
operation bit for bit. See ``docs/fp_exp.md`` for the derivation and the measured error.

Datapath (all quantities are non-negative integers unless noted; ``v[a:b]`` are bits ``a..b-1``)::

    X  = sig << (exp - 1)                          |x| with X_FRAC = 24 fraction bits, exact, X < 2**29
    Y  = (X * LOG2E) >> LOG2E_FRAC                 |x| * log2(e), truncated to Z_FRAC = 24 fraction bits
    Z  = -Y if x < 0 else Y                        signed; exp(x) = 2**Z
    n  = Z >> Z_FRAC,  f = Z[0:24]                 floor and fraction: 2**Z = 2**n * 2**f, 0 <= f < 1
    t1 = T1[f[18:24]],  t2 = T2[f[12:18]]          2**(f_hi) and 2**(f_mid), TABLE_FRAC = 23 fraction bits
    d  = (f[0:12] * LN2) >> 12                     ln(2) * f_lo with D_FRAC = 30 fraction bits
    P  = (t1 * t2) >> 22                           2**(f_hi + f_mid), P_FRAC = 24 fraction bits
    M  = P + ((P * d) >> D_FRAC)                   2**f ~ P * (1 + ln(2) * f_lo), 24 fraction bits
    exp(x) ~ M * 2**(n - 24)                       -> Normalizer -> Rounder (RNE, subnormals, overflow)
"""

from decimal import Decimal, localcontext, ROUND_HALF_EVEN

from amaranth.hdl import Module, Mux, Const, Array
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from .format import FP16
from .pipeline import Pipeline, stream_layout
from .round import decode, Normalizer, Rounder

__all__ = [
    "FPExp", "exp2_table", "X_FRAC", "X_WIDTH", "SAT_EXP_FIELD", "LOG2E_FRAC", "LOG2E", "Z_FRAC",
    "HI_BITS", "MID_BITS", "LO_BITS", "TABLE_FRAC", "T1", "T2", "P_FRAC", "LN2_FRAC", "LN2", "D_FRAC",
    "M_WIDTH",
]

_PREC = 60  # decimal digits for constant generation: far beyond any rounding decision made below


def _round_half_even(value: Decimal) -> int:
    return int(value.to_integral_value(rounding=ROUND_HALF_EVEN))


def exp2_table(index_bits: int, weight_bits: int, frac_bits: int) -> tuple:
    """``round(2**(i / 2**weight_bits) * 2**frac_bits)`` for ``i`` in ``range(2**index_bits)``.

    Computed in 60-digit decimal arithmetic, so every entry is the correctly rounded integer (the exact
    values are irrational except for ``i = 0``, so there are no ties).
    """
    with localcontext() as ctx:
        ctx.prec = _PREC
        scale = Decimal(2) ** frac_bits
        step = Decimal(1) / (Decimal(2) ** weight_bits)
        return tuple(_round_half_even(Decimal(2) ** (i * step) * scale) for i in range(1 << index_bits))


def _scaled_constant(kind: str, frac_bits: int) -> int:
    with localcontext() as ctx:
        ctx.prec = _PREC
        ln2 = Decimal(2).ln()
        value = {"log2e": 1 / ln2, "ln2": ln2}[kind]
        return _round_half_even(value * Decimal(2) ** frac_bits)


# -- Step 1: |x| in fixed point. Every finite binary16 is sig * 2**(exp - 25) (sig with hidden bit, exp the
# effective biased exponent), so with 24 fraction bits |x| = sig << (exp - 1) is exact down to the smallest
# subnormal 2**-24. Inputs with |x| >= 32 (exponent field >= 20) saturate: exp(-32) < 2**-25 rounds to +0 and
# exp(32) > 65504 overflows to +inf (the real limits are about -17.33 and +11.09), so X < 32 * 2**24 = 2**29.
X_FRAC = 24
SAT_EXP_FIELD = 20
X_WIDTH = 29

# -- Step 2: Y = |x| * log2(e). LOG2E = round(log2(e) * 2**28) (29 bits, relative error < 2**-29); the
# 58-bit product keeps Z_FRAC = 24 fraction bits (truncated). Absolute error of Y: < 2**-24 (truncation)
# + |x| * 2**-29 (constant), so < 2**-23 even at |x| = 32. |Y| < 46.2: Z = +-Y fits signed(31), n in -47..46.
LOG2E_FRAC = 28
LOG2E = _scaled_constant("log2e", LOG2E_FRAC)
Z_FRAC = 24

# -- Step 3: f = f_hi/2**6 + f_mid/2**12 + f_lo/2**24 (6 + 6 + 12 bits). 2**f = T1[f_hi] * T2[f_mid] *
# 2**(f_lo/2**24), and the last factor is 1 + ln(2) * f_lo to within (ln(2) * 2**-12)**2 / 2 < 2**-25.
# The ROMs hold 64 entries each of round(2**(i/64) * 2**23) and round(2**(j/4096) * 2**23): 24-bit values
# in [2**23, 2**24), relative error <= 2**-24 each.
HI_BITS = 6
MID_BITS = 6
LO_BITS = Z_FRAC - HI_BITS - MID_BITS  # 12
TABLE_FRAC = 23
T1 = exp2_table(HI_BITS, HI_BITS, TABLE_FRAC)
T2 = exp2_table(MID_BITS, HI_BITS + MID_BITS, TABLE_FRAC)
TABLE_WIDTH = TABLE_FRAC + 1

# -- Step 3b: P = T1 * T2 (48 bits, 46 fraction bits) truncated to P_FRAC = 24 fraction bits:
# 2**24 <= P < 2**25 because T1 * T2 <= 2**(4095/4096) * 2**46 (+ rounding) < 2**47.
P_FRAC = 24
P_WIDTH = P_FRAC + 1

# -- Step 3c: d = ln(2) * f_lo with D_FRAC = 30 fraction bits: LN2 = round(ln(2) * 2**18) (18 bits), the
# 30-bit product f_lo * LN2 has LN2_FRAC + Z_FRAC = 42 fraction bits and is truncated by 12: d < 2**18.
LN2_FRAC = 18
LN2 = _scaled_constant("ln2", LN2_FRAC)
D_FRAC = 30
D_WIDTH = 18

# -- Step 4: M = P + (P * d >> 30) ~ 2**f * 2**24. M >= 2**24 always (T1[0] = T2[0] = 2**23, d >= 0); one
# extra bit of headroom makes 2**25 <= M harmless (it does not occur: the approximation is below 2**f < 2).
M_WIDTH = P_WIDTH + 1

assert LOG2E.bit_length() == 29 and LN2.bit_length() == LN2_FRAC
assert T1[0] == T2[0] == 1 << TABLE_FRAC and max(T1 + T2).bit_length() == TABLE_WIDTH
assert (max(T1) * max(T2)) >> (2 * TABLE_FRAC - P_FRAC) < 1 << P_WIDTH
assert (((1 << LO_BITS) - 1) * LN2) >> (LN2_FRAC + Z_FRAC - D_FRAC) < 1 << D_WIDTH


class FPExp(wiring.Component):
    """``z = exp(x)`` in binary16, round-to-nearest-even of a fixed-point approximation. One result per cycle.

    Input payload: ``x`` (16 bits), then ``user``. Output payload: ``z`` (16 bits), then ``user``.
    Latency :attr:`latency` = 7 cycles:

    1. decode; ``X = |x|`` in fixed point (24 fraction bits); NaN / saturation (``|x| >= 32`` or inf) flags
    2. ``Y = X * LOG2E`` (29 x 29 bits), truncate, negate for ``x < 0``: integer part ``n``, fraction ``f``
    3. ROM lookups ``T1[f_hi]``, ``T2[f_mid]`` (64 x 24 bits each) and ``d = ln(2) * f_lo`` (12 x 18 bits)
    4. ``P = T1 * T2`` (24 x 24 bits), truncated to 25 bits
    5. linear correction ``M = P + P * d`` (25 x 18 bits), truncated
    6. :class:`Normalizer` (shift by 0 or 1)
    7. shared :class:`Rounder` (RNE; subnormal results, underflow to +0, overflow to +inf) and specials

    Specials: NaN -> canonical 0x7E00, -inf -> +0, +inf -> +inf, +-0 -> 1.0 (exactly, through the datapath),
    ``x <= -32`` -> +0, ``x >= 32`` -> +inf. Measured error: at most 1 ULP from the correctly rounded result
    over all 65,536 inputs (``sim.golden.exp.exp_error_table``; ``docs/fp_exp.md``).
    """

    latency = 7

    def __init__(self, *, user_width: int = 0):
        self.fmt = FP16
        self.user_width = user_width
        super().__init__({
            "i": In(stream.Signature(stream_layout({"x": FP16.width}, user_width))),
            "o": Out(stream.Signature(stream_layout({"z": FP16.width}, user_width))),
        })

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        exp_width = fmt.exp_bits + 4  # biased result exponent n + 16 lies in -31..62
        user = self.i.payload.user if self.user_width else None
        p = Pipeline(m, self.i, self.o, user=user)

        # 1. decode and fixed point. For saturating inputs X is garbage; the flag overrides the result.
        x = decode(fmt, self.i.payload.x)
        s1 = p.stage(
            sign=x.sign,
            nan=x.is_nan,
            sat=x.exp_field >= SAT_EXP_FIELD,  # |x| >= 32, including infinities
            X=(x.sig << (x.exp - 1)[:fmt.exp_bits])[:X_WIDTH],  # exp >= 1: shift 0..30
        )

        # 2. |x| * log2(e), truncated to Z_FRAC fraction bits; Z = 2's complement for negative x.
        y = (s1.X * LOG2E)[LOG2E_FRAC + X_FRAC - Z_FRAC:]
        z = Mux(s1.sign, -y, y).as_signed()[:Z_FRAC + 7].as_signed()
        s2 = p.stage(sign=s1.sign, nan=s1.nan, sat=s1.sat,
                     n=z[Z_FRAC:].as_signed(), f=z[:Z_FRAC])

        # 3. ROM lookups and ln(2) * f_lo.
        rom1 = Array(Const(v, TABLE_WIDTH) for v in T1)
        rom2 = Array(Const(v, TABLE_WIDTH) for v in T2)
        f_lo = s2.f[:LO_BITS]
        f_mid = s2.f[LO_BITS:LO_BITS + MID_BITS]
        f_hi = s2.f[LO_BITS + MID_BITS:]
        s3 = p.stage(sign=s2.sign, nan=s2.nan, sat=s2.sat, n=s2.n,
                     t1=rom1[f_hi], t2=rom2[f_mid],
                     d=(f_lo * LN2)[LN2_FRAC + Z_FRAC - D_FRAC:][:D_WIDTH])

        # 4. P = 2**(f_hi + f_mid) with P_FRAC fraction bits.
        s4 = p.stage(sign=s3.sign, nan=s3.nan, sat=s3.sat, n=s3.n, d=s3.d,
                     P=(s3.t1 * s3.t2)[2 * TABLE_FRAC - P_FRAC:][:P_WIDTH])

        # 5. M = P * (1 + ln(2) * f_lo).
        corr = (s4.P * s4.d)[D_FRAC:]
        s5 = p.stage(sign=s4.sign, nan=s4.nan, sat=s4.sat, n=s4.n,
                     M=(s4.P + corr)[:M_WIDTH])

        # 6. normalize. value = M * 2**(n - P_FRAC) = sig * 2**(exp - bias - (M_WIDTH - 1)).
        m.submodules.normalize = norm = Normalizer(sig_width=M_WIDTH, exp_width=exp_width)
        m.d.comb += [norm.sig.eq(s5.M), norm.exp.eq(s5.n + (fmt.bias + M_WIDTH - 1 - P_FRAC))]
        s6 = p.stage(sign=s5.sign, nan=s5.nan, sat=s5.sat, sig=norm.sig_out, exp=norm.exp_out)

        # 7. round (the result is positive) and specials.
        m.submodules.round = rnd = Rounder(fmt=fmt, sig_width=M_WIDTH, exp_width=exp_width)
        m.d.comb += [rnd.sign.eq(0), rnd.exp.eq(s6.exp), rnd.sig.eq(s6.sig), rnd.sticky.eq(0)]
        zbits = Mux(s6.nan, fmt.qnan_bits,
                    Mux(s6.sat, Mux(s6.sign, 0, fmt.inf_bits), rnd.bits))
        s7 = p.stage(z=zbits)
        p.output(z=s7.z)
        return m
