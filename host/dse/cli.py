"""``ndpim dse --out DIR [--small] [--families ndp,pim] [--macs ...] [--dram-buffer-kib ...] [--rank-adders ...]
[--area-budget-mm2 A] [--power-budget-w P] [--pim-area-budget-mm2 A] [--pim-power-budget-w P]
[--jobs N | --cluster ADDRESS]``: design-space exploration of the PLoRA NDP core and of L3's DIMM-PIM rank PUs
(docs/dse.md). The two families are different systems: each has its own budgets and its own Pareto front.

Writes to DIR:

* ``points.csv``: every point (``family`` ndp or pim): configuration, area (logic / glue estimate / SRAM), power,
  throughput, per-mm^2 and per-W figures, budget status, Pareto membership (within its family), reason of a failure;
* ``pareto.md`` / ``pareto.csv``: each family's Pareto front (feasible points no other feasible point of the family
  dominates on throughput / mm^2 and throughput / W), with the excluded and failed points listed below it;
* ``pareto.png``: every point on the (tok/s per mm^2, tok/s per W) plane, one panel per family, the front joined,
  excluded points hollow;
* ``verilog/<point>/ndp_core.v`` + ``lint.txt``: each NDP front point's core as ``ndpim verilog --top ndp_core
  --preset paper --set ... --hier`` writes it, linted with Verilator; ``verilog/<point>/pim_rank_pu.v`` and
  ``pim_bank_pu.v``: each PIM front point's rank PU and bank PU as ``ndpim verilog --top pim_rank_pu (pim_bank_pu)
  --preset paper --set rank_adders=N`` writes them, linted whole (``--verilog none`` skips);
* ``dse.json``: rows, fronts, set-up, sources and what is not swept.

Exit status 0 when at least one point was priced and every front point's Verilog lints clean; 1 otherwise; 2 on a bad
argument (naming the allowed range).
"""

import csv
import sys
import time
from pathlib import Path

from host.cli import UsageError, float_range, out_dir

__all__ = ["add_parser", "cmd_dse", "run_dse", "write_outputs", "verilog_check", "TABLE_COLUMNS",
           "PIM_TABLE_COLUMNS"]

TABLE_COLUMNS = ("point", "macs", "lanes", "pe_rows", "dram_buffer_kib", "input_buffer_kib", "output_buffer_kib",
                 "devices", "core_mm2", "glue_estimate_mm2", "area_mm2", "power_w", "throughput_tok_s",
                 "tok_s_per_mm2", "tok_s_per_w", "budget", "pareto", "verilog")

PIM_TABLE_COLUMNS = ("point", "rank_adders", "dead_adders", "pim_fixed_cycles", "ranks", "rank_pu_logic_mm2",
                     "rank_pu_sram_mm2", "bank_pu_mm2", "rank_mm2", "area_mm2", "rank_w", "power_w", "throughput_tok_s",
                     "tok_s_per_mm2", "tok_s_per_w", "budget", "pareto", "verilog")

_FAMILY_TITLE = {"ndp": "NDP family (PLoRA NDP core)", "pim": "DIMM-PIM family (L3 rank PUs)"}


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


def _families(text):
    import argparse
    from .space import FAMILIES
    vals = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [v for v in vals if v not in FAMILIES]
    if bad or not vals:
        raise argparse.ArgumentTypeError(f"{bad or text!r}: choose from {','.join(FAMILIES)} (comma-separated)")
    return vals


