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
* The run *completes* after the edge on which the last expected output is recorded; ``cycles = t + 1``. A run
  that has not completed after ``max_cycles`` cycles raises :class:`SimulationTimeout` (a hang, not a slow test).
* **Quiet window.** After completion the same protocol continues for ``quiet_cycles`` more cycles (inputs keep
  presenting any items left, outputs keep their ready patterns) while every output item is still recorded. Every
  output port emits exactly what it hands over in the whole run, window included (:attr:`StreamRun.emitted`); a
  port with an expected count that emitted more items than its count -- before completion, or in the window,
  i.e. after the design should be quiet -- fails the run with :class:`ExtraOutput`. ``cycles`` and ``outputs``
  do not depend on the window (a port collected whole keeps the items up to completion in ``outputs``).
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from amaranth.hdl import Shape
from amaranth.lib import wiring, stream

__all__ = [
    "StreamPort", "stream_ports", "Traffic", "StreamRun", "Backend", "SimulationTimeout", "ExtraOutput",
    "BACKENDS", "get_backend", "DEFAULT_QUIET_CYCLES",
]

#: Default length of the check window after completion (cycles): longer than the latency of every unit of the
#: project that a stream test drives (FP units <= 30, bank PU 17, the DRAM controller's read path ~45 at
#: DDR4-3200), so an item a design emits in response to its last input lands in the window.
DEFAULT_QUIET_CYCLES = 64


class SimulationTimeout(RuntimeError):
    """A stream run did not produce its expected outputs within ``max_cycles``."""


class ExtraOutput(AssertionError):
    """A design emitted more items on an output port than the run expected (before completion, or in the quiet
    window after it). ``run`` holds the :class:`StreamRun` (every emitted item), ``ports`` the offending port
    names."""

    def __init__(self, message, run=None, ports=()):
        super().__init__(message)
        self.run = run
        self.ports = tuple(ports)


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
    #: every output port (named in ``expected`` or not) -> every payload it handed over in the whole run,
    #: quiet window included, in arrival order
    emitted: dict = field(default_factory=dict)
    #: output port -> cycle (``t``) in which it handed over its first item beyond its expected count
    extra_cycle: dict = field(default_factory=dict)
    quiet_cycles: int = 0   # length of the check window that followed completion
    counts: dict = field(default_factory=dict)   # the run's ``expected`` counts (None: collected whole)
    #: CPU seconds of the simulation (the harness process for Verilator, this process for Amaranth): a speed
    #: figure that does not depend on how many other jobs share the machine's cores
    cpu_seconds: float | None = None

    def array(self, port: str, dtype=np.uint64) -> np.ndarray:
        return np.array(self.outputs[port], dtype=dtype)

    def extra_items(self) -> dict:
        """Counted output port -> the payloads it emitted beyond its expected count (only ports that did)."""
        return {name: self.emitted[name][n:] for name, n in self.counts.items()
                if n is not None and len(self.emitted.get(name, ())) > n}


class Backend(ABC):
    """A simulation engine. Obtain one with :func:`get_backend`."""

    name: str

    def run_streams(self, component: wiring.Component, inputs: dict, expected: dict, *,
                    traffic: Traffic | None = None, max_cycles: int | None = None,
                    quiet_cycles: int | None = None) -> StreamRun:
        """Run one stream testbench on a freshly reset ``component``.

        ``inputs``: input port name -> sequence of int payloads (every input port must be named; use an empty
        sequence for an idle port). ``expected``: output port name -> number of payloads the port must emit
        (ports not named are always ready and are not checked; ``None`` collects a port whole without making
        the run wait for it or checking its count; at least one port needs a count). ``max_cycles`` defaults to
        a generous bound derived from the amount of traffic. ``quiet_cycles`` (default
        :data:`DEFAULT_QUIET_CYCLES`): the check window after completion (module docstring); 0 checks only the
        items emitted up to completion.

        Raises :class:`SimulationTimeout` (no completion), :class:`ExtraOutput` (a counted port emitted more
        than its count).
        """
        if quiet_cycles is None:
            quiet_cycles = DEFAULT_QUIET_CYCLES
        if isinstance(quiet_cycles, bool) or not isinstance(quiet_cycles, (int, np.integer)) \
                or not 0 <= quiet_cycles <= 1 << 32:
            raise ValueError(f"quiet_cycles must be an int in [0, 2**32], got {quiet_cycles!r}")
        run = self._run(component, inputs, expected, traffic=traffic, max_cycles=max_cycles,
                        quiet_cycles=int(quiet_cycles))
        run.quiet_cycles = int(quiet_cycles)
        run.counts = {name: (None if n is None else int(n)) for name, n in expected.items()}
        bad = list(run.extra_items())
        if bad:
            parts = []
            for name in bad:
                items = run.emitted[name]
                n = int(expected[name])
                t = run.extra_cycle.get(name)
                when = (f"in cycle {t}, " + ("before completion" if t < run.cycles else
                                            f"{t - run.cycles + 1} cycle(s) after completion")) if t is not None \
                    else "cycle unknown"
                parts.append(f"output {name!r} emitted {len(items)} items, {n} expected (first extra item "
                             f"{items[n]:#x} {when})")
            raise ExtraOutput(f"{type(component).__name__}: " + "; ".join(parts)
                              + f" [run completed at cycle {run.cycles}, quiet window {quiet_cycles} cycles]",
                              run=run, ports=bad)
        return run

    @abstractmethod
    def _run(self, component, inputs, expected, *, traffic, max_cycles, quiet_cycles) -> StreamRun:
        """The engine's run: fills ``outputs``, ``cycles``, ``emitted`` and ``extra_cycle`` (see
        :meth:`run_streams`); raises :class:`SimulationTimeout`."""

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
