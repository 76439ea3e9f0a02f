"""Every bad command line ends the same way (issue 32, item 5): exit status 2, one error line on stderr naming the
flag and what it allows, no traceback, nothing written -- and no work started: the functions that do a command's
work are replaced by one that fails the test, so a check that goes missing shows here in milliseconds instead of
starting a run."""

import subprocess
import sys
from pathlib import Path

import pytest

from host import cli

FILE = "{file}"             # an existing regular file
RUN = "{run}"               # a directory that does not exist yet (nothing may create it)
USED = "{used}"             # a directory holding a previous run's files


def _profile(tmp, name, edit=None, text=None):
    import pandas as pd
    from host.gpu.profiles import VIDUR_PROFILES
    path = tmp / name
    if text is not None:
        path.write_text(text)
        return str(path)
    df = pd.read_csv(VIDUR_PROFILES[("a100", "llama2-7b")]).head(4)
    if edit:
        df = edit(df)
    df.to_csv(path, index=False)
    return str(path)


def _non_numeric(df):
    df = df.astype({"n_embd": object})
    df.loc[2, "n_embd"] = "abc"
    return df


# (argv, the flag the message names, what else the message says)
CASES = {
    "demo-requests": (["demo", "--requests", "-1", "--out", RUN], "--requests", "integer >= 1, got -1"),
    "demo-tokens": (["demo", "--tokens", "-3", "--out", RUN], "--tokens", "integer >= 1, got -3"),
    "demo-tokens-text": (["demo", "--tokens", "many", "--out", RUN], "--tokens", "integer >= 1, got 'many'"),
    "demo-long": (["demo", "--requests", "2", "--long", "3", "--out", RUN], "--long", "<= --requests (2), got 3"),
    "demo-short-prompt": (["demo", "--short-prompt", "64", "8", "--out", RUN], "--short-prompt",
                          "MIN must be <= MAX, got 64 8"),
    "demo-short-prompt-zero": (["demo", "--short-prompt", "0", "8", "--out", RUN], "--short-prompt", ">= 1"),
    "demo-long-context": (["demo", "--long-context", "-5", "--out", RUN], "--long-context", ">= 1, got -5"),
    "demo-budget": (["demo", "--budget-kb", "-10", "--out", RUN], "--budget-kb", ">= 0, got -10"),
    "demo-budget-nan": (["demo", "--budget-kb", "nan", "--out", RUN], "--budget-kb", "finite number >= 0"),
    "demo-seed": (["demo", "--seed", "-1", "--out", RUN], "--seed", ">= 0"),
    "demo-out-file": (["demo", "--out", FILE], "--out", "is a file, not a directory"),
    "demo-fst-amaranth": (["demo", "--waveform-format", "fst", "--waveform-engine", "amaranth", "--out", RUN],
                          "--waveform-format", "VCD only"),
    "demo-fst-burst": (["demo", "--waveform-format", "fst", "--ndp-memory", "burst", "--out", RUN],
                       "--waveform-format", "VCD only"),
    "demo-out-used": (["demo", "--out", USED], "--out", "pass --force"),
    "calibrate-waves": (["e2e", "calibrate", "--waves", "0"], "--waves", ">= 1, got 0"),
    "plora-sweep-system": (["plora", "sweep", "--name", "grid", "--systems", "plora,bogus", "--out", RUN],
                           "--systems", "unknown 'bogus'; allowed:"),
    "plora-sweep-model": (["plora", "sweep", "--name", "grid", "--models", "llama2-7b", "bogus", "--out", RUN],
                          "--models", "unknown 'bogus'; allowed:"),
    "plora-sweep-name": (["plora", "sweep", "--name", "bogus", "--out", RUN], "--name", "invalid choice: 'bogus'"),
    "plora-sweep-jobs": (["plora", "sweep", "--name", "grid", "--jobs", "0", "--out", RUN], "--jobs", ">= 1, got 0"),
    "plora-sweep-requests": (["plora", "sweep", "--name", "grid", "--requests", "-5", "--out", RUN], "--requests",
                             ">= 1, got -5"),
    "plora-sweep-out-file": (["plora", "sweep", "--name", "grid", "--out", FILE], "--out", "is a file"),
    "plora-figures-jobs": (["plora", "figures", "--jobs", "0", "--out", RUN], "--jobs", ">= 1, got 0"),
    "plora-run-system": (["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "bogus",
                          "--out", RUN], "--system", "invalid choice: 'bogus'"),
    "plora-run-model": (["plora", "run", "--model", "bogus", "--workload", "uniform", "--system", "plora",
                         "--out", RUN], "--model", "invalid choice: 'bogus'"),
    "plora-run-requests": (["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora",
                            "--requests", "-5", "--out", RUN], "--requests", ">= 1, got -5"),
    "plora-run-devices": (["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora",
                           "--devices", "-1", "--out", RUN], "--devices", "in 0..4096, got -1"),
    "plora-run-rate": (["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora",
                        "--rate", "0", "--out", RUN], "--rate", "> 0, got 0"),
    "plora-run-out-file": (["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora",
                            "--out", FILE], "--out", "is a file"),
    "plora-run-out-used": (["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora",
                            "--out", USED], "--out", "pass --force"),
    "l3-run-max-total": (["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3",
                          "--max-total-tokens", "1", "--out", RUN], "--max-total-tokens", "in 2..131072, got 1"),
    "l3-run-max-total-trace": (["l3", "run", "--model", "opt-66b", "--trace", "trace", "--system", "l3",
                                "--max-total-tokens", "4096", "--out", RUN], "--max-total-tokens",
                               "bounds a generated trace"),
    "l3-sweep-system": (["l3", "sweep", "--systems", "l3,bogus", "--out", RUN], "--systems",
                        "unknown 'bogus'; allowed: ['l3'"),
    "l3-sweep-model": (["l3", "sweep", "--models", "gpt-5", "--out", RUN], "--models", "unknown 'gpt-5'; allowed"),
    "l3-sweep-trace": (["l3", "sweep", "--traces", "nope", "--out", RUN], "--traces", "unknown 'nope'; allowed"),
    "l3-sweep-empty": (["l3", "sweep", "--systems", ",", "--out", RUN], "--systems", "one or more of"),
    "l3-sweep-jobs": (["l3", "sweep", "--jobs", "0", "--out", RUN], "--jobs", ">= 1, got 0"),
    "l3-sweep-requests": (["l3", "sweep", "--requests", "-5", "--out", RUN], "--requests", ">= 1, got -5"),
    "l3-sweep-utilization": (["l3", "sweep", "--gpu-memory-utilization", "1.5", "--out", RUN],
                             "--gpu-memory-utilization", "> 0 and <= 1, got 1.5"),
    "l3-sweep-out-file": (["l3", "sweep", "--out", FILE], "--out", "is a file"),
    "l3-figures-requests": (["l3", "figures", "--requests", "0", "--out", RUN], "--requests", ">= 1, got 0"),
    "l3-run-system": (["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "bogus", "--out", RUN],
                      "--system", "invalid choice: 'bogus'"),
    "l3-run-model": (["l3", "run", "--model", "gpt-5", "--trace", "openr1", "--system", "l3", "--out", RUN],
                     "--model", "invalid choice: 'gpt-5'"),
    "l3-run-requests": (["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3", "--requests",
                         "-5", "--out", RUN], "--requests", ">= 1, got -5"),
    "l3-run-ranksets": (["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3", "--ranksets",
                         "99", "--out", RUN], "--ranksets", "in 1..32, got 99"),
    "l3-run-min-gpu-tokens": (["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3",
                               "--min-gpu-tokens", "kne", "--out", RUN], "--min-gpu-tokens", "'knee' or 'ridge'"),
    "l3-run-min-gpu-tokens-system": (["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "gpu-only",
                                      "--min-gpu-tokens", "64", "--out", RUN], "--min-gpu-tokens",
                                     "applies to the L3 systems, not gpu-only"),
    "l3-run-out-file": (["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3", "--out", FILE],
                        "--out", "is a file"),
    "l3-run-out-used": (["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3", "--out", USED],
                        "--out", "pass --force"),
    "gpu-missing": (["gpu", "predict", "--gpu", "a100", "--profile", "{tmp}/none.csv", "--out", RUN + "/p.csv"],
                    "--profile", "no such file"),
    "gpu-empty": (["gpu", "predict", "--gpu", "a100", "--profile", "{empty}", "--out", RUN + "/p.csv"],
                  "--profile", "not a readable CSV"),
    "gpu-ragged": (["gpu", "predict", "--gpu", "a100", "--profile", "{ragged}", "--out", RUN + "/p.csv"],
                   "--profile", "not a readable CSV (Error tokenizing data"),
    "gpu-columns": (["gpu", "predict", "--gpu", "a100", "--profile", "{columns}", "--out", RUN + "/p.csv"],
                    "--profile", "missing columns ['n_head'"),
    "gpu-non-numeric": (["gpu", "predict", "--gpu", "a100", "--profile", "{non_numeric}", "--out", RUN + "/p.csv"],
                        "--profile", "column n_embd must be numeric, line 4 holds 'abc'"),
    "gpu-out-dir": (["gpu", "predict", "--gpu", "a100", "--profile", "{good}", "--out", USED], "--out",
                    "is a directory, not a file"),
    "gpu-out-under-file": (["gpu", "predict", "--gpu", "a100", "--profile", "{good}", "--out", FILE + "/p.csv"],
                           "--out", "is a file, not a directory"),
    "verilog-set-no-top": (["verilog", "--set", "lanes=-16", "--out", RUN], "--top", "need exactly one --top"),
    "verilog-lanes": (["verilog", "--top", "ndp_pe_array", "--set", "lanes=-16", "--out", RUN], "--set",
                      "lanes=-16: lanes must be a power of two >= 2, got -16"),
    "verilog-fmt": (["verilog", "--top", "fp32_add", "--set", "fmt=fp99", "--out", RUN], "--set",
                    "fmt must be one of ['fp16', 'fp32'], got 'fp99'"),
    "verilog-paper-flat": (["verilog", "--top", "ndp_core", "--preset", "paper", "--out", RUN], "--hier",
                           "does not fit"),
    "verilog-macs": (["verilog", "--top", "ndp_core", "--set", "ndp.macs=abc", "--out", RUN], "--set",
                     "ndp.macs=abc: expected an integer, got 'abc'"),
    "verilog-macs-range": (["verilog", "--top", "ndp_core", "--set", "ndp.macs=-3", "--out", RUN], "--set",
                           "macs must be an int in 1..65536, got -3"),
    "verilog-field": (["verilog", "--top", "ndp_core", "--set", "lanes=16", "--out", RUN], "--set",
                      "no field 'lanes'"),
    "verilog-preset": (["verilog", "--top", "ndp_core", "--preset", "huge", "--out", RUN], "--preset",
                       "no preset 'huge'"),
    "verilog-top": (["verilog", "--top", "bogus", "--out", RUN], "--top", "unknown top(s) ['bogus']"),
    "verilog-out-file": (["verilog", "--top", "fp32_add", "--out", FILE], "--out", "is a file, not a directory"),
    "synth-set-mode": (["synth", "--top", "fp32_add", "--set", "fmt=fp16"], "--mode", "need --mode hier"),
    "synth-hier-set": (["synth", "--mode", "hier", "--top", "fp32_add", "--set", "fmt=fp99"], "--set",
                       "got 'fp99'"),
    "synth-area-mode": (["synth", "--area", "--mode", "fast"], "--area", "takes only --top, --liberty and --json"),
    "synth-area-liberty": (["synth", "--area", "--top", "fp16_add", "--liberty", FILE + "/none.lib"], "--liberty",
                           "does not exist"),
    "synth-area-top": (["synth", "--area", "--top", "bogus"], "--top", "unknown top(s) ['bogus']"),
}


class WorkStarted(Exception):
    """Not a ValueError / RuntimeError: no command turns it into a message of its own."""


def _started(*args, **kw):
    raise WorkStarted("the command started its work")


@pytest.fixture
def no_work(monkeypatch):
    """Every function that does a command's work fails the test if reached."""
    import host.cli
    import host.e2e.calibrate
    import host.e2e.demo
    import host.gpu.model
    import host.l3.figures
    import host.l3.run
    import host.l3.sweep
    import host.plora.figures
    import host.plora.run
    import sim.synth.hier
    import sim.energy.area
    for mod, name in ((sim.energy.area, "module_areas"), (sim.energy.area, "paper_figures"),
                      (host.e2e.demo, "demo"), (host.e2e.calibrate, "calibrate_ndp"),
                      (host.e2e.calibrate, "calibrate_pim_for"), (host.plora.run, "run_spec"),
                      (host.plora.figures, "run_sweep"), (host.plora.figures, "make_figures"),
                      (host.l3.run, "run_l3"), (host.l3.sweep, "run_points"), (host.l3.figures, "make_figures"),
                      (host.cli, "_cached_verilog"), (host.gpu.model, "GPUModel"), (sim.synth.hier, "hier_cells")):
        monkeypatch.setattr(mod, name, _started)


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "file").write_text("not a directory\n")
    used = tmp_path / "used"
    used.mkdir()
    (used / "config.json").write_text("{}\n")
    return {"tmp": str(tmp_path), "file": str(tmp_path / "file"), "run": str(tmp_path / "run"), "used": str(used),
            "empty": _profile(tmp_path, "empty.csv", text=""),
            "ragged": _profile(tmp_path, "ragged.csv", text="n_head,n_embd\n1,2\n1,2,3,4\n"),
            "columns": _profile(tmp_path, "columns.csv", text="a,b\n1,2\n"),
            "non_numeric": _profile(tmp_path, "non_numeric.csv", edit=_non_numeric),
            "good": _profile(tmp_path, "good.csv")}


