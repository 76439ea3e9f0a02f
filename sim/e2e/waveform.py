"""Waveforms from either simulation engine, without changing the backends: subclasses that write one file per
stream run.

* :class:`VCDAmaranthBackend` (``vcd``): the Amaranth simulator's VCD writer around the backend's run (the
  backend builds its ``Simulator`` inside ``run_streams``; this class has ``Simulator.run`` execute under
  ``write_vcd`` for the duration of its own runs).
* :class:`TracingVerilatorBackend` (``vcd`` or ``fst``): a separate Verilator build of the design with
  ``--trace`` / ``--trace-fst`` whose harness dumps every clock edge to the file named by the environment
  variable ``NDPIM_WAVEFORM`` (the harness text of ``sim/backends/verilator.py``, with the trace calls added
  after each ``eval``). The traced executable is cached like any other build (its flags are part of the key).

Open the files with GTKWave (``gtkwave build/demo/waveform.vcd``) or Surfer. Signal names are Amaranth's
hierarchy (``top.system.device.core...``).
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from sim.backends.amaranth_sim import AmaranthBackend
from sim.backends import verilator as _vl

__all__ = ["VCDAmaranthBackend", "TracingVerilatorBackend", "waveform_backend"]


class VCDAmaranthBackend(AmaranthBackend):
    """Amaranth's simulator writing ``path`` (VCD) for every run (the last run's file remains)."""

    name = "amaranth"

    def __init__(self, path):
        super().__init__()
        self.path = Path(path)

    def run_streams(self, component, inputs, expected, **kw):
        from amaranth.sim import Simulator
        orig = Simulator.run
        path = self.path

        def run(sim):
            with sim.write_vcd(str(path)):
                return orig(sim)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        Simulator.run = run
        try:
            return super().run_streams(component, inputs, expected, **kw)
        finally:
            Simulator.run = orig


_INCLUDE = '#include "verilated.h"'


def _traced_harness(text: str, fmt: str) -> str:
    cls, hdr = ("VerilatedFstC", "verilated_fst_c.h") if fmt == "fst" else ("VerilatedVcdC", "verilated_vcd_c.h")
    anchor = "const std::unique_ptr<Vharness_top> top{new Vharness_top{context.get()}};"
    for needle in (_INCLUDE, anchor, "top->final();", "top->eval();"):
        if needle not in text:
            raise RuntimeError(f"the Verilator harness has no {needle!r}: the tracing patch needs updating")
    text = text.replace(_INCLUDE, f'{_INCLUDE}\n#include "{hdr}"', 1)
    text = text.replace(anchor, anchor + f"""
    context->traceEverOn(true);
    {cls}* ndpim_tfp = new {cls};
    top->trace(ndpim_tfp, 99);
    const char* ndpim_wf = std::getenv("NDPIM_WAVEFORM");
    ndpim_tfp->open(ndpim_wf ? ndpim_wf : "waveform.{fmt}");
    uint64_t ndpim_ts = 0;""", 1)
    text = text.replace("top->eval();", "top->eval(); ndpim_tfp->dump(ndpim_ts++);")
    return text.replace("top->final();", "top->final(); ndpim_tfp->close();", 1)


class TracingVerilatorBackend(_vl.VerilatorBackend):
    """Verilator with a traced build (module docstring); ``fmt``: ``"vcd"`` or ``"fst"``."""

    def __init__(self, path, fmt: str = "vcd"):
        super().__init__()
        if fmt not in ("vcd", "fst"):
            raise ValueError(f"fmt must be 'vcd' or 'fst', got {fmt!r}")
        self.path, self.fmt = Path(path), fmt

    def executable(self, component):
        exe = self._exes.get(component)
        if exe is not None and exe.exists():
            return exe
        from sim.backends.verilog import verilog_text
        orig_flags, orig_harness = _vl.VERILATOR_FLAGS, _vl._harness
        flag = "--trace-fst" if self.fmt == "fst" else "--trace"
        _vl.VERILATOR_FLAGS = list(orig_flags) + [flag]
        _vl._harness = lambda ports: _traced_harness(orig_harness(ports), self.fmt)
        try:
            exe = _vl.build_executable(verilog_text(component, "top"), _vl.stream_ports(component))
        finally:
            _vl.VERILATOR_FLAGS, _vl._harness = orig_flags, orig_harness
        self._exes[component] = exe
        return exe

    def run_streams(self, component, inputs, expected, **kw):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        old = os.environ.get("NDPIM_WAVEFORM")
        os.environ["NDPIM_WAVEFORM"] = str(self.path.resolve())
        try:
            return super().run_streams(component, inputs, expected, **kw)
        finally:
            if old is None:
                os.environ.pop("NDPIM_WAVEFORM", None)
            else:
                os.environ["NDPIM_WAVEFORM"] = old


def waveform_backend(engine: str, path, fmt: str = "vcd"):
    """A backend of ``engine`` (``amaranth`` or ``verilator``) that writes ``path``."""
    if engine == "amaranth":
        if fmt != "vcd":
            raise ValueError("Amaranth's simulator writes VCD only")
        return VCDAmaranthBackend(path)
    if engine == "verilator":
        return TracingVerilatorBackend(path, fmt)
    raise ValueError(f"engine must be 'amaranth' or 'verilator', got {engine!r}")
