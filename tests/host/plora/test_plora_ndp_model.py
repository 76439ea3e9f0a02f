"""The analytic NDP stand-in against hand-computed times, and the model selection."""

import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from host.plora.ndp_model import NDPStandIn, NDPDeviceSpec, PLORA_DEVICE, make_ndp_model, monotone_violations

BW, F, OVH = 1.1e12, 2.048e12, 40e-9


def test_paper_device_numbers():
    s = PLORA_DEVICE
    assert s.internal_bw_Bps == 1.1e12 and s.capacity_bytes == 512e9
    assert s.peak_flops == pytest.approx(2.048e12)
    assert NDPStandIn().descriptor_overhead_s == pytest.approx(OVH)


def test_gemm_memory_and_compute_bound():
    n = NDPStandIn()
    # batch 1, A 4096 x 64: memory-bound, one descriptor
    assert n.lora_e4_s(4096, 64, 1) == pytest.approx(4096 * 64 * 2 / BW + OVH)
    # batch 300: input rows per descriptor min(256, 512 KiB input buffer // 8192 = 64): chunks 64 x 4, 44,
    # compute-bound
    assert n.lora_e4_s(4096, 64, 300) == pytest.approx(2 * 300 * 4096 * 64 / F + 5 * OVH)
    # A of 4096 x 128 = 1 MiB exceeds the 20-bit field by one byte: two descriptors
    assert n.lora_e4_s(4096, 128, 1) == pytest.approx(4096 * 128 * 2 / BW + 2 * OVH)
    # E3 = GEMM(X, A) + GEMM(CHAIN, B)
    assert n.lora_e3_s(4096, 1024, 16, 4) == pytest.approx(n.gemm_s(4, 4096, 16) + n.gemm_s(4, 16, 1024))


def test_load_splits_into_operands():
    n = NDPStandIn()
    assert n.load_s(0) == 0.0
    assert n.load_s(1000) == pytest.approx(1000 / BW + OVH)
    assert n.load_s(3 << 20) == pytest.approx((3 << 20) / BW + 4 * OVH)      # 3 MiB / (2**20 - 1) -> 4


def test_attention_hand_computed_and_vectorized():
    n = NDPStandIn(replace(PLORA_DEVICE, lanes=64))
    # 100 tokens, head_dim 64, 4 q heads over 2 kv heads (2 rows per kv head), 64 lanes
    gemm = 2 * max(100 * 64 * 2 / BW, 2 * 2 * 100 * 64 / F)
    sfu = (2 + 3 * 2 + 29 + 5 * 6) * 1e-9
    assert n.attention_s(100, 64, 4, 2) == pytest.approx(2 * (gemm + sfu + 3 * OVH))
    toks = np.array([0, 1, 100, 5000, 9000])
    vec = n.attention_s(toks, 128, 32, 8)
    assert vec[0] == 0.0
    assert np.allclose(vec, [n.attention_s(int(t), 128, 32, 8) for t in toks])
    # 9000 tokens at head_dim 128: K^T chunks of 4095 tokens -> 3 chunks of 3 descriptors per kv head
    assert n.attention_s(9000, 128, 8, 8) - n.attention_s(8000, 128, 8, 8) > 8 * 3 * OVH * 0.99


def test_bad_inputs():
    n = NDPStandIn()
    with pytest.raises(ValueError, match="batch must be an int >= 1"):
        n.lora_e3_s(64, 64, 8, 0)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        n.attention_s(10, 64, 6, 4)
    with pytest.raises(ValueError, match="nbytes"):
        n.load_s(-1)
    with pytest.raises(ValueError, match="internal_bw_gbps"):
        NDPDeviceSpec(internal_bw_gbps=0)
    with pytest.raises(ValueError, match="unknown NDP model kind"):
        make_ndp_model("fast")


def test_scaled_spec():
    s = PLORA_DEVICE.scaled(tflops=4.096, bw_gbps=550, buffer_bytes=1 << 20)
    assert s.macs == 2048 and s.internal_bw_gbps == 550 and s.input_buffer_bytes == 1 << 20
    # smaller buffers -> fewer rows per descriptor -> more operand re-reads
    assert NDPStandIn(PLORA_DEVICE.scaled(buffer_bytes=64 << 10)).lora_e4_s(4096, 64, 64) > \
        NDPStandIn().lora_e4_s(4096, 64, 64)


