"""Energy of a host run (issue 33 item 3): ``energy_j`` split by GPU, links, NDP devices, DIMM-PIM and DRAM, and
``energy_per_token_mj``, for the summary.json of every PLoRA, L3 and end-to-end run.

Terms (J), every one from what the run *executed* (its timeline's busy times and work), never from a cost model:

* ``gpu``: per GPU, ``idle_w x T + (tdp_w - idle_w) x busy_s`` -- board power rising linearly from idle to the
  datasheet's maximum with the busy fraction of the executed timeline (:data:`GPU_POWER`; the board includes the
  HBM and the NVLink PHYs);
* ``links``: bits moved x the link's energy per bit (:data:`LINK_PJ_PER_BIT`): the GPU-device CXL / PCIe links of
  PLoRA, the GPU-host PCIe and the DDR4 channels of the DIMM systems;
* ``ndp``: the NDP cores' datapath and SRAM (sim.energy.ndp) while a device is busy;
* ``pim``: the DIMM-PIM's bank / rank PUs and rank buffers (sim.energy.pim) per head computed;
* ``dram``: the NDP devices' LPDDR5X and the host's DDR4 DIMMs (sim.energy.dram): every rank in precharge standby
  for the whole run, plus the access energy over it (commands, active standby) of the work done;
* ``total`` = their sum; ``energy_per_token_mj`` = total / output tokens, in mJ.

Not charged: CPUs, NICs, fans, power delivery losses, the NDP / PIM logic's leakage and control (no sourced
figure; docs/energy.md "Energy in runs").
"""

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

__all__ = ["GPUPower", "GPU_POWER", "LINK_PJ_PER_BIT", "DDR4_CHANNEL_PJ_PER_BIT", "gpu_power", "link_pj_per_bit",
           "gpu_energy_j", "EnergyLedger", "ndp_device_power", "ndp_idle_dram_w", "ddr4_read_pj_per_bit", "pim_head_increment_pj", "dram_rank_idle_w",
           "ENERGY_KEYS", "keep_busy", "window_s"]

#: the keys of ``energy_j``
ENERGY_KEYS = ("gpu", "links", "ndp", "pim", "dram", "total")


@dataclass(frozen=True)
class GPUPower:
    name: str
    tdp_w: float
    idle_w: float
    sources: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if not 0 < self.idle_w < self.tdp_w <= 5000:
            raise ValueError(f"GPUPower({self.name}): need 0 < idle_w < tdp_w <= 5000 W, got idle {self.idle_w}, "
                             f"tdp {self.tdp_w}")


_IDLE = ("assumption [A-GPU-IDLE]: no datasheet gives an idle board power; a board with no kernel running, "
         "clocks up (a serving process between kernels), taken as ~1/8 of the maximum board power (A100 50 W, "
         "H100 90 W, the order of the idle readings nvidia-smi reports on these boards); the utilization model "
         "is linear between it and the maximum")

#: Board power of the GPUs the hosts model (host.models.hardware.GPUS).
GPU_POWER = {
    "a100": GPUPower("a100", tdp_w=400.0, idle_w=50.0, sources={
        "tdp_w": "NVIDIA A100 Tensor Core GPU datasheet: A100 80GB SXM, Max Thermal Design Power (TDP) 400 W",
        "idle_w": _IDLE}),
    "h100": GPUPower("h100", tdp_w=700.0, idle_w=90.0, sources={
        "tdp_w": "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM, Max Thermal Design Power (TDP) up to 700 W",
        "idle_w": _IDLE}),
}

