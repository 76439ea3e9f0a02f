"""The sourced per-op energy table (sim/energy/ops.py)."""

import pytest

from sim.energy.ops import OP_PJ, op_pj, sram_read_pj


def test_figures_are_the_sources():
    # Horowitz ISSCC 2014, 45 nm 0.9 V
    assert (op_pj("fp16_mul"), op_pj("fp16_add"), op_pj("fp32_add")) == (1.1, 0.4, 0.9)
    assert all(v > 0 for v in OP_PJ.values())


def test_sram_read_takes_the_next_larger_array():
    assert sram_read_pj(64, 8 * 1024) == 10.0
    assert sram_read_pj(128, 8 * 1024 + 1) == 40.0
    assert sram_read_pj(64, 1024 * 1024) == 100.0


@pytest.mark.parametrize("call", [lambda: op_pj("fp8_mul"), lambda: sram_read_pj(64, 2 * 1024 * 1024),
                                  lambda: sram_read_pj(-1, 1024), lambda: sram_read_pj(64, 0)])
def test_bad_input_is_an_error(call):
    with pytest.raises(ValueError):
        call()
