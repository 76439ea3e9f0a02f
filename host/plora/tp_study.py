"""The tensor-parallel study (PLoRA set-up facts): one layer's LoRA wave on TP-4 .. TP-64 GPUs, each GPU with
its own pool of PLoRA devices, models from 7B to a modeled 1.2T dense model, two ports of E3:

* **naive**: every GPU replicates the wave input to its pool: it sends the full-width activation of each input
  group, its pool holds the whole A (replicated in every GPU's pool) and the GPU's column shard of B, computes
  ``y_g = (x A) B_g`` and returns the GPU's shard of ``y``; one round trip;
* **sharded**: row-parallel A (pool ``g`` holds rows ``g`` of A; the GPU sends its shard of ``x``), the pools
  return R-wide partial products, the GPUs all-reduce them (``tokens x R`` FP16 over NVLink, the measured
  all-reduce of ``host.gpu``), then column-parallel B (each GPU sends ``m`` to its pool, which returns its
  shard of ``y``); two round trips.

Per layer: ``T = n_rt * L_link + sum over round trips of max(out / W, in / W, device time) (+ all-reduce)``,
device time from the NDP model (adapters spread over the pool's devices, bucketed as in the system).

Models (design choice: public configurations where one exists): Llama-2-7B and -70B and GPT-3 175B
(``host.models``); MT-NLG 530B (Smith et al. 2022, arXiv:2201.11990: 105 layers, hidden 20480, 128 heads);
the 1T configuration of Narayanan et al. 2021 (Megatron-LM, SC'21, Table 1: 128 layers, hidden 25600, 160
heads); and "1.2T", that shape with 154 layers (12 L h^2 = 1.21e12 parameters; labelled a modeled model).
Dense GPT-style FFN (4 h, two matrices) for the last three.
"""

import numpy as np

from .lora import ModelShape, lora_matrices, FP16_BYTES

__all__ = ["TP_MODELS", "TP_DEGREES", "wave", "tp_study"]

TP_DEGREES = (4, 8, 16, 32, 64)


def _gpt(name, layers, hidden, heads):
    return ModelShape(name=name, n_layers=layers, hidden=hidden, q_heads=heads, kv_heads=heads,
                      head_dim=hidden // heads, ffn_dim=4 * hidden, gated=False)


def _models():
    from host.models import get_model
    from .system import shape_of
    return {
        "7B": shape_of(get_model("llama2-7b")),
        "70B": shape_of(get_model("llama2-70b")),
        "175B": shape_of(get_model("gpt-175b")),
        "530B": _gpt("mt-nlg-530b", 105, 20480, 128),
        "1T": _gpt("megatron-1t", 128, 25600, 160),
        "1.2T": _gpt("modeled-1.2t", 154, 25600, 160),
    }


TP_MODELS = ("7B", "70B", "175B", "530B", "1T", "1.2T")


def _dense_matrices(shape):
    """(d_in, d_out, group) of every adapted matrix of one layer."""
    return [(m.d_in, m.d_out, m.group) for m in lora_matrices(shape)]


def wave(shape, tp, port, *, ndp, link_gbps=128.0, rtt_ns=500.0, n_dev=4, adapters=64, tokens=4, rank=64,
         allreduce=None):
    """One layer's LoRA wave (E3) on one GPU of a ``tp`` group: dict of time (s), link bytes, device time (s)
    and pool bytes per GPU."""
    if port not in ("naive", "sharded"):
        raise ValueError(f"port must be 'naive' or 'sharded', got {port!r}")
    if shape.hidden % tp:
        raise ValueError(f"TP-{tp} does not divide hidden {shape.hidden} of {shape.name}")
    W, L = link_gbps * 1e9, rtt_ns * 1e-9
    mats = _dense_matrices(shape)
    groups = {}
    for d_in, d_out, g in mats:
        groups.setdefault(g, d_in)
    per_dev = int(np.ceil(adapters / n_dev))          # adapters in the busiest device bucket
    B = adapters * tokens
    if port == "naive":
        out = B * sum(groups.values()) * FP16_BYTES
        inn = B * sum(d_out // tp for _, d_out, _ in mats) * FP16_BYTES
        dev = per_dev * sum(ndp.lora_e3_s(d_in, max(d_out // tp, 1), rank, tokens) for d_in, d_out, _ in mats)
        t = L + max(out / W, inn / W, dev)
        pool = adapters * sum(d_in + d_out // tp for d_in, d_out, _ in mats) * rank * FP16_BYTES
        return dict(time_s=t, link_bytes=out + inn, dev_s=dev, allreduce_s=0.0,
                    pool_gb_per_gpu=pool * shape.n_layers / 1e9)
    out1 = B * sum(v // tp for v in groups.values()) * FP16_BYTES
    in1 = B * len(mats) * rank * FP16_BYTES
    dev1 = per_dev * sum(ndp.lora_e4_s(d_in // tp, rank, tokens) for d_in, _, _ in mats)
    ar = 0.0 if allreduce is None else float(allreduce(in1, tp))
    out2 = in1
    in2 = B * sum(d_out // tp for _, d_out, _ in mats) * FP16_BYTES
    dev2 = per_dev * sum(ndp.lora_e3_s(d_in // tp, max(d_out // tp, 1), rank, tokens)
                         - ndp.lora_e4_s(d_in // tp, rank, tokens) for d_in, d_out, _ in mats)
    t = 2 * L + max(out1 / W, in1 / W, dev1) + ar + max(out2 / W, in2 / W, dev2)
    pool = adapters * sum(d_in // tp + d_out // tp for d_in, d_out, _ in mats) * rank * FP16_BYTES
    return dict(time_s=t, link_bytes=out1 + in1 + out2 + in2, dev_s=dev1 + dev2, allreduce_s=ar,
                pool_gb_per_gpu=pool * shape.n_layers / 1e9)


def tp_study(*, ndp=None, link_gbps=128.0, rtt_ns=None, **kw):
    """Rows (dict) for every model x TP degree x port (models whose hidden size TP does not divide are
    skipped)."""
    from .ndp_model import make_ndp_model
    from host.link import get_link
    ndp = ndp or make_ndp_model("auto")
    if rtt_ns is None:
        rtt_ns = get_link("cxl3.1").rtt_ns
    try:
        from host.gpu import GPUModel
        gm = GPUModel("h100")
        allreduce = lambda nbytes, n: gm.all_reduce(nbytes, n).calibrated_s
    except Exception:       # pragma: no cover - host.gpu always present in this project
        allreduce = None
    rows = []
    for name, shape in _models().items():
        for tp in TP_DEGREES:
            if shape.hidden % tp:
                continue
            for port in ("naive", "sharded"):
                r = wave(shape, tp, port, ndp=ndp, link_gbps=link_gbps, rtt_ns=rtt_ns, allreduce=allreduce, **kw)
                rows.append(dict(model=name, tp=tp, port=port, layers=shape.n_layers,
                                 wave_us=r["time_s"] * 1e6, per_token_ms=r["time_s"] * shape.n_layers * 1e3,
                                 link_mb=r["link_bytes"] / 1e6, device_us=r["dev_s"] * 1e6,
                                 allreduce_us=r["allreduce_s"] * 1e6, pool_gb_per_gpu=r["pool_gb_per_gpu"]))
    return rows
