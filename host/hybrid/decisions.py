"""The hybrid's decisions, one copy for the tiny end-to-end run (:class:`host.e2e.hybrid.HybridSystem`, ``make demo``)
and the LLaMA-scale hybrid (:class:`host.hybrid.system.HybridScaleSystem`, ``ndpim hybrid run``); issue 34 item 2.

* :func:`place_kv` -- where a request's KV lives: on the CXL devices, token-interleaved (:data:`NDP`), or on the
  host's DIMM-PIM ranksets (:data:`PIM`), by its final context length and the two sides' load;
* :func:`reselect_serving` -- Algorithm 1 (PLoRA's memory manager, :meth:`host.plora.system.PLoRASystem.decide`)
  again for every serving adapter at its batch, before every iteration (the hybrid's one addition to PLoRA, which
  decides at admission only);
* :func:`sched_classes` and :func:`form_sub_batches` -- the L3 scheduler (:func:`host.l3.scheduler.schedule`)
  forming the two sub-batches of an iteration over GPU, NDP and PIM work, with the requests' residence as their
  class.

Admission and the adapters' placement are PLoRA's own code (the memory manager both systems hold), the predictors
L3's (:class:`host.l3.predictors.L3Predictors`). Each system *prices* what these decide with its own models (the
tiny run: the device backends; the LLaMA-scale run: the NDP kernel table, the rankset model, the GPU model).

**The placement rule** (:func:`place_kv`), in order:

1. *context length*: a request whose final context (prompt + output) is at least ``pim_min_context`` prefers the
   DIMM-PIM (long: its KV is large, host memory is the large pool, and the rank PUs stream it at the ranks'
   internal bandwidth), a shorter one the CXL devices (short: its KV fits beside the adapters, and its attention
   spreads over every device token by token). Default 1,024 tokens: the line between PLoRA VII-A's short
   workloads (prompts and outputs in [8, 512)) and its long ones (prompts from 1,024);
2. *capacity*: a side that cannot hold the request's final KV is not chosen; when neither can, the request waits
   (or, if it could never fit, the run fails saying so);
3. *load*: a *borderline* request -- final context within a factor ``borderline`` of ``pim_min_context`` either
   side -- whose preferred side is the busier one goes to the other side when that gives the lower bottleneck,
   ``max(CXL load, PIM load)`` with the request counted where it goes. Loads are seconds per iteration, L3's two
   sides: the GPU + CXL side (the GPU's work and the CXL devices' decode attention, which the GPU waits for) and
   the PIM side (the ranksets' phase); what the last iteration executed there plus the cost model's terms of the
   requests placed there since; a request's cost on a side is its own term there (:mod:`host.hybrid.cost`).
   On an idle system (equal loads) the context decides. ``borderline = 1`` turns this off. Default 2 (design choice: one doubling
   either side of the line; stated in config.json).
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["PIM", "NDP", "SIDE_NAMES", "DEFAULT_PIM_MIN_CONTEXT", "DEFAULT_BORDERLINE", "SideLoad", "place_kv",
           "is_borderline", "check_placement_args", "reselect_serving", "sched_classes", "form_sub_batches"]

#: Residence classes (the e2e hybrid's, L3's scheduler's ``decode_class`` there).
PIM, NDP = 0, 1
SIDE_NAMES = {PIM: "pim", NDP: "cxl"}
#: The short / long line of PLoRA VII-A's workloads: prompts and outputs in [8, 512) (short), prompts from 1,024
#: (``uniform-long``, ``skewed-long``). The e2e hybrid's default since issue 31.
DEFAULT_PIM_MIN_CONTEXT = 1024
#: Borderline band of the load rule: within a factor 2 of the line (design choice, module docstring).
DEFAULT_BORDERLINE = 2.0


@dataclass(frozen=True)
class SideLoad:
    """What :func:`place_kv` knows of the two sides when it places one request: each side's load (``*_load_s``:
    seconds per iteration the side is busy; the CXL side is the GPU's with the devices' attention), what the
    request would add there (``*_cost_s``) and whether its final KV fits there (``*_fits``)."""

    cxl_load_s: float = 0.0
    pim_load_s: float = 0.0
    cxl_cost_s: float = 0.0
    pim_cost_s: float = 0.0
    cxl_fits: bool = True
    pim_fits: bool = True


def check_placement_args(pim_min_context, borderline) -> None:
    if not (isinstance(pim_min_context, (int, np.integer)) and 1 <= pim_min_context <= 1 << 40):
        raise ValueError(f"pim_min_context must be an integer in 1..{1 << 40} tokens, got {pim_min_context!r}")
    if not (np.isfinite(borderline) and 1.0 <= borderline <= 1024.0):
        raise ValueError(f"borderline must be a factor in [1, 1024], got {borderline!r}")


def is_borderline(final_context: int, pim_min_context: int, borderline: float) -> bool:
    """Whether a request of ``final_context`` tokens is within the factor ``borderline`` of the line."""
    return borderline > 1.0 and pim_min_context / borderline <= final_context < pim_min_context * borderline


def place_kv(final_context: int, *, pim_min_context: int = DEFAULT_PIM_MIN_CONTEXT, load: SideLoad | None = None,
             borderline: float = DEFAULT_BORDERLINE):
    """The residence of a request's KV (:data:`PIM` or :data:`NDP`; None: neither side can hold it now) by the
    rule of the module docstring. ``load`` None: context length alone (a system that places every request up
    front, before any load exists: the tiny end-to-end run)."""
    pref = PIM if final_context >= pim_min_context else NDP
    if load is None:
        return pref
    fits = {PIM: load.pim_fits, NDP: load.cxl_fits}
    other = NDP if pref == PIM else PIM
    if not fits[pref]:
        return other if fits[other] else None
    now = {PIM: load.pim_load_s, NDP: load.cxl_load_s}
    if fits[other] and now[pref] > now[other] and is_borderline(final_context, pim_min_context, borderline):
        at = {PIM: max(load.cxl_load_s, load.pim_load_s + load.pim_cost_s),
              NDP: max(load.cxl_load_s + load.cxl_cost_s, load.pim_load_s)}
        if at[other] < at[pref]:
            return other
    return pref


def reselect_serving(mem, remaining) -> None:
    """Algorithm 1 again for every serving adapter of PLoRA's memory manager ``mem`` at its batch
    (:meth:`host.plora.system.PLoRASystem.decide`); ``remaining(a)``: the most decode tokens adapter ``a``'s
    running requests have left (at least 1)."""
    for a in np.flatnonzero(mem.count).tolist():
        mem.decide(int(a), int(mem.count[a]), remaining(int(a)))


def sched_classes(residence, rankset=None, n_ranksets: int = 1):
    """The L3 scheduler's class of each decode: a PIM-resident request's rankset class (``rankset``; all 0 when
    None), the CXL-resident requests one class of their own (``n_ranksets``). With one rankset: the residence
    (:data:`PIM` 0, :data:`NDP` 1), as the e2e hybrid has always had it."""
    res = np.asarray(residence, np.int64)
    rs = np.zeros(len(res), np.int64) if rankset is None else np.asarray(rankset, np.int64)
    return np.where(res == PIM, rs, int(n_ranksets))


def form_sub_batches(table, view, pred, *, decode_class, offered, min_gpu_tokens: int):
    """The iteration's batch (two sub-batches) by L3's scheduler: the running decodes (classes ``decode_class``,
    a callable of their indices), the running requests still in prefill first, then the waiting requests
    ``offered`` (in queue order; the caller offers only what it can admit). Admits the ones the plan chose.
    Returns the engine's Batch (None for an empty plan)."""
    from host.l3.scheduler import PrefillItem, SchedState, schedule
    from host.l3.systems import plan_batch
    t = table
    run = view.running
    in_pre = t.in_prefill(run)
    dec = run[~in_pre]
    items, waiting_pos = [], {}
    for i in run[in_pre].tolist():
        items.append(PrefillItem(int(i), int(t.prefill_len[i] - t.prefilled[i]), int(t.prefilled[i])))
    for i in offered:
        waiting_pos[int(i)] = len(items)
        items.append(PrefillItem(int(i), int(t.prefill_len[i] - t.prefilled[i]), int(t.prefilled[i])))
    state = SchedState(decode_rids=tuple(dec.tolist()), decode_context=tuple(t.context(dec).tolist()),
                       prefills=tuple(items), decode_class=tuple(int(c) for c in decode_class(dec)))
    plan = schedule(state, pred, min_gpu_tokens=min_gpu_tokens)
    return plan_batch(plan, t, view, waiting_pos)