#: pJ per bit of an off-package SerDes link (PCIe 5.0 / CXL PHY): 5.5 pJ/bit, the SerDes figure Y. Wei et al.,
#: "NVLink-C2C: a coherent off package chip-to-chip interconnect with 40Gbps/pin single-ended signaling", ISSCC
#: 2023 paper 9.3, compare with NVLink-C2C's 1.3 pJ/bit (as quoted in secondary summaries of the paper; the paper's
#: PDF was not re-read here). Applied to PCIe 4/5 and CXL alike (one PHY class).
SERDES_PJ_PER_BIT = 5.5
#: NVLink-C2C, 1.3 pJ/bit (same source): PLoRA's Grace-Hopper baseline link.
NVLINK_C2C_PJ_PER_BIT = 1.3
#: The DDR4-3200 channel's DQ termination per bit, derived (not in the DRAM's IDD: docs/energy.md "Not modelled"):
#: POD12 signalling terminates to VDDQ, so a bit driven low draws VDDQ / (RON + RTT) for one UI and a bit driven
#: high nothing; VDDQ 1.2 V (JEDEC JESD79-4), RON 34 ohm (JESD79-4 RON34 output driver), RTT 50 ohm (the
#: controller's data ODT: Intel Xeon Scalable / Core X-series datasheet vol. 1, DDR4 DC specifications, "Data ODT
#: 50 ohm nominal"), UI 1 / 3.2 GT/s, half the bits low (assumption [A-DQ]: random data, no DBI):
#: 0.5 x 1.2^2 / 84 x 312.5 ps = 2.68 pJ/bit.
DDR4_CHANNEL_PJ_PER_BIT = 0.5 * 1.2 ** 2 / (34.0 + 50.0) * (1e12 / 3.2e9)

#: pJ per bit by link name prefix (host.link presets). NVLink generations used as a GPU-device link (PLoRA's link
#: ladder) leave the GPU board through SerDes PHYs: charged at the SerDes figure.
LINK_PJ_PER_BIT = {"pcie": SERDES_PJ_PER_BIT, "cxl": SERDES_PJ_PER_BIT, "nvlink-c2c": NVLINK_C2C_PJ_PER_BIT,
                   "nvlink": SERDES_PJ_PER_BIT, "ddr4": DDR4_CHANNEL_PJ_PER_BIT}


def gpu_power(name: str) -> GPUPower:
    try:
        return GPU_POWER[name]
    except KeyError:
        raise ValueError(f"no board power for GPU {name!r}; allowed: {sorted(GPU_POWER)}") from None


def link_pj_per_bit(name: str) -> float:
    """pJ/bit of the link named ``name`` (a host.link preset name; a ``*`` suffix of a modified link ignored).
    An unknown name is an error (:meth:`EnergyLedger.add_link` makes the term unknown instead)."""
    n = name.rstrip("*")
    for k in sorted(LINK_PJ_PER_BIT, key=len, reverse=True):
        if n.startswith(k):
            return LINK_PJ_PER_BIT[k]
    raise ValueError(f"no energy per bit for link {name!r}; allowed prefixes: {sorted(LINK_PJ_PER_BIT)}")


def keep_busy(lane_busy: dict, pending, span: list, durations, now: float) -> None:
    """Account the iterations the engine kept (it calls ``on_iteration_end`` at their end, and may cut a priced decode
    stretch at the next arrival): add each timeline lane's busy seconds of the first ``len(durations)`` priced
    iterations (``pending``: lane -> per-iteration busy seconds, or None) into ``lane_busy``, and widen ``span``
    ([first start, last end]) to cover them. The hosts' energy reads both (:func:`window_s`)."""
    n = len(durations)
    for lane, b in (pending or {}).items():
        lane_busy[lane] = lane_busy.get(lane, 0.0) + float(np.sum(np.asarray(b, float)[:n]))
    span[0] = min(span[0], float(now) - float(np.sum(durations)))
    span[1] = max(span[1], float(now))


def window_s(span: list) -> float:
    """Seconds from the first kept iteration's start to the last one's end (0 before any)."""
    return max(0.0, span[1] - span[0]) if np.isfinite(span[0]) else 0.0


