"""``make bench-host``'s compare grid: the small grid of ``ndpim compare`` (host.bench adds its wall time as
``compare_grid_s``)."""

import tempfile

__all__ = ["run_grid"]


def run_grid() -> dict:
    from .cli import write_outputs
    from .run import SMALL, SYSTEMS, Grid, run_grid as _run
    from .workloads import WORKLOADS
    with tempfile.TemporaryDirectory() as d:
        res = _run(Grid(tuple(WORKLOADS), tuple(SYSTEMS), SMALL["requests"], SMALL["matched_batch"]), d)
        write_outputs(res, d)
    rows = res["rows"]
    return {"points": len(rows), "served": sum(r["status"] in ("served", "partial") for r in rows)}
