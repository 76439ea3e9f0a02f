"""The GPU model: a roofline with fitted efficiencies over operator shapes, plus an analytic attention model and
the measured all-reduce.

Every operator is priced two ways:

* **floor** (the idealized time the papers reason with): ``max(FLOPs / peak, bytes / bandwidth)`` at the
  datasheet peak FP16 tensor throughput and HBM bandwidth (host.models.hardware);
* **calibrated**: a soft roofline ``t0 + ((bytes / (bw * e_mem))**p + (FLOPs / (peak * e_cmp))**p)**(1/p)`` whose
  four parameters (launch overhead ``t0``, achieved bandwidth fraction ``e_mem``, achieved compute fraction
  ``e_cmp``, corner sharpness ``p``) are fitted once on every measured GEMM in data/vidur (all GPUs, models and TP
  degrees together: the parameters are dimensionless or absolute times, never per model), so the model prices
  shapes, models and GPUs it was not fitted on (held-out errors: docs/host.md, tests/host/gpu). Element-wise ops
  (norms, rotary embedding, activation, residual add, embedding) are ``t0 + bytes / (bw * e)`` with ``t0`` and
  ``e`` fitted per op kind.

GEMM bytes are ``2 (M K + K N + M N)`` (FP16 input, weights, output, each once). MoE expert GEMMs read the
weights of the experts the batch touches: with uniform routing (assumption), ``E (1 - (1 - a / E)**M)`` of
``E`` experts for ``M`` tokens choosing ``a`` each; their FLOPs are ``2 M a K N``; one grouped kernel.

Attention (no measured attention profile exists offline, data/README.md), FlashAttention-style, with the same
soft roofline and the GEMM fit's parameters (assumption: attention kernels reach the bandwidth and compute
fractions that the linear layers reach on the same GPU; FlashAttention-2 reports 50-73 % of A100 peak in the
forward pass, Dao 2023, arXiv:2307.08691, consistent with the fitted ``e_cmp``):

* decode (one query token per request, batched paged attention, one kernel): bytes = K and V of every request's
  context (``2 * kv_heads * head_dim * 2 B`` per token) + Q and O; FLOPs = ``4 * heads * head_dim`` per KV token;
* prefill (chunks, varlen kernel): FLOPs = ``4 * heads * head_dim * sum_i q_i (kv_i - (q_i - 1) / 2)`` (causal:
  query ``j`` of a chunk over context ``c`` sees ``c + j`` keys, ``kv_i = c_i + q_i``); bytes = Q, O and K, V
  once (assumption: concurrent query tiles of a head share K / V through L2).

The all-reduce of tensor parallelism (two per layer, ``tokens * d_model * 2`` bytes each) comes from the
measured NCCL times (host.gpu.allreduce).
"""

import json
from dataclasses import dataclass, field, asdict
from pathlib import Path

import numpy as np

from host.models.hardware import GPUConfig, get_gpu
from host.models.llm import LLMConfig
from host.gpu.profiles import DATA_DIR, ELT_OPS

__all__ = ["GemmParams", "EltParams", "Calibration", "CALIBRATION_PATH", "load_calibration", "soft_roofline",
           "OpTime", "IterationTime", "GPUModel", "get_gpu_model"]

CALIBRATION_PATH = DATA_DIR / "gpu_calibration.json"


@dataclass(frozen=True)
class GemmParams:
    """Soft-roofline parameters shared by every GEMM (and attention) on every GPU."""

    t0_s: float
    eff_mem: float
    eff_compute: float
    p: float


@dataclass(frozen=True)
class EltParams:
    t0_s: float
    eff_mem: float


@dataclass(frozen=True)
class Calibration:
    gemm: GemmParams
    elt: dict                    # op name -> EltParams
    fitted_on: tuple = ()        # (gpu, label) profiles the fit used
    source_commit: str = ""      # data/vidur/SOURCE_COMMIT

    def to_json(self) -> dict:
        return {"gemm": asdict(self.gemm), "elt": {k: asdict(v) for k, v in self.elt.items()},
                "fitted_on": [list(k) for k in self.fitted_on], "source_commit": self.source_commit}

    @classmethod
    def from_json(cls, d: dict) -> "Calibration":
        return cls(gemm=GemmParams(**d["gemm"]), elt={k: EltParams(**v) for k, v in d["elt"].items()},
                   fitted_on=tuple(tuple(k) for k in d.get("fitted_on", ())),
                   source_commit=d.get("source_commit", ""))


_CAL_CACHE = {}


def load_calibration(path: Path | None = None) -> Calibration:
    """The fitted parameters in data/gpu_calibration.json (written by ``ndpim gpu calibrate``)."""
    path = Path(path or CALIBRATION_PATH)
    if path not in _CAL_CACHE:
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run `ndpim gpu calibrate`")
        _CAL_CACHE[path] = Calibration.from_json(json.loads(path.read_text()))
    return _CAL_CACHE[path]


def soft_roofline(flops, nbytes, *, peak_flops, bw_bytes, t0_s, eff_mem, eff_compute, p):
    """``t0 + ((bytes / (bw e_mem))**p + (flops / (peak e_cmp))**p)**(1/p)`` (vectorized)."""
    tm = np.asarray(nbytes, dtype=np.float64) / (bw_bytes * eff_mem)
    tc = np.asarray(flops, dtype=np.float64) / (peak_flops * eff_compute)
    return t0_s + (tm ** p + tc ** p) ** (1.0 / p)


@dataclass(frozen=True)
class OpTime:
    """One operator's time: calibrated and floor (seconds; scalars or arrays)."""

    calibrated_s: object
    floor_s: object


@dataclass
class IterationTime:
    """One forward pass (all layers) of a batch on one GPU of a TP group.

    ``total_s`` / ``floor_s``: calibrated and idealized times (scalars, or arrays over the iterations of a fused
    decode run). ``ops`` / ``floor_ops``: per operator, summed over layers (``attn_decode`` and ``attn_prefill``
    included; ``all_reduce`` when TP > 1). ``lanes``: GPU busy time vs. NVLink all-reduce time (for traces).
    """

    total_s: object
    floor_s: object
    ops: dict = field(default_factory=dict)
    floor_ops: dict = field(default_factory=dict)


