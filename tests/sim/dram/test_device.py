"""DRAM device model (sim/dram/device.py) through its stream bench (sim/dram/player.py), on both engines.

Every run's trace also goes through the independent Python checker (sim/dram/checker.py): the model's reports and
the checker's must be the same multiset of (code, cycle). The model ignores illegal commands, so the commands it
flagged are passed to the checker as ``injected`` (judged, but not executed).
"""

import random
from dataclasses import replace

import pytest

from hdl.memctl.commands import Cmd, Violation, command_layout
from hdl.memctl.timing import DDR4_3200_TINY, DRAMConfig
from sim.backends import get_backend
from sim.dram.checker import check_trace
from sim.dram.device import flat_burst_address
from sim.dram.player import CommandPlayer
from sim.dram.trace import decode_trace

V = Violation
# DDR4-3200 timing on a small organisation (4 rows x 8 bursts per bank: 256 Kibit of storage, quick to convert),
# with tRC 6 cycles above tRAS + tRP so that a tRC violation can happen alone.
ORG = replace(DDR4_3200_TINY.org, name="ddr4-small", rows=4, columns=64)
CFG = DRAMConfig(name="ddr4-small", org=ORG, timing=replace(DDR4_3200_TINY.timing, tRC=80))
TM = CFG.timing
INIT = {flat_burst_address(ORG, 0, 0, 0, 1, 2): 0xDEADBEEF << 300 | 0x1234,
        flat_burst_address(ORG, 1, 3, 3, 3, 7): (1 << 511) | 5,
        flat_burst_address(ORG, 0, 2, 1, 1, 4): 0xABCDEF}

_players = {}
_backends = {}


def player():
    if "p" not in _players:
        _players["p"] = CommandPlayer(CFG, init=INIT)
    return _players["p"]


def engine(backend):
    # One backend object per engine for the module: the Verilator backend then converts the player once.
    return _backends.setdefault(backend.name, backend)


def program(p, cmds, *, tail=40):
    """cmds: (cycle, kind, fields) in cycle order -> ``i`` payloads; ends with a marked NOP ``tail`` cycles later."""
    out, last = [], 0
    for cycle, kind, f in cmds:
        out.append(p.encode(kind, delay=cycle - last, **f))
        last = cycle
    out.append(p.encode(Cmd.NOP, delay=tail, mark=1))
    return out


def run(backend, cmds, *, reads=0, ab=0, tail=40, max_cycles=None):
    p = player()
    expected = {"marks": 1, "trace": None, "errors": None}
    if reads:
        expected["rdata"] = reads
    if ab:
        expected["ab_rdata"] = ab
    r = backend.run_streams(p, {"i": program(p, cmds, tail=tail)}, expected, max_cycles=max_cycles)
    assert r.outputs["marks"] == [cmds[-1][0] + tail]
    return r


def errors(r):
    return sorted(((c.value, t) for c, t in CommandPlayer.decode_errors(r.outputs["errors"])))


def check_agreement(r, *, end_cycle=None):
    """The checker judges the recorded trace exactly as the model did."""
    trace = decode_trace(r.outputs["trace"], ORG)
    dev = errors(r)
    flagged = {t for c, t in dev if c != V.T_REFI.value}
    injected = {i for i, c in enumerate(trace) if c.cycle in flagged}
    found = check_trace(trace, CFG, injected=injected, end_cycle=end_cycle)
    chk = sorted((v.violation.value, v.cycle) for v in found)
    assert dev == chk, f"model {dev} != checker {chk}"
    return trace


def A(**f):
    return f


