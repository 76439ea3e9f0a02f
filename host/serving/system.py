"""Systems: what the engine asks at each iteration, and the default pieces a system is built from.

A *system* (PLoRA, L3, a baseline) answers three questions; the engine asks nothing else:

(a) **memory**: :meth:`System.can_admit` (does this waiting request's KV / adapters fit now?),
    :meth:`System.on_admit`, :meth:`System.on_finish`, :meth:`System.on_preempt` and
    :meth:`System.before_batch` (grow allocations, evict, or preempt before the next batch is formed);
(b) **the batch**: :meth:`System.form_batch` (default: the :class:`ContinuousBatcher` in ``self.batcher``,
    FCFS continuous batching, optional chunked prefill; override for two sub-batches or per-adapter batches);
(c) **the price**: :meth:`System.price` returns an :class:`~host.serving.batch.IterationResult`, and optionally
    :meth:`System.price_decode_run` prices a stretch of identical decode iterations at once (the engine's fast
    path; return ``None`` to decline).

Plus :meth:`System.on_iteration_end` (update state after an iteration), :meth:`System.config` (goes into
config.json) and :meth:`System.summary` (extra keys for summary.json).

:class:`KVBudget` is the default memory accountant: a byte capacity and per-request KV bytes, either reserving
each request's final KV at admission (``policy="reserve"``: no preemption ever) or growing it block by block
(``policy="paged"``, vLLM-style; when the next tokens do not fit, the most recently admitted request is
preempted and later recomputed).
"""

from collections import deque
from dataclasses import dataclass

import numpy as np

from host.serving.batch import Batch, IterationResult, RunResult, Span
from host.serving.request import RequestTable, WAITING, RUNNING

__all__ = ["System", "SchedulerView", "ContinuousBatcher", "KVBudget", "LinearCostSystem"]

_NO_LIMIT = int(np.iinfo(np.int64).max)


class SchedulerView:
    """The engine's queues as a batcher sees them (engine-owned; a batcher mutates them only through
    :meth:`admit` and :meth:`preempt`).

    ``waiting``: request indices in queue order (FCFS by arrival; preempted requests go back to the head).
    ``running``: admitted request indices in admission order (numpy array; includes requests whose prefill is
    only partly done). ``table``: the :class:`RequestTable`. ``now``: the current time in seconds.
    """

    def __init__(self, table: RequestTable, system: "System"):
        self.table = table
        self.system = system
        self.waiting: deque = deque()
        self._running_arr = np.zeros(0, np.int64)
        self._pending: list = []  # admitted since the array was last built
        self.now = 0.0

    @property
    def running(self) -> np.ndarray:
        if self._pending:
            self._running_arr = np.concatenate([self._running_arr, np.asarray(self._pending, dtype=np.int64)])
            self._pending = []
        return self._running_arr

    @property
    def n_running(self) -> int:
        return len(self._running_arr) + len(self._pending)

    def admit(self, idx: int) -> None:
        """Move waiting request ``idx`` to running (records its first admission time, calls
        ``system.on_admit``). The batcher calls it after ``system.can_admit(idx, now)`` said yes."""
        t = self.table
        if t.state[idx] != WAITING:
            raise ValueError(f"admit: request {t.id[idx]} is not waiting (state {t.state[idx]})")
        self.waiting.remove(idx) if self.waiting[0] != idx else self.waiting.popleft()
        t.state[idx] = RUNNING
        if np.isnan(t.admitted_s[idx]):
            t.admitted_s[idx] = self.now
        self._pending.append(int(idx))
        self.system.on_admit(np.array([idx], np.int64), self.now)

    def preempt(self, idx: int) -> None:
        """Move running request ``idx`` back to the head of the waiting queue; its KV is dropped and will be
        recomputed (its prefill becomes prompt + generated tokens). Calls ``system.on_preempt``."""
        t = self.table
        if t.state[idx] != RUNNING:
            raise ValueError(f"preempt: request {t.id[idx]} is not running")
        run = self.running
        self._running_arr = run[run != idx]
        t.state[idx] = WAITING
        t.prefill_len[idx] = t.prompt_tokens[idx] + t.generated[idx]
        t.prefilled[idx] = 0
        t.preemptions[idx] += 1
        self.waiting.appendleft(int(idx))
        self.system.on_preempt(np.array([idx], np.int64), self.now)

    def _remove_finished(self, idx: np.ndarray) -> None:
        """Drop requests the engine marked FINISHED."""
        if len(idx):
            run = self.running
            self._running_arr = run[self.table.state[run] == RUNNING]


