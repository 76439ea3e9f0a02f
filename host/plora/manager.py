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
from operator import itemgetter

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
    _cached_ids: set | None = field(default=None, repr=False)

    def cached_ids(self) -> set:
        """Ids of the adapters with a caching level above none (built once, then kept up to date by
        :meth:`set_level`; the eviction candidates are among them)."""
        if self._cached_ids is None:
            self._cached_ids = {k for k, a in self.adapters.items() if a.level != LEVEL_NONE}
        return self._cached_ids

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
        if self._cached_ids is not None:
            if level != LEVEL_NONE:
                self._cached_ids.add(aid)
            else:
                self._cached_ids.discard(aid)
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
    kv_dup_tokens: int = 0          # of the new request's ``kv_tokens`` (select): how many to duplicate in HBM
    kv_dup_fraction: float = 0.0    # the fraction of the grid they are (the request keeps it as it grows)


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
        self._need = {}

    def T(self, wave: WaveSums, gpu_tok: float, dev_tok: float, new: tuple | None = None) -> float:
        """iteration_estimate with the attention estimate cached per KV split; ``new``: the joining request's
        (duplicated, device-only) tokens, counted in the batch (:func:`select`'s ``kv_tokens``)."""
        return self.cost.shape.n_layers * (self.cost.wave_s(wave) + self._attention(gpu_tok, dev_tok, new))

    def _attention(self, gpu_tok: float, dev_tok: float, new: tuple | None) -> float:
        key = (gpu_tok, dev_tok, new)
        a = self._att.get(key)
        if a is None:
            st = self.state
            n_req, n_dev_req = self.n_req, st.n_dev_req
            if new is not None:
                gpu_tok, dev_tok = gpu_tok + new[0], dev_tok + new[1]
                n_dev_req = (st.n_req if n_dev_req is None else n_dev_req) + (1 if new[1] >= 1 else 0)
                n_req += 1
            a = self._att[key] = self.cost.attention_estimate(n_req, gpu_tok, dev_tok, distributed=st.distributed,
                                                              n_dev_req=n_dev_req)
        return a

    def need(self, s: int) -> float:
        """HBM bytes strategy ``s`` needs beyond what adapter ``aid`` already caches."""
        got = self._need.get(s)
        if got is None:
            lvl = max(LEVEL_OF[s], self.level)
            got = self._need[s] = _level_bytes(self.cost, self.rank, lvl) - _level_bytes(self.cost, self.rank,
                                                                                      self.level)
        return got

    def J(self, s: int, evictions=(), new: tuple | None = None) -> float:
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
        t = self.T(w, gpu_tok, dev_tok, new)
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

    def J_pairs(self, pairs, split) -> list:
        """``J(s, (), split(g))`` for every ``(s, g)`` of ``pairs`` (bit-equal), each strategy's wave and each
        split's attention computed once."""
        cost, st = self.cost, self.state
        L = cost.shape.n_layers
        waves, once = {}, {}
        for s in {s for s, _ in pairs}:
            w = self.base.copy()
            w.add(self.row[s], self.dev)
            waves[s] = cost.wave_s(w)
            load = self.need(s)
            once[s] = load / cost.link.W + cost.link.L if load > 0 else 0.0
        att = {g: self._attention(st.kv_dup_tokens, st.kv_dev_tokens, split(g)) for g in {g for _, g in pairs}}
        H = self.H
        return [H * (L * (waves[s] + att[g])) + once[s] + 0.0 for s, g in pairs]

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
    temp, ads, hot = state.temperature, state.adapters, state.hot
    memo = cost.__dict__.setdefault("_eviction_memo", {})
    cold = []
    for k in state.cached_ids():
        a = ads[k]
        # not serving: AdapterState.serving is ``strategy is not None and tokens > 0``
        if k == aid or a.level == LEVEL_NONE or (a.strategy is not None and a.tokens > 0) or k in hot:
            continue
        ev = memo.get(("cold", k, a.rank, a.level))
        if ev is None:
            ev = _eviction(cost, "cold", k, a.rank, a.level)
        cold.append((temp.get(k, 0.0), k, ev))
    cold.sort(key=_BY_TWO)
    return [c[2] for c in cold]


def _eviction(cost: CostModel, kind: str, k: int, rank: int, level: int) -> Eviction:
    """``Eviction(kind, k, bytes of its level)`` for a cold or hot adapter (immutable: memoized per cost model)."""
    memo = cost.__dict__.setdefault("_eviction_memo", {})
    key = (kind, k, rank, level)
    got = memo.get(key)
    if got is None:
        got = memo[key] = Eviction(kind, k, _level_bytes(cost, rank, level))
    return got


