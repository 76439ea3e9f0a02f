"""The ``ndpim`` command line: Verilog generation, lint, synthesis statistics, FP reports and benchmarks, and the
host model's command groups.

Command groups are pluggable: besides the built-in groups (``gpu``: host/gpu/cli.py), ``main`` imports each
module in ``PLUGINS`` that exists (``host.plora.cli``, ``host.l3.cli``) and calls its
``add_parser(subparsers)``, which adds its own group (``ndpim plora ...``, ``ndpim l3 ...``) and sets
``func`` on every parser it creates (``parser.set_defaults(func=...)``; ``func(args)`` returns an exit code or
None). A helper adding a group therefore never edits this file. A plugin module that exists but fails to import
is an error (it is not silently skipped).
"""

import argparse
import importlib
import math
import os
import sys
import time
from pathlib import Path

__all__ = ["main", "UsageError", "int_range", "float_range", "out_dir", "existing_file", "hardware_values", "check_run_dir",
           "add_name_list"]


class UsageError(Exception):
    """A command-line value that parses but cannot be used (a cross-flag check, an existing run directory): ``main``
    reports it as argparse reports a bad value -- usage, one line ``ndpim CMD: error: MESSAGE``, exit status 2. The
    message names the flag (``argument --out: ...``). Raised before the command does any work."""


def int_range(lo: int | None = None, hi: int | None = None):
    """argparse ``type``: an integer in ``lo..hi`` (either bound may be open); the message names the range."""
    where = (f" in {lo}..{hi}" if lo is not None and hi is not None else f" >= {lo}" if lo is not None
             else f" <= {hi}" if hi is not None else "")

    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer{where}, got {text!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be an integer{where}, got {v}")
        return v
    return parse


def float_range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False):
    """argparse ``type``: a finite number ``> lo`` (``lo_open``) or ``>= lo``, and ``<= hi``."""
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:.15g}")
    if hi is not None:
        parts.append(f"<= {hi:.15g}")
    where = " " + " and ".join(parts) if parts else ""

    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number{where}, got {text!r}") from None
        if not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be a finite number{where}, got {text}")
        return v
    return parse


def out_dir(text):
    """argparse ``type``: a directory to write into; refused when the path is an existing file."""
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise argparse.ArgumentTypeError(f"{parent} is a file, not a directory")
    return text


def add_name_list(parser, flag, allowed, *, default=None, help=None):
    """A list option that takes both ``FLAG a,b`` and ``FLAG a b`` (and mixes: ``FLAG a,b c``), every name one of
    ``allowed`` (a bad one: exit 2 naming it and the allowed list). The value is stored comma-joined (``"a,b,c"``),
    or ``default`` when the flag is absent."""
    allowed = list(allowed)

    class NameList(argparse.Action):
        def __call__(self, p, namespace, values, option_string=None):
            names = [n for v in values for n in str(v).split(",") if n]
            if not names:
                raise argparse.ArgumentError(self, f"expected one or more of {allowed}")
            bad = [n for n in names if n not in allowed]
            if bad:
                raise argparse.ArgumentError(self, f"unknown {', '.join(map(repr, bad))}; allowed: {allowed}")
            setattr(namespace, self.dest, ",".join(names))

    return parser.add_argument(flag, nargs="+", action=NameList, default=default, metavar="NAME",
                               help=(help + "; " if help else "") + "a,b or a b")