def test_selection_prefers_calibrated_when_present(monkeypatch):
    class Fake:
        descriptor_overhead_s = 1e-9

        def __init__(self, config=None, memory=None):
            self.config, self.memory = config, memory

        @classmethod
        def paper(cls):
            from hdl.ndp.config import PAPER
            return cls(PAPER, types.SimpleNamespace(channels=64))

    mod = types.ModuleType("sim.perf.ndp")
    mod.NDPPerfModel = Fake
    mod.DeviceMemoryModel = lambda channels: types.SimpleNamespace(channels=channels)
    monkeypatch.setitem(sys.modules, "sim.perf.ndp", mod)
    m = make_ndp_model("auto")
    assert isinstance(m, Fake) and m.kind == "calibrated" and "64 LPDDR5X-8533 channels" in m.geometry
    assert make_ndp_model("standin").kind == "standin"
    # a changed device is the calibrated model at that device's geometry (issue 32: "auto" swapped to the stand-in
    # silently; then it was refused): 1.024 TFLOPS = 512 MACs = 128 lanes x 4 rows, 550 GB/s = 32 channels
    m = make_ndp_model("auto", PLORA_DEVICE.scaled(tflops=1.024, bw_gbps=550))
    assert m.kind == "calibrated" and (m.config.lanes, m.config.pe_batch, m.memory.channels) == (128, 4, 32)
    assert "128 lanes x 4 PE rows" in m.geometry and "32 LPDDR5X-8533 channels" in m.geometry
    assert make_ndp_model("standin", PLORA_DEVICE.scaled(tflops=1.0)).kind == "standin"


def test_calibrated_geometry_of_a_device_spec():
    """NDPDeviceSpec -> the calibrated model's core and memory: the paper's device is hdl/ndp/config.PAPER on 64
    channels; larger cores add PE rows, smaller ones narrow the beat; fields without an RTL counterpart, and MAC
    counts no core has, are errors naming them and the allowed values."""
    from hdl.ndp.config import PAPER
    assert PLORA_DEVICE.ndp_config() == replace(PAPER, name="plora-512x2-64ch")
    assert PLORA_DEVICE.channels == 64
    assert [PLORA_DEVICE.scaled(bw_gbps=b).channels for b in (275, 550, 1000, 2200, 4400)] == [16, 32, 58, 128, 256]
    assert [(c.lanes, c.pe_batch) for c in (PLORA_DEVICE.scaled(tflops=t).ndp_config()
                                             for t in (0.512, 1.024, 4.096, 8.192))] == \
        [(128, 2), (128, 4), (512, 4), (512, 8)]
    c = PLORA_DEVICE.scaled(buffer_bytes=2 << 20).ndp_config()
    assert c.input_buffer_bytes == c.dram_buffer_bytes == c.output_buffer_bytes == 2 << 20
    for bad, what in ((PLORA_DEVICE.scaled(buffers=2), "buffers"), (PLORA_DEVICE.scaled(tflops=1.0), "power of two"),
                      (replace(PLORA_DEVICE, clock_ghz=2.0), "clock_ghz"),
                      (replace(PLORA_DEVICE, descriptor_overhead_cycles=10), "descriptor_overhead_cycles")):
        with pytest.raises(ValueError, match=what):
            make_ndp_model("auto", bad)
        assert make_ndp_model("standin", bad).kind == "standin"


def _ladder(**steps):
    (knob, values), = steps.items()
    return [make_ndp_model("calibrated", PLORA_DEVICE.scaled(**{knob: v})) for v in values]


@pytest.mark.parametrize("knob, values", [("bw_gbps", (275, 550, 1100, 2200, 4400)),
                                          ("tflops", (0.512, 1.024, 2.048, 4.096, 8.192))])
def test_more_bandwidth_macs_or_channels_never_make_a_kernel_slower(knob, values):
    """The calibrated model at each device of a ladder (more channels = more bandwidth; more MACs) over the
    kernels the host issues: no kernel gets slower (issue 32 item 1's property)."""
    assert monotone_violations(_ladder(**{knob: values})) == []