def test_write_read_back(backend):
    be = engine(backend)
    d1, d2, d3 = (random.Random(s).getrandbits(512) for s in (1, 2, 3))
    step = 90  # every command well clear of every timing rule
    seq = [
        (A(rank=0, bg=0, bank=0, row=1), Cmd.ACT),
        (A(rank=0, bg=0, bank=0, col=2), Cmd.RD),                 # initial contents
        (A(rank=0, bg=0, bank=0, col=3, wdata=d1), Cmd.WR),
        (A(rank=0, bg=0, bank=0, col=3), Cmd.RD),                 # row hit
        (A(rank=1, bg=2, bank=1, row=0), Cmd.ACT),                # other rank and bank
        (A(rank=1, bg=2, bank=1, col=7, wdata=d2), Cmd.WR),
        (A(rank=1, bg=2, bank=1, col=7), Cmd.RD),
        (A(rank=0, bg=0, bank=0), Cmd.PRE),
        (A(rank=0, bg=0, bank=0, row=2), Cmd.ACT),                # row miss
        (A(rank=0, bg=0, bank=0, col=3, wdata=d3), Cmd.WR),
        (A(rank=0, bg=0, bank=0, col=3), Cmd.RD),
        (A(rank=0, bg=0, bank=0), Cmd.PRE),
        (A(rank=0, bg=0, bank=0, row=1), Cmd.ACT),
        (A(rank=0, bg=0, bank=0, col=3), Cmd.RD),                 # the first row kept d1
        (A(rank=1, bg=2, bank=1, col=0), Cmd.RD),                 # never written: 0
    ]
    cmds = [(step * (i + 1), k, f) for i, (f, k) in enumerate(seq)]
    r = run(be, cmds, reads=6)
    assert r.outputs["rdata"] == [INIT[flat_burst_address(ORG, 0, 0, 0, 1, 2)], d1, d2, d3, d1, 0]
    assert errors(r) == []
    trace = check_agreement(r)
    assert [(c.cycle, c.kind) for c in trace] == [(t, k) for t, k, _ in cmds]


def test_read_burst_pin_timing(backend):
    """rdata pins carry the burst CL .. CL + burst_cycles - 1 after RD (checked through the run's cycle count)."""
    be = engine(backend)
    cmds = [(1, Cmd.ACT, A(rank=1, bg=3, bank=3, row=3)), (30, Cmd.RD, A(rank=1, bg=3, bank=3, col=7))]
    p = player()
    r = be.run_streams(p, {"i": program(p, cmds, tail=200)}, {"rdata": 1})
    assert r.outputs["rdata"] == [INIT[flat_burst_address(ORG, 1, 3, 3, 3, 7)]]
    # last beat in cycle 30 + CL + BC - 1; the bench's FIFO pushes at that edge and presents the payload (buffered
    # FIFO: two cycles later), so the run ends then.
    assert r.cycles == 30 + TM.CL + ORG.burst_cycles - 1 + 3


def test_legal_tight_sequence(backend):
    """Commands at their minimum legal distances: no violations, trace records exact cycles."""
    be = engine(backend)
    t = TM
    b0, b1 = A(rank=0, bg=0, bank=0), A(rank=0, bg=1, bank=0)
    cmds = [
        (1, Cmd.ACT, {**b0, "row": 1}),
        (1 + t.tRRD_S, Cmd.ACT, {**b1, "row": 0}),
        (1 + t.tRCD, Cmd.RD, {**b0, "col": 2}),
        (1 + t.tRCD + t.tCCD_S, Cmd.RD, {**b1, "col": 0}),
        (1 + t.tRCD + 2 * t.tCCD_S, Cmd.RD, {**b0, "col": 1}),   # tCCD_L after the first RD (8 = 2 x 4)
    ]
    # RD -> WR (same rank): write data must start tRTW after the end of read data.
    last_rd = cmds[-1][0]
    wr = last_rd + TM.CL + ORG.burst_cycles + TM.tRTW - TM.CWL
    cmds.append((wr, Cmd.WR, {**b1, "col": 5, "wdata": 77}))
    rd = wr + TM.CWL + ORG.burst_cycles + TM.tWTR_S        # other bank group: tWTR_S
    cmds.append((rd, Cmd.RD, {**b0, "col": 2}))
    rd2 = wr + TM.CWL + ORG.burst_cycles + TM.tWTR_L       # same bank group: tWTR_L
    cmds.append((rd2, Cmd.RD, {**b1, "col": 5}))
    pre = max(1 + t.tRAS, rd2 + t.tRTP, wr + TM.CWL + ORG.burst_cycles + t.tWR)
    cmds.append((pre, Cmd.PRE, b1))
    cmds.append((pre + 1, Cmd.PREA, A(rank=0)))
    cmds.append((pre + 1 + t.tRPab, Cmd.REF, A(rank=0)))
    cmds.append((pre + 1 + t.tRPab + t.tRFC, Cmd.ACT, {**b0, "row": 3}))
    r = run(be, cmds, reads=5)
    assert errors(r) == []
    assert r.outputs["rdata"][4] == 77
    trace = check_agreement(r)
    assert [(c.cycle, c.kind, c.rank, c.bg, c.bank) for c in trace] == \
        [(cy, k, f.get("rank", 0), f.get("bg", 0), f.get("bank", 0)) for cy, k, f in cmds]


