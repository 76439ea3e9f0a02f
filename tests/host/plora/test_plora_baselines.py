"""S-LoRA and CPU-LoRA-Offload executed on their timeline (host/plora/staged_timeline.py): constructed cases, each
hand-computed item by item, beside what each system's estimate (its formula) says."""

import numpy as np
import pytest

from conftest import FakeGPUModel, tiny_model, test_gpu, test_link
from host.serving import Request, run, EngineConfig
from host.plora.baselines import SLoRASystem, CPULoRAOffloadSystem, SLORA_LORA_BW_EFFICIENCY
from host.plora.config import KERNEL_STOP_S
from host.plora.staged_timeline import StagedTimeline, StagedWork

US = 1e-6
RANK8 = {"rank": 8}


def host_kw(**kw):
    return dict(gpu=test_gpu(hbm_gb=1.0), gpu_model=FakeGPUModel(dense_s=1e-6), link=test_link(), **kw)


# --- the timeline alone ------------------------------------------------------------------------------------------
def test_blocking_fetch_runs_copy_after_copy_before_the_forward_pass():
    """Two adapters, 3 layers, no prefetch: 6 copies on the compute stream, each 2 us of bytes and a 1 us round trip
    after the one before completed (18 us), then 3 layers of 4 us base + 1 us LoRA."""
    tl = StagedTimeline(1e9, 1 * US)
    w = StagedWork(base_s=4 * US, lora_s=1 * US, fetch_s=np.full(6, 2 * US),
                   fetch_layer=np.tile(np.arange(3), 2), fetch_blocks=True)
    ex = tl.run(w, 3)
    assert ex.duration_s == pytest.approx(18 * US + 3 * 5 * US, rel=1e-12)
    assert ex.busy_s["PCIe 0"] == pytest.approx(12 * US, rel=1e-12)
    fetch = [s for s in ex.spans if s.name == "adapter fetch"]
    assert [s.start_s for s in fetch] == pytest.approx([0, 3 * US, 6 * US, 9 * US, 12 * US, 15 * US])
    assert min(s.start_s for s in ex.spans if s.lane == "GPU 0") == pytest.approx(18 * US)


def test_prefetch_layer_waits_for_its_copies_in_s_loras_issue_order():
    """With prefetch the copies run beside the forward pass, adapter by adapter, layer by layer (S-LoRA's
    load_to_gpu): layer l's LoRA kernel waits for the second adapter's layer-l copy. Copies complete at 3, 6, 9
    (adapter 0) and 12, 15, 18 us (adapter 1); layer 0: base to 4, LoRA from 12 to 13; layer 1: base to 17, LoRA
    from 17 to 18 (its copy done at 15); layer 2: base to 22, LoRA 22-23 (copy at 18)."""
    tl = StagedTimeline(1e9, 1 * US)
    w = StagedWork(base_s=4 * US, lora_s=1 * US, fetch_s=np.full(6, 2 * US),
                   fetch_layer=np.tile(np.arange(3), 2), fetch_blocks=False)
    ex = tl.run(w, 3)
    assert ex.duration_s == pytest.approx(23 * US, rel=1e-12)
    lora = [s for s in ex.spans if s.lane == "GPU 0" and s.name == "LoRA"]
    assert [s.start_s for s in lora] == pytest.approx([12 * US, 17 * US, 22 * US])
    assert [s.dur_s for s in lora] == pytest.approx([US] * 3)
    # the LoRA kernels' time includes the 8 us the first one waited for its copy
    assert ex.lora_s == pytest.approx(3 * US + 8 * US, rel=1e-12)


def test_staging_sits_on_every_layers_critical_path():
    """CPU-LoRA-Offload's staging: per layer base, kernel stop, the copy and its round trip, the LoRA kernel; the
    stretch form (base_s an array) executes each iteration as the single form does, bit for bit."""
    tl = StagedTimeline(1e9, 1 * US)
    w = StagedWork(base_s=4 * US, lora_s=1 * US, stage_s=3 * US, stop_s=KERNEL_STOP_S)
    ex = tl.run(w, 4)
    assert ex.duration_s == pytest.approx(4 * (4 * US + KERNEL_STOP_S + 3 * US + US + US), rel=1e-12)
    assert ex.busy_s["host"] == pytest.approx(4 * KERNEL_STOP_S, rel=1e-12)
    assert {s.lane for s in ex.spans} == {"GPU 0", "PCIe 0", "host"}
    assert len([s for s in ex.spans if s.name == "staged copy"]) == 4
    bases = np.array([4 * US, 4.5 * US, 5 * US])
    many = tl.run(StagedWork(base_s=bases, lora_s=1 * US, stage_s=3 * US, stop_s=KERNEL_STOP_S), 4, spans=False)
    one = [tl.run(StagedWork(base_s=float(b), lora_s=1 * US, stage_s=3 * US, stop_s=KERNEL_STOP_S), 4,
                  spans=False).duration_s for b in bases]
    assert many.duration_s.tolist() == one
    with pytest.raises(ValueError, match="not both"):
        tl.run(StagedWork(base_s=US, fetch_s=np.full(2, US), fetch_layer=np.arange(2), stage_s=US), 2)
    with pytest.raises(ValueError, match="one iteration"):
        tl.run(StagedWork(base_s=bases, fetch_s=np.full(2, US), fetch_layer=np.arange(2)), 2)


