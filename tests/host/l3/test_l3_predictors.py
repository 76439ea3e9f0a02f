"""The L3 predictors: packed forests equal scikit-learn, online refits, RE on held-out batches (and a mutant)."""

import numpy as np
import pytest
from sklearn.ensemble import RandomForestRegressor

from host.l3.predictors import (L3Predictors, OnlineLinear, OnlineRFR, PackedForest, ProfiledBatches,
                                holdout_error, relative_error)


def test_packed_forest_equals_sklearn():
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 8000, (600, 2))
    y = 1e-3 + X[:, 0] * 2e-6 + X[:, 0] * X[:, 1] * 1e-10
    rf = RandomForestRegressor(n_estimators=8, max_depth=10, random_state=0, n_jobs=1).fit(X, y)
    Xt = np.vstack([rng.uniform(-100, 9000, (300, 2)), X[:20]])
    pf = PackedForest(rf)
    np.testing.assert_array_equal(pf.predict(Xt), rf.predict(Xt))
    np.testing.assert_array_equal(pf.predict_numpy(Xt), rf.predict(Xt))


def test_online_refit_schedule():
    m = OnlineRFR(1, n_estimators=2, refit_at=(4, 8), window=16)
    assert not m.ready
    with pytest.raises(RuntimeError, match="before the first fit"):
        m.predict([[1.0]])
    for k in range(3):
        m.add([[k]], [k])
    assert not m.ready
    m.add([[3]], [3])
    assert m.ready and m.fits == 1
    m.add(np.arange(4, 8)[:, None], np.arange(4, 8))
    assert m.fits == 2
    m.add(np.arange(8, 23)[:, None], np.arange(8, 23))     # next refit every window (16) samples: at 24
    assert m.fits == 2 and len(m.y) == 16
    m.add([[23]], [23])
    assert m.fits == 3 and m.X[:, 0].min() == 8            # trained on the most recent window


def test_linear_recovers_a_linear_law():
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 1e5, (100, 3))
    y = 2e-3 + X @ np.array([1e-7, 2e-5, 3e-8])
    m = OnlineLinear(3, refit_at=(50,))
    m.add(X, y)
    np.testing.assert_allclose(m.predict(X), y, rtol=1e-9)


def _synthetic(n, seed=0, noise=0.0):
    """Profiled sub-batches with smooth true laws (a stand-in for the true GPU / PIM models)."""
    rng = np.random.default_rng(seed)
    sfd = rng.uniform(0, 4e5, n)
    nd = rng.integers(0, 128, n).astype(float)
    cp_o = rng.uniform(0, 4000, n)
    pim_y = 1e-4 + 2e-8 * sfd + 1e-5 * nd + 3e-7 * cp_o
    n_pre = rng.integers(0, 3, n)
    owner = np.repeat(np.arange(n), n_pre)
    c = rng.integers(16, 2048, len(owner)).astype(float)
    f = rng.integers(0, 8000, len(owner)).astype(float)
    p_y = 2e-5 + 1e-10 * c * (f + c / 2)
    sum_cp = np.bincount(owner, weights=c, minlength=n)
    batch_X = np.stack([sum_cp, nd], axis=1)
    batch_y = 5e-3 + 2e-6 * (sum_cp + nd) + 1e-9 * (sum_cp + nd) ** 1.5
    gpu_y = batch_y + np.bincount(owner, weights=p_y, minlength=n)
    mul = lambda y: y * (1 + noise * rng.standard_normal(len(y)))
    return ProfiledBatches(np.stack([sfd, nd, cp_o], axis=1), mul(pim_y), np.stack([c, f], axis=1), mul(p_y),
                           batch_X, mul(batch_y), gpu_y, owner)


def test_holdout_error_on_1000_batches():
    b = _synthetic(1000)
    r = holdout_error(b, seed=0)
    assert r["n_train"] == 800 and r["n_test"] == 200
    assert r["re_pim"] < 1e-6                  # the law is linear in the three features
    assert r["re_gpu"] < 0.05 and r["re_batch"] < 0.05 and r["re_p"] < 0.10
    # a mutant: targets shuffled against their features -> the held-out error explodes
    perm = np.random.default_rng(1).permutation(1000)
    bad = ProfiledBatches(b.pim_X, b.pim_y[perm], b.p_X, b.p_y, b.batch_X, b.batch_y[perm], b.gpu_y[perm],
                          b.p_owner)
    rb = holdout_error(bad, seed=0)
    assert rb["re_pim"] > 0.2 and rb["re_batch"] > 0.2


def test_relative_error_and_subset():
    assert relative_error([1, 2], [1.1, 1.8]) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        relative_error([0, 1], [0, 1])
    b = _synthetic(50)
    s = b.subset([3, 7, 9])
    assert len(s) == 3 and set(s.p_owner.tolist()) <= {0, 1, 2}
    np.testing.assert_allclose(s.gpu_y, b.gpu_y[[3, 7, 9]])
    joined = ProfiledBatches.concat([b.subset(range(25)), b.subset(range(25, 50))])
    np.testing.assert_allclose(joined.p_y, b.p_y)
    np.testing.assert_array_equal(joined.p_owner, b.p_owner)


def test_predictors_interface():
    pred = L3Predictors(seed=0)
    pred.seed(_synthetic(300))
    assert pred.ready
    assert pred.t_pim(1e5, 10, np.array([0, 100, 1000])).shape == (3,)
    assert isinstance(pred.t_pim(1e5, 10, 500), float)
    assert pred.t_p([16, 32], [0, 0]).shape == (2,)
    assert pred.t_batch([0, 16, 64], 8).shape == (3,)
    assert pred.t_gpu([100, 200], [0, 50], 8) > 0


def test_packed_forest_small_queries_equal_sklearn():
    rng = np.random.default_rng(4)
    X = rng.uniform(0, 5000, (300, 2))
    y = np.sin(X[:, 0] / 700) + X[:, 1] * 1e-3
    rf = RandomForestRegressor(n_estimators=5, max_depth=8, random_state=1, n_jobs=1).fit(X, y)
    pf = PackedForest(rf)
    for n in (1, 3, pf.PY_ROWS, pf.PY_ROWS + 1):   # the plain-Python and the vectorized paths
        Xt = rng.uniform(0, 5000, (n, 2))
        np.testing.assert_array_equal(pf.predict(Xt), rf.predict(Xt))
