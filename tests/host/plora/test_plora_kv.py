"""Token-interleaved KV partition with a duplicated prefix, and the exact merge of the partial outputs."""

import numpy as np
import pytest

from sim.golden.attention import reference_attention, merge_partials
from host.plora.kv import partition, share_counts, device_of_token, distributed_attention


def test_partition_is_token_interleaved_and_complete():
    gpu, devs = partition(23, 5, 4)
    assert list(gpu) == [0, 1, 2, 3, 4]
    for d, idx in enumerate(devs):
        assert np.all(device_of_token(idx, 4) == d)
    assert sorted(np.concatenate([gpu] + devs)) == list(range(23))
    assert list(share_counts(23, 5, 4)) == [len(x) for x in devs] == [4, 5, 5, 4]
    assert list(share_counts(3, 0, 8)) == [1, 1, 1, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="dup"):
        partition(3, 4, 2)


@pytest.mark.parametrize("dup,n_dev", [(0, 2), (8, 2), (16, 4), (5, 1)])
def test_distributed_attention_matches_reference(dup, n_dev):
    rng = np.random.default_rng(dup * 10 + n_dev)
    d = 32
    L = dup + n_dev * 8 * 3                      # every device share a multiple of the TINY core's 8 lanes
    K = (rng.standard_normal((L, d)) * 0.5).astype(np.float16)
    V = rng.standard_normal((L, d)).astype(np.float16)
    q = rng.standard_normal(d).astype(np.float16)
    out, parts = distributed_attention(q, K, V, dup=dup, n_dev=n_dev)
    ref = reference_attention(q, K, V)
    assert np.max(np.abs(out - ref)) < 2e-3 * max(1.0, np.max(np.abs(ref)))
    assert {k[0] for k in parts} == ({-1} if dup else set()) | set(range(n_dev))
    # the merge is exact whatever order the partials arrive in
    rev = dict(reversed(list(parts.items())))
    assert np.array_equal(merge_partials(rev).view(np.uint32), out.view(np.uint32))


def test_dropping_a_partial_breaks_the_result():
    """The check above can fail: leaving one device's partial out changes the output."""
    rng = np.random.default_rng(7)
    K = rng.standard_normal((48, 32)).astype(np.float16)
    V = rng.standard_normal((48, 32)).astype(np.float16)
    q = rng.standard_normal(32).astype(np.float16)
    out, parts = distributed_attention(q, K, V, dup=0, n_dev=2)
    partial = merge_partials({k: v for k, v in parts.items() if k[0] == 0})
    assert np.max(np.abs(partial - out)) > 1e-2


def test_share_not_a_lane_multiple_is_refused():
    K = np.zeros((10, 32), np.float16)
    with pytest.raises(ValueError, match="multiple of config.lanes"):
        distributed_attention(np.zeros(32, np.float16), K, K, dup=0, n_dev=2)
