"""The runnable examples (examples/) run and report success."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name,argv", [
    ("gemv_cxl", []),
    ("pim_head", ["--tokens", "48"]),
    ("verilog_custom", ["--out", "{tmp}"]),
    ("waveform", ["--out", "{tmp}"]),
    ("tiny_decode", ["--tokens", "2"]),
])
def test_example(name, argv, tmp_path, capsys):
    rc = _load(name).main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.strip()


def test_every_example_is_tested():
    tested = {"gemv_cxl", "pim_head", "verilog_custom", "waveform", "tiny_decode"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested
