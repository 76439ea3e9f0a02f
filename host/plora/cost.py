"""The cost model of PLoRA VI-B: per-layer LoRA-wave and attention times through W_link and L_link only.

**LoRA wave** (one per layer). Every serving adapter ``i`` contributes the terms of its strategy
(:func:`host.plora.lora.strategy_terms`); the wave is pipelined across adapters, so its time is that of the
busiest resource plus one link round trip when anything crosses the link::

    T_wave = max( max(sum gpu_bytes / W_hbm, sum gpu_flops / F_gpu),      GPU (E1, E2's and E4's GPU part)
                  max(sum out_bytes, sum in_bytes) / W_link,              link, full duplex (W per direction)
                  max_c sum_{i on device c} dev_s_i )                     devices (adapter i on device i mod N)
             + L_link * [any bytes cross the link]
             + t_host * sum host_ops                                             host-mediated systems only

**Attention** (one per layer, PLoRA V-B and VI-B). Request ``r`` attends over ``L_r`` tokens; its first
``dup_r`` are duplicated in HBM (P_KV = sum dup / sum L), token ``i`` lives on device ``i mod N`` (token
interleaving). The GPU computes its share from HBM, each device its share of the rest; every device returns a
partial output and anchors, the GPU merges them (sim/golden/attention.py)::

    T_ATT = max(T_ATT_GPU, L_link + max(T_ATT_dev, T_link_att)) + T_merge
    T_ATT_GPU = sum dup_r * kv_bytes_token_layer / W_hbm       (memory-bound decode attention)
    T_ATT_dev = max_d [sum_r share_s(tokens of r on d) + first_d]   (the NDP model: a device runs its shares as
                                                                  one descriptor stream, attention_batch_s)
    T_link_att = max(out, in) / W_link:  out = q to every device holding tokens + the new token's K, V;
                                         in = partial output (FP16) + anchors (FP16 max, FP32 sum) per device
    T_merge = sum_r parts_r * q_heads * (2 head_dim + 6) / W_hbm

Without distributed attention (ablations NS, N(E3), N(E4); Pure CXL; Grace-Hopper) the GPU computes all of
attention and loads the non-duplicated KV over the link: ``T_ATT = max(T_ATT_GPU, L_link + bytes / W_link)``.

The GPU terms are rooflines on the datasheet numbers (design choice: the cost model is the estimate the
memory manager ranks with; the base model's GEMMs are priced by ``host.gpu``). Everything is per layer; a
decode iteration is ``n_layers`` of them plus the base model.
"""

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .lora import ModelShape, strategy_terms, resident_bytes, E1, E2, E3, E4

__all__ = ["LinkParams", "GPUParams", "CostModel", "AttentionCost", "WaveSums"]

_SHARED = {}


def _ndp_key(ndp):
    """A hashable identity of a device model's timing (None: do not share caches across cost models)."""
    key = getattr(ndp, "cache_key", None)
    if key is not None:
        return key
    spec = getattr(ndp, "spec", None)
    if getattr(ndp, "kind", None) == "standin" and spec is not None:
        return ("standin", spec)
    return None


@dataclass(frozen=True)
class LinkParams:
    """The two numbers the cost model sees of a link: bandwidth per direction and round-trip latency."""

    gbps: float          # W_link, GB/s per direction
    rtt_ns: float        # L_link, round trip

    def __post_init__(self):
        if not (np.isfinite(self.gbps) and self.gbps > 0):
            raise ValueError(f"link bandwidth must be > 0 GB/s, got {self.gbps!r}")
        if not (np.isfinite(self.rtt_ns) and self.rtt_ns >= 0):
            raise ValueError(f"link round-trip latency must be >= 0 ns, got {self.rtt_ns!r}")

    @property
    def W(self) -> float:
        return self.gbps * 1e9

    @property
    def L(self) -> float:
        return self.rtt_ns * 1e-9


@dataclass(frozen=True)
class GPUParams:
    """The GPU numbers the cost model's rooflines use."""

    name: str
    hbm_gb: float
    hbm_gbps: float
    fp16_tflops: float

    @property
    def W_hbm(self) -> float:
        return self.hbm_gbps * 1e9

    @property
    def F(self) -> float:
        return self.fp16_tflops * 1e12


