"""Synthetic, seeded workloads: arrival processes, adapter popularity, lengths; the PLoRA and L3 presets.

Arrivals
    ``all_at_once`` (offline throughput runs: L3 6.1 measures total output tokens over total time of 1,000
    requests), ``poisson_arrivals(rate)``, ``gamma_arrivals(rate, cv)``: inter-arrival gaps gamma-distributed
    with shape ``1 / cv**2`` and scale ``cv**2 / rate`` (S-LoRA, benchmarks/trace.py: mean ``1 / rate``,
    coefficient of variation ``cv``; cv = 1 is Poisson).
Adapter popularity (ids in ``[0, n_adapters)``)
    ``uniform_adapters``; ``skewed_adapters``: a fraction ``hot_fraction`` (0.8) of requests to ``hot`` (50)
    adapters chosen at random, the rest uniform over the others (PLoRA VII-A: "skewed ones send 80% of requests
    to 50 adapters"); ``powerlaw_adapters(alpha)``: S-LoRA's generator, ``floor(n_adapters * X)`` with
    ``X ~ Power(alpha)`` (density ``alpha x**(alpha - 1)`` on [0, 1]; alpha = 1 is uniform, smaller is more
    skewed towards low ids).
LoRA ranks
    ``adapter_ranks``: one rank per adapter drawn uniformly from {8, 16, 32, 64, 128} (PLoRA VII-A).
Lengths
    ``uniform_lengths(lo, hi)`` (integers in ``[lo, hi)``, as S-LoRA's generator); ``lognormal_lengths(mean,
    std)``: lognormal with that mean and standard deviation (``sigma**2 = ln(1 + (std/mean)**2)``,
    ``mu = ln(mean) - sigma**2 / 2``), rounded, at least 1.

PLoRA presets (:func:`plora_workload`; PLoRA's Table VII is withheld, so the lengths are design choices):
``uniform`` / ``skewed`` draw prompt and output lengths uniformly from [8, 512) each (S-LoRA's synthetic
default ranges, the system PLoRA compares with); the ``-long`` variants draw prompts from [1024, 3072) and
outputs from [256, 1024), so a request stays within the 4,096-token context of Llama-2 (max_position_embeddings)
and the "4K context" of PLoRA's introduction; ``powerlaw`` uses S-LoRA's power-law popularity (alpha = 0.5 by
default) with gamma arrivals (cv = 1 by default) and the short lengths. Defaults: 1,000 adapters (PLoRA VII-A),
1,000 requests, 10 requests/s (a design default; every figure states the rate it uses).

L3 presets (:func:`l3_trace`): prompt and output lengths lognormal with the means and standard deviations of
L3 Table 4; 1,000 requests, all arriving at t = 0 (L3 6.1), unless a rate is given.
"""

import numpy as np

from host.workloads.base import Workload

__all__ = ["all_at_once", "poisson_arrivals", "gamma_arrivals", "uniform_adapters", "skewed_adapters",
           "powerlaw_adapters", "adapter_ranks", "uniform_lengths", "lognormal_lengths", "plora_workload",
           "l3_trace", "PLORA_WORKLOADS", "L3_TRACES", "L3_TABLE4", "LORA_RANKS"]

LORA_RANKS = (8, 16, 32, 64, 128)  # PLoRA VII-A: rank drawn from [8, 16, 32, 64, 128]


def _check_n(n):
    if int(n) < 1:
        raise ValueError(f"number of requests must be >= 1, got {n}")
    return int(n)


def all_at_once(n: int, rng=None) -> np.ndarray:
    return np.zeros(_check_n(n))


def poisson_arrivals(n: int, rate_per_s: float, rng) -> np.ndarray:
    return gamma_arrivals(n, rate_per_s, 1.0, rng)


