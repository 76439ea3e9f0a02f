"""The run directory: config.json, requests.csv, iterations.csv, summary.json, trace.json.

* config.json: the engine config, the system's config, and whatever the caller adds (model, workload with its
  generator parameters and seed, command line): enough to rerun the run;
* requests.csv: one row per request (input columns, admission / first-token / finish times, TTFT, TPOT,
  end-to-end, queueing delay, preemptions, optional fields);
* iterations.csv: one row per iteration (start, duration, batch composition, KV tokens, the system's breakdown
  and record columns; ``fused`` is the length of the fused decode stretch the row belongs to); optional
  (:data:`ITERATIONS`): ``all`` (every row), ``stretch`` (one row per stretch of consecutive iterations of the same
  batch composition: :func:`stretch_rows`) or ``none`` (no file);
* summary.json: the common metrics plus the system's keys;
* trace.json: the Chrome trace (host.serving.trace).
"""

import json
import math
from pathlib import Path

import numpy as np

__all__ = ["write_run_dir", "write_csv", "json_default", "stretch_rows", "ITERATIONS", "iterations_mode"]

#: What iterations.csv holds: every iteration, one row per stretch, or no file; ``auto`` is ``all`` up to
#: :data:`AUTO_ALL_MAX` iterations, else ``stretch`` (a long trace's per-iteration file runs to hundreds of MB).
ITERATIONS = ("auto", "all", "stretch", "none")
AUTO_ALL_MAX = 20_000
#: the columns that define a stretch: consecutive iterations with equal values of these (those present) are one
STRETCH_KEYS = ("n_requests", "n_prefill", "n_decode", "prefill_tokens", "replica", "n_E1", "n_E2", "n_E3", "n_E4")


def json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict
        return asdict(o)
    return str(o)


def _clean(obj):
    """NaN / inf -> None so the JSON is strict."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(path, obj) -> Path:
    path = Path(path)
    path.write_text(json.dumps(_clean(json.loads(json.dumps(obj, default=json_default))), indent=2,
                               sort_keys=False, allow_nan=False) + "\n")
    return path


def write_csv(path, columns: dict) -> Path:
    """Write equal-length columns (name -> array) as CSV (pandas, full float precision)."""
    import pandas as pd
    path = Path(path)
    pd.DataFrame({k: np.asarray(v) for k, v in columns.items()}).to_csv(path, index=False)
    return path


def iterations_mode(mode: str, n_rows: int) -> str:
    """The mode ``auto`` resolves to for a run of ``n_rows`` iterations (the others are themselves)."""
    if mode not in ITERATIONS:
        raise ValueError(f"iterations must be one of {ITERATIONS}, got {mode!r}")
    if mode == "auto":
        return "all" if n_rows <= AUTO_ALL_MAX else "stretch"
    return mode


def stretch_rows(columns: dict) -> dict:
    """iterations.csv per stretch: consecutive rows with equal :data:`STRETCH_KEYS` (those present) become one row
    with ``start_s`` of the first, ``duration_s`` the stretch's sum, ``iterations`` its length, every other column
    its mean over the stretch (the composition columns are equal within it)."""
    n = len(next(iter(columns.values()), []))
    if n == 0:
        return {**{k: [] for k in columns}, "iterations": []}
    keys = [k for k in STRETCH_KEYS if k in columns]
    cols = {k: np.asarray(v) for k, v in columns.items()}
    sig = np.stack([cols[k].astype(float) for k in keys], axis=1) if keys else np.zeros((n, 1))
    brk = np.ones(n, bool)
    brk[1:] = np.any(sig[1:] != sig[:-1], axis=1)
    starts = np.flatnonzero(brk)
    lens = np.diff(np.append(starts, n))
    out = {}
    for k, v in cols.items():
        if k == "start_s":
            out[k] = v[starts]
        elif k == "duration_s":
            out[k] = np.add.reduceat(v.astype(float), starts)
        elif np.issubdtype(v.dtype, np.number):
            out[k] = np.add.reduceat(v.astype(float), starts) / lens
        else:
            out[k] = v[starts]
    out["iterations"] = lens
    return out


def write_run_dir(out, out_dir, extra_config: dict | None = None, *, iterations: str = "all") -> Path:
    """Write the run directory of ``out`` (a host.serving.engine.RunOutput); ``iterations``: what iterations.csv
    holds (:data:`ITERATIONS`; config.json records the mode it resolved to)."""
    from host.serving.trace import write_chrome_trace
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    n_rows = len(next(iter(out.iterations.values()), []))
    mode = iterations_mode(iterations, n_rows)
    config = {**(extra_config or {}), **out.config, "iterations_csv": mode}
    write_json(d / "config.json", config)
    write_csv(d / "requests.csv", out.requests_columns())
    if mode == "all":
        write_csv(d / "iterations.csv", out.iterations)
    elif mode == "stretch":
        write_csv(d / "iterations.csv", stretch_rows(out.iterations))
    elif (d / "iterations.csv").exists():
        (d / "iterations.csv").unlink()                 # (a --force rerun: no stale file beside the new run)
    write_json(d / "summary.json", out.summary)
    write_chrome_trace(d / "trace.json", out.spans, process_name=out.system_name,
                       metadata={"dropped_events": out.dropped_spans})
    return d
