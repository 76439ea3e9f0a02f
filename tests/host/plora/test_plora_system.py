"""The PLoRA-family system and the host-memory baselines on the serving engine: hand-computed iterations,
fused runs against step-by-step runs, memory invariants, and each mechanism."""

import numpy as np
import pytest

from conftest import FakeNDP, FakeGPUModel, tiny_model, test_gpu, test_link
from host.serving import Request, RequestTable, run, EngineConfig
from host.plora.config import KERNEL_STOP_S, VARIANTS
from host.plora.system import PLoRASystem
from host.plora.baselines import SLoRASystem, CPULoRAOffloadSystem, SLORA_LORA_BW_EFFICIENCY
from host.plora.lora import E1, E2, E3, E4

RANK8 = {"rank": 8}


def plora(variant="plora", **kw):
    kw.setdefault("gpu", test_gpu())
    kw.setdefault("gpu_model", FakeGPUModel())
    kw.setdefault("link", test_link())
    kw.setdefault("ndp", FakeNDP(e3=1e-6, att=1e-8))
    kw.setdefault("n_dev", 2)
    return PLoRASystem(tiny_model(), variant, **kw)


def test_decode_iteration_hand_computed():
    """nd-e3, one request (prompt 8, output 3) on 2 devices, 1 GB/s link with a 1 us round trip, 0.1 GB/s HBM:
    the run's time is the executed timeline (host/plora/timeline.py), hand-computed here job by job; the cost
    model's estimate is recorded beside it."""
    s = plora("nd-e3", gpu=test_gpu(bw=0.1))
    out = run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], s, EngineConfig(fuse_decode=False))
    # KV duplication: 128 B/token/layer over 0.1 GB/s HBM (1.28 us) is slower than the devices: none
    assert list(out.iterations["kv_dup_fraction"]) == [0.0, 0.0, 0.0]
    W, half = 1e9, 0.5e-6                                  # bytes/s per direction, one-way latency
    out_b, in_b, dev_s = s.cost.terms(8, 1)[E3][:3]       # x out, y back, 7 matrices x 1 us on device 0
    assert dev_s == pytest.approx(7e-6)
    # LoRA wave: x out, the job on device 0, y back; the base GEMMs (10 us / 2 layers) run meanwhile
    wave = max(5e-6, out_b / W + half + dev_s + in_b / W + half)

    def attention(kv):
        # tokens i on device i mod 2; the query (128 B) to each device, the new token's K, V (128 B) to its device,
        # in device order on the link-out FIFO; each device's share at 10 ns per token; partials (152 B) back
        # FIFO in the order they are ready; the merge is free on this GPU model
        new = (kv - 1) % 2
        lo = li = 0.0
        fins = []
        for d in (0, 1):
            lo += (128 + (128 if new == d else 0)) / W
            tokens = len(range(d, kv, 2))
            fins.append(lo + half + tokens * 1e-8)
        for f in sorted(fins):
            li = max(li, f) + 152 / W
        return li + half

    expect = [2 * (wave + attention(kv)) for kv in (9, 10)]
    assert list(out.iterations["duration_s"][1:]) == pytest.approx(expect, rel=1e-12)
    # the estimate Algorithm 1 ranks with (VI-B): wave = busiest resource + one round trip, attention =
    # L_link + max(device, link) + merge (2 partials x 152 B / 0.1 GB/s), plus the base model
    est_layer = 8e-6 + 1e-6 + 0.384e-6 + 3.04e-6
    assert list(out.iterations["estimate_s"][1:]) == pytest.approx([10e-6 + 2 * est_layer] * 2, rel=1e-12)
    err = out.summary["cost_model_err"]
    assert err["max_abs"] > 0.05 and err["iterations"] == 3
    assert out.summary["strategy_counts"]["decisions"]["E3"] == 1


def test_link_latency_is_charged_twice_per_layer():
    """One LoRA wave and one attention return per layer: raising the round trip by 1 us adds 2 x 2 us."""
    def tpot(rtt_ns):
        s = plora("nd-e3", gpu=test_gpu(bw=0.1), link=test_link(rtt_ns=rtt_ns))
        return run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], s).summary["tpot_ms_mean"] * 1e-3
    assert tpot(2000.0) - tpot(1000.0) == pytest.approx(2 * 2 * 1e-6, rel=1e-9)


def test_short_context_is_duplicated_when_the_round_trip_dominates():
    """At 1 GB/s HBM the GPU attends over the 8-token prompt (1.02 us) faster than a device round trip (1 us +
    link + merge): the cost model duplicates the whole request and keeps duplicating its new tokens."""
    s = plora("nd-e3")
    out = run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], s, EngineConfig(fuse_decode=False))
    assert list(out.iterations["kv_dup_fraction"][1:]) == [1.0, 1.0]


