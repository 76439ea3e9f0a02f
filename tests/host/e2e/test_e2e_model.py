"""The tiny model, its float32 reference and the GPU-side FP16 operators (no RTL)."""

import numpy as np
import pytest

from host.e2e.model import (TINY_LLAMA, MICRO_LLAMA, TinyConfig, MATRICES, make_weights, make_adapters,
                            adapter_ranks, get_tiny)
from host.e2e.reference import forward_f32, greedy_f32, teacher_forced_logits, compare_logits
from host.e2e import ops


def test_config_is_the_issue_shape_and_validates():
    c = TINY_LLAMA
    assert (c.n_layers, c.hidden, c.n_heads, c.head_dim, c.ffn, c.vocab) == (2, 256, 4, 64, 688, 512)
    with pytest.raises(ValueError, match="n_heads x head_dim"):
        TinyConfig(hidden=256, n_heads=3, head_dim=64)
    with pytest.raises(ValueError, match="allowed"):
        get_tiny("huge")


def test_weights_and_adapters_are_deterministic():
    a, b, c = make_weights(MICRO_LLAMA, 0), make_weights(MICRO_LLAMA, 0), make_weights(MICRO_LLAMA, 1)
    assert np.array_equal(a.layers[0]["q"], b.layers[0]["q"]) and not np.array_equal(a.layers[0]["q"], c.layers[0]["q"])
    ads = make_adapters(TINY_LLAMA, 8, 0)
    assert [x.rank for x in ads] == adapter_ranks(8) == [8, 16] * 4
    for ad in ads:
        assert len(ad.mats) == TINY_LLAMA.n_layers
        for layer in ad.mats:
            assert set(layer) == set(MATRICES)
            for m, (A, B) in layer.items():
                assert A.shape == (TINY_LLAMA.shape(m)[0], ad.rank) and B.shape == (ad.rank, TINY_LLAMA.shape(m)[1])
                assert A.dtype == np.uint16 and np.all(np.isfinite(A.view(np.float16)))
    assert not np.array_equal(make_adapters(TINY_LLAMA, 2, 0)[0].mats[0]["q"][0],
                              make_adapters(TINY_LLAMA, 2, 1)[0].mats[0]["q"][0])


def test_reference_incremental_equals_full_and_adapters_matter():
    w = make_weights(MICRO_LLAMA, 0)
    ads = make_adapters(MICRO_LLAMA, 2, 0)
    toks = list(range(3, 23))
    full = forward_f32(w, ads[0], toks)
    cache = {}
    inc = np.concatenate([forward_f32(w, ads[0], toks[:12], cache=cache),
                          forward_f32(w, ads[0], toks[12:], cache=cache, start=12)])
    assert np.abs(inc - full).max() < 1e-4
    assert np.abs(forward_f32(w, ads[1], toks) - full).max() > 0.05        # another adapter: other logits
    g = greedy_f32(w, ads[0], toks[:8], 4)
    seq = toks[:8] + g
    tf = teacher_forced_logits(w, ads[0], seq, 8)
    assert [int(np.argmax(r)) for r in tf[:4]] == g


def test_compare_logits_sees_a_difference():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 16)).astype(np.float32)
    same = compare_logits(ref, ref)
    assert same["max_abs_err"] == 0 and same["top1_agree"] == 1.0
    other = ref.copy()
    other[2, int(np.argsort(ref[2])[-2])] += 10.0               # the runner-up becomes top-1
    assert compare_logits(other, ref)["top1_agree"] == 0.75


def test_fp16_ops_against_float64():
    rng = np.random.default_rng(1)
    x = ops.f16(rng.standard_normal((5, 64)))
    g = ops.f16(1 + 0.1 * rng.standard_normal(64))
    xf = ops.f32(x).astype(np.float64)
    ref = xf / np.sqrt((xf ** 2).mean(axis=1, keepdims=True) + 1e-5) * ops.f32(g)
    assert np.abs(ops.f32(ops.rmsnorm(x, g, 1e-5)) - ref).max() <= 2 ** -10 * np.abs(ref).max() * 2
    # RoPE preserves each pair's norm and is the identity at position 0
    r = ops.rope(x, np.arange(5), 1, 64, 10000.0)
    assert np.array_equal(r[0], x[0])
    a, b = ops.f32(x)[:, :32], ops.f32(x)[:, 32:]
    ra, rb = ops.f32(r)[:, :32], ops.f32(r)[:, 32:]
    assert np.allclose(a ** 2 + b ** 2, ra ** 2 + rb ** 2, rtol=3e-3, atol=1e-3)
    # the GPU's attention partial merges with itself into the plain softmax attention
    from sim.golden.attention import merge_partials, prepare_query, reference_attention
    K, V, q = ops.f16(rng.standard_normal((40, 64))), ops.f16(rng.standard_normal((40, 64))), ops.f16(
        rng.standard_normal(64))
    qs = prepare_query(q)
    parts = [(0, *ops.gpu_attention_partial(qs, K[:17], V[:17])), (1, *ops.gpu_attention_partial(qs, K[17:], V[17:]))]
    ref = reference_attention(ops.f32(qs).astype(np.float64), ops.f32(K), ops.f32(V), scale=1.0)
    assert np.abs(merge_partials(parts) - ref).max() < 5e-3 * np.abs(ref).max()
