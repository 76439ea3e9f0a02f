"""The hybrid serving system of the end-to-end run: PLoRA's CXL NDP devices and L3's DIMM-PIM in one system on the
serving engine (:mod:`host.serving`), computing every token of the tiny model through the device backends.

**Where things live.** The GPU (numpy, :mod:`host.e2e.ops`) holds the base weights, the adapter caches the
memory manager chose (P1: A and B, P3: B) and the duplicated KV prefixes. ``n_dev`` CXL NDP devices hold every
adapter (adapter ``a`` on device ``a mod n_dev``, PLoRA's placement: :meth:`host.plora.cost.CostModel.device_of`)
and the KV of the *short* requests, token-interleaved (token ``t`` on device ``t mod n_dev``); the DIMM-PIM rank
holds the KV of the *long* requests (final context >= ``pim_min_context``), whose decode attention it computes.

**Decisions: the Llama-scale code, called, not copied** (issue 32; tests/host/e2e/test_e2e_hybrid_shared_code.py).
The hybrid's own decisions (KV placement, Algorithm 1 every step, the sub-batches) are
:mod:`host.hybrid.decisions`, which the LLaMA-scale hybrid (:mod:`host.hybrid.system`) calls too (issue 34).

* PLoRA's memory manager is the PLoRA system itself (:class:`host.plora.system.PLoRASystem`, variant ``plora``,
  as ``self.mem``) on the tiny model, the e2e device's calibrated NDP model (:class:`host.e2e.perf.NDPTiming`), the
  run's adapter ranks and ``budget_bytes`` of HBM for adapter caches and KV duplicates: its admission (Algorithm 1
  of :mod:`host.plora.manager` over the cost model of :mod:`host.plora.cost`, with the prompt's duplicated KV
  fraction decided with the adapter), its KV-duplicate bookkeeping (dropped duplicates, growth, refresh),
  ``on_finish``, its temperature metric and its pre-caching of the hottest idle adapters (the link time it may
  use: what the iteration left idle on the device-to-GPU direction), its counters (a fallback counted as such) and
  its prompt rule (prefill tokens use the fastest strategy the adapter's caching level allows). The long requests'
  KV lives in the host's DIMMs: the manager manages their adapters but leaves their KV out of its own
  (:meth:`~host.plora.system.PLoRASystem.keep_kv_elsewhere`). One addition, ``select_every_step`` (default on):
  before every iteration :meth:`~host.plora.system.PLoRASystem.decide` runs again for every serving adapter at its
  batch (the adapter's batch and the HBM taken by KV duplicates change; PLoRA decides at admission only).
* The L3 scheduler (:func:`host.l3.scheduler.schedule`) forms the two sub-batches of every iteration (balanced
  split by context, with the PIM / NDP residence as the requests' class; prefills added by the stop rule, the
  last one chunked to a multiple of 16), with L3's predictors (:class:`host.l3.predictors.L3Predictors`) seeded by
  a start-up profile and trained online on L3's targets (:func:`host.l3.predictors.profiled_sub_batch`): RFR_p on
  each prefill's attention time, RFR_batch on the rest of the sub-batch's T_GPU, so that their sum predicts T_GPU
  (eq. 6). Design choice: the predictors learn from the *performance model's* times of each iteration on every
  backend, so the ``rtl``, ``golden`` and ``perf`` runs make the same decisions and are comparable iteration by
  iteration (the charged times are each backend's own).

**One iteration** (:meth:`HybridSystem.price`): every layer runs five stages, each a wave of device jobs per NDP
device (both sub-batches' jobs in one run, sub-batch 0 first; each sub-batch is charged the device cycles its
descriptors occupied, from the cycle stamps) beside the GPU's share: ``qkv`` (Q/K/V projections and their LoRA),
``attn`` (decode attention: the devices' shares of the short requests' KV merged with the GPU's share -- the
duplicated prefix and the tail that does not fill a whole beat of 8 tokens on a device -- by
:func:`sim.golden.attention.merge_partials`; the long requests' heads on the PIM rank; prefills on the GPU), ``o``,
``ffn_in`` (gate and up) and ``down``. A stage lasts ``max(GPU, L_link + max(device, link))`` per device
(PLoRA VI-B's form); a sub-batch's GPU side ``T_GPU_i`` is the sum of its stages, its PIM side ``T_PIM_i`` the
rank's cycles for its heads plus the PCIe transfers (Q/K/V in, outputs back, the other sub-batch's prefill KV
offload: L3 eq. 4), and the iteration lasts ``max(T_GPU_0, T_PIM_1) + max(T_GPU_1, T_PIM_0)`` (L3 5.2) plus the
embedding and LM head, at least as long as the CXL links are busy (adapter loads included). GPU operator times
come from the calibrated GPU model (:mod:`host.gpu`, an H100); links from :mod:`host.link` (CXL 3.1 to the NDP
devices, PCIe 5.0 x16 to the host's DIMMs).
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from host.serving import System, Batch, IterationResult, Span
from host.serving.request import RUNNING
from sim.golden.attention import merge_partials, prepare_query, to_fp16_bits
from host.plora.lora import E1, E2, E3, E4, STRATEGIES
from host.plora.system import PLoRASystem
from host.l3.scheduler import ridge_tokens
from host.l3.predictors import L3Predictors, ProfiledBatches, profiled_sub_batch
from host.hybrid import decisions as hd
from host.hybrid.decisions import PIM, NDP

from . import ops
from .model import llm_config
from .ndp import NDPJob
from .pim import PIMJob

__all__ = ["HybridSystem", "STAGES", "StepRecord"]

STAGES = ("qkv", "attn", "o", "ffn_in", "down")
_STAGE_MATS = {"qkv": ("q", "k", "v"), "o": ("o",), "ffn_in": ("gate", "up"), "down": ("down",)}
# PIM, NDP: the residence classes (the L3 scheduler's decode_class), host.hybrid.decisions'


class _Req:
    """One request's functional state: its tokens, its KV (per layer, FP16 bits), residence, duplicated prefix."""

    def __init__(self, idx, rid, adapter, prompt, out_tokens, cfg, place):
        self.idx, self.rid, self.adapter = idx, rid, adapter
        self.tokens = [int(t) for t in prompt]
        self.prompt_len = len(prompt)
        self.place = place
        n = len(prompt) + out_tokens
        self.K = [np.zeros((n, cfg.hidden), np.uint16) for _ in range(cfg.n_layers)]
        self.V = [np.zeros((n, cfg.hidden), np.uint16) for _ in range(cfg.n_layers)]
        self.n_kv = 0
        self.logits = []              # float32 rows, one per emitted token
        self.slot0 = None             # first PIM slot (long requests)


