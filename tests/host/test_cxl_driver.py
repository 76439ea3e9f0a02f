"""The scripted CXL host driver (host/cxl_driver.py) and the golden device (sim/golden/cxl_device.py): no RTL."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hdl.ndp.config import TINY
from hdl.ndp.descriptor import ErrorCode
from hdl.cxl.regmap import (RegisterMap, QueueLayout, valid_word, completion_flag, DEV_ID_MAGIC, VALID_OFFSET,
                            CPL_FLAG_OFFSET)
from firmware.ndp.descriptor import Descriptor, gemv, gemm, softmax, load, store, decode
from host.cxl_driver import Driver, CompletionRecord, compare_runs, WINDOW_VIOLATION
from sim.golden.cxl_device import (GoldenHang, GoldenOrderError, Fields, port_fields, Event,
                                   encode_descriptor, decode_descriptor, status_name)
from sim.golden.ndp_core import GoldenCore

DEPTH = 2048
MEM = DEPTH * 64
CFG = replace(TINY, name="cxl-unit", input_buffer_bytes=512, output_buffer_bytes=512, dram_buffer_bytes=2048,
              device_bytes=MEM)
LAYOUT = QueueLayout.for_config(CFG)
# queue q: ring at q * 0x4000, completions at + 0x1800, window [0x10000 + q * 0x4000, + 0x4000)
RING, CQ, WIN, WSIZE = 0x4000, 0x1800, 0x10000, 0x4000


def bits(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def driver(nq=2, entries=4, **cfg):
    d = Driver(RegisterMap(nq), LAYOUT, config=CFG, depth=DEPTH)
    for q in range(nq):
        d.configure(q, sq_base=q * RING, entries=entries, cq_base=q * RING + CQ, win_base=WIN + q * WSIZE,
                    win_limit=WIN + (q + 1) * WSIZE, **cfg)
    return d


def win(q, off=0):
    return WIN + q * WSIZE + off


def test_layout_and_formats():
    assert LAYOUT.slot_bytes == 768 and LAYOUT.cpl_bytes == 576
    assert LAYOUT.sq_bytes(4) <= CQ and CQ + LAYOUT.cq_bytes(4) <= RING
    f = port_fields(RegisterMap(2), 11)
    assert f["hmem"].width == 11 + 1 + 512 + 20 + 16 + 16
    w = f["events"].pack(3, 0xDEADBEEF, 16)
    assert f["events"].unpack(w) == (3, 0xDEADBEEF, 16)
    with pytest.raises(ValueError, match="does not fit"):
        f["events"].pack(256, 0, 0)


def test_fields_match_amaranth_layouts():
    from amaranth.lib import data
    from hdl.cxl.csr import mmio_request_layout, MMIO_RESPONSE_LAYOUT
    rm = RegisterMap(4)
    f = port_fields(rm, 12)
    assert Fields.from_layout(mmio_request_layout(rm.addr_bits)) == f["mmio"]
    assert Fields.from_layout(MMIO_RESPONSE_LAYOUT) == f["mmio_rsp"]
    assert Fields.from_layout(data.StructLayout({"queue": 8, "index": 32, "status": 8})) == f["events"]


@given(st.integers(0, 15), st.integers(0, 15), st.integers(0, 15), st.integers(0, 127), st.integers(0, 1),
       st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**20 - 1), min_size=6, max_size=6))
@settings(max_examples=200, deadline=None)
def test_fast_descriptor_codec_matches_firmware(t, op, dt, flags, res, base, dims):
    d = Descriptor(type=t, op=op, dtype=dt, flags=flags, reserved=res, base_addr=base,
                   operand_bytes=dims[0], operand_dim0=dims[1], operand_dim1=dims[2],
                   input_bytes=dims[3], input_dim0=dims[4], input_dim1=dims[5])
    assert encode_descriptor(d) == d.encode()
    assert decode_descriptor(d.encode() | (0xF << 204)) == decode(d.encode())


def test_single_queue_gemv_matches_golden_core():
    rng = np.random.default_rng(0)
    a, x = bits(rng, (16, 24), 0.3), bits(rng, (1, 16))
    d = driver(1)
    d.store(win(0), a)
    s = d.submit(0, gemv(win(0), 16, 24), x)
    h = d.read_completion(0, s.index)
    assert d.expected() == {"mmio_rsp": 8, "hmem_rsp": 1 + LAYOUT.result_bytes // 64, "events": 1,
                            "core_req": None}
    run = d.run("golden")
    rec = run.completion(h)
    core = GoldenCore(CFG, MEM)
    core.write(win(0), a)
    want = core.step(gemv(win(0), 16, 24), x).result
    assert rec.done and rec.ok and rec.seq == 0 and rec.result_bytes == 48
    assert np.array_equal(rec.result_bits(24), want)
    assert run.events == [Event(0, 0, 0)]
    assert run.golden.head == [1] and run.golden.errors == [0] and run.golden.int_status == 1
    # the record as written: header fields, completion flag, zero padding of the last result line
    raw = run.data(h)
    assert int.from_bytes(raw[CPL_FLAG_OFFSET:CPL_FLAG_OFFSET + 8], "little") == completion_flag(0)
    assert raw[64 + 48:128] == bytes(16)
    # the slot: descriptor bytes and the valid word
    slot = bytes(run.memory[0:64])
    assert decode(slot[:26] + bytes(230)) == gemv(win(0), 16, 24)
    assert int.from_bytes(slot[VALID_OFFSET:VALID_OFFSET + 8], "little") == valid_word(0)


def test_streams_protocol_order():
    """Input area, descriptor line (valid cleared), descriptor line with valid word; doorbell after."""
    d = driver(1)
    n0 = len(d._hmem)
    d.submit(0, softmax(1, 8), np.arange(8, dtype=np.uint16))
    ops = d._hmem[n0:]
    assert [op[0] for op in ops] == [(LAYOUT.slot_bytes // 64 * 0) + 4, 0, 0]
    assert ops[1][2] >> (8 * VALID_OFFSET) == 0 and ops[2][2] >> (8 * VALID_OFFSET) == valid_word(0)
    assert d._mmio[-1][:3] == (RegisterMap(1).offset("DOORBELL", 0), 1, 1)
    d.submit(0, softmax(1, 8), np.arange(8, dtype=np.uint16), early_doorbell=True, split_valid=False)
    assert d._mmio[-1][2] == 2


def test_early_and_coalesced_doorbells_same_results():
    rng = np.random.default_rng(1)
    a = bits(rng, (16, 16), 0.3)
    xs = [bits(rng, (1, 16)) for _ in range(6)]
    outs = []
    for mode in ("normal", "early", "coalesced", "late_ring"):
        d = driver(1)
        d.store(win(0), a)
        hs = []
        for i, x in enumerate(xs):
            if mode == "coalesced":
                s = d.submit(0, gemv(win(0), 16, 16), x, doorbell=(i % 3 == 2))
            elif mode == "late_ring":
                s = d.submit(0, gemv(win(0), 16, 16), x, doorbell=False)
            else:
                s = d.submit(0, gemv(win(0), 16, 16), x, early_doorbell=mode == "early")
            hs.append(s)
        if mode == "late_ring":
            d.ring(0)
        reads = [d.read_completion(0, s.index, result_bytes=32) for s in hs[2:]]
        run = d.run("golden")
        assert [e.index for e in run.events] == list(range(6))
        outs.append([run.data(h) for h in reads])
    assert all(o == outs[0] for o in outs)


def test_ring_wrap_gates_slot_reuse():
    """5 submissions on a 2-slot ring: slot re-use waits (barrier) for the previous lap; every record is read
    before it is overwritten."""
    rng = np.random.default_rng(2)
    d = driver(1, entries=2)
    d.store(win(0), bits(rng, (8, 8)))
    recs = []
    for i in range(5):
        if i >= 2:
            recs.append(d.read_completion(0, i - 2, result_bytes=16))
        d.submit(0, gemv(win(0), 8, 8), bits(rng, (1, 8)))
    recs += [d.read_completion(0, i, result_bytes=16) for i in (3, 4)]
    afters = d._afters()
    valid_pos = [s.valid_pos for s in d.submissions]
    # the first write of submission 2 (slot 0 again) waits for both earlier submissions
    first_of_2 = valid_pos[1] + 1 + 1        # after read of record 0 (one line + one result line)
    assert afters[valid_pos[2]] == 2 and afters[first_of_2] >= 2
    run = d.run("golden")
    got = [run.completion(h) for h in recs]
    assert [(r.index, r.seq, r.done) for r in got] == [(i, i, True) for i in (0, 1, 2, 3, 4)]


def test_window_violation_and_isolation():
    rng = np.random.default_rng(3)
    a0, a1 = bits(rng, (16, 16), 0.3), bits(rng, (16, 16), 0.3)
    d = driver(2)
    d.store(win(0), a0)
    d.store(win(1), a1)
    s_bad = d.submit(0, store(win(1), 16, 16), bits(rng, (16, 16)))           # into q1's window
    s_ok = d.submit(1, gemv(win(1), 16, 16), bits(rng, (1, 16)))
    s_straddle = d.submit(0, load(win(0, WSIZE - 64), 2, 32), None)            # 128 B from 64 B before limit
    s_wrap = d.submit(0, gemv(2**64 - 64, 8, 8), bits(rng, (1, 8)))
    s_sm = d.submit(0, softmax(1, 8), bits(rng, (1, 8)))                       # no operand: always passes
    hs = [d.read_completion(s.queue, s.index, result_bytes=64) for s in (s_bad, s_ok, s_straddle, s_wrap, s_sm)]
    w1 = d.read(win(1), 512)
    run = d.run("golden")
    st_ = [run.completion(h).status for h in hs]
    assert st_ == [WINDOW_VIOLATION, 0, WINDOW_VIOLATION, WINDOW_VIOLATION, 0]
    assert run.completion(hs[0]).result_bytes == 0
    assert run.data(w1) == a1.astype("<u2").tobytes()
    assert run.golden.errors == [3, 0]
    assert [a.queue for a in run.golden.accesses] == [1]


def test_window_violation_keeps_chain_state():
    """The core never sees a window-violating descriptor: KEEP state survives it (CHAIN still works)."""
    rng = np.random.default_rng(4)
    d = driver(2)
    d.store(win(0), bits(rng, (16, 16), 0.3))
    d.submit(0, gemv(win(0), 16, 16, keep=True), bits(rng, (1, 16)))
    d.submit(0, gemv(win(1), 16, 16), bits(rng, (1, 16)))                     # violation
    s = d.submit(0, gemv(win(0), 16, 16, chain=True), None)
    h = d.read_completion(0, s.index)
    run = d.run("golden")
    assert [e.status for e in run.events] == [0, WINDOW_VIOLATION, 0]
    assert run.completion(h).ok


def test_malformed_descriptors_complete_with_their_code():
    d = driver(1)
    w = win(0)
    bad = [replace(gemv(w, 8, 8), type=0), replace(load(w, 2, 2), op=2), gemv(w, 8, 8, dtype=2),
           replace(gemv(w, 8, 8), input_dim0=0), replace(gemv(w, 8, 8), operand_bytes=130),
           replace(gemv(w, 8, 8), input_bytes=1024, input_dim1=512), gemm(w, 5, 8, 8), gemv(w + 2, 8, 8),
           gemv(w, 12, 8, trans=True), store(w, 1, 2), replace(load(w, 2, 2), flags=2), gemv(w, 8, 8, chain=True)]
    want = [b.validate(CFG) for b in bad]
    want[-1] = ErrorCode.NO_CHAIN_INPUT
    subs = [d.submit(0, b, np.zeros(min(b.input_bytes, 512) // 2, np.uint16) if b.input_bytes else None)
            for b in bad]
    subs.append(d.submit(0, (1 << 204) | replace(gemv(w, 8, 8), type=0).encode(), None))   # high pad bits
    hs = [d.read_completion(0, s.index, result_bytes=0) for s in subs[-4:]]
    run = d.run("golden")
    assert [e.status for e in run.events] == [c.value for c in want] + [ErrorCode.UNKNOWN_TYPE.value]
    assert run.golden.errors == [len(subs)]
    assert [run.completion(h).status_name for h in hs][-1] == "UNKNOWN_TYPE"
    assert not run.golden.accesses


def test_mmio_register_semantics():
    d = Driver(RegisterMap(2), LAYOUT, config=CFG, depth=DEPTH)
    rm = d.regmap
    ids = [d.mmio_read("DEV_ID"), d.mmio_read("NUM_QUEUES"), d.mmio_write("DEV_ID", 1),
           d.mmio_write("SQ_ENTRIES", 3, 0), d.mmio_write("SQ_ENTRIES", 8, 0), d.mmio_read("SQ_ENTRIES", 0),
           d.mmio_read("DOORBELL", 1), d.mmio_write(0x1F8, 5), d.mmio_write(rm.offset("PASID", 1) + 4, 1),
           d.mmio_write("PASID", 0xFFFFFFFF, 1), d.mmio_read("PASID", 1), d.mmio_read("QUEUE_STRIDE"),
           d.mmio_write("INT_ENABLE", 0xFF), d.mmio_read("INT_ENABLE")]
    run = d.run("golden")
    got = [(run.mmio[i].rdata, run.mmio[i].err) for i in ids]
    assert got == [(DEV_ID_MAGIC, 0), (2, 0), (0, 1), (0, 1), (0, 0), (8, 0), (0, 1), (0, 1), (0, 1), (0, 0),
                   (0xFFFFF, 0), (0x80, 0), (0, 0), (3, 0)]
    assert not run.mmio[ids[0]].dynamic and d.mmio_read("HEAD", 0) is not None


def test_never_rung_submissions_do_not_complete():
    d = driver(1)
    d.submit(0, softmax(1, 8), np.zeros(8, np.uint16), doorbell=False)
    assert d.expected()["events"] == 0
    run = d.run("golden")
    assert run.events == []
    d.ring(0)
    assert d.expected()["events"] == 1


def test_unsatisfiable_gate_is_a_hang():
    d = driver(1)
    d.submit(0, softmax(1, 8), np.zeros(8, np.uint16))
    d.read(0, 64, after=2)
    with pytest.raises(GoldenHang, match="waits for 2"):
        d.run("golden")


def test_forced_order_cross_queue_keep_chain():
    """KEEP on q0 and CHAIN on q1: the CHAIN is refused either way (the kept result is q0's: FOREIGN_STATE after
    it, NO_CHAIN_INPUT before it); the golden follows a forced order."""
    rng = np.random.default_rng(5)
    d = driver(2)
    d.store(win(0), bits(rng, (8, 8), 0.3))
    d.store(win(1), bits(rng, (8, 8), 0.3))
    d.submit(0, gemv(win(0), 8, 8, keep=True), bits(rng, (1, 8)))
    d.submit(1, gemv(win(1), 8, 8, chain=True), None)
    r01 = d.run("golden", order=[(0, 0), (1, 0)])
    r10 = d.run("golden", order=[Event(1, 0, 0), Event(0, 0, 0)])
    assert [e.status for e in r01.events] == [0, ErrorCode.FOREIGN_STATE.value]
    assert [e.status for e in r10.events] == [ErrorCode.NO_CHAIN_INPUT.value, 0]
    with pytest.raises(GoldenOrderError, match="HEAD"):
        d.run("golden", order=[(0, 1), (0, 0)])
    with pytest.raises(GoldenOrderError, match="never became executable"):
        d.run("golden", order=[(0, 0), (1, 0), (1, 1)])
    assert compare_runs(r01, r10, events="per-queue")
    d.submit(1, gemv(win(1), 8, 8, keep=True), bits(rng, (1, 8)))          # q1's own state
    d.submit(1, gemv(win(1), 8, 8, chain=True), None)
    r = d.run("golden")
    assert [st for _, st in r.events_by_queue()[1]][1:] == [0, 0]


def test_compare_runs_and_record_decode():
    rec = CompletionRecord.from_bytes(1, 7, (7).to_bytes(8, "little") + (16).to_bytes(4, "little") + bytes(4)
                                      + (0).to_bytes(8, "little") + bytes(8)
                                      + completion_flag(7).to_bytes(8, "little") + bytes(24))
    assert rec.done and rec.status_name == "WINDOW_VIOLATION" and not rec.ok and rec.result == b""
    assert status_name(3) == "UNKNOWN_DTYPE" and status_name(99) == "99"


def test_argument_checks():
    d = driver(1)
    with pytest.raises(ValueError, match="multiple of 64"):
        d.store(32, b"x")
    with pytest.raises(ValueError, match="beyond"):
        d.store(MEM - 64, bytes(128))
    with pytest.raises(ValueError, match="power of two"):
        d.configure(0, sq_base=0, entries=3, cq_base=0x1800, win_base=0, win_limit=0)
    with pytest.raises(ValueError, match="input area"):
        d.submit(0, softmax(1, 8), np.zeros(1024, np.uint16))
    with pytest.raises(ValueError, match="not configured"):
        Driver(RegisterMap(1), LAYOUT, config=CFG, depth=DEPTH).submit(0, softmax(1, 8))
    with pytest.raises(ValueError, match="tail"):
        d.ring(0, 5)
    with pytest.raises(ValueError, match="after"):
        d.read(0, 64, after=1 << 16)
    with pytest.raises(ValueError, match="Descriptor"):
        d.submit(0, "gemv")


@st.composite
def programs(draw):
    """Independent queues (no KEEP/CHAIN, disjoint windows): any legal execution order gives the same data."""
    nq = draw(st.integers(1, 3))
    subs = draw(st.lists(st.tuples(st.integers(0, nq - 1), st.sampled_from(["gemv", "load", "store", "bad", "sm"]),
                                   st.booleans(), st.integers(0, 3)), min_size=1, max_size=10))
    entries = draw(st.sampled_from([1, 2, 4]))
    return nq, subs, entries, draw(st.integers(0, 2**32 - 1))


@given(programs())
@settings(max_examples=60, deadline=None)
def test_golden_order_independent_for_independent_queues(prog):
    nq, subs, entries, seed = prog
    rng = np.random.default_rng(seed)
    d = driver(nq, entries=entries)
    for q in range(nq):
        d.store(win(q), bits(rng, (64, 64), 0.3))
    count = [0] * nq
    reads = []
    for q, kind, early, off in subs:
        w = win(q, 64 * off)
        desc = {"gemv": gemv(w, 8, 16), "load": load(w, 3, 5), "store": store(w, 1, 32),
                "bad": gemv(win((q + 1) % 3), 8, 8), "sm": softmax(2, 8)}[kind]
        inp = None if kind == "load" else bits(rng, (desc.input_dim0 * desc.input_dim1,))
        if count[q] >= entries:
            reads.append(d.read_completion(q, count[q] - entries, result_bytes=64))
        d.submit(q, desc, inp, early_doorbell=early)
        count[q] += 1
    for q in range(nq):
        for i in range(max(0, count[q] - entries), count[q]):
            reads.append(d.read_completion(q, i, result_bytes=64))
        reads.append(d.read(win(q), 64 * 64 * 2))
    a = d.run("golden")
    # another legal order: per queue in order, queues visited highest first between the gates
    g = d.golden()
    b = d.run(g, order=_reverse_rr(a.events, d))
    assert compare_runs(a, b, events="per-queue") == []


def _reverse_rr(events, d):
    """The same per-queue sequences, merged in a different (still legal) way: between barrier reads the
    golden's round-robin order is replaced by 'highest queue first'. Legal because every gate in these scripts
    is a full barrier: any interleaving of the work before it is possible."""
    afters = sorted(set(d._afters()))
    out, done = [], 0
    for cut in afters + [len(events)]:
        seg = events[done:cut]
        out += sorted(seg, key=lambda e: (-e.queue, e.index))
        done = max(done, cut)
    return out
