"""NDP descriptor: layout (204 bits, one flit, documented offsets), encode/decode, validate(), helpers, config."""

import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hdl.ndp.config import TINY, PAPER, NDP_PRESETS, ndp_preset, slice_preset
from hdl.ndp.descriptor import (DESCRIPTOR_LAYOUT, HEADER_LAYOUT, DESCRIPTOR_BITS, FLIT_BYTES, DescType, DescOp,
                                DType, ErrorCode, DECODER_CODES, CONTROL_CODES, REQUEST_LAYOUT, command_layout)
from firmware.ndp.descriptor import Descriptor, decode, gemv, gemm, softmax, load, store, request

DOC = Path(__file__).resolve().parents[2] / "docs" / "ndp_descriptor.md"


def flat_fields(layout, prefix=""):
    """(dotted name, offset, width) of every leaf field of a nested StructLayout."""
    out = []
    for name, field in layout:
        if hasattr(field.shape, "__iter__") and not isinstance(field.shape, int):
            out += [(f"{prefix}{name}.{n}", field.offset + o, w) for n, o, w in flat_fields(field.shape)]
        else:
            out.append((f"{prefix}{name}", field.offset, field.width))
    return out


# ---- layout ----------------------------------------------------------------------------------------------

def test_layout_is_204_bits_and_fits_a_flit():
    assert DESCRIPTOR_LAYOUT.size == DESCRIPTOR_BITS == 204
    assert HEADER_LAYOUT.size == 20
    assert DESCRIPTOR_BITS <= 8 * FLIT_BYTES == 2048
    widths = {name: w for name, _, w in flat_fields(DESCRIPTOR_LAYOUT)}
    assert widths["base_addr"] == 64
    for t in ("operand", "input"):
        assert [widths[f"{t}.{f}"] for f in ("bytes", "dim0", "dim1")] == [20, 20, 20]


def test_layout_matches_documented_table():
    rows = re.findall(r"^\| `([\w.]+)` \| (\d+):(\d+) \|", DOC.read_text(), re.M)
    documented = {name: (int(lo), int(hi) - int(lo) + 1) for name, hi, lo in rows}
    actual = {name: (off, w) for name, off, w in flat_fields(DESCRIPTOR_LAYOUT)}
    assert documented == actual
    # Contiguous and covering bits 0..203 exactly.
    spans = sorted(actual.values())
    assert spans[0][0] == 0
    for (o1, w1), (o2, _) in zip(spans, spans[1:]):
        assert o1 + w1 == o2
    assert spans[-1][0] + spans[-1][1] == DESCRIPTOR_BITS


def test_enum_codes_are_documented():
    text = DOC.read_text()
    for member in list(DescType) + list(DescOp):
        assert f"{member.value} {member.name}" in text
    for member in ErrorCode:
        assert f"| {member.value} | {member.name} |" in text


def test_encode_places_fields_at_their_offsets():
    d = Descriptor(type=DescType.READ_COMPUTE, op=DescOp.GEMM, dtype=DType.FP16, flags=0x76, reserved=0x1,
                   base_addr=0x0123_4567_89AB_CDEF, operand_bytes=0x11111, operand_dim0=0x22222,
                   operand_dim1=0x33333, input_bytes=0x44444, input_dim0=0x55555, input_dim1=0x66666)
    v = d.encode()
    assert v & 0xF == 3 and (v >> 4) & 0xF == 2 and (v >> 8) & 0xF == 1 and (v >> 12) & 0x7F == 0x76
    assert (v >> 19) & 0x1 == 0x1
    assert (v >> 20) & ((1 << 64) - 1) == 0x0123_4567_89AB_CDEF
    for k, val in enumerate((0x11111, 0x22222, 0x33333, 0x44444, 0x55555, 0x66666)):
        assert (v >> (84 + 20 * k)) & 0xFFFFF == val


# ---- encode / decode -------------------------------------------------------------------------------------

def u(bits):
    return st.integers(0, (1 << bits) - 1)


