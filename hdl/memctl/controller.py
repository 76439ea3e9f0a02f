"""Synthesizable open-page DDR memory controller for one channel (FR-FCFS or in-order scheduling).

Architecture (one clock = one DRAM command clock; at most one command per cycle)::

    i ──> request queue (slots + age matrix) ──> scheduler ──> cmd register ──> DRAM cmd/addr
          write data ──> write-data RAM (slot per write) ─── CWL delay line ──> wdata (burst_cycles clocks)
    o <── response FIFO <── burst assembler <── rdata/rdata_valid        (tags from an in-flight tag FIFO)

* **Queue**: ``queue_depth`` slots; a request is written to the lowest free slot and stays there until its
  column command issues (non-collapsing). An age matrix (per slot, the slots whose requests arrived later)
  gives arrival order: "the oldest" below is the oldest by arrival. Each slot holds the request's bank index,
  row, burst address, direction, tag and (for writes) the slot of its data in the write-data RAM; the
  scheduler's per-slot flags (valid, row hit, first of bank, first of address) are N-bit vectors.
* **Bank state**: per bank an open flag (one vector) and the open row (a small RAM) (open-page policy: rows
  stay open until a request for another row of the bank, or refresh, closes them).
* **Timing**: saturating down-counters, loaded with ``max(current - 1, d - 1)`` when a command issues that
  allows a later command only ``d`` cycles after it; a command is legal when every counter guarding it is
  zero. Per bank: ACT (tRC, tRP, tRPab, tRFC), PRE (tRAS, tRTP, CWL + burst + tWR); RD/WR after ACT (tRCD) is
  read off the ACT counter when tRC > tRCD (else a counter of its own). Per bank group:
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

        def bank_index(rank, bg, bank):
            # flat bank index (rank * G + bg) * K + bank: the address map's field counts are powers of two
            parts = [bank[:aw["bank"]], bg[:aw["bg"]], rank[:aw["rank"]]]
            v = Cat(*parts)
            return v if len(v) else Const(0, 1)

        # ---- request queue --------------------------------------------------------------------------
        # Non-collapsing: a request stays in the slot it was written to (the lowest free one) until its column
        # command issues. Arrival order comes from an age matrix: ``younger[s]`` has bit t set when slot t's request
        # arrived after slot s's (set in every row when a request is written to slot t; a written slot's own row
        # is cleared; bits of free slots are don't-care, every use masks with ``valid``). The oldest slot of a set
        # is the one no other member of the set is younger than. The per-slot state the scheduler needs every
        # cycle is kept as N-bit vectors (bit s = slot s), maintained incrementally (O(queue_depth) logic per cycle
        # instead of comparing every pair of entries and muxing every entry's bank row):
        #   valid; hit: its bank has *its* row open (so its bank is open);
        #   fb: no older queued request to the same bank ("first of bank": may open / close the bank);
        #   fa: no older queued request to the same burst ("first of address": may issue its RD/WR).
        # The request fields are written once, when the request arrives.
        KW = len(bank_index(Const(0, fw["rank"]), Const(0, fw["bg"]), Const(0, fw["bank"])))
        NBP = 1 << KW                      # bank-indexed vectors, padded to a power of two (NB, or 2 with one bank)
        awb, awg = aw["bank"], aw["bg"]
        Q = []
        for p in range(N):
            Q.append({
                # the flat bank index, and again with the direction above it: the bit-select key of its RD/WR
                # in Cat(rd_rdy, wr_rdy) (slicing the bank index out of `ckey` instead: ~4 % more simulation work)
                "bidx": Signal(KW, name=f"q{p}_bidx"),
                "ckey": Signal(KW + 1, name=f"q{p}_ckey"),
                "row": Signal(fw["row"], name=f"q{p}_row"),
                "addr": Signal(amap.addr_bits, name=f"q{p}_addr"),
                "tag": Signal(tw, name=f"q{p}_tag"),
                "slot": Signal(range(N), name=f"q{p}_slot"),
            })
        younger = [Signal(N, name=f"q{p}_younger") for p in range(N)]
        valid = Signal(N)
        q_hit = Signal(N)
        q_fb = Signal(N)
        q_fa = Signal(N)
        q_rank = [Signal(N, name=f"q_rank{r}") for r in range(R)] if R > 1 else None   # slots of each rank

        def oldest_expr(vec):
            """One-hot of the oldest slot whose bit is set in ``vec`` (a subset of ``valid``); 0 if none."""
            acc = Const(0, N)
            for p in range(N):
                acc = acc | Mux(vec[p], younger[p], 0)
            return vec & ~acc

        def oldest(vec, name):
            oh = Signal(N, name=name)
            m.d.comb += oh.eq(oldest_expr(vec))
            return oh

        def encode(oh, name):
            """Index of the set bit of the one-hot ``oh`` (0 if none)."""
            idx = Signal(range(N), name=name)
            m.d.comb += idx.eq(Cat(Cat(oh[p] for p in range(N) if p >> k & 1).any()
                                   for k in range(len(idx))))
            return idx

        def rank_slots(rank):
            """Slots holding a request to ``rank`` (a subset of ``valid`` only after masking)."""
            return Array(q_rank)[rank] if q_rank else Const((1 << N) - 1, N)

        # ---- timing counters ------------------------------------------------------------------------
        # Saturating down-counters, loaded with max(d - 1, current - 1) when a command that allows a later one only
        # d cycles after it issues. Per bank group and rank: `counter` (loaded under exclusive conditions). Per
        # bank: `bank_counters`, decremented every cycle and loaded only by commands that name its bank (or its
        # rank), so its next value needs one test in the cycles it is not loaded.
        counters = []  # (signal, [(cond, distance)], largest value)

        def counter(name, distances):
            top = max([d - 1 for d in distances] + [1])
            sig = Signal(range(top + 1), name=name)
            loads = []
            counters.append((sig, loads, top))
            return sig, loads

        def load_value(sig, d, top):
            # max(d - 1, current - 1) for a counter that never holds more than `top`: the current value - 1 when
            # it exceeds d, else d - 1 (a constant when d - 1 >= top).
            return d - 1 if d - 1 >= top else Mux(sig > d, sig - 1, d - 1)

        def dec(sig):
            return Mux(sig == 0, 0, sig - 1)

        # ---- bank state and counters ----------------------------------------------------------------
        b_open = Signal(NBP)                                       # bit b: bank b has a row open
        m.submodules.b_rows = b_rows = Memory(shape=fw["row"], depth=NBP, init=[])   # the open row of each bank
        b_row_w = b_rows.write_port()
        b_row_r = b_rows.read_port(domain="comb")
        wr_end = tm.CWL + BC  # cycles from WR to the end of its write data
        t_rpab = getattr(tm, "tRPab", None) or tm.tRP  # PREA to ACT/REF
        t_rtw = getattr(tm, "tRTW", RTW_GAP)  # read-to-write DQ bubble
        # Per bank: ACT (tRC after ACT, tRP after PRE, tRPab after PREA, tRFC after REF) and PRE (tRAS after ACT,
        # tRTP after RD, CWL + burst + tWR after WR). tRCD needs no counter of its own when tRC > tRCD: while a bank
        # is open, its ACT counter was zero at the ACT (an ACT needs it), was loaded with tRC - 1 then, and nothing
        # else loads it until the bank closes, so it holds tRC - 1 - (cycles since the cycle after the ACT) and tRCD
        # has passed once it is <= tRC - tRCD.
        derive_rcd = tm.tRC > tm.tRCD
        act_d = {Cmd.ACT: tm.tRC, Cmd.PRE: tm.tRP, Cmd.PREA: t_rpab, Cmd.REF: tm.tRFC}
        pre_d = {Cmd.ACT: tm.tRAS, Cmd.RD: tm.tRTP, Cmd.WR: wr_end + tm.tWR}
        col_d = {Cmd.ACT: tm.tRCD}
        b_act = [Signal(range(max(act_d.values())), name=f"b{b}_act") for b in range(NB)]
        b_pre = [Signal(range(max(pre_d.values())), name=f"b{b}_pre") for b in range(NB)]
        b_col = [] if derive_rcd else [Signal(range(max(tm.tRCD, 2)), name=f"b{b}_col") for b in range(NB)]
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

        # ---- per-bank readiness vectors (bit b = bank b) --------------------------------------------
        GK = G * K

        def per_group(f):
            return Cat(f(r, g).replicate(K) for r in range(R) for g in range(G))

        def per_rank(f):
            return Cat(f(r).replicate(GK) for r in range(R))

        def per_bank(f):
            return Cat(f(b) for b in range(NB))

        rank_mask = [Const(((1 << GK) - 1) << (r * GK), NBP) for r in range(R)]
        act_rdy = Signal(NB)
        pre_rdy = Signal(NB)
        rd_rdy = Signal(NB)
        wr_rdy = Signal(NB)
        col_ok = Signal(NB)
        act_z = Signal(NB)
        pre_z = Signal(NB)
        faw_ok = [Array(c[0] for c in r_faw[r])[r_fawp[r]] == 0 for r in range(R)]
        m.d.comb += [
            act_z.eq(per_bank(lambda b: b_act[b] == 0)),
            pre_z.eq(per_bank(lambda b: b_pre[b] == 0)),
            act_rdy.eq(~b_open[:NB] & act_z & per_group(lambda r, g: g_rrd[r, g][0] == 0)
                       & per_rank(lambda r: (r_rrd[r][0] == 0) & faw_ok[r] & ~blocked[r])),
            pre_rdy.eq(b_open[:NB] & pre_z & per_rank(lambda r: ~blocked[r])),
            col_ok.eq(b_open[:NB]
                      & per_bank(lambda b: (b_act[b] <= tm.tRC - tm.tRCD) if derive_rcd else (b_col[b] == 0))
                      & per_group(lambda r, g: g_ccd[r, g][0] == 0)
                      & per_rank(lambda r: (r_ccd[r][0] == 0) & ~blocked[r])),
            rd_rdy.eq(col_ok & per_group(lambda r, g: g_wtr[r, g][0] == 0)
                      & per_rank(lambda r: (r_rdbus[r][0] == 0) & (r_wtr[r][0] == 0) & credit)),
            wr_rdy.eq(col_ok & per_rank(lambda r: r_wrbus[r][0] == 0)),
        ]
        pad = Const(0, NBP - NB) if NBP > NB else Cat()
        col_rdy = Cat(rd_rdy, pad, wr_rdy, pad)          # indexed by Cat(bank index, write)
        row_rdy = Cat(act_rdy | pre_rdy, pad)            # ACT when the bank is closed, PRE when open

        # ---- per-slot candidates --------------------------------------------------------------------
        # A queued request's bank is open iff its open-bank flag is set, and `hit` implies open, so its ACT / PRE
        # is legal now iff it is not a hit and its bank's row command is ready.
        col_legal = Signal(N)
        row_legal = Signal(N)
        m.d.comb += [col_legal.eq(Cat(col_rdy.bit_select(e["ckey"], 1) for e in Q)),
                     row_legal.eq(Cat(row_rdy.bit_select(e["bidx"], 1) for e in Q))]
        col_cand = Signal(N)
        row_cand = Signal(N)
        if self.policy == "in-order":
            first = oldest(valid, "q_first")   # only the oldest request may issue its RD/WR
            m.d.comb += col_cand.eq(first & q_hit & q_fa & col_legal)
        else:
            m.d.comb += col_cand.eq(valid & q_hit & q_fa & col_legal)
        m.d.comb += row_cand.eq(valid & q_fb & ~q_hit & row_legal)
        col_oh = oldest(col_cand, "col_oh")
        row_oh = oldest(row_cand, "row_oh")
        col_sel = encode(col_oh, "col_sel")
        row_sel = encode(row_oh, "row_sel")

        # ---- refresh decisions ----------------------------------------------------------------------
        ref_mask = Array(rank_mask)[ref_rank]
        ref_prea = Signal()
        ref_ref = Signal()
        any_open = (b_open & ref_mask).any()
        m.d.comb += [
            ref_prea.eq(ref_active & any_open & ((Cat(pre_z, pad) & ref_mask) == ref_mask)),
            ref_ref.eq(ref_active & ~any_open & ((Cat(act_z, pad) & ref_mask) == ref_mask)),
        ]

        # ---- command selection ----------------------------------------------------------------------
        iss_kind = Signal(Cmd)
        iss_bidx = Signal(KW)
        iss_rank = Signal(fw["rank"])
        iss_bg = Signal(fw["bg"])
        iss_bank = Signal(fw["bank"])
        iss_row = Signal(fw["row"])
        iss_addr = Signal(amap.addr_bits)
        iss_tag = Signal(tw)
        iss_slot = Signal(range(N))
        rm_en = Signal()

        def sel(field, idx):
            return Array(e[field] for e in Q)[idx]

        with m.If(ref_prea):
            m.d.comb += [iss_kind.eq(Cmd.PREA), iss_bidx.eq(ref_rank << (awb + awg))]
        with m.Elif(ref_ref):
            m.d.comb += [iss_kind.eq(Cmd.REF), iss_bidx.eq(ref_rank << (awb + awg))]
        with m.Elif(col_cand.any()):
            ck = sel("ckey", col_sel)
            m.d.comb += [
                iss_kind.eq(Mux(ck[KW], Cmd.WR, Cmd.RD)), iss_bidx.eq(ck[:KW]),
                iss_row.eq(sel("row", col_sel)), iss_addr.eq(sel("addr", col_sel)),
                iss_tag.eq(sel("tag", col_sel)), iss_slot.eq(sel("slot", col_sel)),
                rm_en.eq(1),
            ]
        with m.Elif(row_cand.any()):
            bi = sel("bidx", row_sel)
            m.d.comb += [
                iss_kind.eq(Mux(b_open.bit_select(bi, 1), Cmd.PRE, Cmd.ACT)), iss_bidx.eq(bi),
                iss_row.eq(sel("row", row_sel)),
            ]
        m.d.comb += [iss_bank.eq(iss_bidx[:awb]), iss_bg.eq(iss_bidx[awb:awb + awg]),
                     iss_rank.eq(iss_bidx[awb + awg:awb + awg + aw["rank"]])]
        iss_col = amap.decode(iss_addr)["col"]
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
        iss_oh = Signal(NBP)                  # one-hot of the command's bank
        iss_rmask = Signal(NBP)               # the banks of the command's rank
        m.d.comb += [iss_oh.eq(Const(1, NBP) << iss_bidx), iss_rmask.eq(Array(rank_mask)[iss_rank])]
        m.d.sync += b_open.eq((b_open & ~Mux(is_pre, iss_oh, 0) & ~Mux(is_prea, iss_rmask, 0))
                              | Mux(is_act, iss_oh, 0))
        m.d.comb += [b_row_w.en.eq(is_act), b_row_w.addr.eq(iss_bidx), b_row_w.data.eq(iss_row)]

        def bank_counters(sigs, dist, touch):
            # `touch` (NBP bits): the banks whose counter this cycle's command loads; `dist`: distance per kind.
            top = max(dist.values()) - 1
            for b, sig in enumerate(sigs):
                with m.If(touch[b]):
                    nxt = dec(sig)
                    for kind, d in dist.items():
                        if d - 1 > 0:
                            nxt = Mux(iss_kind == kind, load_value(sig, d, top), nxt)
                    m.d.sync += sig.eq(nxt)
                with m.Elif(sig != 0):
                    m.d.sync += sig.eq(sig - 1)

        touch_act, touch_pre = Signal(NBP), Signal(NBP)
        m.d.comb += [touch_act.eq(Mux(is_act | is_pre, iss_oh, 0) | Mux(is_prea | is_ref, iss_rmask, 0)),
                     touch_pre.eq(Mux(is_act | is_col, iss_oh, 0))]
        bank_counters(b_act, act_d, touch_act)
        bank_counters(b_pre, pre_d, touch_pre)
        if not derive_rcd:
            bank_counters(b_col, col_d, Mux(is_act, iss_oh, 0))
        for r in range(R):
            here_r = iss_rank == r
            for g in range(G):
                here_g = here_r & (iss_bg == g)
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

        # A counter's load conditions are exclusive (they name different command kinds, or the same kind in
        # different ranks), so one load applies at most.
        for sig, loads, top in counters:
            nxt = dec(sig)
            for cond, d in loads:
                if d - 1 > 0:
                    nxt = Mux(cond, load_value(sig, d, top), nxt)
            m.d.sync += sig.eq(nxt)

        # ---- refresh bookkeeping --------------------------------------------------------------------
        has_req = [Signal(name=f"r{r}_has_req") for r in range(R)]
        for r in range(R):
            m.d.comb += has_req[r].eq((valid & q_rank[r]).any() if q_rank else valid.any())
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
            self.i.ready.eq(~valid.all() & wfree.any()),
            push.eq(self.i.valid & self.i.ready),
            wport.addr.eq(alloc),
            wport.data.eq(self.i.payload.wdata),
            wport.en.eq(push & self.i.payload.write),
        ]
        in_addr = self.i.payload.addr
        dec_in = amap.decode(in_addr)

        # ---- incremental slot flags ------------------------------------------------------------------
        # The compare vectors below are written where they are used (under the command kinds that need them), so a
        # simulator evaluates them only in those cycles.
        def same_bank_as(bidx):
            return Cat(e["bidx"] == bidx for e in Q)

        removed = Signal(N)                    # one-hot: the slot whose column command issues this cycle
        m.d.comb += removed.eq(Mux(rm_en, col_oh, 0))
        rm_fb = q_fb.bit_select(col_sel, 1)
        # Bank-state changes of this cycle's command, seen by every slot: ACT sets the hit flag of the requests to
        # its row, PRE / PREA clear those of the bank / rank.
        hit_n = Signal(N)
        with m.If(is_act):
            sb = same_bank_as(iss_bidx)
            m.d.comb += hit_n.eq((q_hit & ~sb) | (sb & Cat(e["row"] == iss_row for e in Q)))
        with m.Elif(is_pre):
            m.d.comb += hit_n.eq(q_hit & ~same_bank_as(iss_bidx))
        with m.Elif(is_prea):
            m.d.comb += hit_n.eq(q_hit & ~rank_slots(iss_rank))
        with m.Else():
            m.d.comb += hit_n.eq(q_hit)
        # The removed request's successors: the oldest remaining request to its bank becomes first of bank (if the
        # removed one was), the oldest remaining request to its burst becomes first of address. (Every request to
        # the bank of a first-of-bank request is younger than it, and a removed request is always first of
        # address, so "oldest remaining" is "oldest younger".)
        promote_b = Signal(N)
        promote_a = Signal(N)
        with m.If(rm_en):
            with m.If(rm_fb):
                m.d.comb += promote_b.eq(oldest_expr(valid & ~removed & same_bank_as(iss_bidx)))
            m.d.comb += promote_a.eq(oldest_expr(valid & ~removed & Cat(e["addr"] == iss_addr for e in Q)))
        # The incoming request: its bank's state after this cycle's command; first of bank / address among the
        # requests that stay.
        in_bidx = bank_index(dec_in["rank"], dec_in["bg"], dec_in["bank"])
        in_open_now = b_open.bit_select(in_bidx, 1)
        m.d.comb += b_row_r.addr.eq(in_bidx)
        act_in = is_act & (in_bidx == iss_bidx)
        pre_in = (is_pre & (in_bidx == iss_bidx)) | (is_prea & (dec_in["rank"] == iss_rank))
        in_hit = Signal()
        m.d.comb += in_hit.eq(Mux(act_in, dec_in["row"] == iss_row,
                                  Mux(pre_in, 0, in_open_now & (b_row_r.data == dec_in["row"]))))
        in_fb, in_fa = Signal(), Signal()
        with m.If(push):
            stay = valid & ~removed
            m.d.comb += [in_fb.eq(~(stay & same_bank_as(in_bidx)).any()),
                         in_fa.eq(~(stay & Cat(e["addr"] == in_addr for e in Q)).any())]
        ins_free = Signal(N)
        ins = Signal(N)                        # one-hot: the slot the incoming request is written to (0: none)
        m.d.comb += [ins_free.eq(~valid), ins.eq(Mux(push, ins_free & (~ins_free + 1)[:N], 0))]
        m.d.sync += [
            valid.eq((valid & ~removed) | ins),
            q_hit.eq((hit_n & ~ins) | Mux(in_hit, ins, 0)),
            q_fb.eq(((q_fb | promote_b) & ~ins) | Mux(in_fb, ins, 0)),
            q_fa.eq(((q_fa | promote_a) & ~ins) | Mux(in_fa, ins, 0)),
        ]
        with m.If(push):
            if q_rank:
                for r in range(R):
                    m.d.sync += q_rank[r].eq((q_rank[r] & ~ins) | Mux(dec_in["rank"] == r, ins, 0))
            for p, e in enumerate(Q):
                with m.If(ins[p]):
                    m.d.sync += [
                        e["bidx"].eq(in_bidx), e["ckey"].eq(Cat(in_bidx, self.i.payload.write)),
                        e["row"].eq(dec_in["row"]), e["addr"].eq(in_addr),
                        e["tag"].eq(self.i.payload.tag if self.tag_width else 0), e["slot"].eq(alloc),
                        younger[p].eq(0),
                    ]
                with m.Else():
                    m.d.sync += younger[p].eq(younger[p] | ins)

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
