"""The Pareto front of ``ndpim dse``: over feasible points (priced and within every budget), maximising both
throughput per mm^2 and throughput per W. A point is on the front when no other feasible point is at least as
good on both and strictly better on one (it is *dominated* otherwise)."""

__all__ = ["dominates", "pareto_front", "apply_budgets", "OBJECTIVES"]

#: (column, direction): both maximised.
OBJECTIVES = ("tok_s_per_mm2", "tok_s_per_w")


def dominates(a: dict, b: dict, keys=OBJECTIVES) -> bool:
    """``a`` is at least as good as ``b`` on every key and strictly better on one (all maximised)."""
    return all(a[k] >= b[k] for k in keys) and any(a[k] > b[k] for k in keys)


def pareto_front(rows: list, keys=OBJECTIVES) -> list:
    """Indices of the rows no other row dominates (order kept; equal rows are all on the front)."""
    return [i for i, r in enumerate(rows) if not any(dominates(q, r, keys) for j, q in enumerate(rows) if j != i)]


def apply_budgets(rows: list, area_mm2=None, power_w=None) -> None:
    """Mark each priced row ``feasible`` or ``excluded`` (with the budget it exceeds), in place."""
    for r in rows:
        if r["status"] != "priced":
            r["budget"] = "not priced"
            continue
        over = []
        if area_mm2 is not None and r["area_mm2"] > area_mm2:
            over.append(f"area {r['area_mm2']:.4g} mm^2 > budget {area_mm2:g}")
        if power_w is not None and r["power_w"] > power_w:
            over.append(f"power {r['power_w']:.4g} W > budget {power_w:g}")
        r["budget"] = "excluded: " + "; ".join(over) if over else "feasible"
