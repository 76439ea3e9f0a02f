"""The load regime of a run (issue 30 item 2): how much of the adapters' and the KV's demand the serving set puts on
one GPU's memory. PLoRA's premise (sections I and III, Fig. 3b) is multi-LoRA serving where that demand overshoots
GPU memory; these numbers say whether a run is in that regime.

* ``adapters_touched``: distinct adapters of the requests the run admitted; ``adapter_demand_gb``: their bytes
  (A and B of every adapted matrix of every layer, FP16);
* ``hbm_pressure``: over the run (time-weighted, from the first admission to the last finish), the serving set's
  demand, the distinct adapters of the running requests plus the running requests' whole KV (prompt + output
  tokens, the KV each will hold when it finishes), divided by the HBM of one GPU left after the model's weights;
  ``hbm_pressure_peak`` its maximum; ``hbm_pressure_offered`` the same over the requests *in the system* (from
  arrival, waiting included: the demand offered, before the system's admission control); The denominator is the same for every system (one GPU of the run's type, the
  whole model's weights), so the figure compares the demand the systems' own schedules put on it;
* ``evictions``: adapters and KV evicted by the system's memory manager (summed over kinds), where it has one.
"""

import numpy as np

from .lora import adapter_bytes

__all__ = ["serving_pressure"]


def serving_pressure(table, shape, ranks, *, hbm_bytes: float, weight_bytes: float, kv_bytes_per_token: float) -> dict:
    """The regime figures of a finished run (see the module docstring). ``table``: the run's RequestTable;
    ``shape``: the ``ModelShape``; ``ranks``: rank per adapter id."""
    out = _pressure(table, shape, ranks, np.asarray(table.admitted_s, float), hbm_bytes, weight_bytes,
                    kv_bytes_per_token)
    off = _pressure(table, shape, ranks, np.asarray(table.arrival_s, float), hbm_bytes, weight_bytes,
                    kv_bytes_per_token)
    out["hbm_pressure_offered"] = off["hbm_pressure"]
    return out


def _pressure(table, shape, ranks, adm, hbm_bytes, weight_bytes, kv_bytes_per_token):
    fin = np.asarray(table.finish_s, float)
    ok = np.isfinite(adm) & np.isfinite(np.asarray(table.admitted_s, float))
    ids = np.asarray(table.adapter_id)[ok]
    a_bytes = {int(r): adapter_bytes(shape, int(r)) for r in np.unique(ranks)}
    touched = np.unique(ids)
    demand = float(sum(a_bytes[int(ranks[a])] for a in touched.tolist()))
    room = hbm_bytes - weight_bytes
    out = {"adapters_touched": int(len(touched)), "adapter_demand_gb": demand / 1e9,
           "hbm_after_weights_gb": room / 1e9, "hbm_pressure": 0.0, "hbm_pressure_peak": 0.0}
    if not ok.any() or room <= 0:
        return out
    kv = (np.asarray(table.prompt_tokens, float) + np.asarray(table.output_tokens, float))[ok] * kv_bytes_per_token
    start = adm[ok]
    done = np.isfinite(fin[ok])
    # a request admitted but not finished (a run stopped early) holds its memory to the run's last event
    last = float(max(np.nanmax(np.where(np.isfinite(fin), fin, -np.inf)), np.nanmax(start)))
    end = np.where(done, fin[ok], last)
    # sweep the admission (+) and finish (-) events in time order; at equal times finishes first, then
    # admissions, then the ends of the unfinished requests (never before their own admission)
    times = np.concatenate([end, start])
    kind = np.concatenate([np.where(done, 0, 2).astype(np.int8), np.ones(len(start), np.int8)])
    which = np.concatenate([np.arange(len(end)), np.arange(len(start))])
    order = np.lexsort((kind, times))
    count = {}
    kv_sum = ad_sum = 0.0
    area = peak = 0.0
    t_prev = float(times[order[0]])
    for j in order.tolist():
        t = float(times[j])
        cur = kv_sum + ad_sum
        area += cur * (t - t_prev)
        t_prev = t
        i = int(which[j])
        a = int(ids[i])
        ab = a_bytes[int(ranks[a])]
        if kind[j] == 1:
            kv_sum += kv[i]
            c = count.get(a, 0)
            if c == 0:
                ad_sum += ab
            count[a] = c + 1
        else:
            kv_sum -= kv[i]
            count[a] -= 1
            if count[a] == 0:
                ad_sum -= ab
        peak = max(peak, kv_sum + ad_sum)
    span = float(times.max() - times.min())
    out["hbm_pressure"] = (area / span if span > 0 else peak) / room
    out["hbm_pressure_peak"] = peak / room
    return out
