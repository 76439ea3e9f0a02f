"""One end-to-end run: the tiny model's requests served by the hybrid system on a backend, and its checks.

:func:`run_e2e` builds everything from ``(model size, seed)`` -- weights, adapters, prompts, the devices on the
chosen backend, the calibrated timing models -- runs the serving engine with :class:`host.e2e.hybrid.HybridSystem`
and returns an :class:`E2ERun` (the engine's output, the system with its per-step records, every request's
tokens and logits). :func:`compare_logits` checks two runs bit for bit; :func:`reference_check` compares a run's
tokens and logits with the float32 reference; :func:`perf_error` compares measured device cycles with the
performance model's.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from host.serving import Request, run as engine_run, EngineConfig
from .model import get_tiny, make_weights, make_adapters
from .ndp import NDPDevices, e2e_ndp_config
from .pim import PIMDevice
from .perf import NDPTiming, load_calibration

__all__ = ["E2EConfig", "E2ERun", "run_e2e", "make_requests", "compare_logits", "reference_check", "perf_error",
           "PIM_CALIBRATION", "pim_model_for"]

PIM_CALIBRATION = Path(__file__).resolve().parents[2] / "data" / "e2e_pim_calibration.json"


@dataclass(frozen=True)
class E2EConfig:
    """What a run is made of. ``requests``: how many (the last ``long_requests`` of them long); ``tokens``:
    output tokens each; ``short_prompt``: (min, max) prompt lengths of the short ones; ``long_context``: prompt
    length of the long ones (their decode attention runs on the DIMM-PIM); ``budget_kb``: HBM for adapter caches
    and KV duplicates; ``n_adapters``: adapters stored (request ``i`` uses adapter ``i mod n_adapters``)."""
    model: str = "tiny"
    requests: int = 5
    long_requests: int = 1
    tokens: int = 16
    short_prompt: tuple = (24, 64)
    long_context: int = 1024
    n_adapters: int = 8
    n_dev: int = 2
    budget_kb: float = 400.0
    pim_bank_groups: int = 4
    seed: int = 0
    select_every_step: bool = True
    #: the NDP devices' memory in the RTL: ``burst`` (a fixed-latency burst memory) or ``lpddr5x`` (``ndp_channels``
    #: LPDDR5X-8533 channels with their controllers and DRAM models: sim.cxl.devmem_system); each has its own
    #: calibration of the perf backend
    ndp_memory: str = "burst"
    ndp_channels: int = 2

    def __post_init__(self):
        if self.requests < 1 or not 0 <= self.long_requests <= self.requests:
            raise ValueError(f"requests must be >= 1 and 0 <= long_requests <= requests, got {self.requests}, "
                             f"{self.long_requests}")
        if self.tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {self.tokens}")
        if self.n_dev < 1:
            raise ValueError(f"n_dev must be >= 1, got {self.n_dev}")
        if self.ndp_memory not in ("burst", "lpddr5x"):
            raise ValueError(f"ndp_memory must be 'burst' or 'lpddr5x', got {self.ndp_memory!r}")
        if self.ndp_channels not in (1, 2, 4, 8):
            raise ValueError(f"ndp_channels must be 1, 2, 4 or 8, got {self.ndp_channels!r}")


def make_requests(cfg: E2EConfig, vocab: int) -> tuple:
    """``(requests, prompts)``: all arrive at t = 0, request ``i`` on adapter ``i mod n_adapters``; prompts are
    seeded random token ids."""
    rng = np.random.default_rng([cfg.seed, 0x5EED])
    reqs, prompts = [], {}
    n_short = cfg.requests - cfg.long_requests
    lo, hi = cfg.short_prompt
    for i in range(cfg.requests):
        n = int(rng.integers(lo, hi + 1)) if i < n_short else cfg.long_context
        prompts[i] = rng.integers(0, vocab, n).tolist()
        reqs.append(Request(id=i, arrival_s=0.0, prompt_tokens=n, output_tokens=cfg.tokens,
                            adapter_id=i % cfg.n_adapters))
    return reqs, prompts


def config_fields(config) -> dict:
    """A configuration's fields, flattened (``dram.org.rows``: 64), names excluded: what a calibration records so
    that it is used only for the configuration it measured."""
    from dataclasses import asdict

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            elif k != "name":
                out[f"{prefix}{k}"] = v
        return out
    return flat(asdict(config))


def same_config(stored: dict, config) -> bool:
    """The stored fields equal the configuration's (fields added to the configuration class later are not
    compared: they did not exist when the calibration was measured)."""
    now = config_fields(config)
    return bool(stored) and all(now.get(k, v) == v for k, v in stored.items())


def pim_model_for(config):
    """The PIM performance model of ``config`` with its measured ``fixed_cycles`` (data/e2e_pim_calibration.json,
    written by ``ndpim e2e calibrate``)."""
    from sim.perf.pim import PIMPerfModel
    table = json.loads(PIM_CALIBRATION.read_text()) if PIM_CALIBRATION.exists() else {}
    ent = table.get(config.name)
    if ent is None or not same_config(ent.get("config", {}), config):
        what = "no calibration" if ent is None else "a calibration of another configuration"
        raise FileNotFoundError(f"{PIM_CALIBRATION}: {what} for PIM config {config.name!r}; run `ndpim e2e "
                                f"calibrate --what pim` with the run's options (measures it on the RTL)")
    return PIMPerfModel(config, fixed_cycles=int(ent["fixed_cycles"]))


@dataclass
class E2ERun:
    config: E2EConfig
    backend: str
    output: object                 # host.serving RunOutput
    system: object                 # HybridSystem
    wall_s: float
    tokens: dict = field(default_factory=dict)      # request id -> generated token ids
    logits: dict = field(default_factory=dict)      # request id -> (n, vocab) float32

    def write(self, out_dir) -> Path:
        """The run directory (config.json, requests.csv, iterations.csv, summary.json, trace.json) plus
        steps.json (the per-step table), tokens.json and descriptors.csv (every descriptor's issue / start /
        completion cycle, relative to its wave run's first issue)."""
        out = Path(out_dir)
        self.output.write(out, extra_config={"e2e": self.config.__dict__, "backend": self.backend})
        steps = [s.__dict__ for s in self.system.steps]
        (out / "steps.json").write_text(json.dumps(steps, indent=1, default=_jsonable) + "\n")
        (out / "tokens.json").write_text(json.dumps({str(k): v for k, v in self.tokens.items()}) + "\n")
        with open(out / "descriptors.csv", "w") as f:          # per-descriptor cycle stamps of every wave run
            f.write("iteration,layer,stage,device,job,op,issue_cycle,start_cycle,done_cycle\n")
            for it, layer, stage, dev, job, op, i, st, dn in self.system.descriptor_log:
                f.write(f"{it},{layer},{stage},{dev},\"{' '.join(map(str, job))}\",{op},{i},{st},{dn}\n")
        return out


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def _devices(cfg, backend, engine, tiny, reqs, pim_backend=None, ndp_engine=None):
    ndp_cfg = e2e_ndp_config()
    timing = NDPTiming(ndp_cfg, load_calibration(memory=cfg.ndp_memory, channels=cfg.ndp_channels))
    ndp = NDPDevices(backend, cfg.n_dev, engine=ndp_engine or engine, config=ndp_cfg, perf=timing,
                     memory=cfg.ndp_memory, channels=cfg.ndp_channels)
    longs = [r for r in reqs if r.prompt_tokens + r.output_tokens >= cfg.long_context] if cfg.long_requests else []
    max_tokens = max([r.prompt_tokens + r.output_tokens for r in longs], default=64)
    max_tokens = -(-max_tokens // 16) * 16
    slots = max(1, len(longs) * tiny.n_layers * tiny.n_heads)
    pim = PIMDevice(pim_backend or backend, head_dim=tiny.head_dim, slots=slots, max_tokens=max_tokens, engine=engine,
                    bank_groups=cfg.pim_bank_groups)
    pim.perf = pim_model_for(pim.config) if longs else None      # no PIM work without long requests
    return ndp, pim, timing


def run_e2e(cfg: E2EConfig = E2EConfig(), backend: str = "golden", *, engine: str = "verilator",
            final_kv=None, capture: bool = False, pim_backend: str | None = None,
            ndp_engine: str | None = None, check_beside: bool = False) -> E2ERun:
    """Serve ``cfg``'s requests on ``backend`` (``rtl``, ``golden`` or ``perf``). On ``rtl`` the PIM image holds
    ``final_kv`` (slot -> (K, V): the golden run's, see :mod:`host.e2e.pim`; computed here when None);
    ``ndp_engine``: the NDP devices' simulator when not ``engine`` (:func:`host.e2e.ndp._engine`'s names);
    ``check_beside``: check the LPDDR5X channels' command traces in a process of its own beside the run
    (:attr:`host.e2e.ndp.NDPDevices.check_beside`; a spawned process: the calling script needs the
    ``if __name__ == "__main__":`` guard); problems are raised all the same, at the latest when the run ends."""
    from .hybrid import HybridSystem
    t0 = time.perf_counter()
    tiny = get_tiny(cfg.model)
    weights = make_weights(tiny, cfg.seed)
    adapters = make_adapters(tiny, cfg.n_adapters, cfg.seed)
    reqs, prompts = make_requests(cfg, tiny.vocab)
    ndp, pim, timing = _devices(cfg, backend, engine, tiny, reqs, pim_backend, ndp_engine)
    if cfg.long_requests:
        pim.check_buildable()
    if pim.backend == "rtl" and cfg.long_requests and not pim.fast():
        if final_kv is None:
            final_kv = golden_final_kv(cfg)
        pim.set_final_kv(final_kv)
    system = HybridSystem(weights=weights, adapters=adapters, prompts=prompts, ndp=ndp, pim=pim, ndp_timing=timing,
                          pim_model=pim.perf, budget_bytes=cfg.budget_kb * 1024,
                          pim_min_context=cfg.long_context if cfg.long_requests else 1 << 60, seed=cfg.seed,
                          select_every_step=cfg.select_every_step)
    system.capture = capture
    ndp.check_beside = check_beside and backend == "rtl"
    try:
        out = engine_run(reqs, system, EngineConfig(fuse_decode=False))
    except BaseException:
        ndp.finish(raise_problems=False)
        raise
    ndp.finish()
    run = E2ERun(cfg, backend, out, system, time.perf_counter() - t0)
    for r in system.reqs:                    # the perf backend computes no data: no tokens, no logits
        run.tokens[r.rid] = r.tokens[r.prompt_len:] if backend != "perf" else None
        run.logits[r.rid] = np.array(r.logits, np.float32) if backend != "perf" else None
    return run


def golden_final_kv(cfg: E2EConfig) -> dict:
    """The PIM-resident requests' final K, V per PIM slot, from a golden run of ``cfg``."""
    g = run_e2e(cfg, "golden")
    return final_kv_of(g)


def final_kv_of(run: E2ERun) -> dict:
    sys_ = run.system
    cfg = sys_.cfg
    out = {}
    for r in sys_.reqs:
        if r.slot0 is None:
            continue
        for layer in range(cfg.n_layers):
            for h in range(cfg.n_heads):
                sl = slice(h * cfg.head_dim, (h + 1) * cfg.head_dim)
                out[r.slot0 + layer * cfg.n_heads + h] = (r.K[layer][:r.n_kv, sl].copy(),
                                                          r.V[layer][:r.n_kv, sl].copy())
    return out


def compare_logits(a: E2ERun, b: E2ERun) -> dict:
    """Bit-level comparison of two runs' logits (float32 bits) and tokens."""
    diff, total, first = 0, 0, None
    for rid in a.logits:
        la, lb = a.logits[rid], b.logits.get(rid)
        if lb is None or la.shape != lb.shape:
            return {"equal": False, "reason": f"request {rid}: {la.shape} vs {None if lb is None else lb.shape}"}
        ne = np.flatnonzero(np.any(la.view(np.uint32) != lb.view(np.uint32), axis=1))
        diff += len(ne)
        total += len(la)
        if len(ne) and first is None:
            first = (rid, int(ne[0]))
    tokens_equal = all(a.tokens[r] == b.tokens.get(r) for r in a.tokens)
    return {"equal": diff == 0 and tokens_equal, "rows": total, "rows_differing": diff, "first_difference": first,
            "tokens_equal": tokens_equal}


def reference_check(run: E2ERun) -> dict:
    """The run's tokens and logits against the float32 reference (teacher-forced along the run's tokens)."""
    from .reference import teacher_forced_logits, compare_logits as cmp, greedy_f32
    sys_ = run.system
    per = {}
    agree_all = True
    for r in sys_.reqs:
        ad = sys_.adapters[r.adapter]
        ref = teacher_forced_logits(sys_.w, ad, r.tokens[:-1], r.prompt_len)
        acc = cmp(run.logits[r.rid], ref)
        greedy = greedy_f32(sys_.w, ad, r.tokens[:r.prompt_len], len(r.tokens) - r.prompt_len) \
            if len(r.tokens) - r.prompt_len <= 64 else None
        same = greedy == run.tokens[r.rid] if greedy is not None else None
        agree_all &= bool(same)
        first_div = None
        if greedy is not None and not same:
            first_div = next(k for k, (x, y) in enumerate(zip(greedy, run.tokens[r.rid])) if x != y)
        per[r.rid] = {**acc, "tokens_match": same, "first_divergence": first_div}
    return {"tokens_match": agree_all, "requests": per,
            "max_rel_err": max(p["rel_err"] for p in per.values()),
            "top1_agree": float(np.mean([p["top1_agree"] for p in per.values()]))}


def perf_error(run: E2ERun) -> dict:
    """Measured (rtl) vs model device cycles of the run: per NDP wave run and device, per PIM launch batch, and
    the totals."""
    sys_ = run.system
    w = np.array([(c, p) for *_, c, p in sys_.wave_log], float).reshape(-1, 2)
    pm = np.array([(c, p) for *_, c, p, _ in sys_.pim_log], float).reshape(-1, 2)
    out = {}
    backends = {"ndp": sys_.ndp.backend, "pim": sys_.pim.backend}
    for name, arr in (("ndp", w), ("pim", pm)):
        if backends[name] != "rtl":
            continue
        if len(arr) and arr[:, 0].sum() > 0:
            rel = (arr[:, 1] - arr[:, 0]) / arr[:, 0]
            out[name] = {"waves": int(len(arr)), "total_rtl": float(arr[:, 0].sum()),
                         "total_model": float(arr[:, 1].sum()),
                         "total_rel_err": float((arr[:, 1].sum() - arr[:, 0].sum()) / arr[:, 0].sum()),
                         "max_abs_rel_err": float(np.abs(rel).max()), "mean_abs_rel_err": float(np.abs(rel).mean())}
    return out