def cmd_plot(args):
    from host.plot import load_run, available_metrics, compare_rows, format_table, plot_runs, DEFAULT_TABLE_METRICS
    runs = []
    for r in args.runs:
        try:
            runs.append(load_run(r))
        except ValueError as exc:
            raise UsageError(f"argument RUN_DIR: {exc}") from None
    summ, its = available_metrics(runs)
    if args.list_metrics:
        print("summary.json metrics (every run): " + ", ".join(summ))
        print("iterations.csv columns (every run): " + (", ".join(its) or "none"))
        return 0
    metrics = [m for v in (args.metric or []) for m in v.split(",") if m]
    bad = [m for m in metrics if m not in summ and m not in its]
    if bad:
        raise UsageError(f"argument --metric: {', '.join(map(repr, bad))} is not a summary.json value or an "
                         f"iterations.csv column of every run (--list-metrics lists them)")
    table = [m for m in DEFAULT_TABLE_METRICS if m in summ] + [m for m in metrics if m in summ
                                                                 and m not in DEFAULT_TABLE_METRICS]
    rows = compare_rows(runs, table)
    print(format_table(rows))
    if args.table:
        import csv
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        with open(args.table, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"table: {args.table}")
    out = Path(args.out)
    for m in metrics:
        path = out / f"{m.replace('.', '_')}.png"
        plot_runs(runs, m, path)
        print(f"figure: {path}")
    return 0


def existing_file(text):
    """argparse ``type``: a path to an existing regular file (an input the command reads)."""
    p = Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a regular file")
    return text


def hardware_values(args, sections) -> dict:
    """``{section: {field: value}}`` of ``--hardware FILE`` with the ``--set section.field=value`` overrides on top
    (host.models.hardware_file), every value checked: a bad one is a :class:`UsageError` naming the flag."""
    from host.models.hardware_file import load_hardware, merge, parse_set
    values = None
    if args.hardware is not None:
        try:
            values = load_hardware(args.hardware, sections)
        except ValueError as e:
            raise UsageError(f"argument --hardware: {e}") from None
    sets = []
    for text in args.set or ():
        try:
            sets.append(parse_set(text, sections))
        except ValueError as e:
            raise UsageError(f"argument --set: {e}") from None
    return merge(values, sets)


def check_run_dir(args, *, default: str | None = None) -> None:
    """A run directory (``args.out``) that already holds files is not overwritten without ``--force``; ``default``:
    the command's default directory, which every run rewrites (``build/demo``)."""
    out = Path(args.out)
    if args.force or (default is not None and args.out == default):
        return
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"argument --out: {out} already holds files (a previous run?); pass --force to write "
                         f"over them")


def _tops(names):
    from hdl.tops import TOPS
    if not names:
        return dict(TOPS)
    unknown = [n for n in names if n not in TOPS]
    if unknown:
        raise UsageError(f"argument --top: unknown top(s) {unknown}; allowed: {sorted(TOPS)}")
    return {n: TOPS[n] for n in names}


def cmd_verilog(args):
    from host.topcfg import catalogue, describe
    if args.list and args.top:
        # every preset of the named tops, with its whole configuration (issue 32 item 9)
        cat = catalogue()
        for name in args.top:
            if name not in cat:
                raise UsageError(f"argument --top: unknown top {name!r}; tops: {sorted(cat)}")
            spec = cat[name]
            print(f"{name}: {spec.doc}")
            for preset in [spec.default] + sorted(p for p in spec.presets if p != spec.default):
                print(f"  preset {preset}{' (default)' if preset == spec.default else ''}:")
                for item in describe(spec.config(preset)).split(" "):
                    if item:
                        print(f"    {item}")
        return 0
    if args.list:
        cat = catalogue()
        print(f"{'top':<22}{'presets (default first)':<28}configuration of the default preset")
        for name, spec in sorted(cat.items()):
            presets = [spec.default] + sorted(p for p in spec.presets if p != spec.default)
            print(f"{name:<22}{', '.join(presets):<28}{describe(spec.config(), limit=14)}")
        print("\nndpim verilog --top T [--preset P] [--set FIELD=VALUE ...]: any field of the preset (dotted paths into "
              "nested configurations, e.g. --set ndp.lanes=16 --set ndp.macs=32); every value is validated.")
        return 0
    out = Path(args.out)
    if args.preset or args.set:
        if not args.top or len(args.top) != 1:
            raise UsageError("argument --top: --preset / --set need exactly one --top")
        spec, cfg = _configure(args.top[0], args)
        if args.hier:       # every distinct module once (sim/synth/hier.py): the paper core's flat Verilog is huge
            from sim.synth.hier import hier_verilog
            say = (lambda s: print(s, file=sys.stderr, flush=True))
            skip = tuple(args.counts_only or ())
            path = _cached_verilog(spec.name, ("hier", skip, cfg), lambda: None, out,
                                   text=lambda: hier_verilog(spec.name, spec.build(cfg), progress=say,
                                                             counts_only=skip))
        else:
            _flat_note(spec.name, cfg)
            # the key holds the component's class: tops sharing a configuration (the pim_* tops) never share it
            path = _cached_verilog(_file_stem(spec, cfg), (_component_class(spec, cfg).__name__, cfg),
                                   lambda: spec.build(cfg), out)
        print(path)
        return 0
    from host.topcfg import get_spec
    for name in _tops(args.top):
        spec = get_spec(name)
        print(_cached_verilog(name, spec.config(), lambda s=spec: s.build(s.config()), out))
    return 0


