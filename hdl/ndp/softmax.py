"""Softmax Special Function Unit of the NDP compute unit: FlashAttention-style partial softmax of score rows.

See ``docs/ndp_softmax.md`` for the order of operations, the cycle formula and measured figures; the
bit-exact golden model is ``sim/golden/softmax.py``.

One job (one ``cmd``) is R rows of L = ``nb * lanes`` FP16 scores ``P``. For every row the unit returns the
unnormalized exponentials ``E[r, j] = exp(P[r, j] - m_r)`` (FP16, on ``o``) and an *anchor* ``{m_r, sum_r}``
(``m_r = max_j P[r, j]`` in FP16, ``sum_r = sum_j E[r, j]`` in FP32) that the host uses to merge the partial
softmaxes of several devices (paper V-B, Integral Execution). Each row needs two passes over its scores, so
rows are buffered:

1. **Input / max pass.** ``i`` beats are written into one of two row slots of the row buffer while a running
   ``FPMax`` per lane tracks the maximum; after the row's last beat a pairwise ``FPMax`` tree over the lanes
   gives ``m_r``, which marks the slot full.
2. **Exp pass.** The slot is read back one beat per cycle: per lane ``FPAdd16(P, -m_r)`` then ``FPExp``, out
   on ``o``. Every accepted ``o`` beat is also converted exactly to FP32 (``FPConvert``), summed over the
   lanes by a pairwise FP32 ``FPAdd`` tree and added into one of ``PHASES`` = 4 phase accumulators (beat
   index mod 4; 4 = the FP32 adder latency, so the accumulation runs at one beat per cycle). After the row's
   last beat a pairwise FP32 tree over the 4 phases gives ``sum_r``, queued with ``m_r`` on ``anchor``.

The two slots are used alternately: row r+1's input/max pass overlaps row r's exp pass, and a new row may
overwrite beat q of a slot as soon as the exp pass has read beat q of the slot's previous row, so rows take
``nb`` cycles each in steady state (``nb >= nb_min``). Every floating-point operation is an ``hdl/fp`` unit;
this module only moves data, counts and compares.
"""

from amaranth.hdl import Module, Signal, Cat, Mux, Array, unsigned
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2, exact_log2

from hdl.fp.add import FPAdd
from hdl.fp.convert import FPConvert
from hdl.fp.exp import FPExp
from hdl.fp.format import FP16, FP32
from hdl.fp.max import FPMax

__all__ = ["SoftmaxUnit"]


def _tree(m, name, leaves, valid, user, make):
    """Pairwise reduction of ``leaves`` (a power-of-two count) through units made by ``make(user_width)``.

    Level k combines neighbours (2i, 2i+1) of level k-1 (operand a = the even one). Every unit runs free
    (``o.ready = 1``); ``valid`` and the ``user`` sideband travel with the leftmost unit of each level.
    Returns ``(result, valid, user)`` at the tree output.
    """
    level, k = list(leaves), 0
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level), 2):
            uw = len(user) if (j == 0 and user is not None) else 0
            unit = make(uw)
            m.submodules[f"{name}_l{k}_{j // 2}"] = unit
            m.d.comb += [
                unit.i.valid.eq(valid),
                unit.i.payload.a.eq(level[j]),
                unit.i.payload.b.eq(level[j + 1]),
                unit.o.ready.eq(1),
            ]
            if uw:
                m.d.comb += unit.i.payload.user.eq(user)
            nxt.append(unit.o.payload.z)
            if j == 0:
                nvalid = unit.o.valid
                nuser = unit.o.payload.user if uw else None
        level, valid, user, k = nxt, nvalid, nuser, k + 1
    return level[0], valid, user


