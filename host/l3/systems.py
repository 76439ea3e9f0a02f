"""The systems of the L3 study on host-core's serving engine (:mod:`host.serving`): L3, its ablation steps and the
four baselines, each for one data-parallel replica (:mod:`host.l3.run` runs the replicas and merges them).

Every system owns its memory (a :class:`host.serving.KVBudget`, vLLM-style paged KV in blocks of 16 tokens: a
request is admitted when its prefill fits, grows a block at a time, and the most recently admitted request is
preempted and later recomputed when the next tokens do not fit), forms each iteration's batch and prices it with
the *true* times of the GPU model (:class:`host.l3.gpu_side.GPUSide`) and the DIMM-PIM model
(:class:`host.l3.pim_side.PIMSide`). Times are all-layer totals of one replica.

* :class:`L3System` (``l3``; ablation ``l3-no-comm``, ``l3-no-sched``, ``l3-base``): KV in the DIMM-PIM host
  memory; decoding MHA on the DIMM-PIM, everything else on the GPUs.
  - with the scheduler (5.2, 5.3): two sub-batches per iteration formed by :func:`host.l3.scheduler.schedule`
    from the *predictors* (:class:`host.l3.predictors.L3Predictors`, trained online on the true times of every
    priced iteration); the iteration costs ``max(T_GPU_0, T_PIM_1) + max(T_GPU_1, T_PIM_0)`` of the true times,
    so misprediction shows up as bubbles;
  - without it (``no-sched``): one batch per iteration, prefill-prioritized (vLLM v0: an iteration with prefills
    runs only prefills, whole prompts up to :data:`PREFILL_TOKENS` tokens), GPU and PIM in series within a layer:
    a decode iteration is ``FC + t_in + PIM + t_out`` per layer;
  - with the communication optimisations (5.1, ``comm``): ranksets balanced, the rankset the unit of transfer
    (only the ranks a transfer reads or writes stop computing), prefill KV offload asynchronous and balanced over
    the ranksets; without them: a monolithic DIMM-PIM (every rank stops computing while any transfer runs, one
    transfer per kind, each with its set-up), synchronous offload, random rankset per request. Either way a PIM
    phase's time is read off the timeline of its channel path and ranksets (:mod:`host.l3.pim_side`).
* :class:`GPUOnlySystem` (``gpu-only``, vLLM-style): KV in HBM (the TP group's HBM less the weights and the
  activation workspace, :func:`hbm_kv_capacity_bytes`; vLLM's 0.9 ``gpu_memory_utilization`` is an option, off by
  default), prefill-prioritized batches, attention on the GPU.
* :class:`HBMPIMSystem` (``hbm-pim``, NeuPIMs / AttAcc style): KV in HBM (same capacity as GPU-only), decode
  attention on HBM-PIM at 16x the HBM bandwidth (L3 Table 2: 260.8 TB/s for 8 GPUs), double-buffered banks so
  the GPU and the PIM run concurrently (6.1), prefill-prioritized, decodes in two sub-batches interleaved
  (``max(FC_0, PIM_1) + max(FC_1, PIM_0)``; 6.1 "utilizes sub-batches for decoding"). Labelled variants:
  ``hbm-pim-serial`` (one decode batch, ``FC + PIM``) and ``hbm-pim-best`` (the faster of the two per iteration).
* :class:`RPIMSystem` (``r-pim``, Hermes style): KV in host DIMMs, rank-level PUs only (each rank streams its KV at
  the DDR4-3200 DQ rate: 4x the CPU's bandwidth with 4 ranks per channel, L3 2.2), prefill-prioritized, one batch:
  GPU and PIM in series; the prefill KV transfer is hidden by concurrent computation (6.1).
* :class:`CPUOffloadSystem` (``cpu-offload``, NEO style): GPU-resident requests (KV in HBM) decode on the GPU;
  when HBM is full new requests keep their KV in host memory and their decode attention runs on the host CPU at
  the host DRAM bandwidth (L3 Table 2: 406 GB/s); NEO's two sub-batches (GPU work, CPU decodes) and its mode rule.

Assumptions are listed with their reasons in docs/l3_host.md.
"""

import itertools

import numpy as np

from host.serving import (Batch, ContinuousBatcher, IterationResult, KVBudget, RunResult, Span, System)
from host.l3.gpu_side import GPUSide
from host.l3.pim_side import PIMSide, RanksetPlacement
from host.l3.pim_timing import pim_timing, rankset_model, COMMAND_PATHS, DEFAULT_COMMAND_PATH
from host.l3.predictors import L3Predictors, ProfiledBatches, profiled_sub_batch
from host.l3.scheduler import (PrefillItem, SchedState, balanced_split, efficiency_knee_tokens, ridge_tokens,
                               schedule)

__all__ = ["PREFILL_TOKENS", "GPU_MEMORY_UTILIZATION", "MAX_NUM_SEQS", "gpu_workspace_bytes", "HBM_KV_SYSTEMS",
           "request_kv_limit_bytes", "resolve_min_gpu_tokens", "BLOCK_TOKENS", "FUSE_CAP", "L3System", "GPUOnlySystem",
           "HBMPIMSystem", "RPIMSystem", "CPUOffloadSystem", "SYSTEMS", "make_system", "hbm_kv_capacity_bytes",
           "KV_POLICY", "plan_batch"]

#: Prefill-prioritized batches take whole prompts up to this many tokens per iteration (a longer prompt runs
#: alone). Design choice: vLLM v0 uses max(max_model_len, 2048); the models here have no enforced context limit,
#: and 16K tokens keep the GPU in its compute-bound regime (its FC time is linear beyond ~160 tokens).
PREFILL_TOKENS = 16384
#: vLLM's default ``gpu_memory_utilization`` (fraction of HBM the engine may use; vllm/config.py CacheConfig,
#: ``gpu_memory_utilization: float = 0.9``). A serving framework's safety margin, not a hardware limit: here an
#: option (``gpu_memory_utilization=0.9``), off by default (the whole HBM less weights and workspace), and every
#: run's summary.json states the value it used.
GPU_MEMORY_UTILIZATION = 0.9
#: vLLM's default ``max_num_seqs`` (sequences per iteration; vllm/config.py SchedulerConfig, 256): the rows of the
#: sampled logits the workspace holds.
MAX_NUM_SEQS = 256
#: vLLM's default KV block size (tokens).
BLOCK_TOKENS = 16
#: KV admission policy of every system (design choice, docs/l3_host.md): ``"reserve"`` admits a request when its
#: final KV (prompt + output) fits, as the trace-driven simulators L3 builds on do (lengths known from the trace);
#: no request is ever preempted. ``"paged"`` is vLLM's (grow block by block, preempt the newest and recompute).
KV_POLICY = "reserve"
#: Longest fused stretch of decode iterations priced at once (the engine asks again after it).
FUSE_CAP = 4096
#: HBM-PIM internal bandwidth: L3 Table 2 "260.8TB/s (HBM-PIM)" for 8 A100s = 16x the 16.3 TB/s HBM.
HBM_PIM_FACTOR = 260.8 / 16.3
#: Host CPU bandwidth for NEO-style attention: L3 Table 2 "406GB/s (CPU)" (16-channel DDR4-3200).
CPU_BANDWIDTH_GBPS = 406.0
#: NEO's mode rule (NEO-MLSys25 swiftllm scheduler): run the two sub-batches pipelined when together they hold
#: more than 2.4x the requests of the GPU-only (sequential) batch.
NEO_PIPELINE_RATIO = 2.4


