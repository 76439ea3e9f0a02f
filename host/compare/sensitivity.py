"""``ndpim sensitivity``: PLoRA and L3 over one grid of CXL link bandwidth x host-memory ranksets x context length,
and where each architecture overtakes the other (issue 34 item 3).

**The budget** is ``ndpim compare``'s (host.compare.run): one H100 SXM 80 GB serving Llama-3.1-8B; PLoRA with its 4
CXL devices, L3 with the 2 TiB DIMM-PIM host memory of L3 Table 2 behind the H100's PCIe 5.0 x16.

**The axes.**

* *CXL link bandwidth* per direction: PLoRA's ladder, nine rungs 8 .. 1,800 GB/s (PLoRA VIII "Link sweep: nine
  link bandwidths from 8 to 1800 GB/s"; :data:`host.plora.figures.LINK_LADDER_GBPS`). It is the PLoRA devices'
  link; L3's DIMM-PIM stays behind PCIe 5.0 whatever the rung (the link the H100 has to host memory).
* *Ranksets*: ranks per channel of L3's host memory (``ndpim l3 run --ranksets``; L3 Table 2's 4 is the default),
  1, 2, 4, 8. Each rankset computes while another receives (L3 5.1); more ranksets is more ranks computing at once.
  PLoRA does not use host memory.
* *Context length*: every request's prompt, 1K .. 64K tokens, with :data:`OUTPUT_TOKENS` generated tokens each.

**The workload at a context length** (design choice, stated): ``requests`` requests, all arriving at t = 0 (L3 6.1's
offline batch: throughput over a fixed set of requests), each with the context's prompt and :data:`OUTPUT_TOKENS`
output tokens, adapters and ranks drawn as PLoRA's ``skewed`` preset draws them (1,000 adapters, 80 % of requests to
50 hot ones, ranks 8 .. 128; PLoRA VII-A). The L3 host has no LoRA path: its runs serve the same requests without
the adapters' work (a bias in L3's favour, stated in every output).

**L3's scheduler, as written and with its extension.** ``l3`` is the L3 host's default, the scheduler as the paper
writes it (the prefill chunk that crosses the balance limit, at least 16 tokens; docs/l3_host.md): while few
decodes run, the PIM side is short and the balance admits a 16-token chunk per sub-batch, so an offline batch's
prompts enter slowly. ``l3-knee`` is the labelled extension (``--min-gpu-tokens knee``: the GPU's efficiency-knee
token floor per sub-batch). Both are run and compared with PLoRA.

**The hybrid** (host/hybrid; ``--no-hybrid`` leaves it out) depends on all three axes -- its CXL devices on the
link rung, its DIMM-PIM with the ranksets -- so it runs at every (link, ranksets, context) cell, as the hybrid host's
``llama3-8b`` (Llama-3.1-8B's architecture; host.compare.run). Each cell reports the best of PLoRA, the L3 variant
and the hybrid.

**The metric** is throughput as served (output tokens over the makespan; each host's summary ``throughput_tok_s``).
PLoRA's run depends on the link and the context, L3's on the ranksets and the context, so the grid runs
``links x contexts`` PLoRA points and ``ranksets x contexts`` L3 points and compares them cell by cell. The
*crossover context* of a (link, ranksets) cell is where L3's throughput reaches PLoRA's: the first context at
which L3 is ahead, interpolated in log(context) on the ratio L3 / PLoRA between it and the context before (exact at
the grid points); "L3 ahead throughout" or "PLoRA ahead throughout" when the sign does not change in the range.

Outputs (``--out DIR``): ``points.csv`` (every run), ``grid.csv`` (every cell: both throughputs, the winner),
``crossover.csv`` / ``crossover.md`` (per link and ranksets), ``crossover.png`` (the crossover context over link x
ranksets) and ``throughput.png`` (throughput against context, PLoRA per link rung and L3 per rankset count),
``sensitivity.json``.
"""

import csv
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["OUTPUT_TOKENS", "FULL", "SMALL", "SensitivityGrid", "context_workload", "crossover", "run_sensitivity",
           "write_sensitivity"]

#: Output tokens of every request (design choice: a decode-dominated run, as the decode-attention designs target).
OUTPUT_TOKENS = 128

#: The full grid: PLoRA's nine rungs (PLoRA VIII), ranksets 1..8 (L3 Table 2's 4 in the middle), contexts 1K..64K.
FULL = {"links": (8, 16, 32, 64, 128, 256, 450, 900, 1800), "ranksets": (1, 2, 4, 8),
        "contexts": (1024, 4096, 16384, 65536), "requests": 32}
#: The test grid.
SMALL = {"links": (16, 128), "ranksets": (2, 4), "contexts": (1024, 8192), "requests": 4}


