"""``ndpim plot``: figures and a compare table over run directories of either host (issue 32 item 7).

A run directory is what ``ndpim plora run``, ``ndpim l3 run`` or ``ndpim demo`` writes: ``summary.json`` (the
run's figures), ``config.json`` (what ran) and, for the serving hosts, ``iterations.csv`` (one row per engine
iteration). A *metric* is a key of ``summary.json`` (dotted for nested values: ``gpu_mem_gb.weights``,
``cost_model_err.mean``), plotted as one bar per run, or a column of ``iterations.csv`` (``duration_s``,
``n_decode``, ``kv_tokens`` ...), plotted against the iteration's start time, one line per run. The compare table
has one row per run: its label, host, system, model and every requested summary metric.

Every system has its own style (:func:`system_style`: 13+ distinguishable colour / marker / line combinations,
the same in every figure of both hosts), and legends sit outside the data.
"""

import csv
import json
from pathlib import Path

__all__ = ["Run", "load_run", "metric_value", "available_metrics", "compare_rows", "plot_runs", "system_style",
           "system_order", "DEFAULT_TABLE_METRICS", "format_table", "line_style"]

#: Every system either host runs, in a fixed order (PLoRA's, then L3's, then the end-to-end hybrid): a system's
#: style is its position here, so a system looks the same in every figure whatever else the figure shows.
def system_order() -> tuple:
    global _ORDER
    if _ORDER is None:
        from host.plora.config import ALL_SYSTEMS
        from host.l3.systems import SYSTEMS as L3_SYSTEMS
        _ORDER = tuple(ALL_SYSTEMS) + tuple(s for s in L3_SYSTEMS if s not in ALL_SYSTEMS) + ("hybrid",)
    return _ORDER


_ORDER = None
#: matplotlib's tab20 (strong tones first) then tab20b's darker tones: 32 colours, one per known system
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
           "#dbdb8d", "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252",
           "#bd9e39", "#ad494a", "#a55194", "#6b6ecf", "#e7ba52")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "8")
_LINES = ("-", "--", "-.", ":")
_HATCHES = ("", "//", "..", "xx", "\\\\", "--", "++", "oo")
#: summary metrics of the default compare table (both hosts write them)
DEFAULT_TABLE_METRICS = ("requests", "finished", "tpot_ms_mean", "tpot_ms_p99", "ttft_s_mean", "throughput_tok_s",
                         "mean_batch")


