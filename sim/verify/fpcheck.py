"""Campaigns that check each FP unit's RTL against its golden model (and the golden against SoftFloat).

One table, :data:`UNITS`, says for every FP top how to draw operands, how to pack them and what the golden
output payload is; ``ndpim fp-report``, ``ndpim bench-fp`` and the cocotb testbenches all read it.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from hdl.fp.format import FP16, FP32
from hdl.tops import FP_TOPS
from sim.backends import Traffic, stream_ports
from sim.verify.fpvectors import operand_pairs, random_fp16, random_fp32, FP16_EDGE, FP32_EDGE, pack
from sim.golden import fp16, fp32
from sim.golden.exp import exp as exp16

__all__ = ["UnitSpec", "UNITS", "run_check", "CheckResult", "mac_operands"]


@dataclass(frozen=True)
class UnitSpec:
    name: str
    operands: tuple          # ((field name, width), ...) from the LSB of the input payload
    out_width: int           # output payload bits compared (the user sideband excluded)
    golden: Callable         # (*operand arrays) -> output payload as uint64 array
    vectors: Callable        # (rng, n) -> tuple of operand arrays
    softfloat: str | None = None  # SoftFloat reference of the golden model (see sim.verify.softfloat_ref)

    @property
    def factory(self):
        return FP_TOPS[self.name]


def _pairs(fmt):
    return lambda rng, n: operand_pairs(rng, n, fmt)


def _singles16(rng, n):
    return (np.concatenate([FP16_EDGE, random_fp16(rng, n)]),)


def _singles32(rng, n):
    # Half uniform, half inside the binary16 range with random low bits (ties and near-ties).
    near = rng.integers(0x32000000, 0x47800000 + (1 << 23), n // 2, dtype=np.uint64).astype(np.uint32)
    near |= rng.integers(0, 2, n // 2).astype(np.uint32) << 31
    return (np.concatenate([FP32_EDGE, random_fp32(rng, n - n // 2), near]),)


def _exp_inputs(rng, n):
    if n >= 1 << 16:
        return (np.arange(1 << 16, dtype=np.uint32).astype(np.uint16),)
    x = random_fp16(rng, n)
    x[: n // 2] |= 0x8000  # softmax's operating range: x - max <= 0
    return (np.concatenate([FP16_EDGE, x]),)


def mac_operands(rng, n, acc):
    """``n`` random MAC operand triples (half with products in a moderate range and ``c`` close to ``-a*b``, so
    the accumulation cancels heavily), after every pair of a third of the curated edge cases."""
    a, b = random_fp16(rng, n), random_fp16(rng, n)
    h = n // 2
    a[:h] = (a[:h] & 0x83FF) | (rng.integers(9, 22, h).astype(np.uint16) << 10)
    b[:h] = (b[:h] & 0x83FF) | (rng.integers(9, 22, h).astype(np.uint16) << 10)
    if acc == "fp16":
        c = random_fp16(rng, n)
        c[:h] = fp16.mul(a[:h], b[:h]) ^ np.uint16(0x8000) ^ (c[:h] & 0x7)
    else:
        c = random_fp32(rng, n)
        c[:h] = fp16.mul_wide(a[:h], b[:h]) ^ np.uint32(0x80000000) ^ (c[:h] & 0x1FFF)
    ea, eb = np.meshgrid(FP16_EDGE[::3], FP16_EDGE[::3])
    ce = np.resize(c, ea.size)
    return np.concatenate([ea.ravel(), a]), np.concatenate([eb.ravel(), b]), np.concatenate([ce, c])


def _mac_vectors(acc):
    return lambda rng, n: mac_operands(rng, n, acc)


def _u64(x):
    return np.asarray(x).astype(np.uint64)


def _max_payload(a, b):
    z, lt, eq, un = fp16.max_cmp(a, b)
    return _u64(z) | (_u64(lt) << 16) | (_u64(eq) << 17) | (_u64(un) << 18)


UNITS = {spec.name: spec for spec in [
    UnitSpec(name="fp16_mul", operands=(("a", 16), ("b", 16)), out_width=16,
             golden=lambda a, b: _u64(fp16.mul(a, b)), vectors=_pairs(FP16), softfloat="f16_mul"),
    UnitSpec(name="fp16_mul_fp32", operands=(("a", 16), ("b", 16)), out_width=32,
             golden=lambda a, b: _u64(fp16.mul_wide(a, b)), vectors=_pairs(FP16), softfloat="f16_mul_f32"),
    UnitSpec(name="fp16_add", operands=(("a", 16), ("b", 16)), out_width=16,
             golden=lambda a, b: _u64(fp16.add(a, b)), vectors=_pairs(FP16), softfloat="f16_add"),
    UnitSpec(name="fp32_add", operands=(("a", 32), ("b", 32)), out_width=32,
             golden=lambda a, b: _u64(fp32.add(a, b)), vectors=_pairs(FP32), softfloat="f32_add"),
    UnitSpec(name="fp16_div", operands=(("a", 16), ("b", 16)), out_width=16,
             golden=lambda a, b: _u64(fp16.div(a, b)), vectors=_pairs(FP16), softfloat="f16_div"),
    UnitSpec(name="fp16_to_fp32", operands=(("a", 16),), out_width=32,
             golden=lambda a: _u64(fp16.to_f32(a)), vectors=_singles16, softfloat="f16_to_f32"),
    UnitSpec(name="fp32_to_fp16", operands=(("a", 32),), out_width=16,
             golden=lambda a: _u64(fp16.from_f32(a)), vectors=_singles32, softfloat="f32_to_f16"),
    UnitSpec(name="fp16_mac_fp16", operands=(("a", 16), ("b", 16), ("c", 16)), out_width=16,
             golden=lambda a, b, c: _u64(fp16.mac(a, b, c, acc="fp16")), vectors=_mac_vectors("fp16"),
             softfloat="mac_fp16"),
    UnitSpec(name="fp16_mac_fp32", operands=(("a", 16), ("b", 16), ("c", 32)), out_width=32,
             golden=lambda a, b, c: _u64(fp16.mac(a, b, c, acc="fp32")), vectors=_mac_vectors("fp32"),
             softfloat="mac_fp32"),
    UnitSpec(name="fp16_max", operands=(("a", 16), ("b", 16)), out_width=19,
             golden=_max_payload, vectors=_pairs(FP16), softfloat="max_cmp"),
    UnitSpec(name="fp16_exp", operands=(("x", 16),), out_width=16,
             golden=lambda x: _u64(exp16(x)), vectors=_exp_inputs),
]}


@dataclass
class CheckResult:
    name: str
    backend: str
    latency: int
    checked: int
    mismatches: int
    cycles: int
    wall_seconds: float
    first_mismatch: str = ""


def run_check(spec: UnitSpec, backend, n: int, *, seed: int = 0, traffic: str = "random") -> CheckResult:
    """Draw ``n`` random operands (plus the curated edges), run them through the RTL on ``backend`` and
    compare every output payload with the golden model bit for bit."""
    rng = np.random.default_rng(seed)
    ops = spec.vectors(rng, n)
    component = spec.factory()
    payloads = pack(list(zip(ops, (w for _, w in spec.operands))))
    tr = Traffic.random(stream_ports(component), seed=seed) if traffic == "random" else Traffic.full_rate()
    run = backend.run_streams(component, {"i": payloads}, {"o": len(payloads)}, traffic=tr)
    mask = (1 << spec.out_width) - 1
    got = np.array([p & mask for p in run.outputs["o"]], dtype=np.uint64)
    want = spec.golden(*ops)
    bad = np.nonzero(got != want)[0]
    first = ""
    if len(bad):
        i = bad[0]
        first = " ".join(f"{k}={int(v[i]):#x}" for (k, _), v in zip(spec.operands, ops))
        first += f": got {int(got[i]):#x} want {int(want[i]):#x}"
    return CheckResult(spec.name, backend.name, component.latency, len(payloads), len(bad), run.cycles,
                       run.wall_seconds, first)
