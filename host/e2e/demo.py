"""``ndpim demo``: the tiny model's requests through the hybrid system, a per-step table, the run directory, a
waveform of one decode step's NDP wave and a one-screen summary with the checks (docs/e2e.md)."""

import json
import sys
import time
from pathlib import Path

import numpy as np

from .run import E2EConfig, run_e2e, compare_logits, reference_check, perf_error, final_kv_of

__all__ = ["demo", "step_table", "summary_lines", "write_waveform"]


def _kb(n):
    return f"{n / 1024:.0f}"


def _sub(sb):
    return " ".join(f"r{rid}" + ("" if kind == "D" else kind) for rid, kind in sb) or "-"


def step_table(system) -> list:
    """The per-step table's lines: sub-batches, strategy per adapter (p: for prompt tokens), device cycles, link
    kilobytes (to / from the device), busy times and the step's duration."""
    n = system.n_dev
    head = (f"{'it':>3} {'sub-batch 0':<16}{'sub-batch 1':<22}{'strategy per adapter':<30}"
            + "".join(f"{f'NDP{d} cyc':>10}" for d in range(n)) + f"{'PIM cyc':>9}"
            + "".join(f"{f'CXL{d} KB':>10}" for d in range(n)) + f"{'PCIe KB':>9}"
            + f"{'GPU us':>8}{'NDP us':>8}{'PIM us':>8}{'step us':>9}")
    lines = [head]
    for s in system.steps:
        strat = " ".join(f"a{a}:{v}" for a, v in s.strategies.items())
        row = (f"{s.iteration:>3} {_sub(s.sub_batches[0]):<16}{_sub(s.sub_batches[1]):<22}{strat:<30}"
               + "".join(f"{c:>10}" for c in s.ndp_cycles) + f"{s.pim_cycles:>9}"
               + "".join(f"{_kb(o) + '/' + _kb(i):>10}" for o, i in s.cxl_bytes)
               + f"{_kb(s.pcie_bytes[0]) + '/' + _kb(s.pcie_bytes[1]):>9}"
               + f"{s.gpu_busy_s * 1e6:>8.1f}{max(s.ndp_busy_s) * 1e6:>8.1f}{s.pim_busy_s * 1e6:>8.1f}"
               + f"{s.duration_s * 1e6:>9.1f}")
        lines.append(row)
    return lines


def write_waveform(system, out: Path, engine: str = "amaranth", fmt: str = "vcd") -> tuple:
    """Re-run the captured wave (layer 0, O-projection stage of the first decode-only iteration) on
    ``engine`` writing a waveform; returns ``(path, description)``."""
    from sim.e2e.waveform import waveform_backend
    from .ndp import NDPDevices, plan_runs
    cap = getattr(system, "captured", None)
    if not cap:
        return None, "no decode-only iteration to capture"
    it, layer, stage, jobs_by_dev = cap
    dev = next((d for d, j in enumerate(jobs_by_dev) if j), None)
    if dev is None:
        return None, "the captured stage had no device work"
    path = out / f"waveform.{fmt}"
    be = waveform_backend(engine, path, fmt)
    ndp = NDPDevices("rtl", system.n_dev, engine=be, config=system.ndp.config, perf=None)
    first = plan_runs(jobs_by_dev[dev], ndp.config, ndp.depth)[0]
    t0 = time.perf_counter()
    w = ndp.run_wave(dev, first)
    kinds = sorted({k.key[1] + ":" + ("E1", "E2", "E3", "E4")[k.key[3]] for k in first})
    return path, (f"iteration {it}, layer {layer}, stage {stage}, NDP device {dev}: {w.descriptors} descriptors "
                  f"({', '.join(kinds)}), {w.cycles} cycles, {engine} ({time.perf_counter() - t0:.1f} s)")