def gpu_workspace_bytes(setup, tokens: int = PREFILL_TOKENS) -> float:
    """Activation and workspace bytes one GPU of the TP group needs besides weights and KV: the peak of one
    forward pass over ``tokens`` tokens (the largest batch a prefill-first system forms, :data:`PREFILL_TOKENS`),
    as vLLM measures it before sizing the KV cache (vllm/worker/worker.py ``determine_num_available_blocks``:
    a profiling forward pass at ``max_num_batched_tokens``; L3 6.4: HBM holds "model weights and intermediate data
    for prefilling requests, e.g., the activation"). Modelled from the live tensors of a layer, FP16: the
    residual stream and the normalized input (``2 d_model`` per token) plus the larger of the QKV output and the
    FFN's up-projection output on this GPU (``(q + 2 kv) / TP`` or ``(1 or 2) d_ff / TP`` per token), and the
    sampled logits, FP32 over the whole vocabulary for :data:`MAX_NUM_SEQS` sequences. FlashAttention keeps no
    score matrix; the CUDA context, CUDA graphs and NCCL buffers are not modelled (assumption,
    docs/l3_host.md)."""
    m, tp = setup.model, setup.tp
    wide = max((m.q_dim + 2 * m.kv_dim) / tp, (2 if m.gated_mlp else 1) * m.ffn_width() / tp)
    return float(tokens * m.dtype_bytes * (2 * m.d_model + wide) + MAX_NUM_SEQS * m.vocab * 4)


def hbm_kv_capacity_bytes(setup, gpu_memory_utilization: float | None = None) -> float:
    """KV bytes one replica's HBM holds: per GPU of the TP group, its HBM (times ``gpu_memory_utilization`` when
    that option is set, vLLM's headroom; None: off) less its weight shard and :func:`gpu_workspace_bytes`."""
    u = 1.0 if gpu_memory_utilization is None else float(gpu_memory_utilization)
    if not 0 < u <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u}")
    per_gpu = u * setup.node.gpu.hbm_bytes - setup.model.weight_bytes(setup.tp) - gpu_workspace_bytes(setup)
    return setup.tp * per_gpu


#: Systems whose KV lives in HBM only.
HBM_KV_SYSTEMS = ("gpu-only", "hbm-pim", "hbm-pim-serial", "hbm-pim-best")


def request_kv_limit_bytes(system: str, setup, *, gpu_memory_utilization: float | None = None) -> float:
    """The most KV one request of ``system`` can ever hold on one replica: HBM (GPU-only, HBM-PIM), host memory
    (L3, R-PIM) or the larger of the two (CPU offload keeps a request in either pool)."""
    hbm = hbm_kv_capacity_bytes(setup, gpu_memory_utilization)
    if system in HBM_KV_SYSTEMS:
        return hbm
    if system == "cpu-offload":
        return max(hbm, setup.host_capacity_bytes)
    return setup.host_capacity_bytes


def plan_batch(plan, table, view, waiting_pos):
    """The engine's :class:`Batch` of an L3 ``plan``: decodes and prefill chunks tagged with their sub-batch,
    the predictors' (T_GPU, T_PIM) per sub-batch in ``meta["pred"]``; admits the waiting requests the plan
    chose (``waiting_pos``: the waiting requests offered to the scheduler). None for an empty plan."""
    d_idx, d_sb, p_idx, p_chunk, p_sb = [], [], [], [], []
    for s, sb in enumerate(plan.sub):
        d_idx += sb.decode_rids
        d_sb += [s] * len(sb.decode_rids)
        p_idx += sb.prefill_rids
        p_chunk += sb.chunks
        p_sb += [s] * len(sb.prefill_rids)
    chosen = set(p_idx)
    for i in [r for r in view.waiting if r in waiting_pos and r in chosen]:
        view.admit(i)
    if not d_idx and not p_idx:
        return None
    return Batch.of(table, d_idx, p_idx, p_chunk, sub_batch=np.array(d_sb + p_sb, np.int8),
                    meta={"pred": [(sb.t_gpu, sb.t_pim) for sb in plan.sub]})

def resolve_min_gpu_tokens(value, gpu, setup) -> int:
    """The scheduler's token floor for ``value``: a number of tokens (0: none, the paper's rule), ``"knee"`` (the
    GPU's efficiency knee) or ``"ridge"`` (the roofline ridge of the node's GPU)."""
    if value is None or value == 0 or value == "0":
        return 0
    if value == "knee":
        return efficiency_knee_tokens(lambda t: gpu.fc(t, 0))
    if value == "ridge":
        g = setup.node.gpu
        return ridge_tokens(g.fp16_tflops, g.hbm_bw_gbps, setup.model.dtype_bytes)
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"min_gpu_tokens must be a token count >= 0, 'knee' or 'ridge', got {value!r}") from None
    if v < 0:
        raise ValueError(f"min_gpu_tokens must be >= 0, got {v}")
    return v


