"""The LLaMA-scale hybrid (issue 34 item 2): the placement rules on constructed cases, adapters on CXL by
Algorithm 1, small runs that serve every request, failure that says why, and the check that the e2e hybrid of
``make demo`` and the LLaMA-scale hybrid call the same decision code (host.hybrid.decisions)."""

import json

import numpy as np
import pytest

from host.hybrid import decisions as hd
from host.hybrid.decisions import PIM, NDP, SideLoad, place_kv
from host.hybrid.run import HybridSpec, run_spec
from host.hybrid.system import HybridScaleSystem
from host.models import get_model
from host.serving import Request, EngineConfig, run as engine_run
from host.serving.request import RequestTable, RUNNING, WAITING

MODEL = get_model("llama2-7b")


# ---- the rule itself ---------------------------------------------------------------------------------------------
def test_place_kv_by_context_length():
    assert place_kv(100) == NDP
    assert place_kv(1023) == NDP
    assert place_kv(1024) == PIM
    assert place_kv(50_000) == PIM
    # outside the borderline band no load moves a request
    busy_cxl = SideLoad(cxl_load_s=1.0, pim_load_s=0.0, cxl_cost_s=0.1, pim_cost_s=0.1)
    busy_pim = SideLoad(cxl_load_s=0.0, pim_load_s=1.0, cxl_cost_s=0.1, pim_cost_s=0.1)
    assert place_kv(100, load=busy_cxl) == NDP
    assert place_kv(5000, load=busy_pim) == PIM


def test_place_kv_load_moves_a_borderline_request():
    busy_cxl = SideLoad(cxl_load_s=1.0, pim_load_s=0.0, cxl_cost_s=0.1, pim_cost_s=0.1)
    busy_pim = SideLoad(cxl_load_s=0.0, pim_load_s=1.0, cxl_cost_s=0.1, pim_cost_s=0.1)
    even = SideLoad(cxl_load_s=1.0, pim_load_s=1.0, cxl_cost_s=0.1, pim_cost_s=0.1)
    assert place_kv(900, load=busy_cxl) == PIM          # short but borderline: the idle PIM takes it
    assert place_kv(900, load=busy_pim) == NDP
    assert place_kv(1500, load=busy_pim) == NDP         # long but borderline: the idle CXL devices take it
    assert place_kv(1500, load=busy_cxl) == PIM
    assert place_kv(900, load=even) == NDP              # no gain: the context decides
    assert place_kv(1500, load=even) == PIM
    assert place_kv(900, load=busy_cxl, borderline=1.0) == NDP     # the load rule off
    assert place_kv(1500, load=busy_pim, borderline=1.0) == PIM


def test_place_kv_capacity():
    assert place_kv(5000, load=SideLoad(pim_fits=False)) == NDP
    assert place_kv(100, load=SideLoad(cxl_fits=False)) == PIM
    assert place_kv(100, load=SideLoad(cxl_fits=False, pim_fits=False)) is None
    # a side that cannot hold it is never chosen for load
    assert place_kv(900, load=SideLoad(cxl_load_s=1.0, cxl_cost_s=0.1, pim_fits=False)) == NDP


@pytest.mark.parametrize("bad", [dict(pim_min_context=0), dict(borderline=0.5), dict(borderline=float("nan"))])
def test_bad_placement_arguments_name_the_range(bad):
    with pytest.raises(ValueError, match="must be"):
        HybridScaleSystem(MODEL, profile_batches=0, **bad)


# ---- the system on constructed cases ---------------------------------------------------------------------------
def _bound(prompts, outputs, adapters=None, **kw):
    n = len(prompts)
    reqs = [Request(i, 0.0, int(p), int(o), int(adapters[i] if adapters else i % 4), {"rank": 16})
            for i, (p, o) in enumerate(zip(prompts, outputs))]
    t = RequestTable.from_requests(reqs)
    t.state[:] = WAITING
    s = HybridScaleSystem(MODEL, profile_batches=0, **kw)
    s.bind(t)
    return s, t


def _admit(s, t, i):
    assert s.can_admit(i, 0.0)
    t.state[i] = RUNNING
    s.on_admit(np.array([i]), 0.0)


def test_short_request_on_cxl_token_interleaved():
    s, t = _bound([200], [100], borderline=1.0)
    _admit(s, t, 0)
    assert s.residence[0] == NDP
    assert s.mem.kv.held_tokens[0] == 299 and s.pkv.held_tokens[0] == 0       # its KV in the CXL pool only
    assert s.mem.kv_on_devices[0] and s.place.cls[0] == -1
    # token-interleaved over the four devices: PLoRA's device shares, each within one token of L / n_dev
    cnt = s.cost.device_tokens(np.array([300]), np.array([0]))[0]
    assert len(cnt) == s.n_dev == 4 and cnt.max() - cnt.min() <= 1 and cnt.sum() == 300


