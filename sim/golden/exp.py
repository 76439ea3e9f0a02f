"""Golden model of FPExp (``hdl/fp/exp.py``): binary16 ``exp(x)``, bit-exact with the RTL.

:func:`exp` repeats the RTL's integer datapath step by step in int64 numpy arithmetic (every product is
below 2**58), with the constants and ROMs imported from ``hdl.fp.exp`` so that RTL and model cannot drift.
The final rounding of the exact value ``M * 2**(n - 24)`` (``M < 2**26``, so exact in float64) is numpy's
float64 -> float16 conversion, which is IEEE round-to-nearest-even with subnormals and overflow to
infinity: the same function the shared :class:`~hdl.fp.round.Rounder` computes with ``sticky = 0``.

:func:`exp_error_table` measures the model exhaustively against the correctly rounded binary16 of the
float64 ``exp``.
"""

from dataclasses import dataclass

import numpy as np

from hdl.fp.format import FP16
from hdl.fp.exp import (X_FRAC, SAT_EXP_FIELD, LOG2E_FRAC, LOG2E, Z_FRAC, LO_BITS, MID_BITS, TABLE_FRAC,
                        T1, T2, P_FRAC, LN2_FRAC, LN2, D_FRAC)
from .bits import as_bits, canonicalize_nan

__all__ = ["exp", "exp_fixed", "ExpErrorStats", "exp_error_table", "ulp_distance", "reference_exp"]

_T1 = np.array(T1, dtype=np.int64)
_T2 = np.array(T2, dtype=np.int64)


def exp_fixed(x):
    """The unrounded datapath: ``(M, n, nan, sat, sign)`` with ``exp(x) ~ M * 2**(n - P_FRAC)``.

    ``M``/``n`` are int64 arrays (meaningless where ``nan`` or ``sat`` is set); ``sat`` marks ``|x| >= 32``
    and infinities, whose result is +0 (``sign`` set) or +inf.
    """
    bits = as_bits(x, FP16, "x").astype(np.int64)
    frac = bits & ((1 << FP16.frac_bits) - 1)
    exp_field = (bits >> FP16.frac_bits) & FP16.exp_max
    sign = (bits >> (FP16.width - 1)) & 1
    nan = (exp_field == FP16.exp_max) & (frac != 0)
    sat = exp_field >= SAT_EXP_FIELD
    sig = frac | ((exp_field != 0).astype(np.int64) << FP16.frac_bits)
    exp_eff = np.maximum(exp_field, 1)
    # 1. |x| with X_FRAC fraction bits (only where not saturating, so the shift stays below 19).
    X = np.where(sat, 0, sig << np.where(sat, 0, exp_eff - 1))
    # 2. Y = |x| * log2(e), truncated to Z_FRAC fraction bits; Z signed; n = floor(Z), f = Z mod 1.
    Y = (X * LOG2E) >> (LOG2E_FRAC + X_FRAC - Z_FRAC)
    Z = np.where(sign == 1, -Y, Y)
    n = Z >> Z_FRAC  # arithmetic shift: floor
    f = Z & ((1 << Z_FRAC) - 1)
    # 3. ROMs and ln(2) * f_lo.
    f_lo = f & ((1 << LO_BITS) - 1)
    f_mid = (f >> LO_BITS) & ((1 << MID_BITS) - 1)
    f_hi = f >> (LO_BITS + MID_BITS)
    d = (f_lo * LN2) >> (LN2_FRAC + Z_FRAC - D_FRAC)
    # 4. P = T1 * T2 truncated to P_FRAC fraction bits.
    P = (_T1[f_hi] * _T2[f_mid]) >> (2 * TABLE_FRAC - P_FRAC)
    # 5. linear correction.
    M = P + ((P * d) >> D_FRAC)
    return M, n, nan, sat, sign.astype(bool)


