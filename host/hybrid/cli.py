"""``ndpim hybrid run``: one run of the LLaMA-scale hybrid (GPU + CXL NDP pool + DIMM-PIM; docs/hybrid.md)."""

import json
import sys
from pathlib import Path

__all__ = ["add_parser"]


def add_parser(sub) -> None:
    from host.cli import int_range, float_range, out_dir, existing_file
    from .run import MODELS, WORKLOADS
    from .decisions import DEFAULT_PIM_MIN_CONTEXT, DEFAULT_BORDERLINE
    g = sub.add_parser("hybrid", help="the PLoRA + L3 hybrid at LLaMA scale (docs/hybrid.md)")
    gs = g.add_subparsers(dest="hybrid_cmd", required=True)
    r = gs.add_parser("run", help="one run: workload or trace file -> run directory")
    r.add_argument("--model", default="llama2-7b", choices=list(MODELS))
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", choices=list(WORKLOADS), help="PLoRA's workloads or L3 Table 4's traces")
    src.add_argument("--trace", "--trace-file", dest="trace_file", type=existing_file, metavar="FILE",
                     help="a request trace (CSV / JSONL, docs/inputs.md)")
    r.add_argument("--requests", type=int_range(1, 1_000_000), default=None,
                   help="requests (default 100; a trace file: all of it)")
    r.add_argument("--rate", type=float_range(0.0, lo_open=True), default=None,
                   help="arrivals per second (default 10; a trace file: as given)")
    r.add_argument("--burst", action="store_true", help="every request arrives at t = 0")
    r.add_argument("--seed", type=int_range(0), default=0)
    r.add_argument("--devices", type=int_range(1, 4096), default=None, help="CXL NDP devices (default 4)")
    r.add_argument("--link-gbps", type=float_range(0.0, 100_000.0, lo_open=True), default=None,
                   help="the CXL devices' link, GB/s per direction (default CXL 3.1's 128)")
    r.add_argument("--ranksets", type=int_range(1, 32), default=None, help="DIMM-PIM ranksets (default 4)")
    r.add_argument("--host-memory-gb", type=float_range(1.0, 1 << 20), default=None,
                   help="DIMM-PIM host memory in GiB (default 2048)")
    r.add_argument("--ndp-model", default="auto", choices=["auto", "calibrated", "standin"])
    r.add_argument("--pim-min-context", type=int_range(1, 1 << 40), default=DEFAULT_PIM_MIN_CONTEXT,
                   help=f"final context (tokens) from which a request's KV prefers the DIMM-PIM "
                        f"(default {DEFAULT_PIM_MIN_CONTEXT})")
    r.add_argument("--borderline", type=float_range(1.0, 1024.0), default=DEFAULT_BORDERLINE,
                   help=f"factor around --pim-min-context within which load may move a request "
                        f"(default {DEFAULT_BORDERLINE:g}; 1: context only)")
    r.add_argument("--max-batch", type=int_range(1, 100_000), default=None, help="requests per batch (default 256)")
    r.add_argument("--out", required=True, type=out_dir, help="run directory to write")
    r.add_argument("--force", action="store_true", help="write into an --out directory that already holds files")
    r.set_defaults(func=cmd_run)


def cmd_run(args):
    from host.cli import check_run_dir
    from host.serving import EngineConfig
    from .run import HybridSpec, run_spec
    try:
        spec = HybridSpec(model=args.model, workload="file" if args.trace_file else args.workload,
                          trace_file=args.trace_file,
                          n_requests=args.requests if (args.requests or args.trace_file) else 100,
                          rate_per_s=args.rate if (args.rate or args.trace_file) else 10.0,
                          arrival="burst" if args.burst else "gamma", seed=args.seed, devices=args.devices, link_gbps=args.link_gbps,
                          ranksets=args.ranksets, host_memory_gb=args.host_memory_gb, ndp=args.ndp_model,
                          pim_min_context=args.pim_min_context, borderline=args.borderline,
                          max_batch=args.max_batch)
    except ValueError as e:
        raise SystemExit(f"ndpim hybrid run: {e}") from None
    check_run_dir(args)
    try:
        out = run_spec(spec, out_dir=args.out,
                       engine_config=EngineConfig(trace=True, record_iterations=True, progress=sys.stderr.isatty()))
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"ndpim hybrid run: {e}") from None
    s = out.summary
    wname = f"file:{Path(spec.trace_file).name}" if spec.trace_file else spec.workload
    keys = ("throughput_tok_s", "tbt_ms_mean", "tpot_ms_mean", "ttft_s_mean", "mean_batch")
    print(f"hybrid on {spec.model} / {wname}: " + ", ".join(f"{k} {s[k]:.4g}" for k in keys))
    print(f"KV residence: {json.dumps(s['residence'])} (why: {json.dumps(s['placement_reason'])})")
    print(f"busy: GPU {s['gpu_busy_frac']:.2f}, NDP {s['ndp_busy_frac']:.2f}, PIM {s['pim_busy_frac']:.2f}; "
          f"link bytes {json.dumps({k: round(v / 1e9, 3) for k, v in s['link_bytes'].items()})} GB")
    e = s["cost_model_err"]
    print(f"cost model (PLoRA VI-B + PIM terms) vs executed timeline: mean {100 * e['mean']:+.1f} %, "
          f"mean |err| {100 * e['mean_abs']:.1f} %, p99 |err| {100 * e['p99_abs']:.1f} %")
    en = s.get("energy_j", {})
    print(f"energy {s.get('energy_per_token_mj', float('nan')):.4g} mJ per token ("
          + ", ".join(f"{k} {v:.4g}" for k, v in en.items() if k != "total") + " J)")
    print(f"wrote {Path(args.out)}")
    if s.get("finished", 0) < s.get("requests", 0):
        print(f"FAILED: {s['requests'] - s['finished']} of {s['requests']} requests were not served",
              file=sys.stderr)
        return 1
    return 0
