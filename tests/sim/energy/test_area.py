"""Technology-mapped area and power (sim/energy/area.py): NanGate45 cells via Yosys dfflibmap + abc."""

import json

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.fp import FPAdd, FP16, FP32
from sim.energy import area
from sim.energy.area import (LIBERTY_PATH, MAP_CELLS, SRAM_UM2_PER_BIT, mapped_area, module_areas, read_liberty,
                             reduce_liberty, unit_op_pj, _sram_pj_per_bit)


class _Adders(wiring.Component):
    """``n`` FP16 adders side by side on one input (each a black-boxed unit in module_areas)."""

    def __init__(self, n):
        self.n = n
        super().__init__({"a": In(32), "y": Out(16)})

    def elaborate(self, platform):
        m = Module()
        y = 0
        for k in range(self.n):
            u = FPAdd(fmt=FP16)
            m.submodules[f"u{k}"] = u
            m.d.comb += [u.i.payload.as_value().eq(self.a ^ k), u.i.valid.eq(1), u.o.ready.eq(1)]
            y = y ^ u.o.payload.as_value()
        m.d.comb += self.y.eq(y)
        return m


def _unused_adder():
    """An FP16 adder that the call under test refuses before elaborating (no UnusedElaboratable warning)."""
    u = FPAdd(fmt=FP16)
    u._MustUse__silence = True
    return u


@pytest.fixture(scope="module")
def fp16_add():
    return mapped_area("fp16_add", FPAdd(fmt=FP16))


def test_liberty_is_the_reduced_nangate_file():
    lib = read_liberty()
    assert set(lib.cells) == set(MAP_CELLS)
    # NanGate Open Cell Library typical: NAND2_X1 0.798 um^2, DFF_X1 4.522 um^2 (data/liberty header: provenance)
    assert lib.area("NAND2_X1") == 0.798 and lib.area("DFF_X1") == 4.522
    assert lib.cells["DFF_X1"][2] and not lib.cells["NAND2_X1"][2]
    assert "OpenSTA" in LIBERTY_PATH.read_text()[:2000] and "Apache" in LIBERTY_PATH.read_text()[:2000]


def test_reduce_liberty_reproduces_the_committed_body():
    text = LIBERTY_PATH.read_text()
    assert reduce_liberty(text) == text              # a fixed point: the committed file is reduce_liberty's output


def test_fp16_adder_mapped_area_is_deterministic_and_positive(fp16_add):
    again = mapped_area("fp16_add", FPAdd(fmt=FP16))
    assert fp16_add["logic_um2"] == again["logic_um2"] and fp16_add["by_type"] == again["by_type"]
    assert 500 < fp16_add["logic_um2"] < 5000
    assert 0 < fp16_add["seq_um2"] < fp16_add["logic_um2"] and fp16_add["leak_nw"] > 0
    assert fp16_add["by_type"]["DFF_X1"] > 0 and fp16_add["sram_bits"] == 0
    lib = read_liberty()
    assert fp16_add["logic_um2"] == pytest.approx(sum(n * lib.area(c) for c, n in fp16_add["by_type"].items()))


def test_a_wider_unit_is_larger(fp16_add):
    fp32 = mapped_area("fp32_add", FPAdd(fmt=FP32))
    assert fp32["logic_um2"] > 1.5 * fp16_add["logic_um2"]


def test_doubling_the_instances_doubles_the_unit_area(fp16_add):
    one, two = module_areas("adders1", _Adders(1)), module_areas("adders2", _Adders(2))
    unit1, unit2 = one["modules"]["FPAdd_0"], two["modules"]["FPAdd_0"]
    assert (unit1["instances"], unit2["instances"]) == (1, 2)
    assert unit1["area_um2"] == unit2["area_um2"] == fp16_add["logic_um2"]
    for res in (one, two):
        assert res["logic_um2"] == pytest.approx(sum(m["instances"] * m["area_um2"] for m in res["modules"].values()))
    assert two["logic_um2"] - one["logic_um2"] > 0.9 * fp16_add["logic_um2"]


def test_a_liberty_without_flip_flops_is_an_error(tmp_path):
    lib = tmp_path / "noff.lib"
    lib.write_text(reduce_liberty(LIBERTY_PATH.read_text(), cells=[c for c in MAP_CELLS if not c.startswith("DFF")]))
    with pytest.raises(ValueError, match="no flip-flop cell"):
        mapped_area("fp16_add", _unused_adder(), liberty=lib)


def test_reduce_liberty_names_missing_cells():
    with pytest.raises(ValueError, match="FOO_X1"):
        reduce_liberty(LIBERTY_PATH.read_text(), cells=("NAND2_X1", "FOO_X1"))


def test_memories_are_sram_macros():
    from hdl.pim.bank_pu import BankPU
    from hdl.pim.config import PAPER
    res = module_areas("pim_bank_pu", BankPU(PAPER))
    assert res["sram_bits"] > 0
    assert res["sram_um2"] == pytest.approx(res["sram_bits"] * SRAM_UM2_PER_BIT)
    # L3 4.4 / 6.1: four FP16 multipliers and four adders per bank PU
    by_class = {}
    for m in res["modules"].values():
        by_class[m["class"]] = by_class.get(m["class"], 0) + m["instances"]
    assert by_class["FPMul"] == 4 and by_class["FPAdd"] == 4


