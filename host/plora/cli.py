"""``ndpim plora``: run one PLoRA-study configuration, run sweeps, write the figures.

* ``ndpim plora run --model M --workload W --system S [--link-gbps X] [--link-latency-ns Y] [--devices N]
  [--seed K] --out DIR [--force]``: one run directory (config.json, requests.csv, iterations.csv, summary.json,
  trace.json with lanes GPU, link and one per device); the user's own inputs (docs/inputs.md): ``--trace-file F``
  (CSV / JSONL) instead of ``--workload``, ``--model-config F`` (a Hugging Face config.json) instead of ``--model``,
  ``--hardware F`` (TOML: sections gpu, link, ndp) and ``--set section.field=value``, each checked before the run
  directory is made and recorded in config.json (``inputs``: path and sha256);
* ``ndpim plora sweep --name NAME --out DIR``: one named sweep's CSV (``--name grid`` is the TPOT grid);
* ``ndpim plora figures --out DIR``: CSV and PNG of every figure (host.plora.figures);
* ``ndpim plora kernel-table``: write data/ndp_kernel_table.json, the calibrated NDP model's kernel times for
  every shape the figures ask for (host.plora.kernel_table; after a change to the model, firmware or core).
"""

import json
import sys
from dataclasses import fields
from pathlib import Path

from host.cli import (UsageError, add_name_list, check_run_dir, existing_file, float_range, hardware_values, int_range,
                      out_dir)

__all__ = ["add_parser", "cmd_run", "cmd_sweep", "cmd_figures", "cmd_kernel_table"]


def _run_args(p):
    from .config import ALL_SYSTEMS
    from .run import WORKLOADS
    from host.models import MODELS as ALL_MODELS
    # every model of host/models (docs/host.md names them all); the paper's grid uses four (host.plora.run.MODELS),
    # and a model whose weights leave no HBM on the GPU is a clear error of the run, not of the command line
    p.add_argument("--model", choices=list(ALL_MODELS), help="a preset model (or --model-config)")
    p.add_argument("--model-config", type=existing_file, metavar="FILE",
                   help="the model from a Hugging Face config.json instead of --model (docs/inputs.md)")
    p.add_argument("--workload", choices=list(WORKLOADS), help="a built-in workload (or --trace-file)")
    p.add_argument("--trace-file", type=existing_file, metavar="FILE",
                   help="requests from a CSV or JSONL file instead of --workload (columns: docs/inputs.md); "
                        "arrivals kept as given unless --rate rescales them")
    p.add_argument("--system", required=True, choices=list(ALL_SYSTEMS))
    p.add_argument("--link-gbps", type=float_range(0.0, lo_open=True), default=None,
                   help="link bandwidth per direction, GB/s (default: the system's link preset)")
    p.add_argument("--link-latency-ns", type=float_range(0.0), default=None,
                   help="one-way link latency, ns (the round trip L_link is twice it; default: the preset's)")
    p.add_argument("--devices", type=int_range(0, 4096), default=None,
                   help="PLoRA devices in the pool (default 4; 0: the fewest that hold the run's adapters)")
    p.add_argument("--seed", type=int_range(0), default=0)
    p.add_argument("--requests", type=int_range(1), default=None,
                   help="requests in the workload (default 1000; --trace-file: all of the file's, else its first N)")
    p.add_argument("--rate", type=float_range(0.0, lo_open=True), default=None,
                   help="mean arrival rate, requests/s (default 10; --trace-file: rescale the file's arrivals to "
                        "this rate, default: as given)")
    p.add_argument("--kv-bits", type=int, default=16, choices=[16, 8, 4])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int_range(1, 100_000), default=None,
                      help="closed loop: this many clients, each sending its next request when its last one "
                           "finishes (the arrival rate is ignored)")
    mode.add_argument("--fixed-batch", type=int_range(1, 100_000), default=None,
                      help="closed loop at this many clients with the batch capped at it: every system decodes at "
                           "the same batch (TPOT at matched batch)")
    p.add_argument("--ndp-model", default="auto", choices=["auto", "calibrated", "standin"])
    p.add_argument("--hardware", type=existing_file, metavar="FILE",
                   help="GPU, link and NDP-device parameters from a TOML file (sections gpu, link, ndp; "
                        "docs/inputs.md)")
    p.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", default=None,
                   help="override one hardware parameter, e.g. ndp.internal_bw_gbps=550 (repeatable; after "
                        "--hardware)")