def _file_stem(spec, cfg) -> str:
    """The output file's name: the top whose default configuration ``cfg`` is, when another top is exactly that
    (``--top fp16_add --set fmt=fp32`` writes ``fp32_add.v``: the file name follows the format); else the top's."""
    from dataclasses import is_dataclass, asdict
    from host.topcfg import catalogue
    if not is_dataclass(cfg):
        return spec.name
    key = (type(cfg).__name__, asdict(cfg))
    d = spec.config()
    if is_dataclass(d) and (type(d).__name__, asdict(d)) == key:
        return spec.name
    # another top of the same component (the pim_* tops share one PIMConfig but build different components: a
    # match on the configuration alone named --top pim_rank_pu's file, and its cache entry, pim_bank_pu)
    kind = _component_class(spec, cfg)
    for other in catalogue().values():
        d = other.config()
        if (is_dataclass(d) and (type(d).__name__, asdict(d)) == key
                and _component_class(other, d) is kind):
            return other.name
    return spec.name


def _component_class(spec, cfg):
    """The class of the component ``spec`` builds at ``cfg`` (construction only, no elaboration)."""
    from host.topcfg import silence
    comp = spec.build(cfg)
    silence(comp)
    return type(comp)


def _configure(name, args) -> tuple:
    """``configure`` for the command line: a bad top, preset or ``--set`` is a :class:`UsageError` naming its flag."""
    from host.topcfg import configure, get_spec, parse_sets
    try:
        spec = get_spec(name)
    except ValueError as exc:
        raise UsageError(f"argument --top: {exc}") from None
    try:
        spec.config(args.preset)
    except ValueError as exc:
        raise UsageError(f"argument --preset: {exc}") from None
    try:
        return configure(name, args.preset, parse_sets(args.set))
    except ValueError as exc:
        raise UsageError(f"argument --set: {exc}") from None


def _cached_verilog(name, config, make, out_dir, text=None) -> Path:
    """``out_dir/<name>.v``, from ``build/verilog-cache/`` when the same design (a hash of the sources of hdl/ and
    sim/ and of ``config``) was generated before."""
    import shutil
    from sim.e2e.design_cache import design_hash
    from sim.backends.verilog import verilog_text
    key = design_hash(f"verilog {name} {config!r}")
    cache = Path("build/verilog-cache") / f"{key}.v"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.v"
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        with _heartbeat(f"generating {name}.v" + ("" if text else " (Amaranth's flat conversion)")):
            tmp.write_text(text() if text else verilog_text(make(), name))
        tmp.replace(cache)
    shutil.copyfile(cache, path)
    return path


#: Flat conversion of an NDP top (Amaranth's per-instance hierarchy, every lane its own copy of the FP units),
#: measured on this 2-core machine under load: 32 MACs 65 s / 0.37 GiB, 64 MACs 76 s / 0.62 GiB; the paper's
#: 1,024 MACs did not finish in 4 min, and its PE array alone grew past 17 GB in 9.5 min (docs/ndp_core.md). Above
#: FLAT_NOTE_MACS the command says it will take a while; above FLAT_MAX_MACS it refuses at once and names the
#: flags that do fit (issue 32 item 6).
FLAT_NOTE_MACS = 64
FLAT_MAX_MACS = 256
HIER_HINT = ("--hier --counts-only NDPCore --counts-only PEArray (every distinct module once, the two glue modules "
             "as stubs: the paper core in ~22 s, docs/ndp_core.md)")