# --- the systems -------------------------------------------------------------------------------------------------
def _two_adapters():
    return [Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8), Request(1, 0.0, 8, 3, adapter_id=1, fields=RANK8)]


def test_slora_fetch_on_the_critical_path_and_overlapped():
    """Two rank-8 adapters admitted together (tiny model: 2 layers, 16,384 bytes per adapter per layer, 1 GB/s,
    1 us round trip). S-LoRA's default: four copies ahead of the forward pass, each 16.384 us + 1 us; its estimate
    (one transfer of all bytes + one round trip) is 3 us short. s-lora-prefetch: the copies beside the forward pass;
    layer 0's LoRA kernel waits for adapter 1's layer-0 copy (done at 3 x 17.384 us) - the estimate's
    max(compute, fetch) is short by that wait."""
    copy = 16384 / 1e9 + US
    lora = 2 * 16384 / (1e9 * SLORA_LORA_BW_EFFICIENCY)       # per layer: both adapters' A and B
    base = 0.5 * US                                             # FakeGPUModel: 1 us per iteration over 2 layers
    compute = 2 * (base + lora)
    out = run(_two_adapters(), SLoRASystem(tiny_model(), **host_kw()), EngineConfig(fuse_decode=False))
    it0 = {k: np.asarray(v)[0] for k, v in out.iterations.items()}
    assert it0["duration_s"] == pytest.approx(4 * copy + compute, rel=1e-12)
    est = compute + 4 * 16384 / 1e9 + US
    assert it0["estimate_s"] == pytest.approx(est, rel=1e-12)
    assert est - it0["duration_s"] == pytest.approx(-3 * US, rel=1e-9)
    # later iterations fetch nothing: executed and estimate agree
    d = np.asarray(out.iterations["duration_s"])[1:]
    e = np.asarray(out.iterations["estimate_s"])[1:]
    assert d.tolist() == pytest.approx(e.tolist(), rel=1e-12)
    err = out.summary["cost_model_err"]
    assert err["iterations"] == len(out.iterations["duration_s"]) and err["mean"] < 0

    pre = run(_two_adapters(), SLoRASystem(tiny_model(), prefetch=True, **host_kw()), EngineConfig(fuse_decode=False))
    d0 = float(np.asarray(pre.iterations["duration_s"])[0])
    assert d0 == pytest.approx(3 * copy + lora + base + lora, rel=1e-12)
    e0 = float(np.asarray(pre.iterations["estimate_s"])[0])
    assert e0 == pytest.approx(max(compute, 4 * 16384 / 1e9 + US), rel=1e-12)
    assert d0 - e0 == pytest.approx(3 * copy - base, rel=1e-9)


def test_slora_tp_fetches_each_gpus_share_on_its_own_link():
    """s-lora-2gpu: each GPU copies half of every layer's adapter bytes over its own PCIe link; the trace shows
    both GPUs and both copy engines."""
    s = SLoRASystem(tiny_model(), n_gpus=2, **host_kw())
    out = run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], s, EngineConfig(fuse_decode=False))
    it0 = {k: np.asarray(v)[0] for k, v in out.iterations.items()}
    assert it0["pcie_busy_s"] == pytest.approx(2 * 8192 / 1e9, rel=1e-12)
    lanes = {sp.lane for _, sp in out.spans}
    assert {"GPU 0", "GPU 1", "PCIe 0", "PCIe 1"} <= lanes


def test_cpu_offload_staged_copy_on_the_critical_path():
    """CPU-LoRA-Offload, one rank-8 adapter, 2 layers: every layer of every iteration the GPU's base work (0.5 us),
    a kernel stop (6.7 us), the layer's 16,384 bytes copied (16.384 us + 1 us round trip), then the LoRA kernel.
    Its mechanism is serial, so its formula and the execution agree; the trace shows the host, PCIe and GPU."""
    s = CPULoRAOffloadSystem(tiny_model(), **host_kw())
    out = run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], s, EngineConfig(fuse_decode=False))
    lora = 16384 / (1e9 * s.lora_bw_efficiency)               # the GPU product from HBM, a roofline
    layer = 0.5 * US + KERNEL_STOP_S + 16384 / 1e9 + US + lora
    d = np.asarray(out.iterations["duration_s"])
    assert d.tolist() == pytest.approx([2 * layer] * 3, rel=1e-12)
    assert np.asarray(out.iterations["estimate_s"]).tolist() == pytest.approx(d.tolist(), rel=1e-12)
    assert np.asarray(out.iterations["host_s"]).tolist() == pytest.approx([2 * KERNEL_STOP_S] * 3, rel=1e-12)
    assert abs(out.summary["cost_model_err"]["max_abs"]) < 1e-12
    lanes = {sp.lane for _, sp in out.spans}
    assert {"GPU 0", "PCIe 0", "host"} <= lanes
    # a fused decode stretch executes every iteration's staging too
    fused = run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], CPULoRAOffloadSystem(tiny_model(), **host_kw()))
    assert np.asarray(fused.iterations["duration_s"]).sum() == pytest.approx(d.sum(), rel=1e-12)
