"""Spoofed SPD timing + re-layout in the write path (hdl/pim/spd.py, sim/pim/spoof_system.py, docs/pim_relayout.md).

Every system run is judged at the DEVICE pins: the command trace by the independent checker with the REAL timing,
the write-data strobe by its WRITE DATA TIMING rule (``sim.dram.checker.check_write_data``), plus the device
model's own reports. Amaranth simulator only (one small design per timing; a Verilator build per design would
cost more than the whole run).
"""

import dataclasses
from collections import Counter

import numpy as np
import pytest

from hdl.memctl.commands import Cmd, Violation
from hdl.memctl.timing import DRAMConfig, DDR4_3200_TINY, DDR4_3200_TIMING
from hdl.pim.config import PIMConfig
from hdl.pim.relayout import relayout_burst, inverse_relayout_burst, chip_elements, host_burst
from hdl.pim.spd import spoofed_timing, spoofed_config, spd_write_bytes, spd_write_nck, SPOOFED_FIELDS
from sim.backends import get_backend
from sim.dram.checker import PinViolation, check_trace, check_write_data, describe
from sim.dram.trace import TraceCommand, decode_trace
from sim.pim.spoof_system import SpoofSystem

REAL = DDR4_3200_TIMING
# The paper's 8-chip rank (64-bit beats) with 4 rows x 8 bursts per bank: small storage, quick to elaborate.
ORG = dataclasses.replace(DDR4_3200_TINY.org, name="pim-spoof-small", rows=4, columns=64)
CFG = PIMConfig(name="pim-spoof-small", dram=DRAMConfig(name="pim-spoof-small", org=ORG, timing=REAL))
BC = ORG.burst_cycles
LAT = CFG.relayout_latency
AMARANTH = get_backend("amaranth")
W = PinViolation.WRITE_DATA
QUEUE = 8  # controller queue entries: a smaller design simulates faster; enough to keep the bus busy


# ---- spoofed timing ---------------------------------------------------------------------------------------------

def test_spoofed_timing_values():
    sp = spoofed_timing(REAL, 1)
    assert (sp.CWL, sp.tWR, sp.tWTR_S, sp.tWTR_L) == (15, 25, 5, 13)
    for f in dataclasses.fields(REAL):
        if f.name not in SPOOFED_FIELDS and f.name != "name":
            assert getattr(sp, f.name) == getattr(REAL, f.name), f.name
    # every rule measured from the end of write data keeps its distance from the WR command
    assert sp.CWL + sp.tWR == REAL.CWL + REAL.tWR and sp.CWL + sp.tWTR_L == REAL.CWL + REAL.tWTR_L
    assert dataclasses.replace(spoofed_timing(REAL, 0), name=REAL.name) == REAL
    assert spoofed_config(CFG.dram, 1).timing == sp
    for bad in (-1, REAL.CWL, 1.0, True):
        with pytest.raises(ValueError, match="latency"):
            spoofed_timing(REAL, bad)


def test_spd_bytes():
    real, sp = spd_write_bytes(REAL), spd_write_bytes(spoofed_timing(REAL, 1))
    assert real == {41: 0, 42: 120, 43: 0, 44: 20, 45: 60}   # 15 ns, 2.5 ns, 7.5 ns in 125 ps units
    assert sp == {41: 0, 42: 125, 43: 0, 44: 25, 45: 65}     # 15.625 ns, 3.125 ns, 8.125 ns
    assert spd_write_nck(sp, REAL.tck_ps) == {"tWR": 25, "tWTR_S": 5, "tWTR_L": 13}


# ---- the WRITE DATA TIMING rule of the checker ------------------------------------------------------------------

def C(cycle, kind, **f):
    return TraceCommand(cycle, kind, **f)


BASE = [C(0, Cmd.ACT, row=1), C(4, Cmd.ACT, bg=1, row=1), C(22, Cmd.WR, col=0), C(26, Cmd.WR, bg=1, col=1),
        C(80, Cmd.WR, col=2)]


def win(t, shift=0):
    return list(range(t + REAL.CWL + shift, t + REAL.CWL + BC + shift))


def test_write_data_rule():
    dram = CFG.dram
    ok = win(22) + win(26) + win(80)
    assert check_trace(BASE, dram, write_strobe=ok) == []
    assert check_trace(BASE, dram) == []   # without a strobe trace: the command rules only
    # one clock late everywhere: the back-to-back pair shows at its two ends, the lone WR at both of its ends
    late = win(22, 1) + win(26, 1) + win(80, 1)
    v = check_trace(BASE, dram, write_strobe=late)
    assert [(x.violation, x.cycle) for x in v] == [(W, 22), (W, 46), (W, 80), (W, 100)], describe(v)
    assert v[0].actual == REAL.CWL + 1 and "no data strobe in cycle(s) [38]" in v[0].message
    assert "outside every write's data window" in v[1].message and v[1].command == BASE[3]
    # one clock early, a missing burst, a stray burst with no WR before it
    v = check_write_data(BASE, dram, win(22, -1) + win(26, -1) + win(80))
    assert [(x.violation, x.cycle) for x in v] == [(W, 26), (W, 37)]
    v = check_write_data(BASE, dram, win(22) + win(80))
    assert [(x.cycle, x.command) for x in v] == [(26, BASE[3])]
    v = check_write_data(BASE, dram, [5, 6] + ok)
    assert [(x.cycle, x.command) for x in v] == [(5, None)]
    # an injected WR's window is allowed but not required
    assert check_write_data(BASE, dram, win(22) + win(26), injected={4}) == []
    assert "WRITE_DATA x1" in describe(check_write_data(BASE, dram, win(22) + win(26)))


