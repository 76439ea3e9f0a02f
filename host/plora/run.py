"""One PLoRA-study run from a flat, JSON-able spec: build the workload and the system, run the engine, write
the run directory. Sweeps map :func:`run_point` over specs through ``host.sweep``'s executor."""

import time
from dataclasses import dataclass, asdict, field, replace
from pathlib import Path

import numpy as np

from .config import (VARIANTS, SYSTEM_NAMES, ALL_SYSTEMS, default_link_name, DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS)
from .lora import STRATEGIES

__all__ = ["RunSpec", "MODELS", "WORKLOADS", "build_workload", "build_system", "run_spec", "run_point",
           "SUMMARY_KEYS", "load_model", "resolve", "inputs_record"]

#: The models and workloads the PLoRA study runs (names of ``host.models`` and ``host.workloads``).
MODELS = ("llama2-7b", "llama2-13b", "llama3-8b", "qwen3-30b-a3b")
WORKLOADS = ("uniform", "skewed", "uniform-long", "skewed-long", "powerlaw", "trace")
SUMMARY_KEYS = ("tpot_ms_mean", "tpot_ms_p99", "ttft_s_mean", "throughput_tok_s", "kv_dup_fraction")


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything a run depends on (goes into config.json; ``run_spec(spec)`` reproduces the run).

    ``link_gbps`` / ``link_latency_ns``: override the system's link bandwidth (per direction) and its *one-way*
    latency (the round trip L_link is twice it); ``devices``: device count (``None``: the system's default;
    ``0``: the fewest PLoRA devices that hold the run's adapters, at least the default; Grace-Hopper keeps its
    one Grace memory); ``n_requests`` / ``rate_per_s`` /
    ``arrival``: the workload's size and arrivals (``"gamma"`` at ``rate_per_s`` with ``cv``, or ``"burst"``:
    all at t = 0); ``ndp_tflops`` / ``device_bw_gbps`` / ``buffers`` / ``buffer_mb``: device sensitivity knobs
    (stand-in model); ``max_batch`` / ``max_tokens``: the batcher; ``concurrency``: closed loop with that many
    clients (each sends its next request when its previous one finishes; the arrival process is ignored);
    ``fixed_batch``: closed loop with ``fixed_batch`` clients and the batch capped at ``fixed_batch`` (every
    system decodes at the same batch: TPOT at matched batch).

    The user's own inputs (docs/inputs.md): ``trace_file``: a CSV / JSONL request trace (``workload`` is then
    ``"file"``; ``n_requests`` None takes every request; ``rate_per_s`` None keeps its arrivals as given, a rate
    rescales them); ``model_config``: a Hugging Face config.json (``model`` is then the name the run gives it);
    ``hardware``: ``(("section.field", value), ...)`` from a TOML file (``hardware_file``, recorded) and
    ``--set``, replacing fields of the run's GPU, link and NDP device (host.models.hardware_file)."""

    model: str = "llama2-7b"
    workload: str = "uniform"
    system: str = "plora"
    link_gbps: float | None = None
    link_latency_ns: float | None = None
    devices: int | None = None
    seed: int = 0
    n_requests: int = 1000
    rate_per_s: float = 10.0
    cv: float = 1.0
    arrival: str = "gamma"
    output_tokens: int | None = None
    kv_bits: int = 16
    ndp: str = "auto"
    ndp_tflops: float | None = None
    device_bw_gbps: float | None = None
    buffers: int | None = None
    buffer_mb: float | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    max_tokens: int = DEFAULT_MAX_TOKENS
    lora_waves_per_layer: int = 1
    concurrency: int | None = None
    fixed_batch: int | None = None
    trace_file: str | None = None
    model_config: str | None = None
    hardware: tuple = ()
    hardware_file: str | None = None
    tag: str = ""

    def __post_init__(self):
        from host.models import MODELS as ALL_MODELS
        if self.model_config is None and self.model not in ALL_MODELS:
            raise ValueError(f"unknown model {self.model!r}; allowed: {sorted(ALL_MODELS)}")
        if self.trace_file is not None:
            if self.workload != "file":
                raise ValueError(f"a trace file is workload 'file', got workload {self.workload!r}")
        elif self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; allowed: {list(WORKLOADS)}")
        elif self.rate_per_s is None or self.n_requests is None:
            raise ValueError("rate_per_s and n_requests may be None only with a trace file")
        if self.system not in ALL_SYSTEMS:
            raise ValueError(f"unknown system {self.system!r}; allowed: {list(ALL_SYSTEMS)}")
        checks = [("link_gbps", self.link_gbps, 0.0, False), ("link_latency_ns", self.link_latency_ns, 0.0, True),
                  ("ndp_tflops", self.ndp_tflops, 0.0, False), ("device_bw_gbps", self.device_bw_gbps, 0.0, False),
                  ("buffer_mb", self.buffer_mb, 0.0, False), ("rate_per_s", self.rate_per_s, 0.0, False),
                  ("cv", self.cv, 0.0, False)]
        for name, v, lo, incl in checks:
            if v is not None and not (np.isfinite(v) and (v >= lo if incl else v > lo)):
                raise ValueError(f"{name} must be {'>=' if incl else '>'} {lo}, got {v!r}")
        if self.devices is not None and not (0 <= self.devices <= 4096):
            raise ValueError(f"devices must be in 1..4096 (or 0 for automatic), got {self.devices}")
        if self.buffers is not None and not 1 <= self.buffers <= 64:
            raise ValueError(f"buffers must be in 1..64, got {self.buffers}")
        if self.n_requests is not None and self.n_requests < 1:
            raise ValueError(f"n_requests must be >= 1, got {self.n_requests}")
        if self.arrival not in ("gamma", "burst"):
            raise ValueError(f"arrival must be 'gamma' or 'burst', got {self.arrival!r}")
        if self.kv_bits not in (16, 8, 4):
            raise ValueError(f"kv_bits must be 16, 8 or 4, got {self.kv_bits}")
        for name in ("concurrency", "fixed_batch"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 100_000):
                raise ValueError(f"{name} must be an int in 1..100000 (or None), got {v!r}")
        if self.concurrency is not None and self.fixed_batch is not None:
            raise ValueError("give concurrency (closed loop) or fixed_batch (closed loop at the batch cap), not both")
        if self.output_tokens is not None and self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")
        self._check_hardware()

    def _check_hardware(self):
        from host.models.hardware_file import FIELDS, SECTIONS, as_dict
        pairs = tuple((str(k), v) for k, v in self.hardware or ())     # (config.json gives lists back)
        object.__setattr__(self, "hardware", tuple(sorted(pairs)))
        for key, v in pairs:
            section, _, name = key.partition(".")
            if section not in SECTIONS["plora"] or name not in FIELDS[section]:
                raise ValueError(f"hardware: no field {key} on a PLoRA run; sections: {list(SECTIONS['plora'])}")
            FIELDS[section][name].check(v, v)
        hw = as_dict(pairs)
        twice = [(flag, key) for flag, v, key in
                 (("link_gbps (--link-gbps)", self.link_gbps, "link.bw_gbps"),
                  ("link_latency_ns (--link-latency-ns)", self.link_latency_ns, "link.rtt_ns"),
                  ("device_bw_gbps", self.device_bw_gbps, "ndp.internal_bw_gbps"),
                  ("ndp_tflops", self.ndp_tflops, "ndp.macs"), ("buffers", self.buffers, "ndp.buffers"),
                  ("buffer_mb", self.buffer_mb, "ndp.dram_buffer_bytes"))
                 if v is not None and key.split(".")[1] in hw.get(key.split(".")[0], {})]
        if twice:
            flag, key = twice[0]
            raise ValueError(f"{flag} and hardware {key} both set the same parameter; give one")
        if hw.get("ndp") and self.system not in VARIANTS:
            raise ValueError(f"hardware [ndp]: system {self.system} has no NDP memory device (the PLoRA family has)")

    def hardware_values(self) -> dict:
        from host.models.hardware_file import as_dict
        return as_dict(self.hardware)

    def with_(self, **kw) -> "RunSpec":
        return replace(self, **kw)


