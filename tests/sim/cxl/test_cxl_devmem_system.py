# amaranth: UnusedElaboratable=no
"""The CXL NDP device on the LPDDR5X device memory (sim/cxl/devmem_system.CXLDeviceMemSystem: CXLDevice on
DeviceMemory's host port, FR-FCFS controllers, DRAM channel models), driven by the unchanged scripted host
(host/cxl_driver.py, ``memory="lpddr5x"``) and compared bit for bit with the golden device replayed in the RTL's
order (``Driver.check``, which on this system also fails on any DRAM timing violation or DRAM model report of any
channel). One Verilator build of the 2-channel system is shared by every test (cached across processes by
``design_key``); one tiny run goes through Amaranth's simulator."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from hdl.ndp.config import TINY
from hdl.ndp.descriptor import ErrorCode
from hdl.cxl.regmap import RegisterMap, QueueLayout
from hdl.memctl.commands import Cmd
from firmware.ndp.descriptor import gemv
from firmware.ndp import kernels
from host.cxl_driver import Driver, system_for, WINDOW_VIOLATION
from sim.cxl.devmem_system import CXLDeviceMemSystem, dram_config_for
from sim.golden.attention import prepare_query

DEPTH = 2048
MEM = DEPTH * 64
NQ = 2
CHANNELS = 2
CFG = replace(TINY, name="cxl-test", input_buffer_bytes=512, output_buffer_bytes=512, dram_buffer_bytes=2048,
              device_bytes=MEM)
RING, CQ, WIN, WSIZE = 0x4000, 0x1800, 0x10000, 0x8000

_BACKENDS = {}


def verilator():
    """One design-cached Verilator backend per process: the executable of this design is found by its
    ``design_key`` without regenerating the Verilog."""
    if "v" not in _BACKENDS:
        from sim.e2e.design_cache import CachedVerilatorBackend
        _BACKENDS["v"] = CachedVerilatorBackend()
    return _BACKENDS["v"]


def bits(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def win(q, off=0):
    return WIN + q * WSIZE + off


def driver(entries=4, nq=NQ):
    d = Driver(RegisterMap(NQ), QueueLayout.for_config(CFG), config=CFG, depth=DEPTH, memory="lpddr5x",
               channels=CHANNELS)
    for q in range(nq):
        d.configure(q, sq_base=q * RING, entries=entries, cq_base=q * RING + CQ, win_base=win(q),
                    win_limit=win(q, WSIZE), pasid=0x100 + q)
    return d


def check(d, backend=None, **kw):
    rtl, gold, diffs = d.check(backend or verilator(), **kw)
    assert diffs == [], "\n".join(diffs[:20])
    assert rtl.channel_problems == [] and len(rtl.channels) == 2 * CHANNELS
    assert all(rtl.channels[f"trace{c}"] for c in range(CHANNELS)), "a channel saw no command"
    assert len(rtl.events) == d.expected()["events"]
    return rtl, gold


def test_system_shape():
    """The same ports, formats and attributes as the burst-memory CXLSystem (so the driver and the stamped
    wrapper take it), a memory sized to hold the device's lines, clear errors for bad parameters."""
    lp, burst = system_for(CFG, NQ, DEPTH, memory="lpddr5x", channels=CHANNELS), system_for(CFG, NQ, DEPTH)
    assert lp is driver().system()
    for name, member in burst.signature.members.items():
        assert lp.signature.members[name] == member, name
    assert set(lp.signature.members) - set(burst.signature.members) == {"trace0", "errors0", "trace1", "errors1"}
    assert lp.regmap.num_queues == burst.regmap.num_queues and lp.regmap.addr_bits == burst.regmap.addr_bits
    for attr in ("layout", "mem_addr_bits", "config", "depth"):
        assert getattr(lp, attr) == getattr(burst, attr), attr
    assert lp.device.core is not None and lp.memory.memory.bytes >= MEM
    assert dram_config_for(DEPTH, 2).org.rows == 2 and dram_config_for(DEPTH * 8, 1).org.rows == 16
    with pytest.raises(ValueError, match="memory must be one of burst, lpddr5x, got 'ddr4'"):
        system_for(CFG, NQ, DEPTH, memory="ddr4")
    with pytest.raises(ValueError, match="channels must be a power of two in 1..64, got 3"):
        system_for(CFG, NQ, DEPTH, memory="lpddr5x", channels=3)
    with pytest.raises(ValueError, match="memory must be one of burst, lpddr5x"):
        Driver(NQ, config=CFG, depth=DEPTH, memory="hbm")
    with pytest.raises(ValueError, match="channels must be a power of two in 1..64, got 128"):
        Driver(NQ, config=CFG, depth=DEPTH, memory="lpddr5x", channels=128)
    with pytest.raises(ValueError, match="exceeds"):
        CXLDeviceMemSystem(config=CFG, num_queues=1, depth=1 << 40, channels=1)


