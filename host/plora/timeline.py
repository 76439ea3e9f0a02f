"""The execution timeline of a PLoRA-family iteration, apart from the cost model the decisions use (issue 30).

Algorithm 1 ranks strategies with the VI-B estimate (:mod:`host.plora.cost`): per layer the busiest of GPU, link
and devices plus one round trip for the LoRA wave, ``max(GPU, devices) + merge`` for attention. A run's time does
not come from that estimate. Each iteration is *executed* here, job by job, on a model of the resources:

============  ==============================================================================================
lane          what it models
============  ==============================================================================================
``GPU 0``     one in-order stream: the layer's base GEMMs, the fused GPU LoRA kernel of the E1 adapters, the
              fused kernel of the E2 / E4 GPU parts and the add of the E3 outputs (after their data arrived),
              GPU decode attention, prefill attention, the merge of the partial outputs (times from the
              calibrated GPU model, ``host.gpu``, not the rooflines of the estimate)
``link out``  GPU -> devices, FIFO at W_link; a transfer is delivered ``rtt / 2`` after its last byte left
``link in``   devices -> GPU, FIFO at W_link, in the order the data is ready; delivered ``rtt / 2`` later
``device d``  the NDP core's descriptor queue, FIFO (PLoRA IV: the HDM submission queues feed one core per
              device); a job's time is the RTL-calibrated NDP model's (the same per-job times the estimate sums)
``host``      the CPU's launch path of host-mediated systems (PLoRA-NoCXL): a device job takes host operations
              (each a kernel stop, launch + synchronize, ``KERNEL_STOP_S``), one at a time, FIFO: before it, the
              input's copy and a kernel launch per adapted matrix; after it, a copy of each result back; an
              attention exchange two per device before (the queries' copy, the launch) and one after (the
              partials' copy); the first synchronize waits for the GPU work already queued (the base GEMMs and
              E1 kernel of the layer)
============  ==============================================================================================

Per layer, from the time ``t`` the GPU finished the previous layer (the dependency graph; PLoRA V):

1. the LoRA device jobs (E2: a LOAD of A and B; E3: y = x A B; E4: m = x A) are dispatched at ``t`` in adapter
   order: ``x`` out, the job on its device's queue, its result (y, m, or A and B) back;
   meanwhile the GPU runs the base GEMMs (they read the same input, V-A: ``x W = x W_base + x A B``) and the
   fused E1 kernel, then, once every result is in, the kernel of the E2 / E4 GPU parts and the add of the E3
   outputs; the prompt tokens' K, V leave for the devices once the base GEMMs made them (posted writes);
2. attention (V-B) once the LoRA wave is done: each device with a share gets the query and the new token's K, V,
   runs its share as one descriptor stream on its queue and returns its partial output and anchors; the GPU
   computes its duplicated share and the prefill attention, then merges once every partial is in. Without
   distributed attention the GPU reads the devices' KV over the link while its attention kernel runs (the
   kernel ends when both its HBM part and the last remote byte are done);
3. adapter loads (adapters being cached into HBM, :mod:`host.plora.manager`) are the lowest-priority traffic: they
   take the link-in time a layer leaves idle (design choice: a loader that issues a chunk only while the direction
   is idle); what is left after the last layer runs after it and delays the iteration's end.

The iteration ends when the GPU finished the last layer and every transfer and device job it started is done.
Once a layer starts in the same relative state as the previous one (every lane's backlog the same) the rest
of the layers repeat it exactly and are not recomputed.

What is not modelled (said so in docs/plora_host.md): descriptor bytes and completion polling (a 64-byte line
per descriptor), the GPU's concurrency across streams (one in-order stream), and per-matrix dependencies inside
a layer (one LoRA wave and one attention per layer, as the paper's accounting has it).
"""

from dataclasses import dataclass, field

import numpy as np

from host.serving import Span

__all__ = ["LayerWork", "Executed", "Timeline", "fifo"]