B0, B0b, B1 = A(rank=0, bg=0, bank=0), A(rank=0, bg=0, bank=1), A(rank=0, bg=1, bank=0)
R1 = A(rank=1, bg=0, bank=0)
# code -> (commands, index of the illegal command); each sequence breaks exactly one rule once.
VIOLATION_CASES = {
    V.T_RCD: ([(1, Cmd.ACT, {**B0, "row": 1}), (10, Cmd.RD, {**B0, "col": 0})], 1),
    V.T_RP: ([(1, Cmd.ACT, {**B0, "row": 1}), (60, Cmd.PRE, B0), (81, Cmd.ACT, {**B0, "row": 2})], 2),
    V.T_RAS: ([(1, Cmd.ACT, {**B0, "row": 1}), (30, Cmd.PRE, B0)], 1),
    V.T_RC: ([(1, Cmd.ACT, {**B0, "row": 1}), (53, Cmd.PRE, B0), (77, Cmd.ACT, {**B0, "row": 2})], 2),
    V.T_CCD_S: ([(1, Cmd.ACT, {**B0, "row": 1}), (5, Cmd.ACT, {**B1, "row": 1}), (30, Cmd.RD, {**B0, "col": 0}),
                 (32, Cmd.WR, {**B1, "col": 0, "wdata": 1})], 3),
    V.T_CCD_L: ([(1, Cmd.ACT, {**B0, "row": 1}), (9, Cmd.ACT, {**B0b, "row": 1}), (40, Cmd.RD, {**B0, "col": 0}),
                 (45, Cmd.RD, {**B0b, "col": 0})], 3),
    V.T_RRD_S: ([(1, Cmd.ACT, {**B0, "row": 1}), (3, Cmd.ACT, {**B1, "row": 1})], 1),
    V.T_RRD_L: ([(1, Cmd.ACT, {**B0, "row": 1}), (5, Cmd.ACT, {**B0b, "row": 1})], 1),
    V.T_FAW: ([(1 + 4 * g, Cmd.ACT, A(rank=0, bg=g, bank=0, row=1)) for g in range(4)]
              + [(17, Cmd.ACT, {**B0b, "row": 1})], 4),
    V.T_WTR_S: ([(1, Cmd.ACT, {**B0, "row": 1}), (5, Cmd.ACT, {**B1, "row": 1}),
                 (30, Cmd.WR, {**B0, "col": 0, "wdata": 1}), (52, Cmd.RD, {**B1, "col": 0})], 3),
    V.T_WTR_L: ([(1, Cmd.ACT, {**B0, "row": 1}), (30, Cmd.WR, {**B0, "col": 0, "wdata": 1}),
                 (55, Cmd.RD, {**B0, "col": 1})], 2),
    V.T_WR: ([(1, Cmd.ACT, {**B0, "row": 1}), (30, Cmd.WR, {**B0, "col": 0, "wdata": 1}), (60, Cmd.PRE, B0)], 2),
    V.T_RTP: ([(1, Cmd.ACT, {**B0, "row": 1}), (50, Cmd.RD, {**B0, "col": 0}), (55, Cmd.PRE, B0)], 2),
    V.T_RFC: ([(1, Cmd.REF, A(rank=0)), (100, Cmd.ACT, {**B0, "row": 1})], 1),
    V.BUS: ([(1, Cmd.ACT, {**B0, "row": 1}), (3, Cmd.ACT, {**R1, "row": 1}), (30, Cmd.RD, {**B0, "col": 0}),
             (34, Cmd.RD, {**R1, "col": 0})], 3),
    V.BANK_CLOSED: ([(5, Cmd.RD, {**B0, "col": 0})], 0),
    V.BANK_OPEN: ([(1, Cmd.ACT, {**B0, "row": 1}), (100, Cmd.ACT, {**B0, "row": 2})], 1),
}


@pytest.mark.parametrize("code", list(VIOLATION_CASES), ids=lambda c: c.name)
def test_violation(backend, code):
    be = engine(backend)
    cmds, bad = VIOLATION_CASES[code]
    r = run(be, cmds)
    assert errors(r) == [(code.value, cmds[bad][0])]
    check_agreement(r)


def test_violation_address(backend):
    """An undefined command code is reported as ADDRESS (the organisation's fields are all powers of two)."""
    be = engine(backend)
    p = player()
    layout = CommandPlayer.entry_layout(ORG)
    kind_off = layout["cmd"].offset + command_layout(ORG)["kind"].offset
    entries = [p.encode(Cmd.NOP, delay=5) | (7 << kind_off), p.encode(Cmd.NOP, delay=40, mark=1)]
    r = be.run_streams(p, {"i": entries}, {"marks": 1, "errors": None})
    assert errors(r) == [(V.ADDRESS.value, 5)]


