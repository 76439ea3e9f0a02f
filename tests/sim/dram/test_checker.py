"""The independent DRAM timing checker (sim/dram/checker.py) and trace codec (sim/dram/trace.py)."""

import dataclasses
import random
import time

import pytest

from hdl.memctl.commands import Cmd, Violation
from hdl.memctl.timing import DDR4_3200_TINY, LPDDR5X_8533_TINY, DRAMConfig
from sim.dram import TraceCommand, check_trace, decode_trace, describe, encode_trace

CFG = DDR4_3200_TINY
T = CFG.timing
BC = CFG.org.burst_cycles


def C(cycle, kind, rank=0, bg=0, bank=0, row=0, col=0):
    return TraceCommand(cycle, kind, rank, bg, bank, row, col)


def with_timing(**kw):
    return DRAMConfig(name="custom", org=CFG.org, timing=dataclasses.replace(T, name="custom", **kw))


# ---- trace codec ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [DDR4_3200_TINY, LPDDR5X_8533_TINY], ids=lambda c: c.name)
def test_encode_decode_roundtrip(cfg):
    rng = random.Random(1)
    o = cfg.org
    cmds = [C(rng.randrange(1 << 40), rng.choice(list(Cmd)), rng.randrange(o.ranks), rng.randrange(o.bank_groups),
              rng.randrange(o.banks_per_group), rng.randrange(o.rows), rng.randrange(o.bursts_per_row))
            for _ in range(500)]
    assert decode_trace(encode_trace(cmds, o), o) == cmds


def test_decode_uses_layout_offsets():
    from amaranth.hdl import Const
    from hdl.memctl.commands import trace_layout
    layout = trace_layout(CFG.org)
    value = layout.const({"cmd": {"kind": Cmd.WR, "rank": 1, "bg": 2, "bank": 3, "row": 17, "col": 9},
                          "cycle": 123456})
    payload = Const.cast(value).value
    assert decode_trace([payload], CFG.org) == [C(123456, Cmd.WR, 1, 2, 3, 17, 9)]


def test_decode_rejects_unknown_code():
    with pytest.raises(ValueError, match="unknown command code 7"):
        decode_trace([7], CFG.org)


# ---- a legal hand-written trace ---------------------------------------------------------------------------------

def legal_trace():
    t = []
    t += [C(0, Cmd.ACT, 0, 0, 0, row=1),
          C(4, Cmd.ACT, 0, 1, 0, row=2),          # other bank group: tRRD_S
          C(6, Cmd.ACT, 1, 2, 3, row=7),          # other rank: no tRRD
          C(22, Cmd.RD, 0, 0, 0, col=0),          # tRCD
          C(26, Cmd.RD, 0, 1, 0, col=0),          # tCCD_S, other bank group
          C(30, Cmd.RD, 0, 0, 0, col=1),          # row hit, tCCD_L
          C(36, Cmd.RD, 1, 2, 3, col=5),          # rank switch: data [58,62) after [52,56) + tRTRS
          C(52, Cmd.PRE, 0, 0, 0),                # tRAS
          C(60, Cmd.PRE, 1, 2, 3),
          C(74, Cmd.ACT, 0, 0, 0, row=3),         # row miss: tRP, tRC
          C(96, Cmd.WR, 0, 0, 0, col=2),
          C(128, Cmd.RD, 0, 0, 0, col=2),         # end of write data 116 + tWTR_L
          C(140, Cmd.PREA, 0),                    # tRTP (128 + 12), tWR (116 + 24)
          C(162, Cmd.REF, 0),                     # tRP after PREA
          C(163, Cmd.REF, 1),
          # PIM all-bank sequence
          C(722, Cmd.ACT_AB, 0, row=4),           # tRFC
          C(723, Cmd.ACT, 1, 0, 0, row=9),        # the other rank is free after its own tRFC
          C(744, Cmd.RD_AB, 0, col=0),            # tRCD
          C(748, Cmd.RD, 1, 0, 0, col=3),         # RD_AB has no DQ data: no bus conflict
          C(752, Cmd.RD_AB, 0, col=1),            # tCCD_L
          C(760, Cmd.WR_AB, 0, col=2),            # tCCD_L; its data [776,780) follows rank1's [770,774) + 2
          C(792, Cmd.RD_AB, 0, col=2),            # tWTR_L after the all-bank write data (780)
          C(804, Cmd.PREA, 0),                    # tWR (780 + 24), tRTP (792 + 12)
          C(826, Cmd.ACT, 0, 0, 0, row=5),        # tRPab; tFAW after ACT_AB (722 + 34)
          ]
    return t


