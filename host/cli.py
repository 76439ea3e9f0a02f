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
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _tops(names):
    from hdl.tops import TOPS
    if not names:
        return dict(TOPS)
    unknown = [n for n in names if n not in TOPS]
    if unknown:
        raise SystemExit(f"ndpim: unknown top(s) {unknown}; allowed: {sorted(TOPS)}")
    return {n: TOPS[n] for n in names}


def cmd_verilog(args):
    from sim.backends.verilog import write_verilog
    paths = write_verilog(Path(args.out), _tops(args.top))
    for path in paths:
        print(path)


def cmd_lint(args):
    from sim.backends.verilog import lint
    paths = sorted(Path(args.dir).glob("*.v"))
    if not paths:
        raise SystemExit(f"ndpim lint: no .v files in {args.dir} (run `ndpim verilog --out {args.dir}` first)")
    problems = lint(paths)
    for problem in problems:
        print(problem)
    print(f"lint: {len(paths)} files, {len(problems)} problems")
    return 1 if problems else 0


def cmd_synth(args):
    from sim.synth import synth_stats
    print(f"{'top':<22}{'cells':>8}{'flops':>8}   largest cell groups")
    for name, factory in _tops(args.top).items():
        stats = synth_stats(name, factory())
        top = sorted(stats["by_type"].items(), key=lambda kv: -kv[1])[:4]
        groups = ", ".join(f"{k}:{v}" for k, v in top)
        print(f"{name:<22}{stats['cells']:>8}{stats['flops']:>8}   {groups}", flush=True)


def cmd_fp_report(args):
    import numpy as np
    from sim.backends import get_backend
    from sim.fpcheck import UNITS, run_check
    from sim.softfloat_ref import reference
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
    from sim.fpcheck import UNITS, run_check
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


# Modules that may add a command group: each defines add_parser(subparsers).
BUILTIN_GROUPS = ("host.gpu.cli",)
PLUGINS = ("host.plora.cli", "host.l3.cli")


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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="ndpim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("verilog", help="write one .v per top-level component")
    p.add_argument("--out", default="build/verilog", help="output directory (default: build/verilog)")
    p.add_argument("--top", action="append", help="only this top (repeatable)")
    p.set_defaults(func=cmd_verilog)

    p = sub.add_parser("lint", help="verilator --lint-only on every .v in a directory")
    p.add_argument("dir", nargs="?", default="build/verilog")
    p.set_defaults(func=cmd_lint)

    p = sub.add_parser("synth", help="Yosys generic-gate cell counts per top (needs the synth extra)")
    p.add_argument("--top", action="append", help="only this top (repeatable)")
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

    for mod in _plugin_modules():
        mod.add_parser(sub)

    args = parser.parse_args(argv)
    if getattr(args, "vectors", 1) is not None and getattr(args, "vectors", 1) < 1:
        parser.error(f"--vectors must be >= 1, got {args.vectors}")
    start = time.perf_counter()
    rc = args.func(args) or 0
    print(f"({args.command}: {time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
