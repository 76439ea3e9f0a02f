"""The KV mapping (hdl/pim/mapping.py) and the re-layout unit's golden (hdl/pim/relayout.py) agree on where an FP16
element of a host write burst lands: the host bursts the mapping asks for, re-laid out, are exactly the rank bursts
the mapping stores in the DRAM model (so the host, the re-layout RTL and the kernel images never disagree)."""

import numpy as np
import pytest

from hdl.pim import mapping, relayout
from hdl.pim.config import PAPER, TINY


@pytest.mark.parametrize("config", [PAPER, TINY], ids=lambda c: c.name)
def test_host_bursts_relayout_to_the_stored_bursts(config):
    rng = np.random.default_rng(7)
    elems = rng.integers(0, 1 << 16, (20, config.chips, config.elems_per_burst), dtype=np.uint64).astype(np.uint16)
    host = mapping.host_write_bursts(config, elems)
    stored = mapping.pack_rank_bursts(config, elems)
    assert len(host) == len(stored) == 20
    for e, h, s in zip(elems, host, stored):
        assert h == relayout.host_burst(e, config)
        assert relayout.relayout_burst(h, config) == s
        assert relayout.inverse_relayout_burst(s, config) == h
        assert np.array_equal(relayout.chip_elements(s, config), e)
    # A conventional DIMM (no re-layout) would store the host burst as is: element bytes split across chips.
    assert any(h != s for h, s in zip(host, stored))
