"""The L3 scheduler (L3 5.2, 5.3) on constructed states: balanced split, stop rule, chunk sizing, requeue; and
the plan checker catches broken plans."""

import copy

import numpy as np
import pytest

from host.l3.scheduler import (CHUNK_ALIGN, PrefillItem, SchedState, balanced_split, chunk_size, ridge_tokens,
                               schedule, verify_plan)


class LinearPred:
    """Hand-checkable predictor: T_PIM = a sum_fd + b n_d + c sum_cp (+ d); t_p = k c (f + c / 2);
    t_batch = base + e (sum_cp + n_d)."""

    def __init__(self, a=1e-6, b=1e-4, c=2e-6, d=1e-4, k=1e-9, base=5e-3, e=2e-5):
        self.a, self.b, self.c, self.d, self.k, self.base, self.e = a, b, c, d, k, base, e

    def t_pim(self, sum_fd, n_d, sum_cp):
        return self.a * sum_fd + self.b * n_d + self.c * np.asarray(sum_cp, dtype=float) + self.d

    def t_p(self, c, f):
        c, f = np.asarray(c, dtype=float), np.asarray(f, dtype=float)
        return self.k * c * (f + c / 2)

    def t_batch(self, sum_cp, n_d):
        return self.base + self.e * (np.asarray(sum_cp, dtype=float) + n_d)


def _g(pred, chunks, done, n_d):
    chunks = np.asarray(chunks)
    return float(pred.t_p(chunks, done).sum() + pred.t_batch([chunks.sum()], n_d)[0])


def test_balanced_split_paper_example():
    # L3 5.3 step 2: 2k, 3k, 4k, 5k -> (2k, 5k) and (3k, 4k)
    ctx = [2000, 3000, 4000, 5000]
    a, b = balanced_split(ctx)
    groups = sorted(sorted(ctx[j] for j in g) for g in (a, b))
    assert groups == [[2000, 5000], [3000, 4000]]


@pytest.mark.parametrize("seed", range(5))
def test_balanced_split_is_a_partition_and_near_even(seed):
    rng = np.random.default_rng(seed)
    ctx = rng.integers(1, 20000, 41)
    a, b = balanced_split(ctx)
    assert sorted(a + b) == list(range(41))
    diff = abs(ctx[a].sum() - ctx[b].sum())
    assert diff <= ctx.max()          # greedy longest-first: within the largest item


def _state(n_dec=8, ctx=6000, prefills=(300, 500, 700, 900, 1100), free=None):
    rids = tuple(range(n_dec))
    return SchedState(decode_rids=rids, decode_context=tuple([ctx] * n_dec),
                      prefills=tuple(PrefillItem(100 + j, r, 0) for j, r in enumerate(prefills)), free_tokens=free)


def test_stop_rule_and_chunk():
    pred = LinearPred()
    st = _state()
    plan = schedule(st, pred)
    assert verify_plan(plan, st, pred) == []
    sb0, sb1 = plan.sub
    assert len(sb0.decode_rids) == len(sb1.decode_rids) == 4
    assert sb1.prefill_rids and sb0.prefill_rids
    # sub-batch 1 was filled first, from the head of the queue, and crossed T_PIM_0 only with its last prefill
    assert sb1.prefill_rids[0] == 100
    for i, sb in ((1, sb1), (0, sb0)):
        o = plan.sub[1 - i]
        for k in range(len(sb.chunks) - 1):
            g = _g(pred, sb.chunks[:k + 1], sb.done[:k + 1], len(sb.decode_rids))
            assert g <= pred.t_pim(o.sum_fd, len(o.decode_rids), sum(sb.chunks[:k + 1]))
    # at most one chunked request per sub-batch, a multiple of 16, and it goes back to the head of the queue
    for i, rid, c in plan.chunked:
        assert c % CHUNK_ALIGN == 0 and plan.sub[i].prefill_rids[-1] == rid
    assert len({i for i, _, _ in plan.chunked}) == len(plan.chunked)
    assert plan.requeue == [rid for _, rid, _ in sorted(plan.chunked, key=lambda t: t[1])]