def gamma_arrivals(n: int, rate_per_s: float, cv: float, rng) -> np.ndarray:
    """Arrival times (first at 0) with gamma gaps of mean ``1 / rate`` and coefficient of variation ``cv``."""
    n = _check_n(n)
    if not rate_per_s > 0:
        raise ValueError(f"arrival rate must be > 0 requests/s, got {rate_per_s}")
    if not cv > 0:
        raise ValueError(f"coefficient of variation must be > 0, got {cv}")
    gaps = rng.gamma(1.0 / cv ** 2, cv ** 2 / rate_per_s, n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def uniform_adapters(n: int, n_adapters: int, rng) -> np.ndarray:
    _check_adapters(n_adapters)
    return rng.integers(0, n_adapters, _check_n(n))


def skewed_adapters(n: int, n_adapters: int, rng, hot: int = 50, hot_fraction: float = 0.8) -> np.ndarray:
    """``hot_fraction`` of requests to ``hot`` random adapters (uniform among them), the rest uniform over the
    other ``n_adapters - hot``."""
    _check_adapters(n_adapters)
    if not 1 <= hot < n_adapters:
        raise ValueError(f"hot adapters must be in [1, n_adapters) = [1, {n_adapters}), got {hot}")
    if not 0 <= hot_fraction <= 1:
        raise ValueError(f"hot_fraction must be in [0, 1], got {hot_fraction}")
    n = _check_n(n)
    perm = rng.permutation(n_adapters)
    hot_ids, cold_ids = perm[:hot], perm[hot:]
    is_hot = rng.random(n) < hot_fraction
    return np.where(is_hot, hot_ids[rng.integers(0, hot, n)], cold_ids[rng.integers(0, len(cold_ids), n)])


def powerlaw_adapters(n: int, n_adapters: int, rng, alpha: float = 0.5) -> np.ndarray:
    """S-LoRA's popularity: ``floor(n_adapters * X)``, ``X ~ Power(alpha)``."""
    _check_adapters(n_adapters)
    if not alpha > 0:
        raise ValueError(f"power-law exponent alpha must be > 0, got {alpha}")
    return np.minimum((rng.power(alpha, _check_n(n)) * n_adapters).astype(np.int64), n_adapters - 1)


def adapter_ranks(n_adapters: int, rng, ranks=LORA_RANKS) -> np.ndarray:
    """One LoRA rank per adapter, uniform over ``ranks``."""
    _check_adapters(n_adapters)
    return np.asarray(ranks)[rng.integers(0, len(ranks), n_adapters)]


def _check_adapters(n_adapters):
    if int(n_adapters) < 1:
        raise ValueError(f"n_adapters must be >= 1, got {n_adapters}")


def uniform_lengths(n: int, lo: int, hi: int, rng) -> np.ndarray:
    """Integers in ``[lo, hi)``."""
    if not 1 <= lo < hi:
        raise ValueError(f"length range must satisfy 1 <= lo < hi, got [{lo}, {hi})")
    return rng.integers(lo, hi, _check_n(n))


def lognormal_lengths(n: int, mean: float, std: float, rng, max_tokens: int | None = None) -> np.ndarray:
    """Positive integer lengths, lognormal with the given mean and standard deviation (before rounding)."""
    if not (mean > 0 and std >= 0):
        raise ValueError(f"lognormal lengths need mean > 0 and std >= 0, got {mean}, {std}")
    s2 = np.log1p((std / mean) ** 2)
    x = rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), _check_n(n))
    out = np.maximum(np.rint(x).astype(np.int64), 1)
    return out if max_tokens is None else np.minimum(out, max_tokens)


# name -> (adapter popularity, prompt range, output range)
PLORA_WORKLOADS = {
    "uniform": ("uniform", (8, 512), (8, 512)),
    "skewed": ("skewed", (8, 512), (8, 512)),
    "uniform-long": ("uniform", (1024, 3072), (256, 1024)),
    "skewed-long": ("skewed", (1024, 3072), (256, 1024)),
    "powerlaw": ("powerlaw", (8, 512), (8, 512)),
}


