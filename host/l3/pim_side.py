"""The DIMM-PIM side of one replica: rankset placement (L3 5.1) and the timeline of a PIM phase.

**Placement** (:class:`RanksetPlacement`). A request's KV cache is stored layer by layer, alternating ranksets:
layer ``l`` of request ``r`` lives in rankset ``(l + s_r) mod R``; the heads of a layer are spread over the
replica's channels of that rankset (head ``h`` on channel ``h mod C``), so each rank holds
``ceil(N_h / C)`` heads of it. ``s_r`` (the request's *class*) is chosen at admission as the class with the least
KV tokens (load balancing among ranksets, 5.1); the ablation without the communication optimisations stores a
request whole in one rankset chosen at random (Fig. 6-a "randomly mapping the KV cache of requests").

Because layer ``l`` shifts every request by the same ``l``, the ranksets' loads at any layer are a permutation of
the loads of the classes: a phase's time is the same at every layer, so it is computed once per class.

**A PIM phase** (one layer; :meth:`PIMSide.phase`, :meth:`PIMSide.timeline`): the decoding MHA of a sub-batch's
decodes on the ranksets, the decodes' Q/K/V (and their new K, V: L3 5.1 "Q, K and V values from the GPU to host
memory after the 'QKV generation' phase") written into the ranksets that compute them, the attention outputs
read back ("the computed attention results of decoding requests from host memory to the GPU"), and the offload
of the concurrent GPU sub-batch's prefill KV of that layer. The phase's time is read off a timeline of its
resources, event by event:

* **the channel path**: the replica's PCIe uplinks and its ``C`` memory channels carry one transfer at a time
  (5.1: "due to the shared memory buses between ranks, channel bandwidth does not scale with the number of ranks
  for communication. A single rank can nearly saturate the available channel bandwidth"); a transfer of ``b``
  bytes holds it ``setup_s + b / min(PCIe, C x 24.96 GB/s)`` (PCIe 4.0 x16 31.5 GB/s per direction per uplink;
  24.96 GB/s: one DDR4-3200 channel's 25.6 GB/s DQ peak as ``rankset_sim`` measures a rank receiving);
* **the ranksets**: a rankset computes its decodes' heads (``fixed_cycles + heads_per_rank x sum of
  head_cycles(L)``, :mod:`host.l3.pim_timing`) at the command-bus rate :class:`RanksetModel` gives the ranks
  computing at that moment (one more rank on the bus while a transfer runs); **a rank that a transfer reads or
  writes does not compute meanwhile** (5.1: "only one rankset ... is engaged to receive the data");
* **per-transfer set-up** :attr:`PIMSide.setup_s`, paid by every transfer: the PCIe DMA round trip (1 us,
  host-core's labelled assumption, ``host.link.PCIE4_X16``) plus the DRAM hand-over of the ranks between their
  rank PU and the host's memory controller (JEDEC DDR4-3200 timing of L3 Table 2, :data:`HANDOVER`: the rank PU's
  rows closed, the host's first write through ``tRCD + CWL + burst``, its last recovered and closed, the rank PU's
  row reopened: 132 cycles, 82.5 ns).

Order on the channel path: the Q/K/V first (they gate the attention: "computational-dependent, which will be
immediately used by the attention computation on DIMM-PIM in the same iteration"), then the outputs as they
become ready, then the prefill KV ("transferred asynchronously").

**With the communication optimisations** (``comm=True``, L3): the rankset is the unit of transfer (5.1 "we
introduce a new hardware extension to use rankset as the basic unit for data transfer ... During a single data
transfer, only one rankset ... is engaged to receive the data, while other ranksets can perform independent
computations without being stuck"): one transfer per rankset and kind. The Q/K/V go rankset by rankset, the
busiest rankset first, and each rankset starts computing when its own have arrived while the next one receives;
a rankset's outputs leave when it finishes, while the others still compute. A layer's prefill KV alternates
ranksets layer by layer, so the phase of the average layer gives every rankset ``1 / R`` of it (:meth:`phase`); a
write goes when the channel path is free, to the receiving rankset with the least compute left (idle ones
first), and pauses only that rankset's compute. The offload is asynchronous (the GPU does not wait for it).
Charged conservatively: each rankset transfer is its own DMA with its own round trip, in series.

**Without them** (``comm=False``, ``l3-no-comm`` / ``l3-base``): 5.1's "Conventional scheduling treats all
DIMM-PIM as a monolithic entity, alternating between communication and computation modes": one transfer per kind
(all ranksets at once, so the set-up is paid once per kind: the cheapest count for the monolithic design), and
**every rank stops computing while any transfer runs** (the mode switch); the phase is Q/K/V in, compute, outputs
out and the prefill KV write, each transfer stopping all ranks. The prefill KV offload is also synchronous on the
GPU (the GPU phase that generates it waits for the same transfer: :meth:`PIMSide.offload`).
"""

