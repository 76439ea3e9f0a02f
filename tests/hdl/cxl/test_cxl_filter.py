# amaranth: UnusedElaboratable=no
"""The device-side address filter and PASID check of the CXL NDP device (hdl/cxl/filter.py, docs/cxl_isolation.md)
end to end: the scripted host forges accesses with other PASIDs; the RTL (Verilator) and the golden device,
replayed in the RTL's order, must agree bit for bit (reads, read error bits, events, MMIO responses), and the
outcomes must be the isolation the design promises. Same device parameters as test_cxl_device.py (one build)."""

from dataclasses import replace

import numpy as np
import pytest

from hdl.ndp.config import TINY
from hdl.cxl.regmap import (RegisterMap, QueueLayout, valid_word, VALID_OFFSET, DESC_OFFSET, DEFAULT_DATA_PASID,
                            queue_pasid)
from firmware.ndp.descriptor import gemv, load, store
from host.cxl_driver import Driver
from sim.backends import Traffic
from sim.golden.cxl_device import encode_descriptor

DEPTH = 2048
NQ = 2
CFG = replace(TINY, name="cxl-test", input_buffer_bytes=512, output_buffer_bytes=512, dram_buffer_bytes=2048,
              device_bytes=DEPTH * 64)
LAYOUT = QueueLayout.for_config(CFG)
RING, CQ, WIN, WSIZE = 0x4000, 0x1800, 0x10000, 0x4000
QWIN = (0, 0x8000)                  # both queues' rings and completion areas; data windows above
RESERVED = 0x3000                   # inside the queue window, in no queue's area
DATA = 0x1C000                      # ordinary data, outside every window


