"""``ndpim l3`` commands, the latency study and the figure writers (small inputs)."""

import json

import numpy as np
import pytest

from host.cli import main
from host.l3.figures import (make_figures, plot_ablation, plot_predictor, plot_scalability, plot_throughput,
                             scalability_table, throughput_table, ablation_table, tbt_study)
from host.l3.run import RUN_KEYS


def test_cli_run_writes_the_run_directory(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["l3", "run", "--model", "gpt-175b", "--trace", "longbench", "--system", "r-pim", "--requests", "6",
                 "--ranksets", "2", "--host-memory-gb", "512", "--seed", "1", "--out", str(out)]) in (0, None)
    s = json.loads((out / "summary.json").read_text())
    assert all(k in s for k in RUN_KEYS) and s["finished"] == 6
    # the host link's bytes: R-PIM keeps the KV in the DIMMs, so the KV and each decode's query go out, outputs in
    assert s["link_bytes"]["pcie_out"] > s["link_bytes"]["pcie_in"] > 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["setup"]["ranksets"] == 2 and cfg["setup"]["host_capacity_gib"] == 512 and cfg["seed"] == 1
    assert "throughput_tok_s" in capsys.readouterr().out


def test_cli_run_oom_and_bad_input(tmp_path, capsys):
    out = tmp_path / "rej"
    main(["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "gpu-only", "--requests", "24",
          "--no-progress", "--out", str(out)])
    s = json.loads((out / "summary.json").read_text())
    assert s["oom"] is False and s["rejected"] > 0 and s["finished"] == 24 - s["rejected"]
    assert s["rejected_frac"] == s["rejected"] / 24 and s["gpu_memory_utilization"] == 1.0
    assert s["energy_j"]["total"] > 0 and s["energy_per_token_mj"] > 0
    text = capsys.readouterr().out
    assert "rejected_frac" in text and "gpu_memory_utilization" in text
    out = tmp_path / "oom"                              # 0.9 headroom: every long request rejected, the run OOMs
    main(["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "gpu-only",
          "--requests", "2", "--gpu-memory-utilization", "0.5", "--out", str(out)])
    oom = json.loads((out / "summary.json").read_text())
    assert oom["oom"] is True
    assert oom["energy_per_token_mj"] is None and set(oom["energy_j"]) >= {"gpu", "total"}   # nothing ran
    assert "out of memory" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "gpu-only", "--min-gpu-tokens",
              "160", "--out", str(tmp_path / "y")])
    with pytest.raises(SystemExit):
        main(["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3", "--ranksets", "99",
              "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        main(["l3", "run", "--model", "opt-67b", "--trace", "openr1", "--system", "l3", "--out", str(tmp_path)])


def test_cli_sweep(tmp_path):
    out = tmp_path / "sw"
    main(["l3", "sweep", "--out", str(out), "--models", "gpt-175b", "--traces", "longbench",
          "--systems", "gpu-only,r-pim", "--requests", "6", "--jobs", "1"])
    import pandas as pd
    df = pd.read_csv(out / "throughput.csv")
    assert set(df.system) == {"gpu-only", "r-pim"} and (out / "throughput.png").stat().st_size > 1000
    assert df.loc[df.system == "gpu-only", "normalized"].iloc[0] == pytest.approx(1.0)


def test_tbt_study_shapes():
    rows = tbt_study(batches=(16, 128), ranksets=(2, 8))
    l3 = {(r["batch"], r["ranksets"]): r["tbt_ms"] for r in rows if r["system"] == "l3"}
    gpu = {r["batch"]: r["tbt_ms"] for r in rows if r["system"] != "l3"}
    assert l3[(128, 2)] > l3[(16, 2)] and gpu[128] > gpu[16]
    assert l3[(128, 8)] < l3[(128, 2)]          # more ranksets: more PIM bandwidth for the same batch


def test_figure_writers(tmp_path):
    rows = []
    for m in ("opt-66b", "gpt-89b"):
        for sysname, thr in (("l3", 100.0), ("gpu-only", np.nan), ("hbm-pim", 30.0), ("r-pim", 20.0),
                             ("cpu-offload", 5.0)):
            rows.append({"model": m, "trace": "openr1", "system": sysname, "throughput_tok_s": thr,
                         "oom": not np.isfinite(thr)})
    t = throughput_table(rows)
    assert {r["norm_to"] for r in t} == {"l3"} and t[0]["normalized"] == 1.0
    plot_throughput(t, tmp_path / "t.png")
    ab = ablation_table([{"model": "gpt-89b", "trace": "openr1", "system": s, "throughput_tok_s": v}
                         for s, v in (("l3-base", 10.0), ("l3-no-comm", 12.0), ("l3-no-sched", 11.0), ("l3", 15.0))])
    assert [r["normalized"] for r in ab] == [1.0, 1.2, 1.1, 1.5]
    plot_ablation(ab, tmp_path / "a.png")
    sc = scalability_table([{"model": "gpt-175b", "trace": "openr1", "variant": v, "ranksets": r,
                             "host_memory_gb": c, "throughput_tok_s": x}
                            for v, r, c, x in (("Bw-only", 2, 512, 10.0), ("Bw-only", 4, 512, 15.0),
                                               ("Cap-only", 2, 1024, 12.0), ("Bw-Cap", 2, 512, 10.0),
                                               ("Bw-Cap", 4, 1024, 20.0))])
    assert [r["normalized"] for r in sc] == [1.0, 1.5, 1.2, 1.0, 2.0]
    plot_scalability(sc, tmp_path / "s.png")
    plot_predictor([{"model": "gpt-89b", "trace": "dolphin", "re_pim": 0.1, "re_gpu": 0.02, "re_pim_online": 0.1,
                     "re_gpu_online": 0.02}], tmp_path / "p.png")
    for f in ("t", "a", "s", "p"):
        assert (tmp_path / f"{f}.png").stat().st_size > 1000


def test_make_figures_tbt_only(tmp_path):
    w = make_figures(tmp_path, only=("tbt",), jobs=1, log=lambda *_: None)
    assert set(w) == {"tbt"} and (tmp_path / "tbt.csv").exists() and (tmp_path / "figures.json").exists()
    with pytest.raises(ValueError, match="unknown figure"):
        make_figures(tmp_path, only=("speedup",), jobs=1)


def test_a_run_that_cannot_serve_exits_1(tmp_path, capsys):
    """Issue 32 item 3: an L3 run out of memory (every request rejected: GPT-175B's LongBench KV on GPU-only at
    half the HBM) writes its config and summary and exits 1, saying why; a run that serves exits 0."""
    from host.cli import main
    rc = main(["l3", "run", "--model", "gpt-175b", "--trace", "longbench", "--system", "gpu-only",
               "--gpu-memory-utilization", "0.5", "--requests", "5", "--no-progress", "--out", str(tmp_path / "a")])
    assert rc == 1 and "FAILED" in capsys.readouterr().err
    assert (tmp_path / "a" / "summary.json").is_file()
    assert main(["l3", "run", "--model", "opt-66b", "--trace", "openr1", "--system", "l3", "--requests", "5",
                 "--no-progress", "--out", str(tmp_path / "b")]) == 0


def test_cli_run_max_total_tokens(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["l3", "run", "--model", "gpt-175b", "--trace", "openr1", "--system", "l3", "--requests", "4",
                 "--max-total-tokens", "2048", "--out", str(out)]) in (0, None)
    text = capsys.readouterr().out
    assert "<= 2048 tokens" in text and "cannot hold" in text
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["inputs"]["max_total_tokens"] == 2048 and cfg["workload"]["params"]["max_total"] == 2048
    req = (out / "requests.csv").read_text().splitlines()
    assert len(req) == 5
