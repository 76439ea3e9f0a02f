"""Workloads: seeded request generators (synthetic and from real traces), each a :class:`Workload`.

Every generator takes ``seed`` and returns the same requests for the same arguments; ``Workload.params`` records
the generator and all its arguments (it goes into config.json), ``Workload.notes`` says what was substituted.

* :mod:`host.workloads.synthetic`: arrival processes (all at once, Poisson, gamma with a coefficient of
  variation), adapter popularity (uniform, skewed "80 % of requests to 50 adapters", S-LoRA's power law),
  per-adapter LoRA ranks, the PLoRA workloads (``uniform``, ``skewed``, ``uniform-long``, ``skewed-long``,
  ``powerlaw``) and the L3 traces generated from L3 Table 4 (``openr1``, ``dolphin``, ``openthoughts``,
  ``longbench``);
* :mod:`host.workloads.traces`: arrivals and lengths from the real traces in data/vidur/processed_traces, and
  the LMSYS substitute;
* :mod:`host.workloads.trace_file`: a user's own trace by path (CSV or JSONL, ``--trace-file``; docs/inputs.md).
"""

from host.workloads.base import Workload
from host.workloads.synthetic import (all_at_once, poisson_arrivals, gamma_arrivals, uniform_adapters,
                                      skewed_adapters, powerlaw_adapters, adapter_ranks, uniform_lengths,
                                      lognormal_lengths, plora_workload, l3_trace, PLORA_WORKLOADS, L3_TRACES,
                                      L3_TABLE4)
from host.workloads.traces import TRACES, trace_workload, lmsys_substitute
from host.workloads.trace_file import TraceFileError, TRACE_ERRORS, load_trace_file

__all__ = ["Workload", "all_at_once", "poisson_arrivals", "gamma_arrivals", "uniform_adapters", "skewed_adapters",
           "powerlaw_adapters", "adapter_ranks", "uniform_lengths", "lognormal_lengths", "plora_workload",
           "l3_trace", "PLORA_WORKLOADS", "L3_TRACES", "L3_TABLE4", "TRACES", "trace_workload",
           "lmsys_substitute", "TraceFileError", "TRACE_ERRORS", "load_trace_file"]
