"""cocotb testbench for a DIMM-PIM stream unit with one input stream ``i`` and one output stream ``o`` whose item
counts differ (the bank PU emits one result per job, the softmax unit per token, ...).

Reads the JSON vector file named by ``$PIM_TB_VECTORS`` (written by ``test_cocotb_pim.py``)::

    {"unit": str, "inputs": [int, ...], "expected": [int, ...], "out_mask": int, "seed": int,
     "valid_prob": float, "ready_prob": float, "max_cycles": int}

drives ``inputs`` into ``i`` with seeded random valid gaps, applies seeded random backpressure on ``o`` and
checks every ``o`` payload (``& out_mask``), in order, against ``expected``; after the last expected result it
runs 64 more cycles and fails if ``o`` offers anything else.
"""

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ReadOnly


@cocotb.test()
async def pim_unit_matches_golden(dut):
    with open(os.environ["PIM_TB_VECTORS"]) as f:
        vec = json.load(f)
    inputs, expected, mask = vec["inputs"], vec["expected"], vec["out_mask"]
    rng = random.Random(vec["seed"])

    Clock(dut.clk, 10, unit="ns").start()
    dut.i__valid.value = 0
    dut.i__payload.value = 0
    dut.o__ready.value = 0
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    pos, presenting, got, bad, cycle, extra = 0, False, [], [], 0, 0
    while len(got) < len(expected) or extra < 64:
        assert cycle < vec["max_cycles"], f"{vec['unit']}: {len(got)} of {len(expected)} results after {cycle} cycles"
        if len(got) >= len(expected):
            extra += 1
        if not presenting and pos < len(inputs) and rng.random() < vec["valid_prob"]:
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
            assert len(got) < len(expected), f"{vec['unit']}: unexpected extra output {value.to_unsigned():#x}"
            z = value.to_unsigned() & mask
            if z != expected[len(got)] and len(bad) < 8:
                bad.append(f"[{len(got)}] got {z:#x} want {expected[len(got)]:#x}")
            got.append(z)
        await RisingEdge(dut.clk)
        cycle += 1
        if accepted:
            presenting, pos = False, pos + 1

    mismatches = sum(g != e for g, e in zip(got, expected))
    dut._log.info("%s: %d inputs, %d results in %d cycles, %d mismatches", vec["unit"], len(inputs), len(got),
                  cycle, mismatches)
    assert pos == len(inputs), f"{vec['unit']}: only {pos} of {len(inputs)} inputs accepted"
    assert mismatches == 0, f"{vec['unit']}: {mismatches} of {len(expected)} results differ:\n" + "\n".join(bad)