def add_parser(sub) -> None:
    p = sub.add_parser("plora", help="PLoRA host: serving runs, sweeps and figures (docs/plora_host.md)")
    psub = p.add_subparsers(dest="plora_command", required=True)

    r = psub.add_parser("run", help="one run: writes a run directory")
    _run_args(r)
    r.add_argument("--out", required=True, type=out_dir, help="run directory to write")
    r.add_argument("--force", action="store_true", help="write into an --out directory that already holds files")
    r.add_argument("--iterations", choices=["auto", "all", "stretch", "none"], default="auto",
                   help="what iterations.csv holds: every iteration, one row per stretch of equal batch composition, "
                        "or no file (default auto: all up to 20,000 iterations, else stretch)")
    r.set_defaults(func=cmd_run)

    from host.sweep import add_executor_args
    from .config import ALL_SYSTEMS
    from .figures import FIGURES
    from .run import MODELS
    s = psub.add_parser("sweep", help="run one named sweep and write its CSV")
    s.add_argument("--name", required=True, choices=["grid"] + [f for f in FIGURES if f not in
                                                               ("tp_study", "ablation", "kv_dup", "strategy_mix",
                                                                "layer_breakdown", "tpot_grid")])
    s.add_argument("--out", required=True, type=out_dir, help="directory for <name>.csv")
    s.add_argument("--requests", type=int_range(1), default=100, help="requests per run (default 100)")
    s.add_argument("--seed", type=int_range(0), default=0)
    add_name_list(s, "--models", list(MODELS), help="only these models (default: every model of the sweep)")
    add_name_list(s, "--systems", list(ALL_SYSTEMS), help="only these systems (default: every system of the sweep)")
    add_executor_args(s)
    s.set_defaults(func=cmd_sweep)

    f = psub.add_parser("figures", help="CSV and PNG of every figure of the PLoRA study")
    f.add_argument("--out", required=True, type=out_dir, help="directory for <figure>.csv and <figure>.png")
    f.add_argument("--only", action="append", choices=list(FIGURES), help="only this figure (repeatable)")
    f.add_argument("--requests", type=int_range(1), default=100, help="requests per run (default 100)")
    f.add_argument("--seed", type=int_range(0), default=0)
    f.add_argument("--reuse", action="store_true", help="reuse sweep CSVs already in --out")
    add_name_list(f, "--models", list(MODELS), help="only these models' runs (default: every model)")
    add_name_list(f, "--systems", list(ALL_SYSTEMS), help="only these systems' runs (default: every system)")
    add_executor_args(f)
    f.set_defaults(func=cmd_figures)

    t = psub.add_parser("kernel-table", help="write the calibrated NDP model's kernel times for every shape the "
                                             "figures ask for (data/ndp_kernel_table.json)")
    t.add_argument("--out", default=None, help="table path (default data/ndp_kernel_table.json)")
    t.add_argument("--jobs", type=int_range(1), default=None, help="worker processes (default: the CPUs)")
    t.set_defaults(func=cmd_kernel_table)


