"""Host-memory baselines: S-LoRA (one GPU, and 2 or 4 GPUs tensor-parallel) and CPU-LoRA-Offload.

Both keep the KV cache in HBM, run every adapter on the GPU (E1: the LoRA product from HBM) and hold the
adapters in host DRAM behind the GPU's PCIe 5.0 link (``host.link`` preset ``pcie5-x16``). They differ in how
adapters reach HBM; assumptions (each a modelling choice, see docs/plora_host.md):

**S-LoRA** (Sheng et al., MLSys 2024, PLoRA ref [65]):

* *unified paging*: one HBM pool (HBM x (1 - workspace) - weights) in token-slot units, a slot = one token's
  KV (all layers, this GPU's share); an adapter occupies ``ceil(bytes / slot)`` slots; KV and adapters share it;
* admission reserves the request's final KV (prompt + output - 1 tokens) and, if its adapter is not resident,
  the adapter's slots; idle adapters (no running request) are evicted least-recently-used to make room;
* adapters are fetched over PCIe when their request is admitted, one pinned copy per adapter per layer
  (S-LoRA/S-LoRA slora/models/peft/lora_adapter.py ``load_to_gpu``). S-LoRA's code leaves prefetching off by
  default (slora/server/api_server.py: ``--prefetch`` is ``store_true``), so a new batch's adapters are loaded on
  the compute stream before it runs; executed, each copy starts once the one before it completed. The estimate:
  ``compute + fetch`` (all bytes at W plus one round trip). With ``prefetch=True`` (system ``s-lora-prefetch``,
  not in the grid; S-LoRA's paper, arXiv:2311.03285 section 5.2, describes prefetching the next batch's adapters
  while the current one decodes) the copies run on a stream of their own beside the iteration that first uses
  them, each layer's LoRA kernel waiting for that layer's copies; the estimate: ``max(compute, fetch)``;
* LoRA on the GPU: the batched MBGMM/MBGMV kernels over all the batch's adapters (bytes of their A and B, FLOPs)
  per layer, their bytes at :data:`SLORA_LORA_BW_EFFICIENCY` of the HBM bandwidth (Punica's measured SGMV, below;
  S-LoRA publishes no kernel timings of its own), their FLOPs at the datasheet peak; attention on the GPU over
  HBM (calibrated ``host.gpu`` model);
* ``n_gpus`` 2 or 4: Megatron tensor parallelism of the base model (``host.gpu`` prices the shards and the
  measured all-reduce), adapters sharded the same way (each GPU fetches its share over its own PCIe link),
  plus one all-reduce of the ``tokens x rank`` LoRA intermediate per adapted input group per layer.

**CPU-LoRA-Offload** (the host-staged path of PLoRA III-B(1), Fig. 2(a); VII-A "stages adapters through host
memory over PCIe"):

* KV reserved in HBM at admission (HBM x (1 - workspace) - weights); adapters live in host memory;
* every use of an adapter reaches the SMs only across a kernel boundary: in every layer of every iteration the
  running kernel stops, the CPU copies the batch's adapters' matrices of that layer over PCIe (cudaMemcpy, one
  copy for all of them), and the next kernel reads them: per layer ``kernel stop + bytes / W_pcie + L_pcie``,
  serialized with compute (no prefetch; the synchronous copy on the default stream follows the queued kernels). Nothing stays in HBM across iterations: the staging buffer holds one
  layer's matrices (design choice: the paper's baseline stages adapters, it does not cache them);
* ``cache=True`` (system ``cpu-lora-offload-cached``, the behaviour before issue 30): a staged adapter is cached in
  the HBM that KV does not hold (least-recently-used; never at the cost of admitted KV) and is not staged again.

**Execution and estimate** (issue 30): each iteration is executed on :mod:`host.plora.staged_timeline` (one GPU
stream, its PCIe copy engine, the host's staging path; the GPU items from the calibrated ``host.gpu`` model and the
LoRA kernels above), and the run's time is the timeline's. The formulas above are each system's estimate (neither
system decides anything with it); ``estimate_s`` per iteration and ``cost_model_err`` in summary.json say how far it
was from what the timeline executed.
"""

