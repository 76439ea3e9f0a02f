"""The hybrid calls PLoRA's memory manager and L3's predictor training, not copies of them (issue 32, item 2).

* **Decisions**: one constructed state (admissions one by one under a tight HBM budget, the requests grown, two of
  them finished, pre-caching given link time: PLoRA's before_batch) is fed to
  :class:`host.plora.system.PLoRASystem` configured as the hybrid documents (the tiny model, the e2e NDP timing,
  the run's HBM budget and adapter ranks) and to
  :class:`host.e2e.hybrid.HybridSystem`: every decision (strategy, caching level and batch of every adapter, the
  KV duplicated per request, the counters of decisions, paths, evictions and pre-cached adapters, the strategy of
  decode and prompt tokens) is the same. The state is rich enough that another HBM budget changes the decisions
  (the check can fail).
* **Predictor targets**: L3's and the hybrid's GPU predictors are trained on the same quantities (eq. 6):
  RFR_p on each prefill's own attention time, RFR_batch on the rest of the sub-batch's T_GPU (L3: the batched FC
  time), their sum T_GPU; predictors trained on a sub-batch with prefills predict the T_GPU they were trained on
  (the double-counted targets the hybrid had predicted about twice it)."""

from types import SimpleNamespace

import numpy as np
import pytest

from host.e2e.hybrid import HybridSystem
from host.e2e.model import get_tiny, make_weights, make_adapters, llm_config
from host.e2e.run import E2EConfig, make_requests, _devices
from host.gpu import get_gpu_model
from host.l3.predictors import L3Predictors, ProfiledBatches, profiled_sub_batch
from host.link import get_link
from host.models.hardware import GPUS
from host.plora.lora import STRATEGIES
from host.plora.system import PLoRASystem
from host.serving import Batch, Request, run as engine_run, EngineConfig
from host.serving.request import RequestTable, RUNNING, FINISHED, WAITING

# six short requests on four adapters (adapters 0 and 1 serve two requests each), an HBM budget that holds about
# one adapter's A and B
CFG = E2EConfig(model="micro", requests=6, long_requests=0, tokens=4, short_prompt=(16, 48), n_adapters=4,
                budget_kb=48, seed=0)
FINISH = [0, 4]             # the requests that finish: adapter 0's


def _hybrid(cfg, select_every_step=False, pim_min_context=1 << 60):
    tiny = get_tiny(cfg.model)
    adapters = make_adapters(tiny, cfg.n_adapters, cfg.seed)
    reqs, prompts = make_requests(cfg, tiny.vocab)
    ndp, pim, timing = _devices(cfg, "perf", "verilator", tiny, reqs)
    hy = HybridSystem(weights=make_weights(tiny, cfg.seed), adapters=adapters, prompts=prompts, ndp=ndp, pim=pim,
                      ndp_timing=timing, pim_model=pim.perf, budget_bytes=cfg.budget_kb * 1024,
                      pim_min_context=pim_min_context, seed=cfg.seed, select_every_step=select_every_step)
    return hy, reqs, timing, adapters, tiny


def _plora(tiny, timing, adapters, cfg, budget_bytes=None):
    """PLoRA's system as the hybrid's docstring configures its memory manager."""
    return PLoRASystem(llm_config(tiny), "plora", gpu=GPUS["h100"], gpu_model=get_gpu_model("h100"),
                       link=get_link("cxl3.1"), n_dev=cfg.n_dev, ndp=timing, seed=cfg.seed,
                       ranks=[a.rank for a in adapters],
                       hbm_budget_bytes=cfg.budget_kb * 1024 if budget_bytes is None else budget_bytes)


