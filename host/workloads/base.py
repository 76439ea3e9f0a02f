"""The :class:`Workload` container: columns of requests plus how they were made."""

from dataclasses import dataclass, field

import numpy as np

from host.serving.request import Request, RequestTable

__all__ = ["Workload"]


@dataclass
class Workload:
    """Requests as columns (numpy arrays of one length), sorted by arrival.

    ``params``: the generator's name and arguments (seed included), enough to regenerate it. ``notes``: what a
    reader must know (e.g. a trace that was not available and what replaced it). ``extra``: optional per-request
    fields (e.g. ``rank``: the LoRA rank of the request's adapter).
    """

    name: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    adapter_id: np.ndarray
    extra: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def __post_init__(self):
        self.arrival_s = np.asarray(self.arrival_s, dtype=np.float64)
        n = len(self.arrival_s)
        self.prompt_tokens = np.asarray(self.prompt_tokens, dtype=np.int64)
        self.output_tokens = np.asarray(self.output_tokens, dtype=np.int64)
        self.adapter_id = np.asarray(self.adapter_id, dtype=np.int64)
        for k in ("prompt_tokens", "output_tokens", "adapter_id"):
            if getattr(self, k).shape != (n,):
                raise ValueError(f"Workload {self.name}: column {k} has {getattr(self, k).shape}, expected ({n},)")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError(f"Workload {self.name}: prompt and output lengths must be >= 1")
        order = np.argsort(self.arrival_s, kind="stable")
        if np.any(order != np.arange(n)):
            self.arrival_s, self.prompt_tokens = self.arrival_s[order], self.prompt_tokens[order]
            self.output_tokens, self.adapter_id = self.output_tokens[order], self.adapter_id[order]
            self.extra = {k: np.asarray(v)[order] for k, v in self.extra.items()}
        self.extra = {k: np.asarray(v) for k, v in self.extra.items()}

    def __len__(self):
        return len(self.arrival_s)

    def to_table(self) -> RequestTable:
        return RequestTable(id=np.arange(len(self)), arrival_s=self.arrival_s, prompt_tokens=self.prompt_tokens,
                            output_tokens=self.output_tokens, adapter_id=self.adapter_id, extra=self.extra)

    def requests(self) -> list:
        t = self.to_table()
        return [t.request(i) for i in range(len(self))]

    def head(self, n: int) -> "Workload":
        """The first ``n`` requests (by arrival)."""
        return Workload(self.name, self.arrival_s[:n], self.prompt_tokens[:n], self.output_tokens[:n],
                        self.adapter_id[:n], {k: v[:n] for k, v in self.extra.items()},
                        {**self.params, "head": n}, list(self.notes))

    def stats(self) -> dict:
        """Summary statistics (for printing, config.json and tests)."""
        n = len(self)
        gaps = np.diff(self.arrival_s)
        dur = float(self.arrival_s[-1] - self.arrival_s[0]) if n > 1 else 0.0
        counts = np.bincount(self.adapter_id) if n else np.zeros(0)
        top50 = float(np.sort(counts)[::-1][:50].sum() / n) if n else float("nan")
        return {"requests": n, "duration_s": dur, "rate_per_s": (n - 1) / dur if dur > 0 else float("inf"),
                "interarrival_cv": float(gaps.std() / gaps.mean()) if n > 2 and gaps.mean() > 0 else float("nan"),
                "prompt_mean": float(self.prompt_tokens.mean()), "prompt_std": float(self.prompt_tokens.std()),
                "output_mean": float(self.output_tokens.mean()), "output_std": float(self.output_tokens.std()),
                "adapters_used": int(np.count_nonzero(counts)), "top50_adapter_share": top50}

    def describe(self) -> dict:
        """What config.json records: name, generator parameters, notes and statistics."""
        return {"name": self.name, "params": self.params, "notes": self.notes, "stats": self.stats()}
