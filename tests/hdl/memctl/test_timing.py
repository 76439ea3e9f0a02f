"""DRAM organisation / timing validation, presets and derived figures (hdl/memctl/timing.py)."""

import dataclasses

import pytest

from hdl.memctl.timing import (
    DDR4_3200, DDR4_3200_TINY, LPDDR5X_8533, LPDDR5X_8533_TINY, PRESETS, DRAMConfig, DRAMOrg, DRAMTiming,
    peak_bandwidth_gbps, preset, refresh_efficiency,
)


def test_presets_registered():
    assert set(PRESETS) == {"ddr4-3200", "ddr4-3200-tiny", "lpddr5x-8533", "lpddr5x-8533-tiny"}
    for name, cfg in PRESETS.items():
        assert preset(name) is cfg
        assert cfg.name == name
    with pytest.raises(ValueError, match="unknown DRAM preset 'ddr9'"):
        preset("ddr9")


def test_presets_revalidate():
    # Rebuilding each preset from its fields runs every validation again.
    for cfg in PRESETS.values():
        org = DRAMOrg(**{f.name: getattr(cfg.org, f.name) for f in dataclasses.fields(DRAMOrg)})
        tm = DRAMTiming(**{f.name: getattr(cfg.timing, f.name) for f in dataclasses.fields(DRAMTiming)})
        assert DRAMConfig(name=cfg.name, org=org, timing=tm) == cfg


def test_ddr4_3200_matches_l3_table2():
    t = DDR4_3200.timing
    # L3 Table 2: BL=4:CCD=4:RRD=4/8:RCD=22:RAS=52:RP=22:RC=74:CL=22:WL=16:CDLR=4/12:WR=24:CCDL=8:RTP=12
    assert DDR4_3200.org.burst_cycles == 4
    assert (t.tCCD_S, t.tRRD_S, t.tRRD_L, t.tRCD, t.tRAS, t.tRP, t.tRC) == (4, 4, 8, 22, 52, 22, 74)
    assert (t.CL, t.CWL, t.tWTR_S, t.tWTR_L, t.tWR, t.tCCD_L, t.tRTP) == (22, 16, 4, 12, 24, 8, 12)
    assert t.tck_ps == 625
    assert t.tFAW == 34          # max(20 nCK, 21 ns) at 0.625 ns
    assert t.tREFI == 12480      # 7.8 us
    assert t.tRFC == 560         # 350 ns, 8 Gb
    assert t.tRTRS == 2
    assert t.tRPab == t.tRP
    o = DDR4_3200.org
    assert (o.channels, o.ranks, o.bank_groups, o.banks_per_group) == (16, 2, 4, 4)
    assert (o.rows, o.columns, o.device_width, o.devices_per_rank, o.burst_length) == (65536, 1024, 8, 8, 8)
    assert o.bus_width == 64 and o.burst_bytes == 64 and o.bursts_per_row == 128


def test_tiny_presets_share_timing():
    assert DDR4_3200_TINY.timing is DDR4_3200.timing
    assert LPDDR5X_8533_TINY.timing is LPDDR5X_8533.timing
    for tiny in (DDR4_3200_TINY, LPDDR5X_8533_TINY):
        assert tiny.org.channels == 1 and tiny.org.rows == 32 and tiny.org.columns == 256


def test_lpddr5x_8533():
    t, o = LPDDR5X_8533.timing, LPDDR5X_8533.org
    assert o.beats_per_clock == 8 and o.burst_length == 16 and o.burst_cycles == 2
    assert o.bus_width == 16 and o.channels == 64
    assert o.system_bytes == 512 * 2**30
    assert t.tCCD_S == o.burst_cycles and t.tCCD_L == 4
    assert t.tRC == t.tRAS + t.tRP
    assert t.tRPab > t.tRP
    assert (t.tRCD, t.tRP, t.tRPab, t.tRAS, t.tFAW, t.tRFC, t.tREFI) == (20, 20, 23, 45, 22, 299, 4164)
    # Every ns-specified value really covers its ns minimum at the stored clock.
    ns = {"tRCD": 18, "tRP": 18, "tRPab": 21, "tRAS": 42, "tRRD_S": 5, "tFAW": 20, "tWTR_S": 6.25,
          "tWTR_L": 12, "tWR": 34, "tRFC": 280}
    for name, v in ns.items():
        assert getattr(t, name) * t.tck_ps >= v * 1000, name
    assert t.tREFI * t.tck_ps <= 3906 * 1000


