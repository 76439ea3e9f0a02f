"""DRAM energy from the command stream (sim/energy, issue 33 item 1).

* a trace computed by hand from the datasheet figures (written out below, not read from sim/energy/specs.py)
  equals the model's energy, and every doubled current and a dropped REF move it (the mutants are caught);
* the fast model's recorded command stream equals the RTL controller's trace command for command on one stream
  (random reads crossing a refresh), so their energies are equal; a fast stream missing its REF is caught;
* the recorded Python path schedules like the compiled kernel (counts and column cycles) and passes the checker;
* the outside model (energydram, Micron TN-41-01's method) differs from ours by exactly the two documented terms.
"""

import math

import numpy as np
import pytest

from hdl.memctl.commands import Cmd
from hdl.memctl.timing import DDR4_3200, DDR4_3200_TINY, LPDDR5X_8533, LPDDR5X_8533_TINY
from sim.dram.checker import check_trace, describe
from sim.dram.trace import TraceCommand as T
from sim.energy.dram import command_energy, trace_energy
from sim.energy.record import record_stream
from sim.energy.reference import energydram_energy, explained_difference
from sim.energy.specs import power_spec
from sim.perf.dram import DRAMPerfModel

# DDR4-3200 rank 0: ACT, RD (tRCD), WR (RD->WR = CL + 4 + 2 - CWL), PRE (WR + CWL + 4 + tWR), REF (PRE + tRP)
HAND_TRACE = [T(0, Cmd.ACT, 0, 1, 2, 7), T(22, Cmd.RD, 0, 1, 2, 7, 3), T(34, Cmd.WR, 0, 1, 2, 7, 4),
              T(80, Cmd.PRE, 0, 1, 2, 7), T(102, Cmd.REF, 0)]
HAND_END = 1000


def _hand_pj():
    """The hand calculation: Micron MT40A1G8 DDR4-3200 x8 IDD (mA): IDD0 57, IDD2N 37, IDD3N 52, IDD4R 168,
    IDD4W 150, IDD5B 250; IPP0 3.0 (other IPP 0); VDD 1.2 V, VPP 2.5 V; 8 dies per rank; tCK 0.625 ns;
    tRAS 52, tRC 74, burst 4, tRFC 560 clocks. mA x V x ns = pJ."""
    k = 8 * 0.625
    act = k * (1.2 * (57 - 52) * 52 + 2.5 * 3.0 * 52)          # 3510
    pre = k * (1.2 * (57 - 37) * 22 + 2.5 * 3.0 * 22)          # 3465
    rd = k * 1.2 * (168 - 52) * 4                               # 2784
    wr = k * 1.2 * (150 - 52) * 4                               # 2352
    ref = k * 1.2 * (250 - 52) * 560                            # 665280
    active = 80 + 560                                           # rank 0: [0, 80) open, [102, 662) refreshing
    idle = 2 * HAND_END - active                                # rank 1 idle throughout
    return act + pre + rd + wr + ref + active * k * 1.2 * 52 + idle * k * 1.2 * 37


def test_hand_computed_case():
    assert not check_trace(HAND_TRACE, DDR4_3200, end_cycle=HAND_END)
    e = trace_energy(HAND_TRACE, DDR4_3200, end_cycle=HAND_END)
    assert (e.acts, e.pres, e.rds, e.wrs, e.refs) == (1, 1, 1, 1, 1)
    assert (e.active_cycles, e.idle_cycles) == (640, 1360)
    assert e.total_pj == pytest.approx(_hand_pj(), rel=1e-12)
    assert e.total_pj == pytest.approx(1_178_991.0, rel=1e-12)   # 677391 command + 640 x 312 + 1360 x 222
    assert e.dq_bits == 2 * 512


@pytest.mark.parametrize("current", ["idd0", "idd2n", "idd3n", "idd4r", "idd4w", "idd5b"])
def test_mutant_doubled_idd_caught(current):
    spec = power_spec(DDR4_3200).scaled(2.0, current)
    e = trace_energy(HAND_TRACE, DDR4_3200, spec, end_cycle=HAND_END)
    assert not math.isclose(e.total_pj, _hand_pj(), rel_tol=1e-6)


def test_mutant_missing_ref_caught():
    e = trace_energy([c for c in HAND_TRACE if c.kind is not Cmd.REF], DDR4_3200, end_cycle=HAND_END)
    assert not math.isclose(e.total_pj, _hand_pj(), rel_tol=1e-6)
    # a REF is its increment plus tRFC of active instead of precharge standby
    k = 8 * 0.625
    assert _hand_pj() - e.total_pj == pytest.approx(k * 1.2 * ((250 - 52) * 560 + (52 - 37) * 560), rel=1e-12)


def test_lpddr5x_read_energy_by_hand():
    """LPDDR5X-8533 one burst read: Micron Y52P x16 7500 Mb/s IDD4R - IDD3N per rail scaled to 8533 Mb/s
    (VDD1 18.0 - 2.8 mA at 1.8 V, VDD2H 390 - 40 at 1.05 V, VDDQ 111.9 - 0.6 at 0.5 V) over 2 clocks of 0.938 ns,
    one x16 die-equivalent per rank."""
    e = command_energy(LPDDR5X_8533)
    hand = (8533 / 7500) * 2 * 0.938 * (1.8 * (18.0 - 2.8) + 1.05 * (390 - 40) + 0.5 * (111.9 - 0.6))
    assert e.rd == pytest.approx(hand, rel=1e-12)
    assert e.rd / LPDDR5X_8533.org.burst_bits == pytest.approx(3.76, abs=0.01)   # pJ per bit of the burst term


