"""PLoRA system configurations: the device, the variants (PLoRA, its ablations and the device-based
baselines), and the constants of the host-mediated paths, each with its source.

Sources:

* [PLoRA] (docs/references.md) IV-A: "Aggregated DRAM bandwidth exceeds 1 TB/s [60], far above the
  128 GB/s per direction of the CXL 3.1 link"; IV-B: "1.1 TB/s bandwidth, 512 GB capacity ... our NDP cores
  use 2 TFLOPS"; VII-A: "one NVIDIA H100 GPU (80 GB) with 3350 GB/s bandwidth and four PLoRA memory devices,
  each attached to the CXL switch over CXL 3.1 at 128 GB/s"; "Each LoRA adapter takes a dimension randomly
  chosen from [8, 16, 32, 64, 128], and we add adapters to all weight matrices"; the ablation notation N, S, D;
  the baselines; set-up facts: 1024 MACs, 2048 GFLOPS at 1 GHz, 3 MB SRAM.
* [GH200] NVIDIA GH200 Grace Hopper Superchip datasheet: up to 480 GB LPDDR5X at up to 512 GB/s (CPU
  memory), NVLink-C2C 900 GB/s total (450 GB/s per direction, PLoRA ref [13]).
* [CUDAGraphs] A. Gray, "Getting Started with CUDA Graphs", NVIDIA Technical Blog, 2019: a 2.9 us kernel
  launched back to back with a stream synchronization after each takes 9.6 us per kernel, so a kernel stop
  (launch + synchronize, control back to the CPU) costs 9.6 - 2.9 = 6.7 us.
* [vLLM] vLLM's default ``gpu_memory_utilization = 0.9``: 10 % of HBM is left for activations and workspace.
"""

from dataclasses import dataclass

from .lora import E1, E2, E3, E4, STRATEGIES
from .ndp_model import NDPDeviceSpec, PLORA_DEVICE

__all__ = ["Variant", "VARIANTS", "PLORA_FAMILY", "SYSTEM_NAMES", "ALL_SYSTEMS", "HBM_KV_VARIANTS", "KERNEL_STOP_S", "WORKSPACE_FRACTION", "PLORA_X4",
           "PLoRADeviceConfig",
           "GRACE_MEMORY", "N_DEVICES", "DEFAULT_MAX_BATCH", "DEFAULT_MAX_TOKENS", "default_link_name"]