def test_illegal_commands_are_ignored(backend):
    """An illegal WR writes nothing; an illegal ACT opens nothing; an illegal PRE closes nothing."""
    be = engine(backend)
    addr = flat_burst_address(ORG, 0, 0, 0, 1, 2)
    cmds = [
        (1, Cmd.ACT, {**B0, "row": 1}),
        (10, Cmd.WR, {**B0, "col": 2, "wdata": 0x5555}),     # tRCD: ignored
        (20, Cmd.PRE, B0),                                   # tRAS: ignored, the row stays open
        (40, Cmd.RD, {**B0, "col": 2}),                      # legal: initial contents
        (45, Cmd.ACT, {**B1, "row": 0}),                     # legal
        (47, Cmd.ACT, {**B0b, "row": 0}),                    # 2 cycles after an ACT in another bank group: tRRD_S
        (60, Cmd.RD, {**B0b, "col": 0}),                     # bank never opened: BANK_CLOSED
    ]
    r = run(be, cmds, reads=1)
    assert r.outputs["rdata"] == [INIT[addr]]
    assert errors(r) == [(V.T_RCD.value, 10), (V.T_RAS.value, 20), (V.T_RRD_S.value, 47), (V.BANK_CLOSED.value, 60)]
    check_agreement(r)


def test_all_bank_commands(backend):
    """ACT_AB opens every bank; WR_AB writes the DQ burst into every bank; RD_AB returns every bank's burst."""
    be = engine(backend)
    NB, BB = ORG.banks, ORG.burst_bits
    d = random.Random(7).getrandbits(512)
    init_b9 = INIT[flat_burst_address(ORG, 0, 2, 1, 1, 4)]  # bank 2 * 4 + 1 = 9, row 1, col 4
    cmds = [
        (1, Cmd.ACT_AB, A(rank=0, row=1)),
        (23, Cmd.RD_AB, A(rank=0, col=4)),                  # initial contents: only bank 9 non-zero
        (31, Cmd.WR_AB, A(rank=0, col=5, wdata=d)),         # tCCD_L after RD_AB; bus: RD_AB uses none
        (31 + TM.CWL + ORG.burst_cycles + TM.tWTR_L, Cmd.RD_AB, A(rank=0, col=5)),
        (80, Cmd.RD, A(rank=0, bg=3, bank=2, col=5)),       # one bank through the DQ pins
        (85, Cmd.ACT_AB, A(rank=1, row=0)),                 # other rank: its own window
    ]
    r = run(be, cmds, reads=1, ab=2)
    ab0, ab1 = r.outputs["ab_rdata"]
    assert ab0 == init_b9 << (9 * BB)
    assert ab1 == sum(d << (b * BB) for b in range(NB))
    assert r.outputs["rdata"] == [d]
    assert errors(r) == []
    check_agreement(r)


def test_all_bank_rules(backend):
    be = engine(backend)
    cmds = [
        (1, Cmd.ACT, {**B1, "row": 1}),
        (20, Cmd.ACT_AB, A(rank=0, row=1)),     # a bank is open: BANK_OPEN, and tRC of that bank (ignored)
        (30, Cmd.RD_AB, A(rank=0, col=0)),      # only one bank open: BANK_CLOSED
        (60, Cmd.PREA, A(rank=0)),              # legal (tRAS: 1 + 52 <= 60)
        (82, Cmd.ACT_AB, A(rank=0, row=2)),     # tRPab after PREA
        (90, Cmd.ACT, {**R1, "row": 1}),        # other rank: fine
        (100, Cmd.PREA, A(rank=0)),             # tRAS (82 + 52)
    ]
    r = run(be, cmds)
    assert errors(r) == sorted([(V.BANK_OPEN.value, 20), (V.T_RC.value, 20), (V.BANK_CLOSED.value, 30),
                                (V.T_RAS.value, 100)])
    check_agreement(r)


def _refresh_cmds(intervals, *, skip=()):
    t = TM.tREFI
    out = []
    for k in range(1, intervals + 1):
        if k in skip:
            continue
        out.append((k * t, Cmd.REF, A(rank=0)))
        out.append((k * t + 1, Cmd.REF, A(rank=1)))
    return out


