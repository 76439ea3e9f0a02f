"""Simulation-speed measurement of the memory system: where the Verilator and Amaranth time goes.

Self-driven tops (no testbench work per cycle), so a measurement shows the design's own cost:

* :class:`SelfDrivenMemorySystem`: controller + DRAM device model, fed by an in-design request source
  (sequential or LFSR-random burst addresses, always valid) with an always-ready response sink that counts;
* :class:`ControllerOnly`: the controller with a stand-in for the device (read data ``CL`` cycles after a RD,
  nothing checked): the controller's share;
* :class:`DeviceOnly`: the DRAM device model replaying a recorded command trace from an in-design ROM: the device
  model's share.

Engines: :func:`verilator_cycles_per_s` builds a minimal C++ main (clock, reset, N cycles; no stream handling) with
the project's Verilator flags and reports process CPU time; :func:`amaranth_cycles_per_s` runs Amaranth's
simulator with only a clock. ``python -m sim.dram.speed`` prints the table (``make bench-dram`` includes it).
"""

import hashlib
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from amaranth.hdl import Module, Signal, Const, Cat, Mux, Value
from amaranth.lib import wiring, memory
from amaranth.lib.wiring import Out

from hdl.memctl.commands import Cmd, command_layout

__all__ = ["SelfDrivenMemorySystem", "ControllerOnly", "DeviceOnly", "verilator_cycles_per_s",
           "amaranth_cycles_per_s", "main"]

ROOT = Path(__file__).resolve().parents[2]


class _Source(wiring.Component):
    """Always-valid read requests: burst address = counter (``"seq"``) or a 32-bit LFSR (``"random"``)."""

    def __init__(self, ctl, pattern):
        self.ctl, self.pattern = ctl, pattern
        super().__init__({"accepted": Out(32)})

    def elaborate(self, platform):
        m = Module()
        ctl = self.ctl
        ab = ctl.amap.addr_bits
        state = Signal(32, init=1)
        with m.If(ctl.i.ready):
            if self.pattern == "seq":
                m.d.sync += state.eq(state + 1)
            else:  # Galois LFSR, x^32 + x^22 + x^2 + x + 1
                m.d.sync += state.eq(Mux(state[0], (state >> 1) ^ 0x80200003, state >> 1))
            m.d.sync += self.accepted.eq(self.accepted + 1)
        m.d.comb += [ctl.i.valid.eq(1), ctl.i.payload.addr.eq(state[:ab]), ctl.i.payload.write.eq(0),
                     ctl.o.ready.eq(1)]
        if ctl.tag_width:
            m.d.comb += ctl.i.payload.tag.eq(state)
        return m