def add_parser(sub) -> None:
    from host.sweep.executor import add_executor_args
    from .space import AXES, FAMILIES, GRIDS, PIM_AXES, PIM_GRIDS
    p = sub.add_parser("dse", help="design-space exploration of the NDP core and the DIMM-PIM rank PUs under an "
                                   "area / power budget: Pareto table and figure of throughput per mm^2 and per W "
                                   "(docs/dse.md)")
    p.add_argument("--out", required=True, type=out_dir, help="directory for the table, figure and Verilog")
    p.add_argument("--small", action="store_true", help="the small grids and workloads (the tests')")
    p.add_argument("--families", type=_families, default=FAMILIES,
                   help=f"which families to price, comma-separated (default {','.join(FAMILIES)}): ndp = the PLoRA "
                        "NDP core (--macs, --*-buffer-kib), pim = L3's DIMM-PIM rank PUs (--rank-adders)")
    for axis, ((lo, hi), doc) in AXES.items():
        p.add_argument(f"--{axis.replace('_', '-')}", type=_axis_list(axis), default=None,
                       help=f"{doc}, comma-separated, {lo} .. {hi} (default {','.join(map(str, GRIDS['full'][axis]))})")
    for axis, ((lo, hi), doc) in PIM_AXES.items():
        p.add_argument(f"--{axis.replace('_', '-')}", type=_axis_list(axis), default=None,
                       help=f"PIM: {doc}, comma-separated, {lo} .. {hi} (default "
                            f"{','.join(map(str, PIM_GRIDS['full'][axis]))}); a count needs its RTL calibration "
                            f"(python -m sim.bench.pim --calibrate paper-a<N>), else its row fails saying so")
    p.add_argument("--area-budget-mm2", type=float_range(0.0, lo_open=True), default=None,
                   help="exclude NDP points whose NDP logic (all devices) exceeds this area, mm^2")
    p.add_argument("--power-budget-w", type=float_range(0.0, lo_open=True), default=None,
                   help="exclude NDP points whose NDP logic (all devices) exceeds this peak power, W")
    p.add_argument("--pim-area-budget-mm2", type=float_range(0.0, lo_open=True), default=None,
                   help="exclude PIM points whose PIM logic (rank PUs + bank PUs of every rank) exceeds this area, "
                        "mm^2")
    p.add_argument("--pim-power-budget-w", type=float_range(0.0, lo_open=True), default=None,
                   help="exclude PIM points whose PIM logic (every rank) exceeds this peak power, W")
    p.add_argument("--verilog", choices=("pareto", "none"), default="pareto",
                   help="generate and lint the Verilog of the fronts' points (default) or skip it")
    p.add_argument("--no-area-cache", action="store_true",
                   help="map every module again instead of reading build/area_cache (same figures, slower)")
    add_executor_args(p)
    p.set_defaults(func=cmd_dse)


def run_dse(points, workload, *, executor, cache=True, budgets=(None, None), pim_budgets=(None, None),
            pim_workload=None, say=print) -> dict:
    """Price ``points`` (either family; ``workload`` the NDP points', ``pim_workload`` the PIM points', default
    :data:`host.dse.price.PIM_WORKLOADS` ``full``) on ``executor`` (the first point of each family in this
    process, filling the area cache the others read), apply each family's budgets and find each family's front."""
    from .pareto import apply_budgets, pareto_front
    from .price import PIM_WORKLOADS, price_point
    from .space import FAMILIES
    pim_workload = pim_workload if pim_workload is not None else PIM_WORKLOADS["full"]
    t0 = time.perf_counter()
    jobs = [(p, pim_workload if p.family == "pim" else workload, cache) for p in points]
    first = {}
    for i, p in enumerate(points):
        first.setdefault(p.family, i)
    rows = [None] * len(jobs)
    for i in sorted(first.values()):
        rows[i] = price_point(jobs[i])
        _say_row(rows[i], say)
    left = [i for i, r in enumerate(rows) if r is None]
    rest = executor.map(price_point, [jobs[i] for i in left], desc="dse: points") if left else []
    for i, r in zip(left, rest):
        rows[i] = r
        _say_row(r, say)
    seconds = time.perf_counter() - t0
    fronts = {}
    for fam, b in zip(FAMILIES, (budgets, pim_budgets)):
        apply_budgets([r for r in rows if r["family"] == fam], *b)
        feasible = [i for i, r in enumerate(rows) if r["family"] == fam and r["budget"] == "feasible"]
        fronts[fam] = [feasible[k] for k in pareto_front([rows[i] for i in feasible])]
    front = sorted(i for f in fronts.values() for i in f)
    for i, r in enumerate(rows):
        r["pareto"] = i in front
    return {"rows": rows, "front": front, "fronts": fronts, "seconds": seconds,
            "points_per_s": len(rows) / seconds if seconds > 0 else float("nan")}


