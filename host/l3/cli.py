"""``ndpim l3 ...``: the L3 host's command group (host/cli.py calls :func:`add_parser`).

* ``ndpim l3 run --model M --trace T --system S [--ranksets N] [--host-memory-gb G] [--seed K] [--requests N]
  [--gpu-memory-utilization U] [--min-gpu-tokens N|knee|ridge] [--pim-command-path per_rank|shared] --out DIR
  [--force]``: one run; writes the run directory
  (config.json, requests.csv, iterations.csv, summary.json, trace.json) and prints the summary's main figures,
  the options included. Requests whose KV can never fit the system are rejected and counted (``rejected_frac``);
  when every request is, only config.json and summary.json are written, with ``"oom": true``. The user's own
  inputs (docs/inputs.md): ``--trace-file F`` (CSV / JSONL; ``--rate`` rescales its arrivals) instead of
  ``--trace``, ``--model-config F`` (a Hugging Face config.json, with ``--tp`` / ``--dp``) instead of ``--model``,
  ``--hardware F`` (TOML: sections gpu, link, pim) and ``--set section.field=value``; recorded in config.json.
* ``ndpim l3 sweep --out DIR [--models ...] [--traces ...] [--systems ...]``: throughput per model x trace x
  system (throughput.csv, throughput.png).
* ``ndpim l3 figures --out DIR [--only NAME ...]``: every figure of the study (host.l3.figures).

``--jobs`` / ``--cluster`` choose the executor (local process pool or Dask); progress bars show on long runs.
"""

import argparse
import sys
from pathlib import Path

from host.cli import (UsageError, add_name_list, check_run_dir, existing_file, float_range, hardware_values, int_range,
                      out_dir)

__all__ = ["add_parser"]

_MAIN = ("throughput_tok_s", "tbt_ms_mean", "tbt_ms_p99", "mean_batch", "gpu_bubble_frac", "pim_bubble_frac",
         "makespan_s", "finished", "preemptions", "rejected", "rejected_frac", "pred_re_pim_online",
         "pred_re_gpu_online", "gpu_memory_utilization", "hbm_kv_capacity_gb", "min_gpu_tokens",
         "predictor_seed_batches")


def _system_kw(args) -> dict:
    """System options from the command line; only those that differ from the defaults are passed on."""
    kw = {}
    if args.gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.min_gpu_tokens is not None:
        if not getattr(args, "system", "l3").startswith("l3"):
            raise UsageError(f"argument --min-gpu-tokens: applies to the L3 systems, not {args.system}")
        kw["min_gpu_tokens"] = args.min_gpu_tokens
    if args.predictor_seed_batches is not None:
        kw["profile_batches"] = args.predictor_seed_batches
    if args.pim_command_path is not None:
        kw["pim_command_path"] = args.pim_command_path
    return kw


def _add_options(p):
    p.add_argument("--gpu-memory-utilization", type=float_range(0.0, 1.0, lo_open=True), default=None,
                   help="HBM fraction the serving framework may use (vLLM's headroom, e.g. 0.9); default: off, the "
                        "whole HBM less weights and activation workspace")
    p.add_argument("--min-gpu-tokens", type=_min_gpu_tokens, default=None,
                   help="L3 scheduler token floor (extension): a token count, 'knee' or 'ridge'; default 0, the "
                        "paper's rule as written")
    p.add_argument("--predictor-seed-batches", type=int_range(0), default=None,
                   help="L3 predictors: sub-batches of the start-up profile that seeds them (default 384); 0: they "
                        "start cold and learn from the run alone")
    _add_command_path(p)


def _add_command_path(p):
    from host.l3.pim_timing import COMMAND_PATHS
    p.add_argument("--pim-command-path", choices=COMMAND_PATHS, default=None,
                   help="DIMM-PIM command topology (docs/pim_perf.md): per_rank (default; each rank PU drives its own "
                        "rank, L3 4 / 5.1) or shared (every rank's commands on the channel's one command bus)")


def _min_gpu_tokens(text):
    """argparse ``type``: a token count >= 0, 'knee' or 'ridge' (kept as given)."""
    if text in ("knee", "ridge") or (text.isdigit() and int(text) >= 0):
        return text
    raise argparse.ArgumentTypeError(f"must be a token count >= 0, 'knee' or 'ridge', got {text!r}")


def _csv(s):
    return [x for x in s.split(",") if x]