class _Common(System):
    """Shared parts: GPU side, KV budget, accounting of busy times and bubbles, trace lanes."""

    name = "l3-common"
    has_pim = True
    #: where decode attention runs, for the energy (host/energy.py): "dimm-pim" (its heads on the DIMM-PIM, the
    #: KV and the queries over PCIe and the DDR4 channels), "gpu", "hbm-pim" (in the HBM stacks: the GPU board's
    #: power) or "cpu" (the host CPU reading the KV from the DIMMs)
    decode_attention = "dimm-pim"

    def __init__(self, setup, *, batcher=None, replica: int = 0, seed: int = 0, kv_policy: str = KV_POLICY,
                 gpu_memory_utilization: float | None = None, pim_command_path: str = DEFAULT_COMMAND_PATH):
        super().__init__(batcher)
        if pim_command_path not in COMMAND_PATHS:
            raise ValueError(f"pim_command_path must be one of {COMMAND_PATHS}, got {pim_command_path!r}")
        #: the DIMM-PIM's command topology (host.l3.pim_timing: per_rank, L3 4 / 5.1; or shared); used by the
        #: systems whose PIM is L3's (their PIMSide), recorded by every system with a DIMM-PIM
        self.pim_command_path = pim_command_path
        if kv_policy not in ("reserve", "paged"):
            raise ValueError(f"kv_policy must be 'reserve' or 'paged', got {kv_policy!r}")
        self.kv_policy = kv_policy
        self.gpu_memory_utilization = gpu_memory_utilization
        hbm_kv_capacity_bytes(setup, gpu_memory_utilization)          # validates the option
        self.setup = setup
        self.replica = int(replica)
        self.seed = int(seed)
        self.gpu = GPUSide(setup)
        g0 = self.replica * setup.tp
        self.gpu_lanes = [f"GPU {g}" for g in range(g0, g0 + setup.tp)]
        u0 = self.replica * setup.host_uplinks
        self.pcie_lane = f"PCIe {u0}" if setup.host_uplinks == 1 else f"PCIe {u0}-{u0 + setup.host_uplinks - 1}"
        sfx = f" (replica {self.replica})" if setup.dp > 1 else ""
        self.rankset_lanes = [f"rankset {k}{sfx}" for k in range(setup.host.ranksets)]
        self.emit_spans = True          # False: no trace spans (sweeps)

    # memory ---------------------------------------------------------------------------------------------------
    def _budget(self, table):
        raise NotImplementedError

    def bind(self, table):
        super().bind(table)
        self.kv = self._budget(table)
        self.busy = {"gpu": 0.0, "pim": 0.0, "time": 0.0}
        self._view = None
        self._pending = None
        self.ework = {"gpu_s": 0.0, "pim_s": 0.0, "cpu_s": 0.0, "span": [float("inf"), float("-inf")], "heads": 0.0,
                      "head_tokens": 0.0, "kv_written_tokens": 0.0, "decode_tokens": 0.0}

    def can_admit(self, idx, now):
        return self.kv.can_admit(idx)

    def admission_error(self, idx):
        return self.kv.admission_error(idx)

    def on_admit(self, idx, now):
        self.kv.admit(idx)

    def on_finish(self, idx, now):
        self.kv.release(idx)

    def on_preempt(self, idx, now):
        self.kv.release(idx)

    def before_batch(self, view, now):
        self._view = view
        self.kv.grow(view)

    def _can_admit_more(self) -> bool:
        v = self._view
        return v is not None and len(v.waiting) > 0 and self.kv.can_admit(v.waiting[0])

    # accounting ----------------------------------------------------------------------------------------------
    def _account(self, dur, gpu, pim):
        self.busy["time"] += float(np.sum(dur))
        self.busy["gpu"] += float(np.sum(gpu))
        self.busy["pim"] += float(np.sum(pim))
        d = np.atleast_1d(np.asarray(dur, float))
        self._pending = (d, np.broadcast_to(np.asarray(gpu, float), d.shape),
                         np.broadcast_to(np.asarray(pim, float), d.shape), self.busy.get("cpu", 0.0))

    # energy (host/energy.py) -------------------------------------------------------------------------------
    def on_iteration_end(self, batch, result, now):
        """The energy's accounting of the iterations the engine kept (it may cut a priced decode stretch at the
        next arrival): busy seconds, the time span, and the decode attention's and the KV transfers' work."""
        dur = [result.duration_s] if isinstance(result, IterationResult) else np.asarray(result.durations_s)
        n = len(dur)
        e = self.ework
        if self._pending is not None:
            d, g, p, cpu0 = self._pending
            e["gpu_s"] += float(np.sum(g[:n]))
            e["pim_s"] += float(np.sum(p[:n]))
            if "cpu" in self.busy:      # the CPU's busy seconds of the priced iterations, the kept share of them
                e["cpu_s"] += (self.busy["cpu"] - cpu0) * (n / len(d))
            self._pending = None
        from host.energy import keep_busy
        keep_busy({}, None, e["span"], dur, now)                   # the span of the kept iterations
        m = self.setup.model
        dec = ~batch.prefill
        nd = int(dec.sum())
        kv = batch.kv_after[dec].astype(float)
        e["heads"] += nd * n * m.n_layers * m.n_kv_heads
        e["head_tokens"] += m.n_layers * m.n_kv_heads * (n * kv.sum() + nd * n * (n - 1) / 2)
        e["kv_written_tokens"] += float(batch.new_tokens[batch.prefill].sum()) + nd * n
        e["decode_tokens"] += nd * n

    def energy(self, window_s: float):
        """This replica's :class:`host.energy.EnergyLedger` over ``window_s`` seconds (the node's run, from the
        first iteration's start to the last one's end over every replica): its ``tp`` GPU boards with their
        busy seconds (``hbm-pim``: the HBM-PIM's busy seconds too, clipped at the window: an upper bound); its share
        of the DDR4 DIMMs (``ranks / dp`` ranks) in precharge standby; with the KV in the DIMMs
        (``dimm-pim``, ``cpu``), every token's KV written over PCIe and a DDR4 channel, and with ``dimm-pim`` every
        decode head (sim.energy.pim, beyond standby: its DRAM part to ``dram``, its PUs to ``pim``) and its query
        and output over both; ``cpu``: the KV the CPU reads (its busy seconds x the host memory bandwidth) at the
        DDR4 read and channel energy (the CPU's own power is not charged)."""
        from hdl.memctl.timing import DDR4_3200
        from sim.perf.pim import L3_CPU_BANDWIDTH_GBPS
        from host.energy import EnergyLedger, dram_rank_idle_w, pim_head_increment_pj, ddr4_read_pj_per_bit
        s, e, m = self.setup, self.ework, self.setup.model
        led = EnergyLedger()
        busy = e["gpu_s"] + (e["pim_s"] if self.decode_attention == "hbm-pim" else 0.0)
        led.add_gpu(s.node.gpu.name, s.tp, window_s, min(busy, window_s))
        led.add("dram", s.host.ranks / s.dp * dram_rank_idle_w(DDR4_3200) * window_s)
        if self.decode_attention in ("dimm-pim", "cpu"):
            lb = self.link_bytes()      # the KV written; with dimm-pim each decode token's query in, output out
            bits = 8.0 * (lb["pcie_out"] + lb["pcie_in"])
            if self.decode_attention == "dimm-pim":
                d_pj, pu_pj = pim_head_increment_pj(m.head_dim, e["heads"], e["head_tokens"])
                led.add("dram", d_pj * 1e-12)
                led.add("pim", pu_pj * 1e-12)
            else:
                rbits = 8.0 * e["cpu_s"] * L3_CPU_BANDWIDTH_GBPS * 1e9
                led.add("dram", rbits * ddr4_read_pj_per_bit() * 1e-12)
                led.add_link("ddr4", rbits)
            led.add_link(s.host_link.name, bits)
            led.add_link("ddr4", bits)
        return led

    def link_bytes(self) -> dict:
        """Bytes this replica moved over its host link (PCIe) in the iterations the engine kept, by direction (the
        same work the energy charges, :meth:`energy`): ``pcie_out`` (GPU to host memory: every token's KV written
        to the DIMMs, and with ``dimm-pim`` every decode token's query per layer), ``pcie_in`` (host to GPU: the
        decode attention's output per token and layer). 0 where the KV stays in HBM."""
        e, s = self.ework, self.setup
        m = s.model
        if self.decode_attention not in ("dimm-pim", "cpu"):
            return {"pcie_out": 0.0, "pcie_in": 0.0}
        kv = e["kv_written_tokens"] * s.kv_bytes_per_token
        vec = e["decode_tokens"] * m.n_layers * m.d_model * m.dtype_bytes if self.decode_attention == "dimm-pim" \
            else 0.0
        return {"pcie_out": float(kv + vec), "pcie_in": float(vec)}

    def _gpu_spans(self, name, start, dur, args=None):
        if not self.emit_spans or not dur > 0:
            return []
        return [Span(l, name, float(start), float(dur), args) for l in self.gpu_lanes]

    def summary(self):
        t = self.busy["time"]
        out = {"gpu_bubble_frac": 1.0 - self.busy["gpu"] / t if t > 0 else float("nan"),
               "pim_bubble_frac": (1.0 - self.busy["pim"] / t if t > 0 else float("nan")) if self.has_pim
               else float("nan"),
               "busy_time_s": t, "gpu_busy_s": self.busy["gpu"], "pim_busy_s": self.busy["pim"],
               "kv_capacity_tokens": int(self.kv.capacity_tokens), "kv_peak_tokens": int(self.kv.peak_tokens)}
        return out

    def config(self):
        return {"name": self.name, "replica": self.replica, "seed": self.seed, "kv_policy": self.kv_policy,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "pim_command_path": self.pim_command_path if self.has_pim else None,
                "hbm_kv_capacity_bytes": hbm_kv_capacity_bytes(self.setup, self.gpu_memory_utilization),
                "gpu_workspace_bytes_per_gpu": gpu_workspace_bytes(self.setup), **self.setup.describe()}


# ---------------------------------------------------------------------------------------------------------------
# L3
# ---------------------------------------------------------------------------------------------------------------