@dataclass(frozen=True)
class SensitivityGrid:
    links: tuple
    ranksets: tuple
    contexts: tuple
    requests: int
    seed: int = 0
    hybrid: bool = True

    def __post_init__(self):
        for name, vals, lo, hi in (("links", self.links, 1.0, 10_000.0), ("ranksets", self.ranksets, 1, 32),
                                   ("contexts", self.contexts, 16, 131_072 - OUTPUT_TOKENS)):
            if not vals:
                raise ValueError(f"{name}: give at least one value")
            bad = [v for v in vals if not lo <= v <= hi]
            if bad:
                raise ValueError(f"{name}: {bad} outside the allowed range {lo} .. {hi}")
        if list(self.contexts) != sorted(set(self.contexts)):
            raise ValueError(f"contexts must be increasing and distinct, got {list(self.contexts)}")
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")


def context_workload(context: int, requests: int, seed: int = 0):
    """The workload of one context length (module docstring)."""
    from host.workloads import Workload, plora_workload
    base = plora_workload("skewed", n_requests=requests, rate_per_s=1.0, seed=seed)
    n = len(base)
    w = Workload(f"ctx{context}", np.zeros(n), np.full(n, context, np.int64), np.full(n, OUTPUT_TOKENS, np.int64),
                 base.adapter_id, extra=dict(base.extra),
                 params={"context": context, "output_tokens": OUTPUT_TOKENS, "adapters": "PLoRA skewed preset",
                         "arrivals": "all at t = 0"},
                 notes=[f"{n} requests of {context} prompt + {OUTPUT_TOKENS} output tokens, all at t = 0; adapters "
                        f"as PLoRA's skewed preset draws them"])
    return w


def crossover(contexts, plora, l3):
    """The context where L3's throughput reaches PLoRA's (module docstring): ``(value, text)``; value is None when
    the sign does not change in the range (or a point is missing)."""
    r = [(c, b / a) for c, a, b in zip(contexts, plora, l3) if a == a and b == b and a > 0]
    if len(r) < len(contexts):
        return None, "not every context served by both"
    if r[0][1] >= 1.0:
        return None, "L3 ahead throughout"
    for (c0, q0), (c1, q1) in zip(r, r[1:]):
        if q1 >= 1.0:
            # linear in log(context) on the ratio between the last context PLoRA led and the first L3 leads
            x0, x1 = math.log(c0), math.log(c1)
            x = x0 + (1.0 - q0) * (x1 - x0) / (q1 - q0)
            return float(math.exp(x)), f"L3 ahead from ~{math.exp(x):,.0f} tokens"
    return None, "PLoRA ahead throughout"


def _plora_point(model_path, trace_path, link, seed):
    from host.plora.run import RunSpec, run_spec
    from host.serving import EngineConfig
    from host.models.hf import load_hf_config
    spec = RunSpec(model=load_hf_config(model_path).name, model_config=str(model_path), workload="file",
                   trace_file=str(trace_path), system="plora", n_requests=None, rate_per_s=None, seed=seed,
                   link_gbps=float(link))
    return run_spec(spec, engine_config=EngineConfig(trace=False, record_iterations=False)).summary


#: The L3 variants (module docstring): name -> the L3 system's ``min_gpu_tokens`` (None: the paper's rule as written).
L3_VARIANTS = {"l3": None, "l3-knee": "knee"}


def _l3_point(model, w, ranksets, seed, min_gpu_tokens=None):
    from host.l3.run import run_l3
    from host.serving import EngineConfig
    from .run import l3_budget_setup
    kw = {"min_gpu_tokens": min_gpu_tokens} if min_gpu_tokens is not None else None
    return run_l3(model.name, w.name, "l3", setup=l3_budget_setup(model, ranksets), workload=w, seed=seed,
                  system_kw=kw, engine=EngineConfig(trace=False, record_iterations=False)).summary


def _hybrid_point(w, link, ranksets, seed):
    from host.hybrid.run import HybridSpec, run_workload
    from host.serving import EngineConfig
    from .run import HYBRID_MODEL
    out = run_workload(w, HybridSpec(model=HYBRID_MODEL, seed=seed, link_gbps=float(link), ranksets=ranksets),
                       engine_config=EngineConfig(trace=False, record_iterations=False))
    return out.summary


def _row(system, axis, value, context, s, err, wall):
    fin, offered = int(s.get("finished", 0) or 0), int(s.get("requests_offered", s.get("requests", 0)) or 0)
    ok = not err and fin > 0 and fin >= offered
    return {"system": system, axis: value, "context": context, "status": "served" if ok else "failed",
            "reason": err or ("" if ok else s.get("oom_reason") or s.get("rejected_reason")
                              or f"{fin} of {offered} finished"),
            "throughput_tok_s": float(s.get("throughput_tok_s", float("nan"))) if ok else float("nan"),
            "tpot_ms_mean": float(s.get("tpot_ms_mean", float("nan"))) if ok else float("nan"),
            "mean_batch": float(s.get("mean_batch", float("nan"))) if ok else float("nan"),
            "wall_s": wall}


