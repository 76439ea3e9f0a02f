"""The serving engine: an event-driven loop of iterations over a request table and a pluggable system.

The clock jumps from event to event: the end of an iteration (or of a fused stretch of decode iterations) and
the next arrival when the engine is idle. There is no per-cycle or per-microsecond loop and no per-token
Python loop: each iteration updates its batch's request columns with numpy.

Per iteration the engine:

1. moves every request that has arrived by ``now`` into the waiting queue (FCFS by arrival time, ties by order);
2. calls ``system.before_batch(view, now)`` (memory growth, eviction, preemption), then
   ``system.form_batch(view, now)``;
3. if the batch is decode-only and more than one identical iteration could follow, offers the stretch to
   ``system.price_decode_run`` (up to the first request's last token); a stretch is cut after the iteration
   during which the next request arrives; otherwise ``system.price(batch, now)``;
4. applies the tokens (prefill progress, emitted tokens, first-token / finish times, token gaps), logs the
   iteration, calls ``system.on_iteration_end`` then ``system.on_finish`` for finished requests.

A run is deterministic: the same requests, system and config give the same result.
"""

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from host.serving.batch import Batch, IterationResult, RunResult, Span
from host.serving.metrics import TokenGaps, request_metrics, summarize
from host.serving.request import Request, RequestTable, WAITING, RUNNING, FINISHED
from host.serving.system import SchedulerView, System

__all__ = ["EngineConfig", "Engine", "RunOutput", "run", "as_table"]