def test_legal_trace_has_no_violations():
    v = check_trace(legal_trace(), CFG)
    assert v == [], describe(v)
    assert describe(v) == "no timing violations"


# ---- every violation code, each from a minimal trace -------------------------------------------------------------

REFI9 = 9 * T.tREFI

CASES = {
    Violation.T_RCD: ([C(0, Cmd.ACT), C(21, Cmd.RD)], 21, None),
    Violation.T_RP: ([C(0, Cmd.ACT), C(60, Cmd.PRE), C(81, Cmd.ACT)], 81, None),
    Violation.T_RAS: ([C(0, Cmd.ACT), C(51, Cmd.PRE)], 51, None),
    Violation.T_RC: ([C(0, Cmd.ACT), C(52, Cmd.PRE), C(80, Cmd.ACT)], 80, dict(tRC=84)),
    Violation.T_CCD_S: ([C(0, Cmd.ACT, bg=0), C(4, Cmd.ACT, bg=1), C(26, Cmd.RD, bg=0), C(31, Cmd.RD, bg=1)], 31,
                        dict(tCCD_S=6)),
    Violation.T_CCD_L: ([C(0, Cmd.ACT, bank=0), C(8, Cmd.ACT, bank=1), C(30, Cmd.RD, bank=0),
                         C(36, Cmd.RD, bank=1)], 36, None),
    Violation.T_RRD_S: ([C(0, Cmd.ACT, bg=0), C(3, Cmd.ACT, bg=1)], 3, None),
    Violation.T_RRD_L: ([C(0, Cmd.ACT, bank=0), C(7, Cmd.ACT, bank=1)], 7, None),
    Violation.T_FAW: ([C(0, Cmd.ACT, bg=0), C(4, Cmd.ACT, bg=1), C(8, Cmd.ACT, bg=2), C(12, Cmd.ACT, bg=3),
                       C(16, Cmd.ACT, bg=0, bank=1)], 16, None),
    Violation.T_WTR_S: ([C(0, Cmd.ACT, bg=0), C(4, Cmd.ACT, bg=1), C(22, Cmd.WR, bg=0), C(45, Cmd.RD, bg=1)], 45,
                        None),
    Violation.T_WTR_L: ([C(0, Cmd.ACT), C(22, Cmd.WR), C(53, Cmd.RD)], 53, None),
    Violation.T_WR: ([C(0, Cmd.ACT), C(22, Cmd.WR), C(65, Cmd.PRE)], 65, None),
    Violation.T_RTP: ([C(0, Cmd.ACT), C(45, Cmd.RD), C(56, Cmd.PRE)], 56, None),
    Violation.T_RFC: ([C(0, Cmd.REF), C(559, Cmd.ACT)], 559, None),
    Violation.T_REFI: ([C(8 * T.tREFI, Cmd.REF, rank=1), C(REFI9 + 1, Cmd.NOP)], REFI9, None),
    Violation.BUS: ([C(0, Cmd.ACT, rank=0), C(1, Cmd.ACT, rank=1), C(22, Cmd.RD, rank=0), C(27, Cmd.RD, rank=1)],
                    27, None),
    Violation.BANK_CLOSED: ([C(0, Cmd.RD)], 0, None),
    Violation.BANK_OPEN: ([C(0, Cmd.ACT, row=1), C(74, Cmd.ACT, row=2)], 74, None),
    Violation.ADDRESS: ([C(0, Cmd.ACT, row=32)], 0, None),
}


def test_every_code_has_a_case():
    assert set(CASES) == set(Violation) - {Violation.NONE}


@pytest.mark.parametrize("code", list(CASES), ids=lambda c: c.name)
def test_each_violation(code):
    trace, cycle, overrides = CASES[code]
    cfg = with_timing(**overrides) if overrides else CFG
    v = check_trace(trace, cfg)
    assert [(x.violation, x.cycle) for x in v] == [(code, cycle)], describe(v)
    assert str(v[0]).startswith(f"cycle {cycle}: ")
    # Remove the offending command (the last one; for T_REFI the deadline) and the trace becomes legal.
    if code is not Violation.T_REFI:
        assert check_trace(trace[:-1], cfg) == []