def test_gemv_e4_attention_and_host_lines():
    """On two LPDDR5X channels, through the unchanged driver: host CXL.mem writes read back; a GEMV, a LoRA E4
    (two K-tiles of A accumulating on the device) and an attention share (two token tiles: q K^T KEEP, SOFTMAX
    CHAIN KEEP, e V CHAIN) bit-exact against the golden device; completions per queue in index order with the
    result before the flag; a forged-PASID read of q1's completion area refused (zeros + err), a forged write into
    q1's ring dropped; a descriptor outside its window refused; zero timing violations on both channels."""
    rng = np.random.default_rng(7)
    d = driver(entries=8)
    # host lines: odd-sized data over both channels' granules, read back as written
    raw = rng.integers(0, 256, 64 * 9 + 24, dtype=np.uint8).tobytes()
    d.store(win(1, 0x6000), raw)
    back = d.read(win(1, 0x6000), len(raw))
    # q0: GEMV and LoRA E4 (A stored by the host), then a window violation
    a = bits(rng, (16, 24), 0.3)
    d.store(win(0), a)
    lay = kernels.lora_layout(128, 8, config=CFG, base=win(0, 0x1000))
    a4 = bits(rng, (128, 8), 128 ** -0.5)
    for addr, k0, k1 in lay["a"]:
        d.store(addr, kernels.trans_layout(a4[k0:k1], CFG))
    e4 = kernels.lora_e4(bits(rng, (128,)), lay, config=CFG)
    assert len(e4.program) == 2
    subs0 = [d.submit(0, gemv(win(0), 16, 24), bits(rng, (1, 16)))]
    subs0 += [d.submit(0, desc, x) for desc, x in e4.program]
    subs0.append(d.submit(0, gemv(win(1), 16, 24), bits(rng, (1, 16))))          # q1's window
    # q1: attention share of 64 tokens, head dim 16
    kv = kernels.kv_layout(16, 64, config=CFG, base=win(1, 0x1000))
    k, v = bits(rng, (64, 16), 0.5), bits(rng, (64, 16), 0.5)
    for kt_addr, v_addr, t0, t1 in kv["tiles"]:
        d.store(kt_addr, np.ascontiguousarray(k[t0:t1].T))
        d.store(v_addr, kernels.trans_layout(v[t0:t1], CFG))
    att = kernels.attention_integral(prepare_query(bits(rng, (16,))), kv, config=CFG)
    assert len(att.program) == 6
    subs1 = [d.submit(1, desc, x) for desc, x in att.program]
    # a requester with another PASID: its read of q1's completion area is refused, its write to q1's ring dropped
    forged = d.read(RING + CQ, 64, pasid=0x7)
    d.store(RING, bytes(64), pasid=0x7, after=0)
    hs = [d.read_completion(s.queue, s.index) for s in subs0 + subs1]
    slot = d.read(RING + 64 * 0, 64, pasid=0x101)          # q1's slot 0, by q1: the forged zeros never landed
    rtl, gold = check(d)
    assert rtl.data(back) == raw
    assert rtl.rejected(forged) and rtl.data(forged) == bytes(64)
    assert not rtl.rejected(slot) and rtl.data(slot) != bytes(64) and len(gold.golden.rejected) == 2
    recs = [rtl.completion(h) for h in hs]
    assert [r.status for r in recs] == [0, 0, 0, WINDOW_VIOLATION] + [0] * 6
    assert all(r.done for r in recs)
    by_q = rtl.events_by_queue()
    assert [i for i, _ in by_q[0]] == [0, 1, 2, 3] and [i for i, _ in by_q[1]] == list(range(6))
    # the kernels' outputs, assembled from the RTL's completion records (bit for bit the golden device's)
    def cpl(r, desc):       # a record's result without the padding of its last beat
        return SimpleNamespace(status=ErrorCode(r.status), result=r.result_bits(desc.returned_elems()))
    m = e4.results([cpl(r, desc) for r, (desc, _) in zip(recs[1:3], e4.program)])
    assert m.shape == (8,) and np.array_equal(m, e4.results(
        [cpl(gold.completion(h), desc) for h, (desc, _) in zip(hs[1:3], e4.program)]))
    tiles = att.results([cpl(r, desc) for r, (desc, _) in zip(recs[4:], att.program)])
    assert len(tiles) == 2 and all(o.shape == (16,) for o, _, _ in tiles)


