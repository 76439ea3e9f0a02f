"""GPU-side times of one replica (its TP group), all layers, from host-core's GPU model (:mod:`host.gpu`).

:class:`GPUSide` answers the three questions the L3 systems ask, in seconds for a whole forward pass (all
layers) on the replica's TP group:

* :meth:`GPUSide.fc`: the batched operators of ``tokens`` tokens: QKV / O / FFN GEMMs, norms, rotary, activation,
  residual, embedding, final norm, the LM head over ``logits`` tokens and the two all-reduces per layer (TP > 1,
  the measured DGX NCCL profile): ``GPUModel.dense_time`` (tabulated up to 65,536 tokens; ``dense_ops`` beyond),
  i.e. ``GPUModel.iteration`` without attention (held equal in ``tests/host/l3/test_l3_gpu_side.py``);
* :meth:`GPUSide.prefill_attn`: prefill attention of chunks (one varlen kernel: ``GPUModel.attention_prefill``);
* :meth:`GPUSide.decode_attn`: decode attention on the GPU over KV in HBM (``GPUModel.attention_decode``), for
  the GPU-only baseline and NEO's GPU-resident requests; vectorized over the KV token total (fused runs).
"""

import numpy as np

from host.gpu.model import GPUModel, get_gpu_model

__all__ = ["GPUSide", "gpu_model"]


def gpu_model(gpu) -> GPUModel:
    """The process-wide GPU model of ``gpu`` (a preset's name, or a GPUConfig: a preset's shares host-core's
    instance, tables built once; another, e.g. from ``--hardware``, gets its own, shared by the replicas)."""
    from host.models.hardware import GPUS
    if isinstance(gpu, str) or GPUS.get(gpu.name) == gpu:
        return get_gpu_model(gpu if isinstance(gpu, str) else gpu.name)
    if gpu not in _CUSTOM:
        _CUSTOM[gpu] = GPUModel(gpu)
    return _CUSTOM[gpu]


_CUSTOM = {}


class GPUSide:
    """Times of one TP group of ``setup`` (a :class:`host.l3.config.L3Setup`)."""

    def __init__(self, setup, gpu: GPUModel | None = None):
        m = setup.model
        if m.is_moe:
            raise ValueError(f"{m.name}: the L3 GPU side prices dense models only")
        self.setup, self.model, self.tp = setup, m, setup.tp
        self.g = gpu if gpu is not None else gpu_model(setup.node.gpu)
        self.heads = m.n_heads // self.tp
        self.kv_heads = max(m.n_kv_heads // self.tp, 1)
        self.n_layers = m.n_layers
        self._cap = getattr(self.g, "_TABLE_MAX", 1 << 16) - 1

    # ---- batched operators ----------------------------------------------------------------------------------
    def fc(self, tokens, logits=0):
        """Batched operators over ``tokens`` tokens with the LM head over ``logits`` tokens (vectorized)."""
        tok = np.asarray(tokens, dtype=np.int64)
        lg = np.broadcast_to(np.asarray(logits, dtype=np.int64), tok.shape)
        if max(int(tok.max(initial=0)), int(lg.max(initial=0))) <= self._cap:
            return self.g.dense_time(self.model, self.tp, tok, lg)
        ops = self.g.dense_ops(self.model, self.tp, tok)
        out = sum(c for c, _ in ops.values()) + self.lm_head(lg)
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