import numpy as np

from host.serving import System, ContinuousBatcher, IterationResult, RunResult, Span

from .config import KERNEL_STOP_S, WORKSPACE_FRACTION, DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS
from .lora import E1, STRATEGIES, adapter_bytes, lora_matrices
from .staged_timeline import StagedTimeline, StagedWork
from .system import shape_of, adapter_ranks, estimate_error

__all__ = ["HostMemorySystem", "SLoRASystem", "CPULoRAOffloadSystem", "SLORA_LORA_BW_EFFICIENCY"]

#: Punica's LoRA operator microbenchmark (Chen et al., "Punica: Multi-Tenant LoRA Serving", arXiv:2310.18547,
#: section 7.1; punica-ai/punica benchmarks/bench_lora_op_impls.py: ``add_lora_sgmv``, shrink and expand, h1 4096,
#: h2 11008, rank 16, FP16, one layer, each request its own adapter ("Distinct")): 37 us at batch 1, 116 us at
#: batch 64, each timed from the host between two ``torch.cuda.synchronize()`` (benchmarks/benchmark_utils.py).
#: S-LoRA's decode kernel (MBGMV, its heterogeneous-batching kernels, S-LoRA arXiv:2311.03285) adapts Punica's
#: BGMV, and S-LoRA publishes no kernel timings of its own, so these are S-LoRA's kernels' efficiency here.
PUNICA_SGMV_S = (37e-6, 116e-6)
PUNICA_SGMV_BATCH = (1, 64)
#: bytes of one distinct adapter in that operator: A (4096 x 16) and B (16 x 11008), FP16
PUNICA_SGMV_ADAPTER_BYTES = (4096 * 16 + 16 * 11008) * 2
#: The fraction of HBM bandwidth S-LoRA's LoRA kernels reach on the adapters' bytes: the slope between the two
#: points, (116 - 37) us / 63 adapters = 1.254 us per added adapter (the launch and the host synchronization are
#: in both points and cancel), moves 483,328 bytes: 385 GB/s, 18.9 % of the A100 80 GB's 2,039 GB/s
#: (``host.models.hardware.A100_80GB``). Assumed: the GPU of Punica's section 7 is that A100 (with the 40 GB one,
#: 1,555 GB/s, it would be 24.8 %); the fraction carries to the H100 and to every rank and matrix shape (the
#: kernel's time in proportion to the adapters' bytes, as a memory-bound GEMV's); the FLOPs (prefill) at the
#: datasheet peak, since the measurement is of one row per adapter.
SLORA_LORA_BW_EFFICIENCY = PUNICA_SGMV_ADAPTER_BYTES / (
    (PUNICA_SGMV_S[1] - PUNICA_SGMV_S[0]) / (PUNICA_SGMV_BATCH[1] - PUNICA_SGMV_BATCH[0])) / 2039e9


