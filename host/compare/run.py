"""Run every system of ``ndpim compare`` on every workload, on one GPU budget (module constants), through each
host's own entry point: the PLoRA host's :func:`host.plora.run.run_spec` (with the workload as a trace file, its
``--trace-file`` path) and the L3 host's :func:`host.l3.run.run_l3` (with the workload itself). Nothing of either
host's serving logic is repeated here.

**The GPU budget, the same at every point**: one NVIDIA H100 SXM 80 GB (host.models.hardware ``h100``: PLoRA
VII-A's GPU; the L3 host's DGX-A100 GPU is replaced by it through the host's ``gpu.preset`` hardware field) serving
**Llama-3.1-8B** (BF16; Hugging Face meta-llama/Llama-3.1-8B config.json, :data:`LLAMA31_8B`), the model both
hosts can run: dense (the L3 host prices dense models only), head_dim 128 (the DIMM-PIM PAPER geometry, L3 Table 3)
and a 131,072-token context (the reasoning traces' requests reach 128K tokens; Llama-2's 4K would refuse them).
Beside the GPU each system has its own memory: PLoRA 4 x 512 GB CXL devices on CXL 3.1 (PLoRA VII-A); L3 and
R-PIM the 2 TiB DIMM-PIM host memory of L3 Table 2 behind the H100's PCIe 5.0 x16 (host.link ``pcie5-x16``: the
H100 SXM's host interface, in place of the DGX-A100's PCIe 4.0); S-LoRA and CPU-LoRA-Offload host DRAM over PCIe
5.0 (their host's preset); NEO (cpu-offload) the same 2 TiB host memory as plain DRAM; GPU-only and HBM-PIM none.

**Systems** (:data:`SYSTEMS`): each paper's design and its baselines on that budget. The *strongest baseline of
each paper* is chosen per workload from the numbers (the paper's baseline with the highest throughput at the SLO,
then throughput as served; host.compare.verdict). Multi-GPU baselines (S-LoRA on 2 or 4 GPUs) are left out: they
break the one-GPU budget. **The hybrid** (issue 34 item 2, host/hybrid: PLoRA's CXL pool for the adapters and the short
requests' KV, L3's DIMM-PIM for the long requests' KV, L3's two sub-batches) runs as ``hybrid`` through
:func:`host.hybrid.run.run_workload` on the same requests; its model is the hybrid host's ``llama3-8b``
(host.models), Llama-3.1-8B's architecture (32 layers, hidden 4,096, 32 query / 8 KV heads of 128, FFN 14,336,
vocabulary 128,256: the same weights and KV bytes; only the context limit differs, which an in-memory workload does
not apply), on the same H100 and PLoRA's 4 devices on CXL 3.1, the DIMM-PIM behind the H100's PCIe 5.0.

**Two runs per point**: *as served* (the workload's own arrivals, open loop) and *at matched batch* (a closed loop
of ``matched_batch`` clients, the same for every system: PLoRA host ``fixed_batch``, L3 host the engine's
``concurrency``); the matched run's TPOT is the "TPOT at matched batch", its mean batch shows whether the system
reached it.

A point that cannot serve (an error, or every request refused as never fitting) is a row with ``status`` failed and
the reason; a point that served some requests and refused others is ``partial``.
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import metrics as M
from .workloads import WORKLOADS, build, describe, write_trace

__all__ = ["SYSTEMS", "LLAMA31_8B", "GPU", "Grid", "run_grid", "write_model", "l3_budget_setup", "SMALL", "FULL"]

#: Hugging Face meta-llama/Llama-3.1-8B config.json (the values below, as published).
LLAMA31_8B = {"_name_or_path": "meta-llama/Llama-3.1-8B", "model_type": "llama", "num_hidden_layers": 32,
              "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
              "torch_dtype": "bfloat16"}
#: The GPU of every point (host.models.hardware preset; PLoRA VII-A).
GPU = "h100"
N_GPUS = 1

#: name -> (host, paper, role, what it is)
SYSTEMS = {
    "plora": ("plora", "PLoRA", "proposed", "PLoRA: NDP cores in 4 CXL devices, strategy selection, distributed "
                                            "attention (PLoRA VII-A)"),
    "s-lora": ("plora", "PLoRA", "baseline", "S-LoRA: adapters in host DRAM over PCIe 5.0, unified paging, KV in HBM"),
    "cpu-lora-offload": ("plora", "PLoRA", "baseline", "CPU-LoRA-Offload: adapters staged through host memory per "
                                                       "layer, KV in HBM"),
    "l3": ("l3", "L3", "proposed", "L3: decode attention on 2 TiB DIMM-PIM (L3 Table 2), two interleaved sub-batches"),
    "l3-knee": ("l3", "L3", "extension", "L3 with the labelled token-floor extension (--min-gpu-tokens knee, "
                                         "docs/l3_host.md): the scheduler as written admits one 16-token prefill "
                                         "chunk per sub-batch while few decodes run"),
    "gpu-only": ("l3", "L3", "baseline", "vLLM-style GPU-only, KV in HBM"),
    "hbm-pim": ("l3", "L3", "baseline", "NeuPIMs/AttAcc-style HBM-PIM attention, KV in HBM"),
    "cpu-offload": ("l3", "L3", "baseline", "NEO: KV and attention split between GPU and host CPU/DRAM"),
    "r-pim": ("l3", "L3", "baseline", "Hermes-style rank-level DIMM-PIM"),
    "hybrid": ("hybrid", "hybrid", "proposed", "PLoRA's CXL NDP pool + L3's DIMM-PIM in one system (host/hybrid, "
                                              "issue 34 item 2)"),
}
#: The hybrid host's model with Llama-3.1-8B's architecture (module docstring).
HYBRID_MODEL = "llama3-8b"

#: Grid sizes: requests per workload, matched batch. FULL: 200 requests per workload (design choice: enough for
#: p99 over requests within minutes on 2 cores), matched batch 32 (design choice: inside every system's HBM at the
#: short workloads). SMALL: the test grid.
FULL = {"requests": 200, "matched_batch": 32}
SMALL = {"requests": 6, "matched_batch": 3}


@dataclass
class Grid:
    workloads: tuple
    systems: tuple
    requests: int
    matched_batch: int
    seed: int = 0
    rate_per_s: float = 10.0
    slo_ttft_s: float = M.SLO_TTFT_S
    slo_tpot_ms: float = M.SLO_TPOT_MS
    gpu_usd_per_hour: float = M.GPU_USD_PER_HOUR

    def __post_init__(self):
        bad = [w for w in self.workloads if w not in WORKLOADS]
        if bad:
            raise ValueError(f"unknown workload(s) {bad}; allowed: {list(WORKLOADS)}")
        bad = [s for s in self.systems if s not in SYSTEMS]
        if bad:
            raise ValueError(f"unknown system(s) {bad}; allowed: {list(SYSTEMS)}")


def write_model(out: Path) -> Path:
    path = Path(out) / "model" / "llama-3.1-8b" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(LLAMA31_8B, indent=2) + "\n")
    return path


def l3_budget_setup(model, ranksets=None):
    """The L3 host's set-up on the budget (module docstring): one H100, the DIMM-PIM behind its PCIe 5.0 x16,
    ``ranksets`` ranks per channel (None: L3 Table 2's)."""
    from host.l3.config import l3_setup
    from host.link import get_link
    pcie5 = get_link("pcie5-x16")
    return l3_setup(model, tp=1, dp=1, ranksets=ranksets,
                    hardware={"gpu": {"preset": GPU}, "link": {"bw_gbps": pcie5.bw_gbps, "rtt_ns": pcie5.rtt_ns}})


def _sum_col(iterations, name):
    v = iterations.get(name) if iterations else None
    if v is None:
        return None
    v = np.asarray(v, dtype=np.float64)
    return float(np.nansum(v))


def _plora_run(system, model_path, trace_path, seed, batch):
    from host.plora.run import RunSpec, run_spec
    from host.serving import EngineConfig
    from host.models.hf import load_hf_config
    name = load_hf_config(model_path).name
    spec = RunSpec(model=name, model_config=str(model_path), workload="file", trace_file=str(trace_path),
                   system=system, n_requests=None, rate_per_s=None, seed=seed, fixed_batch=batch)
    out = run_spec(spec, engine_config=EngineConfig(trace=False, record_iterations=True))
    s = dict(out.summary)
    mem = s.get("gpu_mem_gb", {})
    peak = s.get("gpu_mem_gb_peak", {})
    s["_gpu_mem_gb"] = float(mem.get("weights", 0.0) + mem.get("workspace", 0.0) + sum(peak.values()))
    links = {}
    bw = s.get("link", {}).get("gbps")
    for col, lname in (("link_busy_s", "cxl3.1"), ("pcie_busy_s", "pcie5-x16")):
        busy = _sum_col(out.iterations, col)
        if busy is not None and bw:
            links[lname] = {"busy_s": busy, "gb_max": busy * bw}
    s["_links"] = links
    if system == "plora":
        from host.plora.ndp_model import PLORA_DEVICE
        s["_added_memory_gb"] = float(s.get("devices", 4) * PLORA_DEVICE.capacity_gb)
    else:
        s["_added_memory_gb"] = float(s.get("host_store_gb", 0.0))
    s["_offered"] = int(s.get("requests", 0))
    return s, out.table


def _hybrid_run(w, seed, batch):
    from host.hybrid.run import HybridSpec, run_workload
    from host.plora.ndp_model import PLORA_DEVICE
    from host.serving import EngineConfig
    out = run_workload(w, HybridSpec(model=HYBRID_MODEL, seed=seed),
                       engine_config=EngineConfig(trace=False, record_iterations=True, concurrency=batch))
    s = dict(out.summary)
    mem, peak = s.get("gpu_mem_gb", {}), s.get("gpu_mem_gb_peak", {})
    s["_gpu_mem_gb"] = float(sum(v for k, v in mem.items() if k not in peak) + sum(peak.values()))
    lb, link = s.get("link_bytes", {}), s.get("link", {})
    s["_links"] = {name: {"gb": (lb.get(f"{k}_out", 0.0) + lb.get(f"{k}_in", 0.0)) / 1e9}
                   for k, name in (("cxl", "cxl3.1"), ("pcie", "pcie5-x16"))}
    from host.l3.config import L3_HOST_MEMORY
    s["_added_memory_gb"] = float(s.get("devices", 4) * PLORA_DEVICE.capacity_gb
                                  + L3_HOST_MEMORY.capacity_gib * 2 ** 30 / 1e9)
    s["_offered"] = int(s.get("requests", len(w)))
    return s, out.table


def _l3_run(system, model, setup, w, seed, batch):
    from host.l3.run import run_l3
    from host.l3.systems import HBM_KV_SYSTEMS, gpu_workspace_bytes
    from host.serving import EngineConfig
    kw = None
    if system == "l3-knee":     # the L3 system with its labelled extension (SYSTEMS)
        system, kw = "l3", {"min_gpu_tokens": "knee"}
    r = run_l3(model.name, w.name, system, setup=setup, workload=w, seed=seed, system_kw=kw,
               engine=EngineConfig(trace=False, record_iterations=False, concurrency=batch))
    s = dict(r.summary)
    s["_offered"] = int(s.get("requests_offered", len(w)))
    if r.output is None:
        return s, None
    hbm_kv = s.get("kv_peak_tokens", 0) * setup.kv_bytes_per_token \
        if system in HBM_KV_SYSTEMS or system == "cpu-offload" else 0.0
    s["_gpu_mem_gb"] = float(model.weight_bytes(1) + gpu_workspace_bytes(setup) + hbm_kv) / 1e9
    lb = s.get("link_bytes")
    # the host link's bytes as the L3 systems count them (KV written, and with DIMM-PIM each decode token's query and
    # output; 0 where the KV stays in HBM)
    s["_links"] = None if lb is None else {setup.host_link.name: {"gb": (lb["pcie_out"] + lb["pcie_in"]) / 1e9}}
    s["_added_memory_gb"] = setup.host.capacity_bytes / 1e9 if system in ("l3", "r-pim", "cpu-offload") else 0.0
    return s, r.output.table


def _status(s, err):
    if err:
        return "failed", err
    offered, fin = s.get("_offered", 0), int(s.get("finished", 0) or 0)
    if s.get("oom") or fin == 0:
        return "failed", s.get("oom_reason") or s.get("rejected_reason") or "no request finished"
    if fin < offered:
        why = s.get("rejected_reason") or "requests left unfinished"
        return "partial", f"{fin} of {offered} served: {why}"
    return "served", ""


def _num(v):
    try:
        v = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return v


def run_point(grid: Grid, wname, w, system, model, model_path, trace_path, setup, out_dir=None) -> dict:
    host, paper, role, about = SYSTEMS[system]
    row = {"workload": wname, "system": system, "paper": paper, "role": role, "host": host or "-",
           "model": model.name, "gpu": f"{N_GPUS} x {GPU}", "requests": len(w),
           "adapters": int(w.stats()["adapters_used"])}
    t0 = time.perf_counter()
    runs = {}
    for kind, batch in (("served", None), ("matched", grid.matched_batch)):
        err, s, table = "", {}, None
        try:
            if host == "plora":
                s, table = _plora_run(system, model_path, trace_path, grid.seed, batch)
            elif host == "hybrid":
                s, table = _hybrid_run(w, grid.seed, batch)
            else:
                s, table = _l3_run(system, model, setup, w, grid.seed, batch)
        except (ValueError, RuntimeError) as e:
            err = f"{type(e).__name__}: {e}"
        runs[kind] = (s, table, err)
        if out_dir is not None and s:
            from host.serving.rundir import write_json
            d = Path(out_dir) / "runs" / wname / system / kind
            d.mkdir(parents=True, exist_ok=True)
            write_json(d / "summary.json", {k: v for k, v in s.items() if not k.startswith("_")})
    s, table, err = runs["served"]
    status, reason = _status(s, err)
    ms, _, merr = runs["matched"]
    mstatus, mreason = _status(ms, merr)
    row.update(status=status, reason=reason)
    offline = bool(np.all(w.arrival_s == w.arrival_s[0]))
    row["slo"] = (f"TPOT<={grid.slo_tpot_ms:g}ms" + ("" if offline else f", TTFT<={grid.slo_ttft_s:g}s"))
    row["lora_cost"] = "modelled" if host == "plora" else "not modelled (the L3 host has no LoRA path)"
    if status != "failed":
        gp, att = M.goodput(table, _num(s.get("makespan_s")), slo_ttft_s=grid.slo_ttft_s,
                            slo_tpot_ms=grid.slo_tpot_ms, check_ttft=not offline)
        thr = _num(s.get("throughput_tok_s"))
        row.update(finished=int(s.get("finished", 0)),
                   tpot_ms_mean=_num(s.get("tpot_ms_mean")), tpot_ms_p99=_num(s.get("tpot_ms_p99")),
                   tbt_ms_p99=_num(s.get("tbt_ms_p99")), ttft_s_mean=_num(s.get("ttft_s_mean")),
                   ttft_s_p99=_num(s.get("ttft_s_p99")), mean_batch=_num(s.get("mean_batch")),
                   throughput_tok_s=thr, goodput_tok_s=gp, slo_attainment=att,
                   gpu_mem_gb=_num(s.get("_gpu_mem_gb")), added_memory_gb=_num(s.get("_added_memory_gb")),
                   cost_usd_per_mtok=M.cost_per_mtok(gp if gp > 0 else float("nan"), s.get("_added_memory_gb", 0.0),
                                                     gpu_usd_per_hour=grid.gpu_usd_per_hour, n_gpus=N_GPUS),
                   cost_usd_per_mtok_served=M.cost_per_mtok(thr, s.get("_added_memory_gb", 0.0),
                                                            gpu_usd_per_hour=grid.gpu_usd_per_hour, n_gpus=N_GPUS))
        links = s.get("_links")
        if links is None:
            row["link_traffic"] = M.NOT_REPORTED
            row["link_gb_max"] = float("nan")
        elif not links:
            row["link_traffic"] = "no link column in this run's iterations"
            row["link_gb_max"] = float("nan")
        else:
            row["link_traffic"] = "; ".join(f"{k}: {v['gb']:.4g} GB moved" if "gb" in v else
                                            f"{k}: busy {v['busy_s']:.4g} s, <= {v['gb_max']:.4g} GB"
                                            for k, v in links.items())
            row["link_gb_max"] = float(sum(v.get("gb", v.get("gb_max", 0.0)) for v in links.values()))
        e = s.get("energy_per_token_mj")
        row["energy_per_token_mj"] = _num(e) if e is not None else M.NOT_REPORTED
    if mstatus != "failed":
        row.update(tpot_ms_matched=_num(ms.get("tpot_ms_mean")), batch_matched=_num(ms.get("mean_batch")),
                   matched_status=mstatus)
    else:
        row.update(matched_status=f"failed: {mreason}")
    row["matched_batch_target"] = grid.matched_batch
    row["wall_s"] = time.perf_counter() - t0
    return row


def run_grid(grid: Grid, out_dir, *, progress=None) -> dict:
    """Run ``grid``; returns {"rows": [...], "setup": {...}, "workloads": {...}} (and writes workloads and model
    files under ``out_dir``)."""
    from host.models.hf import load_hf_config
    out = Path(out_dir)
    model_path = write_model(out)
    model = load_hf_config(model_path)
    setup = l3_budget_setup(model)
    rows, wdesc = [], {}
    for wname in grid.workloads:
        w = build(wname, n_requests=grid.requests, seed=grid.seed, rate_per_s=grid.rate_per_s)
        trace_path = write_trace(w, out / "workloads" / f"{wname}.csv")
        wdesc[wname] = describe(w)
        for system in grid.systems:
            row = run_point(grid, wname, w, system, model, model_path, trace_path, setup, out_dir=out)
            rows.append(row)
            if progress:
                progress(row)
    for i, r in enumerate(rows):
        r["row"] = f"R{i + 1:02d}"
    from host.plora.ndp_model import PLORA_DEVICE
    setup_desc = {
        "gpu_budget": f"{N_GPUS} x NVIDIA H100 SXM 80 GB (host.models.hardware '{GPU}') at every point",
        "model": f"{model.name} (Hugging Face meta-llama/Llama-3.1-8B config.json; BF16)",
        "plora_pool": f"4 x {PLORA_DEVICE.capacity_gb:g} GB PLoRA devices on CXL 3.1 (PLoRA VII-A)",
        "l3_host": {k: v for k, v in setup.describe().items() if k not in ("model",)},
        "matched_batch": grid.matched_batch, "requests_per_workload": grid.requests, "seed": grid.seed,
        "rate_per_s": grid.rate_per_s, "slo": {"ttft_s": grid.slo_ttft_s, "tpot_ms": grid.slo_tpot_ms},
        "gpu_usd_per_hour": grid.gpu_usd_per_hour, "sources": M.SOURCES,
    }
    return {"rows": rows, "setup": setup_desc, "workloads": wdesc}
