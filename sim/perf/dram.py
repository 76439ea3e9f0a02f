"""Fast DRAM throughput/latency model of ``hdl.memctl.controller.MemoryController`` + a DRAM channel.

No per-cycle loop: :meth:`DRAMPerfModel.stream_cycles` walks the *requests* once (a request-level list schedule,
O(1) amortised work per request over small windows of byte maps), and the all-bank PIM model is closed form.
Every term is a timing parameter or a documented rule of the controller (module docstring of
``hdl/memctl/controller.py``):

* **Queue window**: request ``j`` is accepted once fewer than ``queue_depth`` requests are queued; an entry
  leaves the queue in the cycle its column command is decided (one cycle before it is on the bus).
* **Pipeline**: a request's first command is on the bus 2 cycles after acceptance; a read's response is on
  ``o`` ``CL + burst_cycles + 1`` cycles after its RD (``pipeline_cycles`` = 3 in the latency formula).
* **Per bank** (requests of a bank are served in arrival order: only the oldest queued request of a bank may
  open/close it): row hit -> column command; closed -> ACT (tRC after the last ACT, tRP/tRPab after PRE/PREA,
  tRFC after REF) then tRCD; row miss -> PRE (tRAS after ACT, tRTP after RD, CWL + burst + tWR after WR) then
  ACT (tRP) then tRCD.
* **Per rank ACT rate**: tRRD_S (rank), tRRD_L (bank group), tFAW (at most four ACTs in any tFAW window).
* **Column commands** (FR-FCFS: the oldest *ready* request issues first, so a younger ready request fills an
  earlier slot): tCCD_S per rank, tCCD_L per bank group, DQ bus: a burst of another rank needs burst + tRTRS;
  read/write turnarounds as in the controller (tWTR_S/L, RD->WR = CL + burst + tRTW - CWL).
* **Command bus**: one command per cycle.
* **Refresh**: per rank a tREFI timer (ranks staggered by tREFI/ranks) owes REFs; a rank with no queued
  requests is refreshed at once (eager: hidden when the rank stays idle for tRFC); otherwise it is postponed
  until ``max_postponed_refresh`` are owed, then forced (PREA when every open bank may precharge, REF tRPab
  later, the rank blocked until REF + tRFC). One rank refreshes at a time.

``policy="in-order"``: only the oldest request may issue its column command (column commands in arrival
order); ACT/PRE still run ahead.

Calibrated terms: none so far are fitted; the structural constants (2-cycle command pipeline, 1-cycle
decision-to-bus, ``pipeline_cycles``) are the controller's documented, test-verified values. The agreement
with the RTL over the calibration grid of tests/sim/perf/test_dram_perf.py is reported in docs/dram_perf.md.
"""

import heapq
from dataclasses import dataclass

import numpy as np

from hdl.memctl.addrmap import AddressMap, DEFAULT_ORDER
from hdl.memctl.timing import peak_bandwidth_gbps

__all__ = ["DRAMPerfModel", "PIPELINE_CYCLES", "ISSUE_DELAY"]

#: Controller pipeline: acceptance -> first command on the bus (queue register + command register).
ISSUE_DELAY = 2
#: Fixed latency cycles of the controller beyond tRP/tRCD/CL/burst (``MemoryController.pipeline_cycles``).
PIPELINE_CYCLES = 3

_NEG = -(1 << 40)


class _Map:
    """A growable byte map of cycles (1 = resource used in that cycle)."""

    __slots__ = ("b",)

    def __init__(self, n=1 << 16):
        self.b = bytearray(n)

    def _grow(self, n):
        if n > len(self.b):
            self.b.extend(bytearray(max(n, 2 * len(self.b)) - len(self.b)))

    def set(self, t):
        self._grow(t + 1)
        self.b[t] = 1

    def any(self, lo, hi):
        """Any use in [lo, hi] (inclusive)."""
        lo = max(lo, 0)
        if hi < lo:
            return False
        self._grow(hi + 1)
        return 1 in self.b[lo:hi + 1]

    def count(self, lo, hi):
        lo = max(lo, 0)
        if hi < lo:
            return 0
        self._grow(hi + 1)
        return self.b[lo:hi + 1].count(1)