def test_message_names_constraint_and_distances():
    v = check_trace([C(90, Cmd.ACT, 0, 1, 2), C(104, Cmd.RD, 0, 1, 2)], CFG)
    assert v[0].message == ("cycle 104: RD rank0 bg1 bank2 col0 \u2014 tRCD: 22 cycles required after ACT at "
                            "cycle 90, got 14")
    assert (v[0].constraint, v[0].required, v[0].actual, v[0].index) == ("tRCD", 22, 14, 1)
    assert "T_RCD x1" in describe(v)


# ---- data bus --------------------------------------------------------------------------------------------------

def test_read_to_write_turnaround():
    # RD data [44, 48); a WR of the same rank must start its data >= 48 + tRTW = 50, i.e. be issued >= 34.
    base = [C(0, Cmd.ACT, bg=0), C(4, Cmd.ACT, bg=1), C(22, Cmd.RD, bg=0)]
    assert check_trace(base + [C(34, Cmd.WR, bg=1)], CFG) == []
    v = check_trace(base + [C(33, Cmd.WR, bg=1)], CFG)
    assert [(x.violation, x.cycle, x.required, x.actual) for x in v] == [(Violation.BUS, 33, 2, 1)]


def test_write_before_earlier_read_on_other_rank():
    # A WR issued after a RD of another rank whose data lands first on the bus must still leave tRTRS.
    base = [C(0, Cmd.ACT, rank=0), C(1, Cmd.ACT, rank=1), C(22, Cmd.RD, rank=0)]  # read data [44, 48)
    v = check_trace(base + [C(25, Cmd.WR, rank=1)], CFG)  # write data [41, 45): overlaps
    assert [x.violation for x in v] == [Violation.BUS]
    assert check_trace(base + [C(34, Cmd.WR, rank=1)], CFG) == []  # write data [50, 54): 2 idle cycles


# ---- PIM all-bank commands -------------------------------------------------------------------------------------

def test_act_ab_needs_all_banks_precharged():
    v = check_trace([C(0, Cmd.ACT, bg=3, bank=2), C(100, Cmd.ACT_AB)], CFG)
    assert [(x.violation, x.cycle) for x in v] == [(Violation.BANK_OPEN, 100)]
    assert "bg3 bank2" in v[0].message


def test_act_ab_fills_faw_window():
    ok = [C(0, Cmd.ACT_AB), C(52, Cmd.PREA), C(74, Cmd.ACT)]
    assert check_trace(ok, CFG) == []
    # the next ACT after an ACT_AB waits tFAW even though tRRD would allow it (other rank is not affected)
    trace = [C(0, Cmd.ACT_AB), C(1, Cmd.ACT, rank=1), C(5, Cmd.ACT_AB, rank=0)]
    v = check_trace(trace, CFG)
    assert {x.violation for x in v} == {Violation.BANK_OPEN, Violation.T_RC, Violation.T_FAW, Violation.T_RRD_L}


def test_act_ab_faw_alone():
    # After PREA the banks are closed; a second ACT_AB at tRC is legal only because tFAW (34) < tRC (74).
    cfg = with_timing(tFAW=80)
    trace = [C(0, Cmd.ACT_AB), C(52, Cmd.PREA), C(74, Cmd.ACT_AB)]
    v = check_trace(trace, cfg)
    assert [(x.violation, x.cycle, x.required) for x in v] == [(Violation.T_FAW, 74, 80)]


