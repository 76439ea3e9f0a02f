"""The verdict of ``ndpim compare``, generated from the table: for every workload and metric the system that wins
and the one after it, each claim citing the rows that show it (``R07``), PLoRA against L3 head to head, and each
paper's strongest baseline.

**Who competes.** On a multi-LoRA workload (more than one adapter) the winner is found among the systems that serve
it as posed, adapters included: the PLoRA host's and the hybrid's. The L3 host has no adapter path, so its rows there are the same
requests *without* their LoRA work; they get their own claim ("without adapters"), never the win. On the
single-model workload every system competes (the PLoRA host's rows carry one rank-8 adapter, a small handicap).
Two values within :data:`TIE_REL` of each other are a tie (design choice: the grid's numbers come from one seed;
closer than 1 % is not a difference this table can show). :func:`check` re-derives every claim from a table, so a
claim that a table does not support is found (tests/host/test_compare.py mutates the table and sees the claim flip).

The mechanism behind each result is explained by hand in docs/compare.md; here only what the numbers say.
"""

import math

__all__ = ["METRICS", "claims", "check", "render", "strongest_baselines", "numeric"]

#: column -> (label, better: "low" / "high")
METRICS = {
    "tpot_ms_matched": ("TPOT at matched batch (ms)", "low"),
    "tpot_ms_mean": ("TPOT as served, mean (ms)", "low"),
    "tbt_ms_p99": ("TBT as served, p99 (ms)", "low"),
    "goodput_tok_s": ("throughput at the latency SLO (tok/s)", "high"),
    "throughput_tok_s": ("throughput as served (tok/s)", "high"),
    "ttft_s_mean": ("TTFT as served, mean (s)", "low"),
    "mean_batch": ("batch size as served, mean (requests)", "high"),
    "gpu_mem_gb": ("GPU memory, peak (GB)", "low"),
    "link_gb_max": ("bytes over the links, upper bound (GB)", "low"),
    "energy_per_token_mj": ("energy per token (mJ)", "low"),
    "cost_usd_per_mtok": ("cost per million tokens at the SLO (US$)", "low"),
}
#: Design choice (module docstring): values within 1 % are a tie.
TIE_REL = 0.01
_WORDS = {"low": "lowest", "high": "highest"}


def numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _multi_lora(rows, workload) -> bool:
    return any(r["workload"] == workload and numeric(r.get("adapters")) and r["adapters"] > 1 for r in rows)


def _ranked(rows, workload, metric, hosts=None):
    cand = [r for r in rows if r["workload"] == workload and r.get("status") in ("served", "partial")
            and numeric(r.get(metric)) and (hosts is None or r["host"] in hosts)]
    if metric == "goodput_tok_s":
        cand = [r for r in cand if r[metric] > 0]
    sign = 1.0 if METRICS[metric][1] == "low" else -1.0
    return sorted(cand, key=lambda r: (sign * r[metric], r["row"]))


def _tied(a, b):
    return abs(a - b) <= TIE_REL * max(abs(a), abs(b), 1e-30)


def _workloads(rows):
    out = []
    for r in rows:
        if r["workload"] not in out:
            out.append(r["workload"])
    return out


def strongest_baselines(rows) -> dict:
    """{(workload, paper): row} -- the paper's baseline with the highest throughput at the SLO, then as served."""
    out = {}
    for w in _workloads(rows):
        for paper in ("PLoRA", "L3"):
            cand = [r for r in rows if r["workload"] == w and r["paper"] == paper and r["role"] == "baseline"
                    and r.get("status") in ("served", "partial")]
            if cand:
                key = lambda r: (r["goodput_tok_s"] if numeric(r.get("goodput_tok_s")) else -1.0,  # noqa: E731
                                 r["throughput_tok_s"] if numeric(r.get("throughput_tok_s")) else -1.0)
                out[(w, paper)] = max(cand, key=key)
    return out


def _winner_claim(rows, w, metric, label, better, kind, hosts, what):
    ranked = _ranked(rows, w, metric, hosts)
    if not ranked:
        return None
    best = ranked[0]
    ties = [r for r in ranked[1:] if _tied(r[metric], best[metric])]
    rest = [r for r in ranked[1:] if r not in ties]
    winners = [best] + ties
    c = {"kind": kind, "workload": w, "metric": metric, "winners": [r["system"] for r in winners],
         "value": best[metric], "rows": [r["row"] for r in winners]}
    names = " and ".join(f"{r['system']} ({r['row']})" for r in winners)
    text = (f"**{w}**, {label}{what}: {_WORDS[better]} {names} at {best[metric]:.4g}"
            + (f" (within {100 * TIE_REL:g} %: a tie)" if ties else ""))
    if rest:
        nxt = rest[0]
        c.update(runner_up=nxt["system"], runner_value=nxt[metric])
        c["rows"].append(nxt["row"])
        if best[metric]:
            ratio = nxt[metric] / best[metric]
            text += f"; next {nxt['system']} ({nxt['row']}) at {nxt[metric]:.4g} ({ratio:.3g}x)"
        else:
            text += f"; next {nxt['system']} ({nxt['row']}) at {nxt[metric]:.4g}"
    if metric == "link_gb_max":
        text += (" (the PLoRA host's figures are upper bounds from link busy time; the L3 host's and the hybrid's "
                 "are the bytes they moved)")
    if metric == "tpot_ms_matched":
        cited = winners + rest[:1]
        text += " [mean batch reached: " + ", ".join(
            f"{r['system']} {r['batch_matched']:.3g}" for r in cited if numeric(r.get("batch_matched"))) \
            + f" of {cited[0].get('matched_batch_target', '?')} clients; mean batches that differ mean the TPOTs " \
                "are not at one batch]"
    c["text"] = text
    return c


