"""``ndpim dse`` (host/dse): the Pareto rule, budgets, argument checks, the small grid's table and figure, and the
front points' Verilog lint-clean (docs/dse.md)."""

import csv
import json

import pytest

from host.cli import main
from host.dse import price as P
from host.dse.pareto import apply_budgets, dominates, pareto_front
from host.dse.space import GRIDS, NOT_SWEPT, Point, grid_points


def _row(name, a, w, area=1.0, power=1.0):
    return {"point": name, "status": "priced", "tok_s_per_mm2": a, "tok_s_per_w": w, "area_mm2": area,
            "power_w": power}


# -- the Pareto rule --------------------------------------------------------------------------------------------

def test_a_dominated_point_is_off_the_front():
    rows = [_row("a", 10, 1), _row("b", 5, 5), _row("c", 4, 4), _row("d", 1, 10)]
    assert pareto_front(rows) == [0, 1, 3]                 # c is beaten by b on both
    assert dominates(rows[1], rows[2]) and not dominates(rows[2], rows[1])


def test_equal_points_are_both_on_the_front_and_one_better_coordinate_dominates():
    rows = [_row("a", 3, 3), _row("b", 3, 3)]
    assert pareto_front(rows) == [0, 1]                     # neither strictly better
    rows = [_row("a", 3, 3), _row("b", 3, 2)]
    assert pareto_front(rows) == [0]                        # a equal on one, better on the other
    assert not dominates(rows[0], rows[0])


@pytest.mark.parametrize("mutant", ["flip_ge", "min_not_max", "all_not_any"])
def test_a_mutant_of_the_rule_is_caught(mutant):
    """Each mutant of ``dominates`` gives a different front on these points than the rule does."""
    rows = [_row("a", 10, 1), _row("b", 5, 5), _row("c", 4, 4), _row("d", 1, 10), _row("e", 5, 4)]
    keys = ("tok_s_per_mm2", "tok_s_per_w")
    mutants = {
        "flip_ge": lambda a, b: all(a[k] <= b[k] for k in keys) and any(a[k] > b[k] for k in keys),
        "min_not_max": lambda a, b: all(a[k] <= b[k] for k in keys) and any(a[k] < b[k] for k in keys),
        "all_not_any": lambda a, b: all(a[k] >= b[k] for k in keys) and all(a[k] > b[k] for k in keys),
    }
    m = mutants[mutant]
    mutant_front = [i for i, r in enumerate(rows) if not any(m(q, r) for j, q in enumerate(rows) if j != i)]
    assert pareto_front(rows) == [0, 1, 3]
    assert mutant_front != [0, 1, 3]


def test_budgets_exclude_and_say_which():
    rows = [_row("a", 1, 1, area=10, power=2), _row("b", 1, 1, area=30, power=2), _row("c", 1, 1, area=5, power=9),
            {"point": "d", "status": "failed"}]
    apply_budgets(rows, area_mm2=20, power_w=5)
    assert rows[0]["budget"] == "feasible"
    assert rows[1]["budget"].startswith("excluded: area 30") and "budget 20" in rows[1]["budget"]
    assert rows[2]["budget"].startswith("excluded: power 9")
    assert rows[3]["budget"] == "not priced"


# -- the space and its arguments --------------------------------------------------------------------------------

def test_grid_points_and_the_paper_core_is_in_the_full_grid():
    pts = grid_points(GRIDS["full"])
    assert len(pts) == 15 and Point(1024, 1024, 512, 512) in pts
    sets = dict(P.point_sets(Point(1024, 1024, 512, 512)))
    assert sets == {}                                       # the paper point is the paper preset itself
    spec, cfg = P.core_config(Point(2048, 512, 512, 512))
    assert (cfg.ndp.lanes, cfg.ndp.pe_batch, cfg.ndp.dram_buffer_bytes) == (512, 4, 512 << 10)
    assert "pim.rank_buffer_bytes" in NOT_SWEPT and "ndp.channels / internal_bw_gbps" in NOT_SWEPT
    assert not any("rank_adders" in k for k in NOT_SWEPT)  # swept: the PIM family (tests/host/test_dse_pim.py)


