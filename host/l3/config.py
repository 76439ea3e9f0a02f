"""Configurations of the L3 host, each value with its source.

* **Deployments** (L3 Table 3): OPT-66B on TP 2 x DP 4, GPT-89B on TP 4 x DP 2, GPT-175B on TP 8 x DP 1 of a
  DGX-A100 (8 x A100 80 GB, NVLink/NVSwitch); the model shapes are :mod:`host.models.llm`'s, the node
  :data:`host.models.hardware.DGX_A100`.
* **Host memory** (:class:`HostMemoryConfig`, L3 Table 2): 16 channels x 2 DIMMs of DDR4-3200 with DIMM-PIM,
  2 ranks per DIMM, 2 TB. A *rankset* is one rank on every channel (5.1), so the ranksets are the ranks per
  channel (4 here); the scalability study varies ranksets (2 -> 16) and capacity (512 GB -> 4 TB) independently.
* **PCIe** between the GPUs and the host: PCIe 4.0 x16 (:data:`host.link.PCIE4_X16`, 31.5 GB/s per direction).
  In a DGX-A100 the eight GPUs sit behind four PCIe 4.0 switches, two GPUs per switch, each switch on one x16
  port of a CPU (NVIDIA DGX A100 system architecture: "four PCIe Gen4 switches" for eight GPUs); host-memory
  traffic of a GPU pair therefore shares one x16 uplink (:attr:`L3Setup.host_uplinks`).

**Data parallelism** (design choice): the DP replicas of a deployment are independent serving instances that
share the node's host memory and PIM by a static split: replica ``r`` owns ``channels / DP`` channels (all their
ranks, so every replica keeps every rankset), ``capacity / DP`` of the host memory, its ``TP`` GPUs and their
``TP / 2`` PCIe uplinks. Requests are dealt to replicas round robin; a run's time is the slowest replica's.
"""

from dataclasses import dataclass, field, replace

from host.link import PCIE4_X16, Link
from host.models.hardware import DGX_A100, NodeConfig
from host.models.llm import LLMConfig, get_model

__all__ = ["HostMemoryConfig", "L3Setup", "check_calibrated", "DEPLOYMENTS", "L3_HOST_MEMORY", "SCALING_BASE",
           "l3_setup", "GIB", "GPUS_PER_UPLINK"]

GIB = 1 << 30

#: DGX-A100: two GPUs per PCIe 4.0 switch, one x16 uplink per switch (module docstring).
GPUS_PER_UPLINK = 2


@dataclass(frozen=True, kw_only=True)
class HostMemoryConfig:
    """The DIMM-PIM host memory: ``channels`` channels with ``ranksets`` ranks each (one rankset = one rank per
    channel), ``capacity_gib`` GiB in all (DIMM capacities are binary: 32 DIMMs x 64 GiB = 2 TiB)."""

    channels: int = 16                 # [L3] Table 2 "16 Channels x 2 DIMM"
    ranksets: int = 4                  # [L3] Table 2 "2 Ranks" x 2 DIMMs per channel; 5.1 "four ranks per channel"
    capacity_gib: float = 2048.0       # [L3] Table 2 "Capacity 2TB (Scalable)"
    dimm_type: str = "DDR4-3200"       # [L3] Table 2 "DIMM / DIMM-PIM: DDR4-3200"
    rank_adders: int = 8               # [L3] 6.1 set-up "adder unit of eight FP16 adders" (hdl/pim/config.PAPER);
    #                                    another count is priced only with its RTL calibration (pim_config)
    sources: dict = field(default_factory=lambda: {
        "channels, capacity": "L3 Table 2 (16 channels x 2 DIMMs, 2 TB)",
        "ranksets": "L3 Table 2 (2 ranks per DIMM, 2 DIMMs per channel) and 5.1 (one rank per channel forms a "
                    "rankset; 'four ranks per channel' on the DGX-A100)",
        "timing, geometry": "hdl.pim.config.PAPER via sim.perf.pim (host.l3.pim_timing)"},
        compare=False, hash=False)

    def __post_init__(self):
        if not 1 <= self.channels <= 64:
            raise ValueError(f"HostMemoryConfig.channels = {self.channels} outside [1, 64]")
        if not 1 <= self.ranksets <= 32:
            raise ValueError(f"HostMemoryConfig.ranksets = {self.ranksets} outside [1, 32] (ranks per channel)")
        if not 1 <= self.capacity_gib <= 1 << 20:
            raise ValueError(f"HostMemoryConfig.capacity_gib = {self.capacity_gib} outside [1, 1048576] GiB")
        self.pim_config                 # PIMConfig validates rank_adders (chips = 8 .. 64)

    @property
    def pim_config(self):
        """The rank's :class:`hdl.pim.config.PIMConfig`: PAPER with ``rank_adders`` (PAPER itself at 8). Its
        timing (host.l3.pim_timing.pim_timing) needs an RTL calibration of that geometry
        (data/pim_rtl_calibration.json; ValueError naming the command otherwise)."""
        from hdl.pim.config import PAPER
        if self.rank_adders == PAPER.rank_adders:
            return PAPER
        try:
            return replace(PAPER, rank_adders=self.rank_adders, name=f"paper-a{self.rank_adders}")
        except ValueError as e:
            raise ValueError(f"HostMemoryConfig.rank_adders: {e}") from None

    @property
    def ranks(self) -> int:
        return self.channels * self.ranksets

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_gib * GIB


