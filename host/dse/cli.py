"""``ndpim dse --out DIR [--small] [--macs ...] [--dram-buffer-kib ...] [--area-budget-mm2 A] [--power-budget-w P]
[--jobs N | --cluster ADDRESS]``: design-space exploration of the PLoRA NDP core (docs/dse.md).

Writes to DIR:

* ``points.csv``: every point: configuration, area (logic / glue estimate / SRAM), power, throughput, per-mm^2 and
  per-W figures, budget status, Pareto membership, reason of a failure;
* ``pareto.md`` / ``pareto.csv``: the Pareto front (feasible points no other feasible point dominates on
  throughput / mm^2 and throughput / W), with the excluded and failed points listed below it;
* ``pareto.png``: every point on the (tok/s per mm^2, tok/s per W) plane, the front joined, excluded points hollow;
* ``verilog/<point>/ndp_core.v`` + ``lint.txt``: each front point's core as ``ndpim verilog --top ndp_core --preset
  paper --set ... --hier`` writes it, linted with Verilator (``--verilog none`` skips);
* ``dse.json``: rows, front, set-up, sources and what is not swept.

Exit status 0 when at least one point was priced and every front point's Verilog lints clean; 1 otherwise; 2 on a bad
argument (naming the allowed range).
"""

import csv
import sys
import time
from pathlib import Path

from host.cli import UsageError, float_range, out_dir

__all__ = ["add_parser", "cmd_dse", "run_dse", "write_outputs", "verilog_check", "TABLE_COLUMNS"]

TABLE_COLUMNS = ("point", "macs", "lanes", "pe_rows", "dram_buffer_kib", "input_buffer_kib", "output_buffer_kib",
                 "devices", "core_mm2", "glue_estimate_mm2", "area_mm2", "power_w", "throughput_tok_s",
                 "tok_s_per_mm2", "tok_s_per_w", "budget", "pareto", "verilog")


def _axis_list(name):
    import argparse
    from .space import check_axis

    def parse(text):
        try:
            vals = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"a comma-separated list of integers, got {text!r}") from None
        if not vals:
            raise argparse.ArgumentTypeError("give one or more values")
        try:
            return check_axis(name, vals)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None
    return parse


def add_parser(sub) -> None:
    from host.sweep.executor import add_executor_args
    from .space import AXES, GRIDS
    p = sub.add_parser("dse", help="design-space exploration of the NDP core under an area / power budget: Pareto "
                                   "table and figure of throughput per mm^2 and per W (docs/dse.md)")
    p.add_argument("--out", required=True, type=out_dir, help="directory for the table, figure and Verilog")
    p.add_argument("--small", action="store_true", help="the small grid and workload (the tests')")
    for axis, ((lo, hi), doc) in AXES.items():
        p.add_argument(f"--{axis.replace('_', '-')}", type=_axis_list(axis), default=None,
                       help=f"{doc}, comma-separated, {lo} .. {hi} (default {','.join(map(str, GRIDS['full'][axis]))})")
    p.add_argument("--area-budget-mm2", type=float_range(0.0, lo_open=True), default=None,
                   help="exclude points whose NDP logic (all devices) exceeds this area, mm^2")
    p.add_argument("--power-budget-w", type=float_range(0.0, lo_open=True), default=None,
                   help="exclude points whose NDP logic (all devices) exceeds this peak power, W")
    p.add_argument("--verilog", choices=("pareto", "none"), default="pareto",
                   help="generate and lint the Verilog of the front's points (default) or skip it")
    p.add_argument("--no-area-cache", action="store_true",
                   help="map every module again instead of reading build/area_cache (same figures, slower)")
    add_executor_args(p)
    p.set_defaults(func=cmd_dse)


def run_dse(points, workload, *, executor, cache=True, budgets=(None, None), say=print) -> dict:
    """Price ``points`` on ``executor`` (the first one in this process, filling the area cache the others read),
    apply the budgets and find the front."""
    from .pareto import apply_budgets, pareto_front
    from .price import price_point
    t0 = time.perf_counter()
    jobs = [(p, workload, cache) for p in points]
    rows = [price_point(jobs[0])] if jobs else []
    if rows:
        _say_row(rows[0], say)
    rest = executor.map(price_point, jobs[1:], desc="dse: points") if len(jobs) > 1 else []
    for r in rest:
        _say_row(r, say)
    rows += rest
    seconds = time.perf_counter() - t0
    apply_budgets(rows, *budgets)
    feasible = [i for i, r in enumerate(rows) if r["budget"] == "feasible"]
    front = [feasible[k] for k in pareto_front([rows[i] for i in feasible])]
    for i, r in enumerate(rows):
        r["pareto"] = i in front
    return {"rows": rows, "front": front, "seconds": seconds,
            "points_per_s": len(rows) / seconds if seconds > 0 else float("nan")}


