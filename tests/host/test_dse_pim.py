"""``ndpim dse``'s DIMM-PIM family (host/dse, docs/dse.md): rank-PU adder counts priced by the L3 host with their own
RTL calibrations (data/pim_rtl_calibration.json), an uncalibrated count a failed row naming the command, the axis
checks, the calibrations loaded by the models, the PIM front's Verilog, and the L3 host's ``pim.rank_adders``."""

import csv
import json
from dataclasses import replace

import pytest

from hdl.pim.config import PAPER
from host.cli import main
from host.dse import price as P
from host.dse.space import PIM_GRIDS, PIMPoint, pim_grid_points
from sim.perf.pim import (PIMPerfModel, PIMSequenceModel, calibration_key, load_calibration)


def _adders(n):
    return replace(PAPER, rank_adders=n, name=f"paper-a{n}")


# -- the calibrations --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [16, 32, 64])
def test_the_committed_adder_calibrations_are_loaded_by_the_models(n):
    cal = load_calibration(_adders(n))
    assert calibration_key(_adders(n)) == f"c8-b16-d128-a{n}-fp16-ddr4-3200"
    assert cal["config"] == f"paper-r32-a{n}" and cal["fixed_residuals"] == [0, 0, 0]
    assert PIMPerfModel.calibrated(_adders(n)).fixed_cycles == cal["fixed_cycles"]
    seq = PIMSequenceModel.calibrated(_adders(n))
    assert (seq.gap, seq.tail) == (cal["gap"], cal["tail"])
    # the model with these latencies reproduces every measured head (as measure_calibration checked)
    for L, cycles in cal["rtl_head_cycles"].items():
        h = seq.run([int(L)]).heads[0]
        assert h.done - h.first_cmd + 1 == cycles


def test_an_uncalibrated_count_is_refused_naming_the_command():
    with pytest.raises(ValueError, match="no RTL calibration.*--calibrate"):
        PIMPerfModel.calibrated(_adders(24))


def test_calibration_names_paper_variants_and_rejects_bad_ones():
    from sim.bench.pim import calibration_config
    make, lengths = calibration_config("paper-a16")
    cfg = make()
    assert (cfg.rank_adders, cfg.chips, cfg.banks, cfg.head_dim) == (16, 8, 16, 128)
    assert lengths == calibration_config("paper")[1]
    assert calibration_key(cfg) == calibration_key(_adders(16))
    with pytest.raises(ValueError, match="rank_adders = 7 < chips = 8"):
        calibration_config("paper-a7")[0]()
    with pytest.raises(ValueError, match="paper-a<N>"):
        calibration_config("paper-x16")


# -- the L3 host at another rank PU ------------------------------------------------------------------------------

def test_the_l3_host_times_a_calibrated_rank_pu_and_refuses_an_uncalibrated_one():
    from host.l3.config import l3_setup
    from host.l3.pim_side import PIMSide
    s = l3_setup("opt-66b", hardware={"pim": {"rank_adders": 16}})
    side = PIMSide(s)
    assert side.timing.config == _adders(16)
    assert side.timing.fixed_cycles == load_calibration(_adders(16))["fixed_cycles"]
    assert PIMSide(l3_setup("opt-66b")).timing.config == PAPER
    with pytest.raises(ValueError, match=r"--calibrate paper-a24"):
        l3_setup("opt-66b", hardware={"pim": {"rank_adders": 24}})


def test_ndpim_l3_run_rejects_an_uncalibrated_or_out_of_range_count(tmp_path, capsys):
    for value, needle in (("24", "--calibrate paper-a24"), ("5", "pim.rank_adders")):
        with pytest.raises(SystemExit) as e:
            main(["l3", "run", "--model", "opt-66b", "--trace", "dolphin", "--system", "l3", "--requests", "2",
                  "--out", str(tmp_path / value), "--set", f"pim.rank_adders={value}"])
        assert e.value.code == 2
        assert needle in capsys.readouterr().err


# -- the DSE family ----------------------------------------------------------------------------------------------

def _composed_rank(point, *, cache=True, progress=None):
    """A stand-in for the mapped rank (the rank PU's first mapping takes ~80 s on a cold cache; docs/dse.md's run
    prices the real one): 1 mm^2 + 0.01 per adder, 0.2 W + 0.001 per adder. Only the plumbing is under test."""
    a = point.rank_adders
    return {"dead_adders": 0, "rank_pu_logic_mm2": 0.01 * a, "rank_pu_sram_mm2": 1.0, "bank_pu_mm2": 0.0,
            "bank_pus_per_rank": 128, "rank_mm2": 1.0 + 0.01 * a, "rank_pu_w": 0.2, "bank_pu_w": 0.0,
            "rank_w": 0.2 + 0.001 * a, "area_s": 0.0}


def test_small_grid_has_calibrated_pim_points():
    pts = pim_grid_points(PIM_GRIDS["small"])
    assert pts and all(p.family == "pim" for p in pts)
    for p in pts:
        load_calibration(p.config())            # every --small PIM point is calibrated: no RTL run in the tests