def summary_lines(run, checks: dict, wf, wall: dict) -> list:
    sys_, out = run.system, run.output
    s = out.summary
    cfg = run.config
    tiny = sys_.cfg
    L = []
    L.append(f"model      {tiny.name}: {tiny.n_layers} layers, hidden {tiny.hidden}, {tiny.n_heads} heads x "
             f"{tiny.head_dim}, FFN {tiny.ffn}, vocabulary {tiny.vocab}; {len(sys_.adapters)} adapters (ranks "
             f"{sorted(set(int(a.rank) for a in sys_.adapters))}) on every matrix")
    L.append(f"requests   {cfg.requests} ({cfg.requests - cfg.long_requests} short on the NDP devices, "
             f"{cfg.long_requests} long of {cfg.long_context} prompt tokens on the DIMM-PIM) x {cfg.tokens} tokens; "
             f"backend {run.backend}" + (f", DIMM-PIM on {sys_.pim.backend}" if sys_.pim.backend != run.backend
                                          else ""))
    for r in sys_.reqs:
        toks = run.tokens[r.rid] if run.tokens[r.rid] is not None else "(perf backend: timing only, no data)"
        L.append(f"  r{r.rid} (adapter {r.adapter}, rank {sys_.adapters[r.adapter].rank}, prompt {r.prompt_len}, "
                 f"{'PIM' if r.place == 0 else 'NDP'}): {toks}")
    sc = s.get("strategy_counts", {}).get("decisions", {})
    used = {}
    for st in sys_.steps:
        for v in st.strategies.values():
            for x in v.split("+"):
                used[x] = used.get(x, 0) + 1
    L.append(f"serving    {s['output_tokens']} tokens in {s['iterations']} iterations, {s['makespan_s'] * 1e3:.3f} ms "
             f"simulated; TPOT {s['tpot_ms_mean']:.3f} ms, TTFT {s['ttft_s_mean'] * 1e3:.3f} ms")
    L.append(f"decisions  Algorithm 1: " + ", ".join(f"{k} {v}" for k, v in sc.items())
             + f"; used (adapter-iterations, p = prompt tokens): "
             + ", ".join(f"{k} {v}" for k, v in sorted(used.items())))
    tot_ndp = np.sum([st.ndp_cycles for st in sys_.steps], axis=0).astype(int).tolist()
    tot_pim = int(sum(st.pim_cycles for st in sys_.steps))
    L.append(f"devices    NDP cycles {tot_ndp} (1 GHz), PIM cycles {tot_pim} (DDR4-3200, 1.6 GHz); busy GPU "
             f"{s['gpu_busy_frac']:.0%}, NDP {', '.join(f'{x:.0%}' for x in s['ndp_busy_frac'])}, "
             f"PIM {s['pim_busy_frac']:.0%}")
    if "perf" in checks:
        pe = checks["perf"]
        parts = [f"{k}: total {v['total_rel_err']:+.2%}, max per run {v['max_abs_rel_err']:.2%}" for k, v in pe.items()]
        L.append("perf model " + ("; ".join(parts) if parts else "n/a"))
    if "logits" in checks:
        c = checks["logits"]
        L.append(f"logits     rtl vs golden: " + ("bit-exact" if c["equal"] else "DIFFER") +
                 f" ({c['rows']} rows of float32 logits, tokens {'equal' if c['tokens_equal'] else 'differ'})")
    if "reference" in checks:
        c = checks["reference"]
        n = len(c["requests"])
        ok = sum(1 for v in c["requests"].values() if v["tokens_match"])
        L.append(f"reference  float32: tokens match {ok}/{n} requests; top-1 agreement {c['top1_agree']:.1%}, max "
                 f"logit error {c['max_rel_err']:.2e} of the logit range")
    if wf[0] is not None:
        L.append(f"waveform   {wf[0]} ({wf[1]})")
    L.append(f"run dir    {wall['out']}: config.json requests.csv iterations.csv summary.json trace.json steps.json "
             f"tokens.json descriptors.csv checks.json")
    L.append(f"wall       {wall['total']:.1f} s" + "".join(f", {k} {v:.1f} s" for k, v in wall.items()
                                                        if k not in ("total", "out")))
    return L


def demo(args) -> int:
    t0 = time.perf_counter()
    cfg = E2EConfig(model=args.model, requests=args.requests, long_requests=args.long, tokens=args.tokens,
                    long_context=args.long_context, budget_kb=args.budget_kb, seed=args.seed,
                    short_prompt=tuple(args.short_prompt), pim_bank_groups=args.pim_bank_groups)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pim_be = args.pim_backend or args.backend
    print(f"ndpim demo: {cfg.requests} requests x {cfg.tokens} tokens on backend {args.backend}"
          + (f" ({args.engine})" if args.backend == "rtl" else "")
          + (f", DIMM-PIM on {pim_be}" if pim_be != args.backend else "") + f", run directory {out}", flush=True)
    wall, checks = {"out": str(out)}, {}
    golden = None
    pim_be = args.pim_backend or args.backend
    if pim_be == "rtl" and cfg.long_requests:          # fail before the golden pass if the rank cannot be built
        from .run import _devices
        from .model import get_tiny
        from .run import make_requests
        tiny = get_tiny(cfg.model)
        try:
            _devices(cfg, args.backend, args.engine, tiny, make_requests(cfg, tiny.vocab)[0],
                     pim_be)[1].check_buildable()
        except RuntimeError as exc:
            print(f"ndpim demo: {exc}", file=sys.stderr)
            return 2
    if "rtl" in (args.backend, pim_be) and (args.check or cfg.long_requests):
        t = time.perf_counter()
        golden = run_e2e(cfg, "golden")
        wall["golden run"] = time.perf_counter() - t
        print(f"  golden run: {wall['golden run']:.1f} s", flush=True)
    t = time.perf_counter()
    run = run_e2e(cfg, args.backend, engine=args.engine, pim_backend=pim_be,
                  final_kv=final_kv_of(golden) if golden is not None else None, capture=args.waveform)
    wall[f"{args.backend} run"] = time.perf_counter() - t
    print(f"  {args.backend} run: {wall[f'{args.backend} run']:.1f} s", flush=True)
    print()
    for line in step_table(run.system):
        print(line)
    print()
    run.write(out)
    if args.check:
        t = time.perf_counter()
        if golden is not None:
            checks["logits"] = compare_logits(run, golden)
        if "rtl" in (args.backend, pim_be):
            checks["perf"] = perf_error(run)
        if args.backend != "perf":
            checks["reference"] = reference_check(run)
        wall["checks"] = time.perf_counter() - t
    (out / "checks.json").write_text(json.dumps(checks, indent=1, default=str) + "\n")
    wf = (None, "")
    if args.waveform and args.backend != "perf" or args.waveform and args.backend == "perf":
        t = time.perf_counter()
        try:
            wf = write_waveform(run.system, out, args.waveform_engine, args.waveform_format)
        except Exception as exc:          # noqa: BLE001 - the run's results stand; say why there is no waveform
            wf = (None, f"failed: {exc}")
            print(f"waveform failed: {exc}", file=sys.stderr)
        wall["waveform"] = time.perf_counter() - t
    wall["total"] = time.perf_counter() - t0
    for line in summary_lines(run, checks, wf, wall):
        print(line)
    bad = ("logits" in checks and not checks["logits"]["equal"])
    return 1 if bad else 0
