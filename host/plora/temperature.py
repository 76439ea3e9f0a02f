"""The temperature metric that separates hot adapters from cold ones (PLoRA VI-A).

"each new request raises its adapter's temperature by a fixed increment, all temperatures relax toward the
system average by 0.1 of the gap per step, and PLoRA pre-caches the 50 hottest non-serving adapters."

A step is one engine iteration (design choice: the paper does not name the step). Relaxation keeps the sum
(and so the mean) of the temperatures unchanged, so the increment only sets the scale: 1.0 loses nothing.
"""

import numpy as np

__all__ = ["Temperature", "RELAX", "HOT_COUNT", "INCREMENT"]

RELAX = 0.1        # PLoRA VI-A: "relax toward the system average by 0.1 of the gap per step"
HOT_COUNT = 50     # PLoRA VI-A: "pre-caches the 50 hottest non-serving adapters"
INCREMENT = 1.0    # PLoRA VI-A: "a fixed increment" (value: design choice, scale-free, see module docstring)


class Temperature:
    """Temperatures of ``n_adapters`` adapters (ids 0..n-1), all starting at 0."""

    def __init__(self, n_adapters: int, *, increment: float = INCREMENT, relax: float = RELAX,
                 hot_count: int = HOT_COUNT):
        if isinstance(n_adapters, bool) or not isinstance(n_adapters, (int, np.integer)) or n_adapters < 1:
            raise ValueError(f"n_adapters must be an int >= 1, got {n_adapters!r}")
        if not (increment > 0):
            raise ValueError(f"increment must be > 0, got {increment!r}")
        if not (0 < relax <= 1):
            raise ValueError(f"relax must be in (0, 1], got {relax!r}")
        if hot_count < 0:
            raise ValueError(f"hot_count must be >= 0, got {hot_count!r}")
        self._t = np.zeros(int(n_adapters))
        self._pending = 0          # relaxation steps not yet applied (applied lazily, closed form)
        self.increment, self.relax, self.hot_count = float(increment), float(relax), int(hot_count)

    @property
    def t(self) -> np.ndarray:
        """The temperatures (every pending step applied)."""
        if self._pending:
            mean = self._t.mean()
            self._t = mean + (self._t - mean) * (1.0 - self.relax) ** self._pending
            self._pending = 0
        return self._t

    def on_requests(self, adapter_ids):
        """Each new request raises its adapter's temperature by the increment (repeats count)."""
        ids = np.asarray(adapter_ids, dtype=np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= len(self._t)):
            raise ValueError(f"adapter ids must be in 0..{len(self._t) - 1}, got {ids.min()}..{ids.max()}")
        t = self.t
        np.add.at(t, ids, self.increment)

    def step(self, n: int = 1):
        """``n`` relaxation steps: t <- t + relax * (mean - t), i.e. the gap to the mean shrinks by (1-relax)^n."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self._pending += int(n)

    def hot(self, serving_mask=None) -> np.ndarray:
        """Ids of the ``hot_count`` hottest non-serving adapters, hottest first (ties: lower id first); only
        adapters above the mean count (at the mean an adapter has no signal of future use)."""
        t = self.t
        cand = np.ones(len(t), bool) if serving_mask is None else ~np.asarray(serving_mask, bool)
        cand &= t > t.mean() + 1e-12 * max(1.0, abs(t.mean()))
        ids = np.flatnonzero(cand)
        if len(ids) > self.hot_count:
            part = np.argpartition(-t[ids], self.hot_count - 1)[:self.hot_count]
            ids = ids[part]
        order = np.lexsort((ids, -t[ids]))
        return ids[order]