class L3System(_Common):
    """L3 (see the module docstring). ``comm`` / ``sched`` switch the 5.1 / 5.2 optimisations; ``min_gpu_tokens``
    is the scheduler's token floor, an extension (default 0: the paper's rule as written; ``"knee"``: the GPU's
    efficiency knee, :func:`host.l3.scheduler.efficiency_knee_tokens`; ``"ridge"``: the roofline ridge; or a
    number of tokens); ``max_candidates`` bounds the prefill queue the scheduler looks at; ``placement``
    (``"balanced"`` / ``"random"``) overrides the rankset placement that goes with ``comm`` (a labelled variant:
    ``l3-no-comm-balanced`` pays 5.1's monolithic transfers with 5.1's balanced placement)."""

    def __init__(self, setup, *, comm=True, sched=True, min_gpu_tokens=0, replica=0, seed=0,
                 predictor_kw=None, max_candidates=32, profile_batches=384, kv_policy=KV_POLICY, placement=None,
                 **kv_kw):
        batcher = None if sched else ContinuousBatcher(policy="prefill-first", max_tokens=PREFILL_TOKENS)
        super().__init__(setup, batcher=batcher, replica=replica, seed=seed, kv_policy=kv_policy, **kv_kw)
        self.comm, self.sched = bool(comm), bool(sched)
        self.name = {(True, True): "l3", (False, True): "l3-no-comm", (True, False): "l3-no-sched",
                     (False, False): "l3-base"}[(self.comm, self.sched)]
        own = "balanced" if self.comm else "random"
        self.placement = own if placement is None else placement
        if self.placement not in ("balanced", "random"):
            raise ValueError(f"placement must be 'balanced' or 'random', got {placement!r}")
        if self.placement != own:
            self.name += f"-{self.placement}"
        self.min_gpu_tokens = resolve_min_gpu_tokens(min_gpu_tokens, self.gpu, setup)
        self.pim = PIMSide(setup, comm=self.comm, command_path=self.pim_command_path)
        self.predictor_kw = dict(predictor_kw or {})
        self.max_candidates = int(max_candidates)
        self.profile_batches = int(profile_batches)

    def _budget(self, table):
        return KVBudget(table, capacity_bytes=self.setup.host_capacity_bytes,
                        bytes_per_token=self.setup.kv_bytes_per_token, policy=self.kv_policy, block_tokens=BLOCK_TOKENS)

    def bind(self, table):
        super().bind(table)
        self.place = RanksetPlacement(table.n, self.setup.host.ranksets,
                                      policy=self.placement, seed=self.seed)
        self.pred = L3Predictors(seed=self.seed, cold=self.profile_batches == 0, **self.predictor_kw) \
            if self.sched else None
        self.profiled = []             # ProfiledBatches of the priced iterations (for the predictor study)
        self._buf = {"pim": [], "batch": [], "p": []}
        self._since_learn = 0
        self.online_err = {"pim": [0.0, 0], "gpu": [0.0, 0]}
        if self.sched and self.profile_batches:
            self.pred.seed(self._startup_profile())

    def on_admit(self, idx, now):
        super().on_admit(idx, now)
        for i in np.atleast_1d(idx).tolist():
            self.place.place(i, int(self.kv.held_tokens[i]))

    def on_finish(self, idx, now):
        super().on_finish(idx, now)
        self.place.release(idx)

    def on_preempt(self, idx, now):
        super().on_preempt(idx, now)
        self.place.release(idx)

    # ---- start-up profile: random sub-batches priced by the true models --------------------------------------
    def _startup_profile(self) -> ProfiledBatches:
        """Random sub-batches priced by the true models, spread log-uniformly over the sizes a run meets (the
        start-up profiling pass; design choice, docs/l3_host.md)."""
        rng = np.random.default_rng(self.seed + 7919)
        R, parts = self.setup.host.ranksets, []
        logu = lambda lo, hi, n: np.exp(rng.uniform(np.log(lo), np.log(hi), n))
        for _ in range(self.profile_batches):
            nd = 0 if rng.random() < 0.15 else int(logu(1, 513, 1)[0])
            L = np.rint(logu(16, 65536, nd)).astype(np.int64)
            cls = rng.integers(0, R, nd)
            npre = int(rng.integers(0, 4))
            c = np.maximum(1, np.rint(logu(1, 513, npre))).astype(np.int64) * 16
            f = np.where(rng.random(npre) < 0.4, 0, np.rint(logu(16, 32768, npre))).astype(np.int64)
            no = int(rng.integers(0, 3))
            oc = np.maximum(1, np.rint(logu(1, 513, no))).astype(np.int64) * 16
            parts.append(self._profile(L - 1, L, cls, c, f, oc, rng.integers(0, R, no)))
        return ProfiledBatches.concat(parts)

    def _profile(self, ctx, L, cls, c, f, other_c, other_cls, g_true=None, p_true=None, fc=None
                 ) -> ProfiledBatches:
        """One profiled sub-batch: decodes (contexts ``ctx``, attention lengths ``L``, classes), its prefill
        chunks ``c`` over ``f`` finished tokens, and the other sub-batch's chunks (offloaded meanwhile); the true
        times are computed unless given."""
        nd = len(L)
        kv = np.asarray(f) + np.asarray(c)
        if fc is None:
            fc = float(self.gpu.fc(int(np.sum(c)) + nd, nd))
        tp_each = self.gpu.prefill_attn_each(c, kv) if len(c) else np.zeros(0)
        g = g_true
        if g is None:
            g = fc + (self.gpu.prefill_attn(c, kv) if len(c) else 0.0)
        if p_true is None:
            p_true = self.pim.n_layers * self.pim.phase(L, cls, other_c, other_cls).total
        return profiled_sub_batch(sum_fd=float(np.sum(ctx)), n_d=nd, sum_cp_other=float(np.sum(other_c)),
                                  t_pim=p_true, chunks=c, done=f, t_p_each=tp_each, t_fc=fc, t_gpu=g)

    # ---- the batch --------------------------------------------------------------------------------------------
    def form_batch(self, view, now):
        if not self.sched:
            return self.batcher.form(view, self)
        t = self.table
        run = view.running
        in_pre = t.in_prefill(run)
        dec = run[~in_pre]
        items, waiting_pos = [], {}
        for i in run[in_pre].tolist():                      # chunked requests: the head of the prefill queue
            items.append(PrefillItem(int(i), int(t.prefill_len[i] - t.prefilled[i]), int(t.prefilled[i])))
        free = self.kv.free_tokens
        cand = np.fromiter(itertools.islice(view.waiting, self.max_candidates), np.int64)
        if len(cand):
            fits = np.cumsum(self.kv.need_tokens(cand)) <= free
            cand = cand[:len(fits) if fits.all() else int(np.argmin(fits))]     # FCFS: no overtaking
            left = t.prefill_len[cand] - t.prefilled[cand]
            for i, r, f in zip(cand.tolist(), left.tolist(), t.prefilled[cand].tolist()):
                waiting_pos[i] = len(items)
                items.append(PrefillItem(i, r, f))
        state = SchedState(decode_rids=tuple(dec.tolist()), decode_context=tuple(t.context(dec).tolist()),
                           prefills=tuple(items), decode_class=tuple(self.place.cls[dec].tolist()))
        plan = schedule(state, self.pred, min_gpu_tokens=self.min_gpu_tokens)
        return plan_batch(plan, t, view, waiting_pos)

    # ---- the price ----------------------------------------------------------------------------------------------
    def _parts(self, batch):
        pre = batch.prefill
        sb = batch.sub_batch if batch.sub_batch is not None else np.zeros(len(batch), np.int8)
        out = []
        for i in (0, 1):
            d = ~pre & (sb == i)
            p = pre & (sb == i)
            out.append(dict(ctx=batch.context[d], L=batch.kv_after[d], cls=self.place.cls[batch.req[d]],
                            c=batch.new_tokens[p], f=batch.context[p], kv=batch.kv_after[p],
                            pcls=self.place.cls[batch.req[p]], done=int(np.sum(batch.completes_prefill[p]))))
        return out

    def price(self, batch, now):
        if not self.sched:
            return self._price_single(batch)
        s = self._parts(batch)
        nl = self.pim.n_layers
        G, P, Pb, ph, fcs = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [None, None], [0.0, 0.0]
        for i in (0, 1):
            nd = len(s[i]["L"])
            fcs[i] = float(self.gpu.fc(int(s[i]["c"].sum()) + nd, nd + s[i]["done"]))
            G[i] = fcs[i] + self.gpu.prefill_attn(s[i]["c"], s[i]["kv"])
            if not self.comm:                                # synchronous offload: the GPU waits (5.1 off)
                G[i] += self.pim.offload(s[i]["c"])
        for i in (0, 1):
            o = s[1 - i]
            ph[i] = self.pim.phase(s[i]["L"], s[i]["cls"], o["c"], o["pcls"])
            P[i], Pb[i] = nl * ph[i].total, nl * ph[i].busy
        A, B = max(G[0], P[1]), max(G[1], P[0])
        dur = A + B
        self._account(dur, G[0] + G[1], Pb[0] + Pb[1])
        self._learn(batch, s, G, P, fcs)
        spans = self._spans(G, P, Pb, ph, A) if self.emit_spans else []
        rec = {"t_gpu0_s": G[0], "t_gpu1_s": G[1], "t_pim0_s": P[0], "t_pim1_s": P[1], "phase_a_s": A,
               "phase_b_s": B}
        pred = batch.meta.get("pred")
        if pred:
            rec.update({"pred_gpu0_s": pred[0][0], "pred_gpu1_s": pred[1][0], "pred_pim0_s": pred[0][1],
                        "pred_pim1_s": pred[1][1]})
        return IterationResult(dur, breakdown={"gpu_s": G[0] + G[1], "pim_s": Pb[0] + Pb[1]}, spans=spans,
                               record=rec)

    #: profiled sub-batches are handed to the predictors in groups of this many iterations
    LEARN_EVERY = 32

    def _learn(self, batch, s, G, P, fcs):
        """Profile the two sub-batches' true times (rows buffered, handed to the predictors every
        :attr:`LEARN_EVERY` iterations) and track the online prediction error."""
        buf = self._buf
        pred = batch.meta.get("pred")
        for i in (0, 1):
            o = s[1 - i]
            nd, c = len(s[i]["L"]), s[i]["c"]
            if not nd and not len(c):
                continue
            row = len(buf["pim"])
            buf["pim"].append((float(s[i]["ctx"].sum()), nd, float(o["c"].sum()), P[i]))
            buf["batch"].append((float(c.sum()), nd, fcs[i], G[i]))
            if len(c):
                if len(c) == 1:     # T_GPU = FC + its attention (+ the synchronous offload without 5.1)
                    each = [G[i] - fcs[i] - (0.0 if self.comm else self.pim.offload(c))]
                else:
                    each = self.gpu.prefill_attn_each(c, s[i]["kv"]).tolist()
                for cc, ff, tt in zip(c.tolist(), s[i]["f"].tolist(), each):
                    buf["p"].append((cc, ff, tt, row))
            if pred:
                for key, true, est in (("pim", P[i], pred[i][1]), ("gpu", G[i], pred[i][0])):
                    if true > 0:
                        e = self.online_err[key]
                        e[0] += abs(true - est) / true
                        e[1] += 1
        self._since_learn += 1
        if self._since_learn >= self.LEARN_EVERY or not self.pred.ready:     # cold: learn from every iteration
            self._flush_learning()

    def _flush_learning(self):
        buf = self._buf
        self._since_learn = 0
        if not buf["pim"]:
            return
        pim, bat = np.array(buf["pim"], dtype=np.float64), np.array(buf["batch"], dtype=np.float64)
        pr = np.array(buf["p"], dtype=np.float64).reshape(-1, 4)
        pb = ProfiledBatches(pim_X=pim[:, :3], pim_y=pim[:, 3], p_X=pr[:, :2], p_y=pr[:, 2], batch_X=bat[:, :2],
                             batch_y=bat[:, 2], gpu_y=bat[:, 3], p_owner=pr[:, 3].astype(np.int64))
        for k in buf:
            buf[k] = []
        self.profiled.append(pb)
        self.pred.observe(pb)

    def profiled_batches(self) -> ProfiledBatches:
        """Every sub-batch this system priced with the scheduler (true times), for the predictor study."""
        if self.sched:
            self._flush_learning()
        return ProfiledBatches.concat(self.profiled)

    def _spans(self, G, P, Pb, ph, A):
        nl, R = self.pim.n_layers, self.pim.R
        sp = self._gpu_spans("sub-batch 0 GPU", 0.0, G[0], {"layers": nl}) + \
            self._gpu_spans("sub-batch 1 GPU", A, G[1], {"layers": nl})
        for i, start in ((1, 0.0), (0, A)):
            p = ph[i]
            per = (p.compute + p.writes) if p.compute.size else np.zeros(R)
            # over all layers every rankset holds each class once per R layers: the same total work
            each = nl / R * float(np.sum(per))
            if each > 0:
                sp += [Span(l, f"sub-batch {i} PIM", start, each, {"layers": nl}) for l in self.rankset_lanes]
            link = nl * (p.t_in + p.t_out + p.write)
            if link > 0:
                sp.append(Span(self.pcie_lane, f"sub-batch {i} QKV/out + prefill KV", start, link))
        return sp

    def _price_single(self, batch):
        """Without the scheduler: one batch, GPU and PIM in series (prefill-first batches)."""
        nl = self.pim.n_layers
        pre = batch.prefill
        c, kv = batch.new_tokens[pre], batch.kv_after[pre]
        nd = int((~pre).sum())
        g = float(self.gpu.fc(int(c.sum()) + nd, nd + int(batch.completes_prefill.sum())))
        g += self.gpu.prefill_attn(c, kv)
        L, cls = batch.kv_after[~pre], self.place.cls[batch.req[~pre]]
        ph = self.pim.phase(L, cls)
        p_crit = nl * ph.total
        off = self.pim.offload(c, self.place.cls[batch.req[pre]])
        if self.comm:
            dur = max(g, off) + p_crit           # offload overlapped with the GPU work (the PIM is idle then)
        else:
            dur = g + off + p_crit               # synchronous offload
        pim_busy = nl * ph.busy + off
        self._account(dur, g, pim_busy)
        sp = self._gpu_spans("batch GPU", 0.0, g, {"layers": nl})
        if nl * ph.busy > 0:
            sp += [Span(l, "decode PIM", g, nl / self.pim.R * float(np.sum(ph.compute)), {"layers": nl})
                   for l in self.rankset_lanes]
        if off > 0:
            sp.append(Span(self.pcie_lane, "prefill KV offload", 0.0 if self.comm else g, off))
        return IterationResult(dur, breakdown={"gpu_s": g, "pim_s": pim_busy}, spans=sp,
                               record={"t_pim_s": p_crit, "offload_s": off})

    def price_decode_run(self, batch, max_iters, now):
        if self._can_admit_more():
            return None
        k = int(min(max_iters, self.kv.headroom_iters(batch.req) + 1, FUSE_CAP))
        if k < 2:
            return None
        nl = self.pim.n_layers
        sb = batch.sub_batch if batch.sub_batch is not None and self.sched else np.zeros(len(batch), np.int8)
        G, P, Pb = [], [], []
        for i in (0, 1):
            m = sb == i
            nd = int(m.sum())
            G.append(float(self.gpu.fc(nd, nd)) if nd else 0.0)
            tot, busy = self.pim.run_totals(batch.kv_after[m], self.place.cls[batch.req[m]], k)
            P.append(tot)
            Pb.append(busy)
        if self.sched:
            d = np.maximum(G[0], P[1]) + np.maximum(G[1], P[0])
        else:
            d = G[0] + P[0]
        gpu_b, pim_b = (G[0] + G[1]) * np.ones(k), Pb[0] + Pb[1]
        self._account(d, gpu_b, pim_b)
        sp = self._gpu_spans(f"decode x{k}", 0.0, float(gpu_b.sum()), {"iterations": k})
        sp += [Span(l, f"decode PIM x{k} (busiest rankset)", 0.0, float(pim_b.sum()), {"iterations": k})
               for l in self.rankset_lanes]
        return RunResult(d, breakdown={"gpu_s": gpu_b, "pim_s": pim_b}, spans=sp)

    def on_iteration_end(self, batch, result, now):
        super().on_iteration_end(batch, result, now)
        k = len(result.durations_s) if isinstance(result, RunResult) else 1
        self.place.grow(batch.req, batch.kv_after + (k - 1))

    def summary(self):
        out = super().summary()
        if self.sched:
            for key, (s, n) in self.online_err.items():
                out[f"pred_re_{key}_online"] = s / n if n else float("nan")
            out.update({f"pred_{k}": v for k, v in self.pred.state().items()})
            out["min_gpu_tokens"] = self.min_gpu_tokens
            out["predictor_seed_batches"] = self.profile_batches
        return out

    def config(self):
        return {**super().config(), "comm": self.comm, "sched": self.sched, "min_gpu_tokens": self.min_gpu_tokens,
                "predictor_seed_batches": self.profile_batches if self.sched else None,
                "placement": self.place.policy if hasattr(self, "place") else None,
                "prefill_tokens": None if self.sched else PREFILL_TOKENS}


