"""sim/synth/hier.py: per-distinct-module synthesis totals vs a flat synthesis, and its instance-count checks.

A small PE array (2 lanes x 2 rows: 4 FPMACs, each an FPMul + FPAdd, plus the reduction and tree adders) is quick
to synthesize flat; the per-module total must be within 3 % of it (the difference is the optimisation a flat
synthesis does across module boundaries: constant inputs, unused outputs), while one FPMAC more or less (~15 % of
the design) must fall outside that band, and a wrong multiplicity must fail the Yosys cross-check.
"""

import copy

import pytest

from hdl.ndp.pe_array import PEArray
from sim.synth.hier import hier_cells, flat_cells, check_counts, _instances

LANES, ROWS = 2, 2
TOLERANCE = 0.03


def _pe():
    return PEArray(lanes=LANES, batch=ROWS, acc="fp32", max_k=16, acc_columns=16)


@pytest.fixture(scope="module")
def results():
    return hier_cells("pe", _pe(), verify=True), flat_cells("pe", _pe())


def _total(modules, field="cells"):
    return sum(m["instances"] * m[field] for m in modules.values())


def _by_class(modules, cls):
    return sum(m["instances"] for m in modules.values() if m["class"] == cls)


def test_instance_counts_follow_the_geometry(results):
    hier, _ = results
    mods = hier["modules"]
    assert _by_class(mods, "FPMAC") == LANES * ROWS
    assert _by_class(mods, "FPMul") == LANES * ROWS          # one per FPMAC
    # FPAdd: one per FPMAC, plus the reduction and the adder tree of the PE array
    assert _by_class(mods, "FPAdd") > LANES * ROWS
    assert hier["total"]["cells"] == _total(mods)
    assert hier["modules"]["pe"]["instances"] == 1


def test_per_module_total_matches_flat(results):
    hier, flat = results
    for field in ("cells", "flops"):
        h, f = hier["total"][field], flat[field]
        assert abs(h - f) <= TOLERANCE * f, (field, h, f)
    # memories stay SRAM macros in both (not mapped to flip-flops): the same $mem_v2 cells
    assert hier["total"]["memories"] == flat["memories"] > 0
    assert hier["total"]["memory_bits"] > 0


def test_a_wrong_multiplicity_is_caught(results):
    hier, flat = results
    mods = copy.deepcopy(hier["modules"])
    mac = next(m for m, v in mods.items() if v["class"] == "FPMAC")
    for delta in (-1, +1):                       # one FPMAC (its FPMul and FPAdd) too few / too many
        wrong = copy.deepcopy(mods)
        wrong["pe"]["children"][mac] += delta
        _instances("pe", wrong)                  # recount: the FPMAC's FPMul and FPAdd follow it
        assert _by_class(wrong, "FPMul") == LANES * ROWS + delta
        wrong_total = _total(wrong)
        assert abs(wrong_total - flat["cells"]) > TOLERANCE * flat["cells"], (delta, wrong_total, flat["cells"])
        with pytest.raises(ValueError, match="differ from the black boxes Yosys counted"):
            check_counts(wrong)
    check_counts(mods)                           # the true counts pass


def test_paper_core_preset_matches_the_device_memory_port():
    """ndp_core's paper preset is the core on the 64-channel device memory's wide port (NDPDeviceSystem)."""
    from host.topcfg import configure
    from hdl.memctl.devmem import DeviceMemory
    from hdl.ndp.config import PAPER
    spec, cfg = configure("ndp_core", "paper")
    core = spec.build(cfg)
    dm = DeviceMemory(config=cfg.dram, channels=cfg.channels, ndp_tag_width=cfg.tag_width)
    assert core.mem_req.payload.shape() == dm.ndp_request_layout
    assert core.mem_rsp.payload.shape() == dm.ndp_response_layout
    assert dm.line_bits == 8 * PAPER.align_bytes and dm.bytes == PAPER.device_bytes
    assert configure("ndp_core")[0].default == "tiny"
    with pytest.raises(ValueError, match="must equal ndp.align_bytes"):
        configure("ndp_core", "paper", [("channels", "32")])[0].build(configure("ndp_core", "paper",
                                                                               [("channels", "32")])[1])
    for c in [core, dm] + dm.chans + [ch.controller for ch in dm.chans]:
        c._MustUse__silence = True


def test_a_reset_inserter_above_a_unit_is_refused_by_name():
    """A unit under a ResetInserter cannot become a black box: a clear error, not a wrong count."""
    from amaranth.hdl import Module, ResetInserter, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In
    from hdl.fp.add import FPAdd
    from sim.synth.hier import elaborate_distinct

    class Top(wiring.Component):
        clr: In(1)

        def elaborate(self, platform):
            m = Module()
            m.submodules.add = ResetInserter({"sync": self.clr})(FPAdd())
            return m
    with pytest.raises(ValueError, match="FPAdd.*ResetInserter.*flat"):
        elaborate_distinct("top", Top())
