"""Fused PIM attention golden model (sim/golden/pim_attention.py): a naive per-bank model that reads the KV store
image through hdl/pim/mapping agrees bit for bit; accuracy vs float64; wrong orders give other bits."""

import numpy as np
import pytest

from hdl.pim import mapping as mp
from hdl.pim.config import PAPER, TINY
from sim.golden.attention import reference_attention
from sim.dram.device import flat_burst_address
from sim.golden import fp16, fp32, pim_attention as pa
from sim.golden.exp import exp as exp16


def _u16(x):
    return int(np.asarray(x, np.uint16))


def _naive(cfg, q, K, V):
    """Scalar transcription of docs/pim.md, with the bank data read from the DRAM image via the mapping."""
    L = K.shape[0]
    B, C, E, bpt, G = cfg.banks, cfg.chips, cfg.elems_per_chip, cfg.bursts_per_token, cfg.token_sets
    lay = mp.head_layout(cfg, L, 1)
    img = mp.kv_store_image(cfg, K, V, lay)
    org = cfg.dram.org
    A = lambda a, b: _u16(fp16.add(a, b))
    Mu = lambda a, b: _u16(fp16.mul(a, b))
    X = lambda x: _u16(exp16(np.uint16(x)))
    neg = lambda x: x ^ 0x8000
    # score: bank PU (c, b) over its bursts k
    partial = {}
    for i, (row, col) in enumerate(zip(mp.score_reads(cfg, L).row, mp.score_reads(cfg, L).col)):
        reads = mp.score_reads(cfg, L)
        for b in range(B):
            t, k = int(reads.token[i, b]), int(reads.burst[i, b])
            el = mp.unpack_rank_bursts(cfg, [img.get(flat_burst_address(org, 0, 0, b, row + lay.k_row0[0], col), 0)])[0]
            for c in range(C):
                qq = [int(q[c * E + 4 * k + j]) for j in range(4)]
                tr = A(A(Mu(qq[0], el[c][0]), Mu(qq[1], el[c][1])), A(Mu(qq[2], el[c][2]), Mu(qq[3], el[c][3])))
                partial[c, t] = A(partial.get((c, t), 0), tr)
    Lp = -(-L // B) * B
    s = []
    for t in range(Lp):
        lvl = [partial[c, t] for c in range(C)]
        while len(lvl) > 1:
            lvl = [A(lvl[i], lvl[i + 1]) for i in range(0, len(lvl), 2)]
        s.append(lvl[0] if t < L else 0xFC00)
    # chunk softmax
    es, ms, zs = [], [], []
    for j in range(Lp // B):
        ch = s[j * B:(j + 1) * B]
        lvl = list(ch)
        while len(lvl) > 1:
            lvl = [_u16(fp16.max_cmp(np.uint16(lvl[i]), np.uint16(lvl[i + 1]))[0]) for i in range(0, len(lvl), 2)]
        m = lvl[0]
        e = [X(A(x, neg(m))) for x in ch]
        lvl = [int(fp16.to_f32(np.uint16(x))) for x in e]
        while len(lvl) > 1:
            lvl = [int(fp32.add(np.uint32(lvl[i]), np.uint32(lvl[i + 1]))) for i in range(0, len(lvl), 2)]
        es += e
        ms.append(m)
        zs.append(lvl[0])
    f32 = lambda x: np.uint16(x).view(np.float16).astype(np.float32)
    M, Z = ms[0], np.uint32(zs[0]).view(np.float32)
    for j in range(1, len(ms)):
        M2 = _u16(fp16.max_cmp(np.uint16(M), np.uint16(ms[j]))[0])
        a, b = X(A(M, neg(M2))), X(A(ms[j], neg(M2)))
        Z = np.float32(Z * f32(a)) + np.float32(np.uint32(zs[j]).view(np.float32) * f32(b))
        M = M2
    mant, ex = np.frexp(np.float32(Z))
    zm, sh = _u16(np.float32(mant * 2).astype(np.float16).view(np.uint16)), int(ex) - 1
    two = _u16(np.float16(2.0 ** -sh).view(np.uint16))
    p = []
    for j, m in enumerate(ms):
        g = _u16(fp16.div(np.uint16(X(A(m, neg(M)))), np.uint16(zm)))
        p += [Mu(Mu(es[j * B + i], g), two) if j * B + i < L else 0 for i in range(B)]
    # context: bank PU (c, b) accumulates its 4 elements for each RD_AB (tokens ascending)
    acc = {}
    reads = mp.context_reads(cfg, L)
    for i, (row, col) in enumerate(zip(reads.row, reads.col)):
        for b in range(B):
            t = int(reads.token[i, b])
            el = mp.unpack_rank_bursts(cfg, [img.get(flat_burst_address(org, 0, 0, b, row + lay.v_row0[0], col), 0)])[0]
            pt = p[t] if t < len(p) else 0
            for c in range(C):
                for j in range(4):
                    acc[c, b, j] = A(acc.get((c, b, j), 0), Mu(pt, el[c][j]))
    out = []
    for i in range(cfg.head_dim):
        c, k, j = i // E, (i % E) // 4, i % 4
        r = acc[c, k, j]
        for g in range(1, G):
            r = A(r, acc[c, g * bpt + k, j])
        out.append(r)
    return np.array(out, np.uint16), np.array(s, np.uint16), np.array(p, np.uint16)


@pytest.mark.parametrize("L", [1, 16, 37, 80])
def test_matches_naive_per_bank_model(L):
    q, K, V = pa.make_inputs(TINY, L, "hard" if L == 37 else "normal", seed=L)
    r = pa.pim_attention(TINY, q, K, V)
    out, s, p = _naive(TINY, q, K, V)
    assert np.array_equal(r.score, s)
    assert np.array_equal(r.p, p)
    assert np.array_equal(r.out, out)


def test_paper_geometry_naive_small():
    q, K, V = pa.make_inputs(PAPER, 20, "normal", seed=3)
    out, s, p = _naive(PAPER, q, K, V)
    r = pa.pim_attention(PAPER, q, K, V)
    assert np.array_equal(r.out, out) and np.array_equal(r.p, p)


def test_intermediates_consistent():
    q, K, V = pa.make_inputs(PAPER, 1000, "normal", seed=5)
    r = pa.pim_attention(PAPER, q, K, V)
    nc = -(-1000 // 16)
    assert r.partial.shape == (8, nc * 16) and r.e.shape == (nc * 16,) and r.bank_acc.shape == (8, 16, 4)
    assert np.all(r.score[1000:] == 0xFC00) and np.all(r.p[1000:] == 0) and np.all(r.e[1000:] == 0)
    assert r.M == r.M_run[-1] and r.Z == r.Z_run[-1]
    Z = float(np.uint32(r.Z).view(np.float32))
    assert 1 <= Z <= 1000 and 2 ** r.s <= Z < 2 ** (r.s + 1)
    # M is the maximum score; the final aggregation of the bank accumulators is the output
    assert np.uint16(r.M).view(np.float16) == r.score[:1000].view(np.float16).max()
    acc = r.bank_acc.reshape(8, 4, 4, 4)  # chip, token set, slice, element
    o = acc[:, 0]
    for g in range(1, 4):
        o = fp16.add(o, acc[:, g])
    assert np.array_equal(o.reshape(-1), r.out)


def test_accuracy_vs_float64():
    q, K, V = pa.make_inputs(PAPER, 4096, "normal", seed=0)
    r = pa.pim_attention(PAPER, q, K, V)
    ref = pa.reference_float64(q, K, V)
    assert np.allclose(ref, reference_attention(q, K, V, scale=1.0), rtol=1e-12, atol=0)
    acc = pa.accuracy(r.out, ref)
    assert acc["norm_rel"] < 1e-2 and acc["mean_rel"] < 1e-2
    bad = pa.accuracy(pa.pim_attention(PAPER, q, K, V, mutation="no_rescale").out, ref)
    assert bad["norm_rel"] > 0.1


@pytest.mark.parametrize("mutation", pa.MUTATIONS)
def test_wrong_order_changes_bits(mutation):
    q, K, V = pa.make_inputs(PAPER, 500, "normal", seed=7)
    good = pa.pim_attention(PAPER, q, K, V).out
    bad = pa.pim_attention(PAPER, q, K, V, mutation=mutation).out
    assert np.count_nonzero(good != bad) > 10


def test_errors():
    q, K, V = pa.make_inputs(TINY, 8)
    with pytest.raises(ValueError, match="shapes"):
        pa.pim_attention(TINY, q[:4], K, V)
    with pytest.raises(ValueError, match="max_tokens = 2048"):
        pa.pim_attention(TINY, q, np.zeros((2049, 32), np.uint16), np.zeros((2049, 32), np.uint16))
    with pytest.raises(TypeError):
        pa.pim_attention(TINY, q, K.view(np.float16), V)
    with pytest.raises(ValueError, match="mutation"):
        pa.pim_attention(TINY, q, K, V, mutation="x")


def test_prescale_query_rounds_once_to_fp16():
    """The rank PU's query: q * scale in float64, rounded once to FP16 (scale 1/sqrt(d) by default); FP16-bit input
    is read as FP16. Written independently of the function under test; a bad scale is refused."""
    import numpy as np
    from sim.golden.pim_attention import prescale_query
    rng = np.random.default_rng(3)
    for d in (16, 32, 128):
        q = rng.standard_normal((5, d)) * 50
        want = (q * (1.0 / np.sqrt(d))).astype(np.float16).view(np.uint16)
        assert np.array_equal(prescale_query(q), want)
        qb = q.astype(np.float16).view(np.uint16)
        want_b = (qb[0].view(np.float16).astype(np.float64) * 0.3).astype(np.float16).view(np.uint16)
        assert np.array_equal(prescale_query(qb[0], 0.3), want_b)
    with pytest.raises(ValueError, match="scale"):
        prescale_query(np.ones(4), -1.0)
