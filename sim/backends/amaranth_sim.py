"""Backend on Amaranth's built-in Python simulator (no external tools; 2k-10k cycles/s)."""

import time

from amaranth.hdl import Instance, Value
from amaranth.sim import Simulator

from .base import Backend, StreamRun, SimulationTimeout

__all__ = ["AmaranthBackend"]


def _refuse_black_boxes(sim, component):
    """Amaranth's simulator runs an :class:`Instance` (a separately generated Verilog module, e.g. the
    hierarchical builds' channel and DRAM-model instances) as an empty fragment: its outputs stay 0 and the design
    hangs or computes garbage with no error. Refuse such a design with the instances' names instead.
    (``Simulator._design`` is the prepared design of amaranth 0.5, the version pyproject.toml pins.)"""
    boxes = sorted({f"{'.'.join(info.name)} ({frag.type})"
                    for frag, info in sim._design.fragments.items() if isinstance(frag, Instance)})
    if boxes:
        more = f" and {len(boxes) - 4} more" if len(boxes) > 4 else ""
        raise ValueError(f"{type(component).__name__} holds black-box instances that Amaranth's simulator cannot "
                         f"run: {', '.join(boxes[:4])}{more}; build the design flat (for a hierarchical build, "
                         f"hierarchical=False) or use the verilator backend")


class AmaranthBackend(Backend):
    name = "amaranth"

    def _run(self, component, inputs, expected, *, traffic, max_cycles, quiet_cycles):
        in_ports, out_ports, data, counts, patterns, max_cycles = self._prepare(
            component, inputs, expected, traffic, max_cycles)
        emitted = {q.name: [] for q in out_ports}
        extra_cycle = {}
        result = {}

        sigs = {p.name: getattr(component, p.name) for p in in_ports + out_ports}

        async def testbench(ctx):
            pos = {p.name: 0 for p in in_ports}
            presenting = {p.name: False for p in in_ports}
            end = None      # last cycle of the run (completion + quiet window)
            t = 0
            while end is None and t < max_cycles or end is not None and t <= end:
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
                    if pat[t % len(pat)] and ctx.get(s.valid):
                        got = emitted[q.name]
                        got.append(int(ctx.get(Value.cast(s.payload))))
                        n = counts.get(q.name)
                        if n is not None and len(got) == n + 1:
                            extra_cycle[q.name] = t
                await ctx.tick()
                if end is None and all(counts[n] is None or len(emitted[n]) >= counts[n] for n in counts):
                    result["cycles"] = t + 1
                    result["whole"] = {n: len(emitted[n]) for n in counts if counts[n] is None}
                    end = t + quiet_cycles
                t += 1

        sim = Simulator(component)
        _refuse_black_boxes(sim, component)
        sim.add_clock(1e-9)
        sim.add_testbench(testbench)
        start, cpu0 = time.perf_counter(), time.process_time()
        sim.run()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
        if "cycles" not in result:
            got = {n: len(emitted[n]) for n in counts}
            raise SimulationTimeout(f"{type(component).__name__}: no completion after {max_cycles} cycles; "
                                    f"outputs collected {got} of {counts}")
        outputs = {n: emitted[n][:result["whole"][n] if counts[n] is None else counts[n]] for n in counts}
        return StreamRun(backend=self.name, outputs=outputs, cycles=result["cycles"], wall_seconds=wall,
                         emitted=emitted, extra_cycle=extra_cycle, cpu_seconds=cpu)
