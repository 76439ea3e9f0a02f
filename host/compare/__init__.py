"""``ndpim compare``: one workload set on PLoRA (CXL NDP pool), L3 (DIMM-PIM) and each paper's baselines, on one
GPU budget per point; a table, one figure per metric and a verdict generated from the numbers (docs/compare.md)."""
