"""The CXL NDP device test top (``sim.cxl.system.CXLSystem``) with per-descriptor cycle stamps.

:class:`StampedCXLSystem` wraps a ``CXLSystem`` and adds a free-running cycle counter (0 in the first cycle
after reset, the backends' cycle ``t``) and three observation streams, each one item per event carrying the
cycle (collect them whole: the wrapper never waits for their ``ready``):

* ``stamp_issue``: a ``hmem`` write the host marked was accepted by the device. The host marks the write of
  each submission's valid word (the ordering point of PLoRA IV-C's protocol: from then on the descriptor is
  the device's), so item ``k`` is the issue cycle of the ``k``-th submission.
* ``stamp_start``: the queue engine handed a descriptor to the NDP core (``core.desc`` handshake): descriptors
  reach the core in completion order, so item ``k`` belongs to the ``k``-th event that did not complete with
  a front-end status (a window violation never reaches the core).
* ``stamp_done``: the device posted a completion record (``events``), item ``k`` = event ``k``.

The ``hmem`` port carries one more payload bit than ``CXLSystem``'s, ``mark`` (the top bit), which is
stripped before the device sees the request. Everything else is the wrapped system's, unchanged.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out

__all__ = ["StampedCXLSystem", "STAMP_BITS"]

#: Width of a cycle stamp (2^40 cycles = 18 minutes at 1 GHz: no run of the project comes close).
STAMP_BITS = 40


class StampedCXLSystem(wiring.Component):
    """``inner``: a ``sim.cxl.system.CXLSystem`` (or anything with its ports and a ``device.core.desc``, e.g.
    ``sim.cxl.devmem_system.CXLDeviceMemSystem``: its ``design_key`` and ``verilog_modules`` are passed on)."""

    def __init__(self, inner):
        self.inner = inner
        self.regmap, self.layout = inner.regmap, inner.layout
        self.mem_addr_bits, self.config, self.depth = inner.mem_addr_bits, inner.config, inner.depth
        members = inner.signature.members
        hmem_layout = members["hmem"].signature.members["payload"].shape
        self.hmem_inner_bits = hmem_layout.size
        ports = {}
        for name, member in members.items():
            if name == "hmem":
                fields = {n: f.shape for n, f in hmem_layout}
                fields["mark"] = 1
                ports[name] = In(stream.Signature(data.StructLayout(fields)))
            else:
                ports[name] = member
        for name in ("stamp_issue", "stamp_start", "stamp_done"):
            ports[name] = Out(stream.Signature(STAMP_BITS))
        super().__init__(ports)

    def design_key(self) -> str:
        """The configuration that determines this design (with the sources: sim.e2e.design_cache)."""
        import hashlib
        inner = self.inner
        key = getattr(inner, "design_key", None)
        if callable(key):            # a system that names its own configuration (e.g. CXLDeviceMemSystem)
            return f"StampedCXLSystem({key()})"
        init = hashlib.sha256(repr(list(inner.memory.init)).encode()).hexdigest()[:16]
        return (f"StampedCXLSystem(CXLSystem(config={inner.config!r}, num_queues={inner.regmap.num_queues}, "
                f"depth={inner.depth}, latency={inner.memory.latency}, init={init}))")

    def verilog_modules(self) -> list:
        """The wrapped system's own Verilog modules (a hierarchical build), if it has any."""
        extra = getattr(self.inner, "verilog_modules", None)
        return list(extra()) if callable(extra) else []

    def elaborate(self, platform):
        m = Module()
        m.submodules.system = inner = self.inner
        for name, member in inner.signature.members.items():
            if name == "hmem":
                continue
            if member.flow == In:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(inner, name))
            else:
                wiring.connect(m, getattr(inner, name), wiring.flipped(getattr(self, name)))
        m.d.comb += [
            inner.hmem.valid.eq(self.hmem.valid),
            inner.hmem.payload.eq(self.hmem.payload.as_value()[:self.hmem_inner_bits]),
            self.hmem.ready.eq(inner.hmem.ready),
        ]
        cycle = Signal(STAMP_BITS)
        m.d.sync += cycle.eq(cycle + 1)
        core = inner.device.core
        m.d.comb += [
            self.stamp_issue.valid.eq(self.hmem.valid & self.hmem.ready & self.hmem.payload.mark),
            self.stamp_start.valid.eq(core.desc.valid & core.desc.ready),
            self.stamp_done.valid.eq(inner.events.valid),     # the device ignores events.ready
        ]
        for port in (self.stamp_issue, self.stamp_start, self.stamp_done):
            m.d.comb += port.payload.eq(cycle)
        return m
