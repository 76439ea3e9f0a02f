"""``ndpim bench e2e``: the end-to-end run's speed per backend and its model-vs-RTL error; writes
build/bench/e2e.json (``wall_s`` per backend, ``iterations``, ``tokens``, ``sim_time_ms``, and with ``--rtl``
``ndp_model_rtl_total_rel_err``, ``ndp_model_rtl_max_rel_err``, ``pim_model_rtl_total_rel_err``,
``pim_model_rtl_max_rel_err``, ``logits_bitexact``)."""

import argparse
import json
import time
from pathlib import Path

from .run import E2EConfig, run_e2e, compare_logits, perf_error, final_kv_of


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ndpim bench e2e", description=__doc__.splitlines()[0])
    ap.add_argument("--rtl", action="store_true", help="also run the rtl backend (Verilator builds on first use)")
    ap.add_argument("--model", default="tiny", choices=["tiny", "micro"])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--out", default="build/bench/e2e.json")
    args = ap.parse_args(argv)
    cfg = E2EConfig(model=args.model, tokens=args.tokens)
    res = {"config": cfg.__dict__}
    runs = {}
    for be in ("perf", "golden") + (("rtl",) if args.rtl else ()):
        t = time.perf_counter()
        kw = {"final_kv": final_kv_of(runs["golden"])} if be == "rtl" and cfg.long_requests else {}
        runs[be] = r = run_e2e(cfg, be, **kw)
        s = r.output.summary
        res[be] = {"wall_s": round(time.perf_counter() - t, 2), "iterations": s["iterations"],
                   "tokens": s["output_tokens"], "sim_time_ms": s["makespan_s"] * 1e3,
                   "tpot_ms": s["tpot_ms_mean"]}
        print(f"{be:<7} wall {res[be]['wall_s']:7.1f} s   {s['iterations']} iterations, {s['output_tokens']} tokens, "
              f"{s['makespan_s'] * 1e3:.3f} ms simulated, TPOT {s['tpot_ms_mean']:.3f} ms", flush=True)
    if "rtl" in runs:
        pe = perf_error(runs["rtl"])
        for k, v in pe.items():
            res[f"{k}_model_rtl_total_rel_err"] = v["total_rel_err"]
            res[f"{k}_model_rtl_max_rel_err"] = v["max_abs_rel_err"]
            print(f"{k}: model vs rtl total {v['total_rel_err']:+.2%}, max per run {v['max_abs_rel_err']:.2%} "
                  f"over {v['waves']} runs")
        c = compare_logits(runs["rtl"], runs["golden"])
        res["logits_bitexact"] = bool(c["equal"])
        print(f"logits rtl vs golden: {'bit-exact' if c['equal'] else 'DIFFER'} ({c['rows']} rows)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0