class SelfDrivenMemorySystem(wiring.Component):
    """``MemoryController`` + timing-only ``DRAMChannel`` with an in-design read source (``pattern``: ``"seq"`` or
    ``"random"``). Outputs: ``responses`` (read responses so far), ``commands`` (commands on the bus so far),
    ``violations`` (the device's count)."""

    def __init__(self, config, *, pattern="seq", **controller_kwargs):
        from hdl.memctl.controller import MemoryController
        from .device import DRAMChannel
        controller_kwargs.setdefault("tag_width", 16)
        self.config = config
        self.controller = MemoryController(config=config, **controller_kwargs)
        # as the project's memory systems build it (sim/dram/system.py, sim/devmem/system.py): no RD_AB data path,
        # since a controller never issues all-bank commands (the all-bank rules are still checked)
        self.device = DRAMChannel(config, storage=False, all_bank=False)
        self.source = _Source(self.controller, pattern)
        super().__init__({"responses": Out(32), "commands": Out(32), "violations": Out(32)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.controller = ctl = self.controller
        m.submodules.device = dev = self.device
        m.submodules.source = self.source
        m.d.comb += [Value.cast(dev.cmd).eq(Value.cast(ctl.cmd)), dev.wdata.eq(ctl.wdata), ctl.rdata.eq(dev.rdata),
                     ctl.rdata_valid.eq(dev.rdata_valid), self.violations.eq(dev.violations)]
        with m.If(ctl.o.valid):
            m.d.sync += self.responses.eq(self.responses + 1)
        with m.If(ctl.cmd.kind != Cmd.NOP):
            m.d.sync += self.commands.eq(self.commands + 1)
        return m


class ControllerOnly(wiring.Component):
    """The controller with a stand-in device: a RD on the bus in cycle t returns ``burst_cycles`` beats from
    t + CL; nothing is checked. Outputs as :class:`SelfDrivenMemorySystem` (``violations`` 0)."""

    def __init__(self, config, *, pattern="seq", **controller_kwargs):
        from hdl.memctl.controller import MemoryController
        controller_kwargs.setdefault("tag_width", 16)
        self.config = config
        self.controller = MemoryController(config=config, **controller_kwargs)
        self.source = _Source(self.controller, pattern)
        super().__init__({"responses": Out(32), "commands": Out(32), "violations": Out(32)})

    def elaborate(self, platform):
        m = Module()
        org, tm = self.config.org, self.config.timing
        m.submodules.controller = ctl = self.controller
        m.submodules.source = self.source
        L = tm.CL + org.burst_cycles
        rd = Signal(L)
        m.d.sync += rd.eq(Cat(ctl.cmd.kind == Cmd.RD, rd[:-1]))
        m.d.comb += [ctl.rdata_valid.eq(rd[tm.CL - 1:L - 1].any()), ctl.rdata.eq(0)]
        with m.If(ctl.o.valid):
            m.d.sync += self.responses.eq(self.responses + 1)
        with m.If(ctl.cmd.kind != Cmd.NOP):
            m.d.sync += self.commands.eq(self.commands + 1)
        return m


class DeviceOnly(wiring.Component):
    """A timing-only ``DRAMChannel`` replaying ``trace`` (a list of :class:`sim.dram.trace.TraceCommand`, cycle
    order) from a ROM, each command in its recorded cycle. Outputs: ``commands`` (issued), ``violations``,
    ``responses`` (read bursts returned). ``all_bank``: the model's RD_AB data path (``False``: as behind a
    controller, :class:`SelfDrivenMemorySystem`)."""

    def __init__(self, config, trace, *, all_bank: bool = True):
        from .device import DRAMChannel
        self.config = config
        self.trace = list(trace)
        if self.trace and self.trace[0].cycle < 1:
            raise ValueError(f"DeviceOnly replays commands from cycle 1 on (a registered command input); the trace's "
                             f"first command is at cycle {self.trace[0].cycle}")
        self.device = DRAMChannel(config, storage=False, all_bank=all_bank)
        super().__init__({"responses": Out(32), "commands": Out(32), "violations": Out(32)})

    def elaborate(self, platform):
        m = Module()
        org = self.config.org
        m.submodules.device = dev = self.device
        cl = command_layout(org)
        cw = Value.cast(cl.const({})).shape().width
        entries = []
        for c in self.trace:
            v = cl.const({"kind": c.kind, "rank": c.rank, "bg": c.bg, "bank": c.bank, "row": c.row,
                          "col": c.col}).as_value().value
            entries.append(v | (c.cycle << cw))
        entries.append((1 << (cw + 40)) - 1 - ((1 << cw) - 1))  # sentinel: never reached
        rom = memory.Memory(shape=cw + 40, depth=len(entries), init=entries)
        m.submodules.rom = rom
        rp = rom.read_port(domain="comb")
        ptr = Signal(range(len(entries)))
        m.d.comb += rp.addr.eq(ptr)
        # The command is registered, as a controller's is: the entry due in the next cycle goes to the device's
        # command input at the clock edge (a command in cycle 0 cannot be replayed; __init__ refuses it).
        fire = rp.data[cw:] == dev.cycle + 1
        m.d.sync += Value.cast(dev.cmd).eq(Mux(fire, rp.data[:cw], 0))
        with m.If(fire):
            m.d.sync += [ptr.eq(ptr + 1), self.commands.eq(self.commands + 1)]
        with m.If(dev.rdata_valid):
            m.d.sync += self.responses.eq(self.responses + 1)
        m.d.comb += self.violations.eq(dev.violations)
        return m


# The reset is a register inside the wrapper (high in the first cycle), not a top-level input: Amaranth's
# synchronous reset enters every register's next-state logic, and Verilator re-evaluates logic that depends on a
# changing top-level input in its input-combinational region on every eval.
_WRAPPER = """
module bench_top(input clk, output [31:0] responses, output [31:0] commands, output [31:0] violations);
  reg rst = 1'b1;
  always @(posedge clk) rst <= 1'b0;
  top dut(.clk(clk), .rst(rst), .responses(responses), .commands(commands), .violations(violations));
endmodule
"""

_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include "verilated.h"
#include "Vbench_top.h"
int main(int argc, char** argv) {
    const unsigned long n = std::strtoul(argv[1], nullptr, 10);
    VerilatedContext ctx;
    Vbench_top* top = new Vbench_top{&ctx};
    top->clk = 0; top->eval();
    for (unsigned long t = 0; t <= n; ++t) { top->clk = 1; top->eval(); top->clk = 0; top->eval(); }
    std::printf("%lu %u %u %u\n", n, (unsigned)top->responses, (unsigned)top->commands, (unsigned)top->violations);
    top->final();
    delete top;
    return 0;
}
"""


def _build(verilog_text: str, flags=("-O3",), make_opt="-O2") -> Path:
    from sim.backends.verilog import verilator_env
    key = hashlib.sha256("\0".join([verilog_text, _WRAPPER, _MAIN, *flags, make_opt]).encode()).hexdigest()
    root = ROOT / "build" / "verilator-speed"
    exe = root / key / "sim"
    if exe.exists():
        return exe
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=root))
    (tmp / "top.v").write_text(verilog_text + _WRAPPER)
    (tmp / "main.cpp").write_text(_MAIN)
    env = verilator_env()
    cmd = ["verilator", "--cc", "--exe", *flags, "-Wno-fatal", "-Wno-lint", "-Wno-style", "--x-assign", "0",
           "--x-initial", "0", "--top-module", "bench_top", "--Mdir", "obj", "-o", "../sim", "top.v", "main.cpp"]
    for c, cwd in ((cmd, tmp), (["make", "-j", "2", "-f", "Vbench_top.mk", f"OPT_FAST={make_opt}", f"OPT_SLOW=-O0",
                                 f"OPT_GLOBAL={make_opt}", "CFG_CXXFLAGS_PCH_I=-include"], tmp / "obj")):
        p = subprocess.run(c, cwd=cwd, capture_output=True, text=True, env=env)
        if p.returncode:
            raise RuntimeError(f"{c[0]} failed:\n{(p.stdout + p.stderr)[-3000:]}")
    shutil.rmtree(tmp / "obj", ignore_errors=True)
    try:
        os.rename(tmp, root / key)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return exe


def verilator_cycles_per_s(component, cycles: int, *, verilog_text=None, **build) -> dict:
    """Build (cached) and run ``component`` for ``cycles`` cycles in a minimal Verilator main. Returns
    ``{"cycles", "cpu_s", "wall_s", "cycles_per_s" (CPU time), "responses", "commands", "violations"}``."""
    from amaranth.back import verilog
    exe = _build(verilog_text or verilog.convert(component, name="top"), **build)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([str(exe), str(cycles)], capture_output=True, text=True, check=True).stdout.split()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    n, resp, cmds, viol = (int(x) for x in out)
    return {"cycles": n, "cpu_s": cpu, "wall_s": wall, "cycles_per_s": n / cpu if cpu else float("inf"),
            "responses": resp, "commands": cmds, "violations": viol}


def amaranth_cycles_per_s(component, cycles: int) -> dict:
    """Amaranth's simulator with a clock and one testbench that only waits ``cycles`` cycles and reads the
    counters (no per-cycle testbench work); CPU time of the run, the simulator's compile excluded
    (``compile_s``)."""
    from amaranth.sim import Simulator
    vals = {}

    async def read(ctx):
        await ctx.delay(1e-9 * cycles + 0.5e-9)
        for name in ("responses", "commands", "violations"):
            vals[name] = ctx.get(getattr(component, name))

    t0 = time.process_time()
    sim = Simulator(component)
    sim.add_clock(1e-9)
    sim.add_testbench(read)
    t1 = time.process_time()
    sim.run()
    t2 = time.process_time()
    return {"cycles": cycles, "cpu_s": t2 - t1, "compile_s": t1 - t0, "cycles_per_s": cycles / (t2 - t1), **vals}


def main(argv=None):
    import argparse
    import json
    from hdl.memctl.timing import LPDDR5X_8533_TINY, DDR4_3200_TINY, PRESETS
    ap = argparse.ArgumentParser(prog="python -m sim.dram.speed", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="lpddr5x-8533-tiny", choices=sorted(PRESETS))
    ap.add_argument("--cycles", type=int, default=1_000_000)
    ap.add_argument("--amaranth-cycles", type=int, default=0, help="also run Amaranth's simulator for this "
                    "many cycles per top (0: Verilator only)")
    ap.add_argument("--queue-depth", type=int, default=None)
    args = ap.parse_args(argv)
    cfg = PRESETS[args.config]
    kw = {} if args.queue_depth is None else {"queue_depth": args.queue_depth}
    makers = {"memory system (seq)": lambda: SelfDrivenMemorySystem(cfg, **kw),
              "controller only (seq)": lambda: ControllerOnly(cfg, **kw),
              "memory system (random)": lambda: SelfDrivenMemorySystem(cfg, pattern="random", **kw)}
    from hdl.memctl.controller import DEFAULT_QUEUE_DEPTH
    q = kw.get("queue_depth", DEFAULT_QUEUE_DEPTH)
    print(f"Simulation speed, {cfg.name}, queue {q} (simulated cycles per CPU second; self-driven tops)\n")
    out = {}
    for name, mk in makers.items():
        v = verilator_cycles_per_s(mk(), args.cycles)
        out[name] = {"verilator": v}
        line = (f"{name:26s} Verilator {v['cycles_per_s'] / 1e6:6.3f} M cycles/s  ({v['responses']} reads, "
                f"{v['commands']} commands, {v['violations']} violations)")
        if args.amaranth_cycles:
            a = amaranth_cycles_per_s(mk(), args.amaranth_cycles)
            out[name]["amaranth"] = a
            line += f"   Amaranth {a['cycles_per_s']:7.0f} cycles/s"
        print(line, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
