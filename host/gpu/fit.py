"""Fitting the GPU model on the measured profiles, and measuring its error on profiles it was not fitted on.

``fit(rows)`` fits the four GEMM parameters (least squares on ``log(predicted / measured)``, i.e. relative
error, over every GEMM row given) and, per element-wise op, ``t0`` and ``e``. ``calibrate()`` fits on every
profile in data/ and writes data/gpu_calibration.json (``ndpim gpu calibrate``). ``holdout_report()`` refits
without one model or one GPU and returns the mean absolute percentage error per operator on the rows left out.
"""

import json
from pathlib import Path

import numpy as np

from host.gpu.model import Calibration, CALIBRATION_PATH, EltParams, GemmParams, soft_roofline
from host.gpu.profiles import DATA_DIR, GEMM_OPS, ELT_OPS, VIDUR_PROFILES, training_rows
from host.models.hardware import get_gpu

__all__ = ["fit", "calibrate", "predict_rows", "mape_by_op", "HOLDOUT_SPLITS", "holdout_report"]


def _hw(rows):
    peak = np.array([get_gpu(g).fp16_tflops * 1e12 for g in rows["gpu"]])
    bw = np.array([get_gpu(g).hbm_bw_gbps * 1e9 for g in rows["gpu"]])
    return peak, bw


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def fit(rows) -> Calibration:
    """Fit on long-format rows (host.gpu.profiles.training_rows)."""
    from scipy.optimize import least_squares
    gem = rows[rows["kind"] == "gemm"]
    if gem.empty:
        raise ValueError("fit: no GEMM rows")
    peak, bw = _hw(gem)
    flops = 2.0 * gem["M"].to_numpy() * gem["K"].to_numpy() * gem["N"].to_numpy()
    nbytes = gem["bytes"].to_numpy()
    t = gem["t_s"].to_numpy()

    def model(x):
        return soft_roofline(flops, nbytes, peak_flops=peak, bw_bytes=bw, t0_s=np.exp(x[0]) * 1e-6,
                             eff_mem=_sig(x[1]), eff_compute=_sig(x[2]), p=np.exp(x[3]))

    x = least_squares(lambda x: np.log(model(x) / t), [np.log(3.0), 1.0, 1.0, 0.3]).x
    gemm = GemmParams(t0_s=float(np.exp(x[0]) * 1e-6), eff_mem=float(_sig(x[1])), eff_compute=float(_sig(x[2])),
                      p=float(np.exp(x[3])))
    elt = {}
    for op in ELT_OPS:
        r = rows[rows["op"] == op]
        if r.empty:
            continue
        _, bw_e = _hw(r)
        b, te = r["bytes"].to_numpy(), r["t_s"].to_numpy()
        y = least_squares(lambda y: np.log((np.exp(y[0]) * 1e-6 + b / (bw_e * np.exp(y[1]))) / te),
                          [np.log(2.0), np.log(0.5)]).x
        elt[op] = EltParams(t0_s=float(np.exp(y[0]) * 1e-6), eff_mem=float(np.exp(y[1])))
    keys = tuple(sorted({(g, l) for g, l in zip(rows["gpu"], rows["label"])}))
    commit = (DATA_DIR / "vidur" / "SOURCE_COMMIT").read_text().split()[0]
    return Calibration(gemm=gemm, elt=elt, fitted_on=keys, source_commit=commit)


def predict_rows(cal: Calibration, rows) -> np.ndarray:
    """Predicted seconds for long-format rows."""
    from host.gpu.model import GPUModel
    out = np.empty(len(rows))
    for gpu in rows["gpu"].unique():
        m = GPUModel(gpu, calibration=cal, allreduce=False)
        sel = (rows["gpu"] == gpu).to_numpy()
        r = rows[sel]
        pred = np.empty(len(r))
        g = (r["kind"] == "gemm").to_numpy()
        pred[g] = m.gemm(r["M"].to_numpy()[g], r["K"].to_numpy()[g], r["N"].to_numpy()[g]).calibrated_s
        for op in r["op"][~g].unique():
            s = (r["op"] == op).to_numpy()
            pred[s] = m.elementwise(op, r["bytes"].to_numpy()[s]).calibrated_s
        out[sel] = pred
    return out


def mape_by_op(pred, measured, ops) -> dict:
    """Mean absolute percentage error per operator name."""
    import pandas as pd
    err = np.abs(np.asarray(pred) / np.asarray(measured) - 1.0) * 100.0
    return {k: float(v) for k, v in pd.Series(err).groupby(np.asarray(ops)).mean().items()}


# name -> (profiles fitted on, profiles tested on)
HOLDOUT_SPLITS = {
    "model: llama2-70b held out": ([("h100", "llama2-7b"), ("a100", "llama2-7b")], [("a100", "llama2-70b")]),
    "model: llama2-7b on a100 held out": ([("h100", "llama2-7b"), ("a100", "llama2-70b")], [("a100", "llama2-7b")]),
    "gpu: h100 held out": ([("a100", "llama2-7b"), ("a100", "llama2-70b")], [("h100", "llama2-7b")]),
    "gpu: a100 held out": ([("h100", "llama2-7b")], [("a100", "llama2-7b"), ("a100", "llama2-70b")]),
}


def holdout_report(splits: dict | None = None) -> dict:
    """split name -> {op: MAPE %} on the held-out profiles (GEMMs and element-wise ops)."""
    rows = training_rows()
    out = {}
    for name, (train, test) in (splits or HOLDOUT_SPLITS).items():
        tr = rows[[(g, l) in train for g, l in zip(rows["gpu"], rows["label"])]]
        te = rows[[(g, l) in test for g, l in zip(rows["gpu"], rows["label"])]]
        cal = fit(tr)
        out[name] = mape_by_op(predict_rows(cal, te), te["t_s"].to_numpy(), te["op"].to_numpy())
    return out


def calibrate(path: Path | None = None) -> Calibration:
    """Fit on every profile in data/ and write the calibration file."""
    cal = fit(training_rows())
    path = Path(path or CALIBRATION_PATH)
    path.write_text(json.dumps(cal.to_json(), indent=2) + "\n")
    return cal