def test_the_monotonicity_check_catches_a_slower_device():
    """The checker flags a model that gets slower with more channels (a mutant: a memory whose lines cost more on
    a wider device), and the kernel it happens on."""
    from sim.perf.ndp import NDPPerfModel, DeviceMemoryModel

    class Mutant(DeviceMemoryModel):
        def __init__(self, channels):
            super().__init__(channels)
            self.key = ("mutant",) + self.key           # its own kernel cache (the cache is shared by key)

        def stream(self, lines):
            return super().stream(lines) * (self.channels / 32.0) ** 2

    models = [NDPPerfModel(PLORA_DEVICE.scaled(bw_gbps=b).ndp_config(), Mutant(PLORA_DEVICE.scaled(bw_gbps=b).channels))
              for b in (550, 1100, 2200)]
    got = monotone_violations(models, [("load_s", (64 << 20,)), ("lora_e4_s", (4096, 8, 1))])
    assert {(name, i) for name, _, i, _, _ in got} >= {("load_s", 1), ("load_s", 2)}


def test_a_changed_device_runs_on_the_calibrated_model_and_rows_say_which():
    """RunSpec(device_bw_gbps=550) used to run on the stand-in while the row said ``ndp: auto`` (issue 32): now it
    runs on the calibrated model at 32 channels, and halving the bandwidth does not improve TPOT; with
    ``ndp="standin"`` the row reports ``ndp_model: standin``."""
    from host.plora.run import RunSpec, run_point
    base = RunSpec(model="llama2-7b", workload="uniform-long", system="plora", n_requests=12)
    half = run_point(base.with_(device_bw_gbps=550))
    full = run_point(base)
    assert half["error"] == "" and half["ndp_model"] == "calibrated" and "32 LPDDR5X-8533" in half["ndp_geometry"]
    assert full["ndp_model"] == "calibrated" and "64 LPDDR5X-8533" in full["ndp_geometry"]
    assert half["tpot_ms_mean"] >= full["tpot_ms_mean"]
    ok = run_point(base.with_(device_bw_gbps=550, ndp="standin"))
    assert ok["error"] == "" and ok["ndp_model"] == "standin" and ok["ndp_geometry"].startswith("stand-in")
    bad = run_point(base.with_(buffers=2))
    assert "buffers" in bad["error"] and "standin" in bad["error"]


def test_buffer_sets_overlap_fixed_costs():
    one = NDPStandIn()
    two = NDPStandIn(PLORA_DEVICE.scaled(buffers=2))
    four = NDPStandIn(PLORA_DEVICE.scaled(buffers=4))
    # one descriptor: nothing to overlap with
    assert two.lora_e4_s(4096, 64, 1) == pytest.approx(OVH + 4096 * 64 * 2 / BW)
    # E3 at batch 1 on a 4096 x 64 A and a 64 x 4096 B: two descriptors; with 2 sets the second one's overhead
    # hides behind its data phase (476 ns > 40 ns)
    data = 4096 * 64 * 2 / BW
    assert one.lora_e3_s(4096, 4096, 64, 1) == pytest.approx(2 * (data + OVH))
    assert two.lora_e3_s(4096, 4096, 64, 1) == pytest.approx(OVH + 2 * data)
    # attention on short shares is fixed-cost bound: more sets help, monotonically
    t = [NDPStandIn(replace(PLORA_DEVICE, lanes=64).scaled(buffers=b)).attention_s(64, 128, 32, 32)
         for b in (1, 2, 3, 4)]
    assert t[0] > t[1] > t[2] > t[3]
    # 2 sets, 64 tokens, 32 heads x (scores, softmax, context), 64 lanes: first fixed cost + per descriptor
    # max(data, fixed)
    cyc = 1e-9
    gemm = max(64 * 128 * 2 / BW, 2 * 64 * 128 / F)
    sfu_data, sfu_fixed = (1 + 2 * 1) * cyc, (29 + 30) * cyc
    assert t[1] == pytest.approx(OVH + 32 * (2 * max(gemm, OVH) + max(sfu_data, OVH + sfu_fixed)))
    assert four.attention_s(0, 128, 32, 32) == 0.0


def test_device_preset_is_registered():
    from host.models.devices import get_device
    from host.plora.config import PLORA_X4
    d = get_device("plora-512g-x4")
    assert d is PLORA_X4 and d.count == 4 and d.capacity_gb == 512 and d.bw_gbps == 1100
    assert d.tflops == pytest.approx(2.048) and d.link == "cxl3.1" and d.total_capacity_bytes == 4 * 512e9
