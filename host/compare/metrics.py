"""Derived metrics of ``ndpim compare``: throughput at a latency SLO, GPU memory, link traffic, energy and cost per
million tokens. Every constant has its source; a value a run does not report is :data:`NOT_REPORTED`, never a
number made up here.

**Throughput at a latency SLO** (goodput, DistServe's definition: Zhong et al., OSDI 2024, "goodput: the maximum
request rate ... under SLO attainment"; here the tokens per second of the requests that meet it): the output
tokens of the requests whose TTFT <= ``slo_ttft_s`` and TPOT <= ``slo_tpot_ms`` (host.serving.metrics
``request_metrics``, per request), over the run's makespan. Default SLO: MLPerf Inference v5.0's interactive LLM
scenario (Llama-2-70B: p99 TTFT 450 ms, p99 TPOT 40 ms; mlcommons.org/2025/04/llm-inference-v5); the options
change it. An offline workload (every request at t = 0, L3 6.1) has no per-request TTFT target: its TTFT is queueing
for the whole batch, so only TPOT is checked there (stated in the table's ``slo`` column).

**Cost per million tokens**: ``(GPU $/h + added memory $/h) / (throughput tok/s * 3600) * 1e6``.

* GPU: :data:`GPU_USD_PER_HOUR` -- H100 SXM 80 GB on demand, the low end of "$2.49 - $3.99 / hr" (typical list
  prices across CoreWeave, Lambda, Crusoe, RunPod, early 2026; pricegpu.pages.dev/blog/h100-vs-a100-cloud-price).
  The instance price includes its host (CPU and host DRAM), so S-LoRA's, CPU-LoRA-Offload's and NEO's host memory
  adds nothing.
* Added memory devices: :data:`DRAM_USD_PER_GB` -- a 16 x 256 GB DDR5-6400 ECC RDIMM kit at $76,999 (NEMIX, reported
  2025-12-29 by tuttotech.net / techpowerup: "quasi 20 dollari per gigabyte") = $18.80 / GB, amortised straight-line
  over :data:`AMORTISATION_YEARS` (design choice: 3 years, the depreciation term of the "3-year TCO" of server GPUs,
  mercatus-ai.com/blog/cloud-gpu-pricing), 24 h a day. PLoRA's pool (4 x 512 GB CXL devices, PLoRA VII-A) and L3's
  DIMM-PIM (2 TiB, L3 Table 2) are priced as that DRAM alone: neither CXL-PNM nor DIMM-PIM has a public price, so the
  NDP / PIM logic is not in the number (a lower bound on both systems' cost, stated in the table).

**Energy per token**: ``energy_per_token_mj`` from the run's summary (the energy model, GPU power sourced, on
another branch); absent: :data:`NOT_REPORTED`.

**Link traffic**: the runs report how long each link was busy (PLoRA iterations: ``link_busy_s`` on the CXL link,
S-LoRA ``pcie_busy_s`` on PCIe), not bytes; ``link_gb_max`` = busy seconds x the link's bandwidth is the most that
can have crossed it (an upper bound: a transfer's latency is counted as if it moved data). The L3 host reports
neither: :data:`NOT_REPORTED`.
"""

import math

import numpy as np

__all__ = ["NOT_REPORTED", "SLO_TTFT_S", "SLO_TPOT_MS", "GPU_USD_PER_HOUR", "DRAM_USD_PER_GB", "AMORTISATION_YEARS",
           "goodput", "cost_per_mtok", "SOURCES"]

NOT_REPORTED = "not reported by this run"
#: MLPerf Inference v5.0 interactive scenario (Llama-2-70B): p99 TTFT 450 ms, p99 TPOT 40 ms
#: (mlcommons.org/2025/04/llm-inference-v5).
SLO_TTFT_S = 0.450
SLO_TPOT_MS = 40.0
#: H100 SXM 80 GB on demand, low end of $2.49 - $3.99 / h (pricegpu.pages.dev/blog/h100-vs-a100-cloud-price, early
#: 2026 list prices of CoreWeave, Lambda, Crusoe, RunPod).
GPU_USD_PER_HOUR = 2.49
#: $76,999 / (16 x 256 GB) DDR5-6400 ECC RDIMM (NEMIX kit, reported 2025-12-29, tuttotech.net / techpowerup).
DRAM_USD_PER_GB = 76999.0 / (16 * 256)
#: Design choice: 3-year straight-line amortisation (mercatus-ai.com/blog/cloud-gpu-pricing: "3-Year TCO").
AMORTISATION_YEARS = 3.0
HOURS_PER_YEAR = 365.0 * 24.0

SOURCES = {
    "slo": "MLPerf Inference v5.0 interactive (Llama-2-70B): p99 TTFT 450 ms, p99 TPOT 40 ms "
           "(https://mlcommons.org/2025/04/llm-inference-v5)",
    "goodput": "DistServe (Zhong et al., OSDI 2024): goodput = throughput of requests meeting the SLO",
    "gpu_price": "H100 SXM 80 GB on demand $2.49/h, low end of $2.49-$3.99/h, early 2026 "
                 "(https://pricegpu.pages.dev/blog/h100-vs-a100-cloud-price)",
    "dram_price": "$76,999 for 16 x 256 GB DDR5-6400 RDIMM = $18.80/GB (NEMIX kit, tuttotech.net 2025-12-29, "
                  "after techpowerup)",
    "amortisation": "3 years straight line, 24 h/day (design choice; 3-year TCO, "
                    "https://www.mercatus-ai.com/blog/cloud-gpu-pricing)",
    "energy": "energy_per_token_mj of each run's summary.json (the project's energy model); absent: not reported",
}


def goodput(table, makespan_s: float, *, slo_ttft_s: float = SLO_TTFT_S, slo_tpot_ms: float = SLO_TPOT_MS,
            check_ttft: bool = True) -> tuple:
    """(tokens/s of the requests meeting the SLO, fraction of finished requests meeting it)."""
    from host.serving.metrics import request_metrics
    m = request_metrics(table)
    done = np.isfinite(table.finish_s) & (table.generated >= table.output_tokens)
    ok = done.copy()
    tpot = m["tpot_s"]
    ok &= ~(np.isfinite(tpot) & (tpot * 1e3 > slo_tpot_ms))
    if check_ttft:
        ok &= m["ttft_s"] <= slo_ttft_s
    if not (makespan_s > 0) or not done.any():
        return float("nan"), float("nan")
    tok = float(table.output_tokens[ok].sum())
    return tok / makespan_s, float(ok.sum() / done.sum())


def cost_per_mtok(throughput_tok_s: float, added_memory_gb: float, *, gpu_usd_per_hour: float = GPU_USD_PER_HOUR,
                  n_gpus: int = 1) -> float:
    """US$ per million output tokens at ``throughput_tok_s`` (module docstring)."""
    if not (throughput_tok_s > 0) or not math.isfinite(throughput_tok_s):
        return float("nan")
    mem_per_h = added_memory_gb * DRAM_USD_PER_GB / (AMORTISATION_YEARS * HOURS_PER_YEAR)
    return (n_gpus * gpu_usd_per_hour + mem_per_h) / (throughput_tok_s * 3600.0) * 1e6