def test_fused_runs_match_step_by_step():
    rng = np.random.default_rng(4)
    n = 30
    t = RequestTable(id=np.arange(n), arrival_s=np.sort(rng.uniform(0, 2e-3, n)), prompt_tokens=rng.integers(4, 60, n),
                     output_tokens=rng.integers(2, 40, n), adapter_id=rng.integers(0, 12, n),
                     extra={"rank": rng.choice([8, 16, 32], n)})
    for v in ("plora", "pure-cxl", "nd-e4"):
        a = run(t, plora(v, ndp=FakeNDP(e3=1e-6, att=3e-7)))
        b = run(t, plora(v, ndp=FakeNDP(e3=1e-6, att=3e-7)), EngineConfig(fuse_decode=False))
        assert a.summary["finished"] == b.summary["finished"] == n
        assert (a.iterations["fused"] > 1).any()
        # within a stretch decode attention is interpolated between its first and last iterations
        np.testing.assert_allclose(a.table.finish_s, b.table.finish_s, rtol=2e-3)
        assert a.summary["tpot_ms_mean"] == pytest.approx(b.summary["tpot_ms_mean"], rel=2e-3)


def _heavy_table(n=40, adapters=30, seed=2):
    rng = np.random.default_rng(seed)
    return RequestTable(id=np.arange(n), arrival_s=np.zeros(n), prompt_tokens=rng.integers(20, 200, n),
                        output_tokens=rng.integers(5, 50, n), adapter_id=rng.integers(0, adapters, n),
                        extra={"rank": rng.choice([8, 16, 32, 64], n)})


def test_hbm_budget_is_never_exceeded_and_eviction_happens():
    # 2 MB of HBM (1.6 MB for adapters and KV duplicates after weights and workspace), a fast GPU and slow NDP
    # cores: E1 is worth caching, and the adapters do not all fit
    s = plora("plora", gpu=test_gpu(hbm_gb=0.002, bw=100.0, tflops=100.0), ndp=FakeNDP(e3=1e-4, e4=1e-4, att=1e-7))
    out = run(_heavy_table(), s)
    budget = s.state.budget_bytes / 1e9
    used = out.iterations["hbm_adapters_gb"] + out.iterations["hbm_kv_dup_gb"]
    assert np.all(used <= budget * (1 + 1e-9))
    assert out.summary["finished"] == 40
    sc = out.summary["strategy_counts"]
    assert sum(sc["evictions"].values()) > 0 or sc["paths"].get("cold", 0) > 0
    # the manager's running total of cached bytes equals a recount
    st = s.state
    assert st.cached_bytes(s.cost) == pytest.approx(sum(
        s.cost.resident(a.rank)[E1] if a.level == 2 else s.cost.resident(a.rank)[E4] if a.level == 1 else 0.0
        for a in st.adapters.values()))


def test_pool_must_hold_the_adapters():
    s = plora(device=VARIANTS["plora"].device.scaled(), n_dev=1)
    from dataclasses import replace
    s.device = replace(s.device, capacity_gb=1e-5)            # 10 kB device: no adapter fits
    with pytest.raises(ValueError, match="use at least --devices"):
        run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], s)


def test_variants_use_only_their_strategies():
    t = _heavy_table()
    for v, allowed in (("pure-cxl", {"E1", "E2"}), ("n-e3", {"E3"}), ("nd-e3", {"E3"}), ("nd-e4", {"E4"})):
        out = run(t, plora(v, gpu=test_gpu(hbm_gb=0.01)))
        dec = out.summary["strategy_counts"]["decisions"]
        assert {k for k, c in dec.items() if c and k != "E3 (fallback)"} <= allowed, (v, dec)
    # without distributed attention no device works on attention
    s = plora("pure-cxl")
    run(t, s)
    assert not s.variant.distributed and s.variant.allowed == (E1, E2)


