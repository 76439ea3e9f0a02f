"""Re-layout unit (hdl/pim/relayout.py): the golden bit exchange against docs/pim.md, the chip-level placement,
and the RTL cycle by cycle (Amaranth) and as a stream run on both engines, compared bit for bit with the golden."""

import dataclasses

import numpy as np
import pytest

from amaranth.sim import Simulator

from hdl.pim.config import PAPER, TINY
from hdl.pim.relayout import (Relayout, relayout_words, inverse_relayout_words, relayout_burst,
                              inverse_relayout_burst, chip_burst, chip_elements, host_burst)
from sim.backends import Traffic

CONFIGS = [PAPER, TINY, dataclasses.replace(PAPER, name="paper-lat2", relayout_latency=2)]


def rand_words(rng, n, bits):
    return [int.from_bytes(rng.bytes(bits // 8), "little") for _ in range(n)]


# ---- golden ------------------------------------------------------------------------------------------------------

def test_golden_exchange_of_one_pair():
    # docs/pim.md: A0..A3 in bytes (0,1)..(6,7) of beat A, B0..B3 in beat B; out beat 0 byte k = low byte of
    # element k, out beat 1 byte k = high byte of element k.
    elems = [0xA0A0 + 0x0101 * i for i in range(4)] + [0xB0B0 + 0x0101 * i for i in range(4)]  # A0..A3, B0..B3
    word = int.from_bytes(np.array(elems, dtype="<u2").tobytes(), "little")
    out = relayout_words([word], PAPER)[0].to_bytes(16, "little")
    assert list(out[:8]) == [e & 0xFF for e in elems]
    assert list(out[8:]) == [e >> 8 for e in elems]
    assert list(relayout_words([0x03020100], TINY)[0].to_bytes(4, "little")) == [0, 2, 1, 3]


@pytest.mark.parametrize("cfg", [PAPER, TINY], ids=lambda c: c.name)
def test_golden_inverse_and_chip_placement(cfg):
    rng = np.random.default_rng(3)
    org = cfg.dram.org
    words = rand_words(rng, 50, org.clock_bits)
    assert inverse_relayout_words(relayout_words(words, cfg), cfg) == words
    C, E = cfg.chips, org.burst_length // 2
    for _ in range(20):
        burst = int.from_bytes(rng.bytes(org.burst_bytes), "little")
        stored = relayout_burst(burst, cfg)
        assert inverse_relayout_burst(stored, cfg) == burst
        # the burst is its clock words in order: burst- and word-level golden agree
        nw = org.burst_cycles
        mask = (1 << org.clock_bits) - 1
        parts = relayout_words([(burst >> (k * org.clock_bits)) & mask for k in range(nw)], cfg)
        assert sum(p << (k * org.clock_bits) for k, p in enumerate(parts)) == stored
        host = np.frombuffer(burst.to_bytes(org.burst_bytes, "little"), dtype="<u2")
        el = chip_elements(stored, cfg)
        for c in range(C):
            # chip c's 64-bit burst = its byte of beats 0..7 = 4 whole FP16 elements: host elements c, c+C, ...
            cb = chip_burst(stored, cfg, c)
            assert [(cb >> (16 * j)) & 0xFFFF for j in range(E)] == [int(host[C * j + c]) for j in range(E)]
            assert list(el[c]) == [int(host[C * j + c]) for j in range(E)]
        assert host_burst(el, cfg) == burst


def test_bad_parameters():
    with pytest.raises(ValueError, match="relayout_beats"):
        Relayout(dataclasses.replace(PAPER, relayout_beats=4))
    with pytest.raises(ValueError, match="PIMConfig"):
        Relayout(PAPER.dram)
    with pytest.raises(ValueError, match="shape"):
        host_burst(np.zeros((3, 4)), PAPER)
    with pytest.raises(ValueError, match="chip"):
        chip_burst(0, PAPER, 8)


# ---- RTL ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_rtl_cycle_exact(cfg):
    """Bursts of 4 clocks with random gaps, including back-to-back bursts: o(t + latency) = relayout(i(t)),
    o.valid(t + latency) = i.valid(t), payload 0 when not valid, i.ready always 1."""
    rng = np.random.default_rng(11)
    org = cfg.dram.org
    BC, L = org.burst_cycles, cfg.relayout_latency
    valid = []
    while len(valid) < 300:
        valid += [1] * BC * int(rng.integers(1, 4)) + [0] * int(rng.choice([0, 0, 1, 2, 5]))
    data = rand_words(rng, len(valid), org.clock_bits)
    dut = Relayout(cfg)
    seen = []

    async def tb(ctx):
        for t in range(len(valid) + L + 1):
            if t < len(valid):
                ctx.set(dut.i.valid, valid[t])
                ctx.set(dut.i.payload, data[t])
            else:
                ctx.set(dut.i.valid, 0)
            assert ctx.get(dut.i.ready) == 1
            seen.append((ctx.get(dut.o.valid), ctx.get(dut.o.payload)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(tb)
    sim.run()
    gold = relayout_words(data, cfg)
    for t, (v, d) in enumerate(seen):
        src = t - L
        exp_v = valid[src] if 0 <= src < len(valid) else 0
        assert v == exp_v, f"cycle {t}"
        assert d == (gold[src] if exp_v else 0), f"cycle {t}"
    # full rate: as many output clocks as input clocks, the same runs shifted by exactly the latency
    assert [v for v, _ in seen][L:L + len(valid)] == valid


def test_rtl_stream_run_both_engines(backend):
    """The same stream run on Amaranth and Verilator: bit-exact golden outputs; at full rate the last of n words
    leaves in cycle n + latency - 1 (so cycles = n + latency); with valid gaps the cycle count is the last
    input's acceptance + latency + 1 on both engines."""
    rng = np.random.default_rng(5)
    cfg = PAPER
    n = 400
    words = rand_words(rng, n, cfg.dram.org.clock_bits)
    r = backend.run_streams(Relayout(cfg), {"i": words}, {"o": n})
    assert r.outputs["o"] == relayout_words(words, cfg)
    assert r.cycles == n + cfg.relayout_latency
    pattern = rng.random(997) < 0.6
    r = backend.run_streams(Relayout(cfg), {"i": words}, {"o": n}, traffic=Traffic(valid={"i": pattern}))
    assert r.outputs["o"] == relayout_words(words, cfg)
    last_in = int(np.flatnonzero(np.resize(pattern, 10 * n))[n - 1])
    assert r.cycles == last_in + cfg.relayout_latency + 1


def test_lint_relayout(tmp_path):
    from sim.backends.verilog import write_verilog, lint
    paths = write_verilog(tmp_path, {"pim_relayout": lambda: Relayout(PAPER)})
    assert lint(paths) == []
