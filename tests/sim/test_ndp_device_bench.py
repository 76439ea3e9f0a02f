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
    with pytest.raises(ValueError, match="unknown case 'e5'; allowed: e4, attention, e3, e2, gemv"):
        B.kernel_program("e5", B.slice_config(2))


@pytest.mark.parametrize("channels", [1, 2])
def test_device_init_places_every_byte_where_the_memory_reads_it(channels):
    """``--preload``'s DRAM contents read back through the device memory's own fill model
    (sim.devmem.model.storage_fill: interleave + controller address map + flat burst index) give the image; a
    byte moved to another burst is caught."""
    import numpy as np
    from hdl.memctl.devmem import DeviceMemory, GRANULE_BYTES
    from sim.devmem.model import storage_fill
    dram = B.data_config()
    image = np.random.default_rng(channels).integers(0, 256, 4 * GRANULE_BYTES * channels + 96, np.uint8)
    image[100:164] = 0                                   # all-zero bursts are left out of the dict
    inits = B.device_init(image.tobytes(), channels, dram)
    dm = DeviceMemory(config=dram, channels=channels)
    dm._MustUse__silence = True

    def readback(inits):
        fill = storage_fill(dm, inits)
        return b"".join(fill(g).to_bytes(GRANULE_BYTES, "little") for g in range(-(-image.size // GRANULE_BYTES)))

    assert readback(inits)[:image.size] == image.tobytes()
    c = next(i for i, d in enumerate(inits) if len(d) >= 2)
    (a0, v0), (a1, v1) = list(inits[c].items())[:2]
    bad = [dict(d) for d in inits]
    bad[c][a0], bad[c][a1] = v1, v0
    assert readback(bad)[:image.size] != image.tobytes()
