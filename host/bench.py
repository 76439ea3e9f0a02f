"""``python -m host.bench`` (``make bench-host``): host-model speed and accuracy figures.

Prints and writes build/bench/host.json with:

* the serving engine's speed (after a warm-up run that loads and tabulates the GPU model) on the GPU-only
  reference system (host.serving.GPUSystem): a PLoRA-like run
  (Llama-2-7B on one H100, the ``uniform`` workload, 1,000 requests at 10/s) and an L3-like run (GPT-175B on
  8 A100s with unlimited HBM, the ``openr1`` trace, 1,000 requests), each with fused decode stretches (the
  default) and step by step: wall and CPU seconds, engine steps, iterations, iterations/s;
* the GPU model's held-out error (worst per-operator MAPE over the leave-one-model / leave-one-GPU-out splits);
* the system grids, when their modules exist: ``host.plora.bench.run_grid()`` and ``host.l3.bench.run_grid()``
  (each returns a dict of figures); the wall time of each call is added as ``plora_grid_s`` / ``l3_grid_s``.
"""

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

__all__ = ["engine_speed", "gpu_accuracy", "run_grids", "main"]

GRIDS = (("plora", "host.plora.bench"), ("l3", "host.l3.bench"), ("compare", "host.compare.bench"),
         ("dse", "host.dse.bench"))


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def engine_speed() -> dict:
    from host.models import get_model
    from host.serving import EngineConfig, GPUSystem, run
    from host.workloads import l3_trace, plora_workload

    cases = {
        "plora_like": (lambda fuse: GPUSystem(get_model("llama2-7b"), "h100", tp=1, fuse=fuse),
                       plora_workload("uniform", n_requests=1000, rate_per_s=10.0, seed=0)),
        "l3_like": (lambda fuse: GPUSystem(get_model("gpt-175b"), "a100", hbm_gb=1e6, fuse=fuse),
                    l3_trace("openr1", n_requests=1000, seed=0)),
    }
    cfg = EngineConfig(record_iterations=False, trace=False)
    out = {}
    for name, (make, w) in cases.items():
        # warm-up on a few requests: loads the calibration and NCCL profile and tabulates the GPU model once per
        # process (the one-time setup a sweep worker pays), so the figures below are the engine's steady cost
        _, _, out[f"engine_{name}_setup_cpu_s"] = _timed(lambda: run(w.head(20), make(True), cfg))
        for fuse in (True, False):
            if name == "l3_like" and not fuse:
                continue  # 100k+ iterations one by one: minutes; the PLoRA-like case measures that path
            res, wall, cpu = _timed(lambda: run(w, make(fuse), cfg))
            s = res.summary
            tag = f"engine_{name}_{'fused' if fuse else 'stepwise'}"
            out.update({f"{tag}_wall_s": wall, f"{tag}_cpu_s": cpu, f"{tag}_steps": s["engine_steps"],
                        f"{tag}_iterations": s["iterations"], f"{tag}_iterations_per_s": s["iterations"] / cpu,
                        f"{tag}_steps_per_s": s["engine_steps"] / cpu})
    return out


def gpu_accuracy() -> dict:
    from host.gpu.fit import holdout_report
    from host.gpu.profiles import GEMM_OPS, ELT_OPS
    rep = holdout_report()
    out = {"gpu_heldout_gemm_mape_max": max(e[op] for e in rep.values() for op in GEMM_OPS),
           "gpu_heldout_gemm_mape_mean": sum(e[op] for e in rep.values() for op in GEMM_OPS) / (4 * len(rep)),
           "gpu_heldout_elementwise_mape_max": max(e[op] for e in rep.values() for op in ELT_OPS)}
    for split, errs in rep.items():
        key = split.split(":")[1].strip().replace(" held out", "").replace(" on ", "_").replace("-", "")
        for op in GEMM_OPS:
            out[f"gpu_heldout_{key}_{op}_mape"] = errs[op]
    return out


def run_grids() -> dict:
    out = {}
    for name, module in GRIDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module.startswith(exc.name):
                raise
            print(f"{module}: not present, skipped")
            continue
        figures, wall, cpu = _timed(mod.run_grid)
        out[f"{name}_grid_s"] = wall
        out[f"{name}_grid_cpu_s"] = cpu
        for k, v in (figures or {}).items():
            out[k if k.startswith(f"{name}_") else f"{name}_{k}"] = v
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m host.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/bench/host.json")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-gpu", action="store_true")
    ap.add_argument("--skip-grids", action="store_true")
    args = ap.parse_args(argv)
    figures = {}
    if not args.skip_grids:
        figures.update(run_grids())
    if not args.skip_engine:
        figures.update(engine_speed())
    if not args.skip_gpu:
        figures.update(gpu_accuracy())
    for k, v in figures.items():
        print(f"{k:<58}{v:>14.4g}" if isinstance(v, (int, float)) else f"{k:<58}{v!s:>14}")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
