"""``ndpim gpu``: predict Vidur-format profiles, (re)calibrate, and print the held-out error table."""

import argparse
from pathlib import Path

import numpy as np

__all__ = ["add_parser", "cmd_predict", "cmd_calibrate", "cmd_holdout"]


def _profile_csv(text):
    """argparse ``type``: a readable Vidur ``mlp.csv`` whose shape columns (and measured medians) are numeric and
    pass :func:`host.gpu.profiles.read_profile`'s checks; kept as the path given."""
    import pandas as pd
    from host.gpu.profiles import PROFILE_COLUMNS, read_profile

    def fail(msg):
        return argparse.ArgumentTypeError(f"{text}: " + " ".join(str(msg).split()))
    path = Path(text)
    if not path.is_file():
        raise fail("no such file")
    try:
        df = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise fail(f"not a readable CSV ({' '.join(str(exc).split())})") from None
    missing = [c for c in PROFILE_COLUMNS if c not in df.columns]
    if missing:
        raise fail(f"not a Vidur mlp.csv profile, missing columns {missing}")
    numeric = [c for c in PROFILE_COLUMNS if c != "use_gated_mlp"]
    numeric += [c for c in df.columns if c.startswith("time_stats.") and c.endswith(".median")]
    for c in numeric:
        bad = pd.to_numeric(df[c], errors="coerce").isna().to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise fail(f"column {c} must be numeric, line {i + 2} holds {df[c].iloc[i]!r}")
    try:
        read_profile(path)
    except ValueError as exc:
        raise fail(str(exc).removeprefix(f"{path}: ")) from None
    return text


def _out_csv(text):
    """argparse ``type``: a file to write (not a directory, under no file)."""
    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise argparse.ArgumentTypeError(f"{parent} is a file, not a directory")
    return text


def add_parser(sub) -> None:
    p = sub.add_parser("gpu", help="GPU model: predict operator times, calibrate, held-out errors")
    gsub = p.add_subparsers(dest="gpu_command", required=True)

    q = gsub.add_parser("predict", help="predict time_stats.<op>.median for the rows of a Vidur mlp.csv profile")
    q.add_argument("--gpu", required=True, choices=["a100", "h100"])
    q.add_argument("--profile", required=True, type=_profile_csv, help="input CSV in Vidur's mlp.csv format")
    q.add_argument("--out", required=True, type=_out_csv,
                   help="output CSV: the same rows with predicted medians (ms)")
    q.add_argument("--compare", action="store_true",
                   help="print the mean absolute percentage error per operator against the input's medians")
    q.set_defaults(func=cmd_predict)

    c = gsub.add_parser("calibrate", help="fit the GPU model on data/vidur and write data/gpu_calibration.json")
    c.set_defaults(func=cmd_calibrate)

    h = gsub.add_parser("holdout", help="error on profiles left out of the fit (one model or one GPU at a time)")
    h.set_defaults(func=cmd_holdout)


def _mape_table(title, errs):
    print(title)
    for op, e in errs.items():
        print(f"  {op:<26}{e:>7.1f} %")


def cmd_predict(args):
    from host.gpu.fit import fit, mape_by_op
    from host.gpu.model import GPUModel
    from host.gpu.profiles import VIDUR_PROFILES, read_profile, training_rows

    df = read_profile(args.profile)
    model = GPUModel(args.gpu, allreduce=False)
    pred = model.predict_profile_ops(df)
    measured = {op: df[f"time_stats.{op}.median"].to_numpy(np.float64) * 1e-3 for op in pred
                if f"time_stats.{op}.median" in df.columns}
    out = df.copy()
    for op, t in pred.items():
        out[f"time_stats.{op}.median"] = t * 1e3
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False)
    print(f"wrote {len(out)} rows with predicted medians of {len(pred)} operators to {args.out}")
    if not args.compare:
        return 0
    if not measured:
        raise SystemExit("ndpim gpu predict --compare: the profile has no measured time_stats.<op>.median columns")
    ops = [op for op in measured]
    errs = {op: mape_by_op(pred[op], measured[op], np.full(len(df), op))[op] for op in ops}
    key = next((k for k, p in VIDUR_PROFILES.items() if Path(args.profile).resolve() == p.resolve()), None)
    if key is not None and key[0] != args.gpu:
        print(f"note: {args.profile} was measured on {key[0]}, predicted as {args.gpu}")
    _mape_table(f"MAPE per operator ({args.gpu}, {len(df)} rows"
                f"{', in the calibration fit' if key in model.cal.fitted_on else ', not in the calibration fit'}):",
                errs)
    if key in model.cal.fitted_on:
        rows = training_rows()
        keep = [(g, l) != key for g, l in zip(rows["gpu"], rows["label"])]
        held = GPUModel(args.gpu, calibration=fit(rows[keep]), allreduce=False).predict_profile_ops(df)
        _mape_table("MAPE per operator with this profile left out of the fit:",
                    {op: mape_by_op(held[op], measured[op], np.full(len(df), op))[op] for op in ops})
    return 0


def cmd_calibrate(args):
    import json
    from host.gpu.fit import calibrate
    from host.gpu.model import CALIBRATION_PATH
    cal = calibrate()
    print(json.dumps(cal.to_json()["gemm"], indent=2))
    print(f"wrote {CALIBRATION_PATH}")
    return 0


def cmd_holdout(args):
    from host.gpu.fit import holdout_report
    rep = holdout_report()
    ops = list(next(iter(rep.values())))
    print(f"{'held out':<36}" + "".join(f"{op[:14]:>15}" for op in ops))
    for split, errs in rep.items():
        print(f"{split:<36}" + "".join(f"{errs[op]:>14.1f}%" for op in ops))
    return 0