#: [PLoRA] VII-A: four PLoRA memory devices.
N_DEVICES = 4
#: [CUDAGraphs]: one kernel stop (launch + synchronize), the price of every host-mediated exchange.
KERNEL_STOP_S = 6.7e-6
#: [vLLM]: HBM kept free for activations and workspace.
WORKSPACE_FRACTION = 0.10
#: Design choice (same for every system): at most 256 requests per batch ([PLoRA] V-A, "B_i, 0 to 256") and
#: 8192 prompt tokens per iteration (a prompt longer than that runs alone).
DEFAULT_MAX_BATCH = 256
DEFAULT_MAX_TOKENS = 8192
#: [GH200]: the Grace CPU's memory as the far memory the Hopper GPU loads from (one pool, no NDP).
GRACE_MEMORY = NDPDeviceSpec(name="grace-lpddr5x", internal_bw_gbps=512.0, capacity_gb=480.0)


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One system of the PLoRA family (the pooled-memory systems; S-LoRA and CPU-LoRA-Offload are in
    host.plora.baselines).

    ``allowed``: strategies; ``selection``: Algorithm 1 chooses among them (else the single allowed strategy
    is applied uniformly, still through Algorithm 1's memory handling); ``distributed``: integral attention on
    the NDP cores (D), else the GPU computes attention and loads the devices' KV over the link;
    ``host_mediated``: no accelerator load/store to the devices (PLoRA-NoCXL): every exchange is a kernel stop
    and every adapter's device job its own host-launched kernel; ``precache``: the temperature metric
    pre-caches hot adapters; ``device``: the memory device; ``n_dev``: default device count; ``link``: the
    default link preset (host.link)."""

    name: str
    allowed: tuple
    selection: bool = True
    distributed: bool = True
    host_mediated: bool = False
    precache: bool = True
    kv_in_hbm: bool = False
    device: NDPDeviceSpec = PLORA_DEVICE
    n_dev: int = N_DEVICES
    link: str = "cxl3.1"
    about: str = ""

    def __post_init__(self):
        if not self.allowed or any(s not in (E1, E2, E3, E4) for s in self.allowed):
            raise ValueError(f"Variant {self.name}: allowed must be a non-empty subset of E1..E4")
        if not self.selection and len(self.allowed) != 1:
            raise ValueError(f"Variant {self.name}: without selection exactly one strategy is applied")
        if self.kv_in_hbm and self.distributed:
            raise ValueError(f"Variant {self.name}: kv_in_hbm is for systems without distributed attention (with "
                             f"D, Algorithm 1 places the KV)")

    @property
    def uses_ndp(self) -> bool:
        return self.distributed or any(s in (E3, E4) for s in self.allowed)

    def describe(self) -> dict:
        return {"name": self.name, "allowed": [STRATEGIES[s] for s in self.allowed], "selection": self.selection,
                "distributed_attention": self.distributed, "host_mediated": self.host_mediated,
                "precache": self.precache, "kv_in_hbm": self.kv_in_hbm, "device": self.device.name, "link": self.link, "about": self.about}


_ALL = (E1, E2, E3, E4)
_KV_POOL = ("; KV in the pool, read by the GPU over the link every layer (KV placement belongs to D, "
            "PLoRA V-B(1))")
_BASE_VARIANTS = (
    Variant(name="plora", allowed=_ALL, about="NSD: NDP, strategy selection, distributed attention"),
    Variant(name="ns", allowed=_ALL, distributed=False, about="NDP + strategy selection, no distributed attention"
            + _KV_POOL),
    Variant(name="n-e3", allowed=(E3,), selection=False, distributed=False, precache=False,
            about="NDP only, E3 for every adapter" + _KV_POOL),
    Variant(name="n-e4", allowed=(E4,), selection=False, distributed=False, precache=False,
            about="NDP only, E4 for every adapter" + _KV_POOL),
    Variant(name="nd-e3", allowed=(E3,), selection=False, precache=False,
            about="NDP + distributed attention, E3 for every adapter"),
    Variant(name="nd-e4", allowed=(E4,), selection=False, precache=False,
            about="NDP + distributed attention, E4 for every adapter"),
    Variant(name="pure-cxl", allowed=(E1, E2), distributed=False,
            about="the same devices as plain memory: the GPU loads adapters (E2) and KV over CXL, no NDP" + _KV_POOL),
    Variant(name="grace-hopper", allowed=(E1, E2), distributed=False, device=GRACE_MEMORY, n_dev=1,
            link="nvlink-c2c", about="Grace CPU memory over NVLink-C2C (450 GB/s), GPU loads, no NDP" + _KV_POOL),
    Variant(name="plora-nocxl", allowed=_ALL, host_mediated=True,
            about="PLoRA's devices without accelerator load/store: host-launched kernel per adapter, "
                  "kernel stop per exchange"),
)
#: The systems without D as they were before issue 30: KV kept in HBM as far as it fits (not in the grid)
HBM_KV_VARIANTS = tuple(
    Variant(**{**v.__dict__, "name": f"{v.name}-hbmkv", "kv_in_hbm": True,
               "about": v.about.replace(_KV_POOL, "") + "; KV kept in HBM as far as it fits"})
    for v in _BASE_VARIANTS if not v.distributed)
VARIANTS = {v.name: v for v in _BASE_VARIANTS + HBM_KV_VARIANTS}
#: Names the host-memory baselines use (host.plora.baselines).
BASELINES = ("s-lora", "s-lora-2gpu", "s-lora-4gpu", "cpu-lora-offload")
PLORA_FAMILY = tuple(VARIANTS)
SYSTEM_NAMES = ("plora", "s-lora", "pure-cxl", "cpu-lora-offload", "grace-hopper", "plora-nocxl", "n-e3", "n-e4",
                "ns", "nd-e3", "nd-e4", "s-lora-2gpu", "s-lora-4gpu")
#: Systems kept for comparison, not in the grid: the behaviours before issue 30 (CPU-LoRA-Offload caching what it
#: staged) and S-LoRA with its paper's prefetch (its code's default is off; host/plora/baselines.py)
EXTRA_BASELINES = ("cpu-lora-offload-cached", "s-lora-prefetch")
#: Every system a run may name: the grid's, the KV-in-HBM variants of the systems without D, the extra baselines
ALL_SYSTEMS = SYSTEM_NAMES + tuple(v.name for v in HBM_KV_VARIANTS) + EXTRA_BASELINES


def default_link_name(system: str) -> str:
    """The link preset a system runs on by default."""
    if system in VARIANTS:
        return VARIANTS[system].link
    if system in BASELINES or system in EXTRA_BASELINES:
        return "pcie5-x16"
    raise ValueError(f"unknown system {system!r}; allowed: {list(SYSTEM_NAMES)}")


# --- the device preset in the project's device registry (host.models.devices) -------------------------------
from host.models.devices import DeviceConfig, register_device  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class PLoRADeviceConfig(DeviceConfig):
    """The PLoRA memory device as a registered preset: capacity, internal bandwidth and NDP TFLOPS per device,
    ``count`` devices on ``link``; ``ndp`` is the full device spec the NDP timing model takes."""

    ndp: NDPDeviceSpec = PLORA_DEVICE
    link: str = "cxl3.1"


#: PLoRA VII-A: four PLoRA devices (512 GB, 1.1 TB/s, 2.048 TFLOPS each) on CXL 3.1 at 128 GB/s per direction.
PLORA_X4 = register_device(PLoRADeviceConfig(
    name="plora-512g-x4", capacity_gb=PLORA_DEVICE.capacity_gb, bw_gbps=PLORA_DEVICE.internal_bw_gbps,
    tflops=PLORA_DEVICE.peak_flops / 1e12, count=N_DEVICES,
    sources={"capacity_gb, bw_gbps": "PLoRA IV-B (Samsung CXL-PNM [60]: 1.1 TB/s, 512 GB)",
             "tflops": "PLoRA set-up facts: 1024 FP16 MACs, 2048 GFLOPS at 1 GHz",
             "count, link": "PLoRA VII-A: four devices, each on CXL 3.1 at 128 GB/s (host.link preset cxl3.1)"}),
    replace=True)