def test_chunk_is_the_closest_multiple_of_16():
    pred = LinearPred()
    st = _state(prefills=(4000,))
    plan = schedule(st, pred)
    sb1, sb0 = plan.sub[1], plan.sub[0]
    assert sb1.prefill_rids == [100] and plan.requeue == [100]
    c = sb1.chunks[0]
    assert 0 < c < 4000 and c % 16 == 0
    target = lambda x: pred.t_pim(sb0.sum_fd, len(sb0.decode_rids), x)
    err = lambda x: abs((_g(pred, [x], [0], 4) if x else _g(pred, [0], [0], 4)) - target(x))
    brute = min(range(0, 4000, 16), key=lambda x: (err(x), -x))
    assert c == brute
    # the same request is not taken again by sub-batch 0 in the same iteration
    assert 100 not in sb0.prefill_rids


def test_chunked_request_keeps_its_progress():
    pred = LinearPred()
    st = SchedState(decode_rids=(0, 1), decode_context=(9000, 9000),
                    prefills=(PrefillItem(7, 5000, 3200), PrefillItem(8, 100, 0)))
    plan = schedule(st, pred)
    assert verify_plan(plan, st, pred) == []
    sb = plan.sub[1]
    assert sb.prefill_rids[0] == 7 and sb.done[0] == 3200


def test_memory_caps_prefill_tokens():
    pred = LinearPred(a=1e-5)                   # long PIM phase: the GPU would take a lot of prefill
    st = _state(free=1000, prefills=(600, 600, 600))
    plan = schedule(st, pred)
    assert verify_plan(plan, st, pred) == []
    total = sum(sum(sb.chunks) for sb in plan.sub)
    assert total <= 1000
    for _, _, c in plan.chunked:
        assert c % 16 == 0


def test_short_pim_phase_literal_rule_and_token_floor():
    pred = LinearPred()
    st = SchedState(decode_rids=(0,), decode_context=(50,), prefills=tuple(PrefillItem(10 + j, 96) for j in range(9)))
    lit = schedule(st, pred, min_gpu_tokens=0)
    assert verify_plan(lit, st, pred) == []
    floor = schedule(st, pred, min_gpu_tokens=160)
    assert verify_plan(floor, st, pred, min_gpu_tokens=160) == []
    tok = lambda p, i: sum(p.sub[i].chunks) + len(p.sub[i].decode_rids)
    assert tok(lit, 1) < 160                    # the paper's rule alone: (almost) nothing fits a short PIM phase
    assert tok(floor, 1) >= 160 and tok(floor, 0) >= 160


def test_crossing_request_gets_a_16_multiple_chunk():
    # no decodes and a GPU phase that is past the (empty) PIM phase before any prefill: the literal rule used to
    # pick a 0-token chunk for the crossing request, an empty plan (the engine's deadlock on GPT-175B Dolphin)
    pred = LinearPred(a=0.0, b=0.0, c=0.0, d=0.0)
    st = SchedState(prefills=(PrefillItem(1, 5000), PrefillItem(2, 300)))
    plan = schedule(st, pred)
    assert verify_plan(plan, st, pred) == []
    chunks = [c for sb in plan.sub for c in sb.chunks]
    assert chunks and all(c >= CHUNK_ALIGN and c % CHUNK_ALIGN == 0 for c in chunks), chunks
    assert plan.sub[1].prefill_rids == [1] and plan.sub[1].chunks == [CHUNK_ALIGN]
    assert plan.sub[0].prefill_rids == [2] and plan.sub[0].chunks == [CHUNK_ALIGN]
    assert plan.requeue == [1, 2]
    # with decodes whose PIM phase is shorter than any GPU phase, each sub-batch still takes a 16-token chunk
    st = SchedState(decode_rids=(0, 1), decode_context=(100, 100), prefills=(PrefillItem(5, 4000),))
    plan = schedule(st, LinearPred(a=0.0, c=0.0))
    assert [c for sb in plan.sub for c in sb.chunks] == [CHUNK_ALIGN]


def test_ridge_tokens_a100():
    assert ridge_tokens(312, 2039) == 160


def test_no_decodes_no_prefills():
    pred = LinearPred()
    plan = schedule(SchedState(), pred)
    assert all(not sb.decode_rids and not sb.prefill_rids for sb in plan.sub) and plan.requeue == []


# ---- the checker catches broken plans (mutants) --------------------------------------------------------------

