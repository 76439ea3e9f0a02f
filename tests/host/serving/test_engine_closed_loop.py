"""The engine's closed-loop mode (EngineConfig.concurrency): N clients, each sending its next request when the
previous one finishes."""

import numpy as np
import pytest

from host.serving import Request, RequestTable, run, EngineConfig, LinearCostSystem


def _table(n=10, out=4):
    return RequestTable(id=np.arange(n), arrival_s=np.arange(n) * 100.0, prompt_tokens=np.full(n, 8),
                        output_tokens=np.full(n, out), adapter_id=np.zeros(n, np.int64))


def test_closed_loop_keeps_the_concurrency_and_releases_at_finishes():
    t = _table()
    out = run(t, LinearCostSystem(), EngineConfig(concurrency=3))
    assert out.summary["finished"] == 10
    tab = out.table
    # the first 3 arrive together at the first arrival time; every later arrival is some request's finish
    assert list(tab.arrival_s[:3]) == [0.0, 0.0, 0.0]
    finishes = set(np.round(tab.finish_s, 12).tolist())
    assert all(round(a, 12) in finishes for a in tab.arrival_s[3:])
    # never more than 3 requests in the system
    for a in tab.arrival_s:
        inside = np.count_nonzero((tab.arrival_s <= a) & (tab.finish_s > a))
        assert inside <= 3
    assert out.iterations["n_requests"].max() == 3
    # the caller's table is untouched
    assert list(t.arrival_s) == list(np.arange(10) * 100.0)


def test_open_loop_unchanged_and_bad_concurrency_rejected():
    a = run(_table(), LinearCostSystem())
    assert a.table.arrival_s[5] == 500.0 and a.iterations["n_requests"].max() == 1
    with pytest.raises(ValueError, match="concurrency"):
        EngineConfig(concurrency=0)