def _inputs(args):
    """The run's setup, workload (a trace file's, or None) and the record of the user's files, every input checked
    before any work (a bad one is a UsageError naming its flag)."""
    from host.l3.config import l3_setup
    from host.l3.traces import MAX_TOTAL_TOKENS, TABLE4, generate
    from host.models.hardware_file import SECTIONS
    from host.workloads.trace_file import TraceFileError, file_digest, load_trace_file
    if (args.model is None) == (args.model_config is None):
        raise UsageError("argument --model: give --model or --model-config (one of them)")
    if (args.trace is None) == (args.trace_file is None):
        raise UsageError("argument --trace: give --trace or --trace-file (one of them)")
    if args.max_total_tokens is not None and args.trace not in TABLE4:
        raise UsageError(f"argument --max-total-tokens: bounds a generated trace ({', '.join(TABLE4)}), not "
                         f"{'--trace-file' if args.trace_file else args.trace!r}")
    if args.rate is not None and args.trace_file is None:
        raise UsageError("argument --rate: rescales the arrivals of a --trace-file (the generated traces arrive at "
                         "t = 0)")
    record = {}
    model = args.model
    if args.model_config is not None:
        from dataclasses import asdict
        from host.models.hf import load_hf_config
        try:
            model = load_hf_config(args.model_config)
        except ValueError as e:
            raise UsageError(f"argument --model-config: {e}") from None
        if model.is_moe:
            raise UsageError(f"argument --model-config: {args.model_config}: an MoE model; the L3 GPU side prices "
                             f"dense models only")
        record["model_config"] = {"path": args.model_config, "sha256": file_digest(args.model_config),
                                  "model": {k: v for k, v in asdict(model).items() if k != "sources"}}
    hw = hardware_values(args, SECTIONS["l3"])
    try:            # the model and its deployment on the preset hardware, then with the hardware values
        l3_setup(model, tp=args.tp, dp=args.dp)
    except ValueError as e:
        flag = "--tp" if "TP" in str(e) else "--model-config" if args.model_config else "--model"
        raise UsageError(f"argument {flag}: {e}") from None
    try:
        setup = l3_setup(model, ranksets=args.ranksets, host_memory_gb=args.host_memory_gb, hardware=hw,
                         tp=args.tp, dp=args.dp)
    except ValueError as e:
        flag = "--set" if args.set else "--hardware" if args.hardware else "--ranksets"
        raise UsageError(f"argument {flag}: {e}") from None
    if hw:
        record["hardware"] = {"path": args.hardware, "sha256": args.hardware and file_digest(args.hardware),
                              "values": hw}
    workload = None
    if args.max_total_tokens is not None:
        workload = generate(args.trace, args.requests or 1000, args.seed, max_total=args.max_total_tokens)
        record["max_total_tokens"] = args.max_total_tokens
    if args.trace_file is not None:
        m = setup.model
        # the L3 Table 3 models run as the paper runs them, without their context limit (host/models/llm.py), up to
        # the rank PU buffer's tokens; a model from a config.json also within its max_position_embeddings
        limit, what = MAX_TOTAL_TOKENS, f"the PIM rank buffer's {MAX_TOTAL_TOKENS} tokens (L3 4.4)"
        if args.model_config is not None and 0 < m.max_context < limit:
            limit, what = m.max_context, f"{m.name}'s context (max_position_embeddings)"
        try:
            workload = load_trace_file(args.trace_file, max_context=limit, n_requests=args.requests,
                                       rate_per_s=args.rate, seed=args.seed, context_source=what)
        except TraceFileError as e:
            raise UsageError(f"argument {'--requests' if e.kind == 'too-few' else '--trace-file'}: {e}") from None
        record["trace_file"] = {"path": args.trace_file, "sha256": file_digest(args.trace_file),
                                "arrivals": "as given" if args.rate is None else f"rescaled to {args.rate:g} "
                                                                                  f"requests/s"}
    return setup, workload, record


