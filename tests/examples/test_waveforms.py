"""Waveforms from the examples and both simulators (issue 32 item 8): each file opens with pyvcd, and both
engines write one time base (1 ns per cycle of the clock, rising edges at 0.5 ns + k ns)."""

import importlib.util
from pathlib import Path

import pytest
from vcd.reader import TokenKind, tokenize

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "ps": 1e-12, "fs": 1e-15}


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def clock_edges_ns(path, clock="clk"):
    """(rising-edge times in ns, number of value changes) of the first variable named ``clock`` in the VCD at
    ``path``, read with pyvcd's tokenizer (its $timescale applied)."""
    unit, code, t, rises, changes = None, None, 0, [], 0
    with open(path, "rb") as f:
        for tok in tokenize(f):
            if tok.kind is TokenKind.TIMESCALE:
                ts = tok.timescale
                unit = ts.magnitude.value * UNITS_S[ts.unit.value] / 1e-9
            elif tok.kind is TokenKind.VAR and code is None and tok.var.reference == clock:
                code = tok.var.id_code
            elif tok.kind is TokenKind.CHANGE_TIME:
                t = tok.time_change
            elif tok.kind is TokenKind.CHANGE_SCALAR:
                changes += 1
                if tok.scalar_change.id_code == code and tok.scalar_change.value == "1":
                    rises.append(t * unit)
    if unit is None or code is None:
        raise AssertionError(f"{path}: no $timescale or no {clock!r} variable")
    return rises, changes


def _one_time_base(rises):
    assert rises, "the clock never rose"
    assert rises[0] == pytest.approx(0.5)
    assert all(b - a == pytest.approx(1.0) for a, b in zip(rises, rises[1:]))


def test_both_engines_write_one_time_base(tmp_path, capsys):
    """examples/waveform.py on Amaranth (VCD in fs) and Verilator (VCD in ps): the same clock edges in ns."""
    mod = _load("waveform")
    edges = {}
    for engine in ("amaranth", "verilator"):
        assert mod.main(["--engine", engine, "--out", str(tmp_path)]) == 0
        rises, changes = clock_edges_ns(tmp_path / f"fp16_mul_{engine}.vcd")
        _one_time_base(rises)
        assert changes > len(rises)                    # the design's signals move too
        edges[engine] = rises
    n = min(len(e) for e in edges.values())
    assert edges["amaranth"][:n] == pytest.approx(edges["verilator"][:n])
    capsys.readouterr()


def test_the_time_base_check_catches_a_file_in_another_base(tmp_path):
    """The check fails on a waveform whose clock runs one timestamp per evaluation (Verilator's harness before
    issue 32: 1 ps per half cycle)."""
    p = tmp_path / "bad.vcd"
    p.write_text("$timescale 1ps $end\n$scope module top $end\n$var wire 1 ! clk $end\n$upscope $end\n"
                 "$enddefinitions $end\n#0\n0!\n#1\n1!\n#2\n0!\n#3\n1!\n")
    rises, _ = clock_edges_ns(p)
    with pytest.raises(AssertionError):
        _one_time_base(rises)


@pytest.mark.parametrize("name, argv", [
    ("gemv_cxl", ["--engine", "amaranth", "--waveform", "{tmp}/gemv.vcd"]),
    ("pim_head", ["--engine", "amaranth", "--tokens", "8", "--waveform", "{tmp}/pim.vcd"]),
])
def test_example_waveform_opens_with_pyvcd(name, argv, tmp_path, capsys):
    """An example's ``--waveform FILE`` writes a file pyvcd reads, in the common time base, covering the run."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert _load(name).main(argv) == 0
    out = capsys.readouterr().out
    rises, _ = clock_edges_ns(argv[-1])
    _one_time_base(rises)
    if name == "gemv_cxl":
        cycles = int(out.split("whole run ")[1].split(")")[0])
        assert len(rises) >= cycles
    assert "waveform:" in out


@pytest.mark.parametrize("name, argv, what", [
    ("gemv_cxl", ["--engine", "amaranth", "--waveform", "x.fst"], "VCD only"),
    ("gemv_cxl", ["--waveform", "x.txt"], ".vcd"),
    ("pim_head", ["--waveform", "x.png"], ".vcd"),
    ("tiny_decode", ["--waveform", "x.vcd"], "--backend rtl"),
    ("tiny_decode", ["--backend", "rtl", "--waveform", "x.gz"], ".vcd or .fst"),
])
def test_a_bad_waveform_request_is_refused_before_anything_runs(name, argv, what, capsys):
    with pytest.raises(SystemExit) as e:
        _load(name).main(argv)
    assert e.value.code == 2 and what in capsys.readouterr().err