def test_all_bank_column_commands():
    base = [C(0, Cmd.ACT_AB), C(22, Cmd.RD_AB)]
    assert check_trace(base + [C(30, Cmd.RD_AB)], CFG) == []
    v = check_trace(base + [C(29, Cmd.RD_AB)], CFG)
    assert [(x.violation, x.cycle) for x in v] == [(Violation.T_CCD_L, 29)]
    # a normal RD of any bank group after RD_AB is "same bank group": tCCD_L
    v = check_trace(base + [C(26, Cmd.RD, bg=3, bank=1)], CFG)
    assert [x.violation for x in v] == [Violation.T_CCD_L]
    # RD_AB before the banks are open
    v = check_trace([C(0, Cmd.ACT), C(22, Cmd.RD_AB)], CFG)
    assert [x.violation for x in v] == [Violation.BANK_CLOSED]
    # RD_AB after WR_AB: tWTR_L from the end of the write data
    v = check_trace(base + [C(30, Cmd.WR_AB), C(61, Cmd.RD_AB)], CFG)   # write data ends 30 + 16 + 4 = 50
    assert [(x.violation, x.cycle) for x in v] == [(Violation.T_WTR_L, 61)]
    # WR_AB uses the DQ bus: rank switch against a RD of the other rank
    v = check_trace([C(0, Cmd.ACT_AB), C(1, Cmd.ACT, rank=1), C(23, Cmd.RD, rank=1), C(30, Cmd.WR_AB)], CFG)
    assert [x.violation for x in v] == [Violation.BUS]   # RD data [45, 49), WR_AB data [46, 50)
    # PREA after WR_AB waits tWR in every bank
    v = check_trace([C(0, Cmd.ACT_AB), C(22, Cmd.WR_AB), C(65, Cmd.PREA)], CFG)
    assert [(x.violation, x.cycle) for x in v] == [(Violation.T_WR, 65)]


# ---- refresh ---------------------------------------------------------------------------------------------------

def test_refresh_postponement_8_ok_9_flagged():
    R = T.tREFI
    # both ranks postpone 8 intervals, then catch up with 8 REFs each, tRFC apart
    trace = []
    for n in range(9):
        trace.append(C(8 * R + n * T.tRFC, Cmd.REF, rank=0))
        trace.append(C(8 * R + n * T.tRFC + 1, Cmd.REF, rank=1))
    assert check_trace(trace, CFG, end_cycle=17 * R - 1) == []
    # rank 0 postpones a 9th interval: flagged at the deadline 9 * tREFI
    late = [C(9 * R + 5, Cmd.REF, rank=0), C(8 * R, Cmd.REF, rank=1)]
    late.sort(key=lambda c: c.cycle)
    v = check_trace(late, CFG)
    assert [(x.violation, x.cycle) for x in v] == [(Violation.T_REFI, 9 * R)]
    assert "rank0" in v[0].message
    # a REF exactly at the deadline is in time
    assert check_trace([C(8 * R, Cmd.REF, rank=1), C(9 * R, Cmd.REF, rank=0)], CFG) == []
    # the end of the capture also counts
    v = check_trace([C(8 * R, Cmd.REF, rank=1)], CFG, end_cycle=9 * R)
    assert [(x.violation, x.cycle, x.command) for x in v] == [(Violation.T_REFI, 9 * R, None)]


def test_ref_needs_precharge_and_trp():
    v = check_trace([C(0, Cmd.ACT), C(52, Cmd.PRE), C(73, Cmd.REF)], CFG)
    assert [(x.violation, x.cycle) for x in v] == [(Violation.T_RP, 73)]
    v = check_trace([C(0, Cmd.ACT), C(60, Cmd.REF)], CFG)
    assert [x.violation for x in v] == [Violation.BANK_OPEN]


def test_prea_uses_trpab():
    cfg = DRAMConfig(name="lp", org=LPDDR5X_8533_TINY.org, timing=LPDDR5X_8533_TINY.timing)
    t = cfg.timing
    trace = [C(0, Cmd.ACT), C(t.tRAS, Cmd.PREA), C(t.tRAS + t.tRP, Cmd.ACT)]
    v = check_trace(trace, cfg)
    assert [(x.violation, x.constraint, x.required) for x in v] == [(Violation.T_RP, "tRPab", t.tRPab)]
    trace = [C(0, Cmd.ACT), C(t.tRAS, Cmd.PRE), C(t.tRAS + t.tRP, Cmd.ACT)]
    assert check_trace(trace, cfg) == []  # per-bank PRE: tRP (tRC = tRAS + tRP as well)


# ---- injected commands ------------------------------------------------------------------------------------------

def test_injected_commands_are_reported_but_do_not_change_state():
    trace = [C(0, Cmd.ACT), C(10, Cmd.PRE), C(22, Cmd.RD)]  # the PRE at 10 is an injected illegal command
    v = check_trace(trace, CFG, injected={1})
    assert [(x.violation, x.cycle, x.injected) for x in v] == [(Violation.T_RAS, 10, True)]
    assert "[injected]" in describe(v)
    # without the mark the PRE closes the bank, so the RD finds it closed
    v = check_trace(trace, CFG)
    assert [x.violation for x in v] == [Violation.T_RAS, Violation.BANK_CLOSED]


