"""The design space of ``ndpim dse``: the NDP core's geometry, as the calibrated PLoRA host model prices it.

Axes (each a list of values; a point is one value of each):

* ``macs``: FP16 MACs of the core. The calibrated model derives the geometry from it
  (host/plora/ndp_model.py ``NDPDeviceSpec.ndp_config``): 512 lanes x ``macs / 512`` PE rows from 1,024 MACs up,
  else ``min(128, macs / 2)`` lanes x the rest as rows; the SFU is ``min(128, lanes)`` wide. So lanes, PE rows
  and softmax width are swept *through* ``macs``, never independently (the host's calibrated model has no other
  geometry per MAC count).
* ``dram_buffer_kib`` / ``input_buffer_kib`` / ``output_buffer_kib``: the three operand rings
  (hdl/ndp/config.py; PLoRA set-up "3 MB of SRAM (input, DRAM and output buffers)").

The DIMM-PIM family (:class:`PIMPoint`, L3's host memory, priced separately: a different system):

* ``rank_adders``: FP16 adders of each rank PU's adder unit (hdl/pim/config.py ``PIMConfig.rank_adders``, PAPER 8,
  [L3] 6.1 "adder unit of eight FP16 adders"), at the PAPER channel otherwise. The L3 host prices a count only
  with its own RTL calibration (data/pim_rtl_calibration.json, ``python -m sim.bench.pim --calibrate
  paper-a<N>``); a count without one is a failed row naming that command.

Not swept (docs/dse.md, and every run's dse.json says so): the device-memory channels (their DRAM dies and PHYs
have no area or power in the 45 nm cell model, so a per-mm^2 figure would get their bandwidth for free), the
clock (tied to the memory's CK, hdl/ndp/config.CORE_CLOCK_RATIO), and the other DIMM-PIM units (see
:data:`NOT_SWEPT`).
"""

from dataclasses import dataclass
from itertools import product

__all__ = ["Point", "PIMPoint", "AXES", "PIM_AXES", "GRIDS", "PIM_GRIDS", "FAMILIES", "NOT_SWEPT", "grid_points",
           "pim_grid_points", "check_axis"]

#: axis -> (min, max) accepted on the command line, and its doc.
AXES = {
    # the calibrated model needs a power of two >= 4 (NDPDeviceSpec.ndp_config); 65,536 = NDPConfig's macs range
    "macs": ((4, 1 << 16), "FP16 MACs of the NDP core, a power of two"),
    # hdl/ndp/config.py _RANGES: buffers >= 64 B; 1 GiB = host/models/hardware_file.py FIELDS ndp.*_buffer_bytes max
    "dram_buffer_kib": ((1, 1 << 20), "DRAM (operand) ring, KiB"),
    "input_buffer_kib": ((1, 1 << 20), "input ring, KiB"),
    "output_buffer_kib": ((1, 1 << 20), "output ring, KiB"),
}

#: Grids: ``full`` brackets the paper's 1,024 MACs by 4x each way and its 1 MiB DRAM ring by 2x (hdl/ndp/config.PAPER;
#: the input / output rings at the paper's 512 KiB); ``small`` (the tests' and ``make bench-host``'s): two 128-lane
#: cores at the paper's buffers, whose decoder (the one module whose mapping takes minutes, and which changes with
#: lanes and buffer sizes) is one and the same, so a warm area cache prices them in seconds.
GRIDS = {
    "full": {"macs": (256, 512, 1024, 2048, 4096), "dram_buffer_kib": (512, 1024, 2048),
             "input_buffer_kib": (512,), "output_buffer_kib": (512,)},
    "small": {"macs": (256, 512), "dram_buffer_kib": (1024,), "input_buffer_kib": (512,), "output_buffer_kib": (512,)},
}

#: The DIMM-PIM family's axes: axis -> (min, max), doc. rank_adders: chips = 8 .. 64 at PAPER (hdl/pim/config.py
#: PIMConfig: the adder unit's accumulator mode adds each chip's context lane on its own adder,
#: hdl/pim/adder_unit.py, so fewer adders than chips is refused; the score tree alone would need chips - 1).
PIM_AXES = {
    "rank_adders": ((8, 64), "FP16 adders of each rank PU (PIMConfig.rank_adders; PAPER 8)"),
}

#: ``full``: the paper's 8 and 2x / 4x more (each RTL-calibrated: docs/dse.md); ``small``: the paper's 8 and 16.
PIM_GRIDS = {"full": {"rank_adders": (8, 16, 32)}, "small": {"rank_adders": (8, 16)}}

#: The two families of points: the PLoRA NDP core and L3's DIMM-PIM (each its own front).
FAMILIES = ("ndp", "pim")

