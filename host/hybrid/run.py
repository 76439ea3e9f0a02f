"""One LLaMA-scale hybrid run from a flat, JSON-able spec (``ndpim hybrid run``; ``host.compare`` calls
:func:`run_spec` by the system name ``hybrid``): build the workload and the system, run the engine, write the run
directory (config.json, summary.json, requests.csv, iterations.csv, trace.json) as the PLoRA and L3 hosts do."""

from dataclasses import dataclass, asdict, replace

import numpy as np

from .decisions import DEFAULT_PIM_MIN_CONTEXT, DEFAULT_BORDERLINE, check_placement_args

__all__ = ["HybridSpec", "MODELS", "WORKLOADS", "L3_TRACES", "SINGLE_MODEL_RANK", "build_workload", "build_system",
           "run_spec", "run_workload", "SUMMARY_KEYS"]

#: Dense models with 128-wide heads (the DIMM-PIM's PAPER geometry, host.l3.config.L3Setup) that PLoRA's study runs.
MODELS = ("llama2-7b", "llama2-13b", "llama3-8b")
#: PLoRA's synthetic workloads (host.workloads.plora_workload) and L3 Table 4's traces (host.l3.traces.generate).
PLORA_WORKLOADS = ("uniform", "skewed", "uniform-long", "skewed-long", "powerlaw")
L3_TRACES = ("openr1", "dolphin", "openthoughts", "longbench")
WORKLOADS = PLORA_WORKLOADS + L3_TRACES
#: One model, no adapters (an L3 trace): every request is adapter 0 at PLoRA VII-A's smallest rank, 8 (the least
#: LoRA work; the PLoRA memory manager has no adapter-free path). The same choice as ``ndpim compare``'s reasoning.
SINGLE_MODEL_RANK = 8
SUMMARY_KEYS = ("throughput_tok_s", "tpot_ms_mean", "tbt_ms_mean", "tbt_ms_p99", "ttft_s_mean", "mean_batch")


