"""Generic cocotb testbench for a one-in, one-out stream unit (ports ``i`` and ``o`` of Amaranth's Verilog).

Reads a JSON vector file named by ``$STREAM_TB_VECTORS`` (written by ``test_cocotb_fp.py``)::

    {"unit": str, "inputs": [int, ...], "operands": [[int, ...], ...], "expected": [int, ...],
     "out_bits": int, "seed": int, "valid_prob": float, "ready_prob": float}

drives ``inputs`` into ``i`` with seeded random valid gaps, applies seeded random backpressure on ``o``, and
checks the low ``out_bits`` of every ``o`` payload, in order, against ``expected``.
"""

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ReadOnly


def _describe(vec, k, got):
    ops = " ".join(f"{v[k]:#x}" for v in vec["operands"])
    return f"[{k}] operands {ops}: got {got:#x} want {vec['expected'][k]:#x}"


@cocotb.test()
async def stream_unit_matches_golden(dut):
    with open(os.environ["STREAM_TB_VECTORS"]) as f:
        vec = json.load(f)
    inputs, expected = vec["inputs"], vec["expected"]
    mask = (1 << vec["out_bits"]) - 1
    rng = random.Random(vec["seed"])
    n = len(inputs)
    max_cycles = 64 * n + 1000

    Clock(dut.clk, 10, unit="ns").start()
    dut.i__valid.value = 0
    dut.i__payload.value = 0
    dut.o__ready.value = 0
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    pos, presenting, got, bad = 0, False, [], []
    cycle = 0
    while len(got) < n:
        assert cycle < max_cycles, f"{vec['unit']}: only {len(got)} of {n} results after {max_cycles} cycles"
        # Drive this cycle's handshake, then sample the settled values before the clock edge.
        if not presenting and pos < n and rng.random() < vec["valid_prob"]:
            presenting = True
            dut.i__payload.value = inputs[pos]
        dut.i__valid.value = int(presenting)
        ready = rng.random() < vec["ready_prob"]
        dut.o__ready.value = int(ready)
        await ReadOnly()
        accepted = presenting and dut.i__ready.value == 1
        if ready and dut.o__valid.value == 1:
            value = dut.o__payload.value
            assert value.is_resolvable, f"{vec['unit']}: output {len(got)} has X/Z bits: {value}"
            z = value.to_unsigned() & mask
            if z != expected[len(got)] and len(bad) < 8:
                bad.append(_describe(vec, len(got), z))
            got.append(z)
        await RisingEdge(dut.clk)
        cycle += 1
        if accepted:
            presenting, pos = False, pos + 1

    mismatches = sum(g != e for g, e in zip(got, expected))
    dut._log.info("%s: %d results in %d cycles, %d mismatches", vec["unit"], n, cycle, mismatches)
    assert mismatches == 0, f"{vec['unit']}: {mismatches} of {n} results differ:\n" + "\n".join(bad)