# ---- systems -----------------------------------------------------------------------------------------------------

_systems = {}


def system(kind, storage=False):
    """kind: "spoof" (the design), "plain" (no re-layout, real timing), "nospoof" (re-layout, host uses the real
    timing), "cwl" (only CWL spoofed), "cwl_twr" (CWL and tWR spoofed, tWTR real)."""
    key = (kind, storage)
    if key not in _systems:
        host = {"spoof": None, "plain": None, "nospoof": REAL,
                "cwl": dataclasses.replace(REAL, name="cwl-only", CWL=REAL.CWL - LAT),
                "cwl_twr": dataclasses.replace(REAL, name="cwl-twr", CWL=REAL.CWL - LAT, tWR=REAL.tWR + LAT)}[kind]
        _systems[key] = SpoofSystem(config=CFG, host_timing=host, relayout=kind != "plain", tag_width=8,
                                    device_kwargs=None if storage else {"storage": False}, policy="in-order",
                                    queue_depth=QUEUE)
    return _systems[key]


def req(sys_, addr, write=False, wdata=0, tag=0):
    lay = sys_.controller.request_layout
    return int(lay.const({"addr": int(addr), "write": int(write), "wdata": wdata, "tag": tag}).as_value().value)


def run(sys_, reqs, n_reads, n_cmds=None):
    """Run until ``n_reads`` responses (or, if given, ``n_cmds`` commands: a device model ignores an illegal RD,
    so its response never comes); judge the device pins."""
    expected = {"o": n_reads, "trace": None, "errors": None, "wstrobe": None}
    if n_cmds is not None:
        expected.update(o=None, trace=n_cmds)
    r = AMARANTH.run_streams(sys_, {"i": reqs}, expected, max_cycles=4000 + 100 * len(reqs))
    cmds = decode_trace(r.outputs["trace"], ORG)
    found = check_trace(cmds, CFG.dram, end_cycle=r.cycles - 1, write_strobe=r.outputs["wstrobe"])
    return r, cmds, found


def codes(found):
    return dict(Counter(v.violation.name for v in found))


def directed(sys_):
    """Writes followed by reads / a row miss at the host's minimum distances: WR -> RD in the same bank group
    (tWTR_L), in another bank group (tWTR_S), WR -> PRE (tWR); ends with a read-back."""
    a = sys_.controller.amap.encode_py
    return [req(sys_, a(bg=0, bank=0, row=1, col=0), True, 0x11),
            req(sys_, a(bg=0, bank=0, row=1, col=1), tag=1),
            req(sys_, a(bg=1, bank=0, row=1, col=0), True, 0x22),
            req(sys_, a(bg=2, bank=0, row=1, col=0), tag=3),
            req(sys_, a(bg=0, bank=0, row=2, col=0), True, 0x33),
            req(sys_, a(bg=0, bank=0, row=2, col=0), tag=5)]


def test_directed_with_and_without_spoof():
    """The same traffic on four systems: only the full spoof is legal at the device pins."""
    table = {}
    for kind in ("spoof", "nospoof", "cwl", "cwl_twr"):
        sys_ = system(kind)
        r, cmds, found = run(sys_, directed(sys_), 3, n_cmds=table.get("n_cmds"))
        table.setdefault("n_cmds", len(cmds))   # the host issues the same commands in every system
        assert [c.kind for c in cmds][-1] is Cmd.RD   # after the last write's data
        table[kind] = codes(found)
        dev = Counter(Violation(p & 31).name for p in r.outputs["errors"])
        print(f"\n{kind:8s} host CWL {sys_.controller_config.timing.CWL} tWR {sys_.controller_config.timing.tWR} "
              f"tWTR_S/L {sys_.controller_config.timing.tWTR_S}/{sys_.controller_config.timing.tWTR_L}: "
              f"checker {table[kind] or 'clean'}, device model {dict(dev) or 'clean'}, {r.cycles} cycles")
        if kind == "spoof":
            assert found == [] and r.outputs["errors"] == [], describe(found)
        if kind == "nospoof":   # write data one clock late: 3 lone WRs, each missing its first clock + 1 stray
            assert table[kind] == {"WRITE_DATA": 6}
            assert all(v.actual == REAL.CWL + LAT for v in found if v.command and v.cycle == v.command.cycle)
        if kind == "cwl":       # data on time, but PRE and RDs one clock early relative to the real end of data
            assert table[kind] == {"T_WR": 1, "T_WTR_L": 2, "T_WTR_S": 1}
            assert {"T_WR", "T_WTR_L", "T_WTR_S"} <= set(dev)
        if kind == "cwl_twr":   # the paper's two fields only: tWTR still one clock short
            assert table[kind] == {"T_WTR_L": 2, "T_WTR_S": 1}


