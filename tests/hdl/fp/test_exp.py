# amaranth: UnusedElaboratable=no
import numpy as np
import pytest

from hdl.fp.exp import FPExp, T1, T2, LOG2E, LN2
from sim.backends import get_backend
from sim.golden import exp as gexp
from fp_util import FP16_EDGE, pack, field, run_unit, hexdiff

ALL = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)

# Inputs around every boundary of the datapath: the saturation threshold |x| = 32 (0x5000 / 0xD000), the
# first overflowing input (0x498C, x = 11.09375), the first input whose result is a subnormal (0xC8DB,
# x = -9.7109) and +0 (0xCC56, x = -17.34), the last tiny inputs whose exp rounds to 1.0 (0x0FFF, 0x8BFF),
# the inputs whose result is one ULP off (0x25CF, 0x8C00) and the hardest-to-round inputs (0x1F79, 0xA954,
# 0xC13B, 0xA57F: exp(x) within 2**-23.2 of a rounding midpoint).
BOUNDARY = np.array(
    [v + d for v in (0x4FFF, 0x5000, 0xCFFF, 0xD000, 0x498C, 0xC8DB, 0xCC56, 0x0FFF, 0x8BFF, 0x25CF)
     for d in (-2, -1, 0, 1, 2)]
    + [0x1F79, 0xA954, 0xC13B, 0xA57F, 0x7BFF, 0xFBFF],
    dtype=np.uint16)


def _check(backend, x, *, seed, traffic="random", user=None):
    unit = FPExp(user_width=0 if user is None else 8)
    fields = [(x, 16)] if user is None else [(x, 16), (user, 8)]
    run = run_unit(backend, unit, pack(fields), seed=seed, traffic=traffic)
    got = field(run.outputs["o"], 0, 16, np.uint16)
    want = gexp.exp(x)
    assert np.array_equal(got, want), hexdiff({"x": x}, got, want)
    return run


# -- golden model --------------------------------------------------------------------------------------

def test_golden_error_is_at_most_one_ulp_exhaustive():
    table = gexp.exp_error_table()
    for name, count in (("all", 65536), ("finite", 63488), ("x<=0", 31745)):
        stats = table[name]
        assert stats.count == count, stats
        assert stats.max_ulp <= 1, f"{name}: max error {stats.max_ulp} ULP at inputs " \
                                   f"{[hex(v) for v in stats.worst]}"
        assert stats.ulp0 + stats.ulp1 == count, stats
        # before rounding the approximation is far better than the 2**-12 relative half ULP of binary16
        assert stats.max_rel_error < 2.0 ** -21, stats
    # The measured numbers published in docs/fp_exp.md; a datapath change must update the page.
    assert (table["all"].ulp0, table["all"].ulp1) == (65534, 2), table["all"]
    assert (table["x<=0"].ulp0, table["x<=0"].ulp1) == (31744, 1), table["x<=0"]
    assert table["all"].worst == (0x25CF, 0x8C00)


def test_golden_specials_exact():
    nans = ALL[((ALL & 0x7C00) == 0x7C00) & ((ALL & 0x03FF) != 0)]
    assert nans.size == 2046
    assert np.all(gexp.exp(nans) == 0x7E00)
    assert gexp.exp(0xFC00) == 0x0000  # -inf -> +0
    assert gexp.exp(0x7C00) == 0x7C00  # +inf -> +inf
    assert gexp.exp(0x0000) == 0x3C00 and gexp.exp(0x8000) == 0x3C00  # +-0 -> 1.0
    big = ALL[(ALL & 0x7FFF) >= 0x5000]  # |x| >= 32 and infinities, NaNs
    big_pos = big[(big < 0x8000) & (big <= 0x7C00)]
    big_neg = big[(big >= 0x8000) & (big <= 0xFC00)]
    assert np.all(gexp.exp(big_pos) == 0x7C00)
    assert np.all(gexp.exp(big_neg) == 0x0000)
    # every result is a non-negative number or the canonical NaN
    z = gexp.exp(ALL)
    assert np.all((z < 0x7C00) | (z == 0x7C00) | (z == 0x7E00))


