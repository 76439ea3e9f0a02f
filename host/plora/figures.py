"""The PLoRA study's sweeps and figures (issue item 9): each figure is a named sweep of :class:`RunSpec` points
(or an analytic table), written as ``<name>.csv`` and ``<name>.png`` (matplotlib, Agg).

=================  =========================================================================================
name               what
=================  =========================================================================================
tpot_grid          TPOT (mean, p99) per model x workload (uniform, skewed, uniform-long, skewed-long) x system
ttft_prefill       TTFT of a burst of 256 / 512 / 1024 requests prefilled as one batch
ablation           TPOT of N(E3), N(E4), NS, ND(E3), ND(E4), NSD (= plora) per model (from the grid)
layer_breakdown    per-layer decode latency by component and system (llama2-7b, uniform)
kv_dup             KV fraction duplicated in HBM per model x workload (grid) and over time (one run)
strategy_mix       adapters per strategy E1..E4 in the decode batch over time (uniform and skewed runs)
sensitivity        PLoRA TPOT vs NDP TFLOPS, device bandwidth and buffer size (llama2-7b, uniform-long; the
                   calibrated NDP model at each device's geometry)
link_ladder        TPOT vs link bandwidth, nine rungs 8 .. 1800 GB/s (llama2-7b, uniform-long)
link_latency       TPOT vs one-way link latency 50 .. 2000 ns, two round trips per layer (uniform-long)
devices            TPOT vs device count 1 .. 64 (llama2-7b, uniform-long)
tp_study           per-layer LoRA wave, TP-4 .. TP-64, 7B .. 1.2T, naive vs sharded (analytic)
kv_precision       TPOT with FP16 / INT8 / INT4 KV caches
rate_sweep         throughput vs TPOT per system over open-loop arrival rates up to saturation, and the throughput
                   each sustains at the TPOT SLO (llama2-7b, uniform)
matched_batch      TPOT at matched batch: every system closed-loop at the same fixed batch (llama2-7b, uniform)
=================  =========================================================================================

Every sweep runs through ``host.sweep``'s executor (process pool or Dask), with a progress bar.
"""

import json
from pathlib import Path

import numpy as np

from .config import SYSTEM_NAMES
from .run import RunSpec, run_point, MODELS, run_spec

__all__ = ["FIGURES", "GRID_WORKLOADS", "GRID_RATE_PER_S", "ABLATION", "LINK_LADDER_GBPS", "LATENCIES_NS", "DEVICE_COUNTS",
           "grid_specs", "run_sweep", "make_figures", "sweep_specs"]