def _flat_note(name, config):
    """Refuse (UsageError) or annotate a flat conversion of a large NDP core."""
    macs = getattr(getattr(config, "ndp", config), "macs", None)
    if not isinstance(macs, int) or macs <= FLAT_NOTE_MACS:
        return
    if macs > FLAT_MAX_MACS:
        raise UsageError(f"argument --hier: the flat Verilog of {name} with {macs} MACs does not fit (Amaranth's "
                         f"per-instance conversion grows past 17 GB at the paper's 1,024); up to {FLAT_MAX_MACS} MACs "
                         f"convert flat, larger cores with {HIER_HINT}")
    print(f"note: {name} with {macs} MACs: the flat conversion takes minutes and GiB of memory; {HIER_HINT} is "
          f"faster", file=sys.stderr, flush=True)


class _heartbeat:
    """On a terminal, a line every 15 s while a long step runs, and its wall time at the end (issue 32 item 6)."""

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        import threading
        self.t0 = time.perf_counter()
        self.stop = threading.Event()
        self.on = sys.stderr.isatty() or os.environ.get("NDPIM_PROGRESS") == "1"
        if self.on:
            def beat():
                while not self.stop.wait(15.0):
                    print(f"  ... {self.what}: {time.perf_counter() - self.t0:.0f} s", file=sys.stderr, flush=True)
            self.thread = threading.Thread(target=beat, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.on:
            print(f"{self.what}: {time.perf_counter() - self.t0:.1f} s", file=sys.stderr, flush=True)
        return False


def cmd_ports(args):
    from host.topcfg import ports_markdown
    text = ports_markdown(args.top)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(args.out)


def cmd_lint(args):
    from sim.backends.verilog import lint
    if args.each_module:            # every module of one file as its own top (a --hier file with stubs)
        import re
        path = Path(args.each_module)
        text = path.read_text()
        mods = [m for m in re.findall(r"^module\s+\\?(\S+?)\s*\(", text, re.M)
                if not re.search(r"\(\*\s*blackbox\s*\*\)\s*module\s+\\?" + re.escape(m) + r"\b", text)]
        problems = []
        for m in mods:
            problems += lint([path], top=m)
        for problem in problems:
            print(problem)
        print(f"lint: {path}, {len(mods)} modules, {len(problems)} problems")
        return 1 if problems else 0
    paths = sorted(Path(args.dir).glob("*.v"))
    if not paths:
        raise SystemExit(f"ndpim lint: no .v files in {args.dir} (run `ndpim verilog --out {args.dir}` first)")
    problems = lint(paths)
    for problem in problems:
        print(problem)
    print(f"lint: {len(paths)} files, {len(problems)} problems")
    return 1 if problems else 0


def cmd_synth(args):
    if args.area:
        return _synth_area(args)
    if args.mode == "hier":
        return _synth_hier(args)
    if args.preset or args.set:
        raise UsageError("argument --mode: --preset / --set need --mode hier")
    from sim.synth.yosys import synth_stats
    print(f"{'top':<22}{'cells':>8}{'flops':>8}   largest cell groups"
          + ("   (fast: word-level cells, registers per word)" if args.mode == "fast" else ""))
    for name, factory in _tops(args.top).items():
        stats = synth_stats(name, factory(), mode=args.mode, progress=True)
        top = sorted(stats["by_type"].items(), key=lambda kv: -kv[1])[:4]
        groups = ", ".join(f"{k}:{v}" for k, v in top)
        print(f"{name:<22}{stats['cells']:>8}{stats['flops']:>8}   {groups}", flush=True)


def _synth_area(args):
    """--area: NanGate45 technology-mapped area and power (sim/energy/area.py); figures to --json."""
    import json
    from sim.energy import area
    if args.mode != "full" or args.preset or args.set or args.counts_only or args.no_devmem:
        raise UsageError("argument --area: takes only --top, --liberty and --json (not --mode / --preset / --set / "
                         "--counts-only / --no-devmem)")
    liberty = Path(args.liberty) if args.liberty else area.LIBERTY_PATH
    if not liberty.exists():
        raise UsageError(f"argument --liberty: {liberty} does not exist")
    say = (lambda s: print(s, file=sys.stderr, flush=True))
    if args.top:
        out, tops = {}, _tops(args.top)
        print(f"{'top':<22}{'cells':>8}{'logic um^2':>13}{'seq um^2':>11}{'leak uW':>10}{'SRAM bits':>11}"
              f"{'SRAM um^2':>12}{'s':>6}")
        for name, factory in tops.items():
            res = area.module_areas(name, factory(), liberty=liberty, progress=say)
            cells = sum(m["instances"] * (m["cells"] or 0) for m in res["modules"].values())
            print(f"{name:<22}{cells:>8}{res['logic_um2']:>13,.0f}{res['seq_um2']:>11,.0f}"
                  f"{res['leak_nw'] / 1e3:>10,.1f}{res['sram_bits']:>11,}{res['sram_um2']:>12,.0f}"
                  f"{res['seconds']:>6.1f}", flush=True)
            out[name] = res
    else:
        if args.liberty:
            raise UsageError("argument --liberty: the paper-design table uses the committed library; give --top")
        figs = area.paper_figures(progress=say)
        print(area.format_table(figs), flush=True)
        out = {"figures": area.bench_figures(figs), "detail": figs}
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1, default=str) + "\n")
        print(path)
    return 0


