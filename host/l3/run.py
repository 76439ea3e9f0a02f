"""One run of the L3 study: a deployment, a trace and a system, all data-parallel replicas, one run directory.

:func:`run_l3` deals the requests to the ``DP`` replicas round robin (in arrival order), runs each replica through
host-core's engine with its own system instance (:mod:`host.l3.systems`), and merges them into one
:class:`host.serving.RunOutput` (the replicas run concurrently from t = 0, so the run's makespan is the slowest
replica's). Merged summary keys:

* ``throughput_tok_s`` = all output tokens / makespan; ``tbt_ms_mean`` and the TBT percentiles over every token
  gap of every replica;
* ``mean_batch`` = the sum over replicas of their mean batch (requests per iteration): the node's concurrent
  batch; ``mean_batch_per_replica`` the mean over replicas;
* ``gpu_bubble_frac`` / ``pim_bubble_frac`` = 1 - busy / priced time summed over replicas (GPU: the TP group's
  compute; PIM: the busiest rankset's compute and receive time); NaN where a system has no PIM;
* ``rejected`` / ``rejected_frac``: requests whose final KV (prompt + output - 1 tokens, in blocks of 16) can
  never fit the system's KV memory on a replica (:func:`host.l3.systems.request_kv_limit_bytes`: HBM for GPU-only
  and HBM-PIM on long requests, host memory for L3 and R-PIM); each is rejected on its own at arrival, as a serving
  framework rejects a prompt longer than it can hold, and the run goes on with the others (``requests`` counts the
  served ones, ``requests_offered`` all; throughput is the served requests' output tokens over the makespan).
  ``oom`` is True only when every request is rejected (the run is then not simulated and its throughput is NaN);
* ``gpu_memory_utilization``: the HBM headroom option the run used (1.0: off, the whole HBM less weights and
  workspace; vLLM's 0.9 when set), ``hbm_kv_capacity_gb`` the replica's HBM for KV it implies, and
  ``min_gpu_tokens`` the L3 scheduler's token floor (0: the paper's rule): options never change results unseen.
"""

import time
from dataclasses import dataclass

import numpy as np

from host.serving import (Engine, EngineConfig, RequestTable, RunOutput, summarize)
from host.serving.metrics import TokenGaps
from host.l3.config import l3_setup
from host.l3.systems import (SYSTEMS, make_system, hbm_kv_capacity_bytes, request_kv_limit_bytes, BLOCK_TOKENS,
                             HBM_KV_SYSTEMS)
from host.l3.traces import load_trace

__all__ = ["run_l3", "run_energy", "split_replicas", "merge_outputs", "oom_reason", "never_fits", "take_rows", "RUN_KEYS",
           "FAST_ENGINE"]

#: Keys every summary.json of an L3 run carries (issue 13, item 7).
RUN_KEYS = ("throughput_tok_s", "tbt_ms_mean", "mean_batch", "gpu_bubble_frac", "pim_bubble_frac")

#: System summary keys that add up over replicas (the others are averaged).
_SUMMED = {"swap_outs", "pred_pim_samples", "pred_rfr_p_samples", "pred_rfr_batch_samples", "pred_fits"}

#: Engine options for sweeps: no per-iteration rows, no trace.
FAST_ENGINE = EngineConfig(record_iterations=False, trace=False)


def take_rows(table: RequestTable, rows) -> RequestTable:
    """A request table of ``rows`` of ``table`` (ids kept)."""
    return RequestTable(id=table.id[rows], arrival_s=table.arrival_s[rows], prompt_tokens=table.prompt_tokens[rows],
                        output_tokens=table.output_tokens[rows], adapter_id=table.adapter_id[rows],
                        extra={k: v[rows] for k, v in table.extra.items()})


def split_replicas(table: RequestTable, dp: int) -> list:
    """Round-robin (arrival order) request tables of ``dp`` replicas; ids are kept."""
    order = np.argsort(table.arrival_s, kind="stable")
    return [take_rows(table, order[r::dp]) for r in range(dp)]


def _kv_limit(system, setup, system_kw):
    return request_kv_limit_bytes(system, setup,
                                  gpu_memory_utilization=(system_kw or {}).get("gpu_memory_utilization"))