def _observe(sys_):
    """Every decision of the memory manager, read through the system's own interface where it has one."""
    if isinstance(sys_, HybridSystem):
        mem, counts = sys_.mem, sys_.summary()["strategy_counts"]
        decode = {a: STRATEGIES[sys_._strategy(a)] for a in range(len(mem.ranks))}
        prompt = {a: STRATEGIES[sys_._strategy(a, 40)] for a in range(len(mem.ranks))}
    else:
        mem, counts = sys_, sys_.summary()["strategy_counts"]
        decode = {a: STRATEGIES[int(sys_._strategies_of(np.array([a]))[0])] for a in range(len(mem.ranks))}
        prompt = {a: STRATEGIES[sys_.prefill_strategy(a, 40)[0]] for a in range(len(mem.ranks))}
    st = mem.state
    return {"adapters": {a: (s.level, s.strategy, s.tokens) for a, s in sorted(st.adapters.items())},
            "dup": mem.dup.tolist(), "kv": (st.kv_dup_tokens, st.kv_dev_tokens, st.n_req, st.n_dev_req),
            "counts": {k: counts[k] for k in ("decisions", "paths", "evictions", "precached")},
            "load": mem.pending_load, "decode": decode, "prompt": prompt}


def _mem(sys_):
    return sys_.mem if isinstance(sys_, HybridSystem) else sys_


def _remaining(t, a):
    rem = [int(t.output_tokens[i] - t.generated[i]) for i in range(t.n)
           if int(t.adapter_id[i]) == a and t.state[i] == RUNNING]
    return max(1.0, float(max(rem))) if rem else 1.0


def _scenario(sys_, reqs, reselect=False):
    """The constructed state, step by step; returns the observations after each step."""
    t = RequestTable.from_requests(reqs)
    sys_.bind(t)
    t.state[:] = WAITING
    obs = []
    for i in range(t.n):                                    # admissions, one at a time (as SchedulerView.admit)
        t.state[i] = RUNNING
        sys_.on_admit(np.array([i]), 0.0)
        obs.append(_observe(sys_))
    t.prefilled[:] = t.prefill_len                          # prompts done, 1-3 tokens generated
    t.generated[:] = 1 + np.arange(t.n) % 3
    done = np.array(FINISH)
    for running in (np.arange(t.n), np.setdiff1d(np.arange(t.n), done)):
        if len(running) < t.n:                              # requests finish: adapter 0 stops serving
            t.state[done] = FINISHED
            sys_.on_finish(done, 0.0)
            obs.append(_observe(sys_))
        _mem(sys_).prefetch_budget = 1e9                    # link time for pre-caching
        sys_.before_batch(SimpleNamespace(running=running, waiting=[], table=t), 0.0)
        if reselect and not isinstance(sys_, HybridSystem):  # the hybrid's select_every_step, spelled out
            m = _mem(sys_)
            for a in np.flatnonzero(m.count).tolist():
                m.decide(int(a), int(m.count[a]), _remaining(t, a))
        obs.append(_observe(sys_))
    return obs


def test_one_state_gives_the_hybrid_and_plora_the_same_decisions():
    hy, reqs, timing, adapters, tiny = _hybrid(CFG)
    pl = _plora(tiny, timing, adapters, CFG)
    got, want = _scenario(hy, reqs), _scenario(pl, reqs)
    assert got == want
    # the state exercises the manager: KV and serving evictions, KV duplicates, three strategies
    last = want[-1]
    assert last["counts"]["evictions"]["kv"] > 0 and last["counts"]["evictions"]["serving"] > 0, last["counts"]
    assert any(d > 0 for o in want for d in o["dup"])
    assert len({s for o in want for s in o["decode"].values()}) >= 3
    # and the check can fail: the same state under another budget decides otherwise
    other = _scenario(_plora(tiny, timing, adapters, CFG, budget_bytes=CFG.budget_kb * 1024 * 3), reqs)
    assert other != got


def test_the_hybrids_reselection_is_plora_decide_at_every_step():
    """``select_every_step`` (the hybrid's one addition) calls PLoRASystem.decide for every serving adapter,
    counted with PLoRA's counters."""
    hy, reqs, timing, adapters, tiny = _hybrid(CFG, select_every_step=True)
    pl = _plora(tiny, timing, adapters, CFG)
    got, want = _scenario(hy, reqs), _scenario(pl, reqs, reselect=True)
    assert got == want
    assert want[-1]["counts"] != _scenario(_plora(tiny, timing, adapters, CFG), reqs)[-1]["counts"]


