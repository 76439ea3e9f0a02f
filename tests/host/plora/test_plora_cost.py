"""Each strategy's cost terms (PLoRA V-A, Fig. 6(b)) and the VI-B aggregation against hand-computed values."""

import numpy as np
import pytest

from conftest import SMALL, SMALL_MOE, FakeNDP, GPU, make_cost
from host.plora.cost import WaveSums, LinkParams
from host.plora.lora import (E1, E2, E3, E4, lora_matrices, strategy_terms, resident_bytes, adapter_bytes,
                             ModelShape)

R, B = 8, 3
SUM_IN_OUT = 128 + 96 + 96 + 128 + 192 + 192 + 192       # sum over the 7 matrices of d_in + d_out
SUM_OUT = 64 + 32 + 32 + 64 + 128 + 128 + 64               # sum of d_out
X_ELEMS = 64 + 64 + 64 + 128                                # attn_in, attn_out, ffn_in, ffn_mid (sent once)


def test_matrices_of_the_small_model():
    m = {x.name: (x.d_in, x.d_out, x.group) for x in lora_matrices(SMALL)}
    assert m == {"q": (64, 64, "attn_in"), "k": (64, 32, "attn_in"), "v": (64, 32, "attn_in"),
                 "o": (64, 64, "attn_out"), "gate": (64, 128, "ffn_in"), "up": (64, 128, "ffn_in"),
                 "down": (128, 64, "ffn_mid")}


def test_strategy_terms_hand_computed():
    ndp = FakeNDP(bw=1e9, e3=1e-6, e4=0.5e-6)
    t = strategy_terms(SMALL, R, B, ndp)
    ab = SUM_IN_OUT * R * 2
    flops = 2 * B * R * SUM_IN_OUT
    # E1: nothing crosses the link; the GPU reads A and B from HBM
    assert list(t[E1]) == [0, 0, 0, ab, flops, 0, 0]
    # E2: A and B come in over the link, the device LOADs them (7 matrices, bytes/bw); host-mediated: a copy of
    # each matrix's A and B back
    assert list(t[E2]) == pytest.approx([0, ab, ab / 1e9, 0, flops, 0, 7])
    # E3: x out once per input group, y in, 7 device kernels of batch 3; host-mediated: 4 input copies (q/k/v,
    # o, gate/up, down) and 7 kernel launches before, 7 result copies after
    assert list(t[E3]) == pytest.approx([B * X_ELEMS * 2, B * SUM_OUT * 2, 7 * 3e-6, 0, 0, 11, 7])
    # E4: x out, m (B x R per matrix) in; the GPU reads B and computes m B
    assert list(t[E4]) == pytest.approx([B * X_ELEMS * 2, 7 * B * R * 2, 7 * 1.5e-6, SUM_OUT * R * 2,
                                         2 * B * R * SUM_OUT, 11, 7])
    assert not strategy_terms(SMALL, R, 0, ndp).any()


def test_resident_bytes():
    r = resident_bytes(SMALL, R)
    assert list(r) == [SUM_IN_OUT * R * 2 * 2, 0, 0, SUM_OUT * R * 2 * 2]       # 2 layers
    assert adapter_bytes(SMALL, R) == r[E1]


def test_moe_expected_experts():
    ndp = FakeNDP()
    t1 = strategy_terms(SMALL_MOE, R, 1, ndp)
    # one token touches exactly 2 of 8 experts: E2 loads attention (4 matrices) + 2 x 3 expert matrices
    attn = (128 + 96 + 96 + 128) * R * 2
    expert = (64 + 32) * 3 * R * 2
    assert t1[E2, 1] == pytest.approx(attn + 2 * expert)
    # x: attention groups once, ffn_in once (shared by all experts), each active expert's down input
    assert t1[E3, 0] == pytest.approx((64 + 64 + 64 + 2 * 32) * 2)
    # many tokens touch (almost) every expert
    t = strategy_terms(SMALL_MOE, R, 200, ndp)
    touched = 8 * (1 - (1 - 2 / 8) ** 200)
    assert t[E1, 3] == pytest.approx(attn + touched * expert)
    assert resident_bytes(SMALL_MOE, R)[E1] == pytest.approx(2 * (attn + 8 * expert))


