"""DIMM-PIM timing for the L3 host: the fused decode-attention kernel per head, per rank and per rankset.

Every figure comes from the DIMM-PIM performance model :mod:`sim.perf.pim` (calibrated on this project's RTL) at
the PAPER geometry (:data:`hdl.pim.config.PAPER`: DDR4-3200, 16 banks, 8 x8 chips, head dim 128), read through
one function, :func:`pim_perf_model`, so that a calibrated ``fixed_cycles`` (315 cycles at PAPER, measured on the
PAPER RTL: sim.perf.pim.paper_model) flows into every host figure.

``sim.perf.pim`` evaluates a head row by row and its steady-state period by simulating ~40 refresh intervals of
heads (1-90 ms per query); a serving run asks for millions of heads of distinct lengths. So this module answers
in closed form, vectorized over numpy arrays of lengths, with the model's own rules, and holds itself to the model
in tests (``tests/host/l3/test_l3_pim_timing.py``):

* **steady head** (:meth:`PIMTiming.steady_cycles`): heads back to back on a rank cost their rows; a row of ``n``
  RD_ABs occupies ``max(max(tRCD + (n - 1) tCCD_L + tRTP, tRAS) + tRPab, tRC, tRRD_L, tFAW)`` cycles from its
  ACT_AB to the next (the ``_Rank.row`` rule of ``sim/perf/pim.py``); a head's K region is ``ceil(L / B) bpt``
  RD_ABs and its V region ``ceil(L / G)`` RD_ABs in rows of ``cpr``; heads that do not overlap in the rank PU
  (``PIMPerfModel.overlaps``) also pay ``fixed_cycles`` between heads. Equal to
  ``PIMPerfModel.steady_head_cycles`` to the cycle (tested on a grid of lengths and two ``fixed_cycles``).
* **refresh** (:meth:`PIMTiming.head_cycles`): the steady cost times the model's own refresh factor
  ``heads_period(L) / steady_head_cycles(L)``, tabulated once at :data:`REFRESH_GRID` lengths and interpolated in
  log L (1.037-1.047 at PAPER; within 0.6 % of ``heads_period`` between the grid points, tested: the
  model's own period wobbles by ~0.5 % with L in the "between" refresh regime).
* **a rank's phase** (:meth:`PIMTiming.rank_cycles`): ``fixed_cycles`` once (pipeline fill / drain of a run of
  overlapped heads, as ``heads_period`` charges it) plus the heads' costs.
* **ranksets** (:class:`RanksetModel`), two command paths (``command_path``, docs/pim_perf.md "The command path
  of a rank"). ``"per_rank"`` (the default, [L3] 4 and 5.1): each rank PU drives its own rank's DRAM commands and
  refresh on its side of the DIMM buffer chip; the channel's C/A bus carries the host's PIM transactions and writes
  only, so a computing rank keeps its whole rate whatever the other ranks of its channel do (with four ranks, one
  receiving, the channel keeps 3/4 = 75 % of its compute: [L3] 5.1). Held to the RTL
  (``sim.pim.rankset.rankset_rtl(command_path="per_rank")``: the computing ranks' RD_AB rate with the host
  writing / without, 1.0000) in ``tests/sim/pim/test_pim_rankset_rtl.py``. ``"shared"`` (this project's earlier
  model, a labelled option): the channel's command bus is shared by its ranks (one command per cycle). A
  computing rank issues ``RD_ABs + 2 x rows`` commands per head; a rankset receiving host writes issues a WR
  every ``tCCD_S`` plus its ACT / PRE. When the demand exceeds the bus the computing ranks slow down (the writer
  first, as ``rankset_sim`` arbitrates). Within 1.5 % of ``rankset_sim``'s measured compute preserved at 2, 4
  and 8 ranks per channel (tested); it also covers more ranks than ``rankset_sim`` simulates (the Bw-only
  scaling to 16 ranksets). Either way the write bandwidth of one channel into its receiving rank is
  ``rankset_sim``'s measured figure (24.96 GB/s, 97.5 % of the DQ peak): the host's writes use the channel's
  C/A and DQ on both paths.

Units: cycles are DDR4 command clocks (``tck_ps`` = 625 ps); seconds at the boundary (:meth:`PIMTiming.seconds`).
"""

