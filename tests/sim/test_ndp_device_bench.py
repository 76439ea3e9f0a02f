"""sim/bench/ndp_device.py's inputs (no RTL: the bench itself is `make bench-ndp-device`): every case's program
is accepted by the slice it runs on, fits the data-keeping channels, and a bad case is refused by name."""

import pytest

from firmware.ndp.descriptor import ErrorCode
from hdl.ndp.config import slice_preset
from sim.bench import ndp_device as B


@pytest.mark.parametrize("case", B.CASES)
def test_case_programs_fit_the_slice(case):
    cfg = B.slice_config(2)
    assert cfg.lanes == slice_preset(2).lanes and cfg.device_bytes == 2 * (2 << 20)   # 2 MiB per channel
    stores, kernel = B.kernel_program(case, cfg)
    assert stores and kernel
    for d, _ in stores + kernel:
        assert d.validate(cfg) == ErrorCode.OK, (case, d)
        assert d.base_addr + d.operand_bytes <= cfg.device_bytes


def test_bad_case_is_refused():
    with pytest.raises(ValueError, match="unknown case 'e5'; allowed: e4, attention, e3, e2"):
        B.kernel_program("e5", B.slice_config(2))
