"""The systems of the L3 study: each one's batch limit follows from its KV memory; OOM detection; L3 with and
without its optimisations on a small run; the run directory."""

import json

import numpy as np
import pytest

from host.l3.config import l3_setup
from host.l3.run import RUN_KEYS, oom_reason, run_l3, split_replicas, FAST_ENGINE
from host.l3.systems import BLOCK_TOKENS, hbm_kv_capacity_bytes
from host.workloads import Workload


def _uniform(n, prompt, output):
    return Workload("uniform-test", np.zeros(n), np.full(n, prompt), np.full(n, output), np.zeros(n, np.int64))


def _max_concurrency(table, dp):
    """Most requests admitted and not yet finished at once, per replica (round-robin split by arrival)."""
    out = []
    for sub in split_replicas(table, dp):
        idx = np.searchsorted(table.id, sub.id)
        a, f = table.admitted_s[idx], table.finish_s[idx]
        ev = sorted([(t, 1) for t in a] + [(t, -1) for t in f], key=lambda e: (e[0], e[1]))
        cur = best = 0
        for _, d in ev:
            cur += d
            best = max(best, cur)
        out.append(best)
    return out


def _need(prompt, output):
    return -(-(prompt + output - 1) // BLOCK_TOKENS) * BLOCK_TOKENS


@pytest.mark.parametrize("system, model, host_gb", [("gpu-only", "gpt-89b", None), ("hbm-pim", "gpt-89b", None),
                                                    ("l3", "gpt-175b", 96), ("r-pim", "gpt-175b", 96),
                                                    ("l3-no-sched", "gpt-175b", 96)])
def test_batch_limit_from_memory(system, model, host_gb):
    P, O = 1000, 12
    s = l3_setup(model, host_memory_gb=host_gb)
    cap = hbm_kv_capacity_bytes(s) if system in ("gpu-only", "hbm-pim") else s.host_capacity_bytes
    limit = int(cap // s.kv_bytes_per_token) // _need(P, O)
    n = s.dp * (limit + 10)                           # more requests than fit: the memory must bind
    # the token floor lets the scheduler admit prefills fast enough for memory, not the PIM phase, to bind
    kw = {"profile_batches": 64, "min_gpu_tokens": "knee"} if system == "l3" else {}
    r = run_l3(model, "custom", system, host_memory_gb=host_gb, workload=_uniform(n, P, O), engine=FAST_ENGINE,
               system_kw=kw)
    assert r.summary["finished"] == n and r.summary["preemptions"] == 0
    assert _max_concurrency(r.output.table, s.dp) == [limit] * s.dp
    for sysobj in r.systems:
        assert sysobj.kv.peak_tokens <= sysobj.kv.capacity_tokens


def test_cpu_offload_two_pools():
    P, O, host_gb = 1000, 12, 64
    s = l3_setup("gpt-175b", host_memory_gb=host_gb)
    need = _need(P, O)
    g = int(hbm_kv_capacity_bytes(s) // s.kv_bytes_per_token) // need
    h = int(s.host_capacity_bytes // s.kv_bytes_per_token) // need
    r = run_l3("gpt-175b", "custom", "cpu-offload", host_memory_gb=host_gb, workload=_uniform(g + h + 8, P, O),
               engine=FAST_ENGINE)
    assert _max_concurrency(r.output.table, 1) == [g + h]
    assert r.summary["finished"] == g + h + 8
    assert r.summary["host_kv_peak_tokens"] <= r.summary["host_kv_capacity_tokens"]


def test_request_that_never_fits_is_rejected_and_counted():
    # two requests longer than the replica's HBM holds among six that fit: the long ones are rejected on their own
    # and counted, the others finish (the old rule failed the whole run with oom_reason)
    s = l3_setup("opt-66b")
    hbm_tokens = int(hbm_kv_capacity_bytes(s) // s.kv_bytes_per_token)
    prompt = np.array([hbm_tokens + 100, 500, 500, 500, hbm_tokens + 100, 500, 500, 500])
    w = Workload("reject-test", np.zeros(8), prompt, np.full(8, 10), np.zeros(8, np.int64))
    assert oom_reason("gpu-only", s, w.to_table()) is not None
    assert oom_reason("l3", s, w.to_table()) is None
    r = run_l3("opt-66b", "custom", "gpu-only", workload=w, engine=FAST_ENGINE)
    assert not r.summary["oom"] and r.output is not None
    assert r.summary["rejected"] == 2 and r.summary["rejected_frac"] == 0.25 and r.summary["requests_offered"] == 8
    assert r.summary["finished"] == 6 and r.summary["output_tokens"] == 60
    assert np.isfinite(r.summary["throughput_tok_s"]) and "HBM" in r.summary["rejected_reason"]
    assert sorted(r.config["rejected_ids"]) == [0, 4]
    r3 = run_l3("opt-66b", "custom", "l3", workload=w, engine=FAST_ENGINE, system_kw={"profile_batches": 32})
    assert r3.summary["rejected"] == 0 and r3.summary["finished"] == 8
    # every request too long: nothing to simulate, the run reports OOM
    w2 = _uniform(4, hbm_tokens + 100, 10)
    r = run_l3("opt-66b", "custom", "hbm-pim-serial", workload=w2)
    assert r.summary["oom"] and r.output is None and r.summary["rejected_frac"] == 1.0
    assert not np.isfinite(r.summary["throughput_tok_s"]) and "HBM" in r.summary["oom_reason"]


def test_hbm_capacity_and_headroom_option():
    from host.l3.systems import gpu_workspace_bytes
    s = l3_setup("opt-66b")
    m = s.model
    # per GPU: the HBM less the weight shard and the workspace of one 16K-token pass (OPT FFN: d_ff / TP wide)
    ws = 16384 * 2 * (2 * m.d_model + m.d_ff / 2) + 256 * m.vocab * 4
    assert gpu_workspace_bytes(s) == pytest.approx(ws)
    assert hbm_kv_capacity_bytes(s) == pytest.approx(2 * (80e9 - m.weight_bytes(2) - ws))
    assert hbm_kv_capacity_bytes(s, 0.9) == pytest.approx(hbm_kv_capacity_bytes(s) - 2 * 8e9)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        hbm_kv_capacity_bytes(s, 1.5)
    w = _uniform(4, 1000, 10)
    a = run_l3("opt-66b", "custom", "gpu-only", workload=w, engine=FAST_ENGINE)
    b = run_l3("opt-66b", "custom", "gpu-only", workload=w, engine=FAST_ENGINE,
               system_kw={"gpu_memory_utilization": 0.9})
    assert a.summary["gpu_memory_utilization"] == 1.0 and b.summary["gpu_memory_utilization"] == 0.9
    assert a.summary["kv_capacity_tokens"] > b.summary["kv_capacity_tokens"]
    assert b.summary["hbm_kv_capacity_gb"] == pytest.approx(hbm_kv_capacity_bytes(s, 0.9) / 1e9)


def test_l3_variants_and_summary():
    # long decodes: the DIMM-PIM's share grows with the context, the regime L3 is built for
    w = _uniform(48, 100, 4000)
    res = {}
    for sysname in ("l3", "l3-no-comm", "l3-no-sched", "l3-base"):
        kw = {"profile_batches": 96} if sysname in ("l3", "l3-no-comm") else {}
        r = run_l3("gpt-175b", "custom", sysname, workload=w, engine=FAST_ENGINE, system_kw=kw)
        s = r.summary
        for k in RUN_KEYS:
            assert k in s and np.isfinite(s[k]), (sysname, k)
        assert 0 <= s["gpu_bubble_frac"] < 1 and 0 <= s["pim_bubble_frac"] < 1
        assert s["finished"] == 48 and s["output_tokens"] == 48 * 4000
        res[sysname] = s
    thr = {k: v["throughput_tok_s"] for k, v in res.items()}
    assert thr["l3"] > max(thr["l3-no-comm"], thr["l3-no-sched"]) and min(thr["l3-no-comm"], thr["l3-no-sched"]) \
        > thr["l3-base"], thr
    assert res["l3"]["pred_re_gpu_online"] < 0.5 and "pred_re_pim_online" in res["l3"]
    assert res["l3"]["min_gpu_tokens"] == 0     # the token floor is an option, off by default


def test_replicas_and_reproducibility():
    w = _uniform(12, 200, 30)
    kw = {"profile_batches": 48}
    a = run_l3("opt-66b", "custom", "l3", workload=w, engine=FAST_ENGINE, system_kw=kw)
    b = run_l3("opt-66b", "custom", "l3", workload=w, engine=FAST_ENGINE, system_kw=kw)
    assert a.summary["replicas"] == 4 and len(a.systems) == 4
    assert a.summary["throughput_tok_s"] == b.summary["throughput_tok_s"]
    np.testing.assert_array_equal(a.output.table.finish_s, b.output.table.finish_s)
    assert a.summary["output_tokens"] == 12 * 30
    # the node's energy is every replica's: 4 replicas of TP 2 -> 8 GPU boards at least idle over the window
    from host.energy import GPU_POWER
    T = max(x.ework["span"][1] for x in a.systems) - min(x.ework["span"][0] for x in a.systems)
    assert a.summary["energy_j"]["gpu"] >= 8 * GPU_POWER["a100"].idle_w * T * (1 - 1e-9)
    assert a.summary["energy_j"] == b.summary["energy_j"]


def test_run_directory(tmp_path):
    r = run_l3("gpt-89b", "dolphin", "l3", n_requests=12, system_kw={"profile_batches": 48})
    d = r.output.write(tmp_path / "run")
    for f in ("config.json", "requests.csv", "iterations.csv", "summary.json", "trace.json"):
        assert (d / f).exists()
    s = json.loads((d / "summary.json").read_text())
    for k in RUN_KEYS:
        assert k in s
    # energy (issue 33 item 3): every term, the DIMM-PIM's heads and links charged, the total their sum
    e = s["energy_j"]
    assert set(e) == {"gpu", "links", "ndp", "pim", "dram", "total"}
    assert e["gpu"] > 0 and e["pim"] > 0 and e["links"] > 0 and e["dram"] > 0 and e["ndp"] == 0
    assert e["total"] == pytest.approx(sum(v for k, v in e.items() if k != "total"))
    assert s["energy_per_token_mj"] == pytest.approx(e["total"] / s["output_tokens"] * 1e3)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model"] == "gpt-89b" and cfg["setup"]["tp"] == 4 and cfg["setup"]["dp"] == 2
    tr = json.loads((d / "trace.json").read_text())
    lanes = {e["args"]["name"] for e in tr["traceEvents"] if e.get("name") == "thread_name"}
    assert {f"GPU {g}" for g in range(8)} <= lanes
    assert any(l.startswith("PCIe") for l in lanes)
    assert {f"rankset {k} (replica {r})" for k in range(4) for r in range(2)} <= lanes


def test_predictors_on_profiled_batches_of_a_run():
    from host.l3.predictors import holdout_error
    # small host memory: requests come and go, so many iterations are scheduled
    r = run_l3("gpt-89b", "dolphin", "l3", n_requests=80, host_memory_gb=128, engine=FAST_ENGINE,
               system_kw={"profile_batches": 96})
    pb = r.systems[0].profiled_batches()
    assert len(pb) >= 40                              # every scheduled iteration profiles its sub-batches
    res = holdout_error(pb, seed=0)
    assert res["n_test"] == len(pb) - round(0.8 * len(pb))
    assert res["re_gpu"] < 0.1 and res["re_pim"] < 0.5


def test_hbm_pim_defaults_to_two_decode_sub_batches():
    # few short decodes: the FC dominates, so one serial batch (weights read once) would be faster; L3 6.1's
    # HBM-PIM still decodes in two sub-batches (the old default picked the serial batch here)
    from host.l3.systems import HBMPIMSystem, make_system
    s = l3_setup("gpt-175b")
    L = np.array([300, 200, 100, 50])
    sysd = make_system("hbm-pim", s)
    assert isinstance(sysd, HBMPIMSystem) and sysd.decode_mode == "sub-batches" and sysd.name == "hbm-pim"
    a, b = [0, 3], [1, 2]                               # balanced_split([300, 200, 100, 50])
    f = lambda n: float(sysd.gpu.fc(n, n))
    split = max(f(2), sysd.pim_time(L[b])) + max(f(2), sysd.pim_time(L[a]))
    serial = f(4) + sysd.pim_time(L)
    assert serial < split                               # the case where the old rule fell back to one batch
    assert sysd._decode_iteration(L)[0] == pytest.approx(split)
    ser = make_system("hbm-pim-serial", s)
    assert ser.name == "hbm-pim-serial" and ser._decode_iteration(L)[0] == pytest.approx(serial)
    assert make_system("hbm-pim-best", s)._decode_iteration(L)[0] == pytest.approx(serial)
    # the same choice in fused decode runs: the default and the serial variant differ on a whole run
    w = _uniform(4, 100, 200)
    thr = {n: run_l3("gpt-175b", "custom", n, workload=w, engine=FAST_ENGINE).summary["throughput_tok_s"]
           for n in ("hbm-pim", "hbm-pim-serial", "hbm-pim-best")}
    assert thr["hbm-pim-serial"] > thr["hbm-pim"] and thr["hbm-pim-best"] == pytest.approx(thr["hbm-pim-serial"])


def test_l3_predictors_cold_start_option():
    # profile_batches = 0: no start-up profile, the predictors learn from the run alone (stated in the summary)
    n = 160                                             # staggered arrivals: many priced (learning) iterations
    w = Workload("cold-test", np.arange(n) * 0.05, np.full(n, 300), np.full(n, 200), np.zeros(n, np.int64))
    r = run_l3("gpt-175b", "custom", "l3", workload=w, engine=FAST_ENGINE, system_kw={"profile_batches": 0})
    s = r.summary
    assert s["finished"] == n and s["predictor_seed_batches"] == 0 and s["min_gpu_tokens"] == 0
    assert s["pred_fits"] > 0 and np.isfinite(s["throughput_tok_s"])
    seeded = run_l3("gpt-175b", "custom", "l3", workload=w, engine=FAST_ENGINE, system_kw={"profile_batches": 32})
    assert seeded.summary["predictor_seed_batches"] == 32