def fifo(arrive, service, free: float) -> np.ndarray:
    """Finish times of jobs served in the given order by one FIFO server that is free from ``free``:
    ``f_i = max(a_i, f_{i-1}) + s_i`` (vectorized: ``f_i = S_i + max(free, max_{j<=i} a_j - S_{j-1})``)."""
    a = np.asarray(arrive, dtype=np.float64)
    s = np.asarray(service, dtype=np.float64)
    if a.size == 0:
        return a
    if a.size <= _SMALL_FIFO:
        return _fifo_small(a.tolist(), s.tolist(), float(free))
    return _fifo_np(a, s, free)


#: Up to this many jobs :func:`fifo` runs the same operations one by one in Python, bit-equal to the vectorized
#: form (``test_small_fifo_is_the_vectorized_one``) and 2-4x cheaper than numpy's per-call cost on a few jobs.
_SMALL_FIFO = 8


def _fifo_small(a: list, s: list, free: float) -> np.ndarray:
    out, S, slack = [], 0.0, None
    for ai, si in zip(a, s):
        S = S + si                                              # np.cumsum: sequential
        v = ai - (S - si)
        slack = v if slack is None or v > slack else slack      # np.maximum.accumulate
        out.append(S + (slack if slack > free else free))       # + np.maximum(slack, free)
    return np.array(out)


def _fifo_np(a: np.ndarray, s: np.ndarray, free: float) -> np.ndarray:
    S = np.cumsum(s)
    slack = np.maximum.accumulate(a - (S - s))
    return S + np.maximum(slack, free)


@dataclass
class LayerWork:
    """One layer's work in one iteration (every layer of an iteration carries the same work)."""

    base_s: float = 0.0                   # GPU: the base model's per-layer share
    job_dev: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # LoRA device jobs, in order
    job_out: np.ndarray = field(default_factory=lambda: np.zeros(0))              # bytes to the device first
    job_s: np.ndarray = field(default_factory=lambda: np.zeros(0))                # device seconds
    job_in: np.ndarray = field(default_factory=lambda: np.zeros(0))               # bytes back to the GPU
    gpu_e1_s: float = 0.0                 # fused kernel of the GPU-only adapters (E1)
    gpu_after_s: float = 0.0              # E2 / E4 GPU parts and the add of E3 outputs, after their data
    att_out: np.ndarray | None = None     # (n_dev,) bytes to each device: queries and the new tokens' K, V
    att_s: np.ndarray | None = None       # (n_dev,) device seconds of the attention stream
    att_in: np.ndarray | None = None      # (n_dev,) partial outputs and anchors back
    att_gpu_s: float = 0.0                # GPU decode attention over its HBM share
    remote_in: float = 0.0                # bytes of KV the GPU reads over the link (no distributed attention)
    new_kv_out: float = 0.0               # new tokens' K, V to the devices (no distributed attention; posted)
    merge_s: float = 0.0                  # the GPU's merge of the partials
    prefill_att_s: float = 0.0            # GPU prefill attention
    prefill_out: float = 0.0              # prompt K, V to the devices (posted)
    load_in: float = 0.0                  # adapter-load bytes of the iteration (background, lowest priority)
    host_stop_s: float = 0.0              # per host-mediated operation (0: accelerator load/store)
    job_stops: np.ndarray | None = None   # host operations before each LoRA device job (default 1 each)
    job_stops_after: np.ndarray | None = None   # host operations after it (its results' copies; default 0)
    waves: int = 1                        # LoRA waves per layer (each 1 / waves of the jobs, one after another)


@dataclass
class Executed:
    """What the timeline executed: the iteration's duration, each lane's busy seconds, spans."""

    duration_s: float
    busy_s: dict
    lora_s: float                          # summed over layers: layer start to the LoRA wave done
    attention_s: float                     # summed over layers: LoRA wave done to the merge done
    spans: list