@dataclass
class StreamResult:
    cycles: int              # cycles from the first acceptance to the last response (like StreamRun.cycles)
    acts: int
    pres: int
    refs: int
    col_cycles: np.ndarray   # bus cycle of each request's RD/WR


class DRAMPerfModel:
    """Throughput/latency model of one channel of ``config`` under the project's memory controller.

    ``policy``: ``"fr-fcfs"`` or ``"in-order"``; ``queue_depth``: controller request queue entries;
    ``max_postponed_refresh``: the controller's refresh postponement limit; ``addr_order``: address map order.
    """

    def __init__(self, config, *, policy="fr-fcfs", queue_depth=16, max_postponed_refresh=8,
                 addr_order=DEFAULT_ORDER):
        if policy not in ("fr-fcfs", "in-order"):
            raise ValueError(f"policy must be 'fr-fcfs' or 'in-order', got {policy!r}")
        if not 2 <= queue_depth <= 64:
            raise ValueError(f"queue_depth must be in 2..64, got {queue_depth}")
        self.config = config
        self.policy = policy
        self.queue_depth = queue_depth
        self.max_postponed_refresh = max_postponed_refresh
        self.amap = AddressMap(config.org, order=addr_order)

    # ---- latency ---------------------------------------------------------------------------------------
    def read_latency(self, kind: str) -> int:
        """Unloaded read latency in cycles (acceptance to response): ``hit``, ``closed`` or ``miss``."""
        tm, bc = self.config.timing, self.config.org.burst_cycles
        extra = {"hit": 0, "closed": tm.tRCD, "miss": tm.tRP + tm.tRCD}
        if kind not in extra:
            raise ValueError(f"kind must be one of {sorted(extra)}, got {kind!r}")
        return extra[kind] + tm.CL + bc + PIPELINE_CYCLES

    def read_latency_ns(self, kind: str) -> float:
        return self.read_latency(kind) * self.config.timing.tck_ps / 1000.0

    # ---- request streams -------------------------------------------------------------------------------
    def simulate(self, addresses, writes=None) -> StreamResult:
        """Request-level schedule of a stream of burst addresses (all offered back to back)."""
        org, tm = self.config.org, self.config.timing
        a = np.asarray(addresses, dtype=np.int64).ravel()
        n = a.size
        if n == 0:
            return StreamResult(0, 0, 0, 0, np.zeros(0, dtype=np.int64))
        d = self.amap.decode_py(a)
        G, K, R = org.bank_groups, org.banks_per_group, org.ranks
        rank = d["rank"].tolist()
        bgl = d["bg"].tolist()
        bankf = ((d["rank"] * G + d["bg"]) * K + d["bank"]).tolist()
        rowl = d["row"].tolist()
        wr = [False] * n if writes is None else [bool(x) for x in np.broadcast_to(np.asarray(writes), (n,))]
        BC = org.burst_cycles
        CL, CWL = tm.CL, tm.CWL
        tRPab = tm.tRPab
        WEND = CWL + BC
        rd_xr = BC + tm.tRTRS
        rd_after_wr_xr = max(CWL + BC + tm.tRTRS - CL, CL + BC + tm.tRTRS - CWL)
        wr_after_rd = CL + BC + tm.tRTW - CWL
        wr_after_rd_xr = max(wr_after_rd, BC + tm.tRTRS)
        NB = R * G * K
        Q = self.queue_depth
        inorder = self.policy == "in-order"
        maxp = self.max_postponed_refresh

        # bank state
        b_open = [False] * NB
        b_row = [-1] * NB
        b_act_ok = [0] * NB      # earliest ACT (tRC / tRP / tRFC)
        b_col_ok = [0] * NB      # earliest RD/WR (tRCD)
        b_pre_ok = [0] * NB      # earliest PRE (tRAS / tRTP / tWR)
        b_last_col = [_NEG] * NB  # decision of the previous request's column command (oldest-of-bank rule)
        # maps
        cmdbus = _Map()
        act_r = [_Map() for _ in range(R)]
        act_g = [[_Map() for _ in range(G)] for _ in range(R)]
        rd_r = [_Map() for _ in range(R)]   # RD commands per rank
        wr_r = [_Map() for _ in range(R)]   # WR commands per rank
        col_g = [[_Map() for _ in range(G)] for _ in range(R)]
        col_r = [_Map() for _ in range(R)]
        wend_r = [_NEG] * R                 # last end of write data per rank (monotone approximation)
        wend_g = [[_NEG] * G for _ in range(R)]
        rank_block = [0] * R                # no command to the rank before this cycle (refresh)
        # refresh
        tick = [tm.tREFI - 1 + r * (tm.tREFI // R) for r in range(R)]
        owed = [0] * R
        ref_free = 0                        # one rank refreshes at a time
        refs = acts = pres = 0
        queued = []                         # heap of (decision cycle, rank) of queued requests
        qcount = [0] * R
        col = [0] * n
        last_acc = -1
        last_col_dec = -1                   # in-order: previous column decision

        def free_cmd(t):
            while cmdbus.b[t] if t < len(cmdbus.b) else False:
                t += 1
            return t

        def act_legal(r, g, t):
            # tRRD_S / tRRD_L around t, tFAW windows containing t
            while True:
                if act_r[r].any(t - tm.tRRD_S + 1, t + tm.tRRD_S - 1) or \
                        act_g[r][g].any(t - tm.tRRD_L + 1, t + tm.tRRD_L - 1) or \
                        act_r[r].count(t - tm.tFAW + 1, t) >= 4 or act_r[r].count(t, t + tm.tFAW - 1) >= 4 or \
                        (cmdbus.b[t] if t < len(cmdbus.b) else 0):
                    t += 1
                    continue
                return t

        def col_legal(r, g, t, is_wr):
            while True:
                bad = (cmdbus.b[t] if t < len(cmdbus.b) else 0) or \
                    col_r[r].any(t - tm.tCCD_S + 1, t + tm.tCCD_S - 1) or \
                    col_g[r][g].any(t - tm.tCCD_L + 1, t + tm.tCCD_L - 1)
                if not bad:
                    for r2 in range(R):
                        if r2 == r:
                            if is_wr:
                                bad = rd_r[r].any(t - wr_after_rd + 1, t - 1)
                            else:
                                bad = wr_r[r].any(t - 1 - 0, t - 1) and False
                        else:
                            if is_wr:
                                bad = rd_r[r2].any(t - wr_after_rd_xr + 1, t + rd_after_wr_xr - 1) or \
                                    wr_r[r2].any(t - rd_xr + 1, t + rd_xr - 1)
                            else:
                                bad = rd_r[r2].any(t - rd_xr + 1, t + rd_xr - 1) or \
                                    wr_r[r2].any(t - rd_after_wr_xr + 1, t + wr_after_rd_xr - 1)
                        if bad:
                            break
                if not bad and not is_wr:
                    bad = t < wend_g[r][g] + tm.tWTR_L or t < wend_r[r] + tm.tWTR_S
                if not bad:
                    return t
                t += 1

        def refresh(r, t):
            """Refresh rank r: PREA when allowed (from cycle t), REF after; returns the REF cycle."""
            nonlocal refs, pres, ref_free
            t = max(t, ref_free, rank_block[r])
            banks = range(r * G * K, (r + 1) * G * K)
            opened = [b for b in banks if b_open[b]]
            if opened:
                tp = free_cmd(max([t] + [b_pre_ok[b] for b in opened]))
                cmdbus.set(tp)
                pres += 1
                t_ref = tp + tRPab
            else:
                t_ref = t
            t_ref = free_cmd(max([t_ref] + [b_act_ok[b] for b in banks]))
            cmdbus.set(t_ref)
            refs += 1
            for b in banks:
                b_open[b] = False
                b_act_ok[b] = max(b_act_ok[b], t_ref + tm.tRFC)
            rank_block[r] = t_ref + tm.tRFC
            ref_free = t_ref + 1
            return t_ref

        for j in range(n):
            # acceptance: queue has a free entry (an entry leaves when its column command is decided)
            acc = last_acc + 1
            while len(queued) >= Q:
                dec, r0 = heapq.heappop(queued)
                qcount[r0] -= 1
                acc = max(acc, dec)
            # retire entries decided by now (for has_req)
            while queued and queued[0][0] <= acc:
                dec, r0 = heapq.heappop(queued)
                qcount[r0] -= 1
            # refresh timers up to acc
            for r in range(R):
                while tick[r] <= acc:
                    owed[r] = min(owed[r] + 1, maxp + 1)
                    tick[r] += tm.tREFI
                    if owed[r] >= maxp:
                        t_ref = refresh(r, tick[r] - tm.tREFI + 1)
                        owed[r] -= 1
                        
                if owed[r] and qcount[r] == 0 and rank[j] != r:
                    # eager: the rank has no queued requests
                    refresh(r, acc)
                    owed[r] -= 1
                    while owed[r] and False:
                        pass
            last_acc = acc
            r, g, b = rank[j], bgl[j], bankf[j]
            t0 = acc + ISSUE_DELAY - 1          # earliest decision cycle of a first command
            t0 = max(t0, rank_block[r] - 1)
            # bank: only the oldest queued request of the bank may open/close it
            tb = max(t0, b_last_col[b] + 1) if not (b_open[b] and b_row[b] == rowl[j]) else t0
            if not (b_open[b] and b_row[b] == rowl[j]):
                if b_open[b]:
                    tp = free_cmd(max(tb, b_pre_ok[b] - 1) + 1) - 1
                    cmdbus.set(tp + 1)
                    pres += 1
                    b_act_ok[b] = max(b_act_ok[b], tp + 1 + tm.tRP)
                    tb = tp + 1
                ta = act_legal(r, g, max(tb, b_act_ok[b] - 1) + 1)
                cmdbus.set(ta)
                act_r[r].set(ta)
                act_g[r][g].set(ta)
                acts += 1
                b_open[b], b_row[b] = True, rowl[j]
                b_act_ok[b] = max(b_act_ok[b], ta + tm.tRC)
                b_col_ok[b] = ta + tm.tRCD
                b_pre_ok[b] = max(b_pre_ok[b], ta + tm.tRAS)
                tb = ta
            tc = max(t0 + 1, tb + 1 if tb > t0 else t0 + 1, b_col_ok[b])
            if inorder:
                tc = max(tc, last_col_dec + 2)
            tc = col_legal(r, g, tc, wr[j])
            cmdbus.set(tc)
            col_r[r].set(tc)
            col_g[r][g].set(tc)
            if wr[j]:
                wr_r[r].set(tc)
                e = tc + WEND
                wend_r[r] = max(wend_r[r], e)
                wend_g[r][g] = max(wend_g[r][g], e)
                b_pre_ok[b] = max(b_pre_ok[b], e + tm.tWR)
            else:
                rd_r[r].set(tc)
                b_pre_ok[b] = max(b_pre_ok[b], tc + tm.tRTP)
            col[j] = tc
            b_last_col[b] = max(b_last_col[b], tc - 1)
            last_col_dec = tc - 1
            heapq.heappush(queued, (tc - 1, r))
            qcount[r] += 1
        colv = np.asarray(col, dtype=np.int64)
        # last response: RD at T -> last beat T + CL + BC - 1 -> on o 2 cycles later; cycles = that + 1
        last = int(colv.max())
        cycles = last + CL + BC + 2
        return StreamResult(cycles, acts, pres, refs, colv)

    def stream_cycles(self, addresses, writes=None) -> float:
        """Cycles to serve a back-to-back stream of requests (first acceptance to last response)."""
        return float(self.simulate(addresses, writes).cycles)

    # ---- patterns --------------------------------------------------------------------------------------
    def strided(self, n: int, stride: int = 1) -> float:
        """Cycles for ``n`` reads of burst addresses ``k * stride`` (mod the channel)."""
        return self.stream_cycles((np.arange(n, dtype=np.int64) * stride) % self.amap.bursts)

    def sequential(self, n: int) -> float:
        return self.strided(n, 1)

    def random(self, n: int, seed: int = 0) -> float:
        rng = np.random.default_rng(seed)
        return self.stream_cycles(rng.integers(0, self.amap.bursts, n))

    # ---- PIM all-bank streaming (closed form) -----------------------------------------------------------
    def all_bank_row_period(self, bursts_per_row: int) -> int:
        """Cycles from one ACT_AB to the next of a rank without refresh (see firmware/pim_stream.py)."""
        tm = self.config.timing
        n = bursts_per_row
        prea = max(tm.tRAS, tm.tRCD + (n - 1) * tm.tCCD_L + tm.tRTP)
        return max(prea + tm.tRPab, tm.tRC, tm.tRRD_L, tm.tFAW)

    def all_bank_cycles(self, rows: int, bursts_per_row: int | None = None, *, ranks: int = 1,
                        refresh: bool = True) -> int:
        """Cycle of the last command (the final PREA) of the greedy all-bank program for ``rows`` rows per rank
        on ``ranks`` ranks (firmware.pim_stream.all_bank_schedule), in closed form."""
        tm, org = self.config.timing, self.config.org
        n = org.bursts_per_row if bursts_per_row is None else bursts_per_row
        P = self.all_bank_row_period(n)
        prea = max(tm.tRAS, tm.tRCD + (n - 1) * tm.tCCD_L + tm.tRTP)
        worst = 0
        for r in range(ranks):
            due0 = tm.tREFI + r * (tm.tREFI // org.ranks)
            # row k's ACT_AB at r + k * P + (#REFs before row k) * (tRFC + REF - ACT slot) ...
            # REF at a row boundary takes the ACT's slot (REF needs tRPab after PREA and tRC after ACT_AB,
            # like the next ACT_AB when tRC/tRPab bind) and delays the next ACT_AB by tRFC.
            ref_gap = tm.tRFC + max(0, max(prea + tm.tRPab, tm.tRC) - P)
            t_act = r  # command-bus offset of rank r (one command per cycle, ties to rank 0)
            nref = 0
            due = due0
            for k in range(rows - 1):
                t_prea = t_act + prea
                t_next = t_act + P
                if refresh and t_prea >= due:
                    t_next += ref_gap
                    nref += 1
                    due += tm.tREFI
                t_act = t_next
            worst = max(worst, t_act + prea)
        return worst

    def all_bank_bandwidth_gbps(self, rows, bursts_per_row=None, *, ranks=1, refresh=True) -> float:
        """Bank-internal read bandwidth of all-bank streaming (every bank's burst per RD_AB), GB/s."""
        org, tm = self.config.org, self.config.timing
        n = org.bursts_per_row if bursts_per_row is None else bursts_per_row
        cyc = self.all_bank_cycles(rows, n, ranks=ranks, refresh=refresh) + 1
        data = rows * n * org.banks * org.burst_bytes * ranks
        return data / (cyc * tm.tck_ps) * 1000.0

    def bandwidth_gbps(self, n_bursts: int, cycles: float) -> float:
        org, tm = self.config.org, self.config.timing
        return n_bursts * org.burst_bytes / (cycles * tm.tck_ps) * 1000.0

    def peak_gbps(self) -> float:
        return peak_bandwidth_gbps(self.config).channel