descriptors = st.builds(
    Descriptor, type=u(4), op=u(4), dtype=u(4), flags=u(7), reserved=u(1), base_addr=u(64),
    operand_bytes=u(20), operand_dim0=u(20), operand_dim1=u(20),
    input_bytes=u(20), input_dim0=u(20), input_dim1=u(20))


@settings(max_examples=300, deadline=None)
@given(descriptors)
def test_encode_decode_round_trip(d):
    v = d.encode()
    assert 0 <= v < 1 << DESCRIPTOR_BITS
    assert decode(v) == d
    flit = d.to_flit()
    assert len(flit) == FLIT_BYTES and flit[26:] == bytes(FLIT_BYTES - 26)
    assert int.from_bytes(flit, "little") == v
    assert decode(flit) == d


@settings(max_examples=200, deadline=None)
@given(u(DESCRIPTOR_BITS))
def test_decode_encode_round_trip_any_bits(v):
    assert decode(v).encode() == v


def test_known_codes_become_enum_members():
    d = Descriptor(type=3, op=1, dtype=1, base_addr=0, operand_bytes=0, operand_dim0=0, operand_dim1=0)
    assert d.type is DescType.READ_COMPUTE and d.op is DescOp.GEMV and d.dtype is DType.FP16
    assert Descriptor(type=9, op=0, dtype=1, base_addr=0, operand_bytes=0, operand_dim0=0,
                      operand_dim1=0).type == 9


@pytest.mark.parametrize("field,value", [
    ("type", 16), ("op", -1), ("dtype", 1.0), ("reserved", 2), ("flags", 128), ("base_addr", 1 << 64),
    ("operand_bytes", 1 << 20), ("operand_dim0", -1), ("input_dim1", 1 << 20), ("input_bytes", True),
])
def test_descriptor_rejects_out_of_range_fields(field, value):
    with pytest.raises(ValueError, match=field):
        replace(gemv(0, 2, 2), **{field: value})


def test_decode_rejects_bad_flits():
    with pytest.raises(ValueError, match="256"):
        decode(bytes(255))
    with pytest.raises(ValueError, match="203"):
        decode(1 << DESCRIPTOR_BITS)
    with pytest.raises(ValueError):
        decode(-1)


# ---- validate --------------------------------------------------------------------------------------------
# TINY: input buffer 2048 B, DRAM buffer 4096 B, output buffer 2048 B, max_batch 4, device 16 MiB, lanes 8,
# align_bytes 64.
GOOD = gemv(0x1000, 16, 32)