class HostMemorySystem(System):
    """Common part of S-LoRA and CPU-LoRA-Offload (see the module docstring)."""

    name = "host-memory"

    def __init__(self, model, *, gpu=None, gpu_model=None, link=None, n_gpus=1, kv_bits=16, seed=0,
                 max_batch=DEFAULT_MAX_BATCH, max_tokens=DEFAULT_MAX_TOKENS, batcher=None):
        super().__init__(batcher or ContinuousBatcher(max_requests=max_batch, max_tokens=max_tokens))
        if gpu is None:
            from host.models.hardware import H100_SXM_80GB
            gpu = H100_SXM_80GB
        if gpu_model is None:
            from host.gpu import GPUModel, get_gpu_model
            from host.models.hardware import GPUS
            # the shared per-process model for a preset GPU (its tables serve every run of a sweep worker)
            gpu_model = get_gpu_model(gpu.name) if GPUS.get(gpu.name) == gpu else GPUModel(gpu)
        if link is None:
            from host.link import get_link
            link = get_link("pcie5-x16")
        if n_gpus not in (1, 2, 4, 8):
            raise ValueError(f"n_gpus must be 1, 2, 4 or 8, got {n_gpus}")
        self.model, self.gpu, self.gpu_model, self.link = model, gpu, gpu_model, link
        self.shape = shape_of(model)
        self.n_gpus = n_gpus
        self.kv_bits, self.seed = kv_bits, seed
        self.slot_bytes = model.kv_bytes_per_token(n_gpus, kv_bits / 8.0)   # one token's KV on one GPU
        self._tcache = HostMemorySystem._E1_SHARED.setdefault(self.shape, {})
        # the run's time comes from executing each iteration on this model of the resources (one GPU stream, its
        # PCIe copy engine, the host's staging path), not from the formula the system's estimate is
        self.timeline = StagedTimeline(link.bw_gbps * 1e9, link.rtt_ns * 1e-9, n_gpus)
        self.emit_spans = True          # False: the timeline builds no trace spans (sweeps; the time is the same)

    def bind(self, table):
        super().bind(table)
        n = table.n
        self.n_adapters = int(table.adapter_id.max()) + 1 if n else 1
        self.ranks = adapter_ranks(table, self.n_adapters, self.seed)
        per_rank = {int(r): adapter_bytes(self.shape, int(r)) for r in np.unique(self.ranks)}
        self.a_bytes = np.array([per_rank[int(r)] for r in self.ranks]) / self.n_gpus
        hbm = self.gpu.hbm_gb * 1e9
        self.weights_bytes = float(self.model.weight_bytes(self.n_gpus))
        self.workspace_bytes = WORKSPACE_FRACTION * hbm
        self.pool_bytes = hbm - self.weights_bytes - self.workspace_bytes
        if self.pool_bytes <= 0:
            raise ValueError(f"{self.name}: {self.model.name} weights ({self.weights_bytes / 1e9:.1f} GB per GPU) "
                             f"leave no HBM on {self.gpu.name}")
        self.kv_held = np.zeros(n)             # bytes of KV reserved per request
        self.kv_used = 0.0
        self.resident = np.zeros(self.n_adapters, bool)
        self.last_use = np.zeros(self.n_adapters)
        self.users = np.zeros(self.n_adapters, np.int64)
        self.adapters_used = 0.0
        self.pending_fetch = []             # adapters admitted since the last iteration and not resident
        self.fetches = 0
        self._est_err = []                  # per stretch: estimate / executed - 1 of each iteration (an array)
        self.acc = {"t": 0.0, "adapters": 0.0, "kv": 0.0}
        self.lane_busy, self._pending_busy = {}, None
        self.span_s = [float("inf"), float("-inf")]
        self.peak = {"adapters": 0.0, "kv": 0.0}
        self.adapter_iters = 0.0
        self.clock = 0.0

    # memory ---------------------------------------------------------------------------------------------
    def _need_kv(self, idx):
        t = self.table
        return float(t.prefill_len[idx] + t.output_tokens[idx] - t.generated[idx] - 1) * self.slot_bytes

    def _adapter_need(self, a):
        return 0.0 if self.resident[a] else self._rounded(self.a_bytes[a])

    def _rounded(self, nbytes):
        return float(np.ceil(nbytes / self.slot_bytes)) * self.slot_bytes

    def _evictable(self):
        idle = np.flatnonzero(self.resident & (self.users == 0))
        return idle[np.argsort(self.last_use[idle], kind="stable")]

    def _free(self):
        return self.pool_bytes - self.kv_used - self.adapters_used

    def _make_room(self, need):
        """Evict idle adapters (least recently used first) until ``need`` bytes are free; False if impossible."""
        free = self._free()
        if need <= free:
            return True
        idle = self._evictable()
        sizes = np.array([self._rounded(self.a_bytes[a]) for a in idle])
        if need > free + sizes.sum():
            return False
        for a, s in zip(idle.tolist(), sizes.tolist()):
            if need <= self._free():
                break
            self.resident[a] = False
            self.adapters_used -= s
        return True

    def can_admit(self, idx, now):
        a = int(self.table.adapter_id[idx])
        need = self._need_kv(idx) + self._admit_adapter_need(a)
        free = self._free() + sum(self._rounded(self.a_bytes[x]) for x in self._evictable().tolist() if x != a)
        return need <= free

    def _admit_adapter_need(self, a):
        return self._adapter_need(a)

    def admission_error(self, idx):
        a = int(self.table.adapter_id[idx])
        need = self._need_kv(idx) + self._rounded(self.a_bytes[a])
        if need > self.pool_bytes:
            return (f"needs {need / 1e9:.2f} GB of HBM (KV + adapter) but {self.name} has {self.pool_bytes / 1e9:.2f} "
                    f"GB per GPU after weights and workspace")
        return None

    def on_admit(self, idx, now):
        for i in np.atleast_1d(idx).tolist():
            a = int(self.table.adapter_id[i])
            kv = self._need_kv(i)
            extra = self._admit_adapter_need(a)
            if not self._make_room(kv + extra):
                raise RuntimeError(f"{self.name}: admitted request {i} does not fit")
            self.kv_held[i] = kv
            self.kv_used += kv
            self.users[a] += 1
            self._on_adapter_admit(a)

    def _on_adapter_admit(self, a):
        pass

    def on_finish(self, idx, now):
        idx = np.atleast_1d(idx)
        self.kv_used -= float(self.kv_held[idx].sum())
        self.kv_held[idx] = 0.0
        for a in self.table.adapter_id[idx].tolist():
            self.users[a] -= 1
            self.last_use[a] = now

    on_preempt = on_finish

    # price ----------------------------------------------------------------------------------------------
    def _lora_layer_s(self, adapters, tokens):
        """Per-layer GPU LoRA time (one roofline over the adapters' bytes and FLOPs, this GPU's share)."""
        if not len(adapters):
            return 0.0
        # the same left-to-right sums as a loop (bit-equal): Python's sum over the rows' entries
        get = self._tcache.get
        rows = [get(k) for k in zip(self.ranks[adapters].tolist(), tokens.tolist())]
        if any(r is None for r in rows):
            rows = [self._terms(r, t) for r, t in zip(self.ranks[adapters].tolist(), tokens.tolist())]
        gb = sum([row[3] for row in rows], 0.0)
        gf = sum([row[4] for row in rows], 0.0)
        gb /= self.n_gpus
        gf /= self.n_gpus
        return max(gb / (self.gpu.hbm_bw_gbps * 1e9 * self.lora_bw_efficiency), gf / (self.gpu.fp16_tflops * 1e12))

    #: the fraction of HBM bandwidth the LoRA kernels reach on the adapters' bytes (1: a roofline)
    lora_bw_efficiency = 1.0

    def _terms(self, rank, tokens):
        key = (rank, tokens)
        c = self._tcache.get(key)
        if c is None:
            from .lora import strategy_terms
            c = self._tcache[key] = strategy_terms(self.shape, rank, tokens, _NoDevice)[E1]
        return c

    _E1_SHARED = {}

    def _lora_comm_s(self, tokens_total, ranks):
        """TP > 1: all-reduce of the tokens x rank LoRA intermediate per input group per layer."""
        if self.n_gpus == 1 or tokens_total == 0:
            return 0.0
        groups = self.__dict__.get("_lora_groups")
        if groups is None:
            groups = self._lora_groups = len({m.group for m in lora_matrices(self.shape)})
        nbytes = 2.0 * tokens_total * float(np.max(ranks))
        return groups * float(self.gpu_model.all_reduce(nbytes, self.n_gpus).calibrated_s)

    def _batch_parts(self, batch, runs=1):
        """The batch's adapters, the GPU model's iteration time(s), and per layer the LoRA kernel's and the TP
        all-reduce's seconds."""
        t = self.table
        ad = t.adapter_id[batch.req]
        uniq, inv = np.unique(ad, return_inverse=True)
        tok = np.bincount(inv, weights=batch.new_tokens).astype(np.int64)
        it = self.gpu_model.batch_time(self.model, batch, tp=self.n_gpus, kv_dtype_bytes=self.kv_bits / 8.0,
                                       runs=runs)
        lora_l = self._lora_layer_s(uniq, tok)
        comm_l = self._lora_comm_s(int(tok.sum()), self.ranks[uniq])
        self.last_use[uniq] = self.clock
        return uniq, it, lora_l, comm_l

    def _work(self, it, lora_l, comm_l, **kw) -> StagedWork:
        return StagedWork(base_s=np.asarray(it.total_s, float) / self.shape.n_layers, lora_s=lora_l, comm_s=comm_l,
                          **kw)

    def _execute(self, w, spans=True):
        return self.timeline.run(w, self.shape.n_layers, spans=spans and self.emit_spans)

    def _note_estimate(self, est, executed):
        """Record how far the estimate of an iteration was from what the timeline executed."""
        if executed > 0:
            self._est_err.append(np.array([est / executed - 1.0]))

    def _note_estimates(self, est, executed):
        """:meth:`_note_estimate` for every iteration of a stretch."""
        d = np.asarray(executed, float)
        ok = d > 0
        self._est_err.append(np.asarray(est, float)[ok] / d[ok] - 1.0)

    def cost_model_err(self) -> dict:
        """How far the system's estimate (its formula) was from the executed timeline, over the iterations
        (relative error ``estimate / executed - 1``; as :meth:`host.plora.system.PLoRASystem.cost_model_err`)."""
        e = np.concatenate(self._est_err) if self._est_err else np.zeros(0)
        return estimate_error(e, np.ones(len(e)))

    @staticmethod
    def _stretch_parts(parts, k):
        """A stretch's breakdown: every part an array over its ``k`` iterations (each its own copy)."""
        return {n: np.full(k, float(v)) if np.ndim(v) == 0 else np.array(v, float) for n, v in parts.items()}

    @staticmethod
    def _breakdown(it, ex, lora_l, comm_l, L, **extra):
        att = it.ops.get("attn_decode", 0.0)
        att = np.asarray(att, float) + np.asarray(it.ops.get("attn_prefill", 0.0), float)
        total = np.asarray(it.total_s, float)
        att = att if att.ndim else float(att)
        out = {"base_s": total - att, "attention_s": att, "lora_s": ex.lora_s, "pcie_busy_s": ex.busy_s["PCIe 0"],
               "host_s": ex.busy_s["host"]}
        out.update(extra)
        return out

    def _account(self, dur, k=1, n_adapters=0):
        a = self.acc
        a["t"] += dur
        a["adapters"] += self.adapters_used * dur
        a["kv"] += self.kv_used * dur
        self.peak["adapters"] = max(self.peak["adapters"], self.adapters_used)
        self.peak["kv"] = max(self.peak["kv"], self.kv_used)
        self.adapter_iters += n_adapters * k

    def on_iteration_end(self, batch, result, now):
        self.clock = now
        # the energy's accounting of the iterations the engine kept (it cuts a stretch at the next arrival)
        from host.energy import keep_busy
        durs = [result.duration_s] if isinstance(result, IterationResult) else result.durations_s
        keep_busy(self.lane_busy, self._pending_busy, self.span_s, durs, now)
        self._pending_busy = None

    def _pend(self, ex, ex0, k):
        """Per iteration and timeline lane, the busy seconds executed (a stretch: ``ex`` over its ``k`` iterations,
        ``ex0`` its first when it was executed apart)."""
        out = {}
        for lane, v in ex.busy_s.items():
            a = np.array(np.broadcast_to(np.asarray(v, float).ravel() if np.ndim(v) else float(v), (k,)), float)
            if ex0 is not None and ex0 is not ex:
                a[0] = float(np.asarray(ex0.busy_s[lane], float).ravel()[0])
            out[lane] = a
        self._pending_busy = out

    def energy(self) -> dict:
        """``energy_j`` / ``energy_per_token_mj`` (host/energy.py; docs/energy.md "Energy in runs"): the ``n_gpus``
        boards over the run's window with the timeline's ``GPU 0`` busy seconds (every GPU runs its shard alike);
        the adapter copies over each GPU's PCIe link (its ``PCIe 0`` busy seconds x the link's bandwidth, per GPU)
        and, read from the host's DDR4, over a DDR4 channel and at the DDR4 read energy (``dram``). The host CPU's
        power (CPU-LoRA-Offload's kernel) is not charged."""
        from host.energy import EnergyLedger, ddr4_read_pj_per_bit, window_s
        b = self.lane_busy
        T = window_s(self.span_s)
        led = EnergyLedger()
        led.add_gpu(self.gpu.name, self.n_gpus, T, b.get("GPU 0", 0.0))
        bits = 8.0 * self.link.bw_gbps * 1e9 * b.get("PCIe 0", 0.0) * self.n_gpus
        led.add_link(self.link.name, bits)
        led.add_link("ddr4", bits)
        led.add("dram", bits * ddr4_read_pj_per_bit() * 1e-12)
        return led.as_summary(float(np.sum(self.table.generated)) if self.table is not None else 0.0)

    def config(self):
        return {**super().config(), "model": self.model.name, "gpu": self.gpu.name, "n_gpus": self.n_gpus,
                "link": {"name": self.link.name, "bw_gbps": self.link.bw_gbps, "rtt_ns": self.link.rtt_ns},
                "kv_bits": self.kv_bits, "seed": self.seed, "workspace_fraction": WORKSPACE_FRACTION,
                "kernel_stop_s": KERNEL_STOP_S}

    def summary(self):
        a, T = self.acc, max(self.acc["t"], 1e-30)
        gb = lambda x: x / 1e9
        return {"kv_dup_fraction": 0.0,
                "gpu_mem_gb": {"weights": gb(self.weights_bytes), "workspace": gb(self.workspace_bytes),
                               "adapters": gb(a["adapters"] / T), "kv_dup": 0.0, "kv": gb(a["kv"] / T)},
                "gpu_mem_gb_peak": {"adapters": gb(self.peak["adapters"]), "kv": gb(self.peak["kv"])},
                "strategy_counts": {"decisions": {"E1": int(self.table.n)}, "fetches": self.fetches,
                                    "adapter_iterations": {"E1": float(self.adapter_iters)}},
                "host_store_gb": gb(float(self.a_bytes[np.unique(self.table.adapter_id)].sum()) * self.n_gpus),
                "cost_model_err": self.cost_model_err(), **self.energy()}

    def _stretch_spans(self, ex, durs, k):
        """The trace of a stretch: the first iteration's lanes as executed, one span per lane (and GPU) for the
        rest, as long as the lane's share of the last iteration."""
        spans = list(ex.spans)
        if k > 1 and self.emit_spans:
            d0 = float(durs[0])
            rest = float(durs[1:].sum())
            for lane, b in ex.busy_s.items():
                b = float(np.asarray(b).ravel()[-1])
                if b > 0:
                    frac = min(1.0, b / float(durs[-1]))
                    lanes = [lane] if lane == "host" else [f"{lane[:-2]} {g}" for g in range(self.n_gpus)]
                    spans += [Span(x, f"decode x{k - 1}", d0, rest * frac, {"busy_fraction": frac}) for x in lanes]
        return spans


