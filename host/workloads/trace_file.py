"""A user's own request trace, by path: CSV or JSONL with documented columns (docs/inputs.md).

Columns (CSV: a header row naming them, in any order; JSONL: one JSON object per line with these keys):

* ``arrival_s`` (required): arrival time in seconds, a finite number >= 0; rows in non-decreasing order;
* ``prompt_tokens`` (required): prompt length, an integer >= 1;
* ``output_tokens`` (required): tokens to generate, an integer >= 1;
* ``adapter_id`` (optional, PLoRA runs): the request's LoRA adapter, an integer in 0..1,000,000; absent, the
  adapters are assigned with S-LoRA's power-law popularity over 1,000 adapters (seeded), as the built-in real
  traces do;
* ``rank`` (optional, with ``adapter_id``): that adapter's LoRA rank, an integer in 1..1024, the same on every row
  of one adapter; absent, each adapter's rank is drawn from {8, 16, 32, 64, 128} (seeded, PLoRA VII-A).

Other columns are ignored (the workload's notes list them). ``prompt_tokens + output_tokens`` must be at most
the model's context (``max_context``, from ``max_position_embeddings``). Arrivals are kept as given (not shifted,
not stretched) unless a rate is given: then they are shifted to start at 0 and stretched so that the mean rate
``(n - 1) / (last - first)`` is that rate (the gaps keep their proportions, burstiness kept).

Every problem is a :class:`TraceFileError` whose ``kind`` is one of :data:`TRACE_ERRORS` and whose message
starts with it in brackets (``[unsorted] ...``) and names the file, the line (CSV: the header is line 1), the
column and what is allowed.
"""

import csv
import hashlib
import json
import math
from pathlib import Path

import numpy as np

from host.workloads.base import Workload
from host.workloads.synthetic import LORA_RANKS, adapter_ranks, powerlaw_adapters

__all__ = ["TraceFileError", "TRACE_ERRORS", "TRACE_COLUMNS", "REQUIRED_COLUMNS", "load_trace_file", "file_digest",
           "MAX_ADAPTER_ID", "MAX_RANK"]

REQUIRED_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
TRACE_COLUMNS = REQUIRED_COLUMNS + ("adapter_id", "rank")
MAX_ADAPTER_ID = 1_000_000
MAX_RANK = 1024
#: Defaults when the file has no adapter ids (those of host.workloads.traces: S-LoRA's power law).
N_ADAPTERS, ALPHA = 1000, 0.5

#: The named errors (``TraceFileError.kind``).
TRACE_ERRORS = ("unreadable", "unknown-format", "empty", "missing-column", "missing-value", "non-numeric",
                "non-integer", "non-positive", "out-of-range", "beyond-context", "unsorted", "inconsistent-rank",
                "too-few", "cannot-rescale")


class TraceFileError(ValueError):
    """A bad trace file; ``kind`` names the error (:data:`TRACE_ERRORS`)."""

    def __init__(self, kind: str, message: str):
        assert kind in TRACE_ERRORS, kind
        super().__init__(f"[{kind}] {message}")
        self.kind = kind