def test_channel_checker_catches_a_broken_trace():
    """The per-channel check that ``Driver.check`` relies on flags a trace that breaks the timing (a command moved
    one cycle earlier than its constraint allows, everything else unchanged), a DRAM model report, and a channel
    that was not collected: the hook is live, not a pass-through. (The checker itself is held to the JEDEC rules
    by tests/sim/dram/test_checker.py.)"""
    from sim.dram.trace import decode_trace
    from sim.dram.checker import check_trace
    from hdl.memctl.commands import trace_layout
    rng = np.random.default_rng(3)
    d = driver(nq=1)
    d.store(win(0), bits(rng, (8, 16), 0.3))
    s = d.submit(0, gemv(win(0), 8, 16), bits(rng, (1, 8)))
    d.read_completion(0, s.index, result_bytes=32)
    rtl, _ = check(d)
    sys_ = d.system()
    assert sys_.channel_problems(rtl.channels, rtl.cycles) == []
    org, cfg = sys_.dram_config.org, sys_.dram_config
    cyc_off = trace_layout(org)["cycle"].offset
    tr = list(rtl.channels["trace0"])
    cmds = decode_trace(tr, org)
    # the first command issued exactly at its earliest legal cycle after its predecessor: move it one earlier
    for k in range(1, len(cmds)):
        if cmds[k].cycle - 1 > cmds[k - 1].cycle:
            moved = tr[:k] + [tr[k] - (1 << cyc_off)] + tr[k + 1:]
            if check_trace(decode_trace(moved, org), cfg, end_cycle=rtl.cycles - 1):
                break
    else:
        pytest.fail("no command of the trace sits at its earliest legal cycle")
    broken = dict(rtl.channels, trace0=moved)
    assert any(p.startswith("channel 0: ") for p in sys_.channel_problems(broken, rtl.cycles))
    assert sys_.channel_problems(dict(rtl.channels, errors1=[0x1234]), rtl.cycles) == [
        "channel 1: DRAM model report 0x1234"]
    assert sys_.channel_problems({k: v for k, v in rtl.channels.items() if k != "trace1"}, rtl.cycles) == [
        "channel 1: trace / errors not collected"]


def test_stamped_wrapper_takes_it(monkeypatch):
    """sim/e2e/stamped.StampedCXLSystem wraps the LPDDR5X system as it wraps CXLSystem: its own design key,
    the channel and DRAM model modules passed on to the Verilog (stubbed here: converting them takes ~13 s)."""
    from sim.e2e.stamped import StampedCXLSystem
    lp = system_for(CFG, NQ, DEPTH, memory="lpddr5x", channels=CHANNELS)
    st = StampedCXLSystem(lp)
    assert st.design_key() == f"StampedCXLSystem({lp.design_key()})"
    assert "lpddr5x-8533-2rows" in st.design_key() and "channels=2" in st.design_key()
    assert st.design_key() != StampedCXLSystem(system_for(CFG, NQ, DEPTH)).design_key()
    monkeypatch.setattr(lp, "verilog_modules", lambda: ["module devmem_channel", "module dram_channel"])
    assert st.verilog_modules() == ["module devmem_channel", "module dram_channel"]
    assert {"trace0", "errors1", "stamp_issue"} <= set(st.signature.members)


