"""The executor interface: local pool (in-process and 2 processes) and Dask (LocalCluster) give the same ordered
results."""

import math

import pytest

from host.sweep import LocalExecutor, DaskExecutor, get_executor


def _square(x):
    return x * x


def test_local_in_process_and_pool():
    items = list(range(7))
    with LocalExecutor(1) as ex:
        assert ex.map(_square, items) == [x * x for x in items]
    with LocalExecutor(2) as ex:
        assert ex.map(_square, items) == [x * x for x in items]
    with pytest.raises(ValueError, match="--jobs must be >= 1"):
        LocalExecutor(0)


def test_dask_local_cluster():
    from dask.distributed import LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with get_executor(cluster.scheduler_address) as ex:
            assert isinstance(ex, DaskExecutor)
            assert ex.map(math.sqrt, [4, 9, 16]) == [2.0, 3.0, 4.0]
            assert ex.describe()["kind"] == "dask"