def test_standalone_and_wave(cost):
    ndp = cost.ndp
    t = cost.terms(R, B)
    W, L, Wh, F = 1e9, 1e-6, 100e9, 1e12
    expect = [max(t[E1, 3] / Wh, t[E1, 4] / F),
              max(t[E2, 4] / F, t[E2, 1] / W, t[E2, 2]) + L,
              max(max(t[E3, 0], t[E3, 1]) / W, t[E3, 2]) + L,
              max(max(t[E4, 3] / Wh, t[E4, 4] / F), max(t[E4, 0], t[E4, 1]) / W, t[E4, 2]) + L]
    assert list(cost.standalone_s(R, B)) == pytest.approx(expect)
    # two adapters on the two devices (ids 0 and 1), one E3 and one E1
    w = WaveSums.empty(2)
    w.add(t[E3], cost.device_of(0))
    w.add(t[E1], cost.device_of(1))
    assert cost.wave_s(w) == pytest.approx(max(t[E1, 3] / Wh, t[E3, 1] / W, t[E3, 2]) + L)
    # removing restores the empty wave (no link round trip)
    w.add(t[E3], 0, sign=-1)
    assert w.link_users == 0 and cost.wave_s(w) == pytest.approx(t[E1, 3] / Wh)
    # one link round trip per LoRA wave, more if asked
    c2 = make_cost(lora_waves_per_layer=4)
    assert c2.standalone_s(R, B)[E3] - cost.standalone_s(R, B)[E3] == pytest.approx(3 * L)


def test_link_terms_through_W_and_L_only():
    fast = FakeNDP(e3=1e-9)
    a, b = make_cost(ndp=fast, gbps=2.0, rtt_ns=500), make_cost(ndp=fast, gbps=1.0, rtt_ns=1000)
    t = a.terms(R, B)
    d = b.standalone_s(R, B) - a.standalone_s(R, B)
    # E3 is link-bound in both: halving W and doubling L changes it by exactly bytes/W + L
    link = max(t[E3, 0], t[E3, 1])
    assert d[E3] == pytest.approx(link / 1e9 - link / 2e9 + 0.5e-6)
    assert d[E1] == 0.0


def test_token_interleaving_counts(cost):
    rng = np.random.default_rng(3)
    L = rng.integers(1, 300, 40)
    dup = (rng.random(40) * L).astype(int)
    for n_dev in (1, 2, 3, 4, 7):
        c = make_cost(n_dev=n_dev)
        cnt = c.device_tokens(L, dup)
        brute = np.array([[np.count_nonzero(np.arange(a, l) % n_dev == d) for d in range(n_dev)]
                          for l, a in zip(L, dup)])
        assert np.array_equal(cnt, brute)
        assert np.array_equal(cnt.sum(axis=1), L - dup)


def test_attention_hand_computed():
    c = make_cost(ndp=FakeNDP(att=1e-6), n_dev=2, gbps=1.0, rtt_ns=1000)
    kv_tok = 2 * 2 * 16 * 2                 # K and V, 2 kv heads x 16, FP16
    q_bytes, part = 4 * 16 * 2, 4 * (16 * 2 + 6)
    a = c.attention([10, 5], [4, 0])
    # GPU: 4 duplicated tokens from HBM
    assert a.gpu_s == pytest.approx(4 * kv_tok / 100e9)
    # request 0: tokens 4..9 -> device 0: 4,6,8; device 1: 5,7,9. request 1: 0..4 -> d0: 0,2,4; d1: 1,3
    assert list(a.dev_per_device_s) == pytest.approx([6e-6, 5e-6])
    assert a.dev_s == pytest.approx(6e-6)
    assert a.link_out_bytes == 4 * q_bytes + 2 * kv_tok and a.link_in_bytes == 4 * part
    assert a.link_s == pytest.approx(max(4 * q_bytes + 2 * kv_tok, 4 * part) / 1e9)
    assert a.merge_s == pytest.approx(5 * part / 100e9)
    assert a.total_s == pytest.approx(max(a.gpu_s, 1e-6 + max(6e-6, a.link_s)) + a.merge_s)
    # everything duplicated: no device work; the new token's K, V still go to its device (posted write)
    full = c.attention([10], [10])
    assert full.dev_s == 0 and full.link_in_bytes == 0 and full.link_out_bytes == kv_tok
    assert full.total_s == pytest.approx(max(10 * kv_tok / 100e9, kv_tok / 1e9) + part / 100e9)
    # without distributed attention the GPU loads the rest over the link
    nd = c.attention([10, 5], [4, 0], distributed=False)
    assert nd.link_in_bytes == 11 * kv_tok
    assert nd.total_s == pytest.approx(max(4 * kv_tok / 100e9, 1e-6 + 11 * kv_tok / 1e9))
    with pytest.raises(ValueError, match="dup must satisfy"):
        c.attention([3], [4])


