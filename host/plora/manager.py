"""The PLoRA GPU memory manager: its state, Algorithm 1 (PLoRA VI-A) and the state updates.

Decisions are pure functions of a :class:`ManagerState` (what HBM holds, which adapters serve with which
strategy and batch, the KV duplicates, the temperature classes) and a :class:`host.plora.cost.CostModel`.

**Algorithm 1** as this file reads PLoRA VI-A ("It sorts the four strategies by cost-model time (line 3) and
takes the fastest that fits in GPU memory (line 6). Otherwise it evicts cold adapters first (line 8), and if
more space is still needed it also considers evicting the other GPU memory residents, namely KV cache, hot
adapters, and serving adapters (lines 15-18). Eviction itself changes performance ... so we re-rank them all
with the cost model and take the fastest (lines 19 and 20)"), for the adapter ``i`` of a newly admitted
request:

1. rank the allowed strategies by the cost ``J`` (below) without eviction;
2. ``path="fits"``: if the fastest fits in free HBM, take it;
3. ``path="cold"``: else if it fits after evicting cold adapters (coldest first; dropping a cold adapter
   costs nothing: its master copy stays on the devices), evict the fewest needed and take it;
4. ``path="rerank"``: else build candidates: every strategy that fits after cold evictions (no costly
   eviction), and for every strategy that does not, the eviction sets (after all cold adapters) "KV only",
   "hot only", "serving only" and "KV, then hot, then serving" (the order of lines 15-18); re-rank all of
   them by ``J`` including the eviction cost, take the fastest (ties: fewer evictions, then the adapter's own
   standalone time).

Cost of a candidate, in seconds over the horizon ``H`` = the expected remaining decode iterations of adapter
``i``'s requests (design choice: a one-time load must be weighed against a per-iteration saving)::

    J = H * T_iter(candidate) + load_bytes / W_link + L_link * [load] + sum over hot victims of reload time

``T_iter = n_layers * (T_wave + T_ATT_estimate)`` with the candidate's wave sums and KV split
(:mod:`host.plora.cost`). Evicting serving adapter ``k`` moves it to its best strategy at the lower caching
level; evicting KV duplicates moves tokens from the GPU's attention share to the devices'.
"""

from dataclasses import dataclass, field

import numpy as np

from .cost import CostModel, WaveSums
from .lora import E1, E2, E3, E4, LEVEL_OF, LEVEL_NONE, LEVEL_B, LEVEL_AB, STRATEGIES

__all__ = ["AdapterState", "ManagerState", "Eviction", "Decision", "select", "apply", "rebuild_wave",
           "iteration_estimate", "PATHS"]

PATHS = ("fits", "cold", "rerank", "fallback")


@dataclass
class AdapterState:
    """One adapter the manager knows: rank, HBM caching level, serving strategy and batch."""

    rank: int
    level: int = LEVEL_NONE           # LEVEL_NONE (P2), LEVEL_B (P3), LEVEL_AB (P1)
    strategy: int | None = None       # serving strategy (None: not serving)
    tokens: int = 0                   # batch B_i: its requests in the current decode batch
    remaining: float = 1.0            # expected remaining decode iterations of its requests

    @property
    def serving(self) -> bool:
        return self.strategy is not None and self.tokens > 0


@dataclass
class ManagerState:
    """What the memory manager decides on.

    ``budget_bytes``: HBM for adapter caches and KV duplicates (after base weights and workspace).
    ``kv_dup_tokens`` / ``kv_dev_tokens``: tokens of the running requests duplicated in HBM / only on the
    devices; ``n_req``: running decode requests. ``hot``: the temperature metric's hot set;
    ``temperature``: id -> temperature, to order victims. ``allowed``: the strategies of this system.
    ``wave``: the LoRA wave sums of the serving adapters (keep it consistent: :func:`rebuild_wave`)."""

    budget_bytes: float
    adapters: dict = field(default_factory=dict)
    kv_dup_tokens: float = 0.0
    kv_dev_tokens: float = 0.0
    n_req: int = 0
    n_dev_req: float | None = None      # running requests with device-only tokens (None: all of them)
    hot: frozenset = frozenset()
    temperature: dict = field(default_factory=dict)
    allowed: tuple = (E1, E2, E3, E4)
    distributed: bool = True
    wave: WaveSums | None = None
    _cached: float | None = field(default=None, repr=False)

    def cached_bytes(self, cost: CostModel) -> float:
        """HBM the adapter caches hold (computed once, then kept up to date by :meth:`set_level`)."""
        if self._cached is None:
            self._cached = float(sum(_level_bytes(cost, a.rank, a.level) for a in self.adapters.values()))
        return self._cached

    def set_level(self, cost: CostModel, aid: int, level: int, rank: int | None = None) -> AdapterState:
        """Set adapter ``aid``'s caching level (creating its entry with ``rank`` if needed)."""
        a = self.adapters.get(aid)
        if a is None:
            if rank is None:
                raise ValueError(f"adapter {aid} is not in the state: pass rank=")
            a = self.adapters[aid] = AdapterState(rank=rank)
        if self._cached is not None:
            self._cached += _level_bytes(cost, a.rank, level) - _level_bytes(cost, a.rank, a.level)
        a.level = level
        return a

    def kv_dup_bytes(self, cost: CostModel) -> float:
        return self.kv_dup_tokens * cost.kv_tok

    def free_bytes(self, cost: CostModel) -> float:
        return self.budget_bytes - self.cached_bytes(cost) - self.kv_dup_bytes(cost)


