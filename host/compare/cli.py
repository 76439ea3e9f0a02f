"""``ndpim compare --out DIR [--small] [--workloads ...] [--systems ...]``: every system on every workload on one GPU
budget (host.compare.run), written as

* ``table.csv`` / ``table.md``: one row per (workload, system), rows numbered R01 ...;
* ``figures/<metric>.png``: one figure per metric (host.compare.verdict.METRICS);
* ``verdict.md``: the claims the table supports, each citing its rows (host.compare.verdict);
* ``compare.json``: rows, set-up and sources; ``workloads/*.csv`` and ``model/``: the inputs both hosts ran;
  ``runs/<workload>/<system>/{served,matched}/summary.json``: each run's summary.

Exit status 0 when at least one point served (failed and absent points are rows saying why), 1 when none did.
"""

import csv
import sys
import time
from pathlib import Path

from host.cli import add_name_list, float_range, int_range, out_dir

__all__ = ["add_parser", "cmd_compare", "cmd_sensitivity", "write_outputs", "TABLE_COLUMNS"]

#: table.md's columns (table.csv has every column)
TABLE_COLUMNS = ("row", "workload", "system", "paper", "role", "status", "tpot_ms_matched", "batch_matched",
                 "tpot_ms_mean", "tbt_ms_p99", "goodput_tok_s", "throughput_tok_s", "ttft_s_mean", "mean_batch",
                 "gpu_mem_gb", "link_gb_max", "energy_per_token_mj", "cost_usd_per_mtok")


def add_parser(sub) -> None:
    from .run import SYSTEMS
    from .workloads import WORKLOADS
    from . import metrics as M
    p = sub.add_parser("compare", help="PLoRA vs L3 vs each paper's baselines on one workload set and GPU budget: "
                                       "table, figures, verdict (docs/compare.md)")
    p.add_argument("--out", required=True, type=out_dir, help="directory for the table, figures and verdict")
    p.add_argument("--small", action="store_true", help="the small grid (few requests per workload; the tests')")
    add_name_list(p, "--workloads", list(WORKLOADS), help="only these workloads (default: all)")
    add_name_list(p, "--systems", list(SYSTEMS), help="only these systems (default: all)")
    p.add_argument("--requests", type=int_range(1, 100_000), default=None,
                   help="requests per workload (default 200; --small 6)")
    p.add_argument("--matched-batch", type=int_range(1, 4096), default=None,
                   help="clients of the matched-batch run (default 32; --small 3)")
    p.add_argument("--seed", type=int_range(0), default=0)
    p.add_argument("--rate", type=float_range(0.0, lo_open=True), default=10.0,
                   help="arrival rate of the open-loop workloads, requests/s (default 10, the PLoRA presets')")
    p.add_argument("--slo-ttft-s", type=float_range(0.0, lo_open=True), default=M.SLO_TTFT_S,
                   help=f"TTFT SLO, s (default {M.SLO_TTFT_S:g}: MLPerf Inference v5.0 interactive)")
    p.add_argument("--slo-tpot-ms", type=float_range(0.0, lo_open=True), default=M.SLO_TPOT_MS,
                   help=f"TPOT SLO, ms (default {M.SLO_TPOT_MS:g}: MLPerf Inference v5.0 interactive)")
    p.add_argument("--gpu-usd-per-hour", type=float_range(0.0, lo_open=True), default=M.GPU_USD_PER_HOUR,
                   help=f"GPU price, US$/h (default {M.GPU_USD_PER_HOUR:g}: H100 SXM on demand, early 2026)")
    p.set_defaults(func=cmd_compare)

    from .sensitivity import FULL as SFULL
    q = sub.add_parser("sensitivity", help="PLoRA vs L3 over CXL link bandwidth x ranksets x context length: where "
                                           "each overtakes the other (docs/compare.md)")
    q.add_argument("--out", required=True, type=out_dir, help="directory for the grid, crossover table and figures")
    q.add_argument("--small", action="store_true", help="the small grid (the tests')")
    q.add_argument("--links", type=_num_list(float, 1.0, 10_000.0), default=None,
                   help="PLoRA link rungs, GB/s per direction (default PLoRA's nine, 8 .. 1800)")
    q.add_argument("--ranksets", type=_num_list(int, 1, 32), default=None, help="L3 ranksets (default 1,2,4,8)")
    q.add_argument("--contexts", type=_num_list(int, 16, 131_072 - 128), default=None,
                   help="context lengths, increasing (default 1024,4096,16384,65536)")
    q.add_argument("--requests", type=int_range(1, 10_000), default=None,
                   help=f"requests per context (default {SFULL['requests']})")
    q.add_argument("--seed", type=int_range(0), default=0)
    q.add_argument("--no-hybrid", action="store_true", help="leave the hybrid (host/hybrid) out of the grid")
    q.set_defaults(func=cmd_sensitivity)


def _num_list(kind, lo, hi):
    """argparse type: a comma-separated list of numbers in [lo, hi]."""
    import argparse

    def parse(text):
        try:
            vals = tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"a comma-separated list of {kind.__name__} values, got {text!r}")
        if not vals:
            raise argparse.ArgumentTypeError("give one or more values")
        bad = [v for v in vals if not lo <= v <= hi]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad} outside the allowed range {lo:g} .. {hi:g}")
        return vals
    return parse


def _cell(v):
    if isinstance(v, float):
        return "-" if v != v else f"{v:.4g}"
    return "-" if v is None else str(v)


