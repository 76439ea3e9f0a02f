"""The serving engine on the trivial LinearCostSystem: hand-computed times, fused runs equal to step-by-step
runs, memory admission, preemption, chunked prefill, run directory, bad input."""

import json

import numpy as np
import pytest

from host.serving import (Request, RequestTable, LinearCostSystem, ContinuousBatcher, EngineConfig, run, Batch,
                          IterationResult, System, Span)


def test_single_request_hand_computed():
    # prompt 10, output 4: one prefill iteration (10 tokens over KV 10) then 3 decodes over KV 11, 12, 13
    sys_ = LinearCostSystem(base_s=1e-3, per_token_s=1e-4, per_kv_token_s=1e-6)
    out = run([Request(0, 0.5, 10, 4)], sys_)
    t_pre = 1e-3 + 10e-4 + 10e-6
    dec = [1e-3 + 1e-4 + kv * 1e-6 for kv in (11, 12, 13)]
    t = out.table
    assert t.first_token_s[0] == pytest.approx(0.5 + t_pre)
    assert t.finish_s[0] == pytest.approx(0.5 + t_pre + sum(dec))
    s = out.summary
    assert s["ttft_s_mean"] == pytest.approx(t_pre)
    assert s["tpot_ms_mean"] == pytest.approx(1e3 * sum(dec) / 3)
    assert s["tbt_ms_mean"] == pytest.approx(1e3 * sum(dec) / 3)
    assert s["output_tokens"] == 4 and s["iterations"] == 4 and s["queue_s_mean"] == 0.0
    assert s["throughput_tok_s"] == pytest.approx(4 / (t_pre + sum(dec)))


def _workload(n=60, seed=1):
    rng = np.random.default_rng(seed)
    return RequestTable(id=np.arange(n), arrival_s=np.sort(rng.uniform(0, 0.5, n)),
                        prompt_tokens=rng.integers(1, 200, n), output_tokens=rng.integers(1, 120, n),
                        adapter_id=rng.integers(0, 5, n))


@pytest.mark.parametrize("policy", ["reserve", "paged"])
@pytest.mark.parametrize("batcher", [ContinuousBatcher(), ContinuousBatcher(max_tokens=256, chunk_prefill=True),
                                     ContinuousBatcher(policy="prefill-first", max_requests=8)])
def test_fused_runs_equal_step_by_step(policy, batcher):
    w = _workload()
    kw = dict(kv_capacity_tokens=2000, kv_policy=policy, block_tokens=16, batcher=batcher)
    fused = run(w, LinearCostSystem(**kw))
    step = run(w, LinearCostSystem(fuse=False, **kw))
    assert fused.summary["finished"] == 60
    for col in ("first_token_s", "finish_s", "admitted_s"):
        np.testing.assert_allclose(getattr(fused.table, col), getattr(step.table, col), rtol=1e-12)
    assert fused.summary["iterations"] == step.summary["iterations"]
    assert fused.summary["tbt_ms_mean"] == pytest.approx(step.summary["tbt_ms_mean"], rel=1e-12)
    assert fused.summary["tbt_ms_p99"] == pytest.approx(step.summary["tbt_ms_p99"], rel=1e-12)
    np.testing.assert_allclose(fused.iterations["duration_s"], step.iterations["duration_s"], rtol=1e-12)
    assert (fused.iterations["fused"] > 1).any()  # the fast path was taken
    # every request produced exactly its output tokens and the memory budget never overflowed
    assert np.array_equal(fused.table.generated, w.output_tokens)
    assert fused.summary["kv_peak_tokens"] <= 2000


def test_paged_budget_preempts_and_recomputes():
    # 4 requests that each grow to 100 KV tokens, 250 tokens of memory: someone must be preempted
    reqs = [Request(i, 0.0, 20, 81) for i in range(4)]
    out = run(reqs, LinearCostSystem(kv_capacity_tokens=250, kv_policy="paged", block_tokens=10))
    assert out.summary["preemptions"] > 0
    assert out.summary["finished"] == 4
    assert np.all(out.table.generated == 81)
    assert out.summary["kv_peak_tokens"] <= 250


def test_reserve_budget_limits_batch():
    reqs = [Request(i, 0.0, 50, 51) for i in range(10)]  # each reserves 100 tokens
    out = run(reqs, LinearCostSystem(kv_capacity_tokens=300, kv_policy="reserve"))
    assert out.summary["max_batch"] == 3
    assert out.summary["preemptions"] == 0
    assert out.summary["queue_s_mean"] > 0


def test_chunked_prefill_respects_budget():
    reqs = [Request(0, 0.0, 1000, 3), Request(1, 0.0, 10, 50)]
    out = run(reqs, LinearCostSystem(batcher=ContinuousBatcher(max_tokens=128, chunk_prefill=True)))
    assert out.iterations["num_tokens"].max() <= 128
    assert out.table.first_token_s[0] > out.table.first_token_s[1] or out.table.first_token_s[1] > 0


