"""Lock-step pipeline with ``amaranth.lib.stream`` handshakes, shared by every FP unit.

All stage registers advance together when the output register is empty or being read
(``advance = ~o.valid | o.ready``) and the input is ready exactly when the pipeline advances; a stage's
datapath registers load only when it advances with a valid item. This gives one
operation per cycle at a fixed latency (the number of :meth:`Pipeline.stage` calls), holds ``o.payload``
stable while ``o.valid & ~o.ready`` as the stream rules require, and has no combinational path from
``i.payload``/``i.valid`` to ``o`` (only ``o.ready -> i.ready``). Datapath registers have no reset; valid bits do.

Clock-gated stages (``stage_domains``): a unit may put each stage's datapath registers (one register per stage)
in a clock domain of its parent's choosing, a gated clock (:func:`gated_domain`) whose enable includes the
stage's load (``stage_load``, exported for it). A stage after the first is written in every tick of its clock in
which the pipeline advances: in a cycle the stage loads, with what it loads; otherwise (a gate shared by several
units) with values no valid bit follows, while what the stage held has moved on or was not valid. So the unit
computes the same bits in the same cycles, and Verilator evaluates the logic feeding a stage only on the edges
of its sources' clocks (docs/pim_bank_pu.md, "Clock gating"). The first stage is written only when it loads
(``load_first=True``, the default: Verilator then evaluates its logic only in those cycles, which pays when the
unit's inputs come from registers that change every cycle) or like the others (``load_first=False``: when the
inputs come from gated registers too); both are exact.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, ClockDomain, ClockSignal, Signal, Value
from amaranth.lib import data

__all__ = ["Pipeline", "stream_layout", "gated_domain"]


def stream_layout(fields: dict, user_width: int = 0) -> data.StructLayout:
    """A payload layout with ``fields`` from the LSB up, plus a ``user`` sideband when ``user_width > 0``."""
    fields = dict(fields)
    if user_width < 0:
        raise ValueError(f"user_width must be >= 0, got {user_width}")
    if user_width:
        fields["user"] = user_width
    return data.StructLayout(fields)


class Pipeline:
    """Builds the stage registers of a fixed-latency unit between input stream ``i`` and output ``o``.

    ``user`` (optional) is a sideband value carried unchanged alongside the operands; it arrives at
    ``o.payload.user`` with the result. Call :meth:`stage` once per register stage, then :meth:`output`.
    """

    def __init__(self, m, i, o, *, user=None, stage_domains=None, stage_load=None, load_first=True):
        self.m = m
        # stage n's datapath registers in domain stage_domains[n - 1] (module docstring); stage_load[n - 1] (a
        # Signal, optional) is driven with the stage's load condition
        self._domains = list(stage_domains) if stage_domains is not None else None
        self._loads = list(stage_load) if stage_load is not None else None
        self._load_first = bool(load_first)
        self.i = i
        self.o = o
        self.advance = Signal()
        m.d.comb += [self.advance.eq(~o.valid | o.ready), i.ready.eq(self.advance)]
        self._valid = i.valid
        self._user = user
        self.latency = 0

    def stage(self, **values) -> SimpleNamespace:
        """Register ``values`` (name -> value) into stage ``latency + 1``; returns the registers by name."""
        m, n = self.m, self.latency + 1
        valid = Signal(name=f"s{n}_valid")
        with m.If(self.advance):
            m.d.sync += valid.eq(self._valid)
        # Datapath registers load only with a valid item (no switching on bubbles); what an invalid stage holds
        # is never read (o.payload matters only with o.valid).
        load = Signal(name=f"s{n}_load")
        m.d.comb += load.eq(self.advance & self._valid)
        if self._loads is not None:
            m.d.comb += self._loads[n - 1].eq(load)
        if self._domains is not None:
            if n > 1 or not self._load_first:
                load = self.advance       # every tick in which the pipeline advances (a constant 1 if o.ready is)
            # one register for the whole stage (fields are slices of it): one variable for a simulator to copy
            regs = self._packed_register(f"s{n}", values, load, self._domains[n - 1])
        else:
            regs = {}
            for key, value in values.items():
                regs[key] = self._register(f"s{n}_{key}", value, load)
            if self._user is not None:
                self._user = self._register(f"s{n}_user", self._user, load)
        self._valid = valid
        self.latency = n
        return SimpleNamespace(**regs)

    def _packed_register(self, name, values, load, domain):
        """One register ``name`` holding ``values`` (and ``user``) in ``domain``, written when ``load``; returns the
        fields (slices of it, Views where the values are Views)."""
        fields = dict(values)
        if self._user is not None:
            fields["user"] = self._user
        flat = [Value.cast(v) for v in fields.values()]
        reg = Signal(sum(len(v) for v in flat), name=name, reset_less=True)
        with self.m.If(load):
            self.m.d[domain] += reg.eq(Cat(*flat))
        regs, off = {}, 0
        for (key, value), v in zip(fields.items(), flat):
            part = reg[off:off + len(v)]
            off += len(v)
            if isinstance(value, data.View):
                regs[key] = data.View(value.shape(), part)
            else:
                regs[key] = part.as_signed() if v.shape().signed else part
        if self._user is not None:
            self._user = regs.pop("user")
        return regs

    def _register(self, name, value, load):
        if isinstance(value, data.View):
            reg = Signal(value.shape(), name=name, reset_less=True)
        else:
            value = Value.cast(value)
            reg = Signal(value.shape(), name=name, reset_less=True)
        with self.m.If(load):
            self.m.d.sync += reg.eq(value)
        return reg

    def output(self, **fields):
        """Drive ``o`` from the last stage: ``fields`` name -> value for ``o.payload``; ``user`` is added."""
        if self.latency == 0:
            raise ValueError("a pipeline needs at least one register stage before its output")
        for what, given in (("stage_domains", self._domains), ("stage_load", self._loads)):
            if given is not None and len(given) != self.latency:
                raise ValueError(f"{what} has {len(given)} entries for a pipeline of {self.latency} stages")
        m, o = self.m, self.o
        m.d.comb += o.valid.eq(self._valid)
        for key, value in fields.items():
            m.d.comb += getattr(o.payload, key).eq(value)
        if self._user is not None:
            m.d.comb += o.payload.user.eq(self._user)


def _stage_gating(stage_domains, latency):
    """A unit's ``stage_domains`` argument checked: (the list or None, the stage-load Signals or None)."""
    if stage_domains is None:
        return None, None
    domains = list(stage_domains)
    if len(domains) != latency or not all(isinstance(d, str) and d for d in domains):
        raise ValueError(f"stage_domains must name {latency} clock domains (one per stage), got {stage_domains!r}")
    return domains, [Signal(name=f"s{n + 1}_load_out") for n in range(latency)]


def gated_domain(m, name, enable):
    """Add to ``m`` the clock domain ``name`` (local, no reset): ``sync``'s clock gated by ``enable`` through an
    integrated clock gate -- ``enable`` sampled while the clock is low (the gate's latch; here a negative-edge
    register, in the local domain ``<name>_icg``) and ANDed with the clock. The gated clock has no glitch, and its
    rising edges are those of ``sync`` in the cycles whose ``enable`` was high before the edge. Returns it.

    Not for Amaranth's simulator: it updates the gated domain's registers one delta cycle after ``sync``'s,
    from values ``sync`` has already changed (a race Verilog's non-blocking assignments do not have)."""
    icg = ClockDomain(f"{name}_icg", clk_edge="neg", local=True, reset_less=True)
    cd = ClockDomain(name, local=True, reset_less=True)
    m.domains += [icg, cd]
    latched = Signal(name=f"{name}_en")
    m.d.comb += icg.clk.eq(ClockSignal())
    m.d[icg.name] += latched.eq(enable)
    m.d.comb += cd.clk.eq(ClockSignal() & latched)
    return cd

