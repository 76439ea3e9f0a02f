# amaranth: UnusedElaboratable=no
"""ClockEnable (hdl/ndp/clock.py): high exactly num of every den cycles, spread evenly."""

import pytest
from amaranth.sim import Simulator

from hdl.ndp.clock import ClockEnable
from hdl.ndp.config import CORE_CLOCK_RATIO


def pattern(num, den, cycles):
    dut = ClockEnable(num, den)
    out = []

    async def tb(ctx):
        for _ in range(cycles):
            out.append(ctx.get(dut.ce))
            await ctx.tick()
    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(tb)
    sim.run()
    return out


@pytest.mark.parametrize("num,den", [CORE_CLOCK_RATIO, (3, 5), (1, 4), (7, 7)])
def test_ratio_exact_over_every_window(num, den):
    p = pattern(num, den, 4 * den)
    for start in range(len(p) - den + 1):
        assert sum(p[start:start + den]) == num        # any den consecutive cycles: exactly num enabled
    if num < den:
        # evenly spread: never two disabled cycles closer than floor(den / (den - num))
        lows = [i for i, v in enumerate(p) if not v]
        assert min(b - a for a, b in zip(lows, lows[1:])) >= den // (den - num)


def test_core_clock_is_15_of_16():
    p = pattern(*CORE_CLOCK_RATIO, 64)
    assert CORE_CLOCK_RATIO == (15, 16) and p.count(0) == 4


def test_bad_ratio():
    for num, den in ((0, 4), (5, 4), (1.5, 2), (True, 2)):
        with pytest.raises(ValueError, match="num <= den"):
            ClockEnable(num, den)
