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


def test_gemv_example_fails_when_the_device_refuses(capsys):
    """A GEMV the device refuses (issue 32: it used to print "bit-exact: True" and exit 0) exits 1 and says why;
    arguments out of range are refused before anything runs."""
    mod = _load("gemv_cxl")
    rc = mod.main(["--k", "512", "--n", "32"])
    out = capsys.readouterr().out
    assert rc == 1 and "INPUT_TOO_LARGE" in out and "bit-exact" not in out
    for argv in (["--k", "12"], ["--n", "0"], ["--k", "2048", "--n", "64"]):
        with pytest.raises(SystemExit) as e:
            mod.main(argv)
        assert e.value.code == 2
