"""Algorithm 1 (PLoRA VI-A) on constructed states: every path and every kind of eviction."""

import pytest

from conftest import FakeNDP, make_cost
from host.plora.lora import E1, E2, E3, E4, LEVEL_AB, LEVEL_B, LEVEL_NONE
from host.plora.manager import AdapterState, ManagerState, select, apply, rebuild_wave

R = 8
AB, BB = 32768.0, 16384.0          # SMALL at rank 8: A+B and B of both layers
KV_TOK = 256.0                     # SMALL: bytes of one token's K, V over both layers
H = 100


def state(budget, **kw):
    s = ManagerState(budget_bytes=budget, **kw)
    return s


def check_consistent(st, cost):
    w = st.wave.copy()
    rebuild_wave(st, cost)
    assert w.out_bytes == pytest.approx(st.wave.out_bytes) and w.in_bytes == pytest.approx(st.wave.in_bytes)
    assert w.gpu_bytes == pytest.approx(st.wave.gpu_bytes) and list(w.dev) == pytest.approx(list(st.wave.dev))
    assert st.free_bytes(cost) >= -1e-6


def test_resident_sizes(cost):
    assert list(cost.resident(R)) == [AB, 0, 0, BB]
    assert cost.kv_tok == KV_TOK


def test_fits_takes_the_fastest(cost):
    st = state(1e6)
    d = select(st, cost, 5, 16, rank=R, remaining=H)
    assert (d.path, d.strategy, d.level, d.load_bytes, d.evictions) == ("fits", E1, LEVEL_AB, AB, ())
    # J = H * T_iter + load / W + L, T_iter = 2 layers x max(16384 B / 100 GB/s, 2*16*8*1024 FLOP / 1 TFLOPS)
    assert d.cost_s == pytest.approx(H * 2 * max(16384 / 100e9, 262144 / 1e12) + AB / 1e9 + 1e-6)
    assert [c[0] for c in d.candidates] == ["E1", "E2", "E4", "E3"]          # ranked by J
    assert [c[1] for c in d.candidates] == sorted(c[1] for c in d.candidates)
    apply(st, cost, d, tokens=16, rank=R, remaining=H)
    assert st.adapters[5].level == LEVEL_AB and st.adapters[5].strategy == E1
    check_consistent(st, cost)


def test_small_batch_prefers_ndp(cost):
    d = select(state(1e6), cost, 5, 1, rank=R, remaining=1)
    # one iteration: loading anything costs more than the NDP doing it: E3, 2 layers x (7 kernels x 1 us + L)
    assert d.strategy == E3 and d.path == "fits" and d.load_bytes == 0
    assert d.cost_s == pytest.approx(2 * (7e-6 + 1e-6))


def test_cold_adapters_go_first_coldest_first(cost):
    st = state(2 * AB + 10000, adapters={1: AdapterState(R, LEVEL_AB), 2: AdapterState(R, LEVEL_AB)},
               temperature={1: 0.5, 2: 0.1}, kv_dup_tokens=0)
    st.kv_dup_tokens = 0
    d = select(st, cost, 5, 16, rank=R, remaining=H)
    assert d.path == "cold" and d.strategy == E1
    assert [(e.kind, e.adapter) for e in d.evictions] == [("cold", 2)]
    apply(st, cost, d, tokens=16, rank=R, remaining=H)
    assert st.adapters[2].level == LEVEL_NONE and st.adapters[1].level == LEVEL_AB
    check_consistent(st, cost)


def test_cold_before_kv(cost):
    st = state(AB + 1000 * KV_TOK + 10000, adapters={2: AdapterState(R, LEVEL_AB)}, kv_dup_tokens=1000,
               kv_dev_tokens=1000, n_req=10)
    d = select(st, cost, 5, 16, rank=R, remaining=H)
    assert d.path == "cold" and [e.kind for e in d.evictions] == ["cold"]


def test_rerank_evicts_kv_when_cheap():
    cost = make_cost(ndp=FakeNDP(att=1e-9))
    st = state(1000 * KV_TOK + 10000, kv_dup_tokens=1000, kv_dev_tokens=1000, n_req=10)
    d = select(st, cost, 5, 16, rank=R, remaining=H)
    assert d.path == "rerank" and d.strategy == E1
    assert [e.kind for e in d.evictions] == ["kv"]
    assert d.evictions[0].bytes == pytest.approx(AB - 10000)
    assert d.evictions[0].kv_tokens == pytest.approx((AB - 10000) / KV_TOK)
    labels = [c[0] for c in d.candidates]
    assert "E1+evict(kv)" in labels and "E2" in labels and d.cost_s == min(c[1] for c in d.candidates)
    apply(st, cost, d, tokens=16, rank=R, remaining=H)
    assert st.kv_dup_tokens == pytest.approx(1000 - (AB - 10000) / KV_TOK)
    check_consistent(st, cost)