class Timeline:
    """Executes :class:`LayerWork` on ``n_dev`` device queues, a full-duplex link (``link_W`` bytes/s per
    direction, ``rtt_s`` round trip), one GPU stream and the host's launch path."""

    def __init__(self, n_dev: int, link_W: float, rtt_s: float):
        if n_dev < 1 or not link_W > 0 or rtt_s < 0:
            raise ValueError(f"Timeline needs n_dev >= 1, link_W > 0, rtt_s >= 0; got {n_dev}, {link_W}, {rtt_s}")
        self.n_dev, self.W, self.lat = int(n_dev), float(link_W), float(rtt_s) / 2.0
        self.lanes = ["GPU 0", "link out", "link in", "host"] + [f"device {d}" for d in range(self.n_dev)]

    def run(self, w: LayerWork, n_layers: int, *, spans: bool = True, repeat: bool = True) -> Executed:
        """Execute ``n_layers`` layers of ``w``. ``repeat=False`` computes every layer even once they repeat (the
        tests check the shortcut against it)."""
        n = self.n_dev
        W, lat = self.W, self.lat
        t = 0.0
        lo = li = host = 0.0
        dev = np.zeros(n)
        busy = np.zeros(4 + n)            # GPU, link out, link in, host, devices
        lora_tot = att_tot = 0.0
        out_spans = []
        prev_state, prev = None, None
        waves = max(1, int(w.waves))
        jd = np.asarray(w.job_dev, np.int64)
        j_out_s = np.asarray(w.job_out, float) / W / waves
        j_in_s = np.asarray(w.job_in, float) / W / waves
        j_s = np.asarray(w.job_s, float) / waves
        hosted = w.host_stop_s > 0
        if hosted:
            j_host = (np.ones(len(j_s)) if w.job_stops is None else np.asarray(w.job_stops, float)) * w.host_stop_s \
                / waves
            j_host_after = (np.zeros(len(j_s)) if w.job_stops_after is None
                            else np.asarray(w.job_stops_after, float)) * w.host_stop_s / waves
            j_host_sum = float(j_host.sum())
            # A FIFO whose jobs all arrive at one time ``x`` finishes them at ``cumsum(service) + max(x, free)``, bit
            # for bit what :func:`fifo` computes (its slack is ``x``): the service sums are the same every layer
            S_host = np.cumsum(j_host)
            host_after = bool(j_host_after.any())
        nj = len(jd)
        if nj:
            # each device's jobs in their order (a stable sort by device, cut at each device's first job)
            by_dev = np.argsort(jd, kind="stable")
            cuts = np.searchsorted(jd[by_dev], np.arange(n + 1))
            dev_idx = [by_dev[cuts[d]:cuts[d + 1]] for d in range(n)]
        else:
            dev_idx = []
        # per device: its jobs' indices, their service times and busy seconds (the same every layer)
        dev_jobs = [(d, ix, j_s[ix], float(j_s[ix].sum())) for d, ix in enumerate(dev_idx) if len(ix)]
        if nj:
            # every device's queue as one row of an (n_dev, most jobs) array, its jobs in order from the left (the
            # rest padded): :func:`fifo` of all devices at once, its sequential sums along each row bit for bit
            counts = np.array([len(ix) for ix in dev_idx], np.int64)
            q_rows = jd[by_dev]
            q_cols = np.arange(nj) - (np.cumsum(counts) - counts)[q_rows]
            q_sv = np.zeros((n, int(counts.max())))
            q_sv[q_rows, q_cols] = j_s[by_dev]
            q_S = np.cumsum(q_sv, axis=1)
            q_Sprev = q_S - q_sv
            q_has = np.flatnonzero(counts)
            q_last = counts[q_has] - 1
            q_pad = np.full(q_sv.shape, -np.inf)
            j_out_sum, j_in_sum = float(j_out_s.sum()), float(j_in_s.sum())
            S_out = np.cumsum(j_out_s)
        if w.att_s is None and w.att_out is None and w.att_in is None:
            n_att = 0
        else:
            att_s = np.zeros(n) if w.att_s is None else np.asarray(w.att_s, float)
            att_out_s = np.zeros(n) if w.att_out is None else np.asarray(w.att_out, float) / W
            att_in_s = np.zeros(n) if w.att_in is None else np.asarray(w.att_in, float) / W
            att_devs = np.flatnonzero((att_s > 0) | (att_out_s > 0) | (att_in_s > 0))
            n_att = len(att_devs)
            att_out_sel = att_out_s[att_devs]
            S_att_out = np.cumsum(att_out_sel)
            att_in_sum = float(att_in_s.sum())
            att_out_sum = float(att_out_sel.sum())
            att_in_sel = att_in_s[att_devs]
            att_dev_list = att_devs.tolist()
            att_s_l = att_s.tolist()
            if hosted:
                hs = np.full(n_att, 2.0 * w.host_stop_s)
                S_hs = np.cumsum(hs)
                hs_sum = float(hs.sum())
                hs1 = np.full(n_att, w.host_stop_s)
        state_buf = np.empty(3 + n)
        load_left = float(w.load_in)
        load_spans = []
        layer = 0
        while layer < n_layers:
            # the layer's start state: what each lane still has to do past ``t`` (a lane free before ``t`` acts as
            # free at ``t``: every arrival of the layer is at ``t`` or later)
            state_buf[0], state_buf[1], state_buf[2] = lo, li, host
            state_buf[3:] = dev
            backlog = np.round(np.maximum(state_buf - t, 0.0), 15)
            state = (round(load_left, 3), tuple(backlog.tolist()))
            if repeat and prev_state is not None and state == prev_state:
                # the rest repeats the previous layer exactly
                dur, d_busy, d_lora, d_att, layer_spans = prev
                k = n_layers - layer
                if spans:
                    for j in range(k):
                        out_spans += [Span(s.lane, s.name, s.start_s + (j + 1) * dur, s.dur_s, s.args)
                                      for s in layer_spans]
                busy += k * d_busy
                lora_tot += k * d_lora
                att_tot += k * d_att
                t += k * dur
                # every repeated layer ends in the state it started in
                lo, li, host = (float(x) for x in t + backlog[:3])
                dev = t + backlog[3:]
                break
            t0 = t
            b = [0.0] * (4 + n)                                   # busy seconds per lane in this layer
            first = {}                                            # lane -> first start in this layer (spans)

            def mark(lane, start):
                if spans and (lane not in first or start < first[lane]):
                    first[lane] = start

            # 2. the LoRA wave(s): the base GEMMs and the E1 kernel, the device jobs, then their GPU parts
            mark(0, t)
            g = t + w.base_s + w.gpu_e1_s
            b[0] += w.base_s + w.gpu_e1_s
            if w.prefill_out > 0:                   # the prompt's K, V leave once the base GEMMs made them
                s0 = max(lo, t + w.base_s)
                mark(1, s0)
                lo = s0 + w.prefill_out / W
                b[1] += w.prefill_out / W
            tw = t
            for _ in range(waves if nj else 0):
                if hosted:
                    # a kernel stop synchronizes the GPU: the host's first stop waits for the work already queued
                    # on the stream (the base GEMMs, the E1 kernel)
                    hf = S_host + max(max(tw, g), host)
                    if spans:
                        mark(3, float(hf[0] - j_host[0]))
                    host = float(hf[-1])
                    b[3] += j_host_sum
                    of = fifo(hf, j_out_s, lo)
                else:
                    of = S_out + max(tw, lo)
                if spans:
                    mark(1, float(of[0] - j_out_s[0]))
                lo = float(of[-1])
                b[1] += j_out_sum
                at_dev = of + lat
                df = np.empty(nj)
                q_a = q_pad.copy()
                q_a[q_rows, q_cols] = at_dev[by_dev]
                q_f = q_S + np.maximum(np.maximum.accumulate(q_a - q_Sprev, axis=1), dev[:, None])
                df[by_dev] = q_f[q_rows, q_cols]
                dev[q_has] = q_f[q_has, q_last]
                for d, ix, js, js_sum in dev_jobs:
                    if spans:
                        mark(4 + d, float(q_f[d, 0] - js[0]))
                    b[4 + d] += js_sum
                order = np.argsort(df, kind="stable")
                ready = df[order]
                if hosted and host_after:
                    # the results' copies back: host operations once each job is done, FIFO behind the rest
                    ha = j_host_after[order]
                    ready = fifo(ready, ha, host)
                    host = float(ready[-1])
                    b[3] += float(ha.sum())
                inf = fifo(ready, j_in_s[order], li)
                if spans:
                    mark(2, float(inf[0] - j_in_s[order[0]]))
                li = float(inf[-1])
                b[2] += j_in_sum
                g = max(g, float(inf[-1]) + lat) + w.gpu_after_s / waves
                b[0] += w.gpu_after_s / waves
                tw = g
            ta = g
            # 3. attention
            if n_att:
                if hosted:
                    # per device: the queries' copy and the launch before it can start
                    hf = S_hs + max(ta, max(host, ta))
                    if spans:
                        mark(3, float(hf[0] - hs[0]))
                    host = float(hf[-1])
                    b[3] += hs_sum
                    of = fifo(hf, att_out_sel, lo)
                else:
                    of = S_att_out + max(ta, lo)
                if spans:
                    mark(1, float(of[0] - att_out_s[att_devs[0]]))
                lo = float(of[-1])
                b[1] += att_out_sum
                fin = np.empty(n_att)
                of_l = of.tolist()
                for j, d in enumerate(att_dev_list):
                    s0 = max(of_l[j] + lat, dev[d])
                    a_s = att_s_l[d]
                    if spans and a_s > 0:
                        mark(4 + d, s0)
                    fin[j] = s0 + a_s
                    dev[d] = fin[j]
                    b[4 + d] += a_s
                order = np.argsort(fin, kind="stable")
                ready = fin[order]
                if hosted:                          # the partials' copy back, once each device is done
                    ready = fifo(ready, hs1, host)
                    host = float(ready[-1])
                    b[3] += w.host_stop_s * n_att
                inf = fifo(ready, att_in_sel[order], li)
                if spans:
                    mark(2, float(inf[0] - att_in_sel[order[0]]))
                li = float(inf[-1])
                b[2] += att_in_sum
                got = float(inf.max()) + lat
                g = ta + w.att_gpu_s + w.prefill_att_s
                g = max(g, got) + w.merge_s
                b[0] += w.att_gpu_s + w.prefill_att_s + w.merge_s
            else:
                g_att = ta + w.att_gpu_s
                if w.remote_in > 0:                 # the attention kernel reads the devices' KV over the link
                    s0 = max(li, ta)
                    mark(2, s0)
                    li = s0 + w.remote_in / W
                    b[2] += w.remote_in / W
                    g_att = max(g_att, li + lat)
                if w.new_kv_out > 0:
                    s0 = max(lo, ta)
                    mark(1, s0)
                    lo = s0 + w.new_kv_out / W
                    b[1] += w.new_kv_out / W
                g = g_att + w.prefill_att_s
                b[0] += w.att_gpu_s + w.prefill_att_s
            # 4. adapter loads (background, lowest priority): in the link-in time this layer left idle
            if load_left > 0:
                idle = max(0.0, (g - t0) - b[2])
                moved = min(load_left, idle * W)
                if moved > 0:
                    load_left -= moved
                    b[2] += moved / W
                    if spans:
                        load_spans.append(Span("link in", "adapter loads", t0, g - t0, {"bytes": moved}))
            lora_tot += ta - t0
            att_tot += g - ta
            dur = g - t0
            layer_spans = []
            if spans:
                ends = {0: g, 1: lo, 2: li, 3: host}
                for lane, s0 in sorted(first.items()):
                    e = ends[lane] if lane < 4 else float(dev[lane - 4])
                    if e > s0 and b[lane] > 0:
                        layer_spans.append(Span(self.lanes[lane], "layer", s0, e - s0,
                                                {"busy_s": float(b[lane])}))
                out_spans += layer_spans
            b = np.array(b)
            busy += b
            prev_state, prev = state, (dur, b, ta - t0, g - ta, layer_spans)
            t = g
            layer += 1
        if load_left > 0:                         # what the layers left idle did not cover: after them
            s0 = max(li, t)
            li = s0 + load_left / W
            busy[2] += load_left / W
            if spans:
                load_spans.append(Span("link in", "adapter loads", s0, li - s0, {"bytes": load_left}))
        out_spans += load_spans
        end = max(t, lo, li, host, float(dev.max()) if n else 0.0)
        return Executed(end, dict(zip(self.lanes, busy.tolist())), lora_tot, att_tot, out_spans)