# ---------------------------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------------------------

class _HBMKV(_Common):
    def _budget(self, table):
        cap = hbm_kv_capacity_bytes(self.setup, self.gpu_memory_utilization)
        if cap <= 0:
            raise ValueError(f"{self.setup.model.name}: the weights do not fit the TP group's HBM")
        return KVBudget(table, capacity_bytes=cap, bytes_per_token=self.setup.kv_bytes_per_token, policy=self.kv_policy,
                        block_tokens=BLOCK_TOKENS)


class GPUOnlySystem(_HBMKV):
    """vLLM-style GPU-only serving (module docstring)."""

    name = "gpu-only"
    decode_attention = "gpu"
    has_pim = False

    def __init__(self, setup, *, replica=0, seed=0, kv_policy=KV_POLICY, **kv_kw):
        super().__init__(setup, batcher=ContinuousBatcher(policy="prefill-first", max_tokens=PREFILL_TOKENS),
                         replica=replica, seed=seed, kv_policy=kv_policy, **kv_kw)

    def _time(self, batch, extra_kv=0):
        pre = batch.prefill
        nd = int((~pre).sum())
        fc = float(self.gpu.fc(batch.num_tokens, nd + int(batch.completes_prefill.sum())))
        att = self.gpu.prefill_attn(batch.new_tokens[pre], batch.kv_after[pre])
        dec = self.gpu.decode_attn(nd, int(batch.kv_after[~pre].sum()) + extra_kv)
        return fc + att + dec

    def price(self, batch, now):
        d = self._time(batch)
        self._account(d, d, 0.0)
        return IterationResult(d, breakdown={"gpu_s": d}, spans=self._gpu_spans("batch", 0.0, d))

    def price_decode_run(self, batch, max_iters, now):
        if self._can_admit_more():
            return None
        k = int(min(max_iters, self.kv.headroom_iters(batch.req) + 1, FUSE_CAP))
        if k < 2:
            return None
        nd = len(batch)
        d = float(self.gpu.fc(nd, nd)) + self.gpu.decode_attn(nd, batch.kv_after.sum() + nd * np.arange(k))
        self._account(d, d, 0.0)
        return RunResult(d, breakdown={"gpu_s": d}, spans=self._gpu_spans(f"decode x{k}", 0.0, float(d.sum())))


