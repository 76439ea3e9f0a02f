"""Token-interleaved KV placement, the duplicated prefix in HBM, and the functional distributed attention.

PLoRA V-B: "PLoRA evenly distributes the KV cache of each request across all memory devices at the token
level, storing the KV cache of the i-th token in the (i mod N_dev)-th device ... [and] duplicates a small
portion of the KV cache in GPU memory". The duplicated portion of a request is its first ``dup`` tokens (design
choice: the tokens the GPU already holds when it finishes the prefill); the GPU attends over those, each device
over its tokens among the rest, and the GPU merges the partial outputs exactly (:mod:`sim.golden.attention`).

:func:`distributed_attention` runs that on real data: the devices' shares through the NDP firmware kernel
(``firmware.ndp.kernels.attention_integral``) on the bit-exact golden NDP core (``sim.golden.ndp_core``), the
GPU's share as an FP32 partial softmax, and the merge with :func:`sim.golden.attention.merge_partials`.
"""

import numpy as np

__all__ = ["device_of_token", "partition", "share_counts", "gpu_partial", "distributed_attention"]


def _check(n_tokens, dup, n_dev):
    for name, v, lo in (("n_tokens", n_tokens, 0), ("dup", dup, 0), ("n_dev", n_dev, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if dup > n_tokens:
        raise ValueError(f"dup ({dup}) must be <= n_tokens ({n_tokens})")


def device_of_token(i, n_dev: int):
    """The device holding token ``i``: ``i mod n_dev`` (vectorized)."""
    if n_dev < 1:
        raise ValueError(f"n_dev must be >= 1, got {n_dev}")
    return np.asarray(i) % n_dev


def partition(n_tokens: int, dup: int, n_dev: int):
    """(GPU token indices, [device d's token indices outside the duplicated prefix for d < n_dev])."""
    _check(n_tokens, dup, n_dev)
    idx = np.arange(n_tokens)
    rest = idx[dup:]
    return idx[:dup], [rest[rest % n_dev == d] for d in range(n_dev)]


def share_counts(n_tokens: int, dup: int, n_dev: int) -> np.ndarray:
    """Tokens each device computes on (closed form; :meth:`host.plora.cost.CostModel.device_tokens`)."""
    _check(n_tokens, dup, n_dev)
    d = np.arange(n_dev)
    f = lambda x: np.maximum(0, (x - d + n_dev - 1) // n_dev)
    return f(n_tokens) - f(dup)


def gpu_partial(q_bits, k_bits, v_bits):
    """The GPU's partial over its duplicated tokens, in the devices' format: ``(o FP16 bits, m FP16 bits, sum
    FP32 bits)`` with ``o = sum_j exp(p_j - m) V_j``, ``p = q K^T`` (q pre-scaled), computed in float32."""
    q = np.asarray(q_bits, np.uint16).view(np.float16).astype(np.float32)
    k = np.asarray(k_bits, np.uint16).view(np.float16).astype(np.float32)
    v = np.asarray(v_bits, np.uint16).view(np.float16).astype(np.float32)
    p = (k @ q).astype(np.float16).astype(np.float32)        # scores rounded to FP16 like the device's
    m = p.max()
    e = np.exp(p - m).astype(np.float32)
    o = (e @ v).astype(np.float32)
    return (o.astype(np.float16).view(np.uint16), np.float16(m).view(np.uint16),
            np.float32(e.sum(dtype=np.float32)).view(np.uint32))


def distributed_attention(q, K, V, *, dup: int, n_dev: int, config=None):
    """One query head's decode attention over ``K``, ``V`` (L x d, FP16 bits or floats), with the first
    ``dup`` tokens on the GPU and the rest token-interleaved over ``n_dev`` devices, each running
    ``attention_integral`` on the golden NDP core (``config``: an ``NDPConfig``, default ``TINY``; every
    device share must be a multiple of ``config.lanes`` tokens). Returns (output float32 (d,), partials dict: key (-1, 0)
    for the GPU's, ``(device, tile)`` for each token tile of a device's share)."""
    from firmware.ndp import kernels
    from hdl.ndp.config import TINY
    from sim.golden.ndp_core import GoldenCore
    from sim.golden.attention import prepare_query, merge_partials

    config = config or TINY
    K16 = np.asarray(K).astype(np.float16) if np.asarray(K).dtype != np.uint16 else np.asarray(K).view(np.float16)
    V16 = np.asarray(V).astype(np.float16) if np.asarray(V).dtype != np.uint16 else np.asarray(V).view(np.float16)
    if K16.ndim != 2 or V16.shape != K16.shape:
        raise ValueError(f"K and V must be (L, d) of one shape, got {K16.shape}, {V16.shape}")
    L, d = K16.shape
    gpu_idx, dev_idx = partition(L, dup, n_dev)
    qs = prepare_query(q)
    partials = {}
    if len(gpu_idx):
        partials[(-1, 0)] = gpu_partial(qs, K16[gpu_idx].view(np.uint16), V16[gpu_idx].view(np.uint16))
    for dev, idx in enumerate(dev_idx):
        if len(idx) == 0:
            continue
        if len(idx) % config.lanes:
            raise ValueError(f"device {dev} holds {len(idx)} tokens: the golden NDP core needs a multiple of "
                             f"config.lanes ({config.lanes}); choose L - dup as a multiple of n_dev * lanes")
        lay = kernels.kv_layout(d, len(idx), config=config)
        core = GoldenCore(config, lay["end"])
        store = kernels.kv_store(K16[idx].view(np.uint16), V16[idx].view(np.uint16), lay, config=config)
        if not all(c.ok for c in core.run(store.program)):
            raise RuntimeError(f"device {dev}: KV store failed")
        k = kernels.attention_integral(qs, lay, config=config)
        for tile, part in enumerate(k.results(core.run(k.program))):
            partials[(dev, tile)] = part
    return merge_partials(partials), partials