@dataclass(frozen=True, kw_only=True)
class ContinuousBatcher:
    """FCFS continuous (iteration-level) batching.

    Every running decode request gets one token per iteration; waiting requests are admitted in queue order
    while ``system.can_admit`` says yes, ``max_requests`` (admitted at once) and the per-iteration token budget
    ``max_tokens`` allow; the first refusal stops admission (no overtaking) unless ``skip_blocked``.

    ``policy="mixed"`` (Orca / Sarathi style): decodes and prefills share an iteration. ``policy="prefill-first"``
    (vLLM v0 style): an iteration with any prefill runs only prefills. ``chunk_prefill=True`` (Sarathi): prompts
    are split so an iteration never exceeds ``max_tokens``; without it a prompt is taken whole, and a prompt
    longer than ``max_tokens`` runs alone.
    """

    max_requests: int | None = None
    max_tokens: int | None = None
    policy: str = "mixed"
    chunk_prefill: bool = False
    skip_blocked: bool = False

    def __post_init__(self):
        if self.policy not in ("mixed", "prefill-first"):
            raise ValueError(f"ContinuousBatcher.policy must be 'mixed' or 'prefill-first', got {self.policy!r}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"ContinuousBatcher.max_requests must be >= 1, got {self.max_requests}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"ContinuousBatcher.max_tokens must be >= 1, got {self.max_tokens}")
        if self.chunk_prefill and self.max_tokens is None:
            raise ValueError("ContinuousBatcher: chunk_prefill needs a max_tokens budget")

    def form(self, view: SchedulerView, system: "System") -> Batch | None:
        table, now = view.table, view.now
        running = view.running
        in_pre = table.in_prefill(running)
        decodes = running[~in_pre]
        budget = self.max_tokens if self.max_tokens is not None else _NO_LIMIT
        if self.policy == "mixed":
            decodes = decodes[:budget]
            budget -= len(decodes)
        pre_idx, pre_chunks = [], []
        for i in running[in_pre].tolist():
            left = int(table.prefill_len[i] - table.prefilled[i])
            take = self._take(left, budget, bool(pre_idx) or (self.policy == "mixed" and len(decodes) > 0))
            if take == 0:
                break
            pre_idx.append(i), pre_chunks.append(take)
            budget -= take
        n_admitted = len(running)
        while view.waiting and budget > 0:
            if self.max_requests is not None and n_admitted >= self.max_requests:
                break
            admitted_one = False
            for i in list(view.waiting):
                left = int(table.prefill_len[i] - table.prefilled[i])
                take = self._take(left, budget, bool(pre_idx) or (self.policy == "mixed" and len(decodes) > 0))
                if take and system.can_admit(i, now):
                    view.admit(i)
                    pre_idx.append(i), pre_chunks.append(take)
                    budget -= take
                    n_admitted += 1
                    admitted_one = True
                    break
                if not self.skip_blocked:
                    break
            if not admitted_one:
                break
        if pre_idx and self.policy == "prefill-first":
            return Batch.of(table, [], pre_idx, pre_chunks)
        if not pre_idx and not len(decodes):
            return None
        return Batch.of(table, decodes, pre_idx, pre_chunks or None, check=False)

    def _take(self, left: int, budget: int, batch_nonempty: bool) -> int:
        """Tokens of a prefill with ``left`` tokens to take under ``budget`` (0: not this iteration)."""
        if left <= budget:
            return left
        if self.chunk_prefill:
            return budget
        return 0 if batch_nonempty or self.max_tokens is None or budget < self.max_tokens else left


