"""Small things a user notices (issue 32 item 9): the Verilog file name follows the configured format, and
``verilog --list --top T`` shows every field of every preset of T."""

from host.cli import main
from host.topcfg import catalogue, describe


def test_the_file_name_follows_the_format(tmp_path, capsys):
    for top, sets, name in (("fp16_add", ["fmt=fp32"], "fp32_add"), ("fp16_mul", ["out_fmt=fp32"], "fp16_mul_fp32"),
                            ("fp16_mac_fp16", ["acc=fp32"], "fp16_mac_fp32"), ("fp16_add", ["fmt=fp16"], "fp16_add")):
        argv = ["verilog", "--top", top, "--out", str(tmp_path)]
        for s in sets:
            argv += ["--set", s]
        assert main(argv) == 0
        text = (tmp_path / f"{name}.v").read_text()
        assert f"module {name}" in text                   # the module inside is named alike
    assert not (tmp_path / "fp16_add.v").read_text().count("fp32")   # (the fp16 adder's own file)
    capsys.readouterr()


def test_list_of_one_top_shows_its_whole_configuration(capsys):
    assert main(["verilog", "--list", "--top", "ndp_core"]) == 0
    out = capsys.readouterr().out
    spec = catalogue()["ndp_core"]
    for preset in spec.presets:
        assert f"preset {preset}" in out
        for item in describe(spec.config(preset)).split():
            assert f"    {item}\n" in out
    assert "more)" not in out                             # nothing cut
