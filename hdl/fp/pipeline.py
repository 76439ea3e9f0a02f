"""Lock-step pipeline with ``amaranth.lib.stream`` handshakes, shared by every FP unit.

All stage registers advance together when the output register is empty or being read
(``advance = ~o.valid | o.ready``) and the input is ready exactly when the pipeline advances; a stage's
datapath registers load only when it advances with a valid item. This gives one
operation per cycle at a fixed latency (the number of :meth:`Pipeline.stage` calls), holds ``o.payload``
stable while ``o.valid & ~o.ready`` as the stream rules require, and has no combinational path from
``i.payload``/``i.valid`` to ``o`` (only ``o.ready -> i.ready``). Datapath registers have no reset; valid bits do.
"""

from types import SimpleNamespace

from amaranth.hdl import Signal, Value
from amaranth.lib import data

__all__ = ["Pipeline", "stream_layout"]


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

    def __init__(self, m, i, o, *, user=None):
        self.m = m
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
        regs = {}
        for key, value in values.items():
            regs[key] = self._register(f"s{n}_{key}", value, load)
        if self._user is not None:
            self._user = self._register(f"s{n}_user", self._user, load)
        self._valid = valid
        self.latency = n
        return SimpleNamespace(**regs)

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
        m, o = self.m, self.o
        m.d.comb += o.valid.eq(self._valid)
        for key, value in fields.items():
            m.d.comb += getattr(o.payload, key).eq(value)
        if self._user is not None:
            m.d.comb += o.payload.user.eq(self._user)