def test_long_request_on_dimm_pim():
    s, t = _bound([6000], [2000])
    _admit(s, t, 0)
    assert s.residence[0] == PIM
    assert s.mem.kv.held_tokens[0] == 0 and s.pkv.held_tokens[0] >= 7999      # host memory, not the pool
    assert not s.mem.kv_on_devices[0] and s.mem.dup[0] == 0                   # no prefix duplicated in HBM
    assert 0 <= s.place.cls[0] < s.R


def test_device_load_moves_a_borderline_request():
    """A borderline request (final 1,500 tokens: prefers the DIMM-PIM) goes to the CXL devices once the ranksets
    carry many long requests and the devices nothing; on an idle system it stays on the DIMM-PIM."""
    s, t = _bound([1200], [300])
    _admit(s, t, 0)
    assert s.residence[0] == PIM and s.why[0] == "context"
    s, t = _bound([60000] * 24 + [1200], [2000] * 24 + [300])
    for i in range(24):
        _admit(s, t, i)
    assert (s.residence[:24] == PIM).all()
    _admit(s, t, 24)
    assert s.residence[24] == NDP and s.why[24] == "load"
    assert s.summary()["placement_reason"]["cxl_load"] == 1


def test_the_loads_are_the_last_iterations_sides():
    """After an iteration the rule weighs what it executed on each side: a borderline short request (final 800
    tokens) goes to the ranksets when the GPU + CXL side was the busy one, stays on CXL when the PIM side was."""
    s, t = _bound([700], [100])
    s._last_side = (0.020, 0.001)            # (GPU + CXL, PIM) seconds of the last iteration
    _admit(s, t, 0)
    assert s.residence[0] == PIM and s.why[0] == "load"
    s, t = _bound([700], [100])
    s._last_side = (0.001, 0.020)
    _admit(s, t, 0)
    assert s.residence[0] == NDP and s.why[0] == "context"


def test_capacity_moves_a_long_request_to_cxl():
    from host.l3.config import L3_HOST_MEMORY
    from dataclasses import replace
    s, t = _bound([3000, 3000], [1000, 1000], host=replace(L3_HOST_MEMORY, capacity_gib=3.0))
    _admit(s, t, 0)
    _admit(s, t, 1)                       # 4,000 tokens x 0.5 MB: the 3 GiB host memory holds one
    assert s.residence.tolist() == [PIM, NDP] and s.why[1] == "capacity"


def test_adapters_on_cxl_by_algorithm_1(monkeypatch):
    """Every request's adapter -- PIM-resident or not -- is managed by PLoRA's Algorithm 1
    (host.plora.manager.select through PLoRASystem.decide) and stored on its CXL device."""
    import host.plora.system as ps
    seen = []
    real = ps.select

    def spy(st, cost, a, tokens, **kw):
        seen.append(a)
        return real(st, cost, a, tokens, **kw)
    monkeypatch.setattr(ps, "select", spy)
    s, t = _bound([200, 6000], [100, 2000], adapters=[1, 2])
    _admit(s, t, 0)
    _admit(s, t, 1)
    assert s.residence.tolist() == [NDP, PIM]
    assert seen == [1, 2]
    for a in (1, 2):
        assert s.mem.state.adapters[a].strategy is not None
        assert s.cost.device_of(a) == a % s.n_dev
    assert s.mem.store_bytes > 0          # the adapters' bytes are in the CXL pool