def cmd_run(args):
    from host.serving import EngineConfig
    from host.serving.rundir import write_json
    from host.l3.run import run_l3
    out = Path(args.out)
    setup, workload, record = _inputs(args)
    check_run_dir(args)
    model = setup.model.name
    trace = args.trace or f"file:{Path(args.trace_file).name}"
    if args.model_config is not None:
        print(f"model: {model} from {args.model_config} (TP {setup.tp} x DP {setup.dp})")
    if "hardware" in record:
        from host.models.hardware_file import as_pairs
        print("hardware: " + ", ".join(f"{k}={v:g}" if not isinstance(v, str) else f"{k}={v}"
                                       for k, v in as_pairs(record["hardware"]["values"]))
              + "".join(f" (from {args.hardware}" + (" and --set)" if args.set else ")") if args.hardware else
                        " (from --set)"))
    if args.max_total_tokens is not None:
        print(f"trace {args.trace}: prompt + output <= {args.max_total_tokens} tokens (--max-total-tokens)")
        for note in workload.notes[1:]:
            print(f"note: {note}")
    elif workload is not None:
        if args.rate is None:
            print(f"trace file {args.trace_file}: {len(workload)} requests, arrivals as given in the file")
        else:
            print(f"trace file {args.trace_file}: {len(workload)} requests, arrivals rescaled from "
                  f"{workload.params['rate_per_s_in_file']:.4g} to {args.rate:.4g} requests/s (--rate)")
    try:
        r = run_l3(model, trace, args.system, ranksets=args.ranksets, host_memory_gb=args.host_memory_gb,
                   seed=args.seed, n_requests=args.requests or 1000, system_kw=_system_kw(args) or None,
                   engine=EngineConfig(progress=not args.no_progress and sys.stderr.isatty()), setup=setup,
                   workload=workload)
    except ValueError as exc:
        raise SystemExit(f"ndpim l3 run: {exc}")
    extra = {"command": " ".join(sys.argv)}
    if record:
        extra["inputs"] = record
    if r.output is None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "config.json", {**r.config, **extra})
        write_json(out / "summary.json", r.summary)
        print(f"{args.system} on {model} / {trace}: out of memory: {r.summary['oom_reason']}")
        print(f"wrote {out}/config.json, summary.json")
        print(f"FAILED: {args.system} cannot serve this run (out of memory)", file=sys.stderr)
        return 1
    r.output.write(out, extra, iterations=args.iterations)
    s = r.summary
    print(f"{args.system} on {model} / {trace} ({s['requests']} of {s['requests_offered']} requests "
          f"served, {s['rejected']} rejected as never fitting; {s.get('replicas', 1)} replica(s)):")
    for k in _MAIN:
        if k in s and s[k] is not None:
            v = s[k]
            print(f"  {k:<22}{v:>14.4g}" if isinstance(v, (int, float)) else f"  {k:<22}{v!s:>14}")
    import json as _json
    mode = _json.loads((out / "config.json").read_text()).get("iterations_csv", "all")
    print(f"wrote {out}/ (config.json, requests.csv, iterations.csv [{mode}], summary.json, trace.json)")
    if not s["requests"] or s.get("finished", s["requests"]) < s["requests"]:
        # nothing served (every request rejected as never fitting), or admitted requests left unfinished: the run
        # could not serve its requests (issue 32 item 3); some rejected and the rest served is a result, exit 0
        print(f"FAILED: {args.system} served {s.get('finished', 0)} of the {s['requests_offered']} requests offered "
              f"({s['rejected']} rejected as never fitting)", file=sys.stderr)
        return 1
    return 0


def cmd_sweep(args):
    from host.sweep import get_executor
    from host.l3.figures import _write_csv, plot_throughput, throughput_table
    from host.l3.sweep import run_points, throughput_points
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pts = throughput_points(models=_csv(args.models), traces=_csv(args.traces), systems=_csv(args.systems),
                            n_requests=args.requests, seed=args.seed, options=_system_kw(args))
    with get_executor(args.cluster, args.jobs) as ex:
        rows = run_points(pts, executor=ex, desc="l3 sweep")
    t = throughput_table(rows)
    _write_csv(out / "throughput.csv", t)
    plot_throughput(t, out / "throughput.png")
    for r in t:
        thr = "OOM" if r.get("oom") else f"{r['throughput_tok_s']:.1f}"
        print(f"{r['model']:<9}{r['trace']:<13}{r['system']:<15}{thr:>10} tok/s  x{r['normalized']:.2f} "
              f"(vs {r['norm_to']})  rejected {r.get('rejected_frac', 0.0):.3f}")
    print(f"wrote {out}/throughput.csv, throughput.png")
    return 0


def cmd_figures(args):
    from host.sweep import get_executor
    from host.l3.figures import FIGURES, make_figures
    with get_executor(args.cluster, args.jobs) as ex:
        kw = {} if args.pim_command_path is None else {"pim_command_path": args.pim_command_path}
        make_figures(args.out, n_requests=args.requests, seed=args.seed, only=args.only or FIGURES, executor=ex, **kw)
    return 0


