"""The DIMM-PIM side of one replica: rankset placement (L3 5.1) and the time of a PIM phase.

**Placement** (:class:`RanksetPlacement`). A request's KV cache is stored layer by layer, alternating ranksets:
layer ``l`` of request ``r`` lives in rankset ``(l + s_r) mod R``; the heads of a layer are spread over the
replica's channels of that rankset (head ``h`` on channel ``h mod C``), so each rank holds
``ceil(N_h / C)`` heads of it. ``s_r`` (the request's *class*) is chosen at admission as the class with the least
KV tokens (load balancing among ranksets, 5.1); the ablation without the communication optimisations stores a
request whole in one rankset chosen at random (Fig. 6-a "randomly mapping the KV cache of requests").

Because layer ``l`` shifts every request by the same ``l``, the ranksets' loads at any layer are a permutation of
the loads of the classes: a phase's time is the same at every layer, so it is computed once per class.

**A PIM phase** (one layer; :meth:`PIMSide.phase`): decoding MHA of a sub-batch's decodes on every rankset, the
offload of the concurrent GPU sub-batch's prefill KV, and the decodes' Q/K/V in and attention outputs out:

* ``t_in`` / ``t_out``: Q, K, V (``3 N_h D_h`` FP16 per decode) from the GPUs to host memory and the outputs
  (``N_h D_h``) back, over the replica's PCIe uplinks, one round trip each (critical path, 5.1);
* compute of class ``m``: ``fixed_cycles + heads_per_rank x sum of head_cycles(L)`` over its decodes
  (:mod:`host.l3.pim_timing`), divided by the command-bus rate the ranks keep (:class:`RanksetModel`: all ranks
  computing, or one rankset receiving writes);
* writes into class ``m``: the K and V of that layer of the prefill chunks stored there, at the lower of the PCIe
  bandwidth and the rankset's write bandwidth (channels x ``rankset_sim``'s 24.96 GB/s); the receiving rankset
  does not compute meanwhile (5.1: only one rankset is in communication mode).

With the communication optimisations (``comm=True``):
``T = t_in + max(max_m(compute_m / rate + write_m), sum_m write_m) + t_out`` (the other ranksets keep computing
while one receives; PCIe carries the writes one after the other). Without them (``comm=False``): the DIMM-PIM is
one monolithic unit that stops computing during any transfer, ``T = t_in + max_m compute_m + sum_m write_m +
t_out``, and the prefill KV offload is synchronous (the GPU waits for it: :meth:`PIMSide.sync_offload`).
"""

import numpy as np

from host.l3.pim_timing import pim_timing, rankset_model

__all__ = ["RanksetPlacement", "PIMSide", "PhaseTime"]


class RanksetPlacement:
    """Classes (rankset offsets) of the requests of one run; ``policy`` ``"balanced"`` or ``"random"``."""

    def __init__(self, n_requests: int, ranksets: int, *, policy: str = "balanced", seed: int = 0):
        if policy not in ("balanced", "random"):
            raise ValueError(f"placement policy must be 'balanced' or 'random', got {policy!r}")
        if ranksets < 1:
            raise ValueError(f"ranksets must be >= 1, got {ranksets}")
        self.R = int(ranksets)
        self.policy = policy
        self.cls = np.full(n_requests, -1, np.int64)
        self.tokens = np.zeros(n_requests, np.int64)
        self.load = np.zeros(self.R, np.int64)          # KV tokens held per class
        self.rng = np.random.default_rng(seed)

    def place(self, idx: int, tokens: int) -> int:
        """Give request ``idx`` (holding ``tokens`` KV tokens) its class; returns it."""
        if self.cls[idx] >= 0:
            self.release(idx)
        c = int(np.argmin(self.load)) if self.policy == "balanced" else int(self.rng.integers(self.R))
        self.cls[idx] = c
        self.tokens[idx] = tokens
        self.load[c] += tokens
        return c

    def grow(self, idx, tokens) -> None:
        """Requests ``idx`` now hold ``tokens`` KV tokens each."""
        idx = np.asarray(idx, dtype=np.int64)
        tokens = np.broadcast_to(np.asarray(tokens, dtype=np.int64), idx.shape)
        np.add.at(self.load, self.cls[idx], tokens - self.tokens[idx])
        self.tokens[idx] = tokens

    def release(self, idx) -> None:
        idx = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        idx = idx[self.cls[idx] >= 0]
        np.add.at(self.load, self.cls[idx], -self.tokens[idx])
        self.cls[idx] = -1
        self.tokens[idx] = 0

    def rankset(self, idx, layer):
        """The rankset holding layer ``layer`` of request(s) ``idx``."""
        return (np.asarray(layer) + self.cls[np.asarray(idx)]) % self.R

    def layers_per_rankset(self, idx: int, n_layers: int) -> np.ndarray:
        """How many of a request's ``n_layers`` layers each rankset stores."""
        return np.bincount(self.rankset(np.full(n_layers, idx), np.arange(n_layers)), minlength=self.R)

    @staticmethod
    def heads_per_channel(n_heads: int, channels: int) -> np.ndarray:
        """Heads of one layer on each channel of a rankset (head h on channel h mod C)."""
        return np.bincount(np.arange(n_heads) % channels, minlength=channels)


class PhaseTime:
    """One PIM phase (one layer): ``total`` (critical path), ``busy`` (the busiest rankset's compute + receive
    time), ``t_in``, ``t_out``, ``write`` (all writes), ``compute`` (per class, at the bus rate)."""

    __slots__ = ("total", "busy", "t_in", "t_out", "write", "compute", "writes")

    def __init__(self, total, busy, t_in, t_out, write, compute, writes):
        self.total, self.busy, self.t_in, self.t_out = total, busy, t_in, t_out
        self.write, self.compute, self.writes = write, compute, writes


