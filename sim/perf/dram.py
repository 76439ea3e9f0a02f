"""Fast DRAM throughput/latency model of ``hdl.memctl.controller.MemoryController`` + a DRAM channel.

No per-cycle loop: :meth:`DRAMPerfModel.simulate` is an *event-driven, command-level* replay of the
controller's request queue. It evaluates the controller's arbitration only in cycles where something can
change (a command becomes legal, a request is accepted, a refresh timer ticks, a read credit returns) and jumps
over the idle cycles in between, so its cost is O(commands x queue_depth), not O(cycles). Every term is a
timing parameter or a documented rule of the controller (module docstring of ``hdl/memctl/controller.py``):

* **Queue**: ``queue_depth`` entries in arrival order; a request is accepted in a cycle where fewer than
  ``queue_depth`` entries are queued and is a candidate from the next cycle (its first command is on the bus
  2 cycles after acceptance); an entry leaves in the cycle its column command is decided (on the bus one cycle
  later). Acceptance sees the count before that cycle's removal.
* **Timing**: the controller's down-counters are kept as "ready" cycles (``max(ready, t + d)`` when a command
  issued in decision cycle ``t`` allows the next one ``d`` cycles later): per bank ACT (tRC, tRP, tRPab, tRFC),
  RD/WR (tRCD), PRE (tRAS, tRTP, CWL + burst + tWR); per bank group tCCD_L, tRRD_L, CWL + burst + tWTR_L; per
  rank tCCD_S, tRRD_S, CWL + burst + tWTR_S, the four-entry tFAW ring and the DQ-bus turnarounds (read/write
  across ranks burst + tRTRS, RD->WR CL + burst + tRTW - CWL, WR->RD across ranks); reads also need a
  response credit (at most ``response_depth`` reads outstanding, each for CL + burst + 3 cycles), and
  acceptance a free write-data slot (``queue_depth`` slots; a write holds one until CWL + 1 cycles after its
  WR is decided).
* **Arbitration** (one command per cycle; priority refresh, column, row): ``"fr-fcfs"``: the oldest queued
  row hit whose RD/WR is legal now (never bypassing an older request to the same address); else the oldest
  request whose ACT/PRE is legal now, where only the oldest queued request of a bank may open/close it.
  ``"in-order"``: only the oldest request may issue its RD/WR; ACT/PRE for younger requests run ahead.
* **Refresh**: per rank a tREFI timer (ranks staggered by tREFI/ranks) counts owed REFs; a rank with owed REFs
  and no queued request is refreshed at once, otherwise when ``max_postponed_refresh`` are owed (lowest rank
  first); the refreshing rank is blocked: PREA once every open bank may precharge, REF once every bank may
  activate, then tRFC before its next ACT.
* **Response**: last RD on the bus at T -> response on ``o`` at T + CL + burst + 1; ``cycles`` = that + 1
  (``pipeline_cycles`` = 3 in the latency formula).

Calibrated terms: none; the structural constants (2-cycle command pipeline, 1-cycle decision-to-bus,
``pipeline_cycles``) are the controller's documented, test-verified values. Against the RTL over the grid of
tests/sim/perf/test_dram_perf.py (reads, both policies) the model is cycle-exact; see docs/dram_perf.md.
"""

from collections import deque
from dataclasses import dataclass

import numpy as np

from hdl.memctl.addrmap import AddressMap, DEFAULT_ORDER
from hdl.memctl.commands import Cmd
from hdl.memctl.controller import DEFAULT_QUEUE_DEPTH
from hdl.memctl.timing import peak_bandwidth_gbps
from hdl.pim.allbank import AllBankState, refresh_due, row_timing

__all__ = ["DRAMPerfModel", "EntryFrontend", "PIPELINE_CYCLES", "ISSUE_DELAY"]

#: Controller pipeline: acceptance -> first command on the bus (queue register + command register).
ISSUE_DELAY = 2
#: Fixed latency cycles of the controller beyond tRP/tRCD/CL/burst (``MemoryController.pipeline_cycles``).
PIPELINE_CYCLES = 3

