"""The hybrid at LLaMA scale (issue 34 item 2): one GPU (an H100), a pool of PLoRA's CXL memory devices with NDP
cores, and L3's DIMM-PIM host memory, as one serving system on the engine (:mod:`host.serving`).

**One memory manager over three memories.** HBM holds the base weights, the adapter caches and the duplicated KV
prefixes of the CXL-resident requests; the CXL pool every adapter the run references (adapter ``a`` on device
``a mod n_dev``) and the KV of the requests placed there, token-interleaved; the host's DIMM-PIM ranksets the KV
of the requests placed there, layer by layer over the ranksets (L3 5.1, :class:`host.l3.pim_side.RanksetPlacement`,
balanced). The adapters are PLoRA's: its memory manager (:class:`host.plora.system.PLoRASystem`, variant
``plora``, as ``self.mem``: admission, Algorithm 1 over the VI-B cost model, the prompt's KV duplicated with the
adapter's decision, temperature, pre-caching in idle link time) manages every request's adapter and the
CXL-resident requests' KV; the PIM-resident requests' KV is left out of it
(:meth:`~host.plora.system.PLoRASystem.keep_kv_elsewhere`) and held by a :class:`host.serving.KVBudget` of the
host memory (L3's, reserve policy, blocks of 16 tokens).

**Decisions: the e2e hybrid's, called** (:mod:`host.hybrid.decisions`; ``tests/host/hybrid``): each request's KV
is placed at admission by :func:`~host.hybrid.decisions.place_kv` (its final context against ``pim_min_context``,
each side's capacity, and for a borderline request the two sides' attention loads, :mod:`host.hybrid.cost`);
Algorithm 1 runs again for every serving adapter before every iteration
(:func:`~host.hybrid.decisions.reselect_serving`); L3's scheduler forms the two sub-batches over GPU, NDP and PIM
work (:func:`~host.hybrid.decisions.form_sub_batches`: balanced split by context with the residence -- the
rankset class of a PIM-resident request, one class for the CXL-resident ones -- as the class; prefills by the
stop rule, chunked to multiples of 16) with L3's predictors (:class:`host.l3.predictors.L3Predictors`, seeded by a
start-up profile and trained online on the executed times, L3's targets).

**The price of an iteration** (:meth:`HybridScaleSystem.price`): each sub-batch's GPU + CXL work is PLoRA's
(:meth:`~host.plora.system.PLoRASystem._price_parts`: the base model on the calibrated GPU model, every request's
LoRA by its adapter's strategy with the per-job NDP times of the RTL-calibrated kernel table, the CXL-resident
decodes' distributed attention, the prefills' attention on the GPU, the CXL-resident prompts' KV to the devices,
adapter loads on sub-batch 0) *executed* on PLoRA's timeline (:mod:`host.plora.timeline`); each sub-batch's PIM
phase is L3's (:meth:`host.l3.pim_side.PIMSide.phase`: the PIM-resident decodes' heads on the ranksets at the
RTL-calibrated per-head cycles, Q/K/V in and outputs back over PCIe, the other sub-batch's PIM-resident prompt KV
offloaded meanwhile) executed on its event timeline; the two compose in L3's order on the hybrid timeline
(:mod:`host.hybrid.timeline`). The cost model's estimate of the same iteration (PLoRA's VI-B estimate plus the PIM
terms, :mod:`host.hybrid.cost`) is recorded beside it (``estimate_s``, summary ``cost_model_err``), never charged.

Hardware (each value's source is where it is defined): the H100 of PLoRA VII-A (:data:`host.models.hardware.
H100_SXM_80GB`), CXL 3.1 to four PLoRA devices (:data:`host.plora.config.N_DEVICES`, :mod:`host.link`), L3 Table 2's
host memory (16 channels, 4 ranksets, 2 TB DDR4-3200, :data:`host.l3.config.L3_HOST_MEMORY`) behind the H100
node's PCIe 5.0 x16 (:data:`host.models.hardware.H100_NODE`).
"""

from dataclasses import replace

import numpy as np

from host.serving import System, KVBudget, IterationResult
from host.serving.request import RUNNING