def run_sensitivity(grid: SensitivityGrid, out_dir, *, progress=None) -> dict:
    from host.models.hf import load_hf_config
    from host.compare.run import write_model
    from host.compare.workloads import write_trace
    out = Path(out_dir)
    model_path = write_model(out)
    model = load_hf_config(model_path)
    points = []

    def measure(system, price, ctx, **axes):
        """One run: its row (a run that raises is a failed row with the reason), reported to ``progress``."""
        t0, err, s = time.perf_counter(), "", {}
        try:
            s = price()
        except (ValueError, RuntimeError) as e:
            err = f"{type(e).__name__}: {e}"
        (axis, value), *more = axes.items()
        p = _row(system, axis, value, ctx, s, err, time.perf_counter() - t0)
        p.update(more)
        points.append(p)
        if progress:
            progress(p)

    for ctx in grid.contexts:
        w = context_workload(ctx, grid.requests, grid.seed)
        trace = write_trace(w, out / "workloads" / f"ctx{ctx}.csv")
        for link in grid.links:
            measure("plora", lambda: _plora_point(model_path, trace, link, grid.seed), ctx, link_gbps=link)
        for variant, floor in L3_VARIANTS.items():
            for rs in grid.ranksets:
                measure(variant, lambda: _l3_point(model, w, rs, grid.seed, floor), ctx, ranksets=rs)
        if grid.hybrid:
            for link in grid.links:
                for rs in grid.ranksets:
                    measure("hybrid", lambda: _hybrid_point(w, link, rs, grid.seed), ctx, link_gbps=link, ranksets=rs)
    thr = {(p["system"], p.get("link_gbps", p.get("ranksets")), p["context"]): p["throughput_tok_s"] for p in points
           if p["system"] != "hybrid"}
    hyb = {(p["link_gbps"], p["ranksets"], p["context"]): p["throughput_tok_s"] for p in points
           if p["system"] == "hybrid"}
    cells, cross = [], []
    for variant in L3_VARIANTS:
        for link in grid.links:
            for rs in grid.ranksets:
                a = [thr[("plora", link, c)] for c in grid.contexts]
                b = [thr[(variant, rs, c)] for c in grid.contexts]
                for c, x, y in zip(grid.contexts, a, b):
                    win = "-" if x != x or y != y else (variant if y >= x else "plora")
                    cell = {"l3_variant": variant, "link_gbps": link, "ranksets": rs, "context": c,
                            "plora_tok_s": x, "l3_tok_s": y,
                            "l3_over_plora": y / x if x == x and y == y and x > 0 else float("nan"), "winner": win}
                    if grid.hybrid:
                        h = hyb[(link, rs, c)]
                        cell["hybrid_tok_s"] = h
                        vals = {"plora": x, variant: y, "hybrid": h}
                        cell["best"] = "-" if any(v != v for v in vals.values()) else max(vals, key=vals.get)
                    cells.append(cell)
                v, text = crossover(grid.contexts, a, b)
                cross.append({"l3_variant": variant, "link_gbps": link, "ranksets": rs,
                              "crossover_context": v if v is not None else float("nan"), "verdict": text})
    return {"points": points, "cells": cells, "crossover": cross,
            "grid": {"links_gbps": list(grid.links), "ranksets": list(grid.ranksets), "contexts": list(grid.contexts),
                     "requests": grid.requests, "output_tokens": OUTPUT_TOKENS, "seed": grid.seed,
                     "hybrid": grid.hybrid},
            "notes": ["one H100 SXM 80 GB, Llama-3.1-8B (ndpim compare's budget)",
                      "the L3 host has no LoRA path: its runs serve the same requests without the adapters' work",
                      "L3's DIMM-PIM is behind PCIe 5.0 x16 at every link rung; the rung is PLoRA's CXL link"]}


def _write_csv(rows, path):
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in cols})