def test_pim_small_run_with_an_uncalibrated_point_as_a_failed_row(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "rank_area_power", _composed_rank)
    out = tmp_path / "dse"
    rc = main(["dse", "--out", str(out), "--small", "--families", "pim", "--jobs", "1", "--verilog", "none",
               "--rank-adders", "8,16,12", "--pim-area-budget-mm2", "70"])
    assert rc == 0
    rows = {r["point"]: r for r in csv.DictReader(open(out / "points.csv"))}
    assert set(rows) == {"pim-a8", "pim-a16", "pim-a12"} and {r["family"] for r in rows.values()} == {"pim"}
    bad = rows["pim-a12"]
    assert bad["status"] == "failed" and "python -m sim.bench.pim --calibrate paper-a12" in bad["reason"]
    for n in ("pim-a8", "pim-a16"):
        r = rows[n]
        assert r["status"] == "priced" and int(r["ranks"]) == 64          # 16 channels x 4 ranks (L3 Table 2)
        assert int(r["pim_fixed_cycles"]) == load_calibration(_adders(int(r["rank_adders"])))["fixed_cycles"]
        assert float(r["area_mm2"]) == pytest.approx(64 * float(r["rank_mm2"]))
        assert float(r["tok_s_per_w"]) == pytest.approx(float(r["throughput_tok_s"]) / float(r["power_w"]))
        assert float(r["throughput_tok_s"]) > 0
    # 64 ranks x (1 + 0.01 x 16) mm^2 = 74.24 > 70: a16 excluded; a8's 64 x 1.08 = 69.12 fits
    assert rows["pim-a16"]["budget"].startswith("excluded: area 74.24") and rows["pim-a8"]["budget"] == "feasible"
    front = list(csv.DictReader(open(out / "pareto.csv")))
    assert [r["point"] for r in front] == ["pim-a8"]
    data = json.loads((out / "dse.json").read_text())
    assert data["setup"]["pim_area_budget_mm2"] == 70 and data["fronts"]["ndp"] == []
    md = (out / "pareto.md").read_text()
    assert "DIMM-PIM family" in md and "### Front, pim" in md and "pim-a12: " in md
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "pim-a12" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["--rank-adders", "4"], "[4] outside the allowed range 8 .. 64"),
    (["--rank-adders", "65"], "[65] outside the allowed range 8 .. 64"),
    (["--rank-adders", "x"], "a comma-separated list of integers"),
    (["--families", "gpu"], "choose from ndp,pim"),
    (["--pim-power-budget-w", "0"], "must be a finite number > 0"),
])
def test_bad_pim_input_exits_2_naming_the_range(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        main(["dse", "--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_pim_front_point_verilog_is_both_tops_and_lint_clean(tmp_path):
    from host.dse.cli import verilog_check
    res = verilog_check({"family": "pim", "rank_adders": 16}, tmp_path, say=lambda s: None)
    d = tmp_path / "verilog" / "pim-a16"
    assert res["lint_ok"], (d / "lint.txt").read_text()
    assert "2 files, 0 problems" in res["lint_summary"]
    cmd = (d / "command.txt").read_text()
    assert "--top pim_rank_pu --preset paper" in cmd and "--set rank_adders=16" in cmd
    # each file is its own top (the pim_* tops share PAPER's configuration: ndpim verilog named both files'
    # cache entry after the first such top)
    assert "softmax" in (d / "pim_rank_pu.v").read_text() and "softmax" not in (d / "pim_bank_pu.v").read_text()


def test_rank_area_power_prunes_the_dead_adders_and_matches_the_point(monkeypatch):
    """rank_area_power's arithmetic on a stand-in mapping with 8 of 16 adders pruned (the real mapping: docs)."""
    from sim.energy import area as A
    calls = {}

    def fake_area(cfg, progress=None, cache_dir=None):
        calls["cfg"] = cfg
        mods = {"pim_rank_pu": {"class": "RankPU"}, "FPAdd_0": {"class": "FPAdd"}}
        rank = {"logic_um2": 2e5, "sram_um2": 1e6, "area_um2": 1.2e6, "seconds": 0.0, "modules": mods,
                "pruned": {"pim_rank_pu": {"FPAdd_0": cfg.rank_adders - cfg.chips}}}
        return {"rank_pu": rank, "bank_pu": {"area_um2": 1e4, "seconds": 0.0}, "config": cfg}

    def fake_power(res, cfg):
        return {"bank_pus_per_rank": cfg.chips * cfg.banks, "rank_total_mm2": 2.48, "rank_w": 0.08,
                "bank_w": 0.001, "rank_total_w": 0.2}
    monkeypatch.setattr(A, "pim_area", fake_area)
    monkeypatch.setattr(A, "pim_power", fake_power)
    r = P.rank_area_power(PIMPoint(16))
    assert calls["cfg"] == _adders(16)
    assert r["dead_adders"] == 8 and r["bank_pus_per_rank"] == 128 and r["rank_mm2"] == 2.48


def test_pim_points_run_on_a_dask_cluster_as_locally(monkeypatch):
    """``--cluster``'s executor (an in-process Dask cluster here) gives the PIM rows the local pool gives."""
    from dask.distributed import Client
    from host.dse.cli import run_dse
    from host.sweep.executor import DaskExecutor, LocalExecutor
    monkeypatch.setattr(P, "rank_area_power", _composed_rank)
    pts = [PIMPoint(8), PIMPoint(16), PIMPoint(12)]
    kw = dict(pim_workload=P.PIM_WORKLOADS["small"], say=lambda s: None)
    local = run_dse(pts, P.WORKLOADS["small"], executor=LocalExecutor(jobs=1, progress=False), **kw)
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as c:
        dask = run_dse(pts, P.WORKLOADS["small"], executor=DaskExecutor(client=c, progress=False), **kw)
    key = lambda rs: [(r["point"], r["status"], r.get("throughput_tok_s"), r.get("area_mm2"), r["pareto"])  # noqa: E731
                      for r in rs]
    assert key(dask["rows"]) == key(local["rows"])
    assert [r["status"] for r in local["rows"]] == ["priced", "priced", "failed"]
    assert local["fronts"]["pim"] == [0] and local["fronts"]["ndp"] == []   # a8: less area, same tok/s
