"""Per-request and per-run metrics: TTFT, TPOT, TBT, end-to-end latency, queueing delay, throughput.

Definitions (times in seconds unless the key says ``_ms``):

* TTFT = first token time - arrival; queueing delay = first admission - arrival; end-to-end = finish - arrival;
* TPOT (per request) = (finish - first token) / (output tokens - 1), over requests with more than one output
  token; ``tpot_ms_mean`` / ``tpot_ms_p99`` are over requests;
* TBT = every gap between consecutive tokens of one request (a stall while preempted included);
  ``tbt_ms_mean`` is exact (sum / count), its percentiles come from a log-binned histogram with a relative bin
  width of 0.23 % (:class:`GapHistogram`);
* throughput = output tokens / makespan, makespan = last finish - first arrival;
* ``mean_batch`` = requests per iteration averaged over iterations; ``mean_batch_tokens`` likewise for tokens.
"""

import numpy as np

__all__ = ["GapHistogram", "request_metrics", "summarize"]


class GapHistogram:
    """Streaming histogram of token gaps (seconds): exact count, sum and max; percentiles to within one bin
    (log-spaced from 1 ns to 1e5 s, 8,000 bins: each bin spans a factor 10**(14/8000) = 1.0040)."""

    EDGES = np.logspace(-9, 5, 8001)

    def __init__(self):
        self.counts = np.zeros(len(self.EDGES) - 1, np.int64)
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, gaps, weight: int = 1) -> None:
        gaps = np.asarray(gaps, dtype=np.float64).ravel()
        if not len(gaps):
            return
        b = np.clip(np.searchsorted(self.EDGES, gaps, side="right") - 1, 0, len(self.counts) - 1)
        np.add.at(self.counts, b, weight)
        self.count += len(gaps) * weight
        self.total += float(gaps.sum()) * weight
        self.max = max(self.max, float(gaps.max()))

    def add_constant(self, gap: float, n: int) -> None:
        """``n`` gaps of the same length."""
        if n <= 0:
            return
        b = min(max(int(np.searchsorted(self.EDGES, gap, side="right")) - 1, 0), len(self.counts) - 1)
        self.counts[b] += n
        self.count += n
        self.total += gap * n
        self.max = max(self.max, gap)

    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def percentile(self, q: float) -> float:
        """The geometric centre of the bin holding the ``q``-th percentile (NaN if empty)."""
        if not self.count:
            return float("nan")
        rank = q / 100.0 * self.count
        b = int(np.searchsorted(np.cumsum(self.counts), max(rank, 1), side="left"))
        return float(min(np.sqrt(self.EDGES[b] * self.EDGES[b + 1]), self.max))


def request_metrics(table) -> dict:
    """Per-request metric columns (numpy arrays, NaN where undefined)."""
    out = table.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (table.finish_s - table.first_token_s) / np.maximum(out - 1, 1), np.nan)
    return {
        "ttft_s": table.first_token_s - table.arrival_s,
        "tpot_s": tpot,
        "e2e_s": table.finish_s - table.arrival_s,
        "queue_s": table.admitted_s - table.arrival_s,
    }


def _stat(x, fn):
    x = x[np.isfinite(x)]
    return float(fn(x)) if len(x) else float("nan")


def summarize(table, iter_n_requests, iter_n_tokens, gaps: GapHistogram) -> dict:
    """The common summary.json keys (see the module docstring)."""
    m = request_metrics(table)
    done = np.isfinite(table.finish_s)
    out_tokens = int(table.generated.sum())
    first = float(table.arrival_s.min()) if table.n else 0.0
    end = float(np.nanmax(table.finish_s)) if done.any() else first
    makespan = end - first
    p99 = lambda x: np.percentile(x, 99)
    return {
        "requests": int(table.n),
        "finished": int(done.sum()),
        "output_tokens": out_tokens,
        "prompt_tokens": int(table.prompt_tokens.sum()),
        "makespan_s": makespan,
        "throughput_tok_s": out_tokens / makespan if makespan > 0 else float("nan"),
        "ttft_s_mean": _stat(m["ttft_s"], np.mean),
        "ttft_s_p50": _stat(m["ttft_s"], np.median),
        "ttft_s_p99": _stat(m["ttft_s"], p99),
        "tpot_ms_mean": 1e3 * _stat(m["tpot_s"], np.mean),
        "tpot_ms_p50": 1e3 * _stat(m["tpot_s"], np.median),
        "tpot_ms_p99": 1e3 * _stat(m["tpot_s"], p99),
        "tbt_ms_mean": 1e3 * gaps.mean(),
        "tbt_ms_p50": 1e3 * gaps.percentile(50),
        "tbt_ms_p99": 1e3 * gaps.percentile(99),
        "tbt_ms_max": 1e3 * gaps.max if gaps.count else float("nan"),
        "e2e_s_mean": _stat(m["e2e_s"], np.mean),
        "e2e_s_p99": _stat(m["e2e_s"], p99),
        "queue_s_mean": _stat(m["queue_s"], np.mean),
        "queue_s_p99": _stat(m["queue_s"], p99),
        "iterations": int(len(iter_n_requests)),
        "mean_batch": float(np.mean(iter_n_requests)) if len(iter_n_requests) else float("nan"),
        "max_batch": int(np.max(iter_n_requests)) if len(iter_n_requests) else 0,
        "mean_batch_tokens": float(np.mean(iter_n_tokens)) if len(iter_n_tokens) else float("nan"),
        "preemptions": int(table.preemptions.sum()),
    }