import numpy as np

from host.l3.pim_timing import pim_timing, rankset_model, DEFAULT_COMMAND_PATH

__all__ = ["RanksetPlacement", "PIMSide", "PhaseTime", "HANDOVER"]

#: The DRAM hand-over a transfer costs its ranks (DDR4 command clocks, JEDEC JESD79-4 DDR4-3200 as L3 Table 2 and
#: ``hdl.pim.config.PAPER`` give them): the rank PU's open rows closed (``tRPab``); the host's first write
#: activates (``tRCD``) and lands (``CWL + burst``); after its last write, write recovery and precharge (``tWR +
#: tRP``) before the rank PU reopens its row (``tRCD``). 22 + 22 + 16 + 4 + 24 + 22 + 22 = 132 cycles.
HANDOVER = ("tRPab", "tRCD", "CWL", "burst", "tWR", "tRP", "tRCD")

_IN, _OUT, _WR = 0, 1, 2            # transfer kinds, in the channel path's order of priority
_ALL = -1                           # a monolithic transfer: every rankset at once


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
    """One PIM phase (one layer), read off its timeline: ``total`` (its end: the critical path), ``busy`` (the
    busiest rankset's computing and transfer time), ``t_in`` / ``t_out`` / ``write`` (the channel path's time on
    Q/K/V in, outputs out and prefill KV, set-up included), ``compute`` (per class, seconds computing),
    ``writes`` (per class, seconds receiving prefill KV), ``stalled`` (per class, seconds a class with work to do
    could not compute because a transfer held its ranks) and ``transfers`` (how many)."""

    __slots__ = ("total", "busy", "t_in", "t_out", "write", "compute", "writes", "stalled", "transfers")

    def __init__(self, total, busy, t_in, t_out, write, compute, writes, stalled=None, transfers=0):
        self.total, self.busy, self.t_in, self.t_out = total, busy, t_in, t_out
        self.write, self.compute, self.writes = write, compute, writes
        self.stalled = np.zeros_like(np.asarray(compute, dtype=np.float64)) if stalled is None else stalled
        self.transfers = transfers