def load_model(spec: RunSpec):
    """The LLMConfig of ``spec``: the preset, or the Hugging Face config.json of ``model_config``."""
    if spec.model_config is not None:
        from host.models.hf import load_hf_config
        return load_hf_config(spec.model_config, name=spec.model)
    from host.models import get_model
    return get_model(spec.model)


def build_workload(spec: RunSpec):
    from host.workloads import plora_workload, lmsys_substitute, load_trace_file
    if spec.trace_file is not None:
        model = load_model(spec)
        w = load_trace_file(spec.trace_file, max_context=model.max_context, n_requests=spec.n_requests,
                            rate_per_s=spec.rate_per_s, seed=spec.seed,
                            context_source=f"{model.name}'s context (max_position_embeddings)")
    elif spec.workload == "trace":
        w = lmsys_substitute(n_requests=spec.n_requests, rate_per_s=spec.rate_per_s, cv=spec.cv, seed=spec.seed)
    else:
        w = plora_workload(spec.workload, n_requests=spec.n_requests, rate_per_s=spec.rate_per_s, cv=spec.cv,
                           seed=spec.seed)
    if spec.arrival == "burst":
        w.arrival_s = np.zeros(len(w))
        w.params = {**w.params, "arrival": "burst"}
    if spec.output_tokens is not None:
        w.output_tokens = np.full(len(w), spec.output_tokens, np.int64)
        w.params = {**w.params, "output_tokens": spec.output_tokens}
    return w