class EntryFrontend:
    """When requests reach one channel's controller in the device memory system (hdl/memctl/devmem.py), for a
    stream of one requester's entries (``bursts`` requests each, all offered back to back) whose reads hand over
    in order through a reorder buffer of ``slots`` entries (``None``: unbounded) and a response port that is
    always ready. Every term is the RTL's documented pipeline:

    * grant of entry k: ``G_k = max(G_{k-1} + 1, C_{k-fifo_depth}, pop(read k - slots) + 1)`` (one grant per
      cycle; a free FIFO entry -- entry i leaves the FIFO at edge C_i - 1; a free reorder-buffer slot for a read);
    * the splitter presents its first burst from ``C_k = max(A_{last burst of k-1} + 1, G_k + 2)`` and each
      further burst the cycle after the previous one was accepted (``A``);
    * a read entry completes at ``resp = max(bus cycle of its RDs) + CL + burst_cycles + 1`` (the controller's
      response), is popped at ``max(resp + 1, previous pop + 1)`` and handed over the cycle after;
    * ``end_cycles`` = last pop + 2 (the run's cycle count, as ``StreamRun.cycles``).
    """

    def __init__(self, *, bursts: int, fifo_depth: int, slots: int | None, start: int = 0):
        self.bursts, self.fifo_depth, self.slots, self.start_cycle = bursts, fifo_depth, slots, start

    def start(self, n, writes, config):
        S = self.bursts
        if n % S:
            raise ValueError(f"{n} requests are not whole entries of {S} bursts")
        ne = n // S
        self.resp_delay = config.timing.CL + config.org.burst_cycles + 1
        self.e_rd = [not writes[k * S] for k in range(ne)]
        self.G = [0] * ne
        self.C = [0] * ne
        self.A = [0] * n
        self.left = [S] * ne
        self.last_col = [0] * ne
        self.rd_order = [k for k in range(ne) if self.e_rd[k]]
        self.rd_pos = {k: i for i, k in enumerate(self.rd_order)}
        self.pops = []
        self.resp = {}
        self.next_entry = 0           # first entry whose C is not computed

    def _pop(self, i):
        """Pop cycle of read entry number ``i`` (in read order), or None while unknown."""
        while len(self.pops) <= i:
            k = self.rd_order[len(self.pops)]
            r = self.resp.get(k)
            if r is None:
                return None
            p = r + 1 if not self.pops else max(r + 1, self.pops[-1] + 1)
            self.pops.append(p)
        return self.pops[i]

    def present(self, j):
        S = self.bursts
        k, s = divmod(j, S)
        if s:
            return self.A[j - 1] + 1
        if k >= self.next_entry:
            g = self.start_cycle if k == 0 else self.G[k - 1] + 1
            if k >= self.fifo_depth:
                g = max(g, self.C[k - self.fifo_depth])
            if self.e_rd[k] and self.slots is not None:
                i = self.rd_pos[k] - self.slots
                if i >= 0:
                    p = self._pop(i)
                    if p is None:
                        return None
                    g = max(g, p + 1)
            self.G[k] = g
            c = g + 2
            if k:
                c = max(c, self.A[j - 1] + 1)
            self.C[k] = c
            self.next_entry = k + 1
        return self.C[k]

    def accepted(self, j, t):
        self.A[j] = t

    def issued(self, j, bus_cycle):
        k = j // self.bursts
        if bus_cycle > self.last_col[k]:
            self.last_col[k] = bus_cycle
        self.left[k] -= 1
        if self.left[k] == 0 and self.e_rd[k]:
            self.resp[k] = self.last_col[k] + self.resp_delay

    def end_cycles(self):
        if not self.rd_order:
            return max(self.last_col) + 1
        return self._pop(len(self.rd_order) - 1) + 2


_KERNEL = {}


