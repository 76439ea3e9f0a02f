# amaranth: UnusedElaboratable=no
"""The Amaranth and Verilator backends implement the same stream protocol: same outputs, same cycle counts."""

import numpy as np
import pytest
from amaranth.hdl import ClockSignal, Instance, Module, Signal
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from hdl.fp.add import FPAdd
from hdl.fp.mul import FPMul
from sim.backends import get_backend, stream_ports, Traffic, SimulationTimeout
from sim.backends import verilator as vl_backend
from sim.backends.verilog import verilog_text, lint
from sim.golden import fp16

from fp_util import operand_pairs, pack, hexdiff

UNITS = {
    "mul16": (FPMul, fp16.mul),
    "add16": (FPAdd, fp16.add),
}


def _run_both(component, inputs, expected, traffic):
    return [get_backend(name).run_streams(component, inputs, expected, traffic=traffic)
            for name in ("amaranth", "verilator")]


@pytest.mark.parametrize("traffic", ["random", "full"])
@pytest.mark.parametrize("unit", sorted(UNITS))
def test_fp_units_identical_on_both_backends(unit, traffic):
    factory, golden = UNITS[unit]
    a, b = operand_pairs(np.random.default_rng(11), 400)
    dut = factory()
    tr = Traffic.random(stream_ports(dut), seed=5, valid_prob=0.6, ready_prob=0.5) if traffic == "random" \
        else Traffic.full_rate()
    am, vl = _run_both(dut, {"i": pack([(a, 16), (b, 16)])}, {"o": len(a)}, tr)
    assert vl.cycles == am.cycles
    assert vl.outputs == am.outputs
    want = golden(a, b)
    assert np.array_equal(vl.array("o"), want), hexdiff({"a": a, "b": b}, vl.array("o"), want)
    if traffic == "full":
        # One result per cycle: the last of n results leaves `latency` cycles after the last input.
        assert vl.cycles == len(a) + dut.latency


class JoinAdd96(wiring.Component):
    """Test-only: joins a 40-bit stream ``a`` and a 72-bit stream ``b`` into ``(b + (a << 56)) mod 2**96``,
    with two pipeline registers and the same lock-step handshake as the FP units."""

    latency = 2

    def __init__(self):
        super().__init__({
            "a": In(stream.Signature(40)),
            "b": In(stream.Signature(72)),
            "o": Out(stream.Signature(96)),
        })

    def elaborate(self, platform):
        m = Module()
        advance = ~self.o.valid | self.o.ready
        both = self.a.valid & self.b.valid
        s1_valid, s1 = Signal(), Signal(96)
        m.d.comb += [self.a.ready.eq(advance & both), self.b.ready.eq(advance & both)]
        with m.If(advance):
            m.d.sync += [s1_valid.eq(both), s1.eq(self.b.payload + (self.a.payload << 56)),
                         self.o.valid.eq(s1_valid), self.o.payload.eq(s1)]
        return m


def test_two_inputs_and_wide_output():
    rng = np.random.default_rng(3)
    n = 300
    a = [int(x) for x in rng.integers(0, 1 << 40, n, dtype=np.uint64)]
    b = [int.from_bytes(rng.bytes(9), "little") for _ in range(n)]
    b[:3] = [(1 << 72) - 1, 0, 1 << 71]
    a[:3] = [(1 << 40) - 1, (1 << 40) - 1, 0]
    want = [(y + (x << 56)) % (1 << 96) for x, y in zip(a, b)]
    dut = JoinAdd96()
    for tr in (Traffic.random(stream_ports(dut), seed=9), Traffic.full_rate()):
        am, vl = _run_both(dut, {"a": a, "b": b}, {"o": n}, tr)
        assert am.outputs["o"] == want
        assert vl.outputs["o"] == want
        assert vl.cycles == am.cycles
    assert vl.cycles == n + JoinAdd96.latency


class Hang(wiring.Component):
    """Test-only: accepts everything and never produces an output."""

    def __init__(self):
        super().__init__({"i": In(stream.Signature(8)), "o": Out(stream.Signature(8))})

    def elaborate(self, platform):
        m = Module()
        count = Signal(8)
        m.d.sync += count.eq(count + self.i.valid)
        m.d.comb += [self.i.ready.eq(1), self.o.payload.eq(count)]
        return m


def test_hang_times_out(backend):
    with pytest.raises(SimulationTimeout, match=r"^Hang: no completion after 50 cycles; "
                                                r"outputs collected \{'o': 0\} of \{'o': 3\}$"):
        backend.run_streams(Hang(), {"i": [1, 2, 3]}, {"o": 3}, max_cycles=50)


