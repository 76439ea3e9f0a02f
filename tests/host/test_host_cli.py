"""`ndpim gpu predict` on a Vidur-format profile, the pluggable command groups, and host.bench's grid hook."""

import sys
import types

import numpy as np
import pandas as pd
import pytest

from host import cli
from host.gpu.profiles import VIDUR_PROFILES


def _small_profile(tmp_path):
    df = pd.read_csv(VIDUR_PROFILES[("h100", "llama2-7b")])
    df = df[df["num_tokens"].isin([1, 64, 512, 4096])]
    path = tmp_path / "mlp.csv"
    df.to_csv(path, index=False)
    return path, df


def test_gpu_predict_compare(tmp_path, capsys):
    path, df = _small_profile(tmp_path)
    out = tmp_path / "pred.csv"
    assert cli.main(["gpu", "predict", "--gpu", "h100", "--profile", str(path), "--out", str(out), "--compare"]) == 0
    pred = pd.read_csv(out)
    assert list(pred.columns) == list(df.columns) and len(pred) == len(df)
    for op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"):
        col = f"time_stats.{op}.median"
        assert not np.allclose(pred[col], df[col])  # replaced by predictions
        assert np.all(np.abs(pred[col] / df[col].to_numpy() - 1) < 0.6)
    text = capsys.readouterr().out
    assert "MAPE per operator" in text and "attn_pre_proj" in text


def test_gpu_predict_bad_profile(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["gpu", "predict", "--gpu", "a100", "--profile", str(bad), "--out", str(tmp_path / "o.csv")])
    assert e.value.code == 2
    assert "argument --profile: " in capsys.readouterr().err and not (tmp_path / "o.csv").exists()


def test_plugin_groups_are_added(monkeypatch, capsys):
    mod = types.ModuleType("fake_plugin_cli")
    def add_parser(sub):
        p = sub.add_parser("fakegroup")
        p.add_argument("--x", type=int, default=1)
        p.set_defaults(func=lambda args: print(f"fake {args.x}") or 0)
    mod.add_parser = add_parser
    monkeypatch.setitem(sys.modules, "fake_plugin_cli", mod)
    monkeypatch.setattr(cli, "PLUGINS", ("fake_plugin_cli", "host.does_not_exist.cli"))
    assert cli.main(["fakegroup", "--x", "7"]) == 0
    assert "fake 7" in capsys.readouterr().out


def test_broken_plugin_is_an_error(monkeypatch, tmp_path):
    # a plugin that exists but fails to import (a missing dependency) must not be skipped silently
    (tmp_path / "broken_plugin_cli.py").write_text("import definitely_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "PLUGINS", ("broken_plugin_cli",))
    with pytest.raises(ModuleNotFoundError, match="definitely_missing_dependency_xyz"):
        cli.main(["gpu", "holdout"])


def test_bench_runs_grid_hooks(monkeypatch):
    from host import bench
    mod = types.ModuleType("fake_grid_bench")
    mod.run_grid = lambda: {"grid_points": 3, "plora_tpot_ms": 1.5}
    monkeypatch.setitem(sys.modules, "fake_grid_bench", mod)
    monkeypatch.setattr(bench, "GRIDS", (("plora", "fake_grid_bench"), ("l3", "host.nope.bench")))
    out = bench.run_grids()
    assert out["plora_grid_points"] == 3 and out["plora_tpot_ms"] == 1.5 and out["plora_grid_s"] >= 0
    assert not any(k.startswith("l3_") for k in out)