class _NoDevice:
    """Device times for the E1 column only (never used: E1 has no device work)."""

    @staticmethod
    def load_s(nbytes):
        return 0.0

    @staticmethod
    def lora_e3_s(d_in, d_out, rank, batch):
        return 0.0

    @staticmethod
    def lora_e4_s(d_in, rank, batch):
        return 0.0


class SLoRASystem(HostMemorySystem):
    """S-LoRA: unified paging, fetch on admission before the batch runs (``prefetch=True``: overlapped with one
    iteration), its LoRA kernels at Punica's measured efficiency (:data:`SLORA_LORA_BW_EFFICIENCY`)."""

    lora_bw_efficiency = SLORA_LORA_BW_EFFICIENCY

    def __init__(self, model, *, n_gpus=1, prefetch=False, **kw):
        super().__init__(model, n_gpus=n_gpus, **kw)
        self.prefetch = bool(prefetch)
        self.name = ("s-lora" if n_gpus == 1 else f"s-lora-{n_gpus}gpu") + ("-prefetch" if self.prefetch else "")

    def _with_fetch(self, compute, fetch):
        """The estimate of the iteration that first uses fetched adapters: after the fetch (S-LoRA's default), or
        overlapped with it (prefetch)."""
        return max(compute, fetch) if self.prefetch else compute + fetch

    def config(self):
        return {**super().config(), "prefetch": self.prefetch, "lora_bw_efficiency": self.lora_bw_efficiency}

    def _on_adapter_admit(self, a):
        if not self.resident[a]:
            self.resident[a] = True
            sz = self._rounded(self.a_bytes[a])
            self.adapters_used += sz
            self.pending_fetch.append(a)
            self.fetches += 1

    def _take_fetch(self):
        """The copies of the adapters admitted since the last iteration (in S-LoRA's issue order: adapter by
        adapter, layer by layer, each one layer's share of this GPU's bytes) and the estimate's fetch time: all
        their bytes over the link plus one round trip."""
        if not self.pending_fetch:
            return {}, 0.0
        ids = np.array(self.pending_fetch, np.int64)
        self.pending_fetch = []
        L, W = self.shape.n_layers, self.link.bw_gbps * 1e9
        per_layer = self.a_bytes[ids] / L / W
        copies = dict(fetch_s=np.repeat(per_layer, L), fetch_layer=np.tile(np.arange(L), len(ids)),
                      fetch_blocks=not self.prefetch)
        return copies, float(self.a_bytes[ids].sum()) / W + self.link.rtt_ns * 1e-9

    def _fetch_executed_s(self, copies) -> float:
        """The fetch as executed: its copies one after another, each its bytes and a round trip."""
        return float(np.sum(copies["fetch_s"] + self.link.rtt_ns * 1e-9)) if copies else 0.0

    def price(self, batch, now):
        uniq, it, lora_l, comm_l = self._batch_parts(batch)
        L = self.shape.n_layers
        copies, fetch_est = self._take_fetch()
        est = float(it.total_s) + L * (lora_l + comm_l)
        if copies:
            est = self._with_fetch(est, fetch_est)
        ex = self._execute(StagedWork(base_s=float(it.total_s) / L, lora_s=lora_l, comm_s=comm_l, **copies))
        dur = ex.duration_s
        self._note_estimate(est, dur)
        self._pend(ex, None, 1)
        self._account(dur, 1, len(uniq))
        return IterationResult(dur, breakdown=self._breakdown(it, ex, lora_l, comm_l, L,
                                                              fetch_s=self._fetch_executed_s(copies)),
                               spans=ex.spans, record={"estimate_s": est})

    def price_decode_run(self, batch, max_iters, now):
        k = int(max_iters)
        uniq, it, lora_l, comm_l = self._batch_parts(batch, runs=k)
        L = self.shape.n_layers
        total = np.asarray(it.total_s, float)
        copies, fetch_est = self._take_fetch()
        est = total + L * (lora_l + comm_l)
        # the whole stretch executed at once (the timeline runs every iteration's base work); the fetch, if any,
        # rides on its first iteration alone
        ex = self._execute(self._work(it, lora_l, comm_l))
        durs = np.array(ex.duration_s, float)
        if copies:
            est[0] = self._with_fetch(est[0], fetch_est)
            ex0 = self._execute(StagedWork(base_s=float(total[0]) / L, lora_s=lora_l, comm_s=comm_l, **copies))
            durs[0] = ex0.duration_s
        else:
            ex0 = ex
        self._note_estimates(est, durs)
        self._pend(ex, ex0, k)
        self._account(float(durs.sum()), k, len(uniq))
        parts = self._stretch_parts(self._breakdown(it, ex, lora_l, comm_l, L, fetch_s=0.0), k)
        if copies:
            for n, v in self._breakdown(it, ex0, lora_l, comm_l, L, fetch_s=self._fetch_executed_s(copies)).items():
                parts[n][0] = np.asarray(v, float).ravel()[0]
        return RunResult(durs, breakdown=parts, spans=self._stretch_spans(ex0, durs, k), record={"estimate_s": est})