BAD = {
    "type-none": (replace(GOOD, type=0), ErrorCode.UNKNOWN_TYPE),
    "type-7": (replace(GOOD, type=7), ErrorCode.UNKNOWN_TYPE),
    "op-rc-none": (replace(GOOD, op=DescOp.NONE), ErrorCode.UNKNOWN_OP),
    "op-rc-9": (replace(GOOD, op=9), ErrorCode.UNKNOWN_OP),
    "op-load-gemv": (replace(load(0, 2, 2), op=DescOp.GEMV), ErrorCode.UNKNOWN_OP),
    "op-store-15": (replace(store(0, 2, 32), op=15), ErrorCode.UNKNOWN_OP),
    "dtype-fp32": (gemv(0, 16, 32, dtype=DType.FP32), ErrorCode.UNKNOWN_DTYPE),
    "dtype-none": (replace(GOOD, dtype=0), ErrorCode.UNKNOWN_DTYPE),
    "zero-operand-dim0": (replace(GOOD, operand_dim0=0, operand_bytes=0), ErrorCode.ZERO_DIMENSION),
    "zero-operand-dim1": (replace(GOOD, operand_dim1=0), ErrorCode.ZERO_DIMENSION),
    "zero-input-dim0": (replace(GOOD, input_dim0=0), ErrorCode.ZERO_DIMENSION),
    "zero-store-input": (replace(store(0, 2, 32), input_dim1=0), ErrorCode.ZERO_DIMENSION),
    "zero-softmax-rows": (replace(softmax(2, 8), input_dim0=0, input_bytes=0), ErrorCode.ZERO_DIMENSION),
    "size-operand": (replace(GOOD, operand_bytes=GOOD.operand_bytes + 2), ErrorCode.SIZE_MISMATCH),
    "size-operand-zero": (replace(GOOD, operand_bytes=0), ErrorCode.SIZE_MISMATCH),
    "size-input": (replace(GOOD, input_bytes=16), ErrorCode.SIZE_MISMATCH),
    "size-softmax-input": (replace(softmax(2, 8), input_bytes=30), ErrorCode.SIZE_MISMATCH),
    "operand-large": (gemv(0, 64, 64), ErrorCode.OPERAND_TOO_LARGE),
    "load-large": (load(0, 64, 33), ErrorCode.OPERAND_TOO_LARGE),
    "input-large": (gemm(0, 4, 512, 2), ErrorCode.INPUT_TOO_LARGE),
    "input-padded-large": (gemm(0, 4, 12, 8), ErrorCode.OK),    # placeholder, replaced below
    "input-max-k": (gemv(0, 264, 4), ErrorCode.INPUT_TOO_LARGE),
    "store-input-large": (store(0, 32, 33), ErrorCode.INPUT_TOO_LARGE),
    "softmax-input-large": (softmax(2, 520), ErrorCode.INPUT_TOO_LARGE),
    "addr-capacity": (gemv((1 << 24) - 1023, 16, 32), ErrorCode.ADDRESS_OVERFLOW),
    "addr-wrap": (gemv((1 << 64) - 2, 16, 32), ErrorCode.ADDRESS_OVERFLOW),
    "shape-gemv-k": (replace(GOOD, input_dim1=8, input_bytes=16), ErrorCode.SHAPE_MISMATCH),
    "shape-gemv-rows": (replace(GOOD, input_dim0=2, input_bytes=64), ErrorCode.SHAPE_MISMATCH),
    "shape-gemm-k": (replace(gemm(0, 2, 16, 16), input_dim1=8, input_bytes=32), ErrorCode.SHAPE_MISMATCH),
    "shape-store": (replace(store(0, 4, 8), input_dim0=8, input_dim1=4), ErrorCode.SHAPE_MISMATCH),
    "batch": (gemm(0, 5, 16, 16), ErrorCode.BATCH_TOO_LARGE),
    "output-gemm": (gemm(0, 4, 2, 512), ErrorCode.OUTPUT_TOO_LARGE),
    "output-softmax": (softmax(32, 32), ErrorCode.OUTPUT_TOO_LARGE),
    "output-load": (load(0, 32, 33), ErrorCode.OUTPUT_TOO_LARGE),
    "output-kept-slot": (gemm(0, 4, 8, 72, keep=True), ErrorCode.OUTPUT_TOO_LARGE),
    "output-partial-slot": (gemm(0, 4, 8, 24, trans=True, partial=True), ErrorCode.OUTPUT_TOO_LARGE),
    "output-acc-columns": (gemv(0, 1, 136), ErrorCode.OUTPUT_TOO_LARGE),
    "misaligned-gemv": (gemv(0x1002, 16, 32), ErrorCode.MISALIGNED),
    "misaligned-load": (load(0x20, 2, 2), ErrorCode.MISALIGNED),
    "multiple-n": (gemm(0, 2, 16, 20), ErrorCode.NOT_MULTIPLE),
    "multiple-n-half-odd-k": (gemv(0, 15, 4), ErrorCode.NOT_MULTIPLE),
    "multiple-trans-k": (gemv(0, 12, 8, trans=True), ErrorCode.NOT_MULTIPLE),
    "multiple-trans-half-odd-n": (gemv(0, 4, 5, trans=True), ErrorCode.NOT_MULTIPLE),
    "multiple-softmax": (softmax(2, 12), ErrorCode.NOT_MULTIPLE),
    "multiple-store": (store(0, 2, 2), ErrorCode.NOT_MULTIPLE),
    "flags-load": (replace(load(0, 2, 2), flags=1), ErrorCode.BAD_FLAGS),
    "flags-store": (replace(store(0, 2, 32), flags=2), ErrorCode.BAD_FLAGS),
    "flags-softmax-trans": (replace(softmax(2, 8), flags=16), ErrorCode.BAD_FLAGS),
    "flags-acc-no-trans": (gemv(0, 16, 32, acc=True), ErrorCode.BAD_FLAGS),
    "flags-partial-no-trans": (gemv(0, 16, 32, partial=True), ErrorCode.BAD_FLAGS),
    "flags-keep-partial": (gemv(0, 16, 8, trans=True, keep=True, partial=True), ErrorCode.BAD_FLAGS),
    "flags-group-no-group-lanes": (gemm(0, 4, 2, 8, group=True), ErrorCode.BAD_FLAGS),
}
del BAD["input-padded-large"]

