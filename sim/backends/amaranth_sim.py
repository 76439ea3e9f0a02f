"""Backend on Amaranth's built-in Python simulator (no external tools; ~10k cycles/s)."""

import time

from amaranth.hdl import Value
from amaranth.sim import Simulator

from .base import Backend, StreamRun, SimulationTimeout

__all__ = ["AmaranthBackend"]


class AmaranthBackend(Backend):
    name = "amaranth"

    def run_streams(self, component, inputs, expected, *, traffic=None, max_cycles=None):
        in_ports, out_ports, data, counts, patterns, max_cycles = self._prepare(
            component, inputs, expected, traffic, max_cycles)
        outputs = {name: [] for name in counts}
        result = {}

        sigs = {p.name: getattr(component, p.name) for p in in_ports + out_ports}

        async def testbench(ctx):
            pos = {p.name: 0 for p in in_ports}
            presenting = {p.name: False for p in in_ports}
            for t in range(max_cycles):
                for p in in_ports:
                    s = sigs[p.name]
                    pat = patterns[p.name]
                    if not presenting[p.name] and pos[p.name] < len(data[p.name]) and pat[t % len(pat)]:
                        presenting[p.name] = True
                        ctx.set(Value.cast(s.payload), data[p.name][pos[p.name]])
                    ctx.set(s.valid, presenting[p.name])
                for q in out_ports:
                    pat = patterns[q.name]
                    ctx.set(sigs[q.name].ready, bool(pat[t % len(pat)]))
                for p in in_ports:
                    if presenting[p.name] and ctx.get(sigs[p.name].ready):
                        presenting[p.name] = False
                        pos[p.name] += 1
                for q in out_ports:
                    s = sigs[q.name]
                    pat = patterns[q.name]
                    if q.name in outputs and pat[t % len(pat)] and ctx.get(s.valid):
                        outputs[q.name].append(int(ctx.get(Value.cast(s.payload))))
                await ctx.tick()
                if all(counts[n] is None or len(outputs[n]) >= counts[n] for n in counts):
                    result["cycles"] = t + 1
                    return
            result["cycles"] = None

        sim = Simulator(component)
        sim.add_clock(1e-9)
        sim.add_testbench(testbench)
        start = time.perf_counter()
        sim.run()
        wall = time.perf_counter() - start
        if result["cycles"] is None:
            got = {n: len(v) for n, v in outputs.items()}
            raise SimulationTimeout(f"{type(component).__name__}: no completion after {max_cycles} cycles; "
                                    f"outputs collected {got} of {counts}")
        return StreamRun(backend=self.name, outputs={n: v if counts[n] is None else v[:counts[n]]
                                                      for n, v in outputs.items()},
                         cycles=result["cycles"], wall_seconds=wall)
