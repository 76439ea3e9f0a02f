"""ndpim plot over run directories of both hosts, the compare table, one style per system, list options in both
forms and the PLoRA sweeps' model / system filters (issue 32 item 7)."""

import argparse
import csv

import pytest

from host.cli import main, add_name_list
from host.plot import system_order, system_style, load_run, compare_rows, metric_value


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, argv in (("p", ["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "plora"]),
                       ("s", ["plora", "run", "--model", "llama2-7b", "--workload", "uniform", "--system", "s-lora"]),
                       ("l", ["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3",
                              "--no-progress"])):
        assert main(argv + ["--requests", "12", "--out", str(root / name)]) == 0
    return root


def test_plot_and_compare_table_over_both_hosts(runs, tmp_path, capsys):
    capsys.readouterr()
    rc = main(["plot", str(runs / "p"), str(runs / "s"), str(runs / "l"), "--metric", "tpot_ms_mean,duration_s",
               "--metric", "throughput_tok_s", "--out", str(tmp_path),
               "--table", str(tmp_path / "t.csv")])
    out = capsys.readouterr().out
    assert rc == 0
    for f in ("tpot_ms_mean.png", "duration_s.png", "throughput_tok_s.png", "t.csv"):
        assert (tmp_path / f).stat().st_size > 0
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert [(r["run"], r["host"], r["system"], r["model"]) for r in rows] == \
        [("p", "plora", "plora", "llama2-7b"), ("s", "plora", "s-lora", "llama2-7b"), ("l", "l3", "l3", "opt-66b")]
    # the table's numbers are the runs' own summary values
    for r, d in zip(rows, ("p", "s", "l")):
        assert float(r["tpot_ms_mean"]) == pytest.approx(metric_value(load_run(runs / d).summary, "tpot_ms_mean"))
    assert "s-lora" in out and "tpot_ms_mean" in out


def test_nested_metric_and_the_metric_list(runs, tmp_path, capsys):
    r = load_run(runs / "p")
    assert metric_value(r.summary, "cost_model_err.mean") == r.summary["cost_model_err"]["mean"]
    assert metric_value(r.summary, "no.such") is None
    assert compare_rows([r], ["cost_model_err.mean"])[0]["cost_model_err.mean"] == r.summary["cost_model_err"]["mean"]
    capsys.readouterr()
    assert main(["plot", str(runs / "p"), str(runs / "l"), "--list-metrics"]) == 0
    out = capsys.readouterr().out
    assert "tpot_ms_mean" in out and "duration_s" in out and "cost_model_err.mean" not in out   # (l3 has none)


@pytest.mark.parametrize("argv, what", [
    (["{p}", "--metric", "no_such_metric"], "--list-metrics"),
    (["{tmp}/missing"], "not a run directory"),
    (["{tmp}"], "no summary.json"),
])
def test_plot_refuses_bad_input_with_exit_2(runs, tmp_path, argv, what, capsys):
    argv = [a.replace("{p}", str(runs / "p")).replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as e:
        main(["plot", *argv, "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and what in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_every_system_of_both_hosts_has_its_own_colour():
    """13 PLoRA-grid systems (and every other of both hosts) in distinguishable styles; the check catches a
    palette that repeats."""
    order = system_order()
    assert len(order) >= 13 + 11
    colours = [system_style(n)["color"] for n in order]
    assert len(set(colours)) == len(order)
    from host.plora.config import SYSTEM_NAMES
    assert len({system_style(n)["color"] for n in SYSTEM_NAMES}) == len(SYSTEM_NAMES) == 13
    short = colours[:10] * 4                         # a mutant: the default 10-colour cycle
    assert len(set(short[:len(order)])) < len(order)


def test_list_options_take_both_forms():
    p = argparse.ArgumentParser()
    add_name_list(p, "--systems", ["a", "b", "c"])
    for argv in (["--systems", "a,b"], ["--systems", "a", "b"], ["--systems", "a,", "b"]):
        assert p.parse_args(argv).systems == "a,b"
    assert p.parse_args([]).systems is None
    with pytest.raises(SystemExit):
        p.parse_args(["--systems", "a", "z"])


def test_plora_sweep_and_figures_filter_by_model_and_system(tmp_path, capsys):
    from host.plora.figures import filter_specs, sweep_specs, figure_points
    specs = sweep_specs("link_latency")
    assert {s.system for s in filter_specs(specs, systems=["plora"])} == {"plora"}
    assert figure_points("link_latency", systems=["s-lora"]) == 0 and figure_points("tp_study", ["x"], ["y"]) == 1
    assert main(["plora", "sweep", "--name", "link_latency", "--systems", "pure-cxl", "--requests", "6", "--jobs", "1",
                 "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "link_latency.csv")))
    assert rows and {r["system"] for r in rows} == {"pure-cxl"}
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["plora", "sweep", "--name", "link_latency", "--systems", "s-lora", "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "no point" in capsys.readouterr().err
