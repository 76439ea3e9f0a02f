"""Link model: a link is its per-direction bandwidth and its round-trip latency, nothing else (the two numbers
PLoRA's cost model uses, W_link and L_link, VI-B).

``transfer_s(nbytes, round_trips=1)`` = ``nbytes / bandwidth + round_trips * rtt``. Bandwidths are in GB/s
(1e9 bytes/s) per direction; latencies are round trips in ns.

Presets (:data:`LINKS`), each with its source. Bandwidths come from specifications and vendor pages. Round-trip
latencies of future links are not published; where no measurement is cited, the value is a labelled design
assumption, and the PLoRA sweep varies it from 50 to 2000 ns anyway (plora.txt, set-up facts).
"""

from dataclasses import dataclass, field, replace

import numpy as np

__all__ = ["Link", "LINKS", "get_link", "transfer_s"]


@dataclass(frozen=True, kw_only=True)
class Link:
    """A point-to-point link: ``bw_gbps`` GB/s per direction, ``rtt_ns`` round-trip latency."""

    name: str
    bw_gbps: float
    rtt_ns: float
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if not (np.isfinite(self.bw_gbps) and self.bw_gbps > 0):
            raise ValueError(f"Link({self.name}).bw_gbps must be > 0 GB/s, got {self.bw_gbps}")
        if not (np.isfinite(self.rtt_ns) and self.rtt_ns >= 0):
            raise ValueError(f"Link({self.name}).rtt_ns must be >= 0 ns, got {self.rtt_ns}")

    @property
    def bytes_per_s(self) -> float:
        return self.bw_gbps * 1e9

    def transfer_s(self, nbytes, round_trips=1):
        """Seconds to move ``nbytes`` one way, paying ``round_trips`` round-trip latencies (vectorized)."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        if np.any(nbytes < 0):
            raise ValueError("Link.transfer_s: nbytes must be >= 0")
        out = nbytes / self.bytes_per_s + np.asarray(round_trips, dtype=np.float64) * self.rtt_ns * 1e-9
        return float(out) if out.ndim == 0 else out

    def with_(self, *, bw_gbps: float | None = None, rtt_ns: float | None = None) -> "Link":
        """The same link with another bandwidth and / or latency (sweeps: ``--link-gbps``,
        ``--link-latency-ns``)."""
        return replace(self, name=self.name if bw_gbps is None and rtt_ns is None else f"{self.name}*",
                       bw_gbps=self.bw_gbps if bw_gbps is None else bw_gbps,
                       rtt_ns=self.rtt_ns if rtt_ns is None else rtt_ns)


def transfer_s(nbytes, link: Link, round_trips=1):
    """Seconds to move ``nbytes`` over ``link`` (see :meth:`Link.transfer_s`)."""
    return link.transfer_s(nbytes, round_trips)


_PCIE_LAT = ("design assumption 1000 ns: memory pooling over PCIe DMA needs 500 ns - 1.5 us "
             "(The Next Platform, 'Just how bad is CXL memory latency?', 2022-12-05, quoting GigaIO FabreX); "
             "middle of that range")
_NVL_LAT = ("design assumption 500 ns: no published GPU-to-remote-memory round trip for this link; one switch "
            "hop of a memory-semantic fabric, between the CXL (250 ns) and PCIe DMA (1000 ns) presets; the "
            "PLoRA latency sweep covers 50-2000 ns")

PCIE4_X16 = Link(name="pcie4-x16", bw_gbps=16 * 16e9 * 128 / 130 / 8 / 1e9, rtt_ns=1000.0, sources={
    "bw_gbps": "PCIe 4.0: 16 GT/s per lane, 128b/130b encoding, x16 -> 31.5 GB/s per direction (PCI-SIG PCIe "
               "4.0 base specification); the GPU-host link of each A100 in a DGX-A100 (DGX A100 user guide)",
    "rtt_ns": _PCIE_LAT})
PCIE5_X16 = Link(name="pcie5-x16", bw_gbps=16 * 32e9 * 128 / 130 / 8 / 1e9, rtt_ns=1000.0, sources={
    "bw_gbps": "PCIe 5.0: 32 GT/s per lane, 128b/130b encoding, x16 -> 63.0 GB/s per direction (PCI-SIG PCIe 5.0 "
               "base specification); H100 SXM host interface (NVIDIA H100 datasheet: PCIe Gen5 128 GB/s "
               "bidirectional)",
    "rtt_ns": _PCIE_LAT})
CXL31 = Link(name="cxl3.1", bw_gbps=128.0, rtt_ns=250.0, sources={
    "bw_gbps": "PLoRA VII-A: each PLoRA device attached to the CXL switch over CXL 3.1 at 128 GB/s (per "
               "direction: CXL 3.x runs on the PCIe 6.0 PHY, 64 GT/s x16 = 128 GB/s per direction)",
    "rtt_ns": "design assumption 250 ns: CXL memory expanders measure 2-5x the ~100 ns of local DRAM "
              "(Liu et al., 'Exploring and evaluating real-world CXL', arXiv:2405.14209); low end of that range "
              "for a load/store round trip through one switch"})
NVLINK_C2C = Link(name="nvlink-c2c", bw_gbps=450.0, rtt_ns=500.0, sources={
    "bw_gbps": "PLoRA ref [13] (NVIDIA Grace Hopper architecture in-depth, 2022): NVLink-C2C 900 GB/s total, "
               "450 GB/s per direction; PLoRA's Grace-Hopper baseline runs at 450 GB/s (VII-A)",
    "rtt_ns": _NVL_LAT})
NVLINK4 = Link(name="nvlink4", bw_gbps=450.0, rtt_ns=500.0, sources={
    "bw_gbps": "NVIDIA H100 datasheet: NVLink 900 GB/s per GPU (bidirectional) -> 450 GB/s per direction",
    "rtt_ns": _NVL_LAT})
NVLINK3 = Link(name="nvlink3", bw_gbps=300.0, rtt_ns=500.0, sources={
    "bw_gbps": "NVIDIA A100 datasheet: NVLink 600 GB/s per GPU (bidirectional) -> 300 GB/s per direction "
               "(DGX-A100: through NVSwitch)",
    "rtt_ns": _NVL_LAT})
NVLINK5 = Link(name="nvlink5", bw_gbps=900.0, rtt_ns=500.0, sources={
    "bw_gbps": "NVIDIA Blackwell / fifth-generation NVLink: 1.8 TB/s per GPU bidirectional (PLoRA Table II: "
               "'single-number NVLink rates are bidirectional') -> 900 GB/s per direction",
    "rtt_ns": _NVL_LAT})
NVLINK6 = Link(name="nvlink6", bw_gbps=1800.0, rtt_ns=500.0, sources={
    "bw_gbps": "PLoRA ref [54] (NVIDIA, 'NVLink: the scale-up network for AI factories', 2026): sixth-generation "
               "NVLink 3.6 TB/s bidirectional per GPU -> 1800 GB/s per direction (the top of PLoRA's 8-1800 GB/s "
               "link ladder)",
    "rtt_ns": _NVL_LAT})

LINKS = {l.name: l for l in (PCIE4_X16, PCIE5_X16, CXL31, NVLINK_C2C, NVLINK3, NVLINK4, NVLINK5, NVLINK6)}


def get_link(name: str) -> Link:
    try:
        return LINKS[name]
    except KeyError:
        raise ValueError(f"unknown link {name!r}; allowed: {sorted(LINKS)}") from None
