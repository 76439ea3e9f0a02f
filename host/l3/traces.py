"""Workloads of the L3 study: the four traces of L3 Table 4, generated from their published statistics, and the
real arrival / length traces in data/.

**Generated traces** (``openr1``, ``dolphin``, ``openthoughts``, ``longbench``). The traces themselves are not
available offline (data/README.md); L3 Table 4 gives the mean and standard deviation of the input and output
lengths. Each length is drawn from a **log-normal** distribution with exactly that mean ``m`` and standard
deviation ``s`` (moment matching: ``sigma^2 = ln(1 + s^2 / m^2)``, ``mu = ln m - sigma^2 / 2``), rounded to
the nearest integer and at least 1 (lengths are positive integers). Why log-normal: token lengths are positive
and right-skewed (all four traces have ``s`` comparable to or larger than ``m``: coefficients of variation 0.67
to 2.8), and the log-normal is the standard two-parameter family with those properties that any (m, s) pair
determines; a normal would give negative lengths. Input and output lengths are drawn independently. A request
whose prompt + output exceeds :data:`MAX_TOTAL_TOKENS` (128K: the rank PU buffer holds one FP16 exponential per
token, L3 4.4; longer heads need repeated fetching the PIM model does not cover) is redrawn; this is rare
(< 1e-4 of draws for every trace) and the achieved moments are reported by :func:`trace_stats`.

**Per-dataset bounds.** ``max_total`` (``ndpim l3 run --max-total-tokens``) bounds prompt + output lower, for a
user who has a dataset's documented maximum. None is applied by default: no dataset's documented maximum is
available offline; the one third-party figure (a 16K-token generation budget for OpenR1-Math) cannot bound the trace
Table 4 describes, since a sample within 16K tokens with mean 12,684 has a standard deviation of at most ~6,850,
not 8,465 (Bhatia-Davis, :func:`moments_bound`); and the L3 models run without their context limits, as in the
paper (host/models/llm.py). A bound under which Table 4's moments cannot hold is stated in the workload's notes and
``params["table4_moments_reachable"]``.

**Arrivals**: all 1,000 requests arrive at t = 0 (design choice): the study measures throughput = total output
tokens / total execution time over 1,000 requests drawn at random (6.1 set-up facts), i.e. an offline batch.

**Real trace** (``trace``): arrival times and prompt / output lengths of the Azure LLM inference trace
(conversation service, 2023; Splitwise, Patel et al. ISCA 2024), as processed by Vidur
(data/vidur/processed_traces/splitwise_conv.csv), through :func:`host.workloads.trace_workload`: ``n``
consecutive requests from a seeded random start, arrival times shifted to start at 0.

Every trace is a :class:`host.workloads.Workload` (its ``params`` and ``notes`` go into config.json).
"""

from dataclasses import dataclass

import numpy as np

from host.workloads import Workload, trace_workload

__all__ = ["TraceStats", "TABLE4", "TRACES", "MAX_TOTAL_TOKENS", "lognormal_params", "generate", "real_trace",
           "load_trace", "trace_stats", "REAL_TRACE", "moments_bound"]

#: The rank PU buffer's token capacity at the PAPER geometry (256 KB / 2 B; L3 4.4, hdl.pim.config.max_tokens).
MAX_TOTAL_TOKENS = 128 * 1024

#: The real trace (host.workloads' ``splitwise-conv``).
REAL_TRACE = "splitwise-conv"


@dataclass(frozen=True)
class TraceStats:
    """Mean / standard deviation of input and output lengths (tokens) as published."""

    name: str
    in_mean: float
    in_std: float
    out_mean: float
    out_std: float
    source: str


#: [L3] Table 4 "Real-world traces".
TABLE4 = {
    "openr1": TraceStats("OpenR1-Math-220k", 96.0, 75.1, 12684.1, 8464.6, "L3 Table 4 (ope, 2025)"),
    "dolphin": TraceStats("Dolphin-r1", 201.9, 563.0, 3926.2, 4216.0, "L3 Table 4 (dop, 2025)"),
    "openthoughts": TraceStats("OpenThoughts-114k-math", 89.4, 66.7, 6366.7, 4662.9, "L3 Table 4 (Ope, 2025)"),
    "longbench": TraceStats("LongBench", 7703.9, 4285.5, 89.8, 213.7, "L3 Table 4 (Bai et al., 2024)"),
}

#: CLI names of every trace.
TRACES = (*TABLE4, "trace")


def lognormal_params(mean: float, std: float) -> tuple:
    """``(mu, sigma)`` of the log-normal with this mean and standard deviation."""
    if not (mean > 0 and std >= 0):
        raise ValueError(f"log-normal needs mean > 0 and std >= 0, got {mean}, {std}")
    s2 = np.log1p((std / mean) ** 2)
    return float(np.log(mean) - s2 / 2), float(np.sqrt(s2))