GOOD_CASES = {
    "gemv": GOOD, "gemm": gemm(0, 4, 16, 16), "softmax-edge": softmax(4, 248), "load": load(0, 32, 32),
    "store": store(0, 32, 32), "load-ignores-input": replace(load(0, 2, 2), input_bytes=7, input_dim0=0),
    "reserved-ignored": replace(GOOD, reserved=0x1), "addr-edge": gemv((1 << 24) - 1024, 16, 32),
    "gemv-k8": gemv(0, 8, 8), "gemm-b1": gemm(0, 1, 8, 16), "load-odd": load(64, 3, 5),
    "softmax-ignores-operand": replace(softmax(4, 8), base_addr=3, operand_dim0=0, operand_bytes=5),
    "keep-chain": gemm(0, 2, 16, 8, keep=True, chain=True), "softmax-keep": softmax(1, 248, keep=True),
    "gemv-k12-row": gemv(0, 12, 8), "row-half": gemm(0, 3, 6, 4), "trans": gemm(0, 3, 16, 5, trans=True),
    "trans-half": gemv(0, 4, 6, trans=True), "trans-acc-partial": gemm(0, 2, 8, 24, trans=True, acc=True,
                                                                         partial=True),
    "trans-wide-n": gemv(0, 8, 200, trans=True), "trans-keep": gemv(0, 8, 24, trans=True, keep=True),
}


@pytest.mark.parametrize("name", list(BAD))
def test_validate_reports_each_error(name):
    d, code = BAD[name]
    assert d.validate(TINY) == code


def test_every_error_code_has_a_case():
    """Every decoder code has a case (NO_CHAIN_INPUT / FOREIGN_STATE are the control unit's, WINDOW_VIOLATION
    the front end's: tested with the golden core, the core and the device)."""
    assert {code for _, code in BAD.values()} == set(DECODER_CODES)


@pytest.mark.parametrize("name", list(GOOD_CASES))
def test_validate_accepts_good_descriptors(name):
    assert GOOD_CASES[name].validate(TINY) == ErrorCode.OK