def _say_row(r, say):
    if r["status"] == "priced":
        say(f"{r['point']:<26}{r['lanes']:>4} x {r['pe_rows']:<3} {r['core_mm2']:8.3f} mm^2/core {r['core_w']:7.3f} W"
            f"/core x {r['devices']}  {r['throughput_tok_s']:9.1f} tok/s  ({r['seconds']:.1f} s)")
    else:
        say(f"{r['point']:<26}FAILED: {r['reason']}")


def verilog_check(row, out, *, say=print) -> dict:
    """Generate the core of a priced row as ``ndpim verilog --top ndp_core --preset paper --set ... --hier
    --counts-only NDPCore --counts-only PEArray`` does (the two glue modules as black-box stubs, the paper-geometry
    way of docs/ndp_core.md: their own conversion ran past 10 minutes at 256 MACs on this 2-core machine) and lint
    every non-stub module as its own top (``ndpim lint --each-module``). The glue is therefore not linted here."""
    import contextlib
    import io
    from host.cli import main
    from .price import point_sets
    from .space import Point
    point = Point(row["macs"], row["dram_buffer_kib"], row["input_buffer_kib"], row["output_buffer_kib"])
    d = Path(out) / "verilog" / point.name
    argv = ["verilog", "--top", "ndp_core", "--preset", "paper", "--out", str(d), "--hier"]
    for k, v in point_sets(point):
        argv += ["--set", f"{k}={v}"]
    stubs = True
    argv += ["--counts-only", "NDPCore", "--counts-only", "PEArray"]
    t0 = time.perf_counter()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = main(argv)
    if rc:
        return {"verilog": f"failed: ndpim {' '.join(argv)} exited {rc}", "lint_problems": None}
    path = d / "ndp_core.v"
    lint_argv = ["lint", "--each-module", str(path)] if stubs else ["lint", str(d)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        lrc = main(lint_argv)
    (d / "lint.txt").write_text(buf.getvalue())
    (d / "command.txt").write_text(f"ndpim {' '.join(argv)}\nndpim {' '.join(lint_argv)}\n")
    last = buf.getvalue().strip().splitlines()[-1] if buf.getvalue().strip() else ""
    status = ("lint-clean" if lrc == 0 else "lint problems") + (" (glue stubs: NDPCore, PEArray not linted)"
                                                                 if stubs else " (whole core)")
    say(f"{point.name}: {path} {status}: {last} ({time.perf_counter() - t0:.0f} s)")
    return {"verilog": status, "lint_ok": lrc == 0, "verilog_path": str(path), "lint_summary": last}


def _cell(v):
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return "-" if v != v else f"{v:.4g}"
    return "-" if v is None or v == "" else str(v)


def write_outputs(result: dict, out) -> list:
    """points.csv, pareto.csv, pareto.md, pareto.png, dse.json under ``out``; returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from host.serving.rundir import write_json
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    cols = list(dict.fromkeys([k for r in rows for k in r if k != "traceback"]))
    for name, subset in (("points.csv", rows), ("pareto.csv", [rows[i] for i in result["front"]])):
        with open(out / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            for r in subset:
                w.writerow({k: r.get(k, "") for k in cols})
    s = result["setup"]
    md = ["# ndpim dse: Pareto front", "",
          f"Workload: {s['workload']}. Budgets: area {s['area_budget_mm2'] or 'none'} mm^2, power "
          f"{s['power_budget_w'] or 'none'} W (NDP logic of all devices). {len(rows)} points in "
          f"{result['seconds']:.1f} s ({result['points_per_s']:.3g} points/s, {s['executor']}).", "",
          f"Area: {s['sources']['area']}", "", f"Power: {s['sources']['power']}", "",
          f"Throughput: {s['sources']['throughput']}", "",
          "## Front (no feasible point is at least as good on both tok/s per mm^2 and tok/s per W and better on one)",
          "", "| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    md += ["| " + " | ".join(_cell(rows[i].get(c)) for c in TABLE_COLUMNS) + " |" for i in result["front"]]
    md += ["", "## All points", "", "| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    md += ["| " + " | ".join(_cell(r.get(c)) for c in TABLE_COLUMNS) + " |" for r in rows]
    failed = [r for r in rows if r["status"] != "priced"]
    if failed:
        md += ["", "## Not priced", ""] + [f"- {r['point']}: {r['reason']}" for r in failed]
    md += ["", "## Not swept", ""] + [f"- {k}: {v}" for k, v in s["not_swept"].items()]
    (out / "pareto.md").write_text("\n".join(md) + "\n")

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    priced = [r for r in rows if r["status"] == "priced"]
    for feas, style in ((True, dict(marker="o")), (False, dict(marker="o", facecolors="none", edgecolors="grey"))):
        pts = [r for r in priced if (r["budget"] == "feasible") == feas]
        if pts:
            kw = dict(style)
            if feas:
                kw["c"] = [r["macs"] for r in pts]
                kw["cmap"] = "viridis"
                kw["norm"] = matplotlib.colors.LogNorm()
            sc = ax.scatter([r["tok_s_per_mm2"] for r in pts], [r["tok_s_per_w"] for r in pts],
                            label="feasible" if feas else "over budget", **kw)
            if feas:
                fig.colorbar(sc, ax=ax, label="MACs")
    fr = sorted((rows[i] for i in result["front"]), key=lambda r: r["tok_s_per_mm2"])
    if fr:
        ax.plot([r["tok_s_per_mm2"] for r in fr], [r["tok_s_per_w"] for r in fr], "r-", lw=1)
        ax.scatter([r["tok_s_per_mm2"] for r in fr], [r["tok_s_per_w"] for r in fr], s=160, facecolors="none",
                   edgecolors="red", linewidths=1.5, label="Pareto front")
        for r in fr:
            ax.annotate(r["point"], (r["tok_s_per_mm2"], r["tok_s_per_w"]), fontsize=6, xytext=(-6, 6),
                        textcoords="offset points", ha="right")
    ax.set_xlabel("throughput per NDP-logic area, tok/s per mm^2")
    ax.set_ylabel("throughput per NDP-logic peak power, tok/s per W")
    ax.set_title(f"ndpim dse: {len(priced)} points priced, {len(fr)} on the front", fontsize=9)
    if priced:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=120)
    plt.close(fig)
    write_json(out / "dse.json", {k: v for k, v in result.items()})
    return [out / n for n in ("points.csv", "pareto.csv", "pareto.md", "pareto.png", "dse.json")]


SOURCES = {
    "area": "sim/energy/area.py module_areas: NanGate45 typical cells via Yosys dfflibmap + abc (data/liberty), "
            "SRAM at FreePDK45 fakeram45_2048x39's um^2 per bit; glue of NDPCore / PEArray not mapped: the paper's "
            "generic-gate counts (docs/ndp_core.md) x lanes / 512 x the decoder's mapped um^2 per generic gate "
            "(estimate, column glue_estimate_mm2); no placement or routing overhead",
    "power": "peak: every FPMAC one FP16 multiply + accumulator add per cycle (Horowitz 45 nm, sim/energy/ops.py) + "
             "one A beat written and read in the DRAM ring per cycle + leakage (cells, SRAM, glue estimate); "
             "sim/energy/area.py ndp_power's activity at the point's geometry; NDP logic only (no DRAM, link, GPU)",
    "throughput": "host.plora.run (ndpim plora run) with the calibrated NDP model at the point's geometry "
                  "(host/plora/ndp_model.py, RTL calibration, kernels computed at a new geometry on first use)",
}


def cmd_dse(args):
    from host.sweep.executor import get_executor
    from .price import WORKLOADS
    from .space import AXES, GRIDS, NOT_SWEPT, grid_points
    from dataclasses import asdict
    size = "small" if args.small else "full"
    axes = {a: getattr(args, a) or GRIDS[size][a] for a in AXES}
    points = grid_points(axes)
    workload = WORKLOADS[size]
    if args.cluster:
        try:
            import dask.distributed  # noqa: F401
        except ModuleNotFoundError:
            raise UsageError("argument --cluster: dask.distributed is not installed (pip install "
                             "'dask[distributed]', a dependency of ndpim)") from None
    t0 = time.perf_counter()
    print(f"ndpim dse: {len(points)} points ({', '.join(f'{a} {axes[a]}' for a in AXES)}), workload {workload}",
          flush=True)
    with get_executor(args.cluster, args.jobs) as ex:
        result = run_dse(points, workload, executor=ex, cache=not args.no_area_cache,
                         budgets=(args.area_budget_mm2, args.power_budget_w), say=lambda s: print(s, flush=True))
        executor = ex.describe()
    rows = result["rows"]
    lint_ok = True
    for i in result["front"]:
        if args.verilog == "none":
            rows[i]["verilog"] = "not generated (--verilog none)"
            continue
        rows[i].update(verilog_check(rows[i], args.out, say=lambda s: print(s, flush=True)))
        lint_ok &= bool(rows[i].get("lint_ok"))
    result["setup"] = {"axes": axes, "workload": asdict(workload), "area_budget_mm2": args.area_budget_mm2,
                       "power_budget_w": args.power_budget_w, "executor": executor, "sources": SOURCES,
                       "not_swept": NOT_SWEPT, "objectives": "maximise tok_s_per_mm2 and tok_s_per_w"}
    paths = write_outputs(result, args.out)
    priced = [r for r in rows if r["status"] == "priced"]
    for k, v in NOT_SWEPT.items():
        print(f"not swept: {k}: {v}")
    print(f"wrote {', '.join(str(p) for p in paths)}: {len(rows)} points ({len(priced)} priced, "
          f"{sum(r['budget'].startswith('excluded') for r in rows)} over budget, {len(result['front'])} on the "
          f"front) in {time.perf_counter() - t0:.1f} s; pricing {result['points_per_s']:.3g} points/s")
    if not priced:
        print("FAILED: no point could be priced", file=sys.stderr)
        return 1
    if not lint_ok:
        print("FAILED: a front point's Verilog is not lint-clean (verilog/*/lint.txt)", file=sys.stderr)
        return 1
    return 0
