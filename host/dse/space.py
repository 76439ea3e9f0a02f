"""The design space of ``ndpim dse``: the NDP core's geometry, as the calibrated PLoRA host model prices it.

Axes (each a list of values; a point is one value of each):

* ``macs``: FP16 MACs of the core. The calibrated model derives the geometry from it
  (host/plora/ndp_model.py ``NDPDeviceSpec.ndp_config``): 512 lanes x ``macs / 512`` PE rows from 1,024 MACs up,
  else ``min(128, macs / 2)`` lanes x the rest as rows; the SFU is ``min(128, lanes)`` wide. So lanes, PE rows
  and softmax width are swept *through* ``macs``, never independently (the host's calibrated model has no other
  geometry per MAC count).
* ``dram_buffer_kib`` / ``input_buffer_kib`` / ``output_buffer_kib``: the three operand rings
  (hdl/ndp/config.py; PLoRA set-up "3 MB of SRAM (input, DRAM and output buffers)").

Not swept (docs/dse.md, and every run's dse.json says so): the device-memory channels (their DRAM dies and PHYs
have no area or power in the 45 nm cell model, so a per-mm^2 figure would get their bandwidth for free), the
clock (tied to the memory's CK, hdl/ndp/config.CORE_CLOCK_RATIO), and the DIMM-PIM units (see :data:`NOT_SWEPT`).
"""

from dataclasses import dataclass
from itertools import product

__all__ = ["Point", "AXES", "GRIDS", "NOT_SWEPT", "grid_points"]

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

NOT_SWEPT = {
    "ndp.channels / internal_bw_gbps": "the device memory's LPDDR5X dies and PHYs have no area or power in the "
        "NanGate45 cell model (sim/energy/area.py): a per-mm^2 figure would count their bandwidth for free; "
        "held at the paper's 64 channels (1.1 TB/s)",
    "ndp.lanes / pe_batch / sfu_lanes": "set by macs: the calibrated host model derives its geometry from the MAC "
        "count (host/plora/ndp_model.py NDPDeviceSpec.ndp_config), so they are swept through macs",
    "ndp.clock": "tied to the device memory's CK (hdl/ndp/config.CORE_CLOCK_RATIO, 1 GHz)",
    "pim.rank_adders": "the L3 host's DIMM-PIM timing is calibrated from RTL per rank-PU geometry "
        "(data/pim_rtl_calibration.json: only a8 at the PAPER channel c8-b16-d128); another adder count needs "
        "`python -m sim.bench.pim --calibrate` (a Verilator build of the whole channel), which this command does "
        "not run, and no model is substituted",
    "pim.bank_pu_multipliers": "fixed by the chip burst (64-bit RD / 16 bit = 4, hdl/pim/config.py)",
    "pim.bank_pu_adders / rank_buffer_bytes / softmax width": "not parameters of the calibrated PIM timing "
        "(sim/perf/pim.py calibration_key: chips, banks, head dim, rank adders, accumulator, DRAM timing): "
        "sweeping them would change area with no priced change in throughput",
}


@dataclass(frozen=True)
class Point:
    macs: int
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


def check_axis(name, values) -> tuple:
    """``values`` of axis ``name``, checked (ValueError naming the axis and its allowed range)."""
    (lo, hi), _doc = AXES[name]
    bad = [v for v in values if not lo <= v <= hi or (name == "macs" and v & (v - 1))]
    if bad:
        extra = ", a power of two" if name == "macs" else ""
        raise ValueError(f"--{name.replace('_', '-')}: {bad} outside the allowed range {lo} .. {hi}{extra}")
    return tuple(values)


def grid_points(axes: dict) -> list:
    """Every point of ``axes`` (``{axis: values}``, each axis of :data:`AXES`), in axis order."""
    vals = [check_axis(a, axes[a]) for a in AXES]
    return [Point(*combo) for combo in product(*vals)]
