import pytest

from host.plora.cost import CostModel, GPUParams, LinkParams
from host.plora.lora import ModelShape


class FakeNDP:
    """A device model with simple, hand-computable times (for the cost-model and Algorithm 1 tests)."""

    kind = "standin"
    descriptor_overhead_s = 0.0

    def __init__(self, bw=1e9, e3=1e-6, e4=0.5e-6, att=1e-6):
        self.bw, self.e3, self.e4, self.att = bw, e3, e4, att

    def load_s(self, nbytes):
        return nbytes / self.bw

    def lora_e3_s(self, d_in, d_out, rank, batch):
        return self.e3 * batch

    def lora_e4_s(self, d_in, rank, batch):
        return self.e4 * batch

    def attention_s(self, tokens, head_dim, q_heads, kv_heads):
        return tokens * self.att


#: A small dense model: per layer q 64->64, k 64->32, v 64->32, o 64->64, gate/up 64->128, down 128->64.
SMALL = ModelShape(name="small", n_layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, ffn_dim=128)
#: A small MoE model: 8 experts, 2 active, expert FFN 32.
SMALL_MOE = ModelShape(name="small-moe", n_layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, ffn_dim=0,
                       n_experts=8, experts_active=2, expert_ffn_dim=32)
GPU = GPUParams("test-gpu", 1.0, 100.0, 1.0)          # 100 GB/s HBM, 1 TFLOPS


def make_cost(shape=SMALL, ndp=None, n_dev=2, gbps=1.0, rtt_ns=1000.0, **kw):
    return CostModel(shape, ndp=ndp or FakeNDP(), n_dev=n_dev, link=LinkParams(gbps, rtt_ns), gpu=GPU, **kw)


@pytest.fixture
def cost():
    return make_cost()


# --- system-level fakes -------------------------------------------------------------------------------------
from types import SimpleNamespace as _NS

import numpy as _np


class FakeGPUModel:
    """A GPU model with hand-computable times: a constant ``dense_s`` per iteration, prefill attention
    ``prefill_s_per_tok`` per prompt token, decode attention ``att_s_per_tok`` per KV token (per layer)."""

    def __init__(self, dense_s=10e-6, prefill_s_per_tok=0.0, att_s_per_tok=0.0, allreduce_s=1e-6, kernel_s=0.0,
                 add_s=0.0):
        self.dense_s, self.pre, self.att, self.ar = dense_s, prefill_s_per_tok, att_s_per_tok, allreduce_s
        self.kernel_s, self.add_s = kernel_s, add_s

    def kernel(self, flops, nbytes):
        """A GPU LoRA kernel: ``kernel_s`` each."""
        return _NS(calibrated_s=self.kernel_s if (flops > 0 or nbytes > 0) else 0.0)

    def elementwise(self, op, nbytes):
        """An element-wise kernel (the merge, the add of E3 outputs): ``add_s`` each."""
        return _NS(calibrated_s=self.add_s if nbytes > 0 else 0.0)

    def iteration(self, model, *, tp=None, prefill_q=(), prefill_kv=(), decode_requests=0, decode_kv_tokens=0,
                  logits_tokens=None, kv_dtype_bytes=2.0):
        ops = {"dense": self.dense_s}
        q = _np.asarray(prefill_q, float)
        if len(q):
            ops["attn_prefill"] = self.pre * float(q.sum())
        if decode_requests:
            ops["attn_decode"] = model.n_layers * self.att * _np.asarray(decode_kv_tokens, float)
        return _NS(total_s=sum(_np.asarray(v, float) for v in ops.values()), ops=ops)

    def attention_decode(self, n, kv, **kw):
        return _NS(calibrated_s=self.att * _np.asarray(kv, float))

    def batch_time(self, model, batch, *, tp=None, kv_dtype_bytes=2.0, runs=1):
        pre = batch.prefill
        kv = float(batch.kv_after[~pre].sum())
        if runs > 1:
            kv = kv + (~pre).sum() * _np.arange(runs)
        return self.iteration(model, prefill_q=batch.new_tokens[pre], prefill_kv=batch.kv_after[pre],
                              decode_requests=int((~pre).sum()), decode_kv_tokens=kv)

    def all_reduce(self, nbytes, n):
        return _NS(calibrated_s=self.ar)


def tiny_model():
    """The LLMConfig whose LoRA matrices are those of SMALL (2 layers, hidden 64, 4 heads of 16, 2 KV heads)."""
    from host.models.llm import LLMConfig
    return LLMConfig(name="tiny", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128, vocab=100,
                     gated_mlp=True)


def test_gpu(hbm_gb=1.0, bw=1.0, tflops=1.0):
    from host.models.hardware import GPUConfig
    return GPUConfig(name="test", hbm_gb=hbm_gb, hbm_bw_gbps=bw, fp16_tflops=tflops, sm_count=1, l2_mb=1)


test_gpu.__test__ = False


def test_link(gbps=1.0, rtt_ns=1000.0):
    from host.link import Link
    return Link(name="test-link", bw_gbps=gbps, rtt_ns=rtt_ns)


test_link.__test__ = False
