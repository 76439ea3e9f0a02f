"""The four workloads of ``ndpim compare`` (issue 34 item 1), each built from the project's existing generators:

* ``lora-short`` -- multi-LoRA, short context: PLoRA's ``skewed`` preset (host.workloads.plora_workload: 1,000
  adapters, 80 % of requests to 50 hot adapters, PLoRA VII-A; ranks from {8, ..., 128}, PLoRA VII-A; prompt and
  output lengths uniform in [8, 512), S-LoRA's synthetic default ranges; gamma arrivals, cv 1, at ``rate``);
* ``lora-long`` -- multi-LoRA, long context: PLoRA's ``skewed-long`` preset (prompts [1024, 3072), outputs
  [256, 1024): within the 4K context of PLoRA's introduction);
* ``reasoning`` -- single-model long-context reasoning traces: L3 Table 4's OpenR1-Math-220k lengths
  (host.l3.traces.generate: lognormal, mean 96 / 12,684 tokens in / out), all requests at t = 0 (L3 6.1's
  offline batch). One model, no adapters: every request is adapter 0 at the smallest rank of PLoRA VII-A (8), the
  least LoRA work a PLoRA-host system can be given (the PLoRA host has no adapter-free path);
* ``mix`` -- many adapters and a few long-context requests: the ``lora-short`` requests, of which a fraction
  :data:`MIX_LONG_FRACTION` is replaced by LongBench requests (L3 Table 4: prompts 7,704 +- 4,286 tokens), each keeping
  its arrival time and adapter.

Every workload is written to a trace file (host.workloads.trace_file columns, with ``adapter_id`` and ``rank``) so
both hosts run the same requests: the PLoRA host through its ``--trace-file`` path, the L3 host from the same
:class:`host.workloads.Workload`.
"""

import csv
from pathlib import Path

import numpy as np

from host.workloads import Workload, plora_workload

__all__ = ["WORKLOADS", "MIX_LONG_FRACTION", "SINGLE_MODEL_RANK", "DEFAULT_RATE", "build", "write_trace", "describe"]

#: Design choice (stated): 1 request in 20 of ``mix`` is long-context ("a few", issue 34 item 1); at least one.
MIX_LONG_FRACTION = 0.05
#: PLoRA VII-A: the smallest adapter rank of [8, 16, 32, 64, 128] (``reasoning``: one model, least LoRA work).
SINGLE_MODEL_RANK = 8
#: host.workloads.synthetic: the PLoRA presets' design default, 10 requests/s (every figure states its rate).
DEFAULT_RATE = 10.0

WORKLOADS = {
    "lora-short": "multi-LoRA, short context (PLoRA skewed: 1,000 adapters, prompts/outputs in [8, 512))",
    "lora-long": "multi-LoRA, long context (PLoRA skewed-long: prompts [1024, 3072), outputs [256, 1024))",
    "reasoning": "single model, long-context reasoning (L3 Table 4 OpenR1-Math lengths, all at t = 0)",
    "mix": "many adapters + a few long-context requests (lora-short with 5 % LongBench-length requests)",
}


def build(name: str, *, n_requests: int, seed: int = 0, rate_per_s: float = DEFAULT_RATE) -> Workload:
    """Workload ``name`` (:data:`WORKLOADS`) of ``n_requests`` requests."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; allowed: {list(WORKLOADS)}")
    if name == "lora-short":
        w = plora_workload("skewed", n_requests=n_requests, rate_per_s=rate_per_s, seed=seed)
    elif name == "lora-long":
        w = plora_workload("skewed-long", n_requests=n_requests, rate_per_s=rate_per_s, seed=seed)
    elif name == "reasoning":
        from host.l3.traces import generate
        g = generate("openr1", n_requests, seed)
        w = Workload(name, g.arrival_s, g.prompt_tokens, g.output_tokens, np.zeros(len(g), np.int64),
                     extra={"rank": np.full(len(g), SINGLE_MODEL_RANK, np.int64)}, params=g.params,
                     notes=g.notes + [f"one model: every request is adapter 0 at rank {SINGLE_MODEL_RANK} on the "
                                      f"PLoRA host; the L3 host runs no adapter"])
    else:
        from host.l3.traces import generate
        base = plora_workload("skewed", n_requests=n_requests, rate_per_s=rate_per_s, seed=seed)
        k = max(1, int(round(MIX_LONG_FRACTION * n_requests)))
        rng = np.random.default_rng(seed + 1)
        idx = np.sort(rng.choice(n_requests, size=k, replace=False))
        lb = generate("longbench", k, seed + 2)
        pin, pout = base.prompt_tokens.copy(), base.output_tokens.copy()
        pin[idx], pout[idx] = lb.prompt_tokens, lb.output_tokens
        w = Workload(name, base.arrival_s, pin, pout, base.adapter_id, extra=dict(base.extra),
                     params={**base.params, "long_requests": idx.tolist(), "long_from": "L3 Table 4 LongBench",
                             "long_fraction": MIX_LONG_FRACTION},
                     notes=[f"{k} of {n_requests} requests have LongBench lengths (L3 Table 4), the rest PLoRA "
                            f"skewed lengths"])
    w.name = name
    return w


def write_trace(w: Workload, path) -> Path:
    """``w`` as a trace file (arrival_s, prompt_tokens, output_tokens, adapter_id, rank)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["arrival_s", "prompt_tokens", "output_tokens", "adapter_id", "rank"])
        for a, p, o, ad, r in zip(w.arrival_s, w.prompt_tokens, w.output_tokens, w.adapter_id, w.extra["rank"]):
            out.writerow([repr(float(a)), int(p), int(o), int(ad), int(r)])
    return path


def describe(w: Workload) -> dict:
    s = w.stats()
    return {"name": w.name, "about": WORKLOADS[w.name], "requests": s["requests"],
            "prompt_mean": s["prompt_mean"], "output_mean": s["output_mean"], "adapters_used": s["adapters_used"],
            "offline": bool(np.all(w.arrival_s == w.arrival_s[0])), "params": w.params, "notes": w.notes}
