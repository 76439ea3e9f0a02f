"""ndpim sensitivity (issue 34 item 3): the crossover rule on constructed ratios (and a mutant that swaps the
systems flips it), the small grid writes every output with both L3 variants, bad input exits 2 naming the range."""

import csv
import json
import math

import pytest

from host.cli import main
from host.compare.sensitivity import L3_VARIANTS, OUTPUT_TOKENS, SensitivityGrid, context_workload, crossover


def test_crossover_interpolates_in_log_context():
    ctx = (1024, 4096, 16384)
    # L3 / PLoRA = 0.5, 1.5, 3: the ratio reaches 1 halfway (in log context) between 1K and 4K -> 2K
    v, text = crossover(ctx, [2.0, 2.0, 1.0], [1.0, 3.0, 3.0])
    assert v == pytest.approx(2048.0) and "2,048" in text
    # exact at a grid point
    v, _ = crossover(ctx, [2.0, 2.0, 2.0], [1.0, 2.0, 3.0])
    assert v == pytest.approx(4096.0)
    assert crossover(ctx, [1.0] * 3, [2.0] * 3) == (None, "L3 ahead throughout")
    assert crossover(ctx, [2.0] * 3, [1.0] * 3) == (None, "PLoRA ahead throughout")
    assert crossover(ctx, [2.0, float("nan"), 1.0], [1.0, 1.0, 3.0])[1] == "not every context served by both"
    # a mutant that compares the other way round says the opposite
    assert crossover(ctx, [1.0, 3.0, 3.0], [2.0, 2.0, 1.0])[1] == "L3 ahead throughout"


def test_context_workload():
    w = context_workload(4096, 5, seed=1)
    assert len(w) == 5 and set(w.prompt_tokens) == {4096} and set(w.output_tokens) == {OUTPUT_TOKENS}
    assert all(w.arrival_s == 0) and "rank" in w.extra


def test_small_grid(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sensitivity", "--small", "--out", str(out)]) == 0
    for name in ("points.csv", "grid.csv", "crossover.csv", "crossover.md", "crossover.png", "throughput.png",
                 "sensitivity.json"):
        assert (out / name).stat().st_size > 100
    res = json.loads((out / "sensitivity.json").read_text())
    g = res["grid"]
    n_ctx = len(g["contexts"])
    n_l, n_r = len(g["links_gbps"]), len(g["ranksets"])
    assert len(res["points"]) == n_ctx * (n_l + len(L3_VARIANTS) * n_r + n_l * n_r)   # PLoRA, L3 x 2, hybrid
    assert g["hybrid"] and sum(p["system"] == "hybrid" for p in res["points"]) == n_ctx * n_l * n_r
    assert all(p["status"] == "served" and p["throughput_tok_s"] > 0 for p in res["points"])
    cross = list(csv.DictReader(open(out / "crossover.csv")))
    assert len(cross) == len(L3_VARIANTS) * len(g["links_gbps"]) * len(g["ranksets"])
    # every cell's winner is the larger throughput
    for c in res["cells"]:
        assert c["winner"] == (c["l3_variant"] if c["l3_tok_s"] >= c["plora_tok_s"] else "plora")
        three = {"plora": c["plora_tok_s"], c["l3_variant"]: c["l3_tok_s"], "hybrid": c["hybrid_tok_s"]}
        assert c["best"] == max(three, key=three.get)
    assert "no LoRA path" in (out / "crossover.md").read_text()
    assert "ranksets:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, flag, msg", [
    (["--contexts", "4096,1024"], "--contexts", "increasing"),
    (["--links", "0.5"], "--links", "outside the allowed range"),
    (["--ranksets", "64"], "--ranksets", "outside the allowed range"),
    (["--contexts", "a,b"], "--contexts", "comma-separated list of int"),
])
def test_bad_input(tmp_path, capsys, argv, flag, msg):
    with pytest.raises(SystemExit) as e:
        main(["sensitivity", "--small", "--out", str(tmp_path / "x"), *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and msg in err


def test_grid_validation():
    with pytest.raises(ValueError, match="contexts must be increasing"):
        SensitivityGrid(links=(8,), ranksets=(1,), contexts=(2048, 1024), requests=1)
    with pytest.raises(ValueError, match="requests must be >= 1"):
        SensitivityGrid(links=(8,), ranksets=(1,), contexts=(1024,), requests=0)
    assert math.isfinite(SensitivityGrid(links=(8,), ranksets=(1,), contexts=(1024,), requests=1).links[0])


def test_no_hybrid(tmp_path):
    out = tmp_path / "n"
    assert main(["sensitivity", "--small", "--no-hybrid", "--contexts", "1024", "--links", "128", "--ranksets", "4",
                 "--out", str(out)]) == 0
    res = json.loads((out / "sensitivity.json").read_text())
    assert not any(p["system"] == "hybrid" for p in res["points"]) and "best" not in res["cells"][0]
