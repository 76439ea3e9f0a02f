"""The PLoRA family as serving-engine systems: PLoRA (NSD), its ablations, Pure CXL, Grace-Hopper, PLoRA-NoCXL.

One class, :class:`PLoRASystem`, parameterized by a :class:`host.plora.config.Variant`. It owns:

* **memory**: the device pool holds every adapter the run references and every admitted request's whole KV
  (token-interleaved, reserved at admission); HBM holds the base weights, a workspace fraction, the adapter
  caches (P1: A and B, P3: B) and the duplicated KV prefixes, managed by Algorithm 1
  (:mod:`host.plora.manager`);
* **decisions**: at each admission, Algorithm 1 for the request's adapter with its new batch size B_i; the
  temperature metric (a step per iteration) and the pre-caching of the hottest non-serving adapters into free
  HBM using only idle link time; a new request's prompt KV is duplicated in HBM up to the balanced P_KV
  (:meth:`host.plora.cost.CostModel.balanced_dup_fraction`) as far as free HBM allows;
* **the estimate** of an iteration, which Algorithm 1 ranks with: the base model on the GPU (``host.gpu.GPUModel``,
  calibrated), then per layer the LoRA wave and the decode attention of the cost model (:mod:`host.plora.cost`,
  with the calibrated GPU attention for the duplicated share and the NDP model for the devices' shares), the
  prefill attention on the GPU, and the link: at least as long as the link is busy. Host-mediated variants
  (PLoRA-NoCXL) add a kernel stop per adapter job and per attention exchange in every layer;
* **the time** of an iteration, which the run reports: the same work *executed* job by job on the execution
  timeline (:mod:`host.plora.timeline`: one GPU stream, each link direction a FIFO, each device's descriptor
  queue, the host's launch path), never the estimate. ``estimate_s`` (per iteration) and ``cost_model_err``
  (summary) say how far the estimate was from it.

Prefill tokens of an adapter use the fastest strategy its current caching level allows (no new caching for a
prompt), decode tokens the strategy Algorithm 1 chose.
"""

import numpy as np

from host.serving import System, ContinuousBatcher, KVBudget, IterationResult, RunResult, Span

from .config import (Variant, VARIANTS, KERNEL_STOP_S, WORKSPACE_FRACTION, DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS)
from .cost import CostModel, GPUParams, LinkParams, WaveSums
from .lora import (ModelShape, RANKS, E1, E2, E3, E4, STRATEGIES, LEVEL_OF, LEVEL_NONE, LEVEL_NAMES, adapter_bytes)
from .manager import AdapterState, ManagerState, select, apply, rebuild_wave
from .ndp_model import make_ndp_model, PLORA_DEVICE
from .timeline import LayerWork, Timeline
from .temperature import Temperature

__all__ = ["PLoRASystem", "shape_of", "adapter_ranks", "PricedIteration", "estimate_error"]


def shape_of(model) -> ModelShape:
    """The :class:`ModelShape` of a ``host.models.LLMConfig``."""
    return ModelShape(name=model.name, n_layers=model.n_layers, hidden=model.d_model, q_heads=model.n_heads,
                      kv_heads=model.n_kv_heads, head_dim=model.head_dim, ffn_dim=model.d_ff,
                      n_experts=model.n_experts, experts_active=model.n_active_experts,
                      expert_ffn_dim=model.d_expert_ff, weight_bytes=float(model.weight_bytes(1)),
                      gated=bool(model.gated_mlp))


def adapter_ranks(table, n_adapters: int, seed: int) -> np.ndarray:
    """Rank of every adapter: the requests' ``rank`` field if the workload gives one, else drawn uniformly
    from {8, 16, 32, 64, 128} ([PLoRA] VII-A) with ``seed``."""
    if "rank" in table.extra:
        ranks = np.zeros(n_adapters, np.int64)
        r = np.asarray(table.extra["rank"]).astype(np.int64)
        ranks[table.adapter_id] = r
        if np.any(r < 1):
            raise ValueError("request field 'rank' must be >= 1")
        missing = np.setdiff1d(np.arange(n_adapters), table.adapter_id)
        if len(missing):
            ranks[missing] = np.random.default_rng(seed).choice(RANKS, len(missing))
        return ranks
    return np.random.default_rng(seed).choice(np.array(RANKS), n_adapters)


class PricedIteration:
    """Algorithm 1's estimate (VI-B) of one iteration: its duration and the adapters per strategy."""

    __slots__ = ("duration_s", "strategy_n")