GRID_WORKLOADS = ("uniform", "skewed", "uniform-long", "skewed-long")
ABLATION = ("n-e3", "n-e4", "ns", "nd-e3", "nd-e4", "plora")
MAIN = ("plora", "s-lora", "pure-cxl", "cpu-lora-offload", "grace-hopper", "plora-nocxl")
#: PLoRA set-up facts: nine link bandwidths from 8 to 1800 GB/s (PCIe 5.0, CXL 3.1, NVLink-C2C, NVLink 5 and
#: 6 classes): design choice of the rungs between the class anchors 64 (PCIe 5.0 x16), 128 (CXL 3.1), 450
#: (NVLink-C2C), 900 (NVLink 5) and 1800 (NVLink 6) GB/s per direction.
LINK_LADDER_GBPS = (8, 16, 32, 64, 128, 256, 450, 900, 1800)
LATENCIES_NS = (50, 100, 200, 500, 1000, 2000)
DEVICE_COUNTS = (1, 2, 4, 8, 16, 32, 64)
#: NDP TFLOPS at 1 GHz: 256 .. 4,096 MACs (the calibrated model's cores are powers of two, NDPDeviceSpec.ndp_config)
TFLOPS = (0.512, 1.024, 2.048, 4.096, 8.192)
#: device bandwidth: 16 .. 256 LPDDR5X-8533 channels (NDPDeviceSpec.channels), the paper's 64 in the middle
DEVICE_BW = (275.0, 550.0, 1100.0, 2200.0, 4400.0)
#: MiB of each of the input, DRAM and output buffers (the paper's core: 0.5, 1 and 0.5 MiB; hdl/ndp/config.PAPER)
BUFFER_MB = (0.5, 1.0, 2.0, 4.0)
PREFILL_BATCHES = (256, 512, 1024)
KV_BITS = (16, 8, 4)
#: Open-loop arrival rates of the rate sweep (requests/s; design choice: from the workloads' default 10 up past
#: the rate where every system saturates on llama2-7b uniform, 4x steps with 2x between)
RATES = (2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
#: The TPOT SLO of ``rate_sweep``'s throughput-at-SLO (design choice, the papers state none: p99 TPOT of 100 ms,
#: 10 tokens/s per user, faster than reading speed)
TPOT_SLO_MS = 100.0
#: Fixed batches of ``matched_batch`` (design choice: a light, a typical and a heavy decode batch)
MATCHED_BATCHES = (16, 64, 128)
#: The TPOT grid's open-loop arrival rate (requests/s): the paper's load regime (issue 30 item 2). PLoRA's
#: premise (sections I and III, Fig. 3b) is that the serving set's adapters and KV overshoot the HBM left after
#: the weights; Table VII's arrival rates are not in the text, so the rate is chosen for that premise: the lowest
#: rate of :data:`RATES` at which PLoRA's ``hbm_pressure`` exceeds 1 on the uniform workloads of every model
#: (1,000 requests, seed 0, measured 2026-12-05: at 20 requests/s Llama-3-8B uniform is at 0.45; at 40
#: requests/s 1.06, Llama-2-7B 1.85, Llama-2-13B 3.59, Qwen3-30B-A3B 61; docs/plora_host.md "The grid's regime").
#: A consistency check, not the source: at 40 requests/s and the uniform workload's mean output of ~260 tokens a
#: system decoding at ~25 ms per token (S-LoRA's TPOT at large batch) holds 40 x 260 x 0.025 = 260 requests,
#: the batcher's cap of 256 (V-A: B_i up to 256).
GRID_RATE_PER_S = 40.0
FIGURES = ("tpot_grid", "ttft_prefill", "ablation", "layer_breakdown", "kv_dup", "strategy_mix", "sensitivity",
           "link_ladder", "link_latency", "devices", "tp_study", "kv_precision", "rate_sweep", "matched_batch")


def grid_specs(*, n_requests=100, seed=0, models=MODELS, workloads=GRID_WORKLOADS, systems=SYSTEM_NAMES,
               rate_per_s=GRID_RATE_PER_S):
    """The TPOT grid: every model x workload x system at the regime's arrival rate (:data:`GRID_RATE_PER_S`). A
    model whose referenced adapters do not fit the default pool gets the fewest devices that hold them
    (``devices=0``; the CSV's ``devices_used`` says)."""
    return [RunSpec(model=m, workload=w, system=s, n_requests=n_requests, seed=seed, rate_per_s=rate_per_s,
                    devices=0 if m == "qwen3-30b-a3b" else None)
            for m in models for w in workloads for s in systems]


def sweep_specs(name, *, n_requests=100, seed=0):
    """The run specs of one named sweep (analytic figures have none)."""
    # every sweep at the grid's regime (issue 30 item 2: the open-loop rate at which the serving set overshoots
    # the HBM); the rate sweep sets its own rates, the TTFT study its bursts
    base = RunSpec(model="llama2-7b", workload="uniform", n_requests=n_requests, seed=seed, rate_per_s=GRID_RATE_PER_S)
    # the device and link sweeps run the long-context workload: its KV does not fit HBM, so the pool is used
    pressed = base.with_(workload="uniform-long")
    if name == "tpot_grid":
        return grid_specs(n_requests=n_requests, seed=seed)
    if name == "ttft_prefill":
        return [base.with_(model=m, system=s, n_requests=b, arrival="burst", output_tokens=1, max_batch=b,
                           max_tokens=b * 512, devices=0 if m == "qwen3-30b-a3b" else None, tag=f"batch={b}")
                for m in MODELS for b in PREFILL_BATCHES for s in MAIN]
    if name == "sensitivity":
        # the calibrated model at each device's geometry (issue 32: before, the stand-in, whose constants were
        # stale); buffer *sets* are a stand-in assumption with no RTL counterpart, so the third panel sizes the
        # core's one set of buffers
        out = [pressed.with_(system="plora", ndp_tflops=t, tag="tflops") for t in TFLOPS]
        out += [pressed.with_(system="plora", device_bw_gbps=b, tag="bandwidth") for b in DEVICE_BW]
        out += [pressed.with_(system="plora", buffer_mb=b, tag="buffer_mb") for b in BUFFER_MB]
        return out
    if name == "link_ladder":
        return [pressed.with_(system=s, link_gbps=g) for s in ("plora", "ns", "pure-cxl") for g in LINK_LADDER_GBPS]
    if name == "link_latency":
        return [pressed.with_(system=s, link_latency_ns=l) for s in ("plora", "pure-cxl") for l in LATENCIES_NS]
    if name == "devices":
        return [pressed.with_(system=s, devices=d) for s in ("plora", "pure-cxl") for d in DEVICE_COUNTS]
    if name == "rate_sweep":
        return [base.with_(system=s, rate_per_s=r) for s in MAIN for r in RATES]
    if name == "matched_batch":
        return [base.with_(system=s, fixed_batch=b, n_requests=max(n_requests, 4 * b)) for s in MAIN
                for b in MATCHED_BATCHES]
    if name == "kv_precision":
        return [base.with_(workload="uniform-long", system=s, kv_bits=b) for s in ("plora", "s-lora", "pure-cxl")
                for b in KV_BITS]
    return []


def _executor(executor):
    if executor is None:
        from host.sweep import LocalExecutor
        return LocalExecutor()
    return executor


def run_sweep(specs, executor=None, desc="plora sweep"):
    """Run specs through the executor; a pandas DataFrame of :func:`run_point` rows."""
    import pandas as pd
    ex = _executor(executor)
    rows = ex.map(run_point, list(specs), desc=desc)
    return pd.DataFrame(rows)


# --- time series and breakdown runs (one process each: they need the iteration log) -----------------------

def _iterations(spec):
    import pandas as pd
    out = run_spec(spec)
    it = pd.DataFrame({k: np.asarray(v) for k, v in out.iterations.items()})
    return it, out


def breakdown_point(spec: RunSpec) -> dict:
    """Per-layer decode latency by component (ms), averaged over decode-only iterations (weighted by time)."""
    it, out = _iterations(spec)
    dec = it[it["n_prefill"] == 0]
    from host.models import get_model
    L = get_model(spec.model).n_layers
    w = dec["duration_s"].to_numpy()
    row = {"system": spec.system, "model": spec.model, "layer_ms": float(np.sum(w * w) / max(w.sum(), 1e-30)) * 1e3 / L}
    for col in ("base_s", "lora_s", "attention_s", "host_s", "fetch_s", "staging_s", "link_busy_s"):
        if col in dec:
            v = np.nan_to_num(dec[col].to_numpy(float))
            row[col.replace("_s", "_ms")] = float(np.sum(v * w) / max(w.sum(), 1e-30)) * 1e3 / L
    return row


def series_point(spec: RunSpec) -> dict:
    it, out = _iterations(spec)
    cols = ["start_s", "duration_s", "n_requests", "n_decode", "kv_dup_fraction", "n_E1", "n_E2", "n_E3", "n_E4",
            "hbm_adapters_gb", "hbm_kv_dup_gb"]
    return {"workload": spec.workload, "rows": it[[c for c in cols if c in it]].to_dict("list")}


# --- figures -----------------------------------------------------------------------------------------------

def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, out, name):
    fig.tight_layout()
    fig.savefig(Path(out) / f"{name}.png", dpi=110, bbox_inches="tight")     # (legends outside the axes)
    _plt().close(fig)