#: L3 Table 2: 16 channels x 2 DIMMs x 2 ranks, 2 TB.
L3_HOST_MEMORY = HostMemoryConfig()
#: Scalability study base (L3 6.1 set-up facts): 512 GB, 2 ranksets.
SCALING_BASE = HostMemoryConfig(ranksets=2, capacity_gib=512.0)

#: [L3] Table 3: model -> (TP, DP).
DEPLOYMENTS = {"opt-66b": (2, 4), "gpt-89b": (4, 2), "gpt-175b": (8, 1)}


def check_calibrated(host: HostMemoryConfig) -> dict:
    """The RTL calibration of ``host``'s rank (sim.perf.pim.load_calibration); ValueError naming the command that
    measures it when data/pim_rtl_calibration.json has none (the host never prices a rank without one)."""
    from sim.perf.pim import calibration_key, load_calibration
    cfg = host.pim_config
    try:
        return load_calibration(cfg)
    except ValueError:
        raise ValueError(f"pim.rank_adders = {host.rank_adders}: no RTL calibration of this rank PU "
                         f"({calibration_key(cfg)}); measure it with `python -m sim.bench.pim --calibrate "
                         f"paper-a{host.rank_adders}`") from None


@dataclass(frozen=True, kw_only=True)
class L3Setup:
    """One deployment of the L3 study: a model with its TP x DP on a node, the host memory and the GPU-host
    link. Derived per-replica figures follow the DP split of the module docstring."""

    model: LLMConfig
    tp: int
    dp: int
    node: NodeConfig = DGX_A100
    host: HostMemoryConfig = L3_HOST_MEMORY
    host_link: Link = PCIE4_X16

    def __post_init__(self):
        if self.tp * self.dp > self.node.n_gpus:
            raise ValueError(f"{self.model.name}: TP {self.tp} x DP {self.dp} needs {self.tp * self.dp} GPUs, "
                             f"the {self.node.name} has {self.node.n_gpus}")
        if self.host.channels % self.dp:
            raise ValueError(f"{self.model.name}: {self.host.channels} host channels cannot be split evenly over "
                             f"DP = {self.dp} replicas")
        if self.model.head_dim != 128:
            raise ValueError(f"{self.model.name}: head_dim {self.model.head_dim}; the DIMM-PIM PAPER geometry "
                             f"computes heads of 128 (L3 Table 3)")

    @property
    def channels_per_replica(self) -> int:
        return self.host.channels // self.dp

    @property
    def host_capacity_bytes(self) -> float:
        """Host memory of one replica."""
        return self.host.capacity_bytes / self.dp

    @property
    def host_uplinks(self) -> int:
        """PCIe x16 uplinks one replica's GPUs share to reach host memory (at least one)."""
        return max(1, self.tp // GPUS_PER_UPLINK)

    @property
    def host_link_gbps(self) -> float:
        """GB/s per direction between one replica's GPUs and the host."""
        return self.host_uplinks * self.host_link.bw_gbps

    @property
    def heads_per_rank(self) -> int:
        """Heads of one (request, layer) a rank computes: the layer's heads spread over the replica's channels
        of its rankset (5.1); the ceiling when they do not divide."""
        return -(-self.model.n_heads // self.channels_per_replica)

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token, all layers and heads (FP16)."""
        m = self.model
        return 2.0 * m.n_layers * m.n_kv_heads * m.head_dim * m.dtype_bytes

    @property
    def hbm_bytes_per_replica(self) -> float:
        return self.tp * self.node.gpu.hbm_bytes

    def with_host(self, *, ranksets: int | None = None, capacity_gib: float | None = None) -> "L3Setup":
        h = self.host
        return replace(self, host=replace(h, ranksets=h.ranksets if ranksets is None else ranksets,
                                          capacity_gib=h.capacity_gib if capacity_gib is None else capacity_gib))

    def describe(self) -> dict:
        return {"model": self.model.name, "tp": self.tp, "dp": self.dp, "node": self.node.name,
                "gpu": self.node.gpu.name, "gpu_hbm_gb": self.node.gpu.hbm_gb,
                "gpu_hbm_bw_gbps": self.node.gpu.hbm_bw_gbps, "gpu_fp16_tflops": self.node.gpu.fp16_tflops,
                "host_link_rtt_ns": self.host_link.rtt_ns, "host_channels": self.host.channels, "ranksets": self.host.ranksets,
                "host_capacity_gib": self.host.capacity_gib, "pim_rank_adders": self.host.rank_adders,
                "host_link": self.host_link.name,
                "host_link_gbps_per_replica": self.host_link_gbps,
                "channels_per_replica": self.channels_per_replica, "heads_per_rank": self.heads_per_rank,
                "kv_bytes_per_token": self.kv_bytes_per_token}


def l3_setup(model, *, ranksets: int | None = None, host_memory_gb: float | None = None,
             hardware: dict | None = None, tp: int | None = None, dp: int | None = None) -> L3Setup:
    """The L3 Table 3 deployment of ``model`` (``opt-66b``, ``gpt-89b``, ``gpt-175b``) on the Table 2 host,
    optionally with other ranksets / host capacity (GiB).

    ``model`` may also be an :class:`LLMConfig` (e.g. from a Hugging Face config.json, host.models.hf), run at
    ``tp`` x ``dp`` (required for a model L3 Table 3 does not deploy; else they override its deployment).
    ``hardware``: ``{section: {field: value}}`` (host.models.hardware_file, sections gpu, link, pim) replacing
    fields of the node's GPU, the GPU-host link and the host memory; ``ranksets`` / ``host_memory_gb`` then
    apply on top (the flags)."""
    from host.models.hardware_file import SECTIONS, apply, apply_gpu
    if isinstance(model, LLMConfig):
        m = model
        if m.name in DEPLOYMENTS and (tp is None or dp is None):
            tp, dp = tp or DEPLOYMENTS[m.name][0], dp or DEPLOYMENTS[m.name][1]
        if tp is None or dp is None:
            raise ValueError(f"{m.name}: not an L3 Table 3 deployment; give its TP and DP (--tp, --dp)")
    else:
        if model not in DEPLOYMENTS:
            raise ValueError(f"unknown L3 model {model!r}; allowed: {sorted(DEPLOYMENTS)}")
        t3, d3 = DEPLOYMENTS[model]
        m = get_model(model)
        if (m.tp, m.dp) != (t3, d3):
            raise ValueError(f"{model}: host.models says TP {m.tp} x DP {m.dp}, L3 Table 3 says {t3} x {d3}")
        tp, dp = tp or t3, dp or d3
    hw = hardware or {}
    bad = sorted(set(hw) - set(SECTIONS["l3"]))
    if bad:
        raise ValueError(f"hardware sections {bad} do not apply to an L3 run; allowed: {list(SECTIONS['l3'])}")
    node = DGX_A100
    if hw.get("gpu"):
        node = replace(node, gpu=apply_gpu(node.gpu, hw["gpu"]))
    link = PCIE4_X16
    if hw.get("link"):
        link = link.with_(bw_gbps=hw["link"].get("bw_gbps"), rtt_ns=hw["link"].get("rtt_ns"))
    s = L3Setup(model=m, tp=tp, dp=dp, node=node, host=apply(L3_HOST_MEMORY, hw.get("pim")), host_link=link)
    if s.host.rank_adders != L3_HOST_MEMORY.rank_adders:
        check_calibrated(s.host)
    if ranksets is not None or host_memory_gb is not None:
        s = s.with_host(ranksets=ranksets, capacity_gib=host_memory_gb)
    return s
