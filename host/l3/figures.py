"""The figures of the L3 study (``ndpim l3 figures --out DIR``): each a CSV and a PNG.

* ``throughput``: output tokens / s per model x trace x system (the paper's five and the labelled variant
  ``hbm-pim-serial``), normalized to GPU-only (to L3 where GPU-only runs out of memory, as L3 Fig. 8 does); the CSV
  carries each run's ``rejected_frac``;
* ``scalability``: L3 throughput for 'Bw-only' (ranksets 2 -> 16 at 512 GB), 'Cap-only' (512 GB -> 4 TB at 2
  ranksets) and 'Bw-Cap' (both), normalized to the base (512 GB, 2 ranksets);
* ``ablation``: L3 without the communication optimisations and the scheduler (``l3-base``), each restored alone
  (``l3-no-sched`` = communication only, ``l3-no-comm`` = scheduler only) and both (``l3``), normalized to
  ``l3-base``, with the labelled variant ``l3-no-comm-balanced`` (section 5.1's monolithic transfers but its
  balanced placement) beside ``l3-no-comm``;
* ``tbt``: time between tokens versus batch size and ranksets for GPT-89B with decode-only batches of 6K-token
  requests, against the GPU given unlimited HBM (:func:`tbt_study`);
* ``predictor``: RE = mean |(Y - Yhat) / Y| of the T_PIM and T_GPU predictors on 1,000 profiled sub-batches of an
  L3 run, split 80 / 20 (:func:`predictor_study`), and the runs' online errors.
"""

import json
from pathlib import Path

import numpy as np

from host.l3.sweep import (ABLATION_FIGURE_SYSTEMS, MODELS, PAPER_SYSTEMS, PAPER_TRACES, ablation_points, run_points,
                           scalability_points, throughput_points)

__all__ = ["throughput_table", "ablation_table", "scalability_table", "tbt_study", "predictor_study",
           "make_figures", "FIGURES", "TBT_BATCHES", "TBT_RANKSETS", "TBT_CONTEXT"]

FIGURES = ("throughput", "scalability", "ablation", "tbt", "predictor")
#: Systems of the throughput figure: the paper's five and HBM-PIM's serial variant beside its 6.1 default.
FIGURE_SYSTEMS = (*PAPER_SYSTEMS, "hbm-pim-serial")
#: Latency study (6.1 set-up facts): GPT-89B, decode-only batches of 6K-token requests.
TBT_MODEL = "gpt-89b"
TBT_CONTEXT = 6 * 1024
TBT_BATCHES = (16, 32, 64, 128, 256, 512)
TBT_RANKSETS = (2, 4, 8, 16)


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _write_csv(path, rows, columns=None):
    import pandas as pd
    df = pd.DataFrame(rows)
    if columns:
        df = df[[c for c in columns if c in df.columns]]
    df.to_csv(path, index=False)
    return df


# ---- throughput -------------------------------------------------------------------------------------------------

def throughput_table(rows) -> list:
    """Rows with ``normalized``: throughput / GPU-only's on the same model and trace, or / L3's where GPU-only ran
    out of memory (``norm_to`` says which)."""
    by = {(r["model"], r["trace"], r["system"]): r for r in rows}
    out = []
    for r in rows:
        g = by.get((r["model"], r["trace"], "gpu-only"))
        ref, to = (g, "gpu-only") if g and not g.get("oom") else (by.get((r["model"], r["trace"], "l3")), "l3")
        thr = r.get("throughput_tok_s")
        base = ref.get("throughput_tok_s") if ref and not ref.get("oom") else None
        norm = thr / base if (thr is not None and base and np.isfinite(thr)) else float("nan")
        out.append({**r, "normalized": norm, "norm_to": to})
    return out