def test_rerank_keeps_kv_when_its_eviction_costs_more():
    cost = make_cost(ndp=FakeNDP(att=1e-6))      # devices slow at attention: losing duplicates hurts
    st = state(1000 * KV_TOK + 10000, kv_dup_tokens=1000, kv_dev_tokens=1000, n_req=10)
    d = select(st, cost, 5, 16, rank=R, remaining=H)
    assert d.path == "rerank" and d.strategy == E2 and d.evictions == ()
    j = dict(d.candidates)
    assert j["E1+evict(kv)"] > j["E2"]


def test_rerank_evicts_hot_with_its_reload_cost(cost):
    st = state(AB + 10000, adapters={3: AdapterState(R, LEVEL_AB)}, hot=frozenset({3}))
    d = select(st, cost, 5, 16, rank=R, remaining=H)
    assert d.path == "rerank" and d.strategy == E1
    assert [(e.kind, e.adapter) for e in d.evictions] == [("hot", 3)]
    # J includes reloading the hot adapter later: AB / W + L
    assert d.cost_s == pytest.approx(H * 2 * 262144 / 1e12 + 2 * (AB / 1e9 + 1e-6))


def test_rerank_evicts_a_serving_adapter(cost):
    st = state(AB + 10000, adapters={4: AdapterState(R, LEVEL_AB, E1, tokens=1, remaining=H)})
    rebuild_wave(st, cost)
    d = select(st, cost, 5, 64, rank=R, remaining=H)
    assert d.path == "rerank" and d.strategy == E1
    (ev,) = d.evictions
    assert (ev.kind, ev.adapter, ev.new_level, ev.new_strategy) == ("serving", 4, LEVEL_NONE, E3)
    apply(st, cost, d, tokens=64, rank=R, remaining=H)
    assert st.adapters[4].strategy == E3 and st.adapters[4].level == LEVEL_NONE
    check_consistent(st, cost)


def test_serving_victim_that_finishes_soon_costs_less(cost):
    def run(rem):
        st = state(AB + 10000, adapters={4: AdapterState(R, LEVEL_AB, E1, tokens=8, remaining=rem)})
        rebuild_wave(st, cost)
        return dict(select(st, cost, 5, 64, rank=R, remaining=H).candidates)
    assert run(2)["E1+evict(serving)"] < run(H)["E1+evict(serving)"]


def test_rerank_mixes_kv_hot_and_serving_when_no_single_kind_suffices():
    # need AB - 10000 = 22,768 B beyond free: KV holds 10 x 256 B, the hot adapter its B (16,384 B), the
    # serving adapter (E4) its B (16,384 B): only all three kinds together free enough
    cost = make_cost(ndp=FakeNDP(att=1e-9))
    st = state(10000 + 10 * KV_TOK + 2 * BB,
               adapters={3: AdapterState(R, LEVEL_B), 4: AdapterState(R, LEVEL_B, E4, tokens=1, remaining=2)},
               hot=frozenset({3}), kv_dup_tokens=10, kv_dev_tokens=1000, n_req=10)
    rebuild_wave(st, cost)
    assert st.free_bytes(cost) == pytest.approx(10000)
    d = select(st, cost, 5, 64, rank=R, remaining=H)
    assert d.path == "rerank" and d.strategy == E1
    assert [e.kind for e in d.evictions] == ["kv", "hot", "serving"]
    assert "E1+evict(kv+hot+serving)" in dict(d.candidates)
    assert not any(label in ("E1+evict(kv)", "E1+evict(hot)", "E1+evict(serving)") for label in dict(d.candidates))


def test_reselection_of_a_serving_adapter_reuses_its_cache(cost):
    st = state(BB + 100, adapters={5: AdapterState(R, LEVEL_B, E4, tokens=2, remaining=H)})
    rebuild_wave(st, cost)
    d = select(st, cost, 5, 3)
    # E4 needs nothing new; E1 needs A (AB - BB) which does not fit and nothing can be evicted
    assert dict(d.candidates)["E4"] < dict(d.candidates)["E3"]
    assert d.strategy in (E4, E2) and d.load_bytes == 0


