"""sim.backends.verilog.verilog_text: a component's own modules (``verilog_modules()``) are generated in a forked
child beside the top's conversion when the process has one thread; the text is the same as the serial path's,
and a failure in the child is reported with its message. Run in fresh single-threaded interpreters (a pytest-xdist
worker has an I/O thread, where verilog_text takes the serial path)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""
    import json, os, sys, threading
    from amaranth.hdl import Instance, Module, ClockSignal, ResetSignal
    from amaranth.lib import wiring, stream
    from amaranth.lib.wiring import In, Out
    from amaranth.back import verilog
    from hdl.fp import FPMul, FP16
    import sim.backends.verilog as V

    class Wrapped(wiring.Component):
        def __init__(self, fail=False):
            self.fail = fail
            super().__init__({"i": In(stream.Signature(32)), "o": Out(stream.Signature(16))})
        def verilog_modules(self):
            if self.fail:
                raise ValueError("no such module: fp_mul_x")
            return [verilog.convert(FPMul(fmt=FP16), name="fp_mul_x")]
        def elaborate(self, platform):
            m = Module()
            m.submodules.u = Instance("fp_mul_x", i_clk=ClockSignal(), i_rst=ResetSignal(),
                                      i_i__valid=self.i.valid, i_i__payload=self.i.payload, o_i__ready=self.i.ready,
                                      o_o__valid=self.o.valid, o_o__payload=self.o.payload, i_o__ready=self.o.ready)
            return m

    forks = []
    real_fork = os.fork
    def counting_fork():
        forks.append(1)
        return real_fork()
    os.fork = counting_fork
    out = {"threads": threading.active_count()}
    try:
        out["text"] = V.verilog_text(Wrapped(fail=sys.argv[1] == "fail"))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["forks"] = len(forks)
    print(json.dumps(out))
""")


def _run(mode, serial=False):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    if serial:
        env["NDPIM_VERILOG_SERIAL"] = "1"
    p = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_forked_generation_gives_the_serial_text():
    forked, serial = _run("ok"), _run("ok", serial=True)
    assert forked["threads"] == 1 and forked["forks"] == 1 and serial["forks"] == 0
    assert "module fp_mul_x(" in forked["text"] and "module top(" in forked["text"]
    assert forked["text"] == serial["text"]


def test_a_failure_in_the_child_is_reported():
    forked, serial = _run("fail"), _run("fail", serial=True)
    assert forked["forks"] == 1
    assert forked["error"].startswith("RuntimeError: Verilog generation: verilog_modules() failed")
    assert "ValueError: no such module: fp_mul_x" in forked["error"]
    assert serial["error"] == "ValueError: no such module: fp_mul_x"
