"""Golden model of the DIMM-PIM fused decode-attention kernel (L3 sections 4.2-4.3) for one head on one rank.

Every arithmetic step is the one of ``docs/pim.md`` in exactly its order (score bank-PU partials, the rank adder
tree over the chips, chunk softmax with running ``M`` / ``Z``, normalization, context accumulators per bank in
token order, final aggregation over the token sets), built from the bit-exact FP primitives
(:mod:`sim.golden.fp16`, :mod:`sim.golden.fp32`, :mod:`sim.golden.exp`), so the RTL compares bit for bit. The
data layout (which bank holds which token) is :mod:`hdl.pim.mapping`. Vectorized: 128K tokens x 128 dims in a few
seconds. Two sequential recurrences are plain numpy scalar / small-array loops that round exactly like the
units: the running ``Z`` (binary32 ``mul``/``add``, one rounding each) and the context accumulators (binary16
``add``, RNE; numpy computes binary16 sums in binary32 and rounds once, exact per :mod:`sim.golden.fp16`).
NaNs are canonicalized.

:func:`pim_attention` returns a :class:`PIMAttentionResult` with every intermediate (per-chip partials, scores,
exponentials, per-chunk ``m`` / ``z``, running ``M`` / ``Z``, ``g``, ``p``, bank accumulators) for stage-by-stage
RTL comparison. :func:`accuracy` / :func:`accuracy_table` measure the output against float64 attention of the
same FP16 inputs.
"""

from dataclasses import dataclass

import numpy as np

from hdl.fp.format import FP16, FP32
from . import fp16, fp32
from .bits import as_bits, canonicalize_nan, to_float64
from .exp import exp as exp16

__all__ = ["PIMAttentionResult", "pim_attention", "reference_float64", "accuracy", "accuracy_table",
           "make_inputs", "prescale_query", "DISTRIBUTIONS", "MUTATIONS"]

NEG_INF16 = np.uint16(0xFC00)
_SIGN16 = np.uint16(FP16.sign_mask)
#: Deliberately wrong kernels (tests show the golden model is sensitive to the contract's order).
MUTATIONS = ("no_rescale", "chip_sequential", "context_reverse")


@dataclass
class PIMAttentionResult:
    """Outputs and intermediates (FP16 as uint16, FP32 as uint32). ``Lp = ceil(L / B) * B`` score slots,
    ``nc = Lp / B`` chunks, ``C`` chips, ``B`` logic banks."""
    out: np.ndarray           # (d,) FP16: the attention output
    partial: np.ndarray       # (C, Lp) FP16: bank PU partial dot products (chip c, token t; t >= L on zero K)
    score: np.ndarray         # (Lp,) FP16: rank adder tree; -inf for t >= L
    e: np.ndarray             # (Lp,) FP16: exp16(s_t - m_j) (rank PU buffer)
    m: np.ndarray             # (nc,) FP16: chunk maxima
    z: np.ndarray             # (nc,) FP32: chunk sums
    M_run: np.ndarray         # (nc,) FP16: running maximum after chunk j
    Z_run: np.ndarray         # (nc,) FP32: running sum after chunk j
    M: int                    # final M (FP16 bits)
    Z: int                    # final Z (FP32 bits)
    z_m: int                  # FP16 bits of f16(z_m), z_m in [1, 2)
    s: int                    # Z = z_m * 2**s
    f: np.ndarray             # (nc,) FP16: exp16(m_j - M)
    g: np.ndarray             # (nc,) FP16: f_j / f16(z_m)
    p: np.ndarray             # (Lp,) FP16: probabilities (+0 for t >= L)
    bank_acc: np.ndarray      # (C, B, 4) FP16: context accumulators of bank PU (chip c, logic bank b), element j
    L: int


def _tree(x, op):
    """Balanced reduction over the last axis, pairs (0,1), (2,3), ... in index order; an odd last one passes."""
    while x.shape[-1] > 1:
        n = x.shape[-1]
        y = op(x[..., 0:n - 1:2], x[..., 1:n:2])
        x = np.concatenate([y, x[..., n - 1:]], axis=-1) if n % 2 else y
    return x[..., 0]


def _max16(a, b):
    return fp16.max_cmp(a, b)[0]


def _neg(x):
    return (x ^ _SIGN16).astype(np.uint16)


def _mul32(a, b):
    with np.errstate(all="ignore"):
        return canonicalize_nan((a.view(np.float32) * b.view(np.float32)).view(np.uint32), FP32)


def _prefix_max16(m):
    """Running max16 (exact and associative in FPMax's total order -0 < +0; NaN-absorbing)."""
    key = np.where(m & 0x8000, -(m & 0x7FFF).astype(np.int32) - 1, m.astype(np.int32))
    run = np.maximum.accumulate(key)
    bits = np.where(run < 0, (-(run + 1)) | 0x8000, run).astype(np.uint16)
    f = m.view(np.float16)
    nan = np.logical_or.accumulate(np.isnan(f))
    return np.where(nan, np.uint16(FP16.qnan_bits), bits).astype(np.uint16)