def system_style(name: str) -> dict:
    """Matplotlib style of system ``name``: ``color``, ``marker``, ``linestyle`` (lines) and ``hatch`` (bars). The
    first 32 systems of :func:`system_order` (every system of both hosts) differ in colour, and any two systems
    differ in colour, marker or line style; an unknown name gets a style from its hash, past the known ones."""
    order = system_order()
    i = order.index(name) if name in order else len(order) + sum(map(ord, name)) % 97
    return {"color": _COLORS[i % len(_COLORS)], "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _LINES[(i // len(_COLORS)) % len(_LINES)],
            "hatch": _HATCHES[(i // len(_COLORS)) % len(_HATCHES)]}


def line_style(name: str) -> dict:
    """The keyword arguments of ``Axes.plot`` for system ``name``'s line (colour, marker, line style)."""
    st = system_style(name)
    return {"color": st["color"], "marker": st["marker"], "linestyle": st["linestyle"]}


class Run:
    """One run directory (:func:`load_run`)."""

    def __init__(self, path, summary, config, label):
        self.path, self.summary, self.config, self.label = Path(path), summary, config, label
        self._iterations = None

    @property
    def host(self) -> str:
        cmd = str(self.config.get("command", ""))
        for h in ("plora", "l3", "demo", "e2e"):
            if h in cmd:
                return h
        return "l3" if "setup" in self.config else ("plora" if "spec" in self.config else "?")

    @property
    def system(self) -> str:
        s = self.summary.get("system", self.config.get("system", "?"))
        return s if isinstance(s, str) else str(s.get("name", s)) if isinstance(s, dict) else str(s)

    @property
    def model(self) -> str:
        spec = self.config.get("spec")
        m = spec.get("model") if isinstance(spec, dict) else self.config.get("model")
        if isinstance(m, dict):
            m = m.get("name")
        return str(m) if m is not None else "?"

    def iterations(self) -> dict:
        """``iterations.csv`` as columns of floats (empty when the run wrote none)."""
        if self._iterations is None:
            p = self.path / "iterations.csv"
            cols = {}
            if p.is_file():
                with open(p, newline="") as f:
                    for row in csv.DictReader(f):
                        for k, v in row.items():
                            try:
                                cols.setdefault(k, []).append(float(v))
                            except (TypeError, ValueError):
                                cols.setdefault(k, []).append(float("nan"))
            self._iterations = cols
        return self._iterations


def load_run(path) -> Run:
    """The run directory at ``path``; a ValueError names what is missing."""
    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"{str(p)!r} is not a run directory (not a directory)")
    docs = {}
    for name in ("summary.json", "config.json"):
        f = p / name
        if not f.is_file():
            raise ValueError(f"{str(p)!r} is not a run directory: it has no {name} (written by ndpim plora run, "
                             f"ndpim l3 run or ndpim demo)")
        try:
            docs[name] = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{str(f)!r}: not valid JSON ({exc})") from None
    return Run(p, docs["summary.json"], docs["config.json"], p.name or str(p))


def metric_value(summary: dict, key: str):
    """``summary[key]``, a dotted key descending into nested dicts; None when absent or not a number."""
    v = summary
    for part in key.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    if isinstance(v, bool):
        return float(v)
    return float(v) if isinstance(v, (int, float)) else None


def _numeric_keys(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _numeric_keys(v, f"{prefix}{k}.")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield f"{prefix}{k}"


def available_metrics(runs) -> tuple:
    """(summary metrics every run has, iterations.csv columns every run has), sorted."""
    summ = set.intersection(*(set(_numeric_keys(r.summary)) for r in runs)) if runs else set()
    its = set.intersection(*(set(r.iterations()) for r in runs)) if runs else set()
    return sorted(summ), sorted(its)


def _labels(runs):
    """Unique labels: the directory names, made unique with their parents where two are alike."""
    names = [r.label for r in runs]
    if len(set(names)) == len(names):
        return names
    return [str(r.path) for r in runs]


def compare_rows(runs, metrics=DEFAULT_TABLE_METRICS) -> list:
    """One dict per run: ``run``, ``host``, ``system``, ``model`` and each metric (None where the run lacks it)."""
    return [{"run": lab, "host": r.host, "system": r.system, "model": r.model,
             **{m: metric_value(r.summary, m) for m in metrics}} for lab, r in zip(_labels(runs), runs)]


def format_table(rows) -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    cell = lambda v: "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    w = {c: max(len(c), *(len(cell(r[c])) for r in rows)) for c in cols}
    out = ["  ".join(c.ljust(w[c]) for c in cols), "  ".join("-" * w[c] for c in cols)]
    out += ["  ".join(cell(r[c]).ljust(w[c]) for c in cols) for r in rows]
    return "\n".join(out)


def plot_runs(runs, metric: str, out) -> Path:
    """``out`` (a .png, .pdf or .svg): ``metric`` of every run; a summary metric as bars, an iterations.csv column
    against the iteration's start time. A ValueError names an unknown metric and the ones every run has."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    summ, its = available_metrics(runs)
    labels = _labels(runs)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.0 + 0.7 * len(runs)), 3.4))
    if metric in summ:
        for i, (lab, r) in enumerate(zip(labels, runs)):
            st = system_style(r.system)
            ax.bar(i, metric_value(r.summary, metric), 0.7, color=st["color"], hatch=st["hatch"], edgecolor="k",
                   linewidth=0.4, label=f"{lab} ({r.system})")
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(metric)
    elif metric in its:
        for lab, r in zip(labels, runs):
            st = system_style(r.system)
            cols = r.iterations()
            t = cols.get("start_s") or list(range(len(cols[metric])))
            order = sorted(range(len(t)), key=t.__getitem__)      # (an L3 run's replicas interleave their rows)
            t, y = [t[i] for i in order], [cols[metric][i] for i in order]
            ax.plot(t, y, color=st["color"], linestyle=st["linestyle"], marker=st["marker"],
                    markevery=max(1, len(t) // 12), ms=3, lw=0.9, label=f"{lab} ({r.system})")
        ax.set_xlabel("iteration start (s)" if all("start_s" in r.iterations() for r in runs) else "iteration")
        ax.set_ylabel(metric)
    else:
        hint = ", ".join(summ[:40]) + (" ..." if len(summ) > 40 else "")
        raise ValueError(f"metric {metric!r} is neither a summary.json value nor an iterations.csv column of every "
                         f"run; summary metrics: {hint}; iterations.csv columns: {', '.join(its) or 'none'}")
    ax.set_title(metric, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)     # outside the data
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out
