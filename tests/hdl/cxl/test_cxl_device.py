# amaranth: UnusedElaboratable=no
"""The CXL NDP device RTL (sim/cxl/system.CXLSystem: CSR bank, queue engine, NDP core, guard, arbiter) driven by the
scripted host (host/cxl_driver.py), bit for bit against the golden device (sim/golden/cxl_device.py) replayed in
the RTL's execution order, on both backends. Directed cases; random programs are in test_device_fuzz.py."""

from dataclasses import replace

import numpy as np
import pytest

from hdl.ndp.descriptor import ErrorCode
from hdl.cxl.regmap import RegisterMap, QueueLayout, DEV_ID_MAGIC
from firmware.ndp.descriptor import gemv, gemm, softmax, load, store
from firmware.ndp import kernels
from host.cxl_driver import Driver, WINDOW_VIOLATION, system_for
from host.fuzz.cxl import FUZZ_CONFIG, FUZZ_QUEUES, FUZZ_DEPTH
from sim.backends import Traffic, stream_ports
from sim.golden.cxl_device import Fields, port_fields

# The fuzz campaign's device (host/fuzz/cxl.py): 16 queues, 512 B input / output buffers, a 2 KiB DRAM ring on a
# 128 KiB memory. The same hardware, so the Verilator build (~100 s of CPU) serves both files; these tests use
# queues 0 and 1 of it.
CFG, NQ, DEPTH = FUZZ_CONFIG, FUZZ_QUEUES, FUZZ_DEPTH
MEM = DEPTH * 64
RING, CQ, WIN, WSIZE = 0x4000, 0x1800, 0x10000, 0x4000


