"""cocotb testbench for a DIMM-PIM stream unit with one input stream ``i`` and one or more output streams whose
item counts differ from the input's (the bank PU emits one result per job, the softmax unit per token, per chunk
and per head, ...).

Reads the JSON vector file named by ``$PIM_TB_VECTORS`` (written by ``test_cocotb_pim.py``)::

    {"unit": str, "inputs": [int, ...], "outputs": {port: {"expected": [int, ...], "mask": int}},
     "seed": int, "valid_prob": float, "ready_prob": float, "max_cycles": int}

drives ``inputs`` into ``i`` with seeded random valid gaps, applies seeded random backpressure on every output
port and checks every payload (``& mask``), in order, against ``expected``; after the last expected result it
runs 64 more cycles and fails if any output offers anything else.
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
    inputs, outs = vec["inputs"], vec["outputs"]
    rng = random.Random(vec["seed"])
    port = {name: (getattr(dut, f"{name}__valid"), getattr(dut, f"{name}__ready"), getattr(dut, f"{name}__payload"))
            for name in outs}

    Clock(dut.clk, 10, unit="ns").start()
    dut.i__valid.value = 0
    dut.i__payload.value = 0
    for _, ready, _ in port.values():
        ready.value = 0
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    got = {name: [] for name in outs}
    bad = []
    pos, presenting, cycle, extra = 0, False, 0, 0

    def done():
        return all(len(got[n]) >= len(outs[n]["expected"]) for n in outs)

    while not done() or extra < 64:
        assert cycle < vec["max_cycles"], \
            f"{vec['unit']}: " + ", ".join(f"{n} {len(got[n])}/{len(outs[n]['expected'])}" for n in outs) + \
            f" after {cycle} cycles"
        if done():
            extra += 1
        if not presenting and pos < len(inputs) and rng.random() < vec["valid_prob"]:
            presenting = True
            dut.i__payload.value = inputs[pos]
        dut.i__valid.value = int(presenting)
        readies = {}
        for name, (_, ready, _) in port.items():
            readies[name] = rng.random() < vec["ready_prob"]
            ready.value = int(readies[name])
        await ReadOnly()
        accepted = presenting and dut.i__ready.value == 1
        for name, (valid, _, payload) in port.items():
            if readies[name] and valid.value == 1:
                value = payload.value
                want = outs[name]["expected"]
                assert value.is_resolvable, f"{vec['unit']}: {name} output {len(got[name])} has X/Z bits"
                assert len(got[name]) < len(want), f"{vec['unit']}: extra {name} output {value.to_unsigned():#x}"
                z = value.to_unsigned() & outs[name]["mask"]
                if z != want[len(got[name])] and len(bad) < 8:
                    bad.append(f"{name}[{len(got[name])}] got {z:#x} want {want[len(got[name])]:#x}")
                got[name].append(z)
        await RisingEdge(dut.clk)
        cycle += 1
        if accepted:
            presenting, pos = False, pos + 1

    mismatches = {n: sum(g != e for g, e in zip(got[n], outs[n]["expected"])) for n in outs}
    dut._log.info("%s: %d inputs, %s results in %d cycles, mismatches %s", vec["unit"], len(inputs),
                  {n: len(got[n]) for n in outs}, cycle, mismatches)
    assert pos == len(inputs), f"{vec['unit']}: only {pos} of {len(inputs)} inputs accepted"
    assert not any(mismatches.values()), f"{vec['unit']}: mismatches {mismatches}:\n" + "\n".join(bad)