def exp(x) -> np.ndarray:
    """``exp(x)`` on raw binary16 bit patterns (uint16 array or int), as FPExp computes it."""
    M, n, nan, sat, sign = exp_fixed(x)
    with np.errstate(all="ignore"):
        z = np.ldexp(M.astype(np.float64), (n - P_FRAC).astype(np.int32)).astype(np.float16).view(np.uint16)
    z = np.where(sat, np.where(sign, np.uint16(0), np.uint16(FP16.inf_bits)), z)
    z = np.where(nan, np.uint16(FP16.qnan_bits), z).astype(np.uint16)
    return z


def reference_exp(x) -> np.ndarray:
    """The correctly rounded binary16 ``exp(x)`` via float64 (NaN canonical).

    float64 ``exp`` is within about 2**-52 of the true value, and no binary16 input has ``exp(x)`` closer
    than about 2**-26.4 (relative) to a rounding midpoint of binary16 (measured: input 0x1F79), so the
    double rounding never changes the result.
    """
    bits = as_bits(x, FP16, "x")
    with np.errstate(all="ignore"):
        z = np.exp(bits.view(np.float16).astype(np.float64)).astype(np.float16).view(np.uint16)
    return canonicalize_nan(z, FP16)


def ulp_distance(a, b) -> np.ndarray:
    """ULP distance of binary16 patterns: difference as sign-magnitude integers; NaN vs NaN is 0, NaN vs
    a number is 2**16 (worse than any numeric error)."""
    a = as_bits(a, FP16, "a").astype(np.int64)
    b = as_bits(b, FP16, "b").astype(np.int64)

    def key(v):
        mag = v & 0x7FFF
        return np.where(v & 0x8000, -mag, mag)

    def isnan(v):
        return ((v & 0x7C00) == 0x7C00) & ((v & 0x03FF) != 0)

    d = np.abs(key(a) - key(b))
    return np.where(isnan(a) & isnan(b), 0, np.where(isnan(a) | isnan(b), 1 << 16, d))


@dataclass(frozen=True)
class ExpErrorStats:
    """Error of :func:`exp` against :func:`reference_exp` over one input domain."""

    domain: str
    count: int          # inputs in the domain
    ulp0: int           # results equal to the correctly rounded value
    ulp1: int           # results one ULP away
    max_ulp: int
    worst: tuple        # the inputs (bit patterns) with a nonzero error, at most 16
    max_rel_error: float  # max |M * 2**(n-24) - exp(x)| / exp(x) before rounding, over non-saturated finite x
                          # whose exp(x) is a normal binary16 (nan when there are none)


def exp_error_table() -> dict:
    """Exhaustive error statistics: domain name -> :class:`ExpErrorStats`.

    Domains: ``"all"`` (all 65,536 patterns, NaN == NaN), ``"finite"`` (the 63,488 finite inputs) and
    ``"x<=0"`` (the 31,745 finite inputs with ``x <= 0``, i.e. negative patterns and +0: softmax's range).
    """
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = exp(x)
    want = reference_exp(x)
    dist = ulp_distance(got, want)

    xf = x.view(np.float16).astype(np.float64)
    M, n, nan, sat, _ = exp_fixed(x)
    with np.errstate(all="ignore"):
        true = np.exp(xf)
        approx = np.ldexp(M.astype(np.float64), (n - P_FRAC).astype(np.int32))
        rel = np.abs(approx - true) / true
    normal = ~nan & ~sat & (true >= 2.0 ** -14) & (true <= 65504.0)

    finite = np.isfinite(xf)
    domains = {"all": np.ones(x.shape, dtype=bool), "finite": finite, "x<=0": finite & (xf <= 0)}
    table = {}
    for name, mask in domains.items():
        d = dist[mask]
        r = rel[mask & normal]
        table[name] = ExpErrorStats(
            domain=name, count=int(mask.sum()), ulp0=int((d == 0).sum()), ulp1=int((d == 1).sum()),
            max_ulp=int(d.max()), worst=tuple(int(v) for v in x[mask][d > 0][:16]),
            max_rel_error=float(r.max()) if r.size else float("nan"))
    return table
