"""Stimulus and harness helpers shared by the FP unit tests."""

import numpy as np

from sim.backends import Traffic, stream_ports
from sim.verify.fpvectors import (FP16_EDGE, FP32_EDGE, random_fp16, random_fp32,  # noqa: F401
                           operand_pairs, pack, field)

def run_unit(backend, component, payloads, *, seed=0, traffic="random"):
    """Run ``payloads`` through a one-in, one-out unit; random gaps and backpressure by default."""
    if traffic == "random":
        tr = Traffic.random(stream_ports(component), seed=seed)
    elif traffic == "full":
        tr = Traffic.full_rate()
    else:
        tr = traffic
    return backend.run_streams(component, {"i": payloads}, {"o": len(payloads)}, traffic=tr)


def hexdiff(inputs: dict, got, want, limit=8) -> str:
    """A readable list of the first mismatches for assertion messages."""
    bad = np.nonzero(np.asarray(got) != np.asarray(want))[0]
    rows = []
    for i in bad[:limit]:
        ops = " ".join(f"{k}={int(v[i]):#x}" for k, v in inputs.items())
        rows.append(f"[{i}] {ops}: got {int(got[i]):#x} want {int(want[i]):#x}")
    return f"{len(bad)} mismatches:\n" + "\n".join(rows)


def vector_count(backend, amaranth=3000, verilator=100_000) -> int:
    """Random vectors per RTL test: the compiled simulator affords the full SoftFloat-sized campaign."""
    return verilator if backend.name == "verilator" else amaranth