def gpu_energy_j(gpu: str, n_gpus: int, wall_s: float, busy_s: float) -> float:
    """``n_gpus`` boards of ``gpu`` over ``wall_s`` seconds, each busy ``busy_s`` of them (clipped to the wall)."""
    p = gpu_power(gpu)
    if not (np.isfinite(wall_s) and wall_s >= 0 and np.isfinite(busy_s) and busy_s >= 0):
        raise ValueError(f"wall_s and busy_s must be finite and >= 0, got {wall_s!r}, {busy_s!r}")
    if isinstance(n_gpus, bool) or int(n_gpus) != n_gpus or n_gpus < 1:
        raise ValueError(f"n_gpus must be an int >= 1, got {n_gpus!r}")
    return n_gpus * (p.idle_w * wall_s + (p.tdp_w - p.idle_w) * min(busy_s, wall_s))


class EnergyLedger:
    """Joules by term; :meth:`as_summary` gives the summary.json keys."""

    def __init__(self):
        self.j = {k: 0.0 for k in ENERGY_KEYS if k != "total"}
        self.notes = {}

    def add(self, term: str, joules: float):
        if term not in self.j:
            raise ValueError(f"unknown energy term {term!r}; allowed: {list(self.j)}")
        if not (np.isfinite(joules) and joules >= 0):
            raise ValueError(f"energy of {term} must be finite and >= 0, got {joules!r}")
        self.j[term] += float(joules)

    def unknown(self, term: str, why: str):
        """``term`` cannot be priced (e.g. a GPU without a sourced board power): it and the total are NaN (null in
        summary.json) and ``energy_unknown`` says why -- never a silent zero or a stand-in figure."""
        if term not in self.j:
            raise ValueError(f"unknown energy term {term!r}; allowed: {list(self.j)}")
        self.j[term] = float("nan")
        self.notes[term] = why

    def merge(self, other: "EnergyLedger"):
        self.notes.update(other.notes)
        for k, v in other.j.items():
            self.j[k] += v
        return self

    def energy_j(self) -> dict:
        out = dict(self.j)
        out["total"] = float(sum(self.j.values()))
        return out

    def as_summary(self, output_tokens) -> dict:
        e = self.energy_j()
        tok = float(output_tokens)
        out = {"energy_j": e, "energy_per_token_mj": e["total"] / tok * 1e3 if tok > 0 else float("nan")}
        if self.notes:
            out["energy_unknown"] = dict(self.notes)
        return out

    def add_link(self, name: str, bits: float):
        """``bits`` over the link ``name`` into ``links``; a link without a sourced pJ/bit makes it unknown."""
        try:
            pj = link_pj_per_bit(name)
        except ValueError as e:
            self.unknown("links", str(e))
            return
        self.add("links", bits * pj * 1e-12)

    def add_gpu(self, gpu: str, n_gpus: int, wall_s: float, busy_s: float):
        """:func:`gpu_energy_j` into ``gpu``; a GPU without a board power in :data:`GPU_POWER` makes it unknown."""
        if gpu not in GPU_POWER:
            self.unknown("gpu", f"no sourced board power for GPU {gpu!r} (known: {sorted(GPU_POWER)})")
            return
        self.add("gpu", gpu_energy_j(gpu, n_gpus, wall_s, busy_s))


# ---- device figures from the kernel models (sim.energy) --------------------------------------------------------

