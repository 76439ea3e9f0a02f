"""The pattern near-memory device configurations follow (the PLoRA device lives in host/plora, DIMM-PIM in
host/l3; this module only fixes their shape and gives them one registry).

Subclass :class:`DeviceConfig` as a frozen ``kw_only`` dataclass, add your fields (each with its source in
``sources`` or a comment), validate in ``__post_init__`` (call ``super().__post_init__()``), and register a
preset with :func:`register_device` so CLIs and sweeps can find it by name::

    @dataclass(frozen=True, kw_only=True)
    class PLoRADevice(DeviceConfig):
        ndp_tflops: float
        buffers: int = 2

    register_device(PLoRADevice(name="plora-512g", capacity_gb=512, bw_gbps=1100, ndp_tflops=2.048,
                                count=4, sources={...}))
"""

from dataclasses import dataclass, field

__all__ = ["DeviceConfig", "DEVICES", "register_device", "get_device"]


@dataclass(frozen=True, kw_only=True)
class DeviceConfig:
    """A memory-side device: ``capacity_gb`` GB and ``bw_gbps`` GB/s of internal bandwidth each, ``count`` of
    them, ``tflops`` of near-data compute each (0: plain memory)."""

    name: str
    capacity_gb: float
    bw_gbps: float
    tflops: float = 0.0
    count: int = 1
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        for f in ("capacity_gb", "bw_gbps"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{type(self).__name__}({self.name}).{f} must be > 0, got {getattr(self, f)}")
        if self.tflops < 0:
            raise ValueError(f"{type(self).__name__}({self.name}).tflops must be >= 0, got {self.tflops}")
        if self.count < 1:
            raise ValueError(f"{type(self).__name__}({self.name}).count must be >= 1, got {self.count}")

    @property
    def total_capacity_bytes(self) -> float:
        return self.capacity_gb * 1e9 * self.count

    @property
    def total_bw_bytes_per_s(self) -> float:
        return self.bw_gbps * 1e9 * self.count


DEVICES: dict = {}


def register_device(cfg: DeviceConfig, *, replace: bool = False) -> DeviceConfig:
    """Add a device preset under ``cfg.name`` (error if the name is taken, unless ``replace``)."""
    if not isinstance(cfg, DeviceConfig):
        raise TypeError(f"register_device needs a DeviceConfig, got {type(cfg).__name__}")
    if cfg.name in DEVICES and not replace and DEVICES[cfg.name] != cfg:
        raise ValueError(f"device preset {cfg.name!r} is already registered")
    DEVICES[cfg.name] = cfg
    return cfg


def get_device(name: str) -> DeviceConfig:
    try:
        return DEVICES[name]
    except KeyError:
        raise ValueError(f"unknown device {name!r}; registered: {sorted(DEVICES)}") from None
