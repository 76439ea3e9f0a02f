"""Float32 numpy reference of the tiny model: the same weights and adapters, float32 everywhere (no FP16
rounding of activations, exact softmax, LoRA as ``x A B`` in float32). The accuracy yardstick of the hybrid run:
:func:`teacher_forced_logits` gives the reference's logits along the token sequence the hybrid generated, so
the two are compared position by position (greedy decoding compounds a single flipped token otherwise).
"""

import numpy as np

from .model import TinyWeights, LoraAdapter, MATRICES
from .ops import rope_tables

__all__ = ["forward_f32", "teacher_forced_logits", "greedy_f32", "compare_logits"]


def _rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * g


def _rope(x, positions, H, d, theta):
    x = x.reshape(len(positions), H, d)
    cos, sin = rope_tables(d, positions, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    h = d // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(len(positions), H * d)


def _adapter_f32(adapter):
    if adapter is None:
        return None
    return [{m: (a.view(np.float16).astype(np.float32), b.view(np.float16).astype(np.float32))
             for m, (a, b) in lay.items()} for lay in adapter.mats]


def forward_f32(weights: TinyWeights, adapter: LoraAdapter | None, tokens, *, cache=None, start: int = 0
                ) -> np.ndarray:
    """Causal forward pass over ``tokens`` (positions ``start ..``) in float32; logits (T, vocab) float32 for
    every position. ``cache``: a dict the pass appends its K and V to (per layer), holding the ``start`` earlier
    positions (None: a fresh pass from position 0)."""
    cfg = weights.config
    W = weights.f32
    tokens = np.asarray(tokens, np.int64)
    T = len(tokens)
    H, d = cfg.n_heads, cfg.head_dim
    pos = np.arange(start, start + T)
    x = W["embed"][tokens].astype(np.float32)
    ad = _adapter_f32(adapter) if cache is None or "adapter" not in cache else cache["adapter"]
    if cache is not None:
        cache["adapter"] = ad

    def lin(h, layer, name):
        y = h @ W["layers"][layer][name]
        if ad is not None:
            a, b = ad[layer][name]
            y = y + (h @ a) @ b
        return y

    Ltot = start + T
    mask = np.arange(Ltot)[None, :] > (start + np.arange(T))[:, None]
    for li in range(cfg.n_layers):
        L = W["layers"][li]
        h = _rmsnorm(x, L["attn_norm"], cfg.rms_eps)
        q = _rope(lin(h, li, "q"), pos, H, d, cfg.rope_theta).reshape(T, H, d)
        k = _rope(lin(h, li, "k"), pos, H, d, cfg.rope_theta).reshape(T, H, d)
        v = lin(h, li, "v").reshape(T, H, d)
        if cache is not None:
            kk, vv = cache.get(("k", li)), cache.get(("v", li))
            k = k if kk is None else np.concatenate([kk, k])
            v = v if vv is None else np.concatenate([vv, v])
            cache[("k", li)], cache[("v", li)] = k, v
        att = np.empty((T, H, d), np.float32)
        for hh in range(H):
            s = (q[:, hh] @ k[:, hh].T) * np.float32(1.0 / np.sqrt(d))
            s = np.where(mask, np.float32(-np.inf), s)
            s = s - s.max(axis=1, keepdims=True)
            e = np.exp(s)
            att[:, hh] = (e @ v[:, hh]) / e.sum(axis=1, keepdims=True)
        x = x + lin(att.reshape(T, H * d), li, "o")
        h = _rmsnorm(x, L["ffn_norm"], cfg.rms_eps)
        g, u = lin(h, li, "gate"), lin(h, li, "up")
        x = x + lin(g / (1.0 + np.exp(-g)) * u, li, "down")
    return _rmsnorm(x, W["final_norm"], cfg.rms_eps) @ W["lm_head"]


def teacher_forced_logits(weights, adapter, tokens, n_prompt: int) -> np.ndarray:
    """Reference logits that predict tokens ``n_prompt .. len(tokens)`` (the generated ones, and the one after
    the last): rows ``n_prompt - 1 .. len(tokens) - 1`` of :func:`forward_f32`."""
    return forward_f32(weights, adapter, tokens)[n_prompt - 1:]


def greedy_f32(weights, adapter, prompt, n_new: int) -> list:
    """Greedy decoding of ``n_new`` tokens with the float32 reference (a KV cache of the reference's own K, V)."""
    cache = {}
    toks = [int(t) for t in prompt]
    lg = forward_f32(weights, adapter, toks, cache=cache)[-1]
    out = []
    for _ in range(n_new):
        t = int(np.argmax(lg))
        out.append(t)
        lg = forward_f32(weights, adapter, [t], cache=cache, start=len(toks) + len(out) - 1)[-1]
    return out


def compare_logits(hybrid, ref) -> dict:
    """Accuracy of the hybrid's logits (float32 rows) against the reference's: max abs error, max abs error
    relative to the reference's max |logit|, top-1 agreement, and the smallest top-1 margin of the reference."""
    hyb, ref = np.asarray(hybrid, np.float64), np.asarray(ref, np.float64)
    err = np.abs(hyb - ref)
    top_h, top_r = hyb.argmax(axis=-1), ref.argmax(axis=-1)
    srt = np.sort(ref, axis=-1)
    return {"positions": int(len(ref)), "max_abs_err": float(err.max()),
            "rel_err": float(err.max() / np.abs(ref).max()),
            "top1_agree": float(np.mean(top_h == top_r)),
            "min_ref_margin": float((srt[:, -1] - srt[:, -2]).min())}
