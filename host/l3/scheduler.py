"""The L3 scheduler (L3 5.2, 5.3): adaptive chunk-partitioned batch interleaving, as pure functions of a state.

Each iteration is built from two sub-batches ``i = 0, 1``; sub-batch ``i`` holds decode requests ``d_i`` (finished
tokens ``f_d_i``) and prefill requests ``p_i`` (chunk sizes ``c_p_i`` over finished tokens ``f_p_i``). Per layer
the GPU and the DIMM-PIM work in two phases (Fig. 7):

* phase A: ``GPU_0`` (prefill attention of ``p_0`` and the batched FC of sub-batch 0's tokens) runs while
  ``PIM_1`` (decoding MHA of ``d_1``, its Q/K/V in and outputs out, and the offload of ``p_0``'s fresh KV) runs;
* phase B: ``GPU_1`` with ``PIM_0``.

The latencies (eqs. 1-4, read with eq. 6: the batched FC of GPU_i holds sub-batch i's own decodes, which is the
only reading that respects the data dependence decode-MHA -> projection -> next layer's QKV):

* ``T_GPU_i = t_p(c_p_i, f_p_i) + t_batch(sum c_p_i, len f_d_i)``                       (1), (3), (6)
* ``T_PIM_i = t_d(f_d_i) + t_comm(f_d_i) + t_overlap(c_p_{1-i})``                        (2), (4), (5)

and phase A lasts ``max(T_GPU_0, T_PIM_1)``, phase B ``max(T_GPU_1, T_PIM_0)``. Hence the stop rule of step 3:
prefills join sub-batch 1 until ``T_GPU_1 > T_PIM_0`` and sub-batch 0 until ``T_GPU_0 > T_PIM_1``.

Steps (:func:`schedule`):

1. the decode requests that fit host memory (the caller passes them: :class:`SchedState` ``decodes``);
2. :func:`balanced_split`: two sub-batches with token totals as even as possible (greedy longest-first: each
   request, longest first, joins the sub-batch with the smaller total; 2k, 3k, 4k, 5k -> (5k, 2k), (4k, 3k));
3. :func:`fill_sub_batch`: prefills from the head of the queue join sub-batch 1, then sub-batch 0, until the stop
   rule holds;
4. the request that crossed the line is always included, chunked (:func:`chunk_size`) to the multiple of 16 tokens
   (at least 16, never 0; the whole remainder when that is closer) that brings
   ``T_GPU_i`` closest to ``T_PIM_{1-i}``; at most one chunked request per sub-batch; after the iteration it goes
   back to the head of the prefill queue (:attr:`Plan.requeue`).

The times come from a predictor object (:class:`host.l3.predictors.L3Predictors` or anything with the same
three methods): ``t_pim(sum_fd, n_d, sum_cp_other)``, ``t_p(c, f)`` (per prefill request, vectorized) and
``t_batch(sum_cp, n_d)`` (vectorized over ``sum_cp``, the prefill tokens of the sub-batch).

Design choice (not in the paper), ``min_gpu_tokens``: when the PIM phase is short (few or short decodes: at
start-up, or with long prompts and short outputs as in LongBench) the literal rule admits a single 16-token chunk
per sub-batch, although the GPU's FC time is nearly flat in the token count for small batches (weights dominate)
and L3 2.4 wants the batched FC "maximized to fully utilize the GPU's computational capacity". A sub-batch
therefore always takes prefill tokens up to ``min_gpu_tokens`` GPU tokens (decodes included), while prefills
wait, before the stop rule applies. It is an extension, off by default (``min_gpu_tokens = 0``: the paper's rule as
written; ``--min-gpu-tokens`` on the CLI): :func:`efficiency_knee_tokens` (the fewest tokens whose FC time per
token is within 10 % of its large-batch value; 800-1,500 tokens for the three deployments on A100s) and
:func:`ridge_tokens` (the roofline ridge, 160 on an A100) are the two floors the systems offer.
"""

from dataclasses import dataclass, field

import numpy as np

__all__ = ["CHUNK_ALIGN", "PrefillItem", "SchedState", "SubBatch", "Plan", "balanced_split", "chunk_size",
           "fill_sub_batch", "schedule", "ridge_tokens", "verify_plan",
           "efficiency_knee_tokens", "KNEE_SLACK"]