def _figures(result, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from host.plot import line_style
    g = result["grid"]
    links, rsets, ctxs = g["links_gbps"], g["ranksets"], g["contexts"]
    variants = list(dict.fromkeys(c["l3_variant"] for c in result["crossover"]))
    # the crossover context over link x ranksets, one panel per L3 variant
    fig, axes = plt.subplots(1, len(variants), figsize=(1.5 + 0.75 * len(links) * len(variants),
                                                         1.0 + 0.55 * len(rsets)), squeeze=False)
    for ax, variant in zip(axes[0], variants):
        z = np.full((len(rsets), len(links)), np.nan)
        for c in result["crossover"]:
            if c["l3_variant"] != variant:
                continue
            i, j = rsets.index(c["ranksets"]), links.index(c["link_gbps"])
            v = c["crossover_context"]
            z[i, j] = np.log2(v) if v == v else np.nan
            t = ("L3" if c["verdict"].startswith("L3 ahead throughout") else
                 "PLoRA" if c["verdict"].startswith("PLoRA") else f"{v / 1024:.1f}K" if v == v else "-")
            ax.text(j, i, t, ha="center", va="center", fontsize=6, color="k")
        ax.imshow(z, aspect="auto", cmap="viridis", origin="lower", vmin=math.log2(ctxs[0]),
                  vmax=math.log2(ctxs[-1]))
        ax.set_xticks(range(len(links)))
        ax.set_xticklabels([f"{v:g}" for v in links], fontsize=6)
        ax.set_yticks(range(len(rsets)))
        ax.set_yticklabels([str(v) for v in rsets], fontsize=7)
        ax.set_xlabel("PLoRA CXL link, GB/s per direction", fontsize=7)
        ax.set_ylabel("L3 ranksets", fontsize=7)
        ax.set_title(f"context where {variant} overtakes PLoRA", fontsize=8)
    fig.text(0.5, -0.02, '"PLoRA": PLoRA ahead at every context of the grid; "L3": L3 ahead from the first; '
             'a number: the crossover context (tokens), colour log2 of it', ha="center", fontsize=6)
    fig.savefig(Path(out) / "crossover.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    # throughput against context: PLoRA per link rung, each L3 variant per rankset count
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    series = [("plora", "link_gbps", links)] + [(v, "ranksets", rsets) for v in variants]
    if g.get("hybrid"):
        rs_mid = rsets[len(rsets) // 2]
        st = line_style("hybrid")
        for k, v in enumerate(links):
            ys = [next(p["throughput_tok_s"] for p in result["points"] if p["system"] == "hybrid"
                       and p["link_gbps"] == v and p["ranksets"] == rs_mid and p["context"] == c) for c in ctxs]
            ax.plot(ctxs, ys, ms=3, alpha=0.3 + 0.7 * (k + 1) / len(links),
                    label=f"hybrid, link {v:g} GB/s, {rs_mid} ranksets", **st)
    for sysname, axis, vals in series:
        st = line_style(sysname)
        for k, v in enumerate(vals):
            ys = [next(p["throughput_tok_s"] for p in result["points"]
                       if p["system"] == sysname and p.get(axis) == v and p["context"] == c) for c in ctxs]
            lab = f"{sysname}, link {v:g} GB/s" if axis == "link_gbps" else f"{sysname}, {v} ranksets"
            ax.plot(ctxs, ys, ms=3, alpha=0.3 + 0.7 * (k + 1) / len(vals), label=lab, **st)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (prompt tokens)", fontsize=8)
    ax.set_ylabel("throughput, output tokens/s", fontsize=8)
    ax.legend(fontsize=5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.savefig(Path(out) / "throughput.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_sensitivity(result, out) -> list:
    from host.serving.rundir import write_json
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(result["points"], out / "points.csv")
    _write_csv(result["cells"], out / "grid.csv")
    _write_csv(result["crossover"], out / "crossover.csv")
    md = ["# Where L3 overtakes PLoRA", "", "; ".join(result["notes"]) + ".", "",
          "| L3 variant | link GB/s | ranksets | crossover context | verdict |", "|---|---|---|---|---|"]
    md += [f"| {c['l3_variant']} | {c['link_gbps']:g} | {c['ranksets']} | "
           f"{'-' if c['crossover_context'] != c['crossover_context'] else format(c['crossover_context'], ',.0f')} | "
           f"{c['verdict']} |" for c in result["crossover"]]
    if result["grid"].get("hybrid"):
        cells = [c for c in result["cells"] if c["l3_variant"] == "l3-knee"] or result["cells"]
        ctxs = result["grid"]["contexts"]
        md += ["", f"Best of PLoRA, {cells[0]['l3_variant']} and the hybrid, per link and ranksets (columns: context):",
               "", "| link GB/s | ranksets | " + " | ".join(f"{c:,}" for c in ctxs) + " |",
               "|---|---|" + "---|" * len(ctxs)]
        for link in result["grid"]["links_gbps"]:
            for rs in result["grid"]["ranksets"]:
                row = {c["context"]: c["best"] for c in cells if c["link_gbps"] == link and c["ranksets"] == rs}
                md.append(f"| {link:g} | {rs} | " + " | ".join(row[c] for c in ctxs) + " |")
    (out / "crossover.md").write_text("\n".join(md) + "\n")
    _figures(result, out)
    write_json(out / "sensitivity.json", result)
    return [out / n for n in ("points.csv", "grid.csv", "crossover.csv", "crossover.md", "crossover.png",
                              "throughput.png", "sensitivity.json")]
