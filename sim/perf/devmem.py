"""Fast model of the device memory system (hdl/memctl/devmem.py): N channels behind the NDP / host arbiter.

An NDP line is one 64-byte granule in every channel at the same channel address, so for a stream of NDP lines
alone every channel receives the same requests at the same cycles and does the same thing: the model runs one
channel (:class:`sim.perf.dram.DRAMPerfModel`, the controller's event-driven replay) behind the device memory
system's front end (:class:`sim.perf.dram.EntryFrontend`: grant, request FIFO, burst splitter, reorder-buffer
slots, in-order hand-over). That makes it exact at any channel count, 64 included: the per-channel schedule does
not depend on N (the slices test of tests/sim/devmem shows it in RTL at 1, 2, 4 and 8 channels).
"""

import numpy as np

from hdl.memctl.devmem import GRANULE_BYTES, channel_burst_address
from hdl.memctl.addrmap import AddressMap, DEFAULT_ORDER
from hdl.memctl.controller import DEFAULT_QUEUE_DEPTH
from hdl.memctl.timing import LPDDR5X_8533, peak_bandwidth_gbps
from .dram import DRAMPerfModel, EntryFrontend

__all__ = ["DeviceMemoryPerfModel", "stream_cycles", "stream_time"]


class DeviceMemoryPerfModel:
    """``channels`` channels of ``config`` with the :class:`hdl.memctl.devmem.DeviceMemory` parameters
    ``ndp_slots``, ``fifo_depth``, ``queue_depth``, ``policy``, ``max_postponed_refresh``."""

    def __init__(self, config=LPDDR5X_8533, *, channels: int = 64, ndp_slots: int = 32, fifo_depth: int = 2,
                 queue_depth: int = DEFAULT_QUEUE_DEPTH, policy: str = "fr-fcfs", max_postponed_refresh: int = 8,
                 addr_order=DEFAULT_ORDER):
        if channels < 1 or channels & (channels - 1) or channels > 64:
            raise ValueError(f"channels must be a power of two in 1..64, got {channels}")
        self.config = config
        self.channels = channels
        self.ndp_slots, self.fifo_depth = ndp_slots, fifo_depth
        self.channel = DRAMPerfModel(config, policy=policy, queue_depth=queue_depth,
                                     max_postponed_refresh=max_postponed_refresh, addr_order=addr_order)
        self.amap = self.channel.amap
        self.bursts_per_granule = GRANULE_BYTES // config.org.burst_bytes
        self.line_bytes = GRANULE_BYTES * channels
        #: NDP line address bits: the channel's granules.
        self.line_addr_bits = self.amap.addr_bits - (self.bursts_per_granule.bit_length() - 1)

    def channel_bursts(self, lines) -> np.ndarray:
        """Controller burst addresses, in order, that every channel receives for NDP ``lines`` (line addresses)."""
        e = np.asarray(lines, dtype=np.int64).ravel()
        S = self.bursts_per_granule
        sub = np.tile(np.arange(S, dtype=np.int64), e.size)
        return channel_burst_address(self.amap, S, np.repeat(e, S), sub)

    def ndp_simulate(self, lines, writes=None):
        """:class:`sim.perf.dram.StreamResult` of a back-to-back stream of NDP line requests (one channel's
        schedule; ``cycles`` as ``StreamRun.cycles`` of the RTL top with an always-ready response port)."""
        S = self.bursts_per_granule
        w = None if writes is None else np.repeat(np.broadcast_to(np.asarray(writes, dtype=bool),
                                                                  (np.asarray(lines).size,)), S)
        fe = EntryFrontend(bursts=S, fifo_depth=self.fifo_depth, slots=self.ndp_slots)
        return self.channel.simulate(self.channel_bursts(lines), w, frontend=fe)

    def ndp_stream_cycles(self, lines, writes=None) -> int:
        return self.ndp_simulate(lines, writes).cycles

    def peak_gbps(self) -> float:
        return peak_bandwidth_gbps(self.config).channel * self.channels

    def bandwidth_gbps(self, n_lines: int, cycles: int) -> float:
        return n_lines * self.line_bytes / (cycles * self.config.timing.tck_ps) * 1000.0