def moments_bound(st: TraceStats, max_total: int) -> list:
    """Why Table 4's moments cannot hold with every prompt + output <= ``max_total`` (an empty list when they can).

    Bhatia-Davis: a sample in [lo, hi] with mean m has variance <= (hi - m)(m - lo). The prompt is in
    [1, max_total - 1] and so is the output; a published (mean, std) over that bound cannot come from lengths
    within it, so a trace generated under it has a smaller spread (and mean) than Table 4's."""
    out = []
    hi = max_total - 1
    for what, m, s in (("prompt", st.in_mean, st.in_std), ("output", st.out_mean, st.out_std)):
        if m > hi:
            out.append(f"{st.name}'s mean {what} of {m:g} tokens is over {hi}")
            continue
        smax = float(np.sqrt(max(0.0, (hi - m) * (m - 1))))
        if s > smax:
            out.append(f"{st.name}'s {what} std {s:g} is over the {smax:.0f} any lengths within {hi} tokens with mean "
                       f"{m:g} can have (Bhatia-Davis)")
    return out


def _draw(rng, mean, std, n):
    mu, sigma = lognormal_params(mean, std)
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, n))).astype(np.int64)


def generate(name: str, n: int = 1000, seed: int = 0, *, max_total: int = MAX_TOTAL_TOKENS) -> Workload:
    """``n`` requests of the Table 4 trace ``name`` (see the module docstring), all arriving at t = 0."""
    if name not in TABLE4:
        raise ValueError(f"unknown generated trace {name!r}; allowed: {sorted(TABLE4)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 2 <= max_total <= MAX_TOTAL_TOKENS:
        raise ValueError(f"max_total must be in 2 .. {MAX_TOTAL_TOKENS} (prompt and output >= 1 each; the rank PU "
                         f"buffer's tokens, L3 4.4), got {max_total}")
    st = TABLE4[name]
    short = moments_bound(st, max_total)
    rng = np.random.default_rng(seed)
    pin, pout = _draw(rng, st.in_mean, st.in_std, n), _draw(rng, st.out_mean, st.out_std, n)
    redrawn = 0
    for _ in range(1000):
        bad = pin + pout > max_total
        if not bad.any():
            break
        k = int(bad.sum())
        redrawn += k
        pin[bad], pout[bad] = _draw(rng, st.in_mean, st.in_std, k), _draw(rng, st.out_mean, st.out_std, k)
    else:
        raise RuntimeError(f"{name}: could not draw lengths within {max_total} tokens")
    mu_i, s_i = lognormal_params(st.in_mean, st.in_std)
    mu_o, s_o = lognormal_params(st.out_mean, st.out_std)
    params = dict(generator="host.l3.traces.generate", name=name, n_requests=n, seed=seed, max_total=max_total,
                  distribution="lognormal", arrivals="all at t = 0", table4=vars(st),
                  prompt_mu=mu_i, prompt_sigma=s_i, output_mu=mu_o, output_sigma=s_o, redrawn=redrawn,
                  table4_moments_reachable=not short)
    notes = [f"{st.name}: lengths generated from {st.source} (lognormal with its mean and std, rounded, >= 1; "
             f"prompt + output <= {max_total}, {redrawn} redrawn); the trace itself is not available offline"]
    notes += [f"under the bound of {max_total} tokens Table 4's moments cannot hold: {why}" for why in short]
    return Workload(name, np.zeros(n), pin, pout, np.zeros(n, np.int64), params=params, notes=notes)


def real_trace(n: int = 1000, seed: int = 0, *, max_total: int = MAX_TOTAL_TOKENS) -> Workload:
    """``n`` consecutive requests of the real trace (module docstring); requests longer than ``max_total`` in
    all would be an error (the conversation trace has none)."""
    w = trace_workload(REAL_TRACE, n_requests=n, seed=seed)
    if np.any(w.prompt_tokens + w.output_tokens > max_total):
        raise ValueError(f"{REAL_TRACE}: a request exceeds {max_total} tokens (prompt + output)")
    w.name = "trace"
    return w


def load_trace(name: str, n: int = 1000, seed: int = 0, *, max_total: int = MAX_TOTAL_TOKENS) -> Workload:
    """A trace by CLI name (:data:`TRACES`), every request's prompt + output <= ``max_total``."""
    if name == "trace":
        return real_trace(n, seed, max_total=max_total)
    if name not in TABLE4:
        raise ValueError(f"unknown trace {name!r}; allowed: {list(TRACES)}")
    return generate(name, n, seed, max_total=max_total)


def trace_stats(table) -> dict:
    """Achieved moments of a trace (to compare with Table 4)."""
    return {"requests": int(table.n), "in_mean": float(table.prompt_tokens.mean()),
            "in_std": float(table.prompt_tokens.std()), "out_mean": float(table.output_tokens.mean()),
            "out_std": float(table.output_tokens.std()), "max_total": int((table.prompt_tokens
                                                                           + table.output_tokens).max())}
