"""``ndpim l3 ...``: the L3 host's command group (host/cli.py calls :func:`add_parser`).

* ``ndpim l3 run --model M --trace T --system S [--ranksets N] [--host-memory-gb G] [--seed K] [--requests N]
  [--gpu-memory-utilization U] [--min-gpu-tokens N|knee|ridge] [--pim-command-path per_rank|shared] --out DIR
  [--force]``: one run; writes the run directory
  (config.json, requests.csv, iterations.csv, summary.json, trace.json) and prints the summary's main figures,
  the options included. Requests whose KV can never fit the system are rejected and counted (``rejected_frac``);
  when every request is, only config.json and summary.json are written, with ``"oom": true``.
* ``ndpim l3 sweep --out DIR [--models ...] [--traces ...] [--systems ...]``: throughput per model x trace x
  system (throughput.csv, throughput.png).
* ``ndpim l3 figures --out DIR [--only NAME ...]``: every figure of the study (host.l3.figures).

``--jobs`` / ``--cluster`` choose the executor (local process pool or Dask); progress bars show on long runs.
"""

import argparse
import sys
from pathlib import Path

from host.cli import UsageError, check_run_dir, float_range, int_range, out_dir

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


def _names(allowed):
    """argparse ``type``: a comma-separated list of names, each one of ``allowed`` (kept as given)."""
    def parse(text):
        names = _csv(text)
        if not names:
            raise argparse.ArgumentTypeError(f"expected one or more of {list(allowed)}, comma-separated")
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad))}; allowed: {list(allowed)}")
        return text
    return parse


def _csv(s):
    return [x for x in s.split(",") if x]


def cmd_run(args):
    from host.serving import EngineConfig
    from host.serving.rundir import write_json
    from host.l3.run import run_l3
    out = Path(args.out)
    check_run_dir(args)
    try:
        r = run_l3(args.model, args.trace, args.system, ranksets=args.ranksets, host_memory_gb=args.host_memory_gb,
                   seed=args.seed, n_requests=args.requests, system_kw=_system_kw(args) or None,
                   engine=EngineConfig(progress=not args.no_progress and sys.stderr.isatty()))
    except ValueError as exc:
        raise SystemExit(f"ndpim l3 run: {exc}")
    if r.output is None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "config.json", r.config)
        write_json(out / "summary.json", r.summary)
        print(f"{args.system} on {args.model} / {args.trace}: out of memory: {r.summary['oom_reason']}")
        print(f"wrote {out}/config.json, summary.json")
        return 0
    r.output.write(out, {"command": " ".join(sys.argv)})
    s = r.summary
    print(f"{args.system} on {args.model} / {args.trace} ({s['requests']} of {s['requests_offered']} requests "
          f"served, {s['rejected']} rejected as never fitting; {s.get('replicas', 1)} replica(s)):")
    for k in _MAIN:
        if k in s and s[k] is not None:
            v = s[k]
            print(f"  {k:<22}{v:>14.4g}" if isinstance(v, (int, float)) else f"  {k:<22}{v!s:>14}")
    print(f"wrote {out}/ (config.json, requests.csv, iterations.csv, summary.json, trace.json)")
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
    r.add_argument("--model", required=True, choices=MODELS)
    r.add_argument("--trace", required=True, choices=TRACES)
    r.add_argument("--system", required=True, choices=list(SYSTEMS))
    # the ranges of host.l3.config.HostMemoryConfig
    r.add_argument("--ranksets", type=int_range(1, 32), default=None, help="ranks per channel (default 4, L3 Table 2)")
    r.add_argument("--host-memory-gb", type=float_range(1.0, float(1 << 20)), default=None,
                   help="host memory in GiB (default 2048)")
    r.add_argument("--seed", type=int_range(0), default=0)
    r.add_argument("--requests", type=int_range(1), default=1000, help="requests of the trace (default 1000)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_options(r)
    r.add_argument("--out", required=True, type=out_dir, help="run directory")
    r.add_argument("--force", action="store_true", help="write into an --out directory that already holds files")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", help="throughput per model x trace x system (CSV + PNG)")
    s.add_argument("--out", required=True, type=out_dir)
    s.add_argument("--models", type=_names(MODELS), default=",".join(MODELS))
    s.add_argument("--traces", type=_names(TRACES), default=",".join(PAPER_TRACES))
    s.add_argument("--systems", type=_names(list(SYSTEMS)), default=",".join(PAPER_SYSTEMS))
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