@dataclass
class StepRecord:
    """One iteration of the demo's per-step table."""
    iteration: int
    start_s: float
    duration_s: float
    sub_batches: list                  # per sub-batch: [(request id, "P<tokens>" or "D")]
    strategies: dict                   # adapter -> strategy name
    ndp_cycles: list                   # per device
    ndp_pred_cycles: list
    pim_cycles: int
    pim_pred_cycles: int
    cxl_bytes: list                    # per device: (out, in)
    pcie_bytes: tuple
    gpu_busy_s: float
    ndp_busy_s: list
    pim_busy_s: float
    t_gpu: list
    t_pim: list
    extra: dict = field(default_factory=dict)


class HybridSystem(System):
    """The hybrid system (module docstring). ``ndp``: :class:`host.e2e.ndp.NDPDevices`; ``pim``:
    :class:`host.e2e.pim.PIMDevice`; ``ndp_timing``: the calibrated NDP model (cost model, predictors);
    ``pim_model``: the calibrated :class:`sim.perf.pim.PIMPerfModel`; ``prompts``: request id -> token ids."""

    name = "hybrid"

    def __init__(self, *, weights, adapters, prompts, ndp, pim, ndp_timing, pim_model, budget_bytes: float,
                 pim_min_context: int = 1024, gpu: str = "h100", link: str = "cxl3.1", host_link: str = "pcie5-x16",
                 seed: int = 0, min_gpu_tokens: int | None = None, parallel: bool = True,
                 select_every_step: bool = True):
        super().__init__(None)
        from host.gpu import get_gpu_model
        from host.link import get_link
        from host.models.hardware import GPUS
        self.w, self.adapters, self.prompts = weights, list(adapters), dict(prompts)
        self.cfg = weights.config
        self.ndp, self.pim, self.ndp_timing, self.pim_model = ndp, pim, ndp_timing, pim_model
        self.n_dev = ndp.n
        self.model = llm_config(self.cfg)
        self.gpu_cfg = GPUS[gpu]
        self.gpu = get_gpu_model(gpu)
        self.link, self.host_link = get_link(link), get_link(host_link)
        self.budget_bytes = float(budget_bytes)
        self.pim_min_context = int(pim_min_context)
        self.seed = seed
        # L3's token floor (host.l3.scheduler): the roofline ridge of the GPU, the lower of its two documented
        # choices (the efficiency knee of a model this small is beyond any batch it runs)
        self.min_gpu_tokens = ridge_tokens(self.gpu_cfg.fp16_tflops, self.gpu_cfg.hbm_bw_gbps) \
            if min_gpu_tokens is None else int(min_gpu_tokens)
        self.parallel = parallel
        self.select_every_step = select_every_step
        self.ranks = np.array([ad.rank for ad in self.adapters], np.int64)
        # PLoRA's memory manager: the PLoRA system itself (its admission, Algorithm 1, KV duplicates, temperature
        # and pre-caching; module docstring), on the tiny model, the e2e NDP timing and the run's HBM budget
        self.mem = PLoRASystem(self.model, "plora", gpu=self.gpu_cfg, gpu_model=self.gpu, link=self.link,
                               n_dev=self.n_dev, ndp=ndp_timing, seed=seed, ranks=self.ranks,
                               hbm_budget_bytes=self.budget_bytes)
        self.shape, self.cost = self.mem.shape, self.mem.cost
        self.t0_gpu = float(self.gpu.gemm(1, 8, 8).calibrated_s)      # one kernel's fixed cost (the fitted t0)
        self._pool = ThreadPoolExecutor(max_workers=2) if parallel and ndp.backend == "rtl" else None
        self._pim_pool = ThreadPoolExecutor(max_workers=1) if parallel and pim.backend == "rtl" else None

    # ---- run set-up --------------------------------------------------------------------------------------
    def bind(self, table):
        super().bind(table)
        cfg = self.cfg
        self.reqs = []
        pim_slots = 0
        for i in range(table.n):
            rid = int(table.id[i])
            prompt = self.prompts[rid]
            if len(prompt) != int(table.prompt_tokens[i]):
                raise ValueError(f"request {rid}: prompt of {len(prompt)} tokens, the table says "
                                 f"{int(table.prompt_tokens[i])}")
            a = int(table.adapter_id[i])
            if not 0 <= a < len(self.adapters):
                raise ValueError(f"request {rid}: adapter {a} outside the {len(self.adapters)} adapters")
            final = len(prompt) + int(table.output_tokens[i])
            # the shared placement rule (host.hybrid.decisions.place_kv) by context length: every request is
            # placed up front, before any load exists
            place = hd.place_kv(final, pim_min_context=self.pim_min_context)
            r = _Req(i, rid, a, prompt, int(table.output_tokens[i]), cfg, place)
            if place == PIM:
                r.slot0 = pim_slots
                pim_slots += cfg.n_layers * cfg.n_heads
            self.reqs.append(r)
        if pim_slots > self.pim.slots:
            raise ValueError(f"{pim_slots} PIM head slots needed, the rank was laid out for {self.pim.slots}")
        self.mem.bind(table)
        self.mem.keep_kv_elsewhere([r.idx for r in self.reqs if r.place == PIM])
        self.steps: list = []
        self.wave_log: list = []       # (iteration, layer, stage, device, rtl cycles, model cycles)
        self.descriptor_log: list = []  # (iteration, layer, stage, device, job, op, issue, start, done) cycles
        self.pim_log: list = []        # (iteration, layer, sub-batch, rtl cycles, model cycles, heads)
        self.pred = L3Predictors(seed=self.seed, n_estimators=4, max_depth=6)
        self.pred.seed(self._startup_profile())
        self._it = 0
        self.captured = None           # (iteration, layer, stage, jobs per device) of the waveform's wave
        self.busy = {"gpu": 0.0, "ndp": np.zeros(self.n_dev), "pim": 0.0, "time": 0.0}
        #: the run's device energy (pJ, host.e2e.energy) and link bytes, for summary.json's energy_j
        self.energy_pj = {"ndp": 0.0, "ndp_dram": 0.0, "pim": 0.0, "pim_dram": 0.0}
        self.energy_src = {"ndp": None, "pim": None}
        self.link_bytes = {"cxl": 0.0, "pcie": 0.0}

    # ---- memory and strategies (PLoRA): the PLoRA system's own code (module docstring) ------------------------
    def can_admit(self, idx, now):
        return self.mem.can_admit(idx, now)

    def admission_error(self, idx):
        return self.mem.admission_error(idx)

    def on_admit(self, idx, now):
        self.mem.on_admit(idx, now)

    def on_finish(self, idx, now):
        self.mem.on_finish(idx, now)

    def on_preempt(self, idx, now):
        self.mem.on_preempt(idx, now)

    def _remaining(self, a):
        t = self.table
        rem = [int(t.output_tokens[r.idx] - t.generated[r.idx]) for r in self.reqs
               if r.adapter == a and t.state[r.idx] == RUNNING]
        return max(1.0, float(max(rem))) if rem else 1.0

    def before_batch(self, view, now):
        self.mem.before_batch(view, now)
        if self.select_every_step:              # Algorithm 1 again for every serving adapter, at its batch
            hd.reselect_serving(self.mem, self._remaining)

    def _strategy(self, a, prefill_tokens=0):
        """Decode strategy of adapter ``a`` (the manager's; E3 while it has none), or for ``prefill_tokens``
        prompt tokens the fastest its caching level allows (PLoRA's rule for prompts: no new caching), as the PLoRA
        system prices them."""
        if not prefill_tokens:
            return int(self.mem._strategies_of(np.array([a]))[0])
        return int(self.mem.prefill_strategy(int(a), int(prefill_tokens))[0])

    # ---- the batch (L3) ----------------------------------------------------------------------------------------
    def form_batch(self, view, now):
        # L3's scheduler over the residence classes: the shared code (host.hybrid.decisions.form_sub_batches)
        return hd.form_sub_batches(
            self.table, view, self.pred, offered=list(view.waiting), min_gpu_tokens=self.min_gpu_tokens,
            decode_class=lambda dec: hd.sched_classes([self.reqs[i].place for i in dec.tolist()]))

    # ---- the price: the functional iteration and its time ------------------------------------------------
    def price(self, batch, now):
        it = _Iteration(self, batch)
        it.run()
        res = it.compose()
        self._learn(batch, it)
        self._it += 1
        return res

    def on_iteration_end(self, batch, result, now):
        self.mem.on_iteration_end(batch, result, now)

    def price_decode_run(self, batch, max_iters, now):
        return None                              # every iteration computes its tokens

    # ---- the model's parts of an iteration's time (compose, the start-up profile) -------------------------
    def _base_stages(self, prefill_q, prefill_kv, n_decodes: int, logits_tokens: int):
        """The base model's GPU time per layer of each stage (:data:`STAGES` order; the attention stage's own
        work is charged apart) for a sub-batch of prefill chunks ``prefill_q`` over ``prefill_kv`` tokens and
        ``n_decodes`` decodes, and the embedding, final norm and LM head of all layers, from the calibrated GPU
        model: ``(per-stage array, head seconds)``."""
        nl = self.cfg.n_layers
        ti = self.gpu.iteration(self.model, tp=1, prefill_q=list(prefill_q), prefill_kv=list(prefill_kv),
                                decode_requests=int(n_decodes), decode_kv_tokens=0, logits_tokens=int(logits_tokens))
        o = {k: float(np.sum(v)) / nl for k, v in ti.ops.items()}
        base = np.array([o.get("attn_pre_proj", 0) + o.get("input_layernorm", 0) + o.get("attn_rope", 0),
                         0.0,
                         o.get("attn_post_proj", 0) + o.get("add", 0) / 2,
                         o.get("mlp_up_proj", 0) + o.get("post_attention_layernorm", 0) + o.get("mlp_act", 0),
                         o.get("mlp_down_proj", 0) + o.get("add", 0) / 2])
        return base, nl * (o.get("emb", 0) + o.get("final_norm", 0) + o.get("lm_head", 0))

    def _prefill_attention_s(self, n: int, L: int) -> float:
        """One layer's GPU attention of a prefill chunk of ``n`` tokens ending at ``L`` (roofline of its causal
        FLOPs and its Q/K/V/output bytes)."""
        cfg, g = self.cfg, self.cost.gpu
        fl = 4.0 * cfg.n_heads * cfg.head_dim * n * (L - (n - 1) / 2)
        return max(fl / g.F, (4.0 * n * cfg.hidden + 2.0 * L * cfg.hidden) / g.W_hbm)

    # ---- predictors (L3) ---------------------------------------------------------------------------------
    def _estimate(self, ctx, cls, chunks, done, other_chunks):
        """The performance model's times of one sub-batch for the start-up profile: decodes with contexts
        ``ctx`` and classes ``cls``, prefill ``chunks`` over ``done`` tokens, the other sub-batch's prefill
        ``other_chunks``. Returns ``(T_GPU, T_PIM, each prefill's attention time)`` (all layers), priced as
        :meth:`_Iteration.compose` prices an iteration with what is known before any adapter has a strategy:
        per layer and stage ``max(GPU, L_link + device side)``; the GPU's share is the base model of every token
        (:meth:`_base_stages`: prefills and decodes) with the prefills' attention (:meth:`_prefill_attention_s`) in
        the attention stage; a LoRA stage's work is its share of every request's adapter's (one adapter per request,
        at the adapters' median rank, alternating over the devices: the demo's workload): a prefill's the faster
        of E2 and E3 (the strategies of an adapter with nothing cached, PLoRA's prompt rule:
        :meth:`host.plora.cost.CostModel.prefill_choice`), a decode's E3; its GPU roofline on the GPU, each
        device's device or link time, whichever is longer, on the device side; the attention stage's is the cost model's
        distributed attention of the NDP-resident decodes (nothing duplicated). T_PIM as compose: the rank's
        modelled cycles of every PIM-resident head plus the PCIe round trip and transfers (the other sub-batch's
        prefill KV offloaded meanwhile)."""
        cfg, cost = self.cfg, self.cost
        nl, h, f = cfg.n_layers, cfg.hidden, cfg.ffn
        Lk, W = self.link.rtt_ns * 1e-9, self.link.bw_gbps * 1e9
        chunks, done = np.asarray(chunks, np.int64), np.asarray(done, np.int64)
        ctx, cls = np.asarray(ctx, np.int64), np.asarray(cls)
        nd = len(ctx)
        tp = np.array([self._prefill_attention_s(int(c), int(c + d)) for c, d in zip(chunks, done)])
        g = 0.0
        tokens = int(chunks.sum()) + nd
        if tokens:
            base, _ = self._base_stages(chunks, chunks + done, nd, nd)
            gpu = base.copy()
            gpu[STAGES.index("attn")] += float(tp.sum())
            side = np.zeros(len(STAGES))
            rank = int(np.median(self.ranks))
            rows = np.zeros((self.n_dev, 7))
            for k, n in enumerate([int(c) for c in chunks] + [1] * nd):
                rows[k % self.n_dev] += cost.prefill_choice(rank, n, (E2, E3))[1] if k < len(chunks) else \
                    cost.terms(rank, 1)[E3]
            tot = rows.sum(axis=0)
            dev_side = float(np.max(np.maximum(rows[:, 2], np.maximum(rows[:, 0], rows[:, 1]) / W)))
            size = {"qkv": 6 * h, "o": 2 * h, "ffn_in": 2 * (h + f), "down": h + f}
            for st, w in size.items():
                share = w / sum(size.values())
                gpu[STAGES.index(st)] += share * max(tot[3] / cost.gpu.W_hbm, tot[4] / cost.gpu.F)
                side[STAGES.index(st)] = Lk + share * dev_side
            ndp_ctx = ctx[cls == NDP]
            if len(ndp_ctx):
                side[STAGES.index("attn")] = Lk + cost.attention(ndp_ctx + 1,
                                                                 np.zeros(len(ndp_ctx), np.int64)).total_s
            g = nl * float(np.maximum(gpu, side).sum())
        pim_L = [int(c) + 1 for c, k in zip(ctx, cls) if k == PIM]
        kvb = cfg.kv_bytes_per_token_layer
        out_b = 3 * h * 2 * len(pim_L) + float(np.sum(other_chunks)) * kvb
        in_b = h * 2 * len(pim_L)
        p = 0.0
        if pim_L:
            p += self._pim_run_cycles([L for L in pim_L for _ in range(cfg.n_heads)]) * self.pim_model.tm.tck_ps * 1e-12
        if out_b or in_b:
            p += self.host_link.rtt_ns * 1e-9 + max(out_b, in_b) / (self.host_link.bw_gbps * 1e9)
        return g, nl * p, nl * tp

    def _pim_run_cycles(self, Ls):
        from .pim import run_cycles_model
        return run_cycles_model(self.pim_model, [min(int(L), self.pim.max_tokens) for L in Ls])

    def _startup_profile(self, n=48):
        """Random sub-batches of the run's sizes priced by :meth:`_estimate`, the predictors' seed (L3's
        start-up profile); the targets are L3's (:func:`host.l3.predictors.profiled_sub_batch`)."""
        rng = np.random.default_rng(self.seed + 7919)
        parts = []
        for _ in range(n):
            nd = int(rng.integers(0, 6))
            ctx = rng.integers(16, max(32, self.pim.max_tokens), nd)
            cls = np.where(ctx >= self.pim_min_context, PIM, NDP)
            npre = int(rng.integers(0, 3))
            c = rng.integers(1, 32, npre) * 16
            f = np.where(rng.random(npre) < 0.5, 0, rng.integers(0, 512, npre))
            oc = rng.integers(1, 32, int(rng.integers(0, 2))) * 16
            g, p, tp = self._estimate(ctx, cls, c, f, oc)
            parts.append(profiled_sub_batch(sum_fd=float(np.sum(ctx)), n_d=nd, sum_cp_other=float(np.sum(oc)),
                                            t_pim=p, chunks=c, done=f, t_p_each=tp, t_fc=g - float(tp.sum()),
                                            t_gpu=g))
        return ProfiledBatches.concat(parts)

    def _learn(self, batch, it):
        """Profile both sub-batches with the model's times (module docstring) for the predictors: L3's targets
        (:func:`host.l3.predictors.profiled_sub_batch`), RFR_p each prefill's attention time, RFR_batch the rest
        of the sub-batch's T_GPU."""
        parts = []
        sb = batch.sub_batch if batch.sub_batch is not None else np.zeros(len(batch), np.int8)
        for i in (0, 1):
            d = ~batch.prefill & (sb == i)
            p = batch.prefill & (sb == i)
            po = batch.prefill & (sb == 1 - i)
            nd = int(d.sum())
            if not nd and not p.any():
                continue
            # the sub-batch's prefill entries, in the batch's order (as batch.new_tokens[p])
            tp = np.array([e.get("att_s", 0.0) for e in it.entries if e["sb"] == i and e["pre"]])
            g, pm = float(it.model_t_gpu[i]), float(it.model_t_pim[i])
            parts.append(profiled_sub_batch(sum_fd=float(batch.context[d].sum()), n_d=nd,
                                            sum_cp_other=float(batch.new_tokens[po].sum()), t_pim=pm,
                                            chunks=batch.new_tokens[p], done=batch.context[p], t_p_each=tp,
                                            t_fc=g - float(tp.sum()), t_gpu=g))
        if parts:
            self.pred.observe(ProfiledBatches.concat(parts))

    # ---- outputs -----------------------------------------------------------------------------------------
    def config(self):
        return {**super().config(), "model": self.model.name, "gpu": self.gpu_cfg.name, "n_dev": self.n_dev,
                "link": {"name": self.link.name, "bw_gbps": self.link.bw_gbps, "rtt_ns": self.link.rtt_ns},
                "host_link": {"name": self.host_link.name, "bw_gbps": self.host_link.bw_gbps,
                              "rtt_ns": self.host_link.rtt_ns},
                "budget_bytes": self.budget_bytes, "pim_min_context": self.pim_min_context,
                "ndp_backend": self.ndp.backend, "pim_backend": self.pim.backend, "ndp_config": self.ndp.config.name,
                "pim_config": self.pim.config.name, "select_every_step": self.select_every_step}

    def summary(self):
        b = self.busy
        T = max(b["time"], 1e-30)
        m = self.mem
        return {"strategy_counts": {"decisions": dict(m.decisions), "paths": dict(m.paths),
                                    "evictions": dict(m.evictions), "precached": m.precached},
                "gpu_busy_frac": b["gpu"] / T, "pim_busy_frac": b["pim"] / T,
                "ndp_busy_frac": (b["ndp"] / T).tolist(),
                "residence": {str(r.rid): ("pim" if r.place == PIM else "ndp") for r in self.reqs},
                **self.energy()}

    def energy(self) -> dict:
        """``energy_j`` / ``energy_per_token_mj`` (host/energy.py; docs/energy.md "Energy in runs"): the GPU board
        over the run with its busy seconds; the CXL links' and the PCIe link's bytes (the PIM's also over a DDR4
        channel); the NDP devices' and the PIM rank's energy of the work they ran (host.e2e.energy: from the RTL's
        traces on ``rtl``, from the fast models on ``perf``), their logic to ``ndp`` / ``pim`` and their memories
        to ``dram``. ``energy_sources`` says which."""
        from host.energy import EnergyLedger
        b, e = self.busy, self.energy_pj
        led = EnergyLedger()
        led.add_gpu(self.gpu_cfg.name, 1, b["time"], b["gpu"])
        led.add_link(self.link.name, 8.0 * self.link_bytes["cxl"])
        led.add_link(self.host_link.name, 8.0 * self.link_bytes["pcie"])
        led.add_link("ddr4", 8.0 * self.link_bytes["pcie"])
        led.add("ndp", e["ndp"] * 1e-12)
        led.add("pim", e["pim"] * 1e-12)
        led.add("dram", (e["ndp_dram"] + e["pim_dram"]) * 1e-12)
        out = led.as_summary(float(np.sum(self.table.generated)) if self.table is not None else 0.0)
        out["energy_sources"] = dict(self.energy_src)
        return out


