"""``host.l3.bench.run_grid()``: the whole L3 grid (3 models x 4 traces x 5 systems x 1,000 requests) on the
local process pool (all the CPUs this process may use), timed; called by ``python -m host.bench``
(``make bench-host``), which writes the figures into build/bench/host.json.

Returns ``l3_grid_s`` (wall seconds of the grid, worker start-up included), ``l3_grid_points`` (runs), and per
system the geometric-mean throughput over the model x trace points every system completed (no OOM), with L3's
geometric-mean speedup over each baseline on those points, and the online predictor errors of the L3 runs.
``python -m host.l3.bench`` runs it alone and prints the table.
"""

import sys
import time

import numpy as np

from host.l3.sweep import PAPER_SYSTEMS, run_points, throughput_points

__all__ = ["run_grid", "grid_figures"]


def grid_figures(rows) -> dict:
    out = {}
    ok = {}
    for r in rows:
        if not r.get("oom") and r.get("throughput_tok_s") and np.isfinite(r["throughput_tok_s"]):
            ok.setdefault((r["model"], r["trace"]), {})[r["system"]] = r["throughput_tok_s"]
    common = [k for k, v in ok.items() if all(s in v for s in PAPER_SYSTEMS)]
    out["l3_grid_common_points"] = len(common)
    for s in PAPER_SYSTEMS:
        vals = [ok[k][s] for k in common]
        if vals:
            out[f"l3_geomean_tok_s_{s}"] = float(np.exp(np.mean(np.log(vals))))
    for s in PAPER_SYSTEMS[1:]:
        pts = [k for k, v in ok.items() if "l3" in v and s in v]
        if pts:
            out[f"l3_speedup_over_{s}"] = float(np.exp(np.mean([np.log(ok[k]["l3"] / ok[k][s]) for k in pts])))
    out["l3_oom_points"] = int(sum(1 for r in rows if r.get("oom")))
    l3 = [r for r in rows if r["system"] == "l3" and not r.get("oom")]
    for key in ("pred_re_pim_online", "pred_re_gpu_online"):
        v = [r[key] for r in l3 if r.get(key) is not None and np.isfinite(r[key])]
        if v:
            out[f"l3_{key}_mean"] = float(np.mean(v))
    return out


def run_grid(jobs: int | None = None, n_requests: int = 1000) -> dict:
    """Run the grid and return its figures (module docstring)."""
    t0 = time.perf_counter()
    rows = run_points(throughput_points(n_requests=n_requests), jobs=jobs, desc="l3 grid")
    wall = time.perf_counter() - t0
    out = {"l3_grid_s": wall, "l3_grid_points": len(rows)}
    out.update(grid_figures(rows))
    run_grid.last_rows = rows
    return out


def main(argv=None) -> int:
    figs = run_grid()
    for r in run_grid.last_rows:
        thr = r["throughput_tok_s"]
        print(f"{r['model']:<9}{r['trace']:<13}{r['system']:<12}"
              f"{'OOM' if r.get('oom') else f'{thr:10.1f} tok/s':>16}  wall {r['wall_s']:6.1f} s")
    for k, v in figs.items():
        print(f"{k:<40}{v:>14.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
