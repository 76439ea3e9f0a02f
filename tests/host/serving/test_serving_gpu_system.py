"""The GPU-only reference system: HBM budget, fused runs equal to step-by-step, trace lanes, OOM errors."""

import json

import numpy as np
import pytest

from host.models import get_model
from host.serving import GPUSystem, run, Request, EngineConfig
from host.workloads import plora_workload


def test_kv_capacity_from_hbm():
    m = get_model("llama2-7b")
    s = GPUSystem(m, "h100", tp=1)
    assert s.kv_capacity_bytes() == pytest.approx(80e9 * 0.9 - m.weight_bytes(1))
    with pytest.raises(ValueError, match="leave no HBM for KV"):
        GPUSystem(get_model("gpt-175b"), "a100", tp=1)


def test_batch_limited_by_hbm():
    # 500 requests of 2,000 KV tokens each on Llama-2-13B: 0.82 MB/token -> ~1.6 GB each; ~45 GB free -> < 30
    m = get_model("llama2-13b")
    reqs = [Request(i, 0.0, 1000, 1001) for i in range(100)]
    out = run(reqs, GPUSystem(m, "h100", tp=1), EngineConfig(trace=False))
    cap = GPUSystem(m, "h100", tp=1).kv_capacity_bytes()
    per_req = np.ceil(2000 / 16) * 16 * m.kv_bytes_per_token(1)
    assert out.summary["max_batch"] == int(cap // per_req)
    assert out.summary["finished"] == 100


@pytest.mark.parametrize("policy", ["reserve", "paged"])
def test_fused_equals_stepwise(policy):
    w = plora_workload("uniform", n_requests=120, rate_per_s=40.0, seed=2)
    m = get_model("llama3-8b")
    a = run(w, GPUSystem(m, "a100", tp=1, kv_policy=policy, hbm_gb=20.0))
    b = run(w, GPUSystem(m, "a100", tp=1, kv_policy=policy, hbm_gb=20.0, fuse=False))
    np.testing.assert_allclose(a.table.finish_s, b.table.finish_s, rtol=1e-9)
    assert a.summary["tbt_ms_p99"] == pytest.approx(b.summary["tbt_ms_p99"], rel=1e-9)
    assert a.summary["engine_steps"] < b.summary["engine_steps"]


def test_run_directory_with_nvlink_lane(tmp_path):
    w = plora_workload("uniform", n_requests=30, rate_per_s=100.0, seed=1)
    out = run(w, GPUSystem(get_model("llama2-13b"), "a100", tp=2))
    d = out.write(tmp_path / "r", extra_config={"workload": w.describe()})
    trace = json.loads((d / "trace.json").read_text())
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert lanes == {"batch", "GPU 0", "NVLink"}
    it = out.iterations
    assert np.all(it["floor_s"] < it["duration_s"]) and np.all(it["all_reduce"] > 0)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["system"]["tp"] == 2 and cfg["workload"]["params"]["seed"] == 1
