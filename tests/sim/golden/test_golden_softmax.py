"""sim/golden/softmax.py: order of operations (self-consistency) and accuracy against float64."""

import numpy as np
import pytest

from sim.golden import fp16, fp32
from sim.golden.exp import exp as exp16
from sim.golden.softmax import softmax_rows, row_max, accuracy, to_float64, PHASES

NEG_INF, POS_INF, QNAN = 0xFC00, 0x7C00, 0x7E00  # FP16 encodings (IEEE 754 binary16)


def scores(rng, rows, length, scale=3.0):
    return (scale * rng.standard_normal((rows, length))).astype(np.float16).view(np.uint16)


def scalar_reference(p, lanes):
    """The documented order, element by element with scalar calls (independent of the vectorized model)."""
    rows, length = p.shape
    nb = length // lanes
    e = np.zeros_like(p)
    ms, sums = [], []
    for r in range(rows):
        acc = [None] * lanes
        for q in range(nb):
            for lane in range(lanes):
                x = p[r, q * lanes + lane]
                acc[lane] = fp16.max_cmp(x, x if q == 0 else acc[lane])[0]
        level = acc
        while len(level) > 1:
            level = [fp16.max_cmp(level[i], level[i + 1])[0] for i in range(0, len(level), 2)]
        m = level[0]
        ms.append(m)
        for j in range(length):
            e[r, j] = exp16(fp16.add(p[r, j], np.uint16(m ^ 0x8000)))
        phase = [np.uint32(0)] * PHASES
        for q in range(nb):
            level = [fp16.to_f32(e[r, q * lanes + lane]) for lane in range(lanes)]
            while len(level) > 1:
                level = [fp32.add(level[i], level[i + 1]) for i in range(0, len(level), 2)]
            phase[q % PHASES] = fp32.add(phase[q % PHASES], level[0])
        sums.append(fp32.add(fp32.add(phase[0], phase[1]), fp32.add(phase[2], phase[3])))
    return e, np.array(ms, np.uint16), np.array(sums, np.uint32)


def test_documented_phase_count():
    # The final phase tree in scalar_reference and the docs is written for 4 phases (FP32 FPAdd latency).
    assert PHASES == 4


@pytest.mark.parametrize("lanes,length", [(1, 7), (2, 6), (4, 4), (4, 36), (8, 64)])
def test_order_of_operations(lanes, length):
    rng = np.random.default_rng(lanes * 100 + length)
    p = scores(rng, 5, length)
    p[1, :] = p[1, 0]                                   # equal values
    p[2, ::3] = 0x8000                                  # -0 among negatives
    p[2, 1::3] = 0x0000
    p[3, 0] = NEG_INF
    p[4, -1] = QNAN | 0x0001                            # non-canonical NaN poisons its row
    e, m, s = softmax_rows(p, lanes)
    er, mr, sr = scalar_reference(p, lanes)
    assert np.array_equal(e, er) and np.array_equal(m, mr) and np.array_equal(s, sr)
    assert np.array_equal(row_max(p, lanes), m)
    assert e.dtype == np.uint16 and m.dtype == np.uint16 and s.dtype == np.uint32