@dataclass(frozen=True, kw_only=True)
class HybridSpec:
    """Everything a hybrid run depends on (config.json's ``spec``). ``workload``: one of :data:`WORKLOADS`, or
    ``"file"`` with ``trace_file`` (host.workloads.trace_file: CSV / JSONL; ``n_requests`` None takes every
    request, ``rate_per_s`` None keeps its arrivals); ``devices``: CXL devices (None: PLoRA's four); ``link_gbps``:
    their CXL link per direction (None: CXL 3.1's 128 GB/s);
    ``ranksets`` / ``host_memory_gb``: the DIMM-PIM host memory (None: L3 Table 2's); ``arrival``: ``gamma`` at
    ``rate_per_s`` (PLoRA's workloads) or ``burst`` (all at t = 0; L3's traces always are)."""

    model: str = "llama2-7b"
    workload: str = "skewed"
    trace_file: str | None = None
    n_requests: int | None = 100
    rate_per_s: float | None = 10.0
    arrival: str = "gamma"
    seed: int = 0
    devices: int | None = None
    link_gbps: float | None = None
    ranksets: int | None = None
    host_memory_gb: float | None = None
    ndp: str = "auto"
    pim_min_context: int = DEFAULT_PIM_MIN_CONTEXT
    borderline: float = DEFAULT_BORDERLINE
    max_batch: int | None = None
    profile_batches: int = 384

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"unknown hybrid model {self.model!r}; allowed: {list(MODELS)}")
        if self.trace_file is not None:
            if self.workload != "file":
                raise ValueError(f"a trace file is workload 'file', got workload {self.workload!r}")
        elif self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; allowed: {list(WORKLOADS)} or a trace file")
        elif self.n_requests is None:
            raise ValueError("n_requests may be None only with a trace file")
        if self.n_requests is not None and not 1 <= self.n_requests <= 1_000_000:
            raise ValueError(f"n_requests must be in 1..1000000, got {self.n_requests}")
        if self.rate_per_s is not None and not (np.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            raise ValueError(f"rate_per_s must be > 0, got {self.rate_per_s!r}")
        if self.arrival not in ("gamma", "burst"):
            raise ValueError(f"arrival must be 'gamma' or 'burst', got {self.arrival!r}")
        if self.link_gbps is not None and not (np.isfinite(self.link_gbps) and 0 < self.link_gbps <= 100_000):
            raise ValueError(f"link_gbps must be in (0, 100000] GB/s per direction, got {self.link_gbps!r}")
        if self.devices is not None and not 1 <= self.devices <= 4096:
            raise ValueError(f"devices must be in 1..4096, got {self.devices}")
        if self.ndp not in ("auto", "calibrated", "standin"):
            raise ValueError(f"ndp must be auto, calibrated or standin, got {self.ndp!r}")
        if self.max_batch is not None and not 1 <= self.max_batch <= 100_000:
            raise ValueError(f"max_batch must be in 1..100000, got {self.max_batch}")
        if not 0 <= self.profile_batches <= 100_000:
            raise ValueError(f"profile_batches must be in 0..100000, got {self.profile_batches}")
        check_placement_args(self.pim_min_context, self.borderline)

    def with_(self, **kw) -> "HybridSpec":
        return replace(self, **kw)


def build_workload(spec: HybridSpec):
    from host.models import get_model
    from host.workloads import plora_workload, load_trace_file
    if spec.trace_file is not None:
        model = get_model(spec.model)
        w = load_trace_file(spec.trace_file, max_context=model.max_context, n_requests=spec.n_requests,
                            rate_per_s=spec.rate_per_s, seed=spec.seed,
                            context_source=f"{model.name}'s context (max_position_embeddings)")
    elif spec.workload in L3_TRACES:
        from host.l3.traces import generate
        w = generate(spec.workload, spec.n_requests, spec.seed)
        w.extra = {**w.extra, "rank": np.full(len(w), SINGLE_MODEL_RANK, np.int64)}
        w.notes = list(w.notes) + [f"one model: every request is adapter 0 at rank {SINGLE_MODEL_RANK}"]
    else:
        w = plora_workload(spec.workload, n_requests=spec.n_requests, rate_per_s=spec.rate_per_s or 10.0,
                           seed=spec.seed)
    if spec.arrival == "burst":
        w.arrival_s = np.zeros(len(w))
        w.params = {**w.params, "arrival": "burst"}
    return w


def build_system(spec: HybridSpec):
    from host.models import get_model
    from host.hybrid.system import HybridScaleSystem
    host = None
    if spec.ranksets is not None or spec.host_memory_gb is not None:
        from host.l3.config import L3_HOST_MEMORY
        host = replace(L3_HOST_MEMORY, ranksets=spec.ranksets or L3_HOST_MEMORY.ranksets,
                       capacity_gib=spec.host_memory_gb or L3_HOST_MEMORY.capacity_gib)
    link = None
    if spec.link_gbps is not None:      # the CXL devices' link, as the PLoRA host's --link-gbps
        from host.link import get_link
        link = get_link("cxl3.1").with_(bw_gbps=spec.link_gbps)
    return HybridScaleSystem(get_model(spec.model), n_dev=spec.devices, host=host, link=link, ndp=spec.ndp,
                             seed=spec.seed,
                             pim_min_context=spec.pim_min_context, borderline=spec.borderline,
                             max_batch=spec.max_batch, profile_batches=spec.profile_batches)


def run_spec(spec: HybridSpec, *, out_dir=None, engine_config=None, iterations: str = "auto"):
    """Run ``spec``; write the run directory to ``out_dir`` if given. Returns the engine's RunOutput (its
    ``summary`` has ``rejected_frac``: the fraction of requests not served, 0 for a run that served all)."""
    return run_workload(build_workload(spec), spec, out_dir=out_dir, engine_config=engine_config,
                        iterations=iterations)


def run_workload(w, spec: HybridSpec, *, out_dir=None, engine_config=None, iterations: str = "auto"):
    """Run the hybrid of ``spec`` on the given :class:`host.workloads.Workload` ``w`` (``spec``'s workload fields
    are not used: e.g. a caller's own workload built in memory, with no context limit applied); as
    :func:`run_spec` otherwise."""
    from host.serving import Engine, EngineConfig
    system = build_system(spec)
    cfg = engine_config or EngineConfig(trace=out_dir is not None, record_iterations=True)
    system.emit_spans = bool(cfg.trace)
    out = Engine(system, cfg).run(w)
    s = out.summary
    s["rejected_frac"] = 1.0 - s["finished"] / s["requests"] if s.get("requests") else 0.0
    s["link"] = {"gbps": float(system.link.bw_gbps), "rtt_ns": float(system.link.rtt_ns),
                 "host_link_gbps": float(system.setup.host_link_gbps)}
    s["devices"] = int(system.n_dev)
    if out_dir is not None:
        extra = {"spec": asdict(spec), "workload": w.describe(), "command": "ndpim hybrid run"}
        if w.name != spec.workload and spec.trace_file is None:
            extra["spec"]["workload"] = f"(given: {w.name})"
        if spec.trace_file is not None:
            from host.workloads.trace_file import file_digest
            extra["inputs"] = {"trace_file": {"path": spec.trace_file, "sha256": file_digest(spec.trace_file)}}
        out.write(out_dir, extra_config=extra, iterations=iterations)
    return out
