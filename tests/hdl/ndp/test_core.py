# amaranth: UnusedElaboratable=no
"""NDP core RTL (hdl/ndp/core.py) against the golden core (sim/golden/ndp_core.py), bit for bit, on both backends.

The core runs on a fixed-latency burst memory (fast) for data tests, and on the real memory controller + DRAM
channel model (Verilator) for "rejected descriptors touch no memory" and the DRAM-legality check.
"""

from dataclasses import replace

import numpy as np
import pytest

from hdl.ndp.config import TINY
from hdl.ndp.core import NDPCore
from hdl.ndp.descriptor import ErrorCode
from hdl.memctl.commands import Cmd
from hdl.memctl.timing import DDR4_3200_TINY
from firmware.ndp.descriptor import gemv, gemm, softmax, load, store
from firmware.ndp import kernels
from sim.golden.ndp_core import GoldenCore, beats, x_beats
from sim.ndp.system import NDPBurstSystem, NDPMemorySystem
from sim.backends import Traffic, stream_ports, get_backend
from sim.dram.trace import decode_trace

BURST_BITS = 512
DEPTH = 512                                  # bursts of the test memory: 32 KiB
MEM_BYTES = DEPTH * BURST_BITS // 8
CFG = replace(TINY, name="tiny-test", device_bytes=MEM_BYTES)