@pytest.mark.parametrize("d,code", [
    (replace(GOOD, type=0, operand_dim0=0), ErrorCode.UNKNOWN_TYPE),
    (replace(GOOD, op=7, dtype=5), ErrorCode.UNKNOWN_OP),
    (replace(GOOD, dtype=2, input_dim0=0), ErrorCode.UNKNOWN_DTYPE),
    (replace(GOOD, operand_dim1=0, base_addr=(1 << 64) - 1), ErrorCode.ZERO_DIMENSION),
    (replace(gemv(0, 64, 64), operand_bytes=8190), ErrorCode.SIZE_MISMATCH),
    (gemv((1 << 64) - 2, 64, 64), ErrorCode.OPERAND_TOO_LARGE),
    (replace(gemm(1 << 24, 8, 256, 2)), ErrorCode.INPUT_TOO_LARGE),
    (replace(gemm(1 << 24, 8, 16, 16), input_dim1=4, input_bytes=64), ErrorCode.ADDRESS_OVERFLOW),
    (replace(gemm(2, 8, 16, 16), input_dim1=4, input_bytes=64), ErrorCode.SHAPE_MISMATCH),
    (gemm(2, 8, 2, 512), ErrorCode.BATCH_TOO_LARGE),
    (gemm(2, 4, 2, 512), ErrorCode.OUTPUT_TOO_LARGE),
    (gemv(2, 12, 16), ErrorCode.MISALIGNED),
    (replace(store(0, 2, 2), flags=3), ErrorCode.NOT_MULTIPLE),
])
def test_validate_precedence(d, code):
    """Descriptors failing several checks report the lowest code."""
    assert d.validate(TINY) == code


def test_paper_config_limits():
    # PAPER lanes = 512: row mode N a multiple of 512 (or 256); TRANS K a multiple of 512 (or 256), any N.
    assert gemv(0, 16, 4096).validate(PAPER) == ErrorCode.OK
    assert gemv(0, 16, 256).validate(PAPER) == ErrorCode.OK
    assert gemv(0, 16, 128).validate(PAPER) == ErrorCode.NOT_MULTIPLE
    assert gemv(0, 4096, 16, trans=True).validate(PAPER) == ErrorCode.OK         # LoRA A, rank 16
    assert gemm(0, 256, 256, 8, trans=True).validate(PAPER) == ErrorCode.OK      # the half-block tail
    assert gemv(0, 4096, 16).validate(PAPER) == ErrorCode.NOT_MULTIPLE
    assert gemm(0, 256, 1024, 16, trans=True).validate(PAPER) == ErrorCode.OK
    assert gemm(0, 257, 512, 16, trans=True).validate(PAPER) == ErrorCode.BATCH_TOO_LARGE
    assert softmax(8, 2048).validate(PAPER) == ErrorCode.OK
    assert load((512 << 30) - 4096, 1, 32).validate(PAPER) == ErrorCode.OK
    assert load((512 << 30) - 4096, 1, 2049).validate(PAPER) == ErrorCode.ADDRESS_OVERFLOW
    assert gemv(2048, 16, 4096).validate(PAPER) == ErrorCode.MISALIGNED          # 4 KB lines