class System:
    """Base class of every serving system (subclass it; override what differs).

    Defaults: unlimited memory, the FCFS :class:`ContinuousBatcher` in ``self.batcher``, no fused decode runs.
    :meth:`price` must be overridden. The engine calls :meth:`bind` once before the first iteration.
    """

    name = "system"

    def __init__(self, batcher: ContinuousBatcher | None = None):
        self.batcher = batcher if batcher is not None else ContinuousBatcher()
        self.table: RequestTable | None = None

    def bind(self, table: RequestTable) -> None:
        """Called once per run, before the first iteration: keep the table, reset per-run state."""
        self.table = table

    # (a) memory -------------------------------------------------------------------------------------------
    def can_admit(self, idx: int, now: float) -> bool:
        """Can waiting request ``idx`` be admitted now (its KV, adapters, ... fit)?"""
        return True

    def admission_error(self, idx: int) -> str | None:
        """Why request ``idx`` can never be admitted even with everything else freed (None: it can). The
        engine raises with this text instead of waiting forever."""
        return None

    def on_admit(self, idx: np.ndarray, now: float) -> None:
        """Requests ``idx`` were admitted (allocate their memory)."""

    def on_finish(self, idx: np.ndarray, now: float) -> None:
        """Requests ``idx`` finished (free their memory)."""

    def on_preempt(self, idx: np.ndarray, now: float) -> None:
        """Requests ``idx`` were preempted (free their KV)."""

    def before_batch(self, view: SchedulerView, now: float) -> None:
        """Hook before each batch is formed: grow allocations, evict, or ``view.preempt`` requests."""

    # (b) the batch ----------------------------------------------------------------------------------------
    def form_batch(self, view: SchedulerView, now: float) -> Batch | None:
        """The next iteration's batch (None: nothing to run now). Default: ``self.batcher.form``."""
        return self.batcher.form(view, self)

    # (c) the price ----------------------------------------------------------------------------------------
    def price(self, batch: Batch, now: float) -> IterationResult:
        """Duration, breakdown and trace spans of one iteration of ``batch`` starting at ``now``."""
        raise NotImplementedError(f"{type(self).__name__}.price")

    def price_decode_run(self, batch: Batch, max_iters: int, now: float) -> RunResult | None:
        """Optionally price up to ``max_iters`` consecutive iterations of the decode-only ``batch`` (iteration
        ``i`` sees every context grown by ``i``). Return fewer (>= 1) if something changes earlier (memory
        runs out), or None to make the engine price iterations one by one. The engine asks only when nothing
        else can change the batch before the first request finishes or the next request arrives."""
        return None

    def on_iteration_end(self, batch: Batch, result: IterationResult | RunResult, now: float) -> None:
        """After an iteration (or a fused run) ending at ``now``."""

    # outputs ----------------------------------------------------------------------------------------------
    def config(self) -> dict:
        """This system's parameters for config.json (JSON-serializable)."""
        return {"name": self.name, "batcher": vars(self.batcher).copy() if self.batcher else None}

    def summary(self) -> dict:
        """Extra summary.json keys (e.g. ``kv_dup_fraction``, ``gpu_bubble_frac``)."""
        return {}


