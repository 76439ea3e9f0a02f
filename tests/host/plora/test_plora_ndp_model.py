"""The analytic NDP stand-in against hand-computed times, and the model selection."""

import sys
import types

import numpy as np
import pytest

from host.plora.ndp_model import NDPStandIn, NDPDeviceSpec, PLORA_DEVICE, make_ndp_model

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
    # batch 300: input rows per descriptor min(256, (2**20-1) // 8192 = 127): chunks 127, 127, 46, compute-bound
    assert n.lora_e4_s(4096, 64, 300) == pytest.approx(2 * 300 * 4096 * 64 / F + 3 * OVH)
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
    n = NDPStandIn()
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

        @classmethod
        def paper(cls):
            return cls()

    mod = types.ModuleType("sim.perf.ndp")
    mod.NDPPerfModel = Fake
    monkeypatch.setitem(sys.modules, "sim.perf.ndp", mod)
    m = make_ndp_model("auto")
    assert isinstance(m, Fake) and m.kind == "calibrated"
    assert make_ndp_model("standin").kind == "standin"
    # a changed device spec is priced only by the stand-in, named (issue 32: "auto" swapped to it silently)
    with pytest.raises(ValueError, match="ndp='standin'"):
        make_ndp_model("auto", PLORA_DEVICE.scaled(tflops=1.0))
    with pytest.raises(ValueError, match="device parameters"):
        make_ndp_model("calibrated", PLORA_DEVICE.scaled(tflops=1.0))
    assert make_ndp_model("standin", PLORA_DEVICE.scaled(tflops=1.0)).kind == "standin"


def test_selection_never_falls_back_silently(monkeypatch):
    monkeypatch.setitem(sys.modules, "sim.perf.ndp", None)
    for kind in ("auto", "calibrated"):
        with pytest.raises(ImportError):
            make_ndp_model(kind)
    assert make_ndp_model("standin").kind == "standin"


def test_a_changed_device_without_the_stand_in_named_is_an_error_and_rows_say_the_model():
    """RunSpec(device_bw_gbps=550) used to run on the stand-in while the row said ``ndp: auto`` (issue 32): now
    the point fails with the reason, and with ``ndp="standin"`` the row reports ``ndp_model: standin``."""
    from host.plora.run import RunSpec, run_point
    base = RunSpec(model="llama2-7b", workload="uniform", system="plora", n_requests=12)
    bad = run_point(base.with_(device_bw_gbps=550))
    assert "standin" in bad["error"]
    ok = run_point(base.with_(device_bw_gbps=550, ndp="standin"))
    assert ok["error"] == "" and ok["ndp_model"] == "standin"
    assert run_point(base)["ndp_model"] == "calibrated"


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
    t = [NDPStandIn(PLORA_DEVICE.scaled(buffers=b)).attention_s(64, 128, 32, 32) for b in (1, 2, 3, 4)]
    assert t[0] > t[1] > t[2] > t[3]
    # 2 sets, 64 tokens, 32 heads x (scores, softmax, context): first fixed cost + per descriptor max(data, fixed)
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