def test_per_op_energy_of_units():
    # Horowitz ISSCC 2014: FP16 x FP16 into an FP32 accumulator = 1.1 + 0.9 pJ
    assert unit_op_pj("FPMAC", {"acc": "'fp32'"}) == (pytest.approx(2.0), "Horowitz")
    assert unit_op_pj("FPAdd", {"fmt": "FloatFormat(name='fp16', exp_bits=5, frac_bits=10)"})[0] == 0.4
    pj, basis = unit_op_pj("FPExp", {}, area_um2=2000.0, fp16_add_um2=1000.0)
    assert pj == pytest.approx(0.8) and "estimate" in basis
    # a 8192-bit-wide 1 MiB ring: 128 slices of 8 KiB -> Horowitz 10 pJ per 64 bits
    assert _sram_pj_per_bit(8192, 1 << 20) == pytest.approx(10 / 64)


@pytest.mark.parametrize("call, allowed", [
    (lambda: unit_op_pj("FPAdd", {"fmt": "fp8"}), "allowed fp16, fp32"),
    (lambda: unit_op_pj("FPExp", {}), "no sourced per-op energy"),
    (lambda: _sram_pj_per_bit(64, 2 << 20), r"allowed: 1 \.\. 1048576"),
])
def test_bad_input_names_the_allowed_range(call, allowed):
    with pytest.raises(ValueError, match=allowed):
        call()


def test_missing_liberty_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        mapped_area("fp16_add", _unused_adder(), liberty=tmp_path / "none.lib")


def test_cli_area_of_a_top(tmp_path, capsys):
    from host.cli import main
    out = tmp_path / "a.json"
    assert main(["synth", "--area", "--top", "fp16_add", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["fp16_add"]
    assert res["logic_um2"] > 0 and "fp16_add" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["synth", "--area", "--mode", "fast"])


def test_paper_budgets_are_quotes_not_numbers():
    # neither paper copy states an area or a power (module docstring): nothing to fit to
    for b in area.PAPER_BUDGETS.values():
        assert b["area_mm2"] is None and b["power_w"] is None and b["source"]


def test_a_liberty_missing_a_gate_the_mapping_left_is_an_error(tmp_path):
    # a library whose cells cannot express the netlist's remaining generic cells: _cell_area names the cell
    from sim.energy.area import _cell_area
    with pytest.raises(ValueError, match=r"\$_DFF_P_ x 3 is not in the liberty"):
        _cell_area({"NAND2_X1": 2, "$_DFF_P_": 3}, read_liberty(), "m")


def test_pim_power_arithmetic():
    # L3 4.4 / 6.1: 4 FP16 multiplies + 4 FP16 adds per RD (Horowitz: 4 x 1.1 + 4 x 0.4 = 6.0 pJ); one all-bank RD
    # every tCCD_L = 8 clocks of DDR4-3200's 1.6 GHz = 200 M RD/s; the rank buffer's 64-bit read is Horowitz's
    # 1 MB-array figure (100 pJ) for a 256 KB buffer
    empty = {"modules": {}, "leak_nw": 0.0, "sram_leak_nw": 0.0, "area_um2": 0.0}
    p = area.pim_power({"bank_pu": dict(empty, leak_nw=1000.0), "rank_pu": dict(empty)})
    assert p["rd_per_s"] == pytest.approx(200e6) and p["bank_pj_per_rd"] == pytest.approx(6.0)
    assert p["bank_w"] == pytest.approx(6.0e-12 * 200e6 + 1e-6)
    assert p["rank_w"] == pytest.approx(100e-12 * 200e6)
    assert p["rank_total_w"] == pytest.approx(p["rank_w"] + 128 * p["bank_w"])


def test_the_disk_cache_gives_the_same_areas_and_is_keyed_by_the_rtlil(tmp_path, monkeypatch):
    first = module_areas("adders1", _Adders(1), cache_dir=tmp_path)
    entries = sorted(tmp_path.glob("*.json"))
    assert len(entries) == len(first["modules"])            # one per distinct module mapped
    # a second run reads the cache: Yosys is not called
    monkeypatch.setattr(area.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("yosys ran")))
    again = module_areas("adders1", _Adders(1), cache_dir=tmp_path)
    for key in ("logic_um2", "seq_um2", "leak_nw", "sram_bits", "area_um2"):
        assert again[key] == first[key]
    assert {m: v["by_type"] for m, v in again["modules"].items()} == \
        {m: v["by_type"] for m, v in first["modules"].items()}
    # another design (two adders: a different top module's RTLIL) misses the cache for its top
    with pytest.raises(AssertionError, match="yosys ran"):
        module_areas("adders2", _Adders(2), cache_dir=tmp_path)


class _DeadAdder(wiring.Component):
    """Two FP16 adders, the second one's output read by nothing (dead logic: synthesis removes it)."""

    def __init__(self):
        super().__init__({"a": In(32), "y": Out(16)})

    def elaborate(self, platform):
        m = Module()
        for k in range(2):
            u = FPAdd(fmt=FP16)
            m.submodules[f"u{k}"] = u
            m.d.comb += [u.i.payload.as_value().eq(self.a ^ k), u.i.valid.eq(1), u.o.ready.eq(1)]
            if k == 0:
                m.d.comb += self.y.eq(u.o.payload.as_value())
        return m


def test_a_dead_unit_is_an_error_unless_pruned_then_left_out_and_listed():
    with pytest.raises(ValueError, match="differ from the black boxes Yosys counted"):
        module_areas("dead", _DeadAdder())
    res = module_areas("dead", _DeadAdder(), prune_dead_units=True)
    one = module_areas("adders1", _Adders(1))
    (unit,) = [m for m, v in res["modules"].items() if v["class"] == "FPAdd"]
    assert res["pruned"] == {"dead": {unit: 1}} and res["modules"][unit]["instances"] == 1
    (unit1,) = [m for m, v in one["modules"].items() if v["class"] == "FPAdd"]
    assert res["modules"][unit]["area_um2"] == one["modules"][unit1]["area_um2"]
    assert one["pruned"] == {}