def write_outputs(result: dict, out) -> dict:
    from .figures import plot_all
    from .verdict import claims, render
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    cols = list(dict.fromkeys(["row"] + [k for r in rows for k in r]))
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in cols})
    md = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    md += ["| " + " | ".join(_cell(r.get(c)) for c in TABLE_COLUMNS) + " |" for r in rows]
    notes = ["", "Reasons, link traffic and LoRA cost per row:", ""]
    notes += [f"- {r['row']} {r['workload']} / {r['system']}: " + "; ".join(
        x for x in (r.get("reason"), f"slo {r['slo']}" if r.get("slo") else "",
                    f"links: {r['link_traffic']}" if r.get("link_traffic") else "",
                    f"LoRA cost {r['lora_cost']}" if r.get("lora_cost") else "",
                    f"matched run: {r['matched_status']}" if r.get("matched_status", "served") != "served" else "")
        if x) for r in rows]
    s = result["setup"]
    head = ["# ndpim compare: table", "", f"GPU budget: {s['gpu_budget']}. Model: {s['model']}. "
            f"{s['requests_per_workload']} requests per workload, matched batch {s['matched_batch']}. "
            f"Energy: {s['sources']['energy']}. Cost: GPU ${s['gpu_usd_per_hour']:g}/h ({s['sources']['gpu_price']}); "
            f"added memory at {s['sources']['dram_price']}, {s['sources']['amortisation']}; NDP / PIM logic unpriced "
            f"(no public price): a lower bound for plora, l3, r-pim.", ""]
    (out / "table.md").write_text("\n".join(head + md + notes) + "\n")
    figs = plot_all(rows, out / "figures")
    (out / "verdict.md").write_text(render(rows, s) + "\n")
    from host.serving.rundir import write_json
    write_json(out / "compare.json", {**result, "claims": claims(rows)})
    return {"figures": [str(p) for p in figs]}


def cmd_compare(args):
    from .run import FULL, SMALL, SYSTEMS, Grid, run_grid
    from .workloads import WORKLOADS
    size = SMALL if args.small else FULL
    grid = Grid(workloads=tuple(args.workloads.split(",")) if args.workloads else tuple(WORKLOADS),
                systems=tuple(args.systems.split(",")) if args.systems else tuple(SYSTEMS),
                requests=args.requests or size["requests"], matched_batch=args.matched_batch or size["matched_batch"],
                seed=args.seed, rate_per_s=args.rate, slo_ttft_s=args.slo_ttft_s, slo_tpot_ms=args.slo_tpot_ms,
                gpu_usd_per_hour=args.gpu_usd_per_hour)
    t0 = time.perf_counter()

    def say(r):
        print(f"{r['workload']:<11}{r['system']:<17}{r['status']:<8}"
              + (f"TPOT {r['tpot_ms_mean']:.3g} ms, {r['goodput_tok_s']:.4g} tok/s at SLO"
                 if r["status"] in ("served", "partial") else r.get("reason", "")), flush=True)
    result = run_grid(grid, args.out, progress=say)
    write_outputs(result, args.out)
    served = [r for r in result["rows"] if r["status"] in ("served", "partial")]
    print(f"wrote {args.out}/table.csv, table.md, verdict.md, figures/ ({len(result['rows'])} points, "
          f"{len(served)} served) in {time.perf_counter() - t0:.1f} s")
    if not served:
        print("FAILED: no point could serve", file=sys.stderr)
        return 1
    return 0


def cmd_sensitivity(args):
    from .sensitivity import FULL, SMALL, SensitivityGrid, run_sensitivity, write_sensitivity
    size = SMALL if args.small else FULL
    try:
        grid = SensitivityGrid(links=args.links or size["links"], ranksets=args.ranksets or size["ranksets"],
                               contexts=args.contexts or size["contexts"], requests=args.requests or size["requests"],
                               seed=args.seed, hybrid=not args.no_hybrid)
    except ValueError as e:
        from host.cli import UsageError
        raise UsageError(f"argument --contexts: {e}" if "contexts" in str(e) else str(e)) from None
    t0 = time.perf_counter()

    def say(p):
        axis = (f"link {p['link_gbps']:g} GB/s, {p['ranksets']} rs" if p["system"] == "hybrid" else
                f"link {p['link_gbps']:g} GB/s" if "link_gbps" in p else f"{p['ranksets']} ranksets")
        print(f"{p['system']:<8}{axis:<24}ctx {p['context']:<7}{p['status']:<7}"
              + (f"{p['throughput_tok_s']:.4g} tok/s" if p["status"] == "served" else p["reason"]), flush=True)
    result = run_sensitivity(grid, args.out, progress=say)
    write_sensitivity(result, args.out)
    for c in result["crossover"]:
        print(f"{c['l3_variant']}: link {c['link_gbps']:g} GB/s, {c['ranksets']} ranksets: {c['verdict']}")
    failed = [p for p in result["points"] if p["status"] != "served"]
    print(f"wrote {args.out}/ (points.csv, grid.csv, crossover.csv, crossover.md, crossover.png, throughput.png, "
          f"sensitivity.json): {len(result['points'])} runs in {time.perf_counter() - t0:.1f} s")
    if failed:
        print(f"FAILED: {len(failed)} of {len(result['points'])} runs could not serve: "
              + "; ".join(f"{p['system']} ctx {p['context']}: {p['reason']}" for p in failed[:4]), file=sys.stderr)
        return 1
    return 0
