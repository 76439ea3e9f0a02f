"""Cycle-accurate model of one DRAM channel (all ranks, bank groups and banks), written in Amaranth.

The model simulates in Amaranth's simulator and converts to Verilog for Verilator; it is a *model* (not meant
for synthesis), but uses only Amaranth constructs. It holds per-bank open-row state, the data of every burst
and an independent implementation of every timing/state rule of :class:`hdl.memctl.commands.Violation`, with the
same rules as the Python checker :func:`sim.dram.checker.check_trace` (see ``docs/dram_device.md``).

Pins (all in the ``sync`` domain; cycle ``t`` = the value of :attr:`cycle` in that clock cycle):

* ``cmd`` (in, ``command_layout(org)``): the command on the bus in this cycle (``kind == NOP`` when idle).
* ``wdata`` (in, ``org.clock_bits``): DQ bits of this clock during a write burst: a WR/WR_AB at cycle ``t`` takes
  its burst in cycles ``t + CWL .. t + CWL + burst_cycles - 1``, beat chunks LSB-first (cycle ``t + CWL`` carries
  bits ``[0, clock_bits)`` of the burst).
* ``rdata`` / ``rdata_valid`` (out): a RD at cycle ``t`` drives its burst in cycles ``t + CL .. t + CL +
  burst_cycles - 1`` (same packing); ``rdata`` is 0 outside read bursts.
* ``ab_rdata`` / ``ab_valid`` (out): a RD_AB at cycle ``t`` presents every bank's burst (bank ``bg *
  banks_per_group + bank`` at bits ``[i * burst_bits, (i + 1) * burst_bits)``) in the single cycle ``t + CL``.
* ``cycle`` (out): free-running cycle counter, 0 in the first cycle after reset.
* ``violation`` / ``violation_code`` / ``violation_cycle`` (out): one reported violation per cycle. An illegal
  command at cycle ``t`` reports each violated rule (its code) with ``violation_cycle = t``, the first one in cycle
  ``t + 1`` (later ones, and any backlog, in the following cycles; a 16-entry queue holds the backlog).
  A refresh-postponement violation (T_REFI) at deadline ``d`` is reported with ``violation_cycle = d``.
* ``violations`` (out, 32): violations reported so far; ``violations_dropped`` (out, 16): reports lost to a full
  queue (never in practice: it takes 16 illegal commands with several codes each, back to back).

Semantics of illegal commands: a command violating any rule is reported and **ignored**: it changes neither
bank/timing state nor data (an illegal WR writes nothing, an illegal RD returns no data). This matches the
checker when the flagged commands are passed to it as ``spoofed``.
"""

from amaranth import *
from amaranth.hdl import Shape
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out
from amaranth.lib.memory import Memory
from amaranth.lib.fifo import SyncFIFO

from hdl.memctl.commands import Cmd, command_layout, Violation, CYCLE_BITS

__all__ = ["DRAMChannel", "flat_burst_address", "MASK_BITS"]

# Bits of the internal violation mask: bit c for code c (1..19); T_REFI of rank 0 uses bit 15, rank r >= 1 bit 19 + r.
MASK_BITS = 20


def flat_burst_address(org, rank, bg, bank, row, col) -> int:
    """Index of a burst in ``init``: ``((rank * banks + bg * banks_per_group + bank) * rows + row) * bursts_per_row
    + col``."""
    return ((rank * org.banks + bg * org.banks_per_group + bank) * org.rows + row) * org.bursts_per_row + col


def _log2(n):
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


