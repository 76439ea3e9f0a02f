"""The temperature metric (PLoRA VI-A)."""

import numpy as np
import pytest

from host.plora.temperature import Temperature, HOT_COUNT, RELAX


def test_increment_and_relaxation():
    t = Temperature(4)
    t.on_requests([0, 0, 2])
    assert list(t.t) == [2, 0, 1, 0]
    t.step()
    mean = 0.75
    assert t.t == pytest.approx([2 + RELAX * (mean - 2), RELAX * mean, 1 + RELAX * (mean - 1), RELAX * mean])
    assert t.t.mean() == pytest.approx(mean)          # relaxation keeps the mean
    before = t.t.copy()
    t.step(5)
    assert t.t - mean == pytest.approx((before - mean) * 0.9 ** 5)


def test_hot_set_excludes_serving_and_takes_the_hottest():
    rng = np.random.default_rng(0)
    t = Temperature(1000)
    t.on_requests(rng.integers(0, 1000, 5000))
    t.step(3)
    serving = np.zeros(1000, bool)
    serving[np.argsort(-t.t)[:10]] = True             # the 10 hottest are serving
    hot = t.hot(serving)
    assert HOT_COUNT == 50 and len(hot) == 50
    assert not serving[hot].any()
    rest = np.setdiff1d(np.flatnonzero(~serving), hot)
    assert t.t[hot].min() >= t.t[rest].max()
    assert list(hot) == sorted(hot, key=lambda i: (-t.t[i], i))     # hottest first


def test_nothing_is_hot_without_requests():
    t = Temperature(10)
    assert len(t.hot()) == 0
    t.on_requests([3])
    assert list(t.hot()) == [3]


def test_bad_input():
    with pytest.raises(ValueError, match="n_adapters"):
        Temperature(0)
    with pytest.raises(ValueError, match="relax"):
        Temperature(3, relax=1.5)
    with pytest.raises(ValueError, match="adapter ids must be in 0..2"):
        Temperature(3).on_requests([3])
