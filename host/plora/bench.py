"""The PLoRA part of ``make bench-host``: the whole TPOT grid (4 models x 4 workloads x every system), timed.

:func:`run_grid` runs :func:`host.plora.figures.grid_specs` through the local process pool and returns the
figures ``host/bench.py`` writes to build/bench/host.json: ``plora_grid_s`` (wall seconds of the grid),
``plora_grid_points``, ``plora_grid_errors``, ``plora_grid_ndp_kernel_table`` (whether the calibrated NDP
model's kernel table was current and read: ``loaded N``, else ``stale`` or ``missing``, and the grid computes
every kernel time), per-system mean TPOT over the grid and per-system ``cost_model_err`` (how far each system's
estimate was from its executed timeline: the mean of the points' signed means, their range, the worst p99).

The points are handed to the workers the costliest kinds first (the PLoRA family with Algorithm 1 and the device
timeline before the host-memory baselines), so the last points to finish are short ones; the rows are put back in
the grid's order before anything is computed from them.
"""

import time

__all__ = ["run_grid", "GRID_REQUESTS", "COST_ORDER"]

#: Requests per grid point (issue 30 item 6: 1,000 per point, at the load regime of
#: ``host.plora.figures.GRID_RATE_PER_S``, gamma arrivals with cv 1; the workloads' 1,000 adapters)
GRID_REQUESTS = 1000

#: The grid's systems from the costliest per point to the cheapest (CPU seconds per point measured on the grid,
#: 2026-12-05): the order the points are handed to the workers in; a system not listed comes last
COST_ORDER = ("plora", "plora-nocxl", "nd-e4", "nd-e3", "ns", "pure-cxl", "n-e3", "n-e4", "grace-hopper",
              "s-lora-4gpu", "s-lora-2gpu", "s-lora", "cpu-lora-offload")


def run_grid(*, n_requests: int = GRID_REQUESTS, jobs: int | None = None, executor=None, seed: int = 0) -> dict:
    """Run the TPOT grid; return ``{"plora_grid_s" (wall), "plora_grid_points", "plora_grid_errors" (points that
    cannot run, e.g. a model that does not fit one GPU), "plora_grid_points_cpu_s" (CPU seconds of the points,
    summed over the workers), "plora_grid_ndp_kernel_table", "plora_grid_tpot_ms": {system: mean over the grid}}``."""
    from .figures import grid_specs, run_sweep
    from .ndp_model import make_ndp_model
    # the calibrated model's kernel table (data/ndp_kernel_table.json), loaded here before the workers start
    table = getattr(make_ndp_model("auto"), "table_status", "none")
    own = executor is None
    if own:
        from host.sweep import LocalExecutor
        executor = LocalExecutor(jobs)
    specs = grid_specs(n_requests=n_requests, seed=seed)
    rank = {s: i for i, s in enumerate(COST_ORDER)}
    order = sorted(range(len(specs)), key=lambda i: (rank.get(specs[i].system, len(rank)), i))
    t0 = time.perf_counter()
    try:
        df = run_sweep([specs[i] for i in order], executor, desc="plora grid")
    finally:
        if own:
            executor.close()
    wall = time.perf_counter() - t0
    df.index = order                          # back in the grid's order
    df = df.sort_index()
    ok = df[df["error"] == ""]
    # the load regime (issue 30 item 2): PLoRA's hbm_pressure per model x workload, and its least on the uniform
    # workloads (> 1: the serving set overshoots the HBM left after the weights)
    pl = ok[ok["system"] == "plora"]
    pressure = {f"{r.model}/{r.workload}": float(r.hbm_pressure) for r in pl.itertuples()}
    uni = pl[pl["workload"].isin(("uniform", "uniform-long"))]["hbm_pressure"]
    return {"plora_grid_s": wall, "plora_grid_points": int(len(df)), "plora_grid_errors": int(len(df) - len(ok)),
            "plora_grid_points_cpu_s": float(df["cpu_s"].sum()), "plora_grid_requests_per_point": n_requests,
            "plora_grid_rate_per_s": float(specs[0].rate_per_s) if specs else float("nan"),
            "plora_grid_ndp_kernel_table": table,
            "plora_grid_hbm_pressure": pressure,
            "plora_grid_uniform_hbm_pressure_min": float(uni.min()) if len(uni) else float("nan"),
            "plora_grid_tpot_ms": {s: float(g["tpot_ms_mean"].mean()) for s, g in ok.groupby("system")},
            "plora_grid_cost_model_err": _cost_model_err(ok)}


def _cost_model_err(ok) -> dict:
    """Per system over the grid's points: the mean of the points' signed mean errors, their least and greatest,
    and the worst point's p99 of the absolute error."""
    if "cost_model_err_mean" not in ok:
        return {}
    out = {}
    for s, g in ok.groupby("system"):
        m = g["cost_model_err_mean"].dropna()
        if len(m):
            out[s] = {"mean": float(m.mean()), "min": float(m.min()), "max": float(m.max()),
                      "p99_worst": float(g["cost_model_err_p99"].max())}
    return out


if __name__ == "__main__":        # python -m host.plora.bench
    import json
    print(json.dumps(run_grid(), indent=2))
