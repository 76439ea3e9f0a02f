"""cocotb run of the ``ndp_core`` top's Verilog (``ndp_core_tb.py``: the testbench is the GPU and the device memory)
against the golden core (sim/golden/ndp_core.py): a program with every descriptor kind, KEEP/CHAIN kernels and
rejected descriptors, under random stalls and backpressure."""

from dataclasses import replace

import numpy as np

from hdl.tops import NDP_TOPS
from hdl.ndp.config import TINY
from firmware.ndp.descriptor import gemv, gemm, softmax, load, store
from sim.golden.ndp_core import GoldenCore, beats, x_beats, trans_layout
from cocotb_util import run_top

MEM_BYTES = 1 << 16


def _bits(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def _program(rng):
    a, b = _bits(rng, (16, 24), 0.3), _bits(rng, (24, 16), 0.3)
    t = trans_layout(_bits(rng, (16, 12), 0.3), 8, TINY.acc_columns).reshape(6, 32)
    return [
        (store(0, 16, 24), a), (store(1024, 24, 16), b), (store(2048, 6, 32), t),
        (gemm(0, 3, 16, 24), _bits(rng, (3, 16))),                  # 2 PE passes
        (gemm(0, 2, 16, 24, keep=True), _bits(rng, (2, 16)), 1),    # LoRA E3, owner 1: m = xA kept
        (gemm(1024, 2, 24, 16, chain=True), None, 2),                # FOREIGN_STATE: owner 2 has no state
        (gemm(1024, 2, 24, 16, chain=True), None, 1),                # y = mB
        (gemv(64 * 5 + 2, 16, 24), _bits(rng, (1, 16))),             # MISALIGNED
        (softmax(2, 16, keep=True), _bits(rng, (2, 16), 3.0)),       # anchors returned
        (gemm(0, 2, 16, 24, chain=True), None),                      # uses the kept exponentials
        (gemv(0, 8, 24, chain=True), None),                          # NO_CHAIN_INPUT (kept 2 x 16)
        (gemm(2048, 3, 16, 12, trans=True), _bits(rng, (3, 16))),   # GEMV PEs, 2 passes
        (replace(load(0, 2, 2), flags=1), None),                     # BAD_FLAGS
        (load(1024, 5, 3), None),                                    # odd-size LOAD
    ]


def test_ndp_core_top_against_golden(monkeypatch):
    dut = NDP_TOPS["ndp_core"]()
    cfg = dut.config
    assert cfg == TINY
    rng = np.random.default_rng(11)
    prog = _program(rng)
    golden = GoldenCore(cfg, MEM_BYTES)
    cpl = golden.run(prog)
    assert len({c.status for c in cpl}) >= 5          # OK and several error classes (FOREIGN_STATE too)
    y = [w for c in cpl for w in beats(c.result, cfg.lanes)]
    cpl_words = [c.seq | (c.status.value << 16) for c in cpl]
    run_top(monkeypatch, "ndp_core", dut, "ndp_core_tb", "NDP_CORE_TB_VECTORS", {
        "desc": [e[0].request(e[2] if len(e) == 3 else 0) for e in prog], "x": x_beats(prog, cfg), "y": y,
        "cpl": cpl_words,
        "memory": {}, "latency": 12, "addr_bits": dut.mem_addr_bits, "burst_bits": dut.burst_bits, "seed": 5,
    })
