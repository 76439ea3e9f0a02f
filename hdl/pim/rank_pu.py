"""DIMM-PIM rank PU ([L3] 4, esp. 4.3 kernel fusion and 4.4 dynamic refresh; docs/references.md): the
buffer-chip controller of one rank that runs the fused decode-attention kernel of ``docs/pim.md`` head by head.
Design notes, timing and measured cycle counts: ``docs/pim_rank_pu_sequencer.md``.

Two components:

* :class:`PIMSequencer` -- the all-bank command program of a head (``ACT_AB`` / ``RD_AB`` ... / ``PREA`` per row
  of the K region, then of the V region) with **hardware timing counters** (tRCD, tCCD_L, tRTP, tRAS, tRP/tRPab,
  tRC, tRRD_L, tFAW with an ACT_AB counting as four activates, tRFC) and **dynamic refresh** (section 4.4): a
  refresh is due every tREFI; up to ``config.max_postponed_refresh`` (8) may be postponed; before a head starts
  the sequencer issues pending REFs until the head's worst-case length (computed from L in hardware) fits
  before the next refresh deadline; a head longer than that (or a datapath stall) is covered by an urgent
  refresh at the next command slot (PREA, REF, re-ACT of the same row).
* :class:`RankPU` -- the sequencer plus the buffer-chip datapath: routes each RD_AB's data (the DRAM's
  ``ab_rdata``) with the broadcast word (score: the chip's q slice of the burst; context: the ``G`` probabilities
  of the RD_AB's token sets) to the bank PUs (:class:`hdl.pim.bank_pu.BankPU`, outside this component: they
  sit in the DRAM chips), collects their results over the chip -> buffer link (16 bits per chip per command
  clock), and runs the rank adder tree -> chunk softmax -> rank buffer -> normalizer -> broadcast, and at the
  end of a head the context aggregation -> ``result`` stream.

Clock: everything runs in the DRAM command clock (``sync``); cycle 0 = the first cycle after reset, the same
numbering as :class:`sim.dram.device.DRAMChannel` ``cycle``.
"""

from amaranth.hdl import Module, Signal, Mux, Cat, Const, Array, signed
from amaranth.lib.memory import Memory
from amaranth.lib import wiring, stream, data
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2, bits_for

from hdl.memctl.commands import Cmd, command_layout, CYCLE_BITS
from hdl.pim.allbank import allbank_gaps
from hdl.pim.config import PIMConfig

__all__ = ["PIMSequencer", "RankPU", "head_cycle_bound", "launch_layout", "rd_layout", "pu_ctrl_layout",
           "MODE_SCORE", "MODE_CONTEXT"]

MODE_SCORE = 0    # = hdl.pim.bank_pu.MODE_SCORE
MODE_CONTEXT = 1  # = hdl.pim.bank_pu.MODE_CONTEXT


def _pow2(config, name, value):
    if value < 1 or value & (value - 1):
        raise ValueError(f"PIMConfig {config.name!r}: {name} = {value} must be a power of two (the rank PU "
                         f"splits token and column indices with shifts)")
    return exact_log2(value)


def launch_layout(config) -> data.StructLayout:
    """One kernel launch (one head): ``L`` tokens (1 .. ``config.max_tokens``), the first row of its K and V
    regions (``hdl.pim.mapping.head_layout``), the head's refresh hint ``postpone`` (0 .. ``max_postponed_refresh``:
    before this head, REFs are issued until at most ``postpone`` are owed -- 0: refresh eagerly at this head
    boundary; ``max_postponed_refresh``: only as many as the head's length requires), and the prescaled query
    ``q`` (``d`` FP16, element ``i`` in bits ``[16 i, 16 i + 16)``)."""
    rows = config.dram.org.rows
    return data.StructLayout({
        "L": bits_for(config.max_tokens),
        "k_row0": max(1, ceil_log2(rows)),
        "v_row0": max(1, ceil_log2(rows)),
        "postpone": bits_for(config.max_postponed_refresh),
        "q": 16 * config.head_dim,
    })


def rd_layout(config) -> data.StructLayout:
    """What the sequencer records for every RD_AB it issues (consumed when its data arrives ``CL`` later):
    ``mode``, ``first`` / ``last`` of the bank-PU job (score: burst 0 / burst ``bpt - 1`` of a token; context: the
    head's first / last context RD_AB), ``k`` (score: the burst index), ``slot`` (score: token slot ``u``;
    context: column ``v``)."""
    return data.StructLayout({
        "mode": 1, "first": 1, "last": 1,
        "k": max(1, ceil_log2(config.bursts_per_token)),
        "slot": bits_for(config.max_tokens),
        "hp": 1,        # parity of the head (launch count mod 2): selects its q in the rank PU
        "pfirst": 1,    # the phase's first RD_AB (the rank PU queues the phase for the link)
    })


def _urgent_margin(tm):
    """The sequencer refreshes at the next command slot once the refresh deadline is this close (cycles): a PREA
    may wait up to max(tRAS, tRTP), then tRPab to the REF, plus slack."""
    return max(tm.tRAS, tm.tRTP) + tm.tRPab + 16