class CPULoRAOffloadSystem(HostMemorySystem):
    """CPU-LoRA-Offload: host-staged per-layer copies with a kernel stop per exchange, every iteration
    (``cache=True``: an LRU cache in HBM, staged once)."""

    name = "cpu-lora-offload"

    def __init__(self, model, *, cache: bool = False, **kw):
        super().__init__(model, n_gpus=1, **kw)
        self.cache = bool(cache)
        if self.cache:
            self.name = "cpu-lora-offload-cached"

    def _admit_adapter_need(self, a):
        return 0.0                     # the adapter need not fit: it is staged layer by layer

    def _stage(self, uniq):
        """Bytes to stage this iteration (adapters not cached) and cache those that fit afterwards."""
        missing = uniq[~self.resident[uniq]]
        nbytes = float(self.a_bytes[missing].sum())
        for a in (missing.tolist() if self.cache else ()):
            sz = self._rounded(self.a_bytes[a])
            if self._make_room(sz):
                self.resident[a] = True
                self.adapters_used += sz
        self.fetches += len(missing)
        return nbytes, len(missing)

    def _staging_s(self, nbytes, n_missing):
        if n_missing == 0:
            return 0.0
        L = self.shape.n_layers
        W, rtt = self.link.bw_gbps * 1e9, self.link.rtt_ns * 1e-9
        return L * (KERNEL_STOP_S + rtt) + nbytes / W

    def _staged(self, nbytes, n_missing):
        """The timeline's per-layer staging: the layer's share of the bytes and a kernel stop (none if nothing is
        staged)."""
        if n_missing == 0:
            return {}
        return dict(stage_s=nbytes / self.shape.n_layers / (self.link.bw_gbps * 1e9), stop_s=KERNEL_STOP_S)

    def price(self, batch, now):
        uniq, it, lora_l, comm_l = self._batch_parts(batch)
        L = self.shape.n_layers
        nbytes, miss = self._stage(uniq)
        stage = self._staging_s(nbytes, miss)
        est = float(it.total_s) + L * (lora_l + comm_l) + stage
        ex = self._execute(StagedWork(base_s=float(it.total_s) / L, lora_s=lora_l, comm_s=comm_l,
                                      **self._staged(nbytes, miss)))
        dur = ex.duration_s
        self._note_estimate(est, dur)
        self._pend(ex, None, 1)
        self._account(dur, 1, len(uniq))
        return IterationResult(dur, breakdown=self._breakdown(it, ex, lora_l, comm_l, L, staging_s=stage),
                               spans=ex.spans, record={"estimate_s": est})

    def price_decode_run(self, batch, max_iters, now):
        k = int(max_iters)
        uniq, it, lora_l, comm_l = self._batch_parts(batch, runs=k)
        L = self.shape.n_layers
        total = np.asarray(it.total_s, float)
        nbytes, miss = self._stage(uniq)
        stage = self._staging_s(nbytes, miss)
        staging = np.zeros(k)
        staged = self._staged(nbytes, miss)
        if self.cache:
            staging[0] = stage               # staged once, then cached
            ex = self._execute(StagedWork(base_s=total / L, lora_s=lora_l, comm_s=comm_l))
            durs = np.array(ex.duration_s, float)
            ex0 = ex
            if staged:
                ex0 = self._execute(StagedWork(base_s=float(total[0]) / L, lora_s=lora_l, comm_s=comm_l, **staged))
                durs[0] = ex0.duration_s
        else:
            staging[:] = stage               # staged in every iteration
            self.fetches += (k - 1) * miss
            ex = ex0 = self._execute(StagedWork(base_s=total / L, lora_s=lora_l, comm_s=comm_l, **staged))
            durs = np.array(ex.duration_s, float)
        est = total + L * (lora_l + comm_l) + staging
        self._note_estimates(est, durs)
        self._pend(ex, ex0, k)
        self._account(float(durs.sum()), k, len(uniq))
        parts = self._stretch_parts(self._breakdown(it, ex, lora_l, comm_l, L, staging_s=staging), k)
        if ex0 is not ex:
            for n, v in self._breakdown(it, ex0, lora_l, comm_l, L).items():
                parts[n][0] = np.asarray(v, float).ravel()[0]
        return RunResult(durs, breakdown=parts, spans=self._stretch_spans(ex0, durs, k), record={"estimate_s": est})