def _tiny_script():
    """One host line written and read back, one 8 x 8 GEMV, on a one-queue one-channel device."""
    rng = np.random.default_rng(11)
    d = Driver(RegisterMap(1), QueueLayout.for_config(CFG), config=CFG, depth=DEPTH, memory="lpddr5x", channels=1)
    d.configure(0, sq_base=0, entries=1, cq_base=CQ, win_base=WIN, win_limit=WIN + WSIZE)
    line = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    d.store(WIN + 0x100, line)
    back = d.read(WIN + 0x100, 64)
    d.store(WIN, bits(rng, (8, 8), 0.3))
    s = d.submit(0, gemv(WIN, 8, 8), bits(rng, (1, 8)), split_valid=False)
    return d, back, line, d.read_completion(0, s.index, result_bytes=16)


class _CorruptFirstWrite(wiring.Component):
    """Mutant DRAM channel: the real model, but bit 0 of the first write burst's first data beat is flipped on its
    way in (one corrupted burst; every other pin passes unchanged)."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__(wiring.Signature(dict(inner.signature.members)))

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = self.inner
        cwl = inner.timing.CWL
        started, done = Signal(), Signal()
        delay = Signal(range(cwl + 1))
        with m.If(~started & (self.cmd.kind == Cmd.WR)):
            m.d.sync += [started.eq(1), delay.eq(cwl - 1)]
        with m.Elif(started & (delay != 0)):
            m.d.sync += delay.eq(delay - 1)
        flip = started & ~done & (delay == 0)        # cycle t + CWL of the first WR at t: its first data beat
        with m.If(flip):
            m.d.sync += done.eq(1)
        for name, member in self.signature.members.items():
            mine, theirs = getattr(self, name), getattr(inner, name)
            if name == "wdata":
                m.d.comb += theirs.eq(mine ^ flip)
            elif member.flow == In:
                m.d.comb += Value.cast(theirs).eq(Value.cast(mine))
            else:
                m.d.comb += Value.cast(mine).eq(Value.cast(theirs))
        return m


def test_amaranth_simulator_and_a_mutant_memory():
    """The tiny script on Amaranth's simulator (one channel, flat build; the simulator runs it at ~120 cycles per
    second, so the case is the smallest one) with a mutant memory that corrupts one write burst (one bit of the
    host's first line): ``Driver.check`` reports exactly that byte of the read-back, and nothing else differs from
    the golden device (the GEMV bit-exact, every channel clean): one run shows the Amaranth path correct and the
    check catching a broken memory (the clean Verilator runs above cover the unmutated design)."""
    from sim.backends import get_backend
    d, back, line, h = _tiny_script()
    sys_ = CXLDeviceMemSystem(config=CFG, num_queues=1, depth=DEPTH, channels=1, hierarchical=False)
    sys_.memory.devices[0] = _CorruptFirstWrite(sys_.memory.devices[0])
    rtl, gold, diffs = d.check(get_backend("amaranth"), system=sys_)
    assert rtl.data(back)[0] == line[0] ^ 1 and rtl.data(back)[1:] == line[1:]
    assert len(diffs) == 1 and f"read [{WIN + 0x100:#x}, +64): first difference at byte 0" in diffs[0], diffs
    assert rtl.completion(h).ok and rtl.channel_problems == []
    assert rtl.completion(h).result == gold.completion(h).result and len(rtl.completion(h).result) == 16


def test_random_stalls_and_backpressure():
    """Random valid gaps on mmio / hmem and back-pressure on mmio_rsp / hmem_rsp (Verilator, the shared build):
    the gated reads equal the golden device's, every channel stays clean (the driver never back-pressures the
    channels' trace / errors streams, whose records would otherwise be lost)."""
    from sim.backends import Traffic, stream_ports
    rng = np.random.default_rng(4)
    d = driver()
    for q in range(2):
        d.store(win(q), bits(rng, (16, 16), 0.3))
    hs = []
    for i in range(4):
        q = i % 2
        s = d.submit(q, gemv(win(q), 16, 16), bits(rng, (1, 16)), doorbell=i % 3 != 0)
        hs.append(d.read_completion(q, s.index, result_bytes=32))
    for q in range(2):
        d.ring(q)
    sys_ = d.system()
    traffic = Traffic.random(stream_ports(sys_), seed=5, valid_prob=0.5, ready_prob=0.5)
    assert any(k.startswith("trace") for k in traffic.ready)         # the pattern would stall them
    rtl = d.run(verilator(), traffic=traffic)
    gold = d.run("golden", order=rtl.events)
    assert all(rtl.data(h) == gold.data(h) and rtl.completion(h).ok for h in hs)
    assert rtl.channel_problems == []
