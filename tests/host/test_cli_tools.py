"""ndpim verilog --list / --preset / --set, ndpim ports, ndpim bench / fuzz dispatch (no synthesis tools needed)."""

import pytest

from host.cli import main, BENCHES, FUZZ
from host.topcfg import catalogue, configure, ports_markdown, describe, silence


def test_every_top_is_catalogued_with_a_buildable_default():
    from hdl.tops import TOPS
    cat = catalogue()
    assert set(TOPS) <= set(cat)
    for name in ("ndp_decoder", "ndp_pe_array", "pim_bank_pu", "memctl_ddr4_3200", "fp16_mul"):
        spec = cat[name]
        comp = spec.build(spec.config())
        assert comp.signature.members
        silence(comp)


def test_set_validates_and_names_the_field():
    spec, cfg = configure("ndp_decoder", "tiny", [("lanes", "16"), ("macs", "32")])
    assert cfg.lanes == 16 and cfg.macs == 32
    with pytest.raises(ValueError, match="lanes must be a power of two"):
        configure("ndp_decoder", "tiny", [("lanes", "12")])
    with pytest.raises(ValueError, match="no field 'lane'"):
        configure("ndp_decoder", "tiny", [("lane", "16")])
    with pytest.raises(ValueError, match="rows must be a power of two"):
        configure("pim_bank_pu", "tiny", [("dram.org.rows", "100")])
    with pytest.raises(ValueError, match="no preset"):
        configure("ndp_decoder", "huge")


def test_cli_verilog_list_and_custom_top(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["verilog", "--list"]) == 0
    out = capsys.readouterr().out
    assert "ndp_decoder" in out and "paper, tiny" in out and "macs=1024" in out
    assert main(["verilog", "--top", "fp16_add", "--preset", "default", "--out", "v"]) == 0
    assert (tmp_path / "v" / "fp16_add.v").read_text().startswith("/*") or (tmp_path / "v" / "fp16_add.v").exists()
    cached = list((tmp_path / "build" / "verilog-cache").glob("*.v"))
    assert len(cached) == 1
    capsys.readouterr()
    for argv, message in ((["--top", "ndp_decoder", "--preset", "tiny", "--set", "lanes=3"],
                           "argument --set: lanes: NDPConfig 'tiny': lanes must be a power of two"),
                          (["--preset", "tiny"], "argument --top: --preset / --set need exactly one --top")):
        with pytest.raises(SystemExit) as e:
            main(["verilog"] + argv)
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_ports_page_names_fields_and_bits():
    md = ports_markdown(["ndp_core", "fp16_mul"])
    assert "`desc.header.op` [4, 8)" in md and "`desc.base_addr` [20, 84)" in md and "`owner` [204, 236)" in md
    assert "| `i` | in stream | 32 |" in md


def test_bench_and_fuzz_modules_exist():
    import importlib.util

    def exists(m):
        try:
            return importlib.util.find_spec(m) is not None
        except ModuleNotFoundError:
            return False
    for name, mods in list(BENCHES.items()) + [("fuzz", FUZZ)]:
        assert any(exists(m) for m in mods), name
    with pytest.raises(SystemExit):
        main(["bench", "nope"])


@pytest.mark.parametrize("name", sorted(BENCHES) + ["fuzz"])
def test_bench_help_prints_usage_and_runs_nothing(name, capsys):
    """`ndpim bench NAME --help` (and `ndpim fuzz --help`) prints the bench's usage and exits 0 instead of starting
    the bench (two of them ignored their arguments and ran); an unknown option is refused."""
    argv = ["fuzz", "--help"] if name == "fuzz" else ["bench", name, "--help"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_status_explanations_name_the_limit():
    from dataclasses import replace
    from hdl.ndp.config import TINY
    from hdl.ndp.descriptor import ErrorCode
    from firmware.ndp.descriptor import gemv, gemm, load
    from host.ndp_status import explain
    d = gemv(0, 688, 16)
    st = d.validate(TINY)
    assert st == ErrorCode.OPERAND_TOO_LARGE
    text = explain(st, d, TINY)
    assert "OPERAND_TOO_LARGE" in text and "22016 bytes" in text and "dram_buffer_bytes = 4096" in text
    g = gemm(0, 8, 64, 16)
    assert g.validate(TINY) == ErrorCode.INPUT_TOO_LARGE or g.validate(TINY) == ErrorCode.BATCH_TOO_LARGE
    assert "max_batch = 4" in explain(ErrorCode.BATCH_TOO_LARGE, g, TINY)
    m = gemv(32, 64, 16)
    assert explain(m.validate(TINY), m, TINY).startswith("MISALIGNED: base_addr 0x20")
    assert "window [0x1000, 0x2000)" in explain(16, load(0, 1, 32), TINY, window=(0x1000, 0x2000))
    for code in ErrorCode:
        assert explain(code, gemv(0, 64, 16), TINY)