def _tree(path):
    return sorted((str(p.relative_to(path)), p.read_bytes() if p.is_file() else None) for p in Path(path).rglob("*"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_command_line_is_one_line_exit_2_and_writes_nothing(case, paths, no_work, capsys, monkeypatch):
    argv, flag, says = CASES[case]
    argv = [a.format(**paths) for a in argv]
    monkeypatch.chdir(paths["tmp"])
    before = _tree(paths["tmp"])
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2, (e.value.code, err)
    assert out == "" and "Traceback" not in err
    lines = err.rstrip("\n").splitlines()
    assert lines and lines[0].startswith("usage: ndpim")
    errors = [line for line in lines if ": error: " in line]
    assert errors == [lines[-1]], err                    # one message, the last line
    assert flag in lines[-1] and says in lines[-1], lines[-1]
    assert _tree(paths["tmp"]) == before                 # no run directory made, nothing overwritten


def test_every_issue_case_is_here():
    """The cases issue 32 item 5 lists, by name."""
    need = {"demo-requests", "demo-tokens", "demo-short-prompt", "demo-long-context", "demo-budget",
            "plora-sweep-system", "plora-sweep-model", "plora-sweep-jobs", "plora-sweep-requests", "l3-sweep-system",
            "l3-sweep-model", "l3-sweep-jobs", "l3-sweep-requests", "gpu-missing", "gpu-ragged", "gpu-non-numeric",
            "verilog-set-no-top", "verilog-lanes", "verilog-fmt", "verilog-macs", "demo-out-file",
            "plora-run-out-file", "l3-run-out-file", "verilog-out-file", "demo-out-used", "plora-run-out-used",
            "l3-run-out-used"}
    assert need <= set(CASES)


@pytest.mark.parametrize("argv", [
    ["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora", "--out", "{used}",
     "--force"],
    ["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3", "--out", "{used}", "--force"],
    ["demo", "--out", "{used}", "--force"],
    ["demo"],                                   # its default directory, build/demo, is rewritten by every run
    ["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora", "--out", "{tmp}/new"],
])
def test_good_command_lines_reach_the_work(argv, paths, no_work, monkeypatch):
    """The checks refuse only what they should: --force, the demo's default directory and a new directory pass."""
    monkeypatch.chdir(paths["tmp"])
    (Path(paths["tmp"]) / "build" / "demo").mkdir(parents=True)
    (Path(paths["tmp"]) / "build" / "demo" / "config.json").write_text("{}\n")
    with pytest.raises(WorkStarted):
        cli.main([a.format(**paths) for a in argv])


def test_the_installed_entry_exits_2_without_a_traceback(tmp_path):
    """`python -m host.cli` (what the ndpim script runs): the status reaches the shell, the message is one line."""
    r = subprocess.run([sys.executable, "-m", "host.cli", "l3", "sweep", "--jobs", "0", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.splitlines()[-1] == "ndpim l3 sweep: error: argument --jobs: must be an integer >= 1, got 0"
    assert not (tmp_path / "o").exists()
    r = subprocess.run([sys.executable, "-m", "host.cli", "--version"], capture_output=True, text=True, timeout=120)
    from importlib.metadata import version
    assert r.returncode == 0 and r.stdout.strip() == f"ndpim {version('ndpim')}"