# ---- cached per-kernel answers for the host's sweeps ----------------------------------------------------------

#: Exact points of the cached curves: every line count up to 64, then 8 per octave (geometric), up to 2**26 lines.
_GRID = np.unique(np.concatenate([np.arange(1, 65), np.round(2.0 ** np.arange(6, 26.001, 1 / 8)).astype(np.int64)]))
_MODELS = {}


def _pattern_lines(pattern: str, n: int, seed: int = 1) -> np.ndarray:
    if pattern == "seq":
        return np.arange(n, dtype=np.int64)
    if pattern.startswith("stride"):
        return np.arange(n, dtype=np.int64) * int(pattern[6:])
    if pattern == "random":
        return np.random.default_rng(seed).integers(0, 1 << 24, n)
    raise ValueError(f"pattern must be 'seq', 'stride<k>' or 'random', got {pattern!r}")


class _Curve:
    """Exact cycle counts of one (model, pattern, direction) at the grid points, computed on demand; queries in
    between interpolate linearly (the cycle count of a stream is within a few cycles of linear between neighbouring
    grid points; the test measures the bound)."""

    def __init__(self, model, pattern, write):
        self.model, self.pattern, self.write = model, pattern, write
        self.exact = {}

    def at(self, n):
        if n not in self.exact:
            lines = _pattern_lines(self.pattern, n) % (1 << self.model.line_addr_bits)
            self.exact[n] = self.model.ndp_stream_cycles(lines, np.full(n, self.write) if self.write else None)
        return self.exact[n]

    def cycles(self, n):
        if n <= 0:
            return 0
        if n > _GRID[-1]:   # beyond the grid: the rate of the last octave (steady state over many tREFI)
            a, b = int(_GRID[-9]), int(_GRID[-1])
            ca, cb = self.at(a), self.at(b)
            return cb + (n - b) * (cb - ca) / (b - a)
        i = int(np.searchsorted(_GRID, n))
        b = int(_GRID[i])
        if b == n:
            return float(self.at(n))
        a = int(_GRID[i - 1])
        ca, cb = self.at(a), self.at(b)
        return ca + (n - a) * (cb - ca) / (b - a)


def stream_cycles(n_lines: int, pattern: str = "seq", channels: int = 64, *, write: bool = False,
                  config=LPDDR5X_8533, exact: bool = False) -> float:
    """Cycles (memory clock) of ``n_lines`` NDP line requests (``channels`` x 64 bytes each) offered back to back.
    ``pattern``: ``"seq"``, ``"stride<k>"`` (line k x i), ``"random"`` (uniform, fixed seed). Cached: the exact
    count at grid points (every n <= 64, then 8 per octave), linear in between (error bound measured by
    tests/sim/perf/test_devmem_perf.py); ``exact=True`` simulates this n."""
    key = (config.name, channels)
    if key not in _MODELS:
        _MODELS[key] = (DeviceMemoryPerfModel(config, channels=channels), {})
    model, curves = _MODELS[key]
    if exact:
        lines = _pattern_lines(pattern, n_lines) % (1 << model.line_addr_bits)
        return float(model.ndp_stream_cycles(lines, np.full(n_lines, write) if write else None))
    ck = (pattern, bool(write))
    if ck not in curves:
        _pattern_lines(pattern, 1)  # validates the pattern name
        curves[ck] = _Curve(model, pattern, bool(write))
    return curves[ck].cycles(int(n_lines))


def stream_time(nbytes: int, pattern: str = "seq", channels: int = 64, *, write: bool = False,
                config=LPDDR5X_8533) -> float:
    """Seconds to stream ``nbytes`` of device data through the NDP port (whole lines of ``channels`` x 64 bytes)
    with ``channels`` channels of ``config``: :func:`stream_cycles` x tCK."""
    line = GRANULE_BYTES * channels
    n = -(-int(nbytes) // line)
    return stream_cycles(n, pattern, channels, write=write, config=config) * config.timing.tck_ps * 1e-12