def _serving_drops(cost: CostModel, allowed, k: int, rank: int, tokens: int, level: int, strategy: int) -> tuple:
    """Serving adapter ``k``'s drops as ``(slowdown per freed byte, k, Eviction)`` (memoized per cost model)."""
    memo = cost.__dict__.setdefault("_serving_memo", {})
    key = (tuple(allowed), k, rank, tokens, level, strategy)
    got = memo.get(key)
    if got is None:
        got = memo[key] = tuple((ratio, k, Eviction("serving", k, freed, lvl, new))
                                for ratio, freed, lvl, new in _drops(cost, allowed, rank, tokens, level, strategy))
    return got


def _drops(cost: CostModel, allowed, rank: int, tokens: int, level: int, strategy: int) -> tuple:
    """A serving adapter's drops to each lower caching level: ``(slowdown per freed byte, freed bytes, level,
    new strategy)`` (a function of its arguments alone: memoized per cost model)."""
    memo = cost.__dict__.setdefault("_drops_memo", {})
    key = (tuple(allowed), rank, tokens, level, strategy)
    got = memo.get(key)
    if got is None:
        times = cost.standalone_s(rank, tokens)
        out = []
        for lvl in range(level - 1, -1, -1):
            ok = [s for s in allowed if LEVEL_OF[s] <= lvl]
            if not ok:
                continue
            new = min(ok, key=lambda s: (times[s], s))
            freed = _level_bytes(cost, rank, level) - _level_bytes(cost, rank, lvl)
            delta = max(float(times[new] - times[strategy]), 0.0)
            out.append((delta / freed, freed, lvl, new))
        got = memo[key] = tuple(out)
    return got


def _hot_and_serving(state: ManagerState, cost: CostModel, aid: int):
    """(hot, serving) victims in eviction order: hot adapters coldest first; serving adapters' drops to a
    lower caching level, by their standalone slowdown per freed byte (design choice: an ordering heuristic;
    the candidates are then priced exactly by J)."""
    hot, serving = [], []
    temp, ads, allowed, in_hot = state.temperature, state.adapters, tuple(state.allowed), state.hot
    memo = cost.__dict__.setdefault("_serving_memo", {})
    ev_memo = cost.__dict__.setdefault("_eviction_memo", {})
    for k in state.cached_ids():
        a = ads[k]
        if k == aid or a.level == LEVEL_NONE:
            continue
        if a.strategy is None or a.tokens <= 0:          # not serving
            if k in in_hot:
                ev = ev_memo.get(("hot", k, a.rank, a.level))
                if ev is None:
                    ev = _eviction(cost, "hot", k, a.rank, a.level)
                hot.append((temp.get(k, 0.0), k, ev))
            continue
        got = memo.get((allowed, k, a.rank, a.tokens, a.level, a.strategy))
        if got is None:
            got = _serving_drops(cost, allowed, k, a.rank, a.tokens, a.level, a.strategy)
        serving.extend(got)
    hot.sort(key=_BY_TWO)
    serving.sort(key=_BY_TWO)
    return [h[2] for h in hot], [v[2] for v in serving]


