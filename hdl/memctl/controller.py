"""Synthesizable open-page DDR memory controller for one channel (FR-FCFS or in-order scheduling).

Architecture (one clock = one DRAM command clock; at most one command per cycle)::

    i ──> request queue (collapsing, age = position) ──> scheduler ──> cmd register ──> DRAM cmd/addr
          write data ──> write-data RAM (slot per write) ─── CWL delay line ──> wdata (burst_cycles clocks)
    o <── response FIFO <── burst assembler <── rdata/rdata_valid        (tags from an in-flight tag FIFO)

* **Queue**: ``queue_depth`` entries kept in arrival order (entry 0 is the oldest); the entry whose column
  command issues is removed and younger entries move down. Each entry holds the decoded coordinates, the
  direction, the tag and (for writes) the slot of its data in the write-data RAM.
* **Bank state**: per bank an open flag and the open row (open-page policy: rows stay open until a request
  for another row of the bank, or refresh, closes them).
* **Timing**: saturating down-counters, loaded with ``max(current, d - 1)`` when a command issues that allows
  a later command only ``d`` cycles after it; a command is legal when every counter guarding it is zero.
  Per bank: ACT (tRC, tRP, tRFC), RD/WR (tRCD), PRE (tRAS, tRTP, CWL + burst + tWR). Per bank group:
  tCCD_L, tRRD_L, CWL + burst + tWTR_L. Per rank: tCCD_S, tRRD_S, CWL + burst + tWTR_S, a four-entry tFAW
  ring, and the data-bus turnarounds (read-read and write-write across ranks: burst + tRTRS; read-to-write:
  CL + burst + 2 - CWL, across ranks at least burst + tRTRS; write-to-read across ranks:
  max(CWL + burst + tRTRS - CL, CL + burst + tRTRS - CWL)).
* **Arbitration** (priority: refresh, column command, row command):
  ``"fr-fcfs"``: the oldest queued row hit whose RD/WR is legal now; else the oldest request whose ACT or PRE
  is legal now, where a request may only open/close its bank if it is the oldest queued request of that bank
  (so younger requests never close a row an older one needs). A column command never bypasses an older
  request to the same address (read/write ordering is preserved per address).
  ``"in-order"``: only the oldest request may issue its RD/WR (strict arrival order), but ACT/PRE for later
  requests to other banks are issued ahead (bank-group/bank interleaving keeps sequential streams at the
  bus rate).
* **Refresh**: per rank a tREFI timer (ranks staggered by tREFI/ranks) counts owed REFs. A rank with owed
  REFs and no queued requests is refreshed at once; with requests pending, REF is postponed until
  ``max_postponed_refresh`` are owed, then forced: the rank is blocked, PREA once every open bank may
  precharge, REF once every bank may activate (tRP / tRC / previous tRFC), then the rank reopens after tRFC.
* **Read responses** return in DRAM issue order with the request's tag: for ``"in-order"`` that is request
  order; for ``"fr-fcfs"`` it is the scheduler's order (match on ``tag``). At most ``response_depth`` reads
  are in flight or buffered, so ``o`` backpressure never loses data (reads stall instead).
* **Write data** for a WR issued on the bus in cycle T is driven on ``wdata`` in cycles
  T + CWL .. T + CWL + burst_cycles - 1, beat k = bits [k*clock_bits, (k+1)*clock_bits) of ``wdata``.
  Read beats are assembled the same way.

Latency (request accepted on ``i`` in cycle t, response handed over on ``o`` in cycle t + L, unloaded):
``L = [tRP] + [tRCD] + CL + burst_cycles + 3`` (``3`` = :attr:`MemoryController.pipeline_cycles`): row hit
without the brackets, closed bank + tRCD, row miss (other row open) + tRP + tRCD. The first command for a
request is on the bus 2 cycles after acceptance (queue register, command register); the response is offered
on ``o`` 2 cycles after the last read beat (beat register + response FIFO), the last beat being on the bus in
cycle T + CL + burst_cycles - 1 for a RD in cycle T.
"""

from amaranth.hdl import Module, Signal, Const, Cat, Mux, Array, Shape
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.lib.memory import Memory
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered

from .commands import Cmd, command_layout
from .addrmap import AddressMap, DEFAULT_ORDER

__all__ = ["MemoryController", "POLICIES", "RTW_GAP", "DEFAULT_QUEUE_DEPTH"]