def _synth_hier(args):
    """--mode hier: per distinct module x instance count (sim/synth/hier.py); figures to --json."""
    import json
    from host.topcfg import describe
    from sim.synth.hier import hier_cells, format_report
    names = args.top or ["ndp_core"]
    if (args.preset or args.set) and len(names) != 1:
        raise UsageError("argument --top: --preset / --set need exactly one --top")
    configured = {name: _configure(name, args) for name in names}     # every value checked before any work
    out = {}
    for name in names:
        spec, cfg = configured[name]
        say = (lambda s: print(s, file=sys.stderr, flush=True))
        res = {"top": name, "preset": args.preset or spec.default, "config": describe(cfg)}
        res["core"] = hier_cells(name, spec.build(cfg), progress=say, checkpoint=args.json and f"{args.json}.partial",
                                 counts_only=tuple(args.counts_only or ()))
        res["counts_only"] = list(args.counts_only or ())
        parts = [res["core"]]
        channels = getattr(cfg, "channels", None)
        if channels and not args.no_devmem:     # the device memory the core's line port is sized for
            from hdl.memctl.devmem import DeviceMemory
            dm = DeviceMemory(config=cfg.dram, channels=channels, ndp_tag_width=cfg.tag_width)
            res["devmem"] = hier_cells("devmem", dm, progress=say,
                                       checkpoint=args.json and f"{args.json}.devmem.partial")
            parts.append(res["devmem"])
        res["total"] = {k: sum(p["total"][k] for p in parts) for k in parts[0]["total"]}
        res["seconds"] = sum(p["seconds"] for p in parts)
        print(format_report(res), flush=True)
        out[name] = res
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out if len(out) > 1 else next(iter(out.values())), indent=1) + "\n")
        print(path)
    return 0