#: [L3 5.3 step 4] "The chunk size is a multiple of 16, better aligning with the requirements of GPU tiling."
CHUNK_ALIGN = 16
#: chunk_size compares all candidates when there are at most this many, else bisects first.
_SEARCH = 8


#: Efficiency knee: the FC time per token within this fraction of its large-batch value (design constant).
KNEE_SLACK = 0.10


def efficiency_knee_tokens(fc, *, slack: float = KNEE_SLACK, large: int = 16384) -> int:
    """The fewest tokens (a multiple of 16) whose batched-FC time per token, ``fc(t) / t`` for the vectorized
    ``fc(tokens)``, is within ``slack`` of ``fc(large) / large``."""
    t = np.arange(CHUNK_ALIGN, large + 1, CHUNK_ALIGN)
    per = np.asarray(fc(t), dtype=np.float64) / t
    ok = per <= (1 + slack) * float(np.asarray(fc(np.array([large])))[0]) / large
    return int(t[int(np.argmax(ok))]) if ok.any() else large


def ridge_tokens(fp16_tflops: float, hbm_bw_gbps: float, dtype_bytes: int = 2) -> int:
    """Tokens per FC GEMM at the GPU's roofline ridge: a GEMM over ``t`` tokens does ``2 t`` FLOPs per weight
    of ``dtype_bytes`` bytes, so it turns compute-bound at ``t = ridge x dtype_bytes / 2``; rounded up to
    :data:`CHUNK_ALIGN` (A100: 312 TFLOPS / 2039 GB/s = 153 FLOP/B -> 160 tokens)."""
    t = fp16_tflops * 1e12 / (hbm_bw_gbps * 1e9) * dtype_bytes / 2
    return int(-(-int(np.ceil(t)) // CHUNK_ALIGN) * CHUNK_ALIGN)


@dataclass(frozen=True)
class PrefillItem:
    """A request waiting for (more of) its prefill: ``remaining`` tokens to go over ``done`` finished ones."""

    rid: int
    remaining: int
    done: int = 0

    def __post_init__(self):
        if self.remaining < 1 or self.done < 0:
            raise ValueError(f"PrefillItem {self.rid}: remaining must be >= 1 and done >= 0, got "
                             f"{self.remaining}, {self.done}")


@dataclass(frozen=True)
class SchedState:
    """What the scheduler sees: the decode requests of this iteration (``decode_rids``, ``decode_context`` =
    finished tokens f_d, optionally ``decode_class`` = their rankset classes), the prefill queue in order (head
    first) and the host-memory room for new prefill KV, in tokens (``free_tokens``; None: unlimited)."""

    decode_rids: tuple = ()
    decode_context: tuple = ()
    prefills: tuple = ()
    free_tokens: int | None = None
    decode_class: tuple | None = None

    def __post_init__(self):
        if len(self.decode_rids) != len(self.decode_context):
            raise ValueError("SchedState: decode_rids and decode_context differ in length")
        if self.decode_class is not None and len(self.decode_class) != len(self.decode_rids):
            raise ValueError("SchedState: decode_class and decode_rids differ in length")


@dataclass
class SubBatch:
    decode_rids: list = field(default_factory=list)
    decode_context: list = field(default_factory=list)
    prefill_rids: list = field(default_factory=list)
    chunks: list = field(default_factory=list)      # c_p
    done: list = field(default_factory=list)        # f_p
    t_gpu: float = 0.0                              # predicted T_GPU_i
    t_pim: float = 0.0                              # predicted T_PIM_i

    @property
    def sum_fd(self) -> int:
        return int(sum(self.decode_context))

    @property
    def sum_cp(self) -> int:
        return int(sum(self.chunks))


@dataclass
class Plan:
    """The two sub-batches and the requests to put back at the head of the prefill queue (chunked ones, in
    their original queue order)."""

    sub: tuple
    requeue: list
    chunked: list                                   # (sub-batch, rid, chunk) of each chunked request


def balanced_split(context, classes=None, counts_tiebreak: bool = True):
    """Split requests into two sub-batches with token totals as even as possible: longest first, each to the
    sub-batch with the smaller total (ties: the one with fewer requests, then sub-batch 0). Returns two lists of
    positions into ``context``.

    With ``classes`` (each request's rankset class, :mod:`host.l3.pim_side`), a sub-batch's decoding MHA lasts
    as long as its most loaded class, so each request goes to the sub-batch whose load *in its class* is smaller
    first, then by total (design refinement of step 2: with one class, or all classes distinct, it is the plain
    rule)."""
    ctx = np.asarray(context, dtype=np.int64)
    cls = np.zeros(len(ctx), np.int64) if classes is None else np.asarray(classes, dtype=np.int64)
    order = np.argsort(-ctx, kind="stable")
    tot, cnt = [0, 0], [0, 0]
    load = {}
    out = ([], [])
    for j in order.tolist():
        m = int(cls[j])
        l0, l1 = load.get((0, m), 0), load.get((1, m), 0)
        if classes is not None and l0 != l1:
            s = 0 if l0 < l1 else 1
        elif tot[0] != tot[1]:
            s = 0 if tot[0] < tot[1] else 1
        elif counts_tiebreak and cnt[0] != cnt[1]:
            s = 0 if cnt[0] < cnt[1] else 1
        else:
            s = 0
        out[s].append(j)
        tot[s] += int(ctx[j])
        cnt[s] += 1
        load[(s, m)] = load.get((s, m), 0) + int(ctx[j])
    return out


def _candidates(remaining: int, lo: int, hi: int) -> np.ndarray:
    """Chunk sizes to consider for the request at the line with ``remaining`` tokens, at least ``lo`` and at most
    ``hi`` (memory room): multiples of 16 (at least 16) below the remainder and the remainder itself when ``hi``
    allows it. The request that crosses the line is always included (L3 5.3 step 4: it "is chunked"), so 0 is a
    candidate only when memory leaves room for no candidate at all (``hi`` below 16 and below the remainder)."""
    start = max(CHUNK_ALIGN, -(-lo // CHUNK_ALIGN) * CHUNK_ALIGN)
    c = np.arange(start, min(hi, remaining - 1) + 1, CHUNK_ALIGN, dtype=np.int64)
    if hi >= remaining:
        c = np.append(c, remaining)
    if not len(c):
        c = np.arange(CHUNK_ALIGN, min(hi, remaining - 1) + 1, CHUNK_ALIGN, dtype=np.int64)[-1:]
    if not len(c):
        c = np.zeros(1, np.int64)
    return c


def chunk_size(remaining, done, *, fixed_tp, tokens_before, n_d, target_fn, pred, min_chunk=0, max_chunk=None,
               known=None):
    """Step 4: the chunk of the last prefill of a sub-batch that brings ``T_GPU`` closest to the other
    sub-batch's ``T_PIM``. ``fixed_tp``: summed ``t_p`` of the sub-batch's other prefills; ``tokens_before``: their
    prefill tokens; ``n_d``: the sub-batch's decodes; ``target_fn(c)``: ``T_PIM`` of the other sub-batch when this
    request contributes ``c`` tokens (vectorized: the prefill KV offload grows with c). Candidates
    (:func:`_candidates`): multiples of 16 (>= 16) below the remainder and the remainder; at least ``min_chunk``
    when memory allows, at most ``max_chunk`` (memory room); 0 only when the room holds no candidate; ``known``: {chunk: (T_GPU, T_PIM)} already evaluated.
    Returns ``(chunk, T_GPU, T_PIM)``; ties go to the larger chunk."""
    hi = remaining if max_chunk is None else min(remaining, max_chunk)
    cand = _candidates(int(remaining), int(min_chunk), int(hi))

    memo = {}

    def err(cs):
        """(|T_GPU - T_PIM|, T_GPU, T_PIM) at candidate chunks ``cs`` (evaluated once each)."""
        new = [c for c in cs.tolist() if c not in memo]
        if new:
            nc = np.array(new, dtype=np.int64)
            pos = nc > 0
            tp = np.zeros(len(nc))
            if pos.any():
                tp[pos] = pred.t_p(nc[pos], np.full(int(pos.sum()), done))
            g = fixed_tp + tp + pred.t_batch(tokens_before + nc, n_d)
            p = np.broadcast_to(np.asarray(target_fn(nc), dtype=np.float64), g.shape)
            for c, gg, pp in zip(new, g.tolist(), p.tolist()):
                memo[c] = (gg, pp)
        g = np.array([memo[c][0] for c in cs.tolist()])
        p = np.array([memo[c][1] for c in cs.tolist()])
        return np.abs(g - p), g, p

    if known is not None:
        memo.update(known)
    if len(cand) > _SEARCH:
        # T_GPU - T_PIM grows with the chunk (nearly linearly): keep a bracket [lo, hi] around the first
        # candidate past the line and shrink it by interpolation (bisection when that stalls), one row at a time
        d = lambda j: float(np.subtract(*err(cand[j:j + 1])[1:])[0])
        lo, hi = 0, len(cand) - 1
        d_lo, d_hi = d(lo), d(hi)
        if d_hi <= 0:
            lo = hi
        elif d_lo > 0:
            hi = lo
        bisect = False
        while hi - lo > 1:
            if bisect or d_hi == d_lo:
                mid = (lo + hi) // 2
            else:
                mid = min(hi - 1, max(lo + 1, lo + int(round((hi - lo) * -d_lo / (d_hi - d_lo)))))
            d_mid = d(mid)
            width = hi - lo
            if d_mid <= 0:
                lo, d_lo = mid, d_mid
            else:
                hi, d_hi = mid, d_mid
            bisect = not bisect and (hi - lo) > width // 2     # alternate when interpolation gains little
        cand = cand[max(0, lo - 1):min(len(cand), hi + 2)]
    e, g, p = err(cand)
    best = len(e) - 1 - int(np.argmin(e[::-1]))
    return int(cand[best]), float(g[best]), float(p[best])


def _t_gpu(pred, tp_sum, prefill_tokens, n_d):
    return tp_sum + float(pred.t_batch(np.array([prefill_tokens]), n_d)[0])


def fill_sub_batch(i, plan_sub, queue, used, *, pred, free_tokens, min_gpu_tokens):
    """Step 3 for sub-batch ``i``: take prefills from ``queue`` (skipping positions in ``used``) into
    ``plan_sub[i]`` until ``T_GPU_i > T_PIM_{1-i}`` (and the sub-batch holds at least ``min_gpu_tokens`` GPU
    tokens, decodes included), the request that crosses the line chunked by :func:`chunk_size`; stops early when
    host memory (``free_tokens``) runs out. The whole-request prefixes are evaluated at once (one predictor call
    per model). Returns ``(free_tokens left, (rid, chunk) of the chunked request or None)``."""
    sb, other = plan_sub[i], plan_sub[1 - i]
    n_d = len(sb.decode_rids)
    sfd_o, nd_o = other.sum_fd, len(other.decode_rids)
    avail = [(pos, it) for pos, it in enumerate(queue) if pos not in used]
    chunked = None
    tp_sum = 0.0
    if avail and (free_tokens is None or free_tokens > 0):
        rem = np.array([it.remaining for _, it in avail], dtype=np.int64)
        done = np.array([it.done for _, it in avail], dtype=np.int64)
        cum = np.cumsum(rem)
        tp_each = np.zeros(len(avail))
        k, start, block, known = len(avail), 0, 2, None
        while start < len(avail):                    # prefixes in growing blocks: most stops come early
            end = min(len(avail), start + block)
            tp_each[start:end] = pred.t_p(rem[start:end], done[start:end])
            g = np.cumsum(tp_each[:end])[start:] + pred.t_batch(cum[start:end], n_d)
            p = np.asarray(pred.t_pim(sfd_o, nd_o, cum[start:end]), dtype=np.float64)
            g_blk, p_blk = g, p
            stop = (g > p) & (cum[start:end] + n_d >= min_gpu_tokens)
            if free_tokens is not None:
                stop |= cum[start:end] > free_tokens
            hit = np.flatnonzero(stop)
            if len(hit):
                k = start + int(hit[0])
                known = {int(rem[k]): (float(g_blk[hit[0]]), float(p_blk[hit[0]]))}
                break
            start, block = end, 2 * block
        for j in range(k):                           # whole requests before the line
            pos, it = avail[j]
            used.add(pos)
            sb.prefill_rids.append(it.rid)
            sb.chunks.append(int(it.remaining))
            sb.done.append(int(it.done))
        tp_sum = float(tp_each[:k].sum())
        tokens = int(cum[k - 1]) if k else 0
        if free_tokens is not None:
            free_tokens -= tokens
        if k < len(avail):                           # the request at the line: a chunk of >= 16 tokens (0: no memory)
            pos, it = avail[k]
            room = it.remaining if free_tokens is None else min(it.remaining, free_tokens)
            take = 0
            if room > 0:
                take, _, _ = chunk_size(it.remaining, it.done, fixed_tp=tp_sum, tokens_before=tokens, n_d=n_d,
                                        target_fn=lambda c: pred.t_pim(sfd_o, nd_o, tokens + np.asarray(c)),
                                        pred=pred, min_chunk=max(0, min_gpu_tokens - tokens - n_d),
                                        max_chunk=room, known=known if room == it.remaining else None)
            if take > 0:
                used.add(pos)
                sb.prefill_rids.append(it.rid)
                sb.chunks.append(int(take))
                sb.done.append(int(it.done))
                tp_sum += float(tp_each[k]) if take == it.remaining else \
                    float(pred.t_p(np.array([take]), np.array([it.done]))[0])
                if free_tokens is not None:
                    free_tokens -= take
                if take < it.remaining:
                    chunked = (it.rid, int(take))
    sb.t_gpu = _t_gpu(pred, tp_sum, sb.sum_cp, n_d)
    return free_tokens, chunked


def schedule(state: SchedState, pred, *, min_gpu_tokens: int = 0, balance: bool = True) -> Plan:
    """One iteration of the L3 scheduler (steps 2-4) on ``state``. ``balance=False`` puts every decode in
    sub-batch 0 (a single batch) and admits no prefill by the rule (used by no ablation; for tests)."""
    sub = (SubBatch(), SubBatch())
    ctx = list(state.decode_context)
    parts = balanced_split(ctx, state.decode_class) if balance else (list(range(len(ctx))), [])
    for s, part in enumerate(parts):
        for j in part:
            sub[s].decode_rids.append(state.decode_rids[j])
            sub[s].decode_context.append(int(ctx[j]))
    queue = list(state.prefills)
    used: set = set()
    chunked = []
    free = state.free_tokens
    for i in (1, 0):
        free, ch = fill_sub_batch(i, sub, queue, used, pred=pred, free_tokens=free,
                                  min_gpu_tokens=min_gpu_tokens)
        if ch is not None:
            chunked.append((i, *ch))
    for i in (0, 1):
        o = sub[1 - i]
        sub[i].t_pim = float(pred.t_pim(sub[i].sum_fd, len(sub[i].decode_rids), o.sum_cp))
    order = {item.rid: pos for pos, item in enumerate(queue)}
    requeue = sorted((rid for _, rid, _ in chunked), key=order.get)
    return Plan(sub=sub, requeue=requeue, chunked=chunked)


def verify_plan(plan: Plan, state: SchedState, pred, *, min_gpu_tokens: int = 0) -> list:
    """Every rule of steps 2-4 that ``plan`` breaks for ``state`` (an empty list: none). Used by the tests (and
    shown by them to catch broken plans)."""
    bad = []
    queue = {it.rid: (pos, it) for pos, it in enumerate(state.prefills)}
    dec = [r for sb in plan.sub for r in sb.decode_rids]
    if sorted(dec) != sorted(state.decode_rids):
        bad.append("decodes: not every decode request is in exactly one sub-batch")
    seen = set()
    total = 0
    chunked_rids = []
    for i, sb in enumerate(plan.sub):
        last_pos = -1
        n_chunked = 0
        for k, (rid, c, f) in enumerate(zip(sb.prefill_rids, sb.chunks, sb.done)):
            if rid not in queue:
                bad.append(f"sub-batch {i}: prefill {rid} is not in the queue")
                continue
            pos, it = queue[rid]
            if rid in seen:
                bad.append(f"prefill {rid} appears twice")
            seen.add(rid)
            if pos < last_pos:
                bad.append(f"sub-batch {i}: prefill {rid} taken out of queue order")
            last_pos = pos
            if not 1 <= c <= it.remaining:
                bad.append(f"prefill {rid}: chunk {c} outside [1, {it.remaining}]")
            if c < it.remaining:
                n_chunked += 1
                chunked_rids.append(rid)
                if c % CHUNK_ALIGN:
                    bad.append(f"prefill {rid}: chunk {c} is not a multiple of {CHUNK_ALIGN}")
                if k != len(sb.prefill_rids) - 1:
                    bad.append(f"sub-batch {i}: chunked prefill {rid} is not the last one")
            if f != it.done:
                bad.append(f"prefill {rid}: finished tokens {f} != {it.done}")
            total += c
        if n_chunked > 1:
            bad.append(f"sub-batch {i}: {n_chunked} chunked requests (at most one)")
    if state.free_tokens is not None and total > state.free_tokens:
        bad.append(f"prefill tokens {total} exceed the free host memory {state.free_tokens}")
    if sorted(plan.requeue) != sorted(chunked_rids):
        bad.append(f"requeue {plan.requeue} != chunked requests {chunked_rids}")
    elif plan.requeue != sorted(plan.requeue, key=lambda r: queue[r][0]):
        bad.append("requeue not in queue order")
    # the stop rule: no sub-batch went on after its T_GPU passed the other's T_PIM (with the token floor)
    for i, sb in enumerate(plan.sub):
        o = plan.sub[1 - i]
        n_d = len(sb.decode_rids)
        for k in range(len(sb.prefill_rids) - 1):
            cps, fps = np.array(sb.chunks[:k + 1]), np.array(sb.done[:k + 1])
            g = float(pred.t_p(cps, fps).sum() + pred.t_batch(np.array([cps.sum()]), n_d)[0])
            p = float(pred.t_pim(o.sum_fd, len(o.decode_rids), int(cps.sum())))
            if g > p and cps.sum() + n_d >= min_gpu_tokens:
                bad.append(f"sub-batch {i}: T_GPU {g:.4g} > T_PIM {p:.4g} after {k + 1} prefills, yet more "
                           f"were added")
                break
    # ... and none stopped before the line while prefills and memory were left
    used_by = {rid: i for i, sb in enumerate(plan.sub) for rid in sb.prefill_rids}
    free_left = None if state.free_tokens is None else state.free_tokens - total
    for i in (1, 0):
        sb, o = plan.sub[i], plan.sub[1 - i]
        cps, fps = np.array(sb.chunks, dtype=np.int64), np.array(sb.done, dtype=np.int64)
        n_d = len(sb.decode_rids)
        g = float(pred.t_p(cps, fps).sum() + pred.t_batch(np.array([cps.sum()]), n_d)[0])
        p = float(pred.t_pim(o.sum_fd, len(o.decode_rids), int(cps.sum())))
        crossed = g > p and cps.sum() + n_d >= min_gpu_tokens
        if crossed or sb.prefill_rids and sb.prefill_rids[-1] in chunked_rids or free_left == 0:
            continue
        avail = [r for r in queue if used_by.get(r) != 1] if i == 1 else [r for r in queue if r not in used_by]
        if not avail:
            continue
        nxt = queue[avail[0]][1]
        room = nxt.remaining if free_left is None else min(nxt.remaining, free_left + (
            sum(plan.sub[0].chunks) if i == 1 else 0))
        tokens = int(cps.sum())
        c, _, _ = chunk_size(nxt.remaining, nxt.done, fixed_tp=float(pred.t_p(cps, fps).sum()),
                             tokens_before=tokens, n_d=n_d,
                             target_fn=lambda x: pred.t_pim(o.sum_fd, len(o.decode_rids), tokens + np.asarray(x)),
                             pred=pred, min_chunk=max(0, min_gpu_tokens - tokens - n_d), max_chunk=room)
        if c > 0:
            bad.append(f"sub-batch {i}: stopped at T_GPU {g:.4g} <= T_PIM {p:.4g} although prefill {nxt.rid} "
                       f"({c} tokens) fits")
    return bad