def file_digest(path) -> str:
    """``sha256:<hex>`` of a file's bytes (what config.json records of a loaded input)."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _rows(path: Path):
    """``(format, [(line, {column: value})], columns)``; values are strings (CSV) or JSON values (JSONL)."""
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8-sig")        # (a spreadsheet's byte-order mark dropped)
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFileError("unreadable", f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    if suffix == ".csv":
        reader = csv.DictReader(text.splitlines())
        columns = [c.strip() for c in (reader.fieldnames or [])]
        if not columns:
            raise TraceFileError("empty", f"{path}: empty file (a header row naming the columns "
                                          f"{list(REQUIRED_COLUMNS)} and one row per request are expected)")
        rows = []
        for raw in reader:
            if None in raw:         # more cells than the header names
                raise TraceFileError("unreadable", f"{path}: line {reader.line_num}: {len(raw[None]) + len(columns)}"
                                                   f" cells, the header names {len(columns)} columns")
            rows.append((reader.line_num, {k.strip(): v for k, v in raw.items()}))
        return "csv", rows, columns
    if suffix in (".jsonl", ".ndjson"):
        rows, columns = [], []
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFileError("unreadable", f"{path}: line {i}: not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceFileError("unreadable", f"{path}: line {i}: expected a JSON object with keys "
                                                   f"{list(REQUIRED_COLUMNS)}, got {type(obj).__name__}")
            for k in obj:
                if k not in columns:
                    columns.append(k)
            rows.append((i, obj))
        return "jsonl", rows, columns
    raise TraceFileError("unknown-format", f"{path}: unknown trace format {path.suffix or '(no suffix)'!r}; "
                                           f"allowed: .csv, .jsonl (docs/inputs.md)")


def _number(path, line, col, v, fmt):
    """A finite float from a cell (named errors for missing / non-numeric)."""
    where = f"{path}: line {line}, column {col}"
    if v is None or (isinstance(v, str) and not v.strip()):
        raise TraceFileError("missing-value", f"{where}: missing value")
    if isinstance(v, bool) or (fmt == "jsonl" and not isinstance(v, (int, float))):
        raise TraceFileError("non-numeric", f"{where}: expected a number, got {v!r}")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise TraceFileError("non-numeric", f"{where}: expected a number, got {v!r}") from None
    if not math.isfinite(x):
        raise TraceFileError("non-numeric", f"{where}: expected a finite number, got {v!r}")
    return x


def _integer(path, line, col, v, fmt, lo, hi, kind_low):
    x = _number(path, line, col, v, fmt)
    where = f"{path}: line {line}, column {col}"
    allowed = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"
    if x != int(x):
        raise TraceFileError("non-integer", f"{where}: non-integer value {v!r}; allowed: {allowed}")
    x = int(x)
    if x < lo:
        raise TraceFileError(kind_low, f"{where}: {x} is {'not positive' if kind_low == 'non-positive' else 'too small'}"
                                       f"; allowed: {allowed}")
    if hi is not None and x > hi:
        raise TraceFileError("out-of-range", f"{where}: {x} is too large; allowed: {allowed}")
    return x


def load_trace_file(path, *, max_context: int | None = None, n_requests: int | None = None,
                    rate_per_s: float | None = None, seed: int = 0, context_source: str = "the model's context") \
        -> Workload:
    """The requests of the trace file ``path`` (module docstring), checked row by row.

    ``max_context``: the longest request (prompt + output tokens) allowed (``None`` or 0: no limit);
    ``context_source`` names it in the message. ``n_requests``: the first ``n`` requests (all when ``None``).
    ``rate_per_s``: rescale the arrivals to this mean rate (module docstring). ``seed``: adapters / ranks the
    file does not give."""
    path = Path(path)
    if not path.is_file():
        raise TraceFileError("unreadable", f"{path}: no such file")
    fmt, rows, columns = _rows(path)
    if not rows:
        raise TraceFileError("empty", f"{path}: no requests" + (" (only a header)" if fmt == "csv" else ""))
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise TraceFileError("missing-column", f"{path}: missing column(s) {missing}; required: "
                                               f"{list(REQUIRED_COLUMNS)}, optional: adapter_id, rank (found "
                                               f"{columns})")
    if "rank" in columns and "adapter_id" not in columns:
        raise TraceFileError("missing-column", f"{path}: column rank needs column adapter_id (a rank per adapter)")
    has_ad, has_rank = "adapter_id" in columns, "rank" in columns
    arr, pin, pout, ad, rk = [], [], [], [], []
    ranks_of = {}
    limit = int(max_context) if max_context else None
    prev = None
    for line, row in rows:
        for c in REQUIRED_COLUMNS + (("adapter_id",) if has_ad else ()) + (("rank",) if has_rank else ()):
            if c not in row:
                raise TraceFileError("missing-column", f"{path}: line {line}: no {c} (required: "
                                                       f"{list(REQUIRED_COLUMNS)})")
        a = _number(path, line, "arrival_s", row["arrival_s"], fmt)
        if a < 0:
            raise TraceFileError("out-of-range", f"{path}: line {line}, column arrival_s: {row['arrival_s']!r} is "
                                                 f"negative; allowed: a finite number >= 0 (seconds)")
        if prev is not None and a < prev[1]:
            raise TraceFileError("unsorted", f"{path}: line {line}, column arrival_s: {a:g} s arrives before "
                                             f"line {prev[0]}'s {prev[1]:g} s; arrivals must be in non-decreasing "
                                             f"order (sort the file by arrival_s)")
        prev = (line, a)
        p = _integer(path, line, "prompt_tokens", row["prompt_tokens"], fmt, 1, None, "non-positive")
        o = _integer(path, line, "output_tokens", row["output_tokens"], fmt, 1, None, "non-positive")
        if limit is not None and p + o > limit:
            raise TraceFileError("beyond-context", f"{path}: line {line}: prompt_tokens + output_tokens = {p} + {o}"
                                                   f" = {p + o} is beyond {context_source}; allowed: <= {limit}")
        arr.append(a), pin.append(p), pout.append(o)
        if has_ad:
            i = _integer(path, line, "adapter_id", row["adapter_id"], fmt, 0, MAX_ADAPTER_ID, "out-of-range")
            ad.append(i)
            if has_rank:
                r = _integer(path, line, "rank", row["rank"], fmt, 1, MAX_RANK, "non-positive")
                if ranks_of.setdefault(i, (line, r))[1] != r:
                    raise TraceFileError("inconsistent-rank", f"{path}: line {line}, column rank: adapter {i} has "
                                                              f"rank {r} here and {ranks_of[i][1]} on line "
                                                              f"{ranks_of[i][0]}; allowed: one rank per adapter")
                rk.append(r)
    n_file = len(arr)
    if n_requests is not None:
        if n_requests > n_file:
            raise TraceFileError("too-few", f"{path}: holds {n_file} requests, asked for {n_requests}; allowed: "
                                            f"--requests <= {n_file}")
        n = n_requests
    else:
        n = n_file
    arr, pin, pout = np.asarray(arr[:n]), np.asarray(pin[:n], np.int64), np.asarray(pout[:n], np.int64)
    digest = file_digest(path)
    params = dict(generator="trace_file", file=str(path), sha256=digest, format=fmt, rows=n_file, n_requests=n,
                  max_context=limit, seed=seed, arrivals="as given" if rate_per_s is None else "rescaled")
    notes = []
    extra_cols = [c for c in columns if c not in TRACE_COLUMNS]
    if extra_cols:
        notes.append(f"{path.name}: columns {extra_cols} ignored")
    if rate_per_s is not None:
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s}")
        dur = float(arr[-1] - arr[0])
        if n < 2 or dur <= 0:
            raise TraceFileError("cannot-rescale", f"{path}: the {n} requests all arrive at {arr[0]:g} s, so their "
                                                   f"arrivals cannot be rescaled to a rate; allowed: no --rate, or "
                                                   f"a trace with at least two distinct arrival times")
        given = (n - 1) / dur
        arr = (arr - arr[0]) * (given / rate_per_s)
        params.update(rate_per_s=rate_per_s, rate_per_s_in_file=given)
        notes.append(f"{path.name}: arrivals rescaled from {given:.4g} to {rate_per_s:.4g} requests/s (shifted to "
                     f"start at 0, gaps stretched by {given / rate_per_s:.4g})")
    rng = np.random.default_rng(seed)
    if has_ad:
        ids = np.asarray(ad[:n], np.int64)
        if has_rank:
            rank = np.asarray(rk[:n], np.int64)
        else:
            table = adapter_ranks(int(ids.max()) + 1, rng)
            rank = table[ids]
            notes.append(f"{path.name}: no rank column; each adapter's LoRA rank drawn from {list(LORA_RANKS)} "
                         f"(seed {seed})")
    else:
        table = adapter_ranks(N_ADAPTERS, rng)
        ids = powerlaw_adapters(n, N_ADAPTERS, rng, ALPHA)
        rank = table[ids]
        notes.append(f"{path.name}: no adapter_id column; adapters assigned with S-LoRA's power-law popularity "
                     f"(alpha {ALPHA}) over {N_ADAPTERS} adapters, ranks from {list(LORA_RANKS)} (seed {seed})")
    return Workload(path.stem, arr, pin, pout, ids, extra={"rank": rank}, params=params, notes=notes)