@dataclass
class WaveSums:
    """Running sums of one layer's LoRA wave (all serving adapters)."""

    gpu_bytes: float
    gpu_flops: float
    out_bytes: float
    in_bytes: float
    dev: np.ndarray          # per device bucket, seconds
    link_users: int          # adapters whose strategy crosses the link
    host_ops: float = 0.0    # host-mediated operations (counted for systems without accelerator load/store)

    @classmethod
    def empty(cls, n_dev: int) -> "WaveSums":
        return cls(0.0, 0.0, 0.0, 0.0, np.zeros(n_dev), 0)

    def copy(self) -> "WaveSums":
        return WaveSums(self.gpu_bytes, self.gpu_flops, self.out_bytes, self.in_bytes, self.dev.copy(),
                        self.link_users, self.host_ops)

    def add(self, terms_row, device: int, sign: float = 1.0):
        """Add (sign=+1) or remove (-1) one adapter's terms (a row of strategy_terms) on ``device``."""
        out_b, in_b, dev_s, g_b, g_f = terms_row[:5]
        if len(terms_row) == 7:
            # np.sum of two entries is their sum (bit-equal), without numpy's per-call cost
            self.host_ops += sign * float(terms_row[5] + terms_row[6])
        elif len(terms_row) > 5:
            self.host_ops += sign * float(np.sum(terms_row[5:]))
        self.out_bytes += sign * out_b
        self.in_bytes += sign * in_b
        self.dev[device] += sign * dev_s
        self.gpu_bytes += sign * g_b
        self.gpu_flops += sign * g_f
        if out_b > 0 or in_b > 0:
            self.link_users += int(sign)


@dataclass
class AttentionCost:
    """One layer's attention, its parts (seconds, bytes) and the total."""

    gpu_s: float
    dev_s: float
    dev_per_device_s: np.ndarray
    link_out_bytes: float
    link_in_bytes: float
    link_s: float
    merge_s: float
    total_s: float
    #: (n_req, n_dev) tokens each device holds (:meth:`CostModel.device_tokens`; distributed attention only), for
    #: the execution of the same attention to reuse
    dev_tokens: np.ndarray | None = None


