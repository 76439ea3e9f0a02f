"""L3 configurations (Tables 2, 3) and the traces generated from Table 4."""

import numpy as np
import pytest

from host.l3.config import DEPLOYMENTS, GIB, L3_HOST_MEMORY, SCALING_BASE, HostMemoryConfig, l3_setup
from host.l3.traces import (MAX_TOTAL_TOKENS, TABLE4, generate, load_trace, lognormal_params, moments_bound,
                             trace_stats)
from host.workloads import L3_TABLE4


def test_deployments_table3():
    assert DEPLOYMENTS == {"opt-66b": (2, 4), "gpt-89b": (4, 2), "gpt-175b": (8, 1)}
    for name, (tp, dp) in DEPLOYMENTS.items():
        s = l3_setup(name)
        assert (s.tp, s.dp) == (tp, dp) and s.model.head_dim == 128 and s.model.dtype_bytes == 2
        assert s.node.n_gpus == 8 and s.node.gpu.hbm_gb == 80
        assert s.channels_per_replica * dp == 16
        assert s.host_capacity_bytes * dp == pytest.approx(2048 * GIB)
        assert s.host_uplinks == tp // 2
    s = l3_setup("gpt-175b")
    assert s.kv_bytes_per_token == 2 * 96 * 96 * 128 * 2
    assert s.host_link.bw_gbps == pytest.approx(31.5, rel=0.01)


def test_host_memory_table2_and_scaling():
    h = L3_HOST_MEMORY
    assert (h.channels, h.ranksets, h.capacity_gib, h.ranks) == (16, 4, 2048, 64)
    assert (SCALING_BASE.ranksets, SCALING_BASE.capacity_gib) == (2, 512)
    s = l3_setup("gpt-89b", ranksets=16, host_memory_gb=4096)
    assert s.host.ranksets == 16 and s.host.capacity_gib == 4096
    with pytest.raises(ValueError, match="ranksets"):
        HostMemoryConfig(ranksets=0)
    with pytest.raises(ValueError, match="capacity_gib"):
        l3_setup("gpt-89b", host_memory_gb=0)
    with pytest.raises(ValueError, match="unknown L3 model"):
        l3_setup("llama2-7b")


def test_table4_numbers_agree_with_host_workloads():
    for name, st in TABLE4.items():
        assert L3_TABLE4[name] == (st.in_mean, st.in_std, st.out_mean, st.out_std)


@pytest.mark.parametrize("name", list(TABLE4))
def test_generated_moments(name):
    st = TABLE4[name]
    w = generate(name, 20000, seed=3)
    t = w.to_table()
    assert t.prompt_tokens.min() >= 1 and t.output_tokens.min() >= 1
    assert t.prompt_tokens.dtype.kind == "i"
    assert (t.prompt_tokens + t.output_tokens).max() <= MAX_TOTAL_TOKENS
    s = trace_stats(t)
    assert s["in_mean"] == pytest.approx(st.in_mean, rel=0.04)
    assert s["out_mean"] == pytest.approx(st.out_mean, rel=0.04)
    assert s["in_std"] == pytest.approx(st.in_std, rel=0.2)
    assert s["out_std"] == pytest.approx(st.out_std, rel=0.2)
    assert np.all(t.arrival_s == 0)
    assert w.params["distribution"] == "lognormal" and w.notes


def test_lognormal_params_and_seeding():
    mu, sigma = lognormal_params(100.0, 50.0)
    assert np.exp(mu + sigma ** 2 / 2) == pytest.approx(100.0)
    assert np.sqrt((np.exp(sigma ** 2) - 1) * np.exp(2 * mu + sigma ** 2)) == pytest.approx(50.0)
    a, b, c = generate("dolphin", 50, seed=1), generate("dolphin", 50, seed=1), generate("dolphin", 50, seed=2)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens) and not np.array_equal(a.output_tokens, c.output_tokens)
    with pytest.raises(ValueError, match="unknown"):
        load_trace("sharegpt")


def test_real_trace():
    w = load_trace("trace", 100, seed=0)
    t = w.to_table()
    assert t.n == 100 and t.arrival_s[0] == 0 and np.all(np.diff(t.arrival_s) >= 0)
    assert w.name == "trace" and "splitwise" in str(w.params)


def test_moments_bound_is_bhatia_davis():
    # OpenR1's outputs (mean 12,684, std 8,465) cannot all lie within a 16K-token budget: at most
    # sqrt((16383 - 12684.1) * (12684.1 - 1)) = 6,849
    why = moments_bound(TABLE4["openr1"], 16 * 1024)
    assert len(why) == 1 and "output" in why[0] and "6849" in why[0]
    assert moments_bound(TABLE4["openr1"], MAX_TOTAL_TOKENS) == []
    # a mutant bound that ignores the mean would pass a spread no sample can have
    assert moments_bound(TABLE4["longbench"], 7000)   # its mean prompt is over the bound


def test_a_lower_bound_is_applied_and_stated():
    w = generate("openr1", 4000, seed=2, max_total=16 * 1024)
    t = w.to_table()
    assert (t.prompt_tokens + t.output_tokens).max() <= 16 * 1024
    assert w.params["table4_moments_reachable"] is False and any("Bhatia-Davis" in n for n in w.notes)
    assert trace_stats(t)["out_std"] < 6850
    assert generate("dolphin", 50, seed=1).params["table4_moments_reachable"] is True
    for bad in (1, MAX_TOTAL_TOKENS + 1):
        with pytest.raises(ValueError, match="max_total must be in 2 .. 131072"):
            generate("dolphin", 5, max_total=bad)
