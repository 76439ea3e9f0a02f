# amaranth: UnusedElaboratable=no
"""AdderUnit (hdl/pim/adder_unit.py): tree and accumulator modes bit-exact vs sim/golden/pim_rank, mode
switches, the slot hazard, throughput and latency."""

import numpy as np
import pytest

from hdl.pim.adder_unit import AdderUnit
from hdl.pim.config import PAPER, TINY
from sim.backends import Traffic, stream_ports
from sim.golden.pim_rank import score_tree, aggregate
from fp_util import FP16_EDGE

CONFIGS = {"amaranth": TINY, "verilator": PAPER}


def fp16_values(rng, shape, edge=0.2):
    x = (4 * rng.standard_normal(shape)).astype(np.float16).view(np.uint16)
    pick = rng.random(shape) < edge
    x[pick] = rng.choice(FP16_EDGE, int(pick.sum()))
    return x


def item(unit, data, mode, idx=0, first=0, last=0):
    d = sum(int(v) << (16 * k) for k, v in enumerate(data))
    return unit.in_layout.const({"data": d, "mode": mode, "idx": idx, "first": first, "last": last}
                                ).as_value().value


def unpack(unit, word):
    n = 16 * unit.lanes
    return ([(word >> (16 * k)) & 0xFFFF for k in range(unit.lanes)], (word >> n) & 1,
            (word >> (n + 1)) & ((1 << unit.idx_bits) - 1))


def tree_job(unit, rng, tokens):
    p = fp16_values(rng, (tokens, unit.chips))
    items = [item(unit, list(row) + [0x1111] * (unit.lanes - unit.chips), unit.TREE) for row in p]
    want = [([int(s)] + [0] * (unit.lanes - 1), unit.TREE, 0) for s in score_tree(p)]
    return items, want


def acc_job(unit, rng, G, order="g-major"):
    """Final aggregation of one head: one lane per adder (acc[c, g, e], c = chip for PAPER); items g-major (as the DQ links deliver)
    or element-major (every item hits the slot just written: the hazard path)."""
    S, N, pad = unit.slots, unit.adders, [0] * (unit.lanes - unit.adders)
    acc = fp16_values(rng, (N, G, S))
    out = aggregate(acc).reshape(N, S)
    pairs = [(g, e) for g in range(G) for e in range(S)] if order == "g-major" else \
        [(g, e) for e in range(S) for g in range(G)]
    items = [item(unit, list(acc[:, g, e]) + pad, unit.ACC, e, g == 0, g == G - 1) for g, e in pairs]
    done = [e for g, e in pairs if g == G - 1]
    want = [([int(v) for v in out[:, e]] + pad, unit.ACC, e) for e in done]
    return items, want


def run_check(backend, unit, items, want, traffic=None):
    run = backend.run_streams(unit, {"i": items}, {"o": len(want)}, traffic=traffic)
    got = [unpack(unit, w) for w in run.outputs["o"]]
    for k, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"output {k}: {g} != {w}"
    return run


def test_adder_unit_modes(backend):
    """Tree items, an aggregation (g-major and element-major orders), tree again: full rate and random
    valid gaps / backpressure."""
    unit = AdderUnit(CONFIGS[backend.name])
    rng = np.random.default_rng(3)
    items, want = [], []
    for job in (lambda: tree_job(unit, rng, 40), lambda: acc_job(unit, rng, unit.config.token_sets),
                lambda: acc_job(unit, rng, 3, "e-major"), lambda: tree_job(unit, rng, 9),
                lambda: acc_job(unit, rng, 1), lambda: tree_job(unit, rng, 5)):
        i, w = job()
        items += i
        want += w
    run_check(backend, unit, items, want)
    for seed in range(2):
        run_check(backend, unit, items, want, Traffic.random(stream_ports(unit), seed=seed))


def test_adder_unit_timing(backend):
    """Tree: one token per cycle after tree_latency; acc g-major: one item per cycle; element-major waits
    for every add (FPAdd latency per item)."""
    unit = AdderUnit(CONFIGS[backend.name])
    rng = np.random.default_rng(4)
    items, want = tree_job(unit, rng, 64)
    assert run_check(backend, unit, items, want).cycles == 64 + unit.tree_latency
    assert run_check(backend, unit, items[:1], want[:1]).cycles == 1 + unit.tree_latency
    G, S = unit.config.token_sets, unit.slots
    items, want = acc_job(unit, rng, G)
    assert run_check(backend, unit, items, want).cycles == G * S + unit.acc_latency
    items, want = acc_job(unit, rng, G, "e-major")
    cyc = run_check(backend, unit, items, want).cycles
    assert cyc == S * (1 + (G - 1) * (unit.acc_latency + 1)) + unit.acc_latency - 1 + 1, cyc
    print(f"\n[{backend.name}] tree latency {unit.tree_latency}, acc latency {unit.acc_latency}, "
          f"element-major aggregation {cyc} cycles")


def test_adder_unit_bad_config():
    from dataclasses import replace
    from hdl.memctl.timing import DRAMConfig
    with pytest.raises(ValueError, match="config must be a PIMConfig"):
        AdderUnit(object())
    org = replace(TINY.dram.org, devices_per_rank=1)
    cfg = replace(TINY, dram=DRAMConfig(name="x", org=org, timing=TINY.dram.timing), head_dim=16)
    with pytest.raises(ValueError, match="chips = 1 must be a power of two"):
        AdderUnit(cfg)
    # accumulator mode adds chip c's context lane on adder c: fewer adders than chips would drop the last chips'
    # lanes (acc_data is the adders' outputs), so PIMConfig refuses it, though the score tree needs only chips - 1
    from hdl.pim.config import PAPER
    with pytest.raises(ValueError, match="rank_adders = 7 < chips = 8"):
        replace(PAPER, rank_adders=7)
    assert replace(PAPER, rank_adders=8).rank_adders == 8


def test_adder_unit_lint(tmp_path):
    from sim.backends.verilog import write_verilog, lint
    paths = write_verilog(tmp_path, {"pim_adder_unit": lambda: AdderUnit(PAPER)})
    assert lint(paths) == []