def test_balanced_fraction_balances(cost):
    c = make_cost(ndp=FakeNDP(att=1e-9), n_dev=4)
    p = c.balanced_dup_fraction()
    g, d, _ = c.attention_rates()
    assert p * g == pytest.approx((1 - p) * d / 4)


def test_bad_configs():
    with pytest.raises(ValueError, match="link bandwidth"):
        LinkParams(0, 10)
    with pytest.raises(ValueError, match="kv_bits"):
        make_cost(kv_bits=12)
    with pytest.raises(ValueError, match="n_dev"):
        make_cost(n_dev=0)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ModelShape(name="x", n_layers=1, hidden=8, q_heads=3, kv_heads=2, head_dim=4, ffn_dim=8)
    with pytest.raises(ValueError, match="rank"):
        strategy_terms(SMALL, 0, 1, FakeNDP())


def test_device_attention_lookup_matches_the_model():
    from dataclasses import replace
    from host.plora.ndp_model import NDPStandIn, PLORA_DEVICE
    # a stand-in of 64 lanes (its softmax term steps every 64 tokens: a smooth curve to interpolate)
    stand = NDPStandIn(replace(PLORA_DEVICE, lanes=64))
    from host.plora.system import shape_of
    from host.models import get_model
    shape = shape_of(get_model("llama3-8b"))
    c = make_cost(shape=shape, ndp=stand, n_dev=4)
    toks = np.array([0, 1, 7, 64, 65, 4095, 4096, 9000])
    exact = stand.attention_s(toks, 128, 32, 8)
    assert np.allclose(c._ndp_attention(toks), exact, rtol=0, atol=0)     # a table of the exact values

    class Scalar:           # a model with a scalar-only interface: sampled, interpolated
        kind = "calibrated"

        def attention_s(self, tokens, head_dim, q_heads, kv_heads):
            return stand.attention_s(float(tokens), head_dim, q_heads, kv_heads)
    s = make_cost(shape=shape, ndp=Scalar(), n_dev=4)
    got = s._ndp_attention(toks)
    assert np.array_equal(got[:5], exact[:5])                             # sampled exactly up to 1024
    assert np.allclose(got, exact, rtol=0.04)                             # interpolated beyond


def test_device_attention_is_the_devices_descriptor_stream():
    """Issue 29 item 1 in the host: with the calibrated device model a device's attention time in a layer is its
    shares run as one descriptor stream (NDPPerfModel.attention_batch_s, column by column), below the same shares
    priced one by one from an idle device; the stand-in model (no stream interface) keeps pricing shares alone."""
    from sim.perf.ndp import NDPPerfModel
    from host.plora.ndp_model import NDPStandIn
    from host.plora.system import shape_of
    from host.models import get_model
    shape = shape_of(get_model("llama2-7b"))
    ndp = NDPPerfModel.paper(table=None)
    c = make_cost(shape=shape, ndp=ndp, n_dev=4)
    cnt = np.array([[256, 255, 0, 3], [1024, 1024, 0, 0], [7, 0, 0, 2048]])
    got = c.device_attention(cnt)
    for d in range(4):
        want = ndp.attention_batch_s(cnt[:, d], 128, 32, 32) if cnt[:, d].any() else 0.0
        assert got[d] == pytest.approx(want, rel=1e-12, abs=0)
        alone = float(np.sum(ndp.attention_s(cnt[:, d], 128, 32, 32)))
        # the stream hides the pairs' fixed costs under the next pairs' reads: >= 10 % here (14 % on device 3,
        # whose 3-token share runs the grouped kernel either way, 27 % on the others)
        assert got[d] <= alone and (not cnt[:, d].any() or got[d] < 0.9 * alone)
    s = make_cost(shape=shape, ndp=NDPStandIn(), n_dev=4)
    assert np.allclose(s.device_attention(cnt), NDPStandIn().attention_s(cnt, 128, 32, 32).sum(axis=0), rtol=1e-12)


