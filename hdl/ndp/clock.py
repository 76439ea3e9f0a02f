"""Clock enable of the NDP core: the core's domain advances ``num`` of every ``den`` cycles of the memory clock.

PLoRA's core runs at 1 GHz ([PLoRA] line ~177); the LPDDR5X-8533 device memory's command clock CK is
1066.7 MHz (``hdl/memctl/timing.py``): exactly 15/16 (``hdl.ndp.config.CORE_CLOCK_RATIO``). The one-domain RTL
simulation runs the core as a clock-enabled domain of CK; a chip would clock the core separately and cross the
memory streams with asynchronous FIFOs. The enable is spread evenly (an accumulator adds ``num`` each cycle and
enables the cycle it wraps past ``den``), so over any ``den`` consecutive cycles it is high exactly ``num``
times.
"""

from amaranth.hdl import Module, Signal, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

__all__ = ["ClockEnable"]


class ClockEnable(wiring.Component):
    """``ce`` high ``num`` of every ``den`` cycles (1 <= num <= den). Port: ``ce`` (Out(1))."""

    def __init__(self, num: int, den: int):
        if isinstance(num, bool) or isinstance(den, bool) or not isinstance(num, int) or not isinstance(den, int) \
                or not 1 <= num <= den or den > 1 << 16:
            raise ValueError(f"clock ratio must be integers 1 <= num <= den <= 65536, got {num}/{den}")
        self.num, self.den = num, den
        super().__init__({"ce": Out(1)})

    def elaborate(self, platform):
        m = Module()
        acc = Signal(range(self.den))
        nxt = acc + self.num
        m.d.comb += self.ce.eq(nxt >= self.den)
        m.d.sync += acc.eq(Mux(nxt >= self.den, nxt - self.den, nxt))
        return m
