"""Workloads from the real traces in data/vidur/processed_traces (see data/README.md).

* ``splitwise-conv`` / ``splitwise-code``: Azure LLM inference traces (2023): arrival times, prompt and output
  tokens. A run takes ``n_requests`` consecutive requests from a seeded random start, arrivals shifted to start
  at 0, optionally rescaled to a mean rate (``rate_per_s``: the time axis is stretched, burstiness kept).
* ``arxiv``: prompt / output token counts of an arXiv summarization workload, no arrival times: a run samples
  ``n_requests`` rows (seeded) and draws arrivals from a gamma process (``rate_per_s``, ``cv``) or sends all at
  once.

The traces carry no adapter ids: adapters are assigned with S-LoRA's power-law popularity (``alpha``) over
``n_adapters``, and each request gets its adapter's LoRA rank (``rank``), as in the synthetic workloads.

The LMSYS Chatbot Arena trace (PLoRA's real workload, VII-A) is not available offline: :func:`lmsys_substitute`
says so in its notes and uses ``splitwise-conv`` (a chat service, like Chatbot Arena) instead.
"""

from pathlib import Path

import numpy as np

from host.workloads.base import Workload
from host.workloads.synthetic import adapter_ranks, all_at_once, gamma_arrivals, powerlaw_adapters

DATA_DIR = Path(__file__).resolve().parents[2] / "data"  # the project's data/ (data/README.md)

__all__ = ["TRACES", "trace_workload", "lmsys_substitute", "LMSYS_NOTE"]

_T = DATA_DIR / "vidur" / "processed_traces"
TRACES = {"splitwise-conv": _T / "splitwise_conv.csv", "splitwise-code": _T / "splitwise_code.csv",
          "arxiv": _T / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"}

LMSYS_NOTE = ("LMSYS Chatbot Arena trace (PLoRA's real workload) is not available offline; substituted by the "
              "Azure LLM inference conversation trace (data/vidur/processed_traces/splitwise_conv.csv, a chat "
              "service) with S-LoRA's power-law adapter popularity")

_CACHE = {}


def _load(name):
    if name not in _CACHE:
        import pandas as pd
        try:
            path = TRACES[name]
        except KeyError:
            raise ValueError(f"unknown trace {name!r}; allowed: {sorted(TRACES)}") from None
        _CACHE[name] = pd.read_csv(path)
    return _CACHE[name]


def trace_workload(name: str, *, n_requests: int = 1000, rate_per_s: float | None = None, cv: float = 1.0,
                   n_adapters: int = 1000, alpha: float = 0.5, max_tokens: int | None = None,
                   seed: int = 0) -> Workload:
    """``n_requests`` requests of trace ``name`` (see the module docstring)."""
    df = _load(name)
    if n_requests < 1:
        raise ValueError(f"n_requests must be >= 1, got {n_requests}")
    if n_requests > len(df):
        raise ValueError(f"trace {name} has {len(df)} requests, asked for {n_requests}")
    rng = np.random.default_rng(seed)
    notes = []
    if "arrived_at" in df.columns:
        start = int(rng.integers(0, len(df) - n_requests + 1))
        rows = df.iloc[start:start + n_requests]
        arr = rows["arrived_at"].to_numpy(np.float64)
        arr = arr - arr[0]
        if rate_per_s is not None:
            if not rate_per_s > 0:
                raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
            if arr[-1] > 0:
                arr = arr * ((n_requests - 1) / rate_per_s) / arr[-1]
        window = dict(start_row=start)
    else:
        idx = np.sort(rng.choice(len(df), n_requests, replace=False))
        rows = df.iloc[idx]
        arr = all_at_once(n_requests) if rate_per_s is None else gamma_arrivals(n_requests, rate_per_s, cv, rng)
        window = dict(sampled_rows=n_requests)
        notes.append(f"{name}: the trace has no arrival times; arrivals "
                     f"{'all at t = 0' if rate_per_s is None else f'gamma, {rate_per_s}/s, cv {cv}'}")
    prompts = np.maximum(rows["num_prefill_tokens"].to_numpy(np.int64), 1)
    outputs = np.maximum(rows["num_decode_tokens"].to_numpy(np.int64), 1)
    if max_tokens is not None:
        prompts, outputs = np.minimum(prompts, max_tokens), np.minimum(outputs, max_tokens)
    ranks = adapter_ranks(n_adapters, rng)
    ad = powerlaw_adapters(n_requests, n_adapters, rng, alpha)
    params = dict(generator="trace_workload", name=name, file=str(TRACES[name].relative_to(DATA_DIR.parent)),
                  n_requests=n_requests, rate_per_s=rate_per_s, cv=cv, n_adapters=n_adapters, alpha=alpha,
                  max_tokens=max_tokens, seed=seed, **window)
    return Workload(name, arr, prompts, outputs, ad, extra={"rank": ranks[ad]}, params=params, notes=notes)


def lmsys_substitute(**kw) -> Workload:
    """PLoRA's ``trace`` workload: the LMSYS stand-in (``splitwise-conv``), with the substitution in its notes."""
    w = trace_workload("splitwise-conv", **kw)
    w.notes.insert(0, LMSYS_NOTE)
    w.name = "trace"
    w.params["substitutes"] = "lmsys-chatbot-arena"
    return w