def _legend(ax, **kw):
    """The legend outside the data, right of the axes (issue 32 item 7)."""
    ax.legend(fontsize=kw.pop("fontsize", 7), loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw)


def _style(hue, h) -> dict:
    """A system's own colour and hatch (host.plot.system_style: the same in every figure of both hosts)."""
    if hue != "system":
        return {}
    from host.plot import system_style
    st = system_style(str(h))
    return {"color": st["color"], "hatch": st["hatch"]}


def _bars(ax, df, x, hue, y, order_x, order_hue, log=False):
    n = len(order_hue)
    width = 0.8 / n
    for j, h in enumerate(order_hue):
        vals = [df[(df[x] == v) & (df[hue] == h)][y].mean() for v in order_x]
        ax.bar(np.arange(len(order_x)) + (j - (n - 1) / 2) * width, vals, width, label=h, **_style(hue, h))
    ax.set_xticks(np.arange(len(order_x)))
    ax.set_xticklabels(order_x, rotation=30, ha="right", fontsize=7)
    if log:
        ax.set_yscale("log")


def fig_tpot_grid(df, out):
    plt = _plt()
    models = [m for m in MODELS if m in set(df["model"])]
    fig, axes = plt.subplots(len(models), 1, figsize=(11, 2.6 * len(models)), squeeze=False)
    systems = [s for s in SYSTEM_NAMES if s in set(df["system"])]
    for ax, m in zip(axes[:, 0], models):
        _bars(ax, df[df["model"] == m], "workload", "system", "tpot_ms_mean",
              [w for w in GRID_WORKLOADS if w in set(df["workload"])], systems, log=True)
        ax.set_title(f"{m}: mean TPOT (ms, log)", fontsize=9)
    _legend(axes[0, 0], fontsize=6)
    _save(fig, out, "tpot_grid")


