"""The GPU model: error on measured rows it was not fitted on (leave one model / one GPU out), the calibration
file is current, floors, attention and all-reduce behave as their formulas say."""

import json

import numpy as np
import pytest

from host.gpu import GPUModel, load_calibration
from host.gpu.fit import fit, holdout_report, predict_rows, mape_by_op, HOLDOUT_SPLITS
from host.gpu.model import CALIBRATION_PATH, Calibration, GemmParams
from host.gpu.profiles import GEMM_OPS, ELT_OPS, training_rows
from host.models import get_model, H100_SXM_80GB

# Stated bounds on the held-out mean absolute percentage error (docs/host.md lists the measured values).
GEMM_BOUND = 12.0
ELT_BOUND = 30.0


@pytest.fixture(scope="module")
def report():
    return holdout_report()


def test_heldout_error_within_bounds(report):
    for split, errs in report.items():
        print(split, {k: round(v, 1) for k, v in errs.items()})
        for op in GEMM_OPS:
            assert errs[op] < GEMM_BOUND, (split, op, errs[op])
        for op in ELT_OPS:
            assert errs[op] < ELT_BOUND, (split, op, errs[op])


def test_the_bound_catches_a_broken_model():
    # the idealized roofline (no fitted efficiencies or overhead) must fail the GEMM bound: the check can fail
    rows = training_rows([("h100", "llama2-7b")])
    cal = fit(training_rows([("a100", "llama2-7b")]))
    broken = Calibration(gemm=GemmParams(t0_s=0.0, eff_mem=1.0, eff_compute=1.0, p=50.0), elt=cal.elt)
    errs = mape_by_op(predict_rows(broken, rows), rows["t_s"].to_numpy(), rows["op"].to_numpy())
    assert max(errs[op] for op in GEMM_OPS) > GEMM_BOUND


def test_calibration_file_is_current():
    fresh = fit(training_rows()).to_json()
    stored = json.loads(CALIBRATION_PATH.read_text())
    for k, v in fresh["gemm"].items():
        assert stored["gemm"][k] == pytest.approx(v, rel=1e-3), k
    for op, params in fresh["elt"].items():
        for k, v in params.items():
            assert stored["elt"][op][k] == pytest.approx(v, rel=1e-3), (op, k)


def test_floor_is_weights_at_datasheet_bandwidth():
    g = GPUModel("h100")
    m = get_model("llama2-7b")
    it = g.iteration(m, tp=1, decode_requests=1, decode_kv_tokens=1, logits_tokens=0)
    weights = m.n_layers * m.layer_weight_params() * 2
    assert it.floor_s == pytest.approx(weights / 3350e9, rel=0.02)
    # the data README's sanity figure: 32 tokens measure ~5.8 ms per forward on H100, floor ~4.0 ms
    it32 = g.iteration(m, tp=1, decode_requests=32, decode_kv_tokens=32, logits_tokens=0)
    assert 5.0e-3 < it32.total_s < 6.8e-3 and it32.floor_s == pytest.approx(4.0e-3, rel=0.05)
    assert it32.total_s > it32.floor_s


def test_attention_decode_scales_with_kv_and_vectorizes():
    g = GPUModel("a100")
    m = get_model("llama2-13b")
    kv = np.array([1e4, 1e5, 1e6])
    it = g.iteration(m, tp=1, decode_requests=16, decode_kv_tokens=kv)
    one = [g.iteration(m, tp=1, decode_requests=16, decode_kv_tokens=x).total_s for x in kv]
    np.testing.assert_allclose(it.total_s, one)
    big = g.attention_decode(16, 1e6, heads=40, kv_heads=40, head_dim=128)
    # large KV: bandwidth-bound at the fitted achieved fraction
    kv_bytes = 1e6 * 2 * 40 * 128 * 2
    assert big.calibrated_s == pytest.approx(kv_bytes / (2039e9 * load_calibration().gemm.eff_mem), rel=0.02)


def test_prefill_attention_is_causal():
    g = GPUModel("h100")
    a = g.attention_prefill([8000], [8000], heads=32, kv_heads=32, head_dim=128)
    b = g.attention_prefill([8000], [16000], heads=32, kv_heads=32, head_dim=128)
    assert b.floor_s > a.floor_s
    # compute-bound; FLOPs of an 8000-token causal prefill: 4 h d sum_j j = 4 * 32 * 128 * 8000 * 8001 / 2
    assert a.floor_s == pytest.approx(4 * 32 * 128 * 8000 * 8001 / 2 / 989.4e12, rel=1e-6)
    with pytest.raises(ValueError, match="kv_tokens >= q_tokens"):
        g.attention_prefill([10], [5], heads=1, kv_heads=1, head_dim=8)


def test_tensor_parallel_adds_measured_all_reduce():
    g = GPUModel("a100")
    m = get_model("gpt-175b")
    it = g.iteration(m, tp=8, decode_requests=64, decode_kv_tokens=64 * 1000)
    assert it.ops["all_reduce"] > 0
    ar = g.all_reduce(np.array([1e4, 1e6, 1e8]), 8)
    assert np.all(np.diff(ar.calibrated_s) > 0) and np.all(ar.calibrated_s > ar.floor_s)
    assert g.all_reduce(1e6, 1).calibrated_s == 0.0


def test_moe_touches_fewer_experts_at_small_batches():
    g = GPUModel("h100")
    one = g.gemm(1, 2048, 1536, experts=128, active=8)
    many = g.gemm(4096, 2048, 1536, experts=128, active=8)
    # one token reads 8 experts' weights, a large batch all 128
    assert one.floor_s == pytest.approx(2 * (8 * 2048 * 1536 + 8 * (2048 + 1536)) / 3350e9, rel=1e-6)
    assert many.floor_s >= 128 * 2048 * 1536 * 2 / 3350e9