def test_never_fits_is_a_clear_error():
    with pytest.raises(RuntimeError, match="can never be admitted.*needs 150 KV tokens"):
        run([Request(7, 0.0, 100, 51)], LinearCostSystem(kv_capacity_tokens=100))


def test_run_directory(tmp_path):
    out = run(_workload(20), LinearCostSystem())
    d = out.write(tmp_path / "run", extra_config={"seed": 3})
    assert json.loads((d / "config.json").read_text())["seed"] == 3
    summary = json.loads((d / "summary.json").read_text())
    for key in ("throughput_tok_s", "tpot_ms_mean", "tpot_ms_p99", "ttft_s_mean", "tbt_ms_mean", "mean_batch"):
        assert summary[key] is not None and summary[key] > 0
    trace = json.loads((d / "trace.json").read_text())
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert lanes == {"batch", "GPU 0"}
    assert len((d / "requests.csv").read_text().splitlines()) == 21
    n_iter = len((d / "iterations.csv").read_text().splitlines()) - 1
    assert n_iter == summary["iterations"]


class _EmitEarly(System):
    """Entries of sub-batch 0 emit at half the iteration (L3-style)."""

    def form_batch(self, view, now):
        b = self.batcher.form(view, self)
        if b is not None:
            b.sub_batch = (np.arange(len(b)) % 2).astype(np.int8)
        return b

    def price(self, batch, now):
        off = np.where(batch.sub_batch == 0, 0.5, 1.0)
        return IterationResult(1.0, spans=[Span("GPU 0", "sb0", 0, 0.5), Span("GPU 0", "sb1", 0.5, 0.5)],
                               emit_offset_s=off)


def test_emit_offsets_set_token_times():
    out = run([Request(0, 0.0, 5, 2), Request(1, 0.0, 5, 2)], _EmitEarly())
    assert list(out.table.first_token_s) == [0.5, 1.0]
    assert list(out.table.finish_s) == [1.5, 2.0]


def test_bad_input():
    with pytest.raises(ValueError, match="output_tokens must be >= 1"):
        Request(0, 0.0, 5, 0)
    with pytest.raises(ValueError, match="policy"):
        ContinuousBatcher(policy="lifo")
    with pytest.raises(ValueError, match="duration_s"):
        IterationResult(0.0)
    with pytest.raises(ValueError, match="unique"):
        RequestTable(id=[1, 1], arrival_s=[0, 0], prompt_tokens=[1, 1], output_tokens=[1, 1])


def test_token_gaps_exact_and_mergeable():
    from host.serving import TokenGaps
    a, b = TokenGaps(), TokenGaps()
    a.add([1.0, 2.0, 3.0])
    b.add([10.0], weight=7)
    m = TokenGaps.merge([a, b])
    assert m.count == 10 and m.max == 10.0
    assert m.mean() == pytest.approx((6 + 70) / 10)
    assert m.percentile(30) == 3.0 and m.percentile(31) == 10.0 and m.percentile(0) == 1.0
    a += b
    assert a.count == 10


def test_batcher_policies():
    w = _workload(40, seed=3)
    pf = run(w, LinearCostSystem(batcher=ContinuousBatcher(policy="prefill-first")))
    it = pf.iterations
    assert np.all((it["n_prefill"] == 0) | (it["n_decode"] == 0))  # never mixed
    mixed = run(w, LinearCostSystem(batcher=ContinuousBatcher(max_tokens=64, chunk_prefill=True)))
    it = mixed.iterations
    assert np.any((it["n_prefill"] > 0) & (it["n_decode"] > 0))
    assert it["num_tokens"].max() <= 64
    capped = run(w, LinearCostSystem(batcher=ContinuousBatcher(max_requests=3)))
    assert capped.summary["max_batch"] == 3


def test_reproducible_and_progress_bar():
    w = _workload(30, seed=9)
    a = run(w, LinearCostSystem(kv_capacity_tokens=800, kv_policy="paged", block_tokens=8))
    b = run(w, LinearCostSystem(kv_capacity_tokens=800, kv_policy="paged", block_tokens=8),
            EngineConfig(progress=True))
    assert a.summary == b.summary
    for k, v in a.iterations.items():
        np.testing.assert_array_equal(v, b.iterations[k])


def test_first_api_gap_histogram_still_merges_run_outputs():
    # the first API version's pattern (merging data-parallel replicas into a GapHistogram) keeps working
    from host.serving import GapHistogram, summarize
    outs = [run(_workload(20, seed=s), LinearCostSystem()) for s in (1, 2)]
    gaps = GapHistogram()
    for o in outs:
        gaps.counts += o.gaps.counts
        gaps.count += o.gaps.count
        gaps.total += o.gaps.total
        gaps.max = max(gaps.max, o.gaps.max)
    exact = outs[0].gaps.merge([o.gaps for o in outs])
    assert gaps.count == exact.count and gaps.mean() == pytest.approx(exact.mean())
    assert gaps.percentile(99) == pytest.approx(exact.percentile(99), rel=0.005)
    s = summarize(outs[0].table, np.zeros(0), np.zeros(0), gaps)
    assert s["tbt_ms_mean"] == pytest.approx(1e3 * exact.mean())
