"""The L3 host (DIMM-PIM serving, L3 sections 3, 5, 6.1): configurations, DIMM-PIM timing from sim/perf/pim.py,
rankset placement and communication, the two-sub-batch scheduler and its predictors, L3 and its baselines on
host-core's serving engine, traces, runs, sweeps, figures and the ``ndpim l3`` commands. See docs/l3_host.md.

Entry points: :func:`host.l3.run.run_l3` (one run), :mod:`host.l3.sweep` (grids), :mod:`host.l3.figures`,
:func:`host.l3.bench.run_grid`, :mod:`host.l3.cli` (``add_parser``)."""
