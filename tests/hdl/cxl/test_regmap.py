"""CXL MMIO register map (``hdl.cxl.regmap``): invariants, lookups, validation, and ``docs/cxl_regmap.md``."""

import re
from pathlib import Path

import pytest

import hdl.cxl.regmap as rmod
from hdl.cxl.regmap import (Register, RegisterMap, QueueLayout, check_registers, QUEUE_BASE, QUEUE_STRIDE,
                            MAX_QUEUES, REG_BYTES, valid_word, completion_flag)
from hdl.ndp.config import TINY, PAPER
from hdl.ndp.descriptor import DESCRIPTOR_BITS, FLIT_BYTES

DOC = Path(__file__).resolve().parents[3] / "docs" / "cxl_regmap.md"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 17, MAX_QUEUES])
def test_no_overlap_aligned_and_inside_size(n):
    rm = RegisterMap(num_queues=n)
    regs = list(rm)
    assert len(regs) == len(rm) == 8 + 10 * n
    offsets = [r.offset for r in regs]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    for r in regs:
        assert r.offset % REG_BYTES == 0 and r.offset + REG_BYTES <= rm.size
        assert 1 <= r.width <= 64 and 0 <= r.reset <= r.mask
        assert rm.at(r.offset) is r
        assert rm.reg(r.name, r.queue) is r and rm.offset(r.name, r.queue) == r.offset
    assert rm.size & (rm.size - 1) == 0 and rm.size == 1 << rm.addr_bits
    assert rm.size >= QUEUE_BASE + n * QUEUE_STRIDE > rm.size // 2
    for q in range(n):
        assert rm.offset("SQ_BASE", q) == QUEUE_BASE + q * QUEUE_STRIDE == rm.queue_base(q)
    assert rm.reg("NUM_QUEUES").reset == n and rm.reg("INT_STATUS").width == n
    assert rm.reg("QUEUE_STRIDE").reset == QUEUE_STRIDE
    assert rm.at(3) is None and rm.at(rm.size) is None


def test_lookups_and_errors():
    rm = RegisterMap(num_queues=4)
    assert rm.offset("DEV_ID") == 0 and rm.reg("DEV_ID").access == "RO"
    assert rm.offset("DOORBELL", 3) == 0x100 + 3 * 0x80 + 0x38
    assert rm.reg("HEAD", 1).full_name == "Q1.HEAD"
    with pytest.raises(ValueError, match="unknown register name 'NOPE'"):
        rm.reg("NOPE")
    with pytest.raises(ValueError, match="out of range 0..3"):
        rm.reg("SQ_BASE", 4)
    with pytest.raises(ValueError, match="out of range"):
        rm.offset("CTRL", -1)
    with pytest.raises(ValueError, match="per-queue register"):
        rm.reg("SQ_BASE")
    with pytest.raises(ValueError, match="global register"):
        rm.reg("INT_STATUS", 0)
    for bad in (0, MAX_QUEUES + 1, "4", True, 2.0):
        with pytest.raises(ValueError, match="num_queues"):
            RegisterMap(num_queues=bad)


def test_register_and_map_validation():
    ok = dict(name="X", offset=8, access="RW", reset=0, width=8, doc="")
    Register(**ok)
    for change, msg in [({"offset": 4}, "misaligned"), ({"access": "RW0"}, "access"), ({"width": 65}, "width"),
                        ({"width": 0}, "width"), ({"reset": 256}, "does not fit"), ({"name": "x y"}, "name"),
                        ({"offset": -8}, "offset")]:
        with pytest.raises(ValueError, match=msg):
            Register(**{**ok, **change})
    with pytest.raises(ValueError, match="overlap at offset 0x8"):
        check_registers([Register(**ok), Register(**{**ok, "name": "Y"})])
    with pytest.raises(ValueError, match="duplicate register Q1.X"):
        check_registers([Register(**ok, queue=1), Register(**{**ok, "offset": 16}, queue=1)])
    check_registers([Register(**ok, queue=0), Register(**{**ok, "offset": 16}, queue=1)])


def _num(text, n):
    return n if text == "N" else int(text, 0)


def test_documented_tables_match_regmap():
    text = DOC.read_text()
    rows = re.findall(r"^\| `(\w+)` \| (\+?)(0x[0-9A-Fa-f]+) \| (\w+) \| (\w+) \| (\w+) \|", text, re.M)
    assert rows
    for n in (1, 4, 64):
        rm = RegisterMap(num_queues=n)
        documented = {}
        for name, rel, off, access, reset, width in rows:
            documented[name] = (rel == "+", int(off, 16), access, _num(reset, n), _num(width, n))
        actual = {}
        for r in rm:
            if r.queue is None:
                actual[r.name] = (False, r.offset, r.access, r.reset, r.width)
            elif r.queue == 0:
                actual[r.name] = (True, r.offset - QUEUE_BASE, r.access, r.reset, r.width)
        assert documented == actual
    section = text.split("| constant | value | meaning |")[1]
    consts = dict(re.findall(r"^\| `([A-Z_]+)` \| (0x[0-9A-Fa-f]+|\d+) \|", section, re.M))
    assert consts
    for name, value in consts.items():
        assert getattr(rmod, name) == int(value, 0), name
    assert f"`QUEUE_BASE + q * QUEUE_STRIDE` = `{QUEUE_BASE:#x} + q * {QUEUE_STRIDE:#x}`" in text


def test_queue_memory_layout():
    assert rmod.SLOT_HEADER_BYTES == FLIT_BYTES == 256
    assert rmod.DESC_BYTES * 8 >= DESCRIPTOR_BITS > (rmod.DESC_BYTES - 1) * 8
    assert rmod.DESC_OFFSET + rmod.DESC_BYTES <= rmod.VALID_OFFSET and rmod.VALID_OFFSET % 8 == 0
    assert rmod.CPL_FLAG_OFFSET % 8 == 0 and rmod.CPL_FLAG_OFFSET + 8 <= rmod.CPL_HEADER_BYTES
    lay = QueueLayout(input_bytes=2048, result_bytes=1024)
    assert lay.slot_bytes == 2304 and lay.cpl_bytes == 1088
    assert lay.slot_addr(0x1000, 8, 11) == 0x1000 + 3 * 2304
    assert lay.valid_addr(0x1000, 8, 3) == 0x1000 + 3 * 2304 + 32
    assert lay.input_addr(0, 8, 1) == 2304 + 256 and lay.desc_addr(0, 8, 1) == 2304
    assert lay.flag_addr(0x800, 4, 5) == 0x800 + 1088 + 32 and lay.result_addr(0, 4, 0) == 64
    assert lay.sq_bytes(8) == 8 * 2304 and lay.cq_bytes(4) == 4 * 1088
    for bad in (0, 3, -4):
        with pytest.raises(ValueError, match="power of two"):
            lay.slot_addr(0, bad, 0)
    with pytest.raises(ValueError, match="input_bytes"):
        QueueLayout(input_bytes=100, result_bytes=0)
    assert QueueLayout.for_config(TINY) == QueueLayout(2048, 2048)
    assert QueueLayout.for_config(PAPER).input_bytes >= PAPER.input_buffer_bytes
    # Tagged words: the index is in the low half, so a stale lap never matches.
    assert valid_word(5) != valid_word(5 + 8) and valid_word(5) >> 32 == rmod.VALID_TAG >> 32
    assert valid_word((1 << 32) + 7) == valid_word(7) and completion_flag(7) & 0xFFFF_FFFF == 7
    assert valid_word(0) != 0 and completion_flag(0) != valid_word(0)