_FIXED = ("start_s", "duration_s", "n_requests", "n_prefill", "n_decode", "prefill_tokens", "num_tokens",
          "kv_tokens", "fused", "finished", "waiting", "running")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Engine options.

    ``fuse_decode``: offer stretches of identical decode iterations to ``System.price_decode_run``.
    ``max_time_s``: stop after the iteration that crosses this time (unfinished requests stay unfinished).
    ``concurrency``: closed loop with that many clients: the first ``concurrency`` requests (in arrival order)
    arrive at the first arrival time, and each finished request releases the next one at its finish time (zero
    think time; the requests' own arrival times are otherwise ignored and overwritten in the output).
    ``record_iterations``: keep per-iteration rows. ``trace``: keep spans for the Chrome trace, at most
    ``trace_max_events`` of them (later ones are counted, not kept). ``progress``: a tqdm bar of finished
    requests, shown when the run lasts more than 2 s.
    """

    fuse_decode: bool = True
    max_time_s: float = float("inf")
    max_iterations: int = 100_000_000
    record_iterations: bool = True
    trace: bool = True
    trace_max_events: int = 200_000
    progress: bool = False
    concurrency: int | None = None

    def __post_init__(self):
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or int(self.concurrency) < 1):
            raise ValueError(f"EngineConfig.concurrency must be an int >= 1 (or None: open loop), got "
                             f"{self.concurrency!r}")
        if not self.max_time_s > 0:
            raise ValueError(f"EngineConfig.max_time_s must be > 0, got {self.max_time_s}")
        if self.max_iterations < 1:
            raise ValueError(f"EngineConfig.max_iterations must be >= 1, got {self.max_iterations}")
        if self.trace_max_events < 0:
            raise ValueError(f"EngineConfig.trace_max_events must be >= 0, got {self.trace_max_events}")


def as_table(requests) -> RequestTable:
    """A fresh :class:`RequestTable` from a RequestTable, a workload (anything with ``to_table()``) or a
    sequence of :class:`Request`."""
    if isinstance(requests, RequestTable):
        t = RequestTable(id=requests.id, arrival_s=requests.arrival_s, prompt_tokens=requests.prompt_tokens,
                         output_tokens=requests.output_tokens, adapter_id=requests.adapter_id,
                         extra=requests.extra)
        return t
    if hasattr(requests, "to_table"):
        return requests.to_table()
    return RequestTable.from_requests(list(requests))


class _IterationLog:
    """Columnar per-iteration rows, kept as chunks (a scalar per single iteration, arrays for fused stretches)
    and assembled once at the end."""

    def __init__(self):
        self.chunks = []   # (k, fixed tuple, extra dict)
        self.rows = 0

    def append(self, k, fixed: tuple, extra: dict):
        self.chunks.append((k, fixed, extra))
        self.rows += k

    def columns(self) -> dict:
        n = self.rows
        out = {}
        for j, name in enumerate(_FIXED):
            col = np.empty(n, dtype=np.float64 if name in ("start_s", "duration_s") else np.int64)
            r = 0
            for k, fixed, _ in self.chunks:
                col[r:r + k] = fixed[j]
                r += k
            out[name] = col
        names = []
        for _, _, extra in self.chunks:
            for name in extra:
                if name not in names:
                    if name in out:
                        raise ValueError(f"iteration record {name!r} collides with an engine column")
                    names.append(name)
        for name in names:
            col = np.full(n, np.nan)
            r = 0
            for k, _, extra in self.chunks:
                v = extra.get(name)
                if v is not None:
                    col[r:r + k] = v
                r += k
            out[name] = col
        return out


@dataclass
class RunOutput:
    """Everything a run produced. ``summary`` holds the common keys (see host.serving.metrics) plus the
    system's; :meth:`write` writes the run directory."""

    system_name: str
    table: RequestTable
    iterations: dict
    spans: list
    dropped_spans: int
    gaps: TokenGaps
    summary: dict
    config: dict
    wall_s: float

    def requests_columns(self) -> dict:
        t = self.table
        cols = {"id": t.id, "adapter_id": t.adapter_id, "arrival_s": t.arrival_s,
                "prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens, "generated": t.generated,
                "admitted_s": t.admitted_s, "first_token_s": t.first_token_s, "finish_s": t.finish_s,
                "preemptions": t.preemptions}
        cols.update(request_metrics(t))
        cols.update({k: v for k, v in t.extra.items() if k not in cols})
        return cols

    def write(self, out_dir, extra_config: dict | None = None, *, iterations: str = "all") -> Path:
        """Write config.json, requests.csv, iterations.csv (``iterations``: ``all``, ``stretch``, ``none`` or
        ``auto``; host.serving.rundir), summary.json and trace.json into ``out_dir``."""
        from host.serving.rundir import write_run_dir
        return write_run_dir(self, out_dir, extra_config, iterations=iterations)


class Engine:
    """Runs requests through a :class:`~host.serving.system.System`; see the module docstring."""

    def __init__(self, system: System, config: EngineConfig | None = None):
        self.system = system
        self.config = config if config is not None else EngineConfig()

    def run(self, requests) -> RunOutput:
        wall0 = time.perf_counter()
        cfg, system = self.config, self.system
        table = as_table(requests)
        n = table.n
        system.bind(table)
        view = SchedulerView(table, system)
        order = np.argsort(table.arrival_s, kind="stable")
        closed = None
        if cfg.concurrency is not None and n:
            # closed loop: the first clients' requests arrive together, the rest are released by finishes
            from collections import deque
            t_first = float(table.arrival_s[order[0]])
            table.arrival_s = table.arrival_s.copy()          # the caller's arrays are not touched
            closed = deque(order[cfg.concurrency:].tolist())
            order = order[:cfg.concurrency]
            table.arrival_s[order] = t_first
            table.arrival_s[np.asarray(closed, dtype=np.int64)] = np.inf
        n_sched = len(order)
        arr_sorted = table.arrival_s[order]
        self._table, self._view, self._system = table, view, system
        self._log = _IterationLog() if cfg.record_iterations else None
        self._n_req_per_iter, self._n_tok_per_iter = [], []
        self._spans, self._dropped = [], 0
        self._gaps = TokenGaps()
        self._iter_rep = []
        self._finished = 0
        ptr = 0
        arr_list = arr_sorted.tolist()
        next_arr = arr_list[0] if n_sched else float("inf")
        t = float(arr_sorted[0]) if n_sched else 0.0
        iters = 0
        self._bar = None
        if cfg.progress:
            from tqdm import tqdm
            self._bar = tqdm(total=n, desc=f"{system.name}: requests", delay=2.0, leave=False, dynamic_ncols=True)
        while self._finished < n:
            if t > cfg.max_time_s or iters >= cfg.max_iterations:
                break
            if ptr < n_sched and next_arr <= t:
                j = int(np.searchsorted(arr_sorted, t, side="right"))
                new = order[ptr:j]
                table.state[new] = WAITING
                view.waiting.extend(new.tolist())
                ptr = j
                next_arr = arr_list[ptr] if ptr < n_sched else float("inf")
            view.now = t
            system.before_batch(view, t)
            batch = system.form_batch(view, t)
            if batch is None or len(batch) == 0:
                if len(view.running):
                    raise RuntimeError(f"{system.name}: form_batch returned no batch at t={t:.6f} s while "
                                       f"{len(view.running)} requests are running")
                if ptr < n_sched:
                    t = max(t, next_arr)
                    continue
                head = view.waiting[0]
                why = system.admission_error(head) or "the system admitted nothing and nothing else can change"
                raise RuntimeError(f"{system.name}: request {table.id[head]} (prompt {table.prompt_tokens[head]}, "
                                   f"output {table.output_tokens[head]} tokens) can never be admitted: {why}")
            if (table.state[batch.req] != RUNNING).any():
                raise RuntimeError(f"{system.name}: the batch holds requests that were not admitted")
            next_arrival = next_arr
            done = None
            if cfg.fuse_decode and batch.is_decode_only:
                max_iters = int(table.remaining_output(batch.req).min())
                max_iters = min(max_iters, cfg.max_iterations - iters)
                if max_iters > 1:
                    res = system.price_decode_run(batch, max_iters, t)
                    if res is not None:
                        if len(res.durations_s) > max_iters:
                            raise RuntimeError(f"{system.name}.price_decode_run returned "
                                               f"{len(res.durations_s)} iterations, more than {max_iters}")
                        res = self._cut(res, t, min(next_arrival, cfg.max_time_s))
                        k = len(res.durations_s)
                        done = self._apply_run(batch, res, t)
                        iters += k
                        t = t + float(res.durations_s.sum())
            if done is None:
                res = system.price(batch, t)
                if not isinstance(res, IterationResult):
                    raise TypeError(f"{system.name}.price must return an IterationResult, got {type(res)}")
                done = self._apply_iteration(batch, res, t)
                iters += 1
                t = t + res.duration_s
            if closed and len(done):
                # each finished request's client sends its next request now
                new = [closed.popleft() for _ in range(min(len(done), len(closed)))]
                table.arrival_s[new] = t
                table.state[new] = WAITING
                view.waiting.extend(new)
        if self._bar is not None:
            self._bar.close()
        summary = summarize(table, self._n_req_per_iter, self._n_tok_per_iter, self._gaps, self._iter_rep)
        summary["engine_steps"] = len(self._iter_rep)
        summary["system"] = system.name
        summary["trace_dropped_events"] = self._dropped
        extra = system.summary()
        clash = set(extra) & set(summary)
        if clash:
            raise ValueError(f"{system.name}.summary() redefines engine keys {sorted(clash)}")
        summary.update(extra)
        config = {"engine": asdict(cfg), "system": system.config()}
        return RunOutput(system_name=system.name, table=table,
                         iterations=self._log.columns() if self._log else {}, spans=self._spans,
                         dropped_spans=self._dropped, gaps=self._gaps, summary=summary, config=config,
                         wall_s=time.perf_counter() - wall0)

    # --- helpers -----------------------------------------------------------------------------------------
    @staticmethod
    def _cut(res: RunResult, t0: float, until: float) -> RunResult:
        """Keep the iterations up to and including the one that ends at or after ``until``."""
        ends = t0 + np.cumsum(res.durations_s)
        if until >= ends[-1]:
            return res
        k = int(np.searchsorted(ends, until, side="left")) + 1
        t_cut = float(ends[k - 1] - t0)
        spans = []
        for s in res.spans:
            if s.start_s >= t_cut:
                continue
            spans.append(s if s.start_s + s.dur_s <= t_cut else Span(s.lane, s.name, s.start_s, t_cut - s.start_s,
                                                                      s.args))
        cut = lambda v: v[:k] if isinstance(v, np.ndarray) and v.ndim else v
        return RunResult(res.durations_s[:k], {n: cut(v) for n, v in res.breakdown.items()}, spans,
                         {n: cut(v) for n, v in res.record.items()})

    def _add_spans(self, t0: float, spans, batch: Batch, dur: float, k: int):
        if not self.config.trace:
            return
        room = self.config.trace_max_events - len(self._spans)
        label = ("decode" if batch.is_decode_only else
                 "prefill" if batch.num_decode == 0 else "prefill+decode")
        if k > 1:
            label = f"{label} x{k}"
        own = Span("batch", label, 0.0, dur, {"requests": int(len(batch)), "tokens": int(batch.num_tokens),
                                            "iterations": int(k)})
        items = [own, *spans]
        if room < len(items):
            self._dropped += len(items) - max(room, 0)
            items = items[:max(room, 0)]
        self._spans.extend((t0, s) for s in items)

    def _finish(self, done: np.ndarray, t_end: float):
        if len(done):
            self._table.state[done] = FINISHED
            self._view._remove_finished(done)
            self._finished += len(done)
            if self._bar is not None:
                self._bar.update(len(done))
            self._system.on_finish(done, t_end)

    def _apply_iteration(self, batch: Batch, res: IterationResult, t: float) -> np.ndarray:
        table = self._table
        idx, pre = batch.req, batch.prefill
        dur = float(res.duration_s)
        t_end = t + dur
        if pre.any():
            table.prefilled[idx[pre]] += batch.new_tokens[pre]
        emit_mask = ~pre | batch.completes_prefill
        e = idx[emit_mask]
        if res.emit_offset_s is None:
            emit_t = np.full(len(e), t_end)
        else:
            off = np.asarray(res.emit_offset_s, dtype=np.float64)
            if off.shape != (len(batch),) or np.any(off <= 0) or np.any(off > dur * (1 + 1e-12)):
                raise ValueError(f"{self._system.name}: emit_offset_s must have one value per batch entry in "
                                 f"(0, duration]")
            emit_t = t + off[emit_mask]
        first = table.generated[e] == 0
        table.first_token_s[e[first]] = emit_t[first]
        self._gaps.add(emit_t[~first] - table.last_token_s[e[~first]])
        table.generated[e] += 1
        table.last_token_s[e] = emit_t
        fin = table.generated[e] >= table.output_tokens[e]
        done = e[fin]
        table.finish_s[done] = emit_t[fin]
        view = self._view
        n_pre = int(pre.sum())
        self._n_req_per_iter.append(len(batch))
        self._n_tok_per_iter.append(batch.num_tokens)
        self._iter_rep.append(1)
        if self._log is not None:
            fixed = (t, dur, len(batch), n_pre, len(batch) - n_pre, batch.num_prefill_tokens, batch.num_tokens,
                     int(batch.kv_after.sum()), 1, len(done), len(view.waiting), view.n_running)
            self._log.append(1, fixed, {**res.breakdown, **res.record} if res.record else res.breakdown)
        self._add_spans(t, res.spans, batch, dur, 1)
        self._system.on_iteration_end(batch, res, t_end)
        self._finish(done, t_end)
        return done

    def _apply_run(self, batch: Batch, res: RunResult, t: float) -> np.ndarray:
        table = self._table
        idx = batch.req
        d = res.durations_s
        k = len(d)
        ends = t + np.cumsum(d)
        self._gaps.add(ends[0] - table.last_token_s[idx])
        if k > 1:
            self._gaps.add(d[1:], len(idx))
        table.generated[idx] += k
        table.last_token_s[idx] = ends[-1]
        fin = table.generated[idx] >= table.output_tokens[idx]
        done = idx[fin]
        table.finish_s[done] = ends[-1]
        n = len(batch)
        self._n_req_per_iter.append(n)
        self._n_tok_per_iter.append(n)
        self._iter_rep.append(k)
        if self._log is not None:
            kv0 = int(batch.kv_after.sum())
            fin_col = np.zeros(k, np.int64)
            fin_col[-1] = len(done)
            view = self._view
            fixed = (ends - d, d, n, 0, n, 0, n, kv0 + n * np.arange(k), k, fin_col, len(view.waiting),
                     view.n_running)
            self._log.append(k, fixed, {**res.breakdown, **res.record} if res.record else res.breakdown)
        self._add_spans(t, res.spans, batch, float(d.sum()), k)
        self._system.on_iteration_end(batch, res, float(ends[-1]))
        self._finish(done, float(ends[-1]))
        return done


def run(requests, system: System, config: EngineConfig | None = None) -> RunOutput:
    """Run ``requests`` (Request list, RequestTable or workload) through ``system``; see :class:`Engine`."""
    return Engine(system, config).run(requests)