class _Iteration:
    """One iteration's functional pass and its timing (see :class:`HybridSystem`)."""

    def __init__(self, sys_: HybridSystem, batch):
        self.s, self.b = sys_, batch
        cfg = sys_.cfg
        n = len(batch)
        sb = batch.sub_batch if batch.sub_batch is not None else np.zeros(n, np.int8)
        self.order = sorted(range(n), key=lambda j: (int(sb[j]), j))        # sub-batch 0's rows first
        self.sb = sb
        rows, start = [], 0
        self.entries = []
        for j in self.order:
            r = sys_.reqs[int(batch.req[j])]
            nt, ctx, pre = int(batch.new_tokens[j]), int(batch.context[j]), bool(batch.prefill[j])
            toks = r.tokens[ctx:ctx + nt] if pre else [r.tokens[-1]]
            self.entries.append(dict(j=j, r=r, n=nt, ctx=ctx, pre=pre, sb=int(sb[j]), lo=start, hi=start + nt,
                                     toks=toks, emit=(not pre) or bool(batch.completes_prefill[j])))
            start += nt
        self.M = start
        L, S, D = cfg.n_layers, len(STAGES), sys_.n_dev
        z = lambda: np.zeros((2, L, S, D))  # noqa: E731
        self.dev_cyc, self.dev_pred, self.cxl_out, self.cxl_in = z(), z(), z(), z()
        self.gpu_extra = np.zeros((2, L, S))          # GPU LoRA / attention-partial work beyond the base model
        self.pim_cyc = np.zeros((2, L))
        self.pim_pred = np.zeros((2, L))
        self.pcie = np.zeros((2, L, 2))
        self.strat = {}

    # ---- device calls ----------------------------------------------------------------------------------
    def _waves(self, layer, stage, jobs_by_dev):
        s = self.s
        if getattr(s, "capture", False) and s.captured is None and self.b.is_decode_only and layer == 0 \
                and stage == "o":
            s.captured = (s._it, layer, stage, [list(j) for j in jobs_by_dev])
        devs = [d for d in range(s.n_dev) if jobs_by_dev[d]]
        if s._pool is not None and len(devs) > 1:
            res = list(s._pool.map(lambda d: s.ndp.run_wave(d, jobs_by_dev[d]), devs))
        else:
            res = [s.ndp.run_wave(d, jobs_by_dev[d]) for d in devs]
        si = STAGES.index(stage)
        out = {}
        for d, w in zip(devs, res):
            out.update(w.outputs)
            s.wave_log.append((s._it, layer, stage, d, w.cycles, w.pred_cycles))
            if w.energy:
                s.energy_pj["ndp"] += w.energy["logic"]
                s.energy_pj["ndp_dram"] += w.energy["dram"]
                s.energy_src["ndp"] = w.energy["source"]
            for st in w.stamps:
                s.descriptor_log.append((s._it, layer, stage, d, st.job, st.op, st.issue, st.start, st.done))
            for key in w.job_cycles:
                i = key[-1]                           # every job key ends with its sub-batch
                self.dev_cyc[i, layer, si, d] += w.job_cycles[key]
                self.dev_pred[i, layer, si, d] += w.job_pred.get(key, w.job_cycles[key])
                o, n = w.job_link[key]
                self.cxl_out[i, layer, si, d] += o
                self.cxl_in[i, layer, si, d] += n
        return out

    def _gpu_lora(self, layer, stage, sub, rows, d_in, d_out, r):
        """Roofline of the GPU's part of a LoRA job (PLoRA's terms), charged to the stage."""
        cost = self.s.cost
        flops = 2.0 * rows * r * (d_in + d_out)
        nbytes = 2.0 * (r * (d_in + d_out) + rows * (d_in + d_out + r))
        self.gpu_extra[sub, layer, STAGES.index(stage)] += max(nbytes / cost.gpu.W_hbm, flops / cost.gpu.F)

    # ---- the forward pass ------------------------------------------------------------------------------
    def run(self):
        s, cfg, W = self.s, self.s.cfg, self.s.w
        X = np.concatenate([ops.embed(W.embed, e["toks"]) for e in self.entries]) if self.entries else \
            np.zeros((0, cfg.hidden), np.uint16)
        pos = np.concatenate([np.arange(e["ctx"], e["ctx"] + e["n"]) for e in self.entries])
        # strategies of this iteration: decode rows use the manager's, prefill rows PLoRA's rule for prompts
        groups, pre_tok = {}, {}
        for e in self.entries:                  # an adapter's prompt tokens priced together, as PLoRA's pricing does
            if e["pre"]:
                pre_tok[e["r"].adapter] = pre_tok.get(e["r"].adapter, 0) + e["n"]
        for e in self.entries:
            a = e["r"].adapter
            strat = s._strategy(a, pre_tok[a] if e["pre"] else 0)
            groups.setdefault((a, strat, e["sb"]), []).append(e)
            if not e["pre"]:
                self.strat[a] = STRATEGIES[strat]
        self.groups = groups
        for layer in range(cfg.n_layers):
            Lw = W.layers[layer]
            H = ops.rmsnorm(X, Lw["attn_norm"], cfg.rms_eps)
            Q, K, V = (self._proj(layer, "qkv", m, H, Lw[m]) for m in ("q", "k", "v"))
            Q = ops.rope(Q, pos, cfg.n_heads, cfg.head_dim, cfg.rope_theta)
            K = ops.rope(K, pos, cfg.n_heads, cfg.head_dim, cfg.rope_theta)
            for e in self.entries:
                r = e["r"]
                r.K[layer][e["ctx"]:e["ctx"] + e["n"]] = K[e["lo"]:e["hi"]]
                r.V[layer][e["ctx"]:e["ctx"] + e["n"]] = V[e["lo"]:e["hi"]]
            A = self._attention(layer, Q)
            X = ops.add(X, self._proj(layer, "o", "o", A, Lw["o"]))
            H2 = ops.rmsnorm(X, Lw["ffn_norm"], cfg.rms_eps)
            G = self._proj(layer, "ffn_in", "gate", H2, Lw["gate"])
            U = self._proj(layer, "ffn_in", "up", H2, Lw["up"], wave=False)
            X = ops.add(X, self._proj(layer, "down", "down", ops.swiglu(G, U), Lw["down"]))
        for e in self.entries:
            r = e["r"]
            r.n_kv = e["ctx"] + e["n"]
            if e["emit"]:
                lg = ops.logits(X[e["hi"] - 1:e["hi"]], W.final_norm, W.lm_head, cfg.rms_eps)[0]
                r.logits.append(lg)
                r.tokens.append(int(np.argmax(lg)))

    def _proj(self, layer, stage, m, H, Wm, wave=True):
        """``H @ W_m`` plus every entry's LoRA delta. The stage's device jobs for all its matrices run as one wave
        (on the stage's first matrix; ``wave=False`` for the others, whose results the first call kept)."""
        if wave:
            self._stage_results = self._stage_wave(layer, stage).run(H)
        base = ops.linear(H, Wm)
        out = base.copy()
        s = self.s
        for (a, strat, sub), ents in self.groups.items():
            rows = np.concatenate([np.arange(e["lo"], e["hi"]) for e in ents])
            x = H[rows]
            ad = s.adapters[a]
            Am, Bm = ad.ab(layer, m)
            key = (layer, m, a, strat, sub)
            if strat == E1:
                delta = ops.linear(ops.linear(x, Am), Bm)
                self._gpu_lora(layer, stage, sub, len(rows), *Am.shape[:1], Bm.shape[1], ad.rank)
            elif strat == E2:
                A2, B2 = self._stage_results[key]
                delta = ops.linear(ops.linear(x, A2), B2)
                self._gpu_lora(layer, stage, sub, len(rows), Am.shape[0], Bm.shape[1], ad.rank)
            elif strat == E3:
                delta = np.asarray(self._stage_results[key], np.uint16).reshape(len(rows), -1)
            else:
                mm = np.asarray(self._stage_results[key], np.uint16).reshape(len(rows), -1)
                delta = ops.linear(mm, Bm)
                self._gpu_lora(layer, stage, sub, len(rows), 0, Bm.shape[1], ad.rank)
            out[rows] = ops.add(base[rows], delta)
        return out

    def _stage_wave(self, layer, stage):
        """The device jobs of a LoRA stage (every matrix of the stage, every (adapter, strategy, sub-batch)
        group with device work), one wave per device."""
        s = self.s
        jobs = [[] for _ in range(s.n_dev)]
        for sub in (0, 1):
            for (a, strat, gsub), ents in self.groups.items():
                if gsub != sub or strat == E1:
                    continue
                rows = np.concatenate([np.arange(e["lo"], e["hi"]) for e in ents])
                dev = s.cost.device_of(a)
                for m in _STAGE_MATS[stage]:
                    Am, Bm = s.adapters[a].ab(layer, m)
                    key = (layer, m, a, strat, sub)
                    if strat == E2:
                        jobs[dev].append(NDPJob(key, "E2", {"A": Am, "B": Bm}))
                    elif strat == E3:
                        jobs[dev].append(NDPJob(key, "E3", {"A": Am, "B": Bm}, None))
                    else:
                        jobs[dev].append(NDPJob(key, "E4", {"A": Am}, None))
                    jobs[dev][-1]._rows = rows
        return _Deferred(self, layer, stage, jobs)

    def _attention(self, layer, Q):
        """Attention of every entry (module docstring): returns (M, hidden) FP16 bits."""
        s, cfg = self.s, self.s.cfg
        hd, nh, N = cfg.head_dim, cfg.n_heads, s.n_dev
        out = np.zeros((self.M, cfg.hidden), np.uint16)
        si = STAGES.index("attn")
        jobs = [[] for _ in range(N)]
        gpu_parts, pim_jobs = {}, {0: [], 1: []}
        kvb = cfg.kv_bytes_per_token_layer
        for e in self.entries:
            r, sub = e["r"], e["sb"]
            L = e["ctx"] + e["n"]
            if e["pre"]:
                for h in range(nh):
                    sl = slice(h * hd, (h + 1) * hd)
                    out[e["lo"]:e["hi"], sl] = ops.attention_full(Q[e["lo"]:e["hi"], sl], r.K[layer][:L, sl],
                                                                  r.V[layer][:L, sl])
                if r.place == PIM:
                    self.pcie[1 - sub, layer, 0] += e["n"] * kvb         # offloaded meanwhile (L3 eq. 4)
                else:
                    for d in range(N):                                   # the prompt's KV streams to the devices
                        self.cxl_out[sub, layer, si, d] += e["n"] * kvb / N
                t_att = s._prefill_attention_s(e["n"], L)
                self.gpu_extra[sub, layer, si] += t_att
                e["att_s"] = e.get("att_s", 0.0) + t_att          # RFR_p's target (HybridSystem._learn)
                continue
            q = Q[e["lo"]]
            if r.place == PIM:
                for h in range(nh):
                    sl = slice(h * hd, (h + 1) * hd)
                    pim_jobs[sub].append(PIMJob((layer, r.rid, h, sub), r.slot0 + layer * nh + h, q[sl],
                                                r.K[layer][:L, sl], r.V[layer][:L, sl]))
                self.pcie[sub, layer, 0] += 3 * cfg.hidden * 2      # q, k, v of the new token to the host
                self.pcie[sub, layer, 1] += cfg.hidden * 2          # the attention output back
                continue
            # short request: device shares (whole beats, beyond the duplicated prefix), the rest on the GPU
            dup = int(s.mem.dup[r.idx])
            lanes = s.ndp.config.lanes
            cap = s.ndp_timing.max_share(hd)
            dev_pos = []
            for d in range(N):
                p = np.arange(d, L, N)
                p = p[p >= dup]
                p = p[:len(p) // lanes * lanes]
                dev_pos.append(p)
            on_dev = np.zeros(L, bool)
            for p in dev_pos:
                on_dev[p] = True
            gpos = np.flatnonzero(~on_dev)
            self.cxl_out[sub, layer, si, int((L - 1) % N)] += kvb         # the new token's K, V to its device
            for h in range(nh):
                sl = slice(h * hd, (h + 1) * hd)
                Kh, Vh = r.K[layer][:L, sl], r.V[layer][:L, sl]
                for d in range(N):
                    p = dev_pos[d]
                    for c0 in range(0, len(p), cap):
                        pc = p[c0:c0 + cap]
                        jobs[d].append(NDPJob((layer, r.rid, h, d, c0, sub), "ATT",
                                              {"K": Kh[pc], "V": Vh[pc]}, q[sl]))
                if len(gpos):
                    gpu_parts[(r.rid, h)] = ops.gpu_attention_partial(prepare_query(q[sl]), Kh[gpos], Vh[gpos])
            if len(gpos):
                self.gpu_extra[sub, layer, si] += float(s.gpu.attention_decode(
                    1, len(gpos), heads=nh, kv_heads=nh, head_dim=hd).calibrated_s) + \
                    nh * (N + 1) * (2 * hd + 6) / s.cost.gpu.W_hbm
            e["_dev"] = dev_pos
            e["_gpos"] = gpos
        # the PIM rank's launches (one per sub-batch, in order) run beside the NDP devices' wave: independent
        # simulations of independent devices (a thread: the simulator is a subprocess on the rtl backend)
        pim_runs = (lambda: {sub: s.pim.run(pim_jobs[sub]) for sub in (0, 1) if pim_jobs[sub]})
        pim_fut = s._pim_pool.submit(pim_runs) if s._pim_pool is not None and any(jobs) else None
        res = self._waves(layer, "attn", jobs) if any(jobs) else {}
        pim_res = pim_fut.result() if pim_fut is not None else pim_runs()
        for sub in (0, 1):
            if pim_jobs[sub]:
                pr = pim_res[sub]
                pred = s._pim_run_cycles([j.L for j in pim_jobs[sub]])
                cyc = pr.cycles if s.pim.backend == "rtl" else pred
                self.pim_cyc[sub, layer] += cyc
                self.pim_pred[sub, layer] += pred
                s.pim_log.append((s._it, layer, sub, cyc, pred, len(pim_jobs[sub])))
                if pr.energy:
                    s.energy_pj["pim"] += pr.energy["datapath"] + pr.energy["sram"]
                    s.energy_pj["pim_dram"] += pr.energy["dram_command"] + pr.energy["dram_background"]
                    s.energy_src["pim"] = "rtl-trace" if s.pim.backend == "rtl" else "perf-model"
                for j in pim_jobs[sub]:
                    _, rid, h, _ = j.key
                    e = next(x for x in self.entries if x["r"].rid == rid and not x["pre"])
                    out[e["lo"], h * hd:(h + 1) * hd] = pr.outputs.get(j.key, np.zeros(hd, np.uint16))
        for e in self.entries:
            r = e["r"]
            if e["pre"] or r.place == PIM:
                continue
            for h in range(nh):
                parts = []
                for d in range(N):
                    for c0 in range(0, len(e["_dev"][d]), s.ndp_timing.max_share(hd)):
                        key = (layer, r.rid, h, d, c0, e["sb"])
                        if key in res:                  # one (o, m, sum) per token tile of the job
                            for t, (o, m, sm) in enumerate(res[key]):
                                parts.append(((d, c0, t), o, m, sm))
                g = gpu_parts.get((r.rid, h))
                if g is not None:
                    parts.append(((N, 0, 0), *g))
                if parts and s.ndp.backend != "perf":
                    out[e["lo"], h * hd:(h + 1) * hd] = to_fp16_bits(merge_partials(parts))
        return out

    # ---- time ------------------------------------------------------------------------------------------
    def compose(self) -> IterationResult:
        s, b, cfg = self.s, self.b, self.s.cfg
        nl, N = cfg.n_layers, s.n_dev
        W, Lk = s.link.bw_gbps * 1e9, s.link.rtt_ns * 1e-9
        Wp, Lp = s.host_link.bw_gbps * 1e9, s.host_link.rtt_ns * 1e-9
        tck = s.pim.config.dram.timing.tck_ps * 1e-12
        # base-model GPU times per sub-batch and stage, from the calibrated GPU model (per layer)
        base = np.zeros((2, len(STAGES)))
        head = 0.0
        for i in (0, 1):
            es = [e for e in self.entries if e["sb"] == i]
            if not es:
                continue
            pre = [e for e in es if e["pre"]]
            base[i], h = s._base_stages([e["n"] for e in pre], [e["ctx"] + e["n"] for e in pre],
                                        sum(1 for e in es if not e["pre"]), sum(1 for e in es if e["emit"]))
            head += h

        def times(dev_cyc):
            gpu = base[:, None, :] + self.gpu_extra                        # (2, L, S)
            dev = dev_cyc / s.ndp.config.clock_mhz / 1e6                   # (2, L, S, D) seconds
            link = np.maximum(self.cxl_out, self.cxl_in) / W
            side = np.where((dev > 0) | (link > 0), Lk + np.maximum(dev, link), 0.0).max(axis=3)
            stage = np.maximum(gpu, side)
            return stage, gpu, dev, link

        def total(stage, pim_cyc):
            G = stage.sum(axis=(1, 2))
            pl = self.pcie.sum(axis=2)
            P = (pim_cyc * tck + np.where(pl > 0, Lp + np.max(self.pcie, axis=2) / Wp, 0.0)).sum(axis=1)
            A, B = max(G[0], P[1]), max(G[1], P[0])
            return G, P, A, B

        stage, gpu, dev, link = times(self.dev_cyc)
        G, P, A, B = total(stage, self.pim_cyc)
        load = s.mem.pending_load
        link_busy = (link.sum(axis=(0, 1, 2)).max() if N else 0.0) + load / W
        compute = A + B + head
        dur = max(compute, link_busy, 1e-9)
        s.mem.pending_load = 0.0
        # what the next iteration's pre-caching may load: the idle time of the links' device-to-GPU direction
        link_in = (self.cxl_in.sum(axis=(0, 1, 2)).max() if N else 0.0) / W + load / W
        s.mem.prefetch_budget = max(0.0, dur - link_in) * W
        pstage, *_ = times(self.dev_pred)
        self.model_t_gpu, self.model_t_pim, *_ = total(pstage, self.pim_pred)
        # spans: sub-batch 0's GPU side from 0, 1's from A; PIM for sub-batch 1 from 0, sub-batch 0 from A
        spans = []
        for i, t0 in ((0, 0.0), (1, A)):
            t = t0
            for layer in range(nl):
                for si, st in enumerate(STAGES):
                    if stage[i, layer, si] <= 0:
                        continue
                    name = f"L{layer} {st} sb{i}"
                    if gpu[i, layer, si] > 0:
                        spans.append(Span("GPU 0", name, t, float(gpu[i, layer, si])))
                    for d in range(N):
                        if dev[i, layer, si, d] > 0:
                            spans.append(Span(f"NDP {d}", name, t + Lk / 2, float(dev[i, layer, si, d]),
                                              {"cycles": int(self.dev_cyc[i, layer, si, d])}))
                        if link[i, layer, si, d] > 0:
                            spans.append(Span(f"CXL {d}", name, t, float(link[i, layer, si, d])))
                    t += float(stage[i, layer, si])
        for i, t0 in ((1, 0.0), (0, A)):
            if P[i] > 0:
                pc = float(self.pim_cyc[i].sum() * tck)
                spans.append(Span("PIM rank 0", f"attention sb{i}", t0, max(pc, 1e-12),
                                  {"cycles": int(self.pim_cyc[i].sum())}))
                spans.append(Span("PCIe", f"QKV/out sb{i}", t0, max(P[i] - pc, 1e-12)))
        gpu_busy = float(gpu.sum()) + head
        ndp_busy = dev.sum(axis=(0, 1, 2))
        pim_busy = float(self.pim_cyc.sum() * tck)
        s.busy["gpu"] += gpu_busy
        s.busy["ndp"] += ndp_busy
        s.busy["pim"] += pim_busy
        s.busy["time"] += dur
        s.link_bytes["cxl"] += float(self.cxl_out.sum() + self.cxl_in.sum())
        s.link_bytes["pcie"] += float(self.pcie.sum())
        strategies = {}
        for (a, strat, _), ents in self.groups.items():
            for e in ents:
                name = STRATEGIES[strat] + ("p" if e["pre"] else "")
                if name not in strategies.setdefault(int(a), []):
                    strategies[int(a)].append(name)
        strategies = {a: "+".join(sorted(v)) for a, v in sorted(strategies.items())}
        rec = StepRecord(
            iteration=s._it, start_s=0.0, duration_s=dur,
            sub_batches=[[(e["r"].rid, f"P{e['n']}" if e["pre"] else "D") for e in self.entries if e["sb"] == i]
                         for i in (0, 1)],
            strategies=strategies, ndp_cycles=self.dev_cyc.sum(axis=(0, 1, 2)).astype(int).tolist(),
            ndp_pred_cycles=self.dev_pred.sum(axis=(0, 1, 2)).round().astype(int).tolist(),
            pim_cycles=int(self.pim_cyc.sum()), pim_pred_cycles=int(self.pim_pred.sum()),
            cxl_bytes=[(int(self.cxl_out[..., d].sum()), int(self.cxl_in[..., d].sum())) for d in range(N)],
            pcie_bytes=(int(self.pcie[..., 0].sum()), int(self.pcie[..., 1].sum())),
            gpu_busy_s=gpu_busy, ndp_busy_s=ndp_busy.tolist(), pim_busy_s=pim_busy, t_gpu=G.tolist(),
            t_pim=P.tolist())
        s.steps.append(rec)
        record = {"t_gpu0_s": G[0], "t_gpu1_s": G[1], "t_pim0_s": P[0], "t_pim1_s": P[1], "gpu_busy_s": gpu_busy,
                  "pim_busy_s": pim_busy, "pim_cycles": rec.pim_cycles, "pcie_out_bytes": rec.pcie_bytes[0],
                  "pcie_in_bytes": rec.pcie_bytes[1], "link_busy_s": link_busy}
        for d in range(N):
            record[f"ndp{d}_cycles"] = rec.ndp_cycles[d]
            record[f"ndp{d}_model_cycles"] = rec.ndp_pred_cycles[d]
            record[f"cxl{d}_out_bytes"], record[f"cxl{d}_in_bytes"] = rec.cxl_bytes[d]
        for (a, strat, _), ents in self.groups.items():
            if any(not e["pre"] for e in ents):
                record[f"adapter{a}_strategy"] = strat + 1          # 1..4 = E1..E4 (decode)
        return IterationResult(dur, breakdown={"gpu_s": float(G.sum()), "pim_s": float(P.sum()),
                                               "head_s": head, "link_busy_s": link_busy},
                               spans=spans, record=record)


class _Deferred:
    """The results of a LoRA stage's wave, computed on first use with the inputs known by then: a stage's
    matrices share one input (Q/K/V: the normed activations; gate/up: the FFN input), except ``down`` whose
    input is the SwiGLU output (given to the first lookup)."""

    def __init__(self, it, layer, stage, jobs):
        self.it, self.layer, self.stage, self.jobs = it, layer, stage, jobs
        self.res = None

    def __getitem__(self, key):
        if self.res is None:
            raise RuntimeError("stage results read before the stage ran")
        if key not in self.res and self.it.s.ndp.backend == "perf":
            return self._placeholder(key)        # the perf backend computes no data: zeros of the right shape
        return self.res[key]

    def _placeholder(self, key):
        layer, m, a, strat, _ = key
        A, B = self.it.s.adapters[a].ab(layer, m)
        job = next(j for jobs in self.jobs for j in jobs if j.key == key)
        rows = len(job._rows)
        if strat == E2:
            return A, B
        return np.zeros((rows, B.shape[1] if strat == E3 else A.shape[1]), np.uint16)

    def run(self, H):
        for dev_jobs in self.jobs:
            for j in dev_jobs:
                if j.kind != "E2":
                    j.x = H[j._rows]
        self.res = self.it._waves(self.layer, self.stage, self.jobs) if any(self.jobs) else {}
        return self