def _spec(args):
    """The RunSpec of the command line, every input checked (files included) before any work: a bad value is a
    UsageError naming its flag."""
    from .run import RunSpec, build_workload, resolve
    from host.models.hardware_file import SECTIONS, as_pairs
    if (args.model is None) == (args.model_config is None):
        raise UsageError("argument --model: give --model or --model-config (one of them)")
    if (args.workload is None) == (args.trace_file is None):
        raise UsageError("argument --workload: give --workload or --trace-file (one of them)")
    model = args.model
    if args.model_config is not None:
        from host.models.hf import load_hf_config
        try:
            model = load_hf_config(args.model_config).name
        except ValueError as e:
            raise UsageError(f"argument --model-config: {e}") from None
    hw = hardware_values(args, SECTIONS["plora"])
    trace = args.trace_file is not None
    try:
        spec = RunSpec(model=model, model_config=args.model_config, workload="file" if trace else args.workload,
                       trace_file=args.trace_file, system=args.system, link_gbps=args.link_gbps,
                       link_latency_ns=args.link_latency_ns, devices=args.devices, seed=args.seed,
                       n_requests=args.requests if args.requests is not None or trace else 1000,
                       rate_per_s=args.rate if args.rate is not None or trace else 10.0, kv_bits=args.kv_bits,
                       ndp=args.ndp_model, concurrency=args.concurrency, fixed_batch=args.fixed_batch,
                       hardware=as_pairs(hw), hardware_file=args.hardware)
    except ValueError as e:         # a combination the flags' own checks do not see
        raise UsageError(str(e)) from None
    try:
        resolve(spec)
    except ValueError as e:
        flag = "--set" if args.set else "--hardware" if args.hardware else "--model-config"
        raise UsageError(f"argument {flag}: {e}") from None
    if trace:
        from host.workloads import TraceFileError
        try:
            args._workload = build_workload(spec)
        except TraceFileError as e:
            raise UsageError(f"argument {'--requests' if e.kind == 'too-few' else '--trace-file'}: {e}") from None
    return spec


def _say_inputs(spec, args) -> None:
    """One line per user input: what was loaded, and what happened to the trace's arrivals."""
    if spec.model_config is not None:
        print(f"model: {spec.model} from {spec.model_config}")
    if spec.hardware:
        print(f"hardware: {', '.join(f'{k}={v:g}' if not isinstance(v, str) else f'{k}={v}' for k, v in spec.hardware)}"
              + (f" (from {spec.hardware_file} and --set)" if spec.hardware_file and args.set else
                 f" (from {spec.hardware_file})" if spec.hardware_file else " (from --set)"))
    w = getattr(args, "_workload", None)
    if w is not None:
        p = w.params
        if spec.rate_per_s is None:
            print(f"trace file {spec.trace_file}: {len(w)} requests, arrivals as given in the file")
        else:
            print(f"trace file {spec.trace_file}: {len(w)} requests, arrivals rescaled from "
                  f"{p['rate_per_s_in_file']:.4g} to {spec.rate_per_s:.4g} requests/s (--rate)")


