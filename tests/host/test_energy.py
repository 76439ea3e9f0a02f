"""host/energy.py: the GPU utilization model and the ledger by hand, a PLoRA run's GPU term from its timeline,
an accounting that drops the GPU term caught, unknown GPUs and links, bad input (issue 33 item 3)."""

import math

import numpy as np
import pytest

from host.energy import (EnergyLedger, GPU_POWER, GPUPower, gpu_energy_j, link_pj_per_bit, DDR4_CHANNEL_PJ_PER_BIT,
                         ENERGY_KEYS)


def test_gpu_utilization_model_by_hand():
    # 2 A100 boards over 10 s, busy 4 s each: 2 x (50 W x 10 s + (400 - 50) W x 4 s) = 3,800 J
    assert gpu_energy_j("a100", 2, 10.0, 4.0) == pytest.approx(3800.0)
    # busy beyond the window is clipped (a board never draws more than its maximum)
    assert gpu_energy_j("h100", 1, 1.0, 5.0) == pytest.approx(700.0)
    assert GPU_POWER["h100"].tdp_w == 700.0 and GPU_POWER["a100"].tdp_w == 400.0


def test_ledger_by_hand_and_per_token():
    led = EnergyLedger()
    led.add("gpu", 3.0)
    led.add("links", 0.5)
    led.add("dram", 1.5)
    s = led.as_summary(2000)
    assert set(s["energy_j"]) == set(ENERGY_KEYS)
    assert s["energy_j"]["total"] == pytest.approx(5.0)
    assert s["energy_per_token_mj"] == pytest.approx(5.0 / 2000 * 1e3)
    assert math.isnan(led.as_summary(0)["energy_per_token_mj"])


def test_ddr4_channel_figure_by_hand():
    # 0.5 x 1.2 V^2 / (34 + 50) ohm x 312.5 ps
    assert DDR4_CHANNEL_PJ_PER_BIT == pytest.approx(2.678571, rel=1e-6)
    assert link_pj_per_bit("pcie4-x16") == 5.5 and link_pj_per_bit("cxl3.1*") == 5.5
    assert link_pj_per_bit("nvlink-c2c") == 1.3


def _plora_run(monkeypatch=None):
    from host.plora.run import RunSpec, run_spec
    from host.serving import EngineConfig
    import host.plora.system as S
    box = {}
    orig = S.PLoRASystem.energy

    def spy(self):
        box["span"], box["busy"] = list(self.span_s), dict(self.lane_busy)
        return orig(self)
    S.PLoRASystem.energy = spy
    try:
        out = run_spec(RunSpec(workload="skewed", n_requests=30, devices=2, seed=3),
                       engine_config=EngineConfig(trace=False, record_iterations=False))
    finally:
        S.PLoRASystem.energy = orig
    return out.summary, box


def gpu_term_is_the_timelines(summary, box) -> bool:
    """The run's GPU term equals the utilization model on its window and the timeline's busy seconds."""
    T = box["span"][1] - box["span"][0]
    want = gpu_energy_j("h100", 1, T, box["busy"]["GPU 0"])
    got = summary["energy_j"]["gpu"]
    return got is not None and abs(got - want) <= 1e-9 * want


def test_plora_gpu_term_from_the_timeline_and_a_dropped_term_is_caught(monkeypatch):
    s, box = _plora_run()
    assert box["span"][0] == 0.0 and box["span"][1] == pytest.approx(s["makespan_s"] + 0.0, rel=1e-9, abs=1e-9) \
        or box["span"][1] - box["span"][0] <= s["makespan_s"] * (1 + 1e-9)
    assert gpu_term_is_the_timelines(s, box)
    assert 0 < box["busy"]["GPU 0"] <= box["span"][1] - box["span"][0] + 1e-9
    # the mutant: an accounting that drops the GPU term
    monkeypatch.setattr(EnergyLedger, "add_gpu", lambda self, *a, **k: None)
    s2, box2 = _plora_run()
    assert not gpu_term_is_the_timelines(s2, box2)


def test_unknown_gpu_or_link_is_unknown_not_zero():
    led = EnergyLedger()
    led.add("dram", 1.0)
    led.add_gpu("b200", 1, 1.0, 0.5)
    led.add_link("infiniband", 8e9)
    s = led.as_summary(10)
    assert math.isnan(s["energy_j"]["gpu"]) and math.isnan(s["energy_j"]["links"])
    assert math.isnan(s["energy_j"]["total"])
    assert "b200" in s["energy_unknown"]["gpu"] and "a100" in s["energy_unknown"]["gpu"]
    assert "infiniband" in s["energy_unknown"]["links"]


def test_bad_input_names_the_range():
    with pytest.raises(ValueError, match="allowed: \\['a100', 'h100'\\]"):
        gpu_energy_j("v100", 1, 1.0, 1.0)
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        gpu_energy_j("a100", 1, -1.0, 0.0)
    with pytest.raises(ValueError, match="n_gpus must be an int >= 1"):
        gpu_energy_j("a100", 0, 1.0, 0.0)
    with pytest.raises(ValueError, match="0 < idle_w < tdp_w <= 5000"):
        GPUPower("x", tdp_w=100.0, idle_w=200.0)
    with pytest.raises(ValueError, match="allowed"):
        EnergyLedger().add("cpu", 1.0)
    with pytest.raises(ValueError, match="finite and >= 0"):
        EnergyLedger().add("gpu", -1.0)
    with pytest.raises(ValueError, match="allowed prefixes"):
        link_pj_per_bit("ethernet")
    from host.energy import pim_head_increment_pj
    with pytest.raises(ValueError, match="head_dim 128"):
        pim_head_increment_pj(64, 1, 10)
    assert np.isfinite(pim_head_increment_pj(128, 1, 1024)[0])


@pytest.mark.parametrize("system", ["s-lora-2gpu", "cpu-lora-offload", "pure-cxl"])
def test_every_plora_system_reports_energy(system):
    """The baselines (S-LoRA, CPU-LoRA-Offload) and the variants without NDP carry the keys too; S-LoRA's two
    boards draw at least twice one board's idle power over the run."""
    from host.plora.run import RunSpec, run_spec
    from host.serving import EngineConfig
    s = run_spec(RunSpec(system=system, workload="skewed", n_requests=20, seed=3),
                 engine_config=EngineConfig(trace=False, record_iterations=False)).summary
    e = s["energy_j"]
    assert set(e) == set(ENERGY_KEYS) and all(v >= 0 for v in e.values())
    assert e["total"] == pytest.approx(sum(v for k, v in e.items() if k != "total"))
    assert s["energy_per_token_mj"] == pytest.approx(e["total"] / s["output_tokens"] * 1e3)
    if system == "s-lora-2gpu":
        assert e["gpu"] >= 2 * GPU_POWER["h100"].idle_w * s["makespan_s"] * (1 - 1e-9)
    if system == "pure-cxl":
        assert e["ndp"] == 0.0 and e["dram"] > 0