@dataclass(frozen=True)
class Eviction:
    """One eviction: ``kind`` in cold / kv / hot / serving; ``adapter`` (-1 for KV); ``bytes`` freed;
    ``new_level`` (adapters); ``new_strategy`` (serving adapters); ``kv_tokens`` (KV duplicates dropped)."""

    kind: str
    adapter: int
    bytes: float
    new_level: int = LEVEL_NONE
    new_strategy: int | None = None
    kv_tokens: float = 0.0


@dataclass(frozen=True)
class Decision:
    """Algorithm 1's answer for one adapter: the strategy, the caching level after it, the bytes to load over
    the link, the evictions, the path taken, its cost J and every candidate considered ``(label, J)``."""

    adapter: int
    strategy: int
    level: int
    load_bytes: float
    evictions: tuple
    path: str
    cost_s: float
    candidates: tuple


def _level_bytes(cost: CostModel, rank: int, level: int) -> float:
    r = cost.resident(rank)
    return float(r[E1] if level == LEVEL_AB else r[E4] if level == LEVEL_B else 0.0)


def rebuild_wave(state: ManagerState, cost: CostModel) -> WaveSums:
    """The wave sums of ``state``'s serving adapters (also stored in ``state.wave``)."""
    w = WaveSums.empty(cost.n_dev)
    for aid, a in state.adapters.items():
        if a.serving:
            w.add(cost.terms(a.rank, a.tokens)[a.strategy], cost.device_of(aid))
    state.wave = w
    return w


def iteration_estimate(cost: CostModel, wave: WaveSums, n_req: int, gpu_tok: float, dev_tok: float,
                       distributed: bool = True, n_dev_req: float | None = None) -> float:
    """The cost model's decode-iteration estimate (LoRA waves and attention of every layer)."""
    return cost.shape.n_layers * (cost.wave_s(wave) + cost.attention_estimate(n_req, gpu_tok, dev_tok,
                                                                               distributed=distributed,
                                                                               n_dev_req=n_dev_req))


class _Eval:
    """Evaluates candidates for one decision (adapter ``aid`` with ``tokens`` and horizon ``H``)."""

    def __init__(self, state: ManagerState, cost: CostModel, aid: int, rank: int, tokens: int, H: float):
        self.state, self.cost, self.aid, self.rank, self.tokens, self.H = state, cost, aid, rank, tokens, H
        base = state.wave.copy() if state.wave is not None else rebuild_wave(state, cost).copy()
        me = state.adapters.get(aid)
        if me is not None and me.serving:
            base.add(cost.terms(me.rank, me.tokens)[me.strategy], cost.device_of(aid), sign=-1.0)
        self.base = base
        self.level = me.level if me is not None else LEVEL_NONE
        self.row = cost.terms(rank, tokens)
        self.dev = cost.device_of(aid)
        self.n_req = state.n_req
        self._att = {}

    def T(self, wave: WaveSums, gpu_tok: float, dev_tok: float) -> float:
        """iteration_estimate with the attention estimate cached per KV split."""
        key = (gpu_tok, dev_tok)
        a = self._att.get(key)
        if a is None:
            a = self._att[key] = self.cost.attention_estimate(self.n_req, gpu_tok, dev_tok,
                                                              distributed=self.state.distributed,
                                                              n_dev_req=self.state.n_dev_req)
        return self.cost.shape.n_layers * (self.cost.wave_s(wave) + a)

    def need(self, s: int) -> float:
        """HBM bytes strategy ``s`` needs beyond what adapter ``aid`` already caches."""
        lvl = max(LEVEL_OF[s], self.level)
        return _level_bytes(self.cost, self.rank, lvl) - _level_bytes(self.cost, self.rank, self.level)

    def J(self, s: int, evictions=()) -> float:
        cost, st = self.cost, self.state
        w = self.base.copy()
        gpu_tok, dev_tok = st.kv_dup_tokens, st.kv_dev_tokens
        once = 0.0
        for ev in evictions:
            if ev.kind == "kv":
                gpu_tok -= ev.kv_tokens
                dev_tok += ev.kv_tokens
            elif ev.kind == "serving":
                k = st.adapters[ev.adapter]
                w.add(cost.terms(k.rank, k.tokens)[k.strategy], cost.device_of(ev.adapter), sign=-1.0)
                w.add(cost.terms(k.rank, k.tokens)[ev.new_strategy], cost.device_of(ev.adapter))
            elif ev.kind == "hot":
                once += ev.bytes / cost.link.W + cost.link.L
        w.add(self.row[s], self.dev)
        t = self.T(w, gpu_tok, dev_tok)
        load = self.need(s)
        if load > 0:
            once += load / cost.link.W + cost.link.L
        # serving victims pay their slowdown over min(H, H_k) (the per-iteration term covers H iterations)
        extra = 0.0
        for ev in evictions:
            if ev.kind == "serving":
                hk = st.adapters[ev.adapter].remaining
                if hk < self.H:
                    extra -= (self.H - hk) * self._serving_delta(ev)
        return self.H * t + once + extra

    def _serving_delta(self, ev) -> float:
        cost, st = self.cost, self.state
        k = st.adapters[ev.adapter]
        w0 = self.base.copy()
        w1 = self.base.copy()
        w1.add(cost.terms(k.rank, k.tokens)[k.strategy], cost.device_of(ev.adapter), sign=-1.0)
        w1.add(cost.terms(k.rank, k.tokens)[ev.new_strategy], cost.device_of(ev.adapter))
        return self.T(w1, st.kv_dup_tokens, st.kv_dev_tokens) - self.T(w0, st.kv_dup_tokens, st.kv_dev_tokens)