def random_workload(sys_, rng, n, addrs, write_frac=0.5):
    model, reqs, expect = {}, [], {}
    for k in range(n):
        a = int(rng.choice(addrs))
        if rng.random() < write_frac:
            d = int.from_bytes(rng.bytes(ORG.burst_bytes), "little")
            model[a] = d
            reqs.append(req(sys_, a, True, d, tag=k % 256))
        else:
            reqs.append(req(sys_, a, False, tag=k % 256))
            expect[k] = model.get(a, 0)
    return reqs, expect


def test_spoofed_random_traffic_bit_exact_and_legal():
    """Random writes/reads (row hits, misses, RAW on the same bursts) through the spoofed system: no violation at
    the device pins; the DRAM holds the re-laid-out bursts; chip c holds elements c, c+8, c+16, c+24."""
    rng = np.random.default_rng(7)
    sys_ = system("spoof", storage=True)
    amap = sys_.controller.amap
    addrs = np.unique(np.concatenate([rng.integers(0, amap.bursts, 10),
                                      amap.encode_py(bank=1, row=np.array([1, 2, 1, 3]), col=np.array([0, 0, 1, 2]))]))
    reqs, expect = random_workload(sys_, rng, 60, addrs)
    # one burst placed by chip: the host builds it with host_burst (chip c, element j)
    elems = rng.integers(0, 1 << 16, (CFG.chips, ORG.burst_length // 2), dtype=np.uint16)
    a = amap.encode_py(rank=1, bg=3, bank=2, row=3, col=7)
    reqs += [req(sys_, a, True, host_burst(elems, CFG)), req(sys_, a, tag=255)]
    r, cmds, found = run(sys_, reqs, len(expect) + 1)
    assert found == [] and r.outputs["errors"] == [], describe(found[:10])
    got = [(p & ((1 << ORG.burst_bits) - 1), p >> ORG.burst_bits) for p in r.outputs["o"]]  # in order
    for (d, tag), k in zip(got, sorted(expect)):
        assert tag == k % 256
        assert d == relayout_burst(expect[k], CFG), f"request {k}"
        assert inverse_relayout_burst(d, CFG) == expect[k]
    assert np.array_equal(chip_elements(got[-1][0], CFG), elems)
    n_wr = sum(c.kind is Cmd.WR for c in cmds)
    assert len(r.outputs["wstrobe"]) == BC * n_wr   # 4 clocks of data per burst at the pins
    # the same traffic without re-layout (real timing): reads return the host bursts themselves; every command
    # not bound by a read<->write turnaround at the same cycle
    plain = system("plain")
    r0, cmds0, found0 = run(plain, reqs, len(expect) + 1)
    assert found0 == []
    col = [c for c in cmds0 if c.kind in (Cmd.RD, Cmd.WR)]
    turns = sum(a.kind is Cmd.RD and b.kind is Cmd.WR or a.kind is Cmd.WR and b.kind is Cmd.RD and a.rank != b.rank
                for a, b in zip(col, col[1:]))
    same = sum(a == b for a, b in zip(cmds, cmds0))
    print(f"\nrandom: {len(reqs)} requests, {n_wr} WR; spoofed {r.cycles} cycles, plain {r0.cycles} cycles; "
          f"{same} of {len(cmds)} commands identical (kind, address, cycle); {turns} RD->WR / cross-rank WR->RD "
          f"turnarounds in the plain trace")
    assert r0.cycles <= r.cycles <= r0.cycles + turns


def test_streamed_writes_then_reads_add_no_bus_cycle():
    """32 sequential writes then 32 reads: the spoofed system issues exactly the plain system's commands in the
    same cycles, its device-pin write data occupies exactly the same clocks (4 per burst, back to back) and the run
    takes the same number of cycles."""
    runs = {}
    for kind in ("spoof", "plain"):
        sys_ = system(kind)
        n = 32
        reqs = [req(sys_, a, True, a + 1) for a in range(n)] + [req(sys_, a, tag=a) for a in range(n)]
        runs[kind] = run(sys_, reqs, n)
    (r, cmds, found), (r0, cmds0, found0) = runs["spoof"], runs["plain"]
    assert found == [] and found0 == [] and r.outputs["errors"] == []
    assert cmds == cmds0
    assert r.cycles == r0.cycles
    assert r.outputs["wstrobe"] == r0.outputs["wstrobe"]
    wr = [c.cycle for c in cmds if c.kind is Cmd.WR]
    assert r.outputs["wstrobe"] == [t + REAL.CWL + k for t in wr for k in range(BC)]
    gaps = Counter(b - a for a, b in zip(wr, wr[1:]))
    print(f"\nstreamed: {len(cmds)} commands, {len(wr)} WR (gaps {dict(gaps)}), {r.cycles} cycles in both systems")
    assert gaps[BC] >= len(wr) // 2   # mostly back to back on the bus
