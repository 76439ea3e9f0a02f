"""``make bench-host``'s DSE figure (host.bench GRIDS): the small grids of both families (the NDP cores and the
calibrated DIMM-PIM rank PUs) priced in one process with the area cache warm (a first, untimed pass fills it), as
``dse_points_per_s`` (and ``dse_pim_points``, the PIM points among them)."""

import time

__all__ = ["run_grid"]


def run_grid() -> dict:
    from host.sweep.executor import LocalExecutor
    from .cli import run_dse
    from .price import PIM_WORKLOADS, WORKLOADS
    from .space import GRIDS, PIM_GRIDS, grid_points, pim_grid_points
    points = grid_points(GRIDS["small"]) + pim_grid_points(PIM_GRIDS["small"])
    kw = dict(pim_workload=PIM_WORKLOADS["small"], say=lambda s: None)
    with LocalExecutor(jobs=1, progress=False) as ex:
        run_dse(points, WORKLOADS["small"], executor=ex, **kw)      # warm-up: fills the area cache
        t0 = time.perf_counter()
        res = run_dse(points, WORKLOADS["small"], executor=ex, **kw)
        wall = time.perf_counter() - t0
    bad = [r for r in res["rows"] if r["status"] != "priced"]
    if bad:
        raise RuntimeError(f"dse bench: {bad[0]['point']} not priced: {bad[0]['reason']}")
    return {"dse_points": len(points), "dse_pim_points": sum(p.family == "pim" for p in points),
            "dse_points_per_s": len(points) / wall}
