"""The execution timeline of a hybrid iteration: PLoRA's execution timeline (:mod:`host.plora.timeline`: the GPU
stream, the CXL link's two directions, each NDP device's descriptor queue, the host's launch path) extended with
the DIMM-PIM lanes (L3's PIM phase, :meth:`host.l3.pim_side.PIMSide.phase`: each rankset, the channel path /
PCIe), in L3's two-sub-batch order (L3 5.2, Fig. 8):

* phase A: sub-batch 0's GPU + CXL work (its LoRA waves, its CXL-resident decodes' distributed attention, its
  prefills' attention, the prompt KV of its CXL-resident prefills to the devices) executed on PLoRA's timeline from
  0, while the ranksets compute sub-batch 1's PIM-resident decodes (their Q/K/V in, outputs back, sub-batch 0's
  PIM-resident prefill KV offloaded meanwhile);
* phase B, from ``A = max(G_0, P_1)``: sub-batch 1's GPU + CXL work, while the ranksets compute sub-batch 0's.

The iteration lasts ``A + max(G_1, P_0)``: a sub-batch's GPU work waits for its PIM attention of the phase before
(L3's dependency), so the bubbles of a mispredicted split show up as time. ``G_i`` is the duration PLoRA's
timeline executed (never its estimate), ``P_i`` the phase L3's event timeline executed, times the layers.
"""

from dataclasses import dataclass

from host.serving import Span

__all__ = ["HybridExecuted", "compose"]


@dataclass
class HybridExecuted:
    duration_s: float
    phase_a_s: float
    phase_b_s: float
    t_gpu: tuple            # (G_0, G_1): executed GPU + CXL side per sub-batch
    t_pim: tuple            # (P_0, P_1): executed PIM phase per sub-batch (all layers)
    busy_s: dict            # lane -> busy seconds
    spans: list


def compose(gpu_ex, pim_ph, n_layers: int, ranksets: int, *, spans: bool = True) -> HybridExecuted:
    """The iteration of ``gpu_ex`` (per sub-batch a :class:`host.plora.timeline.Executed` or None) and ``pim_ph``
    (per sub-batch a :class:`host.l3.pim_side.PhaseTime` of one layer, or None)."""
    G = tuple(float(e.duration_s) if e is not None else 0.0 for e in gpu_ex)
    P = tuple(n_layers * float(p.total) if p is not None else 0.0 for p in pim_ph)
    A = max(G[0], P[1])
    B = max(G[1], P[0])
    busy = {}
    out = []
    for i, t0 in ((0, 0.0), (1, A)):
        e = gpu_ex[i]
        if e is None:
            continue
        for lane, b in e.busy_s.items():
            busy[lane] = busy.get(lane, 0.0) + b
        if spans:
            out += [Span(s.lane, f"sb{i} {s.name}", s.start_s + t0, s.dur_s, s.args) for s in e.spans]
    for i, t0 in ((1, 0.0), (0, A)):
        p = pim_ph[i]
        if p is None:
            continue
        # over all layers each rankset holds each class once per R layers (L3 5.1): every rankset the same work
        per = n_layers / ranksets * float(p.compute.sum() + p.writes.sum())
        link = n_layers * (p.t_in + p.t_out + p.write)
        for k in range(ranksets):
            busy[f"rankset {k}"] = busy.get(f"rankset {k}", 0.0) + per
        busy["PCIe"] = busy.get("PCIe", 0.0) + link
        if spans:
            if per > 0:
                out += [Span(f"rankset {k}", f"sb{i} PIM attention", t0, per, {"layers": n_layers})
                        for k in range(ranksets)]
            if link > 0:
                out.append(Span("PCIe", f"sb{i} QKV/out + prefill KV", t0, link))
    return HybridExecuted(A + B, A, B, G, P, busy, out)