def test_golden_is_monotonic():
    # softmax relies on exp preserving order: the finite inputs in increasing order give non-decreasing results
    x = ALL[np.isfinite(ALL.view(np.float16))]
    order = np.argsort(x.view(np.float16).astype(np.float64), kind="stable")
    z = gexp.exp(x[order]).view(np.float16).astype(np.float64)
    assert np.all(z[1:] >= z[:-1])


def test_golden_is_independent_of_reference_on_simple_values():
    # a few values checked against hand-known binary16 results, not against numpy's exp
    cases = {0x3C00: 0x4170,  # exp(1) = 2.71828 -> 2.71875
             0xBC00: 0x35E3,  # exp(-1) = 0.367879 -> 0.367920
             0x4000: 0x4764,  # exp(2) = 7.389 -> 7.390625
             0x4A00: 0x7C00,  # exp(12) overflows
             0xCA00: 0x0067}  # exp(-12) = 6.144e-6 = 103.08 * 2**-24 -> subnormal 103 * 2**-24
    for x, want in cases.items():
        assert int(gexp.exp(x)) == want, f"exp({x:#06x}) = {int(gexp.exp(x)):#06x}, want {want:#06x}"


def test_tables_are_correctly_rounded():
    # the ROM and constant generation (exact decimal arithmetic) agree with float64 to within one unit
    i = np.arange(64)
    assert np.all(np.abs(np.array(T1) - 2.0 ** (i / 64) * 2 ** 23) <= 0.5)
    assert np.all(np.abs(np.array(T2) - 2.0 ** (i / 4096) * 2 ** 23) <= 0.5)
    assert abs(LOG2E - np.log2(np.e) * 2 ** 28) <= 0.5
    assert abs(LN2 - np.log(2) * 2 ** 18) <= 0.5


def test_golden_rejects_bad_input():
    with pytest.raises(TypeError, match="uint16"):
        gexp.exp(np.zeros(4, dtype=np.float16))
    with pytest.raises(TypeError, match="uint16"):
        gexp.exp(np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[0, 65536\)"):
        gexp.exp(70000)
    with pytest.raises(TypeError, match="uint16"):
        gexp.exp_fixed(np.zeros(2, dtype=np.uint32))


# -- RTL vs golden -------------------------------------------------------------------------------------

def test_fp16_exp_matches_golden(backend):
    rng = np.random.default_rng(21)
    n = 3000 if backend.name == "amaranth" else 100_000
    x = np.concatenate([FP16_EDGE, BOUNDARY, rng.integers(0, 1 << 16, n).astype(np.uint16)])
    _check(backend, x, seed=5)


def test_softmax_range_matches_golden(backend):
    # exp(x - max): x <= 0, concentrated where results are normal (|x| < 10)
    rng = np.random.default_rng(22)
    n = 1000 if backend.name == "amaranth" else 30_000
    x = -(rng.random(n) * 10.0)
    x = x.astype(np.float16).view(np.uint16) | np.uint16(0x8000)
    _check(backend, x, seed=6)


def test_full_rate_is_one_result_per_cycle(backend):
    n = 500
    x = np.random.default_rng(23).integers(0, 1 << 16, n).astype(np.uint16)
    run = _check(backend, x, seed=0, traffic="full")
    assert run.cycles == n + FPExp.latency


def test_user_sideband_travels_with_its_result(backend):
    n = 300
    x = np.random.default_rng(24).integers(0, 1 << 16, n).astype(np.uint16)
    tags = (np.arange(n) * 37 % 256).astype(np.uint16)
    run = _check(backend, x, seed=7, user=tags)
    assert np.array_equal(field(run.outputs["o"], 16, 8, np.uint16), tags)


def test_rtl_exhaustive_verilator():
    # every binary16 input through the compiled RTL, random valid gaps and backpressure
    _check(get_backend("verilator"), ALL, seed=8)


def test_bad_parameters():
    with pytest.raises(ValueError, match="user_width must be >= 0"):
        FPExp(user_width=-1)
