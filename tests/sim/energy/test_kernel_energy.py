"""NDP descriptor / kernel and DIMM-PIM head energy (sim/energy/ndp.py, sim/energy/pim.py; issue 33 items 3-4):
hand-computed cases, the PIM model's energy against the RTL's command trace (micro channel, Verilator), mutants
caught, bad input refused, and the bench figures' keys."""

from dataclasses import replace

import numpy as np
import pytest

from firmware.ndp.descriptor import gemv
from hdl.ndp.config import TINY
from sim.energy import ops
from sim.energy.dram import command_energy
from sim.energy.ndp import descriptor_counts, work_pj, bench_figures, kernel_energy, program_energy
from sim.energy.pim import (head_ops, head_commands, head_energy, launch_energy, trace_launch_energy,
                            pim_power_spec, EXP_OPS)
from sim.perf.pim import PIMPerfModel
from sim.pim.fused import micro


def test_gemv_descriptor_hand_computed():
    # GEMV x (1 x 64) A (64 x 16) on TINY: 1,024 MACs, each an FP16 multiply (1.1 pJ) and an FP32 add (0.9 pJ),
    # Horowitz ISSCC 2014 -> 2,048 pJ. SRAM (every TINY buffer <= 8 KB: 10 pJ per 64 bits): the DRAM ring takes the
    # 2,048 operand bytes once and gives them once (one pass of 1 row) = 32,768 bits -> 5,120 pJ; the input ring
    # 128 bytes in and out = 2,048 bits -> 320 pJ; the return ring 16 FP16 results in and out = 512 bits -> 80 pJ.
    d = gemv(0, 64, 16)
    c = descriptor_counts(d, TINY, 64)
    assert c["macs"] == 1024 and c["read_lines"] == 2048 // 64 and c["flops"] == 2048
    dp, sram = work_pj(c, TINY)
    assert dp == pytest.approx(2048.0)
    assert sram == pytest.approx(5120.0 + 320.0 + 80.0)
    # a mutant datapath (the accumulate charged in FP16) is caught by the hand figure
    assert work_pj(c, replace(TINY, acc="fp16"))[0] != pytest.approx(2048.0)


def test_pim_head_hand_computed():
    cfg = micro(16)
    L, d, chips = 60, cfg.head_dim, cfg.chips
    w = head_ops(cfg, L)
    # score and context MACs 2 L d multiplies + d normalization multiplies; L d score adds (FP16), L d context adds
    # (FP16 accumulators), (chips - 1)(L + d) rank-PU adds, 2 L softmax compare / subtract, L FP32 sums, L exps
    assert w["ops"]["fp16_mul"] == 2 * L * d + d
    assert w["ops"]["fp16_add"] == L * d + L * d + (chips - 1) * (L + d) + 2 * L
    assert w["ops"]["fp32_add"] == L and w["ops"]["int32_mul"] == 4 * L and w["flops"] == 4 * d * L
    m = PIMPerfModel(cfg)
    e = head_energy(m, L)
    hand = sum(n * ops.op_pj(k) for k, n in w["ops"].items())
    assert e.datapath_pj == pytest.approx(hand)
    # DRAM commands: every row an ACT_AB and a PREA (banks x ACT / PRE), every RD_AB banks x RD (docs/energy.md)
    cmds = head_commands(m, L)
    ce = command_energy(replace(cfg.dram, org=replace(cfg.dram.org, ranks=1)), pim_power_spec(cfg))
    rows = sum(c.kind.name == "ACT_AB" for c in cmds)
    rds = sum(c.kind.name == "RD_AB" for c in cmds)
    B = cfg.banks
    assert rds == m.head(L).rd_ab and rows == m.head(L).rows
    assert e.dram_command_pj == pytest.approx(rows * B * (ce.act + ce.pre) + rds * B * ce.rd)
    hand_cmd = rows * B * (ce.act + ce.pre) + rds * B * ce.rd
    # mutants: a doubled IDD0 or IDD4R in the rank's spec is caught by the hand figure
    import sim.energy.pim as P
    spec = pim_power_spec(cfg)
    for field in ("idd0", "idd4r"):
        rails = tuple(replace(r, **{field: 2 * getattr(r, field)}) for r in spec.rails)
        orig = P.pim_power_spec
        P.pim_power_spec = lambda c, _s=replace(spec, rails=rails): _s
        try:
            assert head_energy(m, L).dram_command_pj != pytest.approx(hand_cmd), field
        finally:
            P.pim_power_spec = orig