class GPUModel:
    """Calibrated GPU operator times for one GPU type (see the module docstring).

    ``GPUModel("h100")`` or ``GPUModel(H100_SXM_80GB)``; ``calibration`` defaults to data/gpu_calibration.json;
    ``allreduce`` defaults to the measured profile of that GPU's DGX node (host.gpu.allreduce), loaded on first
    use.
    """

    def __init__(self, gpu: GPUConfig | str, calibration: Calibration | None = None, allreduce=None):
        self.gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
        self.cal = calibration if calibration is not None else load_calibration()
        self._allreduce = allreduce
        self._peak = self.gpu.fp16_tflops * 1e12
        self._bw = self.gpu.hbm_bw_gbps * 1e9
        self._tables = {}
        self._models = {}

    # --- operators (vectorized) ----------------------------------------------------------------------------
    def gemm(self, M, K, N, *, experts: int = 0, active: int = 0) -> OpTime:
        """``M x K`` by ``K x N`` (one shard). With ``experts > 0``: a grouped MoE GEMM, each of ``M`` tokens
        using ``active`` of ``experts`` weight matrices ``K x N``."""
        M = np.asarray(M, dtype=np.float64)
        if np.any(M < 0):
            raise ValueError("GPUModel.gemm: M must be >= 0")
        if experts:
            touched = experts * (1.0 - (1.0 - active / experts) ** M)
            flops = 2.0 * M * active * K * N
            nbytes = 2.0 * (touched * K * N + M * active * (K + N))
        else:
            flops = 2.0 * M * K * N
            nbytes = 2.0 * (M * K + K * N + M * N)
        return self._price(flops, nbytes, M > 0)

    def kernel(self, flops, nbytes) -> OpTime:
        """One GEMM-like kernel of ``flops`` and ``nbytes`` of HBM traffic on the calibrated GEMM fit (its launch
        floor ``t0`` included; e.g. a fused LoRA kernel of many adapters). 0 when ``flops`` and ``nbytes`` are."""
        flops = np.asarray(flops, dtype=np.float64)
        nbytes = np.asarray(nbytes, dtype=np.float64)
        return self._price(flops, nbytes, (flops > 0) | (nbytes > 0))

    def _price(self, flops, nbytes, active=True) -> OpTime:
        g = self.cal.gemm
        cal = soft_roofline(flops, nbytes, peak_flops=self._peak, bw_bytes=self._bw, t0_s=g.t0_s,
                            eff_mem=g.eff_mem, eff_compute=g.eff_compute, p=g.p)
        floor = np.maximum(np.asarray(flops, float) / self._peak, np.asarray(nbytes, float) / self._bw)
        cal = np.where(active, cal, 0.0)
        floor = np.where(active, floor, 0.0)
        return OpTime(float(cal) if cal.ndim == 0 else cal, float(floor) if floor.ndim == 0 else floor)

    def elementwise(self, op: str, nbytes) -> OpTime:
        """A memory-bound element-wise op (one of host.gpu.profiles.ELT_OPS) moving ``nbytes``."""
        try:
            e = self.cal.elt[op]
        except KeyError:
            raise ValueError(f"unknown element-wise op {op!r}; calibrated: {sorted(self.cal.elt)}") from None
        nbytes = np.asarray(nbytes, dtype=np.float64)
        cal = np.where(nbytes > 0, e.t0_s + nbytes / (self._bw * e.eff_mem), 0.0)
        return OpTime(cal if cal.ndim else float(cal), nbytes / self._bw)

    def attention_decode(self, n_requests, kv_tokens, *, heads: int, kv_heads: int, head_dim: int,
                         kv_dtype_bytes: float = 2.0) -> OpTime:
        """Decode attention of ``n_requests`` single-token queries over ``kv_tokens`` KV tokens in total (per
        shard: ``heads`` / ``kv_heads`` of this GPU). Vectorized over ``kv_tokens``."""
        kv = np.asarray(kv_tokens, dtype=np.float64)
        n = np.asarray(n_requests, dtype=np.float64)
        flops = 4.0 * heads * head_dim * kv
        nbytes = 2.0 * kv_heads * head_dim * kv_dtype_bytes * kv + 4.0 * n * heads * head_dim
        return self._price(flops, nbytes, n > 0)

    def attention_prefill(self, q_tokens, kv_tokens, *, heads: int, kv_heads: int, head_dim: int,
                          kv_dtype_bytes: float = 2.0) -> OpTime:
        """Prefill attention of chunks (arrays: ``q_tokens[i]`` new tokens over ``kv_tokens[i]`` = context +
        new) in one varlen kernel."""
        q = np.asarray(q_tokens, dtype=np.float64)
        kv = np.asarray(kv_tokens, dtype=np.float64)
        if q.shape != kv.shape or np.any(kv < q):
            raise ValueError("attention_prefill: q_tokens and kv_tokens must match and kv_tokens >= q_tokens")
        flops = 4.0 * heads * head_dim * float(np.sum(q * (kv - (q - 1) / 2)))
        nbytes = 4.0 * float(q.sum()) * heads * head_dim + 2.0 * kv_heads * head_dim * kv_dtype_bytes * float(kv.sum())
        return self._price(flops, nbytes, q.size > 0)

    @property
    def allreduce(self):
        if self._allreduce is None:
            from host.gpu.allreduce import AllReduceModel
            self._allreduce = AllReduceModel.for_gpu(self.gpu.name)
        return self._allreduce

    def all_reduce(self, nbytes, n_workers: int) -> OpTime:
        """Measured NCCL all-reduce time; floor: ring all-reduce at the datasheet NVLink bandwidth
        (``2 (n - 1) / n * bytes / bw``)."""
        return self.allreduce.time(nbytes, n_workers)

    # --- a whole forward pass --------------------------------------------------------------------------------
    def dense_ops(self, model: LLMConfig, tp: int, tokens) -> dict:
        """Everything of a forward pass but attention and the LM head, vectorized over ``tokens`` (an array of
        token counts): op name -> (calibrated, floor) arrays, each summed over the layers."""
        M = np.asarray(tokens, dtype=np.float64)
        L, H = model.n_layers, model.d_model
        on = M > 0
        out = {}

        def add(name, t: OpTime, times=1.0):
            c = np.where(on, t.calibrated_s, 0.0) * times
            f = np.where(on, t.floor_s, 0.0) * times
            if name in out:
                out[name] = (out[name][0] + c, out[name][1] + f)
            else:
                out[name] = (c, f)

        for lin in model.linears(tp):
            if lin.name.startswith("mlp") and model.is_moe:
                add(lin.name, self.gemm(M, lin.k, lin.n, experts=model.n_experts, active=model.n_active_experts), L)
            else:
                add(lin.name, self.gemm(M, lin.k, lin.n), L)
        if model.is_moe:
            add("moe_router", self.gemm(M, H, model.n_experts), L)
        q_dim, kv_dim, ff = model.q_dim / tp, max(model.kv_dim / tp, model.head_dim), model.ffn_width() / tp
        act = (6.0 if model.gated_mlp else 4.0) * ff * (model.n_active_experts if model.is_moe else 1)
        add("input_layernorm", self.elementwise("input_layernorm", 4.0 * M * H), L)
        add("attn_rope", self.elementwise("attn_rope", 4.0 * M * (q_dim + kv_dim)), L)
        add("post_attention_layernorm", self.elementwise("post_attention_layernorm", 4.0 * M * H), L)
        add("mlp_act", self.elementwise("mlp_act", act * M), L)
        add("add", self.elementwise("add", 6.0 * M * H), L)
        add("emb", self.elementwise("emb", 4.0 * M * H))
        add("final_norm", self.elementwise("input_layernorm", 4.0 * M * H))
        if tp > 1:
            add("all_reduce", self.all_reduce(2.0 * M * H, tp), 2 * L)
        return out

    def dense_time(self, model: LLMConfig, tp: int, tokens, logits_tokens=0):
        """Calibrated time of everything but attention for ``tokens`` tokens with the LM head over
        ``logits_tokens`` (vectorized; tabulated)."""
        tab = self._dense_table(model, tp, int(np.max(tokens, initial=0)), int(np.max(logits_tokens, initial=0)))
        out = tab["total"][np.asarray(tokens, dtype=np.int64)] + tab["lm"][np.asarray(logits_tokens, dtype=np.int64)]
        return float(out) if np.ndim(out) == 0 else out

    _TABLE_MAX = 1 << 16

    def _dense_table(self, model: LLMConfig, tp: int, tokens: int, logits_tokens: int) -> dict | None:
        """Per (model, tp): every dense op's time for 0..n-1 tokens (n doubling as needed, up to 65,536) and
        the LM head's for 0..n-1 logits tokens. None when ``tokens`` exceeds the cap."""
        key = (id(model), tp)
        tab = self._tables.get(key)
        need = max(tokens, logits_tokens) + 1
        if tab is None or need > tab["n"]:
            if need > self._TABLE_MAX:
                return None
            n = max(1024, need, 2 * tab["n"] if tab else 0)
            n = min(1 << int(np.ceil(np.log2(n))), self._TABLE_MAX)
            self._models[id(model)] = model  # keeps id(model) unique while tabulated
            ops = self.dense_ops(model, tp, np.arange(n))
            names = list(ops)
            cal = np.array([ops[k][0] for k in names])
            flo = np.array([ops[k][1] for k in names])
            lm = self.gemm(np.arange(n), model.d_model, model.vocab / tp)
            tab = {"n": n, "names": names, "cal": cal, "floor": flo, "total": cal.sum(axis=0),
                   "total_floor": flo.sum(axis=0), "lm": np.asarray(lm.calibrated_s),
                   "lm_floor": np.asarray(lm.floor_s)}
            self._tables[key] = tab
        return tab

    def _dense_part(self, model: LLMConfig, tp: int, tokens: int, logits_tokens: int) -> tuple:
        """(ops, floors, total, total floor) of everything but attention, LM head included."""
        tab = self._dense_table(model, tp, tokens, logits_tokens)
        if tab is not None:
            ops = dict(zip(tab["names"], tab["cal"][:, tokens].tolist()))
            floors = dict(zip(tab["names"], tab["floor"][:, tokens].tolist()))
            total, floor = float(tab["total"][tokens]), float(tab["total_floor"][tokens])
            if logits_tokens:
                c, f = float(tab["lm"][logits_tokens]), float(tab["lm_floor"][logits_tokens])
                ops["lm_head"], floors["lm_head"] = c, f
                total, floor = total + c, floor + f
            return ops, floors, total, floor
        d = self.dense_ops(model, tp, np.array([tokens]))
        ops = {k: float(v[0][0]) for k, v in d.items()}
        floors = {k: float(v[1][0]) for k, v in d.items()}
        if logits_tokens:
            lm = self.gemm(float(logits_tokens), model.d_model, model.vocab / tp)
            ops["lm_head"], floors["lm_head"] = float(lm.calibrated_s), float(lm.floor_s)
        return ops, floors, sum(ops.values()), sum(floors.values())

    def _scalar(self, flops: float, nbytes: float) -> tuple:
        """(calibrated, floor) of one operator with scalar FLOPs and bytes (fast path)."""
        g = self.cal.gemm
        if flops <= 0 and nbytes <= 0:
            return 0.0, 0.0
        tm = nbytes / (self._bw * g.eff_mem)
        tc = flops / (self._peak * g.eff_compute)
        return g.t0_s + (tm ** g.p + tc ** g.p) ** (1.0 / g.p), max(flops / self._peak, nbytes / self._bw)

    def iteration(self, model: LLMConfig, *, tp: int | None = None, prefill_q=(), prefill_kv=(),
                  decode_requests: int = 0, decode_kv_tokens=0, logits_tokens: int | None = None,
                  kv_dtype_bytes: float = 2.0) -> IterationTime:
        """A forward pass over ``sum(prefill_q) + decode_requests`` tokens on one GPU of a ``tp`` group.

        ``prefill_q`` / ``prefill_kv``: per prefill chunk, its new tokens and its context + new tokens.
        ``decode_kv_tokens``: total KV tokens the decode requests attend over (their contexts + 1); may be an
        array (one value per iteration of a fused decode run), then every time is an array. ``logits_tokens``:
        tokens that go through the LM head (default: decodes + prefill chunks).
        """
        tp = model.tp if tp is None else tp
        n_pre = len(prefill_q)
        if n_pre:
            q = np.asarray(prefill_q, dtype=np.float64)
            q_sum = float(q.sum())
        else:
            q_sum = 0.0
        tokens = int(q_sum) + int(decode_requests)
        if logits_tokens is None:
            logits_tokens = int(decode_requests) + n_pre
        ops, floors, total, floor = self._dense_part(model, tp, tokens, int(logits_tokens))
        heads = model.n_heads // tp
        kv_heads = max(model.n_kv_heads // tp, 1)
        hd = model.head_dim
        L = model.n_layers
        if n_pre:
            kv = np.asarray(prefill_kv, dtype=np.float64)
            if kv.shape != q.shape or np.any(kv < q):
                raise ValueError("iteration: prefill_q and prefill_kv must match and prefill_kv >= prefill_q")
            flops = 4.0 * heads * hd * float(np.sum(q * (kv - (q - 1) / 2)))
            nbytes = 4.0 * q_sum * heads * hd + 2.0 * kv_heads * hd * kv_dtype_bytes * float(kv.sum())
            c, f = self._scalar(flops, nbytes)
            ops["attn_prefill"], floors["attn_prefill"] = L * c, L * f
            total, floor = total + L * c, floor + L * f
        if decode_requests:
            if np.ndim(decode_kv_tokens) == 0:
                kvt = float(decode_kv_tokens)
                c, f = self._scalar(4.0 * heads * hd * kvt, 2.0 * kv_heads * hd * kv_dtype_bytes * kvt
                                    + 4.0 * decode_requests * heads * hd)
            else:
                kvt = np.asarray(decode_kv_tokens, dtype=np.float64)
                g = self.cal.gemm
                flops = (4.0 * heads * hd) * kvt
                nbytes = (2.0 * kv_heads * hd * kv_dtype_bytes) * kvt + 4.0 * decode_requests * heads * hd
                tm = nbytes * (1.0 / (self._bw * g.eff_mem))
                tc = flops * (1.0 / (self._peak * g.eff_compute))
                c = g.t0_s + (tm ** g.p + tc ** g.p) ** (1.0 / g.p)
                f = np.maximum(flops * (1.0 / self._peak), nbytes * (1.0 / self._bw))
            ops["attn_decode"], floors["attn_decode"] = L * c, L * f
            total, floor = total + L * c, floor + L * f
        return IterationTime(total_s=total, floor_s=floor, ops=ops, floor_ops=floors)

    def batch_time(self, model: LLMConfig, batch, *, tp: int | None = None, kv_dtype_bytes: float = 2.0,
                   runs: int = 1) -> IterationTime:
        """:meth:`iteration` for a :class:`host.serving.Batch` (all of it on this GPU's TP group). With
        ``runs = k > 1`` (decode-only batch), an array over the ``k`` iterations of a fused run."""
        pre = batch.prefill
        if not pre.any():
            n_dec = len(pre)
            dec_kv = int(batch.context.sum()) + n_dec
            if runs > 1:
                dec_kv = dec_kv + n_dec * np.arange(runs)
            return self.iteration(model, tp=tp, decode_requests=n_dec, decode_kv_tokens=dec_kv,
                                  logits_tokens=n_dec, kv_dtype_bytes=kv_dtype_bytes)
        if runs > 1:
            raise ValueError("batch_time: runs > 1 needs a decode-only batch")
        dec = ~pre
        n_dec = int(dec.sum())
        dec_kv = int(batch.context[dec].sum()) + n_dec
        return self.iteration(model, tp=tp, prefill_q=batch.new_tokens[pre], prefill_kv=batch.kv_after[pre],
                              decode_requests=n_dec, decode_kv_tokens=dec_kv,
                              logits_tokens=n_dec + int(batch.completes_prefill.sum()),
                              kv_dtype_bytes=kv_dtype_bytes)

    # --- Vidur profile rows ----------------------------------------------------------------------------------
    def predict_profile_ops(self, df) -> dict:
        """Predicted per-op times (seconds) for the rows of a Vidur ``mlp.csv`` DataFrame: op -> array."""
        from host.gpu.profiles import op_shapes
        out = {}
        for op, shape in op_shapes(df).items():
            if shape[0] == "gemm":
                out[op] = np.asarray(self.gemm(shape[1], shape[2], shape[3]).calibrated_s)
            elif op in self.cal.elt:
                out[op] = np.asarray(self.elementwise(op, shape[2]).calibrated_s)
        return out


_SHARED = {}


def get_gpu_model(gpu: str) -> GPUModel:
    """One shared :class:`GPUModel` per GPU type and process, with the default calibration (its tables and
    caches are reused by every system built in the process, e.g. across the runs of a sweep worker)."""
    if gpu not in _SHARED:
        _SHARED[gpu] = GPUModel(gpu)
    return _SHARED[gpu]
