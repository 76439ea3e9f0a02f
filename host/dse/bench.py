"""``make bench-host``'s DSE figure (host.bench GRIDS): the small grid priced in one process with the area cache
warm (a first, untimed pass fills it), as ``dse_points_per_s``."""

import time

__all__ = ["run_grid"]


def run_grid() -> dict:
    from host.sweep.executor import LocalExecutor
    from .cli import run_dse
    from .price import WORKLOADS
    from .space import GRIDS, grid_points
    points = grid_points(GRIDS["small"])
    with LocalExecutor(jobs=1, progress=False) as ex:
        run_dse(points, WORKLOADS["small"], executor=ex, say=lambda s: None)      # warm-up: fills the area cache
        t0 = time.perf_counter()
        res = run_dse(points, WORKLOADS["small"], executor=ex, say=lambda s: None)
        wall = time.perf_counter() - t0
    bad = [r for r in res["rows"] if r["status"] != "priced"]
    if bad:
        raise RuntimeError(f"dse bench: {bad[0]['point']} not priced: {bad[0]['reason']}")
    return {"dse_points": len(points), "dse_points_per_s": len(points) / wall}