def _check_inputs(config, q, K, V, L):
    d = config.head_dim
    q = as_bits(q, FP16, "q")
    K = as_bits(K, FP16, "K")
    V = as_bits(V, FP16, "V")
    if q.shape != (d,) or K.ndim != 2 or K.shape[1] != d or V.shape != K.shape:
        raise ValueError(f"shapes must be q ({d},), K (L, {d}), V (L, {d}); got {q.shape}, {K.shape}, {V.shape}")
    L = K.shape[0] if L is None else int(L)
    if not 1 <= L <= min(K.shape[0], config.max_tokens):
        raise ValueError(f"L = {L} outside [1, min(len(K) = {K.shape[0]}, config.max_tokens = "
                         f"{config.max_tokens})]")
    return q, K[:L], V[:L], L


def pim_attention(config, q, K, V, *, L=None, mutation=None) -> PIMAttentionResult:
    """The fused kernel for one head: ``q`` (d,) prescaled query (host/attention.prepare_query), ``K``, ``V``
    (L, d), all FP16 bits (uint16). ``mutation``: one of :data:`MUTATIONS` (a deliberately wrong order, for
    tests only)."""
    if mutation is not None and mutation not in MUTATIONS:
        raise ValueError(f"mutation must be None or one of {MUTATIONS}, got {mutation!r}")
    q, K, V, L = _check_inputs(config, q, K, V, L)
    B, C, bpt, G, d = config.banks, config.chips, config.bursts_per_token, config.token_sets, config.head_dim
    nc = -(-L // B)
    Lp = nc * B
    Kp = np.zeros((Lp, d), np.uint16)
    Kp[:L] = K

    # ---- score: bank PU (chip c, token t): per burst k a 4-product tree, accumulated over k from +0
    prod = fp16.mul(Kp.reshape(Lp, C, bpt, 4), q.reshape(1, C, bpt, 4))
    tree = fp16.add(fp16.add(prod[..., 0], prod[..., 1]), fp16.add(prod[..., 2], prod[..., 3]))  # (Lp, C, bpt)
    acc = np.zeros((Lp, C), np.uint16)
    for k in range(bpt):
        acc = fp16.add(acc, tree[..., k])
    partial = acc
    if mutation == "chip_sequential":
        s = partial[:, 0]
        for c in range(1, C):
            s = fp16.add(s, partial[:, c])
    else:
        s = _tree(partial, fp16.add)
    s = s.copy()
    s[L:] = NEG_INF16

    # ---- chunk softmax
    sc = s.reshape(nc, B)
    m = _tree(sc, _max16)
    e = exp16(fp16.add(sc, _neg(m)[:, None]))                          # (nc, B)
    z = _tree(fp16.to_f32(e), fp32.add)                                # (nc,) uint32
    M_run = _prefix_max16(m)
    M_prev = np.concatenate([M_run[:1], M_run[:-1]])
    a = fp16.to_f32(exp16(fp16.add(M_prev, _neg(M_run))))
    b = fp16.to_f32(exp16(fp16.add(m, _neg(M_run))))
    zf, af, bf = z.view(np.float32), a.view(np.float32), b.view(np.float32)
    Zr = np.empty(nc, np.float32)
    with np.errstate(all="ignore"):
        Zc = zf[0]
        Zr[0] = Zc
        if mutation == "no_rescale":
            for j in range(1, nc):
                Zc = Zc + zf[j]
                Zr[j] = Zc
        else:
            for j in range(1, nc):
                Zc = af[j] * Zc
                Zc = Zc + bf[j] * zf[j]
                Zr[j] = Zc
    Z_run = canonicalize_nan(Zr.view(np.uint32), FP32)
    M, Z = M_run[-1], Z_run[-1]
    Zv = float(Z.view(np.float32))
    if np.isfinite(Zv) and Zv > 0:
        mant, ex = np.frexp(np.float32(Zv))              # Z = mant * 2**ex, mant in [0.5, 1): exact split
        zm32 = np.float32(mant * 2)
        sexp = int(ex) - 1
    else:
        zm32, sexp = np.float32(Zv), 0
    z_m = fp16.from_f32(np.asarray(zm32, np.float32).view(np.uint32))
    if not 0 <= sexp <= 24:
        raise AssertionError(f"Z = {Zv}: exponent {sexp} outside the FP16 scale range")
    two_m_s = np.float16(2.0 ** -sexp).view(np.uint16)    # exact FP16 (subnormal below 2**-14)

    # ---- normalization per chunk
    f = exp16(fp16.add(m, _neg(np.broadcast_to(M, m.shape))))
    if mutation == "no_rescale":
        f = np.full_like(m, 0x3C00)   # every chunk as if its own maximum were the global one
    g = fp16.div(f, np.broadcast_to(z_m, f.shape))
    p = fp16.mul(fp16.mul(e, g[:, None]), two_m_s).ravel()
    p[L:] = 0

    # ---- context: bank (c, g bpt + k) accumulates tokens t = v G + g (ascending v), 4 elements each
    nv = -(-L // G)
    Lv = nv * G
    Vp = np.zeros((Lv, d), np.uint16)
    Vp[:L] = V
    order = range(nv - 1, -1, -1) if mutation == "context_reverse" else range(nv)
    if getattr(config, "context_acc", "fp16") == "fp32":
        # exact FP16 x FP16 products summed in binary32 (numpy float32 adds round like FPAdd32), one rounding
        # to FP16 per bank accumulator at the end
        cprod = fp16.mul_wide(Vp, p[:Lv, None]).reshape(nv, G, d).view(np.float32)
        accs = np.zeros((G, d), np.float32)
        with np.errstate(all="ignore"):
            for v in order:
                accs = accs + cprod[v]
        accs = fp16.from_f32(canonicalize_nan(accs.view(np.uint32), FP32))
    else:
        cprod = fp16.mul(Vp, p[:Lv, None]).reshape(nv, G, d).view(np.float16)
        accs = np.zeros((G, d), np.float16)
        with np.errstate(all="ignore"):
            for v in order:
                accs = accs + cprod[v]
        accs = canonicalize_nan(accs.view(np.uint16), FP16)
    # final aggregation: r = acc(g=0); r = add16(r, acc(g)) for g = 1 .. G-1
    out = accs[0]
    for gi in range(1, G):
        out = fp16.add(out, accs[gi])
    bank_acc = accs.reshape(G, C, bpt, 4).transpose(1, 0, 2, 3).reshape(C, B, 4)
    return PIMAttentionResult(out=out, partial=np.ascontiguousarray(partial.T), score=s, e=e.ravel(), m=m, z=z,
                              M_run=M_run, Z_run=Z_run, M=int(M), Z=int(Z), z_m=int(z_m), s=sexp, f=f, g=g, p=p,
                              bank_acc=bank_acc, L=L)


# ---- accuracy ---------------------------------------------------------------------------------------------

def reference_float64(q, K, V) -> np.ndarray:
    """softmax(q K^T) V in float64 on the FP16 inputs (q already prescaled, so no further scale)."""
    qf, kf, vf = to_float64(q), to_float64(K), to_float64(V)
    sc = kf @ qf
    e = np.exp(sc - sc.max())
    return (e @ vf) / e.sum()


def accuracy(out_bits, ref) -> dict:
    """``norm_rel`` = max |out - ref| / max |ref|; ``mean_rel`` = mean |out - ref| / mean |ref|."""
    o = to_float64(out_bits)
    err = np.abs(o - ref)
    return {"norm_rel": float(err.max() / np.abs(ref).max()), "mean_rel": float(err.mean() / np.abs(ref).mean())}


#: Input distributions of the accuracy table. ``normal``: q, K, V ~ N(0, 1) (q prescaled by 1/sqrt(d)).
#: ``hard``: K with log-normal per-channel scales (outlier channels, sigma 1) and q ~ N(0, 2^2), so the scores
#: spread over tens (peaky softmax, many exponentials far below 1), and V ~ N(2, 1) (a non-zero mean: the
#: FP16 context accumulators carry a large value while adding small p V terms).
DISTRIBUTIONS = ("normal", "hard")


def make_inputs(config, L, dist="normal", seed=0):
    """``(q_bits, K_bits, V_bits)`` for ``L`` tokens (q prescaled by 1/sqrt(d) with host/attention.prepare_query)."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"dist must be one of {DISTRIBUTIONS}, got {dist!r}")
    rng = np.random.default_rng(seed)
    d = config.head_dim
    q = rng.standard_normal(d)
    K = rng.standard_normal((L, d), dtype=np.float32)
    V = rng.standard_normal((L, d), dtype=np.float32)
    if dist == "hard":
        q = q * 2.0
        K = K * np.exp(rng.standard_normal(d)).astype(np.float32)
        V = V + 2.0
    return prescale_query(q), K.astype(np.float16).view(np.uint16), V.astype(np.float16).view(np.uint16)


def prescale_query(q, scale=None) -> np.ndarray:
    """``q * scale`` rounded once to FP16 bits (uint16), ``scale`` defaulting to ``1 / sqrt(d)``: the query the
    rank PU receives (``docs/pim.md``: the host prescales it). ``q``: floats or FP16 bits, (d,) or (R, d). The
    host's rule, :func:`sim.golden.attention.prepare_query`."""
    from sim.golden.attention import prepare_query
    return prepare_query(q, scale)


def accuracy_table(config, lengths, dists=DISTRIBUTIONS, seed=0):
    """Rows ``(dist, L, norm_rel, mean_rel)`` of the fused kernel against :func:`reference_float64`."""
    rows = []
    for dist in dists:
        for L in lengths:
            q, K, V = make_inputs(config, L, dist, seed)
            r = pim_attention(config, q, K, V)
            a = accuracy(r.out, reference_float64(q, K, V))
            rows.append((dist, L, a["norm_rel"], a["mean_rel"]))
    return rows