def cmd_fp_report(args):
    import numpy as np
    from sim.backends import get_backend
    from sim.verify.fpcheck import UNITS, run_check
    from sim.verify.softfloat_ref import reference
    from sim.golden.exp import exp_error_table

    backend = get_backend(args.backend)
    units = {n: UNITS[n] for n in _tops(args.top) if n in UNITS}
    print(f"FP units: RTL on {backend.name} (random valid gaps and backpressure) vs golden; golden vs "
          f"Berkeley SoftFloat, same vectors")
    print(f"{'unit':<15}{'latency':>8}{'RTL checked':>13}{'mismatches':>11}{'SoftFloat checked':>19}"
          f"{'mismatches':>11}")
    failures = 0
    for i, (name, spec) in enumerate(units.items()):
        res = run_check(spec, backend, args.vectors, seed=args.seed + i)
        sf_checked, sf_bad = "-", "-"
        if spec.softfloat:
            ops = spec.vectors(np.random.default_rng(args.seed + i), args.vectors)
            bad = int(np.count_nonzero(spec.golden(*ops) != reference(spec.softfloat, *ops)))
            sf_checked, sf_bad = len(ops[0]), bad
            failures += bad
        failures += res.mismatches
        print(f"{name:<15}{res.latency:>8}{res.checked:>13}{res.mismatches:>11}{sf_checked:>19}{sf_bad:>11}",
              flush=True)
        if res.mismatches:
            print(f"    first mismatch: {res.first_mismatch}")
    print()
    print("exp error, exhaustive over all 65,536 inputs, vs the correctly rounded fp16 of exp(float64 x):")
    print(f"{'domain':<10}{'inputs':>8}{'0 ULP':>8}{'1 ULP':>8}{'max ULP':>9}{'max rel. error before rounding':>32}")
    for stats in exp_error_table().values():
        print(f"{stats.domain:<10}{stats.count:>8}{stats.ulp0:>8}{stats.ulp1:>8}{stats.max_ulp:>9}"
              f"{stats.max_rel_error:>32.3g}")
        if stats.max_ulp > 1:
            failures += 1
    print()
    print("all bit-exact" if failures == 0 else f"FAILED: {failures} mismatches")
    return 1 if failures else 0


def cmd_bench_fp(args):
    from sim.backends import get_backend
    from sim.verify.fpcheck import UNITS, run_check
    print(f"{'unit':<15}{'backend':<11}{'vectors':>9}{'cycles':>10}{'wall s':>9}{'cycles/s':>12}")
    for name in _tops(args.top):
        if name not in UNITS:
            continue
        for backend_name in args.backends.split(","):
            backend = get_backend(backend_name)
            n = args.amaranth_vectors if backend_name == "amaranth" else args.verilator_vectors
            # Warm-up run (compiles the Verilator model) so the timed run measures simulation only.
            run_check(UNITS[name], backend, 16, traffic="full")
            res = run_check(UNITS[name], backend, n, traffic="full")
            rate = res.cycles / res.wall_seconds if res.wall_seconds else float("inf")
            print(f"{name:<15}{backend_name:<11}{res.checked:>9}{res.cycles:>10}{res.wall_seconds:>9.3f}"
                  f"{rate:>12,.0f}", flush=True)


# `ndpim bench NAME` and `ndpim fuzz`: the first importable module of each list, called as main(argv) with the
# remaining arguments.
BENCHES = {
    "dram": ("sim.bench.dram",),
    "devmem": ("sim.devmem.bench",),
    "ndp": ("sim.bench.ndp",),
    "ndp-device": ("sim.bench.ndp_device",),
    "cxl-devmem": ("host.cxl_bench",),
    "pim": ("sim.bench.pim",),
    "host": ("host.bench",),
    "e2e": ("host.e2e.bench",),
    "energy": ("sim.energy.bench",),
}
FUZZ = ("host.fuzz.cxl",)
BENCH_DEFAULT_ARGS = {"pim": ["--all-rtl"]}


def _module_main(candidates, argv):
    for name in candidates:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue
            raise
        return mod.main(argv) or 0
    raise SystemExit(f"ndpim: none of {list(candidates)} exists")


def cmd_bench(args):
    if args.name == "fp":
        return cmd_bench_fp(args)
    argv = list(args.args) or BENCH_DEFAULT_ARGS.get(args.name, [])
    return _module_main(BENCHES[args.name], argv)


def cmd_fuzz(args):
    argv = ["--cases", str(args.cases), "--jobs", str(args.jobs)] + list(args.args)
    return _module_main(FUZZ, argv)