def test_group_descriptors():
    """GROUP (rows of W = group_lanes packed g to a beat; issue 29): the shapes, flags and sizes it accepts on
    PAPER (W = 128, g = 4), each rule's code, and the packed beats / R x W results the decoder reports."""
    ok = ErrorCode.OK
    scores = gemm(0, 8, 128, 512, keep=True, group=True)          # 2 query rows x 4 heads of head dim 128
    assert scores.validate(PAPER) == ok and scores.result_shape(PAPER) == (8, 128)
    assert scores.input_beats(512, PAPER) == 2 and scores.command(PAPER)["group"] == 1
    assert softmax(8, 128, keep=True, chain=True, group=True).validate(PAPER) == ok
    assert gemm(0, 8, 128, 512, chain=True, group=True).returned_elems(2, PAPER) == 8 * 128
    assert gemm(0, 256, 128, 512, group=True).validate(PAPER) == ok               # 64 query rows
    # K = n W: a head dim of n W over n x words per PE row (up to the PE array's ceil(max_k / lanes) words)
    two = gemm(0, 8, 256, 512, group=True)
    assert two.validate(PAPER) == ok and two.result_shape(PAPER) == (8, 128) and two.input_beats(512, PAPER) == 4
    assert gemm(0, 4, 512, 512, group=True).validate(PAPER) == ok
    assert two.validate(replace(PAPER, max_k=512)) == ErrorCode.SHAPE_MISMATCH      # one x word: K <= W
    cases = {
        "rows-not-multiple-of-g": (gemm(0, 6, 128, 512, group=True), ErrorCode.SHAPE_MISMATCH),
        "k-not-n-w": (gemm(0, 8, 192, 512, group=True), ErrorCode.SHAPE_MISMATCH),
        "n-not-lanes": (gemm(0, 8, 128, 1024, group=True), ErrorCode.SHAPE_MISMATCH),
        "softmax-row-not-w": (softmax(8, 256, group=True), ErrorCode.SHAPE_MISMATCH),
        "softmax-rows": (softmax(6, 128, group=True), ErrorCode.SHAPE_MISMATCH),
        "gemv": (replace(gemv(0, 128, 512), flags=32), ErrorCode.BAD_FLAGS),
        "trans": (gemm(0, 8, 128, 512, trans=True, group=True), ErrorCode.NOT_MULTIPLE),    # (TRANS K < lanes)
        "trans-k": (gemm(0, 8, 512, 512, trans=True, group=True), ErrorCode.BAD_FLAGS),     # (K = 4 W: shape ok)
        "acc": (replace(gemm(0, 8, 128, 512, group=True), flags=32 | 4), ErrorCode.BAD_FLAGS),
        "too-many-rows": (gemm(0, 260, 128, 512, group=True), ErrorCode.BATCH_TOO_LARGE),
        "no-group-lanes": (gemm(0, 8, 128, 512, group=True), ErrorCode.BAD_FLAGS),
    }
    for name, (d, code) in cases.items():
        cfg = replace(PAPER, group_lanes=0, group_narrow=False) if name == "no-group-lanes" else PAPER
        assert d.validate(cfg) == code, name
    with pytest.raises(ValueError, match="group_lanes"):
        replace(PAPER, group_lanes=256)                  # > lanes / 4
    with pytest.raises(ValueError, match="group_lanes"):
        replace(PAPER, group_lanes=64)                   # < sfu_lanes


# ---- helpers and expected commands ---------------------------------------------------------------------

dims = st.integers(1, 64)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["gemv", "gemm", "gemm-trans", "softmax", "load", "store"]), dims, dims, dims,
       st.integers(0, (1 << 14)), st.booleans(), st.booleans())
def test_helpers_build_valid_descriptors(kind, a, b, c, line, keep, chain):
    base, f = 64 * line, {"keep": keep, "chain": chain}
    d = {"gemv": lambda: gemv(base, 8 * (a % 8 + 1), 8 * (b % 4 + 1), **f),
         "gemm": lambda: gemm(base, 1 + a % 4, 8 * (b % 8 + 1), 8 * (c % 2 + 1), **f),
         "gemm-trans": lambda: gemm(base, 1 + a % 4, 8 * (b % 4 + 1), c % 16 + 1, trans=True, **f),
         "softmax": lambda: softmax(1 + a % 8, 8 * (b % 4 + 1), **f), "load": lambda: load(base, a % 16 + 1, b),
         "store": lambda: store(base, a % 16 + 1, 32)}[kind]()
    assert d.validate(TINY) == ErrorCode.OK
    assert decode(d.to_flit()) == d


def test_command_fields():
    layout = command_layout(TINY)
    c = layout.const(gemm(0x40, 3, 16, 8).command(TINY, seq=70000))
    assert (c.keep, c.chain) == (0, 0)
    assert c.status == ErrorCode.OK and c.seq == 70000 % 65536 and c.op == DescOp.GEMM
    assert (c.operand_elems, c.input_elems, c.output_elems) == (128, 48, 24)
    assert (c.operand_dim0, c.operand_dim1, c.input_dim0, c.input_dim1, c.base_addr) == (16, 8, 3, 16, 0x40)
    c = layout.const(replace(load(0, 2, 3), input_dim0=5).command(TINY, 1))
    assert (c.input_dim0, c.input_elems, c.output_elems) == (0, 0, 6)
    assert layout.const(store(0, 2, 3).command(TINY)).output_elems == 0
    c = layout.const(softmax(2, 8, keep=True, chain=True).command(TINY))
    assert (c.output_elems, c.input_elems, c.operand_elems, c.keep, c.chain) == (22, 16, 0, 1, 1)
    bad = BAD["batch"][0].command_bits(TINY, seq=5, owner=9)
    assert bad == layout.const({"status": ErrorCode.BATCH_TOO_LARGE, "seq": 5, "owner": 9}).as_value().value
    c = layout.const(gemm(0, 3, 12, 4, keep=True).command(TINY, owner=7))
    assert (c.input_beats, c.ret_elems, c.keep, c.owner) == (6, 0, 1, 7)     # rows padded to whole beats
    c = layout.const(gemm(0, 3, 16, 5, trans=True, acc=True).command(TINY))
    assert (c.trans, c.acc, c.partial, c.ret_elems) == (1, 1, 0, 15)
    c = layout.const(softmax(2, 8, keep=True).command(TINY))
    assert c.ret_elems == 6


