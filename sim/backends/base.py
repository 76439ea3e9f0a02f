"""One interface to run a stream testbench on a component under any simulation engine.

A *stream run* drives every input stream of a component with a list of payloads and collects a number of
payloads from every output stream, under per-cycle handshake patterns (:class:`Traffic`). Every backend
implements exactly the same per-cycle protocol, so the same run gives the same outputs **and the same cycle
count** on every engine:

* The design leaves reset; cycle ``t = 0`` is the first clock cycle after reset.
* In cycle ``t``, input port ``p`` that is not presenting an item starts presenting its next item (if any
  remain) when ``traffic.valid[p][t % len]`` is true; once presenting it holds ``valid`` and the payload
  until the item is accepted (stream rules). Output port ``q`` drives ``ready = traffic.ready[q][t % len]``.
* At the clock edge ending cycle ``t``, an input item is accepted if ``valid & ready``; an output payload is
  recorded if ``valid & ready``.
* An output port with a count of ``None`` is *collected whole*: every payload it hands over is recorded, and
  it does not take part in deciding when the run ends (command traces, error reports).
* The run ends after the edge on which the last expected output is recorded; ``cycles = t + 1``. A run that
  has not finished after ``max_cycles`` cycles raises :class:`SimulationTimeout` (a hang, not a slow test).
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from amaranth.hdl import Shape
from amaranth.lib import wiring, stream

__all__ = [
    "StreamPort", "stream_ports", "Traffic", "StreamRun", "Backend", "SimulationTimeout",
    "BACKENDS", "get_backend",
]


class SimulationTimeout(RuntimeError):
    """A stream run did not produce its expected outputs within ``max_cycles``."""


@dataclass(frozen=True)
class StreamPort:
    name: str
    direction: str  # "in" (driven by the testbench) or "out" (consumed by the testbench)
    width: int


def stream_ports(component: wiring.Component) -> list[StreamPort]:
    """The stream ports of ``component``, in signature order."""
    ports = []
    for name, member in component.signature.members.items():
        if not member.is_signature or not isinstance(member.signature, stream.Signature):
            continue
        width = Shape.cast(member.signature.members["payload"].shape).width
        # An In(stream) port is driven by the testbench (flipped signature: the component consumes it).
        direction = "in" if member.flow == wiring.In else "out"
        ports.append(StreamPort(name, direction, width))
    if not ports:
        raise ValueError(f"{type(component).__name__} has no amaranth.lib.stream ports")
    return ports


@dataclass(frozen=True)
class Traffic:
    """Per-cycle handshake patterns, repeated cyclically: ``valid`` per input port, ``ready`` per output port.

    A port without an entry is always valid (inputs) or always ready (outputs).
    """

    valid: dict = field(default_factory=dict)
    ready: dict = field(default_factory=dict)

    @classmethod
    def full_rate(cls) -> "Traffic":
        return cls()

    @classmethod
    def random(cls, ports: Sequence[StreamPort], *, seed: int, valid_prob: float = 0.7,
               ready_prob: float = 0.7, length: int = 4099) -> "Traffic":
        """Seeded random valid gaps on every input and backpressure on every output."""
        for name, prob in (("valid_prob", valid_prob), ("ready_prob", ready_prob)):
            if not 0.0 < prob <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {prob}")
        rng = np.random.default_rng(seed)
        valid, ready = {}, {}
        for port in ports:
            if port.direction == "in":
                valid[port.name] = rng.random(length) < valid_prob
            else:
                ready[port.name] = rng.random(length) < ready_prob
        return cls(valid=valid, ready=ready)

    def pattern(self, port: StreamPort) -> np.ndarray:
        table = self.valid if port.direction == "in" else self.ready
        pat = table.get(port.name)
        if pat is None:
            return np.ones(1, dtype=bool)
        pat = np.asarray(pat, dtype=bool)
        if pat.ndim != 1 or pat.size == 0:
            raise ValueError(f"traffic pattern for port {port.name!r} must be a non-empty 1-D array")
        return pat


@dataclass
class StreamRun:
    backend: str
    outputs: dict       # output port name -> list of int payloads, in arrival order
    cycles: int         # clock cycles from the end of reset to the last recorded output
    wall_seconds: float  # time spent simulating (excludes elaboration and compilation)

    def array(self, port: str, dtype=np.uint64) -> np.ndarray:
        return np.array(self.outputs[port], dtype=dtype)


class Backend(ABC):
    """A simulation engine. Obtain one with :func:`get_backend`."""

    name: str

    @abstractmethod
    def run_streams(self, component: wiring.Component, inputs: dict, expected: dict, *,
                    traffic: Traffic | None = None, max_cycles: int | None = None) -> StreamRun:
        """Run one stream testbench on a freshly reset ``component``.

        ``inputs``: input port name -> sequence of int payloads (every input port must be named; use an empty
        sequence for an idle port). ``expected``: output port name -> number of payloads to collect (ports not
        named are always ready and their payloads are dropped; ``None`` collects a port whole without making the
        run wait for it; at least one port needs a count). ``max_cycles`` defaults to a generous bound derived
        from the amount of traffic.
        """

    @staticmethod
    def _prepare(component, inputs, expected, traffic, max_cycles):
        ports = stream_ports(component)
        by_name = {p.name: p for p in ports}
        in_ports = [p for p in ports if p.direction == "in"]
        out_ports = [p for p in ports if p.direction == "out"]
        for name in inputs:
            if name not in by_name or by_name[name].direction != "in":
                raise ValueError(f"{name!r} is not an input stream of {type(component).__name__}; "
                                 f"inputs are {[p.name for p in in_ports]}")
        for name in expected:
            if name not in by_name or by_name[name].direction != "out":
                raise ValueError(f"{name!r} is not an output stream of {type(component).__name__}; "
                                 f"outputs are {[p.name for p in out_ports]}")
        missing = [p.name for p in in_ports if p.name not in inputs]
        if missing:
            raise ValueError(f"no input sequence for input stream(s) {missing}")
        data = {}
        for port in in_ports:
            items = [int(x) for x in inputs[port.name]]
            for x in items:
                if not 0 <= x < (1 << port.width):
                    raise ValueError(f"payload {x:#x} does not fit input stream {port.name!r} "
                                     f"({port.width} bits)")
            data[port.name] = items
        counts = {name: (None if n is None else int(n)) for name, n in expected.items()}
        for name, n in counts.items():
            if n is not None and n < 0:
                raise ValueError(f"expected count for {name!r} must be >= 0 or None, got {n}")
        if counts and all(n is None for n in counts.values()):
            raise ValueError("at least one output port needs an expected count to end the run")
        traffic = traffic or Traffic.full_rate()
        patterns = {p.name: traffic.pattern(p) for p in ports}
        if max_cycles is None:
            total = sum(len(v) for v in data.values()) + sum(n for n in counts.values() if n is not None)
            max_cycles = 64 * total + 10_000
        return in_ports, out_ports, data, counts, patterns, max_cycles


BACKENDS = ("amaranth", "verilator")


def get_backend(name: str) -> Backend:
    """``"amaranth"`` (Amaranth's Python simulator) or ``"verilator"`` (compiled C++ harness)."""
    if name == "amaranth":
        from .amaranth_sim import AmaranthBackend
        return AmaranthBackend()
    if name == "verilator":
        from .verilator import VerilatorBackend
        return VerilatorBackend()
    raise ValueError(f"unknown backend {name!r}; allowed: {list(BACKENDS)}")