def test_peak_bandwidth():
    bw = peak_bandwidth_gbps(DDR4_3200)
    assert bw.channel == pytest.approx(25.6)
    assert bw.system == pytest.approx(409.6)  # the L3 paper quotes 406 GB/s CPU-side
    bw = peak_bandwidth_gbps(LPDDR5X_8533)
    assert bw.channel == pytest.approx(17.06, abs=0.01)
    assert bw.system == pytest.approx(1092, abs=2)  # ~1.09 TB/s, the papers' ~1.1 TB/s
    assert DDR4_3200.data_rate_mts == pytest.approx(3200)


def test_refresh_efficiency():
    assert refresh_efficiency(DDR4_3200) == pytest.approx(1 - 560 / 12480)
    assert 0.9 < refresh_efficiency(LPDDR5X_8533) < 0.95


# ---- validation: every constraint raises, naming itself and the values -----------------------------------------

def _org(**kw):
    return dataclasses.replace(DDR4_3200.org, **kw)


def _tm(**kw):
    return dataclasses.replace(DDR4_3200.timing, **kw)


@pytest.mark.parametrize("field", ["channels", "ranks", "bank_groups", "banks_per_group", "rows", "columns",
                                   "device_width", "devices_per_rank", "burst_length", "beats_per_clock"])
@pytest.mark.parametrize("value", [0, -4])
def test_org_counts_positive(field, value):
    with pytest.raises(ValueError, match=rf"{field} must be >= 1, got {value}"):
        _org(**{field: value})


@pytest.mark.parametrize("field,value", [("ranks", 3), ("bank_groups", 6), ("banks_per_group", 3),
                                         ("rows", 1000), ("columns", 768), ("burst_length", 12)])
def test_org_power_of_two(field, value):
    with pytest.raises(ValueError, match=rf"{field} must be a power of two, got {value}"):
        _org(**{field: value})


def test_org_columns_divisible_by_burst():
    with pytest.raises(ValueError, match=r"columns \(8\) not divisible by burst_length \(16\)"):
        _org(columns=8, burst_length=16)


def test_org_burst_divisible_by_beats():
    with pytest.raises(ValueError, match=r"burst_length \(8\) not divisible by beats_per_clock \(3\)"):
        _org(beats_per_clock=3)


def test_org_type_checked():
    with pytest.raises(ValueError, match=r"rows must be an int, got 32.0"):
        _org(rows=32.0)


POSITIVE = ["tck_ps", "CL", "CWL", "tRCD", "tRP", "tRAS", "tRC", "tCCD_S", "tCCD_L", "tRRD_S", "tRRD_L", "tFAW",
            "tWTR_S", "tWTR_L", "tWR", "tRTP", "tREFI", "tRFC", "tRPab"]


@pytest.mark.parametrize("field", POSITIVE)
def test_timing_positive(field):
    with pytest.raises(ValueError, match=rf"{field} must be >= 1, got 0"):
        _tm(**{field: 0})


@pytest.mark.parametrize("field", ["tRTRS", "tRTW"])
def test_timing_bubbles_non_negative(field):
    _tm(**{field: 0})  # allowed
    with pytest.raises(ValueError, match=rf"{field} must be >= 0, got -1"):
        _tm(**{field: -1})


@pytest.mark.parametrize("kw,msg", [
    (dict(tRC=70), r"tRC \(70\) < tRAS \(52\) \+ tRP \(22\)"),
    (dict(tCCD_L=2, tCCD_S=4), r"tCCD_L \(2\) < tCCD_S \(4\)"),
    (dict(tRRD_L=3), r"tRRD_L \(3\) < tRRD_S \(4\)"),
    (dict(tWTR_L=3), r"tWTR_L \(3\) < tWTR_S \(4\)"),
    (dict(tREFI=560), r"tREFI \(560\) <= tRFC \(560\)"),
    (dict(tRPab=21), r"tRPab \(21\) < tRP \(22\)"),
])
def test_timing_consistency(kw, msg):
    with pytest.raises(ValueError, match=msg):
        _tm(**kw)


def test_tfaw_below_four_trrd_is_allowed():
    # JEDEC does not imply tFAW >= 4 * tRRD_S (LPDDR5X-8533 itself has 22 < 4 * 6 after rounding).
    assert LPDDR5X_8533.timing.tFAW < 4 * LPDDR5X_8533.timing.tRRD_S
    _tm(tFAW=10)


def test_config_bus_saturable():
    with pytest.raises(ValueError, match=r"burst_cycles \(4\) > tCCD_S \(2\)"):
        DRAMConfig(name="x", org=DDR4_3200.org, timing=_tm(tCCD_S=2))


def test_config_types():
    with pytest.raises(ValueError, match="org must be a DRAMOrg"):
        DRAMConfig(name="x", org=None, timing=DDR4_3200.timing)
    with pytest.raises(ValueError, match="timing must be a DRAMTiming"):
        DRAMConfig(name="x", org=DDR4_3200.org, timing=None)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DDR4_3200.timing.tRCD = 1