def _device(spec: RunSpec, base):
    from host.models.hardware_file import apply
    base = apply(base, spec.hardware_values().get("ndp"))
    kw = {}
    if spec.ndp_tflops is not None:
        kw["tflops"] = spec.ndp_tflops
    if spec.device_bw_gbps is not None:
        kw["bw_gbps"] = spec.device_bw_gbps
    if spec.buffers is not None:
        kw["buffers"] = spec.buffers
    if spec.buffer_mb is not None:
        kw["buffer_bytes"] = int(round(spec.buffer_mb * (1 << 20) / 128)) * 128
    return base.scaled(**kw) if kw else base


def _link(spec: RunSpec):
    from host.link import get_link
    link = get_link(default_link_name(spec.system))
    hw = spec.hardware_values().get("link")
    if hw:
        link = link.with_(bw_gbps=hw.get("bw_gbps"), rtt_ns=hw.get("rtt_ns"))
    rtt = None if spec.link_latency_ns is None else 2.0 * spec.link_latency_ns
    if spec.link_gbps is not None or rtt is not None:
        link = link.with_(bw_gbps=spec.link_gbps, rtt_ns=rtt)
    return link


def _auto_devices(spec, model, workload, device, default):
    from .lora import adapter_bytes
    from .system import shape_of
    shape = shape_of(model)
    ids = np.unique(workload.adapter_id)
    ranks = dict(zip(workload.adapter_id.tolist(), np.asarray(workload.extra["rank"]).tolist()))
    store = sum(adapter_bytes(shape, int(ranks[a])) for a in ids.tolist())
    return max(default, int(np.ceil(store / (0.95 * device.capacity_bytes))))


def _gpu(spec: RunSpec):
    """The run's GPU: the H100 of PLoRA VII-A, with the hardware [gpu] fields."""
    from host.models.hardware import H100_SXM_80GB
    from host.models.hardware_file import apply_gpu
    return apply_gpu(H100_SXM_80GB, spec.hardware_values().get("gpu"))


def resolve(spec: RunSpec) -> dict:
    """What ``spec`` runs on, checked without running (the command line calls it before making the run
    directory): the model, the GPU, the link and the memory device; raises ValueError naming the problem."""
    model = load_model(spec)
    gpu, link = _gpu(spec), _link(spec)
    device = None
    if spec.system in VARIANTS:
        v = VARIANTS[spec.system]
        device = _device(spec, v.device)
        if spec.ndp != "standin" and v.uses_ndp and device.name == "plora":
            device.ndp_config()          # the calibrated model's geometry (errors name the field)
    return {"model": model, "gpu": gpu, "link": link, "device": device}


def inputs_record(spec: RunSpec) -> dict:
    """What config.json records of the user's files: path and content hash, and what was taken from each."""
    from host.workloads.trace_file import file_digest
    rec = {}
    if spec.trace_file is not None:
        rec["trace_file"] = {"path": spec.trace_file, "sha256": file_digest(spec.trace_file),
                             "arrivals": "as given" if spec.rate_per_s is None else
                             f"rescaled to {spec.rate_per_s:g} requests/s"}
    if spec.model_config is not None:
        m = load_model(spec)
        rec["model_config"] = {"path": spec.model_config, "sha256": file_digest(spec.model_config),
                               "model": {k: v for k, v in asdict(m).items() if k != "sources"}}
    if spec.hardware_file is not None or spec.hardware:
        rec["hardware"] = {"path": spec.hardware_file,
                           "sha256": None if spec.hardware_file is None else file_digest(spec.hardware_file),
                           "values": spec.hardware_values()}
    return rec


def build_system(spec: RunSpec, workload=None):
    """The system of ``spec`` (and the device count it resolved)."""
    from .system import PLoRASystem
    from .baselines import SLoRASystem, CPULoRAOffloadSystem
    model = load_model(spec)
    link = _link(spec)
    common = dict(gpu=_gpu(spec), link=link, kv_bits=spec.kv_bits, seed=spec.seed,
                  max_batch=spec.fixed_batch or spec.max_batch, max_tokens=spec.max_tokens)
    if spec.system in VARIANTS:
        v = VARIANTS[spec.system]
        device = _device(spec, v.device)
        n_dev = v.n_dev if spec.devices is None else spec.devices
        if n_dev == 0 and v.device.name != "plora":
            n_dev = v.n_dev                # only a pool of PLoRA devices grows (Grace memory is one chip's)
        if n_dev == 0:
            n_dev = _auto_devices(spec, model, workload if workload is not None else build_workload(spec), device,
                                  v.n_dev)
        return PLoRASystem(model, v, n_dev=n_dev, device=device, ndp=spec.ndp,
                           lora_waves_per_layer=spec.lora_waves_per_layer, **common)
    if spec.system in ("cpu-lora-offload", "cpu-lora-offload-cached"):
        return CPULoRAOffloadSystem(model, cache=spec.system.endswith("-cached"), **common)
    n_gpus = {"s-lora": 1, "s-lora-2gpu": 2, "s-lora-4gpu": 4, "s-lora-prefetch": 1}[spec.system]
    return SLoRASystem(model, n_gpus=n_gpus, prefetch=spec.system.endswith("-prefetch"), **common)