def test_nocxl_pays_a_kernel_stop_per_host_operation():
    """PLoRA-NoCXL (no accelerator load/store): an E3 adapter on the tiny model takes, per layer, 4 input copies
    and 7 kernel launches before its device job and 7 result copies after it, each a kernel stop on the host
    (one at a time); the attention exchange 3 per device. The estimate Algorithm 1 ranks with counts them too."""
    nocxl = VARIANTS["nd-e3"].__class__(**{**VARIANTS["nd-e3"].__dict__, "host_mediated": True,
                                           "name": "nd-e3-host"})
    a, b = plora("nd-e3"), plora(nocxl)
    assert b.cost.host_op_s == KERNEL_STOP_S and a.cost.host_op_s == 0.0
    ra = run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], a)
    rb = run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], b)
    extra = (rb.summary["tpot_ms_mean"] - ra.summary["tpot_ms_mean"]) * 1e-3
    # at least the LoRA job's 18 stops in series, per layer, 2 layers; the attention's 3 per device make the
    # devices' share dearer than the GPU's: the cost model duplicates the whole KV in HBM instead
    assert extra >= 2 * 18 * KERNEL_STOP_S * (1 - 1e-9)
    assert list(rb.iterations["kv_dup_fraction"][1:]) == [1.0, 1.0]
    # the estimate counts the same operations: -12 % here (it overlaps the base GEMMs and the device job with the
    # host's stops, which the executed synchronizes and serializes); without them it was -63 %
    assert -0.2 < rb.summary["cost_model_err"]["mean"] < 0
    w = b.cost.terms(8, 1)
    assert b.cost.standalone_s(8, 1)[2] - a.cost.standalone_s(8, 1)[2] == pytest.approx(18 * KERNEL_STOP_S)
    assert w[0, 5] == w[0, 6] == 0                 # E1 needs no host operation


def host_kw():
    return dict(gpu=test_gpu(hbm_gb=1.0), gpu_model=FakeGPUModel(dense_s=1e-6), link=test_link())


def test_slora_pays_its_fetch_and_its_kernels():
    """S-LoRA as its code runs by default: the adapter fetched over PCIe before the batch that first uses it
    (prefetch off), one copy per layer, each after the one before completed; its LoRA kernels at Punica's measured
    SGMV efficiency; with the paper's prefetch the fetch overlaps the iteration instead
    (tests/host/plora/test_plora_baselines.py executes both on constructed cases)."""
    # Punica's operator: 483,328 bytes per added adapter in (116 - 37) / 63 us, over the A100's 2,039 GB/s
    assert SLORA_LORA_BW_EFFICIENCY == pytest.approx(483328 / (79e-6 / 63) / 2039e9, rel=1e-12)
    assert SLORA_LORA_BW_EFFICIENCY == pytest.approx(0.18903, abs=1e-5)
    req = [Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)]
    # the prefill: 1 us of base model; LoRA per layer: A and B of rank 8 (16,384 bytes) at 1 GB/s x 0.189 (its
    # 131,072 FLOPs at 1 TFLOPS are less), 2 layers; the fetch: the 32,768-byte adapter in two 16,384-byte copies
    # at 1 GB/s, each completing a 1 us round trip later
    compute = 1e-6 + 2 * 16384 / (1e9 * SLORA_LORA_BW_EFFICIENCY)
    fetch = 2 * (16384 / 1e9 + 1e-6)
    s = SLoRASystem(tiny_model(), **host_kw())
    out = run(req, s)
    assert out.table.first_token_s[0] == pytest.approx(compute + fetch, rel=1e-12)
    assert out.summary["strategy_counts"]["fetches"] == 1
    pre = SLoRASystem(tiny_model(), prefetch=True, **host_kw())
    assert pre.name == "s-lora-prefetch"
    # overlapped, but the first layer's LoRA kernel waits for that layer's copy
    assert run(req, pre).table.first_token_s[0] == pytest.approx(16384 / 1e9 + 1e-6 + compute - 0.5e-6, rel=1e-12)
    # a second request for the same adapter fetches nothing
    out2 = run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8), Request(1, 1.0, 8, 3, adapter_id=0, fields=RANK8)],
               SLoRASystem(tiny_model(), **host_kw()))
    assert out2.summary["strategy_counts"]["fetches"] == 1


def test_slora_unified_pool_limits_admission():
    # slot = one token's KV over both layers = 256 B; pool = 0.9 x HBM - weights
    m = tiny_model()
    gpu = test_gpu(hbm_gb=(m.weight_bytes(1) + 60_000) / 0.9 / 1e9)
    s = SLoRASystem(m, gpu=gpu, gpu_model=FakeGPUModel(), link=test_link())
    t = RequestTable(id=np.arange(4), arrival_s=np.zeros(4), prompt_tokens=np.full(4, 40),
                     output_tokens=np.full(4, 10), adapter_id=np.arange(4), extra={"rank": np.full(4, 8)})
    out = run(t, s)
    # each request: 49 KV slots (12,544 B) + its adapter (128 slots = 32,768 B): only one fits at a time
    assert out.summary["max_batch"] == 1 and out.summary["finished"] == 4
    assert s.peak["kv"] + s.peak["adapters"] <= s.pool_bytes


