"""One executor interface for sweeps: a local process pool by default, a Dask distributed cluster on request.

``executor.map(fn, items, desc=...)`` returns ``[fn(x) for x in items]`` in order, running the calls in parallel,
with a tqdm progress bar that appears only when the sweep runs longer than ``progress_delay_s`` (2 s). ``fn``
must be picklable (a module-level function) and so must the items.

* :class:`LocalExecutor`: ``concurrent.futures.ProcessPoolExecutor`` with ``jobs`` workers (default: the CPUs
  this process may use); ``jobs=1`` runs in this process (no pickling, easiest to debug).
* :class:`DaskExecutor`: a ``dask.distributed.Client`` connected to ``address`` (``--cluster tcp://host:8786``),
  or to a given client / ``LocalCluster``.

:func:`get_executor` picks one from command-line values; :func:`add_executor_args` adds ``--jobs`` and
``--cluster`` to an argparse parser.
"""

import os
from concurrent.futures import ProcessPoolExecutor, as_completed

__all__ = ["Executor", "LocalExecutor", "DaskExecutor", "get_executor", "add_executor_args", "default_jobs"]


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _bar(total, desc, delay, disable):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, delay=delay, disable=disable, leave=False, dynamic_ncols=True)


class Executor:
    """The interface: ``map(fn, items, desc=None) -> list`` (ordered), ``close()``; a context manager."""

    progress_delay_s = 2.0
    progress = True

    def map(self, fn, items, desc: str | None = None) -> list:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def describe(self) -> dict:
        return {"kind": type(self).__name__}


class LocalExecutor(Executor):
    def __init__(self, jobs: int | None = None, progress: bool = True):
        jobs = default_jobs() if jobs is None else int(jobs)
        if jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {jobs}")
        self.jobs = jobs
        self.progress = progress
        self._pool = None

    def map(self, fn, items, desc=None):
        items = list(items)
        out = [None] * len(items)
        with _bar(len(items), desc, self.progress_delay_s, not self.progress) as bar:
            if self.jobs == 1 or len(items) <= 1:
                for i, x in enumerate(items):
                    out[i] = fn(x)
                    bar.update()
                return out
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=self.jobs)
            futs = {self._pool.submit(fn, x): i for i, x in enumerate(items)}
            for f in as_completed(futs):
                out[futs[f]] = f.result()
                bar.update()
        return out

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def describe(self):
        return {"kind": "local", "jobs": self.jobs}


class DaskExecutor(Executor):
    """Runs on a Dask distributed cluster: ``DaskExecutor("tcp://host:8786")`` or ``DaskExecutor(client=c)``."""

    def __init__(self, address=None, *, client=None, progress: bool = True):
        from dask.distributed import Client
        if client is None and address is None:
            raise ValueError("DaskExecutor needs a scheduler address (--cluster tcp://host:port) or a client")
        self._own = client is None
        self.client = client if client is not None else Client(address)
        self.address = address if address is not None else getattr(client.scheduler, "address", None)
        self.progress = progress

    def map(self, fn, items, desc=None):
        from dask.distributed import as_completed as dask_completed
        items = list(items)
        futs = self.client.map(fn, items, pure=False)
        index = {f.key: i for i, f in enumerate(futs)}
        out = [None] * len(items)
        with _bar(len(items), desc, self.progress_delay_s, not self.progress) as bar:
            for f in dask_completed(futs):
                out[index[f.key]] = f.result()
                bar.update()
        return out

    def close(self):
        if self._own:
            self.client.close()

    def describe(self):
        return {"kind": "dask", "address": str(self.address)}


def get_executor(cluster: str | None = None, jobs: int | None = None, progress: bool = True) -> Executor:
    """``cluster`` (a Dask scheduler address) -> :class:`DaskExecutor`, else :class:`LocalExecutor` (``jobs``)."""
    if cluster:
        return DaskExecutor(cluster, progress=progress)
    return LocalExecutor(jobs, progress=progress)


def add_executor_args(parser) -> None:
    from host.cli import int_range
    parser.add_argument("--jobs", type=int_range(1), default=None,
                        help="local worker processes (default: the CPUs available; 1 = in this process)")
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="run on a Dask distributed cluster at this scheduler address (tcp://host:8786)")
