"""Model, hardware, device and link configurations: derived values against hand-computed ones, sources present,
bad values refused."""

from dataclasses import dataclass

import pytest

from host.models import MODELS, get_model, GPUS, NODES, DeviceConfig, register_device, get_device, DEVICES
from host.link import LINKS, get_link, Link


def test_parameter_counts_match_the_model_cards():
    # published sizes: Llama-2 6.74B / 13.0B / 69.0B, Llama-3 8.03B, Qwen3-30B-A3B 30.5B, OPT 66B, GPT-3 175B
    expect = {"llama2-7b": 6.74, "llama2-13b": 13.02, "llama2-70b": 68.98, "llama3-8b": 8.03,
              "qwen3-30b-a3b": 30.5, "opt-66b": 66.2, "gpt-175b": 175.2}
    for name, b in expect.items():
        assert get_model(name).params() / 1e9 == pytest.approx(b, rel=0.01), name


def test_kv_bytes_per_token():
    # 2 (K, V) x layers x kv_heads x head_dim x 2 B
    assert get_model("llama2-7b").kv_bytes_per_token(tp=1) == 2 * 32 * 32 * 128 * 2
    assert get_model("llama3-8b").kv_bytes_per_token(tp=1) == 2 * 32 * 8 * 128 * 2
    assert get_model("qwen3-30b-a3b").kv_bytes_per_token(tp=1) == 2 * 48 * 4 * 128 * 2
    assert get_model("gpt-175b").kv_bytes_per_token() == 2 * 96 * 12 * 128 * 2  # TP 8: 12 heads per GPU
    assert get_model("llama3-8b").kv_bytes_per_token(tp=8) == 2 * 32 * 1 * 128 * 2


def test_l3_table3_models():
    for name, (layers, heads, d, tp, dp) in {"opt-66b": (64, 72, 9216, 2, 4), "gpt-89b": (48, 96, 12288, 4, 2),
                                             "gpt-175b": (96, 96, 12288, 8, 1)}.items():
        m = get_model(name)
        assert (m.n_layers, m.n_heads, m.d_model, m.tp, m.dp, m.head_dim) == (layers, heads, d, tp, dp, 128)


def test_linear_shapes_and_moe():
    q = get_model("qwen3-30b-a3b")
    shapes = {l.name: (l.k, l.n, l.count) for l in q.linears(1)}
    assert shapes["attn_pre_proj"] == (2048, (32 + 8) * 128, 1)
    assert shapes["mlp_up_proj"] == (2048, 2 * 768, 8)
    with pytest.raises(ValueError, match="tensor-parallel degree 3"):
        get_model("llama2-7b").linears(3)


def test_every_config_has_sources():
    for cfg in [*MODELS.values(), *GPUS.values(), *NODES.values(), *LINKS.values()]:
        assert cfg.sources, cfg.name


def test_links():
    assert get_link("cxl3.1").bw_gbps == 128 and get_link("nvlink-c2c").bw_gbps == 450
    assert get_link("nvlink6").bw_gbps == 1800 and get_link("nvlink5").bw_gbps == 900
    assert get_link("pcie5-x16").bw_gbps == pytest.approx(63.0, rel=1e-3)
    l = get_link("cxl3.1").with_(rtt_ns=1000)
    assert l.transfer_s(128e6, round_trips=2) == pytest.approx(1e-3 + 2e-6)
    with pytest.raises(ValueError, match="bw_gbps must be > 0"):
        Link(name="x", bw_gbps=0, rtt_ns=1)
    with pytest.raises(ValueError, match="unknown link 'pcie9'"):
        get_link("pcie9")


def test_device_pattern():
    @dataclass(frozen=True, kw_only=True)
    class Toy(DeviceConfig):
        buffers: int = 2

    d = register_device(Toy(name="toy-test", capacity_gb=512, bw_gbps=1100, tflops=2.0, count=4))
    assert get_device("toy-test") is d and d.total_capacity_bytes == 4 * 512e9
    with pytest.raises(ValueError, match="already registered"):
        register_device(Toy(name="toy-test", capacity_gb=1, bw_gbps=1))
    with pytest.raises(ValueError, match="capacity_gb must be > 0"):
        Toy(name="bad", capacity_gb=0, bw_gbps=1)
    DEVICES.pop("toy-test")
