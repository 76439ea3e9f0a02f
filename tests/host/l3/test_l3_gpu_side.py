"""The L3 GPU side against host-core's GPU model (GPUModel.iteration without attention)."""

import numpy as np
import pytest

from host.l3.config import l3_setup
from host.l3.gpu_side import GPUSide


@pytest.mark.parametrize("model", ["opt-66b", "gpt-89b", "gpt-175b"])
def test_fc_equals_iteration_without_attention(model):
    s = l3_setup(model)
    gs = GPUSide(s)
    for tok, lg in [(1, 1), (37, 5), (160, 0), (4096, 12), (70000, 3)]:
        it = gs.g.iteration(s.model, tp=s.tp, decode_requests=tok, decode_kv_tokens=0, logits_tokens=lg)
        ref = it.total_s - it.ops["attn_decode"]
        assert gs.fc(tok, lg) == pytest.approx(ref, rel=1e-12)
    np.testing.assert_allclose(gs.fc(np.array([1, 37]), np.array([1, 5])), [gs.fc(1, 1), gs.fc(37, 5)])


def test_attention_all_layers():
    s = l3_setup("gpt-175b")
    gs = GPUSide(s)
    one = gs.g.attention_prefill([512], [2048], heads=12, kv_heads=12, head_dim=128).calibrated_s
    assert gs.prefill_attn([512], [2048]) == pytest.approx(96 * one)
    np.testing.assert_allclose(gs.prefill_attn_each([512, 16], [2048, 16]),
                               [gs.prefill_attn([512], [2048]), gs.prefill_attn([16], [16])])
    assert gs.prefill_attn([], []) == 0.0 and gs.decode_attn(0, 100) == 0.0
    d = gs.decode_attn(4, np.array([4000, 4004]))
    assert d.shape == (2,) and d[1] > d[0]