class HBMPIMSystem(_HBMKV):
    """NeuPIMs / AttAcc-style GPU + HBM-PIM (module docstring)."""

    name = "hbm-pim"
    decode_attention = "hbm-pim"
    #: decode modes -> system names: L3 6.1's sub-batches (default), one batch in series, the faster of the two
    MODES = {"sub-batches": "hbm-pim", "serial": "hbm-pim-serial", "best": "hbm-pim-best"}

    def __init__(self, setup, *, decode_mode="sub-batches", replica=0, seed=0, kv_policy=KV_POLICY, **kv_kw):
        super().__init__(setup, batcher=ContinuousBatcher(policy="prefill-first", max_tokens=PREFILL_TOKENS),
                         replica=replica, seed=seed, kv_policy=kv_policy, **kv_kw)
        if decode_mode not in self.MODES:
            raise ValueError(f"HBM-PIM decode_mode must be one of {list(self.MODES)}, got {decode_mode!r}")
        self.decode_mode = decode_mode
        self.name = self.MODES[decode_mode]
        m = setup.model
        self.pim_Bps = HBM_PIM_FACTOR * setup.tp * setup.node.gpu.hbm_bw_gbps * 1e9
        self.kv_tok_layer = 2 * m.n_kv_heads * m.head_dim * m.dtype_bytes
        self.timing = pim_timing()
        self.pim_lanes = [f"HBM-PIM {g[4:]}" for g in self.gpu_lanes]

    def pim_time(self, L):
        """All-layer HBM-PIM attention time of decodes over ``L`` tokens (last axis; vectorized over leading
        axes): KV bytes at the internal bandwidth, derated by the all-bank kernel's utilization at that length (the
        DIMM-PIM model's ideal / actual cycles: the same row-streaming structure; assumption, docs/l3_host.md)."""
        L = np.asarray(L, dtype=np.int64)
        if L.shape[-1] == 0:
            return np.zeros(L.shape[:-1]) if L.ndim > 1 else 0.0
        t = self.timing
        util = t.rd_ab(L) * t.model.tm.tCCD_L / t.head_cycles(L)
        out = self.setup.model.n_layers * np.sum(L * self.kv_tok_layer / util, axis=-1) / self.pim_Bps
        return float(out) if np.ndim(out) == 0 else out

    def _decode_iteration(self, L, ctx_split=None):
        """(duration, GPU busy, PIM busy) of a decode iteration. ``sub-batches`` (L3 6.1, NeuPIMs): two
        interleaved sub-batches, ``max(FC_0, PIM_1) + max(FC_1, PIM_0)``; ``serial``: one batch, ``FC + PIM``;
        ``best``: the faster of the two (two sub-batches read the weights twice, which loses when the FC
        dominates)."""
        n = len(L)
        f_all, p_all = float(self.gpu.fc(n, n)), self.pim_time(L)
        if self.decode_mode == "serial":
            return f_all + p_all, f_all, p_all
        a, b = balanced_split(L) if ctx_split is None else ctx_split
        n0, n1 = len(a), len(b)
        f0, f1 = float(self.gpu.fc(n0, n0)), float(self.gpu.fc(n1, n1))
        p0, p1 = self.pim_time(L[a]), self.pim_time(L[b])
        split = max(f0, p1) + max(f1, p0)
        if self.decode_mode == "sub-batches" or split < f_all + p_all:
            return split, f0 + f1, p0 + p1
        return f_all + p_all, f_all, p_all

    def price(self, batch, now):
        pre = batch.prefill
        if pre.any():
            d = float(self.gpu.fc(batch.num_tokens, int(batch.completes_prefill.sum()))) + \
                self.gpu.prefill_attn(batch.new_tokens[pre], batch.kv_after[pre])
            self._account(d, d, 0.0)
            return IterationResult(d, breakdown={"gpu_s": d}, spans=self._gpu_spans("prefill", 0.0, d))
        d, g, p = self._decode_iteration(batch.kv_after)
        self._account(d, g, p)
        sp = self._gpu_spans("decode FC" + ("" if self.decode_mode == "serial" else " (2 sub-batches)"), 0.0, g) + \
            [Span(l, "decode attention", 0.0, p / 2) for l in self.pim_lanes]
        return IterationResult(d, breakdown={"gpu_s": g, "pim_s": p}, spans=sp)

    def price_decode_run(self, batch, max_iters, now):
        if self._can_admit_more():
            return None
        k = int(min(max_iters, self.kv.headroom_iters(batch.req) + 1, FUSE_CAP))
        if k < 2:
            return None
        L = batch.kv_after
        a, b = balanced_split(L)
        pts = np.unique(np.append(np.arange(0, k, 16), k - 1))
        n, n0, n1 = len(L), len(a), len(b)
        f_all, f0, f1 = (float(self.gpu.fc(x, x)) for x in (n, n0, n1))
        grow = pts[:, None]
        p_all = self.pim_time(L[None, :] + grow)
        p0, p1 = self.pim_time(L[a][None, :] + grow), self.pim_time(L[b][None, :] + grow)
        split = np.maximum(f0, p1) + np.maximum(f1, p0)
        use = {"sub-batches": np.ones(len(pts), bool), "serial": np.zeros(len(pts), bool),
               "best": split < f_all + p_all}[self.decode_mode]
        vals = np.stack([np.where(use, split, f_all + p_all), np.where(use, f0 + f1, f_all),
                         np.where(use, p0 + p1, p_all)], axis=1)
        d, g, p = (np.interp(np.arange(k), pts, vals[:, j]) for j in range(3))
        self._account(d, g, p)
        sp = self._gpu_spans(f"decode x{k}", 0.0, float(g.sum())) + \
            [Span(l, f"decode attention x{k}", 0.0, float(p.sum()) / 2) for l in self.pim_lanes]
        return RunResult(d, breakdown={"gpu_s": g, "pim_s": p}, spans=sp)