from . import decisions as hd
from .decisions import (PIM, NDP, SIDE_NAMES, DEFAULT_PIM_MIN_CONTEXT, DEFAULT_BORDERLINE, SideLoad, is_borderline,
                        check_placement_args)
from .cost import PIMCost, cxl_load_s
from .timeline import compose

__all__ = ["HybridScaleSystem", "PIM_BLOCK_TOKENS", "PROFILE_BATCHES", "MAX_CANDIDATES"]

#: L3's KV block (host.l3.systems.BLOCK_TOKENS, vLLM's default block size) for the host memory's budget.
PIM_BLOCK_TOKENS = 16
#: L3's start-up profile size (host.l3.systems.L3System's default ``profile_batches``).
PROFILE_BATCHES = 384
#: L3's bound on the prefill queue the scheduler looks at (host.l3.systems.L3System's default ``max_candidates``).
MAX_CANDIDATES = 32


class HybridScaleSystem(System):
    """The LLaMA-scale hybrid (module docstring). ``model``: a ``host.models.LLMConfig`` (dense, head_dim 128:
    the DIMM-PIM's PAPER geometry); ``n_dev``: CXL devices (default PLoRA's four); ``host``: a
    :class:`host.l3.config.HostMemoryConfig`; ``ndp``: the NDP timing model's kind (PLoRA's ``auto`` /
    ``calibrated`` / ``standin``); ``pim_min_context`` / ``borderline``: the placement rule
    (:func:`host.hybrid.decisions.place_kv`)."""

    name = "hybrid"

    def __init__(self, model, *, n_dev: int | None = None, gpu=None, link=None, host=None, host_link=None,
                 ndp="auto", seed: int = 0, pim_min_context: int = DEFAULT_PIM_MIN_CONTEXT,
                 borderline: float = DEFAULT_BORDERLINE, max_batch: int | None = None, max_tokens: int | None = None,
                 profile_batches: int = PROFILE_BATCHES, select_every_step: bool = True):
        super().__init__(None)
        from host.l3.config import L3Setup, L3_HOST_MEMORY
        from host.l3.gpu_side import GPUSide
        from host.l3.pim_side import PIMSide
        from host.l3.scheduler import ridge_tokens
        from host.link import get_link
        from host.models.hardware import H100_SXM_80GB, H100_NODE
        from host.plora.config import DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS, N_DEVICES
        from host.plora.system import PLoRASystem
        check_placement_args(pim_min_context, borderline)
        if getattr(model, "is_moe", False):
            raise ValueError(f"{model.name}: the hybrid's PIM side prices dense models only (L3's GPU side)")
        self.model = model
        self.gpu_cfg = gpu or H100_SXM_80GB
        self.link = link or get_link("cxl3.1")
        self.pim_min_context, self.borderline = int(pim_min_context), float(borderline)
        self.seed = int(seed)
        self.select_every_step = bool(select_every_step)
        self.max_batch = DEFAULT_MAX_BATCH if max_batch is None else int(max_batch)
        if not 1 <= self.max_batch <= 100_000:
            raise ValueError(f"max_batch must be in 1..100000, got {self.max_batch}")
        self.profile_batches = int(profile_batches)
        n_dev = N_DEVICES if n_dev is None else int(n_dev)
        self.mem = PLoRASystem(model, "plora", gpu=self.gpu_cfg, link=self.link, n_dev=n_dev, ndp=ndp, seed=seed,
                               max_batch=self.max_batch,
                               max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens))
        self.n_dev = self.mem.n_dev
        self.cost = self.mem.cost
        node = replace(H100_NODE, gpu=self.gpu_cfg)
        self.setup = L3Setup(model=model, tp=1, dp=1, node=node, host=host or L3_HOST_MEMORY,
                             host_link=host_link or node.host_link)
        self.pim = PIMSide(self.setup, comm=True)
        self.gpu_side = GPUSide(self.setup, gpu=self.mem.gpu_model)
        self.pcost = PIMCost(self.pim)
        #: the longest head a rank PU computes: its buffer's tokens (L3 4.4; host.l3.pim_timing)
        self.pim_max_tokens = int(self.pim.timing.max_tokens)
        self.R = self.pim.R
        self.nl = model.n_layers
        # L3's token floor as the e2e hybrid takes it: the roofline ridge of the GPU (host.l3.scheduler)
        self.min_gpu_tokens = ridge_tokens(self.gpu_cfg.fp16_tflops, self.gpu_cfg.hbm_bw_gbps)
        self.emit_spans = True

    # ---- run set-up --------------------------------------------------------------------------------------
    def bind(self, table):
        from host.l3.pim_side import RanksetPlacement
        from host.l3.predictors import L3Predictors
        super().bind(table)
        self.mem.bind(table)
        n = table.n
        self.final = (table.prompt_tokens + table.output_tokens).astype(np.int64)
        self.pkv = KVBudget(table, capacity_bytes=self.setup.host_capacity_bytes,
                            bytes_per_token=self.setup.kv_bytes_per_token, policy="reserve",
                            block_tokens=PIM_BLOCK_TOKENS)
        self.place = RanksetPlacement(n, self.R, policy="balanced", seed=self.seed)
        self.residence = np.full(n, -1, np.int64)
        self.active = np.zeros(n, bool)
        self.why = np.full(n, "", object)              # "context", "capacity" or "load"
        self._tent = {}
        self._last_side = (0.0, 0.0)       # the last iteration's executed GPU + CXL side and PIM side (seconds)
        self._since = {PIM: [], NDP: []}   # requests placed since it
        self.pred = L3Predictors(seed=self.seed, cold=self.profile_batches == 0)
        if self.profile_batches:
            self.pred.seed(self._startup_profile())
        self._buf = []
        self._since_learn = 0
        self._est_err, self._est_err_gpu = [], []
        self.acc = {"time": 0.0, "gpu": 0.0, "ndp": 0.0, "pim": 0.0, "cxl_out": 0.0, "cxl_in": 0.0,
                    "pcie_out": 0.0, "pcie_in": 0.0, "heads": 0.0, "head_tokens": 0.0,
                    "span": [float("inf"), float("-inf")]}

    # ---- placement and admission ----------------------------------------------------------------------------
    def _side_load(self, i, extra=None) -> SideLoad:
        """What the placement rule knows when it places request ``i`` (``extra``: the requests placed tentatively
        this iteration, ``{side: [indices]}``). A side's load: what the last iteration executed there -- the GPU +
        CXL side ``T_GPU_0 + T_GPU_1`` (the GPU's work and the CXL devices' attention it waits for), the PIM side
        ``T_PIM_0 + T_PIM_1`` -- plus the cost model's terms of the requests placed there since (their decode
        attention at their final contexts beside the side's residents: :mod:`host.hybrid.cost`); the request's
        cost on each side is its own term there; and whether its final KV fits each side."""
        extra = extra or {PIM: [], NDP: []}
        L = int(self.final[i])
        g_last, p_last = self._last_side
        # CXL: PLoRA's attention term of the residents before, with the newly placed, and with this one
        new_c = [int(j) for j in self._since[NDP]] + [int(j) for j in extra[NDP]]
        old_c = np.setdiff1d(np.flatnonzero(self.active & (self.residence == NDP)), new_c)
        Lc = list(self.final[old_c])
        c_old = cxl_load_s(self.cost, self.nl, Lc)
        Lc += [int(self.final[j]) for j in new_c]
        c_now = cxl_load_s(self.cost, self.nl, Lc)
        c_with = cxl_load_s(self.cost, self.nl, Lc + [L])
        # PIM: the PIM terms likewise (the tentative ones and this one where the balanced placement puts them)
        new_p = [int(j) for j in self._since[PIM]]
        old_p = np.setdiff1d(np.flatnonzero(self.active & (self.residence == PIM)), new_p)
        Lp, cp = list(self.final[old_p]), list(self.place.cls[old_p])
        p_old = self.pcost.load_s(np.array(Lp, np.int64), np.array(cp, np.int64))
        Lp += [int(self.final[j]) for j in new_p]
        cp += [int(self.place.cls[j]) for j in new_p]
        load_tok = self.place.load.copy()
        for j in extra[PIM]:
            c = int(np.argmin(load_tok))
            load_tok[c] += int(self.final[j])
            Lp.append(int(self.final[j]))
            cp.append(c)
        p_now = self.pcost.load_s(np.array(Lp, np.int64), np.array(cp, np.int64))
        c = int(np.argmin(load_tok))
        p_with = self.pcost.load_s(np.array(Lp + [L], np.int64), np.array(cp + [c], np.int64)) \
            if L <= self.pim_max_tokens else float("inf")
        kx = {s: (int(self.mem.kv.need_tokens(np.array(extra[s], int)).sum()) if s == NDP else
                  int(self.pkv.need_tokens(np.array(extra[s], int)).sum())) if len(extra[s]) else 0
              for s in (PIM, NDP)}
        return SideLoad(cxl_load_s=g_last + c_now - c_old, pim_load_s=p_last + p_now - p_old,
                        cxl_cost_s=c_with - c_now, pim_cost_s=p_with - p_now,
                        cxl_fits=int(self.mem.kv.need_tokens(i)) <= self.mem.kv.free_tokens - kx[NDP],
                        pim_fits=L <= self.pim_max_tokens
                        and int(self.pkv.need_tokens(i)) <= self.pkv.free_tokens - kx[PIM])

    def _place(self, i, extra=None):
        load = self._side_load(i, extra)
        side = hd.place_kv(int(self.final[i]), pim_min_context=self.pim_min_context, load=load,
                        borderline=self.borderline)
        return side

    def can_admit(self, idx, now):
        return self._place(int(idx)) is not None

    def admission_error(self, idx):
        i = int(idx)
        cxl = int(self.mem.kv.need_tokens(i)) > self.mem.kv.capacity_tokens
        pim = int(self.pkv.need_tokens(i)) > self.pkv.capacity_tokens or self.final[i] > self.pim_max_tokens
        if cxl and pim:
            gb = self.final[i] * self.setup.kv_bytes_per_token / 1e9
            return (f"its final KV ({int(self.final[i])} tokens, {gb:.2f} GB) fits neither the CXL pool's KV room ({self.mem.kv.capacity_bytes / 1e9:.1f} GB) nor the "
                    f"host's DIMM-PIM memory ({self.pkv.capacity_bytes / 1e9:.1f} GB, heads of at most "
                    f"{self.pim_max_tokens} tokens: the rank PU buffer)")
        return None

    def on_admit(self, idx, now):
        for i in np.atleast_1d(idx).tolist():
            side = self._tent.pop(i, None)
            if side is None:
                side = self._place(i)
            if side is None:
                raise RuntimeError(f"hybrid: request {int(self.table.id[i])} admitted with room on neither side")
            pref = PIM if self.final[i] >= self.pim_min_context else NDP
            self.why[i] = "context" if side == pref else (
                "load" if is_borderline(int(self.final[i]), self.pim_min_context, self.borderline)
                and (self.mem.kv.can_admit(i) if pref == NDP else self.pkv.can_admit(i)) else "capacity")
            self.residence[i] = side
            self.active[i] = True
            self._since[side].append(i)
            if side == PIM:
                self.pkv.admit(np.array([i]))
                self.place.place(i, int(self.pkv.held_tokens[i]))
                self.mem.keep_kv_elsewhere([i])
            self.mem.on_admit(np.array([i]), now)

    def on_finish(self, idx, now):
        self.mem.on_finish(idx, now)
        self.pkv.release(idx)
        self.place.release(idx)
        self.active[idx] = False

    def on_preempt(self, idx, now):
        raise RuntimeError("hybrid: no request is ever preempted (KV reserved at admission on either side)")

    # ---- the batch ----------------------------------------------------------------------------------------
    def _remaining(self, a):
        t = self.table
        run = np.flatnonzero((t.adapter_id == a) & (t.state == RUNNING))
        if not len(run):
            return 1.0
        return max(1.0, float((t.output_tokens[run] - t.generated[run]).max()))

    def before_batch(self, view, now):
        self.mem.before_batch(view, now)
        if self.select_every_step:
            hd.reselect_serving(self.mem, self._remaining)

    def form_batch(self, view, now):
        # the waiting requests offered: FCFS (no overtaking) while a side can hold each one, the batch cap kept
        offered, extra = [], {PIM: [], NDP: []}
        self._tent = {}
        room = self.max_batch - view.n_running
        for i in list(view.waiting)[:MAX_CANDIDATES]:
            if len(offered) >= room:
                break
            side = self._place(int(i), extra)
            if side is None:
                break
            self._tent[int(i)] = side
            extra[side].append(int(i))
            offered.append(int(i))
        res, cls = self.residence, self.place.cls
        return hd.form_sub_batches(self.table, view, self.pred, offered=offered, min_gpu_tokens=self.min_gpu_tokens,
                                decode_class=lambda dec: hd.sched_classes(res[dec], cls[dec], self.R))

    # ---- the price --------------------------------------------------------------------------------------------
    def _gpu_side(self, sub, load_bytes):
        """Sub-batch ``sub``'s GPU + CXL work: PLoRA's estimate and its execution on PLoRA's timeline."""
        m, cost = self.mem, self.cost
        p = m._price_parts(sub)
        pre = sub.prefill
        on_cxl = self.residence[sub.req] == NDP
        # the prompt KV of the CXL-resident prefills goes to the devices (the PIM-resident ones' over PCIe)
        p["prefill_kv_bytes"] = float(sub.new_tokens[pre & on_cxl].sum()) * cost.kv_tok_layer
        dec = p["dec_req"]
        nd = self.residence[dec] == NDP
        kv_after = sub.kv_after[~pre][nd]
        att = m._attention(dec[nd], kv_after)
        est = m._assemble(p, att, load_bytes)
        ex = m._execute(p, kv_after, m.dup[dec[nd]], load_bytes, spans=self.emit_spans, att=att)
        return p, est, ex, dec[nd], kv_after

    def price(self, batch, now):
        sb = batch.sub_batch if batch.sub_batch is not None else np.zeros(len(batch), np.int8)
        subs = [batch.select(sb == i) for i in (0, 1)]
        load = self.mem.pending_load
        gpu_ex, gpu_est, parts, nstrat = [None, None], [0.0, 0.0], [None, None], np.zeros(4)
        dec_ndp, kv_ndp = [], []
        for i in (0, 1):
            if not len(subs[i]):
                continue
            p, est, ex, dn, kv = self._gpu_side(subs[i], load if i == 0 or not len(subs[0]) else 0.0)
            if i == 0 or not len(subs[0]):
                load = 0.0
            gpu_ex[i], gpu_est[i], parts[i] = ex, est.duration_s, p
            nstrat += est.strategy_n
            dec_ndp.append(dn)
            kv_ndp.append(kv)
        # the PIM phases: sub-batch i's PIM-resident decodes, the other's PIM-resident prompt KV offloaded meanwhile
        pim_ph, pim_est, pcie = [None, None], [0.0, 0.0], [0.0, 0.0]
        for i in (0, 1):
            s, o = subs[i], subs[1 - i]
            d = ~s.prefill & (self.residence[s.req] == PIM)
            op = o.prefill & (self.residence[o.req] == PIM)
            if not d.any() and not op.any():
                continue
            L, cls = s.kv_after[d], self.place.cls[s.req[d]]
            c, ccls = o.new_tokens[op], self.place.cls[o.req[op]]
            pim_ph[i] = self.pim.phase(L, cls, c, ccls)
            pim_est[i] = self.pcost.iteration_s(L, cls, c, ccls)
            pcie[0] += self.nl * (int(d.sum()) * self.pim.qkv_bytes + float(c.sum()) * self.pim.kv_layer_bytes)
            pcie[1] += self.nl * int(d.sum()) * self.pim.out_bytes
        ex = compose(gpu_ex, pim_ph, self.nl, self.R, spans=self.emit_spans)
        dur = max(ex.duration_s, 1e-12)
        self._last_side = (float(sum(ex.t_gpu)), float(sum(ex.t_pim)))      # the placement rule's loads
        self._since = {PIM: [], NDP: []}
        est = max(gpu_est[0], pim_est[1]) + max(gpu_est[1], pim_est[0])
        self._est_err.append(est / dur - 1.0)
        G = [e.duration_s for e in gpu_ex if e is not None]
        if G:
            self._est_err_gpu.append(sum(g for g in gpu_est) / sum(G) - 1.0)
        # PLoRA's bookkeeping: pre-caching may use the link-in time the iteration left idle
        W = self.cost.link.W
        link_in = ex.busy_s.get("link in", 0.0)
        self.mem.pending_load = 0.0
        self.mem.prefetch_budget = max(0.0, dur - link_in) * W
        dec_all = np.concatenate(dec_ndp) if dec_ndp else np.zeros(0, np.int64)
        kv_all = np.concatenate(kv_ndp) if kv_ndp else np.zeros(0, np.int64)

        class _R:                       # what PLoRA's record reads of an estimate: the adapters per strategy
            strategy_n = nstrat
        rec, dupf, cached, kvd = self.mem._record(_R, kv_all, dec_all)
        self.mem._account(dur, dupf, cached, kvd, nstrat)
        self._learn(batch, subs, ex)
        a = self.acc
        a["time"] += dur
        a["gpu"] += ex.busy_s.get("GPU 0", 0.0)
        a["ndp"] += sum(v for k, v in ex.busy_s.items() if k.startswith("device "))
        a["pim"] += ex.busy_s.get("rankset 0", 0.0)
        a["cxl_out"] += ex.busy_s.get("link out", 0.0) * W
        a["cxl_in"] += link_in * W
        a["pcie_out"] += pcie[0]
        a["pcie_in"] += pcie[1]
        pim_dec = ~batch.prefill & (self.residence[batch.req] == PIM)
        m = self.setup.model            # the DIMM-PIM heads of the energy (as the L3 systems count them)
        a["heads"] += float(pim_dec.sum()) * m.n_layers * m.n_kv_heads
        a["head_tokens"] += float(batch.kv_after[pim_dec].sum()) * m.n_layers * m.n_kv_heads
        rec.update({"estimate_s": est, "t_gpu0_s": ex.t_gpu[0], "t_gpu1_s": ex.t_gpu[1], "t_pim0_s": ex.t_pim[0],
                    "t_pim1_s": ex.t_pim[1], "phase_a_s": ex.phase_a_s, "phase_b_s": ex.phase_b_s,
                    "n_pim_decode": int(pim_dec.sum()), "n_cxl_decode": int((~batch.prefill).sum() - pim_dec.sum()),
                    "cxl_out_bytes": ex.busy_s.get("link out", 0.0) * W, "cxl_in_bytes": link_in * W,
                    "pcie_out_bytes": pcie[0], "pcie_in_bytes": pcie[1]})
        pred = batch.meta.get("pred")
        if pred:
            rec.update({"pred_gpu0_s": pred[0][0], "pred_gpu1_s": pred[1][0], "pred_pim0_s": pred[0][1],
                        "pred_pim1_s": pred[1][1]})
        return IterationResult(dur, breakdown={"gpu_s": float(sum(ex.t_gpu)), "pim_s": float(sum(ex.t_pim))},
                               spans=ex.spans, record=rec)

    def price_decode_run(self, batch, max_iters, now):
        return None                    # every iteration is formed, scheduled and executed

    def on_iteration_end(self, batch, result, now):
        self.mem.on_iteration_end(batch, result, now)
        from host.energy import keep_busy
        keep_busy({}, None, self.acc["span"], [result.duration_s], now)      # the span the energy is charged over

    def energy(self) -> dict:
        """``energy_j`` and ``energy_per_token_mj`` of the run (host/energy.py; docs/energy.md "Energy in runs"),
        PLoRA's accounting for the GPU and the CXL side and L3's for the DIMM-PIM side, from the executed timeline's
        busy seconds and the bytes it moved: the GPU board over the run's span with its busy seconds; the CXL link's
        and the PCIe link's bits (the PCIe bits also cross a DDR4 channel); each NDP device's busy seconds at the
        paper device's busy power at this model's shape, every device's LPDDR5X in standby for the span; the
        DIMM-PIM heads (sim.energy.pim, beyond standby) and every rank of the host memory in precharge standby."""
        from hdl.memctl.timing import DDR4_3200
        from host.energy import EnergyLedger, dram_rank_idle_w, ndp_device_power, pim_head_increment_pj, window_s
        a, m = self.acc, self.setup.model
        T = window_s(a["span"])
        led = EnergyLedger()
        led.add_gpu(self.gpu_cfg.name, 1, T, min(a["gpu"], T))
        led.add_link(self.link.name, 8.0 * (a["cxl_out"] + a["cxl_in"]))
        pcie_bits = 8.0 * (a["pcie_out"] + a["pcie_in"])
        led.add_link(self.setup.host_link.name, pcie_bits)
        led.add_link("ddr4", pcie_bits)
        sh = self.mem.shape
        p = ndp_device_power(int(sh.hidden), int(sh.head_dim), int(sh.q_heads), int(sh.kv_heads))
        led.add("ndp", p["logic"] * a["ndp"])
        led.add("dram", self.n_dev * p["idle_dram"] * T + max(0.0, p["dram"] - p["idle_dram"]) * a["ndp"])
        d_pj, pu_pj = pim_head_increment_pj(m.head_dim, a["heads"], a["head_tokens"])
        led.add("dram", d_pj * 1e-12 + self.setup.host.ranks * dram_rank_idle_w(DDR4_3200) * T)
        led.add("pim", pu_pj * 1e-12)
        return led.as_summary(float(np.sum(self.table.generated)) if self.table is not None else 0.0)

    # ---- predictors (L3's) --------------------------------------------------------------------------------
    def _startup_profile(self):
        """L3's start-up profile (host.l3.systems.L3System._startup_profile's draws) priced by what is known before
        any adapter has a strategy: T_GPU the base model and prefill attention on the GPU model plus the
        CXL-resident decodes' distributed attention (PLoRA's cost term), T_PIM the PIM-resident decodes' executed
        PIM phase. A decode is CXL-resident (class R) or on one of the R ranksets, uniformly."""
        from host.l3.predictors import ProfiledBatches, profiled_sub_batch
        rng = np.random.default_rng(self.seed + 7919)
        R, parts = self.R, []
        logu = lambda lo, hi, n: np.exp(rng.uniform(np.log(lo), np.log(hi), n))  # noqa: E731
        for _ in range(self.profile_batches):
            nd = 0 if rng.random() < 0.15 else int(logu(1, 257, 1)[0])
            L = np.rint(logu(16, 32768, nd)).astype(np.int64)
            cls = rng.integers(0, R + 1, nd)
            npre = int(rng.integers(0, 4))
            c = np.maximum(1, np.rint(logu(1, 257, npre))).astype(np.int64) * 16
            f = np.where(rng.random(npre) < 0.4, 0, np.rint(logu(16, 16384, npre))).astype(np.int64)
            no = int(rng.integers(0, 3))
            oc = np.maximum(1, np.rint(logu(1, 257, no))).astype(np.int64) * 16
            ocls = rng.integers(0, R, no)
            kv = f + c
            fc = float(self.gpu_side.fc(int(c.sum()) + nd, nd))
            tp = self.gpu_side.prefill_attn_each(c, kv) if npre else np.zeros(0)
            g = fc + float(tp.sum()) + cxl_load_s(self.cost, self.nl, L[cls == R])
            on_pim = cls < R
            p = self.nl * self.pim.phase(L[on_pim], cls[on_pim], oc, ocls).total if (on_pim.any() or no) else 0.0
            parts.append(profiled_sub_batch(sum_fd=float(np.sum(L - 1)), n_d=nd, sum_cp_other=float(oc.sum()),
                                            t_pim=p, chunks=c, done=f, t_p_each=tp, t_fc=g - float(tp.sum()),
                                            t_gpu=g))
        return ProfiledBatches.concat(parts)

    #: profiled sub-batches are handed to the predictors every this many iterations (L3System.LEARN_EVERY)
    LEARN_EVERY = 32

    def _learn(self, batch, subs, ex):
        """L3's targets (:func:`host.l3.predictors.profiled_sub_batch`) from the executed times: RFR_p each
        prefill's attention time (the GPU model's), RFR_batch the rest of the sub-batch's executed T_GPU, the linear
        model its executed T_PIM."""
        from host.l3.predictors import ProfiledBatches, profiled_sub_batch
        for i in (0, 1):
            s, o = subs[i], subs[1 - i]
            d, p = ~s.prefill, s.prefill
            if not d.any() and not p.any():
                continue
            c, kv = s.new_tokens[p], s.kv_after[p]
            tp = self.gpu_side.prefill_attn_each(c, kv) if p.any() else np.zeros(0)
            g = float(ex.t_gpu[i])
            self._buf.append(profiled_sub_batch(sum_fd=float(s.context[d].sum()), n_d=int(d.sum()),
                                                sum_cp_other=float(o.new_tokens[o.prefill].sum()),
                                                t_pim=float(ex.t_pim[i]), chunks=c, done=s.context[p], t_p_each=tp,
                                                t_fc=max(g - float(tp.sum()), 0.0), t_gpu=g))
        self._since_learn += 1
        if self._buf and (self._since_learn >= self.LEARN_EVERY or not self.pred.ready):
            self.pred.observe(ProfiledBatches.concat(self._buf))
            self._buf, self._since_learn = [], 0

    # ---- outputs ---------------------------------------------------------------------------------------------
    def config(self):
        m = self.mem.config()
        return {"name": self.name, "model": self.model.name, "gpu": self.gpu_cfg.name, "n_dev": self.n_dev,
                "device": m["device"], "link": m["link"], "ndp_model": m["ndp_model"],
                "ndp_kernel_table": m["ndp_kernel_table"], "seed": self.seed,
                "pim_min_context": self.pim_min_context, "borderline": self.borderline,
                "max_batch": self.max_batch, "min_gpu_tokens": self.min_gpu_tokens,
                "profile_batches": self.profile_batches, "select_every_step": self.select_every_step,
                "max_candidates": MAX_CANDIDATES, "pim_block_tokens": PIM_BLOCK_TOKENS,
                "memory_manager": "host.plora.system.PLoRASystem (variant plora)",
                "decisions": "host.hybrid.decisions (place_kv, reselect_serving, form_sub_batches)",
                "host": self.setup.describe()}

    def summary(self):
        from host.plora.system import estimate_error
        out = self.mem.summary()
        a = self.acc
        T = max(a["time"], 1e-30)
        e = np.array(self._est_err)
        eg = np.array(self._est_err_gpu)
        out["cost_model_err"] = estimate_error(e, np.ones(len(e)))
        out["cost_model_err_gpu_side"] = estimate_error(eg, np.ones(len(eg)))
        placed = self.residence >= 0
        out["residence"] = {SIDE_NAMES[s]: int(np.count_nonzero(self.residence == s)) for s in (PIM, NDP)}
        out["placement_reason"] = {f"{SIDE_NAMES[s]}_{w}": int(np.count_nonzero((self.residence == s) &
                                                                                 (self.why == w)))
                                   for s in (PIM, NDP) for w in ("context", "load", "capacity")}
        out["placed"] = int(placed.sum())
        out["gpu_busy_frac"] = a["gpu"] / T
        out["ndp_busy_frac"] = a["ndp"] / T / self.n_dev
        out["pim_busy_frac"] = a["pim"] / T
        out["link_bytes"] = {"cxl_out": a["cxl_out"], "cxl_in": a["cxl_in"], "pcie_out": a["pcie_out"],
                             "pcie_in": a["pcie_in"]}
        out["gpu_mem_gb"] = {**out["gpu_mem_gb"], "kv": 0.0}
        out["host_kv_gb_peak"] = self.pkv.peak_tokens * self.pkv.bytes_per_token / 1e9
        out["predictors"] = self.pred.state() if hasattr(self.pred, "state") else {}
        out.update(self.energy())
        return out