def test_uniform_strategies_and_fallback(cost):
    d = select(state(0, allowed=(E3,)), cost, 5, 16, rank=R)
    assert (d.strategy, d.path) == (E3, "fits")
    d = select(state(10000, allowed=(E4,)), cost, 5, 16, rank=R)
    assert (d.strategy, d.path) == (E3, "fallback")
    d = select(state(BB, allowed=(E4,)), cost, 5, 16, rank=R)
    assert (d.strategy, d.path) == (E4, "fits")


def test_bad_input(cost):
    with pytest.raises(ValueError, match="pass rank"):
        select(state(0), cost, 5, 1)
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        select(state(0), cost, 5, 0, rank=R)


def test_kv_duplicate_and_adapter_cache_are_one_decision(cost):
    """PLoRA III / V-B: the joining request's duplicated KV and its adapter's cache compete for the same HBM.
    40,000 free bytes hold the rank-8 adapter's A+B (32,768) or the 100-token prompt's KV (25,600), not both.
    Adapter first (kv_tokens=0), Algorithm 1 caches it (E1) and only 28 tokens' duplicate fits beside it; as one
    decision the KV duplicate wins: the devices' attention (1 us per token, 2 devices) costs far more than E3.
    (The fastest pair, E1 with all 100 tokens duplicated, does not fit: the pairs that fit are re-ranked, lines
    19-20.)"""
    assert select(state(40000.0), cost, 0, 1, rank=R, remaining=10).strategy == E1
    d = select(state(40000.0), cost, 0, 1, rank=R, remaining=10, kv_tokens=100)
    assert (d.strategy, d.path, d.kv_dup_tokens, d.kv_dup_fraction, d.load_bytes) == (E3, "rerank", 100, 1.0, 0.0)
    # J(E3, all 100 duplicated), by hand: wave = max(1,024 B of y / 1 GB/s, 7 kernels x 1 us) + L = 8 us;
    # attention (one request): max(GPU 100 x 128 B / 100 GB/s, the new token's 128 B to a device / 1 GB/s) + the
    # merge of one partial (152 B / 100 GB/s); 10 iterations of 2 layers
    att = max(100 * 128 / 100e9, 128 / 1e9) + 152 / 100e9
    assert d.cost_s == pytest.approx(10 * 2 * (8e-6 + att), rel=1e-12)
    # J(E1, 28 duplicated), what caching the adapter first leaves: 72 tokens on the devices (36 us on each of
    # the 2, after L) and the load of A+B once
    from host.plora.manager import _Eval
    att_e1 = 1e-6 + 72 * 1e-6 / 2 + 3 * 152 / 100e9
    j_e1 = 10 * 2 * (16384 / 100e9 + att_e1) + AB / 1e9 + 1e-6
    assert _Eval(state(40000.0), cost, 0, R, 1, 10).J(E1, (), (28.0, 72.0)) == pytest.approx(j_e1, rel=1e-12)
    assert d.cost_s < j_e1 / 4
    # the pair ranking's shortcut is J itself, bit for bit
    ev = _Eval(state(40000.0), cost, 0, R, 1, 10)
    pairs = [(s, g) for s in (E1, E2, E3, E4) for g in (0, 28, 100)]
    split = lambda g: (float(g), float(100 - g))      # noqa: E731
    assert ev.J_pairs(pairs, split) == [ev.J(s, (), split(g)) for s, g in pairs]
    # with room for both, both
    both = select(state(60000.0), cost, 0, 1, rank=R, remaining=10, kv_tokens=100)
    assert (both.strategy, both.kv_dup_tokens) == (E1, 100)
    # KV placement is D's: no KV decision without distributed attention; bad arguments are named
    with pytest.raises(ValueError, match="distributed"):
        select(state(40000.0, distributed=False), cost, 0, 1, rank=R, remaining=10, kv_tokens=100)
    with pytest.raises(ValueError, match="kv_tokens"):
        select(state(40000.0), cost, 0, 1, rank=R, remaining=10, kv_tokens=-1)


def test_cached_ids_follow_every_level_change(cost):
    """The eviction candidates come from the set of cached adapters, kept up to date by set_level."""
    st = state(1e6, adapters={1: AdapterState(R, LEVEL_AB), 2: AdapterState(R, LEVEL_NONE), 3: AdapterState(R, LEVEL_B)})
    assert st.cached_ids() == {1, 3}
    st.set_level(cost, 1, LEVEL_NONE)
    st.set_level(cost, 2, LEVEL_B)
    st.set_level(cost, 7, LEVEL_AB, rank=R)
    assert st.cached_ids() == {k for k, a in st.adapters.items() if a.level != LEVEL_NONE} == {2, 3, 7}
