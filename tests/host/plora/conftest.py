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