def test_a_long_requests_kv_stays_out_of_the_managers_kv():
    """The DIMM-PIM request: its adapter is managed, its prompt is neither duplicated nor counted as device KV."""
    cfg = E2EConfig(model="micro", requests=3, long_requests=1, tokens=3, long_context=48, short_prompt=(16, 32),
                    pim_bank_groups=1, budget_kb=24, seed=0)
    hy, reqs, *_ = _hybrid(cfg, pim_min_context=48)
    t = RequestTable.from_requests(reqs)
    hy.bind(t)
    long_ = [r.idx for r in hy.reqs if r.place == 0]
    assert long_ == [2]
    t.state[:] = RUNNING
    hy.on_admit(np.arange(3), 0.0)
    m = hy.mem
    assert m.count[int(t.adapter_id[2])] == 1 and m.dup[2] == 0
    assert m.state.kv_dup_tokens + m.state.kv_dev_tokens == t.prefill_len[:2].sum()
    assert m.state.n_req == 2


# ---- the predictors' targets -----------------------------------------------------------------------------
def _fit_and_predict(pb: ProfiledBatches, row: int) -> tuple:
    """Predictors trained on many copies of ``pb``: (predicted T_GPU of sub-batch ``row``, its T_GPU)."""
    pred = L3Predictors(seed=0, n_estimators=4, max_depth=6)
    pred.seed(ProfiledBatches.concat([pb] * 70))
    own = pb.p_owner == row
    return pred.t_gpu(pb.p_X[own, 0], pb.p_X[own, 1], int(pb.batch_X[row, 1])), float(pb.gpu_y[row])


def _check_targets(pb, each_attention, t_gpu):
    """RFR_p: each prefill's own attention; RFR_batch: T_GPU less them; gpu_y: T_GPU; prediction = T_GPU."""
    np.testing.assert_allclose(pb.p_y, each_attention, rtol=1e-12)
    np.testing.assert_allclose(pb.gpu_y, t_gpu, rtol=1e-12)
    np.testing.assert_allclose(pb.batch_y + np.bincount(pb.p_owner, weights=pb.p_y, minlength=len(pb)), pb.gpu_y,
                               rtol=1e-12)
    assert np.all(pb.batch_y > 0)
    for row in np.unique(pb.p_owner):
        hat, true = _fit_and_predict(pb, int(row))
        assert hat == pytest.approx(true, rel=0.02), (hat, true)


def test_l3_trains_its_predictors_on_prefill_attention_and_batched_fc():
    from host.l3.config import l3_setup
    from host.l3.systems import make_system
    s = make_system("l3", l3_setup("opt-66b"), profile_batches=0)
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=p, output_tokens=8) for i, p in
            enumerate((900, 2000, 700, 3000, 500))]
    t = RequestTable.from_requests(reqs)
    s.bind(t)
    t.state[:] = RUNNING
    s.on_admit(np.arange(5), 0.0)
    t.prefilled[:3] = t.prefill_len[:3]
    t.generated[:3] = 2
    # sub-batch 0: two decodes and two prefill chunks; sub-batch 1: a decode and one chunk
    b = Batch(req=[0, 1, 3, 2, 4], new_tokens=[1, 1, 512, 1, 256], context=[901, 2001, 1024, 701, 0],
              prefill=[False, False, True, False, True], completes_prefill=[False, False, False, False, False],
              sub_batch=[0, 0, 0, 1, 1])
    t.prefilled[3] = 1024
    s.price(b, 0.0)
    pb = s.profiled_batches()
    assert len(pb) == 2 and len(pb.p_y) == 2
    c, kv = np.array([512, 256]), np.array([1536, 256])
    each = np.concatenate([s.gpu.prefill_attn_each(c[:1], kv[:1]), s.gpu.prefill_attn_each(c[1:], kv[1:])])
    fc = [s.gpu.fc(512 + 2, 2), s.gpu.fc(256 + 1, 1)]
    np.testing.assert_allclose(pb.batch_y, fc, rtol=1e-12)
    _check_targets(pb, each, np.array(fc) + each)
    # the start-up profile's rows are built by the same function
    one = s._profile(np.array([900]), np.array([901]), np.array([0]), np.array([512]), np.array([1024]),
                     np.array([256]), np.array([1]))
    ref = profiled_sub_batch(sum_fd=900, n_d=1, sum_cp_other=256, t_pim=float(one.pim_y[0]), chunks=[512],
                             done=[1024], t_p_each=s.gpu.prefill_attn_each(np.array([512]), np.array([1536])),
                             t_fc=s.gpu.fc(513, 1))
    for f in ("pim_X", "p_X", "p_y", "batch_X", "batch_y", "gpu_y", "p_owner"):
        np.testing.assert_array_equal(getattr(one, f), getattr(ref, f))