def _say_row(r, say):
    if r["status"] != "priced":
        say(f"{r['point']:<26}FAILED: {r['reason']}")
    elif r["family"] == "pim":
        say(f"{r['point']:<26}{r['rank_adders']:>3} adders {r['rank_mm2']:8.3f} mm^2/rank {r['rank_w']:7.3f} W/rank"
            f" x {r['ranks']}  {r['throughput_tok_s']:9.1f} tok/s  ({r['seconds']:.1f} s)")
    else:
        say(f"{r['point']:<26}{r['lanes']:>4} x {r['pe_rows']:<3} {r['core_mm2']:8.3f} mm^2/core {r['core_w']:7.3f} W"
            f"/core x {r['devices']}  {r['throughput_tok_s']:9.1f} tok/s  ({r['seconds']:.1f} s)")


def pim_verilog_check(row, out, *, say=print) -> dict:
    """Generate the rank PU and bank PU of a priced PIM row as ``ndpim verilog --top pim_rank_pu --preset paper --set
    rank_adders=N`` (and ``--top pim_bank_pu``) does and lint them whole (``ndpim lint DIR``)."""
    import contextlib
    import io
    from host.cli import main
    from .price import pim_point_sets
    from .space import PIMPoint
    point = PIMPoint(row["rank_adders"])
    d = Path(out) / "verilog" / point.name
    sets = [x for k, v in pim_point_sets(point) for x in ("--set", f"{k}={v}")]
    cmds = [["verilog", "--top", top, "--preset", "paper", "--out", str(d), *sets]
            for top in ("pim_rank_pu", "pim_bank_pu")]          # one top per ndpim verilog --preset
    t0 = time.perf_counter()
    for argv in cmds:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                rc = main(argv)
            except SystemExit as e:         # an argument error of the command line built here
                rc = e.code
        if rc:
            return {"verilog": f"failed: ndpim {' '.join(argv)} exited {rc}", "lint_ok": False}
    lint_argv = ["lint", str(d)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        lrc = main(lint_argv)
    (d / "lint.txt").write_text(buf.getvalue())
    (d / "command.txt").write_text("".join(f"ndpim {' '.join(a)}\n" for a in (*cmds, lint_argv)))
    last = buf.getvalue().strip().splitlines()[-1] if buf.getvalue().strip() else ""
    status = ("lint-clean" if lrc == 0 else "lint problems") + " (rank PU + bank PU, whole)"
    path = d / "pim_rank_pu.v"
    say(f"{point.name}: {path} {status}: {last} ({time.perf_counter() - t0:.0f} s)")
    return {"verilog": status, "lint_ok": lrc == 0, "verilog_path": str(path), "lint_summary": last}


def verilog_check(row, out, *, say=print) -> dict:
    """Generate the core of a priced row as ``ndpim verilog --top ndp_core --preset paper --set ... --hier
    --counts-only NDPCore --counts-only PEArray`` does (the two glue modules as black-box stubs, the paper-geometry
    way of docs/ndp_core.md: their own conversion ran past 10 minutes at 256 MACs on this 2-core machine) and lint
    every non-stub module as its own top (``ndpim lint --each-module``). The glue is therefore not linted here. A
    PIM row (``family`` pim): :func:`pim_verilog_check`."""
    if row.get("family") == "pim":
        return pim_verilog_check(row, out, say=say)
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
    fronts = result.get("fronts") or {"ndp": result["front"]}
    md = ["# ndpim dse: Pareto fronts", "",
          f"{len(rows)} points in {result['seconds']:.1f} s ({result['points_per_s']:.3g} points/s, "
          f"{s['executor']}). Each family is its own system, with its own budgets and front.", ""]
    for fam, cols in (("ndp", TABLE_COLUMNS), ("pim", PIM_TABLE_COLUMNS)):
        frows = [r for r in rows if r.get("family", "ndp") == fam]
        if not frows:
            continue
        src = s["sources"]
        if fam == "ndp":
            md += [f"## {_FAMILY_TITLE[fam]}", "", f"Workload: {s['workload']}. Budgets: area "
                   f"{s['area_budget_mm2'] or 'none'} mm^2, power {s['power_budget_w'] or 'none'} W (NDP logic of "
                   f"all devices).", "", f"Area: {src['area']}", "", f"Power: {src['power']}", "",
                   f"Throughput: {src['throughput']}", ""]
        else:
            md += [f"## {_FAMILY_TITLE[fam]}", "", f"Workload: {s['pim_workload']}. Budgets: area "
                   f"{s['pim_area_budget_mm2'] or 'none'} mm^2, power {s['pim_power_budget_w'] or 'none'} W (PIM "
                   f"logic of every rank).", "", f"Area: {src['pim_area']}", "", f"Power: {src['pim_power']}", "",
                   f"Throughput: {src['pim_throughput']}", ""]
        md += [f"### Front, {fam} (no feasible {fam} point is at least as good on both tok/s per mm^2 and tok/s "
               f"per W and better on one)", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        md += ["| " + " | ".join(_cell(rows[i].get(c)) for c in cols) + " |" for i in fronts.get(fam, [])]
        md += ["", f"### All {fam} points", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        md += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in frows]
        md += [""]
    failed = [r for r in rows if r["status"] != "priced"]
    if failed:
        md += ["## Not priced", ""] + [f"- {r['point']}: {r['reason']}" for r in failed] + [""]
    md += ["## Not swept", ""] + [f"- {k}: {v}" for k, v in s["not_swept"].items()]
    (out / "pareto.md").write_text("\n".join(md) + "\n")

    fams = [f for f in ("ndp", "pim") if any(r.get("family", "ndp") == f for r in rows)] or ["ndp"]
    fig, axes = plt.subplots(1, len(fams), figsize=(6.4 * len(fams), 4.6), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        _plot_family(ax, fig, fam, [r for r in rows if r.get("family", "ndp") == fam],
                     [rows[i] for i in fronts.get(fam, [])], matplotlib)
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=120)
    plt.close(fig)
    write_json(out / "dse.json", {k: v for k, v in result.items()})
    return [out / n for n in ("points.csv", "pareto.csv", "pareto.md", "pareto.png", "dse.json")]


def _plot_family(ax, fig, fam, rows, front, matplotlib):
    """One family's panel of pareto.png: feasible points coloured by MACs / rank adders, over-budget hollow."""
    colour, what, unit = (("macs", "MACs", "NDP-logic") if fam == "ndp" else
                          ("rank_adders", "rank-PU adders", "PIM-logic (all ranks)"))
    priced = [r for r in rows if r["status"] == "priced"]
    for feas, style in ((True, dict(marker="o")), (False, dict(marker="o", facecolors="none", edgecolors="grey"))):
        pts = [r for r in priced if (r["budget"] == "feasible") == feas]
        if pts:
            kw = dict(style)
            if feas:
                kw["c"] = [r[colour] for r in pts]
                kw["cmap"] = "viridis"
                if len({r[colour] for r in pts}) > 1:
                    kw["norm"] = matplotlib.colors.LogNorm()
            sc = ax.scatter([r["tok_s_per_mm2"] for r in pts], [r["tok_s_per_w"] for r in pts],
                            label="feasible" if feas else "over budget", **kw)
            if feas:
                fig.colorbar(sc, ax=ax, label=what)
    fr = sorted(front, key=lambda r: r["tok_s_per_mm2"])
    if fr:
        ax.plot([r["tok_s_per_mm2"] for r in fr], [r["tok_s_per_w"] for r in fr], "r-", lw=1)
        ax.scatter([r["tok_s_per_mm2"] for r in fr], [r["tok_s_per_w"] for r in fr], s=160, facecolors="none",
                   edgecolors="red", linewidths=1.5, label="Pareto front")
        for r in fr:
            ax.annotate(r["point"], (r["tok_s_per_mm2"], r["tok_s_per_w"]), fontsize=6, xytext=(-6, 6),
                        textcoords="offset points", ha="right")
    ax.set_xlabel(f"throughput per {unit} area, tok/s per mm^2")
    ax.set_ylabel(f"throughput per {unit} peak power, tok/s per W")
    ax.set_title(f"{_FAMILY_TITLE[fam]}: {len(priced)} points priced, {len(fr)} on the front", fontsize=9)
    if priced:
        ax.legend(fontsize=7)


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
    "pim_area": "sim/energy/area.py pim_area at the point's PIMConfig: the rank PU (pim_rank_pu, 256 KB buffer as "
                "SRAM) + chips x banks = 128 bank PUs per rank, mapped as the NDP core is (NanGate45, FreePDK45 "
                "SRAM, no placement or routing overhead); x the host memory's ranks (16 channels x 4 ranks, L3 "
                "Table 2)",
    "pim_power": "peak: sim/energy/area.py pim_power at the point's PIMConfig: one all-bank RD every tCCD_L, every "
                 "bank PU's multipliers / adders and every rank-PU FP unit one operation per RD, one 64-bit buffer "
                 "read per RD (Horowitz 45 nm), + leakage; PIM logic only (no DRAM, link, GPU)",
    "pim_throughput": "host.l3.run.run_l3 (ndpim l3 run --set pim.rank_adders=N) with the DIMM-PIM model "
                      "calibrated on the RTL of the point's rank PU (data/pim_rtl_calibration.json, python -m "
                      "sim.bench.pim --calibrate paper-a<N>); no calibration: a failed row, no stand-in",
}


def cmd_dse(args):
    from host.sweep.executor import get_executor
    from .price import PIM_WORKLOADS, WORKLOADS
    from .space import AXES, GRIDS, NOT_SWEPT, PIM_AXES, PIM_GRIDS, grid_points, pim_grid_points
    from dataclasses import asdict
    size = "small" if args.small else "full"
    axes = {a: getattr(args, a) or GRIDS[size][a] for a in AXES}
    pim_axes = {a: getattr(args, a) or PIM_GRIDS[size][a] for a in PIM_AXES}
    points = (grid_points(axes) if "ndp" in args.families else []) + \
        (pim_grid_points(pim_axes) if "pim" in args.families else [])
    workload, pim_workload = WORKLOADS[size], PIM_WORKLOADS[size]
    if args.cluster:
        try:
            import dask.distributed  # noqa: F401
        except ModuleNotFoundError:
            raise UsageError("argument --cluster: dask.distributed is not installed (pip install "
                             "'dask[distributed]', a dependency of ndpim)") from None
    t0 = time.perf_counter()
    if "ndp" in args.families:
        print(f"ndpim dse: ndp: {sum(p.family == 'ndp' for p in points)} points "
              f"({', '.join(f'{a} {axes[a]}' for a in AXES)}), workload {workload}", flush=True)
    if "pim" in args.families:
        print(f"ndpim dse: pim: {sum(p.family == 'pim' for p in points)} points "
              f"({', '.join(f'{a} {pim_axes[a]}' for a in PIM_AXES)}), workload {pim_workload}", flush=True)
    with get_executor(args.cluster, args.jobs) as ex:
        result = run_dse(points, workload, executor=ex, cache=not args.no_area_cache,
                         budgets=(args.area_budget_mm2, args.power_budget_w),
                         pim_budgets=(args.pim_area_budget_mm2, args.pim_power_budget_w), pim_workload=pim_workload,
                         say=lambda s: print(s, flush=True))
        executor = ex.describe()
    rows = result["rows"]
    lint_ok = True
    for i in result["front"]:
        if args.verilog == "none":
            rows[i]["verilog"] = "not generated (--verilog none)"
            continue
        rows[i].update(verilog_check(rows[i], args.out, say=lambda s: print(s, flush=True)))
        lint_ok &= bool(rows[i].get("lint_ok"))
    result["setup"] = {"families": list(args.families), "axes": axes, "pim_axes": pim_axes,
                       "workload": asdict(workload), "pim_workload": asdict(pim_workload),
                       "area_budget_mm2": args.area_budget_mm2, "power_budget_w": args.power_budget_w,
                       "pim_area_budget_mm2": args.pim_area_budget_mm2, "pim_power_budget_w": args.pim_power_budget_w,
                       "executor": executor, "sources": SOURCES, "not_swept": NOT_SWEPT,
                       "objectives": "maximise tok_s_per_mm2 and tok_s_per_w, within each family"}
    paths = write_outputs(result, args.out)
    priced = [r for r in rows if r["status"] == "priced"]
    for k, v in NOT_SWEPT.items():
        print(f"not swept: {k}: {v}")
    print(f"wrote {', '.join(str(p) for p in paths)}: {len(rows)} points ({len(priced)} priced, "
          f"{sum(r['budget'].startswith('excluded') for r in rows)} over budget, "
          + ", ".join(f"{len(v)} on the {k} front" for k, v in result["fronts"].items() if k in args.families)
          + f") in {time.perf_counter() - t0:.1f} s; pricing {result['points_per_s']:.3g} points/s")
    if not priced:
        print("FAILED: no point could be priced", file=sys.stderr)
        return 1
    if not lint_ok:
        print("FAILED: a front point's Verilog is not lint-clean (verilog/*/lint.txt)", file=sys.stderr)
        return 1
    return 0