_BY_TWO = itemgetter(0, 1)


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
           remaining: float | None = None, kv_tokens: int = 0, kv_grid: int = 10) -> Decision:
    """Algorithm 1 for adapter ``aid`` serving ``tokens`` requests (its new batch size). ``rank`` is needed if
    the state does not know the adapter; ``remaining`` (>= 1) defaults to the state's value.

    ``kv_tokens`` > 0 (distributed attention only): the joining request's prompt tokens, whose duplication in HBM
    competes with the adapter's caching for the same free HBM (PLoRA III: "adapters and their KV caches compete for
    GPU memory ... strategy selection, KV cache placement, and the GPU memory budget form one decision space"; V-B:
    duplicated entries compete with LoRA adapters). The decision is then over pairs (strategy, duplicated fraction
    of ``0, 1/kv_grid, ..., 1``): each pair's J counts the joining request in the attention estimate with its
    split, its HBM need is the strategy's plus the duplicate's, and the fastest pair that fits (after cold
    evictions) is taken (ties: the strategy's order, then the smaller fraction). When no pair fits without
    evicting hot or serving adapters or KV, the costly candidates of lines 15-20 duplicate nothing of the joining
    request (evicting KV duplicates to make room and adding one would contradict each other; design choice).
    ``Decision.kv_dup_tokens`` says how many of the ``kv_tokens`` to duplicate. ``kv_tokens`` = 0: the decision
    is over strategies alone, as before."""
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
    if isinstance(kv_tokens, bool) or int(kv_tokens) != kv_tokens or kv_tokens < 0:
        raise ValueError(f"kv_tokens must be an int >= 0, got {kv_tokens!r}")
    if kv_tokens and not state.distributed:
        raise ValueError("kv_tokens > 0 needs distributed attention (KV placement in HBM is D's, PLoRA V-B)")
    if not (isinstance(kv_grid, int) and 1 <= kv_grid <= 1000):
        raise ValueError(f"kv_grid must be an int in 1..1000, got {kv_grid!r}")
    ev = _Eval(state, cost, aid, rank, tokens, H)
    free = state.free_bytes(cost)
    # ties in J (a strategy whose resource is not the wave's bottleneck adds nothing to T_iter) go to the
    # adapter's own standalone time, then to the lower caching level
    own = cost.standalone_s(rank, tokens)
    kv_tokens = int(kv_tokens)
    if kv_tokens:
        frac = {}
        for k in range(kv_grid + 1):
            frac.setdefault(int(k / kv_grid * kv_tokens), k / kv_grid)
        pairs = [(s, g) for s in state.allowed for g in sorted(frac)]
    else:
        frac = {0: 0.0}
        pairs = [(s, 0) for s in state.allowed]

    def split(g):
        return (float(g), float(kv_tokens - g)) if kv_tokens else None

    ranked = sorted(((j, float(own[s]), LEVEL_OF[s], s, g) for j, (s, g) in zip(ev.J_pairs(pairs, split), pairs)))
    cands = [(f"{STRATEGIES[s]}" + (f"+dup({g})" if kv_tokens else ""), j) for j, _, _, s, g in ranked]
    best_j, _, _, best, best_g = ranked[0]

    def need_of(s, g):
        return ev.need(s) + g * cost.kv_tok

    def decide(s, evs, path, j, cand, g=0):
        lvl = max(LEVEL_OF[s], ev.level)
        return Decision(aid, s, lvl, ev.need(s), tuple(evs), path, j, tuple(cand), int(g), frac[g])

    need = need_of(best, best_g)
    if need <= free + 1e-6:                                                # line 6
        return decide(best, (), "fits", best_j, cands, best_g)
    cold = _cold(state, cost, aid)
    cold_total = sum(c.bytes for c in cold)
    if need <= free + cold_total + 1e-6:                                   # line 8
        return decide(best, _take(cold, need - free), "cold", best_j, cands, best_g)
    # no costly eviction needed for some pairs: they are candidates next to the costly ones below
    fitting = [(j, 0, o, s, _take(cold, need_of(s, g) - free) if need_of(s, g) > free + 1e-6 else [],
                f"{STRATEGIES[s]}+dup({g})", g)
               for j, o, _, s, g in ranked if g > 0 and need_of(s, g) <= free + cold_total + 1e-6]
    if kv_tokens:
        # the costly candidates duplicate none of the joining request: re-rank its strategies with it on the devices
        ranked = sorted(((ev.J(s, (), split(0)), float(own[s]), LEVEL_OF[s], s, 0) for s in state.allowed))
    # lines 15-20: candidates with and without costly evictions, re-ranked by J including eviction cost
    hot, serving = _hot_and_serving(state, cost, aid)
    options = [o[:6] + (o[6],) for o in fitting]
    for j, _, _, s, _ in ranked:
        n = ev.need(s)
        if n <= free + cold_total + 1e-6:
            evs = _take(cold, n - free) if n > free + 1e-6 else []
            options.append((j, 0, float(own[s]), s, evs, f"{STRATEGIES[s]}", 0))
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
            jj = ev.J(s, full, split(0))
            options.append((jj, len(full), float(own[s]), s, full, f"{STRATEGIES[s]}+evict({label})", 0))
    if not options:
        # no allowed strategy can be made to fit: serve with E3 (needs no HBM) and say so
        j = ev.J(E3, (), split(0))
        return decide(E3, (), "fallback", j, cands + [("E3 (fallback)", j)])
    options.sort(key=lambda o: (o[0], o[1], o[2], o[3], o[6]))
    j, _, _, s, evs, _, g = options[0]
    return decide(s, evs, "rerank", j, [(o[5], o[0]) for o in options], g)


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
