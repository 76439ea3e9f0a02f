"""The traced Verilator build (sim.e2e.waveform.TracingVerilatorBackend): it writes a waveform only when given a
file, so one build serves a whole run (no file) and the waveform of one of its runs (the demo's rtl run and its
waveform); the same outputs and cycles either way; its design-cache entry is not the untraced build's."""

import numpy as np
import pytest

from hdl.fp import FPMul, FP16
from sim.e2e.design_cache import CachedVerilatorBackend, silence
from sim.e2e.waveform import TracingVerilatorBackend

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
