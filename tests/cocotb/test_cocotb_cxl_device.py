"""cocotb run of the ``cxl_device`` top's Verilog (``cxl_device_tb.py``: the testbench is the GPU and the device
memory): two queues bound to PASIDs 0x10 / 0x11, GEMV and LOAD results, a rejected descriptor and a window
violation, a forged slot write by the other queue's requester (dropped by the address filter), completions polled
over CXL.mem with the queue's PASID and checked bit for bit against the golden core, and every result line read
again with the other PASID (zeros + err)."""

import numpy as np

from hdl.tops import CXL_TOPS
from hdl.ndp.config import TINY
from hdl.cxl.regmap import valid_word, completion_flag, SLOT_HEADER_BYTES, CTRL_ENABLE
from hdl.cxl.device import WINDOW_VIOLATION
from firmware.ndp.descriptor import gemv, load
from sim.golden.ndp_core import GoldenCore, beats
from cocotb_util import run_top

SQ = {0: 0x40000, 1: 0x60000}
CQ = {0: 0x80000, 1: 0xA0000}
WIN = {0: (0x0000, 0x8000), 1: (0x8000, 0x10000)}
PASID = {0: 0x10, 1: 0x11}          # queue q's requester; the other queue's PASID is PASID[q] ^ 1


def _lines(base, raw: bytes):
    raw = raw.ljust(-(-len(raw) // 64) * 64, b"\0")
    return [[(base + i) // 64, int.from_bytes(raw[i:i + 64], "little")] for i in range(0, len(raw), 64)]


def test_cxl_device_top_as_gpu(monkeypatch):
    dut = CXL_TOPS["cxl_device"]()
    cfg, rm, lay = dut.config, dut.regmap, dut.layout
    assert cfg == TINY
    rng = np.random.default_rng(3)
    a0 = (rng.standard_normal((16, 32)) * 0.3).astype(np.float16).view(np.uint16)
    a1 = (rng.standard_normal((8, 24)) * 0.3).astype(np.float16).view(np.uint16)
    golden = GoldenCore(cfg, 1 << 20)
    golden.write(0x1000, a0)
    golden.write(0x9000, a1)
    lines = _lines(0x1000, a0.tobytes()) + _lines(0x9000, a1.tobytes())

    setup = []
    for q in (0, 1):
        for name, value in (("SQ_BASE", SQ[q]), ("SQ_ENTRIES", 4), ("CQ_BASE", CQ[q]), ("WIN_BASE", WIN[q][0]),
                            ("WIN_LIMIT", WIN[q][1]), ("PASID", PASID[q]), ("CTRL", CTRL_ENABLE)):
            setup.append([rm.offset(name, q), value])
    x = rng.standard_normal((1, 16)).astype(np.float16).view(np.uint16)
    # (queue, descriptor, input, window verdict); no KEEP/CHAIN, so each result is independent of the order
    # in which the device serves the two queues.
    subs = [(0, gemv(0x1000, 16, 32), x, True), (1, load(0x9000, 8, 24), None, True),
            (1, gemv(0x1000, 16, 32), x, False),              # queue 1 may not read queue 0's window
            (0, gemv(0x1002, 16, 32), x, True),               # MISALIGNED (the core rejects it)
            (0, gemv(0x1000, 16, 32), x, True)]
    submissions, expect, count = [], [], {0: 0, 1: 0}
    for q, d, inp, in_window in subs:
        k = count[q]
        count[q] += 1
        slot = SQ[q] + (k % 4) * lay.slot_bytes
        hdr = bytearray(64)
        hdr[0:26] = d.encode().to_bytes(26, "little")
        slot_lines = (_lines(slot + SLOT_HEADER_BYTES, inp.tobytes()) if inp is not None else []) + \
            _lines(slot, bytes(hdr))
        forged = bytearray(64)                                 # a LOAD of the other window, valid for slot k
        forged[0:26] = load(WIN[1 - q][0], 1, 8).encode().to_bytes(26, "little")
        forged[32:40] = valid_word(k).to_bytes(8, "little")
        hdr[32:40] = valid_word(k).to_bytes(8, "little")
        submissions.append({"queue": q, "pasid": PASID[q], "slot_lines": slot_lines,
                            "forged": [_lines(slot, bytes(forged))[0] + [PASID[q] ^ 1]],
                            "valid": _lines(slot, bytes(hdr))[0], "doorbell": [rm.offset("DOORBELL", q), k + 1]})
        if in_window:
            c = golden.step(d, inp)
            status, result = c.status.value, c.result
        else:
            status, result = WINDOW_VIOLATION, np.zeros(0, np.uint16)
        words = beats(result, cfg.lanes)
        cpl = CQ[q] + (k % 4) * lay.cpl_bytes
        header = k | (status << 64) | ((16 * len(words)) << 128) | (completion_flag(k) << 256)
        res = b"".join(w.to_bytes(16, "little") for w in words)
        expect.append({"queue": q, "pasid": PASID[q], "cpl_line": cpl // 64, "header": header,
                       "result_lines": _lines(cpl + 64, res)})
    assert {e["header"] >> 64 & 0xFF for e in expect} >= {0, WINDOW_VIOLATION, 12}

    run_top(monkeypatch, "cxl_device", dut, "cxl_device_tb", "CXL_DEVICE_TB_VECTORS", {
        "mmio_setup": setup, "lines": lines, "submissions": submissions, "expect": expect, "latency": 12,
        "addr_bits": dut.mem_addr_bits, "mmio_addr_bits": rm.addr_bits, "seed": 7,
    })