class KVBudget:
    """Byte budget for KV cache (and whatever else a system charges per request).

    ``bytes_per_token``: KV bytes per token of one request (all layers, this replica). ``policy="reserve"``:
    a request is admitted only if its final KV (prompt + output - 1 tokens, in blocks of ``block_tokens``) fits
    and holds it until it finishes. ``policy="paged"``: admission needs its prefill plus one block; decode
    grows it block by block (:meth:`grow`), preempting the most recently admitted when full.
    ``fixed_bytes`` are taken off the capacity up front (e.g. weights).
    """

    def __init__(self, table: RequestTable, *, capacity_bytes: float, bytes_per_token: float,
                 policy: str = "reserve", block_tokens: int = 16, fixed_bytes: float = 0.0):
        if policy not in ("reserve", "paged"):
            raise ValueError(f"KVBudget.policy must be 'reserve' or 'paged', got {policy!r}")
        if bytes_per_token <= 0:
            raise ValueError(f"KVBudget.bytes_per_token must be > 0, got {bytes_per_token}")
        if block_tokens < 1:
            raise ValueError(f"KVBudget.block_tokens must be >= 1, got {block_tokens}")
        if capacity_bytes - fixed_bytes <= 0:
            raise ValueError(f"KVBudget: capacity {capacity_bytes:.3g} B leaves nothing after fixed "
                             f"{fixed_bytes:.3g} B")
        self.table = table
        self.capacity_bytes = float(capacity_bytes) - float(fixed_bytes)
        self.bytes_per_token = float(bytes_per_token)
        self.policy = policy
        self.block_tokens = int(block_tokens)
        self.held_tokens = np.zeros(table.n, np.int64)  # tokens allocated per request (block-rounded)
        self.used_tokens = 0
        self.peak_tokens = 0
        self.capacity_tokens = int(self.capacity_bytes // self.bytes_per_token)

    def _round(self, tokens):
        b = self.block_tokens
        return -(-np.asarray(tokens, dtype=np.int64) // b) * b

    def need_tokens(self, idx) -> np.ndarray:
        """Tokens request(s) ``idx`` need allocated to be admitted."""
        t = self.table
        if self.policy == "reserve":
            return self._round(t.prefill_len[idx] + t.output_tokens[idx] - t.generated[idx] - 1)
        return self._round(t.prefill_len[idx] + 1)

    @property
    def used_bytes(self) -> float:
        return self.used_tokens * self.bytes_per_token

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.used_tokens

    def can_admit(self, idx: int) -> bool:
        return int(self.need_tokens(idx)) <= self.free_tokens

    def admission_error(self, idx: int) -> str | None:
        need = int(self.need_tokens(idx))
        if need > self.capacity_tokens:
            return (f"needs {need} KV tokens ({need * self.bytes_per_token / 1e9:.3f} GB) but the budget holds "
                    f"{self.capacity_tokens} ({self.capacity_bytes / 1e9:.3f} GB)")
        return None

    def admit(self, idx) -> None:
        need = self.need_tokens(idx)
        self.held_tokens[idx] = need
        self.used_tokens += int(np.sum(need))
        self.peak_tokens = max(self.peak_tokens, self.used_tokens)

    def release(self, idx) -> None:
        self.used_tokens -= int(self.held_tokens[idx].sum())
        self.held_tokens[idx] = 0

    def headroom_iters(self, idx) -> int:
        """Paged: how many more decode iterations requests ``idx`` can all run before one needs a block that
        does not fit (reserve: unbounded)."""
        if self.policy == "reserve" or len(idx) == 0:
            return _NO_LIMIT
        t = self.table
        kv_next = t.context(idx) + 1
        slack = self.held_tokens[idx] - kv_next  # tokens each can still add without a new block
        # after j more iterations request r needs ceil(max(0, j - slack_r) / b) new blocks; the free pool must
        # hold their sum. Search j by doubling then bisection over this monotone condition.
        def fits(j):
            extra = np.maximum(0, j - slack)
            return int(self._round(extra).sum()) <= self.free_tokens
        hi = 1
        while fits(hi) and hi < 1 << 40:
            hi *= 2
        lo = hi // 2 if hi > 1 else 0
        if not fits(lo):
            return 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def grow(self, view: SchedulerView) -> None:
        """Paged: make room for the next token of every running request whose prefill is done, preempting the
        most recently admitted requests when the pool is short."""
        if self.policy != "paged":
            return
        t = self.table
        while True:
            run = view.running
            if not len(run):
                return
            dec = run[~t.in_prefill(run)]
            need = np.maximum(0, t.context(dec) + 1 - self.held_tokens[dec])
            extra = self._round(need)
            if int(extra.sum()) <= self.free_tokens:
                self.held_tokens[dec] += extra
                self.used_tokens += int(extra.sum())
                self.peak_tokens = max(self.peak_tokens, self.used_tokens)
                return
            view.preempt(int(run[-1]))


class LinearCostSystem(System):
    """The trivial example system: an iteration costs
    ``base_s + per_token_s * tokens + per_kv_token_s * (sum of KV tokens attended)``, with an optional
    :class:`KVBudget` (``kv_capacity_tokens`` tokens of 1 byte each). Used by tests and as a template; it prices
    fused decode runs in closed form. Lanes: ``"GPU 0"``.
    """

    name = "linear"

    def __init__(self, *, base_s=1e-3, per_token_s=1e-5, per_kv_token_s=1e-8, kv_capacity_tokens=None,
                 kv_policy="reserve", block_tokens=1, batcher=None, fuse=True):
        super().__init__(batcher)
        self.base_s, self.per_token_s, self.per_kv_token_s = base_s, per_token_s, per_kv_token_s
        self.kv_capacity_tokens, self.kv_policy, self.block_tokens = kv_capacity_tokens, kv_policy, block_tokens
        self.fuse = fuse
        self.kv = None

    def bind(self, table):
        super().bind(table)
        self.kv = None if self.kv_capacity_tokens is None else KVBudget(
            table, capacity_bytes=self.kv_capacity_tokens, bytes_per_token=1.0, policy=self.kv_policy,
            block_tokens=self.block_tokens)

    def can_admit(self, idx, now):
        return self.kv is None or self.kv.can_admit(idx)

    def admission_error(self, idx):
        return None if self.kv is None else self.kv.admission_error(idx)

    def on_admit(self, idx, now):
        if self.kv is not None:
            self.kv.admit(idx)

    def on_finish(self, idx, now):
        if self.kv is not None:
            self.kv.release(idx)

    on_preempt = on_finish

    def before_batch(self, view, now):
        if self.kv is not None:
            self.kv.grow(view)

    def _cost(self, tokens, kv):
        return self.base_s + self.per_token_s * tokens + self.per_kv_token_s * kv

    def price(self, batch, now):
        kv = int(batch.kv_after.sum())
        d = self._cost(batch.num_tokens, kv)
        return IterationResult(d, breakdown={"compute_s": d},
                               spans=[Span("GPU 0", "prefill+decode" if not batch.is_decode_only else "decode",
                                           0.0, d)])

    def price_decode_run(self, batch, max_iters, now):
        if not self.fuse:
            return None
        k = max_iters
        if self.kv is not None:
            k = min(k, self.kv.headroom_iters(batch.req) + 1)
        i = np.arange(k)
        d = self._cost(batch.num_tokens, batch.kv_after.sum() + i * len(batch))
        return RunResult(d, breakdown={"compute_s": d}, spans=[Span("GPU 0", f"decode x{k}", 0.0, float(d.sum()))])

    def config(self):
        return {**super().config(), "base_s": self.base_s, "per_token_s": self.per_token_s,
                "per_kv_token_s": self.per_kv_token_s, "kv_capacity_tokens": self.kv_capacity_tokens,
                "kv_policy": self.kv_policy}

    def summary(self):
        return {} if self.kv is None else {"kv_peak_tokens": self.kv.peak_tokens}