class RPIMSystem(_Common):
    """Hermes-style rank-level DIMM-PIM (module docstring)."""

    name = "r-pim"

    def __init__(self, setup, *, replica=0, seed=0, kv_policy=KV_POLICY, **kv_kw):
        super().__init__(setup, batcher=ContinuousBatcher(policy="prefill-first", max_tokens=PREFILL_TOKENS),
                         replica=replica, seed=seed, kv_policy=kv_policy, **kv_kw)
        # transfers and placement as L3, on the same command path
        self.pim = PIMSide(setup, comm=True, command_path=self.pim_command_path)
        rs = rankset_model(self.pim_command_path, setup.host.pim_config)
        tm = pim_timing(setup.host.pim_config).model.tm
        org = pim_timing(setup.host.pim_config).config.dram.org
        # one rank PU streams its rank at the DQ rate (measured stream efficiency of rankset_sim's writer), less
        # refresh; on the shared command path the channel's command bus carries one RD per burst of every streaming
        # rank, on the rank PUs' own paths (per_rank, the default) nothing slows a streaming rank
        demand = 1.0 / tm.tCCD_S + 2.0 / (org.banks_per_group * org.bursts_per_row)
        shared = self.pim_command_path == "shared"
        self._bus = [1.0] + [min(1.0, 1.0 / (k * demand)) if shared else 1.0
                             for k in range(1, setup.host.ranksets + 1)]
        self.rank_Bps = rs.channel_write_gbps * 1e9 * (1 - tm.tRFC / tm.tREFI)
        m = setup.model
        self.head_tok_bytes = 2 * m.head_dim * m.dtype_bytes          # K and V of one head, one token

    def _budget(self, table):
        return KVBudget(table, capacity_bytes=self.setup.host_capacity_bytes,
                        bytes_per_token=self.setup.kv_bytes_per_token, policy=self.kv_policy, block_tokens=BLOCK_TOKENS)

    def bind(self, table):
        super().bind(table)
        self.place = RanksetPlacement(table.n, self.setup.host.ranksets, policy="balanced", seed=self.seed)

    def on_admit(self, idx, now):
        super().on_admit(idx, now)
        for i in np.atleast_1d(idx).tolist():
            self.place.place(i, int(self.kv.held_tokens[i]))

    def on_finish(self, idx, now):
        super().on_finish(idx, now)
        self.place.release(idx)

    on_preempt = on_finish

    def pim_layer(self, L, cls):
        """One layer's rank-PU time: the busiest class's KV bytes per rank at the rank's stream bandwidth."""
        L = np.asarray(L, dtype=np.float64)
        if not L.size:
            return 0.0
        per = np.bincount(np.asarray(cls), weights=L, minlength=self.pim.R) * self.setup.heads_per_rank
        bus = self._bus[int(np.count_nonzero(per))]
        return float(per.max()) * self.head_tok_bytes / (self.rank_Bps * bus)

    def price(self, batch, now):
        nl = self.pim.n_layers
        pre = batch.prefill
        if pre.any():
            g = float(self.gpu.fc(batch.num_tokens, int(batch.completes_prefill.sum()))) + \
                self.gpu.prefill_attn(batch.new_tokens[pre], batch.kv_after[pre])
            off = self.pim.sync_offload(batch.new_tokens[pre])
            d = max(g, off)                                  # hidden by concurrent computation (6.1)
            self._account(d, g, 0.0)
            sp = self._gpu_spans("prefill", 0.0, g) + ([Span(self.pcie_lane, "prefill KV", 0.0, off)] if off else [])
            return IterationResult(d, breakdown={"gpu_s": g}, spans=sp)
        nd = len(batch)
        g = float(self.gpu.fc(nd, nd))
        pim = nl * self.pim_layer(batch.kv_after, self.place.cls[batch.req])
        io = nl * float(self.pim.transfer_in(nd) + self.pim.transfer_out(nd))
        d = g + pim + io
        self._account(d, g, pim)
        sp = self._gpu_spans("decode FC", 0.0, g) + [Span(l, "decode attention", g + io / 2, pim)
                                                     for l in self.rankset_lanes]
        return IterationResult(d, breakdown={"gpu_s": g, "pim_s": pim}, spans=sp)

    def price_decode_run(self, batch, max_iters, now):
        if self._can_admit_more():
            return None
        k = int(min(max_iters, self.kv.headroom_iters(batch.req) + 1, FUSE_CAP))
        if k < 2:
            return None
        nl, nd = self.pim.n_layers, len(batch)
        g = float(self.gpu.fc(nd, nd))
        cls = self.place.cls[batch.req]
        per = np.bincount(cls, weights=batch.kv_after.astype(float), minlength=self.pim.R)
        cnt = np.bincount(cls, minlength=self.pim.R)
        i = np.arange(k)
        busiest = (per[None, :] + cnt[None, :] * i[:, None]).max(axis=1)
        bus = self._bus[int(np.count_nonzero(cnt))]
        pim = nl * busiest * self.setup.heads_per_rank * self.head_tok_bytes / (self.rank_Bps * bus)
        io = nl * float(self.pim.transfer_in(nd) + self.pim.transfer_out(nd))
        d = g + pim + io
        self._account(d, g * np.ones(k), pim)
        sp = self._gpu_spans(f"decode x{k}", 0.0, g * k) + [Span(l, f"decode attention x{k}", 0.0, float(pim.sum()))
                                                         for l in self.rankset_lanes]
        return RunResult(d, breakdown={"gpu_s": g * np.ones(k), "pim_s": pim}, spans=sp)

    def on_iteration_end(self, batch, result, now):
        super().on_iteration_end(batch, result, now)
        k = len(result.durations_s) if isinstance(result, RunResult) else 1
        self.place.grow(batch.req, batch.kv_after + (k - 1))


