"""Golden NDP core (sim/golden/ndp_core.py): descriptor semantics, streams, KEEP/CHAIN, memory, accuracy."""

from dataclasses import replace

import numpy as np
import pytest

from hdl.ndp.config import TINY
from hdl.ndp.descriptor import ErrorCode, SEQ_BITS
from firmware.ndp.descriptor import gemv, gemm, softmax, load, store
from firmware.ndp import kernels
from sim.golden import fp16
from sim.golden.ndp_core import (GoldenCore, Completion, beats, unbeats, x_beats, statuses, trans_layout,
                                 accuracy_report, accuracy_table)
from sim.golden.pe_array import gemm as pe_gemm, gemm_mode
from sim.golden.softmax import softmax_rows

TINY16 = replace(TINY, name="tiny-fp16", acc="fp16")
MEM = 1 << 16


def rand_bits(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def core_with(cfg, addr, data):
    core = GoldenCore(cfg, MEM)
    core.write(addr, data)
    return core


def ref_mm(x, a, cfg):
    y = pe_gemm(np.atleast_2d(x), a, acc=cfg.acc, lanes=cfg.lanes)
    return (fp16.from_f32(y) if cfg.acc == "fp32" else y).reshape(-1)


# ---- streams ---------------------------------------------------------------------------------------------

def test_beats_packing():
    assert beats(np.array([1, 2, 3], np.uint16), 2) == [1 | 2 << 16, 3]
    assert beats(np.zeros(0, np.uint16), 8) == []
    rng = np.random.default_rng(1)
    v = rng.integers(0, 1 << 16, 37, dtype=np.uint16)
    w = beats(v, 8)
    assert len(w) == 5 and w[-1] >> (16 * 5) == 0           # 37 = 4*8 + 5: last beat zero padded
    assert np.array_equal(unbeats(w, 8, 37), v)
    with pytest.raises(ValueError, match="lanes"):
        beats(v, 0)
    with pytest.raises(TypeError):
        beats(np.zeros(3, np.int32), 8)


def test_x_beats_skip_rejected_chain_and_load_and_pad_rows():
    rng = np.random.default_rng(2)
    x = rand_bits(rng, (1, 16))
    x12 = rand_bits(rng, (2, 12))
    prog = [
        (gemv(0, 16, 8, keep=True), x),                 # accepted: 2 beats
        (gemv(3, 16, 8), x),                            # MISALIGNED: the GPU sends nothing
        (softmax(1, 8, chain=True), None),              # CHAIN: nothing
        (load(0, 4, 8), None),                          # LOAD: nothing
        (store(0, 4, 8), rand_bits(rng, (4, 8))),       # accepted: 4 beats
        (gemm(0, 2, 12, 8), x12),                       # K = 12: each row padded to 2 beats
        (gemm(0, 2, 16, 8, trans=True, acc=True), rand_bits(rng, (2, 16))),   # no partial: NO_CHAIN_INPUT
    ]
    assert prog[1][0].validate(TINY) == ErrorCode.MISALIGNED
    assert statuses(prog, TINY)[-1] == ErrorCode.NO_CHAIN_INPUT
    pad = np.zeros((2, 16), np.uint16)
    pad[:, :12] = x12
    xb = x_beats(prog, TINY)
    assert xb == beats(x, 8) + beats(prog[4][1], 8) + beats(pad, 8)


# ---- semantics -------------------------------------------------------------------------------------------

def test_keep_suppresses_return_and_chains_read_it_repeatedly():
    rng = np.random.default_rng(3)
    a = rand_bits(rng, (16, 8), 0.25)
    b = rand_bits(rng, (8, 16), 0.25)
    x = rand_bits(rng, (1, 16))
    core = core_with(TINY, 0, a)
    core.write(256, b)
    c = core.run([(gemv(0, 16, 8, keep=True), x), (gemv(256, 8, 16, chain=True), None),
                  (gemv(256, 8, 16, chain=True), None)])
    assert [(k.seq, k.status) for k in c] == [(0, ErrorCode.OK), (1, ErrorCode.OK), (2, ErrorCode.OK)]
    assert c[0].result.size == 0
    m = ref_mm(x, a, TINY)
    assert np.array_equal(c[1].result, ref_mm(m, b, TINY)) and np.array_equal(c[2].result, c[1].result)
    assert np.array_equal(core.kept(0), m.reshape(1, 8)) and core.kept(1) is None


@pytest.mark.parametrize("cfg", [TINY, TINY16], ids=lambda c: c.acc)
def test_e3_equals_two_step_gemm(cfg):
    rng = np.random.default_rng(4)
    d, r = 32, 16
    a, b = rand_bits(rng, (d, r), d ** -0.5), rand_bits(rng, (r, d), r ** -0.5)
    x = rand_bits(rng, (3, d))
    lay = kernels.lora_layout(d, r, config=cfg)
    core = GoldenCore(cfg, lay["end"])
    assert all(k.ok for k in core.run(kernels.lora_store(a, b, lay, config=cfg).program))
    k = kernels.lora_e3(x, lay, config=cfg)
    y = k.results(core.run(k.program))
    m = gemm_mode(x, a, acc=cfg.acc, lanes=cfg.lanes, mode="trans")
    m16 = fp16.from_f32(m) if cfg.acc == "fp32" else m       # m is kept on the device in FP16
    y2 = pe_gemm(m16, b, acc=cfg.acc, lanes=cfg.lanes)
    assert np.array_equal(y, fp16.from_f32(y2) if cfg.acc == "fp32" else y2)


def test_state_check_cases():
    """CHAIN / ACC against the owner's state: NO_CHAIN_INPUT (own state missing or of another shape),
    FOREIGN_STATE (no state of its own while another owner holds some); rejected descriptors change nothing."""
    rng = np.random.default_rng(5)
    core = core_with(TINY, 0, rand_bits(rng, (16, 8)))
    x = rand_bits(rng, (1, 16))
    chain = (gemv(0, 8, 8, chain=True), None)         # needs a kept 1 x 8 result
    prog = [
        chain,                                        # 0 nothing kept anywhere: NO_CHAIN_INPUT
        (gemv(0, 16, 8, keep=True), x, 1), chain,     # 1 owner 1 keeps; 2 owner 0 has nothing: FOREIGN_STATE
        (gemv(0, 16, 8, chain=False), x, 1),          # 3 a plain GEMV leaves owner 1's state alone
        (gemv(0, 8, 8, chain=True), None, 1),         # 4 input 1 x 8 == kept 1 x 8: OK
        (gemv(0, 16, 8, chain=True), None, 1),        # 5 shape 1 x 16 != kept 1 x 8: NO_CHAIN_INPUT
        (gemv(3, 16, 8, keep=True), x, 0),            # 6 MISALIGNED: no state for owner 0
        chain,                                        # 7 still FOREIGN_STATE
        (gemv(0, 16, 8, keep=True), x, 0), chain,     # 8, 9 owner 0 keeps, then chains: OK
        (gemv(0, 16, 8, trans=True, acc=True), x, 0), # 10 ACC without a partial: NO_CHAIN_INPUT
        (gemv(0, 16, 8, trans=True, partial=True), x, 2),                     # 11 owner 2: a partial (slot 2?)
    ]
    got = [k.status for k in core.run(prog)]
    NC, FS, OK = ErrorCode.NO_CHAIN_INPUT, ErrorCode.FOREIGN_STATE, ErrorCode.OK
    assert got == [NC, OK, FS, OK, OK, NC, ErrorCode.MISALIGNED, FS, OK, OK, NC, OK]
    # two slots on TINY: owner 2's PARTIAL evicted the round-robin victim (slot 0: owner 1)
    assert core.kept(1) is None and core.kept(0) is not None and core.partial(2) is not None
    assert core.run([(gemv(0, 8, 8, chain=True), None, 1)])[0].status == FS
    assert [k.seq for k in core.run([chain, chain])] == [13, 14]
    assert statuses(prog, TINY) == got


def test_partial_tiles_accumulate_in_fp32():
    rng = np.random.default_rng(10)
    a = rand_bits(rng, (24, 6), 0.3)
    xs = rand_bits(rng, (2, 24))
    core = GoldenCore(TINY, MEM)
    core.write(0, trans_layout(a[:8], 8, TINY.acc_columns))
    core.write(1024, trans_layout(a[8:16], 8, TINY.acc_columns))
    core.write(2048, trans_layout(a[16:20], 8, TINY.acc_columns))
    prog = [(gemm(0, 2, 8, 6, trans=True, partial=True), xs[:, :8]),
            (gemm(1024, 2, 8, 6, trans=True, acc=True, partial=True), xs[:, 8:16]),
            (gemm(2048, 2, 4, 6, trans=True, acc=True), xs[:, 16:20]),
            (gemm(2048, 2, 4, 6, trans=True, acc=True), xs[:, 16:20])]     # partial consumed
    c = core.run(prog)
    assert [k.status for k in c] == [ErrorCode.OK] * 3 + [ErrorCode.NO_CHAIN_INPUT]
    t = [gemm_mode(xs[:, k0:k1], a[k0:k1], acc="fp32", lanes=8, mode=mode).view(np.float32)
         for k0, k1, mode in ((0, 8, "trans"), (8, 16, "trans"), (16, 20, "trans_half"))]
    want = fp16.from_f32(((t[0] + t[1]) + t[2]).view(np.uint32))
    assert c[0].result.size == 0 and c[1].result.size == 0 and np.array_equal(c[2].result, want.reshape(-1))


def test_softmax_keep_then_trans_context():
    # SOFTMAX R=2, L=8 with KEEP keeps 2 x 8 exponentials; a TRANS GEMM CHAIN of K=8 consumes them
    rng = np.random.default_rng(6)
    p = rand_bits(rng, (2, 8))
    v = rand_bits(rng, (8, 8))
    core = core_with(TINY, 0, trans_layout(v, 8, TINY.acc_columns))
    c = core.run([(softmax(2, 8, keep=True), p), (gemm(0, 2, 8, 8, trans=True, chain=True), None)])
    e, m, s = softmax_rows(p, TINY.sfu_lanes)
    want = fp16.from_f32(gemm_mode(e, v, acc="fp32", lanes=8, mode="trans"))
    assert c[1].ok and np.array_equal(c[1].result, want.reshape(-1))


def test_softmax_return_full_and_keep_anchors():
    rng = np.random.default_rng(7)
    p = rand_bits(rng, (3, 16), 2.0)
    e, m, s = softmax_rows(p, TINY.sfu_lanes)
    anchors = np.stack([m, s & 0xFFFF, s >> 16], axis=1).astype(np.uint16).reshape(-1)
    core = GoldenCore(TINY, MEM)
    full, kept = core.run([(softmax(3, 16), p), (softmax(3, 16, keep=True), p)])
    assert np.array_equal(full.result, np.concatenate([e.reshape(-1), anchors]))
    assert full.result.size == 3 * (16 + 3)
    assert np.array_equal(kept.result, anchors)
    assert core.kept(0).shape == (3, 16)


def test_rejected_descriptors_take_no_input():
    rng = np.random.default_rng(8)
    core = GoldenCore(TINY, MEM)
    bad = gemm(0, 5, 16, 8)                               # BATCH_TOO_LARGE (max_batch 4)
    c = core.run([(bad, rand_bits(rng, (5, 16))), (bad, None), (store(0, 4, 8, ), rand_bits(rng, (4, 8)))])
    assert [k.status for k in c] == [ErrorCode.BATCH_TOO_LARGE] * 2 + [ErrorCode.OK]
    assert all(k.result.size == 0 for k in c)
    assert x_beats([(bad, None)], TINY) == []


def test_store_load_round_trip_and_memory_layout():
    rng = np.random.default_rng(9)
    t = rand_bits(rng, (8, 16))
    core = GoldenCore(TINY, MEM)
    c = core.run([(store(128, 8, 16), t), (load(128, 8, 16), None), (load(128 + 64, 1, 3), None)])
    assert [k.status for k in c] == [ErrorCode.OK] * 3
    assert c[0].result.size == 0
    assert np.array_equal(c[1].result, t.reshape(-1))
    assert np.array_equal(c[2].result, t.reshape(-1)[32:35])       # byte 192 = element 32
    raw = bytes(core.memory[128:132])
    assert raw == int(t[0, 0]).to_bytes(2, "little") + int(t[0, 1]).to_bytes(2, "little")
    assert np.array_equal(core.read(128, 128), t.reshape(-1))


def test_seq_wraps_and_persists():
    core = GoldenCore(TINY, MEM)
    core.seq = (1 << SEQ_BITS) - 1
    c = core.run([(load(0, 1, 8), None), (load(0, 1, 8), None)])
    assert [k.seq for k in c] == [(1 << SEQ_BITS) - 1, 0]
    core.reset()
    assert core.run([(load(0, 1, 8), None)])[0].seq == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="config"):
        GoldenCore("tiny", 100)
    with pytest.raises(ValueError, match="memory_bytes"):
        GoldenCore(TINY, 0)
    with pytest.raises(ValueError, match="device_bytes"):
        GoldenCore(TINY, TINY.device_bytes + 1)
    core = GoldenCore(TINY, 1024)
    with pytest.raises(ValueError, match="program"):
        core.run("nope")
    with pytest.raises(ValueError, match=r"program\[0\]"):
        core.run([(1, 2)])
    with pytest.raises(ValueError, match="owner"):
        core.run([(load(0, 4, 8), None, -1)])
    with pytest.raises(ValueError, match="needs a GPU input"):
        core.run([(store(0, 4, 8), None)])
    with pytest.raises(ValueError, match="shape"):
        core.run([(store(0, 4, 8), np.zeros((8, 4), np.uint16))])
    with pytest.raises(ValueError, match="take no GPU input"):
        core.run([(load(0, 4, 8), np.zeros(32, np.uint16))])
    with pytest.raises(ValueError, match="golden memory"):
        core.run([(load(1024, 4, 8), None)])               # accepted by TINY (16 MiB) but past 1 KiB
    with pytest.raises(ValueError, match="golden memory"):
        core.write(1020, np.zeros(4, np.uint16))