class PIMSide:
    """PIM phase times of one replica of ``setup``; ``comm`` switches L3's 5.1 communication (module
    docstring)."""

    def __init__(self, setup, *, comm: bool = True, command_path: str = DEFAULT_COMMAND_PATH):
        m = setup.model
        self.setup, self.comm = setup, bool(comm)
        #: the rank PUs' command path (host.l3.pim_timing.COMMAND_PATHS): per_rank (a computing rank keeps its
        #: rate) or shared (the ranks' commands share the channel's bus)
        self.command_path = command_path
        self.timing, self.rs = pim_timing(setup.host.pim_config), rankset_model(command_path, setup.host.pim_config)
        self.R = setup.host.ranksets
        self.C = setup.channels_per_replica
        self.hpr = setup.heads_per_rank
        self.n_layers = m.n_layers
        self.link_Bps = setup.host_link_gbps * 1e9
        self.rtt_s = setup.host_link.rtt_ns * 1e-9
        #: bytes / s of the channel path: the lower of the replica's PCIe (per direction) and its channels (each
        #: at rankset_sim's measured 24.96 GB/s; assumption: reads of the outputs stream as fast as writes)
        self.chan_Bps = self.C * self.rs.channel_write_gbps * 1e9
        self.write_Bps = min(self.link_Bps, self.chan_Bps)
        self.read_Bps = min(self.link_Bps, self.chan_Bps)
        tm, org = self.timing.model.tm, self.timing.config.dram.org
        vals = {"burst": org.burst_cycles}
        self.handover_cycles = int(sum(vals[k] if k in vals else getattr(tm, k) for k in HANDOVER))
        self.tck = self.timing.tck_s
        #: seconds of set-up every transfer pays: the PCIe DMA round trip and the ranks' DRAM hand-over
        self.setup_s = self.rtt_s + self.handover_cycles * self.tck
        vec = m.n_heads * m.head_dim * m.dtype_bytes           # one FP16 vector per head
        self.qkv_bytes, self.out_bytes = 3 * vec, vec             # per decode request per layer
        self.kv_layer_bytes = 2 * m.n_kv_heads * m.head_dim * m.dtype_bytes   # K and V of one token, one layer
        # compute rate a computing rank keeps with k ranks of its channel busy (k = 1 .. R), without / with one
        # of them transferring: the command bus is shared by the ranks that issue commands
        self._rate = [1.0] + [self.rs.compute_rate(k) for k in range(1, self.R + 1)]
        self._rate_w = [1.0, 1.0] + [self.rs.compute_rate(k, writer=True) for k in range(2, self.R + 1)]
        self.fixed = self.timing.fixed_cycles

    # ---- pieces (one layer) ----------------------------------------------------------------------------------
    def transfer_in(self, n_dec):
        """PCIe time of ``n_dec`` decodes' Q/K/V with one round trip (the baselines' serial transfer)."""
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

    def class_write_bytes(self, chunks, cls) -> np.ndarray:
        """Bytes each class receives (one layer) for prefill chunks ``chunks`` of requests in ``cls``."""
        c = np.asarray(chunks, dtype=np.float64)
        if not c.size:
            return np.zeros(self.R)
        return np.bincount(np.asarray(cls, dtype=np.int64), weights=c * self.kv_layer_bytes, minlength=self.R)

    def offload(self, chunks, cls=None) -> float:
        """All-layer seconds of the channel path's prefill-KV transfers of ``chunks`` (of requests in classes
        ``cls``): one transfer per layer and receiving class with the optimisations, one per layer without
        them, set-up included. Without the optimisations the GPU waits for it (synchronous offload)."""
        c = np.asarray(chunks, dtype=np.float64)
        tot = float(np.sum(c))
        if tot <= 0:
            return 0.0
        n = 1 if (not self.comm or cls is None) else len(np.unique(np.asarray(cls)[c > 0]))
        return self.n_layers * (n * self.setup_s + tot * self.kv_layer_bytes / self.write_Bps)

    def sync_offload(self, chunks) -> float:
        """All-layer seconds of streaming ``chunks``' KV at the channel path's rate, no set-up (R-PIM's hidden
        transfer)."""
        return self.n_layers * float(np.sum(chunks)) * self.kv_layer_bytes / self.write_Bps

    # ---- the timeline of one phase ---------------------------------------------------------------------------
    def timeline(self, cycles, n_dec, write_bytes, write_setups=None) -> PhaseTime:
        """One phase (one layer) from per-class full-rate compute ``cycles``, per-class decode counts ``n_dec``
        (their Q/K/V go in, their outputs out) and per-class prefill-KV ``write_bytes``, simulated event by
        event on the channel path and the ranksets (module docstring). ``write_setups``: the set-ups each
        class's write pays (default one per class receiving; the balanced L3 offload spreads them)."""
        R, comm, S, tck = self.R, self.comm, self.setup_s, self.tck
        cyc = [float(x) for x in cycles]
        nd = [int(x) for x in n_dec]
        wb = [float(x) for x in write_bytes]
        ws = [1.0] * R if write_setups is None else [float(x) for x in write_setups]
        rem = cyc[:]
        started = [n == 0 for n in nd]              # a class computes once its Q/K/V are in
        # transfers (kind, dest, seconds) in three queues: Q/K/V in (their order), outputs (as they become
        # ready), prefill KV writes
        if comm:
            order = sorted((m for m in range(R) if nd[m]), key=lambda m: (-cyc[m], m))
            q_in = [(_IN, m, S + nd[m] * self.qkv_bytes / self.write_Bps) for m in order]
            q_wr = [(_WR, m, ws[m] * S + wb[m] / self.write_Bps) for m in range(R) if wb[m] > 0]
            outs = {m: (_OUT, m, S + nd[m] * self.out_bytes / self.read_Bps) for m in range(R) if nd[m]}
        else:
            Q, W = sum(nd), sum(wb)
            q_in = [(_IN, _ALL, S + Q * self.qkv_bytes / self.write_Bps)] if Q else []
            q_wr = [(_WR, _ALL, S + W / self.write_Bps)] if W > 0 else []
            outs = {_ALL: (_OUT, _ALL, S + Q * self.out_bytes / self.read_Bps)} if Q else {}
        q_out = []
        n_transfers = len(q_in) + len(q_wr) + len(outs)
        kind_s = [0.0, 0.0, 0.0]
        comp_s, xfer_s, stall_s, wr_s = [0.0] * R, [0.0] * R, [0.0] * R, [0.0] * R
        active = [m for m in range(R) if started[m] and rem[m] > 0]     # classes with work they may do
        inf = float("inf")
        t, cur, dest, cur_end = 0.0, None, None, inf
        rate_free, rate_busy = self._rate, self._rate_w
        while True:
            if cur is None:
                if q_in:
                    cur = q_in.pop(0)
                elif q_out:
                    cur = q_out.pop(0)
                elif q_wr:                               # into the receiving class with the least work left
                    j = min(range(len(q_wr)), key=lambda i: rem[q_wr[i][1]] if q_wr[i][1] >= 0 else 0.0)
                    cur = q_wr.pop(j)
                if cur is not None:
                    kind, dest, dur = cur
                    cur_end = t + dur
                    kind_s[kind] += dur
                    if kind == _WR:
                        if dest == _ALL:
                            for m in range(R):
                                wr_s[m] += dur * wb[m] / W
                        else:
                            wr_s[dest] += dur
            if cur is None:
                comp = active
            elif dest == _ALL:
                comp = []
            else:
                comp = [m for m in active if m != dest]
            t_next = cur_end
            if comp:
                spc = tck / (rate_busy[len(comp) + 1] if cur is not None else rate_free[len(comp)])
                first = comp[0]
                for m in comp:
                    if rem[m] < rem[first]:
                        first = m
                t_c = t + rem[first] * spc
                if t_c < t_next:
                    t_next = t_c
            else:
                t_c = inf
            if t_next == inf:
                break
            dt = t_next - t
            if comp:
                step = dt / spc
                for m in comp:
                    rem[m] -= step
                    comp_s[m] += dt
            if cur is not None:
                if dest == _ALL:
                    for m in range(R):
                        xfer_s[m] += dt
                    for m in active:
                        stall_s[m] += dt
                else:
                    xfer_s[dest] += dt
                    if dest in active:
                        stall_s[dest] += dt
            t = t_next
            if t_c <= t_next:                            # computes end
                rem[first] = 0.0
                for m in comp:
                    if rem[m] <= 1e-9 * cyc[m]:
                        rem[m] = 0.0
                active = [m for m in active if rem[m] > 0.0]
                if comm:
                    for m in comp:
                        if rem[m] == 0.0 and m in outs:
                            q_out.append(outs.pop(m))
            if cur is not None and cur_end <= t:         # the transfer ends
                if cur[0] == _IN:
                    for m in (range(R) if dest == _ALL else (dest,)):
                        started[m] = True
                    active = [m for m in range(R) if started[m] and rem[m] > 0.0]
                cur, dest, cur_end = None, None, inf
            if not comm and _ALL in outs and not active and all(started):
                q_out.append(outs.pop(_ALL))
        busy = max((comp_s[m] + xfer_s[m] for m in range(R)), default=0.0)
        return PhaseTime(t, busy, kind_s[_IN], kind_s[_OUT], kind_s[_WR], np.array(comp_s), np.array(wr_s),
                         np.array(stall_s), n_transfers)

    def phase(self, dec_L, dec_cls, pre_chunks=(), pre_cls=()) -> PhaseTime:
        """One layer: decodes attending over ``dec_L`` tokens in classes ``dec_cls``, while prefill chunks
        ``pre_chunks`` of requests in ``pre_cls`` are offloaded.

        With the optimisations the offload is asynchronous and alternates ranksets layer by layer (5.1 "its KV
        cache for different layers is alternately offloaded to different ranksets. As a result, the data
        transfer time is eventually balanced across each rankset"; "transferred asynchronously"): the phase of
        the average layer gives every rankset ``1 / R`` of the layer's prefill KV and of its set-ups (one per
        class receiving). Without them each class receives its own, in the one monolithic transfer."""
        cls = np.asarray(dec_cls, dtype=np.int64)
        wb = self.class_write_bytes(pre_chunks, pre_cls)
        ws = None
        if self.comm and wb.any():
            ws = np.full(self.R, np.count_nonzero(wb) / self.R)
            wb = np.full(self.R, wb.sum() / self.R)
        return self.timeline(self.class_cycles(dec_L, cls), np.bincount(cls, minlength=self.R), wb, ws)

    def run_totals(self, dec_L, dec_cls, k: int, stride: int = 16):
        """All-layer PIM phase totals and busy times of ``k`` decode-only iterations in which every context grows
        by one per iteration (no writes): arrays of length ``k``. Each phase's timeline is evaluated exactly
        every ``stride`` iterations (and at the last) and interpolated linearly in between (the per-head cost is
        piecewise linear in L)."""
        L = np.asarray(dec_L, dtype=np.int64)
        n = len(L)
        if not n:
            return np.zeros(k), np.zeros(k)
        pts = np.unique(np.append(np.arange(0, k, stride), k - 1))
        Ls = L[None, :] + pts[:, None]
        hc = self.timing.head_cycles(Ls.ravel()).reshape(Ls.shape)
        cls = np.asarray(dec_cls, dtype=np.int64)
        nd = np.bincount(cls, minlength=self.R)
        per = np.zeros((len(pts), self.R))
        for c in range(self.R):
            sel = cls == c
            if sel.any():
                per[:, c] = hc[:, sel].sum(axis=1) * self.hpr + self.fixed
        none = np.zeros(self.R)
        tot_p, busy_p = np.zeros(len(pts)), np.zeros(len(pts))
        for j in range(len(pts)):
            ph = self.timeline(per[j], nd, none)
            tot_p[j], busy_p[j] = ph.total, ph.busy
        x = np.arange(k)
        return self.n_layers * np.interp(x, pts, tot_p), self.n_layers * np.interp(x, pts, busy_p)