def claims(rows) -> list:
    """Every claim the table supports (dicts; ``text`` is the sentence, ``rows`` the rows it cites)."""
    out = []
    for w in _workloads(rows):
        multi = _multi_lora(rows, w)
        groups = [("winner", ("plora", "hybrid") if multi else None, "")]
        if multi:
            groups.append(("winner-no-lora", ("l3",), " without adapters (L3 host, no LoRA path; not the workload "
                                                       "as posed)"))
        for metric, (label, better) in METRICS.items():
            for kind, hosts, what in groups:
                c = _winner_claim(rows, w, metric, label, better, kind, hosts, what)
                if c is not None:
                    out.append(c)
        for metric in ("goodput_tok_s", "tpot_ms_matched"):
            p = [r for r in rows if r["workload"] == w and r["system"] == "plora" and numeric(r.get(metric))]
            l3 = [r for r in rows if r["workload"] == w and r["system"] == "l3" and numeric(r.get(metric))]
            if p and l3:
                p, l3 = p[0], l3[0]
                label, better = METRICS[metric]
                if _tied(p[metric], l3[metric]):
                    win = "tie"
                else:
                    lo = p if p[metric] < l3[metric] else l3
                    win = lo["system"] if better == "low" else ({"plora", "l3"} - {lo["system"]}).pop()
                out.append({"kind": "head-to-head", "workload": w, "metric": metric, "winners": [win],
                            "rows": [p["row"], l3["row"]], "value": (p[metric], l3[metric]),
                            "text": f"**{w}**, PLoRA vs L3 on {label}: plora ({p['row']}) {p[metric]:.4g}, "
                                    f"l3 ({l3['row']}) {l3[metric]:.4g}: "
                                    + ("a tie" if win == "tie" else f"{win} wins")
                                    + (" (the l3 row carries no LoRA work: the L3 host has no adapter path)"
                                       if _multi_lora(rows, w) else "")})
    for (w, paper), r in strongest_baselines(rows).items():
        gp = r.get("goodput_tok_s")
        out.append({"kind": "strongest-baseline", "workload": w, "metric": "goodput_tok_s", "paper": paper,
                    "winners": [r["system"]], "rows": [r["row"]],
                    "text": f"**{w}**, strongest {paper} baseline: {r['system']} ({r['row']}; "
                            f"{gp:.4g} tok/s at the SLO, {r['throughput_tok_s']:.4g} as served)"
                    if numeric(gp) and numeric(r.get("throughput_tok_s")) else
                    f"**{w}**, strongest {paper} baseline: {r['system']} ({r['row']})"})
    return out


def check(claim_list, rows) -> list:
    """The claims of ``claim_list`` that ``rows`` does not support (empty: every claim holds)."""
    fresh = {(c["kind"], c["workload"], c["metric"], c.get("paper")): c for c in claims(rows)}
    bad = []
    for c in claim_list:
        f = fresh.get((c["kind"], c["workload"], c["metric"], c.get("paper")))
        if f is None or f["winners"] != c["winners"] or f["rows"][:len(c["winners"])] != c["rows"][:len(c["winners"])]:
            bad.append(c)
    return bad


def render(rows, setup: dict) -> str:
    """verdict.md: every claim, grouped by workload, then the absent and failed points."""
    cl = claims(rows)
    lines = ["# ndpim compare: verdict (generated from table.csv)", "",
             f"GPU budget at every point: {setup['gpu_budget']}; model: {setup['model']}. "
             f"SLO: TTFT <= {setup['slo']['ttft_s']:g} s (open-loop workloads only), TPOT <= "
             f"{setup['slo']['tpot_ms']:g} ms. Every claim names the rows of table.csv / table.md that show it. "
             "Why each result comes out as it does: docs/compare.md.", ""]
    for w in _workloads(rows):
        lines += [f"## {w}", ""]
        lines += [f"- {c['text']}" for c in cl if c["workload"] == w]
        lines.append("")
    gone = [r for r in rows if r.get("status") in ("absent", "failed", "partial")]
    if gone:
        lines += ["## Absent, failed and partial points", ""]
        lines += [f"- {r['row']} {r['workload']} / {r['system']}: {r['status']}: {r.get('reason', '')}" for r in gone]
        lines.append("")
    return "\n".join(lines)