class PIMSide:
    """PIM phase times of one replica of ``setup``."""

    def __init__(self, setup, *, comm: bool = True):
        m = setup.model
        self.setup, self.comm = setup, bool(comm)
        self.timing, self.rs = pim_timing(), rankset_model()
        self.R = setup.host.ranksets
        self.C = setup.channels_per_replica
        self.hpr = setup.heads_per_rank
        self.n_layers = m.n_layers
        self.link_Bps = setup.host_link_gbps * 1e9
        self.rtt_s = setup.host_link.rtt_ns * 1e-9
        self.write_Bps = min(self.link_Bps, self.C * self.rs.channel_write_gbps * 1e9)
        vec = m.n_heads * m.head_dim * m.dtype_bytes           # one FP16 vector per head
        self.qkv_bytes, self.out_bytes = 3 * vec, vec             # per decode request per layer
        self.kv_layer_bytes = 2 * m.n_kv_heads * m.head_dim * m.dtype_bytes   # K and V of one token, one layer
        self.rate_all = self.rs.compute_rate(self.R)
        self.rate_w = self.rs.compute_rate(self.R, writer=True) if self.R > 1 else 0.0
        self.tck = self.timing.tck_s
        self.fixed = self.timing.fixed_cycles

    # ---- pieces (one layer) ----------------------------------------------------------------------------------
    def transfer_in(self, n_dec):
        n = np.asarray(n_dec, dtype=np.float64)
        return np.where(n > 0, n * self.qkv_bytes / self.link_Bps + self.rtt_s, 0.0)

    def transfer_out(self, n_dec):
        n = np.asarray(n_dec, dtype=np.float64)
        return np.where(n > 0, n * self.out_bytes / self.link_Bps + self.rtt_s, 0.0)

    def class_cycles(self, L, cls) -> np.ndarray:
        """Full-rate cycles per class (one layer) of decodes attending over ``L`` tokens in classes ``cls``."""
        L = np.asarray(L, dtype=np.int64)
        cls = np.asarray(cls, dtype=np.int64)
        if not L.size:
            return np.zeros(self.R)
        cyc = np.bincount(cls, weights=self.timing.head_cycles(L), minlength=self.R) * self.hpr
        has = np.bincount(cls, minlength=self.R) > 0
        return np.where(has, cyc + self.fixed, 0.0)

    def class_writes(self, chunks, cls) -> np.ndarray:
        """Seconds each class receives (one layer) for prefill chunks ``chunks`` of requests in ``cls``."""
        c = np.asarray(chunks, dtype=np.float64)
        if not c.size:
            return np.zeros(self.R)
        return np.bincount(np.asarray(cls, dtype=np.int64), weights=c * self.kv_layer_bytes,
                           minlength=self.R) / self.write_Bps

    def sync_offload(self, chunks) -> float:
        """All-layer seconds of a synchronous prefill-KV offload (no communication optimisations)."""
        return self.n_layers * float(np.sum(chunks)) * self.kv_layer_bytes / self.write_Bps

    def combine(self, cycles, writes, n_dec) -> PhaseTime:
        """A phase (one layer) from per-class full-rate ``cycles``, per-class receive seconds ``writes`` and the
        number of decodes."""
        t_in, t_out = float(self.transfer_in(n_dec)), float(self.transfer_out(n_dec))
        w_tot = float(np.sum(writes))
        if self.comm:
            rate = self.rate_w if (w_tot > 0 and self.R > 1) else self.rate_all
            comp = np.asarray(cycles) * self.tck / rate
            per = comp + writes
            busy = float(per.max()) if per.size else 0.0
            body = max(busy, w_tot)
        else:
            comp = np.asarray(cycles) * self.tck / self.rate_all
            busy = float(comp.max()) + w_tot if comp.size else w_tot
            body = busy
        total = t_in + body + t_out if (n_dec or w_tot) else 0.0
        return PhaseTime(total, busy, t_in, t_out, w_tot, comp, np.asarray(writes))

    def phase(self, dec_L, dec_cls, pre_chunks=(), pre_cls=()) -> PhaseTime:
        """One layer: decodes attending over ``dec_L`` tokens in classes ``dec_cls``, while prefill chunks
        ``pre_chunks`` of requests in ``pre_cls`` are offloaded."""
        return self.combine(self.class_cycles(dec_L, dec_cls), self.class_writes(pre_chunks, pre_cls), len(dec_L))

    def run_totals(self, dec_L, dec_cls, k: int, stride: int = 16):
        """All-layer PIM phase totals and busy times of ``k`` decode-only iterations in which every context grows
        by one per iteration (no writes): arrays of length ``k``. Evaluated exactly every ``stride`` iterations
        (and at the last) and interpolated linearly in between (the per-head cost is piecewise linear in L)."""
        L = np.asarray(dec_L, dtype=np.int64)
        n = len(L)
        if not n:
            return np.zeros(k), np.zeros(k)
        pts = np.unique(np.append(np.arange(0, k, stride), k - 1))
        Ls = L[None, :] + pts[:, None]
        hc = self.timing.head_cycles(Ls.ravel()).reshape(Ls.shape)
        cls = np.asarray(dec_cls, dtype=np.int64)
        per = np.zeros((len(pts), self.R))
        for c in range(self.R):
            sel = cls == c
            if sel.any():
                per[:, c] = hc[:, sel].sum(axis=1) * self.hpr + self.fixed
        comp_s = per.max(axis=1) * self.tck / self.rate_all
        busy = np.interp(np.arange(k), pts, comp_s)
        total = busy + float(self.transfer_in(n)) + float(self.transfer_out(n))
        return self.n_layers * total, self.n_layers * busy