def test_rtl_and_fast_model_energy_equal():
    """4,000 random reads on the DDR4 controller (RTL, Verilator) and the fast model's recorded stream: the same
    commands at the same cycles (a REF included), hence the same energy; dropping the REF is caught."""
    from sim.bench.dram import pattern_addresses, rtl_stream
    from sim.dram.trace import decode_trace
    cfg = DDR4_3200_TINY
    model = DRAMPerfModel(cfg)
    addrs = pattern_addresses(model.amap, "random", 4000)
    run = rtl_stream(cfg, addrs)
    rtl = decode_trace(run.outputs["trace"], cfg.org)
    assert not check_trace(rtl, cfg, end_cycle=run.cycles - 1)
    res, fast = record_stream(model, addrs)
    assert res.cycles == run.cycles
    assert sum(c.kind is Cmd.REF for c in rtl) >= 1
    assert fast == rtl
    e_rtl = trace_energy(rtl, cfg, end_cycle=run.cycles)
    e_fast = trace_energy(fast, cfg, end_cycle=res.cycles)
    print(f"\nddr4-3200-tiny random x4000: RTL {e_rtl.total_pj:.1f} pJ, fast {e_fast.total_pj:.1f} pJ, "
          f"{e_fast.pj_per_bit():.3f} pJ/bit")
    assert e_fast.total_pj == e_rtl.total_pj
    no_ref = trace_energy([c for c in fast if c.kind is not Cmd.REF], cfg, end_cycle=res.cycles)
    assert not math.isclose(no_ref.total_pj, e_rtl.total_pj, rel_tol=1e-6)


@pytest.mark.parametrize("cfg", [DDR4_3200_TINY, LPDDR5X_8533_TINY], ids=lambda c: c.name)
def test_recorded_stream_is_the_models_schedule(cfg):
    rng = np.random.default_rng(3)
    model = DRAMPerfModel(cfg)
    n = 1200
    addrs = rng.integers(0, model.amap.bursts, n)
    writes = np.repeat(rng.random(n // 4) < 0.3, 4)
    res, cmds = record_stream(model, addrs, writes)
    kernel = model.simulate(addrs, writes)
    assert (res.cycles, res.acts, res.pres, res.refs) == (kernel.cycles, kernel.acts, kernel.pres, kernel.refs)
    cols = [c for c in cmds if c.kind in (Cmd.RD, Cmd.WR)]
    assert sorted(c.cycle for c in cols) == sorted(kernel.col_cycles.tolist())
    assert sum(c.kind is Cmd.WR for c in cols) == int(writes.sum())
    v = check_trace(cmds, cfg, end_cycle=res.cycles - 1)
    assert not v, describe(v[:10])


@pytest.mark.parametrize("cfg", [DDR4_3200, LPDDR5X_8533], ids=lambda c: c.name)
@pytest.mark.parametrize("pattern", ["seq", "random"])
def test_outside_model_difference_explained(cfg, pattern):
    model = DRAMPerfModel(cfg)
    n = 6000
    addrs = np.arange(n) if pattern == "seq" else np.random.default_rng(1).integers(0, model.amap.bursts, n)
    res, cmds = record_stream(model, addrs)
    ours = trace_energy(cmds, cfg, end_cycle=res.cycles)
    outside = energydram_energy(cmds, cfg, end_cycle=res.cycles)
    diff = ours.total_pj - outside["total_pj"]
    print(f"\n{cfg.name} {pattern}: ours {ours.pj_per_bit():.3f} pJ/bit, energydram "
          f"{outside['total_pj'] / ours.dq_bits:.3f} pJ/bit ({100 * diff / outside['total_pj']:+.3f} %)")
    assert diff == pytest.approx(explained_difference(outside, cfg), rel=1e-9, abs=1e-6)
    assert abs(diff) / outside["total_pj"] < 0.01
    # the explained terms are not vacuous: a doubled IDD3N in ours alone is not explained
    bad = trace_energy(cmds, cfg, power_spec(cfg).scaled(2.0, "idd3n"), end_cycle=res.cycles)
    assert not math.isclose(bad.total_pj - outside["total_pj"], explained_difference(outside, cfg), rel_tol=1e-3)


def test_owed_refresh():
    """An idle channel over two refresh intervals owes ranks x 2 REFs; a trace that issued them owes none."""
    from sim.energy.dram import owed_refresh_pj
    cfg = DDR4_3200
    tm = cfg.timing
    ce = command_energy(cfg)
    idle = trace_energy([], cfg, end_cycle=2 * tm.tREFI)
    assert owed_refresh_pj(idle, cfg) == pytest.approx(4 * (ce.ref + tm.tRFC * (ce.act_stby - ce.pre_stby)))
    refs = [T(k * tm.tREFI + r, Cmd.REF, r) for k in range(2) for r in range(2)]
    assert owed_refresh_pj(trace_energy(refs, cfg, end_cycle=2 * tm.tREFI), cfg) == 0