def _bars(ax, groups, series, values, ylabel, title, log=False):
    x = np.arange(len(groups))
    w = 0.8 / max(1, len(series))
    for j, s in enumerate(series):
        v = np.array([values.get((g, s), np.nan) for g in groups], dtype=float)
        from host.plot import system_style, system_order   # one style per system, the same in every figure
        st = system_style(s) if s in system_order() else {}
        ax.bar(x + (j - (len(series) - 1) / 2) * w, np.nan_to_num(v, nan=0.0), w, label=s,
               **{k: st[k] for k in ("color", "hatch") if k in st})
        for xi, vi in zip(x, v):
            if not np.isfinite(vi):
                ax.text(xi + (j - (len(series) - 1) / 2) * w, 0, "OOM", rotation=90, ha="center", va="bottom",
                        fontsize=6)
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if log:
        ax.set_yscale("log")


def plot_throughput(rows, path):
    plt = _plt()
    traces = [t for t in PAPER_TRACES if any(r["trace"] == t for r in rows)] or sorted({r["trace"] for r in rows})
    systems = [s for s in FIGURE_SYSTEMS if any(r["system"] == s for r in rows)]
    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.4), squeeze=False)
    for ax, t in zip(axes[0], traces):
        vals = {(r["model"], r["system"]): r["normalized"] for r in rows if r["trace"] == t}
        _bars(ax, models, systems, vals, "throughput (norm.)", t, log=True)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)   # outside
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


# ---- ablation / scalability -------------------------------------------------------------------------------------

def ablation_table(rows) -> list:
    by = {(r["model"], r["trace"], r["system"]): r for r in rows}
    out = []
    for r in rows:
        b = by.get((r["model"], r["trace"], "l3-base"))
        base = b["throughput_tok_s"] if b else None
        out.append({**r, "normalized": r["throughput_tok_s"] / base if base else float("nan")})
    return out


def plot_ablation(rows, path):
    plt = _plt()
    traces = [t for t in PAPER_TRACES if any(r["trace"] == t for r in rows)]
    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.4), squeeze=False)
    for ax, t in zip(axes[0], traces):
        vals = {(r["model"], r["system"]): r["normalized"] for r in rows if r["trace"] == t}
        _bars(ax, models, list(ABLATION_FIGURE_SYSTEMS), vals, "throughput / l3-base", t)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def scalability_table(rows) -> list:
    """Rows with ``normalized`` = throughput / the base's (512 GB, 2 ranksets); where the base runs out of memory
    (a request longer than the replica's share of 512 GB), / the first point of the Bw-Cap series that does not
    (``norm_to`` names it)."""
    out = []
    for r in rows:
        series = [b for b in rows if b["model"] == r["model"] and b["variant"] == "Bw-Cap"]
        ok = [b for b in series if b.get("throughput_tok_s") is not None and np.isfinite(b["throughput_tok_s"])]
        base = ok[0] if ok else None
        norm = r["throughput_tok_s"] / base["throughput_tok_s"] if base and r.get("throughput_tok_s") is not None \
            else float("nan")
        out.append({**r, "normalized": norm,
                    "norm_to": f"{base['ranksets']} ranksets, {base['host_memory_gb']:g} GB" if base else None})
    return out


def plot_scalability(rows, path):
    plt = _plt()
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
    for ax, m in zip(axes[0], models):
        for v in ("Bw-only", "Cap-only", "Bw-Cap"):
            pts = [r for r in rows if r["model"] == m and r["variant"] == v]
            ax.plot(range(len(pts)), [r["normalized"] for r in pts], marker="o", label=v)
            if v == "Bw-Cap":
                ax.set_xticks(range(len(pts)), [f"{r['ranksets']}RS\n{int(r['host_memory_gb'])}G" for r in pts],
                              fontsize=7)
        ax.set_ylabel("L3 throughput / base")
        ax.set_title(f"{m}, {rows[0]['trace']}", fontsize=9)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


# ---- latency study ----------------------------------------------------------------------------------------------