def head_cycle_bound(config, L, *, drain=0):
    """Upper bound (cycles) of one head's command program as the sequencer computes it in hardware, from the
    head's first command to its closing PREA: every RD_AB ``tCCD_L`` apart, every row change (plus the two
    region ends) at most ``tRC + tRCD + tRTP + tRPab`` (``ROW``), plus ``drain`` (the datapath's latency from
    the last score RD_AB to the first probabilities, :attr:`RankPU.drain_bound`)."""
    tm = config.dram.timing
    B, G, bpt, cpr = config.banks, config.token_sets, config.bursts_per_token, config.columns_per_row
    nS = -(-L // B) * bpt
    nV = -(-L // G)
    row = tm.tRC + tm.tRCD + tm.tRTP + tm.tRPab
    return (nS + nV) * tm.tCCD_L + (nS // cpr + nV // cpr + 4) * row + drain


class PIMSequencer(wiring.Component):
    """All-bank command sequencer of one rank (see the module docstring).

    Ports (``sync`` domain):

    * ``launch`` (in stream, :func:`launch_layout`): one head. Accepted when the sequencer is idle, or (with
      ``overlap``) at the end of a phase when the new head's score phase may run before the pending head's
      context phase (both heads' ``ceil(L / B) B`` e_t entries fit ``config.max_tokens``): phases
      S0 S1 C0 S2 C1 ... ([L3] 4.3 bubble-free pipelining). ``overlap=False``: heads strictly sequential.
    * ``cmd`` (out, ``command_layout(org)``): the command on the bus this cycle (``NOP`` otherwise).
    * ``rd`` (out stream, :func:`rd_layout`): one entry per RD_AB, in the cycle it issues. ``rd.ready`` low
      holds RD_ABs back (the rank PU's record queue is full). ``rd.valid`` is a strobe that is only raised
      with ``rd.ready`` high (a RD_AB issues only when its record can be stored): connect it to a FIFO's write
      side, not to a stream consumer whose ``ready`` waits for ``valid``.
    * ``p_avail`` (in): context RD_AB ``v`` issues only while ``p_avail`` is high (its probabilities are ready;
      the rank PU pops them on ``rd``).
    * ``head`` (out): ``L``, ``q`` of the head being sequenced (held until the next launch).
    * ``busy`` (out): a head's program is in progress. ``refreshes`` (out, 32): REFs issued;
      ``urgent_refreshes`` (out, 16): REFs that had to be issued inside a head.
    * ``drain`` (constant parameter): cycles the datapath may take from the last score RD_AB to the first
      probabilities; enters the head-length bound of the refresh decision.

    With ``shared_bus=True`` (several rank PUs and the host memory controller on one channel, [L3] 5.1
    ranksets; ``sim/pim/rankset.py``) three more ports:

    * ``grant`` (in): the sequencer may drive the command bus this cycle (the buffer chips give the host's
      commands priority); a command that is not granted waits, every counter keeps counting.
    * ``host_cmd`` (in, ``command_layout``): the host's command on the bus this cycle (``NOP`` if none).
    * ``owner`` (out): the rank PU owns its rank (compute mode). With ``owned=False`` the rank starts in *host
      mode*: the sequencer issues nothing and snoops the host's commands to its rank -- a REF counts as one of
      its own (deadline, owed, tRFC), any other command may leave rows open (so the first command it issues
      later is a PREA, no earlier than ``max(tRAS, CWL + burst + tWR, tRTP)`` after the host's last command to
      the rank). It takes the rank on the first launch it accepts and keeps it.
    """

    def __init__(self, config: PIMConfig, *, rank: int = 0, drain: int = 0, overlap: bool = True,
                 shared_bus: bool = False, owned: bool = True):
        if not isinstance(config, PIMConfig):
            raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
        org = config.dram.org
        self.overlap = bool(overlap)
        if not 0 <= rank < org.ranks:
            raise ValueError(f"rank = {rank} outside [0, {org.ranks})")
        if not 0 <= drain < 1 << 20:
            raise ValueError(f"drain = {drain} outside [0, 2**20)")
        if not shared_bus and not owned:
            raise ValueError("owned=False needs shared_bus=True (a host must own the rank until the first launch)")
        self.config = config
        self.org = org
        self.rank = rank
        self.drain = drain
        self.shared_bus = bool(shared_bus)
        self.owned = bool(owned)
        self.log_B = _pow2(config, "banks", config.banks)
        self.log_G = _pow2(config, "token_sets", config.token_sets)
        self.log_bpt = _pow2(config, "bursts_per_token", config.bursts_per_token)
        self.log_cpr = _pow2(config, "columns_per_row", config.columns_per_row)
        ports = {
            "launch": In(stream.Signature(launch_layout(config))),
            "cmd": Out(command_layout(org)),
            "rd": Out(stream.Signature(rd_layout(config))),
            "p_avail": In(1),
            "head": Out(launch_layout(config)),
            "busy": Out(1),
            "refreshes": Out(32),
            "urgent_refreshes": Out(16),
        }
        if self.shared_bus:
            ports.update({"grant": In(1), "host_cmd": In(command_layout(org)), "owner": Out(1)})
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        cfg, org, tm = self.config, self.org, self.config.dram.timing
        TB = CYCLE_BITS
        nbits = bits_for(cfg.max_tokens) + 2

        t = Signal(TB)                      # cycle counter (= DRAMChannel.cycle)
        m.d.sync += t.eq(t + 1)

        # ---- timing counters: cycles until the command is legal (0 = legal now) ------------------------------
        # Loaded on issue with max(remaining - 1, X - 1), so that a command at cycle s makes the next one legal
        # at s + X; they count down otherwise.
        gaps = allbank_gaps(tm)
        cw = bits_for(max(x for prevs in gaps.values() for x in prevs.values()) + 1)
        w_act = Signal(cw)   # ACT_AB: tRPab after PREA, tRC / tRRD_L / tFAW after ACT_AB, tRFC after REF
        w_rd = Signal(cw)    # RD_AB: tRCD after ACT_AB, tCCD_L after RD_AB
        w_pre = Signal(cw)   # PREA: tRAS after ACT_AB, tRTP after RD_AB
        w_ref = Signal(cw)   # REF: tRPab after PREA, tRC after ACT_AB (conservative), tRFC after REF
        counters = (w_act, w_rd, w_pre, w_ref)
        loads = {id(c): [] for c in counters}
        # Bus ownership: may issue this cycle (always, on a channel of its own).
        if self.shared_bus:
            own = Signal(init=int(self.owned))
            m.d.comb += self.owner.eq(own)
            go = self.grant & own
        else:
            own, go = Const(1), Const(1)
        ok_act, ok_rd, ok_pre, ok_ref = ((w == 0) & go for w in counters)

        def load(cond, counter, x):
            loads[id(counter)].append((cond, x))

        # ---- refresh bookkeeping -----------------------------------------------------------------------------
        # deadline: the checker's / JESD79-4 bound -- by cycle (n_ref + 9) tREFI at least n_ref + 1 REFs.
        deadline = Signal(TB, init=(cfg.max_postponed_refresh + 1) * tm.tREFI)
        phase = Signal(range(tm.tREFI))
        owed = Signal(range(-64, 64))   # due - issued (due: one per tREFI since reset)
        tick = Signal()
        m.d.sync += phase.eq(Mux(phase == tm.tREFI - 1, 0, phase + 1))
        m.d.comb += tick.eq((phase == 0) & (t != 0))
        urgent = Signal()
        m.d.comb += urgent.eq(deadline < t + _urgent_margin(tm))
        # Pulled-in refreshes: never more than max_postponed_refresh ahead of the due count.
        may_pull = Signal()
        m.d.comb += may_pull.eq(owed > -cfg.max_postponed_refresh)

        # ---- head registers and program counters --------------------------------------------------------------
        # Heads overlap (bubble-free pipelining, [L3] 4.3): the phases run S0 S1 C0 S2 C1 ... -- after head h's
        # score phase the next head's score phase runs while head h's softmax / normalization completes, then
        # head h's context phase. "sc_*": the head whose score phase runs / ran last; "p_*": the head whose
        # score phase is done and whose context phase is pending (at most one).
        head = Signal(launch_layout(cfg))
        m.d.comb += self.head.eq(head)
        hp_next = Signal()    # parity of the next accepted head (= RankPU's q double buffer index)
        head_hp = Signal()
        lin = Signal(nbits)   # next RD_AB of the phase (linear column of the region)
        ctx = Signal()        # phase: 0 score, 1 context
        n_cur = Signal(nbits)
        row0_cur = Signal(len(head.k_row0))
        hp_cur = Signal()
        sc_nV, sc_slots = Signal(nbits), Signal(nbits)
        sc_vrow = Signal(len(head.v_row0))
        sc_hp = Signal()
        sc_bound = Signal(TB)
        pv = Signal()
        p_nV, p_slots = Signal(nbits), Signal(nbits)
        p_vrow = Signal(len(head.v_row0))
        p_hp = Signal()
        p_bound = Signal(TB)
        row_open = Signal()
        foreign = Signal()   # shared bus: rows of the rank may have been left open by the host (PREA first)
        open_row = Signal(max(1, ceil_log2(org.rows)))

        L = head.L
        m.d.comb += self.busy.eq(0)

        # Command outputs (default NOP)
        cmd = self.cmd
        issue = {k: Signal(name=f"issue_{k.name.lower()}") for k in (Cmd.ACT_AB, Cmd.RD_AB, Cmd.PREA, Cmd.REF)}
        kind = Signal(Cmd)
        for k, s in issue.items():
            with m.If(s):
                m.d.comb += kind.eq(k)

        n_phase = n_cur
        tgt_row = Signal.like(open_row)
        m.d.comb += tgt_row.eq(row0_cur + (lin >> self.log_cpr))
        col = lin[:self.log_cpr] if self.log_cpr else Const(0, 1)
        assert len(tgt_row) == len(cmd.row) and len(col) == len(cmd.col), "command_layout field widths"
        kb = lin[:self.log_bpt] if self.log_bpt else Const(0, 1)

        refreshes = self.refreshes
        # The refresh decision before a head's score phase covers everything up to the next decision: this
        # head's program and, when heads overlap, the pending head's context phase (and this head's own context
        # if no further head comes) -- bounded by the sum of both heads' bounds.
        bound = Signal(TB)
        m.d.comb += bound.eq(sc_bound + Mux(pv, p_bound, 0))
        need_ref_head = Signal()   # before a head: refresh now so the head fits before the deadline
        m.d.comb += need_ref_head.eq(((deadline < t + bound) & may_pull)
                                     | (owed > head.postpone))

        def do_ref(urgent_one):
            with m.If(ok_ref):
                m.d.comb += issue[Cmd.REF].eq(1)
                m.d.sync += [deadline.eq(deadline + tm.tREFI), refreshes.eq(refreshes + 1)]
                if urgent_one:
                    m.d.sync += self.urgent_refreshes.eq(self.urgent_refreshes + 1)

        def close_row_then_ref(urgent_one):
            # REF needs every bank precharged: close an open row first (PREA once tRAS / tRTP allow), then REF.
            with m.If(row_open):
                with m.If(ok_pre):
                    m.d.comb += issue[Cmd.PREA].eq(1)
                    m.d.sync += [row_open.eq(0), foreign.eq(0)]
            with m.Else():
                do_ref(urgent_one)

        # Overlap rule: the next launch's score phase may run before the pending head's context phase only if
        # both heads' e_t fit the rank buffer together (slots = ceil(L / B) B entries each; the rank PU's buffer
        # is circular) -- otherwise the heads run sequentially.
        B = cfg.banks
        l_slots = ((self.launch.payload.L + B - 1) >> self.log_B) << self.log_B

        def ovl_ok(slots):
            if not self.overlap:
                return Const(0)
            return self.launch.valid & (slots + l_slots <= cfg.max_tokens)

        def accept():
            m.d.comb += self.launch.ready.eq(1)
            m.d.sync += [head.eq(self.launch.payload), head_hp.eq(hp_next), hp_next.eq(~hp_next),
                         state.eq(PLAN)]

        def start_ctx(nV_, vrow_, hp_):
            m.d.sync += [ctx.eq(1), lin.eq(0), n_cur.eq(nV_), row0_cur.eq(vrow_), hp_cur.eq(hp_)]

        def pend_sc():
            m.d.sync += [pv.eq(1), p_nV.eq(sc_nV), p_vrow.eq(sc_vrow), p_hp.eq(sc_hp), p_slots.eq(sc_slots),
                         p_bound.eq(sc_bound)]

        # Program state (an explicit register compared with if-chains: no incomplete case statements in the
        # generated Verilog).
        IDLE, PLAN, REFRESH, RUN = range(4)
        state = Signal(range(4))
        with m.If(state == IDLE):
            with m.If(~own):            # host mode: the first launch takes the rank
                with m.If(self.launch.valid):
                    accept()
                    if self.shared_bus:
                        m.d.sync += own.eq(1)
            with m.Elif(urgent & ~row_open):
                do_ref(False)
            with m.Elif(row_open):      # heads end precharged; rows the host left open
                with m.If(ok_pre):
                    m.d.comb += issue[Cmd.PREA].eq(1)
                    m.d.sync += [row_open.eq(0), foreign.eq(0)]
            with m.Else():
                with m.If(self.launch.valid):
                    accept()
        with m.Elif(state == PLAN):
            m.d.comb += self.busy.eq(1)
            G = cfg.token_sets
            s = ((L + B - 1) >> self.log_B) << self.log_bpt
            v = (L + G - 1) >> self.log_G
            row = tm.tRC + tm.tRCD + tm.tRTP + tm.tRPab
            m.d.sync += [
                n_cur.eq(s), row0_cur.eq(head.k_row0), hp_cur.eq(head_hp), lin.eq(0), ctx.eq(0),
                sc_nV.eq(v), sc_vrow.eq(head.v_row0), sc_hp.eq(head_hp),
                sc_slots.eq(((L + B - 1) >> self.log_B) << self.log_B),
                sc_bound.eq((s + v) * tm.tCCD_L + ((s >> self.log_cpr) + (v >> self.log_cpr) + 4) * row
                            + self.drain),
            ]
            m.d.sync += state.eq(REFRESH)
        with m.Elif(state == REFRESH):
            # Dynamic refresh between heads [L3 4.4]: issue pending REFs while the head would not fit
            # before the next deadline (or more than the launch's `postpone` are owed). With heads overlapped
            # a row may still be open here: precharge it first.
            m.d.comb += self.busy.eq(1)
            with m.If(need_ref_head | urgent):
                close_row_then_ref(False)
            with m.Else():
                m.d.sync += state.eq(RUN)
        with m.Else():
            m.d.comb += self.busy.eq(1)
            more = lin < n_phase
            with m.If(urgent):
                close_row_then_ref(True)
            with m.Elif(more):
                with m.If(row_open & (open_row == tgt_row) & ~foreign):
                    ok = ok_rd & self.rd.ready & (~ctx | self.p_avail)
                    with m.If(ok):
                        m.d.comb += [issue[Cmd.RD_AB].eq(1), self.rd.valid.eq(1)]
                        m.d.sync += lin.eq(lin + 1)
                with m.Elif(row_open):
                    with m.If(ok_pre):
                        m.d.comb += issue[Cmd.PREA].eq(1)
                        m.d.sync += [row_open.eq(0), foreign.eq(0)]
                with m.Else():
                    with m.If(ok_act):
                        m.d.comb += issue[Cmd.ACT_AB].eq(1)
                        m.d.sync += [row_open.eq(1), open_row.eq(tgt_row)]
            with m.Elif(~ctx):
                # score phase of head sc ended
                with m.If(pv):
                    start_ctx(p_nV, p_vrow, p_hp)
                    pend_sc()
                with m.Elif(ovl_ok(sc_slots)):
                    pend_sc()
                    accept()
                with m.Else():
                    start_ctx(sc_nV, sc_vrow, sc_hp)
            with m.Elif(pv):
                # context phase ended, a head's context is pending: the next head's score phase first if it may
                # overlap, else the pending context
                with m.If(ovl_ok(p_slots)):
                    accept()
                with m.Else():
                    start_ctx(p_nV, p_vrow, p_hp)
                    m.d.sync += pv.eq(0)
            with m.Elif(row_open):
                with m.If(ok_pre):
                    m.d.comb += issue[Cmd.PREA].eq(1)
                    m.d.sync += [row_open.eq(0), foreign.eq(0)]
            with m.Else():
                m.d.sync += state.eq(IDLE)

        m.d.comb += [
            cmd.eq(Cat(kind, Const(self.rank, len(cmd.rank)), Const(0, len(cmd.bg) + len(cmd.bank)), tgt_row, col)),
            self.rd.payload.mode.eq(ctx),
            self.rd.payload.first.eq(Mux(ctx, lin == 0, kb == 0)),
            self.rd.payload.last.eq(Mux(ctx, lin == n_cur - 1, kb == (1 << self.log_bpt) - 1)),
            self.rd.payload.k.eq(kb),
            self.rd.payload.slot.eq(Mux(ctx, lin, lin >> self.log_bpt)),
            self.rd.payload.hp.eq(hp_cur),
            self.rd.payload.pfirst.eq(lin == 0),
        ]

        # Host mode (shared bus): the host's commands to this rank, snooped
        snoop_ref = Signal()
        if self.shared_bus:
            h = self.host_cmd
            snoop = ~own & (h.kind != Cmd.NOP) & (h.rank == self.rank)
            snoop_other = snoop & (h.kind != Cmd.REF)
            m.d.comb += snoop_ref.eq(snoop & (h.kind == Cmd.REF))
            with m.If(snoop_other):
                m.d.sync += [row_open.eq(1), foreign.eq(1)]
            with m.If(snoop_ref):
                m.d.sync += deadline.eq(deadline + tm.tREFI)
            # PRE of a bank the host used: tRAS after its ACT, write recovery after its WR, tRTP after its RD
            load(snoop_other, w_pre, max(tm.tRAS, tm.CWL + org.burst_cycles + tm.tWR, tm.tRTP))
            for c in counters:
                load(snoop_ref, c, tm.tRFC)

        # owed: +1 per tREFI, -1 per REF (its own or, in host mode, the host's)
        m.d.sync += owed.eq(owed + tick - issue[Cmd.REF] - snoop_ref)

        # ---- counter updates: the all-bank rules of hdl/pim/allbank.py, one counter per command kind -----------
        counter_of = {Cmd.ACT_AB: w_act, Cmd.RD_AB: w_rd, Cmd.PREA: w_pre, Cmd.REF: w_ref}
        for nxt, prevs in gaps.items():
            for prev, x in prevs.items():
                load(issue[prev], counter_of[nxt], x)
        for c in counters:
            dec = Mux(c == 0, 0, c - 1)
            nxt = dec
            for cond, x in loads[id(c)]:
                nxt = Mux(cond & (dec < x - 1), x - 1, nxt)
            m.d.sync += c.eq(nxt)
        return m


def pu_ctrl_layout(config) -> data.StructLayout:
    """Control the rank PU sends with every RD_AB's data to the bank PUs (``BankPU.i`` fields besides ``row``,
    ``bcast`` and the per-bank constant ``sel``)."""
    return data.StructLayout({"mode": 1, "first": 1, "last": 1})


class RankPU(wiring.Component):
    """Buffer-chip controller of one rank: :class:`PIMSequencer` + the fused-kernel datapath.

    Parameters: ``config`` (:class:`PIMConfig`), ``rank`` (the rank it drives), ``drain`` (see
    :meth:`drain_bound`), ``overlap`` (default ``True``: consecutive heads overlap when both heads' e_t fit the
    circular rank buffer; ``False``: strictly sequential heads), ``softmax`` (``False``: test mode without the
    softmax unit / normalizer -- the scores ``s_t`` leave on ``scores`` and the probabilities come in on
    ``p_in``, one word of ``G`` FP16 per context RD_AB).

    Streams:

    * ``launch`` (in, :func:`launch_layout`): one head per item, into a 2-entry launch queue (with ``overlap``,
      the sequencer takes the next head at the end of a phase: S0 S1 C0 S2 C1 ..., see :class:`PIMSequencer`).
    * ``result`` (out, 16): the head's ``d`` FP16 outputs, element 0 first, heads in launch order.
    * ``scores`` (out, 16; ``softmax=False`` only): ``s_t`` per score slot (``t >= L`` masked to -inf).
    * ``p_in`` (in, ``16 G``; ``softmax=False`` only): probabilities of context RD_AB ``v`` (token ``v G + g``
      in bits ``[16 g, 16 g + 16)``).

    DRAM and chip-side pins (plain signals, ``sync`` domain):

    * ``cmd`` (out): the command bus. ``ab_valid`` (in): the DRAM presents a RD_AB's data this cycle.
    * ``pu_valid`` / ``pu_ctrl`` / ``pu_bcast`` (out): with ``ab_valid``, every bank PU takes an item: its row
      word (from ``ab_rdata``, wired in the chip), ``pu_bcast[c]`` (chip ``c``'s 64-bit broadcast word),
      ``pu_ctrl``. ``pu_ready`` (in): AND of the bank PUs' ``i.ready`` (must be high with ``pu_valid``;
      ``errors`` bit 0 records a miss).
    * ``pu_res`` / ``pu_res_valid`` (in) / ``pu_res_ready`` (out), indexed ``c * B + b``: bank PU ``o`` streams.
      The chip -> buffer link moves 16 bits per chip per cycle: a score partial in one cycle, a context
      result (4 accumulators) in four.
    * ``errors`` (out, 4, sticky): bit 0 a bank PU was not ready for its data, bit 1 RD_AB data without a
      record, bit 2 the record queue overflowed.
    * ``refreshes``, ``urgent_refreshes``, ``busy`` (out): from the sequencer.
    * ``shared_bus=True``: ``grant``, ``host_cmd``, ``owner`` of :class:`PIMSequencer` (``owned=False``: the
      rank starts in host mode).
    """

    def __init__(self, config: PIMConfig, *, rank: int = 0, softmax: bool = True, drain: int | None = None,
                 overlap: bool = True, shared_bus: bool = False, owned: bool = True):
        if not isinstance(config, PIMConfig):
            raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
        self.config = config
        self.org = org = config.dram.org
        self.softmax = softmax
        C, B, G = config.chips, config.banks, config.token_sets
        if drain is None:
            drain = self.drain_bound(config)
        if config.max_tokens % config.banks:
            raise ValueError(f"PIMConfig {config.name!r}: max_tokens = {config.max_tokens} must be a multiple of "
                             f"banks = {config.banks} (the circular rank buffer holds whole chunks)")
        self.overlap = bool(overlap)
        self.shared_bus = bool(shared_bus)
        self.seq = PIMSequencer(config, rank=rank, drain=drain, overlap=overlap, shared_bus=shared_bus,
                                owned=owned)
        ports = {
            "launch": In(stream.Signature(launch_layout(config))),
            "result": Out(stream.Signature(16)),
            "cmd": Out(command_layout(org)),
            "ab_valid": In(1),
            "pu_valid": Out(1),
            "pu_ctrl": Out(pu_ctrl_layout(config)),
            "pu_bcast": Out(data.ArrayLayout(64, C)),
            "pu_ready": In(1),
            "pu_res": In(data.ArrayLayout(64, C * B)),
            "pu_res_valid": In(C * B),
            "pu_res_ready": Out(C * B),
            "errors": Out(4),
            "refreshes": Out(32),
            "urgent_refreshes": Out(16),
            "busy": Out(1),
        }
        if not softmax:
            ports["scores"] = Out(stream.Signature(16))
            ports["p_in"] = In(stream.Signature(16 * G))
        if self.shared_bus:
            ports.update({"grant": In(1), "host_cmd": In(command_layout(org)), "owner": Out(1)})
        super().__init__(ports)

    @staticmethod
    def drain_bound(config) -> int:
        """Cycles allowed in the refresh decision for the datapath between the last score RD_AB and the first
        context probabilities (CL + bank PU + link of a slot + adder tree + softmax + normalizer, generously)."""
        tm = config.dram.timing
        return tm.CL + 2 * config.banks + 512

    def elaborate(self, platform):
        m = Module()
        cfg, tm = self.config, self.config.dram.timing
        C, B, G, E, bpt = cfg.chips, cfg.banks, cfg.token_sets, cfg.elems_per_chip, cfg.bursts_per_token
        d = cfg.head_dim
        Lbits = bits_for(cfg.max_tokens)
        m.submodules.seq = seq = self.seq
        m.d.comb += [self.cmd.eq(seq.cmd), self.refreshes.eq(seq.refreshes),
                     self.urgent_refreshes.eq(seq.urgent_refreshes), self.busy.eq(seq.busy)]
        if self.shared_bus:
            m.d.comb += [seq.grant.eq(self.grant), seq.host_cmd.eq(self.host_cmd), self.owner.eq(seq.owner)]
        errors = self.errors

        # ---- launch queue (2 heads) -> the sequencer, plus the head length for the softmax side ---------------
        LL = launch_layout(cfg)
        lq = m.submodules.lq = SyncFIFO(width=LL.size, depth=2)
        m.d.comb += [lq.w_en.eq(self.launch.valid), lq.w_data.eq(self.launch.payload),
                     self.launch.ready.eq(lq.w_rdy)]
        hq_norm = self._hq_norm = m.submodules.hq_norm = SyncFIFOBuffered(width=Lbits, depth=4)
        room = hq_norm.w_rdy
        lpay = data.View(LL, lq.r_data)
        seq_take = seq.launch.valid & seq.launch.ready
        m.d.comb += [
            seq.launch.payload.eq(lq.r_data),
            seq.launch.valid.eq(lq.r_rdy & room),
            lq.r_en.eq(seq_take),
            hq_norm.w_en.eq(seq_take & self.softmax),
            hq_norm.w_data.eq(lpay.L),
        ]
        # q of two heads (by launch parity): a score RD_AB's data may arrive after the next head's launch
        qreg = Array(Signal(16 * d, name=f"q{i}") for i in range(2))
        hp_acc = Signal()
        with m.If(seq_take):
            m.d.sync += hp_acc.eq(~hp_acc)
            for i in range(2):
                with m.If(hp_acc == i):
                    m.d.sync += qreg[i].eq(lpay.q)

        # ---- RD_AB records: issued -> popped when the data arrives (CL later) -------------------------------
        RL = rd_layout(cfg)
        rec_depth = (tm.CL + tm.tCCD_L - 1) // tm.tCCD_L + 2
        rec = m.submodules.rec = SyncFIFO(width=RL.size + 16 * G, depth=rec_depth)
        pfifo = m.submodules.pfifo = SyncFIFOBuffered(width=16 * G, depth=8)
        # phases in command order for the link: {L, context}, queued with the phase's first RD_AB
        lph = m.submodules.lph = SyncFIFOBuffered(width=Lbits + 1, depth=4)
        is_ctx_rd = seq.rd.valid & seq.rd.payload.mode
        m.d.comb += [
            lph.w_en.eq(seq.rd.valid & seq.rd.payload.pfirst),
            lph.w_data.eq(Cat(seq.head.L, seq.rd.payload.mode)),
            seq.rd.ready.eq(rec.w_rdy & (lph.w_rdy | ~seq.rd.payload.pfirst)),
            seq.p_avail.eq(pfifo.r_rdy),
            rec.w_en.eq(seq.rd.valid & seq.rd.ready),
            rec.w_data.eq(Cat(seq.rd.payload.as_value(), Mux(seq.rd.payload.mode, pfifo.r_data, 0))),
            pfifo.r_en.eq(is_ctx_rd & seq.rd.ready),
        ]
        with m.If(rec.w_en & ~rec.w_rdy):
            m.d.sync += errors[2].eq(1)

        # ---- to the bank PUs, with the DRAM data ------------------------------------------------------------
        r = data.View(RL, rec.r_data[:RL.size])
        pword = rec.r_data[RL.size:]
        q = qreg[r.hp]
        m.d.comb += [
            rec.r_en.eq(self.ab_valid),
            self.pu_valid.eq(self.ab_valid & rec.r_rdy),
            self.pu_ctrl.mode.eq(r.mode), self.pu_ctrl.first.eq(r.first), self.pu_ctrl.last.eq(r.last),
        ]
        for c in range(C):
            qs = Array(q[16 * (c * E + 4 * k): 16 * (c * E + 4 * k) + 64] for k in range(bpt))
            m.d.comb += self.pu_bcast[c].eq(Mux(r.mode, pword, qs[r.k]))
        with m.If(self.ab_valid & ~rec.r_rdy):
            m.d.sync += errors[1].eq(1)
        with m.If(self.pu_valid & ~self.pu_ready):
            m.d.sync += errors[0].eq(1)

        # ---- chip -> buffer link and the adder unit ---------------------------------------------------------
        from hdl.pim.adder_unit import AdderUnit
        m.submodules.adder = au = AdderUnit(cfg)
        link_L = Signal(Lbits)
        nslots = Signal(Lbits)
        slot = Signal(Lbits)
        lbank = Signal(range(B))
        lj = Signal(2)
        lctx = Signal()   # link phase: 0 score slots, 1 context readout
        m.d.comb += [link_L.eq(lph.r_data[:Lbits]), lctx.eq(lph.r_data[Lbits]),
                     nslots.eq((link_L + B - 1) >> exact_log2(B))]
        rv = self.pu_res_valid
        bank_all = Cat(Cat(rv[c * B + b] for c in range(C)).all() for b in range(B))
        have = lph.r_rdy & bank_all.bit_select(lbank, 1)
        ai = au.i.payload
        for c in range(C):
            word = self.pu_res[c * B + lbank] if B > 1 else self.pu_res[c]
            m.d.comb += ai.data[16 * c:16 * (c + 1)].eq(Mux(lctx, word.word_select(lj, 16), word[:16]))
        m.d.comb += [
            au.i.valid.eq(have),
            ai.mode.eq(Mux(lctx, AdderUnit.ACC, AdderUnit.TREE)),
            ai.idx.eq(Cat(lj, lbank[:exact_log2(bpt)]) if bpt > 1 else lj),
            ai.first.eq((lbank >> exact_log2(bpt)) == 0),
            ai.last.eq((lbank >> exact_log2(bpt)) == G - 1),
        ]
        take = have & au.i.ready
        bank_done = take & (~lctx | (lj == 3))
        for c in range(C):
            for b in range(B):
                m.d.comb += self.pu_res_ready[c * B + b].eq(bank_done & (lbank == b))
        with m.If(take):
            with m.If(lctx):
                m.d.sync += lj.eq(lj + 1)
                with m.If(lj == 3):
                    m.d.sync += lbank.eq(lbank + 1)
                    with m.If(lbank == B - 1):
                        m.d.comb += lph.r_en.eq(1)
            with m.Else():
                m.d.sync += lbank.eq(lbank + 1)
                with m.If(lbank == B - 1):
                    m.d.sync += slot.eq(slot + 1)
                    with m.If(slot == nslots - 1):
                        m.d.sync += slot.eq(0)
                        m.d.comb += lph.r_en.eq(1)

        # token index of the tree outputs, for the padding mask (per head: counts the score items)
        sq = m.submodules.sq = SyncFIFOBuffered(width=Lbits, depth=4)   # L of heads whose scores are in flight
        m.d.comb += [sq.w_en.eq(take & ~lctx & (slot == 0) & (lbank == 0)), sq.w_data.eq(link_L)]
        tok = Signal(Lbits + 1)
        sL = sq.r_data
        s_raw = au.o.payload.data[:16]
        s_val = Signal(16)
        m.d.comb += s_val.eq(Mux(tok >= sL, 0xFC00, s_raw))   # t >= L: -inf [docs/pim.md score phase]
        s_valid = Signal()
        s_ready = Signal()
        m.d.comb += s_valid.eq(au.o.valid & (au.o.payload.mode == AdderUnit.TREE))
        s_fire = s_valid & s_ready
        s_lastone = tok == (((sL + B - 1) >> exact_log2(B)) << exact_log2(B)) - 1
        with m.If(s_fire):
            m.d.sync += tok.eq(Mux(s_lastone, 0, tok + 1))
            with m.If(s_lastone):
                m.d.comb += sq.r_en.eq(1)

        # ---- context aggregation results -> result stream -----------------------------------------------------
        res = Array(Signal(16, name=f"res{i}") for i in range(d))
        nres = Signal(range(E + 1))
        res_full = Signal()
        oidx = Signal(range(d))
        acc_ready = ~res_full
        acc_valid = au.o.valid & (au.o.payload.mode == AdderUnit.ACC)
        m.d.comb += au.o.ready.eq(Mux(au.o.payload.mode == AdderUnit.ACC, acc_ready, s_ready))
        with m.If(acc_valid & acc_ready):
            for c in range(C):
                for i in range(E):
                    with m.If(au.o.payload.idx == i):
                        m.d.sync += res[c * E + i].eq(au.o.payload.data[16 * c:16 * (c + 1)])
            m.d.sync += nres.eq(nres + 1)
            with m.If(nres == E - 1):
                m.d.sync += [res_full.eq(1), nres.eq(0), oidx.eq(0)]
        m.d.comb += [self.result.valid.eq(res_full), self.result.payload.eq(res[oidx])]
        with m.If(self.result.valid & self.result.ready):
            m.d.sync += oidx.eq(oidx + 1)
            with m.If(oidx == d - 1):
                m.d.sync += res_full.eq(0)

        # ---- softmax side ---------------------------------------------------------------------------------------
        if not self.softmax:
            m.d.comb += [
                self.scores.valid.eq(s_valid), self.scores.payload.eq(s_val), s_ready.eq(self.scores.ready),
                pfifo.w_en.eq(self.p_in.valid), pfifo.w_data.eq(self.p_in.payload),
                self.p_in.ready.eq(pfifo.w_rdy),
            ]
        else:
            self._softmax_path(m, s_valid, s_val, s_ready, pfifo, tok, sL, s_lastone)
        return m

    def _softmax_path(self, m, s_valid, s_val, s_ready, pfifo, tok, sL, s_lastone):
        """Scores -> PIMSoftmaxUnit -> rank buffer (e_t, m_j) -> (after the head's M, Z) PIMNormalizer -> p words."""
        from hdl.pim.softmax_unit import PIMSoftmaxUnit, PIMNormalizer
        cfg = self.config
        B, G = cfg.banks, cfg.token_sets
        Lbits = bits_for(cfg.max_tokens)
        m.submodules.softmax = sm = PIMSoftmaxUnit(cfg)
        m.submodules.normalizer = nz = PIMNormalizer(cfg)
        m.d.comb += [
            sm.i.valid.eq(s_valid), s_ready.eq(sm.i.ready),
            sm.i.payload.s.eq(s_val), sm.i.payload.pad.eq(tok >= sL), sm.i.payload.last.eq(s_lastone),
        ]
        # rank buffer: one FP16 e_t per token (config.rank_buffer_bytes), and m_j per chunk
        depth = cfg.max_tokens
        mdepth = depth // B
        m.submodules.ebuf = ebuf = Memory(shape=16, depth=depth, init=[])
        m.submodules.mbuf = mbuf = Memory(shape=16, depth=max(2, depth // B), init=[])
        ew, er = ebuf.write_port(), ebuf.read_port()
        mw, mr = mbuf.write_port(), mbuf.read_port()
        # Circular: head after head, so with overlapped heads the next head's e_t never overwrite the entries
        # the normalizer still reads (the sequencer overlaps two heads only if both fit).
        ewp = Signal(range(depth + 1))
        mwp = Signal(range(mdepth + 1))
        head_take = Signal()
        m.d.comb += [
            sm.e.ready.eq(1), sm.m.ready.eq(1),
            ew.en.eq(sm.e.valid), ew.addr.eq(ewp), ew.data.eq(sm.e.payload.e),
            mw.en.eq(sm.m.valid), mw.addr.eq(mwp), mw.data.eq(sm.m.payload.m),
        ]
        with m.If(sm.e.valid):
            m.d.sync += ewp.eq(Mux(ewp == depth - 1, 0, ewp + 1))
        with m.If(sm.m.valid):
            m.d.sync += mwp.eq(Mux(mwp == mdepth - 1, 0, mwp + 1))

        # the normalizer feed: after the head's M / Z, tokens 0 .. ceil(L / G) G - 1 of the buffer
        hq = self._hq_norm
        hM, hz, hs = Signal(16), Signal(16), Signal(signed(9))
        nL = Signal(Lbits)
        nend = Signal(Lbits + 2)
        active = Signal()
        nt = Signal(Lbits + 2)
        m.d.comb += head_take.eq(sm.head.valid & ~active & hq.r_rdy)
        m.d.comb += [sm.head.ready.eq(head_take), hq.r_en.eq(head_take)]
        # reader: the head's first entry (ebase, mbase) and the next head's (enext, mnext)
        ebase, enext = Signal(range(depth)), Signal(range(depth))
        mbase, mnext = Signal(range(max(2, mdepth))), Signal(range(max(2, mdepth)))
        h_chunks = (hq.r_data + B - 1) >> exact_log2(B)
        e_adv = Signal(Lbits + 2)
        m_adv = Signal(Lbits + 2)
        m.d.comb += [e_adv.eq(enext + (h_chunks << exact_log2(B))), m_adv.eq(mnext + h_chunks)]
        with m.If(head_take):
            m.d.sync += [ebase.eq(enext), mbase.eq(mnext),
                         enext.eq(Mux(e_adv >= depth, e_adv - depth, e_adv)),
                         mnext.eq(Mux(m_adv >= mdepth, m_adv - mdepth, m_adv))]
            m.d.sync += [hM.eq(sm.head.payload.M), hz.eq(sm.head.payload.z_m), hs.eq(sm.head.payload.s),
                         nL.eq(hq.r_data), nend.eq(((hq.r_data + G - 1) >> exact_log2(G)) << exact_log2(G)),
                         nt.eq(0), active.eq(1)]
        v1 = Signal()
        pad1 = Signal()
        adv = ~v1 | nz.i.ready
        issue = active & (nt < nend) & adv
        ea = Signal(Lbits + 3)
        ma = Signal(Lbits + 3)
        m.d.comb += [ea.eq(ebase + nt), ma.eq(mbase + (nt >> exact_log2(B)))]
        m.d.comb += [er.addr.eq(Mux(ea >= depth, ea - depth, ea)), er.en.eq(adv),
                     mr.addr.eq(Mux(ma >= mdepth, ma - mdepth, ma)), mr.en.eq(adv)]
        with m.If(adv):
            m.d.sync += [v1.eq(issue), pad1.eq(nt >= nL)]
        with m.If(issue):
            m.d.sync += nt.eq(nt + 1)
        with m.If(active & (nt == nend) & ~v1):
            m.d.sync += active.eq(0)
        m.d.comb += [
            nz.i.valid.eq(v1),
            nz.i.payload.e.eq(er.data), nz.i.payload.m.eq(mr.data), nz.i.payload.M.eq(hM),
            nz.i.payload.z_m.eq(hz), nz.i.payload.s.eq(hs), nz.i.payload.pad.eq(pad1),
        ]
        # p_t -> words of G probabilities (one per context RD_AB)
        pk = Signal(range(G))
        pacc = Array(Signal(16, name=f"pacc{g}") for g in range(G))
        last_g = pk == G - 1
        m.d.comb += [
            nz.o.ready.eq(~last_g | pfifo.w_rdy),
            pfifo.w_en.eq(nz.o.valid & last_g),
            pfifo.w_data.eq(Cat(*[pacc[g] for g in range(G - 1)], nz.o.payload.p)),
        ]
        with m.If(nz.o.valid & nz.o.ready):
            m.d.sync += pk.eq(Mux(last_g, 0, pk + 1))
            for g in range(G):
                with m.If(pk == g):
                    m.d.sync += pacc[g].eq(nz.o.payload.p)