class CPUOffloadSystem(_Common):
    """NEO-style CPU offloading (module docstring): two KV pools, GPU-resident decodes in sub-batch 0 with the
    prefills, host-resident decodes in sub-batch 1 with their attention on the CPU."""

    name = "cpu-offload"
    decode_attention = "cpu"
    has_pim = False

    def __init__(self, setup, *, replica=0, seed=0, kv_policy=KV_POLICY, **kv_kw):
        super().__init__(setup, replica=replica, seed=seed, kv_policy=kv_policy, **kv_kw)
        self.pim = PIMSide(setup, comm=True)                 # PCIe transfers of the CPU decodes' Q/K/V and outputs
        self.cpu_Bps = CPU_BANDWIDTH_GBPS * 1e9 / setup.dp   # the replica's share of the host DRAM bandwidth
        m = setup.model
        self.kv_tok_layer = 2 * m.n_kv_heads * m.head_dim * m.dtype_bytes
        self.cpu_lane = f"CPU{f' (replica {self.replica})' if setup.dp > 1 else ''}"

    def _budget(self, table):
        cap = hbm_kv_capacity_bytes(self.setup, self.gpu_memory_utilization)
        if cap <= 0:
            raise ValueError(f"{self.setup.model.name}: the weights do not fit the TP group's HBM")
        return KVBudget(table, capacity_bytes=cap, bytes_per_token=self.setup.kv_bytes_per_token, policy=self.kv_policy,
                        block_tokens=BLOCK_TOKENS)

    def bind(self, table):
        super().bind(table)
        self.host = KVBudget(table, capacity_bytes=self.setup.host_capacity_bytes,
                             bytes_per_token=self.setup.kv_bytes_per_token, policy=self.kv_policy,
                             block_tokens=BLOCK_TOKENS)
        self.on_cpu = np.zeros(table.n, bool)
        self.swap_bytes = 0.0
        self.swaps = 0
        self.busy["cpu"] = 0.0

    def _pool(self, i):
        return self.host if self.on_cpu[i] else self.kv

    def can_admit(self, idx, now):
        return self.kv.can_admit(idx) or self.host.can_admit(idx)

    def admission_error(self, idx):
        a, b = self.kv.admission_error(idx), self.host.admission_error(idx)
        return None if a is None or b is None else f"HBM: {a}; host: {b}"

    def on_admit(self, idx, now):
        for i in np.atleast_1d(idx).tolist():
            if self.kv.can_admit(i):
                self.on_cpu[i] = False
                self.kv.admit(np.array([i]))
            else:
                self.on_cpu[i] = True
                self.host.admit(np.array([i]))

    def on_finish(self, idx, now):
        idx = np.atleast_1d(idx)
        g, c = idx[~self.on_cpu[idx]], idx[self.on_cpu[idx]]
        if len(g):
            self.kv.release(g)
        if len(c):
            self.host.release(c)
        self.on_cpu[idx] = False

    on_preempt = on_finish

    def before_batch(self, view, now):
        """Grow both pools: a GPU-resident request that no longer fits HBM is swapped out to host memory (NEO);
        a host-resident one that does not fit is preempted (recomputed)."""
        self._view = view
        t = self.table
        while True:
            run = view.running
            dec = run[~t.in_prefill(run)]
            gdec, cdec = dec[~self.on_cpu[dec]], dec[self.on_cpu[dec]]
            need_g = self.kv._round(np.maximum(0, t.context(gdec) + 1 - self.kv.held_tokens[gdec]))
            need_c = self.host._round(np.maximum(0, t.context(cdec) + 1 - self.host.held_tokens[cdec]))
            if int(need_g.sum()) > self.kv.free_tokens and len(gdec):
                v = int(gdec[-1])                            # swap out the most recent GPU-resident request
                need_host = int(self.host._round(t.context(np.array([v])) + 1)[0])
                if need_host <= self.host.free_tokens:
                    self.swap_bytes += float(t.context(np.array([v]))[0]) * self.setup.kv_bytes_per_token
                    self.kv.release(np.array([v]))
                    self.host.held_tokens[v] = need_host
                    self.host.used_tokens += need_host
                    self.host.peak_tokens = max(self.host.peak_tokens, self.host.used_tokens)
                    self.on_cpu[v] = True
                    self.swaps += 1
                else:
                    view.preempt(v)
                continue
            if int(need_c.sum()) > self.host.free_tokens and len(cdec):
                view.preempt(int(cdec[-1]))
                continue
            self.kv.held_tokens[gdec] += need_g
            self.kv.used_tokens += int(need_g.sum())
            self.kv.peak_tokens = max(self.kv.peak_tokens, self.kv.used_tokens)
            self.host.held_tokens[cdec] += need_c
            self.host.used_tokens += int(need_c.sum())
            self.host.peak_tokens = max(self.host.peak_tokens, self.host.used_tokens)
            return

    def form_batch(self, view, now):
        t = self.table
        budget = PREFILL_TOKENS
        run = view.running
        pre_idx, pre_chunks = [], []
        for i in run[t.in_prefill(run)].tolist():
            left = int(t.prefill_len[i] - t.prefilled[i])
            pre_idx.append(i), pre_chunks.append(left)
            budget -= left
        while view.waiting and budget > 0:
            i = view.waiting[0]
            left = int(t.prefill_len[i] - t.prefilled[i])
            if (left > budget and pre_idx) or not self.can_admit(i, now):
                break
            view.admit(i)
            pre_idx.append(i), pre_chunks.append(left)
            budget -= left
        run = view.running
        dec = run[~t.in_prefill(run)]
        gdec, cdec = dec[~self.on_cpu[dec]], dec[self.on_cpu[dec]]
        x0 = len(pre_idx) + len(gdec)
        pipelined = len(cdec) > 0 and (x0 == 0 or x0 + len(cdec) > NEO_PIPELINE_RATIO * x0)
        if not pipelined:
            cdec = cdec[:0]
        d_idx = np.concatenate([gdec, cdec]).astype(np.int64)
        if not len(d_idx) and not pre_idx:
            return None
        sb = np.concatenate([np.zeros(len(gdec), np.int8), np.ones(len(cdec), np.int8),
                             np.zeros(len(pre_idx), np.int8)])
        return Batch.of(t, d_idx, pre_idx, pre_chunks, sub_batch=sb, meta={"pipelined": pipelined})

    def _times(self, batch, extra=0):
        """(duration, GPU busy, CPU busy) with CPU-decode contexts grown by ``extra`` (scalar or array)."""
        nl = self.setup.model.n_layers
        sb, pre = batch.sub_batch, batch.prefill
        b0d, b1 = ~pre & (sb == 0), ~pre & (sb == 1)
        n0 = int(b0d.sum()) + int(pre.sum())
        tok0 = int(b0d.sum()) + int(batch.new_tokens[pre].sum())
        g0 = float(self.gpu.fc(tok0, int(b0d.sum()) + int(batch.completes_prefill.sum()))) + \
            self.gpu.prefill_attn(batch.new_tokens[pre], batch.kv_after[pre]) + \
            self.gpu.decode_attn(int(b0d.sum()), batch.kv_after[b0d].sum() + int(b0d.sum()) * np.asarray(extra))
        n1 = int(b1.sum())
        if not n1:
            return g0, g0, 0.0 * np.asarray(g0)
        g1 = float(self.gpu.fc(n1, n1))
        kv1 = batch.kv_after[b1].sum() + n1 * np.asarray(extra)
        cpu = nl * (kv1 * self.kv_tok_layer / self.cpu_Bps
                    + float(self.pim.transfer_in(n1) + self.pim.transfer_out(n1)))
        d = g1 + np.maximum(g0, cpu) if n0 else g1 + cpu
        return d, g0 + g1, cpu

    def price(self, batch, now):
        d, g, c = self._times(batch)
        swap = self.swap_bytes / (self.setup.host_link_gbps * 1e9)
        self.swap_bytes = 0.0
        d = float(d) + swap                                   # swap-outs of this iteration over PCIe, in series
        self._account(d, g, 0.0)
        self.busy["cpu"] += float(c)
        sp = self._gpu_spans("batch", 0.0, float(g)) + ([Span(self.cpu_lane, "CPU decode attention", 0.0, float(c))]
                                                         if c else [])
        if swap:
            sp.append(Span(self.pcie_lane, "swap-out", 0.0, swap))
        return IterationResult(d, breakdown={"gpu_s": float(g), "cpu_s": float(c)}, spans=sp,
                               record={"pipelined": float(batch.meta.get("pipelined", False))})

    def price_decode_run(self, batch, max_iters, now):
        if self._can_admit_more() or self.swap_bytes:
            return None
        gdec = batch.req[batch.sub_batch == 0]
        k = int(min(max_iters, self.kv.headroom_iters(gdec) + 1 if len(gdec) else FUSE_CAP,
                    self.host.headroom_iters(batch.req[batch.sub_batch == 1]) + 1, FUSE_CAP))
        if k < 2:
            return None
        i = np.arange(k)
        d, g, c = self._times(batch, i)
        d, g, c = (np.broadcast_to(np.asarray(x, dtype=float), (k,)).copy() for x in (d, g, c))
        self._account(d, g, 0.0)
        self.busy["cpu"] += float(c.sum())
        sp = self._gpu_spans(f"decode x{k}", 0.0, float(g.sum()))
        if c.sum():
            sp.append(Span(self.cpu_lane, f"CPU decode attention x{k}", 0.0, float(c.sum())))
        return RunResult(d, breakdown={"gpu_s": g, "cpu_s": c}, spans=sp)

    def summary(self):
        out = super().summary()
        t = self.busy["time"]
        out["cpu_bubble_frac"] = 1.0 - self.busy["cpu"] / t if t > 0 else float("nan")
        out["host_kv_peak_tokens"] = int(self.host.peak_tokens)
        out["host_kv_capacity_tokens"] = int(self.host.capacity_tokens)
        out["swap_outs"] = self.swaps
        return out


#: CLI system names -> (factory, kwargs).
SYSTEMS = {
    "l3": (L3System, {}),
    "gpu-only": (GPUOnlySystem, {}),
    "hbm-pim": (HBMPIMSystem, {}),
    "hbm-pim-serial": (HBMPIMSystem, {"decode_mode": "serial"}),
    "hbm-pim-best": (HBMPIMSystem, {"decode_mode": "best"}),
    "r-pim": (RPIMSystem, {}),
    "cpu-offload": (CPUOffloadSystem, {}),
    "l3-no-comm": (L3System, {"comm": False}),
    "l3-no-comm-balanced": (L3System, {"comm": False, "placement": "balanced"}),
    "l3-no-sched": (L3System, {"sched": False}),
    "l3-base": (L3System, {"comm": False, "sched": False}),
}


def make_system(name: str, setup, *, replica: int = 0, seed: int = 0, **kw) -> System:
    try:
        cls, base = SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; allowed: {list(SYSTEMS)}") from None
    return cls(setup, replica=replica, seed=seed, **base, **kw)
