"""Sweeps of the L3 study through host-core's executor (local process pool or Dask, progress bars).

A sweep is a list of :class:`Point` (model, trace, system, host-memory variant, seed); :func:`run_points` runs
them with :func:`run_point` (a module-level, picklable function) on an executor and returns one row (dict) per
point: its identity plus the run's summary figures. The grids of the study:

* :func:`throughput_points`: 3 models x 4 traces x the systems (the paper's 5 by default);
* :func:`scalability_points`: L3 on the scalability base (512 GB, 2 ranksets), 'Bw-only' ranksets 2 -> 16,
  'Cap-only' capacity 512 GB -> 4 TB, 'Bw-Cap' both (6.1 set-up facts);
* :func:`ablation_points`: L3 without the communication optimisations and the scheduler, each restored
  (``l3-base``, ``l3-no-comm`` = scheduler only, ``l3-no-sched`` = communication only, ``l3``), and the labelled
  variant ``l3-no-comm-balanced`` (5.1's monolithic transfers with its balanced placement).
"""

import time
from dataclasses import dataclass, asdict

import numpy as np

__all__ = ["Point", "run_point", "run_points", "throughput_points", "scalability_points", "ablation_points",
           "MODELS", "PAPER_TRACES", "PAPER_SYSTEMS", "ABLATION_SYSTEMS",
           "ABLATION_FIGURE_SYSTEMS", "SCALING_RANKSETS", "SCALING_CAPACITY_GB",
           "SUMMARY_KEYS"]

MODELS = ("opt-66b", "gpt-89b", "gpt-175b")
PAPER_TRACES = ("openr1", "dolphin", "openthoughts", "longbench")
PAPER_SYSTEMS = ("l3", "gpu-only", "hbm-pim", "r-pim", "cpu-offload")
ABLATION_SYSTEMS = ("l3-base", "l3-no-comm", "l3-no-sched", "l3")
#: The ablation figure's systems: the paper's steps and, beside ``l3-no-comm``, the labelled variant
#: ``l3-no-comm-balanced`` (5.1's monolithic transfers with its balanced placement: separates the two).
ABLATION_FIGURE_SYSTEMS = ("l3-base", "l3-no-comm", "l3-no-comm-balanced", "l3-no-sched", "l3")
#: [L3] 6.1 set-up facts: ranksets 2 -> 16, capacity 512 GB -> 4 TB.
SCALING_RANKSETS = (2, 4, 8, 16)
SCALING_CAPACITY_GB = (512, 1024, 2048, 4096)

SUMMARY_KEYS = ("throughput_tok_s", "tbt_ms_mean", "tbt_ms_p99", "mean_batch", "gpu_bubble_frac",
                "pim_bubble_frac", "cpu_bubble_frac", "makespan_s", "iterations", "finished", "output_tokens",
                "preemptions", "pred_re_pim_online", "pred_re_gpu_online", "min_gpu_tokens", "predictor_seed_batches", "oom", "oom_reason",
                "kv_capacity_tokens", "requests_offered", "rejected", "rejected_frac", "gpu_memory_utilization",
                "hbm_kv_capacity_gb", "wall_s")


@dataclass(frozen=True)
class Point:
    model: str
    trace: str
    system: str
    seed: int = 0
    n_requests: int = 1000
    ranksets: int | None = None
    host_memory_gb: float | None = None
    study: str = ""
    variant: str = ""
    #: system options (``min_gpu_tokens``, ``gpu_memory_utilization``, ...) as sorted (name, value) pairs
    options: tuple = ()


def run_point(p: Point) -> dict:
    """Run one point (no per-iteration rows, no trace) and return its identity and summary figures."""
    from host.l3.run import run_l3, FAST_ENGINE
    t0, c0 = time.perf_counter(), time.process_time()
    r = run_l3(p.model, p.trace, p.system, ranksets=p.ranksets, host_memory_gb=p.host_memory_gb, seed=p.seed,
               n_requests=p.n_requests, engine=FAST_ENGINE, system_kw=dict(p.options) or None)
    row = asdict(p)
    row["options"] = ";".join(f"{k}={v}" for k, v in p.options)
    for k in SUMMARY_KEYS:
        v = r.summary.get(k)
        row[k] = v if not isinstance(v, (np.floating, np.integer)) else v.item()
    row["wall_s"] = time.perf_counter() - t0
    row["cpu_s"] = time.process_time() - c0
    return row


def _cost(p: Point) -> float:
    """Rough relative cost, to start the slow points first (better packing on the workers)."""
    c = {"l3": 10, "l3-no-comm": 10, "l3-no-comm-balanced": 10}.get(p.system, 1)
    return c * (3 if p.trace == "longbench" else 1) * p.n_requests


def run_points(points, *, executor=None, jobs=None, desc="l3 sweep") -> list:
    """Rows of :func:`run_point` for ``points`` (in their order), on ``executor`` (default: a local pool of
    ``jobs`` workers)."""
    from host.sweep import LocalExecutor
    points = list(points)
    order = sorted(range(len(points)), key=lambda i: -_cost(points[i]))
    own = executor is None
    ex = LocalExecutor(jobs) if own else executor
    try:
        rows = ex.map(run_point, [points[i] for i in order], desc=desc)
    finally:
        if own:
            ex.close()
    out = [None] * len(points)
    for i, row in zip(order, rows):
        out[i] = row
    return out


def throughput_points(*, models=MODELS, traces=PAPER_TRACES, systems=PAPER_SYSTEMS, n_requests=1000, seed=0,
                      options=None):
    """The model x trace x system grid; ``options``: system options applied to every system that takes them
    (``min_gpu_tokens`` to the L3 systems, ``gpu_memory_utilization`` to all)."""
    opts = dict(options or {})

    def own(s):
        o = {k: v for k, v in opts.items() if k not in ("min_gpu_tokens", "profile_batches") or s.startswith("l3")}
        return tuple(sorted(o.items()))
    return [Point(m, t, s, seed, n_requests, study="throughput", options=own(s)) for m in models for t in traces
            for s in systems]


def ablation_points(*, models=MODELS, traces=PAPER_TRACES, n_requests=1000, seed=0):
    return [Point(m, t, s, seed, n_requests, study="ablation") for m in models for t in traces
            for s in ABLATION_FIGURE_SYSTEMS]


def scalability_points(*, models=("gpt-175b",), trace="openr1", n_requests=1000, seed=0):
    pts = []
    base_r, base_c = SCALING_RANKSETS[0], SCALING_CAPACITY_GB[0]
    for m in models:
        for r in SCALING_RANKSETS:
            pts.append(Point(m, trace, "l3", seed, n_requests, r, base_c, "scalability", "Bw-only"))
        for c in SCALING_CAPACITY_GB:
            pts.append(Point(m, trace, "l3", seed, n_requests, base_r, c, "scalability", "Cap-only"))
        for r, c in zip(SCALING_RANKSETS, SCALING_CAPACITY_GB):
            pts.append(Point(m, trace, "l3", seed, n_requests, r, c, "scalability", "Bw-Cap"))
    return pts
