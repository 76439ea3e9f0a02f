"""Small things a user notices (issue 32 item 9): the Verilog file name follows the configured format, and
``verilog --list --top T`` shows every field of every preset of T."""

from host.cli import main
from host.topcfg import catalogue, describe


def test_the_file_name_follows_the_format(tmp_path, capsys):
    for top, sets, name in (("fp16_add", ["fmt=fp32"], "fp32_add"), ("fp16_mul", ["out_fmt=fp32"], "fp16_mul_fp32"),
                            ("fp16_mac_fp16", ["acc=fp32"], "fp16_mac_fp32"), ("fp16_add", ["fmt=fp16"], "fp16_add")):
        argv = ["verilog", "--top", top, "--out", str(tmp_path)]
        for s in sets:
            argv += ["--set", s]
        assert main(argv) == 0
        text = (tmp_path / f"{name}.v").read_text()
        assert f"module {name}" in text                   # the module inside is named alike
    assert not (tmp_path / "fp16_add.v").read_text().count("fp32")   # (the fp16 adder's own file)
    capsys.readouterr()


def test_list_of_one_top_shows_its_whole_configuration(capsys):
    assert main(["verilog", "--list", "--top", "ndp_core"]) == 0
    out = capsys.readouterr().out
    spec = catalogue()["ndp_core"]
    for preset in spec.presets:
        assert f"preset {preset}" in out
        for item in describe(spec.config(preset)).split():
            assert f"    {item}\n" in out
    assert "more)" not in out                             # nothing cut


def test_iterations_csv_is_optional_and_per_stretch(tmp_path, capsys):
    """--iterations all / stretch / none (issue 32 item 9): a stretch row sums its iterations' durations and counts
    them, so the stretch file adds up to the full one; none writes no file; config.json records the mode."""
    import json
    import pandas as pd
    from host.serving.rundir import stretch_rows, iterations_mode, AUTO_ALL_MAX
    base = ["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora", "--requests", "30"]
    for mode in ("all", "stretch", "none"):
        assert main(base + ["--iterations", mode, "--out", str(tmp_path / mode)]) == 0
        assert json.loads((tmp_path / mode / "config.json").read_text())["iterations_csv"] == mode
    full = pd.read_csv(tmp_path / "all" / "iterations.csv")
    st = pd.read_csv(tmp_path / "stretch" / "iterations.csv")
    assert len(st) < len(full) and st["iterations"].sum() == len(full)
    assert st["duration_s"].sum() == __import__("pytest").approx(full["duration_s"].sum(), rel=1e-12)
    assert not (tmp_path / "none" / "iterations.csv").exists()
    # consecutive rows of one composition are one stretch; a change of composition starts the next
    cols = {"start_s": [0.0, 1.0, 2.0, 3.0], "duration_s": [1.0, 1.0, 1.0, 2.0], "n_decode": [4, 4, 5, 4],
            "kv_tokens": [10, 20, 30, 40]}
    s = stretch_rows(cols)
    assert list(s["iterations"]) == [2, 1, 1] and list(s["duration_s"]) == [2.0, 1.0, 2.0]
    assert list(s["kv_tokens"]) == [15.0, 30.0, 40.0] and list(s["start_s"]) == [0.0, 2.0, 3.0]
    assert iterations_mode("auto", AUTO_ALL_MAX) == "all" and iterations_mode("auto", AUTO_ALL_MAX + 1) == "stretch"
    capsys.readouterr()


def test_a_plora_run_that_leaves_requests_unserved_exits_1(tmp_path, capsys, monkeypatch):
    """Issue 32 item 3: `ndpim plora run` exits 1 when requests are left unserved (here the engine stops after 5
    iterations); the run directory is still written, and its regime figures cope with the unfinished requests."""
    import host.plora.run as R
    from host.serving import EngineConfig
    real = R.run_spec

    def stopped_early(spec, **kw):
        kw["engine_config"] = EngineConfig(max_iterations=5, trace=True, record_iterations=True)
        return real(spec, **kw)
    monkeypatch.setattr(R, "run_spec", stopped_early)
    base = ["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora", "--requests", "6"]
    assert main(base + ["--out", str(tmp_path / "a")]) == 1
    assert "FAILED" in capsys.readouterr().err and (tmp_path / "a" / "summary.json").is_file()
    monkeypatch.setattr(R, "run_spec", real)
    assert main(base + ["--out", str(tmp_path / "b")]) == 0
