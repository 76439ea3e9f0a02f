"""The LPDDR5X refresh model of the e2e NDP timing (host.e2e.perf.RankRefresh): which address bits select a rank
on the e2e device, and when a rank's refresh stalls a descriptor's operand reads (the calibration and the model
against the RTL's waves: tests/host/e2e/test_e2e_ndp.py)."""

from types import SimpleNamespace

import numpy as np
import pytest

from firmware.ndp.descriptor import load, store, softmax
from host.e2e.calibrate import rank_bits, refresh_params
from host.e2e.ndp import NDPDevices
from host.e2e.perf import RankRefresh, rank_of, NDPTiming, load_calibration

PARAMS = {"model": "rank", "interval": 1000, "cycles": 100, "prea": 10, "ranks": 2, "stagger": 500, "owed": 1000,
          "rank_bits": [16], "first_issue": [0.0, 0.0]}


@pytest.fixture(scope="module")
def device():
    return NDPDevices("rtl", 1, memory="lpddr5x", channels=2)


def test_rank_bits_follow_the_device_address_map(device):
    mem = device.system().inner.memory.memory
    bits = rank_bits(mem)
    assert bits == [16]                        # 2 channels x 64-byte granules; rank above bg, col, bank (11 bits)
    off, ranks = mem.amap.offsets["rank"], mem.config.org.ranks
    rng = np.random.default_rng(5)
    for a in rng.integers(0, mem.bytes, 300):
        _, burst, _ = mem.locate(int(a))
        assert rank_of(int(a), bits) == (burst >> off) & (ranks - 1)
    p = refresh_params(device, [0.0, 0.0])
    assert (p["interval"], p["cycles"], p["prea"], p["stagger"]) == (4164, 299, 23, 2082)   # LPDDR5X-8533 timing


def test_rank_bits_refuse_a_map_that_is_not_a_bit_permutation():
    amap = SimpleNamespace(offsets={"rank": 3})
    two = SimpleNamespace(amap=amap, config=SimpleNamespace(org=SimpleNamespace(ranks=2)), bytes=1 << 8,
                          locate=lambda a: (0, 8 if a in (16, 32) else 0, 0))    # two address bits -> rank 1
    with pytest.raises(ValueError, match="not a bit permutation"):
        rank_bits(two)


def _load(base, nbytes):
    return load(base, nbytes // 64, 32)


def test_a_refresh_owed_before_the_reads_stalls_them():
    m = RankRefresh(PARAMS, first_abs=0)
    # rank 0 owes at 1000 and is idle: blocked 1000 .. 1110; reads from 1050 wait 60 cycles
    assert m.stall(_load(0, 4096), 1050, 1150) == (1210, 60)


def test_the_other_rank_is_not_stalled():
    m = RankRefresh(PARAMS, first_abs=0)
    assert m.stall(_load(1 << 16, 4096), 1050, 1150) == (1150, 0)    # rank 1 owes at 1500


def test_a_stores_writes_wait_too_and_a_softmax_touches_no_memory():
    assert RankRefresh(PARAMS, first_abs=0).stall(store(0, 64, 32), 1050, 1150) == (1210, 60)
    assert RankRefresh(PARAMS, first_abs=0).windows(softmax(1, 64), 1050, 1150) == []


def test_a_refresh_owed_during_the_reads_waits_for_them_and_stalls_the_next_reads():
    m = RankRefresh(PARAMS, first_abs=0)
    assert m.stall(_load(0, 4096), 950, 1050) == (1050, 0)           # postponed to the end of the reads
    assert m.stall(_load(4096, 4096), 1100, 1200) == (1260, 60)      # blocked 1050 .. 1160


def test_a_descriptor_across_the_rank_boundary_stalls_in_its_second_half():
    m = RankRefresh(PARAMS, first_abs=450)     # run-relative: rank 0 owes at 550, rank 1 at 1500 - 450 = 1050
    d = _load((1 << 16) - 2048, 4096)          # half in rank 0, half in rank 1
    assert [r for r, *_ in m.windows(d, 1000, 1200)] == [0, 1]
    # rank 1 is idle while rank 0 is read: refreshed 1050 .. 1160; its reads from 1100 wait 60 cycles
    assert m.stall(d, 1000, 1200) == (1260, 60)


def test_no_refresh_model_on_the_burst_memory_and_an_old_calibration_is_refused():
    cal = load_calibration(memory="burst")
    assert "refresh" not in cal
    lp = load_calibration(memory="lpddr5x", channels=2)
    assert lp["refresh"]["model"] == "rank" and lp["gap_pair"]
    old = dict(lp, refresh={"interval": 4164, "cycles": 299, "phase": 0, "first_issue": [0, 0]})
    with pytest.raises(ValueError, match="rank model"):
        NDPTiming(None, old)
