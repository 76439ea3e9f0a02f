"""Sweeps: one executor interface (local process pool or Dask cluster), see host.sweep.executor."""

from host.sweep.executor import (Executor, LocalExecutor, DaskExecutor, get_executor, add_executor_args,
                                 default_jobs)

__all__ = ["Executor", "LocalExecutor", "DaskExecutor", "get_executor", "add_executor_args", "default_jobs"]
