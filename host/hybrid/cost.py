"""The hybrid's cost model: PLoRA's VI-B estimate (:mod:`host.plora.cost`, Algorithm 1's) for the GPU + CXL side of a
sub-batch, extended with the DIMM-PIM terms (issue 34 item 2), and the two sides' attention loads the placement
rule weighs (:func:`host.hybrid.decisions.place_kv`).

**The PIM terms** (:class:`PIMCost`), one layer of one sub-batch's PIM phase, from the same component models the
executed phase uses (:class:`host.l3.pim_side.PIMSide`: the RTL-calibrated per-head cycles of
:mod:`host.l3.pim_timing`, the channel path's rate and per-transfer set-up) but without its event-level timeline:
no command-bus sharing between the ranks computing at once, no rank stalled by a transfer, no overlap of one
rankset's outputs with another's compute. The estimate is the longer of

* the critical path: the Q/K/V in (one set-up and the bytes per rankset with decodes, in series), the busiest
  rankset's compute at its full rate (``fixed_cycles + heads_per_rank x sum head_cycles(L)``), the outputs back
  (one set-up and the bytes per rankset);
* the channel path's occupancy: every transfer of the phase in series, the other sub-batch's prefill KV offload
  included (one set-up per receiving rankset).

The iteration's estimate is L3's composition of the two sides, ``max(G_0, P_1) + max(G_1, P_0)`` (L3 5.2), with
``G_i`` PLoRA's estimate of sub-batch ``i`` and ``P_i`` these terms times the layers. The run's time does not come
from it (the executed timeline: :mod:`host.hybrid.timeline`); ``cost_model_err`` says how far it was.

**Attention terms of the placement rule** (:meth:`PIMCost.load_s`, :func:`cxl_load_s`): the all-layer
decode-attention seconds per iteration of a set of requests at their final contexts, all decoding at once -- on
the CXL devices by PLoRA's attention term (:meth:`host.plora.cost.CostModel.attention`, nothing duplicated), on the
ranksets by the PIM terms above (Q/K/V in, the busiest rankset's compute, outputs back). The rule adds the
differences they make (a request's, the requests placed since the last iteration) to what the last iteration
executed on each side (:meth:`host.hybrid.system.HybridScaleSystem._side_load`).
"""

import numpy as np

__all__ = ["PIMCost", "cxl_load_s"]


class PIMCost:
    """The PIM terms of the hybrid's cost model over ``pim`` (a :class:`host.l3.pim_side.PIMSide`)."""

    def __init__(self, pim):
        self.pim = pim
        self.nl = pim.n_layers

    def phase_s(self, dec_L, dec_cls, pre_chunks=(), pre_cls=()) -> float:
        """The estimate of one layer's PIM phase (module docstring), seconds."""
        p = self.pim
        cls = np.asarray(dec_cls, np.int64)
        nd = np.bincount(cls, minlength=p.R) if cls.size else np.zeros(p.R, np.int64)
        comp = p.class_cycles(dec_L, cls) * p.tck
        busy = nd > 0
        t_in = float(np.sum(np.where(busy, p.setup_s + nd * p.qkv_bytes / p.write_Bps, 0.0)))
        t_out = float(np.sum(np.where(busy, p.setup_s + nd * p.out_bytes / p.read_Bps, 0.0)))
        wb = p.class_write_bytes(pre_chunks, pre_cls)
        write = float(np.count_nonzero(wb)) * p.setup_s + float(wb.sum()) / p.write_Bps
        return max(t_in + float(comp.max(initial=0.0)) + t_out, t_in + t_out + write)

    def iteration_s(self, dec_L, dec_cls, pre_chunks=(), pre_cls=()) -> float:
        """:meth:`phase_s` of all layers."""
        return self.nl * self.phase_s(dec_L, dec_cls, pre_chunks, pre_cls)

    def load_s(self, L, cls) -> float:
        """All-layer seconds of the PIM phase the cost model estimates (:meth:`iteration_s`: Q/K/V in, the busiest
        rankset's compute, outputs back) for residents of final contexts ``L`` in classes ``cls``, decoding at
        once."""
        if not len(L):
            return 0.0
        return self.iteration_s(L, cls)


def cxl_load_s(cost, n_layers: int, L) -> float:
    """All-layer seconds of PLoRA's distributed decode attention (its cost model's term, nothing duplicated) of
    residents of final contexts ``L`` on the CXL devices."""
    L = np.asarray(L, np.int64)
    if not len(L):
        return 0.0
    return n_layers * float(cost.attention(L, np.zeros(len(L), np.int64)).total_s)