@lru_cache(maxsize=None)
def ndp_device_power(d_model: int, head_dim: int, q_heads: int, kv_heads: int, rank: int = 16) -> dict:
    """Power (W) of one paper NDP device (sim.perf.ndp.NDPPerfModel.paper) while busy, split into ``logic``
    (datapath + SRAM) and ``dram`` (its 64 LPDDR5X channels), and ``idle_dram`` (every rank in precharge standby):
    the busiest of the kernels the PLoRA host runs at the model's shape -- the LoRA E3 GEMV (d_model, ``rank``,
    batch 1) and the decode attention of one GQA group over 1,024 tokens (grouped kernel where the model's head
    dim takes it) -- as energy / modelled time (sim.energy.ndp.kernel_energy). An upper bound on the busy power
    of the other kernels (GEMMs reuse each line, so they draw less per second: bench figures)."""
    from sim.perf.ndp import NDPPerfModel
    from sim.energy.ndp import kernel_energy
    m = NDPPerfModel.paper()
    g = max(1, q_heads // kv_heads)
    d = m._d(d_model, rank)
    kernels = [kernel_energy(m, "e3", d, rank, 1)]
    if m.uses_grouped(head_dim, q_heads, kv_heads):
        kernels.append(kernel_energy(m, "attention_grouped", head_dim, 1024, g))
    else:
        kernels.append(kernel_energy(m, "attention", head_dim, 1024, g))
    best = max(kernels, key=lambda e: e.power_w)
    s = best.seconds
    return {"logic": (best.datapath_pj + best.sram_pj) * 1e-12 / s, "dram": best.dram_pj * 1e-12 / s,
            "idle_dram": ndp_idle_dram_w()}


def dram_rank_idle_w(config) -> float:
    """Precharge-standby power (W) of one rank of ``config`` (a DRAMConfig; sim.energy.dram.command_energy)."""
    from sim.energy.dram import command_energy
    e = command_energy(config)
    return e.pre_stby * 1e-12 / (config.timing.tck_ps * 1e-12)


def ddr4_read_pj_per_bit() -> float:
    """DDR4-3200 DIMM energy per bit of a sequential read (sim.energy.dram.command_energy of DDR4_3200: a RD
    burst, and one ACT + PRE per row of ``row_bytes`` per rank), without standby (the host charges it)."""
    from hdl.memctl.timing import DDR4_3200
    from sim.energy.dram import command_energy
    e, org = command_energy(DDR4_3200), DDR4_3200.org
    bursts_per_row = org.row_bytes // org.burst_bytes
    return (e.rd + (e.act + e.pre) / bursts_per_row) / org.burst_bits


def ndp_idle_dram_w() -> float:
    """One paper NDP device's memory idle: 64 LPDDR5X-8533 channels x their ranks in precharge standby."""
    from hdl.memctl.timing import LPDDR5X_8533
    from hdl.ndp.config import PAPER_CHANNELS
    return PAPER_CHANNELS * LPDDR5X_8533.org.ranks * dram_rank_idle_w(LPDDR5X_8533)


@lru_cache(maxsize=None)
def _pim_lines(head_dim: int):
    """((a, b) of the DRAM part, (a, b) of the PU part): a DIMM-PIM head's energy beyond its rank's precharge
    standby, pJ, as ``a + b L`` through the paper model's heads at L = 1,024 and 4,096 (sim.energy.pim.head_energy;
    the head's command stream is row after row, linear in L up to the last row's rounding)."""
    from sim.perf.pim import paper_model
    from sim.energy.pim import head_energy
    m = paper_model()
    if head_dim != m.config.head_dim:
        raise ValueError(f"the DIMM-PIM head model is for head_dim {m.config.head_dim}, got {head_dim}")
    e1, e2 = head_energy(m, 1024), head_energy(m, 4096)

    def line(f):
        b = (f(e2) - f(e1)) / (4096 - 1024)
        return f(e1) - b * 1024, b
    return line(lambda e: e.dram_increment_pj), line(lambda e: e.datapath_pj + e.sram_pj)


def pim_head_increment_pj(head_dim: int, heads: float, token_sum: float) -> tuple:
    """Energy (pJ) of ``heads`` DIMM-PIM heads whose contexts sum to ``token_sum`` tokens, beyond the ranks'
    precharge standby (the host charges that for every rank for the whole run): (DRAM part, PU part)."""
    if not (np.isfinite(heads) and heads >= 0 and np.isfinite(token_sum) and token_sum >= 0):
        raise ValueError(f"heads and token_sum must be finite and >= 0, got {heads!r}, {token_sum!r}")
    (ad, bd), (ap, bp) = _pim_lines(head_dim)
    return max(0.0, ad * heads + bd * token_sum), max(0.0, ap * heads + bp * token_sum)
