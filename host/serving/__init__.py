"""The serving engine shared by every system (PLoRA, L3, baselines).

Public API (stable names; extend compatibly):

* requests: :class:`Request`, :class:`RequestTable` (columnar state), states PENDING / WAITING / RUNNING /
  FINISHED;
* batches: :class:`Batch`, and what a system returns: :class:`IterationResult`, :class:`RunResult`,
  :class:`Span` (trace lanes);
* systems: :class:`System` (base class: memory, batch, price), :class:`SchedulerView` (the queues a batcher
  sees), :class:`ContinuousBatcher` (default FCFS continuous batching, optional chunked prefill),
  :class:`KVBudget` (reserve or paged KV accounting), :class:`LinearCostSystem` (trivial example);
* engine: :class:`EngineConfig`, :class:`Engine`, :func:`run` -> :class:`RunOutput` (``.summary``,
  ``.write(dir)``);
* metrics: :class:`TokenGaps` (exact token-gap statistics; RunOutput.gaps), :class:`GapHistogram` (the first
  version's binned collector, kept compatible), :func:`request_metrics`, :func:`summarize`;
* outputs: :func:`write_run_dir`, :func:`write_chrome_trace`.
"""

from host.serving.request import Request, RequestTable, PENDING, WAITING, RUNNING, FINISHED
from host.serving.batch import Batch, IterationResult, RunResult, Span
from host.serving.system import System, SchedulerView, ContinuousBatcher, KVBudget, LinearCostSystem
from host.serving.engine import EngineConfig, Engine, RunOutput, run, as_table
from host.serving.metrics import TokenGaps, GapHistogram, request_metrics, summarize
from host.serving.rundir import write_run_dir
from host.serving.gpu_system import GPUSystem
from host.serving.trace import write_chrome_trace

__all__ = ["Request", "RequestTable", "PENDING", "WAITING", "RUNNING", "FINISHED", "Batch", "IterationResult",
           "RunResult", "Span", "System", "SchedulerView", "ContinuousBatcher", "KVBudget", "LinearCostSystem",
           "EngineConfig", "Engine", "RunOutput", "run", "as_table", "TokenGaps", "GapHistogram", "request_metrics",
           "summarize", "write_run_dir", "write_chrome_trace", "GPUSystem"]