def add_parser(subparsers):
    from host.sweep import add_executor_args
    from host.l3.figures import FIGURES
    from host.l3.sweep import MODELS, PAPER_SYSTEMS, PAPER_TRACES
    from host.l3.systems import SYSTEMS
    from host.l3.traces import TRACES
    p = subparsers.add_parser("l3", help="L3 (DIMM-PIM) serving: runs, sweeps, figures",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="l3_command", required=True)

    r = sub.add_parser("run", help="one run (a model, a trace, a system) -> a run directory")
    r.add_argument("--model", choices=MODELS, help="an L3 Table 3 model (or --model-config)")
    r.add_argument("--model-config", type=existing_file, metavar="FILE",
                   help="the model from a Hugging Face config.json instead of --model (dense, head_dim 128; with "
                        "--tp and --dp; docs/inputs.md)")
    r.add_argument("--tp", type=int_range(1, 8), default=None,
                   help="tensor-parallel GPUs per replica (default: L3 Table 3's for --model)")
    r.add_argument("--dp", type=int_range(1, 8), default=None,
                   help="data-parallel replicas (default: L3 Table 3's for --model; TP x DP <= the node's 8 GPUs)")
    r.add_argument("--trace", choices=TRACES, help="a built-in trace (or --trace-file)")
    r.add_argument("--trace-file", type=existing_file, metavar="FILE",
                   help="requests from a CSV or JSONL file instead of --trace (columns: docs/inputs.md); arrivals "
                        "kept as given unless --rate rescales them")
    r.add_argument("--rate", type=float_range(0.0, lo_open=True), default=None,
                   help="with --trace-file: rescale its arrivals to this mean rate, requests/s")
    r.add_argument("--system", required=True, choices=list(SYSTEMS))
    r.add_argument("--hardware", type=existing_file, metavar="FILE",
                   help="GPU, link and DIMM-PIM parameters from a TOML file (sections gpu, link, pim; docs/inputs.md)")
    r.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", default=None,
                   help="override one hardware parameter, e.g. pim.ranksets=8 (repeatable; after --hardware)")
    # the ranges of host.l3.config.HostMemoryConfig
    r.add_argument("--ranksets", type=int_range(1, 32), default=None, help="ranks per channel (default 4, L3 Table 2)")
    r.add_argument("--host-memory-gb", type=float_range(1.0, float(1 << 20)), default=None,
                   help="host memory in GiB (default 2048)")
    r.add_argument("--seed", type=int_range(0), default=0)
    r.add_argument("--requests", type=int_range(1), default=None,
                   help="requests of the trace (default 1000; --trace-file: all of the file's, else its first N)")
    r.add_argument("--max-total-tokens", type=int_range(2, 128 * 1024), default=None, metavar="N",
                   help="with a generated --trace: prompt + output of every request <= N (redrawn above it), e.g. a "
                        "dataset's documented maximum; default 131072, the rank PU buffer (L3 4.4). Says so when "
                        "Table 4's moments cannot hold under N")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_options(r)
    r.add_argument("--out", required=True, type=out_dir, help="run directory")
    r.add_argument("--force", action="store_true", help="write into an --out directory that already holds files")
    r.add_argument("--iterations", choices=["auto", "all", "stretch", "none"], default="auto",
                   help="what iterations.csv holds: every row (fused decode stretches are already one row), one "
                        "row per stretch of equal batch composition, or no file (default auto: all up to 20,000 "
                        "rows, else stretch)")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", help="throughput per model x trace x system (CSV + PNG)")
    s.add_argument("--out", required=True, type=out_dir)
    add_name_list(s, "--models", MODELS, default=",".join(MODELS), help="models")
    add_name_list(s, "--traces", TRACES, default=",".join(PAPER_TRACES), help="traces")
    add_name_list(s, "--systems", list(SYSTEMS), default=",".join(PAPER_SYSTEMS), help="systems")
    s.add_argument("--requests", type=int_range(1), default=1000)
    s.add_argument("--seed", type=int_range(0), default=0)
    _add_options(s)
    add_executor_args(s)
    s.set_defaults(func=cmd_sweep)

    f = sub.add_parser("figures", help="every figure of the L3 study (CSV + PNG)")
    f.add_argument("--out", required=True, type=out_dir)
    f.add_argument("--only", nargs="*", choices=FIGURES, help="only these figures")
    f.add_argument("--requests", type=int_range(1), default=1000)
    f.add_argument("--seed", type=int_range(0), default=0)
    _add_command_path(f)
    add_executor_args(f)
    f.set_defaults(func=cmd_figures)
    return p
