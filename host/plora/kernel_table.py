"""``ndpim plora kernel-table``: write data/ndp_kernel_table.json, the calibrated NDP model's kernel times for
every kernel shape the PLoRA study asks for.

The calibrated model (sim/perf/ndp.py) prices each kernel on the firmware's own descriptor program, which costs
milliseconds to a second per new shape; a sweep meets thousands of shapes (LoRA waves of every rank x batch on
every matrix width, attention shares of every context length). The table holds those answers, computed by the
model itself: :func:`build` runs every sweep of ``ndpim plora figures`` (the TPOT grid included) with the table
switched off, collects every worker's kernel cache and writes the union with the model's fingerprint
(``sim.perf.ndp.table_fingerprint``: the model's parameters and a hash of its sources). ``NDPPerfModel.paper()``
seeds its cache from the table only when the fingerprint matches, so a changed model or firmware never reads
old times (it warns and computes them); ``tests/host/plora/test_plora_kernel_table.py`` checks that the
committed table is current and equal to the model on a sample of its entries.
"""

import tempfile
import time

from host.sweep import Executor, LocalExecutor

__all__ = ["build", "main"]


def _fresh_model():
    from sim.perf.ndp import NDPPerfModel
    return NDPPerfModel.paper(table=None)


def _collecting(args):
    fn, item = args
    import sim.perf.ndp as ndp
    ndp.USE_TABLE = False
    out = fn(item)
    return out, ndp.kernel_cache_entries(_fresh_model())


class _Collector(Executor):
    """Runs ``map`` through ``inner`` and keeps every worker's kernel cache entries."""

    def __init__(self, inner):
        self.inner, self.entries = inner, {}

    def map(self, fn, items, desc=None):
        got = self.inner.map(_collecting, [(fn, x) for x in items], desc=desc)
        for _, entries in got:
            for k, v in entries:
                self.entries.setdefault(repr(k), (k, v))
        return [r for r, _ in got]


def build(path=None, *, jobs=None, n_requests=100, seed=0, figures=None, bench=True) -> dict:
    """Run the figures' sweeps (``figures``: names, default all) and, with ``bench``, the bench grid of
    ``make bench-host`` (``host.plora.bench``: every model x workload x system at ``GRID_REQUESTS`` requests, the
    regime's rate) with the table off, and write the union of the kernel caches to ``path`` (default
    ``sim.perf.ndp.TABLE_PATH``). Returns ``{"path", "entries", "wall_s"}``.

    The bench grid is in the table because its 1,000 requests per point bring ~1,000 prompt lengths per model
    and workload, each a new batch of the E3 / E4 kernels the uniform E3 / E4 ablations run a prompt with
    (~36 ms of the model per length on Llama-2-7B, 2026-12-05): without them the grid is minutes, not seconds."""
    import sim.perf.ndp as ndp
    from .figures import FIGURES, make_figures, grid_specs, run_sweep
    from .bench import GRID_REQUESTS
    path = ndp.TABLE_PATH if path is None else path
    t0 = time.perf_counter()
    ndp.USE_TABLE = False
    inner = LocalExecutor(jobs)
    col = _Collector(inner)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            make_figures(tmp, names=list(figures or FIGURES), n_requests=n_requests, seed=seed, executor=col)
        if bench:
            run_sweep(grid_specs(n_requests=GRID_REQUESTS, seed=seed), col, desc="bench grid")
    finally:
        inner.close()
        ndp.USE_TABLE = True
    model = _fresh_model()
    entries = list(col.entries.values())
    ndp.write_kernel_table(model, entries, path,
                           source="ndpim plora kernel-table (host/plora/kernel_table.py): the calibrated NDP "
                                  f"model over every sweep of `ndpim plora figures` ({n_requests} requests, seed "
                                  f"{seed})" + (f" and the bench grid ({GRID_REQUESTS} requests)" if bench else ""))
    return {"path": str(path), "entries": len(entries), "wall_s": time.perf_counter() - t0}