def rand_bits(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def memory_bursts(golden):
    """The golden memory as a list of 512-bit burst ints (the BurstMemory init)."""
    raw = bytes(golden.memory)
    nb = BURST_BITS // 8
    return [int.from_bytes(raw[i:i + nb], "little") for i in range(0, len(raw), nb)]


def expected_streams(golden, program):
    cpl = golden.run(program)
    y = [w for c in cpl for w in beats(c.result, CFG.lanes)]
    return y, [(c.seq, c.status) for c in cpl]


def completions(words):
    return [(w & 0xFFFF, ErrorCode((w >> 16) & 0xF)) for w in words]


def run_core(backend, golden_init, program, traffic=None, seed=0):
    golden = golden_init()
    init = memory_bursts(golden)
    y, cpl = expected_streams(golden, program)
    dut = NDPBurstSystem(config=CFG, burst_bits=BURST_BITS, depth=DEPTH, init=init)
    if traffic == "random":
        traffic = Traffic.random(stream_ports(dut), seed=seed, valid_prob=0.7, ready_prob=0.6)
    run = backend.run_streams(dut, {"desc": [d.encode() for d, _ in program], "x": x_beats(program, CFG)},
                              {"y": len(y), "cpl": len(cpl)}, traffic=traffic)
    return run, y, cpl


def mixed_program(rng):
    """Every descriptor kind, KEEP/CHAIN, several GEMM passes, and rejected descriptors in between."""
    a = rand_bits(rng, (16, 24), 0.3)      # at 0
    bm = rand_bits(rng, (24, 16), 0.3)     # at 1024
    kT = rand_bits(rng, (16, 32), 0.3)     # at 2048 (d = 16, l = 32)
    v = rand_bits(rng, (32, 16), 0.3)      # at 4096
    q = rand_bits(rng, (1, 16))
    prog = [
        (store(0, 16, 24), a), (store(1024, 24, 16), bm), (store(2048, 16, 32), kT), (store(4096, 32, 16), v),
        (gemv(0, 16, 24), rand_bits(rng, (1, 16))),
        (gemm(0, 3, 16, 24), rand_bits(rng, (3, 16))),              # 2 passes (pe_batch 2)
        (gemm(0, 4, 16, 24, keep=True), rand_bits(rng, (4, 16))),   # LoRA E3: m = xA kept ...
        (gemm(1024, 4, 24, 16, chain=True), None),                   # ... y = mB
        (gemv(0, 16, 24, chain=True), None),                         # NO_CHAIN_INPUT (previous did not KEEP)
        (gemv(2048, 16, 32, keep=True), q),                          # attention: scores kept
        (softmax(1, 32, chain=True, keep=True), None),               # anchors returned, exps kept
        (gemv(4096, 32, 16, chain=True), None),                      # partial output
        (softmax(3, 16), rand_bits(rng, (3, 16), 4.0)),              # plain softmax, 3 rows
        (replace(gemv(0, 16, 24), type=0), rand_bits(rng, (1, 16))), # UNKNOWN_TYPE: no input sent
        (gemv(64 * 3 + 2, 16, 24), rand_bits(rng, (1, 16))),         # MISALIGNED
        (load(4096, 3, 5), None),                                    # odd-size LOAD (tail masked)
        (load(0, 16, 24), None),
        (gemm(MEM_BYTES - 64, 2, 16, 24), rand_bits(rng, (2, 16))),  # ADDRESS_OVERFLOW
        (softmax(2, 8, keep=True), rand_bits(rng, (2, 8))),
        (replace(store(64, 1, 32), flags=1), rand_bits(rng, (1, 32))),  # BAD_FLAGS: clears kept
        (gemv(0, 8, 24, chain=True), None),                          # NO_CHAIN_INPUT
    ]
    return prog


def test_mixed_program_bit_exact(backend):
    rng = np.random.default_rng(1)
    prog = mixed_program(rng)
    statuses = {d.validate(CFG) for d, _ in prog}
    assert {ErrorCode.OK, ErrorCode.UNKNOWN_TYPE, ErrorCode.MISALIGNED, ErrorCode.ADDRESS_OVERFLOW,
            ErrorCode.BAD_FLAGS} <= statuses
    run, y, cpl = run_core(backend, lambda: GoldenCore(CFG, MEM_BYTES), prog)
    assert completions(run.outputs["cpl"]) == cpl
    assert ErrorCode.NO_CHAIN_INPUT in {s for _, s in cpl}
    assert run.outputs["y"] == y


def test_random_stalls_and_backpressure(backend):
    rng = np.random.default_rng(2)
    prog = mixed_program(rng)
    for seed in (3, 4):
        run, y, cpl = run_core(backend, lambda: GoldenCore(CFG, MEM_BYTES), prog, traffic="random", seed=seed)
        assert completions(run.outputs["cpl"]) == cpl
        assert run.outputs["y"] == y


def test_lora_and_attention_kernels(backend):
    """Firmware kernels (E2 loads, E3, E4, attention integral) run on the RTL exactly as on the golden core."""
    rng = np.random.default_rng(5)
    d, r = 32, 8
    a, b = rand_bits(rng, (d, r), d ** -0.5), rand_bits(rng, (r, d), r ** -0.5)
    lay = kernels.lora_layout(d, r, config=CFG)
    kv = kernels.kv_layout(16, 32, config=CFG, base=lay["end"])
    k_bits, v_bits = rand_bits(rng, (32, 16), 0.5), rand_bits(rng, (32, 16), 0.5)
    prog = (kernels.lora_store(a, b, lay, config=CFG).program + kernels.kv_store(k_bits, v_bits, kv, config=CFG).program
            + kernels.lora_e2_loads(lay["a"], lay["b"], d, r, config=CFG).program
            + kernels.lora_e3(rand_bits(rng, (3, d)), lay["a"], lay["b"], d, r, config=CFG).program
            + kernels.lora_e4(rand_bits(rng, (1, d)), lay["a"], d, r, config=CFG).program
            + kernels.attention_integral(rand_bits(rng, (1, 16)), kv["kT"], kv["v"], 16, 32, config=CFG).program)
    assert kv["end"] <= MEM_BYTES
    for traffic in (None, "random"):
        run, y, cpl = run_core(backend, lambda: GoldenCore(CFG, MEM_BYTES), prog, traffic=traffic, seed=9)
        assert all(s == ErrorCode.OK for _, s in cpl)
        assert completions(run.outputs["cpl"]) == cpl
        assert run.outputs["y"] == y


def test_rejected_descriptors_touch_no_memory():
    """On the real controller + DRAM model: one descriptor of every decoder error class (and a CHAIN with
    nothing kept) completes with its code and issues no RD/WR; a good GEMV after them does, with zero DRAM
    timing violations and no hang."""
    cfg = replace(CFG, device_bytes=2 << 20)
    bad = [replace(gemv(0, 8, 8), type=0), replace(load(0, 2, 2), op=2), gemv(0, 8, 8, dtype=2),
           replace(gemv(0, 8, 8), input_dim0=0), replace(gemv(0, 8, 8), operand_bytes=6), gemv(0, 64, 64),
           gemm(0, 5, 256, 8), gemv((2 << 20) - 64, 8, 8), replace(gemv(0, 8, 8), input_dim0=2, input_bytes=32),
           gemm(0, 5, 8, 8), softmax(1, 1022), gemv(2, 8, 8), gemv(0, 12, 8), store(0, 1, 2),
           replace(load(0, 2, 2), flags=2), gemv(0, 8, 8, chain=True)]
    codes = [d.validate(cfg) for d in bad]
    assert set(codes) >= set(ErrorCode) - {ErrorCode.OK, ErrorCode.NO_CHAIN_INPUT}
    dut = NDPMemorySystem(config=cfg, dram_config=DDR4_3200_TINY, device_kwargs={"storage": False})
    x = [0x3C00] * 1
    run = get_backend("amaranth").run_streams(
        dut, {"desc": [d.encode() for d in bad] + [gemv(0, 8, 8).encode()], "x": x},
        {"y": 1, "cpl": len(bad) + 1, "trace": None, "errors": None}, max_cycles=20_000)
    got = completions(run.outputs["cpl"])
    want = [(i, c) for i, c in enumerate(codes)]
    want[-1] = (len(bad) - 1, ErrorCode.NO_CHAIN_INPUT)
    assert got == want + [(len(bad), ErrorCode.OK)]
    cols = [c for c in decode_trace(run.outputs["trace"], DDR4_3200_TINY.org) if c.kind in (Cmd.RD, Cmd.WR)]
    assert run.outputs["errors"] == []
    # The only column commands are the good GEMV's: 8 x 8 FP16 = 128 bytes = 2 bursts.
    assert len(cols) == 2


def test_bad_construction():
    with pytest.raises(ValueError, match="mem_burst_bits"):
        NDPCore(config=CFG, mem_burst_bits=100, mem_addr_bits=20)
    with pytest.raises(ValueError, match="lanes"):
        NDPCore(config=replace(CFG, macs=4, lanes=2, pe_batch=2), mem_burst_bits=512, mem_addr_bits=20)
    with pytest.raises(ValueError, match="align_bytes"):
        NDPCore(config=replace(CFG, align_bytes=32), mem_burst_bits=512, mem_addr_bits=20)
    with pytest.raises(ValueError, match="NDPConfig"):
        NDPCore(config="tiny", mem_burst_bits=512, mem_addr_bits=20)
    with pytest.raises(ValueError, match="in-order"):
        NDPMemorySystem(config=CFG, dram_config=DDR4_3200_TINY, policy="fr-fcfs")
