"""Requests: the immutable input record and the engine's columnar request table.

A :class:`Request` is what a workload generator or a test writes: id, arrival time, prompt and output lengths,
adapter id and optional named fields (e.g. an adapter rank). The engine turns a list of them (or a
:class:`host.workloads.Workload`) into a :class:`RequestTable`: one numpy column per attribute, indexed by the
request's position (``idx``), so every per-iteration update is one vectorized operation over a batch's indices.

Token accounting (the convention every system follows):

* a request's *prefill* processes ``prefill_len`` tokens (its prompt; after a recompute preemption, its prompt
  plus the tokens it had generated), possibly in chunks over several iterations;
* the iteration that completes the prefill emits the first output token (``generated`` becomes 1);
* each decode iteration feeds the last generated token and emits one more;
* ``context`` (tokens already in the KV cache before an iteration) is ``prefilled`` during the prefill and
  ``prefill_len + generated - 1`` during decode, so the KV after the iteration holds ``context + new_tokens``;
* a request finishes when ``generated == output_tokens``.
"""

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

__all__ = ["Request", "RequestTable", "PENDING", "WAITING", "RUNNING", "FINISHED"]

# Request states (RequestTable.state).
PENDING, WAITING, RUNNING, FINISHED = -1, 0, 1, 2


@dataclass(frozen=True)
class Request:
    """One request as a workload states it.

    ``fields`` carries optional per-request values (numbers) that a system may read, e.g. ``{"rank": 16}``; all
    requests of one run must name the same fields.
    """

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    adapter_id: int = 0
    fields: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if not self.arrival_s >= 0:
            raise ValueError(f"request {self.id}: arrival_s must be >= 0, got {self.arrival_s}")
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.id}: output_tokens must be >= 1, got {self.output_tokens}")


class RequestTable:
    """Columnar state of every request of a run (numpy arrays of length ``n``, indexed by ``idx``).

    Input columns: ``id``, ``arrival_s``, ``prompt_tokens``, ``output_tokens``, ``adapter_id`` and
    ``extra[name]`` for each optional field. State columns (the engine writes them; systems read them):
    ``state`` (PENDING / WAITING / RUNNING / FINISHED), ``prefill_len``, ``prefilled``, ``generated``,
    ``admitted_s`` (first admission), ``first_token_s``, ``last_token_s``, ``finish_s`` (NaN until set) and
    ``preemptions``.
    """

    def __init__(self, *, id, arrival_s, prompt_tokens, output_tokens, adapter_id=None, extra=None):
        self.id = np.asarray(id, dtype=np.int64)
        n = self.n = len(self.id)
        self.arrival_s = np.asarray(arrival_s, dtype=np.float64)
        self.prompt_tokens = np.asarray(prompt_tokens, dtype=np.int64)
        self.output_tokens = np.asarray(output_tokens, dtype=np.int64)
        self.adapter_id = (np.zeros(n, np.int64) if adapter_id is None
                           else np.asarray(adapter_id, dtype=np.int64))
        self.extra = {k: np.asarray(v) for k, v in (extra or {}).items()}
        for name in ("arrival_s", "prompt_tokens", "output_tokens", "adapter_id"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"RequestTable: column {name} has shape {getattr(self, name).shape}, "
                                 f"expected ({n},)")
        for k, v in self.extra.items():
            if v.shape != (n,):
                raise ValueError(f"RequestTable: extra column {k!r} has shape {v.shape}, expected ({n},)")
        if n:
            if not np.all(np.isfinite(self.arrival_s)) or self.arrival_s.min() < 0:
                raise ValueError("RequestTable: arrival_s must be finite and >= 0")
            if self.prompt_tokens.min() < 1:
                raise ValueError(f"RequestTable: prompt_tokens must be >= 1 (min is {self.prompt_tokens.min()})")
            if self.output_tokens.min() < 1:
                raise ValueError(f"RequestTable: output_tokens must be >= 1 (min is {self.output_tokens.min()})")
            if len(np.unique(self.id)) != n:
                raise ValueError("RequestTable: request ids must be unique")
        self.reset()

    def reset(self):
        """Clear the state columns (every request PENDING, nothing processed)."""
        n = self.n
        self.state = np.full(n, PENDING, dtype=np.int8)
        self.prefill_len = self.prompt_tokens.copy()
        self.prefilled = np.zeros(n, np.int64)
        self.generated = np.zeros(n, np.int64)
        self.admitted_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.last_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, np.int32)

    @classmethod
    def from_requests(cls, requests: Sequence[Request]) -> "RequestTable":
        names = sorted({k for r in requests for k in r.fields})
        for r in requests:
            if sorted(r.fields) != names:
                raise ValueError(f"request {r.id}: fields {sorted(r.fields)} differ from the run's {names}")
        return cls(id=[r.id for r in requests], arrival_s=[r.arrival_s for r in requests],
                   prompt_tokens=[r.prompt_tokens for r in requests],
                   output_tokens=[r.output_tokens for r in requests],
                   adapter_id=[r.adapter_id for r in requests],
                   extra={k: [r.fields[k] for r in requests] for k in names})

    def __len__(self):
        return self.n

    # --- derived views (vectorized over idx) -------------------------------------------------------------
    def in_prefill(self, idx) -> np.ndarray:
        """True where the request still has prompt (or recompute) tokens to prefill."""
        return self.prefilled[idx] < self.prefill_len[idx]

    def context(self, idx) -> np.ndarray:
        """Tokens in the KV cache before the next iteration (see the module docstring)."""
        pre = self.prefilled[idx]
        return np.where(pre < self.prefill_len[idx], pre, self.prefill_len[idx] + self.generated[idx] - 1)

    def kv_tokens_final(self, idx) -> np.ndarray:
        """KV tokens the request holds when it finishes: prompt + output - 1 (the last token is never fed)."""
        return self.prompt_tokens[idx] + self.output_tokens[idx] - 1

    def remaining_output(self, idx) -> np.ndarray:
        return self.output_tokens[idx] - self.generated[idx]

    def request(self, idx: int) -> Request:
        """The input record of one request (for printing and tests)."""
        return Request(id=int(self.id[idx]), arrival_s=float(self.arrival_s[idx]),
                       prompt_tokens=int(self.prompt_tokens[idx]), output_tokens=int(self.output_tokens[idx]),
                       adapter_id=int(self.adapter_id[idx]),
                       fields={k: v[idx].item() for k, v in self.extra.items()})