# ---- runs --------------------------------------------------------------------------------------------------------
def _mix_trace(path, n=12, seed=0):
    """Many adapters with a few long-context requests (issue 34 item 1's mix, small)."""
    rng = np.random.default_rng(seed)
    rows = ["arrival_s,prompt_tokens,output_tokens,adapter_id,rank"]
    for i in range(n):
        long = i % 6 == 3
        p = int(rng.integers(2000, 3000)) if long else int(rng.integers(8, 256))
        o = int(rng.integers(16, 48))
        a = int(rng.integers(0, 100))
        rows.append(f"{i * 0.01!r},{p},{o},{a},{(8, 16, 32, 64, 128)[a % 5]}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize("workload", ["skewed", "skewed-long", "longbench", "mix"])
def test_small_run_serves_every_request(workload, tmp_path):
    kw = dict(n_requests=6, profile_batches=16, seed=1)
    if workload == "mix":
        spec = HybridSpec(workload="file", trace_file=_mix_trace(tmp_path / "mix.csv"), rate_per_s=None, **kw)
    else:
        spec = HybridSpec(workload=workload, **kw)
    out = run_spec(spec, out_dir=tmp_path / "run")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["finished"] == s["requests"] == 6 and s["rejected_frac"] == 0.0
    for k in ("throughput_tok_s", "tbt_ms_mean", "tpot_ms_mean", "ttft_s_mean", "mean_batch", "gpu_mem_gb",
              "link_bytes", "cost_model_err", "residence"):
        assert k in s, k
    assert sum(s["residence"].values()) == 6
    if workload == "skewed-long" or workload == "longbench":
        assert s["residence"]["pim"] > 0
    if workload == "mix":
        assert s["residence"]["pim"] >= 1 and s["residence"]["cxl"] >= 1
    # energy (issue 33 item 3): every part, the total their sum, the DIMM-PIM charged iff it held decodes' KV
    e = s["energy_j"]
    parts = ("gpu", "links", "ndp", "pim", "dram")
    assert set(e) == {*parts, "total"} and e["gpu"] > 0 and e["dram"] > 0 and e["links"] > 0
    assert e["total"] == pytest.approx(sum(e[k] for k in parts))
    assert (e["pim"] > 0) == (s["residence"]["pim"] > 0)
    assert s["energy_per_token_mj"] == pytest.approx(e["total"] / s["output_tokens"] * 1e3)
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["command"] == "ndpim hybrid run" and cfg["system"]["pim_min_context"] == 1024
    it = out.iterations
    # the executed timeline, never the estimate: the durations are the timeline's, the estimate recorded beside
    assert np.all(np.asarray(it["duration_s"]) > 0) and "estimate_s" in it


def test_the_timeline_has_the_dimm_pim_lanes(tmp_path):
    out = run_spec(HybridSpec(workload="skewed-long", n_requests=3, profile_batches=8), out_dir=tmp_path / "r")
    lanes = {s.lane for _, s in out.spans}
    assert {"GPU 0", "link out", "link in", "device 0", "rankset 0", "PCIe"} <= lanes


def test_a_request_that_fits_nowhere_fails_saying_why():
    from host.l3.config import L3_HOST_MEMORY
    from dataclasses import replace
    reqs = [Request(0, 0.0, 100, 10, 0, {"rank": 8}), Request(1, 0.0, 3_000_000, 10, 1, {"rank": 8})]
    s = HybridScaleSystem(MODEL, profile_batches=0, n_dev=1, host=replace(L3_HOST_MEMORY, capacity_gib=64.0))
    with pytest.raises(RuntimeError, match="fits neither the CXL pool"):
        engine_run(reqs, s, EngineConfig(trace=False))


def test_cli_run_and_bad_input(tmp_path, capsys):
    from host.cli import main
    with pytest.raises(SystemExit) as e:
        main(["hybrid", "run", "--workload", "skewed", "--pim-min-context", "0", "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "1..1099511627776" in capsys.readouterr().err
    rc = main(["hybrid", "run", "--workload", "skewed", "--requests", "3", "--out", str(tmp_path / "r")])
    assert rc == 0 and (tmp_path / "r" / "summary.json").exists()
    assert "KV residence" in capsys.readouterr().out


# ---- one decision code ----------------------------------------------------------------------------------------
def test_e2e_and_llama_scale_hybrids_call_the_same_decision_functions(monkeypatch, tmp_path):
    """Both systems call host.hybrid.decisions' place_kv, reselect_serving and form_sub_batches (counted through
    the module), and a changed rule changes what both do."""
    from host.e2e.run import E2EConfig, run_e2e
    calls = {}
    for name in ("place_kv", "reselect_serving", "form_sub_batches", "sched_classes"):
        real = getattr(hd, name)

        def spy(*a, _real=real, _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*a, **k)
        monkeypatch.setattr(hd, name, spy)
    cfg = E2EConfig(model="micro", requests=3, long_requests=1, tokens=3, long_context=48, short_prompt=(16, 32),
                    pim_bank_groups=1, budget_kb=24, seed=0)
    e2e = run_e2e(cfg, "perf")
    got_e2e, calls = dict(calls), {}
    run_spec(HybridSpec(workload="skewed-long", n_requests=3, profile_batches=8))
    got_scale = dict(calls)
    for name in ("place_kv", "reselect_serving", "form_sub_batches", "sched_classes"):
        assert got_e2e.get(name, 0) > 0 and got_scale.get(name, 0) > 0, (name, got_e2e, got_scale)
    assert sorted(e2e.system.summary()["residence"].values()) == ["ndp", "ndp", "pim"]

    # a different rule (everything on the CXL devices) is what both systems then do
    monkeypatch.setattr(hd, "place_kv", lambda *a, **k: NDP)
    e2e = run_e2e(cfg, "perf")
    assert set(e2e.system.summary()["residence"].values()) == {"ndp"}
    out = run_spec(HybridSpec(workload="skewed-long", n_requests=3, profile_batches=8))
    assert out.summary["residence"] == {"pim": 0, "cxl": 3}


def test_hybrid_energy_mutant_without_the_gpu_is_caught():
    """A ledger that drops the GPU term (the largest) gives a different total: the test above would see it."""
    spec = HybridSpec(workload="skewed", n_requests=4, profile_batches=8, seed=2)
    from host.hybrid.run import build_system, build_workload
    from host.serving import Engine
    sysobj = build_system(spec)
    Engine(sysobj, EngineConfig(trace=False)).run(build_workload(spec))
    e = sysobj.energy()["energy_j"]
    import host.energy as H
    orig = H.EnergyLedger.add_gpu
    try:
        H.EnergyLedger.add_gpu = lambda self, *a, **k: None
        e2 = sysobj.energy()["energy_j"]
    finally:
        H.EnergyLedger.add_gpu = orig
    assert e2["gpu"] == 0 and e2["total"] < e["total"] - 0.5 * e["gpu"]