def _cold(state: ManagerState, cost: CostModel, aid: int):
    """Cold adapters (cached, not serving, not hot), coldest first."""
    temp = state.temperature
    cold = [(temp.get(k, 0.0), k, Eviction("cold", k, _level_bytes(cost, a.rank, a.level)))
            for k, a in state.adapters.items()
            if k != aid and a.level != LEVEL_NONE and not a.serving and k not in state.hot]
    cold.sort(key=lambda x: (x[0], x[1]))
    return [c[2] for c in cold]


def _hot_and_serving(state: ManagerState, cost: CostModel, aid: int):
    """(hot, serving) victims in eviction order: hot adapters coldest first; serving adapters' drops to a
    lower caching level, by their standalone slowdown per freed byte (design choice: an ordering heuristic;
    the candidates are then priced exactly by J)."""
    hot, serving = [], []
    temp = state.temperature
    for k, a in state.adapters.items():
        if k == aid or a.level == LEVEL_NONE:
            continue
        if not a.serving:
            if k in state.hot:
                hot.append((temp.get(k, 0.0), k, Eviction("hot", k, _level_bytes(cost, a.rank, a.level))))
            continue
        times = cost.standalone_s(a.rank, a.tokens)
        for lvl in range(a.level - 1, -1, -1):
            ok = [s for s in state.allowed if LEVEL_OF[s] <= lvl]
            if not ok:
                continue
            new = min(ok, key=lambda s: (times[s], s))
            freed = _level_bytes(cost, a.rank, a.level) - _level_bytes(cost, a.rank, lvl)
            delta = max(float(times[new] - times[a.strategy]), 0.0)
            serving.append((delta / freed, k, Eviction("serving", k, freed, lvl, new)))
    hot.sort(key=lambda x: (x[0], x[1]))
    serving.sort(key=lambda x: (x[0], x[1]))
    return [h[2] for h in hot], [v[2] for v in serving]


def _take(items, need):
    """Items in order until their bytes reach ``need`` (one per adapter); None if they cannot."""
    got, out, seen = 0.0, [], set()
    for it in items:
        if got >= need - 1e-6:
            break
        if it.adapter in seen and it.adapter >= 0:
            continue
        seen.add(it.adapter)
        out.append(it)
        got += it.bytes
    return out if got >= need - 1e-6 else None


def _kv_item(state, cost, need):
    avail = state.kv_dup_tokens * cost.kv_tok
    if avail <= 0:
        return None
    nbytes = min(avail, need)
    return Eviction("kv", -1, nbytes, kv_tokens=nbytes / cost.kv_tok)


