"""Hardware parameters from a TOML file (``--hardware F``) and ``--set section.field=value`` (docs/inputs.md).

A file holds one table per section; each key is a field of the configuration dataclass the section maps to::

    [gpu]                 # host.models.hardware.GPUConfig (PLoRA: the H100; L3: the DGX-A100's A100)
    hbm_bw_gbps = 3000
    [link]                # host.link.Link (PLoRA: the system's link; L3: the GPU-host PCIe link)
    bw_gbps = 64
    rtt_ns = 500
    [ndp]                 # host.plora.ndp_model.NDPDeviceSpec (PLoRA: each memory device)
    internal_bw_gbps = 550
    [pim]                 # host.l3.config.HostMemoryConfig (L3: the DIMM-PIM host memory)
    ranksets = 8

``--set section.field=value`` (repeatable) overrides the file, field by field. Which sections a command takes:
:data:`SECTIONS` (``plora run``: gpu, link, ndp; ``l3 run``: gpu, link, pim). Every value is checked against its
range in :data:`FIELDS`; a bad one is a :class:`ValueError` naming the file or the ``--set``, the field and the
range. The values then replace those fields of the run's preset objects (:func:`apply`), so the run is priced
by the same calibrated models as with the presets; the configuration dataclasses check what ranges alone cannot
(e.g. the calibrated NDP model's power-of-two MAC count).
"""

import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["FIELDS", "SECTIONS", "Field", "load_hardware", "parse_set", "merge", "as_pairs", "as_dict", "apply", "apply_gpu",
           "describe_field"]


@dataclass(frozen=True)
class Field:
    kind: type                       # int, float or str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple = ()
    help: str = ""
    pow2: bool = False

    def allowed(self) -> str:
        if self.kind is str:
            return f"one of {list(self.choices)}"
        what = "a power of two" if self.pow2 else "an integer" if self.kind is int else "a number"
        num = (lambda x: f"{x:.15g}")
        if self.lo is not None and self.hi is not None and not self.lo_open:
            return f"{what} in {num(self.lo)}..{num(self.hi)}"
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {num(self.lo)}")
        if self.hi is not None:
            parts.append(f"<= {num(self.hi)}")
        return f"{what} {' and '.join(parts)}".strip()

    def check(self, v, raw):
        """The value, checked; raises ValueError('must be ..., got ...')."""
        if self.kind is str:
            if not isinstance(v, str) or v not in self.choices:
                raise ValueError(f"must be {self.allowed()}, got {raw!r}")
            return v
        if isinstance(v, bool):
            raise ValueError(f"must be {self.allowed()}, got {raw!r}")
        if isinstance(v, str):
            try:
                v = int(v) if self.kind is int else float(v)
            except ValueError:
                raise ValueError(f"expected {self.allowed()}, got {raw!r}") from None
        if self.kind is int:
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if not isinstance(v, int):
                raise ValueError(f"must be {self.allowed()}, got {raw!r}")
        elif not isinstance(v, (int, float)):
            raise ValueError(f"must be {self.allowed()}, got {raw!r}")
        else:
            v = float(v)
        bad = (not math.isfinite(v) or (self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo))
               or (self.hi is not None and v > self.hi))
        if bad or (self.pow2 and int(v) & (int(v) - 1)):
            raise ValueError(f"must be {self.allowed()}, got {raw!r}")
        return v


def _gpus():
    from host.models.hardware import GPUS
    return tuple(sorted(GPUS))


#: section -> field -> its type and range.
FIELDS = {
    "gpu": {"preset": Field(str, choices=_gpus(), help="the GPU the other fields modify"),
            "hbm_gb": Field(float, 0.0, 1e4, lo_open=True, help="HBM capacity, GB"),
            "hbm_bw_gbps": Field(float, 0.0, 1e6, lo_open=True, help="HBM bandwidth, GB/s"),
            "fp16_tflops": Field(float, 0.0, 1e6, lo_open=True, help="dense FP16 tensor peak, TFLOPS"),
            "sm_count": Field(int, 1, 100_000, help="streaming multiprocessors"),
            "l2_mb": Field(float, 0.0, 1e5, lo_open=True, help="L2 cache, MB")},
    "link": {"bw_gbps": Field(float, 0.0, 1e5, lo_open=True, help="bandwidth per direction, GB/s"),
             "rtt_ns": Field(float, 0.0, 1e9, help="round-trip latency, ns (twice the one-way latency)")},
    "ndp": {"internal_bw_gbps": Field(float, 0.0, 1e5, lo_open=True, help="device memory bandwidth, GB/s"),
            "capacity_gb": Field(float, 0.0, 1e6, lo_open=True, help="device capacity, GB"),
            "macs": Field(int, 1, 1 << 20, help="FP16 MACs of the NDP core (calibrated model: a power of two >= 4)"),
            "clock_ghz": Field(float, 0.0, 100.0, lo_open=True, help="core clock (calibrated model: 1.0 only)"),
            "input_buffer_bytes": Field(int, 128, 1 << 30, help="input buffer, bytes"),
            "dram_buffer_bytes": Field(int, 128, 1 << 30, help="DRAM (operand) buffer, bytes"),
            "output_buffer_bytes": Field(int, 128, 1 << 30, help="output buffer, bytes"),
            "max_batch": Field(int, 1, 4096, help="per-adapter batch of one descriptor"),
            "lanes": Field(int, 1, 65536, pow2=True, help="stand-in's SFU lanes"),
            "descriptor_overhead_cycles": Field(int, 0, 1_000_000, help="stand-in's fixed cost per descriptor"),
            "buffers": Field(int, 1, 64, help="buffer sets (calibrated model: 1 only)")},
    "pim": {"channels": Field(int, 1, 64, help="host memory channels (a multiple of the deployment's DP)"),
            "ranksets": Field(int, 1, 32, help="ranks per channel"),
            "capacity_gib": Field(float, 1.0, float(1 << 20), help="host memory, GiB"),
            # hdl/pim/config.py PIMConfig: rank_adders >= chips = 8 (one adder per chip's context lane), <= 64
            "rank_adders": Field(int, 8, 64, help="FP16 adders of each rank PU's adder unit (PAPER 8; a count "
                                                  "needs its RTL calibration, python -m sim.bench.pim "
                                                  "--calibrate paper-a<N>)")},
}