# Modules that may add a command group: each defines add_parser(subparsers).
BUILTIN_GROUPS = ("host.gpu.cli", "host.e2e.cli")
PLUGINS = ("host.plora.cli", "host.l3.cli", "host.compare.cli")


# the LLaMA-scale hybrid's group (ndpim hybrid ...; issue 34 item 2)
PLUGINS += ("host.hybrid.cli",)
# design-space exploration under an area / power budget (ndpim dse; issue 34 item 4)
PLUGINS += ("host.dse.cli",)


def _plugin_modules():
    mods = [importlib.import_module(name) for name in BUILTIN_GROUPS]
    for name in PLUGINS:
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            # only "this plugin (or its package) does not exist" is skippable
            if exc.name is None or not name.startswith(exc.name):
                raise
    return mods


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("ndpim")
    except PackageNotFoundError:        # run from a checkout that was not installed
        return "unknown (not installed)"


def _tag_parsers(parser) -> None:
    """Every (sub)parser records itself as ``args._parser`` (the deepest one parsed wins), so that a
    :class:`UsageError` is reported under the command's own usage line."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                sp.set_defaults(_parser=sp)
                _tag_parsers(sp)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="ndpim", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ndpim {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("verilog", help="write one .v per top-level component (any validated configuration)",
                       description="Write Verilog of the tops (cached by a hash of the design and its configuration "
                                   "in build/verilog-cache). `--list` shows every top, its presets and configuration.")
    p.add_argument("--out", default="build/verilog", type=out_dir, help="output directory (default: build/verilog)")
    p.add_argument("--top", action="append", help="only this top (repeatable); see --list")
    p.add_argument("--preset", help="configuration preset of the top (see --list)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a configuration field (repeatable; dotted paths for nested configurations)")
    p.add_argument("--list", action="store_true", help="list the tops with their presets and configurations")
    p.add_argument("--hier", action="store_true",
                   help="with --preset/--set: write every distinct module once (FP units, PE array, SFU, decoder "
                        "as modules instantiated N times; sim/synth/hier.py) instead of Amaranth's per-instance "
                        "hierarchy -- what makes the paper-geometry core small enough to generate and lint")
    p.add_argument("--counts-only", action="append", metavar="CLASS",
                   help="with --hier: modules of this class are written as black-box stubs (repeatable)")
    p.set_defaults(func=cmd_verilog)

    p = sub.add_parser("ports", help="write the page of every top's port bit layouts (docs/ports.md)")
    p.add_argument("--out", default="docs/ports.md")
    p.add_argument("--top", action="append", help="only this top (repeatable)")
    p.set_defaults(func=cmd_ports)

    p = sub.add_parser("lint", help="verilator --lint-only on every .v in a directory")
    p.add_argument("dir", nargs="?", default="build/verilog")
    p.add_argument("--each-module", metavar="FILE",
                   help="lint every (non-stub) module of FILE as its own top, e.g. a `verilog --hier` file")
    p.set_defaults(func=cmd_lint)

    p = sub.add_parser("synth", help="Yosys cell counts per top, with progress (needs the synth extra)")
    p.add_argument("--top", action="append", help="only this top (repeatable)")
    p.add_argument("--mode", choices=["full", "fast", "hier"], default="full",
                   help="full: synth -flatten to generic gates (minutes for the big tops); fast: proc; flatten; "
                        "stat (word-level cells, seconds); hier: per distinct module x instance count, memories "
                        "kept as SRAM macros (sim/synth/hier.py; with --preset / --set; ndp_core's paper preset "
                        "adds its 64-channel device memory)")
    p.add_argument("--preset", help="--mode hier: configuration preset of the top (ndpim verilog --list)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="--mode hier: override a field")
    p.add_argument("--no-devmem", action="store_true", help="--mode hier: the core only, not its device memory")
    p.add_argument("--counts-only", action="append", metavar="CLASS",
                   help="--mode hier: modules of this class (e.g. PEArray, NDPCore: the single-instance fabrics that "
                        "are too large to convert at the paper geometry) are elaborated for their instance counts "
                        "and memories but not synthesized (repeatable)")
    p.add_argument("--json", help="--mode hier / --area: write the figures here (e.g. build/bench/ndp_synth.json)")
    p.add_argument("--area", action="store_true",
                   help="NanGate45 technology-mapped area (dfflibmap + abc -liberty; SRAM macros at the FreePDK45 "
                        "fakeram45 density) and power (Horowitz per-op energy x stated activity + leakage): without "
                        "--top the paper NDP core and the L3 PAPER rank / bank PU beside the papers' budgets (about "
                        "2 min of CPU); with --top those tops (sim/energy/area.py, docs/energy.md)")
    p.add_argument("--liberty", help="--area --top: map to this liberty file instead of data/liberty/"
                                     "nangate45_typ_min.lib")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("fp-report", help="bit-exactness of every FP unit, and the exp error table")
    p.add_argument("--backend", default="verilator", choices=["amaranth", "verilator"])
    p.add_argument("--vectors", type=int, default=100_000, help="random vectors per unit (default 100000)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--top", action="append", help="only this unit (repeatable)")
    p.set_defaults(func=cmd_fp_report)

    p = sub.add_parser("bench-fp", help="simulated cycles per second per FP unit and backend")
    p.add_argument("--backends", default="amaranth,verilator")
    p.add_argument("--amaranth-vectors", type=int, default=3000)
    p.add_argument("--verilator-vectors", type=int, default=500_000)
    p.add_argument("--top", action="append", help="only this unit (repeatable)")
    p.set_defaults(func=cmd_bench_fp)

    p = sub.add_parser("bench", help="benchmarks: fp, dram, devmem, ndp, pim, host, e2e, energy (figures to build/bench/*.json)",
                       description="Run a benchmark; arguments after the name go to it (e.g. `ndpim bench pim --rtl`).")
    p.add_argument("name", choices=["fp"] + sorted(BENCHES))
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the benchmark")
    p.add_argument("--backends", default="amaranth,verilator", help=argparse.SUPPRESS)
    p.add_argument("--amaranth-vectors", type=int, default=3000, help=argparse.SUPPRESS)
    p.add_argument("--verilator-vectors", type=int, default=500_000, help=argparse.SUPPRESS)
    p.add_argument("--top", action="append", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("plot", help="a metric over run directories of either host (figure), and a compare table",
                       description="Figures and a compare table over run directories written by ndpim plora run, "
                                   "ndpim l3 run or ndpim demo (host/plot.py).")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (summary.json, config.json)")
    p.add_argument("--metric", action="append", metavar="M",
                   help="a summary.json value (dotted for nested: gpu_mem_gb.weights) drawn as bars, or an "
                        "iterations.csv column drawn against time; repeatable, or a,b")
    p.add_argument("--out", type=out_dir, default="build/plot", help="directory for <metric>.png (default build/plot)")
    p.add_argument("--table", metavar="FILE.csv", help="also write the compare table as CSV")
    p.add_argument("--list-metrics", action="store_true", help="list the metrics every run has, and stop")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("fuzz", help="the CXL device fuzz campaign under Verilator")
    p.add_argument("--cases", type=int, default=1_000_000)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("args", nargs=argparse.REMAINDER, help="further arguments of the campaign")
    p.set_defaults(func=cmd_fuzz)

    for mod in _plugin_modules():
        mod.add_parser(sub)

    _tag_parsers(parser)
    args = parser.parse_args(argv)
    if getattr(args, "vectors", 1) is not None and getattr(args, "vectors", 1) < 1:
        parser.error(f"--vectors must be >= 1, got {args.vectors}")
    start = time.perf_counter()
    try:
        rc = args.func(args) or 0
    except UsageError as exc:
        getattr(args, "_parser", parser).error(str(exc))      # prints usage and one error line, exits 2
    print(f"({args.command}: {time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return rc


if __name__ == "__main__":
    # `python -m host.cli`: run the importable module's main, so that the command groups (which import host.cli)
    # and this entry share one UsageError class
    from host.cli import main as _main
    sys.exit(_main())