class SoftmaxUnit(wiring.Component):
    """Partial-softmax SFU: ``lanes`` FP16 scores per cycle in, ``lanes`` exponentials per cycle out.

    Parameters (keyword only):

    ``lanes``
        FP16 scores per beat (a power of two).
    ``max_len``
        Largest row length L, a multiple of ``lanes``; the row buffer holds 2 rows of ``max_len / lanes`` beats.
    ``max_rows``
        Largest number of rows R per job.

    Streams (payloads packed from the LSB):

    ``cmd`` (in)
        ``rows`` [R, ``bits_for(max_rows)``], then ``nb`` [L / lanes, ``bits_for(max_len / lanes)``]; both
        >= 1 and within the maxima (not checked in hardware).
    ``i`` (in)
        ``R * nb`` beats, row-major: beat ``r*nb + q`` holds ``P[r, q*lanes + l]`` in bits ``[16 l, 16 l + 16)``.
    ``o`` (out)
        ``R * nb`` beats, same layout: ``E[r, j] = FPExp(FPAdd16(P[r, j], -m_r))``.
    ``anchor`` (out)
        ``R`` beats ``{max: m_r (FP16, bits [0, 16)), sum: sum_r (FP32, bits [16, 48))}``, each after its
        row's last ``o`` beat.

    Jobs may follow each other back to back (the next ``cmd`` is accepted once the previous job's last
    ``i`` beat is in). Cycle formula: :meth:`cycles`.
    """

    #: FP32 phase accumulators: one per cycle of FP32 FPAdd latency (source: hdl/fp/add.py), so a beat never
    #: waits for the previous beat's sum.
    PHASES = FPAdd.latency
    #: Exp pass: row-buffer read issued in cycle c -> ``o`` valid in cycle ``c + exp_latency``
    #: (1 read/operand register + FPAdd16 + FPExp).
    exp_latency = 1 + FPAdd.latency + FPExp.latency

    def __init__(self, *, lanes: int = 4, max_len: int = 64, max_rows: int = 16):
        if not isinstance(lanes, int) or lanes < 1 or lanes & (lanes - 1):
            raise ValueError(f"lanes must be a power of two >= 1, got {lanes!r}")
        if not isinstance(max_len, int) or max_len < lanes or max_len % lanes:
            raise ValueError(f"max_len must be a positive multiple of lanes={lanes}, got {max_len!r}")
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows must be an integer >= 1, got {max_rows!r}")
        self.lanes = lanes
        self.max_len = max_len
        self.max_rows = max_rows
        self.max_nb = max_len // lanes
        self.log_lanes = exact_log2(lanes)
        #: Last ``i`` beat of a row accepted in cycle t -> ``m_r`` at the max-tree output in cycle
        #: ``t + max_latency`` (running FPMax + one FPMax per lane-tree level); its exp pass can start in the
        #: next cycle.
        self.max_latency = FPMax.latency * (1 + self.log_lanes)
        #: Last ``o`` beat of a row accepted in cycle t -> its ``anchor`` valid in cycle ``t + anchor_latency``:
        #: FPConvert, the FP32 lane tree, the phase accumulator, the FP32 phase tree, the anchor queue register.
        self.anchor_latency = (FPConvert.latency + FPAdd.latency * self.log_lanes + FPAdd.latency
                               + FPAdd.latency * exact_log2(self.PHASES) + 1)
        #: Smallest ``nb`` for one row per ``nb`` cycles: a row's beat q may overwrite its slot only after
        #: the exp pass of the slot's previous row has read beat q (design choice: 2 slots + write-behind).
        self.nb_min = self.max_latency + 1
        #: Anchor queue depth = rows allowed between exp-pass start and anchor hand-over. Design choice: enough
        #: that the queue never throttles a ready anchor sink when ``nb >= nb_min`` (``1 + ceil((exp_latency +
        #: anchor_latency) / nb_min)`` rows), rounded up to a power of two so the ring pointers wrap by
        #: truncation (complete case statements in the Verilog).
        self.anchor_depth = 1 << ceil_log2(1 + -(-(self.exp_latency + self.anchor_latency) // self.nb_min))
        self.cmd_layout = data.StructLayout({"rows": bits_for(max_rows), "nb": bits_for(self.max_nb)})
        self.anchor_layout = data.StructLayout({"max": FP16.width, "sum": FP32.width})
        super().__init__({
            "cmd": In(stream.Signature(self.cmd_layout)),
            "i": In(stream.Signature(unsigned(FP16.width * lanes))),
            "o": Out(stream.Signature(unsigned(FP16.width * lanes))),
            "anchor": Out(stream.Signature(self.anchor_layout)),
        })

    def cycles(self, rows: int, nb: int) -> int:
        """Cycles of one job with every input always valid and every output always ready, from the cycle the
        ``cmd`` is accepted (cycle 0) to the cycle the last ``anchor`` is accepted, inclusive.

        For ``nb >= nb_min``: ``(rows + 1) * nb + max_latency + exp_latency + anchor_latency + 1``. Smaller
        ``nb`` is evaluated with the schedule recurrence below (the RTL's handshake conditions, cycle by cycle).
        """
        if not 1 <= rows <= self.max_rows:
            raise ValueError(f"rows must be in 1..{self.max_rows}, got {rows}")
        if not 1 <= nb <= self.max_nb:
            raise ValueError(f"nb must be in 1..{self.max_nb}, got {nb}")
        D, X, A = self.anchor_depth, self.exp_latency, self.anchor_latency
        start, acc_t, last_in = [], [], 0   # exp-pass start cycles, anchor acceptance cycles
        for r in range(rows):
            t = last_in + 1                   # first beat: cycle after the cmd / the previous row's last beat
            for q in range(nb):
                if r >= 2:                    # write-behind: slot's previous row has read beat q
                    t = max(t, start[r - 2] + q + 1)
                t_q, t = t, t + 1
            last_in = t_q
            e = last_in + self.max_latency + 1            # m_r known -> slot full
            if r >= 1:
                e = max(e, start[r - 1] + nb)             # exp pass of the previous row done
            if r >= D:
                e = max(e, acc_t[r - D] + 1)              # anchor queue credit
            start.append(e)
            a = e + nb - 1 + X + A                        # last o beat accepted, then anchor
            if r >= 1:
                a = max(a, acc_t[r - 1] + 1)
            acc_t.append(a)
        return acc_t[-1] + 1

    def elaborate(self, platform):
        m = Module()
        L, NB, D = self.lanes, self.max_nb, self.anchor_depth
        W = FP16.width
        PH = self.PHASES

        def slot_addr(q, slot):
            return q + Mux(slot, NB, 0)

        # ---- row buffer: 2 slots of NB beats (slot s at addresses s*NB ..). Design choice: two slots (double
        # buffering) + write-behind give one row per nb cycles; a third slot would only help nb < nb_min.
        # The read port is not transparent, so a beat written in the cycle it is read returns the old data.
        m.submodules.rowbuf = rowbuf = memory.Memory(shape=unsigned(W * L), depth=2 * NB, init=[])
        wr = rowbuf.write_port()
        rd = rowbuf.read_port()

        # ---- per-slot state (2 slots)
        full = [Signal(name=f"full{s}") for s in range(2)]      # m known, exp pass not started
        pend = [Signal(name=f"pend{s}") for s in range(2)]      # all beats written, m in the max tree
        slot_m = [Signal(W, name=f"slot{s}_m") for s in range(2)]
        slot_nb = [Signal(range(NB + 1), name=f"slot{s}_nb") for s in range(2)]

        # ---- exp-pass read state (declared here: the input side's write-behind check uses it)
        ract = Signal()                                  # a row is being read (beats 1.. of it)
        rslot = Signal()
        rq = Signal(range(max(NB, 2)))                   # beats of the current row already issued
        rnb = Signal(range(NB + 1))
        rm = Signal(W)

        # ================= input / max pass
        in_run = Signal()
        rows_n = Signal(range(self.max_rows + 1))
        rin = Signal(range(max(self.max_rows, 2)))
        nb_in = Signal(range(NB + 1))
        qin = Signal(range(max(NB, 2)))
        wslot = Signal()

        m.d.comb += self.cmd.ready.eq(~in_run)
        with m.If(self.cmd.valid & ~in_run):
            m.d.sync += [rows_n.eq(self.cmd.payload.rows), nb_in.eq(self.cmd.payload.nb),
                         rin.eq(0), qin.eq(0), in_run.eq(1)]

        w_full = Mux(wslot, full[1], full[0])
        w_pend = Mux(wslot, pend[1], pend[0])
        write_ok = ~w_full & ~w_pend & ~(ract & (rslot == wslot) & (rq <= qin))
        in_fire = Signal()
        in_last = Signal()
        m.d.comb += [
            self.i.ready.eq(in_run & write_ok),
            in_fire.eq(self.i.valid & self.i.ready),
            in_last.eq(qin == nb_in - 1),
            wr.addr.eq(slot_addr(qin, wslot)),
            wr.data.eq(self.i.payload),
            wr.en.eq(in_fire),
        ]
        with m.If(in_fire):
            with m.If(in_last):
                m.d.sync += [qin.eq(0), wslot.eq(~wslot)]
                for s in range(2):
                    with m.If(wslot == s):
                        m.d.sync += [pend[s].eq(1), slot_nb[s].eq(nb_in)]
                with m.If(rin == rows_n - 1):
                    m.d.sync += in_run.eq(0)
                with m.Else():
                    m.d.sync += rin.eq(rin + 1)
            with m.Else():
                m.d.sync += qin.eq(qin + 1)

        # Running max per lane: acc_l = FPMax(P, acc_l); the first beat of a row compares the score with itself.
        lane_max = []
        max_last = max_slot = max_valid = None
        for lane in range(L):
            u = FPMax(user_width=2 if lane == 0 else 0)   # lane 0 carries {last beat, slot}
            m.submodules[f"runmax_{lane}"] = u
            acc = Signal(W, name=f"runmax_acc{lane}")
            x = self.i.payload[W * lane:W * (lane + 1)]
            fwd = Mux(u.o.valid, u.o.payload.z, acc)
            m.d.comb += [
                u.i.valid.eq(in_fire),
                u.i.payload.a.eq(x),
                u.i.payload.b.eq(Mux(qin == 0, x, fwd)),
                u.o.ready.eq(1),
            ]
            if lane == 0:
                m.d.comb += u.i.payload.user.eq(Cat(in_last, wslot))
                max_valid = u.o.valid
                max_last = u.o.payload.user[0]
                max_slot = u.o.payload.user[1]
            with m.If(u.o.valid):
                m.d.sync += acc.eq(u.o.payload.z)
            lane_max.append(u.o.payload.z)
        m_row, m_valid, m_user = _tree(m, "maxtree", lane_max, max_valid & max_last, max_slot,
                                       lambda uw: FPMax(user_width=uw))
        for s in range(2):
            with m.If(m_valid & (m_user == s)):
                m.d.sync += [slot_m[s].eq(m_row), full[s].eq(1), pend[s].eq(0)]

        # ================= exp pass
        adds = [FPAdd(fmt=FP16, user_width=1 if lane == 0 else 0) for lane in range(L)]
        exps = [FPExp(user_width=1 if lane == 0 else 0) for lane in range(L)]
        s0_valid = Signal()
        s0_m = Signal(W)
        s0_last = Signal()
        rd_adv = Signal()
        m.d.comb += rd_adv.eq(~s0_valid | adds[0].i.ready)

        inflight = Signal(range(D + 1))      # rows started whose anchor has not been handed over
        ndone = Signal(range(D + 1))         # anchors waiting in the queue
        pw = max(ceil_log2(D), 1)
        mhead = Signal(pw)
        shead = Signal(pw)
        tail = Signal(pw)
        ring_m = Array(Signal(W, name=f"ring{k}_m") for k in range(D))
        ring_s = Array(Signal(FP32.width, name=f"ring{k}_sum") for k in range(D))

        def wrap_inc(v):
            return (v + 1)[:len(v)]   # D is a power of two

        r_full = Mux(rslot, full[1], full[0])
        r_m = Mux(rslot, slot_m[1], slot_m[0])
        r_nb = Mux(rslot, slot_nb[1], slot_nb[0])
        start = Signal()
        issue = Signal()
        q_cur = Mux(ract, rq, 0)
        nb_cur = Mux(ract, rnb, r_nb)
        m_cur = Mux(ract, rm, r_m)
        r_last = q_cur == nb_cur - 1
        m.d.comb += [
            start.eq(rd_adv & ~ract & r_full & (inflight < D)),
            issue.eq((rd_adv & ract) | start),
            rd.addr.eq(slot_addr(q_cur, rslot)),
            rd.en.eq(rd_adv),
        ]
        with m.If(rd_adv):
            m.d.sync += [s0_valid.eq(issue), s0_m.eq(m_cur), s0_last.eq(r_last)]
        with m.If(start):
            m.d.sync += [rm.eq(r_m), rnb.eq(r_nb), mhead.eq(wrap_inc(mhead))]
            for k in range(D):      # explicit per-entry enables (an Array target gives incomplete cases)
                with m.If(mhead == k):
                    m.d.sync += ring_m[k].eq(r_m)
            for s in range(2):
                with m.If(rslot == s):
                    m.d.sync += full[s].eq(0)
        with m.If(issue):
            with m.If(r_last):
                m.d.sync += [ract.eq(0), rslot.eq(~rslot), rq.eq(0)]
            with m.Else():
                m.d.sync += [ract.eq(1), rq.eq(q_cur + 1)]

        for lane in range(L):
            add, ex = adds[lane], exps[lane]
            m.submodules[f"sub_{lane}"] = add
            m.submodules[f"exp_{lane}"] = ex
            m.d.comb += [
                add.i.valid.eq(s0_valid),
                add.i.payload.a.eq(rd.data[W * lane:W * (lane + 1)]),
                add.i.payload.b.eq(s0_m ^ FP16.sign_mask),   # -m_r: sign flip (exact)
                ex.i.valid.eq(add.o.valid),
                ex.i.payload.x.eq(add.o.payload.z),
                add.o.ready.eq(ex.i.ready),
                ex.o.ready.eq(self.o.ready),
            ]
            if lane == 0:
                m.d.comb += [add.i.payload.user.eq(s0_last), ex.i.payload.user.eq(add.o.payload.user)]
        m.d.comb += [
            self.o.valid.eq(exps[0].o.valid),
            self.o.payload.eq(Cat(*[ex.o.payload.z for ex in exps])),
        ]
        o_fire = self.o.valid & self.o.ready

        # ---- FP32 sum: convert, lane tree, phase accumulators, phase tree
        convs = []
        for lane in range(L):
            cv = FPConvert(src=FP16, dst=FP32, user_width=1 if lane == 0 else 0)
            m.submodules[f"cvt_{lane}"] = cv
            m.d.comb += [cv.i.valid.eq(o_fire), cv.i.payload.a.eq(exps[lane].o.payload.z), cv.o.ready.eq(1)]
            if lane == 0:
                m.d.comb += cv.i.payload.user.eq(exps[0].o.payload.user)
            convs.append(cv)
        beat_sum, bs_valid, bs_user = _tree(m, "lanesum", [cv.o.payload.z for cv in convs], convs[0].o.valid,
                                            convs[0].o.payload.user, lambda uw: FPAdd(fmt=FP32, user_width=uw))
        bs_last = bs_user[0]

        phb = max(ceil_log2(PH), 1)
        ph = Signal(phb)                     # beat index mod PHASES within the row
        early = Signal(init=1)               # beat index < PHASES: the phase accumulator starts at +0
        m.submodules.accum = accu = FPAdd(fmt=FP32, user_width=phb + 2)   # user = {ph, early, last}
        areg = [Signal(FP32.width, name=f"phase{p}_acc") for p in range(PH)]
        o_ph = accu.o.payload.user[:phb]
        o_early = accu.o.payload.user[phb]
        o_last = accu.o.payload.user[phb + 1]
        hit = accu.o.valid & (o_ph == ph)
        m.d.comb += [
            accu.i.valid.eq(bs_valid),
            accu.i.payload.a.eq(Mux(early, 0, Mux(hit, accu.o.payload.z, Array(areg)[ph]))),
            accu.i.payload.b.eq(beat_sum),
            accu.i.payload.user.eq(Cat(ph, early, bs_last)),
            accu.o.ready.eq(1),
        ]
        with m.If(bs_valid):
            with m.If(bs_last):
                m.d.sync += [ph.eq(0), early.eq(1)]
            with m.Else():
                m.d.sync += ph.eq(Mux(ph == PH - 1, 0, ph + 1))
                with m.If(ph == PH - 1):
                    m.d.sync += early.eq(0)
        for p in range(PH):
            with m.If(accu.o.valid & (o_ph == p)):
                m.d.sync += areg[p].eq(accu.o.payload.z)
        finals = []
        for p in range(PH):
            used = (~o_early | (o_ph >= p)) if p else 1   # phases past a short row's last beat give +0
            val = Mux(o_ph == p, accu.o.payload.z, areg[p])
            finals.append(Mux(used, val, 0))
        row_sum, sum_valid, _ = _tree(m, "phasesum", finals, accu.o.valid & o_last, None,
                                      lambda uw: FPAdd(fmt=FP32, user_width=uw))

        # ---- anchor queue (D entries: m written at exp-pass start, sum at the phase-tree output)
        a_fire = self.anchor.valid & self.anchor.ready
        with m.If(sum_valid):
            m.d.sync += shead.eq(wrap_inc(shead))
            for k in range(D):
                with m.If(shead == k):
                    m.d.sync += ring_s[k].eq(row_sum)
        with m.If(a_fire):
            m.d.sync += tail.eq(wrap_inc(tail))
        m.d.sync += [
            inflight.eq(inflight + start - a_fire),
            ndone.eq(ndone + sum_valid - a_fire),
        ]
        m.d.comb += [
            self.anchor.valid.eq(ndone != 0),
            self.anchor.payload.max.eq(ring_m[tail]),
            self.anchor.payload.sum.eq(ring_s[tail]),
        ]
        return m