def bits(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def win(q, off=0):
    return WIN + q * WSIZE + off


def driver(entries=4, nq=2):           # two of the device's queues configured
    d = Driver(RegisterMap(NQ), QueueLayout.for_config(CFG), config=CFG, depth=DEPTH)
    for q in range(nq):
        d.configure(q, sq_base=q * RING, entries=entries, cq_base=q * RING + CQ, win_base=win(q),
                    win_limit=win(q, WSIZE), pasid=0x100 + q)
    return d


def check(d, backend, **kw):
    rtl, gold, diffs = d.check(backend.name, **kw)     # by name: one cached backend (and executable) per process
    assert diffs == [], "\n".join(diffs[:20])
    assert len(rtl.events) == d.expected()["events"]
    return rtl, gold


def test_port_formats_match_the_rtl():
    sys_ = system_for(CFG, NQ, DEPTH)
    assert sys_.layout == QueueLayout.for_config(CFG) and sys_.regmap.num_queues == NQ
    mine = port_fields(sys_.regmap, sys_.mem_addr_bits)
    for name in ("mmio", "mmio_rsp", "hmem", "hmem_rsp", "events", "core_req"):
        assert Fields.from_layout(sys_.signature.members[name].signature.members["payload"].shape) == mine[name]


def test_single_queue_gemv_softmax_load(backend):
    rng = np.random.default_rng(0)
    a, x = bits(rng, (16, 24), 0.3), bits(rng, (1, 16))
    d = driver(nq=1)
    ids = [d.mmio_read("DEV_ID"), d.mmio_read("NUM_QUEUES")]
    d.store(win(0), a)
    subs = [d.submit(0, gemv(win(0), 16, 24), x), d.submit(0, softmax(2, 8), bits(rng, (2, 8), 3.0)),
            d.submit(0, load(win(0), 3, 5), None)]
    hs = [d.read_completion(0, s.index, result_bytes=64) for s in subs]
    rtl, gold = check(d, backend)
    assert [(rtl.mmio[i].rdata, rtl.mmio[i].err) for i in ids] == [(DEV_ID_MAGIC, 0), (NQ, 0)]
    recs = [rtl.completion(h) for h in hs]
    assert all(r.ok for r in recs) and [r.result_bytes for r in recs] == [48, 48, 32]
    assert np.array_equal(recs[2].result_bits(15), a.reshape(-1)[[i for i in range(15)]])


@pytest.mark.parametrize("mode", ["early", "coalesced", "late"])
def test_doorbells(backend, mode):
    """early: the MMIO stream runs ahead, every doorbell precedes its descriptor (the engine re-polls);
    coalesced: one doorbell for three slots; late: MMIO held until the descriptors are in memory."""
    rng = np.random.default_rng(1)
    d = driver(nq=1)
    d.store(win(0), bits(rng, (8, 16), 0.3))
    subs = [d.submit(0, gemv(win(0), 8, 16), bits(rng, (1, 8)), doorbell=mode != "coalesced",
                     early_doorbell=mode == "early") for _ in range(3)]
    if mode == "coalesced":
        d.ring(0)
    hs = [d.read_completion(0, s.index, result_bytes=32) for s in subs]
    rtl, _ = check(d, backend, mmio_delay=400 if mode == "late" else 0)
    assert [e.index for e in rtl.events] == [0, 1, 2] and all(rtl.completion(h).ok for h in hs)


def test_two_queues_interleaved_window_violation(backend):
    """Two queues at once; q0 tries to write q1's window and to read across its own limit: WINDOW_VIOLATION
    completions, no core request leaves a window, q1's data and results are untouched."""
    rng = np.random.default_rng(2)
    a0, a1 = bits(rng, (16, 16), 0.3), bits(rng, (16, 16), 0.3)
    d = driver()
    d.store(win(0), a0)
    d.store(win(1), a1)
    subs = [d.submit(0, gemv(win(0), 16, 16), bits(rng, (1, 16))),
            d.submit(1, gemv(win(1), 16, 16), bits(rng, (1, 16))),
            d.submit(0, store(win(1), 16, 16), bits(rng, (16, 16))),
            d.submit(1, gemm(win(1), 3, 16, 16), bits(rng, (3, 16))),
            d.submit(0, load(win(0, WSIZE - 64), 2, 32), None),
            d.submit(1, store(win(1, 512), 1, 32), bits(rng, (1, 32))),
            d.submit(0, gemv(win(0), 16, 16), bits(rng, (1, 16)))]
    hs = [d.read_completion(s.queue, s.index, result_bytes=128) for s in subs]
    areas = [d.read(win(q), 1024) for q in range(2)]
    rtl, gold = check(d, backend)
    st = [rtl.completion(h).status for h in hs]
    assert st == [0, 0, WINDOW_VIOLATION, 0, WINDOW_VIOLATION, 0, 0]
    assert rtl.data(areas[0]) == a0.astype("<u2").tobytes() + bytes(512)
    assert rtl.data(areas[1])[:512] == a1.astype("<u2").tobytes()[:512]
    assert {q for q, _, _ in rtl.core_req} == {0, 1}


def test_malformed_descriptors(backend):
    """One descriptor of every decoder error class, plus NO_CHAIN_INPUT: each completes with its code, the
    queue's ERRORS counts them, no core memory request is issued for them."""
    d = driver(entries=8, nq=1)                  # 16 descriptors: the ring wraps twice
    w = win(0)
    bad = [replace(gemv(w, 8, 8), type=0), replace(load(w, 2, 2), op=2), gemv(w, 8, 8, dtype=2),
           replace(gemv(w, 8, 8), input_dim0=0), replace(gemv(w, 8, 8), operand_bytes=130), gemv(w, 64, 32),
           replace(gemv(w, 8, 8), input_bytes=1024, input_dim1=512), gemv(MEM - 64, 8, 8),
           replace(gemv(w, 8, 8), input_dim0=2, input_bytes=32), gemm(w, 5, 8, 8), softmax(4, 64),
           gemv(w + 2, 8, 8), gemv(w, 12, 8, trans=True), store(w, 1, 2),
           replace(load(w, 2, 2), flags=2), gemv(w, 8, 8, chain=True)]
    codes = [b.validate(CFG) for b in bad]
    codes[-1] = ErrorCode.NO_CHAIN_INPUT
    for b in bad:
        d.submit(0, b, np.zeros(min(b.input_bytes, 512) // 2, np.uint16) if b.input_bytes else None)
    rtl, gold = check(d, backend)
    assert gold.golden.errors == [len(bad)] + [0] * (NQ - 1)
    got = [e.status for e in rtl.events]
    # gemv(MEM - 64): outside the window before it can overflow the device
    want = [WINDOW_VIOLATION if not (win(0) <= b.base_addr and b.base_addr + b.operand_bytes <= win(0, WSIZE))
            and b.has_operand else c.value for b, c in zip(bad, codes)]
    assert got == want
    assert set(got) == {c.value for c in ErrorCode} - {0, ErrorCode.ADDRESS_OVERFLOW.value,
                                                      ErrorCode.FOREIGN_STATE.value} | {WINDOW_VIOLATION}
    assert rtl.core_req == []


def test_cross_queue_chain_is_refused(backend):
    """A kept result belongs to the queue (PASID) that kept it: q1 CHAINing on q0's kept result completes with
    FOREIGN_STATE and reads nothing (no core request of q1 for it); each queue chains on its own state."""
    rng = np.random.default_rng(12)
    d = driver(entries=4)
    for q in (0, 1):
        d.store(win(q), bits(rng, (8, 8), 0.3))
    d.submit(0, gemv(win(0), 8, 8, keep=True), bits(rng, (1, 8)))
    d.submit(1, gemv(win(1), 8, 8, chain=True), None, after=1)         # after q0's KEEP: FOREIGN_STATE
    d.submit(1, gemv(win(1), 8, 8, keep=True), bits(rng, (1, 8)), after=2)
    d.submit(1, gemv(win(1), 8, 8, chain=True), None)                   # q1's own state: OK
    d.submit(0, gemv(win(0), 8, 8, chain=True), None)                   # q0's state survived q1's: OK
    hs = [d.read_completion(q, i, result_bytes=16) for q, i in ((1, 0), (1, 2), (0, 1))]
    rtl, gold = check(d, backend)
    by_q = rtl.events_by_queue()
    assert [st for _, st in by_q[1]] == [ErrorCode.FOREIGN_STATE.value, 0, 0]
    assert [st for _, st in by_q[0]] == [0, 0]
    assert rtl.completion(hs[0]).result_bytes == 0 and rtl.completion(hs[1]).ok and rtl.completion(hs[2]).ok
    # q1's core requests: only the 2 bursts of each of its 2 OK GEMVs (the refused CHAIN read nothing)
    assert sum(1 for q, _, _ in rtl.core_req if q == 1) == 4


def test_ring_wrap_and_cross_queue_chain(backend):
    """A 2-slot ring used for 5 descriptors (slot re-use gated on completion), and LoRA E3 (TRANS GEMM KEEP, GEMM
    CHAIN) on q0 while q1 runs plain GEMVs in between: the kept result is q0's, so q1's descriptors never
    disturb it (every descriptor completes OK); the golden follows the RTL."""
    rng = np.random.default_rng(3)
    d = driver(entries=2)
    dd, r = 16, 8
    a, b = bits(rng, (dd, r), dd ** -0.5), bits(rng, (r, dd), r ** -0.5)
    lay = kernels.lora_layout(dd, r, config=CFG, base=win(0))
    for addr, k0, k1 in lay["a"]:
        d.store(addr, kernels.trans_layout(a[k0:k1], CFG))
    for addr, n0, n1 in lay["b"]:
        d.store(addr, np.ascontiguousarray(b[:, n0:n1]))
    d.store(win(1), bits(rng, (8, 8)))
    e3 = kernels.lora_e3(bits(rng, (2, dd)), lay, config=CFG)
    hs = []
    for k, (desc, x) in enumerate(e3.program + e3.program[:1] + e3.program[1:]):
        s0 = d.submit(0, desc, x)
        s1 = d.submit(1, gemv(win(1), 8, 8), bits(rng, (1, 8)))
        hs += [d.read_completion(0, s0.index, result_bytes=64), d.read_completion(1, s1.index, result_bytes=16)]
    rtl, gold = check(d, backend)
    assert [rtl.completion(h).seq for h in hs] == [i // 2 for i in range(len(hs))]
    assert all(e.status == 0 for e in rtl.events)


def test_random_stalls_and_backpressure():
    """Random valid gaps on mmio/hmem and back-pressure on mmio_rsp/hmem_rsp (Verilator)."""
    rng = np.random.default_rng(4)
    d = driver()
    for q in range(2):
        d.store(win(q), bits(rng, (16, 16), 0.3))
    hs = []
    for i in range(6):
        q = i % 2
        s = d.submit(q, gemv(win(q), 16, 16, keep=i == 2), bits(rng, (1, 16)), doorbell=i % 3 != 0)
        hs.append(d.read_completion(q, s.index, result_bytes=32, after=0))   # ungated: may see old records
    for q in range(2):
        d.ring(q)
    hs += [d.read_completion(q, i, result_bytes=32) for q in range(2) for i in range(3)]
    sys_ = system_for(CFG, NQ, DEPTH)
    for seed in (5, 6):
        traffic = Traffic.random(stream_ports(sys_), seed=seed, valid_prob=0.5, ready_prob=0.5)
        rtl = d.run("verilator", traffic=traffic)
        gold = d.run("golden", order=rtl.events)
        # the ungated reads race with the device: compare only the gated ones
        for h in hs[6:]:
            assert rtl.data(h) == gold.data(h)
        assert all(rtl.completion(h).done for h in hs[6:])