NOT_SWEPT = {
    "ndp.channels / internal_bw_gbps": "the device memory's LPDDR5X dies and PHYs have no area or power in the "
        "NanGate45 cell model (sim/energy/area.py): a per-mm^2 figure would count their bandwidth for free; "
        "held at the paper's 64 channels (1.1 TB/s)",
    "ndp.lanes / pe_batch / sfu_lanes": "set by macs: the calibrated host model derives its geometry from the MAC "
        "count (host/plora/ndp_model.py NDPDeviceSpec.ndp_config), so they are swept through macs",
    "ndp.clock": "tied to the device memory's CK (hdl/ndp/config.CORE_CLOCK_RATIO, 1 GHz)",
    "pim.bank_pu_multipliers / bank_pu_adders": "fixed by the chip burst: 64-bit RD / 16 bit = 4 multipliers "
        "(hdl/pim/config.py), and the bank PU's RTL takes only bank_pu_adders = bank_pu_multipliers "
        "(hdl/pim/bank_pu.py BankPU: N - 1 tree adders + 1 accumulator)",
    "pim bank PUs per chip / softmax width": "not free parameters: one bank PU per DRAM bank and a softmax chunk of "
        "one score per logic bank ([L3] 6.1; PIMConfig.chunk = banks), and the banks are the DDR4 x8 organisation "
        "(4 bank groups x 4 banks, [JESD79-4]; hdl/memctl/timing.py DDR4_3200) the calibration key fixes (b16)",
    "pim.rank_buffer_bytes": "not in the calibration key, and a single head's RTL cycles do not change with it "
        "(measured on the micro channel at 2x the buffer: tests/hdl/pim/test_pim_rank_adders.py), but it bounds the "
        "longest head (max_tokens) and which heads overlap (sim/perf/pim.py PIMPerfModel.overlaps); the L3 host "
        "raises on a head longer than the buffer instead of rejecting the request (host.l3.pim_timing; its traces "
        "are capped at PAPER's 128K tokens), so a smaller buffer cannot be priced, and [L3] 4.4 gives 256 KB only",
    "pim.context_acc": "a numerics option (FP32 bank-PU accumulators), not a unit count; calibrated only at fp16",
}


@dataclass(frozen=True)
class Point:
    macs: int
    family = "ndp"
    dram_buffer_kib: int
    input_buffer_kib: int
    output_buffer_kib: int

    @property
    def name(self) -> str:
        return f"m{self.macs}-d{self.dram_buffer_kib}k-i{self.input_buffer_kib}k-o{self.output_buffer_kib}k"

    def hardware(self) -> tuple:
        """The PLoRA host's ``--set`` values of this point (host/models/hardware_file.py FIELDS ndp)."""
        return (("ndp.macs", self.macs), ("ndp.dram_buffer_bytes", self.dram_buffer_kib << 10),
                ("ndp.input_buffer_bytes", self.input_buffer_kib << 10),
                ("ndp.output_buffer_bytes", self.output_buffer_kib << 10))


@dataclass(frozen=True)
class PIMPoint:
    """One DIMM-PIM point: L3's host memory (hdl/pim/config.PAPER ranks) with ``rank_adders`` per rank PU."""
    rank_adders: int

    family = "pim"

    @property
    def name(self) -> str:
        return f"pim-a{self.rank_adders}"

    def hardware(self) -> dict:
        """The L3 host's ``--set`` values of this point (host/models/hardware_file.py FIELDS pim)."""
        return {"pim": {"rank_adders": self.rank_adders}}

    def host(self):
        """L3's host memory (host.l3.config.L3_HOST_MEMORY) with this point's rank PUs."""
        from dataclasses import replace
        from host.l3.config import L3_HOST_MEMORY
        return replace(L3_HOST_MEMORY, rank_adders=self.rank_adders)

    def config(self):
        """The rank's :class:`hdl.pim.config.PIMConfig` (host.l3.config.HostMemoryConfig.pim_config)."""
        return self.host().pim_config


def check_axis(name, values) -> tuple:
    """``values`` of axis ``name`` (of :data:`AXES` or :data:`PIM_AXES`), checked (ValueError naming the axis and
    its allowed range)."""
    (lo, hi), _doc = AXES[name] if name in AXES else PIM_AXES[name]
    bad = [v for v in values if not lo <= v <= hi or (name == "macs" and v & (v - 1))]
    if bad:
        extra = ", a power of two" if name == "macs" else ""
        raise ValueError(f"--{name.replace('_', '-')}: {bad} outside the allowed range {lo} .. {hi}{extra}")
    return tuple(values)


def grid_points(axes: dict) -> list:
    """Every point of ``axes`` (``{axis: values}``, each axis of :data:`AXES`), in axis order."""
    vals = [check_axis(a, axes[a]) for a in AXES]
    return [Point(*combo) for combo in product(*vals)]


def pim_grid_points(axes: dict) -> list:
    """Every DIMM-PIM point of ``axes`` (``{axis: values}``, each axis of :data:`PIM_AXES`), in axis order."""
    vals = [check_axis(a, axes[a]) for a in PIM_AXES]
    return [PIMPoint(*combo) for combo in product(*vals)]