def select(state: ManagerState, cost: CostModel, aid: int, tokens: int, *, rank: int | None = None,
           remaining: float | None = None) -> Decision:
    """Algorithm 1 for adapter ``aid`` serving ``tokens`` requests (its new batch size). ``rank`` is needed if
    the state does not know the adapter; ``remaining`` (>= 1) defaults to the state's value."""
    me = state.adapters.get(aid)
    if rank is None:
        if me is None:
            raise ValueError(f"adapter {aid} is not in the state: pass rank=")
        rank = me.rank
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    H = max(1.0, float(remaining if remaining is not None else (me.remaining if me is not None else 1.0)))
    if not state.allowed:
        raise ValueError("state.allowed is empty")
    ev = _Eval(state, cost, aid, rank, tokens, H)
    free = state.free_bytes(cost)
    # ties in J (a strategy whose resource is not the wave's bottleneck adds nothing to T_iter) go to the
    # adapter's own standalone time, then to the lower caching level
    own = cost.standalone_s(rank, tokens)
    ranked = sorted(((ev.J(s), float(own[s]), LEVEL_OF[s], s) for s in state.allowed))
    cands = [(f"{STRATEGIES[s]}", j) for j, _, _, s in ranked]
    best_j, _, _, best = ranked[0]
    need = ev.need(best)

    def decide(s, evs, path, j, cand):
        lvl = max(LEVEL_OF[s], ev.level)
        return Decision(aid, s, lvl, ev.need(s), tuple(evs), path, j, tuple(cand))

    if need <= free + 1e-6:                                                # line 6
        return decide(best, (), "fits", best_j, cands)
    cold = _cold(state, cost, aid)
    cold_total = sum(c.bytes for c in cold)
    if need <= free + cold_total + 1e-6:                                   # line 8
        return decide(best, _take(cold, need - free), "cold", best_j, cands)
    # lines 15-20: candidates with and without costly evictions, re-ranked by J including eviction cost
    hot, serving = _hot_and_serving(state, cost, aid)
    options = []
    for j, _, _, s in ranked:
        n = ev.need(s)
        if n <= free + cold_total + 1e-6:
            evs = _take(cold, n - free) if n > free + 1e-6 else []
            options.append((j, 0, float(own[s]), s, evs, f"{STRATEGIES[s]}"))
            continue
        rest = n - free - cold_total
        sets = {}
        kv = _kv_item(state, cost, rest)
        if kv is not None and kv.bytes >= rest - 1e-6:
            sets["kv"] = [kv]
        h = _take(hot, rest)
        if h is not None:
            sets["hot"] = h
        sv = _take(serving, rest)
        if sv is not None:
            sets["serving"] = sv
        mixed, got = [], 0.0
        if kv is not None:
            mixed.append(kv)
            got += kv.bytes
        for it in hot + serving:
            if got >= rest - 1e-6:
                break
            if it.kind == "serving" and any(m.adapter == it.adapter for m in mixed):
                continue
            mixed.append(it)
            got += it.bytes
        if got >= rest - 1e-6:
            sets["kv+hot+serving"] = mixed
        for label, evs in sets.items():
            full = list(cold) + list(evs)
            jj = ev.J(s, full)
            options.append((jj, len(full), float(own[s]), s, full, f"{STRATEGIES[s]}+evict({label})"))
    if not options:
        # no allowed strategy can be made to fit: serve with E3 (needs no HBM) and say so
        j = ev.J(E3)
        return decide(E3, (), "fallback", j, cands + [("E3 (fallback)", j)])
    options.sort(key=lambda o: (o[0], o[1], o[2], o[3]))
    j, _, _, s, evs, _ = options[0]
    return decide(s, evs, "rerank", j, [(o[5], o[0]) for o in options])


def apply(state: ManagerState, cost: CostModel, d: Decision, *, tokens: int, rank: int | None = None,
          remaining: float | None = None):
    """Carry out decision ``d`` on ``state`` (in place): evictions, the adapter's new level, strategy and
    batch, and the wave sums."""
    if state.wave is None:
        rebuild_wave(state, cost)
    for e in d.evictions:
        if e.kind == "kv":
            state.kv_dup_tokens -= e.kv_tokens
            state.kv_dev_tokens += e.kv_tokens
            continue
        a = state.adapters[e.adapter]
        if e.kind == "serving":
            state.wave.add(cost.terms(a.rank, a.tokens)[a.strategy], cost.device_of(e.adapter), sign=-1.0)
            a.strategy = e.new_strategy
            state.wave.add(cost.terms(a.rank, a.tokens)[a.strategy], cost.device_of(e.adapter))
        state.set_level(cost, e.adapter, e.new_level)
    me = state.adapters.get(d.adapter)
    if me is None:
        me = state.set_level(cost, d.adapter, LEVEL_NONE, rank)
    if me.serving:
        state.wave.add(cost.terms(me.rank, me.tokens)[me.strategy], cost.device_of(d.adapter), sign=-1.0)
    state.set_level(cost, d.adapter, d.level)
    me.strategy = d.strategy
    me.tokens = tokens
    if remaining is not None:
        me.remaining = remaining
    state.wave.add(cost.terms(me.rank, me.tokens)[me.strategy], cost.device_of(d.adapter))