def fig_ablation(df, out):
    plt = _plt()
    d = df[df["system"].isin(ABLATION)]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    _bars(ax, d[d["workload"].isin(GRID_WORKLOADS)], "model", "system", "tpot_ms_mean",
          [m for m in MODELS if m in set(d["model"])], list(ABLATION), log=True)
    ax.set_ylabel("mean TPOT (ms), over the grid's workloads")
    _legend(ax)
    _save(fig, out, "ablation")


def fig_kv_dup(df, series, out):
    plt = _plt()
    d = df[df["system"] == "plora"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.5))
    _bars(a, d, "model", "workload", "kv_dup_fraction", [m for m in MODELS if m in set(d["model"])],
          [w for w in GRID_WORKLOADS if w in set(d["workload"])])
    a.set_ylabel("KV fraction duplicated in HBM")
    _legend(a)
    for s in series:
        r = s["rows"]
        if "kv_dup_fraction" in r:
            b.plot(r["start_s"], r["kv_dup_fraction"], label=s["workload"], lw=0.8)
    b.set_xlabel("time (s)")
    b.set_ylabel("P_KV of the decode batch")
    _legend(b)
    _save(fig, out, "kv_dup")


def fig_strategy_mix(series, out):
    plt = _plt()
    fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 3.3), squeeze=False)
    for ax, s in zip(axes[0], series):
        r = s["rows"]
        ys = [np.nan_to_num(np.asarray(r.get(f"n_E{i}", []), float)) for i in (1, 2, 3, 4)]
        if len(ys[0]):
            ax.stackplot(r["start_s"], *ys, labels=["E1", "E2", "E3", "E4"], step="post")
        ax.set_title(f"plora, llama2-7b, {s['workload']}", fontsize=9)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("adapters in the decode batch")
        _legend(ax)
    _save(fig, out, "strategy_mix")


