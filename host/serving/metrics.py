"""Per-request and per-run metrics: TTFT, TPOT, TBT, end-to-end latency, queueing delay, throughput.

Definitions (times in seconds unless the key says ``_ms``):

* TTFT = first token time - arrival; queueing delay = first admission - arrival; end-to-end = finish - arrival;
* TPOT (per request) = (finish - first token) / (output tokens - 1), over requests with more than one output
  token; ``tpot_ms_mean`` / ``tpot_ms_p99`` are over requests;
* TBT = every gap between consecutive tokens of one request (a stall while preempted included); mean and
  percentiles are exact (:class:`TokenGaps`);
* throughput = output tokens / makespan, makespan = last finish - first arrival;
* ``mean_batch`` = requests per iteration averaged over iterations; ``mean_batch_tokens`` likewise for tokens.
"""

import numpy as np

__all__ = ["TokenGaps", "GapHistogram", "request_metrics", "summarize"]


class TokenGaps:
    """Every gap between consecutive tokens of a request, kept as (values, weight) chunks: a fused stretch of
    ``k`` iterations over ``n`` requests adds its ``k - 1`` iteration durations once with weight ``n``.
    Statistics are exact (weighted mean, weighted lower percentile, max)."""

    def __init__(self):
        self._chunks = []
        self._final = None

    def add(self, gaps, weight: int = 1) -> None:
        gaps = np.asarray(gaps, dtype=np.float64).ravel()
        if len(gaps) and weight > 0:
            self._chunks.append((gaps, weight))
            self._final = None

    def add_constant(self, gap: float, n: int) -> None:
        """``n`` gaps of the same length."""
        if n > 0:
            self._chunks.append((np.array([gap], dtype=np.float64), int(n)))
            self._final = None

    def extend(self, other: "TokenGaps") -> "TokenGaps":
        """Add every gap of ``other`` (e.g. merging data-parallel replicas' runs)."""
        self._chunks.extend(other._chunks)
        self._final = None
        return self

    __iadd__ = extend

    @classmethod
    def merge(cls, parts) -> "TokenGaps":
        """One collector holding the gaps of all ``parts``."""
        out = cls()
        for p in parts:
            out.extend(p)
        return out

    def _finalize(self):
        if self._final is None:
            if not self._chunks:
                self._final = (np.zeros(0), np.zeros(0))
            else:
                v = np.concatenate([c[0] for c in self._chunks])
                w = np.concatenate([np.full(len(c[0]), c[1], dtype=np.float64) for c in self._chunks])
                order = np.argsort(v, kind="stable")
                self._final = (v[order], w[order])
        return self._final

    @property
    def count(self) -> int:
        return int(sum(len(c[0]) * c[1] for c in self._chunks))

    @property
    def total(self) -> float:
        """Sum of all gaps (seconds)."""
        return float(sum(float(c[0].sum()) * c[1] for c in self._chunks))

    @property
    def counts(self) -> np.ndarray:
        """Gap counts on :attr:`GapHistogram.EDGES` bins (compatibility with the first API version)."""
        v, w = self._finalize()
        b = np.minimum(np.maximum(np.searchsorted(GapHistogram.EDGES, v, side="right") - 1, 0),
                       len(GapHistogram.EDGES) - 2)
        return np.bincount(b, weights=w, minlength=len(GapHistogram.EDGES) - 1).astype(np.int64)

    @property
    def max(self) -> float:
        v, _ = self._finalize()
        return float(v[-1]) if len(v) else float("nan")

    def mean(self) -> float:
        v, w = self._finalize()
        return float(np.dot(v, w) / w.sum()) if len(v) else float("nan")

    def percentile(self, q: float) -> float:
        """The smallest gap with at least ``q`` % of all gaps at or below it (NaN if empty)."""
        v, w = self._finalize()
        if not len(v):
            return float("nan")
        cw = np.cumsum(w)
        return float(v[min(int(np.searchsorted(cw, q / 100.0 * cw[-1], side="left")), len(v) - 1)])


class GapHistogram:
    """The first API version's token-gap collector, kept for callers that build or merge histograms (the
    engine now returns a :class:`TokenGaps`, which also exposes ``counts`` / ``count`` / ``total`` / ``max`` on
    these bins). Streaming histogram of token gaps (seconds): exact count, sum and max; percentiles to within one bin
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


def summarize(table, iter_n_requests, iter_n_tokens, gaps: TokenGaps, iter_repeats=None) -> dict:
    """The common summary.json keys (see the module docstring). ``iter_n_requests`` / ``iter_n_tokens``: per
    iteration (or per chunk of ``iter_repeats`` identical iterations) batch requests and tokens."""
    iter_n_requests = np.asarray(iter_n_requests, dtype=np.float64)
    iter_n_tokens = np.asarray(iter_n_tokens, dtype=np.float64)
    rep = np.ones(len(iter_n_requests)) if iter_repeats is None else np.asarray(iter_repeats, dtype=np.float64)
    n_iter = int(rep.sum())
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
        "iterations": n_iter,
        "mean_batch": float(np.dot(iter_n_requests, rep) / n_iter) if n_iter else float("nan"),
        "max_batch": int(np.max(iter_n_requests)) if n_iter else 0,
        "mean_batch_tokens": float(np.dot(iter_n_tokens, rep) / n_iter) if n_iter else float("nan"),
        "preemptions": int(table.preemptions.sum()),
    }
