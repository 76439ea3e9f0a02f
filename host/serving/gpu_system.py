"""A GPU-only serving system (vLLM-style) on the calibrated GPU model: the reference system and a base class.

One model replica on ``tp`` GPUs (tensor parallel) of a given type; the whole iteration runs on the GPUs;
KV in HBM. Memory: each GPU's HBM minus its weight shard minus a reserve (``hbm_reserve_frac`` of HBM for
activations, CUDA context and fragmentation: vLLM's default ``gpu_memory_utilization`` is 0.9, i.e. 10 %
reserved; vLLM engine arguments documentation) holds KV, accounted by :class:`~host.serving.system.KVBudget`
(``reserve`` or ``paged`` with 16-token blocks, vLLM's default block size). ``hbm_gb`` overrides the capacity
(e.g. "unlimited HBM" studies). Pricing: :meth:`host.gpu.GPUModel.batch_time`, vectorized over fused decode
runs. Trace lanes: ``GPU 0`` (compute, one span per iteration or run) and ``NVLink`` (the all-reduce share when
TP > 1, drawn after the compute; the GPU model charges it serially).

Subclasses override what they change (memory via ``kv_capacity_bytes``, pricing via ``price`` /
``price_decode_run``, batching via the ``batcher`` argument or ``form_batch``).
"""

import numpy as np

from host.gpu import GPUModel, get_gpu_model
from host.models.llm import LLMConfig
from host.serving.batch import IterationResult, RunResult, Span
from host.serving.system import ContinuousBatcher, KVBudget, System

__all__ = ["GPUSystem"]


class GPUSystem(System):
    name = "gpu-only"

    def __init__(self, model: LLMConfig, gpu="h100", *, tp: int | None = None, batcher=None,
                 kv_policy: str = "reserve", block_tokens: int = 16, hbm_reserve_frac: float = 0.1,
                 hbm_gb: float | None = None, kv_dtype_bytes: float = 2.0, gpu_model: GPUModel | None = None,
                 fuse: bool = True):
        super().__init__(batcher if batcher is not None else ContinuousBatcher())
        self.model = model
        self.gpu_model = gpu_model if gpu_model is not None else (
            get_gpu_model(gpu) if isinstance(gpu, str) else GPUModel(gpu))
        self.tp = model.tp if tp is None else tp
        if not 0 <= hbm_reserve_frac < 1:
            raise ValueError(f"hbm_reserve_frac must be in [0, 1), got {hbm_reserve_frac}")
        self.kv_policy, self.block_tokens = kv_policy, block_tokens
        self.hbm_reserve_frac, self.hbm_gb, self.kv_dtype_bytes = hbm_reserve_frac, hbm_gb, kv_dtype_bytes
        self.fuse = fuse
        self.kv = None
        if self.kv_capacity_bytes() <= 0:
            raise ValueError(f"{model.name} on {self.tp} x {self.gpu_model.gpu.name}: the weights "
                             f"({model.weight_bytes(self.tp) / 1e9:.1f} GB per GPU) leave no HBM for KV")

    # memory ------------------------------------------------------------------------------------------------
    def kv_capacity_bytes(self) -> float:
        """KV bytes one GPU of the replica can hold."""
        hbm = (self.hbm_gb if self.hbm_gb is not None else self.gpu_model.gpu.hbm_gb) * 1e9
        return hbm * (1 - self.hbm_reserve_frac) - self.model.weight_bytes(self.tp)

    def kv_bytes_per_token(self) -> float:
        return self.model.kv_bytes_per_token(self.tp, self.kv_dtype_bytes)

    def bind(self, table):
        super().bind(table)
        self.kv = KVBudget(table, capacity_bytes=self.kv_capacity_bytes(), bytes_per_token=self.kv_bytes_per_token(),
                           policy=self.kv_policy, block_tokens=self.block_tokens)

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
        self.kv.grow(view)

    # price -------------------------------------------------------------------------------------------------
    @staticmethod
    def _spans(total_s: float, all_reduce_s: float, label: str) -> list:
        spans = [Span("GPU 0", label, 0.0, total_s - all_reduce_s)]
        if all_reduce_s > 0:
            spans.append(Span("NVLink", "all-reduce", total_s - all_reduce_s, all_reduce_s))
        return spans

    def price(self, batch, now):
        it = self.gpu_model.batch_time(self.model, batch, tp=self.tp, kv_dtype_bytes=self.kv_dtype_bytes)
        d = float(it.total_s)
        label = "decode" if batch.is_decode_only else "prefill" if batch.num_decode == 0 else "prefill+decode"
        return IterationResult(d, breakdown={k: float(v) for k, v in it.ops.items()},
                               spans=self._spans(d, float(it.ops.get("all_reduce", 0.0)), label),
                               record={"floor_s": float(it.floor_s)})

    def price_decode_run(self, batch, max_iters, now):
        if not self.fuse:
            return None
        k = min(max_iters, self.kv.headroom_iters(batch.req) + 1)
        it = self.gpu_model.batch_time(self.model, batch, tp=self.tp, kv_dtype_bytes=self.kv_dtype_bytes, runs=k)
        d = it.total_s if np.ndim(it.total_s) else np.full(k, it.total_s)
        ar = k * float(it.ops.get("all_reduce", 0.0))
        return RunResult(d, breakdown=it.ops, spans=self._spans(float(d.sum()), ar, f"decode x{k}"),
                         record={"floor_s": it.floor_s})

    def config(self):
        return {**super().config(), "model": self.model.name, "gpu": self.gpu_model.gpu.name, "tp": self.tp,
                "kv_policy": self.kv_policy, "block_tokens": self.block_tokens,
                "hbm_reserve_frac": self.hbm_reserve_frac, "hbm_gb": self.hbm_gb,
                "kv_dtype_bytes": self.kv_dtype_bytes, "kv_capacity_gb": self.kv_capacity_bytes() / 1e9}

    def summary(self):
        return {"kv_capacity_tokens": int(self.kv.capacity_tokens), "kv_peak_tokens": int(self.kv.peak_tokens),
                "gpu_mem_gb": {"weights": self.model.weight_bytes(self.tp) / 1e9,
                               "kv_peak": self.kv.peak_tokens * self.kv.bytes_per_token / 1e9}}