def fig_layer_breakdown(rows, out):
    plt = _plt()
    comps = [("base_ms", "base GEMMs"), ("lora_ms", "LoRA"), ("attention_ms", "attention"),
             ("host_ms", "host-mediated"), ("fetch_ms", "adapter fetch"), ("staging_ms", "host staging")]
    fig, ax = plt.subplots(figsize=(10, 3.8))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for key, label in comps:
        v = np.array([float(np.nan_to_num(r.get(key, 0.0))) for r in rows])
        if v.any():
            ax.bar(x, v, 0.6, bottom=bottom, label=label)
            bottom += v
    ax.plot(x, [r["layer_ms"] for r in rows], "k_", ms=18, label="iteration / layers")
    ax.set_xticks(x)
    ax.set_xticklabels([r["system"] for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("per-layer decode time (ms)")
    _legend(ax)
    _save(fig, out, "layer_breakdown")


def _lines(df, x, out, name, xlabel, hue="system", logx=True, logy=True, title=None):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for h, g in df.groupby(hue):
        g = g.sort_values(x)
        from host.plot import line_style
        st = line_style(str(h)) if hue == "system" else {}
        ax.plot(g[x], g["tpot_ms_mean"], **({"marker": "o", "linestyle": "-"} | st), label=str(h), ms=3)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("mean TPOT (ms)")
    if title:
        ax.set_title(title, fontsize=9)
    _legend(ax)
    _save(fig, out, name)


def throughput_at_slo(df, slo_ms: float = TPOT_SLO_MS):
    """Per system: the highest throughput of a rate-sweep point whose p99 TPOT meets ``slo_ms`` (NaN: none does)."""
    rows = []
    for s, g in df.groupby("system"):
        ok = g[g["tpot_ms_p99"].astype(float) <= slo_ms]
        best = ok.loc[ok["throughput_tok_s"].astype(float).idxmax()] if len(ok) else None
        rows.append({"system": s, "slo_tpot_ms_p99": slo_ms,
                     "throughput_tok_s_at_slo": float(best["throughput_tok_s"]) if best is not None else float("nan"),
                     "rate_per_s_at_slo": float(best["rate_per_s"]) if best is not None else float("nan"),
                     "max_throughput_tok_s": float(g["throughput_tok_s"].astype(float).max())})
    return rows


def fig_rate_sweep(df, out):
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    for s, g in df.groupby("system"):
        g = g.sort_values("rate_per_s")
        from host.plot import line_style
        st = line_style(str(s))
        a.plot(g["throughput_tok_s"], g["tpot_ms_mean"], ms=3, label=s, **st)
        b.plot(g["rate_per_s"], g["hbm_pressure_offered"], ms=3, label=s, **st)
    a.axhline(TPOT_SLO_MS, color="k", lw=0.6, ls="--")
    a.set_xlabel("throughput (output tokens/s)")
    a.set_ylabel("mean TPOT (ms)")
    a.set_yscale("log")
    a.set_title("llama2-7b, uniform: open-loop rates " + ", ".join(f"{r:g}" for r in RATES) + " req/s", fontsize=8)
    b.axhline(1.0, color="k", lw=0.6, ls="--")
    b.set_xscale("log")
    b.set_xlabel("arrival rate (requests/s)")
    b.set_ylabel("HBM pressure offered")
    _legend(b)
    _save(fig, out, "rate_sweep")


def fig_matched_batch(df, out):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.4))
    _bars(ax, df, "fixed_batch", "system", "tpot_ms_mean", sorted(set(df["fixed_batch"])),
          [s for s in MAIN if s in set(df["system"])], log=True)
    ax.set_xlabel("fixed batch (closed loop)")
    ax.set_ylabel("mean TPOT (ms)")
    ax.set_title("llama2-7b, uniform: TPOT at matched batch", fontsize=9)
    _legend(ax)
    _save(fig, out, "matched_batch")


def fig_sensitivity(df, out):
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.3))
    for ax, (tag, col, label) in zip(axes, (("tflops", "ndp_tflops", "NDP TFLOPS"),
                                            ("bandwidth", "device_bw_gbps", "device bandwidth (GB/s)"),
                                            ("buffer_mb", "buffer_mb", "MiB per buffer (input, DRAM, output)"))):
        g = df[df["tag"] == tag].sort_values(col)
        ax.plot(g[col], g["tpot_ms_mean"], "o-")
        ax.set_xlabel(label)
        ax.set_ylabel("PLoRA mean TPOT (ms), llama2-7b uniform-long")
        ax.set_xscale("log", base=2)
    _save(fig, out, "sensitivity")