class BlackBox(wiring.Component):
    """Test-only: a pass-through whose work is done by an instance of a separately generated module (as the
    hierarchical builds instantiate their channels)."""

    def __init__(self):
        super().__init__({"i": In(stream.Signature(8)), "o": Out(stream.Signature(8))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.box = Instance("box_module", i_clk=ClockSignal(), i_d=self.i.payload, o_q=self.o.payload,
                                    i_v=self.i.valid, o_v=self.o.valid)
        m.d.comb += self.i.ready.eq(self.o.ready)
        return m


def test_amaranth_refuses_a_black_box_instance(monkeypatch):
    """Amaranth's simulator would run the instance as nothing (outputs 0, a silent hang): the backend names it."""
    with pytest.raises(ValueError, match=r"BlackBox holds black-box instances that Amaranth's simulator cannot run: "
                                         r"top\.box \(box_module\); build the design flat"):
        get_backend("amaranth").run_streams(BlackBox(), {"i": [1]}, {"o": 1}, max_cycles=20)
    # without the check: no error, just no output
    from sim.backends import amaranth_sim
    monkeypatch.setattr(amaranth_sim, "_refuse_black_boxes", lambda sim, c: None)
    with pytest.raises(SimulationTimeout):
        get_backend("amaranth").run_streams(BlackBox(), {"i": [1]}, {"o": 1}, max_cycles=20)


def test_bad_arguments(backend):
    with pytest.raises(ValueError, match="'x' is not an input stream of FPMul"):
        backend.run_streams(FPMul(), {"i": [1], "x": [1]}, {"o": 1})
    with pytest.raises(ValueError, match="'i' is not an output stream of FPMul"):
        backend.run_streams(FPMul(), {"i": [1]}, {"i": 1})
    with pytest.raises(ValueError, match="does not fit input stream 'i' \\(32 bits\\)"):
        backend.run_streams(FPMul(), {"i": [1 << 32]}, {"o": 1})
    with pytest.raises(ValueError, match="no input sequence for input stream"):
        backend.run_streams(FPMul(), {}, {"o": 1})


def test_verilator_executable_is_cached():
    first = vl_backend.VerilatorBackend().executable(FPMul())
    again = vl_backend.VerilatorBackend().executable(FPMul())  # fresh backend, fresh component
    assert again == first and first.parent.parent == vl_backend.BUILD_ROOT
    assert len(first.parent.name) == 64


def test_verilator_build_failure_shows_compiler_output(tmp_path, monkeypatch):
    monkeypatch.setattr(vl_backend, "BUILD_ROOT", tmp_path)
    broken = "module top(clk);\n  input clk;\n  wire x = ;\nendmodule\n"
    with pytest.raises(RuntimeError, match=r"(?s)Verilator build failed: verilator exited.*syntax error"):
        vl_backend.build_executable(broken, [])


def test_concurrent_builds_compile_the_runtime_library_once(tmp_path, monkeypatch):
    """Builds at once in an empty cache (the demo's two, or pytest workers): Verilator's run-time library is
    compiled by one of them, the others wait for it; a design asked for twice at once is built once."""
    import threading
    monkeypatch.setattr(vl_backend, "BUILD_ROOT", tmp_path)
    calls, orig = [], vl_backend._run_tool

    def counting(cmd, cwd, what):
        calls.append(what)
        return orig(cmd, cwd, what)
    monkeypatch.setattr(vl_backend, "_run_tool", counting)
    designs = [f"module top(clk, rst);\n  input clk;\n  input rst;\n  reg [{w}:0] c = 0;\n"
               f"  always @(posedge clk) c <= c + 1;\nendmodule\n" for w in (3, 5)]
    exes, errors = [], []

    def build(v):
        try:
            exes.append(vl_backend.build_executable(v, []))
        except Exception as exc:        # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=build, args=(v,)) for v in designs + designs[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert calls.count("make (Verilator run-time library)") == 1
    assert calls.count("make (C++ compile)") == 2 and len(exes) == 3 and len(set(exes)) == 2
    assert all(e.exists() for e in exes)
    runtime = [d for d in tmp_path.iterdir() if d.name.startswith("runtime-") and d.is_dir()]
    assert len(runtime) == 1 and all((runtime[0] / o).exists() for o in vl_backend.RUNTIME_OBJS)


def test_lint_clean_on_fp_unit_and_catches_a_real_problem(tmp_path):
    good = tmp_path / "fp_mul.v"
    good.write_text(verilog_text(FPMul(), "fp_mul"))
    assert lint([good]) == []
    bad = tmp_path / "bad.v"  # `y` is never driven: not one of the waived warnings
    bad.write_text("module bad(input a, output y, output z);\n  assign z = a;\nendmodule\n")
    problems = lint([bad])
    assert problems and all("UNDRIVEN" in p for p in problems), problems


class CountWithLog(wiring.Component):
    """Passes ``i`` to ``o`` through one register; ``log`` reports every accepted item plus 1000, unthrottled
    (a trace port: the testbench keeps it always ready)."""

    def __init__(self):
        super().__init__({"i": In(stream.Signature(16)), "o": Out(stream.Signature(16)),
                          "log": Out(stream.Signature(16))})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.i.ready):
            m.d.sync += [self.o.valid.eq(self.i.valid), self.o.payload.eq(self.i.payload)]
        m.d.sync += [self.log.valid.eq(self.i.valid & self.i.ready), self.log.payload.eq(self.i.payload + 1000)]
        return m


def test_collect_whole_port(backend):
    """A port expected as ``None`` is recorded in full and does not decide when the run ends."""
    items = list(range(40))
    tr = Traffic(valid={"i": np.array([1, 0, 1], dtype=bool)}, ready={"o": np.array([1, 1, 0], dtype=bool)})
    run = backend.run_streams(CountWithLog(), {"i": items}, {"o": len(items), "log": None}, traffic=tr)
    assert run.outputs["o"] == items
    # The last log entry appears on the edge after the last input is accepted, which is no later than the
    # edge that hands over the last output, so every item is in the log.
    assert run.outputs["log"] == [x + 1000 for x in items]
    with pytest.raises(ValueError, match="at least one output port needs an expected count"):
        backend.run_streams(CountWithLog(), {"i": items}, {"log": None})


def test_collect_whole_is_cycle_identical():
    items = list(range(100))
    tr = Traffic.random(stream_ports(CountWithLog()), seed=9)
    runs = [get_backend(b).run_streams(CountWithLog(), {"i": items}, {"o": 100, "log": None}, traffic=tr)
            for b in ("amaranth", "verilator")]
    assert runs[0].cycles == runs[1].cycles
    assert runs[0].outputs == runs[1].outputs


class EchoExtra(wiring.Component):
    """Test-only: passes ``i`` to ``o`` through one register (a correct echo); after it has passed ``after``
    items it emits ONE extra item (the last payload + 1) ``delay`` cycles later -- a design that emits one item
    too many, after the output the testbench expects is complete. ``side`` emits one item per input item
    (always ready; a second counted port)."""

    def __init__(self, after, delay):
        self.after, self.delay = after, delay
        super().__init__({"i": In(stream.Signature(16)), "o": Out(stream.Signature(16)),
                          "side": Out(stream.Signature(16))})

    def elaborate(self, platform):
        m = Module()
        n = Signal(16)
        wait = Signal(range(self.delay + 2))
        armed = Signal()
        last = Signal(16)
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [self.o.valid.eq(1), self.o.payload.eq(self.i.payload), last.eq(self.i.payload),
                         n.eq(n + 1)]
            with m.If(n + 1 == self.after):
                m.d.sync += [armed.eq(1), wait.eq(0)]
        with m.Elif(armed & ~self.o.valid):
            m.d.sync += wait.eq(wait + 1)
            with m.If(wait == self.delay):
                m.d.sync += [armed.eq(0), self.o.valid.eq(1), self.o.payload.eq(last + 1)]
        m.d.sync += [self.side.valid.eq(self.i.valid & self.i.ready), self.side.payload.eq(self.i.payload)]
        return m


def test_extra_output_after_completion_is_caught(backend):
    """One extra item after the last expected one: the old harness (which stopped at the expected count, here
    ``quiet_cycles=0``) passes it with the right outputs; the check window fails the run and names the item."""
    from sim.backends import ExtraOutput
    items = list(range(10, 30))
    dut = EchoExtra(after=len(items), delay=5)
    old = backend.run_streams(dut, {"i": items}, {"o": len(items)}, quiet_cycles=0)
    assert old.outputs["o"] == items              # what every stream test compared: the design "passes"
    with pytest.raises(ExtraOutput, match=r"^EchoExtra: output 'o' emitted 21 items, 20 expected \(first extra "
                                          r"item 0x1e in cycle \d+, \d+ cycle\(s\) after completion\)") as exc:
        backend.run_streams(dut, {"i": items}, {"o": len(items)})
    run = exc.value.run
    assert run.outputs["o"] == items and run.emitted["o"] == items + [items[-1] + 1]
    assert run.extra_items() == {"o": [items[-1] + 1]} and exc.value.ports == ("o",)
    assert run.extra_cycle["o"] >= run.cycles
    # with no extra item the same run passes and reports exactly what each port emitted
    ok = backend.run_streams(EchoExtra(after=len(items) + 1, delay=5), {"i": items}, {"o": len(items)})
    assert ok.emitted["o"] == items and ok.emitted["side"] == items and ok.extra_items() == {}


def test_extra_output_before_completion_is_caught(backend):
    """A counted port that emits one item too many while another port is still awaited fails even without a
    window; ports not named in ``expected`` are reported but not checked."""
    from sim.backends import ExtraOutput
    items = list(range(8))
    tr = Traffic(ready={"o": np.array([1, 0, 0, 0], dtype=bool)})   # o is slow: side finishes first
    with pytest.raises(ExtraOutput, match=r"output 'side' emitted 8 items, 7 expected \(first extra item 0x7 in "
                                          r"cycle \d+, before completion\)"):
        backend.run_streams(EchoExtra(after=99, delay=1), {"i": items}, {"o": 8, "side": 7}, traffic=tr,
                            quiet_cycles=0)
    run = backend.run_streams(EchoExtra(after=99, delay=1), {"i": items}, {"o": 8}, traffic=tr)
    assert run.emitted["side"] == items and "side" not in run.outputs


def test_extra_output_identical_on_both_backends():
    from sim.backends import ExtraOutput
    items = list(range(50))
    dut = EchoExtra(after=len(items), delay=9)
    tr = Traffic.random(stream_ports(dut), seed=4)
    tr = Traffic(valid=tr.valid, ready={"o": tr.ready["o"]})    # `side` ignores ready: keep it always ready
    runs = []
    for name in ("amaranth", "verilator"):
        with pytest.raises(ExtraOutput) as exc:
            get_backend(name).run_streams(dut, {"i": items}, {"o": len(items), "side": None}, traffic=tr)
        runs.append(exc.value.run)
    a, v = runs
    assert (a.cycles, a.outputs, a.emitted, a.extra_cycle) == (v.cycles, v.outputs, v.emitted, v.extra_cycle)
    assert a.outputs["side"] == items and a.emitted["side"] == items


def test_quiet_cycles_argument(backend):
    with pytest.raises(ValueError, match=r"quiet_cycles must be an int in \[0, 2\*\*32\], got -1"):
        backend.run_streams(FPMul(), {"i": [1]}, {"o": 1}, quiet_cycles=-1)


class MemReader(wiring.Component):
    """Test-only: reads words 0..n-1 of a Memory with a given init, one per accepted address."""

    def __init__(self, init, n):
        self.init, self.n = init, n
        super().__init__({"i": In(stream.Signature(8)), "o": Out(stream.Signature(16))})

    def elaborate(self, platform):
        from amaranth.lib.memory import Memory
        m = Module()
        m.submodules.mem = mem = Memory(shape=16, depth=self.n, init=self.init)
        rd = mem.read_port(domain="comb")
        m.d.comb += [rd.addr.eq(self.i.payload), self.i.ready.eq(~self.o.valid | self.o.ready)]
        with m.If(self.i.ready):
            m.d.sync += [self.o.valid.eq(self.i.valid), self.o.payload.eq(rd.data)]
        return m


def test_zero_memory_inits_are_stripped_and_nothing_changes():
    """The Verilator build drops `mem[k] = 0` initialisations (VERILATOR_FLAGS set --x-initial 0): the same
    reads, non-zero words kept; assignments outside initial blocks are never touched."""
    from sim.backends.verilator import strip_zero_memory_inits
    init = [0, 5, 0, 0, 0x1234, 0, 7, 0]
    dut = MemReader(init, len(init))
    text = verilog_text(dut, "top")
    stripped = strip_zero_memory_inits(text)
    assert stripped.count("16'h0000;") < text.count("16'h0000;") and "16'h1234;" in stripped
    fake = "always @* begin\n  x[3] = 1'h0;\nend\ninitial begin\n  mem[2] = 8'h00;\n  mem[3] = 8'h01;\nend\n"
    assert strip_zero_memory_inits(fake) == "always @* begin\n  x[3] = 1'h0;\nend\ninitial begin\n  mem[3] = 8'h01;\nend\n"
    for name in ("amaranth", "verilator"):
        run = get_backend(name).run_streams(MemReader(init, len(init)), {"i": list(range(8)) * 2}, {"o": 16})
        assert run.outputs["o"] == init * 2