def test_refresh_postponement():
    """REF every tREFI is clean; no REF for 9 intervals is a T_REFI at 9 x tREFI (per rank). Verilator only."""
    be = _backends.setdefault("verilator", get_backend("verilator"))
    T = TM.tREFI
    r = run(be, _refresh_cmds(12), max_cycles=20 * T)
    assert errors(r) == []
    check_agreement(r, end_cycle=12 * T + 1 + 40)
    # Nothing for nine intervals: both ranks violate at 9 T; REFs then catch up (up to 8 postponed is legal).
    late = [(9 * T + 5, Cmd.REF, A(rank=0))] + [(9 * T + 5 + k * TM.tRFC, Cmd.REF, A(rank=0)) for k in range(1, 4)]
    late.append((9 * T + 4 * TM.tRFC + 10, Cmd.REF, A(rank=1)))
    r = run(be, late, tail=2 * T, max_cycles=20 * T)
    # rank 0: 4 REFs by 10 T -> fine at 10 T (10 - 4 = 6); rank 1: 1 REF -> 10 - 1 = 9 > 8 at 10 T and 11 T.
    assert errors(r) == sorted([(V.T_REFI.value, 9 * T)] * 2 + [(V.T_REFI.value, 10 * T), (V.T_REFI.value, 11 * T)])
    check_agreement(r, end_cycle=late[-1][0] + 2 * T)


def _random_cmds(n, seed, *, p_legalish=0.0):
    rng = random.Random(seed)
    kinds = [Cmd.ACT] * 6 + [Cmd.RD] * 6 + [Cmd.WR] * 5 + [Cmd.PRE] * 4 + [Cmd.PREA, Cmd.REF, Cmd.ACT_AB,
                                                                         Cmd.RD_AB, Cmd.WR_AB]
    t, out = 0, []
    for _ in range(n):
        t += rng.choice([1, 1, 2, 3, 4, 6, 8, 12, 20, 30])
        k = rng.choice(kinds)
        out.append((t, k, A(rank=rng.randrange(ORG.ranks), bg=rng.randrange(ORG.bank_groups),
                            bank=rng.randrange(ORG.banks_per_group), row=rng.randrange(ORG.rows),
                            col=rng.randrange(ORG.bursts_per_row), wdata=rng.getrandbits(512))))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_random_traces_agree_with_checker(backend, seed):
    """Random command mixes (most commands illegal): the model and the checker report the same violations."""
    be = engine(backend)
    n = 120 if backend.name == "amaranth" else 20000
    cmds = _random_cmds(n, seed)
    r = run(be, cmds, tail=200, max_cycles=cmds[-1][0] + 1000)
    assert len(r.outputs["trace"]) == n
    assert len(errors(r)) > n // 10
    check_agreement(r, end_cycle=cmds[-1][0] + 200)


def test_timing_only_model_returns_burst_addresses(backend):
    """storage=False: writes are discarded and each read returns its own flat burst address."""
    p = CommandPlayer(CFG, storage=False)
    seq = [(100, Cmd.ACT, A(rank=1, bg=2, bank=3, row=3)), (130, Cmd.WR, A(rank=1, bg=2, bank=3, col=5, wdata=7)),
           (200, Cmd.RD, A(rank=1, bg=2, bank=3, col=5)), (210, Cmd.RD, A(rank=1, bg=2, bank=3, col=6))]
    r = backend.run_streams(p, {"i": program(p, seq)}, {"marks": 1, "rdata": 2, "trace": None, "errors": None})
    assert r.outputs["rdata"] == [flat_burst_address(ORG, 1, 2, 3, 3, 5), flat_burst_address(ORG, 1, 2, 3, 3, 6)]
    assert r.outputs["errors"] == []
    # RD_AB: every bank's own burst address, banks opened by one ACT_AB and (bank 6) re-opened at another row by a
    # single-bank PRE / ACT (the bank's row, not the rank's all-bank row, is read).
    t_pre = 1 + TM.tRAS
    t_act = max(t_pre + TM.tRP, 1 + TM.tRC)
    seq = [(1, Cmd.ACT_AB, A(rank=0, row=1)), (t_pre, Cmd.PRE, A(rank=0, bg=1, bank=2)),
           (t_act, Cmd.ACT, A(rank=0, bg=1, bank=2, row=3)), (t_act + TM.tRCD, Cmd.RD_AB, A(rank=0, col=7))]
    r = backend.run_streams(p, {"i": program(p, seq)}, {"marks": 1, "ab_rdata": 1, "trace": None, "errors": None})
    rows = [3 if b == 6 else 1 for b in range(ORG.banks)]
    want = sum(flat_burst_address(ORG, 0, b // ORG.banks_per_group, b % ORG.banks_per_group, rows[b], 7)
               << (b * ORG.burst_bits) for b in range(ORG.banks))
    assert r.outputs["ab_rdata"] == [want]
    assert r.outputs["errors"] == []