def fig_ttft(df, out):
    plt = _plt()
    models = [m for m in MODELS if m in set(df["model"])]
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.3), squeeze=False)
    for ax, m in zip(axes[0], models):
        d = df[df["model"] == m]
        _bars(ax, d, "max_batch", "system", "ttft_s_mean", list(PREFILL_BATCHES), list(MAIN), log=True)
        ax.set_xticklabels([str(b) for b in PREFILL_BATCHES], rotation=0)
        ax.set_title(f"{m}: mean TTFT (s)", fontsize=9)
        ax.set_xlabel("prefill batch (requests)")
    _legend(axes[0, -1], fontsize=6)
    _save(fig, out, "ttft_prefill")


def fig_tp(rows, out):
    import pandas as pd
    plt = _plt()
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (m, g) in enumerate(df.groupby("model", sort=False)):
        for port, style in (("naive", "x--"), ("sharded", "o-")):
            h = g[g["port"] == port]
            ax.plot(h["tp"], h["per_token_ms"], style, color=colors[i % len(colors)], label=f"{m} {port}", ms=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tensor-parallel degree (each GPU with its own pool of 4 devices)")
    ax.set_ylabel("LoRA waves per token, all layers (ms)")
    _legend(ax, fontsize=6)
    _save(fig, out, "tp_study")


def fig_kv_precision(df, out):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    _bars(ax, df, "kv_bits", "system", "tpot_ms_mean", list(KV_BITS), ["plora", "s-lora", "pure-cxl"], log=True)
    ax.set_xticklabels(["FP16", "INT8", "INT4"], rotation=0)
    ax.set_ylabel("mean TPOT (ms), llama2-7b uniform-long")
    _legend(ax)
    _save(fig, out, "kv_precision")


def _csv(df, out, name):
    import pandas as pd
    if not isinstance(df, pd.DataFrame):
        df = pd.DataFrame(df)
    df.to_csv(Path(out) / f"{name}.csv", index=False)
    return df


def filter_specs(specs, models=None, systems=None) -> list:
    """The run specs of a sweep restricted to ``models`` / ``systems`` (None: all)."""
    return [s for s in specs if (models is None or s.model in models) and (systems is None or s.system in systems)]


def figure_points(name, models=None, systems=None) -> int:
    """Runs figure ``name`` has under the ``models`` / ``systems`` filter (0: nothing to draw; the analytic
    TP study: 1 whatever the filter)."""
    if name == "tp_study":
        return 1
    if name in ("ablation", "kv_dup"):
        name = "tpot_grid"
    if name == "strategy_mix":
        return len(filter_specs([RunSpec(model="llama2-7b", workload="uniform", system="plora")], models, systems))
    if name == "layer_breakdown":
        return len(filter_specs([RunSpec(model="llama2-7b", workload="uniform", system=s) for s in SYSTEM_NAMES],
                                models, systems))
    return len(filter_specs(sweep_specs(name), models, systems))


def make_figures(out, *, names=FIGURES, n_requests=100, seed=0, executor=None, reuse=False, log=print,
                 models=None, systems=None):
    """Write ``<name>.csv`` and ``<name>.png`` for every figure in ``names`` into ``out``. ``reuse``: read a
    sweep's CSV from ``out`` instead of rerunning it when it exists; ``models`` / ``systems``: only those points
    of every sweep (None: all). Returns {name: csv path}."""
    import pandas as pd
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    own = executor is None
    ex = _executor(executor)
    try:
        return _make(out, names, n_requests, seed, ex, reuse, models, systems)
    finally:
        if own:
            ex.close()


def _make(out, names, n_requests, seed, ex, reuse, models=None, systems=None):
    import pandas as pd
    done = {}
    keep = lambda specs: filter_specs(specs, models, systems)        # noqa: E731

    def sweep(name):
        path = out / f"{name}.csv"
        if reuse and path.exists():
            df = pd.read_csv(path, keep_default_na=False, na_values=[""])
            return df[(df["model"].isin(models) if models else True) & (df["system"].isin(systems) if systems
                                                                          else True)]
        df = run_sweep(keep(sweep_specs(name, n_requests=n_requests, seed=seed)), ex, desc=name)
        return _csv(df, out, name)

    grid = None
    if any(n in names for n in ("tpot_grid", "ablation", "kv_dup")):
        grid = sweep("tpot_grid")
        if "tpot_grid" in names:
            fig_tpot_grid(grid, out)
            done["tpot_grid"] = out / "tpot_grid.csv"
        if "ablation" in names:
            _csv(grid[grid["system"].isin(ABLATION)], out, "ablation")
            fig_ablation(grid, out)
            done["ablation"] = out / "ablation.csv"
    series = None
    if "strategy_mix" in names or "kv_dup" in names:
        specs = keep([RunSpec(model="llama2-7b", workload=w, system="plora", n_requests=max(n_requests, 200),
                              seed=seed, rate_per_s=GRID_RATE_PER_S) for w in ("uniform", "skewed")])
        series = ex.map(series_point, specs, desc="time series")
        rows = []
        for s in series:
            n = len(s["rows"]["start_s"])
            rows.append(pd.DataFrame({"workload": [s["workload"]] * n, **s["rows"]}))
        _csv(pd.concat(rows), out, "strategy_mix")
        fig_strategy_mix(series, out)
        done["strategy_mix"] = out / "strategy_mix.csv"
    if "kv_dup" in names:
        _csv(grid[grid["system"] == "plora"][["model", "workload", "kv_dup_fraction", "gpu_mem_gb_kv_dup",
                                              "gpu_mem_gb_adapters"]], out, "kv_dup")
        fig_kv_dup(grid, series, out)
        done["kv_dup"] = out / "kv_dup.csv"
    if "layer_breakdown" in names:
        specs = keep([RunSpec(model="llama2-7b", workload="uniform", system=s, n_requests=n_requests, seed=seed,
                              rate_per_s=GRID_RATE_PER_S) for s in SYSTEM_NAMES])
        rows = ex.map(breakdown_point, specs, desc="layer_breakdown")
        _csv(rows, out, "layer_breakdown")
        fig_layer_breakdown(rows, out)
        done["layer_breakdown"] = out / "layer_breakdown.csv"
    for name, fig in (("ttft_prefill", fig_ttft), ("sensitivity", fig_sensitivity),
                      ("kv_precision", fig_kv_precision)):
        if name in names:
            fig(sweep(name), out)
            done[name] = out / f"{name}.csv"
    if "link_ladder" in names:
        _lines(sweep("link_ladder"), "link_gbps", out, "link_ladder", "link bandwidth per direction (GB/s)",
               title="llama2-7b, uniform-long")
        done["link_ladder"] = out / "link_ladder.csv"
    if "link_latency" in names:
        _lines(sweep("link_latency"), "link_latency_ns", out, "link_latency", "one-way link latency (ns)",
               logy=False, title="llama2-7b, uniform-long (two round trips per layer)")
        done["link_latency"] = out / "link_latency.csv"
    if "devices" in names:
        _lines(sweep("devices"), "devices", out, "devices", "devices in the pool", title="llama2-7b, uniform-long")
        done["devices"] = out / "devices.csv"
    if "rate_sweep" in names:
        df = sweep("rate_sweep")
        fig_rate_sweep(df, out)
        _csv(throughput_at_slo(df), out, "rate_sweep_slo")
        done["rate_sweep"] = out / "rate_sweep.csv"
    if "matched_batch" in names:
        fig_matched_batch(sweep("matched_batch"), out)
        done["matched_batch"] = out / "matched_batch.csv"
    if "tp_study" in names:
        from .tp_study import tp_study
        rows = tp_study()
        _csv(rows, out, "tp_study")
        fig_tp(rows, out)
        done["tp_study"] = out / "tp_study.csv"
    (out / "figures.json").write_text(json.dumps({"n_requests": n_requests, "seed": seed,
                                                  "figures": {k: str(v) for k, v in done.items()}}, indent=2))
    return done
