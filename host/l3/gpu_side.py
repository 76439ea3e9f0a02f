"""GPU-side times of one replica (its TP group), all layers, from host-core's GPU model (:mod:`host.gpu`).

:class:`GPUSide` answers the three questions the L3 systems ask, in seconds for a whole forward pass (all
layers) on the replica's TP group:

* :meth:`GPUSide.fc`: the batched operators of ``tokens`` tokens: QKV / O / FFN GEMMs, norms, rotary, activation,
  residual, embedding, final norm, the LM head over ``logits`` tokens and the two all-reduces per layer (TP > 1,
  the measured DGX NCCL profile). This is ``GPUModel.iteration`` without attention, evaluated vectorized over
  the token count from the model's public operator functions and tabulated once per replica (``iteration``
  costs ~1 ms per call; a run asks tens of thousands of times). Held equal to ``GPUModel.iteration`` in
  ``tests/host/l3/test_l3_gpu_side.py``;
* :meth:`GPUSide.prefill_attn`: prefill attention of chunks (one varlen kernel: ``GPUModel.attention_prefill``);
* :meth:`GPUSide.decode_attn`: decode attention on the GPU over KV in HBM (``GPUModel.attention_decode``), for
  the GPU-only baseline and NEO's GPU-resident requests; vectorized over the KV token total (fused runs).
"""

from functools import lru_cache

import numpy as np

from host.gpu import GPUModel

__all__ = ["GPUSide", "gpu_model"]


@lru_cache(maxsize=4)
def gpu_model(gpu_name: str) -> GPUModel:
    """One calibrated GPU model per GPU type and process (loading the calibration and NCCL profile is slow)."""
    return GPUModel(gpu_name)


class GPUSide:
    """Times of one TP group of ``setup`` (a :class:`host.l3.config.L3Setup`)."""

    def __init__(self, setup, gpu: GPUModel | None = None):
        m = setup.model
        if m.is_moe:
            raise ValueError(f"{m.name}: the L3 GPU side prices dense models only")
        self.setup, self.model, self.tp = setup, m, setup.tp
        self.g = gpu if gpu is not None else gpu_model(setup.node.gpu.name)
        self.heads = m.n_heads // self.tp
        self.kv_heads = max(m.n_kv_heads // self.tp, 1)
        self.n_layers = m.n_layers
        self._table = np.zeros(0)
        self._grow(4096)

    # ---- batched operators ----------------------------------------------------------------------------------
    def _dense(self, tokens: np.ndarray) -> np.ndarray:
        """All-layer time of everything but attention and the LM head, for each token count (vectorized
        version of ``GPUModel._dense_part``)."""
        m, tp, g = self.model, self.tp, self.g
        L, H = m.n_layers, m.d_model
        T = tokens.astype(np.float64)
        t = np.zeros_like(T)
        for lin in m.linears(tp):
            t += L * np.asarray(g.gemm(T, lin.k, lin.n).calibrated_s)
        q_dim, kv_dim, ff = m.q_dim / tp, max(m.kv_dim / tp, m.head_dim), m.ffn_width() / tp
        act = (6.0 if m.gated_mlp else 4.0) * ff
        elt = lambda op, b: np.asarray(g.elementwise(op, b).calibrated_s)
        t += L * (elt("input_layernorm", 4.0 * T * H) + elt("attn_rope", 4.0 * T * (q_dim + kv_dim))
                  + elt("post_attention_layernorm", 4.0 * T * H) + elt("mlp_act", act * T) + elt("add", 6.0 * T * H))
        t += elt("emb", 4.0 * T * H) + elt("input_layernorm", 4.0 * T * H)
        if tp > 1:
            t += 2 * L * np.asarray(g.all_reduce(2.0 * T * H, tp).calibrated_s)
        return np.where(T > 0, t, 0.0)

    def _grow(self, n):
        n = max(int(n), 2 * len(self._table))
        self._table = self._dense(np.arange(n + 1))

    def fc(self, tokens, logits=None):
        """Batched operators over ``tokens`` tokens (vectorized), with the LM head over ``logits`` tokens
        (default: none)."""
        tok = np.asarray(tokens, dtype=np.int64)
        if tok.size and tok.max() >= len(self._table):
            self._grow(int(tok.max()) + 1)
        out = self._table[tok]
        if logits is not None:
            out = out + self.lm_head(logits)
        return float(out) if np.ndim(out) == 0 else out

    def lm_head(self, logits):
        lg = np.asarray(logits, dtype=np.float64)
        t = np.asarray(self.g.gemm(lg, self.model.d_model, self.model.vocab / self.tp).calibrated_s)
        t = np.where(lg > 0, t, 0.0)
        return float(t) if t.ndim == 0 else t

    # ---- attention -----------------------------------------------------------------------------------------
    def prefill_attn(self, q, kv) -> float:
        """Prefill attention of chunks ``q[i]`` new tokens over ``kv[i]`` = context + new tokens (one kernel),
        all layers."""
        q = np.asarray(q, dtype=np.int64)
        if not q.size:
            return 0.0
        a = self.g.attention_prefill(q, np.asarray(kv, dtype=np.int64), heads=self.heads, kv_heads=self.kv_heads,
                                     head_dim=self.model.head_dim)
        return self.n_layers * float(a.calibrated_s)

    def prefill_attn_each(self, q, kv) -> np.ndarray:
        """:meth:`prefill_attn` of each chunk alone (the per-request samples RFR_p learns)."""
        return np.array([self.prefill_attn([a], [b]) for a, b in zip(np.asarray(q), np.asarray(kv))])

    def decode_attn(self, n_requests, kv_tokens):
        """GPU decode attention of ``n_requests`` requests over ``kv_tokens`` KV tokens in total, all layers
        (vectorized over ``kv_tokens``)."""
        if n_requests <= 0:
            return 0.0 if np.ndim(kv_tokens) == 0 else np.zeros(np.shape(kv_tokens))
        a = self.g.attention_decode(n_requests, kv_tokens, heads=self.heads, kv_heads=self.kv_heads,
                                    head_dim=self.model.head_dim)
        out = self.n_layers * np.asarray(a.calibrated_s)
        return float(out) if out.ndim == 0 else out