@pytest.fixture(scope="module")
def hybrid_learning():
    """A perf-backend run whose iterations have prefills beside decodes; every profiled sub-batch it learned."""
    seen = []
    orig = HybridSystem._learn

    def spy(self, batch, it):
        obs = self.pred.observe
        self.pred.observe = lambda pb: (seen.append((batch, it, pb)), obs(pb))
        try:
            orig(self, batch, it)
        finally:
            del self.pred.observe
    HybridSystem._learn = spy
    try:
        cfg = E2EConfig(model="micro", requests=4, long_requests=1, tokens=3, long_context=48, short_prompt=(16, 32),
                        pim_bank_groups=1, budget_kb=24, seed=0)
        hy, reqs, *_ = _hybrid(cfg, pim_min_context=cfg.long_context)
        # two requests arrive while the others decode: prefills beside decodes
        reqs = [Request(id=r.id, arrival_s=1e-4 * (i % 2), prompt_tokens=r.prompt_tokens,
                        output_tokens=r.output_tokens, adapter_id=r.adapter_id) for i, r in enumerate(reqs)]
        engine_run(reqs, hy, EngineConfig(fuse_decode=False))
    finally:
        HybridSystem._learn = orig
    return hy, seen


def test_the_hybrid_trains_its_predictors_on_the_same_quantities(hybrid_learning):
    s, seen = hybrid_learning
    nl = s.cfg.n_layers
    with_prefills = 0
    for batch, it, pb in seen:
        rows = [i for i in (0, 1) if any(e["sb"] == i for e in it.entries)]
        assert len(pb) == len(rows)
        each = [nl * s._prefill_attention_s(e["n"], e["ctx"] + e["n"]) for i in rows for e in it.entries
                if e["sb"] == i and e["pre"]]
        _check_targets(pb, np.array(each), np.array([it.model_t_gpu[i] for i in rows]))
        with_prefills += len(pb.p_y) > 0
    assert with_prefills >= 2
    # the start-up profile: the same targets, from the same function
    prof = s._startup_profile(n=12)
    np.testing.assert_allclose(prof.batch_y + np.bincount(prof.p_owner, weights=prof.p_y, minlength=len(prof)),
                               prof.gpu_y, rtol=1e-12)
    assert len(prof.p_y) and np.all(prof.batch_y > 0)


def test_double_counted_targets_would_be_caught(hybrid_learning):
    """The hybrid's former targets (RFR_p: T_GPU / n prefills each, RFR_batch: T_GPU) fail the same check."""
    _, seen = hybrid_learning
    batch, it, pb = next(x for x in seen if len(x[2].p_y))
    row = int(pb.p_owner[0])
    n = int(np.sum(pb.p_owner == row))
    bad = ProfiledBatches(pb.pim_X, pb.pim_y, pb.p_X, np.where(pb.p_owner == row, pb.gpu_y[row] / n, pb.p_y),
                          pb.batch_X, pb.gpu_y.copy(), pb.gpu_y, pb.p_owner)
    hat, true = _fit_and_predict(bad, row)
    assert hat > 1.5 * true
    with pytest.raises(AssertionError):
        _check_targets(bad, pb.p_y, pb.gpu_y)
