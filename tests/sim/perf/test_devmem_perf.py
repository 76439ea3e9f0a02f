"""The device memory system's fast model (sim/perf/devmem.py): cached per-kernel answers and the slice property.

The model's cycle-exactness against the RTL is tested in tests/hdl/memctl/test_devmem.py (same Verilator build as
the bit-exact tests); the compiled kernel against its Python reference in tests/sim/perf/test_dram_perf.py.
"""

import numpy as np
import pytest

from hdl.memctl.timing import LPDDR5X_8533
from sim.perf.devmem import DeviceMemoryPerfModel, stream_cycles, stream_time

#: Bound of the cached curve (linear between grid points 1/8 octave apart) against an exact simulation: regular
#: patterns are within a few cycles of linear; a random stream's count fluctuates with the draw.
CACHE_BOUND = {"seq": 0.005, "random": 0.02}


def test_cached_stream_cycles_within_bound():
    rng = np.random.default_rng(4)
    for pattern in ("seq", "random"):
        worst = 0.0
        for n in [1, 17, 64] + sorted(int(x) for x in rng.integers(65, 6_000, 4)):
            cached = stream_cycles(n, pattern)
            exact = stream_cycles(n, pattern, exact=True)
            err = abs(cached - exact) / exact
            worst = max(worst, err)
            assert err <= CACHE_BOUND[pattern], (pattern, n, cached, exact)
            if n <= 64:
                assert cached == exact
        print(f"\n{pattern}: cached vs exact: worst {100 * worst:.3f} % (bounds {CACHE_BOUND})")


def test_stream_time_is_cycles_times_tck_and_near_peak():
    n = 1 << 30
    t = stream_time(n)
    lines = n // (64 * 64)
    assert t == pytest.approx(stream_cycles(lines) * LPDDR5X_8533.timing.tck_ps * 1e-12, rel=1e-12)
    gbps = n / t / 1e9
    print(f"\n1 GiB sequential over 64 channels: {1e3 * t:.3f} ms = {gbps:.1f} GB/s")
    assert 0.95 * 1091.7 <= gbps <= 1091.7
    with pytest.raises(ValueError):
        stream_time(1024, "zigzag")


def test_per_channel_schedule_does_not_depend_on_the_channel_count():
    """An NDP line is one granule of every channel at the same address: the per-channel stream, hence the cycle
    count, is the same at every slice (the RTL shows it at 1, 2, 4, 8 channels: make bench-dram)."""
    lines = np.random.default_rng(2).integers(0, 1 << 20, 1500)
    counts = {n: DeviceMemoryPerfModel(LPDDR5X_8533, channels=n).ndp_stream_cycles(lines) for n in (1, 8, 64)}
    assert len(set(counts.values())) == 1, counts
