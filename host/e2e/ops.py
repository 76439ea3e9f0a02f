"""The GPU side of the hybrid run: FP16 tensors (uint16 bit patterns), float32 arithmetic, one rounding to FP16
per operator (what a GPU kernel with FP32 accumulation and FP16 storage does).

Every function is deterministic numpy, so the ``rtl`` and ``golden`` backends, which differ only in who
computes the device results, produce bit-identical GPU results from bit-identical device results. The order
of operations is fixed here and documented per function; :mod:`host.e2e.reference` is the same model in plain
float32 without the FP16 roundings (the accuracy yardstick).
"""

import numpy as np

__all__ = ["f32", "f16", "linear", "add", "rmsnorm", "rope_tables", "rope", "swiglu", "embed", "logits",
           "gpu_attention_partial", "attention_full"]


def f32(bits) -> np.ndarray:
    """FP16 bits -> float32 (exact)."""
    return np.asarray(bits, np.uint16).view(np.float16).astype(np.float32)


def f16(x) -> np.ndarray:
    """float32 -> FP16 bits, round to nearest even (one rounding)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).view(np.uint16)


def linear(x, w) -> np.ndarray:
    """``x @ w``: FP16 operands, float32 product and sum (numpy's float32 GEMM), rounded to FP16."""
    return f16(f32(x) @ f32(w))


def add(a, b) -> np.ndarray:
    """Element-wise FP16 + FP16 in float32, rounded (residual connections, LoRA deltas)."""
    return f16(f32(a) + f32(b))


def rmsnorm(x, g, eps: float) -> np.ndarray:
    """RMSNorm (Zhang and Sennrich 2019; LLaMA): ``x / sqrt(mean(x^2) + eps) * g``, float32, rounded once."""
    xf = f32(x)
    r = np.float32(1.0) / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps))
    return f16(xf * r * f32(g))


def rope_tables(head_dim: int, positions, theta: float) -> tuple:
    """(cos, sin) float32 of shape (len(positions), head_dim / 2): angle ``p * theta^(-2i/d)``."""
    inv = (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope(x, positions, n_heads: int, head_dim: int, theta: float) -> np.ndarray:
    """Rotary embedding (LLaMA / Hugging Face "rotate half": element i pairs with i + d/2) of ``x`` (T, H*d)
    FP16 bits at ``positions`` (T,), float32, rounded once."""
    xf = f32(x).reshape(len(positions), n_heads, head_dim)
    cos, sin = rope_tables(head_dim, positions, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    h = head_dim // 2
    a, b = xf[..., :h], xf[..., h:]
    out = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    return f16(out.reshape(len(positions), n_heads * head_dim))


def swiglu(gate, up) -> np.ndarray:
    """``silu(gate) * up`` in float32 (silu(x) = x / (1 + exp(-x))), rounded once."""
    g = f32(gate)
    return f16(g / (np.float32(1.0) + np.exp(-g)) * f32(up))


def embed(table, tokens) -> np.ndarray:
    return np.asarray(table)[np.asarray(tokens, np.int64)]


def logits(x, norm, lm_head, eps: float) -> np.ndarray:
    """Final RMSNorm (FP16) and the LM head in float32: the logits stay float32 (compared bit for bit)."""
    return f32(rmsnorm(x, norm, eps)) @ f32(lm_head)


def gpu_attention_partial(q_scaled, K, V):
    """The GPU's partial attention over its share of the KV (the HBM-resident tokens), in the devices' partial
    format so that :func:`sim.golden.attention.merge_partials` merges it with theirs: ``q_scaled`` (d,) FP16 bits
    (pre-scaled by 1/sqrt(d), as the devices get it), ``K``, ``V`` (L, d) FP16 bits. Scores ``s = q K^T`` in
    float32, ``m = fp16(max s)``, ``e = exp(s - m)`` float32, ``sum = sum e`` (float32), ``o = fp16(e V)``.
    Returns ``(o uint16 (d,), m uint16 (), sum uint32 ())``."""
    s = f32(K) @ f32(q_scaled)
    m = f16(np.max(s))
    e = np.exp(s - f32(m)).astype(np.float32)
    tot = np.sum(e, dtype=np.float32)
    return f16(e @ f32(V)), np.asarray(m, np.uint16), np.asarray(tot, np.float32).view(np.uint32)


def attention_full(q, K, V) -> np.ndarray:
    """Whole-context attention of one head on the GPU (prefill, or a decode whose KV is all in HBM): float32
    ``softmax(q K^T / sqrt(d)) V`` with causal rows (``q`` (T, d) for the last T positions of K), FP16 out."""
    qf, kf, vf = f32(q), f32(K), f32(V)
    T, L = qf.shape[0], kf.shape[0]
    s = (qf @ kf.T) * np.float32(1.0 / np.sqrt(qf.shape[1]))
    mask = np.arange(L)[None, :] > (L - T + np.arange(T))[:, None]
    s = np.where(mask, np.float32(-np.inf), s)
    s = s - s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return f16((e @ vf) / e.sum(axis=1, keepdims=True))