@pytest.fixture(scope="module")
def pim_rtl():
    """Two heads (L = 60, then 200) on the micro channel's RTL (Verilator; timing-only storage: the command stream
    does not depend on the data), as sim.pim.fused.rtl_cycles runs it."""
    from hdl.pim.mapping import head_layout
    from hdl.pim.rank_pu import RankPU, head_cycle_bound
    from sim.backends import get_backend
    from sim.dram.trace import decode_trace
    from sim.pim.fused import PIMChannelSystem, encode_launch, decode_done
    cfg = micro(16)
    comp = PIMChannelSystem(cfg, None, storage=False)
    out = []
    for L in (60, 200):
        lay = head_layout(cfg, L, 1)
        q = np.zeros(cfg.head_dim, np.uint16)
        run = get_backend("verilator").run_streams(
            comp, {"launch": [encode_launch(cfg, L, lay.k_row0[0], lay.v_row0[0], q)]},
            {"result": cfg.head_dim, "done": 1, "trace": None},
            max_cycles=4 * head_cycle_bound(cfg, L, drain=RankPU.drain_bound(cfg)) + 20000)
        trace = decode_trace(run.outputs["trace"], cfg.dram.org)
        done = decode_done(run.outputs["done"])[0]
        out.append((L, trace, done["cycle"] - trace[0].cycle + 1))
    return cfg, out


def test_pim_head_energy_model_within_1_percent_of_rtl(pim_rtl):
    cfg, runs = pim_rtl
    m = PIMPerfModel.calibrated(cfg)
    for L, trace, cycles in runs:
        rtl = trace_launch_energy(cfg, trace, [L], cycles)
        model = launch_energy(m, [L], m.head(L).cycles)
        err = (model["total"] - rtl["total"]) / rtl["total"]
        print(f"\nPIM head L={L}: RTL {rtl['total']:.0f} pJ ({cycles} cycles), model {model['total']:.0f} pJ "
              f"({m.head(L).cycles} cycles), {100 * err:+.3f} %")
        assert rtl["dram_command"] == pytest.approx(model["dram_command"])       # the same commands
        assert abs(err) <= 0.01
        # a model that drops the PREAs' energy is caught
        assert abs(model["total"] - sum(c.kind.name == "PREA" for c in trace) * cfg.banks
                   * command_energy(cfg.dram, pim_power_spec(cfg)).pre - rtl["total"]) > 0.01 * rtl["total"]


def test_bad_input_is_refused():
    m = PIMPerfModel(micro(16))
    with pytest.raises(ValueError, match=r"outside \[1, config.max_tokens = 256\]"):
        head_energy(m, 0)
    with pytest.raises(ValueError, match=r"L must be an int in 1\.\.256"):
        head_ops(m.config, 300)
    with pytest.raises(ValueError, match="cycles must be an int >= 0"):
        launch_energy(m, [8], -1)
    from sim.perf.ndp import NDPPerfModel
    nm = NDPPerfModel.paper()
    with pytest.raises(ValueError, match="allowed: e2, e3, e4, attention"):
        kernel_energy(nm, "gemm", 1, 2, 3)
    with pytest.raises(ValueError, match="positive integers"):
        kernel_energy(nm, "e3", 4096, 0, 1)
    with pytest.raises(ValueError, match="needs the device memory"):
        program_energy(NDPPerfModel(TINY), [gemv(0, 64, 16)])
    with pytest.raises(ValueError, match="allowed"):
        ops.op_pj("fp8_mul")


def test_exp_is_charged_as_its_units_operations():
    assert EXP_OPS == {"int32_mul": 4, "int32_add": 2}


def test_bench_figures():
    f = bench_figures()
    assert all(isinstance(v, (int, float)) and np.isfinite(v) for v in f.values())
    for k in ("gemv", "gemm", "attention"):
        assert f[f"ndp_{k}_pj_per_bit"] > 0 and f[f"ndp_{k}_pj_per_flop"] > 0
        assert f[f"ndp_{k}_total_pj"] == pytest.approx(f[f"ndp_{k}_dram_pj"] + f[f"ndp_{k}_datapath_pj"]
                                                         + f[f"ndp_{k}_sram_pj"])
    assert f["pim_head_pj_per_bit"] > 0 and f["pim_head_pj_per_flop"] > 0
    # a GEMM reuses every operand line over its batch: more FLOPs per bit than the GEMV
    assert f["ndp_gemm_pj_per_flop"] < f["ndp_gemv_pj_per_flop"]