def test_request_layout():
    """The core's desc payload: descriptor in bits 0..203, owner above; a bare encoding is owner 0."""
    d = gemv(0x40, 16, 8)
    assert REQUEST_LAYOUT.size == DESCRIPTOR_BITS + 32
    assert request(d) == d.encode() == d.request(0)
    v = d.request(0xABCD1234)
    assert v & ((1 << DESCRIPTOR_BITS) - 1) == d.encode() and v >> DESCRIPTOR_BITS == 0xABCD1234
    with pytest.raises(ValueError, match="owner"):
        request(d, 1 << 32)


def test_code_sets():
    assert CONTROL_CODES == (ErrorCode.NO_CHAIN_INPUT, ErrorCode.FOREIGN_STATE)
    assert ErrorCode.WINDOW_VIOLATION.value == 16 and ErrorCode.FOREIGN_STATE.value == 17
    assert set(DECODER_CODES) == {c for c in ErrorCode if 0 < c.value < 15}


# ---- config ---------------------------------------------------------------------------------------------

def test_presets():
    assert NDP_PRESETS == {"tiny": TINY, "paper": PAPER}
    assert ndp_preset("paper") is PAPER
    assert PAPER.macs == 1024 and PAPER.clock_mhz == 1000 and (PAPER.lanes, PAPER.pe_batch) == (512, 2)
    assert PAPER.peak_flops == pytest.approx(2.048e12)
    assert PAPER.buffer_bytes == 3 << 20                      # "3 MB of SRAM (input, DRAM and output buffers)"
    assert PAPER.partial_slot_elems == 256 * 128              # batch 256 x rank 128 FP32 partial sums per owner
    for n in (1, 2, 4, 8, 16, 32):
        s = slice_preset(n)
        assert s.lanes == 8 * n and s.pe_batch == PAPER.pe_batch and s.buffer_bytes * 64 == PAPER.buffer_bytes * n
        assert s.align_bytes == 64 * n and s.sfu_lanes * 64 == PAPER.sfu_lanes * n
    assert replace(slice_preset(64), name="paper") == PAPER
    with pytest.raises(ValueError, match="channels"):
        slice_preset(3)
    with pytest.raises(ValueError, match="tiny"):
        ndp_preset("huge")


@pytest.mark.parametrize("field,value", [
    ("macs", 0), ("clock_mhz", 0), ("input_buffer_bytes", 1), ("dram_buffer_bytes", 1 << 40),
    ("output_buffer_bytes", "4k"), ("max_batch", 1 << 20), ("acc", "bf16"), ("instr_buffer_depth", 1),
    ("device_bytes", (1 << 64) + 1), ("name", ""), ("macs", True), ("lanes", 6), ("lanes", 4),
    ("pe_batch", 0), ("align_bytes", 48), ("input_buffer_bytes", 72), ("state_slots", 3), ("sfu_lanes", 16),
    ("acc_columns", 8), ("max_k", 0), ("state_buffer_bytes", 1000), ("partial_buffer_bytes", 6),
])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        replace(TINY, **{field: value})