class _CountingNDP(FakeNDP):
    """FakeNDP that counts the E3 / E4 kernels it prices."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.kernels = 0

    def lora_e3_s(self, d_in, d_out, rank, batch):
        self.kernels += 1
        return super().lora_e3_s(d_in, d_out, rank, batch)

    def lora_e4_s(self, d_in, rank, batch):
        self.kernels += 1
        return super().lora_e4_s(d_in, rank, batch)


def test_prefill_choice_prices_a_kernel_only_when_it_can_win():
    # SMALL, rank 8, link 1 GB/s, rtt 1 us. E2 alone: A and B (16,384 bytes) in over the link = 16.384 us, their
    # LOAD on the device at 1 GB/s the same, + L = 17.384 us. E3 alone: y back (B x 1,024 bytes) at 1 GB/s, the
    # device 7 kernels x 1 us x B, + L = 7 B + 1 us; without the device term its bound is 1.024 B + 1 us, above
    # E2's 17.384 us from B = 17 on: no kernel is priced there.
    ndp = _CountingNDP()
    c = make_cost(ndp=ndp)
    best, row = c.prefill_choice(8, 2, [E2, E3])          # E3: 15 us < 17.384 us
    assert best == E3 and ndp.kernels > 0
    assert row[2] == pytest.approx(7 * 2e-6)
    n = ndp.kernels
    best, row = c.prefill_choice(8, 17, [E2, E3])         # bound 18.408 us > 17.384 us: E2, no kernel
    assert best == E2 and ndp.kernels == n
    assert row[1] == 16384 and row[2] == pytest.approx(16.384e-6)
    best, _ = c.prefill_choice(8, 3000, [E1, E2, E3, E4])
    assert best == E1 and ndp.kernels == n                 # E1: only the GPU, far below every link-bound bound
    assert c.prefill_choice(8, 3000, [E3])[0] == E3 and ndp.kernels > n   # nothing to compare: priced


def test_prefill_choice_pruned_equals_unpruned():
    """The pruned choice is the unpruned one (``min(ok, key=standalone_s)``), with a bit-equal row, on the
    small dense and MoE models over batches from 1 to 5,000 and every set of allowed strategies."""
    sets = [[E2, E3], [E1, E2, E3, E4], [E1, E2], [E2, E3, E4], [E3], [E2], [E4, E3], [E1, E3]]
    for shape in (SMALL, SMALL_MOE):
        for host_op in (0.0, 6.7e-6):
            pruned = make_cost(shape, ndp=FakeNDP(e3=2e-8, e4=1e-8), host_op_s=host_op)
            full = make_cost(shape, ndp=FakeNDP(e3=2e-8, e4=1e-8), host_op_s=host_op)
            for rank in (8, 128):
                for tok in (1, 2, 5, 16, 17, 40, 300, 5000):
                    for ok in sets:
                        b1, r1 = pruned.prefill_choice(rank, tok, ok)
                        b2, r2 = full.prefill_choice(rank, tok, ok, prune=False)
                        times = full.standalone_s(rank, tok)
                        assert b1 == b2 == min(ok, key=lambda x: times[x]), (shape.name, rank, tok, ok)
                        assert np.array_equal(r1, r2)


def test_device_attention_keeps_only_its_last_answer():
    """The kept answer is the one for the same shares, never another's, and a caller changing it changes nothing."""
    c = make_cost(ndp=FakeNDP(att=1e-6))
    a, b = np.array([[3, 0], [1, 2]]), np.array([[4, 1], [0, 2]])
    first = c.device_attention(a)
    assert list(c.device_attention(b)) == list(c._device_attention(b))
    again = c.device_attention(a)
    assert list(again) == list(first) == list(c._device_attention(a))
    again[:] = -1.0
    assert list(c.device_attention(a)) == list(first)
