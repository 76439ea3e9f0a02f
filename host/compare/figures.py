"""One figure per metric of ``ndpim compare``: grouped bars, workloads along x, one bar per system in the shared
system styles (host.plot.system_style), legend outside the data; a point without a number (absent, failed, not
reported) is marked ``n/a`` at its place."""

from pathlib import Path

from .verdict import METRICS, numeric

__all__ = ["plot_metric", "plot_all"]


def plot_metric(rows, metric, out) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from host.plot import system_style
    label, better = METRICS[metric]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    width = 0.8 / max(1, len(systems))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(workloads) + 2), 3.6))
    for j, s in enumerate(systems):
        st = system_style(s)
        xs, ys, na = [], [], []
        for i, w in enumerate(workloads):
            r = next((r for r in rows if r["workload"] == w and r["system"] == s), None)
            x = i - 0.4 + (j + 0.5) * width
            if r is not None and r.get("status") in ("served", "partial") and numeric(r.get(metric)):
                xs.append(x), ys.append(r[metric])
            else:
                na.append(x)
        ax.bar(xs, ys, width, color=st["color"], hatch=st["hatch"], edgecolor="k", linewidth=0.4, label=s)
        for x in na:
            ax.text(x, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=5, color=st["color"])
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads, fontsize=8)
    ax.set_ylabel(label, fontsize=8)
    ax.set_title(f"{label} ({'lower' if better == 'low' else 'higher'} is better)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_all(rows, out_dir) -> list:
    return [plot_metric(rows, m, Path(out_dir) / f"{m}.png") for m in METRICS]
