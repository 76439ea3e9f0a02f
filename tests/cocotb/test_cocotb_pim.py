# amaranth: UnusedElaboratable=no
"""cocotb runs of the DIMM-PIM tops' generated Verilog (``pim_stream_tb.py`` drives them) against the golden
models: the bank PU (score and context jobs, edge values) under random valid gaps and backpressure; the re-layout
unit on write-data clocks with gaps (no backpressure: a DDR data bus cannot stall); the rank PU's adder unit (chip
trees and context aggregation), chunk softmax unit (e / m / head outputs) and normalizer."""

import numpy as np

from hdl.tops import PIM_TOPS
from hdl.pim.bank_pu import MODE_SCORE, MODE_CONTEXT
from sim.golden import pim_bank
from fp_util import FP16_EDGE
from cocotb_util import run_top


def _run(monkeypatch, name, dut, inputs, outputs, seed, ready_prob=0.6):
    """Run ``pim_stream_tb`` on ``dut``; ``outputs``: {port: (expected payloads, mask)}."""
    run_top(monkeypatch, name, dut, "pim_stream_tb", "PIM_TB_VECTORS", {
        "unit": name, "inputs": inputs,
        "outputs": {p: {"expected": [int(x) for x in e], "mask": m} for p, (e, m) in outputs.items()},
        "seed": seed, "valid_prob": 0.7, "ready_prob": ready_prob, "max_cycles": 60 * len(inputs) + 2000})


def _fp16(rng, shape, edge_frac=0.1):
    x = rng.standard_normal(shape).astype(np.float16).view(np.uint16)
    pick = rng.random(shape) < edge_frac
    x[pick] = rng.choice(FP16_EDGE, int(pick.sum()))
    return x


def _word(elems):
    return sum(int(v) << (16 * j) for j, v in enumerate(elems))


def test_bank_pu_top(monkeypatch):
    """Score tokens (bpt bursts each) and context jobs of several tokens, interleaved."""
    dut = PIM_TOPS["pim_bank_pu"]()
    cfg, n = dut.config, dut.lanes
    rng = np.random.default_rng(21)
    jobs = [(MODE_SCORE, cfg.bursts_per_token)] * 12 + [(MODE_CONTEXT, 9), (MODE_SCORE, 1), (MODE_CONTEXT, 30)] \
        + [(MODE_SCORE, cfg.bursts_per_token), (MODE_CONTEXT, 2)] * 6
    modes, firsts, lasts = [], [], []
    for mode, items in jobs:
        modes += [mode] * items
        firsts += [1] + [0] * (items - 1)
        lasts += [0] * (items - 1) + [1]
    k = len(modes)
    row, bcast = _fp16(rng, (k, n)), _fp16(rng, (k, n))
    sel = rng.integers(0, cfg.token_sets, k)
    want = pim_bank.run_items(row, bcast, sel, modes, firsts, lasts)
    inputs = [dut.i_layout.const({"row": _word(row[i]), "bcast": _word(bcast[i]), "sel": int(sel[i]),
                                  "mode": modes[i], "first": firsts[i], "last": lasts[i]}).as_value().value
              for i in range(k)]
    expected = [w | (m << (16 * n)) for w, m in want]
    _run(monkeypatch, "pim_bank_pu", dut, inputs, {"o": (expected, (1 << (16 * n + 1)) - 1)}, seed=4)


def test_relayout_top(monkeypatch):
    """Random write-data clocks with gaps between them: each valid clock comes out re-laid out (docs/pim.md 4.1)."""
    from hdl.pim.relayout import relayout_words
    dut = PIM_TOPS["pim_relayout"]()
    bits = dut.config.dram.org.clock_bits
    rng = np.random.default_rng(3)
    words = [int.from_bytes(rng.bytes(bits // 8), "little") for _ in range(400)]
    _run(monkeypatch, "pim_relayout", dut, words, {"o": (relayout_words(words, dut.config), (1 << bits) - 1)}, seed=8,
         ready_prob=1.0)


def test_adder_unit_top(monkeypatch):
    """Chip-tree tokens, then one head's context aggregation (token set outer, slot inner), then trees again."""
    from sim.golden.pim_rank import score_tree, aggregate
    dut = PIM_TOPS["pim_adder_unit"]()
    rng = np.random.default_rng(12)
    lanes, chips = dut.lanes, dut.chips
    mask = (1 << (16 * lanes)) - 1

    def item(data, mode, idx=0, first=0, last=0):
        return dut.in_layout.const({"data": _word(data), "mode": mode, "idx": idx, "first": first, "last": last}
                                   ).as_value().value

    inputs, expected = [], []
    for tokens in (40, 7):
        p = _fp16(rng, (tokens, chips))
        inputs += [item(list(r) + [0] * (lanes - chips), dut.TREE) for r in p]
        expected += [int(s) for s in score_tree(p)]
        G, S, N = dut.config.token_sets, dut.slots, dut.adders
        acc = _fp16(rng, (N, G, S))
        out = aggregate(acc).reshape(N, S)
        inputs += [item(list(acc[:, g, e]) + [0] * (lanes - N), dut.ACC, e, g == 0, g == G - 1)
                   for g in range(G) for e in range(S)]
        expected += [_word(list(out[:, e]) + [0] * (lanes - N)) for e in range(S)]
    _run(monkeypatch, "pim_adder_unit", dut, inputs, {"o": (expected, mask)}, seed=6)


def test_softmax_and_normalizer_tops(monkeypatch):
    """Four heads (one with a single real token in its last chunk) through the chunk softmax unit; their
    exponentials through the normalizer."""
    from sim.golden.pim_rank import chunk_softmax, normalize
    sm, nm = PIM_TOPS["pim_softmax"](), PIM_TOPS["pim_normalizer"]()
    ch = sm.config.chunk
    rng = np.random.default_rng(13)
    items, e_want, m_want, head_want, norm_in, p_want = [], [], [], [], [], []
    for L in (64, 17, 40, 33):
        n = -(-L // ch)
        s = np.full(n * ch, 0x1234, np.uint16)
        s[:L] = (3 * rng.standard_normal(L)).astype(np.float16).view(np.uint16)
        g = chunk_softmax(s, L)
        items += [int(s[t]) | (int(t >= L) << 16) | (int(t // ch == n - 1) << 17) for t in range(n * ch)]
        e_want += [int(x) for x in g["e"]]
        m_want += [int(x) for x in g["m"]]
        head_want.append(int(g["M"]) | (int(g["z_m"]) << 16) | ((int(g["s"]) & 0x1FF) << 32) | (int(g["Z"]) << 41))
        p = normalize(g["e"], g["m"], g["M"], g["z_m"], g["s"], L)
        for t in range(n * ch):
            norm_in.append(nm.i.payload.shape().const({
                "e": int(g["e"][t]), "m": int(g["m"][t // ch]), "M": int(g["M"]), "z_m": int(g["z_m"]),
                "s": int(g["s"]), "pad": int(t >= L)}).as_value().value)
        p_want += [int(x) for x in p]
    _run(monkeypatch, "pim_softmax", sm, items, {"e": (e_want, 0xFFFF), "m": (m_want, 0xFFFF),
                                             "head": (head_want, (1 << 73) - 1)}, seed=9)
    _run(monkeypatch, "pim_normalizer", nm, norm_in, {"o": (p_want, 0xFFFF)}, seed=10)
