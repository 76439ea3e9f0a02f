# amaranth: UnusedElaboratable=no
"""The shared normalizer (hdl/fp/round.py): the logarithmic shifter against the definition (shift left by the
leading-zero count; a zero significand keeps its exponent), for every width the FP units use and a few more."""
import random

import pytest
from amaranth.sim import Simulator

from hdl.fp.round import Normalizer


def reference(sig, exp, width):
    if sig == 0:
        return 0, exp
    count = width - sig.bit_length()
    return (sig << count) & ((1 << width) - 1), exp - count


# 11 / 14 / 15: FP16 (div, add); 22: the FP16 product; 24 / 27 / 28: FP32; 1, 2, 3, 5: odd and tiny widths
@pytest.mark.parametrize("width", [1, 2, 3, 5, 11, 14, 15, 22, 24, 27, 28, 48])
def test_normalizer_matches_leading_zero_shift(width):
    rng = random.Random(width)
    values = {0, 1, (1 << width) - 1} | {1 << k for k in range(width)} | {(1 << k) - 1 for k in range(width)}
    values |= {rng.getrandbits(width) for _ in range(150)}
    if width <= 8:
        values = set(range(1 << width))
    dut = Normalizer(sig_width=width, exp_width=11)
    bad = []

    async def bench(ctx):
        for v in sorted(values):
            for e in (-900, -7, 0, 1, 300, 1023):   # e - count stays inside the 11-bit signed range
                ctx.set(dut.sig, v)
                ctx.set(dut.exp, e)
                got = (ctx.get(dut.sig_out), ctx.get(dut.exp_out))
                if got != reference(v, e, width):
                    bad.append((v, e, got, reference(v, e, width)))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    assert not bad, f"width {width}: {len(bad)} mismatches, first {bad[:3]}"