def test_out_of_order_trace_rejected():
    with pytest.raises(ValueError, match="not in cycle order"):
        check_trace([C(5, Cmd.ACT), C(4, Cmd.NOP)], CFG)


# ---- a long legal trace from a simple greedy scheduler ---------------------------------------------------------

def generate_legal(cfg, n_commands, seed=0):
    """Closed-page traffic, one bank at a time with generous spacing, REF for both ranks every tREFI, and an
    all-bank PIM sequence every 8th transaction."""
    t, o = cfg.timing, cfg.org
    bc = o.burst_cycles
    rng = random.Random(seed)
    rtw = max(t.tCCD_L, t.CL + bc + t.tRTW - t.CWL)   # RD -> WR of the same rank
    out = []
    now = 0
    next_ref = t.tREFI
    n = 0
    while len(out) < n_commands:
        if now >= next_ref:
            for r in range(o.ranks):
                out.append(TraceCommand(now + r, Cmd.REF, r))
            now += t.tRFC + o.ranks
            next_ref += t.tREFI
            continue
        r = rng.randrange(o.ranks)
        if n % 8 == 7:
            row = rng.randrange(o.rows)
            a = now
            rd = a + t.tRCD
            rd2 = rd + t.tCCD_L
            wr = rd2 + t.tCCD_L
            rd3 = wr + t.CWL + bc + t.tWTR_L
            pre = max(a + t.tRAS, wr + t.CWL + bc + t.tWR, rd3 + t.tRTP)
            out += [TraceCommand(a, Cmd.ACT_AB, r, row=row), TraceCommand(rd, Cmd.RD_AB, r, col=1),
                    TraceCommand(rd2, Cmd.RD_AB, r, col=2), TraceCommand(wr, Cmd.WR_AB, r, col=3),
                    TraceCommand(rd3, Cmd.RD_AB, r, col=3), TraceCommand(pre, Cmd.PREA, r)]
            now = max(pre + t.tRPab, a + t.tFAW, a + t.tRC) + t.tRTRS + bc
        else:
            g, b = rng.randrange(o.bank_groups), rng.randrange(o.banks_per_group)
            row, col = rng.randrange(o.rows), rng.randrange(o.bursts_per_row)
            a = now
            rd = a + t.tRCD
            wr = rd + rtw
            pre = max(a + t.tRAS, rd + t.tRTP, wr + t.CWL + bc + t.tWR)
            out += [TraceCommand(a, Cmd.ACT, r, g, b, row=row), TraceCommand(rd, Cmd.RD, r, g, b, col=col),
                    TraceCommand(wr, Cmd.WR, r, g, b, col=col), TraceCommand(pre, Cmd.PRE, r, g, b)]
            now = max(pre + t.tRP, a + t.tRC) + t.tRTRS + bc
        n += 1
    return out


@pytest.mark.parametrize("cfg", [DDR4_3200_TINY, LPDDR5X_8533_TINY], ids=lambda c: c.name)
def test_long_legal_trace_is_fast(cfg):
    trace = generate_legal(cfg, 200_000)
    start = time.perf_counter()
    v = check_trace(trace, cfg)
    elapsed = time.perf_counter() - start
    assert v == [], describe(v[:20])
    assert elapsed < 10.0, f"checker took {elapsed:.2f} s for {len(trace)} commands"
    # the same trace, decoded from hardware payloads, gives the same verdict
    payloads = encode_trace(trace[:5000], cfg.org)
    assert decode_trace(payloads, cfg.org) == trace[:5000]


def test_long_trace_with_one_injected_error():
    trace = generate_legal(CFG, 20_000, seed=3)
    i = next(k for k in range(10_000, len(trace)) if trace[k].kind is Cmd.RD)
    bad = dataclasses.replace(trace[i], cycle=trace[i].cycle - 1)   # one cycle before tRCD
    v = check_trace(trace[:i] + [bad] + trace[i + 1:], CFG)
    assert [(x.violation, x.cycle, x.index) for x in v] == [(Violation.T_RCD, bad.cycle, i)]