def _mutants(plan, st):
    """Broken variants of a correct plan, each breaking one rule."""
    out = {}
    m = copy.deepcopy(plan)                      # chunk not a multiple of 16
    i, rid, c = m.chunked[0]
    m.sub[i].chunks[-1] = c + 1
    out["unaligned"] = m
    m = copy.deepcopy(plan)                      # chunked request not requeued
    m.requeue = []
    out["not_requeued"] = m
    m = copy.deepcopy(plan)                      # a decode lost
    m.sub[0].decode_rids.pop()
    out["lost_decode"] = m
    m = copy.deepcopy(plan)                      # a second chunked request in one sub-batch
    sb = m.sub[1]
    if len(sb.chunks) >= 2:
        sb.chunks[0] = 16
        out["two_chunked"] = m
    m = copy.deepcopy(plan)                      # stopped early: sub-batch 1 without prefills
    m.sub[1].prefill_rids, m.sub[1].chunks, m.sub[1].done = [], [], []
    m.requeue = [r for s in m.sub for r in s.prefill_rids if r in m.requeue]
    m.chunked = [t for t in m.chunked if t[0] == 0]
    out["stopped_early"] = m
    return out


def test_checker_catches_mutants():
    pred = LinearPred()
    st = _state(prefills=(300, 500, 700, 900, 1100, 1300))
    plan = schedule(st, pred)
    assert verify_plan(plan, st, pred) == [] and plan.chunked
    muts = _mutants(plan, st)
    assert len(muts) >= 4
    for name, m in muts.items():
        assert verify_plan(m, st, pred), f"mutant {name} not caught"
    # a scheduler that ignores the stop rule (adds everything) is caught too
    greedy = copy.deepcopy(plan)
    used = {r for s in greedy.sub for r in s.prefill_rids}
    greedy.requeue, greedy.chunked = [], []
    for s in greedy.sub:
        s.chunks = [next(it.remaining for it in st.prefills if it.rid == r) for r in s.prefill_rids]
    greedy.sub[0].prefill_rids += [it.rid for it in st.prefills if it.rid not in used]
    greedy.sub[0].chunks += [it.remaining for it in st.prefills if it.rid not in used]
    greedy.sub[0].done += [0 for it in st.prefills if it.rid not in used]
    assert any("yet more were added" in b for b in verify_plan(greedy, st, pred))


def test_chunk_size_candidates():
    pred = LinearPred()
    c, g, p = chunk_size(100, 0, fixed_tp=0.0, tokens_before=0, n_d=0, target_fn=lambda x: np.full(np.shape(x), 1.0),
                         pred=pred)
    assert c == 100                              # the target is far above: the whole remainder
    c, g, p = chunk_size(1000, 0, fixed_tp=0.0, tokens_before=0, n_d=0, target_fn=lambda x: np.zeros(np.shape(x)),
                         pred=pred)
    assert c == CHUNK_ALIGN                      # the target is below anything: the crossing request still gets 16
    c, _, _ = chunk_size(10, 0, fixed_tp=0.0, tokens_before=0, n_d=0, target_fn=lambda x: np.zeros(np.shape(x)),
                         pred=pred)
    assert c == 10                               # a remainder below 16 is taken whole
    c, _, _ = chunk_size(1000, 0, fixed_tp=0.0, tokens_before=0, n_d=0, target_fn=lambda x: np.zeros(np.shape(x)),
                         pred=pred, max_chunk=15)
    assert c == 0                                # memory holds no 16-token chunk: the only 0
    c, _, _ = chunk_size(1000, 0, fixed_tp=0.0, tokens_before=0, n_d=0, target_fn=lambda x: np.zeros(np.shape(x)),
                         pred=pred, min_chunk=100)
    assert c == 112                              # at least min_chunk, rounded up to 16
    c, _, _ = chunk_size(1000, 0, fixed_tp=0.0, tokens_before=0, n_d=0, target_fn=lambda x: np.full(np.shape(x), 9.),
                         pred=pred, max_chunk=250)
    assert c == 240                              # memory room 250: the largest multiple of 16 below it


def test_balanced_split_by_class():
    # two classes: each sub-batch gets one long and one short request of each class
    ctx = [9000, 8000, 1000, 500, 9000, 8000, 1000, 500]
    cls = [0, 0, 0, 0, 1, 1, 1, 1]
    a, b = balanced_split(ctx, cls)
    for g in (a, b):
        for m in (0, 1):
            load = sum(ctx[j] for j in g if cls[j] == m)
            assert load in (9500, 9000)
    # all classes distinct: the plain rule (the paper's example)
    a, b = balanced_split([2000, 3000, 4000, 5000], [0, 1, 2, 3])
    assert sorted(sorted([2000, 3000, 4000, 5000][j] for j in g) for g in (a, b)) == [[2000, 5000], [3000, 4000]]