class DRAMChannel(wiring.Component):
    """One DRAM channel of ``config`` (a :class:`hdl.memctl.timing.DRAMConfig`).

    ``init``: initial burst contents, a dict ``{flat burst address: int}`` or a sequence indexed by flat burst
    address (see :func:`flat_burst_address`); missing bursts are 0.
    ``storage``: ``False`` drops the data arrays (writes are discarded, a read returns its own flat burst
    address): a timing-only model that converts to Verilog in a fraction of the time (Amaranth emits every
    memory bit's initial value, ~2-3 us per bit).
    ``all_bank``: ``False`` drops the RD_AB data path (``ab_rdata`` stays 0, ``ab_valid`` low; the all-bank rules
    are still checked): for a channel behind a memory controller, which never issues all-bank commands, it
    saves the per-bank read rings and a ``banks x burst_bits``-bit output that simulators evaluate every cycle.
    """

    def __init__(self, config, init=None, *, storage: bool = True, all_bank: bool = True):
        self.config = config
        self.org = org = config.org
        self.timing = tm = config.timing
        self.storage = storage
        self.all_bank = all_bank
        if tm.CL < 3 or tm.CWL < 2:
            raise ValueError("DRAMChannel needs CL >= 3 and CWL >= 2")
        if not tm.tRC >= tm.tRAS >= tm.tRCD:   # a bank's tRC and tRCD stamps follow from its tRAS stamp
            raise ValueError(f"DRAMChannel needs tRC >= tRAS >= tRCD, got {tm.tRC}, {tm.tRAS}, {tm.tRCD}")
        self._init = init
        self.mask_bits = MASK_BITS + org.ranks - 1
        super().__init__({
            "cmd": In(command_layout(org)),
            "wdata": In(org.clock_bits),
            "rdata": Out(org.clock_bits),
            "rdata_valid": Out(1),
            "ab_rdata": Out(org.banks * org.burst_bits),
            "ab_valid": Out(1),
            "cycle": Out(CYCLE_BITS),
            "violation": Out(1),
            "violation_code": Out(Violation),
            "violation_cycle": Out(CYCLE_BITS),
            "violations": Out(32),
            "violations_dropped": Out(16),
        })

    # -- storage ----------------------------------------------------------------------------------------------
    def _bank_inits(self):
        """Per bank index (bg * banks_per_group + bank): init list of depth ranks * rows * bursts_per_row."""
        org = self.org
        NB, ROWS, COLS = org.banks, org.rows, org.bursts_per_row
        depth = org.ranks * ROWS * COLS
        if self._init is None:
            return [None] * NB
        items = self._init.items() if isinstance(self._init, dict) else enumerate(self._init)
        lists = [[0] * depth for _ in range(NB)]
        used = [False] * NB
        total = org.ranks * NB * ROWS * COLS
        for addr, value in items:
            addr, value = int(addr), int(value)
            if not 0 <= addr < total:
                raise ValueError(f"init address {addr} outside 0..{total - 1}")
            if value == 0:
                continue
            col = addr % COLS
            row = (addr // COLS) % ROWS
            bi = (addr // (COLS * ROWS)) % NB
            rank = addr // (COLS * ROWS * NB)
            lists[bi][(rank * ROWS + row) * COLS + col] = value
            used[bi] = True
        return [lst if u else None for lst, u in zip(lists, used)]

    def elaborate(self, platform):
        m = Module()
        org, tm = self.org, self.timing
        R, BG, BPG, NB = org.ranks, org.bank_groups, org.banks_per_group, org.banks
        ROWS, COLS, BC = org.rows, org.bursts_per_row, org.burst_cycles
        BB, CB = org.burst_bits, org.clock_bits
        CL, CWL = tm.CL, tm.CWL
        WEND = CWL + BC
        TW = CYCLE_BITS + 1  # stamp width ("ready at" cycles may exceed the counter by a few thousand)

        # Simulation speed (Amaranth's simulator): a comb statement that reads a signal assigned by another comb
        # statement of the same module re-runs the module's whole comb function one delta cycle later. So the
        # decode and the rule checks below are expressions, not named signals, down to one signal (``mask``),
        # and everything that reads ``mask`` or a memory's read data in comb logic is in the submodule ``dp``
        # (docs/dram_device.md, "Simulation speed").
        dp = Module()
        m.submodules.dp = dp
        t = self.cycle
        m.d.sync += t.eq(t + 1)

        def stamp(name):
            return Signal(TW, name=name)

        def after(x):  # t + constant, as a stamp value
            return (t + x)[:TW]

        # ---- command decode ---------------------------------------------------------------------------------
        c = self.cmd
        kind = c.kind
        is_act, is_rd, is_wr = kind == Cmd.ACT, kind == Cmd.RD, kind == Cmd.WR
        is_pre, is_prea, is_ref = kind == Cmd.PRE, kind == Cmd.PREA, kind == Cmd.REF
        is_actab, is_rdab, is_wrab = kind == Cmd.ACT_AB, kind == Cmd.RD_AB, kind == Cmd.WR_AB
        is_nop = kind == Cmd.NOP
        known = Cat(is_nop, is_act, is_rd, is_wr, is_pre, is_prea, is_ref, is_actab, is_rdab, is_wrab).any()
        single_bank = is_act | is_rd | is_wr | is_pre
        uses_row = is_act | is_actab
        uses_col = is_rd | is_wr | is_rdab | is_wrab

        rank_ok = c.rank < R
        bank_ok = (c.bg < BG) & (c.bank < BPG)
        addr_bad = ~is_nop & (~known | ~rank_ok | (single_bank & ~bank_ok)
                              | (uses_row & (c.row >= ROWS)) | (uses_col & (c.col >= COLS)))

        rank = c.rank
        bi = (c.bg * BPG + c.bank)[:Shape.cast(range(NB)).width]             # bank index within the rank
        rbi = (rank * NB + bi)[:Shape.cast(range(R * NB)).width]

        # ---- state ------------------------------------------------------------------------------------------
        # Per bank (rank * NB + bi). Open flags and open rows: one packed signal per rank each (bit / field ``bi``).
        # The six "ready at" stamps live in one memory row per bank (written only by a legal single-bank command,
        # read at the addressed bank); an all-bank command (ACT_AB, PREA, RD_AB, WR_AB) writes the rank's copy of
        # the stamps it sets instead of every bank's, and a bank's stamp is the later of the two (every stamp is
        # "command cycle + a fixed distance", so the newest write is the maximum; tRPab >= tRP, DRAMTiming checks).
        # Simulators then update a few signals per cycle, not 8 per bank (docs/dram_device.md, "Simulation speed").
        RB_ = max(1, (ROWS - 1).bit_length())       # a row's field in the packed rows (>= 1 bit, unlike RB below)
        r_openv = [Signal(NB, name=f"open_r{r}") for r in range(R)]
        r_rowv = [Signal(NB * RB_, name=f"rows_r{r}") for r in range(R)]
        SF = ("rp", "rc", "rcd", "ras", "rtp", "wr")   # ACT: tRP / tRPab, tRC; RD/WR: tRCD; PRE: tRAS, tRTP, tWR
        # A bank's row keeps four of them: tRC and tRCD follow from tRAS (all three are "ACT cycle + distance";
        # 0 = never). Fewer bits: Amaranth's simulator evaluates a write port's enable once per bit.
        MF = ("rp", "ras", "rtp", "wr")
        bstate = Memory(shape=len(MF) * TW, depth=R * NB, init=[])
        m.submodules.bstate = bstate
        bs_r = bstate.read_port(domain="comb")
        bs_w = bstate.write_port()
        # The read address follows single-bank commands only (a NOP or an all-bank command keeps the last one):
        # a simulator then re-reads the row, and re-runs the checks that use it, only when another bank is named.
        bs_addr = Signal.like(bs_r.addr)
        m.d.comb += bs_r.addr.eq(Mux(is_act | is_rd | is_wr | is_pre, rbi, bs_addr))
        m.d.sync += bs_addr.eq(bs_r.addr)
        ab = {f: [stamp(f"ab_{f}_{r}") for r in range(R)] for f in SF}    # the rank's all-bank copies
        A = Array
        # Per (rank, bank group): ACT, column command, end of write data, each with its _L and _S distance.
        g_rrdl = [stamp(f"rrdl_{k}") for k in range(R * BG)]
        g_rrds = [stamp(f"rrds_{k}") for k in range(R * BG)]
        g_ccdl = [stamp(f"ccdl_{k}") for k in range(R * BG)]
        g_ccds = [stamp(f"ccds_{k}") for k in range(R * BG)]
        g_wtrl = [stamp(f"wtrl_{k}") for k in range(R * BG)]
        g_wtrs = [stamp(f"wtrs_{k}") for k in range(R * BG)]
        # Per rank: maxima over the rank's banks (exact for the all-bank commands and PREA, see docs).
        r_rp = [stamp(f"r_rp_{r}") for r in range(R)]
        r_rc = [stamp(f"r_rc_{r}") for r in range(R)]
        r_rcd = [stamp(f"r_rcd_{r}") for r in range(R)]
        r_ras = [stamp(f"r_ras_{r}") for r in range(R)]
        r_rtp = [stamp(f"r_rtp_{r}") for r in range(R)]
        r_wr = [stamp(f"r_wr_{r}") for r in range(R)]
        r_rfc = [stamp(f"r_rfc_{r}") for r in range(R)]
        r_faw = [[stamp(f"faw_{r}_{i}") for i in range(4)] for r in range(R)]  # oldest first, + tFAW
        r_owed = [Signal(signed(32), name=f"owed_{r}") for r in range(R)]

        rsel = [rank == r for r in range(R)]

        def by_rank(sigs):
            return A(sigs)[rank]

        openv = Value.cast(by_rank(r_openv))      # the addressed rank's open flags
        any_open = openv.any()
        all_open = openv.all()
        # The addressed bank's stamps: its memory row or the rank's all-bank copy, whichever is later.
        mine = {f: bs_r.data[j * TW:(j + 1) * TW] for j, f in enumerate(MF)}
        ras = mine["ras"]
        mine_all = dict(mine, rc=Mux(ras == 0, 0, (ras + (tm.tRC - tm.tRAS))[:TW]),
                        rcd=Mux(ras == 0, 0, (ras - (tm.tRAS - tm.tRCD))[:TW]))
        bst = {}
        for f in SF:
            rk = by_rank(ab[f])
            bst[f] = Mux(mine_all[f] > rk, mine_all[f], rk)

        # Per bank group of the addressed rank: is each _L/_S rule still binding?
        def bg_busy(stamps):
            return [Cat(rsel[r] & (t < stamps[r * BG + g]) for r in range(R)).any() for g in range(BG)]

        rrdl_b, rrds_b = bg_busy(g_rrdl), bg_busy(g_rrds)
        ccdl_b, ccds_b = bg_busy(g_ccdl), bg_busy(g_ccds)
        wtrl_b, wtrs_b = bg_busy(g_wtrl), bg_busy(g_wtrs)

        def same_bg(busy):
            return Array(busy)[c.bg]

        def other_bg(busy):
            return Cat(busy[g] & (c.bg != g) for g in range(BG)).any()

        def any_bg(busy):
            return Cat(busy).any()

        # DQ bus: the last K legal bursts (start cycle, rank, write?).
        MAXLAT, MINLAT = max(CL, CWL), min(CL, CWL)
        gapmax = max(tm.tRTRS, tm.tRTW)
        K = (MAXLAT - MINLAT + gapmax + BC) // BC + 2
        # One shift register of K entries {valid, start, rank, write} (one signal: a simulator updates it once).
        RW = Shape.cast(range(max(2, R))).width
        EW = 1 + TW + RW + 1
        bus = Signal(K * EW)
        bus_e = [bus[i * EW:(i + 1) * EW] for i in range(K)]
        bus_v = [e[0] for e in bus_e]
        bus_s = [e[1:1 + TW] for e in bus_e]
        bus_r = [e[1 + TW:1 + TW + RW] for e in bus_e]
        bus_w = [e[-1] for e in bus_e]
        new_w = is_wr | is_wrab
        new_s = Mux(new_w, after(CWL), after(CL))
        conflicts = []
        for i in range(K):
            other_first = bus_s[i] <= new_s
            diff_rank = bus_r[i] != rank
            # gap after the first burst: tRTRS across ranks, tRTW read -> write in a rank, else 0
            gap_a = Mux(diff_rank, tm.tRTRS, Mux(~bus_w[i] & new_w, tm.tRTW, 0))   # existing first
            gap_b = Mux(diff_rank, tm.tRTRS, Mux(~new_w & bus_w[i], tm.tRTW, 0))   # new first
            conflicts.append(bus_v[i] & Mux(other_first, new_s < bus_s[i] + BC + gap_a,
                                            bus_s[i] < new_s + BC + gap_b))
        bus_conflict = Cat(conflicts).any()

        # ---- rule checks (comb) ------------------------------------------------------------------------------
        V = Violation
        mask = Signal(MASK_BITS)  # codes violated by this cycle's command
        rfc = t < by_rank(r_rfc)
        bopen = openv.bit_select(bi, 1)

        def flag(code, cond):
            m.d.comb += mask[code.value].eq(cond)

        with m.If(addr_bad):
            flag(V.ADDRESS, 1)
        with m.Elif(~is_nop):
            flag(V.T_RFC, rfc)
            with m.If(is_rd | is_wr):
                with m.If(~bopen):
                    flag(V.BANK_CLOSED, 1)
                with m.Else():
                    flag(V.T_RCD, t < bst["rcd"])
                    flag(V.T_CCD_L, same_bg(ccdl_b))
                    flag(V.T_CCD_S, other_bg(ccds_b))
                    flag(V.T_WTR_L, is_rd & same_bg(wtrl_b))
                    flag(V.T_WTR_S, is_rd & other_bg(wtrs_b))
                    flag(V.BUS, bus_conflict)
            with m.Elif(is_act):
                flag(V.BANK_OPEN, bopen)
                flag(V.T_RP, t < bst["rp"])
                flag(V.T_RC, t < bst["rc"])
                flag(V.T_RRD_L, same_bg(rrdl_b))
                flag(V.T_RRD_S, other_bg(rrds_b))
                flag(V.T_FAW, t < by_rank([f[0] for f in r_faw]))
            with m.Elif(is_pre):
                with m.If(bopen):  # PRE of a precharged bank is a NOP
                    flag(V.T_RAS, t < bst["ras"])
                    flag(V.T_RTP, t < bst["rtp"])
                    flag(V.T_WR, t < bst["wr"])
            with m.Elif(is_prea):
                with m.If(any_open):
                    flag(V.T_RAS, t < by_rank(r_ras))
                    flag(V.T_RTP, t < by_rank(r_rtp))
                    flag(V.T_WR, t < by_rank(r_wr))
            with m.Elif(is_ref | is_actab):
                flag(V.BANK_OPEN, any_open)
                flag(V.T_RP, t < by_rank(r_rp))
                with m.If(is_actab):
                    flag(V.T_RC, t < by_rank(r_rc))
                    flag(V.T_RRD_L, any_bg(rrdl_b))
                    flag(V.T_FAW, t < by_rank([f[0] for f in r_faw]))
            with m.Elif(is_rdab | is_wrab):
                with m.If(~all_open):
                    flag(V.BANK_CLOSED, 1)
                with m.Else():
                    flag(V.T_RCD, t < by_rank(r_rcd))
                    flag(V.T_CCD_L, any_bg(ccdl_b))
                    flag(V.T_WTR_L, is_rdab & any_bg(wtrl_b))
                    flag(V.BUS, is_wrab & bus_conflict)

        legal = ~is_nop & (mask == 0)
        OKS = (("act", is_act), ("rd", is_rd), ("wr", is_wr), ("pre", is_pre), ("prea", is_prea), ("ref", is_ref),
               ("actab", is_actab), ("rdab", is_rdab), ("wrab", is_wrab))
        # ``ok``: expressions for comb logic; ``oks``: the same as signals of the submodule ``okm`` for the clocked
        # updates (a clocked process reads settled signals; the expressions would be evaluated at every use).
        ok = {k: legal & cond for k, cond in OKS}
        okv = Signal(len(OKS))
        okm = Module()
        m.submodules.okm = okm
        okm.d.comb += okv.eq(Cat(ok[k] for k, _ in OKS))
        oks = {k: okv[i] for i, (k, _) in enumerate(OKS)}
        rank_is = Signal(R, name="rank_is")       # one-hot rank and bank group of the command (for `sync`)
        bg_is = Signal(BG, name="bg_is")
        bopen_s = Signal()
        okm.d.comb += [rank_is.eq(Cat(rsel)), bg_is.eq(Cat(c.bg == g for g in range(BG))), bopen_s.eq(bopen)]

        # ---- state updates (legal commands only) --------------------------------------------------------------
        # The addressed bank's memory row (legal single-bank commands only) with the stamps this command sets.
        sets = {"rp": (ok["pre"], after(tm.tRP)), "ras": (ok["act"], after(tm.tRAS)),
                "rtp": (ok["rd"], after(tm.tRTP)), "wr": (ok["wr"], after(WEND + tm.tWR))}
        dp.d.comb += [bs_w.addr.eq(rbi), bs_w.data.eq(Cat(Mux(sets[f][0], sets[f][1], mine[f]) for f in MF)),
                     bs_w.en.eq(ok["act"] | (ok["pre"] & bopen) | ok["rd"] | ok["wr"])]
        for r in range(R):
            in_rank = rank_is[r]
            with m.If(in_rank):
                with m.If(oks["act"]):
                    m.d.sync += [r_openv[r].bit_select(bi, 1).eq(1), r_rowv[r].word_select(bi, RB_).eq(c.row)]
                with m.If(oks["actab"]):
                    m.d.sync += [r_openv[r].eq((1 << NB) - 1), r_rowv[r].eq(c.row[:RB_].replicate(NB)),
                                 ab["rc"][r].eq(after(tm.tRC)), ab["rcd"][r].eq(after(tm.tRCD)),
                                 ab["ras"][r].eq(after(tm.tRAS))]
                with m.If(oks["pre"] & bopen_s):
                    m.d.sync += r_openv[r].bit_select(bi, 1).eq(0)
                with m.If(oks["prea"]):
                    m.d.sync += [r_openv[r].eq(0), ab["rp"][r].eq(after(tm.tRPab))]
                with m.If(oks["rdab"]):
                    m.d.sync += ab["rtp"][r].eq(after(tm.tRTP))
                with m.If(oks["wrab"]):
                    m.d.sync += ab["wr"][r].eq(after(WEND + tm.tWR))
            for g in range(BG):
                k = r * BG + g
                me = in_rank & bg_is[g]
                with m.If((oks["act"] & me) | (oks["actab"] & in_rank)):
                    m.d.sync += [g_rrdl[k].eq(after(tm.tRRD_L)), g_rrds[k].eq(after(tm.tRRD_S))]
                with m.If(((oks["rd"] | oks["wr"]) & me) | ((oks["rdab"] | oks["wrab"]) & in_rank)):
                    m.d.sync += [g_ccdl[k].eq(after(tm.tCCD_L)), g_ccds[k].eq(after(tm.tCCD_S))]
                with m.If((oks["wr"] & me) | (oks["wrab"] & in_rank)):
                    m.d.sync += [g_wtrl[k].eq(after(WEND + tm.tWTR_L)), g_wtrs[k].eq(after(WEND + tm.tWTR_S))]
            with m.If(in_rank):
                with m.If(oks["act"] | oks["actab"]):
                    m.d.sync += [r_rc[r].eq(after(tm.tRC)), r_rcd[r].eq(after(tm.tRCD)),
                                 r_ras[r].eq(after(tm.tRAS))]
                with m.If(oks["act"]):
                    m.d.sync += [r_faw[r][i].eq(r_faw[r][i + 1]) for i in range(3)]
                    m.d.sync += r_faw[r][3].eq(after(tm.tFAW))
                with m.If(oks["actab"]):
                    m.d.sync += [r_faw[r][i].eq(after(tm.tFAW)) for i in range(4)]
                with m.If(oks["pre"] & bopen_s):
                    with m.If(r_rp[r] < after(tm.tRP)):
                        m.d.sync += r_rp[r].eq(after(tm.tRP))
                with m.If(oks["prea"]):
                    m.d.sync += r_rp[r].eq(after(tm.tRPab))
                with m.If(oks["rd"] | oks["rdab"]):
                    m.d.sync += r_rtp[r].eq(after(tm.tRTP))
                with m.If(oks["wr"] | oks["wrab"]):
                    m.d.sync += r_wr[r].eq(after(WEND + tm.tWR))
                with m.If(oks["ref"]):
                    m.d.sync += r_rfc[r].eq(after(tm.tRFC))

        # DQ bus history
        with m.If(oks["rd"] | oks["wr"] | oks["wrab"]):
            rank_w = Cat(rank, Const(0, max(0, RW - len(rank))))[:RW]
            m.d.sync += bus.eq(Cat(Const(1, 1), new_s, rank_w, new_w, bus[:(K - 1) * EW]))

        # ---- refresh postponement ----------------------------------------------------------------------------
        phase = Signal(range(tm.tREFI))
        m.d.sync += phase.eq(Mux(phase == tm.tREFI - 1, 0, phase + 1))
        tick = (phase == 0) & (t != 0)
        refi = []
        for r in range(R):
            owed_next = r_owed[r] + tick - (ok["ref"] & rsel[r])
            m.d.sync += r_owed[r].eq(r_owed[r] + tick - (oks["ref"] & rank_is[r]))
            refi.append(tick & (owed_next > 8))
        refi = Cat(refi)

        # ---- violation reporting -----------------------------------------------------------------------------
        MB = self.mask_bits
        new_mask = (mask | (refi[0] << V.T_REFI.value) | (refi[1:] << MASK_BITS))[:MB]
        queue = m.submodules.vqueue = SyncFIFO(width=MB + CYCLE_BITS, depth=16)
        cur_mask = Signal(MB)
        cur_cycle = Signal(CYCLE_BITS)
        rest = (cur_mask & (cur_mask - 1))[:MB]
        code = Const(0, range(MASK_BITS))
        for i in reversed(range(MB)):
            code = Mux(cur_mask[i], i if i < MASK_BITS else V.T_REFI.value, code)
        m.d.comb += [self.violation.eq(cur_mask != 0), self.violation_code.eq(code),
                     self.violation_cycle.eq(cur_cycle)]
        with m.If(cur_mask != 0):
            m.d.sync += self.violations.eq(self.violations + 1)
        push = ((rest != 0) | queue.r_rdy) & (new_mask != 0)
        with m.If(rest != 0):
            m.d.sync += cur_mask.eq(rest)
        with m.Elif(queue.r_rdy):
            m.d.sync += [cur_mask.eq(queue.r_data[:MB]), cur_cycle.eq(queue.r_data[MB:])]
        with m.Else():
            m.d.sync += [cur_mask.eq(new_mask), cur_cycle.eq(t)]
        dp.d.comb += [queue.r_en.eq((rest == 0) & queue.r_rdy), queue.w_en.eq(push),
                      queue.w_data.eq(Mux(push, Cat(new_mask, t), 0))]   # changes only with a push
        with m.If(push & ~queue.w_rdy):
            m.d.sync += self.violations_dropped.eq(self.violations_dropped + 1)

        # ---- data path ---------------------------------------------------------------------------------------
        RB, CLB, KB = _log2(ROWS), _log2(COLS), _log2(R)

        def addr(rank_v, row_v, col_v):
            return Cat(col_v[:CLB], row_v[:RB], rank_v[:KB])

        rowsel = Value.cast(by_rank(r_rowv))
        rows_of_rank = [rowsel[b * RB_:(b + 1) * RB_] for b in range(NB)]
        # Read pipeline: bit j of rp_dq / rp_ab is set when a RD / RD_AB issued j + 1 cycles ago (one shift vector
        # each, not a register per stage). The data go through small rings in issue order: the write slot is taken
        # at issue, the read pointer advances on each read-out (FIFO order), so no slot travels down the pipeline.
        n_dq = (CL - 2) // BC + 2
        n_ab = CL
        NRP = CL + BC - 1
        rp_dq = Signal(NRP)
        rp_ab = Signal(NRP)
        rp_bank = Signal(range(NB))  # bank of the read issued last cycle (stage 0)
        dslot = Signal(range(n_dq))  # next ring slot of a RD (written at stage 0)
        aslot = Signal(range(n_ab))
        dq_rptr = Signal(range(n_dq))
        ab_rptr = Signal(range(n_ab))
        dslot0 = Signal(range(n_dq))  # the slot of the read at stage 0
        aslot0 = Signal(range(n_ab))
        with m.If(oks["rd"]):
            m.d.sync += dslot.eq(Mux(dslot == n_dq - 1, 0, dslot + 1))
        with m.If(oks["rdab"]):
            m.d.sync += aslot.eq(Mux(aslot == n_ab - 1, 0, aslot + 1))
        with m.If(rp_dq[CL - 2]):
            m.d.sync += dq_rptr.eq(Mux(dq_rptr == n_dq - 1, 0, dq_rptr + 1))
        with m.If(rp_ab[CL - 2]):
            m.d.sync += ab_rptr.eq(Mux(ab_rptr == n_ab - 1, 0, ab_rptr + 1))
        m.d.sync += [rp_dq.eq(Cat(oks["rd"], rp_dq[:-1])), rp_ab.eq(Cat(oks["rdab"], rp_ab[:-1])), rp_bank.eq(bi),
                     dslot0.eq(dslot), aslot0.eq(aslot)]

        # Write pipeline: bit j of wp_v is set when a WR / WR_AB issued j + 1 cycles ago; the writes' rank, bank,
        # column and all-bank flag wait in a ring (issue order) until their last beat is on the pins.
        NWP = CWL + BC - 1
        wp_v = Signal(NWP)
        m.d.sync += wp_v.eq(Cat(oks["wr"] | oks["wrab"], wp_v[:-1]))
        n_w = 1 << max(1, (NWP).bit_length())
        wr_ring = Memory(shape=KB + _log2(NB) + CLB + 1, depth=n_w, init=[])
        m.submodules.wr_ring = wr_ring
        wr_w, wr_r = wr_ring.write_port(), wr_ring.read_port(domain="comb")
        w_wptr = Signal(range(n_w))
        w_rptr = Signal(range(n_w))
        dp.d.comb += [wr_w.addr.eq(w_wptr), wr_w.en.eq(ok["wr"] | ok["wrab"]),
                     wr_w.data.eq(Cat(rank[:KB], bi[:_log2(NB)], c.col[:CLB], ok["wrab"])), wr_r.addr.eq(w_rptr)]
        with m.If(oks["wr"] | oks["wrab"]):
            m.d.sync += w_wptr.eq(w_wptr + 1)
        wlast = NWP - 1  # the write whose last beat is on the pins now
        commit = wp_v[wlast]
        with m.If(commit):
            m.d.sync += w_rptr.eq(w_rptr + 1)
        c_rank = wr_r.data[:KB] if KB else Const(0, 1)
        c_bank = wr_r.data[KB:KB + _log2(NB)]
        c_col = wr_r.data[KB + _log2(NB):KB + _log2(NB) + CLB]
        c_ab = wr_r.data[-1]
        wbuf = [Signal(CB, name=f"wbuf_{i}") for i in range(BC - 1)]
        for i in range(BC - 1):
            with m.If(wp_v[CWL - 1 + i]):
                m.d.sync += wbuf[i].eq(self.wdata)
        commit_data = Cat(*wbuf, self.wdata)
        commit_rowv = Value.cast(A(r_rowv)[c_rank])
        commit_rows = [commit_rowv[b * RB_:(b + 1) * RB_] for b in range(NB)]

        bank_data = []
        inits = self._bank_inits() if self.storage else None
        for b in range(NB):
            if self.storage:
                mem = Memory(shape=BB, depth=R * ROWS * COLS, init=inits[b] or [])
                m.submodules[f"bank{b}"] = mem
                rport = mem.read_port()
                wport = mem.write_port()
                dp.d.comb += [
                    rport.addr.eq(addr(rank, rows_of_rank[b], c.col)),
                    rport.en.eq((ok["rd"] & (bi == b)) | ok["rdab"]),
                    wport.addr.eq(addr(c_rank, commit_rows[b], c_col)),
                    wport.data.eq(commit_data),
                    wport.en.eq(commit & (c_ab | (c_bank == b))),
                ]
                bank_data.append(rport.data)
        if not self.storage:
            # Timing-only model: a read returns its own flat burst address (see flat_burst_address), so benchmarks
            # can still check which burst came back where, without storage. Registered like a synchronous read
            # port's data: a RD's tag, and for a RD_AB the column, rank and every bank's row (the banks' tags are
            # formed at the output).
            tag_w = CLB + RB + _log2(NB) + KB
            rd_tag = Signal(tag_w)
            with m.If(oks["rd"]):
                m.d.sync += rd_tag.eq(Cat(c.col[:CLB], rowsel.word_select(bi, RB_)[:RB], bi[:_log2(NB)],
                                          rank[:KB]))
            ab_tag = Signal(CLB + KB + NB * RB_)
            if self.all_bank:
                with m.If(oks["rdab"]):
                    m.d.sync += ab_tag.eq(Cat(c.col[:CLB], rank[:KB], rowsel))

        # Read rings: written the cycle after the command, read at t + CL - 1 -> presented at t + CL. A ring is as
        # wide as its data (a timing-only model's tags are a few bits: Amaranth's simulator evaluates a write
        # port's enable once per data bit). One ring memory per bank for RD_AB when bursts are stored (Amaranth's
        # simulator cannot compile a write port thousands of bits wide).

        def widen(v):
            return Cat(v, Const(0, BB - len(v))) if len(v) < BB else v

        dq_data = Array(bank_data)[rp_bank] if self.storage else rd_tag
        dq_ring = Memory(shape=len(dq_data), depth=n_dq, init=[])
        m.submodules.dq_ring = dq_ring
        dq_w, dq_r = dq_ring.write_port(), dq_ring.read_port()
        dp.d.comb += [
            dq_w.addr.eq(dslot0), dq_w.data.eq(dq_data), dq_w.en.eq(rp_dq[0]),
            dq_r.addr.eq(dq_rptr), dq_r.en.eq(rp_dq[CL - 2]),
        ]
        if self.all_bank:
            dp.d.comb += self.ab_valid.eq(rp_ab[CL - 1])
            for grp in ([[b] for b in range(NB)] if self.storage else [list(range(NB))]):
                data_in = bank_data[grp[0]] if self.storage else ab_tag
                ab_ring = Memory(shape=len(data_in), depth=n_ab, init=[])
                m.submodules[f"ab_ring{grp[0]}" if self.storage else "ab_ring"] = ab_ring
                ab_w, ab_r = ab_ring.write_port(), ab_ring.read_port()
                dp.d.comb += [
                    ab_w.addr.eq(aslot0), ab_w.data.eq(data_in), ab_w.en.eq(rp_ab[0]),
                    ab_r.addr.eq(ab_rptr), ab_r.en.eq(rp_ab[CL - 2]),
                ]
                for b in grp:
                    if self.storage:
                        out = ab_r.data
                    else:
                        col_o, rank_o = ab_r.data[:CLB], ab_r.data[CLB:CLB + KB]
                        row_o = ab_r.data[CLB + KB + b * RB_:CLB + KB + (b + 1) * RB_][:RB]
                        out = Cat(col_o, row_o, Const(b, _log2(NB)), rank_o)
                    with dp.If(rp_ab[CL - 1]):       # 0 outside ab_valid (a simulator skips the wide update)
                        dp.d.comb += self.ab_rdata.word_select(b, BB).eq(widen(out))
        rdq = widen(dq_r.data)
        for i in range(BC):
            with dp.If(rp_dq[CL - 1 + i]):
                dp.d.comb += [self.rdata.eq(rdq.word_select(i, CB)), self.rdata_valid.eq(1)]
        return m
