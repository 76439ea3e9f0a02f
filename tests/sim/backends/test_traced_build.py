"""The traced Verilator build (sim.e2e.waveform.TracingVerilatorBackend): it writes a waveform only when given a
file, so one build serves a whole run (no file) and the waveform of one of its runs (the demo's rtl run and its
waveform); the same outputs and cycles either way; its design-cache entry is not the untraced build's."""

import numpy as np
import pytest

from hdl.fp import FPMul, FP16
from sim.e2e.design_cache import CachedVerilatorBackend, silence
from sim.e2e.waveform import TracingVerilatorBackend, _vcd_harness as _vcd

A = np.array([1.5, -2.0, 0.25], np.float16).view(np.uint16).astype(np.int64)
B = np.array([2.0, 3.0, 8.0], np.float16).view(np.uint16).astype(np.int64)


def _run(be):
    return be.run_streams(FPMul(fmt=FP16), {"i": list(A | (B << 16))}, {"o": len(A)})


def test_one_traced_build_runs_with_and_without_a_waveform(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                       # the harness's default file name would land here
    quiet, loud = TracingVerilatorBackend(None), TracingVerilatorBackend(tmp_path / "w.vcd")
    r0 = _run(quiet)
    assert not list(tmp_path.glob("*.vcd"))          # no file without a path
    r1 = _run(loud)
    assert (tmp_path / "w.vcd").read_text().startswith("$version")
    assert r0.outputs == r1.outputs and r0.cycles == r1.cycles
    assert np.array_equal(np.array(r0.outputs["o"], np.uint16).view(np.float16), np.float16([3.0, -6.0, 2.0]))
    assert quiet.executable(FPMul(fmt=FP16)) == loud.executable(FPMul(fmt=FP16))   # one build
    assert quiet.build_tag != CachedVerilatorBackend().build_tag == ""
    monkeypatch.setenv("NDPIM_WAVEFORM", str(tmp_path / "x.vcd"))
    refused = FPMul(fmt=FP16)
    silence(refused)                                  # refused before it is elaborated
    with pytest.raises(RuntimeError, match="NDPIM_WAVEFORM"):
        quiet.run_streams(refused, {"i": [0]}, {"o": 1})


def test_a_traced_build_is_not_the_design_caches_untraced_entry(monkeypatch, tmp_path):
    monkeypatch.setenv("VERILATOR_BUILD_DIR", str(tmp_path))

    class Keyed(FPMul):
        def design_key(self):
            return "fpmul-fp16-test"
    plain = CachedVerilatorBackend().executable(Keyed(fmt=FP16))
    traced = TracingVerilatorBackend(None).executable(Keyed(fmt=FP16))
    assert plain != traced
    assert len(list((tmp_path / "designs").glob("*.exe"))) == 2


def _vcd_names(path):
    return [ln.split()[4] for ln in path.read_text().splitlines() if ln.lstrip().startswith("$var")]


def test_hide_internal_wires_renames_only_yosys_internal_names():
    from sim.backends.verilator import hide_internal_wires
    src = ("module top(a, y);\n  wire \\$12 ;\n  reg \\$auto$verilog_backend.cc:2355:dump_module$4  = 0;\n"
           "  wire \\rport__en$173 ;\n  assign \\$12  = a[\\$12 ];\n  assign y = {\\$12 , \\rport__en$173 };\n"
           "endmodule\n")
    out = hide_internal_wires(src)
    assert out.count("\\_$12 ") == 4 and "\\$12" not in out
    assert "\\_$auto$verilog_backend.cc:2355:dump_module$4 " in out
    assert "\\rport__en$173 " in out and "\\rport__en_$" not in out          # a `$` inside a name stays
    assert hide_internal_wires(out) == out                                   # a name `\_$...` exists: unchanged


def test_a_traced_build_records_the_named_signals_only(tmp_path, monkeypatch):
    """Yosys's internal wires (`$12`) are left out of the trace (the fast-compiling build of the demo), the
    named ones are there, and ``--trace-underscore`` brings the internal ones back; the outputs are the same."""
    monkeypatch.setenv("VERILATOR_BUILD_DIR", str(tmp_path / "builds"))
    named = TracingVerilatorBackend(tmp_path / "named.vcd")
    r0 = _run(named)
    names = _vcd_names(tmp_path / "named.vcd")
    assert names and not [n for n in names if n.startswith("$")]
    assert "o__valid" in names and "i__ready" in names
    everything = TracingVerilatorBackend(tmp_path / "all.vcd")
    everything.extra_flags += ("--trace-underscore",)
    r1 = _run(everything)
    every = _vcd_names(tmp_path / "all.vcd")
    assert [n for n in every if n.startswith("$")] and set(names) <= set(every)
    assert r0.outputs == r1.outputs and r0.cycles == r1.cycles


def test_trace_code_moves_to_the_cold_list(tmp_path):
    from sim.backends.verilator import _trace_code_slow
    mk = tmp_path / "Vharness_top_classes.mk"
    mk.write_text("VM_CLASSES_FAST += \\\n  Vharness_top \\\n\nVM_SUPPORT_FAST += \\\n  Vharness_top__Trace__0 \\\n"
                  "  Vharness_top__Other \\\n  Vharness_top__Trace__1 \\\n\nVM_SUPPORT_SLOW += \\\n"
                  "  Vharness_top__Syms__Slow \\\n  Vharness_top__Trace__0__Slow \\\n\n")
    _trace_code_slow(mk)
    text = mk.read_text()
    fast = text.split("VM_SUPPORT_FAST += \\\n")[1].split("\n\n")[0]
    slow = text.split("VM_SUPPORT_SLOW += \\\n")[1].split("\n\n")[0]
    assert fast.split() == ["Vharness_top__Other", "\\"]
    assert slow.split()[::2] == ["Vharness_top__Trace__0", "Vharness_top__Trace__1", "Vharness_top__Syms__Slow",
                                 "Vharness_top__Trace__0__Slow"]


def test_traced_and_untraced_builds_share_the_runtime_library(tmp_path, monkeypatch):
    """Verilator's run-time library objects do not depend on --trace or the optimiser's -f switches: one compile
    serves all three builds (the demo's traced NDP device and -fno-dfg PIM rank compile it once)."""
    import sim.backends.verilator as vb
    monkeypatch.setattr(vb, "BUILD_ROOT", tmp_path)
    exes = {vb.VerilatorBackend().executable(FPMul(fmt=FP16)),
            vb.VerilatorBackend(extra_flags=["-fno-dfg"]).executable(FPMul(fmt=FP16)),
            vb.VerilatorBackend(extra_flags=["--trace"], harness_filter=_vcd).executable(FPMul(fmt=FP16))}
    assert len(exes) == 3
    assert len([p for p in tmp_path.glob("runtime-*") if p.is_dir()]) == 1
