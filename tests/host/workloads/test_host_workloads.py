"""Workload generators: their statistics match their parameters, seeds reproduce, traces read correctly."""

import numpy as np
import pytest

from host.workloads import (plora_workload, l3_trace, trace_workload, lmsys_substitute, gamma_arrivals,
                            powerlaw_adapters, skewed_adapters, lognormal_lengths, L3_TABLE4, PLORA_WORKLOADS)


def test_seeded_and_reproducible():
    a, b = plora_workload("skewed", seed=5), plora_workload("skewed", seed=5)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.adapter_id, b.adapter_id)
    c = plora_workload("skewed", seed=6)
    assert not np.array_equal(a.adapter_id, c.adapter_id)


def test_gamma_arrivals_rate_and_cv():
    rng = np.random.default_rng(0)
    for cv in (0.5, 1.0, 3.0):
        t = gamma_arrivals(200_000, 20.0, cv, rng)
        gaps = np.diff(t)
        assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.02)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.03)


def test_skewed_sends_80_percent_to_50_adapters():
    w = plora_workload("skewed", n_requests=50_000, seed=1)
    counts = np.bincount(w.adapter_id, minlength=1000)
    assert np.sort(counts)[::-1][:50].sum() / len(w) == pytest.approx(0.8, abs=0.01)
    assert w.adapter_id.max() < 1000
    u = plora_workload("uniform", n_requests=50_000, seed=1)
    cu = np.bincount(u.adapter_id, minlength=1000)
    assert cu.min() > 0 and cu.max() / cu.mean() < 1.6  # roughly flat over all 1,000


def test_powerlaw_follows_slora_generator():
    rng = np.random.default_rng(2)
    ids = powerlaw_adapters(200_000, 1000, rng, alpha=0.5)
    # P(id < k) = (k / n)**alpha
    for k in (10, 100, 500):
        assert np.mean(ids < k) == pytest.approx((k / 1000) ** 0.5, abs=0.005)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        powerlaw_adapters(10, 10, rng, alpha=0)


def test_ranks_and_lengths():
    for name, (_, p, o) in PLORA_WORKLOADS.items():
        w = plora_workload(name, n_requests=5000, seed=3)
        assert set(np.unique(w.extra["rank"])) <= {8, 16, 32, 64, 128}
        assert p[0] <= w.prompt_tokens.min() and w.prompt_tokens.max() < p[1]
        assert o[0] <= w.output_tokens.min() and w.output_tokens.max() < o[1]
        # every request of an adapter carries the same rank
        for a in np.unique(w.adapter_id)[:20]:
            assert len(np.unique(w.extra["rank"][w.adapter_id == a])) == 1
    long = plora_workload("uniform-long", seed=3)
    assert (long.prompt_tokens + long.output_tokens).max() <= 4096


@pytest.mark.parametrize("name", sorted(L3_TABLE4))
def test_l3_traces_match_table4(name):
    pm, ps, om, os_ = L3_TABLE4[name]
    w = l3_trace(name, n_requests=100_000, seed=4)
    assert w.prompt_tokens.min() >= 1 and w.output_tokens.min() >= 1
    assert w.prompt_tokens.mean() == pytest.approx(pm, rel=0.05)
    assert w.output_tokens.mean() == pytest.approx(om, rel=0.05)
    assert w.prompt_tokens.std() == pytest.approx(ps, rel=0.15)
    assert w.output_tokens.std() == pytest.approx(os_, rel=0.15)
    assert np.all(w.arrival_s == 0) and len(l3_trace(name)) == 1000


def test_real_traces():
    w = trace_workload("splitwise-conv", n_requests=500, seed=1)
    assert w.arrival_s[0] == 0 and np.all(np.diff(w.arrival_s) >= 0)
    r = trace_workload("splitwise-conv", n_requests=500, seed=1, rate_per_s=50.0)
    assert (len(r) - 1) / r.arrival_s[-1] == pytest.approx(50.0)
    assert np.array_equal(r.prompt_tokens, w.prompt_tokens)
    a = trace_workload("arxiv", n_requests=300, seed=1, rate_per_s=5.0)
    assert a.notes and a.prompt_tokens.mean() > 1000
    t = lmsys_substitute(n_requests=100, seed=0)
    assert "not available offline" in t.notes[0] and "splitwise_conv" in t.notes[0]
    with pytest.raises(ValueError, match="unknown trace"):
        trace_workload("lmsys")


def test_lognormal_lengths_bad_input():
    with pytest.raises(ValueError, match="mean > 0"):
        lognormal_lengths(10, -1, 1, np.random.default_rng(0))