#: The sections each command takes.
SECTIONS = {"plora": ("gpu", "link", "ndp"), "l3": ("gpu", "link", "pim")}


def describe_field(key: str) -> str:
    section, name = key.split(".", 1)
    f = FIELDS[section][name]
    return f"{key}: {f.help}; {f.allowed()}"


def _check(section, name, value, raw, sections, where):
    if section not in sections:
        raise ValueError(f"{where}: section [{section}] does not apply here; allowed: {list(sections)}")
    fields = FIELDS[section]
    if name not in fields:
        raise ValueError(f"{where}: no field {section}.{name}; allowed: {sorted(fields)}")
    try:
        return fields[name].check(value, raw)
    except ValueError as exc:
        raise ValueError(f"{where}: {section}.{name} {exc}") from None


def read_file(path, loads, kind: str, parse_error):
    """``loads`` of the text of the user's file ``path`` (a ``kind`` file: TOML, JSON); a missing, unreadable or
    malformed file is a ValueError naming the file (the input loaders' common first step)."""
    path = Path(path)
    try:
        return loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, parse_error) as exc:
        raise ValueError(f"{path}: not a readable {kind} file ({exc})") from None


def load_hardware(path, sections) -> dict:
    """``{section: {field: value}}`` of the TOML file ``path``, every value checked (module docstring)."""
    path = Path(path)
    data = read_file(path, tomllib.loads, "TOML", tomllib.TOMLDecodeError)
    out = {}
    for section, table in data.items():
        if section not in FIELDS:
            raise ValueError(f"{path}: unknown section [{section}]; allowed: {list(sections)}")
        if not isinstance(table, dict):
            raise ValueError(f"{path}: {section} must be a table [{section}] of fields, got {table!r}")
        for name, v in table.items():
            out.setdefault(section, {})[name] = _check(section, name, v, v, sections, str(path))
    return out


def parse_set(text: str, sections) -> tuple:
    """``(section, field, value)`` of one ``section.field=value``, checked."""
    key, eq, raw = text.partition("=")
    section, dot, name = key.strip().partition(".")
    if not eq or not dot or not name:
        raise ValueError(f"{text!r}: expected section.field=value (e.g. ndp.internal_bw_gbps=550)")
    if section not in FIELDS:
        raise ValueError(f"{text}: unknown section {section!r}; allowed: {list(sections)}")
    return section, name, _check(section, name, raw.strip(), raw.strip(), sections, text)


def merge(file_values: dict | None, sets=()) -> dict:
    """The file's values with the ``--set`` triples on top."""
    out = {s: dict(v) for s, v in (file_values or {}).items()}
    for section, name, v in sets:
        out.setdefault(section, {})[name] = v
    return out


def as_pairs(values: dict) -> tuple:
    """``{section: {field: value}}`` as sorted ``(("section.field", value), ...)`` (hashable, for a RunSpec)."""
    return tuple(sorted((f"{s}.{k}", v) for s, t in values.items() for k, v in t.items()))


def as_dict(pairs) -> dict:
    out = {}
    for key, v in pairs or ():
        s, k = key.split(".", 1)
        out.setdefault(s, {})[k] = v
    return out


def apply(obj, values: dict | None):
    """``obj`` (a frozen dataclass) with ``values``' fields replaced (no-op when empty)."""
    return replace(obj, **values) if values else obj


def apply_gpu(base, values: dict | None):
    """The GPU of ``values`` (``preset``, else ``base``) with the other fields replaced."""
    values = dict(values or {})
    if "preset" in values:
        from host.models.hardware import get_gpu
        base = get_gpu(values.pop("preset"))
    return apply(base, values)
