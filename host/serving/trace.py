"""Chrome trace (JSON Trace Event Format, viewable in Perfetto / chrome://tracing) from a run's spans.

One process (the system), one thread per lane in order of first appearance, except that the engine's own
``batch`` lane comes first; every span is a complete event (``"ph": "X"``) with microsecond ``ts`` / ``dur``.
"""

import json
from pathlib import Path

__all__ = ["trace_events", "write_chrome_trace"]


def trace_events(spans, process_name: str = "ndpim") -> list:
    """Trace events for ``spans``: a list of ``(absolute start s, Span)`` pairs."""
    lanes = {"batch": 0}
    for _, s in spans:
        if s.lane not in lanes:
            lanes[s.lane] = len(lanes)
    events = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": process_name}}]
    for lane, tid in lanes.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": lane}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid, "args": {"sort_index": tid}})
    for t0, s in spans:
        ev = {"name": s.name, "ph": "X", "pid": 1, "tid": lanes[s.lane], "ts": round((t0 + s.start_s) * 1e6, 4),
              "dur": round(s.dur_s * 1e6, 4)}
        if s.args:
            ev["args"] = s.args
        events.append(ev)
    return events


def write_chrome_trace(path, spans, process_name: str = "ndpim", metadata: dict | None = None) -> Path:
    path = Path(path)
    doc = {"traceEvents": trace_events(spans, process_name), "displayTimeUnit": "ms",
           "otherData": dict(metadata or {})}
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path