def test_cpu_lora_offload_stages_every_use():
    """PLoRA III-B(1): each iteration, in every layer, a kernel stop and a host copy of the adapter's matrices over
    PCIe, serialized with compute; nothing is cached (fused decode runs pay it in every iteration too). The
    ``-cached`` variant (before issue 30) stages once and keeps the adapter in HBM."""
    req = [Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)]
    stage = 2 * (KERNEL_STOP_S + 1e-6) + 32768 / 1e9          # 2 layers x (stop + round trip) + the adapter
    s = CPULoRAOffloadSystem(tiny_model(), **host_kw())
    out = run(req, s, EngineConfig(fuse_decode=False))
    d = out.iterations["duration_s"]
    lora = float(s._lora_layer_s(np.array([0]), np.array([8]))) * 2
    assert d[0] == pytest.approx(1e-6 + lora + stage)
    assert list(d[1:]) == pytest.approx([1e-6 + lora + stage] * 2)
    fused = run(req, CPULoRAOffloadSystem(tiny_model(), **host_kw()))
    assert fused.summary["tpot_ms_mean"] == pytest.approx(out.summary["tpot_ms_mean"], rel=1e-9)
    c = CPULoRAOffloadSystem(tiny_model(), cache=True, **host_kw())
    dc = run(req, c, EngineConfig(fuse_decode=False)).iterations["duration_s"]
    assert dc[0] == pytest.approx(1e-6 + lora + stage)
    assert dc[1] < 2e-6 + lora + 1e-9                 # cached in HBM: no staging
    assert c.name == "cpu-lora-offload-cached"


def test_kv_placement_belongs_to_d():
    """Without distributed attention the KV lives in the pool and the GPU reads it over the link every layer
    (PLoRA V-B(1)); the "-hbmkv" variants keep it in HBM as far as it fits, as before issue 30."""
    req = [Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)]
    pool = run(req, plora("ns"), EngineConfig(fuse_decode=False))
    hbm = run(req, plora("ns-hbmkv"), EngineConfig(fuse_decode=False))
    assert list(pool.iterations["kv_dup_fraction"]) == [0.0, 0.0, 0.0]
    assert list(hbm.iterations["kv_dup_fraction"][1:]) == [1.0, 1.0]
    # the pool's KV crosses the link: 9 tokens x 128 B per layer at 1 GB/s, then the attention kernel may end
    assert (pool.iterations["link_busy_s"][1:] > hbm.iterations["link_busy_s"][1:]).all()
    assert pool.summary["tpot_ms_mean"] > hbm.summary["tpot_ms_mean"]
    assert VARIANTS["ns-hbmkv"].kv_in_hbm and not VARIANTS["ns"].kv_in_hbm
    with pytest.raises(ValueError, match="kv_in_hbm"):
        VARIANTS["plora"].__class__(**{**VARIANTS["plora"].__dict__, "kv_in_hbm": True})


def test_grace_hopper_pays_a_launch_per_lora_kernel():
    """Grace-Hopper: the GPU reads adapters (E2) and KV from Grace memory over NVLink-C2C itself (PLoRA ref [52],
    extended GPU memory: no host in the path, so no kernel stop), but its LoRA kernel is a kernel of its own
    beside the base GEMMs (it cannot be fused into them): every layer of every iteration pays the GPU model's
    per-kernel floor once for it. One request, 2 layers: a 5 us floor adds 2 x 5 us to each decode iteration."""
    def durations(kernel_s):
        s = plora("grace-hopper", gpu_model=FakeGPUModel(kernel_s=kernel_s), ndp=FakeNDP(att=1e-8), n_dev=1)
        out = run([Request(0, 0.0, 8, 3, adapter_id=0, fields=RANK8)], s, EngineConfig(fuse_decode=False))
        return np.asarray(out.iterations["duration_s"][1:]), s
    base, _ = durations(0.0)
    paid, s = durations(5e-6)
    assert s.cost.host_op_s == 0.0                     # no kernel stops: the GPU loads and stores over C2C
    assert list(paid - base) == pytest.approx([2 * 5e-6] * 2, rel=1e-9)


def test_pruned_prompt_strategy_runs_as_the_unpruned(monkeypatch):
    """A run whose prompts' strategies are chosen with the kernel pruning executes the same iterations, bit for bit,
    as one that prices every strategy's kernels (prompts long enough that E3 is pruned, short enough that it wins)."""
    from host.plora.cost import CostModel
    reqs = [Request(i, 1e-5 * i, p, 3, adapter_id=i % 3, fields=RANK8) for i, p in enumerate((4, 40, 400, 9, 120))]

    def durations():
        out = run(list(reqs), plora("plora", ndp=FakeNDP(e3=2e-8, e4=1e-8, att=1e-8)), EngineConfig(fuse_decode=False))
        return list(out.iterations["duration_s"]), list(out.iterations["estimate_s"])
    pruned = durations()
    orig = CostModel.prefill_choice
    monkeypatch.setattr(CostModel, "prefill_choice", lambda self, r, t, ok, prune=True: orig(self, r, t, ok, prune=False))
    assert durations() == pruned