def plora_workload(name: str, *, n_requests: int = 1000, rate_per_s: float = 10.0, cv: float = 1.0,
                   n_adapters: int = 1000, alpha: float = 0.5, hot: int = 50, hot_fraction: float = 0.8,
                   prompt_range=None, output_range=None, seed: int = 0) -> Workload:
    """A PLoRA workload (see the module docstring); ``rank`` per request is its adapter's LoRA rank."""
    try:
        pop, p_rng, o_rng = PLORA_WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown PLoRA workload {name!r}; allowed: {sorted(PLORA_WORKLOADS)}") from None
    p_rng = tuple(prompt_range or p_rng)
    o_rng = tuple(output_range or o_rng)
    rng = np.random.default_rng(seed)
    ranks = adapter_ranks(n_adapters, rng)
    arrivals = gamma_arrivals(n_requests, rate_per_s, cv, rng)
    if pop == "uniform":
        ad = uniform_adapters(n_requests, n_adapters, rng)
    elif pop == "skewed":
        ad = skewed_adapters(n_requests, n_adapters, rng, hot, hot_fraction)
    else:
        ad = powerlaw_adapters(n_requests, n_adapters, rng, alpha)
    prompts = uniform_lengths(n_requests, *p_rng, rng)
    outputs = uniform_lengths(n_requests, *o_rng, rng)
    params = dict(generator="plora_workload", name=name, n_requests=n_requests, rate_per_s=rate_per_s, cv=cv,
                  n_adapters=n_adapters, popularity=pop, prompt_range=list(p_rng), output_range=list(o_rng),
                  seed=seed)
    if pop == "skewed":
        params.update(hot=hot, hot_fraction=hot_fraction)
    if pop == "powerlaw":
        params.update(alpha=alpha)
    return Workload(name, arrivals, prompts, outputs, ad, extra={"rank": ranks[ad]}, params=params)


# L3 Table 4: trace -> (avg L_in, std L_in, avg L_out, std L_out)
L3_TABLE4 = {
    "openr1": (96.0, 75.1, 12684.1, 8464.6),      # OpenR1-Math-220k
    "dolphin": (201.9, 563.0, 3926.2, 4216.0),    # Dolphin-r1
    "openthoughts": (89.4, 66.7, 6366.7, 4662.9), # OpenThoughts-114k-math
    "longbench": (7703.9, 4285.5, 89.8, 213.7),   # LongBench
}
L3_TRACES = tuple(L3_TABLE4)


def l3_trace(name: str, *, n_requests: int = 1000, rate_per_s: float | None = None, cv: float = 1.0,
             max_tokens: int | None = None, seed: int = 0) -> Workload:
    """An L3 trace generated from L3 Table 4 (lognormal lengths; all arrive at 0 unless ``rate_per_s``)."""
    try:
        pm, ps, om, os_ = L3_TABLE4[name]
    except KeyError:
        raise ValueError(f"unknown L3 trace {name!r}; allowed: {sorted(L3_TABLE4)}") from None
    rng = np.random.default_rng(seed)
    prompts = lognormal_lengths(n_requests, pm, ps, rng, max_tokens)
    outputs = lognormal_lengths(n_requests, om, os_, rng, max_tokens)
    arrivals = all_at_once(n_requests) if rate_per_s is None else gamma_arrivals(n_requests, rate_per_s, cv, rng)
    params = dict(generator="l3_trace", name=name, n_requests=n_requests, rate_per_s=rate_per_s, cv=cv,
                  max_tokens=max_tokens, seed=seed, distribution="lognormal",
                  table4=dict(prompt_mean=pm, prompt_std=ps, output_mean=om, output_std=os_))
    notes = [f"{name}: lengths generated from L3 Table 4 statistics (lognormal, matched mean and std); the real "
             f"trace is not available offline"]
    return Workload(name, arrivals, prompts, outputs, np.zeros(n_requests, np.int64), params=params, notes=notes)
