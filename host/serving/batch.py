"""The batch of one iteration and what a system answers when it prices it.

A :class:`Batch` is columnar: entry ``j`` is request ``req[j]`` (an index into the run's
:class:`~host.serving.request.RequestTable`) processing ``new_tokens[j]`` tokens over ``context[j]`` tokens
already in its KV cache; ``prefill[j]`` says whether those tokens are (a chunk of) the prompt. Systems read
the columns with numpy, never loop over tokens.

A system prices a batch with an :class:`IterationResult` (one iteration) or, for a stretch of identical decode
iterations, a :class:`RunResult` (see :meth:`host.serving.system.System.price_decode_run`). Both carry a
duration, a breakdown (named component times in seconds; components may overlap, so they need not sum to the
duration), and :class:`Span` s on named lanes for the Chrome trace.
"""

from dataclasses import InitVar, dataclass, field

import numpy as np

__all__ = ["Batch", "Span", "IterationResult", "RunResult"]


@dataclass(eq=False)
class Batch:
    """One iteration's work.

    ``sub_batch`` optionally labels entries (e.g. L3's two interleaved sub-batches, 0 and 1); ``meta`` carries
    whatever the system's batcher wants its pricing to see (e.g. per-adapter strategies). ``completes_prefill``
    marks the prefill entries whose chunk reaches the end of the prompt: they emit the first token.
    """

    req: np.ndarray
    new_tokens: np.ndarray
    context: np.ndarray
    prefill: np.ndarray
    completes_prefill: np.ndarray
    sub_batch: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    validate: InitVar[bool] = True

    def __post_init__(self, validate=True):
        if not validate:  # trusted constructors (Batch.of, select) build consistent int64 / bool columns
            return
        self.req = np.asarray(self.req, dtype=np.int64)
        n = len(self.req)
        self.new_tokens = np.asarray(self.new_tokens, dtype=np.int64)
        self.context = np.asarray(self.context, dtype=np.int64)
        self.prefill = np.asarray(self.prefill, dtype=bool)
        self.completes_prefill = np.asarray(self.completes_prefill, dtype=bool)
        for name in ("new_tokens", "context", "prefill", "completes_prefill"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"Batch.{name} has shape {getattr(self, name).shape}, expected ({n},)")
        if n and self.new_tokens.min() < 1:
            raise ValueError("Batch.new_tokens must be >= 1 for every entry")
        if np.any(~self.prefill & (self.new_tokens != 1)):
            raise ValueError("Batch: a decode entry processes exactly 1 new token")
        if np.any(self.completes_prefill & ~self.prefill):
            raise ValueError("Batch: completes_prefill set on a decode entry")
        if len(np.unique(self.req)) != n:
            raise ValueError("Batch: a request appears twice in one batch")
        if self.sub_batch is not None:
            self.sub_batch = np.asarray(self.sub_batch, dtype=np.int8)
            if self.sub_batch.shape != (n,):
                raise ValueError(f"Batch.sub_batch has shape {self.sub_batch.shape}, expected ({n},)")

    @classmethod
    def of(cls, table, decode_idx=(), prefill_idx=(), prefill_chunks=None, sub_batch=None, meta=None,
           check: bool = True) -> "Batch":
        """Build a batch from decode requests and prefill requests (``prefill_chunks[j]`` tokens of the
        ``j``-th prefill; default its whole remaining prefill), reading contexts from ``table``. ``check=False``
        skips the duplicate-request check for callers whose indices are distinct by construction (the default
        batcher)."""
        d = np.asarray(decode_idx, dtype=np.int64)
        p = np.asarray(prefill_idx, dtype=np.int64)
        nd, npf = len(d), len(p)
        d_pre = table.prefilled[d]
        d_len = table.prefill_len[d]
        if nd and (d_pre < d_len).any():
            raise ValueError("Batch.of: a decode request still has prefill tokens left")
        if npf == 0:
            if sub_batch is not None:
                sub_batch = np.asarray(sub_batch, dtype=np.int8)
            if check and nd > 1 and (np.diff(np.sort(d)) == 0).any():
                raise ValueError("Batch: a request appears twice in one batch")
            if sub_batch is not None and sub_batch.shape != d.shape:
                raise ValueError(f"Batch.sub_batch has shape {sub_batch.shape}, expected ({nd},)")
            return cls(req=d, new_tokens=np.ones(nd, np.int64), context=d_len + table.generated[d] - 1,
                       prefill=np.zeros(nd, bool), completes_prefill=np.zeros(nd, bool), sub_batch=sub_batch,
                       meta=dict(meta or {}), validate=False)
        left = table.prefill_len[p] - table.prefilled[p]
        if (left <= 0).any():
            raise ValueError("Batch.of: a prefill request has no prefill tokens left")
        chunks = left if prefill_chunks is None else np.asarray(prefill_chunks, dtype=np.int64)
        if chunks.shape != p.shape or np.any(chunks < 1) or np.any(chunks > left):
            raise ValueError(f"Batch.of: prefill chunks must be in [1, remaining prefill] ({left}), got {chunks}")
        req = np.concatenate([d, p])
        if len(np.unique(req)) != len(req):
            raise ValueError("Batch: a request appears twice in one batch")
        if sub_batch is not None:
            sub_batch = np.asarray(sub_batch, dtype=np.int8)
            if sub_batch.shape != req.shape:
                raise ValueError(f"Batch.sub_batch has shape {sub_batch.shape}, expected ({len(req)},)")
        return cls(req=req, new_tokens=np.concatenate([np.ones(nd, np.int64), chunks.astype(np.int64)]),
                   context=np.concatenate([d_len + table.generated[d] - 1, table.prefilled[p]]),
                   prefill=np.concatenate([np.zeros(nd, bool), np.ones(npf, bool)]),
                   completes_prefill=np.concatenate([np.zeros(nd, bool), chunks == left]),
                   sub_batch=sub_batch, meta=dict(meta or {}), validate=False)

    def __len__(self):
        return len(self.req)

    @property
    def num_requests(self) -> int:
        return len(self.req)

    @property
    def num_tokens(self) -> int:
        return int(self.new_tokens.sum())

    @property
    def num_prefill_tokens(self) -> int:
        return int(self.new_tokens[self.prefill].sum())

    @property
    def num_decode(self) -> int:
        return int(np.count_nonzero(~self.prefill))

    @property
    def is_decode_only(self) -> bool:
        return not self.prefill.any()

    @property
    def decode_kv_tokens(self) -> int:
        """KV tokens the decode entries attend over, in total (their contexts + 1)."""
        dec = ~self.prefill
        return int(self.context[dec].sum()) + int(dec.sum())

    @property
    def kv_after(self) -> np.ndarray:
        """KV tokens each entry attends over (its context plus its new tokens)."""
        return self.context + self.new_tokens

    def select(self, mask) -> "Batch":
        """The entries where ``mask`` holds (e.g. one sub-batch), same meta."""
        mask = np.asarray(mask, dtype=bool)
        return Batch(req=self.req[mask], new_tokens=self.new_tokens[mask], context=self.context[mask],
                     prefill=self.prefill[mask], completes_prefill=self.completes_prefill[mask],
                     sub_batch=None if self.sub_batch is None else self.sub_batch[mask], meta=self.meta)