def test_completion_type():
    c = GoldenCore(TINY, MEM).run([(load(0, 1, 8), None)])[0]
    assert isinstance(c, Completion) and c.ok and c.result.dtype == np.uint16


# ---- accuracy --------------------------------------------------------------------------------------------

def test_accuracy_report(capsys):
    reps = {cfg.acc: accuracy_report(cfg) for cfg in (TINY, TINY16)}
    with capsys.disabled():
        print("\nNDP kernel accuracy vs float64 (TINY; d=64 r=16 batch=8; attention head_dim=32, 4 x 64 positions)")
        print(accuracy_table([TINY, TINY16]))
    for acc, rep in reps.items():
        for kern in ("e3", "e4", "attention"):
            assert rep[kern]["nonfinite"] == 0
    # FP32 accumulation: error near FP16 output rounding (2**-11 ~ 4.9e-4) relative to the output scale
    assert reps["fp32"]["e4"]["norm_rel"] < 1e-3
    assert reps["fp32"]["e3"]["norm_rel"] < 2e-3
    assert reps["fp32"]["attention"]["norm_rel"] < 5e-3
    for kern in ("e3", "e4", "attention"):
        assert reps["fp16"][kern]["norm_rel"] < 2e-2
        assert reps["fp32"][kern]["mean_rel"] <= reps["fp16"][kern]["mean_rel"]
