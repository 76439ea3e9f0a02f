"""Host hardware configurations with sources: GPUs (:class:`GPUConfig`) and nodes (:class:`NodeConfig`).

Units: capacities in GB (1e9 bytes), bandwidths in GB/s (1e9 bytes/s), FLOP rates in TFLOPS (1e12/s, dense
FP16/BF16 tensor-core peak, no sparsity).
"""

from dataclasses import dataclass, field

from host.link import Link, NVLINK3, NVLINK4, PCIE4_X16, PCIE5_X16

__all__ = ["GPUConfig", "NodeConfig", "GPUS", "NODES", "get_gpu", "get_node", "A100_80GB", "H100_SXM_80GB",
           "DGX_A100", "H100_NODE"]


@dataclass(frozen=True, kw_only=True)
class GPUConfig:
    name: str
    hbm_gb: float
    hbm_bw_gbps: float
    fp16_tflops: float
    sm_count: int
    l2_mb: float
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        for f in ("hbm_gb", "hbm_bw_gbps", "fp16_tflops", "sm_count", "l2_mb"):
            if not getattr(self, f) > 0:
                raise ValueError(f"GPUConfig({self.name}).{f} must be > 0, got {getattr(self, f)}")

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from bandwidth- to compute-bound."""
        return self.fp16_tflops * 1e12 / (self.hbm_bw_gbps * 1e9)


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """A server: ``n_gpus`` GPUs joined by ``gpu_link`` (per GPU, per direction), each reaching the host over
    ``host_link``; ``host_memory_gb`` of host DRAM."""

    name: str
    gpu: GPUConfig
    n_gpus: int
    gpu_link: Link
    host_link: Link
    host_memory_gb: float
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if self.n_gpus < 1:
            raise ValueError(f"NodeConfig({self.name}).n_gpus must be >= 1, got {self.n_gpus}")


A100_80GB = GPUConfig(
    name="a100", hbm_gb=80, hbm_bw_gbps=2039, fp16_tflops=312, sm_count=108, l2_mb=40,
    sources={"hbm_gb, hbm_bw_gbps, fp16_tflops": "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: 80 GB "
                                                  "HBM2e, 2,039 GB/s, FP16 Tensor Core 312 TFLOPS dense)",
             "sm_count, l2_mb": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs, 40 MB L2",
             "cross-check": "L3 Table 2: 8 A100 -> 16.3 TB/s aggregate (8 x 2.039)"})

H100_SXM_80GB = GPUConfig(
    name="h100", hbm_gb=80, hbm_bw_gbps=3350, fp16_tflops=989.4, sm_count=132, l2_mb=50,
    sources={"hbm_gb, hbm_bw_gbps, fp16_tflops": "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 80 GB HBM3, "
                                                  "3.35 TB/s, FP16 Tensor Core 1,979 TFLOPS with sparsity = "
                                                  "989.4 dense)",
             "sm_count, l2_mb": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2023): H100 SXM5 132 SMs, "
                                "50 MB L2",
             "cross-check": "PLoRA VII-A: one H100 (80 GB) with 3350 GB/s"})

GPUS = {g.name: g for g in (A100_80GB, H100_SXM_80GB)}

DGX_A100 = NodeConfig(
    name="dgx-a100", gpu=A100_80GB, n_gpus=8, gpu_link=NVLINK3, host_link=PCIE4_X16, host_memory_gb=2000,
    sources={"n_gpus, gpu, gpu_link": "NVIDIA DGX A100 datasheet (8x A100 80GB, 6 NVSwitches, 600 GB/s NVLink "
                                      "per GPU); L3 6.1 (8 A100, NVLink)",
             "host_link": "DGX A100 user guide: each GPU on a PCIe 4.0 x16 switch port",
             "host_memory_gb": "DGX A100 datasheet: 2 TB system memory; L3 Table 2: 16 channels x 2 DIMMs, 2 TB"})

H100_NODE = NodeConfig(
    name="h100-node", gpu=H100_SXM_80GB, n_gpus=8, gpu_link=NVLINK4, host_link=PCIE5_X16, host_memory_gb=2000,
    sources={"*": "NVIDIA DGX H100 datasheet: 8x H100 SXM 80GB, NVLink 900 GB/s per GPU, PCIe Gen5 host "
                  "interface, 2 TB system memory"})

NODES = {n.name: n for n in (DGX_A100, H100_NODE)}


def get_gpu(name: str) -> GPUConfig:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; allowed: {sorted(GPUS)}") from None


def get_node(name: str) -> NodeConfig:
    try:
        return NODES[name]
    except KeyError:
        raise ValueError(f"unknown node {name!r}; allowed: {sorted(NODES)}") from None