@dataclass(frozen=True)
class Span:
    """A busy interval on a named lane of the trace, in seconds relative to the start of the iteration (or
    run) that reports it. Lane names are free text; the convention is ``"GPU 0"``, ``"link"``, ``"device 3"``,
    ``"rankset 1"``, ``"PCIe"``."""

    lane: str
    name: str
    start_s: float
    dur_s: float
    args: dict | None = None


@dataclass
class IterationResult:
    """What one iteration costs.

    ``duration_s``: wall time of the iteration (the clock advances by it). ``breakdown``: named component times
    (seconds; may overlap). ``spans``: trace intervals relative to the iteration start. ``emit_offset_s``:
    optional per batch entry, when its token is emitted relative to the iteration start (default: at the end;
    L3's sub-batch 0 emits before sub-batch 1). ``record``: extra numeric columns for iterations.csv.
    """

    duration_s: float
    breakdown: dict = field(default_factory=dict)
    spans: list = field(default_factory=list)
    emit_offset_s: np.ndarray | None = None
    record: dict = field(default_factory=dict)

    def __post_init__(self):
        if not (np.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"IterationResult.duration_s must be finite and > 0, got {self.duration_s}")


@dataclass
class RunResult:
    """What a stretch of ``k`` consecutive decode iterations of the same batch costs (k = len(durations_s)).

    Iteration ``i`` of the stretch sees every context grown by ``i``. ``breakdown`` and ``record`` map names to
    arrays of length ``k``; ``spans`` are relative to the start of the stretch (a system may give one span per
    lane for the whole stretch, or per iteration).
    """

    durations_s: np.ndarray
    breakdown: dict = field(default_factory=dict)
    spans: list = field(default_factory=list)
    record: dict = field(default_factory=dict)

    def __post_init__(self):
        self.durations_s = np.asarray(self.durations_s, dtype=np.float64)
        if self.durations_s.ndim != 1 or len(self.durations_s) < 1:
            raise ValueError("RunResult.durations_s must be a non-empty 1-D array")
        if not np.isfinite(self.durations_s).all() or self.durations_s.min() <= 0:
            raise ValueError("RunResult.durations_s must be finite and > 0")