@pytest.mark.parametrize("argv, needle", [
    (["--macs", "300"], "300] outside the allowed range 4 .. 65536, a power of two"),
    (["--macs", "2"], "outside the allowed range 4 .. 65536"),
    (["--dram-buffer-kib", "0"], "outside the allowed range 1 .. 1048576"),
    (["--area-budget-mm2", "-1"], "must be a finite number > 0"),
    (["--macs", "x"], "a comma-separated list of integers"),
])
def test_bad_input_exits_2_naming_the_range(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        main(["dse", "--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


# -- the command on the small grid -----------------------------------------------------------------------------

def _composed_area(point, *, cache=True, progress=None):
    """A stand-in for the mapped area in the command-level test (the mapping of the decoder alone takes minutes
    on a cold cache; the bench prices the real one): 0.01 mm^2 per MAC + 2 mm^2, 2 mW per MAC + 0.5 W. Only the
    plumbing (table, figure, budgets, exit status) is under test here."""
    spec, cfg = P.core_config(point)
    c = cfg.ndp
    return {"lanes": c.lanes, "pe_rows": c.pe_batch, "sfu_lanes": c.sfu_lanes, "logic_mm2": 0.01 * c.macs,
            "glue_estimate_mm2": 0.0, "sram_mm2": 2.0, "sram_bits": 0, "core_mm2": 0.01 * c.macs + 2.0,
            "mac_w": 0.002 * c.macs, "sram_w": 0.0, "leak_w": 0.5, "core_w": 0.002 * c.macs + 0.5, "area_s": 0.0}


def test_small_grid_writes_the_pareto_table_and_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "core_area_power", _composed_area)
    out = tmp_path / "dse"
    rc = main(["dse", "--out", str(out), "--small", "--families", "ndp", "--jobs", "1", "--verilog", "none",
               "--macs", "256,512,1024", "--area-budget-mm2", "40"])
    assert rc == 0
    rows = list(csv.DictReader(open(out / "points.csv")))
    assert [r["point"] for r in rows] == ["m256-d1024k-i512k-o512k", "m512-d1024k-i512k-o512k",
                                         "m1024-d1024k-i512k-o512k"]
    assert all(r["status"] == "priced" for r in rows)
    # four devices x (0.01 x 1024 + 2) mm^2 = 48.96 > 40: excluded
    assert rows[2]["budget"].startswith("excluded: area 48.96")
    for r in rows:
        assert float(r["tok_s_per_mm2"]) == pytest.approx(float(r["throughput_tok_s"]) / float(r["area_mm2"]))
        assert r["ndp_geometry"].startswith("calibrated")
    front = list(csv.DictReader(open(out / "pareto.csv")))
    assert front and all(r["budget"] == "feasible" for r in front)
    md = (out / "pareto.md").read_text()
    assert "### Front, ndp" in md and "## Not swept" in md and "pim.rank_buffer_bytes" in md
    assert "DIMM-PIM family" not in md and {r["family"] for r in rows} == {"ndp"}
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "dse.json").read_text())
    assert data["setup"]["area_budget_mm2"] == 40 and len(data["rows"]) == 3
    assert "pricing" in capsys.readouterr().out


def test_a_point_that_cannot_be_priced_is_a_row_and_none_priced_exits_1(tmp_path, monkeypatch, capsys):
    def broken(point, **kw):
        raise RuntimeError("no area for this point")
    monkeypatch.setattr(P, "core_area_power", broken)
    out = tmp_path / "dse"
    rc = main(["dse", "--out", str(out), "--small", "--families", "ndp", "--jobs", "1", "--verilog", "none",
               "--macs", "256"])
    assert rc == 1
    rows = list(csv.DictReader(open(out / "points.csv")))
    assert rows[0]["status"] == "failed" and "no area for this point" in rows[0]["reason"]
    assert "no point could be priced" in capsys.readouterr().err


def test_the_front_points_verilog_is_lint_clean(tmp_path):
    from host.dse.cli import verilog_check
    row = {"macs": 16, "dram_buffer_kib": 64, "input_buffer_kib": 64, "output_buffer_kib": 64}
    res = verilog_check(row, tmp_path, say=lambda s: None)
    assert res["lint_ok"], (tmp_path / "verilog" / "m16-d64k-i64k-o64k" / "lint.txt").read_text()
    cmd = (tmp_path / "verilog" / "m16-d64k-i64k-o64k" / "command.txt").read_text()
    assert "--set ndp.macs=16" in cmd and "--counts-only NDPCore" in cmd


def test_runs_on_a_dask_cluster(monkeypatch):
    """``--cluster``'s executor (an in-process Dask cluster here) gives the same rows as the local pool."""
    from dask.distributed import Client
    from host.dse.cli import run_dse
    from host.sweep.executor import DaskExecutor, LocalExecutor
    monkeypatch.setattr(P, "core_area_power", _composed_area)
    pts = [Point(256, 1024, 512, 512), Point(512, 1024, 512, 512)]
    local = run_dse(pts, P.WORKLOADS["small"], executor=LocalExecutor(jobs=1, progress=False), say=lambda s: None)
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as c:
        dask = run_dse(pts, P.WORKLOADS["small"], executor=DaskExecutor(client=c, progress=False),
                       say=lambda s: None)
    key = lambda rs: [(r["point"], r["throughput_tok_s"], r["area_mm2"], r["pareto"]) for r in rs]  # noqa: E731
    assert key(dask["rows"]) == key(local["rows"])