def bits(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def win(q, off=0):
    return WIN + q * WSIZE + off


def slot_line(desc, index):
    """A forged slot header line: descriptor and a matching valid word."""
    raw = encode_descriptor(desc) if not isinstance(desc, int) else desc
    word = (raw << (8 * DESC_OFFSET)) | (valid_word(index) << (8 * VALID_OFFSET))
    return word.to_bytes(64, "little")


def script(qwin: bool):
    """The forged-access program (see the test docstring); returns the driver and what to check."""
    rng = np.random.default_rng(5)
    d = Driver(RegisterMap(NQ), LAYOUT, config=CFG, depth=DEPTH)
    t = {"csr": {}}
    if qwin:
        d.set_queue_window(*QWIN)
        # queue 1 placed badly first: each enabling CTRL write is refused
        for name, v in (("SQ_BASE", 0x9000), ("SQ_ENTRIES", 4), ("CQ_BASE", RING + CQ), ("WIN_BASE", win(1)),
                        ("WIN_LIMIT", win(1, WSIZE))):
            d.mmio_write(name, v, 1)
        t["csr"]["ring outside the window"] = d.mmio_write("CTRL", 1, 1)
        d.mmio_write("SQ_BASE", RING, 1)
        d.mmio_write("CQ_BASE", 0x7F00, 1)
        t["csr"]["completion area past the limit"] = d.mmio_write("CTRL", 1, 1)
        d.mmio_write("CQ_BASE", RING + CQ, 1)
        d.mmio_write("WIN_BASE", 0x7000, 1)
        t["csr"]["data window overlapping"] = d.mmio_write("CTRL", 1, 1)
    for q in range(NQ):
        d.configure(q, sq_base=q * RING, entries=4, cq_base=q * RING + CQ, win_base=win(q),
                    win_limit=win(q, WSIZE), fence=True)
    if qwin:
        t["csr"]["QWIN locked"] = d.mmio_write("QWIN_BASE", 0x1000)
        t["csr"]["window moved onto the queue window"] = d.mmio_write("WIN_BASE", 0x100, 0)
        t["csr"]["ring moved out"] = d.mmio_write("SQ_BASE", 0x9000, 0)
    p0, p1 = queue_pasid(0), queue_pasid(1)
    a0, a1 = bits(rng, (16, 24), 0.3), bits(rng, (16, 16), 0.3)
    d.store(win(0), a0)
    d.store(win(1), a1)
    x0, x1 = bits(rng, (1, 16)), bits(rng, (1, 16))
    # q0: the real descriptor, then a forged overwrite of its slot (q1's PASID) before the doorbell
    t["s0"] = d.submit(0, gemv(win(0), 16, 24), x0, doorbell=False)
    d.store(LAYOUT.slot_addr(0, 4, 0), slot_line(load(win(0), 2, 4), 0), pasid=p1)
    d.ring(0)
    # q1: a forged, doorbell-less STORE into q1's slot 1 by q0's requester (it would overwrite q1's data)
    d.store(LAYOUT.slot_addr(RING, 4, 1), slot_line(store(win(1), 1, 32), 1), pasid=p0)
    d.store(LAYOUT.input_addr(RING, 4, 1), np.full(32, 0x3C00, np.uint16), pasid=p0)
    t["s1"] = d.submit(1, gemv(win(1), 16, 16), x1)
    d.mmio_write("DOORBELL", 2, 1)          # and a doorbell covering the forged slot
    t["cpl0"] = d.read_completion(0, 0)
    t["cpl0_forged"] = d.read_completion(0, 0, pasid=p1)
    t["slot1"] = d.read(LAYOUT.slot_addr(RING, 4, 1), 64)
    t["win1"] = d.read(win(1), 16 * 16 * 2)
    t["cpl1_1"] = d.read_completion(1, 1, result_bytes=0)
    data = bits(rng, (64,))
    d.store(DATA, data, pasid=0x12345)
    t["data"] = d.read(DATA, 128, pasid=0x54321)
    t["data_bits"] = data
    d.store(RESERVED, bits(rng, (32,)), pasid=DEFAULT_DATA_PASID)
    t["reserved"] = d.read(RESERVED, 64, pasid=p0)
    t["rejects"] = d.mmio_read("HMEM_REJECTS")
    t["a1"] = a1
    return d, t


def late_last_mmio(d, at=6000):
    """Hold the last MMIO request (the HMEM_REJECTS read) until cycle ``at``, after the hmem script."""
    k = len(d._mmio) - 1
    pat = np.concatenate([np.ones(k, bool), np.zeros(at - k, bool), np.ones(400_000, bool)])
    return Traffic(valid={"mmio": pat})


def check_isolation(run, t, qwin):
    rec0 = run.completion(t["cpl0"])
    assert rec0.ok and rec0.result_bytes == 48                         # the GEMV ran, not the forged LOAD
    assert run.rejected(t["cpl0_forged"]) and run.data(t["cpl0_forged"]) == bytes(len(run.data(t["cpl0_forged"])))
    assert not run.rejected(t["cpl0"])
    assert run.data(t["slot1"]) == bytes(64)                           # the forged slot never landed
    assert np.array_equal(run.bits(t["win1"]), t["a1"].reshape(-1))  # q1's data untouched
    assert not run.completion(t["cpl1_1"]).done                        # q1#1 never executed
    assert [(e.queue, e.index, e.status) for e in run.events] in ([(0, 0, 0), (1, 0, 0)], [(1, 0, 0), (0, 0, 0)])
    assert not run.rejected(t["data"]) and np.array_equal(run.bits(t["data"]), t["data_bits"])
    if qwin:
        assert run.rejected(t["reserved"]) and run.data(t["reserved"]) == bytes(64)
        for what, i in t["csr"].items():
            assert run.mmio[i].err == 1, what
    else:
        assert not run.rejected(t["reserved"])


@pytest.mark.parametrize("qwin", [True, False])
def test_forged_accesses_golden(qwin):
    d, t = script(qwin)
    g = d.run("golden")
    check_isolation(g, t, qwin)
    # rejected: slot 0 overwrite, slot 1 header + input, 9 forged completion lines (+ reserved store and read)
    assert g.golden.rejects == 12 + (2 if qwin else 0)
    assert g.golden.pending == {1: (1, 2)}                             # q1 waits on the never-written slot 1
    assert all(r.err == 0 for i, r in enumerate(g.mmio) if i not in t["csr"].values())


@pytest.mark.parametrize("qwin", [True, False])
def test_forged_accesses_rtl_matches_golden(qwin):
    d, t = script(qwin)
    rtl, gold, diffs = d.check("verilator", traffic=late_last_mmio(d))
    assert diffs == [], "\n".join(diffs[:20])
    check_isolation(rtl, t, qwin)
    assert rtl.mmio[t["rejects"]].rdata == gold.golden.rejects == 12 + (2 if qwin else 0)


def test_data_outside_window_unaffected_without_configuration():
    """No queue window, no queue: every access is ordinary data, whatever its PASID (golden)."""
    d = Driver(RegisterMap(NQ), LAYOUT, config=CFG, depth=DEPTH)
    rng = np.random.default_rng(9)
    data = bits(rng, (128,))
    d.store(0, data, pasid=7)
    h = d.read(0, 256, pasid=99)
    g = d.run("golden")
    assert not g.rejected(h) and np.array_equal(g.bits(h), data) and g.golden.rejects == 0


def test_driver_pasid_arguments():
    d = Driver(RegisterMap(NQ), LAYOUT, config=CFG, depth=DEPTH)
    with pytest.raises(ValueError, match="pasid"):
        d.store(0, b"\0" * 64, pasid=1 << 20)
    with pytest.raises(ValueError, match="queue window"):
        d.set_queue_window(32, 0x8000)
    d.configure(0, sq_base=0, entries=2, cq_base=CQ, win_base=win(0), win_limit=win(0, 64))
    assert d._q[0].pasid == queue_pasid(0) == 1
    d.store(0, b"\1" * 64)                                     # in q0's ring: q0's PASID by default
    d.store(DATA, b"\1" * 64)                                  # ordinary data: DEFAULT_DATA_PASID
    assert [op[4] for op in d._hmem] == [1, DEFAULT_DATA_PASID]