def tbt_study(*, model=TBT_MODEL, batches=TBT_BATCHES, ranksets=TBT_RANKSETS, context=TBT_CONTEXT) -> list:
    """TBT of decode-only iterations: every request attends over ``context`` + 1 tokens; ``batch`` requests on the
    node (``batch / DP`` per replica). L3: two balanced sub-batches on the rankset classes (``j mod R``),
    ``max(T_GPU_0, T_PIM_1) + max(T_GPU_1, T_PIM_0)``; GPU: FC plus attention over KV in HBM (capacity not
    limited). Host capacity is not limited either (a latency study)."""
    from host.l3.config import l3_setup
    from host.l3.gpu_side import GPUSide
    from host.l3.pim_side import PIMSide
    from host.l3.scheduler import balanced_split
    rows = []
    base = l3_setup(model)
    gpu = GPUSide(base)
    for B in batches:
        n = max(1, B // base.dp)
        L = np.full(n, context + 1)
        t_gpu = float(gpu.fc(n, n)) + gpu.decode_attn(n, int(L.sum()))
        rows.append({"model": model, "system": "gpu (unlimited HBM)", "batch": B, "ranksets": None,
                     "tbt_ms": 1e3 * t_gpu})
        for R in ranksets:
            s = l3_setup(model, ranksets=R)
            pim = PIMSide(s, comm=True)
            cls = np.arange(n) % R
            a, b = balanced_split(L, cls)
            G = [float(gpu.fc(len(x), len(x))) for x in (a, b)]
            P = [pim.n_layers * pim.phase(L[x], cls[x]).total for x in (a, b)]
            t = max(G[0], P[1]) + max(G[1], P[0])
            rows.append({"model": model, "system": "l3", "batch": B, "ranksets": R, "tbt_ms": 1e3 * t,
                         "t_gpu_ms": 1e3 * (G[0] + G[1]), "t_pim_ms": 1e3 * (P[0] + P[1])})
    return rows


def plot_tbt(rows, path):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    g = [r for r in rows if r["system"] != "l3"]
    ax.plot([r["batch"] for r in g], [r["tbt_ms"] for r in g], "k--o", label=g[0]["system"] if g else "gpu")
    for R in sorted({r["ranksets"] for r in rows if r["system"] == "l3"}):
        pts = [r for r in rows if r["system"] == "l3" and r["ranksets"] == R]
        ax.plot([r["batch"] for r in pts], [r["tbt_ms"] for r in pts], marker="o", label=f"L3, {R} ranksets")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (requests of 6K tokens)")
    ax.set_ylabel("TBT (ms)")
    ax.set_title(f"{rows[0]['model']}: decode-only TBT", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


# ---- predictors --------------------------------------------------------------------------------------------------

def _predictor_point(args):
    model, trace, n_requests, seed, n_batches = args
    from host.l3.run import run_l3, FAST_ENGINE
    from host.l3.predictors import holdout_error
    r = run_l3(model, trace, "l3", n_requests=n_requests, seed=seed, engine=FAST_ENGINE)
    pb = [s.profiled_batches() for s in r.systems]
    from host.l3.predictors import ProfiledBatches
    allb = ProfiledBatches.concat(pb)
    n = len(allb)
    take = np.sort(np.random.default_rng(seed).choice(n, min(n_batches, n), replace=False)) if n else []
    res = holdout_error(allb.subset(take), seed=seed) if n >= 10 else {}
    return {"model": model, "trace": trace, "profiled_batches": n, **res,
            "re_pim_online": r.summary.get("pred_re_pim_online"), "re_gpu_online": r.summary.get("pred_re_gpu_online")}


def predictor_study(*, models=MODELS, trace="dolphin", n_requests=1000, seed=0, n_batches=1000, executor=None,
                    jobs=None) -> list:
    """Per model: an L3 run's profiled sub-batches (true times), ``n_batches`` of them at random, RE of fresh
    predictors trained on 80 % and tested on 20 % (:func:`host.l3.predictors.holdout_error`), with the run's
    online errors (the scheduler's own predictions against the true times)."""
    from host.sweep import LocalExecutor
    own = executor is None
    ex = LocalExecutor(jobs) if own else executor
    try:
        return ex.map(_predictor_point, [(m, trace, n_requests, seed, n_batches) for m in models],
                      desc="l3 predictor study")
    finally:
        if own:
            ex.close()


def plot_predictor(rows, path):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    keys = [("re_pim", "T_PIM (Linear), held out"), ("re_gpu", "T_GPU (RFR_p + RFR_batch), held out"),
            ("re_pim_online", "T_PIM, online"), ("re_gpu_online", "T_GPU, online")]
    models = [r["model"] for r in rows]
    vals = {(r["model"], lab): 100 * (r.get(k) or np.nan) for r in rows for k, lab in keys}
    _bars(ax, models, [lab for _, lab in keys], vals, "relative error (%)", f"predictors ({rows[0]['trace']})")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


# ---- all --------------------------------------------------------------------------------------------------------

def make_figures(out_dir, *, n_requests=1000, seed=0, only=FIGURES, executor=None, jobs=None,
                 scaling_models=MODELS, scaling_trace="openr1", log=print, pim_command_path=None) -> dict:
    """Run what ``only`` needs and write ``<name>.csv`` and ``<name>.png`` for each figure into ``out_dir``;
    returns {figure: [paths]} and writes figures.json (the tables). ``pim_command_path``: the DIMM-PIM's command
    path of every run of the throughput, ablation and scalability figures (None: the default, per_rank)."""
    from host.sweep import LocalExecutor
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    unknown = set(only) - set(FIGURES)
    if unknown:
        raise ValueError(f"unknown figure(s) {sorted(unknown)}; allowed: {list(FIGURES)}")
    own = executor is None
    ex = LocalExecutor(jobs) if own else executor
    written, tables = {}, {}
    try:
        pts = []
        if "throughput" in only:
            pts += throughput_points(n_requests=n_requests, seed=seed, systems=FIGURE_SYSTEMS)
        if "ablation" in only:
            pts += [p for p in ablation_points(n_requests=n_requests, seed=seed)
                    if not ("throughput" in only and p.system == "l3")]
        if "scalability" in only:
            pts += scalability_points(models=scaling_models, trace=scaling_trace, n_requests=n_requests, seed=seed)
        if pim_command_path is not None:
            from dataclasses import replace as _replace
            pts = [_replace(p, options=tuple(sorted({**dict(p.options), "pim_command_path": pim_command_path}.items())))
                   for p in pts]
        rows = run_points(pts, executor=ex, desc="l3 figures") if pts else []
        if "throughput" in only:
            t = throughput_table([r for r in rows if r["study"] == "throughput"])
            _write_csv(out / "throughput.csv", t)
            plot_throughput(t, out / "throughput.png")
            written["throughput"], tables["throughput"] = [out / "throughput.csv", out / "throughput.png"], t
        if "ablation" in only:
            ab = [r for r in rows if r["study"] == "ablation"]
            ab += [{**r, "study": "ablation"} for r in rows if r["study"] == "throughput" and r["system"] == "l3"]
            t = ablation_table(ab)
            _write_csv(out / "ablation.csv", t)
            plot_ablation(t, out / "ablation.png")
            written["ablation"], tables["ablation"] = [out / "ablation.csv", out / "ablation.png"], t
        if "scalability" in only:
            t = scalability_table([r for r in rows if r["study"] == "scalability"])
            _write_csv(out / "scalability.csv", t)
            plot_scalability(t, out / "scalability.png")
            written["scalability"], tables["scalability"] = [out / "scalability.csv", out / "scalability.png"], t
        if "tbt" in only:
            t = tbt_study()
            _write_csv(out / "tbt.csv", t)
            plot_tbt(t, out / "tbt.png")
            written["tbt"], tables["tbt"] = [out / "tbt.csv", out / "tbt.png"], t
        if "predictor" in only:
            t = predictor_study(n_requests=n_requests, seed=seed, executor=ex)
            _write_csv(out / "predictor.csv", t)
            plot_predictor(t, out / "predictor.png")
            written["predictor"], tables["predictor"] = [out / "predictor.csv", out / "predictor.png"], t
    finally:
        if own:
            ex.close()
    (out / "figures.json").write_text(json.dumps({"n_requests": n_requests, "seed": seed, "tables": tables},
                                                 indent=1, default=lambda o: o.item() if hasattr(o, "item")
                                                 else str(o)) + "\n")
    for name, paths in written.items():
        log(f"{name}: " + ", ".join(str(p) for p in paths))
    return written