from functools import lru_cache

import numpy as np

from hdl.pim.config import PAPER
from sim.perf.pim import PIMPerfModel, paper_model, rankset_sim

__all__ = ["pim_perf_model", "PIMTiming", "RanksetModel", "pim_timing", "rankset_model", "REFRESH_GRID",
           "COMMAND_PATHS", "DEFAULT_COMMAND_PATH"]

#: Lengths at which the model's refresh factor is evaluated (log-spaced, plus both sides of the PAPER overlap
#: limit 64K / 64K + 1); both sides of the "between" / "in_head" refresh switch (~23.6K at PAPER) are added by
#: bisection on the model's own choice.
#: The rank PU's command path (docs/pim_perf.md "The command path of a rank"; = sim.pim.rankset.COMMAND_PATHS):
#: ``"per_rank"`` -- each rank PU drives its own rank ([L3] 4: the rank PU on the DIMM buffer chip issues its rank's
#: commands and takes over its refresh; 5.1: one rank of four receiving "preserves 75 %" of the compute);
#: ``"shared"`` -- every rank's commands on the channel's one command bus (labelled option).
COMMAND_PATHS = ("per_rank", "shared")
DEFAULT_COMMAND_PATH = "per_rank"

REFRESH_GRID = (1, 16, 64, 256, 1024, 2048, 4096, 8192, 12288, 16384, 20480, 32768, 49152, 65536, 65537, 98304,
                131072)


def pim_perf_model(config=None) -> PIMPerfModel:
    """The DIMM-PIM performance model the host uses: PAPER geometry, refresh included (``"auto"``), overlapped
    heads, and ``fixed_cycles`` measured on the PAPER rank's RTL (:func:`sim.perf.pim.paper_model`, from
    ``data/pim_rtl_calibration.json``, written by ``ndpim bench pim --calibrate paper``). ``config``: another
    :class:`hdl.pim.config.PIMConfig` (e.g. ``--set pim.rank_adders=16``, :attr:`host.l3.config.HostMemoryConfig.
    pim_config`), priced only with ``fixed_cycles`` measured on its own RTL: ValueError naming the
    ``python -m sim.bench.pim --calibrate`` command when ``data/pim_rtl_calibration.json`` has no entry for it."""
    if config is None or config == PAPER:
        return paper_model()
    return PIMPerfModel.calibrated(config)


