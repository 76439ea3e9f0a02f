# amaranth: UnusedElaboratable=no
"""NDP instruction buffer + descriptor decoder against the firmware mirror (``Descriptor.validate``/``command``).

Every test takes the ``backend`` fixture (Amaranth simulator and Verilator): a stream of random valid and
malformed descriptors, under random valid gaps and backpressure, must give exactly the firmware's decoded
command / error code for each descriptor, in order, with the arrival index as ``seq``.
"""

import random
from dataclasses import replace

import pytest

from hdl.ndp.config import TINY, PAPER
from hdl.ndp.decoder import DescriptorDecoder, InstructionBuffer
from hdl.ndp.descriptor import DescOp, DType, ErrorCode, DECODER_CODES, FLAG_BITS, FLAG_GROUP, FLAG_NARROW
from firmware.ndp.descriptor import decode, gemv, gemm, softmax, load, store
from sim.backends import Traffic, stream_ports


def valid_descriptor(rng, cfg):
    """A random well-formed descriptor that fits ``cfg`` (TINY-sized shapes, so it fits PAPER too)."""
    kinds = ["gemv", "gemm", "gemm-half", "trans", "trans-half", "softmax", "load", "store"]
    kind = rng.choice(kinds + (["group", "group-softmax"] if cfg.group_lanes else [])
                      + (["narrow", "narrow-softmax"] if cfg.group_narrow else []))
    base = cfg.align_bytes * rng.randrange(0, (cfg.device_bytes - 8192) // cfg.align_bytes)
    flags = {"keep": rng.random() < 0.3, "chain": rng.random() < 0.3}
    tflags = dict(flags, trans=True, acc=rng.random() < 0.3, partial=rng.random() < 0.3)
    if tflags["partial"]:
        tflags["keep"] = False
    if kind == "gemv":
        return gemv(base, rng.randint(1, 64), 8 * rng.randint(1, 4), **flags)
    if kind == "gemm":
        return gemm(base, rng.randint(1, cfg.max_batch), 8 * rng.randint(1, 8), 8 * rng.randint(1, 2), **flags)
    if kind == "gemm-half":
        return gemm(base, rng.randint(1, cfg.max_batch), 2 * rng.randint(1, 32), 4, **flags)
    if kind == "trans":
        return gemm(base, rng.randint(1, cfg.max_batch), 8 * rng.randint(1, 8), rng.randint(1, 16), **tflags)
    if kind == "trans-half":
        return gemm(base, rng.randint(1, cfg.max_batch), 4, 2 * rng.randint(1, 16), **tflags)
    if kind == "softmax":
        return softmax(rng.randint(1, 8), 8 * rng.randint(1, 8), **flags)
    g = cfg.group_segments
    if kind == "group":
        return gemm(base, g * rng.randint(1, cfg.max_batch // g), cfg.group_lanes, cfg.lanes, group=True, **flags)
    if kind == "group-softmax":
        return softmax(g * rng.randint(1, 4), cfg.group_lanes, group=True, **flags)
    if kind == "narrow":        # segments of W / 2: 2 g rows to a beat, K = n W / 2
        return gemm(base, 2 * g * rng.randint(1, cfg.max_batch // (2 * g)), cfg.group_lanes // 2 * rng.randint(1, 3),
                    cfg.lanes, group=True, narrow=True, **flags)
    if kind == "narrow-softmax":
        return softmax(2 * g * rng.randint(1, 2), cfg.group_lanes // 2, group=True, narrow=True, **flags)
    if kind == "load":
        return load(base, rng.randint(1, 16), rng.randint(1, 64))
    return store(base, rng.randint(1, 16), 32 * rng.randint(1, 2))


def mutate(rng, d, cfg):
    """``d`` with one random field (or a few) replaced: mostly malformed, sometimes still valid."""
    f = rng.choice(["type", "op", "dtype", "zero", "bytes", "dims", "big", "addr", "shape", "batch", "out",
                    "align", "multiple", "flags", "raw"])
    if f == "type":
        return replace(d, type=rng.choice([0, 4, 7, 15, 1, 2, 3]))
    if f == "op":
        return replace(d, op=rng.randrange(16))
    if f == "dtype":
        return replace(d, dtype=rng.randrange(16))
    if f == "zero":
        return replace(d, **{rng.choice(["operand_dim0", "operand_dim1", "input_dim0", "input_dim1"]): 0})
    if f == "bytes":
        key = rng.choice(["operand_bytes", "input_bytes"])
        return replace(d, **{key: (getattr(d, key) + rng.choice([-2, -1, 1, 2, 1000])) % (1 << 20)})
    if f == "dims":
        key = rng.choice(["operand_dim0", "operand_dim1", "input_dim0", "input_dim1"])
        return replace(d, **{key: rng.randrange(1, 1 << 20)})
    if f == "big":      # consistent sizes that overflow a buffer
        k, n = rng.randint(32, 128), rng.randint(16, 128)
        return rng.choice([gemv(d.base_addr, k, n), gemm(d.base_addr, 4, k * 8, 2), load(d.base_addr, k, n),
                           store(d.base_addr, k, n)])
    if f == "addr":
        return replace(d, base_addr=rng.choice([rng.randrange(1 << 64), cfg.device_bytes - d.operand_bytes,
                                                cfg.device_bytes - d.operand_bytes + 1, (1 << 64) - 2]))
    if f == "shape":
        return replace(d, input_dim0=d.input_dim1, input_dim1=d.input_dim0)
    if f == "batch":
        b = rng.randint(cfg.max_batch + 1, cfg.max_batch + 3)
        return gemm(d.base_addr, b, rng.randint(1, 8), rng.randint(1, 8))
    if f == "out":
        return rng.choice([gemm(0, cfg.max_batch, 8, 8 * rng.randint(33, 100)), softmax(32, 8 * rng.randint(4, 5)),
                           load(0, 32, rng.randint(33, 60)), gemm(0, 4, 8, 8 * rng.randint(17, 30), keep=True),
                           gemm(0, 4, 8, rng.randint(17, 40), trans=True, partial=True),
                           gemv(0, 2, 8 * rng.randint(17, 30))])
    if f == "align":
        return replace(d, base_addr=d.base_addr + rng.choice([1, 2, 32, cfg.align_bytes - 2]))
    if f == "multiple":
        return rng.choice([gemv(0, 8 * rng.randint(1, 4) + rng.randint(1, 3), 8, trans=True),
                           gemm(0, 2, 8, 8 * rng.randint(1, 4) + rng.randint(1, 7)),
                           gemm(0, 2, 7, 4), gemv(0, 4, 7, trans=True),
                           softmax(2, rng.randint(1, 7)), store(0, 1, rng.randint(1, 31))])
    if f == "flags":
        return replace(d, flags=rng.randrange(1 << FLAG_BITS))
    return decode(rng.getrandbits(204))


# One minimal descriptor per error class (TINY), so every class is covered whatever the seed.
EVERY_CODE = [
    replace(gemv(0, 8, 8), type=0), replace(load(0, 2, 2), op=DescOp.GEMM), gemv(0, 8, 8, dtype=DType.FP32),
    replace(gemv(0, 8, 8), input_dim0=0), replace(gemv(0, 8, 8), operand_bytes=6), gemv(0, 64, 64),
    gemm(0, 4, 512, 8), gemv(TINY.device_bytes - 64, 8, 8), replace(gemv(0, 8, 8), input_dim0=2, input_bytes=32),
    gemm(0, TINY.max_batch + 1, 8, 8), softmax(32, 32), gemv(2, 8, 8), gemv(0, 12, 8, trans=True),
    store(0, 1, 2), replace(load(0, 2, 2), flags=2), gemv(64, 8, 8), softmax(2, 8, keep=True, chain=True),
    gemv(0, 16, 8, trans=True, acc=True), gemv(0, 16, 32, acc=True), gemm(0, 3, 6, 4), gemv(0, 4, 6, trans=True),
]


def descriptor_stream(seed, n, cfg=TINY):
    rng = random.Random(seed)
    ds = list(EVERY_CODE)
    while len(ds) < n:
        d = valid_descriptor(rng, cfg)
        ds.append(d if rng.random() < 0.35 else mutate(rng, d, cfg))
    rng.shuffle(ds)
    return ds


def owners(ds):
    return [(k * 2654435761) % (1 << 32) for k in range(len(ds))]


def run_decoder(backend, ds, cfg=TINY, traffic=None):
    dut = DescriptorDecoder(config=cfg)
    if traffic == "random":
        traffic = Traffic.random(stream_ports(dut), seed=len(ds))
    run = backend.run_streams(dut, {"i": [d.request(o) for d, o in zip(ds, owners(ds))]}, {"o": len(ds)},
                              traffic=traffic)
    return dut, run


def check_outputs(run, ds, cfg=TINY):
    expected = [d.command_bits(cfg, seq, o) for seq, (d, o) in enumerate(zip(ds, owners(ds)))]
    got = run.outputs["o"]
    assert len(got) == len(ds)
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"descriptor {k} {ds[k]}: expected {ds[k].validate(cfg)!r}, got {g:#x} != {e:#x}"


def test_stream_matches_firmware_validate(backend):
    ds = descriptor_stream(seed=1, n=200)
    codes = {d.validate(TINY) for d in ds}
    assert codes == set(DECODER_CODES) | {ErrorCode.OK}, set(DECODER_CODES) - codes
    _, run = run_decoder(backend, ds, traffic="random")
    check_outputs(run, ds)


def test_heavy_backpressure_fills_the_buffer(backend):
    ds = descriptor_stream(seed=2, n=60)
    dut = DescriptorDecoder(config=TINY)
    traffic = Traffic.random(stream_ports(dut), seed=3, valid_prob=1.0, ready_prob=0.15)
    run = backend.run_streams(dut, {"i": [d.request(o) for d, o in zip(ds, owners(ds))]}, {"o": len(ds)},
                              traffic=traffic)
    check_outputs(run, ds)
    assert run.cycles > 4 * len(ds)     # output-bound: the instruction buffer was full most of the time


def test_full_rate_latency_and_throughput(backend):
    """One descriptor per cycle, first result DescriptorDecoder.latency cycles after acceptance; a rejected
    descriptor costs no extra cycle (no hang, no bubble)."""
    ds = [gemv(0, 8, 8)]
    _, run = run_decoder(backend, ds)
    assert run.cycles == DescriptorDecoder.latency + 1
    ds = [d for _, d in zip(range(40), (EVERY_CODE * 4))]
    _, run = run_decoder(backend, ds)
    check_outputs(run, ds)
    assert run.cycles == DescriptorDecoder.latency + len(ds)


def test_paper_config(backend):
    cap = PAPER.device_bytes
    ds = [gemv(cap - 8192, 4, 512), gemv(cap - 2048, 4, 512), gemm(0, 256, 1024, 16, trans=True),
          gemm(0, 257, 1024, 16, trans=True), gemv(0, 512, 1023), replace(gemv(0, 256, 1024), operand_bytes=0),
          softmax(8, 2048, keep=True), store(1 << 38, 64, 4096), load((1 << 64) - 4096, 1, 1),
          gemv(cap - (1 << 19), 256, 1024), gemm(0, 256, 256, 128, trans=True, acc=True),
          gemm(0, 256, 128, 256), gemv(0, 32, 8192), gemv(0, 16, 16896)]
    ds += descriptor_stream(seed=4, n=40, cfg=PAPER)
    _, run = run_decoder(backend, ds, cfg=PAPER, traffic="random")
    check_outputs(run, ds, cfg=PAPER)


def test_group_config(backend):
    """A core with the grouped dataflow (group_lanes = 2 of 8 lanes): GROUP descriptors, well formed and mutated
    (shapes, rows, flags), decoded exactly as ``Descriptor.validate`` / ``command`` say, under random traffic."""
    cfg = replace(TINY, sfu_lanes=2, group_lanes=2, max_batch=8)
    # K = n W (2, 4, 6, 64 = W x the PE array's 32 x words: accepted), K = 3, 66 or 0 (refused)
    ds = [gemm(0, 4, 2, 8, group=True, keep=True), gemm(0, 6, 2, 8, group=True), gemm(0, 4, 4, 8, group=True),
          gemm(0, 4, 6, 8, group=True), gemm(0, 4, 64, 8, group=True), gemm(0, 4, 3, 8, group=True),
          gemm(0, 4, 66, 8, group=True), gemm(0, 4, 0, 8, group=True),
          replace(gemv(0, 2, 8), flags=32), softmax(8, 2, group=True, keep=True, chain=True), softmax(4, 8, group=True),
          gemm(0, 4, 2, 8, group=True, trans=True), replace(gemm(0, 4, 2, 8, group=True), flags=32 | 8 | 16)]
    ds += descriptor_stream(seed=9, n=60, cfg=cfg)
    _, run = run_decoder(backend, ds, cfg=cfg, traffic="random")
    check_outputs(run, ds, cfg=cfg)
    codes = {d.validate(cfg) for d in ds}
    assert {ErrorCode.OK, ErrorCode.SHAPE_MISMATCH, ErrorCode.BAD_FLAGS} <= codes
    assert sum(d.grouped(cfg) and d.validate(cfg) == ErrorCode.OK for d in ds) >= 5
    assert [ds[i].validate(cfg) for i in (2, 3, 4)] == [ErrorCode.OK] * 3
    assert [ds[i].validate(cfg) for i in (5, 6)] == [ErrorCode.SHAPE_MISMATCH] * 2
    assert ds[3].result_shape(cfg) == (4, 2) and ds[3].input_beats(8, cfg) == 3


def test_group_narrow_config(backend):
    """A core with NARROW GROUP descriptors (group_lanes = 4 of 16 lanes, group_narrow: segments of 4 or 2 per
    descriptor): the shapes at W / 2 (K = n W / 2, rows of W / 2, rows a multiple of 2 g) accepted, the W-shapes
    refused under NARROW and the W / 2 shapes without it, NARROW without GROUP or on a core without group_narrow
    BAD_FLAGS; decoded as ``Descriptor.validate`` / ``command`` say, under random traffic."""
    cfg = replace(TINY, macs=32, lanes=16, sfu_lanes=2, group_lanes=4, group_narrow=True, max_batch=16)
    ds = [gemm(0, 8, 2, 16, group=True, narrow=True, keep=True), gemm(0, 8, 6, 16, group=True, narrow=True),
          softmax(8, 2, group=True, narrow=True, keep=True, chain=True), gemm(0, 4, 4, 16, group=True),
          gemm(0, 4, 2, 16, group=True, narrow=True), gemm(0, 8, 3, 16, group=True, narrow=True),
          softmax(8, 4, group=True, narrow=True), gemm(0, 8, 2, 16, group=True), softmax(8, 2, group=True),  # (W = 4)
          replace(gemm(0, 8, 2, 16), flags=FLAG_NARROW), replace(softmax(8, 16), flags=FLAG_NARROW),
          gemm(0, 8, 2 * 16, 16, group=True, narrow=True), gemm(0, 8, 2 * 16 + 2, 16, group=True, narrow=True)]  # K <= W/2 x 16 x words
    ds += descriptor_stream(seed=11, n=60, cfg=cfg)
    _, run = run_decoder(backend, ds, cfg=cfg, traffic="random")
    check_outputs(run, ds, cfg=cfg)
    assert [d.validate(cfg) for d in ds[:13]] == [
        ErrorCode.OK, ErrorCode.OK, ErrorCode.OK, ErrorCode.OK, ErrorCode.SHAPE_MISMATCH, ErrorCode.SHAPE_MISMATCH,
        ErrorCode.SHAPE_MISMATCH, ErrorCode.SHAPE_MISMATCH, ErrorCode.SHAPE_MISMATCH, ErrorCode.BAD_FLAGS,
        ErrorCode.BAD_FLAGS,
        ErrorCode.OK, ErrorCode.SHAPE_MISMATCH]
    assert ds[1].result_shape(cfg) == (8, 2) and ds[1].input_beats(16, cfg) == 3
    assert sum(d.narrowed(cfg) and d.validate(cfg) == ErrorCode.OK for d in ds) >= 6
    # the same NARROW GEMM on a core without group_narrow: BAD_FLAGS (its shape checked at W: fine here)
    plain = replace(cfg, group_narrow=False)
    assert gemm(0, 4, 4, 16, group=True, narrow=True).validate(plain) == ErrorCode.BAD_FLAGS
    assert replace(gemm(0, 4, 4, 16, group=True), flags=FLAG_GROUP).validate(plain) == ErrorCode.OK


def test_instruction_buffer_is_an_ordered_fifo(backend):
    rng = random.Random(5)
    items = [rng.getrandbits(204 + 32) for _ in range(50)]
    dut = InstructionBuffer(config=TINY)
    run = backend.run_streams(dut, {"i": items}, {"o": len(items)},
                              traffic=Traffic.random(stream_ports(dut), seed=6, ready_prob=0.4))
    assert run.outputs["o"] == items
    run = backend.run_streams(InstructionBuffer(config=TINY), {"i": items[:1]}, {"o": 1})
    assert run.cycles == InstructionBuffer.latency + 1


def test_rejects_non_config():
    with pytest.raises(ValueError, match="NDPConfig"):
        DescriptorDecoder(config=None)
    with pytest.raises(ValueError, match="NDPConfig"):
        InstructionBuffer(config="tiny")


def test_sfu_fifo_depth_is_validated():
    """``NDPConfig.sfu_fifo`` (the FIFO in front of the SFU): 0..4096 words, an int; out of range names the field
    and the range."""
    from hdl.ndp.config import PAPER
    assert PAPER.sfu_fifo == 32 and TINY.sfu_fifo == 0
    for bad in (-1, 4097, 2.0, True):
        with pytest.raises(ValueError, match=r"sfu_fifo must be an int in 0\.\.4096"):
            replace(TINY, sfu_fifo=bad)