def _regime(out, system) -> dict:
    """The run's load regime (host/plora/pressure.py) and its evictions."""
    from .pressure import serving_pressure
    model = system.model
    kv_tok = model.kv_bytes_per_token(1, system.kv_bits / 8.0)
    r = serving_pressure(out.table, system.shape, system.ranks, hbm_bytes=system.gpu.hbm_gb * 1e9,
                         weight_bytes=float(model.weight_bytes(1)), kv_bytes_per_token=kv_tok)
    ev = out.summary.get("strategy_counts", {}).get("evictions")
    r["evictions"] = int(sum(ev.values())) if isinstance(ev, dict) else 0
    return r


def run_spec(spec: RunSpec, *, out_dir=None, engine_config=None, iterations: str = "all"):
    """Run ``spec``; write the run directory to ``out_dir`` if given (``iterations``: what its iterations.csv
    holds, host.serving.rundir.ITERATIONS). Returns the engine's RunOutput."""
    from host.serving import Engine, EngineConfig
    w = build_workload(spec)
    system = build_system(spec, w)
    cfg = engine_config or EngineConfig(trace=out_dir is not None, record_iterations=True)
    if hasattr(system, "emit_spans"):
        system.emit_spans = bool(cfg.trace)        # no trace: the timeline builds no spans
    closed = spec.fixed_batch or spec.concurrency
    if closed is not None:
        from dataclasses import replace as _replace
        cfg = _replace(cfg, concurrency=int(closed))
    out = Engine(system, cfg).run(w)
    out.summary.update(_regime(out, system))
    out.summary["link"] = {"gbps": float(system.link.bw_gbps), "rtt_ns": float(system.link.rtt_ns)}
    if hasattr(system, "n_dev"):
        out.summary["devices"] = int(system.n_dev)
    if out_dir is not None:
        extra = {"spec": asdict(spec), "workload": w.describe(), "command": "ndpim plora run"}
        inputs = inputs_record(spec)
        if inputs:
            extra["inputs"] = inputs
        out.write(out_dir, extra_config=extra, iterations=iterations)
    return out


def run_point(spec: RunSpec) -> dict:
    """One sweep point: the spec's fields and the run's main metrics (a flat dict, picklable). Errors are
    recorded in ``error`` (e.g. a pool too small), never raised, so one bad point does not end a sweep."""
    from host.serving import EngineConfig
    t0, c0 = time.perf_counter(), time.process_time()
    row = asdict(spec)
    try:
        out = run_spec(spec, engine_config=EngineConfig(trace=False, record_iterations=False))
    except (ValueError, RuntimeError) as e:
        row.update({k: float("nan") for k in SUMMARY_KEYS}, error=str(e), wall_s=time.perf_counter() - t0,
                   cpu_s=time.process_time() - c0)
        return row
    s = out.summary
    row.update({k: s.get(k, float("nan")) for k in SUMMARY_KEYS})
    row["ndp_model"] = s.get("ndp_model", "none")        # the model that priced the run, never the option's name
    row["ndp_geometry"] = s.get("ndp_geometry", "")      # and the device it priced (channels, lanes x rows)
    for k in ("adapters_touched", "adapter_demand_gb", "hbm_pressure", "hbm_pressure_peak", "hbm_pressure_offered",
              "evictions"):
        row[k] = s.get(k, float("nan"))
    row.update(finished=s["finished"], mean_batch=s["mean_batch"], iterations=s["iterations"],
               devices_used=s.get("devices", np.nan), error="", wall_s=time.perf_counter() - t0,
               cpu_s=time.process_time() - c0)
    for kind, v in s.get("gpu_mem_gb", {}).items():
        row[f"gpu_mem_gb_{kind}"] = v
    err = s.get("cost_model_err")
    if err is not None:                   # PLoRA-family: how far Algorithm 1's estimate was from the timeline
        row["cost_model_err_mean"], row["cost_model_err_p99"] = err["mean"], err["p99_abs"]
    dec = s.get("strategy_counts", {}).get("decisions", {})
    for name in STRATEGIES:
        row[f"decisions_{name}"] = dec.get(name, 0)
    return row
