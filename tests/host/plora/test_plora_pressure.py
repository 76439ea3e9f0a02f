"""The load-regime figures (host/plora/pressure.py) by hand, and the closed-loop / fixed-batch run modes."""

import numpy as np
import pytest

from conftest import SMALL
from host.plora.lora import adapter_bytes
from host.plora.pressure import serving_pressure
from host.serving import RequestTable


def _done_table():
    # three requests: two on adapter 0, one on adapter 1
    t = RequestTable(id=np.arange(3), arrival_s=np.array([0.0, 0.0, 1.0]), prompt_tokens=np.array([10, 10, 20]),
                     output_tokens=np.array([10, 10, 20]), adapter_id=np.array([0, 0, 1]))
    t.admitted_s = np.array([0.0, 2.0, 1.0])
    t.finish_s = np.array([4.0, 6.0, 3.0])
    return t


def test_pressure_by_hand():
    ranks = np.array([8, 16])
    a0, a1 = adapter_bytes(SMALL, 8), adapter_bytes(SMALL, 16)
    kvt = 100.0
    room = 1e6
    r = serving_pressure(_done_table(), SMALL, ranks, hbm_bytes=room + 5e6, weight_bytes=5e6, kv_bytes_per_token=kvt)
    assert r["adapters_touched"] == 2 and r["adapter_demand_gb"] == pytest.approx((a0 + a1) / 1e9)
    # serving set over [0, 6]: [0,1) r0; [1,2) r0 r2; [2,3) r0 r1 r2; [3,4) r0 r1; [4,6) r1
    kv0, kv2 = 20 * kvt, 40 * kvt
    d = [kv0 + a0, kv0 + a0 + kv2 + a1, 2 * kv0 + a0 + kv2 + a1, 2 * kv0 + a0, kv0 + a0]
    dt = [1, 1, 1, 1, 2]
    assert r["hbm_pressure"] == pytest.approx(np.dot(d, dt) / 6 / room)
    assert r["hbm_pressure_peak"] == pytest.approx(max(d) / room)
    # offered: r1 is in the system from its arrival at 0
    off = [2 * kv0 + a0, 2 * kv0 + a0 + kv2 + a1, 2 * kv0 + a0 + kv2 + a1, 2 * kv0 + a0, kv0 + a0]
    assert r["hbm_pressure_offered"] == pytest.approx(np.dot(off, dt) / 6 / room)


def test_run_modes_and_regime_keys():
    from host.plora.run import RunSpec, run_spec
    base = RunSpec(model="llama2-7b", workload="uniform", system="s-lora", n_requests=40, ndp="standin")
    fixed = run_spec(base.with_(fixed_batch=8)).summary
    assert fixed["max_batch"] == 8 and fixed["mean_batch"] > 6
    for k in ("adapters_touched", "adapter_demand_gb", "hbm_pressure", "hbm_pressure_peak", "hbm_pressure_offered",
              "evictions"):
        assert k in fixed
    closed = run_spec(base.with_(concurrency=4)).summary
    assert closed["max_batch"] <= 4
    with pytest.raises(ValueError, match="not both"):
        base.with_(concurrency=4, fixed_batch=8)
    with pytest.raises(ValueError, match="fixed_batch"):
        base.with_(fixed_batch=0)


def test_throughput_at_slo_by_hand():
    import pandas as pd
    from host.plora.figures import throughput_at_slo, sweep_specs, RATES, MATCHED_BATCHES
    df = pd.DataFrame({"system": ["a"] * 3 + ["b"] * 2, "rate_per_s": [1, 2, 4, 1, 2],
                       "tpot_ms_p99": [50, 90, 300, 150, 200], "throughput_tok_s": [100, 180, 250, 90, 120]})
    rows = {r["system"]: r for r in throughput_at_slo(df, 100.0)}
    assert rows["a"]["throughput_tok_s_at_slo"] == 180 and rows["a"]["rate_per_s_at_slo"] == 2
    assert rows["a"]["max_throughput_tok_s"] == 250
    assert np.isnan(rows["b"]["throughput_tok_s_at_slo"])          # no point meets the SLO
    rs = sweep_specs("rate_sweep")
    assert {s.rate_per_s for s in rs} == set(RATES)
    mb = sweep_specs("matched_batch")
    assert {s.fixed_batch for s in mb} == set(MATCHED_BATCHES) and all(s.n_requests >= 4 * s.fixed_batch for s in mb)