POLICIES = ("fr-fcfs", "in-order")
#: Default scheduling window (request-queue entries). Design choice, measured (docs/dram_controller.md): on the full
#: ddr4-3200 preset, uniformly random reads with FR-FCFS reach 73.8 % of peak with 16 entries, 84.3 % with 24 and
#: 88.2 % with 32 (20,000 reads, RTL = fast model); 32 keeps >= 80 % with margin for other seeds and lengths.
DEFAULT_QUEUE_DEPTH = 32
#: Default read-to-write DQ bubble when the timing has no ``tRTW`` (DDR4: RD->WR = CL + BL/2 - CWL + 2).
RTW_GAP = 2


class MemoryController(wiring.Component):
    """Open-page memory controller for one channel of ``config`` (a :class:`DRAMConfig`).

    Parameters (keyword-only): ``config``; ``queue_depth`` (2..64 request-queue entries: the scheduling window,
    default :data:`DEFAULT_QUEUE_DEPTH` = 32);
    ``policy`` (``"fr-fcfs"`` or ``"in-order"``); ``addr_order`` (field order of the burst address, see
    :class:`AddressMap`); ``tag_width`` (0..32 bits returned with read data); ``max_postponed_refresh``
    (1..8, JEDEC allows 8); ``response_depth`` (read-response buffer entries, default
    ``max(8, ceil((CL + burst_cycles + 8) / tCCD_S))``, enough for full-rate reads with a ready ``o``).

    Ports:

    * ``i``: In(stream of ``{addr: burst address, write: 1, wdata: burst_bits, tag: tag_width}``).
    * ``o``: Out(stream of ``{rdata: burst_bits, tag: tag_width}``): one per read request.
    * ``cmd``: Out(:func:`command_layout`): the command on the bus this cycle (registered; NOP when idle).
    * ``wdata``: Out(org.clock_bits): write data of the current clock.
    * ``rdata``: In(org.clock_bits), ``rdata_valid``: In(1): read data from the device.

    Latency: see the module docstring (:attr:`pipeline_cycles` fixed controller cycles).
    """

    pipeline_cycles = 3

    def __init__(self, *, config, queue_depth: int = DEFAULT_QUEUE_DEPTH, policy: str = "fr-fcfs", addr_order=DEFAULT_ORDER,
                 tag_width: int = 8, max_postponed_refresh: int = 8, response_depth: int | None = None):
        org, tm = config.org, config.timing
        if not isinstance(queue_depth, int) or not 2 <= queue_depth <= 64:
            raise ValueError(f"queue_depth must be an int in 2..64, got {queue_depth!r}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if not isinstance(tag_width, int) or not 0 <= tag_width <= 32:
            raise ValueError(f"tag_width must be an int in 0..32, got {tag_width!r}")
        if not isinstance(max_postponed_refresh, int) or not 1 <= max_postponed_refresh <= 8:
            raise ValueError(f"max_postponed_refresh must be an int in 1..8 (JEDEC), got {max_postponed_refresh!r}")
        bc = org.burst_cycles
        if bc < 1 or org.burst_length % org.beats_per_clock:
            raise ValueError(f"burst_length {org.burst_length} must be a multiple of beats_per_clock "
                             f"{org.beats_per_clock}")
        for name in ("CL", "CWL", "tRCD", "tRP", "tRAS", "tRC", "tCCD_S", "tCCD_L", "tRRD_S", "tRRD_L",
                     "tFAW", "tWTR_S", "tWTR_L", "tWR", "tRTP", "tREFI", "tRFC"):
            if getattr(tm, name) < 1:
                raise ValueError(f"timing {name} must be >= 1, got {getattr(tm, name)}")
        if tm.tRTRS < 0:
            raise ValueError(f"timing tRTRS must be >= 0, got {tm.tRTRS}")
        if tm.tCCD_S < bc:
            raise ValueError(f"tCCD_S ({tm.tCCD_S}) shorter than a burst ({bc} cycles) is not supported")
        if tm.tREFI <= tm.tRFC:
            raise ValueError(f"tREFI ({tm.tREFI}) must exceed tRFC ({tm.tRFC})")
        if response_depth is None:
            response_depth = max(8, -(-(tm.CL + bc + 8) // tm.tCCD_S))
        if not isinstance(response_depth, int) or not 2 <= response_depth <= 256:
            raise ValueError(f"response_depth must be an int in 2..256, got {response_depth!r}")
        self.config = config
        self.queue_depth = queue_depth
        self.policy = policy
        self.tag_width = tag_width
        self.max_postponed_refresh = max_postponed_refresh
        self.response_depth = response_depth
        self.amap = AddressMap(org, order=addr_order)
        self.request_layout = data.StructLayout({
            "addr": self.amap.addr_bits, "write": 1, "wdata": org.burst_bits, "tag": tag_width})
        self.response_layout = data.StructLayout({"rdata": org.burst_bits, "tag": tag_width})
        super().__init__({
            "i": In(stream.Signature(self.request_layout)),
            "o": Out(stream.Signature(self.response_layout)),
            "cmd": Out(command_layout(org)),
            "wdata": Out(org.clock_bits),
            "rdata": In(org.clock_bits),
            "rdata_valid": In(1),
        })

    # Latency helpers (cycles from acceptance on `i` to the response on `o`, unloaded).
    def read_latency(self, kind: str) -> int:
        """``kind``: ``"hit"`` (row open), ``"closed"`` (bank precharged) or ``"miss"`` (other row open)."""
        tm, bc = self.config.timing, self.config.org.burst_cycles
        extra = {"hit": 0, "closed": tm.tRCD, "miss": tm.tRP + tm.tRCD}
        if kind not in extra:
            raise ValueError(f"kind must be one of {sorted(extra)}, got {kind!r}")
        return extra[kind] + tm.CL + bc + self.pipeline_cycles

    def elaborate(self, platform):
        m = Module()
        org, tm = self.config.org, self.config.timing
        amap = self.amap
        N = self.queue_depth
        RD_DEPTH = self.response_depth
        BC = org.burst_cycles
        CB = org.clock_bits
        R, G, K = org.ranks, org.bank_groups, org.banks_per_group
        NB = R * G * K
        cl = command_layout(org)
        fw = {f: Shape.cast(cl.members[f]).width for f in ("rank", "bg", "bank", "row", "col")}
        aw = amap.widths
        tw = max(1, self.tag_width)

        def flat(r, g, k):
            return (r * G + g) * K + k

        def bank_index(rank, bg, bank):
            parts = [bank[:aw["bank"]], bg[:aw["bg"]], rank[:aw["rank"]]]
            v = Cat(*parts)
            return v if len(v) else Const(0, 1)

        # ---- timing counters ------------------------------------------------------------------------
        counters = []  # (signal, [(cond, distance)])

        def counter(name, distances, init=0):
            top = max([d - 1 for d in distances] + [init, 1])
            sig = Signal(range(top + 1), name=name, init=init)
            loads = []
            counters.append((sig, loads))
            return sig, loads

        # ---- request queue --------------------------------------------------------------------------
        # Besides the request, each entry keeps four flags, maintained incrementally (O(queue_depth) logic per
        # cycle instead of comparing every pair of entries and muxing every entry's bank row):
        #   open: its bank has a row open; hit: its bank has *its* row open;
        #   fb: no older queued request to the same bank ("first of bank": may open / close the bank);
        #   fa: no older queued request to the same burst ("first of address": may issue its RD/WR).
        Q = []
        for p in range(N):
            Q.append({
                "valid": Signal(name=f"q{p}_valid"),
                "write": Signal(name=f"q{p}_write"),
                "rank": Signal(fw["rank"], name=f"q{p}_rank"),
                "bg": Signal(fw["bg"], name=f"q{p}_bg"),
                "bank": Signal(fw["bank"], name=f"q{p}_bank"),
                "row": Signal(fw["row"], name=f"q{p}_row"),
                "col": Signal(fw["col"], name=f"q{p}_col"),
                "tag": Signal(tw, name=f"q{p}_tag"),
                "slot": Signal(range(N), name=f"q{p}_slot"),
                "open": Signal(name=f"q{p}_open"),
                "hit": Signal(name=f"q{p}_hit"),
                "fb": Signal(name=f"q{p}_fb"),
                "fa": Signal(name=f"q{p}_fa"),
            })
        count = Signal(range(N + 1))

        # ---- bank state and counters ----------------------------------------------------------------
        b_open = [Signal(name=f"b{b}_open") for b in range(NB)]
        b_row = [Signal(fw["row"], name=f"b{b}_row") for b in range(NB)]
        wr_end = tm.CWL + BC  # cycles from WR to the end of its write data
        t_rpab = getattr(tm, "tRPab", None) or tm.tRP  # PREA to ACT/REF
        t_rtw = getattr(tm, "tRTW", RTW_GAP)  # read-to-write DQ bubble
        b_act, b_col, b_pre = [], [], []
        for b in range(NB):
            b_act.append(counter(f"b{b}_act", [tm.tRC, tm.tRP, t_rpab, tm.tRFC]))
            b_col.append(counter(f"b{b}_col", [tm.tRCD]))
            b_pre.append(counter(f"b{b}_pre", [tm.tRAS, tm.tRTP, wr_end + tm.tWR]))
        g_ccd, g_rrd, g_wtr = {}, {}, {}
        for r in range(R):
            for g in range(G):
                g_ccd[r, g] = counter(f"r{r}g{g}_ccd", [tm.tCCD_L])
                g_rrd[r, g] = counter(f"r{r}g{g}_rrd", [tm.tRRD_L])
                g_wtr[r, g] = counter(f"r{r}g{g}_wtr", [wr_end + tm.tWTR_L])
        rd_after_rd_xr = BC + tm.tRTRS
        rd_after_wr_xr = max(tm.CWL + BC + tm.tRTRS - tm.CL, tm.CL + BC + tm.tRTRS - tm.CWL)
        wr_after_rd = tm.CL + BC + t_rtw - tm.CWL
        wr_after_rd_xr = max(wr_after_rd, BC + tm.tRTRS)
        wr_after_wr_xr = BC + tm.tRTRS
        r_ccd, r_rrd, r_wtr, r_rdbus, r_wrbus, r_faw, r_fawp = [], [], [], [], [], [], []
        for r in range(R):
            r_ccd.append(counter(f"r{r}_ccd", [tm.tCCD_S]))
            r_rrd.append(counter(f"r{r}_rrd", [tm.tRRD_S]))
            r_wtr.append(counter(f"r{r}_wtr", [wr_end + tm.tWTR_S]))
            r_rdbus.append(counter(f"r{r}_rdbus", [rd_after_rd_xr, rd_after_wr_xr]))
            r_wrbus.append(counter(f"r{r}_wrbus", [wr_after_rd, wr_after_rd_xr, wr_after_wr_xr]))
            r_faw.append([counter(f"r{r}_faw{j}", [tm.tFAW]) for j in range(4)])
            r_fawp.append(Signal(2, name=f"r{r}_fawp"))

        # ---- refresh state --------------------------------------------------------------------------
        maxp = self.max_postponed_refresh
        owed = [Signal(range(maxp + 2), name=f"r{r}_owed") for r in range(R)]
        refi = [Signal(range(2 * tm.tREFI), name=f"r{r}_refi", init=tm.tREFI - 1 + r * (tm.tREFI // R))
                for r in range(R)]
        ref_active = Signal()
        ref_rank = Signal(fw["rank"])
        blocked = [Signal(name=f"r{r}_blocked") for r in range(R)]
        for r in range(R):
            m.d.comb += blocked[r].eq(ref_active & (ref_rank == r))

        # ---- read credit ----------------------------------------------------------------------------
        outstanding = Signal(range(RD_DEPTH + 1))
        credit = Signal()
        m.d.comb += credit.eq(outstanding < RD_DEPTH)

        # ---- per-bank readiness vectors -------------------------------------------------------------
        act_rdy = Signal(NB)
        pre_rdy = Signal(NB)
        rd_rdy = Signal(NB)
        wr_rdy = Signal(NB)
        open_vec = Signal(NB)
        for r in range(R):
            faw_ok = Array(c[0] for c in r_faw[r])[r_fawp[r]] == 0
            for g in range(G):
                for k in range(K):
                    b = flat(r, g, k)
                    col_ok = (b_open[b] & (b_col[b][0] == 0) & (g_ccd[r, g][0] == 0) & (r_ccd[r][0] == 0)
                              & ~blocked[r])
                    m.d.comb += [
                        open_vec[b].eq(b_open[b]),
                        act_rdy[b].eq(~b_open[b] & (b_act[b][0] == 0) & (g_rrd[r, g][0] == 0)
                                      & (r_rrd[r][0] == 0) & faw_ok & ~blocked[r]),
                        pre_rdy[b].eq(b_open[b] & (b_pre[b][0] == 0) & ~blocked[r]),
                        rd_rdy[b].eq(col_ok & (r_rdbus[r][0] == 0) & (g_wtr[r, g][0] == 0)
                                     & (r_wtr[r][0] == 0) & credit),
                        wr_rdy[b].eq(col_ok & (r_wrbus[r][0] == 0)),
                    ]

        # ---- per-entry candidates -------------------------------------------------------------------
        col_cand = Signal(N)
        row_cand = Signal(N)
        e_open = Signal(N)
        for p, e in enumerate(Q):
            bi = bank_index(e["rank"], e["bg"], e["bank"])
            col_legal = Mux(e["write"], wr_rdy.bit_select(bi, 1), rd_rdy.bit_select(bi, 1))
            if self.policy == "in-order" and p > 0:
                m.d.comb += col_cand[p].eq(0)
            else:
                m.d.comb += col_cand[p].eq(e["valid"] & e["hit"] & col_legal & e["fa"])
            m.d.comb += [
                e_open[p].eq(e["open"]),
                row_cand[p].eq(e["valid"] & e["fb"]
                               & Mux(e["open"], ~e["hit"] & pre_rdy.bit_select(bi, 1), act_rdy.bit_select(bi, 1))),
            ]

        col_sel = Signal(range(N))
        row_sel = Signal(range(N))
        for p in reversed(range(N)):
            with m.If(col_cand[p]):
                m.d.comb += col_sel.eq(p)
            with m.If(row_cand[p]):
                m.d.comb += row_sel.eq(p)

        # ---- refresh decisions ----------------------------------------------------------------------
        any_open = Array(Cat(b_open[flat(r, g, k)] for g in range(G) for k in range(K)).any() for r in range(R))
        all_pre0 = Array(Cat(b_pre[flat(r, g, k)][0] == 0 for g in range(G) for k in range(K)).all()
                         for r in range(R))
        all_act0 = Array(Cat(b_act[flat(r, g, k)][0] == 0 for g in range(G) for k in range(K)).all()
                         for r in range(R))
        ref_prea = Signal()
        ref_ref = Signal()
        m.d.comb += [
            ref_prea.eq(ref_active & any_open[ref_rank] & all_pre0[ref_rank]),
            ref_ref.eq(ref_active & ~any_open[ref_rank] & all_act0[ref_rank]),
        ]

        # ---- command selection ----------------------------------------------------------------------
        iss_kind = Signal(Cmd)
        iss_rank = Signal(fw["rank"])
        iss_bg = Signal(fw["bg"])
        iss_bank = Signal(fw["bank"])
        iss_row = Signal(fw["row"])
        iss_col = Signal(fw["col"])
        iss_tag = Signal(tw)
        iss_slot = Signal(range(N))
        rm_en = Signal()

        def sel(field, idx):
            return Array(e[field] for e in Q)[idx]

        with m.If(ref_prea):
            m.d.comb += [iss_kind.eq(Cmd.PREA), iss_rank.eq(ref_rank)]
        with m.Elif(ref_ref):
            m.d.comb += [iss_kind.eq(Cmd.REF), iss_rank.eq(ref_rank)]
        with m.Elif(col_cand.any()):
            m.d.comb += [
                iss_kind.eq(Mux(sel("write", col_sel), Cmd.WR, Cmd.RD)),
                iss_rank.eq(sel("rank", col_sel)), iss_bg.eq(sel("bg", col_sel)),
                iss_bank.eq(sel("bank", col_sel)), iss_row.eq(sel("row", col_sel)),
                iss_col.eq(sel("col", col_sel)), iss_tag.eq(sel("tag", col_sel)),
                iss_slot.eq(sel("slot", col_sel)),
                rm_en.eq(1),
            ]
        with m.Elif(row_cand.any()):
            m.d.comb += [
                iss_kind.eq(Mux(e_open.bit_select(row_sel, 1), Cmd.PRE, Cmd.ACT)),
                iss_rank.eq(sel("rank", row_sel)), iss_bg.eq(sel("bg", row_sel)),
                iss_bank.eq(sel("bank", row_sel)), iss_row.eq(sel("row", row_sel)),
            ]
        m.d.sync += [
            self.cmd.kind.eq(iss_kind), self.cmd.rank.eq(iss_rank), self.cmd.bg.eq(iss_bg),
            self.cmd.bank.eq(iss_bank), self.cmd.row.eq(iss_row), self.cmd.col.eq(iss_col),
        ]

        is_act = iss_kind == Cmd.ACT
        is_pre = iss_kind == Cmd.PRE
        is_prea = iss_kind == Cmd.PREA
        is_ref = iss_kind == Cmd.REF
        is_rd = iss_kind == Cmd.RD
        is_wr = iss_kind == Cmd.WR
        is_col = is_rd | is_wr

        # ---- state updates on issue -----------------------------------------------------------------
        for r in range(R):
            here_r = iss_rank == r
            for g in range(G):
                here_g = here_r & (iss_bg == g)
                for k in range(K):
                    b = flat(r, g, k)
                    here_b = here_g & (iss_bank == k)
                    b_act[b][1].extend([(is_act & here_b, tm.tRC), (is_pre & here_b, tm.tRP),
                                        (is_prea & here_r, t_rpab), (is_ref & here_r, tm.tRFC)])
                    b_col[b][1].append((is_act & here_b, tm.tRCD))
                    b_pre[b][1].extend([(is_act & here_b, tm.tRAS), (is_rd & here_b, tm.tRTP),
                                        (is_wr & here_b, wr_end + tm.tWR)])
                    with m.If(is_act & here_b):
                        m.d.sync += [b_open[b].eq(1), b_row[b].eq(iss_row)]
                    with m.Elif((is_pre & here_b) | (is_prea & here_r)):
                        m.d.sync += b_open[b].eq(0)
                g_ccd[r, g][1].append((is_col & here_g, tm.tCCD_L))
                g_rrd[r, g][1].append((is_act & here_g, tm.tRRD_L))
                g_wtr[r, g][1].append((is_wr & here_g, wr_end + tm.tWTR_L))
            r_ccd[r][1].append((is_col & here_r, tm.tCCD_S))
            r_rrd[r][1].append((is_act & here_r, tm.tRRD_S))
            r_wtr[r][1].append((is_wr & here_r, wr_end + tm.tWTR_S))
            r_rdbus[r][1].extend([(is_rd & ~here_r, rd_after_rd_xr), (is_wr & ~here_r, rd_after_wr_xr)])
            r_wrbus[r][1].extend([(is_rd & here_r, wr_after_rd), (is_rd & ~here_r, wr_after_rd_xr),
                                  (is_wr & ~here_r, wr_after_wr_xr)])
            for j in range(4):
                r_faw[r][j][1].append((is_act & here_r & (r_fawp[r] == j), tm.tFAW))
            with m.If(is_act & here_r):
                m.d.sync += r_fawp[r].eq(r_fawp[r] + 1)

        for sig, loads in counters:
            dec = Mux(sig == 0, 0, sig - 1)
            ld = Const(0, len(sig))
            for cond, d in loads:
                if d - 1 > 0:
                    ld = Mux(cond, d - 1, ld)
            m.d.sync += sig.eq(Mux(ld > dec, ld, dec))

        # ---- refresh bookkeeping --------------------------------------------------------------------
        has_req = [Signal(name=f"r{r}_has_req") for r in range(R)]
        for r in range(R):
            m.d.comb += has_req[r].eq(Cat(e["valid"] & (e["rank"] == r) for e in Q).any())
            tick = refi[r] == 0
            m.d.sync += refi[r].eq(Mux(tick, tm.tREFI - 1, refi[r] - 1))
            done = is_ref & (iss_rank == r)
            with m.If(tick & ~done & (owed[r] != maxp + 1)):
                m.d.sync += owed[r].eq(owed[r] + 1)
            with m.Elif(~tick & done):
                m.d.sync += owed[r].eq(owed[r] - 1)
        with m.If(~ref_active):
            # Forced refreshes first (lowest rank), then eager refreshes of ranks without queued requests.
            for r in reversed(range(R)):
                with m.If((owed[r] != 0) & ~has_req[r]):
                    m.d.sync += [ref_active.eq(1), ref_rank.eq(r)]
            for r in reversed(range(R)):
                with m.If(owed[r] >= maxp):
                    m.d.sync += [ref_active.eq(1), ref_rank.eq(r)]
        with m.Elif(is_ref):
            m.d.sync += ref_active.eq(0)

        # ---- write-data RAM and request acceptance --------------------------------------------------
        m.submodules.wmem = wmem = Memory(shape=org.burst_bits, depth=N, init=[])
        wport = wmem.write_port()
        rport = wmem.read_port()
        wfree = Signal(N, init=(1 << N) - 1)
        alloc = Signal(range(N))
        for s in reversed(range(N)):
            with m.If(wfree[s]):
                m.d.comb += alloc.eq(s)
        push = Signal()
        m.d.comb += [
            self.i.ready.eq((count < N) & wfree.any()),
            push.eq(self.i.valid & self.i.ready),
            wport.addr.eq(alloc),
            wport.data.eq(self.i.payload.wdata),
            wport.en.eq(push & self.i.payload.write),
        ]
        dec_in = amap.decode(self.i.payload.addr)
        ins_pos = count - rm_en

        # ---- incremental entry flags -----------------------------------------------------------------
        def same_bank(a, b):
            return (a["rank"] == b["rank"]) & (a["bg"] == b["bg"]) & (a["bank"] == b["bank"])

        iss = {"rank": iss_rank, "bg": iss_bg, "bank": iss_bank, "row": iss_row, "col": iss_col}
        inc = {f: dec_in[f] for f in ("rank", "bg", "bank", "row", "col")}
        removed = Signal(N)                    # one-hot: the entry whose column command issues this cycle
        m.d.comb += removed.eq(Mux(rm_en, Const(1, N) << col_sel, 0))
        rm_fb = Array(e["fb"] for e in Q)[col_sel]
        # The removed entry's successor: the oldest younger entry to its bank becomes first of bank (if the removed
        # one was), the oldest younger entry to its burst becomes first of address.
        younger = Signal(N)
        m.d.comb += younger.eq(~((Const(2, N + 1) << col_sel) - 1)[:N])
        nb_vec = Signal(N)
        na_vec = Signal(N)
        for p, e in enumerate(Q):
            sb = e["valid"] & same_bank(e, iss)
            m.d.comb += [nb_vec[p].eq(sb & younger[p]),
                         na_vec[p].eq(sb & younger[p] & (e["row"] == iss_row) & (e["col"] == iss_col))]
        promote_b = Signal(N)
        promote_a = Signal(N)
        m.d.comb += [promote_b.eq(Mux(rm_en & rm_fb, nb_vec & -nb_vec, 0)),
                     promote_a.eq(Mux(rm_en, na_vec & -na_vec, 0))]
        # Bank-state changes of this cycle's command, seen by every entry (and the incoming request).
        def act_here(x):
            return is_act & same_bank(x, iss)

        def pre_here(x):
            return (is_pre & same_bank(x, iss)) | (is_prea & (x["rank"] == iss_rank))

        nxt_flags = []
        for p, e in enumerate(Q):
            o, h = Signal(name=f"q{p}_open_n"), Signal(name=f"q{p}_hit_n")
            m.d.comb += [
                o.eq(Mux(act_here(e), 1, Mux(pre_here(e), 0, e["open"]))),
                h.eq(Mux(act_here(e), e["row"] == iss_row, Mux(pre_here(e), 0, e["hit"]))),
            ]
            nxt_flags.append({"open": o, "hit": h, "fb": e["fb"] | promote_b[p], "fa": e["fa"] | promote_a[p]})
        # The incoming request: its bank's state after this cycle's command; first of bank / address among the
        # entries that stay.
        in_bi = bank_index(inc["rank"], inc["bg"], inc["bank"])
        in_open_now = open_vec.bit_select(in_bi, 1)
        in_row_now = Array(b_row)[in_bi]
        in_open, in_hit = Signal(), Signal()
        m.d.comb += [
            in_open.eq(Mux(act_here(inc), 1, Mux(pre_here(inc), 0, in_open_now))),
            in_hit.eq(Mux(act_here(inc), inc["row"] == iss_row,
                          Mux(pre_here(inc), 0, in_open_now & (in_row_now == inc["row"])))),
        ]
        stay_b = Signal(N)
        stay_a = Signal(N)
        for p, e in enumerate(Q):
            sb = e["valid"] & ~removed[p] & same_bank(e, inc)
            m.d.comb += [stay_b[p].eq(sb), stay_a[p].eq(sb & (e["row"] == inc["row"]) & (e["col"] == inc["col"]))]

        for p, e in enumerate(Q):
            nxt = Q[p + 1] if p + 1 < N else None
            nf = nxt_flags[p + 1] if p + 1 < N else None
            with m.If(push & (ins_pos == p)):
                m.d.sync += [
                    e["valid"].eq(1), e["write"].eq(self.i.payload.write),
                    e["rank"].eq(dec_in["rank"]), e["bg"].eq(dec_in["bg"]), e["bank"].eq(dec_in["bank"]),
                    e["row"].eq(dec_in["row"]), e["col"].eq(dec_in["col"]),
                    e["tag"].eq(self.i.payload.tag if self.tag_width else 0), e["slot"].eq(alloc),
                    e["open"].eq(in_open), e["hit"].eq(in_hit), e["fb"].eq(~stay_b.any()),
                    e["fa"].eq(~stay_a.any()),
                ]
            # Entries at or above the removed one shift down (the last entry always does: no constant compare).
            with m.Elif(rm_en & ((col_sel <= p) if p < N - 1 else 1)):
                if nxt is None:
                    m.d.sync += e["valid"].eq(0)
                else:
                    m.d.sync += [e[f].eq(nxt[f]) for f in e if f not in nf]
                    m.d.sync += [e[f].eq(nf[f]) for f in nf]
            with m.Else():
                m.d.sync += [e[f].eq(nxt_flags[p][f]) for f in nxt_flags[p]]
        m.d.sync += count.eq(count + push - rm_en)

        # Write-data delay line: WR decided in cycle t is on the bus in t+1, its data in t+1+CWL ...
        L = tm.CWL + BC
        sr_v = [Signal(name=f"wsr{k}_valid") for k in range(L)]
        sr_s = [Signal(range(N), name=f"wsr{k}_slot") for k in range(L)]
        m.d.sync += [sr_v[0].eq(is_wr), sr_s[0].eq(iss_slot)]
        for k in range(1, L):
            m.d.sync += [sr_v[k].eq(sr_v[k - 1]), sr_s[k].eq(sr_s[k - 1])]
        m.d.comb += [rport.addr.eq(sr_s[tm.CWL - 1]), rport.en.eq(sr_v[tm.CWL - 1])]
        wbeat = Const(0, CB)
        for k in range(BC):
            wbeat = Mux(sr_v[tm.CWL + k], rport.data[k * CB:(k + 1) * CB], wbeat)
        m.d.comb += self.wdata.eq(wbeat)
        free_mask = Signal(N)
        alloc_mask = Signal(N)
        m.d.comb += [
            free_mask.eq(Mux(sr_v[tm.CWL - 1], Const(1, N) << sr_s[tm.CWL - 1], 0)),
            alloc_mask.eq(Mux(push & self.i.payload.write, Const(1, N) << alloc, 0)),
        ]
        m.d.sync += wfree.eq((wfree | free_mask) & ~alloc_mask)

        # ---- read path ------------------------------------------------------------------------------
        m.submodules.tags = tags = SyncFIFO(width=tw, depth=RD_DEPTH)
        m.submodules.resp = resp = SyncFIFOBuffered(width=org.burst_bits + tw, depth=RD_DEPTH)
        m.d.comb += [tags.w_en.eq(is_rd), tags.w_data.eq(iss_tag)]
        beats = [Signal(CB, name=f"rbeat{k}") for k in range(BC - 1)]
        rcount = Signal(range(BC))
        last = rcount == BC - 1
        with m.If(self.rdata_valid):
            m.d.sync += rcount.eq(Mux(last, 0, rcount + 1))
            for k in range(BC - 1):
                with m.If(rcount == k):
                    m.d.sync += beats[k].eq(self.rdata)
        burst_done = self.rdata_valid & last
        m.d.comb += [
            resp.w_en.eq(burst_done),
            resp.w_data.eq(Cat(*beats, self.rdata, tags.r_data)),
            tags.r_en.eq(burst_done),
            self.o.valid.eq(resp.r_rdy),
            self.o.payload.rdata.eq(resp.r_data[:org.burst_bits]),
            resp.r_en.eq(self.o.ready),
        ]
        if self.tag_width:
            m.d.comb += self.o.payload.tag.eq(resp.r_data[org.burst_bits:])
        m.d.sync += outstanding.eq(outstanding + is_rd - (self.o.valid & self.o.ready))
        return m