class CostModel:
    """Cost terms of one configuration: model shape, NDP model, device count, link, GPU, KV precision.

    ``lora_waves_per_layer``: link round trips the LoRA part of one layer pays (1: the paper's accounting,
    "two round trips per layer: one LoRA wave, one attention return")."""

    def __init__(self, shape: ModelShape, *, ndp, n_dev: int, link: LinkParams, gpu: GPUParams,
                 kv_bits: int = 16, lora_waves_per_layer: int = 1, gpu_attention_s=None, host_op_s: float = 0.0):
        if isinstance(n_dev, bool) or not isinstance(n_dev, int) or n_dev < 1:
            raise ValueError(f"n_dev must be an int >= 1, got {n_dev!r}")
        if kv_bits not in (4, 8, 16):
            raise ValueError(f"kv_bits must be 16, 8 or 4, got {kv_bits!r}")
        if lora_waves_per_layer < 1:
            raise ValueError(f"lora_waves_per_layer must be >= 1, got {lora_waves_per_layer}")
        self.shape, self.ndp, self.n_dev, self.link, self.gpu = shape, ndp, n_dev, link, gpu
        self.kv_bits = kv_bits
        self.waves = lora_waves_per_layer
        if not (np.isfinite(host_op_s) and host_op_s >= 0):
            raise ValueError(f"host_op_s must be >= 0, got {host_op_s!r}")
        #: seconds per host-mediated operation (PLoRA-NoCXL: a kernel stop, KERNEL_STOP_S; 0: load/store access)
        self.host_op_s = float(host_op_s)
        self.kv_tok_layer = shape.kv_bytes_per_token_layer(kv_bits)
        self.kv_tok = shape.kv_bytes_per_token(kv_bits)
        self._gpu_att = gpu_attention_s
        self.q_bytes = shape.q_heads * shape.head_dim * 2.0
        self.partial_bytes = shape.q_heads * (shape.head_dim * 2.0 + 6.0)
        self.standalone_s = lru_cache(maxsize=None)(self._standalone_s)
        self.resident = lru_cache(maxsize=None)(self._resident)
        self._att_tab = {}
        self._att_lut = {}
        # a device runs a layer's attention shares as one descriptor stream (sim/perf/ndp.py attention_batch_s):
        # each request's share at its cost inside the stream, plus once the first pair's unhidden latency; a model
        # without that interface (the stand-in) prices each share alone
        self._stream = all(hasattr(ndp, f) for f in ("attention_stream_s", "attention_fixed_s", "attention_first_s"))
        self._first = None
        self._rates = None
        # the LoRA terms depend only on the model shape and the device model: runs in one process share them
        key = _ndp_key(ndp)
        shared = _SHARED.setdefault((shape, key), ({}, {})) if key is not None else ({}, {})
        self._terms_cache, self._tables = shared
        if key is not None:
            # the devices' attention tables too (they depend on the shape, the device model and the KV width)
            self._att_tab, self._att_lut = _SHARED.setdefault(("attention", shape, key, kv_bits), ({}, {}))

    # --- LoRA ---------------------------------------------------------------------------------------------
    def terms(self, rank: int, tokens: int) -> np.ndarray:
        """Per-layer cost terms (4 x 7) of one adapter (:func:`host.plora.lora.strategy_terms`), cached."""
        key = (rank, tokens)
        t = self._terms_cache.get(key)
        if t is None:
            t = strategy_terms(self.shape, rank, tokens, self.ndp)
            t.setflags(write=False)
            self._terms_cache[key] = t
        return t

    def decode_table(self, rank: int, max_tokens: int) -> np.ndarray:
        """``terms(rank, b)`` for every ``b`` in ``0..max_tokens`` as one (max_tokens + 1, 4, 7) array (the
        per-iteration pricing gathers from it instead of calling :meth:`terms` per adapter)."""
        tab = self._tables.get(rank)
        if tab is None or len(tab) <= max_tokens:
            size = 1 << int(max_tokens).bit_length()          # grow by powers of two
            tab = np.stack([self.terms(rank, b) for b in range(size)])
            tab.setflags(write=False)
            self._tables[rank] = tab
        return tab

    def _resident(self, rank: int) -> np.ndarray:
        r = resident_bytes(self.shape, rank)
        r.setflags(write=False)
        return r

    def host_terms(self, rank: int, tokens: int) -> np.ndarray:
        """:meth:`terms` without the NDP model's E3 / E4 kernel times (their ``dev_s`` is 0; every other term
        bit-equal to :meth:`terms`), cached alongside it."""
        key = ("host", rank, tokens)
        t = self._terms_cache.get(key)
        if t is None:
            t = strategy_terms(self.shape, rank, tokens, self.ndp, device_lora=False)
            t.setflags(write=False)
            self._terms_cache[key] = t
        return t

    def prefill_choice(self, rank: int, tokens: int, ok, *, prune: bool = True):
        """The fastest of the strategies ``ok`` (in their order; the first on ties) for one adapter serving
        ``tokens`` prompt tokens alone, and its terms row: ``min(ok, key=standalone_s(rank, tokens))``.

        ``prune``: the NDP model prices an E3 / E4 kernel at this batch only when the strategy can win. Its
        standalone time without the device term (``host_terms``) is a lower bound of the full one (the device
        term enters through a max, then the same sums); when that bound is above the best E1 / E2 time (exact:
        their terms do not involve a kernel), the strategy cannot be chosen and its kernel is not priced (a
        prompt is thousands of tokens: every new prompt length is a new kernel shape). The choice and the row
        are the unpruned ones, bit for bit (tests/host/plora/test_plora_cost.py)."""
        ok = list(ok)
        if not prune or (rank, tokens) in self._terms_cache or all(x in (E3, E4) for x in ok):
            times = self.standalone_s(rank, tokens)
            best = min(ok, key=lambda x: times[x])
            return best, self.terms(rank, tokens)[best]
        cheap = self.host_terms(rank, tokens)
        lb = self._standalone_of(cheap)
        known = [x for x in ok if x in (E1, E2)]
        best = min(known, key=lambda x: lb[x])
        if any(x in (E3, E4) and lb[x] <= lb[best] for x in ok):
            times = self.standalone_s(rank, tokens)
            best = min(ok, key=lambda x: times[x])
            return best, self.terms(rank, tokens)[best]
        return best, cheap[best]

    def _standalone_s(self, rank: int, tokens: int) -> np.ndarray:
        """Per-layer time of one adapter alone under each strategy (4,): its wave with nobody else
        (``standalone_s``, cached)."""
        return self._standalone_of(self.terms(rank, tokens))

    def _standalone_of(self, t: np.ndarray) -> np.ndarray:
        gpu = np.maximum(t[:, 3] / self.gpu.W_hbm, t[:, 4] / self.gpu.F)
        link = np.maximum(t[:, 0], t[:, 1]) / self.link.W
        crosses = (t[:, 0] > 0) | (t[:, 1] > 0)
        out = np.maximum(np.maximum(gpu, link), t[:, 2]) + self.waves * self.link.L * crosses \
            + self.host_op_s * (t[:, 5] + t[:, 6])
        out.setflags(write=False)
        return out

    def wave_s(self, s: WaveSums) -> float:
        """Per-layer time of a LoRA wave with sums ``s``."""
        gpu = max(s.gpu_bytes / self.gpu.W_hbm, s.gpu_flops / self.gpu.F)
        link = max(s.out_bytes, s.in_bytes) / self.link.W
        t = max(gpu, link, float(s.dev.max()) if len(s.dev) else 0.0)
        # a host-mediated system's launches and copies run one at a time on the host, in series with the wave
        return t + (self.waves * self.link.L if s.link_users > 0 else 0.0) + self.host_op_s * s.host_ops

    def device_of(self, adapter_id: int) -> int:
        """The device bucket of an adapter (design choice: adapter i's layer l lives on device (i + l) mod N,
        so within every layer the adapters fall into the buckets i mod N)."""
        return int(adapter_id) % self.n_dev

    # --- attention ----------------------------------------------------------------------------------------
    def device_tokens(self, kv_tokens, dup) -> np.ndarray:
        """(n_req, n_dev) tokens each device holds outside the duplicated prefix: token i on device i mod N."""
        L = np.asarray(kv_tokens, dtype=np.int64)[:, None]
        a = np.asarray(dup, dtype=np.int64)[:, None]
        d = np.arange(self.n_dev, dtype=np.int64)[None, :]
        n = self.n_dev
        return np.maximum(0, (L - d + n - 1) // n) - np.maximum(0, (a - d + n - 1) // n)

    def _ndp_fn(self, kind):
        """The device model's per-request attention seconds: ``"share"`` a share inside a stream
        (``attention_stream_s``; without it ``attention_s``), ``"alone"`` a share from an idle device,
        ``"first"`` what one of the share's stream entries costs from an idle device beyond its stream cost
        (``attention_first_s``)."""
        if kind == "share" and self._stream:
            return self.ndp.attention_stream_s
        if kind == "first":
            return self.ndp.attention_first_s
        return self.ndp.attention_s

    def _ndp_attention_exact(self, tokens: np.ndarray, kind: str = "share") -> np.ndarray:
        s = self.shape
        scale = self.kv_bits / 16.0       # a narrower KV streams proportionally fewer bytes (design choice)
        fn = self._ndp_fn(kind)
        if getattr(self.ndp, "kind", "") == "standin":
            return np.asarray(fn(tokens * scale, s.head_dim, s.q_heads, s.kv_heads), float)
        if kind not in self._att_tab:
            # a model with a scalar interface: sample it (every count to 1024, every 64 to 16384, then 100
            # log-spaced points to 2M tokens) and interpolate linearly between the samples
            grid = np.unique(np.concatenate([np.arange(0, 1025), np.arange(1024, 16385, 64),
                                             np.geomspace(16384, 1 << 21, 100).round()]))
            vals = np.array([fn(float(x), s.head_dim, s.q_heads, s.kv_heads) if x > 0 else 0.0 for x in grid])
            self._att_tab[kind] = (grid, vals)
        g, v = self._att_tab[kind]
        return np.interp(tokens * scale, g, v)

    def _ndp_attention(self, tokens, kind: str = "share") -> np.ndarray:
        """Device seconds of one request's share of ``tokens`` (integer counts, vectorized) on one device: inside
        the device's stream of the layer's shares (``kind="share"``) or from an idle device (``"alone"``), from
        a lookup table over every count (grown by powers of two as needed)."""
        tok = np.asarray(tokens)
        if tok.dtype.kind != "i":
            if not np.all(tok == np.round(tok)):
                return self._ndp_attention_exact(tok.astype(float), kind)
            tok = tok.astype(np.int64)
        top = int(tok.max()) if tok.size else 0
        lut = self._att_lut.get(kind)
        if lut is None or len(lut) <= top:
            size = max(1 << 12, 1 << (top.bit_length()))
            lut = self._ndp_attention_exact(np.arange(size, dtype=float), kind)
            lut[0] = 0.0
            self._att_lut[kind] = lut
        return lut[tok]

    def device_attention(self, cnt) -> np.ndarray:
        """Per device (columns of ``cnt``, the (n_req, n_dev) tokens each device holds): one layer's attention
        of its shares run as one stream, ``sum_r share(cnt[r, d]) + max_r first(cnt[r, d])`` (the first entry's
        unhidden latency, once; sim/perf/ndp.py ``attention_batch_s``). With a
        model that prices shares alone only: ``sum_r alone(cnt[r, d])``. (The last answer is kept: an
        iteration's estimate and its execution ask for the same shares one after the other.)"""
        cnt = np.asarray(cnt)
        key = (cnt.shape, cnt.dtype.str, cnt.tobytes())
        last = getattr(self, "_last_dev_att", None)
        if last is not None and last[0] == key:
            return last[1].copy()
        out = self._device_attention(cnt)
        self._last_dev_att = (key, out.copy())
        return out

    def _device_attention(self, cnt) -> np.ndarray:
        per = self._ndp_attention(cnt)
        out = per.sum(axis=0)
        if self._stream and cnt.size:
            extra = self._ndp_attention(cnt, "first")
            out = out + np.where(cnt > 0, extra, 0.0).max(axis=0)
        return out

    def gpu_attention_s(self, n_req: int, tokens_total: float) -> float:
        """GPU decode attention of ``n_req`` requests over ``tokens_total`` HBM-resident tokens in one layer
        (the ``gpu_attention_s(n_req, tokens)`` hook if given, e.g. the calibrated GPU model; else the
        roofline ``bytes / W_hbm``)."""
        if tokens_total <= 0:
            return 0.0
        if self._gpu_att is not None:
            # the last answer is kept: an iteration's estimate and its execution ask for the same share in turn
            key = (n_req, tokens_total)
            last = self.__dict__.get("_last_gpu_att")
            if last is not None and last[0] == key:
                return last[1]
            got = float(self._gpu_att(n_req, tokens_total))
            self._last_gpu_att = (key, got)
            return got
        return tokens_total * self.kv_tok_layer / self.gpu.W_hbm

    def attention(self, kv_tokens, dup, *, distributed: bool = True, new_tokens_to_devices: bool = True
                  ) -> AttentionCost:
        """One layer of decode attention for the requests with ``kv_tokens`` (attended tokens, incl. the new
        one) and ``dup`` duplicated tokens each (0 <= dup <= kv_tokens)."""
        L = np.asarray(kv_tokens, dtype=np.int64)
        a = np.asarray(dup, dtype=np.int64)
        if L.shape != a.shape or L.ndim != 1:
            raise ValueError(f"kv_tokens and dup must be 1-D of one length, got {L.shape}, {a.shape}")
        if np.any(a < 0) or np.any(a > L):
            raise ValueError("dup must satisfy 0 <= dup <= kv_tokens")
        W, Lk, Wh = self.link.W, self.link.L, self.gpu.W_hbm
        gpu_s = self.gpu_attention_s(int(np.count_nonzero(a)), float(a.sum()))
        if len(L) == 0:
            return AttentionCost(0.0, 0.0, np.zeros(self.n_dev), 0.0, 0.0, 0.0, 0.0, 0.0)
        remote = L - a
        if not distributed:
            in_b = float(remote.sum()) * self.kv_tok_layer
            out_b = float(len(L)) * self.kv_tok_layer if new_tokens_to_devices else 0.0
            link_s = max(in_b, out_b) / W
            total = max(gpu_s, (Lk + link_s) if in_b > 0 else 0.0)
            return AttentionCost(gpu_s, 0.0, np.zeros(self.n_dev), out_b, in_b, link_s, 0.0, total)
        cnt = self.device_tokens(L, a)
        per_dev = self.device_attention(cnt)
        active = cnt > 0
        n_active = active.sum(axis=1)
        out_b = float(n_active.sum()) * self.q_bytes
        if new_tokens_to_devices:
            out_b += float(len(L)) * self.kv_tok_layer
        in_b = float(n_active.sum()) * self.partial_bytes
        link_s = max(out_b, in_b) / W
        dev_s = float(per_dev.max())
        parts = n_active + (a > 0)
        merge_s = float(parts.sum()) * self.partial_bytes / Wh
        # no device share: only the posted writes of the new tokens' K, V (no round trip to wait for)
        dev_side = (Lk + max(dev_s, link_s)) if n_active.sum() > 0 else link_s
        # host-mediated: per device with a share a copy of the queries out, the kernel launch, a copy back
        dev_side += self.host_op_s * 3.0 * float(np.count_nonzero(active.any(axis=0)))
        total = max(gpu_s, dev_side) + merge_s
        return AttentionCost(gpu_s, dev_s, per_dev, out_b, in_b, link_s, merge_s, total, cnt)

    # --- aggregate estimate the memory manager ranks with -------------------------------------------------
    def attention_rates(self):
        """(per-token GPU seconds, per-token device seconds, per-request-per-device device seconds) of the
        linearized attention estimate (from the NDP model at 1 and 4097 tokens: a share's cost inside the
        device's stream)."""
        if self._rates is None:
            t1, t2 = self._ndp_attention(np.array([1, 4097]))
            per_tok_dev = (t2 - t1) / 4096.0
            self._rates = (self.kv_tok_layer / self.gpu.W_hbm, float(per_tok_dev), max(float(t1 - per_tok_dev), 0.0))
        return self._rates

    def attention_first_s(self) -> float:
        """Once per device with a share: the first pair's latency the stream does not hide (the device model's
        ``attention_fixed_s`` at a one-beat share; 0 for a model that prices shares alone)."""
        if self._first is None:
            s = self.shape
            self._first = float(self.ndp.attention_fixed_s(np.array([1.0]), s.head_dim, s.q_heads, s.kv_heads)) \
                if self._stream else 0.0
        return self._first

    def attention_estimate(self, n_req: int, gpu_tokens: float, dev_tokens: float, *,
                           distributed: bool = True, n_dev_req: float | None = None) -> float:
        """Linearized one-layer attention time for ``n_req`` requests with ``gpu_tokens`` duplicated and
        ``dev_tokens`` device-only tokens in total, ``n_dev_req`` of the requests (default all) holding
        device-only tokens (the memory manager's estimate; :meth:`attention` prices exactly)."""
        if n_req <= 0:
            return 0.0
        g_rate, d_rate, d_fixed = self.attention_rates()
        gpu_s = gpu_tokens * g_rate
        if not distributed:
            return max(gpu_s, self.link.L + dev_tokens * self.kv_tok_layer / self.link.W if dev_tokens > 0 else 0.0)
        m = n_req if n_dev_req is None else n_dev_req
        n_act = min(self.n_dev, max(1.0, dev_tokens / max(m, 1))) if dev_tokens > 0 and m > 0 else 0.0
        dev_s = dev_tokens * d_rate / self.n_dev + m * d_fixed * n_act / self.n_dev \
            + (self.attention_first_s() if dev_tokens > 0 else 0.0)
        link_s = max(m * n_act * self.q_bytes + n_req * self.kv_tok_layer,
                     m * n_act * self.partial_bytes) / self.link.W
        merge = (m * n_act + n_req * (gpu_tokens > 0)) * self.partial_bytes / self.gpu.W_hbm
        dev_side = self.link.L + max(dev_s, link_s) if dev_tokens > 0 else link_s
        if dev_tokens > 0:
            dev_side += self.host_op_s * 3.0 * n_act
        return max(gpu_s, dev_side) + merge

    def dup_fraction_for(self, n_req: int, gpu_tokens: float, dev_tokens: float, n_dev_req: float,
                         new_tokens: int, *, distributed: bool = True, grid: int = 10) -> float:
        """The duplicated fraction of a new request of ``new_tokens`` tokens that minimizes the attention
        estimate of the batch it joins (fractions 0, 1/grid, ..., 1; ties: the smaller)."""
        best, best_t = 0.0, None
        for k in range(grid + 1):
            p = k / grid
            d = new_tokens * (1.0 - p)
            t = self.attention_estimate(n_req + 1, gpu_tokens + new_tokens * p, dev_tokens + d,
                                        distributed=distributed, n_dev_req=n_dev_req + (1 if d >= 1 else 0))
            if best_t is None or t < best_t * (1 - 1e-12):
                best, best_t = p, t
        return best

    def balanced_dup_fraction(self) -> float:
        """The P_KV at which the GPU's and the devices' attention shares take equal time (per token, large
        contexts): beyond it, more duplication only slows the GPU side."""
        g_rate, d_rate, _ = self.attention_rates()
        dev_rate = d_rate / self.n_dev
        return dev_rate / (g_rate + dev_rate)