def never_fits(system: str, setup, table: RequestTable, system_kw: dict | None = None) -> np.ndarray:
    """Mask of the requests of ``table`` whose final KV can never fit ``system``'s KV memory on one replica (the
    engine's reserve policy: prompt + output - 1 tokens, rounded up to blocks of 16)."""
    tok = int(_kv_limit(system, setup, system_kw) // setup.kv_bytes_per_token) // BLOCK_TOKENS * BLOCK_TOKENS
    return (table.prompt_tokens + table.output_tokens - 1) > tok


def oom_reason(system: str, setup, table: RequestTable, system_kw: dict | None = None) -> str | None:
    """Why ``system`` can never serve some request of ``table`` (its final KV exceeds the KV memory), or None."""
    cap = _kv_limit(system, setup, system_kw)
    where = "HBM" if system in HBM_KV_SYSTEMS else "host memory"
    tok = int(cap // setup.kv_bytes_per_token) // BLOCK_TOKENS * BLOCK_TOKENS
    final = table.prompt_tokens + table.output_tokens - 1
    big = never_fits(system, setup, table, system_kw)
    if not big.any():
        return None
    return (f"{int(big.sum())} of {table.n} requests need more KV than the replica's {where} holds "
            f"({tok} tokens = {cap / 1e9:.1f} GB; longest request {int(final.max())} tokens)")


def merge_outputs(outs: list, name: str) -> RunOutput:
    """One :class:`RunOutput` from the replicas' outputs (module docstring)."""
    if len(outs) == 1:
        o = outs[0]
        o.summary["mean_batch_per_replica"] = o.summary["mean_batch"]
        o.summary["replicas"] = 1
        return o
    cols = ("id", "arrival_s", "prompt_tokens", "output_tokens", "adapter_id")
    t = RequestTable(**{c: np.concatenate([getattr(o.table, c) for o in outs]) for c in cols},
                     extra={k: np.concatenate([o.table.extra[k] for o in outs]) for k in outs[0].table.extra})
    for c in ("state", "prefill_len", "prefilled", "generated", "admitted_s", "first_token_s", "last_token_s",
              "finish_s", "preemptions"):
        setattr(t, c, np.concatenate([getattr(o.table, c) for o in outs]))
    order = np.argsort(t.id, kind="stable")
    for c in cols + ("state", "prefill_len", "prefilled", "generated", "admitted_s", "first_token_s",
                     "last_token_s", "finish_s", "preemptions"):
        setattr(t, c, getattr(t, c)[order])
    t.extra = {k: v[order] for k, v in t.extra.items()}
    gaps = TokenGaps.merge([o.gaps for o in outs])
    s = summarize(t, np.zeros(0), np.zeros(0), gaps)
    rs = [o.summary for o in outs]
    s["iterations"] = int(sum(r["iterations"] for r in rs))
    s["mean_batch"] = float(sum(r["mean_batch"] for r in rs))
    s["mean_batch_per_replica"] = float(np.mean([r["mean_batch"] for r in rs]))
    s["max_batch"] = int(sum(r["max_batch"] for r in rs))
    s["mean_batch_tokens"] = float(sum(r["mean_batch_tokens"] for r in rs))
    s["system"] = name
    s["replicas"] = len(outs)
    s["trace_dropped_events"] = int(sum(r.get("trace_dropped_events", 0) for r in rs))
    busy = {k: sum(r.get(k, 0.0) for r in rs) for k in ("busy_time_s", "gpu_busy_s", "pim_busy_s")}
    T = busy["busy_time_s"]
    s.update(busy)
    s["gpu_bubble_frac"] = 1 - busy["gpu_busy_s"] / T if T > 0 else float("nan")
    s["pim_bubble_frac"] = (1 - busy["pim_busy_s"] / T if T > 0 else float("nan")) \
        if np.isfinite(rs[0].get("pim_bubble_frac", float("nan"))) else float("nan")
    for k in rs[0]:
        if k in s:
            continue
        vals = [r.get(k) for r in rs]
        if all(isinstance(v, (int, float, np.integer, np.floating)) for v in vals):
            v = np.asarray(vals, dtype=np.float64)
            fin = v[np.isfinite(v)]
            if not len(fin):
                s[k] = float("nan")
            elif k in _SUMMED or k.startswith(("kv_", "host_kv_")):
                s[k] = float(fin.sum())
            else:
                s[k] = float(fin.mean())
    keys = set().union(*[o.iterations.keys() for o in outs]) if outs[0].iterations else set()
    iterations = {}
    if keys:
        for k in list(outs[0].iterations) + ["replica"] + sorted(keys - set(outs[0].iterations)):
            parts = []
            for r, o in enumerate(outs):
                n = len(o.iterations["start_s"])
                parts.append(np.full(n, r) if k == "replica" else np.asarray(o.iterations.get(k, np.full(n, np.nan))))
            iterations[k] = np.concatenate(parts)
    from host.serving import Span
    spans = []
    for r, o in enumerate(outs):
        for t0, sp in o.spans:
            spans.append((t0, sp if sp.lane != "batch" else Span(f"batch (replica {r})", sp.name, sp.start_s,
                                                                  sp.dur_s, sp.args)))
    spans.sort(key=lambda x: x[0])
    config = dict(outs[0].config)
    config["system"] = {**config["system"], "replica": list(range(len(outs)))}
    return RunOutput(system_name=name, table=t, iterations=iterations, spans=spans,
                     dropped_spans=sum(o.dropped_spans for o in outs), gaps=gaps, summary=s, config=config,
                     wall_s=sum(o.wall_s for o in outs))


def run_energy(systems: list, output_tokens) -> dict:
    """``energy_j`` and ``energy_per_token_mj`` of the node (host/energy.py): every replica's ledger over the
    node's window (the earliest iteration start to the latest iteration end of any replica; a replica that is done
    idles until the others are)."""
    from host.energy import EnergyLedger
    spans = [s.ework["span"] for s in systems if np.isfinite(s.ework["span"][0])]
    window = max(x[1] for x in spans) - min(x[0] for x in spans) if spans else 0.0
    led = EnergyLedger()
    for s in systems:
        led.merge(s.energy(window))
    return led.as_summary(output_tokens)


@dataclass
class L3Run:
    output: RunOutput | None
    summary: dict
    config: dict
    systems: list


def run_l3(model: str, trace: str, system: str, *, ranksets: int | None = None, host_memory_gb: float | None = None,
           seed: int = 0, n_requests: int = 1000, workload=None, engine: EngineConfig | None = None,
           system_kw: dict | None = None, setup=None) -> L3Run:
    """Run ``system`` on ``model``'s L3 deployment (or ``setup``, an L3Setup) with ``trace`` (or ``workload``); see
    the module docstring."""
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; allowed: {list(SYSTEMS)}")
    wall0 = time.perf_counter()
    setup = setup if setup is not None else l3_setup(model, ranksets=ranksets, host_memory_gb=host_memory_gb)
    w = workload if workload is not None else load_trace(trace, n_requests, seed)
    table = w.to_table()
    config = {"model": model, "trace": trace, "system_name": system, "seed": seed, "setup": setup.describe(),
              "workload": w.describe() if hasattr(w, "describe") else None}
    big = never_fits(system, setup, table, system_kw)
    reason = oom_reason(system, setup, table, system_kw)
    gmu = (system_kw or {}).get("gpu_memory_utilization")
    options = {"gpu_memory_utilization": 1.0 if gmu is None else float(gmu),
               "hbm_kv_capacity_gb": hbm_kv_capacity_bytes(setup, gmu) / 1e9,
               "requests_offered": int(table.n), "rejected": int(big.sum()),
               "rejected_frac": float(big.mean()) if table.n else 0.0, "rejected_reason": reason}
    config["rejected_ids"] = table.id[big].tolist()
    if big.all():
        s = {"system": system, "oom": True, "oom_reason": reason, "requests": 0, "finished": 0,
             "throughput_tok_s": float("nan"), "tbt_ms_mean": float("nan"), "mean_batch": float("nan"),
             "gpu_bubble_frac": float("nan"), "pim_bubble_frac": float("nan"), **options,
             # nothing ran: no energy (null in summary.json, the keys present as in every run)
             "energy_j": {k: float("nan") for k in ("gpu", "links", "ndp", "pim", "dram", "total")},
             "energy_per_token_mj": float("nan"),
             "wall_s": time.perf_counter() - wall0}
        return L3Run(None, s, config, [])
    served = take_rows(table, np.flatnonzero(~big)) if big.any() else table
    outs, systems = [], []
    for r, sub in enumerate(split_replicas(served, setup.dp)):
        sysobj = make_system(system, setup, replica=r, seed=seed + r, **(system_kw or {}))
        sysobj.emit_spans = engine is None or engine.trace
        outs.append(Engine(sysobj, engine).run(sub))
        systems.append(sysobj)
    out = merge_outputs(outs, system)
    out.summary.update(run_energy(systems, out.summary.get("output_tokens", 0)))
    lb = [sy.link_bytes() for sy in systems]        # every replica's host link, summed
    out.summary["link_bytes"] = {k: float(sum(x[k] for x in lb)) for k in ("pcie_out", "pcie_in")}
    out.summary["oom"] = False
    out.summary.update(options)
    out.summary["wall_s"] = time.perf_counter() - wall0
    out.config = {**config, **out.config}
    return L3Run(out, out.summary, out.config, systems)