def cmd_run(args):
    from .run import run_spec
    spec = _spec(args)
    check_run_dir(args)
    _say_inputs(spec, args)
    from host.serving import EngineConfig
    try:
        # a tqdm bar of finished requests on a terminal (shown after 2 s; issue 32 item 6)
        out = run_spec(spec, out_dir=args.out, iterations=args.iterations,
                       engine_config=EngineConfig(trace=True, record_iterations=True, progress=sys.stderr.isatty()))
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"ndpim plora run: {e}") from None
    s = out.summary
    keys = ("tpot_ms_mean", "tpot_ms_p99", "ttft_s_mean", "throughput_tok_s", "kv_dup_fraction")
    wname = f"file:{Path(spec.trace_file).name}" if spec.trace_file else spec.workload
    print(f"{spec.system} on {spec.model} / {wname}: " + ", ".join(f"{k} {s[k]:.4g}" for k in keys))
    print(f"gpu_mem_gb: {json.dumps({k: round(float(v), 3) for k, v in s['gpu_mem_gb'].items()})}")
    print(f"strategy_counts: {json.dumps(s['strategy_counts'].get('decisions', {}))}")
    print(f"regime: mean batch {s['mean_batch']:.1f}, {s['adapters_touched']} adapters touched "
          f"({s['adapter_demand_gb']:.1f} GB), hbm_pressure {s['hbm_pressure']:.2f} (peak {s['hbm_pressure_peak']:.2f}, "
          f"offered {s['hbm_pressure_offered']:.2f}), evictions {s['evictions']}")
    cfg = json.loads((Path(args.out) / "config.json").read_text())
    for note in cfg.get("workload", {}).get("notes", []):
        print(f"note: {note}")
    if "ndp_model" in s:
        print(f"NDP timing model: {s['ndp_model']} ({s.get('ndp_geometry', '')})")
    if "cost_model_err" in s:
        e = s["cost_model_err"]
        # the PLoRA family (its summary names its NDP model) decides with Algorithm 1; the host-memory baselines'
        # estimate is their own formula
        what = "Algorithm 1's estimate" if "ndp_model" in s else "the system's formula"
        print(f"cost model ({what}) vs executed timeline: mean {100 * e['mean']:+.1f} %, "
              f"mean |err| {100 * e['mean_abs']:.1f} %, p99 |err| {100 * e['p99_abs']:.1f} %")
    mode = json.loads((Path(args.out) / "config.json").read_text()).get("iterations_csv", "all")
    print(f"wrote {Path(args.out)} (iterations.csv: {mode})")
    if s.get("finished", 0) < s.get("requests", 0):
        print(f"FAILED: {s['requests'] - s['finished']} of {s['requests']} requests were not served",
              file=sys.stderr)
        return 1
    return 0


def _executor(args):
    from host.sweep import get_executor
    return get_executor(jobs=args.jobs, cluster=args.cluster)


def _filters(args):
    split = lambda v: None if v is None else v.split(",")        # noqa: E731
    return split(args.models), split(args.systems)


def cmd_sweep(args):
    from .figures import sweep_specs, run_sweep, filter_specs
    name = "tpot_grid" if args.name == "grid" else args.name
    models, systems = _filters(args)
    specs = filter_specs(sweep_specs(name, n_requests=args.requests, seed=args.seed), models, systems)
    if not specs:
        raise UsageError(f"argument --models/--systems: no point of the {name} sweep is on "
                         f"{', '.join(models or ['any model'])} x {', '.join(systems or ['any system'])}")
    with _executor(args) as ex:
        df = run_sweep(specs, ex, desc=name)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / f"{name}.csv", index=False)
    bad = df[df["error"] != ""]
    print(f"{name}: {len(df)} points ({len(bad)} with errors) -> {out / (name + '.csv')}")
    for _, r in bad.iterrows():
        print(f"  {r['model']} {r['workload']} {r['system']}: {r['error']}", file=sys.stderr)
    return 0


def cmd_figures(args):
    from .figures import make_figures, FIGURES, figure_points
    models, systems = _filters(args)
    names = tuple(args.only or FIGURES)
    if models or systems:
        empty = [n for n in names if not figure_points(n, models, systems)]
        for n in empty:
            print(f"note: {n}: no run on these --models / --systems; skipped", file=sys.stderr)
        names = tuple(n for n in names if n not in empty)
        if not names:
            raise UsageError("argument --models/--systems: no requested figure has a run on these models and "
                             "systems")
    with _executor(args) as ex:
        done = make_figures(args.out, names=names, n_requests=args.requests, seed=args.seed,
                            executor=ex, reuse=args.reuse, models=models, systems=systems)
    for name, path in done.items():
        print(f"{name}: {path} and {Path(path).with_suffix('.png')}")
    return 0


def cmd_kernel_table(args):
    from .kernel_table import build
    got = build(args.out, jobs=args.jobs)
    print(f"wrote {got['path']}: {got['entries']} kernel times in {got['wall_s']:.0f} s")
    return 0