def test_properties_and_specials():
    rng = np.random.default_rng(5)
    p = scores(rng, 6, 32)
    p[0] = 0x8000                                        # all -0: m = -0, E = exp(-0 - -0) = exp(+0) = 1
    p[1, :16] = 0x0000                                   # -0 and +0: m = +0 (FPMax orders -0 < +0)
    p[1, 16:] = 0x8000
    p[2] = NEG_INF                                       # all -inf: -inf - -inf = NaN
    p[3, 5] = POS_INF                                    # +inf: inf - inf = NaN there, exp(-inf) = 0 elsewhere
    p[4, 7] = QNAN
    p[5, 3] = NEG_INF                                    # one -inf: contributes exactly 0
    for lanes in (1, 4, 8):
        e, m, s = softmax_rows(p, lanes)
        f = to_float64(p)
        assert m[0] == 0x8000 and np.all(e[0] == 0x3C00) and to_float64(s[0]) == 32.0
        assert m[1] == 0x0000 and np.all(e[1] == 0x3C00)
        assert m[2] == NEG_INF and np.all(e[2] == QNAN) and np.isnan(to_float64(s[2]))
        assert m[3] == POS_INF and e[3, 5] == QNAN and np.all(np.delete(e[3], 5) == 0) and np.isnan(to_float64(s[3]))
        assert m[4] == QNAN and np.all(e[4] == QNAN)
        assert e[5, 3] == 0 and to_float64(m[5]) == np.max(f[5])
        # Finite rows: the maximum element gives exactly 1.0 and no E exceeds it.
        for r in (0, 1, 5):
            assert np.max(to_float64(e[r])) == 1.0
        # E and m do not depend on the lane count; the sum only through the FP32 order (a few ulps at most).
        e1, m1, s1 = softmax_rows(p, 1)
        assert np.array_equal(e, e1) and np.array_equal(m, m1)
        ok = np.isfinite(to_float64(s1))
        assert np.allclose(to_float64(s)[ok], to_float64(s1)[ok], rtol=1e-6, atol=0)


def test_accuracy_within_bounds():
    """Every E within the FP16 bound of the spec's order: the FP16 rounding of x = p - m
    (|dx| <= |x| 2**-11) then FPExp's 1 ulp + the final half ulp; sum and softmax accordingly."""
    rng = np.random.default_rng(2026)
    for scale, shift, lanes, length in [(1.0, 0.0, 4, 1024), (3.0, 0.0, 64, 1024), (4.0, 100.0, 8, 512),
                                        (8.0, -20.0, 2, 256)]:
        p = (shift + scale * rng.standard_normal((16, length))).astype(np.float16).view(np.uint16)
        e, m, s = softmax_rows(p, lanes)
        x = to_float64(p)
        assert np.array_equal(to_float64(m), x.max(axis=1))
        xm = x - x.max(axis=1, keepdims=True)
        e_ref = np.exp(xm)
        rel_bound = (1 + 1.5 * 2.0 ** -10) * np.exp(np.abs(xm) * 2.0 ** -11) - 1
        err = np.abs(to_float64(e) - e_ref)
        assert np.all(err <= rel_bound * e_ref + 1.5 * 2.0 ** -24)  # + the subnormal ulp, absolute
        s_ref = e_ref.sum(axis=1)
        n_adds = np.log2(lanes) + length / lanes / PHASES + 2
        s_bound = (rel_bound * e_ref + 1.5 * 2.0 ** -24).sum(axis=1) + n_adds * 2.0 ** -24 * s_ref
        assert np.all(np.abs(to_float64(s) - s_ref) <= s_bound)
        sm = to_float64(e) / to_float64(s)[:, None]
        sm_ref = e_ref / s_ref[:, None]
        assert np.max(np.abs(sm - sm_ref)) < 1e-4
        acc = accuracy(p, lanes)
        assert acc["m_exact"] and acc["finite_rows"] == 16
        assert acc["e_max_rel"] < 1e-2 and acc["sum_max_rel"] < 1e-3 and acc["softmax_max_rel"] < 1e-2
        assert acc["sum_vs_e_max_rel"] < 1e-6
        print(f"\nscale {scale} shift {shift} lanes {lanes} L {length}: " +
              ", ".join(f"{k} {v:.3e}" for k, v in acc.items() if isinstance(v, float)))


def test_bad_arguments():
    p = np.zeros((2, 8), np.uint16)
    with pytest.raises(ValueError, match="lanes must be a power of two"):
        softmax_rows(p, 3)
    with pytest.raises(ValueError, match="multiple of lanes"):
        softmax_rows(p, 16)
    with pytest.raises(ValueError, match="2-D"):
        softmax_rows(p[0], 1)
    with pytest.raises(TypeError, match="uint16"):
        softmax_rows(p.astype(np.float16), 1)
