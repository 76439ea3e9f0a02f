"""Synthesis cell counts of the device memory system, per distinct module x instance count (``make bench-dram``).

A flat synthesis of 64 channels (64 controllers, ~4.5 MB of Verilog) is slow, so the design is synthesized as its
two distinct modules: one :class:`hdl.memctl.devmem.DeviceChannel` (request FIFO, splitter, controller, reorder
buffers), flattened, and the fabric (arbiter, slot bookkeeping, reassembly, output muxes) with the channels as
black boxes. Total = fabric + N x channel. Yosys generic gates (``synth``), as ``make synth`` (sim/synth/yosys.py).
"""

import re
import subprocess
import tempfile
from pathlib import Path

from amaranth.back import rtlil, verilog

from sim.synth.yosys import _yosys

__all__ = ["devmem_cells"]


def _stat(report: str) -> dict:
    by_type = {kind: int(n) for n, kind in re.findall(r"^\s+(\d+)\s+(\$\S+)\s*$", report, re.M)}
    by_type.pop("$scopeinfo", None)
    return by_type


def _run(tmp, script):
    out = subprocess.run([_yosys(), "-q", "-p", script], capture_output=True, text=True, cwd=tmp)
    if out.returncode:
        raise RuntimeError(f"yosys failed:\n{(out.stdout + out.stderr)[-3000:]}")
    return (Path(tmp) / "stat.txt").read_text()


def devmem_cells(memory) -> dict:
    """``memory``: a :class:`DeviceMemory` built with ``channel_module``. Returns ``{"channel": {...},
    "fabric": {...}, "channels": N, "total": {"cells", "flops"}}``, each part ``{"cells", "flops", "by_type"}``."""
    name = memory.channel_module
    if not name:
        raise ValueError("devmem_cells needs DeviceMemory(channel_module=<name>)")
    out = {"channels": memory.channels}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "channel.il").write_text(rtlil.convert(memory.chans[0], name=name))
        rep = _run(tmp, f"read_rtlil channel.il; synth -flatten -top {name}; tee -q -o stat.txt stat")
        out["channel"] = _summary(_stat(rep))
        (Path(tmp) / "channel.v").write_text(verilog.convert(memory.chans[0], name=name))
        (Path(tmp) / "fabric.il").write_text(rtlil.convert(memory, name="devmem_fabric"))
        rep = _run(tmp, "read_verilog -lib channel.v; read_rtlil fabric.il; synth -flatten -top devmem_fabric; "
                        "tee -q -o stat.txt stat")
        by_type = _stat(rep)
        by_type = {k: v for k, v in by_type.items() if k.startswith("$")}
        out["fabric"] = _summary(by_type)
    n = memory.channels
    out["total"] = {"cells": out["fabric"]["cells"] + n * out["channel"]["cells"],
                    "flops": out["fabric"]["flops"] + n * out["channel"]["flops"]}
    return out


def _summary(by_type):
    return {"cells": sum(by_type.values()), "flops": sum(v for k, v in by_type.items() if "DFF" in k),
            "by_type": by_type}