class PLoRASystem(System):
    """A PLoRA-family system (see the module docstring). ``model``: a ``host.models.LLMConfig``;
    ``variant``: a :class:`Variant` or its name; ``gpu``: a ``host.models.hardware.GPUConfig``;
    ``gpu_model``: a ``host.gpu.GPUModel`` (default: the calibrated one for ``gpu``); ``link``: a
    ``host.link.Link`` (default: the variant's preset); ``n_dev``: device count (default: the variant's);
    ``device``: the device spec (default: the variant's); ``ndp``: the NDP timing model or its kind
    (``auto``/``calibrated``/``standin``); ``kv_bits``: 16, 8 or 4; ``seed``: adapter ranks; ``ranks``: every
    adapter's rank (default: :func:`adapter_ranks`); ``hbm_budget_bytes``: HBM for adapter caches and KV duplicates
    (default: the GPU's HBM less the weights and the workspace)."""

    def __init__(self, model, variant="plora", *, gpu=None, gpu_model=None, link=None, n_dev=None, device=None,
                 ndp="auto", kv_bits=16, seed=0, max_batch=DEFAULT_MAX_BATCH, max_tokens=DEFAULT_MAX_TOKENS,
                 lora_waves_per_layer=1, batcher=None, ranks=None, hbm_budget_bytes=None):
        super().__init__(batcher or ContinuousBatcher(max_requests=max_batch, max_tokens=max_tokens))
        if isinstance(variant, str):
            if variant not in VARIANTS:
                raise ValueError(f"unknown PLoRA-family system {variant!r}; allowed: {sorted(VARIANTS)}")
            variant = VARIANTS[variant]
        self.variant: Variant = variant
        self.name = variant.name
        self.model = model
        self.shape = shape_of(model)
        if gpu is None:
            from host.models.hardware import H100_SXM_80GB
            gpu = H100_SXM_80GB
        self.gpu = gpu
        if gpu_model is None:
            from host.gpu import GPUModel, get_gpu_model
            from host.models.hardware import GPUS
            # the shared per-process model for a preset GPU (its tables serve every run of a sweep worker)
            gpu_model = get_gpu_model(gpu.name) if GPUS.get(gpu.name) == gpu else GPUModel(gpu)
        self.gpu_model = gpu_model
        if link is None:
            from host.link import get_link
            link = get_link(variant.link)
        self.link = link
        self.n_dev = int(variant.n_dev if n_dev is None else n_dev)
        if self.n_dev < 1:
            raise ValueError(f"n_dev must be >= 1, got {self.n_dev}")
        self.device = variant.device if device is None else device
        if isinstance(ndp, str) and ndp == "auto" and self.device != PLORA_DEVICE and not variant.uses_ndp:
            # a system whose memory is not an NDP device (Grace-Hopper's Grace memory: GPU loads only) is timed by
            # the stand-in's memory terms on its own memory spec, by its definition; the summary's ndp_model says so
            ndp = "standin"
        self.ndp = make_ndp_model(ndp, self.device) if isinstance(ndp, str) else ndp
        self.kv_bits = kv_bits
        self.seed = seed
        self.given_ranks = None if ranks is None else np.asarray(ranks, np.int64)
        self.hbm_budget_bytes = None if hbm_budget_bytes is None else float(hbm_budget_bytes)
        heads, kvh, hd = model.n_heads, model.n_kv_heads, model.head_dim
        kvb = kv_bits / 8.0
        gm = self.gpu_model

        def gpu_att(n_req, tokens):
            return gm.attention_decode(max(n_req, 1), tokens, heads=heads, kv_heads=kvh, head_dim=hd,
                                       kv_dtype_bytes=kvb).calibrated_s

        self.cost = CostModel(self.shape, ndp=self.ndp, n_dev=self.n_dev,
                              link=LinkParams(link.bw_gbps, link.rtt_ns),
                              gpu=GPUParams(gpu.name, gpu.hbm_gb, gpu.hbm_bw_gbps, gpu.fp16_tflops),
                              kv_bits=kv_bits, lora_waves_per_layer=lora_waves_per_layer, gpu_attention_s=gpu_att,
                              host_op_s=KERNEL_STOP_S if variant.host_mediated else 0.0)
        self.max_batch = max_batch
        # the run's time comes from executing each iteration on this model of the resources, not from self.cost
        self.timeline = Timeline(self.n_dev, link.bw_gbps * 1e9, link.rtt_ns * 1e-9)
        self.emit_spans = True          # False: the timeline builds no trace spans (sweeps; the time is the same)

    # --- run set-up --------------------------------------------------------------------------------------
    def bind(self, table):
        super().bind(table)
        n = table.n
        self.n_adapters = int(table.adapter_id.max()) + 1 if n else 1
        if self.given_ranks is None:
            self.ranks = adapter_ranks(table, self.n_adapters, self.seed)
        else:
            if len(self.given_ranks) < self.n_adapters or np.any(self.given_ranks < 1):
                raise ValueError(f"{self.name}: ranks must give every one of the {self.n_adapters} adapters a rank "
                                 f">= 1, got {self.given_ranks.tolist()}")
            self.ranks = self.given_ranks[:self.n_adapters].copy()
        self.rank_values = np.unique(self.ranks)
        self.rank_idx = np.searchsorted(self.rank_values, self.ranks)
        self._tab = None
        used = np.unique(table.adapter_id)
        self.adapter_bytes = {int(r): adapter_bytes(self.shape, int(r)) for r in np.unique(self.ranks)}
        store = float(sum(self.adapter_bytes[int(self.ranks[a])] for a in used))
        pool = self.n_dev * self.device.capacity_bytes
        if store >= pool:
            per = self.device.capacity_bytes
            need = int(np.ceil(store / per)) + 1
            raise ValueError(f"{self.name}: the {len(used)} adapters this workload references take "
                             f"{store / 1e9:.0f} GB, more than the pool of {self.n_dev} x "
                             f"{per / 1e9:.0f} GB; use at least --devices {need}")
        self.store_bytes = store
        self.kv = KVBudget(table, capacity_bytes=pool, bytes_per_token=self.cost.kv_tok, policy="reserve",
                           block_tokens=1, fixed_bytes=store)
        hbm = self.gpu.hbm_gb * 1e9
        self.weights_bytes = float(self.model.weight_bytes(1))
        self.workspace_bytes = WORKSPACE_FRACTION * hbm
        budget = hbm - self.weights_bytes - self.workspace_bytes if self.hbm_budget_bytes is None \
            else self.hbm_budget_bytes
        if budget <= 0:
            raise ValueError(f"{self.name}: {self.model.name} weights ({self.weights_bytes / 1e9:.1f} GB) leave no "
                             f"HBM on {self.gpu.name}")
        self.state = ManagerState(budget_bytes=budget, allowed=self.variant.allowed,
                                  distributed=self.variant.distributed)
        rebuild_wave(self.state, self.cost)
        self.temp = Temperature(self.n_adapters)
        self.count = np.zeros(self.n_adapters, np.int64)
        self.strat = np.full(self.n_adapters, -1, np.int64)
        self.dup = np.zeros(n, np.int64)
        self.pfrac = np.zeros(n)
        self.pending_load = 0.0
        self.prefetch_budget = 0.0
        self.cached_total = 0.0
        self.decisions = {s: 0 for s in STRATEGIES}
        self.decisions["E3 (fallback)"] = 0
        self.paths = {}
        self.evictions = {"cold": 0, "kv": 0, "hot": 0, "serving": 0}
        self.precached = 0
        self.adapter_iters = np.zeros(4)
        self.acc = {"t": 0.0, "dup_w": 0.0, "adapters": 0.0, "kv_dup": 0.0}
        self.lane_busy = {}             # executed busy seconds per timeline lane (the energy's utilization)
        self._pending_busy = None
        self.span_s = [float("inf"), float("-inf")]     # first iteration's start, last one's end
        self.peak = {"adapters": 0.0, "kv_dup": 0.0}
        self._precache_level = {}
        self._hot_dirty = True
        self._idle_adapters = set()
        self._est_err = []
        #: requests whose KV the device pool holds (all, in a PLoRA system; a hybrid may keep some elsewhere: their
        #: prompts are not duplicated in HBM and their KV is not in the attention estimate)
        self.kv_on_devices = np.ones(n, bool)
        self._all_kv_on_devices = True

    # --- memory ------------------------------------------------------------------------------------------
    def can_admit(self, idx, now):
        return self.kv.can_admit(idx)

    def admission_error(self, idx):
        return self.kv.admission_error(idx)

    def keep_kv_elsewhere(self, idx):
        """Requests ``idx`` keep their KV outside the device pool and HBM (a hybrid's host-memory PIM requests):
        their adapters are managed as every other's, their prompts are not duplicated and their KV is not in the
        attention estimate (call after :meth:`bind`)."""
        self.kv_on_devices[np.asarray(idx, np.int64).ravel()] = False
        self._all_kv_on_devices = bool(self.kv_on_devices.all())

    def _cached_bytes(self):
        return self.state.cached_bytes(self.cost)

    def on_admit(self, idx, now):
        t, st, cost = self.table, self.state, self.cost
        for i in np.atleast_1d(idx).tolist():
            if self.kv_on_devices[i]:          # (a hybrid's PIM request holds no KV in the pool: keep_kv_elsewhere)
                self.kv.admit(np.array([i]))
            a = int(t.adapter_id[i])
            self.count[a] += 1
            self.temp.on_requests([a])
            remaining = float(t.output_tokens[i] - t.generated[i])
            self._refresh_hot()
            prompt = int(t.prefill_len[i])
            if not self.kv_on_devices[i]:
                prompt = 0
            # with distributed attention the prompt's duplication in HBM and the adapter's caching are one
            # decision (PLoRA III, V-B; manager.select's kv_tokens)
            d = self.decide(a, int(self.count[a]), max(1.0, remaining),
                            kv_tokens=prompt if self.variant.distributed else 0)
            # the prompt's KV duplicated in HBM: with D the fraction Algorithm 1 chose with the adapter (kept as the
            # request grows); without D the KV lives in the pool (PLoRA V-B(1): placement and duplication in HBM
            # are D's), and the "-hbmkv" variants keep it in HBM as far as it fits, as before issue 30
            free = st.free_bytes(cost)
            if self.variant.distributed:
                p, want = d.kv_dup_fraction, d.kv_dup_tokens
            else:
                p = 1.0 if self.variant.kv_in_hbm else 0.0
                want = int(p * prompt)
            self.pfrac[i] = p
            dup = min(want, int(max(free, 0.0) // cost.kv_tok))
            self.dup[i] = max(dup, 0)
            st.kv_dup_tokens += self.dup[i]
            st.kv_dev_tokens += prompt - self.dup[i]
            st.n_dev_req = (st.n_dev_req or 0) + (1 if prompt > self.dup[i] else 0)
            st.n_req += 1 if self.kv_on_devices[i] else 0

    def decide(self, a: int, tokens: int, remaining: float, kv_tokens: int = 0):
        """Algorithm 1 for adapter ``a`` serving ``tokens`` requests (:func:`host.plora.manager.select`), carried
        out on the state (evictions, KV duplicates dropped, loads, the strategy the pricing reads) and counted;
        returns the :class:`host.plora.manager.Decision`."""
        st, cost = self.state, self.cost
        rank = int(self.ranks[a])
        d = select(st, cost, a, tokens, rank=rank, remaining=remaining, kv_tokens=kv_tokens)
        kv_ev = sum(e.kv_tokens for e in d.evictions if e.kind == "kv")
        apply(st, cost, d, tokens=tokens, rank=rank, remaining=remaining)
        if kv_ev > 0:
            self._drop_dup(kv_ev)
        self._sync([a] + [e.adapter for e in d.evictions if e.kind == "serving"])
        self.pending_load += d.load_bytes
        self.decisions["E3 (fallback)" if d.path == "fallback" else STRATEGIES[d.strategy]] += 1
        self.paths[d.path] = self.paths.get(d.path, 0) + 1
        for e in d.evictions:
            self.evictions[e.kind] += 1
        return d

    def _drop_dup(self, tokens):
        """Algorithm 1 evicted ``tokens`` duplicated KV tokens: take them from the running requests in
        proportion to what each holds."""
        run = np.flatnonzero(self.dup)
        total = int(self.dup[run].sum())
        if total <= 0:
            return
        keep = max(0.0, 1.0 - tokens / total)
        self.dup[run] = np.floor(self.dup[run] * keep).astype(np.int64)
        self.pfrac[run] *= keep
        # the manager moved ``tokens`` (fractional) from duplicated to device-only; make it exact
        st = self.state
        dropped = total - int(self.dup[run].sum())
        st.kv_dup_tokens = float(self.dup.sum())
        st.kv_dev_tokens += dropped - tokens

    def _update_adapter(self, a):
        st, cost = self.state, self.cost
        s = st.adapters.get(a)
        if s is None or not s.serving:
            return
        dev = cost.device_of(a)
        st.wave.add(cost.terms(s.rank, s.tokens)[s.strategy], dev, sign=-1.0)
        if self.count[a] > 0:
            s.tokens = int(self.count[a])
            st.wave.add(cost.terms(s.rank, s.tokens)[s.strategy], dev)
        else:
            s.tokens = 0
            s.strategy = None

    def on_finish(self, idx, now):
        self.kv.release(idx)
        t = self.table
        self.dup[idx] = 0
        self.pfrac[idx] = 0.0
        for a in t.adapter_id[idx].tolist():
            self.count[a] -= 1
        for a in np.unique(t.adapter_id[idx]).tolist():
            self._update_adapter(int(a))
            self._sync([int(a)])

    def on_preempt(self, idx, now):
        self.on_finish(idx, now)

    def before_batch(self, view, now):
        st, cost, t = self.state, self.cost, self.table
        run = view.running
        if not self._all_kv_on_devices:
            run = run[self.kv_on_devices[run]]
        if len(run):
            ctx = t.context(run) + 1
            self.dup[run] = self._dup_grown(run, ctx)
            self._refresh_kv(run, ctx)
        else:
            st.kv_dup_tokens = st.kv_dev_tokens = 0.0
            st.n_dev_req = 0.0
        st.n_req = len(run)
        st.temperature = _TempView(self.temp)
        self._hot_dirty = True
        if self.variant.selection and self.variant.precache:
            self._refresh_hot()
            self._precache()

    def _dup_grown(self, run, kv_tokens):
        """Duplicated tokens of requests ``run`` once their KV holds ``kv_tokens``: each keeps its fraction (the
        GPU keeps a copy of its new tokens' K, V) as far as free HBM allows (growth scaled down to fit)."""
        want = np.maximum(np.floor(self.pfrac[run] * kv_tokens).astype(np.int64) - self.dup[run], 0)
        grow = int(want.sum())
        if grow:
            free = self.state.budget_bytes - self.state.cached_bytes(self.cost) - float(self.dup.sum()) * self.cost.kv_tok
            room = int(max(free, 0.0) // self.cost.kv_tok)
            if grow > room:
                want = np.floor(want * (room / grow)).astype(np.int64)
        return np.minimum(self.dup[run] + want, kv_tokens)

    def _refresh_kv(self, run, kv_tokens):
        st = self.state
        st.kv_dup_tokens = float(self.dup[run].sum())
        st.kv_dev_tokens = float((kv_tokens - self.dup[run]).sum())
        st.n_dev_req = float(np.count_nonzero(kv_tokens > self.dup[run]))

    def _refresh_hot(self):
        if self._hot_dirty:
            self.state.hot = frozenset(self.temp.hot(self.count > 0).tolist())
            self._hot_dirty = False

    def _precache_level_of(self, rank):
        lvl = self._precache_level.get(rank)
        if lvl is None:
            s = int(np.argmin([self.cost.standalone_s(rank, 1)[x] if x in self.variant.allowed else np.inf
                               for x in range(4)]))
            lvl = LEVEL_OF[s]
            self._precache_level[rank] = lvl
        return lvl

    def _precache(self):
        st, cost = self.state, self.cost
        hot = sorted(st.hot, key=lambda a: (-self.temp.t[a], a))
        if not hot or self.prefetch_budget <= 0:
            return
        free = st.free_bytes(cost)
        for a in hot:
            rank = int(self.ranks[a])
            lvl = self._precache_level_of(rank)
            s = st.adapters.get(a)
            have = s.level if s is not None else LEVEL_NONE
            if lvl <= have:
                continue
            r = cost.resident(rank)
            need = (r[E1] if lvl == 2 else r[E4]) - (r[E4] if have == 1 else 0.0)
            if need > free or need > self.prefetch_budget:
                continue
            st.set_level(cost, a, lvl, rank)
            free -= need
            self.prefetch_budget -= need
            self.pending_load += need
            self.precached += 1

    # --- the price ---------------------------------------------------------------------------------------
    def _wave(self, adapters, counts, strategies, pre_adapters=(), pre_tokens=()):
        """Per-layer LoRA wave sums of decode adapters (with strategies) and prefill tokens, and the per-adapter
        rows (``(devices, rows (n, 7), strategies)``) the execution timeline runs as jobs."""
        cost = self.cost
        w = WaveSums.empty(self.n_dev)
        n_strat = np.zeros(4)
        devs, rows_l, strat_l = [], [], []
        if len(adapters):
            need = int(counts.max())
            if self._tab is None or self._tab.shape[1] <= need:
                tabs = [cost.decode_table(int(r), need) for r in self.rank_values]
                size = min(len(t) for t in tabs)
                self._tab = np.stack([t[:size] for t in tabs])
            rows = self._tab[self.rank_idx[adapters], counts, strategies]
            tot = rows.sum(axis=0)
            w.out_bytes, w.in_bytes, w.gpu_bytes, w.gpu_flops = float(tot[0]), float(tot[1]), float(tot[3]), float(tot[4])
            w.host_ops = float(tot[5] + tot[6])
            w.dev = np.bincount(adapters % self.n_dev, weights=rows[:, 2], minlength=self.n_dev)
            w.link_users = int(np.count_nonzero(rows[:, 0] + rows[:, 1]))
            n_strat = np.bincount(strategies, minlength=4).astype(float)
            devs.append(adapters % self.n_dev)
            rows_l.append(rows)
            strat_l.append(np.asarray(strategies))
        for a, tok in zip(pre_adapters, pre_tokens):
            a, tok = int(a), int(tok)
            best, row = self.prefill_strategy(a, tok)
            w.add(row, cost.device_of(a))
            devs.append(np.array([cost.device_of(a)]))
            rows_l.append(row[None, :])
            strat_l.append(np.array([best]))
        if rows_l:
            jobs = (np.concatenate(devs), np.concatenate(rows_l), np.concatenate(strat_l))
        else:
            jobs = (np.zeros(0, np.int64), np.zeros((0, 7)), np.zeros(0, np.int64))
        return w, n_strat, jobs

    def prefill_strategy(self, a: int, tokens: int):
        """The strategy of adapter ``a``'s ``tokens`` prompt tokens and its terms row: the fastest its current
        caching level allows (no new caching for a prompt)."""
        s = self.state.adapters.get(a)
        lvl = s.level if s is not None else LEVEL_NONE
        ok = [x for x in self.variant.allowed if LEVEL_OF[x] <= lvl] or [E3 if self.variant.uses_ndp else E2]
        return self.cost.prefill_choice(int(self.ranks[a]), tokens, ok)

    def _strategies_of(self, adapters):
        out = self.strat[adapters]
        bad = out < 0
        if bad.any():
            out = out.copy()
            out[bad] = E3 if self.variant.uses_ndp else E2
        return out

    def _sync(self, adapters):
        """Copy the manager's strategies of ``adapters`` into the array the pricing gathers from."""
        for a in adapters:
            s = self.state.adapters.get(a)
            self.strat[a] = -1 if s is None or s.strategy is None else s.strategy

    def _price_parts(self, batch, att_points=None):
        """Everything but the decode attention, plus the decode-attention function of the context offset."""
        t, cost = self.table, self.cost
        L = self.shape.n_layers
        pre = batch.prefill
        dec_req = batch.req[~pre]
        ad = t.adapter_id[dec_req]
        cnt = np.bincount(ad, minlength=self.n_adapters)
        uniq = np.flatnonzero(cnt)
        counts = cnt[uniq]
        strat = self._strategies_of(uniq)
        pre_req = batch.req[pre]
        pre_ad = t.adapter_id[pre_req]
        pre_tok = batch.new_tokens[pre]
        if len(pre_ad):
            pu, inv = np.unique(pre_ad, return_inverse=True)
            pt = np.bincount(inv, weights=pre_tok).astype(np.int64)
        else:
            pu, pt = (), ()
        w, n_strat, jobs = self._wave(uniq, counts, strat, pu, pt)
        lora_s = cost.wave_s(w)
        it = self.gpu_model.iteration(self.model, tp=1, prefill_q=batch.new_tokens[pre],
                                      prefill_kv=batch.kv_after[pre], decode_requests=int(len(dec_req)),
                                      decode_kv_tokens=0, logits_tokens=int(len(dec_req) + batch.completes_prefill.sum()),
                                      kv_dtype_bytes=self.kv_bits / 8.0)
        ops = it.ops
        prefill_att = float(ops.get("attn_prefill", 0.0))
        base = float(it.total_s) - prefill_att - float(np.sum(ops.get("attn_decode", 0.0)))
        prefill_kv_bytes = float(pre_tok.sum()) * cost.kv_tok_layer      # per layer, to the devices
        # (a host-mediated system's launches and copies are in lora_s and the attention: cost.host_op_s)
        return dict(L=L, w=w, n_strat=n_strat, lora_s=lora_s, base=base, prefill_att=prefill_att,
                    prefill_kv_bytes=prefill_kv_bytes, dec_req=dec_req, jobs=jobs)

    def _attention(self, dec_req, kv_after, offset=0, dup=None):
        return self.cost.attention(kv_after + offset, self.dup[dec_req] if dup is None else dup,
                                   distributed=self.variant.distributed)

    def _assemble(self, p, att, load_bytes):
        """The estimate: every layer's LoRA wave and attention in series, plus the base model, or the link's busy
        time if longer."""
        L, w, Wl = p["L"], p["w"], self.cost.link.W
        wave_link = max(w.out_bytes, w.in_bytes) / Wl
        layer = p["lora_s"] + att.total_s + (p["prefill_att"] + p["base"]) / L
        link_busy = L * (wave_link + att.link_s + p["prefill_kv_bytes"] / Wl) + load_bytes / Wl
        r = PricedIteration()
        r.duration_s = max(L * layer, link_busy)
        r.strategy_n = p["n_strat"]
        return r

    # --- the execution timeline (host/plora/timeline.py): what the run's time comes from --------------------
    def _gpu_kernel_s(self, flops: float, nbytes: float) -> float:
        if not (flops > 0 or nbytes > 0):
            return 0.0
        memo = self.__dict__.setdefault("_kernel_memo", {})
        got = memo.get((flops, nbytes))
        if got is None:
            got = memo[(flops, nbytes)] = float(self.gpu_model.kernel(flops, nbytes).calibrated_s)
        return got

    def _gpu_add_s(self, nbytes: float) -> float:
        if not nbytes > 0:
            return 0.0
        memo = self.__dict__.setdefault("_add_memo", {})
        got = memo.get(nbytes)
        if got is None:
            got = memo[nbytes] = float(self.gpu_model.elementwise("add", nbytes).calibrated_s)
        return got

    def _layer_work(self, p, kv_after, dup, load_bytes, att=None) -> LayerWork:
        """One layer's work of the iteration priced by ``p`` (:meth:`_price_parts`) with decode requests of
        ``kv_after`` tokens, ``dup`` of them duplicated in HBM, and ``load_bytes`` of adapter loads pending
        (``att``: the estimate's :class:`AttentionCost` of the same requests, whose GPU share, device tokens and
        per-device times the execution takes instead of computing them again)."""
        cost, L = self.cost, p["L"]
        lora = p.get("_lora_work")
        if lora is None:
            # the LoRA and prefill part depends on p alone: kept in p for the stretch's other executions
            devs, rows, strat = p["jobs"]
            e1 = strat == E1
            after = (strat == E2) | (strat == E4)
            e3 = strat == E3
            on_dev = ~e1 & ((rows[:, 0] > 0) | (rows[:, 1] > 0) | (rows[:, 2] > 0))
            lora = p["_lora_work"] = dict(
                base_s=p["base"] / L, job_dev=devs[on_dev], job_out=rows[on_dev, 0], job_s=rows[on_dev, 2],
                job_in=rows[on_dev, 1],
                gpu_e1_s=self._gpu_kernel_s(float(rows[e1, 4].sum()), float(rows[e1, 3].sum())),
                gpu_after_s=self._gpu_kernel_s(float(rows[after, 4].sum()), float(rows[after, 3].sum()))
                + self._gpu_add_s(3.0 * float(rows[e3, 1].sum())),
                prefill_att_s=p["prefill_att"] / L, prefill_out=p["prefill_kv_bytes"], waves=cost.waves,
                host_stop_s=cost.host_op_s, job_stops=rows[on_dev, 5] if cost.host_op_s > 0 else None,
                job_stops_after=rows[on_dev, 6] if cost.host_op_s > 0 else None)
        w = LayerWork(load_in=load_bytes, **lora)
        Lt = np.asarray(kv_after, np.int64)
        a = np.asarray(dup, np.int64)
        if len(Lt):
            w.att_gpu_s = att.gpu_s if att is not None else cost.gpu_attention_s(int(np.count_nonzero(a)),
                                                                                  float(a.sum()))
            if self.variant.distributed:
                cnt = att.dev_tokens if att is not None else cost.device_tokens(Lt, a)
                n_act = (cnt > 0).sum(axis=0).astype(float)
                new_tok = np.bincount((Lt - 1) % self.n_dev, minlength=self.n_dev).astype(float)
                w.att_out = n_act * cost.q_bytes + new_tok * cost.kv_tok_layer
                w.att_in = n_act * cost.partial_bytes
                w.att_s = att.dev_per_device_s if att is not None else cost.device_attention(cnt)
                parts = float(n_act.sum() + np.count_nonzero(a))
                w.merge_s = self._gpu_add_s(parts * cost.partial_bytes + len(Lt) * cost.q_bytes)
            else:
                w.remote_in = float((Lt - a).sum()) * cost.kv_tok_layer
                w.new_kv_out = float(len(Lt)) * cost.kv_tok_layer
        return w

    def _execute(self, p, kv_after, dup, load_bytes, spans=True, att=None):
        return self.timeline.run(self._layer_work(p, kv_after, dup, load_bytes, att), p["L"],
                                 spans=spans and self.emit_spans)

    def _record(self, r, kv_after, dec_req):
        tot = float(kv_after.sum())
        dupf = float(self.dup[dec_req].sum()) / tot if tot > 0 else 0.0
        cached = self._cached_bytes()
        kvd = float(self.dup.sum()) * self.cost.kv_tok
        rec = {"kv_dup_fraction": dupf, "hbm_adapters_gb": cached / 1e9, "hbm_kv_dup_gb": kvd / 1e9}
        for j, s in enumerate(STRATEGIES):
            rec[f"n_{s}"] = float(r.strategy_n[j])
        return rec, dupf, cached, kvd

    def _account(self, dur, dupf, cached, kvd, n_strat, k=1):
        a = self.acc
        a["t"] += dur
        a["dup_w"] += dupf * dur
        a["adapters"] += cached * dur
        a["kv_dup"] += kvd * dur
        self.peak["adapters"] = max(self.peak["adapters"], cached)
        self.peak["kv_dup"] = max(self.peak["kv_dup"], kvd)
        self.adapter_iters += n_strat * k

    def energy(self) -> dict:
        """``energy_j`` and ``energy_per_token_mj`` of the run so far (host/energy.py, docs/energy.md "Energy in
        runs"): the GPU board over the run's time (first iteration's start to the last one's end, idle gaps
        included) with its timeline lane's busy seconds; the GPU-device link's
        bits (each direction's busy seconds x its bandwidth); each NDP device's busy seconds at the busy power of
        the paper device's kernels at this model's shape (logic to ``ndp``, its LPDDR5X to ``dram``), every
        device's memory in precharge standby for the whole run."""
        from host.energy import EnergyLedger, ndp_device_power, window_s
        b = self.lane_busy
        T = window_s(self.span_s)
        led = EnergyLedger()
        led.add_gpu(self.gpu.name, 1, T, b.get("GPU 0", 0.0))
        bits = 8.0 * self.cost.link.W * (b.get("link out", 0.0) + b.get("link in", 0.0))
        led.add_link(self.link.name, bits)
        sh = self.shape
        p = ndp_device_power(int(sh.hidden), int(sh.head_dim), int(sh.q_heads), int(sh.kv_heads))
        dev = sum(b.get(f"device {d}", 0.0) for d in range(self.n_dev))
        # a variant without NDP (pure CXL memory, Grace memory) only moves data: its devices' memory is charged
        # as the paper device's LPDDR5X (standby, and its streaming power while busy), no NDP logic
        led.add("ndp", p["logic"] * dev if self.variant.uses_ndp else 0.0)
        led.add("dram", self.n_dev * p["idle_dram"] * T + max(0.0, p["dram"] - p["idle_dram"]) * dev)
        return led.as_summary(float(np.sum(self.table.generated)) if self.table is not None else 0.0)

    def _executed_parts(self, p, ex):
        """The per-iteration breakdown of what the timeline executed (seconds, all layers)."""
        base = p["base"]
        return {"base_s": base, "lora_s": max(0.0, ex.lora_s - base), "attention_s": ex.attention_s,
                "prefill_attention_s": p["prefill_att"], "host_s": ex.busy_s["host"],
                "link_busy_s": max(ex.busy_s["link out"], ex.busy_s["link in"])}

    def _note_estimate(self, est, executed, k=1):
        """Record how far the cost model's estimate of an iteration was from what the timeline executed."""
        if executed > 0:
            self._est_err.append((est / executed - 1.0, k))

    def price(self, batch, now):
        p = self._price_parts(batch)
        kv_after = batch.kv_after[~batch.prefill]
        att = self._attention(p["dec_req"], kv_after)
        r = self._assemble(p, att, self.pending_load)            # Algorithm 1's estimate (VI-B)
        ex = self._execute(p, kv_after, self.dup[p["dec_req"]], self.pending_load, att=att)
        dur = ex.duration_s
        self._note_estimate(r.duration_s, dur)
        self.pending_load = 0.0
        self.prefetch_budget = max(0.0, dur - ex.busy_s["link in"]) * self.cost.link.W
        rec, dupf, cached, kvd = self._record(r, kv_after, p["dec_req"])
        rec["estimate_s"] = r.duration_s
        self._account(dur, dupf, cached, kvd, r.strategy_n)
        self._pending_busy = {lane: np.array([b], float) for lane, b in ex.busy_s.items()}
        return IterationResult(dur, breakdown=self._executed_parts(p, ex), spans=ex.spans, record=rec)

    def price_decode_run(self, batch, max_iters, now):
        p = self._price_parts(batch)
        kv_after = batch.kv_after
        dec = p["dec_req"]
        k = int(max_iters)
        # decode attention grows smoothly (near linearly) with the contexts: execute the stretch's first and last
        # iterations on the timeline, interpolate between them
        pts = np.unique(np.array([0, k - 1], np.int64))
        # the duplicated prefixes grow within the stretch as they would iteration by iteration
        dups = {0: self.dup[dec], k - 1: self._dup_grown(dec, kv_after + (k - 1))}
        rs, exs, atts = [], [], []
        for o in pts:
            o = int(o)
            atts.append(self._attention(dec, kv_after, o, dups[o]))
            rs.append(self._assemble(p, atts[-1], 0.0))
            exs.append(self._execute(p, kv_after + o, dups[o], 0.0, spans=o == 0, att=atts[-1]))
        self._end_dup = (dec, dups[k - 1])
        it = np.arange(k)
        durs = np.interp(it, pts, [e.duration_s for e in exs])
        est = np.interp(it, pts, [r.duration_s for r in rs])
        ests = [r.duration_s for r in rs]
        if self.pending_load > 0:
            # the adapter loads pending at the stretch's start ride on its first iteration only
            rs[0] = self._assemble(p, atts[0], self.pending_load)
            exs[0] = self._execute(p, kv_after, dups[0], self.pending_load, att=atts[0])
            durs[0], est[0], ests[0] = exs[0].duration_s, rs[0].duration_s, rs[0].duration_s
        for j in range(len(pts)):
            # each executed end point stands for half the stretch (all of it when k == 1)
            self._note_estimate(ests[j], exs[j].duration_s, k / len(pts))
        r0 = rs[0]
        self.pending_load = 0.0
        idle = np.maximum(0.0, durs - np.interp(it, pts, [e.busy_s["link in"] for e in exs]))
        # what the next iteration's idle link-in time can carry: the stretch's last iteration's idle time (as a
        # step-by-step run would have it), not the whole stretch's
        self.prefetch_budget = float(idle[-1]) * self.cost.link.W
        rec, dupf, cached, kvd = self._record(r0, kv_after, dec)
        self._account(float(durs.sum()), dupf, cached, kvd, r0.strategy_n, k)
        # per iteration and lane, the busy seconds executed (accounted in on_iteration_end for the iterations the
        # engine kept: it cuts a stretch at the next arrival)
        self._pending_busy = {lane: np.interp(it, pts, [e.busy_s[lane] for e in exs]) for lane in exs[0].busy_s}
        pe = [self._executed_parts(p, e) for e in exs]
        parts = {n: np.interp(it, pts, [x[n] for x in pe]) for n in pe[0]}
        records = {n: np.full(k, v) for n, v in rec.items()}
        records["estimate_s"] = est
        # the trace: the first iteration's lanes as executed, then one span per lane for the rest of the stretch
        spans = list(exs[0].spans)
        if k > 1:
            d0 = exs[0].duration_s
            rest = float(durs[1:].sum())
            for lane, b in exs[-1].busy_s.items():
                if b > 0:
                    spans.append(Span(lane, f"decode x{k - 1}", d0, rest * min(1.0, b / exs[-1].duration_s),
                                      {"busy_fraction": b / exs[-1].duration_s}))
        return RunResult(durs, breakdown=parts, spans=spans, record=records)

    def on_iteration_end(self, batch, result, now):
        k = 1 if isinstance(result, IterationResult) else len(result.durations_s)
        from host.energy import keep_busy
        keep_busy(self.lane_busy, self._pending_busy, self.span_s,
                  [result.duration_s] if k == 1 and isinstance(result, IterationResult) else result.durations_s, now)
        self._pending_busy = None
        self.temp.step(k)
        if k > 1 and self._end_dup is not None:
            dec, dup = self._end_dup
            if len(dup) == len(dec):
                self.dup[dec] = dup
                self.state.kv_dup_tokens = float(self.dup.sum())
            self._end_dup = None

    # --- outputs -----------------------------------------------------------------------------------------
    def config(self):
        return {**super().config(), "variant": self.variant.describe(), "model": self.model.name,
                "gpu": self.gpu.name, "n_dev": self.n_dev, "device": vars(self.device).copy(),
                "link": {"name": self.link.name, "bw_gbps": self.link.bw_gbps, "rtt_ns": self.link.rtt_ns},
                "ndp_model": getattr(self.ndp, "kind", type(self.ndp).__name__),
                "ndp_geometry": getattr(self.ndp, "geometry", ""),
                "ndp_kernel_table": getattr(self.ndp, "table_status", "none"), "kv_bits": self.kv_bits,
                "seed": self.seed, "workspace_fraction": WORKSPACE_FRACTION,
                "lora_waves_per_layer": self.cost.waves}

    def summary(self):
        a, T = self.acc, max(self.acc["t"], 1e-30)
        gb = lambda x: x / 1e9
        return {
            "kv_dup_fraction": a["dup_w"] / T,
            "gpu_mem_gb": {"weights": gb(self.weights_bytes), "workspace": gb(self.workspace_bytes),
                           "adapters": gb(a["adapters"] / T), "kv_dup": gb(a["kv_dup"] / T), "kv": 0.0},
            "gpu_mem_gb_peak": {"adapters": gb(self.peak["adapters"]), "kv_dup": gb(self.peak["kv_dup"])},
            "strategy_counts": {"decisions": dict(self.decisions), "paths": dict(self.paths),
                                "evictions": dict(self.evictions), "precached": self.precached,
                                "adapter_iterations": {s: float(self.adapter_iters[j])
                                                       for j, s in enumerate(STRATEGIES)}},
            "pool_gb": {"adapters": gb(self.store_bytes), "kv_peak": gb(self.kv.peak_tokens * self.cost.kv_tok),
                        "capacity": gb(self.n_dev * self.device.capacity_bytes)},
            "ndp_model": getattr(self.ndp, "kind", type(self.ndp).__name__),
            "ndp_geometry": getattr(self.ndp, "geometry", ""),
            "cost_model_err": self.cost_model_err(),
            **self.energy(),
        }

    def cost_model_err(self) -> dict:
        """How far Algorithm 1's estimate (the VI-B cost model) was from the executed timeline, over the
        iterations (weighted; relative error ``estimate / executed - 1``): ``mean`` (signed), ``mean_abs``,
        ``p99_abs`` and ``max_abs``."""
        if not self._est_err:
            return estimate_error(np.zeros(0), np.zeros(0))
        return estimate_error(np.array([x for x, _ in self._est_err]), np.array([k for _, k in self._est_err], float))


def estimate_error(e: np.ndarray, wt: np.ndarray) -> dict:
    """``cost_model_err`` of relative errors ``e`` (``estimate / executed - 1``) with weights ``wt`` (iterations):
    ``mean`` (signed), ``mean_abs``, ``p99_abs``, ``max_abs`` and ``iterations``."""
    if not len(e):
        return {"mean": 0.0, "mean_abs": 0.0, "p99_abs": 0.0, "max_abs": 0.0, "iterations": 0}
    a = np.abs(e)
    order = np.argsort(a)
    cw = np.cumsum(wt[order]) / wt.sum()
    p99 = float(a[order][min(np.searchsorted(cw, 0.99), len(a) - 1)])
    return {"mean": float(np.average(e, weights=wt)), "mean_abs": float(np.average(a, weights=wt)),
            "p99_abs": p99, "max_abs": float(a.max()), "iterations": float(wt.sum())}


class _TempView:
    """``state.temperature`` as a mapping id -> temperature over the metric (no copy)."""

    __slots__ = ("temp",)

    def __init__(self, temp):
        self.temp = temp

    def get(self, k, default=0.0):
        t = self.temp.t
        return float(t[k]) if 0 <= k < len(t) else default
