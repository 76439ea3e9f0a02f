"""The L3 scheduler's latency predictors (L3 5.3, eqs. 5-6), trained online from profiled iterations.

* ``T_PIM_i = Linear(sum f_d_i, len f_d_i, sum c_p_{1-i})`` (eq. 5): least squares with an intercept
  (scikit-learn ``LinearRegression``) on the three features, weighted by ``1 / y^2`` (relative error);
* ``T_GPU_i = RFR_p(c_p_i, f_p_i) + RFR_batch(sum c_p_i, len f_d_i)`` (eq. 6): two random-forest regressors
  (scikit-learn ``RandomForestRegressor``). ``RFR_p`` is trained per prefill request on (chunk, finished tokens)
  -> its prefill-attention time and summed over the sub-batch's prefills; ``RFR_batch`` on (prefill tokens,
  decodes) -> the batched FC time (linear layers, all-reduce) of the sub-batch.

Online training (5.3 "runtime profiling"): every priced iteration reports its sub-batches' *true* times
(:meth:`L3Predictors.observe`); the models refit on their most recent ``window`` samples whenever their data
set has grown to the next size of ``refit_at``, then every ``refit_every`` new samples, so they track the run as
it evolves (the linear model, cheap to fit: the last 1,024 samples every 64; the forests: the last 4,096 samples
at 64, 256, 1,024, 4,096, then every 4,096). Before the first fit, two choices (the paper does not say what the
scheduler uses before "a sufficient amount of data has been collected"): by default the system *seeds* them with
a start-up profile of random sub-batches priced by the same true models (:meth:`L3Predictors.seed`, 384
sub-batches: a profiling pass before serving, like vLLM's); with ``profile_batches = 0`` they start *cold*
(``cold=True``): a model not yet fitted predicts 0, so the stop rule never fires and the first iterations take
the prefills memory allows, until the run's own samples fit the models. Every L3 summary states which
(``predictor_seed_batches``).

Forest predictions are evaluated by :class:`PackedForest` (every tree's nodes in flat arrays, all trees and
inputs traversed at once with numpy): equal to ``RandomForestRegressor.predict`` (tested) and ~50x faster for
the few-row queries the scheduler makes.

:func:`relative_error` is the paper's RE = mean |(Y - Yhat) / Y|; :func:`holdout_error` trains on 80 % of a set
of profiled batches and reports RE on the other 20 %.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["PackedForest", "OnlineRFR", "OnlineLinear", "L3Predictors", "relative_error", "holdout_error",
           "ProfiledBatches", "profiled_sub_batch"]


class PackedForest:
    """A fitted ``RandomForestRegressor`` (or a single tree) for fast prediction of few rows: a plain-Python
    traversal for up to :attr:`PY_ROWS` rows, the trees' compiled traversal summed in scikit-learn's order
    otherwise (skipping ``predict``'s validation and thread pool), or every tree's nodes in flat arrays traversed
    at once with numpy (:meth:`predict_numpy`). All three equal ``RandomForestRegressor.predict`` (tested)."""

    def __init__(self, forest):
        trees = [e.tree_ for e in getattr(forest, "estimators_", [forest])]
        self._trees = trees
        offs = np.cumsum([0] + [t.node_count for t in trees])
        self.roots = offs[:-1].astype(np.int64)
        left, right, feat, thr, val = [], [], [], [], []
        for t, o in zip(trees, offs[:-1]):
            leaf = t.children_left < 0
            left.append(np.where(leaf, np.arange(t.node_count) + o, t.children_left + o))
            right.append(np.where(leaf, np.arange(t.node_count) + o, t.children_right + o))
            feat.append(np.where(leaf, 0, t.feature))
            thr.append(np.where(leaf, np.inf, t.threshold))
            val.append(t.value[:, 0, 0])
        self.left, self.right = np.concatenate(left), np.concatenate(right)
        self.feature, self.threshold = np.concatenate(feat), np.concatenate(thr)
        self.value = np.concatenate(val)
        self.depth = max(int(t.max_depth) for t in trees)
        leaf = self.left == np.arange(len(self.left))
        self._nodes = [(f, v, -1, -1) if lf else (f, t, l, r) for f, t, v, l, r, lf in
                       zip(self.feature.tolist(), self.threshold.tolist(), self.value.tolist(), self.left.tolist(),
                           self.right.tolist(), leaf.tolist())]
        self._roots = self.roots.tolist()

    #: rows up to which a plain Python traversal beats the vectorized one (numpy call overheads)
    PY_ROWS = 8

    def _predict_py(self, X) -> np.ndarray:
        nodes, roots = self._nodes, self._roots
        out = np.empty(len(X))
        for i, x in enumerate(X.astype(np.float64).tolist()):
            s = 0.0
            for n in roots:
                f, t, l, r = nodes[n]
                while l >= 0:
                    f, t, l, r = nodes[l if x[f] <= t else r]
                s += t
            out[i] = s / len(roots)
        return out

    def predict(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=np.float32)            # sklearn compares float32 features to the thresholds
        n = X.shape[0]
        if n <= self.PY_ROWS:
            return self._predict_py(X)
        if self._trees is not None:                    # the trees' own compiled traversal, summed in order
            X = np.ascontiguousarray(X)
            acc = np.zeros(n)
            for t in self._trees:
                acc += t.predict(X).reshape(n, -1)[:, 0]
            return acc / len(self._trees)
        return self.predict_numpy(X)

    def predict_numpy(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=np.float32)
        n = X.shape[0]
        node = np.repeat(self.roots[:, None], n, axis=1)
        cols = np.arange(n)[None, :]
        for _ in range(self.depth):
            x = X[cols, self.feature[node]]
            node = np.where(x <= self.threshold[node], self.left[node], self.right[node])
        return self.value[node].mean(axis=0)


class _Online:
    """Shared sample store and refit schedule."""

    def __init__(self, n_features, refit_at, window, refit_every=None):
        self.n_features = n_features
        self.refit_at = tuple(refit_at)
        self.window = int(window)
        self.refit_every = int(refit_every or window)
        self.X = np.zeros((0, n_features))
        self.y = np.zeros(0)
        self.seen = 0               # samples ever added
        self.fitted_at = 0          # `seen` at the last fit
        self.fits = 0

    def add(self, X, y):
        X = np.asarray(X, dtype=np.float64).reshape(-1, self.n_features)
        y = np.asarray(y, dtype=np.float64).ravel()
        if not len(y):
            return
        self.X = np.vstack([self.X, X])[-self.window:]
        self.y = np.concatenate([self.y, y])[-self.window:]
        self.seen += len(y)
        if self._due():
            self.fit()

    def _due(self):
        if self.fits == 0:
            return self.seen >= self.refit_at[0]
        nxt = [s for s in self.refit_at if s > self.fitted_at]
        return self.seen >= (nxt[0] if nxt else self.fitted_at + self.refit_every)

    @property
    def ready(self) -> bool:
        return self.fits > 0

    def fit(self):
        self._fit(self.X, self.y)
        self.fitted_at = self.seen
        self.fits += 1


class OnlineRFR(_Online):
    """Random-forest regressor retrained on its most recent ``window`` samples as they arrive."""

    def __init__(self, n_features, *, n_estimators=8, max_depth=10, min_samples_leaf=1, seed=0,
                 refit_at=(64, 256, 1024, 4096), window=4096):
        super().__init__(n_features, refit_at, window)
        self.params = dict(n_estimators=n_estimators, max_depth=max_depth, min_samples_leaf=min_samples_leaf,
                           random_state=seed, n_jobs=1)
        self.forest = None
        self.packed = None
        self._memo = {}

    def _fit(self, X, y):
        from sklearn.ensemble import RandomForestRegressor
        self.forest = RandomForestRegressor(**self.params).fit(X, y)
        self.packed = PackedForest(self.forest)
        self._memo = {}

    def predict(self, X) -> np.ndarray:
        if self.packed is None:
            raise RuntimeError("OnlineRFR.predict before the first fit (seed the predictors first)")
        X = np.asarray(X, dtype=np.float64)
        if len(X) == 1:                                  # single rows repeat often between refits: memoized
            key = tuple(X[0].tolist())
            v = self._memo.get(key)
            if v is None:
                if len(self._memo) > 200_000:
                    self._memo.clear()
                v = self._memo[key] = float(self.packed.predict(X)[0])
            return np.array([v])
        return self.packed.predict(X)


class OnlineLinear(_Online):
    """Linear model with intercept (scikit-learn ``LinearRegression``), retrained online. Fitted by weighted least
    squares with weights ``1 / y^2`` (``relative=True``, default): it minimizes the squared *relative* error, the
    scheduler's and the paper's metric, so short PIM phases (a few decodes, start-up) are predicted as well as
    long ones."""

    def __init__(self, n_features, *, refit_at=(16, 64, 256), window=1024, refit_every=64, relative=True):
        super().__init__(n_features, refit_at, window, refit_every)
        self.coef = None
        self.intercept = 0.0
        self.relative = bool(relative)

    def _fit(self, X, y):
        from sklearn.linear_model import LinearRegression
        w = 1.0 / np.maximum(np.abs(y), 1e-12) ** 2 if self.relative else None
        m = LinearRegression().fit(X, y, sample_weight=w)
        self.coef, self.intercept = np.asarray(m.coef_, dtype=np.float64), float(m.intercept_)

    def predict(self, X) -> np.ndarray:
        if self.coef is None:
            raise RuntimeError("OnlineLinear.predict before the first fit (seed the predictors first)")
        return np.asarray(X, dtype=np.float64).reshape(-1, self.n_features) @ self.coef + self.intercept


class L3Predictors:
    """The three models of eqs. 5-6 behind the interface :mod:`host.l3.scheduler` uses."""

    def __init__(self, *, seed=0, n_estimators=8, max_depth=10, window=4096, cold=False):
        self.cold = bool(cold)          # an unfitted model predicts 0 instead of raising (module docstring)
        self.pim = OnlineLinear(3)
        self.rfr_p = OnlineRFR(2, n_estimators=n_estimators, max_depth=max_depth, seed=seed, window=window)
        self.rfr_batch = OnlineRFR(2, n_estimators=n_estimators, max_depth=max_depth, seed=seed + 1,
                                   window=window)

    # --- the scheduler's interface -------------------------------------------------------------------------
    def t_pim(self, sum_fd, n_d, sum_cp_other):
        """Predicted T_PIM of a sub-batch (eq. 5); vectorized over ``sum_cp_other``."""
        m = self.pim
        if m.coef is None and self.cold:
            return 0.0 if np.ndim(sum_cp_other) == 0 else np.zeros(np.shape(sum_cp_other))
        if m.coef is None:
            raise RuntimeError("OnlineLinear.predict before the first fit (seed the predictors first)")
        a, b, k = m.coef
        out = np.maximum(a * float(sum_fd) + b * float(n_d) + k * np.asarray(sum_cp_other, dtype=np.float64)
                         + m.intercept, 0.0)
        return float(out) if out.ndim == 0 else out

    def t_p(self, chunks, done) -> np.ndarray:
        """Predicted prefill-attention time of each prefill request (RFR_p), vectorized."""
        c = np.asarray(chunks, dtype=np.float64).ravel()
        if not len(c):
            return np.zeros(0)
        if self.cold and self.rfr_p.packed is None:
            return np.zeros(len(c))
        X = np.empty((len(c), 2))
        X[:, 0], X[:, 1] = c, np.asarray(done, np.float64).ravel()
        return np.maximum(self.rfr_p.predict(X), 0.0)

    def t_batch(self, prefill_tokens, n_d) -> np.ndarray:
        """Predicted batched-FC time of a sub-batch (RFR_batch) over ``sum c_p`` prefill tokens and ``n_d``
        decodes; vectorized over ``prefill_tokens``."""
        t = np.asarray(prefill_tokens, dtype=np.float64).ravel()
        if self.cold and self.rfr_batch.packed is None:
            return np.zeros(len(t))
        X = np.empty((len(t), 2))
        X[:, 0], X[:, 1] = t, float(n_d)
        return np.maximum(self.rfr_batch.predict(X), 0.0)

    def t_gpu(self, chunks, done, n_d) -> float:
        chunks = np.asarray(chunks)
        return float(self.t_p(chunks, done).sum() + self.t_batch([chunks.sum()], n_d)[0])

    # --- training ------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.pim.ready and self.rfr_p.ready and self.rfr_batch.ready

    def observe(self, batches) -> None:
        """Add profiled sub-batches (:class:`ProfiledBatches`) and refit what is due."""
        self.pim.add(batches.pim_X, batches.pim_y)
        if len(batches.p_y):
            self.rfr_p.add(batches.p_X, batches.p_y)
        self.rfr_batch.add(batches.batch_X, batches.batch_y)

    def seed(self, batches) -> None:
        """Start-up profile: add ``batches`` and fit every model now."""
        self.observe(batches)
        for m in (self.pim, self.rfr_p, self.rfr_batch):
            if not m.ready:
                m.fit()

    def state(self) -> dict:
        return {"pim_samples": self.pim.seen, "rfr_p_samples": self.rfr_p.seen,
                "rfr_batch_samples": self.rfr_batch.seen,
                "fits": self.pim.fits + self.rfr_p.fits + self.rfr_batch.fits}


@dataclass
class ProfiledBatches:
    """True times of profiled sub-batches, as the predictors learn them.

    ``pim_X`` (n, 3) = (sum f_d, len f_d, sum c_p of the other sub-batch) -> ``pim_y`` = T_PIM;
    ``p_X`` (m, 2) = (chunk, finished tokens) of each prefill request -> ``p_y`` = its prefill attention time;
    ``batch_X`` (n, 2) = (sum c_p, len f_d) -> ``batch_y`` = batched FC time; ``gpu_y`` = T_GPU of the sub-batch
    and ``p_owner`` (m,) the sub-batch row each prefill belongs to (for the RE of T_GPU as a whole)."""

    pim_X: np.ndarray
    pim_y: np.ndarray
    p_X: np.ndarray
    p_y: np.ndarray
    batch_X: np.ndarray
    batch_y: np.ndarray
    gpu_y: np.ndarray
    p_owner: np.ndarray

    def __len__(self):
        return len(self.pim_y)

    @classmethod
    def empty(cls):
        z2, z3 = np.zeros((0, 2)), np.zeros((0, 3))
        return cls(z3, np.zeros(0), z2, np.zeros(0), z2, np.zeros(0), np.zeros(0), np.zeros(0, np.int64))

    @classmethod
    def concat(cls, parts):
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        offs = np.cumsum([0] + [len(p) for p in parts[:-1]])
        return cls(np.vstack([p.pim_X for p in parts]), np.concatenate([p.pim_y for p in parts]),
                   np.vstack([p.p_X for p in parts]), np.concatenate([p.p_y for p in parts]),
                   np.vstack([p.batch_X for p in parts]), np.concatenate([p.batch_y for p in parts]),
                   np.concatenate([p.gpu_y for p in parts]),
                   np.concatenate([p.p_owner + o for p, o in zip(parts, offs)]))

    def subset(self, rows):
        rows = np.asarray(rows, dtype=np.int64)
        remap = np.full(len(self), -1, np.int64)
        remap[rows] = np.arange(len(rows))
        keep = remap[self.p_owner] >= 0
        return ProfiledBatches(self.pim_X[rows], self.pim_y[rows], self.p_X[keep], self.p_y[keep],
                               self.batch_X[rows], self.batch_y[rows], self.gpu_y[rows], remap[self.p_owner[keep]])


def profiled_sub_batch(*, sum_fd: float, n_d: int, sum_cp_other: float, t_pim: float, chunks, done, t_p_each,
                       t_fc: float, t_gpu: float | None = None) -> ProfiledBatches:
    """One profiled sub-batch as the predictors learn it (eqs. 5-6): the targets every system that uses
    :class:`L3Predictors` trains them on (L3's :class:`host.l3.systems.L3System`, the end-to-end hybrid).

    ``sum_fd``, ``n_d``: its decodes' summed context and count; ``sum_cp_other``: the other sub-batch's prefill
    tokens (offloaded meanwhile); ``t_pim``: T_PIM, the Linear model's target. ``chunks``, ``done``: its prefill
    requests' chunks and finished tokens; ``t_p_each``: each one's prefill-attention time, RFR_p's target (per
    request); ``t_fc``: the sub-batch's batched FC time, RFR_batch's target, i.e. T_GPU less its prefills'
    attention; ``t_gpu``: T_GPU as the system timed it (for the RE of T_GPU as a whole; default ``t_fc`` plus the
    prefills' attention). ``RFR_p`` summed over the prefills plus ``RFR_batch`` predicts T_GPU (eq. 6): a
    system must not give either model the whole T_GPU."""
    c = np.asarray(chunks, float).ravel()
    tp = np.asarray(t_p_each, float).ravel()
    if len(tp) != len(c):
        raise ValueError(f"profiled_sub_batch: {len(c)} prefill chunks, {len(tp)} prefill-attention times")
    if t_gpu is None:
        t_gpu = float(t_fc) + float(tp.sum())
    return ProfiledBatches(
        pim_X=np.array([[float(sum_fd), n_d, float(sum_cp_other)]]), pim_y=np.array([t_pim]),
        p_X=np.stack([c, np.asarray(done, float).ravel()], axis=1).reshape(-1, 2), p_y=tp,
        batch_X=np.array([[float(c.sum()), n_d]]), batch_y=np.array([t_fc]), gpu_y=np.array([t_gpu]),
        p_owner=np.zeros(len(c), np.int64))


def relative_error(y, yhat) -> float:
    """RE = mean |(Y - Yhat) / Y| (L3 5.3 / 6.1 set-up)."""
    y, yhat = np.asarray(y, dtype=np.float64), np.asarray(yhat, dtype=np.float64)
    if np.any(y <= 0):
        raise ValueError("relative_error: every true latency Y must be > 0")
    return float(np.mean(np.abs((y - yhat) / y)))


def holdout_error(batches: ProfiledBatches, *, train_frac=0.8, seed=0, **predictor_kw) -> dict:
    """Train fresh predictors on ``train_frac`` of ``batches`` (random split, seeded) and report RE on the rest:
    ``re_pim`` (Linear), ``re_gpu`` (RFR_p + RFR_batch per sub-batch), ``re_batch`` (RFR_batch alone),
    ``re_p`` (RFR_p per prefill request), with the counts."""
    n = len(batches)
    if n < 10:
        raise ValueError(f"holdout_error needs at least 10 profiled batches, got {n}")
    perm = np.random.default_rng(seed).permutation(n)
    k = int(round(train_frac * n))
    tr, te = batches.subset(np.sort(perm[:k])), batches.subset(np.sort(perm[k:]))
    pred = L3Predictors(seed=seed, window=max(n, 1), **predictor_kw)
    pred.seed(tr)
    pim_hat = pred.pim.predict(te.pim_X)
    batch_hat = pred.rfr_batch.predict(te.batch_X)
    p_hat = pred.rfr_p.predict(te.p_X) if len(te.p_y) else np.zeros(0)
    gpu_hat = batch_hat + np.bincount(te.p_owner, weights=p_hat, minlength=len(te))
    out = {"n_batches": n, "n_train": len(tr), "n_test": len(te),
           "re_pim": relative_error(te.pim_y, pim_hat), "re_gpu": relative_error(te.gpu_y, gpu_hat),
           "re_batch": relative_error(te.batch_y, batch_hat)}
    if len(te.p_y):
        out["re_p"] = relative_error(te.p_y, p_hat)
        out["n_test_prefills"] = int(len(te.p_y))
    return out