class PIMTiming:
    """Closed-form, vectorized per-head / per-rank cycles of ``model`` (a :class:`PIMPerfModel`)."""

    def __init__(self, model: PIMPerfModel | None = None):
        self.model = model if model is not None else pim_perf_model()
        cfg, tm = self.model.config, self.model.tm
        self.config = cfg
        self.tck_s = tm.tck_ps * 1e-12
        self.fixed_cycles = self.model.fixed_cycles
        self.max_tokens = cfg.max_tokens
        self._B, self._G, self._bpt, self._cpr = cfg.banks, cfg.token_sets, cfg.bursts_per_token, cfg.columns_per_row
        self._base = tm.tRCD - tm.tCCD_L + tm.tRTP
        self._ccd, self._ras, self._rp = tm.tCCD_L, tm.tRAS, tm.tRPab
        self._floor = max(tm.tRC, tm.tRRD_L, tm.tFAW)
        self._full_row = int(self._row(np.array([self._cpr]))[0])
        grid = sorted({L for L in REFRESH_GRID if L <= cfg.max_tokens} | set(self._refresh_switch()))
        grid = np.array(grid, dtype=np.float64)
        self._log_grid = np.log(grid)
        self._ratio = np.array([self.model.heads_period(int(L)) / self.model.steady_head_cycles(int(L))
                                for L in grid])

    def _refresh_switch(self):
        """The two lengths either side of the model's switch from "between" to "in_head" refresh (none if it
        does not switch within the rank buffer)."""
        mode = lambda L: self.model.head(L).refresh_mode
        lo, hi = 1, self.max_tokens
        if mode(lo) == mode(hi):
            return []
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if mode(mid) == mode(1) else (lo, mid)
        return [lo, hi]

    # ---- rows -------------------------------------------------------------------------------------------------
    def _row(self, n):
        """Cycles from a row's ACT_AB to the next row's ACT_AB for ``n`` >= 1 RD_ABs (``_Rank.row``)."""
        return np.maximum(np.maximum(self._base + n * self._ccd, self._ras) + self._rp, self._floor)

    def _region(self, n):
        full, part = np.divmod(n, self._cpr)
        return full * self._full_row + np.where(part > 0, self._row(np.maximum(part, 1)), 0)

    def rd_ab(self, L):
        L = np.asarray(L, dtype=np.int64)
        return -(-L // self._B) * self._bpt + -(-L // self._G)

    def overlaps(self, L):
        L = np.asarray(L, dtype=np.int64)
        return self.model.overlap & (2 * (-(-L // self._B) * self._B) <= self.max_tokens)

    def rows(self, L):
        L = np.asarray(L, dtype=np.int64)
        nS, nV = -(-L // self._B) * self._bpt, -(-L // self._G)
        return -(-nS // self._cpr) + -(-nV // self._cpr)

    def _check(self, L):
        L = np.asarray(L, dtype=np.int64)
        if L.size and (L.min() < 1 or L.max() > self.max_tokens):
            raise ValueError(f"head length outside [1, {self.max_tokens}] (the rank PU buffer): "
                             f"min {L.min()}, max {L.max()}")
        return L

    def steady_cycles(self, L):
        """Cycles per head of ``L`` tokens back to back on one rank, refresh not due (=
        ``PIMPerfModel.steady_head_cycles``)."""
        L = self._check(L)
        nS, nV = -(-L // self._B) * self._bpt, -(-L // self._G)
        c = self._region(nS) + self._region(nV)
        gap = np.where(self.overlaps(L), 0, self.fixed_cycles)
        return c - self._rp + np.maximum(1 + gap, self._rp)

    def refresh_factor(self, L):
        """The model's ``heads_period / steady_head_cycles`` at ``L`` (interpolated in log L)."""
        L = np.asarray(L, dtype=np.float64)
        return np.interp(np.log(np.maximum(L, 1.0)), self._log_grid, self._ratio)

    def head_cycles(self, L):
        """Average cycles per head of ``L`` tokens, refresh included (float)."""
        return self.steady_cycles(L) * self.refresh_factor(L)

    def rank_cycles(self, head_lengths, heads_each=1):
        """Cycles of one rank running the given heads back to back (``heads_each`` heads of every length):
        ``fixed_cycles`` once plus the heads. 0 for no heads."""
        L = np.asarray(head_lengths)
        if L.size == 0:
            return 0.0
        return float(self.fixed_cycles + heads_each * self.head_cycles(L).sum())

    def seconds(self, cycles):
        return np.asarray(cycles, dtype=np.float64) * self.tck_s


class RanksetModel:
    """The compute a channel's ranks keep (L3 5.1), from the DRAM timing of ``timing.model``, on one of two command
    paths (``command_path``, :data:`COMMAND_PATHS`).

    ``"per_rank"`` (default): each rank PU issues its rank's commands on its own side of the buffer chip; a
    computing rank keeps its stand-alone rate (``compute_rate`` = 1 for any number of ranks, with or without a
    rank receiving): measured in RTL (``sim.pim.rankset.rankset_rtl``, four TINY ranks, three computing while the
    host writes into the fourth: 1.0000). ``"shared"``: per cycle of the channel's command bus (capacity 1), a
    computing rank streaming rows of 128 RD_ABs needs ``(128 + 2) / row cycles`` (0.121 at DDR4-3200), a writing
    rank ``1 / tCCD_S`` plus one ACT and one PRE per ``banks_per_group`` x ``cpr`` WRs (its ACTs of the next bank
    set overlap); checked against ``sim.perf.pim.rankset_sim``. ``compute_rate(ranks, writer)`` is the fraction
    of its stand-alone RD_AB rate each computing rank keeps."""

    def __init__(self, timing: PIMTiming, command_path: str = DEFAULT_COMMAND_PATH):
        if command_path not in COMMAND_PATHS:
            raise ValueError(f"command_path = {command_path!r} must be one of {COMMAND_PATHS}")
        self.timing = timing
        self.command_path = command_path
        cfg, tm = timing.config, timing.model.tm
        org = cfg.dram.org
        self.compute_demand = (timing._cpr + 2) / timing._full_row
        self.write_demand = 1.0 / tm.tCCD_S + 2.0 / (org.banks_per_group * org.bursts_per_row)
        r = rankset_sim(cfg, 2)
        #: GB/s one channel writes into its receiving rank (measured by rankset_sim: 97.5 % of the DQ peak).
        self.channel_write_gbps = r.write_gbps
        self.dq_peak_gbps = r.dq_peak_gbps

    def compute_rate(self, ranks: int, writer: bool = False) -> float:
        """Fraction of the stand-alone compute rate each of the computing ranks of a channel keeps: ``ranks``
        ranks in all, one of them receiving writes when ``writer`` (it does not compute)."""
        if ranks < 1:
            raise ValueError(f"ranks per channel must be >= 1, got {ranks}")
        computing = ranks - 1 if writer else ranks
        if computing <= 0:
            return 0.0
        if self.command_path == "per_rank":
            return 1.0          # its own command path: nothing on the channel's C/A bus slows it
        free = 1.0 - (self.write_demand if writer else 0.0)
        return min(1.0, free / (computing * self.compute_demand))

    def preserved(self, ranks: int) -> float:
        """Fraction of the channel's all-ranks compute kept while one rank receives writes (rankset_sim's
        ``preserved``)."""
        return (ranks - 1) * self.compute_rate(ranks, True) / (ranks * self.compute_rate(ranks, False))


@lru_cache(maxsize=8)
def _cached_timing(config, fixed_cycles: int, refresh: str, overlap: bool) -> PIMTiming:
    m = pim_perf_model(config)
    if (m.fixed_cycles, m.refresh, m.overlap) != (fixed_cycles, refresh, overlap):
        m = PIMPerfModel(m.config, fixed_cycles=fixed_cycles, refresh=refresh, overlap=overlap)
    return PIMTiming(m)


def pim_timing(config=None) -> PIMTiming:
    """The process-wide :class:`PIMTiming` of :func:`pim_perf_model` (built once per configuration: ~0.5 s)."""
    m = pim_perf_model(config)
    return _cached_timing(None if config == PAPER else config, m.fixed_cycles, m.refresh, m.overlap)


def rankset_model(command_path: str = DEFAULT_COMMAND_PATH, config=None) -> RanksetModel:
    """The process-wide :class:`RanksetModel` of :func:`pim_timing` (at ``config``, default PAPER) on
    ``command_path`` (built once per path and configuration)."""
    if command_path not in COMMAND_PATHS:
        raise ValueError(f"command_path = {command_path!r} must be one of {COMMAND_PATHS}")
    return _cached_rankset_model(command_path, None if config == PAPER else config)


@lru_cache(maxsize=8)
def _cached_rankset_model(command_path: str, config=None) -> RanksetModel:
    return RanksetModel(pim_timing(config), command_path)