def _kernel(required: bool = False):
    """The compiled ``dram_kernel.c`` (ctypes), built with the system C compiler into build/perf/ on first use and
    cached by the source's hash; ``None`` if no compiler works (``required``: raise instead)."""
    if "lib" in _KERNEL:
        return _KERNEL["lib"]
    import ctypes
    import hashlib
    import os
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path
    src = Path(__file__).with_name("dram_kernel.c")
    text = src.read_bytes()
    root = Path(os.environ.get("NDPIM_PERF_BUILD_DIR", Path(__file__).resolve().parents[2] / "build" / "perf"))
    lib = root / f"dram_kernel-{hashlib.sha256(text).hexdigest()[:16]}.so"
    try:
        if not lib.exists():
            cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
            if cc is None:
                raise RuntimeError("no C compiler (gcc / cc) on PATH")
            root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=root)
            os.close(fd)
            proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(src)], capture_output=True, text=True)
            if proc.returncode:
                os.unlink(tmp)
                raise RuntimeError(f"compiling {src} failed:\n{proc.stderr[-2000:]}")
            os.replace(tmp, lib)
        k = ctypes.CDLL(str(lib))
        k.dram_simulate.restype = ctypes.c_int
        k.dram_simulate.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 8
    except (OSError, RuntimeError):
        if required:
            raise
        k = None
    _KERNEL["lib"] = k
    return k


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

    def __init__(self, config, *, policy="fr-fcfs", queue_depth=DEFAULT_QUEUE_DEPTH, max_postponed_refresh=8,
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
    def simulate(self, addresses, writes=None, *, frontend=None, engine: str = "auto") -> StreamResult:
        """Schedule of a stream of burst addresses (all offered back to back): an event-driven, command-level
        replay of the controller's queue and arbitration (see the module docstring).

        ``frontend``: ``None`` (requests offered to the controller back to back from cycle 0), or an
        :class:`EntryFrontend` that decides when each request reaches the controller (the device memory
        system's request FIFO, splitter and reorder buffer, hdl/memctl/devmem.py); ``cycles`` is then its
        :meth:`EntryFrontend.end_cycles`.

        ``engine``: ``"c"`` (the compiled twin, ``sim/perf/dram_kernel.c``, ~100x faster), ``"python"``, or
        ``"auto"`` (C when a C compiler is available, else Python). Both give identical results (tested)."""
        if engine not in ("auto", "c", "python"):
            raise ValueError(f"engine must be 'auto', 'c' or 'python', got {engine!r}")
        if engine != "python":
            kernel = _kernel(required=engine == "c")
            if kernel is not None:
                return self._simulate_c(kernel, addresses, writes, frontend)
        return self._simulate_py(addresses, writes, frontend=frontend)

    def _kernel_params(self, frontend):
        org, tm = self.config.org, self.config.timing
        G, K, R = org.bank_groups, org.banks_per_group, org.ranks
        BC, CL, CWL = org.burst_cycles, tm.CL, tm.CWL
        wr_end = CWL + BC
        wr_rd = CL + BC + tm.tRTW - CWL
        fe = frontend
        return np.array([
            R * G * K, R * G, R, G * K, self.queue_depth, int(self.policy == "in-order"), self.max_postponed_refresh,
            max(8, -(-(CL + BC + 8) // tm.tCCD_S)), CL + BC + 3,
            CL, BC, CWL, BC + tm.tRTRS, max(CWL + BC + tm.tRTRS - CL, CL + BC + tm.tRTRS - CWL), wr_rd,
            max(wr_rd, BC + tm.tRTRS), BC + tm.tRTRS,
            tm.tRC, tm.tRCD, tm.tRAS, tm.tRP, tm.tRTP, tm.tRRD_S, tm.tRRD_L, tm.tFAW, tm.tCCD_S, tm.tCCD_L,
            wr_end + tm.tWR, wr_end + tm.tWTR_L, wr_end + tm.tWTR_S, tm.tRPab, tm.tRFC, tm.tREFI,
            int(fe is not None), fe.bursts if fe else 1, fe.fifo_depth if fe else 1,
            (-1 if fe.slots is None else fe.slots) if fe else -1, fe.start_cycle if fe else 0,
            CL + BC + 1,
        ], dtype=np.int64)

    def _simulate_c(self, kernel, addresses, writes, frontend):
        import ctypes
        org = self.config.org
        a = np.asarray(addresses, dtype=np.int64).ravel()
        n = a.size
        if n == 0:
            return StreamResult(0, 0, 0, 0, np.zeros(0, dtype=np.int64))
        d = self.amap.decode_py(a)
        G, K = org.bank_groups, org.banks_per_group
        grp = d["rank"] * G + d["bg"]
        arrs = [np.ascontiguousarray(x, dtype=np.int32) for x in
                (d["rank"], grp, grp * K + d["bank"], d["row"], d["col"])]
        wr = (np.zeros(n, dtype=np.uint8) if writes is None else
              np.ascontiguousarray(np.broadcast_to(np.asarray(writes, dtype=bool), (n,)), dtype=np.uint8))
        if frontend is not None and n % frontend.bursts:
            raise ValueError(f"{n} requests are not whole entries of {frontend.bursts} bursts")
        params = self._kernel_params(frontend)
        col = np.zeros(n, dtype=np.int64)
        out = np.zeros(4, dtype=np.int64)
        ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)
        rc = kernel.dram_simulate(ptr(params), n, *(ptr(x) for x in arrs), ptr(wr), ptr(col), ptr(out))
        if rc:
            raise RuntimeError(f"dram_kernel.dram_simulate failed with code {rc}")
        return StreamResult(int(out[0]), int(out[1]), int(out[2]), int(out[3]), col)

    def _simulate_py(self, addresses, writes=None, *, frontend=None, record=None) -> StreamResult:
        """:meth:`simulate` in Python: the reference the compiled kernel is checked against. ``record``: called as
        ``record(kind, cycle, rank, bank, row, col, write)`` for every command the replay issues (kind ``"ACT"``,
        ``"PRE"``, ``"PREA"``, ``"REF"`` or ``"COL"``; ``cycle`` the bus cycle, the decision cycle + 1; ``bank`` the
        rank-flat bank index, -1 for PREA / REF): the command stream sim/energy/record.py reads."""
        org, tm = self.config.org, self.config.timing
        a = np.asarray(addresses, dtype=np.int64).ravel()
        n = a.size
        if n == 0:
            return StreamResult(0, 0, 0, 0, np.zeros(0, dtype=np.int64))
        d = self.amap.decode_py(a)
        G, K, R = org.bank_groups, org.banks_per_group, org.ranks
        NB = R * G * K
        rank_l = d["rank"].tolist()
        grp_l = (d["rank"] * G + d["bg"]).tolist()
        bank_l = ((d["rank"] * G + d["bg"]) * K + d["bank"]).tolist()
        row_l = d["row"].tolist()
        col_l = d["col"].tolist()
        wr_l = [False] * n if writes is None else [bool(x) for x in np.broadcast_to(np.asarray(writes), (n,))]
        fe = frontend
        if fe is not None:
            fe.start(n, wr_l, self.config)
        BC, CL, CWL = org.burst_cycles, tm.CL, tm.CWL
        wr_end = CWL + BC
        rd_rd_xr = BC + tm.tRTRS
        rd_wr_xr = max(CWL + BC + tm.tRTRS - CL, CL + BC + tm.tRTRS - CWL)
        wr_rd = CL + BC + tm.tRTW - CWL
        wr_rd_xr = max(wr_rd, BC + tm.tRTRS)
        wr_wr_xr = BC + tm.tRTRS
        tRC, tRCD, tRAS, tRP, tRTP = tm.tRC, tm.tRCD, tm.tRAS, tm.tRP, tm.tRTP
        tRRD_S, tRRD_L, tFAW, tCCD_S, tCCD_L = tm.tRRD_S, tm.tRRD_L, tm.tFAW, tm.tCCD_S, tm.tCCD_L
        WRP, WTRL, WTRS = wr_end + tm.tWR, wr_end + tm.tWTR_L, wr_end + tm.tWTR_S
        tRPab, tRFC, tREFI = tm.tRPab, tm.tRFC, tm.tREFI
        RESP = CL + BC + 3                  # RD decided in t -> no longer outstanding from t + RESP
        RD_DEPTH = max(8, -(-(CL + BC + 8) // tCCD_S))
        Q = self.queue_depth
        inorder = self.policy == "in-order"
        maxp = self.max_postponed_refresh
        INF = 1 << 62
        # ready times ("counter is zero from this cycle on")
        b_open = [False] * NB
        b_row = [-1] * NB
        b_act = [0] * NB
        b_col = [0] * NB
        b_pre = [0] * NB
        g_ccd = [0] * (R * G)
        g_rrd = [0] * (R * G)
        g_wtr = [0] * (R * G)
        r_ccd = [0] * R
        r_rrd = [0] * R
        r_wtr = [0] * R
        r_rdbus = [0] * R
        r_wrbus = [0] * R
        r_faw = [[0] * 4 for _ in range(R)]
        r_fawp = [0] * R
        # refresh
        next_tick = [tREFI - 1 + r * (tREFI // R) for r in range(R)]
        owed = [0] * R
        ref_active = False
        ref_rank = 0
        rank_banks = [list(range(r * G * K, (r + 1) * G * K)) for r in range(R)]
        rank_q = [0] * R                     # queued requests per rank (has_req)
        rd_out = deque()                     # release cycles of outstanding reads
        wslot = deque()                      # release cycles of write-data slots of issued writes
        wq = 0                               # queued writes (each holds a write-data slot)
        queue = []                           # request indices, oldest first
        col = [0] * n
        nxt = 0                              # next request to accept
        done = 0
        acts = pres = refs = 0
        t = 0
        while done < n:
            # ---- decisions in cycle t
            while rd_out and rd_out[0] <= t:
                rd_out.popleft()
            while wslot and wslot[0] <= t:
                wslot.popleft()
            credit = len(rd_out) < RD_DEPTH
            issued = False
            sel_col = -1
            wake = INF
            blk = ref_rank if ref_active else -1
            is_ref = False
            if ref_active:
                rb = rank_banks[ref_rank]
                if any(b_open[b] for b in rb):
                    tp = max(b_pre[b] for b in rb)
                    if tp <= t:            # PREA
                        for b in rb:
                            b_open[b] = False
                            if b_act[b] < t + tRPab:
                                b_act[b] = t + tRPab
                        pres += 1
                        if record is not None:
                            record("PREA", t + 1, ref_rank, -1, 0, 0, False)
                        issued = True
                    else:
                        wake = tp
                else:
                    ta = max(b_act[b] for b in rb)
                    if ta <= t:            # REF
                        for b in rb:
                            if b_act[b] < t + tRFC:
                                b_act[b] = t + tRFC
                        refs += 1
                        if record is not None:
                            record("REF", t + 1, ref_rank, -1, 0, 0, False)
                        issued = is_ref = True
                    else:
                        wake = ta
            if not issued:
                sel_row = -1
                row_kind = 0
                seen_b = set()
                seen_a = set()
                for p, j in enumerate(queue):
                    b = bank_l[j]
                    r = rank_l[j]
                    if b_open[b] and b_row[b] == row_l[j]:
                        if sel_col < 0 and r != blk and (not inorder or p == 0) and \
                                (b, row_l[j], col_l[j]) not in seen_a:
                            gi = grp_l[j]
                            if wr_l[j]:
                                tc = max(b_col[b], g_ccd[gi], r_ccd[r], r_wrbus[r])
                            else:
                                tc = max(b_col[b], g_ccd[gi], r_ccd[r], r_rdbus[r], g_wtr[gi], r_wtr[r])
                                if not credit:
                                    tc = max(tc, t + 1, rd_out[0])
                            if tc <= t:
                                sel_col = p
                            elif tc < wake:
                                wake = tc
                    elif sel_row < 0 and r != blk and b not in seen_b:
                        if b_open[b]:
                            tr = b_pre[b]
                            k = 1
                        else:
                            gi = grp_l[j]
                            tr = max(b_act[b], g_rrd[gi], r_rrd[r], r_faw[r][r_fawp[r]])
                            k = 2
                        if tr <= t:
                            sel_row = p
                            row_kind = k
                        elif tr < wake:
                            wake = tr
                    seen_b.add(b)
                    seen_a.add((b, row_l[j], col_l[j]))
                    if sel_col >= 0:
                        break
                if sel_col >= 0:
                    j = queue.pop(sel_col)
                    b, r, gi = bank_l[j], rank_l[j], grp_l[j]
                    g_ccd[gi] = max(g_ccd[gi], t + tCCD_L)
                    r_ccd[r] = max(r_ccd[r], t + tCCD_S)
                    if wr_l[j]:
                        wslot.append(t + CWL + 1)
                        b_pre[b] = max(b_pre[b], t + WRP)
                        g_wtr[gi] = max(g_wtr[gi], t + WTRL)
                        r_wtr[r] = max(r_wtr[r], t + WTRS)
                        for r2 in range(R):
                            if r2 != r:
                                r_rdbus[r2] = max(r_rdbus[r2], t + rd_wr_xr)
                                r_wrbus[r2] = max(r_wrbus[r2], t + wr_wr_xr)
                    else:
                        b_pre[b] = max(b_pre[b], t + tRTP)
                        rd_out.append(t + RESP)
                        r_wrbus[r] = max(r_wrbus[r], t + wr_rd)
                        for r2 in range(R):
                            if r2 != r:
                                r_rdbus[r2] = max(r_rdbus[r2], t + rd_rd_xr)
                                r_wrbus[r2] = max(r_wrbus[r2], t + wr_rd_xr)
                    col[j] = t + 1
                    if record is not None:
                        record("COL", t + 1, r, b, row_l[j], col_l[j], wr_l[j])
                    done += 1
                    issued = True
                    if fe is not None:
                        fe.issued(j, t + 1)
                elif sel_row >= 0:
                    j = queue[sel_row]
                    b, r, gi = bank_l[j], rank_l[j], grp_l[j]
                    if row_kind == 1:      # PRE
                        b_open[b] = False
                        b_act[b] = max(b_act[b], t + tRP)
                        pres += 1
                        if record is not None:
                            record("PRE", t + 1, r, b, row_l[j], 0, False)
                    else:                  # ACT
                        b_open[b] = True
                        b_row[b] = row_l[j]
                        b_act[b] = max(b_act[b], t + tRC)
                        b_col[b] = max(b_col[b], t + tRCD)
                        b_pre[b] = max(b_pre[b], t + tRAS)
                        g_rrd[gi] = max(g_rrd[gi], t + tRRD_L)
                        r_rrd[r] = max(r_rrd[r], t + tRRD_S)
                        f = r_faw[r]
                        p = r_fawp[r]
                        f[p] = max(f[p], t + tFAW)
                        r_fawp[r] = (p + 1) & 3
                        acts += 1
                        if record is not None:
                            record("ACT", t + 1, r, b, row_l[j], 0, False)
                    issued = True
            # ---- refresh bookkeeping (has_req: the queue of cycle t, before this cycle's removal and push)
            changed = issued
            new_active = ref_active
            if not ref_active:
                cand = -1
                for r in range(R):
                    if owed[r] >= maxp:
                        cand = r
                        break
                if cand < 0:
                    for r in range(R):
                        if owed[r] and rank_q[r] == 0:
                            cand = r
                            break
                if cand >= 0:
                    new_active = True
                    ref_rank = cand
                    changed = True
            elif is_ref:
                new_active = False
            for r in range(R):
                tick = next_tick[r] == t
                dn = is_ref and ref_rank == r
                if tick:
                    next_tick[r] += tREFI
                    changed = True
                    if not dn and owed[r] != maxp + 1:
                        owed[r] += 1
                elif dn:
                    owed[r] -= 1
            ref_active = new_active
            if sel_col >= 0:
                rank_q[rank_l[j]] -= 1
                wq -= wr_l[j]
            # ---- acceptance (count of cycle t < Q and a free write-data slot; both before this cycle's removal)
            room = nxt < n and len(queue) + (sel_col >= 0) < Q and wq + len(wslot) < Q
            if room and fe is not None:
                p = fe.present(nxt)
                if p is None or p > t:
                    room = False
                    if p is not None and p < wake:
                        wake = p
            if room:
                if fe is not None:
                    fe.accepted(nxt, t)
                j = nxt
                queue.append(j)
                rank_q[rank_l[j]] += 1
                wq += wr_l[j]
                nxt += 1
                changed = True
            if changed:
                t += 1
            else:
                w = min(wake, min(next_tick))
                if rd_out and not credit:
                    w = min(w, rd_out[0])
                if wslot and nxt < n:
                    w = min(w, wslot[0])
                t = max(t + 1, w)
        colv = np.asarray(col, dtype=np.int64)
        if fe is not None:
            return StreamResult(fe.end_cycles(), acts, pres, refs, colv)
        # cycles ends with the last read response (as StreamRun.cycles); a write-only stream with its last WR
        rd = ~np.asarray(wr_l, dtype=bool)
        last = int(colv[rd].max()) if rd.any() else int(colv.max())
        return StreamResult(last + CL + BC + 2, acts, pres, refs, colv)

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
    def all_bank_row(self, bursts_per_row: int):
        """``(prea, period, ref_period)`` of one rank's all-bank row of ``bursts_per_row`` RD_ABs, in cycles from
        its ACT_AB: its PREA, the next row's ACT_AB, and the next row's ACT_AB when a REF is taken at the row
        boundary (REF as early as legal, then the ACT_AB). Derived from the all-bank rules of
        :mod:`hdl.pim.allbank` (:class:`~hdl.pim.allbank.AllBankState`, :func:`~hdl.pim.allbank.row_timing`:
        the table the RTL sequencer, ``firmware/pim_stream.py`` and ``sim/perf/pim.py`` use), read at call time:
        a row's commands depend only on the previous row's, so one row from an idle rank gives the steady row."""
        if not 1 <= bursts_per_row <= self.config.org.bursts_per_row:
            raise ValueError(f"bursts_per_row must be in 1..{self.config.org.bursts_per_row}, got {bursts_per_row}")
        st = AllBankState(self.config.timing)
        act, _, _, prea = row_timing(st, bursts_per_row)
        nxt = st.copy()
        period = row_timing(nxt, bursts_per_row)[0] - act
        ref = st.legal(Cmd.REF)
        st.issue(Cmd.REF, max(ref, prea + 1))            # one command per cycle: REF after the PREA
        ref_period = row_timing(st, bursts_per_row)[0] - act
        return prea - act, period, ref_period

    def all_bank_row_period(self, bursts_per_row: int) -> int:
        """Cycles from one ACT_AB to the next of a rank without refresh (the rules of :mod:`hdl.pim.allbank`)."""
        return self.all_bank_row(bursts_per_row)[1]

    def all_bank_cycles(self, rows: int, bursts_per_row: int | None = None, *, ranks: int = 1,
                        refresh: bool = True) -> int:
        """Cycle of the last command (the final PREA) of the greedy all-bank program for ``rows`` rows per rank
        on ``ranks`` ranks (firmware.pim_stream.all_bank_schedule), in closed form: per rank, row ``k + 1``'s
        ACT_AB is ``period`` after row ``k``'s, or ``ref_period`` when a REF is due by row ``k``'s PREA
        (:meth:`all_bank_row`; refresh due times :func:`hdl.pim.allbank.refresh_due`); rank ``r`` runs ``r``
        cycles behind rank 0 (one command per cycle on the shared command bus, ties to the lower rank)."""
        tm, org = self.config.timing, self.config.org
        n = org.bursts_per_row if bursts_per_row is None else bursts_per_row
        prea, P, P_ref = self.all_bank_row(n)
        worst = 0
        for r in range(ranks):
            due = refresh_due(1, r, org.ranks, tm.tREFI)
            t_act = r  # command-bus offset of rank r (one command per cycle, ties to rank 0)
            for _ in range(rows - 1):
                if refresh and t_act + prea >= due:   # REF at the first row boundary after it is due
                    t_act += P_ref
                    due += tm.tREFI
                else:
                    t_act += P
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
