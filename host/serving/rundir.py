"""The run directory: config.json, requests.csv, iterations.csv, summary.json, trace.json.

* config.json: the engine config, the system's config, and whatever the caller adds (model, workload with its
  generator parameters and seed, command line): enough to rerun the run;
* requests.csv: one row per request (input columns, admission / first-token / finish times, TTFT, TPOT,
  end-to-end, queueing delay, preemptions, optional fields);
* iterations.csv: one row per iteration (start, duration, batch composition, KV tokens, the system's breakdown
  and record columns; ``fused`` is the length of the fused decode stretch the row belongs to);
* summary.json: the common metrics plus the system's keys;
* trace.json: the Chrome trace (host.serving.trace).
"""

import json
import math
from pathlib import Path

import numpy as np

__all__ = ["write_run_dir", "write_csv", "json_default"]


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


def write_run_dir(out, out_dir, extra_config: dict | None = None) -> Path:
    """Write the run directory of ``out`` (a host.serving.engine.RunOutput)."""
    from host.serving.trace import write_chrome_trace
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    config = {**(extra_config or {}), **out.config}
    write_json(d / "config.json", config)
    write_csv(d / "requests.csv", out.requests_columns())
    write_csv(d / "iterations.csv", out.iterations)
    write_json(d / "summary.json", out.summary)
    write_chrome_trace(d / "trace.json", out.spans, process_name=out.system_name,
                       metadata={"dropped_events": out.dropped_spans})
    return d
