"""The PLoRA NDP core: instruction buffer + decoder, control unit, input/DRAM/output buffers, PE array, softmax SFU.

Fig. 5(c) of [PLoRA] (Section IV-B): "the instruction buffer holds instructions
until they issue, and the decoder turns each into control code for the control unit, which drives the DRAM
controller and the Compute Unit. The Compute Unit holds an input buffer for GPU data, a DRAM buffer for
device-resident data, and an output buffer for intermediate and final results, and its logic pairs PEs
optimized for GEMV and GEMM with a Special Function Unit (SFU) for softmax." See ``docs/ndp_core.md`` for the
units, the rings, the stream protocol, the clocking and measured figures.

Streams (all ``amaranth.lib.stream``; a *beat* is ``lanes`` FP16 elements, element ``l`` in bits
``[16 l, 16 l + 16)``):

* ``desc`` (in): requests (``REQUEST_LAYOUT``: a descriptor and its owner) into the instruction buffer.
* ``x`` (in): the GPU input of every descriptor that completes OK and takes one (STORE, READ_COMPUTE without
  CHAIN), in descriptor order: a READ_COMPUTE's rows each padded to whole beats, a STORE's bytes.
* ``y`` (out): the returned elements of every OK descriptor, in order, packed row-major:
  ``ceil(elements / lanes)`` beats, the last zero-padded.
* ``cpl`` (out): one completion ``{seq, status}`` per descriptor, in order, after its ``y`` beats.
* ``mem_req`` (out) / ``mem_rsp`` (in): line-granular requests ``{addr, write, wdata, tag}`` and read
  responses ``{rdata, tag}`` in request order (an in-order memory controller or the device memory system).
* ``ce`` (in, default 1): clock enable of the whole core. The memory side runs every cycle; with ``ce`` high
  15 of 16 cycles the core runs at 1 GHz against LPDDR5X's 1066.7 MHz CK (``hdl.ndp.config.CORE_CLOCK_RATIO``).

Descriptors overlap: the memory engine reads the operands of later descriptors into the DRAM ring while
earlier ones compute, drain and return (``docs/ndp_core.md``).
"""

from amaranth.hdl import Module, Signal, Const, Cat, Mux, Array, EnableInserter, unsigned
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.utils import exact_log2, bits_for, ceil_log2

from ..fp.add import FPAdd
from ..fp.convert import FPConvert
from ..fp.format import FP16, FP32
from ..fp.mac import ACCUMULATORS
from .config import NDPConfig
from .decoder import DescriptorDecoder
from .descriptor import (REQUEST_LAYOUT, OWNER_BITS, FIELD_BITS, ADDR_BITS, SEQ_BITS, DescType, DescOp,
                         ErrorCode, ANCHOR_ELEMS)
from .pe_array import PEArray, PEMode
from .softmax import SoftmaxUnit

__all__ = ["NDPCore", "completion_layout", "CMD_RING", "JOB_RING"]

#: Descriptors in flight between the decoder and the completion (design choice: enough for the memory engine
#: to run several descriptors ahead of the compute).
CMD_RING = 8
#: PE / SFU / LOAD / STORE jobs in flight between the job generator and the output writer (design choice:
#: LOAD, COMPUTE and DRAIN of three jobs, plus slack).
JOB_RING = 8


def completion_layout() -> data.StructLayout:
    """One completion: the descriptor's sequence number and its status."""
    return data.StructLayout({"seq": SEQ_BITS, "status": ErrorCode})


def _pow2(v):
    return v > 0 and v & (v - 1) == 0


class _RingReader(wiring.Component):
    """Streams words of a synchronous read port from ``start`` (a free-running ring position) for ``count``
    words, one per cycle, each only once ``avail`` says it has been written. ``go`` loads ``start``/``count``;
    ``o`` is the word stream (data held under backpressure); ``busy`` while words remain or one is offered.
    ``sel`` (optional): the port's words hold ``1 << sel_bits`` items; the item ``pos & mask`` is selected.
    ``pairs`` (optional, ``sel_bits >= 1``): ``o`` is two items wide; with ``two`` high at ``go`` (``start`` even)
    each word of ``o`` is the item pair ``(pos, pos + 1)`` of one port word (``count`` pairs), else one item in
    the low half. ``last``: no word is left to issue (the offered word, if any, is the last one); ``go`` may come
    in the cycle the last word is taken (the next run's first word is then offered two cycles later)."""

    def __init__(self, port, pos_bits, count_bits, item_bits, sel_bits=0, pairs=False):
        if pairs and not sel_bits:
            raise ValueError("_RingReader: pairs need at least two items per port word (sel_bits >= 1)")
        self.port = port
        self.pos_bits, self.sel_bits = pos_bits, sel_bits
        self.item_bits = item_bits
        self.pairs = pairs
        super().__init__({
            "go": In(1), "start": In(pos_bits), "count": In(count_bits), "two": In(1),
            "avail": In(1), "pos": Out(pos_bits),
            "o": Out(stream.Signature(item_bits * (2 if pairs else 1))), "busy": Out(1), "last": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        ptr = self.pos
        rem = Signal.like(self.count)
        sel = Signal(max(self.sel_bits, 1))
        adv = ~self.o.valid | self.o.ready
        issue = adv & (rem != 0) & self.avail
        word_idx = ptr >> self.sel_bits
        m.d.comb += [
            self.port.addr.eq(word_idx[:len(self.port.addr)]),
            self.port.en.eq(adv),
            self.busy.eq(self.o.valid | (rem != 0)),
            self.last.eq(rem == 0),
        ]
        two = Signal()
        if self.pairs:
            one = self.port.data.word_select(sel, self.item_bits)
            pair = self.port.data.word_select(sel[1:], 2 * self.item_bits)
            m.d.comb += self.o.payload.eq(Mux(two, pair, one))
        elif self.sel_bits:
            m.d.comb += self.o.payload.eq(self.port.data.word_select(sel, self.item_bits))
        else:
            m.d.comb += self.o.payload.eq(self.port.data)
        with m.If(self.go):
            m.d.sync += [ptr.eq(self.start), rem.eq(self.count), self.o.valid.eq(0)]
            if self.pairs:
                m.d.sync += two.eq(self.two)
        with m.Elif(adv):
            m.d.sync += self.o.valid.eq(issue)
            with m.If(issue):
                m.d.sync += [ptr.eq(ptr + 1 + two), rem.eq(rem - 1)]
                if self.sel_bits:
                    m.d.sync += sel.eq(ptr[:self.sel_bits])
        return m


class _Core(wiring.Component):
    """The core's logic in one clock domain (``NDPCore`` adds the clock enable)."""

    def __init__(self, core):
        self.c = core
        super().__init__(core._ports())

    def elaborate(self, platform):
        core, cfg = self.c, self.c.config
        L, W, P = core.lanes, core.beat_bits, core.beats_per_line
        lsh, psh = exact_log2(L), exact_log2(P)
        line_sh = exact_log2(core.line_bytes)
        half = L // 2
        acc_fmt = ACCUMULATORS[cfg.acc]
        aw = acc_fmt.width
        m = Module()
        m.submodules.decoder = dec = core.decoder
        m.submodules.pe = pe = core.pe
        m.submodules.sfu = sfu = core.sfu
        wiring.connect(m, wiring.flipped(self.desc), dec.i)

        IN_CAP, DR_CAP, RET_CAP = core.in_cap, core.dram_lines, core.ret_cap
        KB, PS, NS = core.kept_beats, core.partial_elems, cfg.state_slots
        in_pb, dr_pb, ret_pb = bits_for(2 * IN_CAP - 1), bits_for(2 * DR_CAP - 1), bits_for(2 * RET_CAP - 1)

        # ---- buffers
        m.submodules.inbuf = inbuf = memory.Memory(shape=unsigned(W), depth=IN_CAP, init=[])
        m.submodules.dbuf = dbuf = memory.Memory(shape=unsigned(W * P), depth=DR_CAP, init=[])
        m.submodules.retbuf = retbuf = memory.Memory(shape=unsigned(W), depth=RET_CAP, init=[])
        m.submodules.keptbuf = keptbuf = memory.Memory(shape=unsigned(W), depth=max(NS * KB, 2), init=[])
        m.submodules.partbuf = partbuf = memory.Memory(shape=unsigned(aw), depth=max(NS * PS, 2), init=[])
        in_w = inbuf.write_port()
        d_w = dbuf.write_port()
        r_w = retbuf.write_port(granularity=16)        # results
        r_wa = retbuf.write_port(granularity=16)       # softmax anchors (element writes)
        k_w = keptbuf.write_port(granularity=16)
        p_w = partbuf.write_port()
        p_r = partbuf.read_port(transparent_for=(p_w,))

        # ============================================================== command ring (decoder -> units)
        cl = dec.command_layout
        # prod: the seq of the last KEEP into the entry's slot dispatched before it (a CHAIN's producer)
        ent_layout = data.StructLayout({"cmd": cl, "slot": max(1, ceil_log2(NS)), "prod": SEQ_BITS})
        CQ = CMD_RING
        qb = bits_for(2 * CQ - 1)
        ring = Array(Signal(ent_layout.size, name=f"cq{i}") for i in range(CQ))
        wp = Signal(qb)
        rp_m, rp_i, rp_g, rp_o, rp_r = (Signal(qb, name=n) for n in ("rp_mem", "rp_in", "rp_gen", "rp_out",
                                                                     "rp_ret"))

        def entry(rp):
            return ent_layout(ring[rp[:qb - 1]])

        def has(rp):
            return rp != wp

        # ---- dispatcher: the control unit's state check (NO_CHAIN_INPUT / FOREIGN_STATE) and state slots
        so = [Signal(OWNER_BITS, name=f"slot{s}_owner") for s in range(NS)]
        kv = [Signal(name=f"slot{s}_kept") for s in range(NS)]
        kr = [Signal(FIELD_BITS, name=f"slot{s}_kept_rows") for s in range(NS)]
        kc = [Signal(FIELD_BITS, name=f"slot{s}_kept_cols") for s in range(NS)]
        pv = [Signal(name=f"slot{s}_part") for s in range(NS)]
        pr = [Signal(FIELD_BITS, name=f"slot{s}_part_rows") for s in range(NS)]
        pc = [Signal(FIELD_BITS, name=f"slot{s}_part_cols") for s in range(NS)]
        ks = [Signal(SEQ_BITS, name=f"slot{s}_keep_seq") for s in range(NS)]    # seq of the slot's last KEEP
        victim = Signal(range(max(NS, 2)))
        c = dec.o.payload
        is_mm = (c.type == DescType.READ_COMPUTE) & ((c.op == DescOp.GEMV) | (c.op == DescOp.GEMM))
        res_rows = Mux(is_mm, Mux(c.op == DescOp.GEMV, 1, c.input_dim0), c.input_dim0)
        gw = Mux(c.narrow, cfg.group_lanes // 2, cfg.group_lanes) if cfg.group_narrow else cfg.group_lanes
        res_cols = Mux(is_mm, Mux(c.group, gw, c.operand_dim1), c.input_dim1)   # (GROUP GEMM: R x W; NARROW W / 2)
        valid_s = [kv[s] | pv[s] for s in range(NS)]
        hit_s = [valid_s[s] & (so[s] == c.owner) for s in range(NS)]
        any_hit, any_valid = Cat(*hit_s).any(), Cat(*valid_s).any()
        hit_idx = Signal(range(max(NS, 2)))
        free_idx = Signal(range(max(NS, 2)))
        for s in reversed(range(NS)):
            with m.If(hit_s[s]):
                m.d.comb += hit_idx.eq(s)
            with m.If(~valid_s[s]):
                m.d.comb += free_idx.eq(s)
        any_free = ~Cat(*valid_s).all()
        kept_ok = Array(kv)[hit_idx] & (Array(kr)[hit_idx] == c.input_dim0) & (Array(kc)[hit_idx] == c.input_dim1)
        part_ok = Array(pv)[hit_idx] & (Array(pr)[hit_idx] == res_rows) & (Array(pc)[hit_idx] == res_cols)
        needs = c.chain | c.acc
        state_ok = ~needs | (any_hit & (~c.chain | kept_ok) & (~c.acc | part_ok))
        status = Signal(ErrorCode)
        with m.If(c.status != ErrorCode.OK):
            m.d.comb += status.eq(c.status)
        with m.Elif(state_ok):
            m.d.comb += status.eq(ErrorCode.OK)
        with m.Elif(~any_hit & any_valid):
            m.d.comb += status.eq(ErrorCode.FOREIGN_STATE)
        with m.Else():
            m.d.comb += status.eq(ErrorCode.NO_CHAIN_INPUT)
        slot = Signal(range(max(NS, 2)))
        m.d.comb += slot.eq(Mux(any_hit, hit_idx, Mux(any_free, free_idx, victim)))
        full = (wp - rp_r)[:qb] == CQ
        m.d.comb += dec.o.ready.eq(~full)
        with m.If(dec.o.valid & ~full):
            e = Signal(ent_layout)
            m.d.comb += [e.cmd.eq(c), e.cmd.status.eq(status), e.slot.eq(slot), e.prod.eq(Array(ks)[slot])]
            with m.If(status != ErrorCode.OK):       # a rejected command carries only status, seq, owner
                m.d.comb += [e.cmd.eq(0), e.cmd.status.eq(status), e.cmd.seq.eq(c.seq), e.cmd.owner.eq(c.owner)]
            for i in range(CQ):                  # (explicit per entry: complete case statements in the Verilog)
                with m.If(wp[:qb - 1] == i):
                    m.d.sync += ring[i].eq(e.as_value())
            m.d.sync += wp.eq(wp + 1)
            uses = c.keep | c.partial | c.chain | c.acc
            with m.If((status == ErrorCode.OK) & uses):
                for s in range(NS):
                    with m.If(slot == s):
                        with m.If(~any_hit):
                            m.d.sync += [so[s].eq(c.owner), kv[s].eq(0), pv[s].eq(0)]
                            if NS > 1:
                                with m.If(~any_free):
                                    m.d.sync += victim.eq(victim + 1)
                        with m.If(c.keep):
                            m.d.sync += [kv[s].eq(1), kr[s].eq(res_rows), kc[s].eq(res_cols), ks[s].eq(c.seq)]
                        with m.If(c.partial):
                            m.d.sync += [pv[s].eq(1), pr[s].eq(res_rows), pc[s].eq(res_cols)]
                        with m.Elif(c.acc):
                            m.d.sync += pv[s].eq(0)

        def lines_of(cmd):
            return ((cmd.operand_elems << 1) + (core.line_bytes - 1)) >> line_sh

        # ============================================================== memory engine
        a_m = Signal(dr_pb)                    # DRAM ring lines allocated (free-running, mod 2 * DR_CAP)
        w_m = Signal(dr_pb)                    # lines written by read responses
        f_e = Signal(dr_pb)                    # lines freed by the compute
        stores_done = Signal(qb)
        m.submodules.store_fifo = store_fifo = SyncFIFOBuffered(width=W, depth=4)
        me = entry(rp_m)
        mc = me.cmd
        m_busy = Signal()
        m_n = Signal(FIELD_BITS)               # lines of the current request burst
        m_i = Signal(FIELD_BITS)
        m_line = Signal(core.mem_addr_bits)
        m_store = Signal()
        wp_buf = Signal(W * P)
        wp_n = Signal(range(P + 1))
        req = self.mem_req
        mem_line_first = (mc.base_addr >> line_sh)[:core.mem_addr_bits]
        with m.If(~m_busy & has(rp_m)):
            reads = (mc.status == ErrorCode.OK) & ((mc.type == DescType.LOAD)
                                                   | ((mc.type == DescType.READ_COMPUTE) & (mc.op != DescOp.SOFTMAX)))
            writes = (mc.status == ErrorCode.OK) & (mc.type == DescType.STORE)
            space = ((a_m - f_e)[:dr_pb] + lines_of(mc)) <= DR_CAP
            with m.If(reads):
                with m.If(space):
                    m.d.sync += [m_busy.eq(1), m_store.eq(0), m_n.eq(lines_of(mc)), m_i.eq(0),
                                 m_line.eq(mem_line_first), a_m.eq(a_m + lines_of(mc))]
            with m.Elif(writes):
                m.d.sync += [m_busy.eq(1), m_store.eq(1), m_n.eq(lines_of(mc)), m_i.eq(0), m_line.eq(mem_line_first),
                             wp_n.eq(0)]
            with m.Else():
                m.d.sync += rp_m.eq(rp_m + 1)
        # STORE: pack P beats of the store FIFO into a line
        m.d.comb += store_fifo.r_en.eq(m_busy & m_store & (wp_n != P) & (m_i != m_n))
        with m.If(store_fifo.r_en & store_fifo.r_rdy):
            m.d.sync += [wp_buf.eq(Cat(wp_buf[W:], store_fifo.r_data) if P > 1 else store_fifo.r_data),
                         wp_n.eq(wp_n + 1)]
        m.d.comb += [
            req.valid.eq(m_busy & (m_i != m_n) & (~m_store | (wp_n == P))),
            req.payload.as_value().eq(Cat(m_line, m_store, wp_buf,
                                          Const(0, len(req.payload.as_value()) - core.mem_addr_bits - 1 - W * P))),
        ]
        with m.If(req.valid & req.ready):
            m.d.sync += [m_i.eq(m_i + 1), m_line.eq(m_line + 1), wp_n.eq(0)]
        with m.If(m_busy & (m_i == m_n)):
            m.d.sync += [m_busy.eq(0), rp_m.eq(rp_m + 1)]
            with m.If(m_store):
                m.d.sync += stores_done.eq(stores_done + 1)
        # read responses (in request order) -> DRAM ring; space was reserved, so always ready
        m.d.comb += [
            self.mem_rsp.ready.eq(1),
            d_w.addr.eq(w_m[:dr_pb - 1]), d_w.data.eq(self.mem_rsp.payload.rdata), d_w.en.eq(self.mem_rsp.valid),
        ]
        with m.If(self.mem_rsp.valid):
            m.d.sync += w_m.eq(w_m + 1)

        # ============================================================== input unit
        w_i = Signal(in_pb)                    # input beats written
        f_i = Signal(in_pb)                    # input beats freed by the compute
        ie = entry(rp_i)
        ic = ie.cmd
        i_busy = Signal()
        i_left = Signal(FIELD_BITS)
        i_chain = Signal()
        m.submodules.kept_rd = kept_rd = _RingReader(keptbuf.read_port(), bits_for(NS * KB), FIELD_BITS, W)
        m.d.comb += kept_rd.avail.eq(1)
        with m.If(~i_busy & has(rp_i)):
            takes = (ic.status == ErrorCode.OK) & ((ic.type == DescType.STORE) | (ic.type == DescType.READ_COMPUTE))
            space = ((w_i - f_i)[:in_pb] + ic.input_beats) <= IN_CAP
            with m.If(~takes):
                m.d.sync += rp_i.eq(rp_i + 1)
            # a CHAIN copies the kept result once its producer (the slot's last KEEP before it) has written it:
            # ``pend`` descriptors before it are not done, its producer ``dist`` descriptors before it (seq and
            # ring entries count alike); descriptors between them (another owner's) may still be in flight
            pend = (rp_i - rp_o)[:qb]
            dist = (ic.seq - ie.prod)[:SEQ_BITS]
            with m.Elif(space & (~ic.chain | (pend == 0) | (pend < dist))):
                m.d.sync += [i_busy.eq(1), i_left.eq(ic.input_beats), i_chain.eq(ic.chain)]
                with m.If(ic.chain):
                    m.d.comb += [kept_rd.go.eq(1), kept_rd.start.eq(ie.slot * KB), kept_rd.count.eq(ic.input_beats)]
        src_valid = Mux(i_chain, kept_rd.o.valid, self.x.valid)
        m.d.comb += [
            self.x.ready.eq(i_busy & ~i_chain & (i_left != 0)),
            kept_rd.o.ready.eq(i_busy & i_chain & (i_left != 0)),
            in_w.addr.eq(w_i[:in_pb - 1]),
            in_w.data.eq(Mux(i_chain, kept_rd.o.payload, self.x.payload)),
            in_w.en.eq(i_busy & src_valid & (i_left != 0)),
        ]
        with m.If(in_w.en):
            m.d.sync += [w_i.eq(w_i + 1), i_left.eq(i_left - 1)]
        with m.If(i_busy & (i_left == 0)):
            m.d.sync += [i_busy.eq(0), rp_i.eq(rp_i + 1)]

        # ============================================================== job generator
        KIND_NONE, KIND_STORE, KIND_LOAD, KIND_SFU, KIND_PE = range(5)
        job_layout = data.StructLayout({
            "kind": 3, "mode": PEMode, "rows": range(cfg.pe_batch + 1), "k": FIELD_BITS,
            "cols": bits_for(2 * cfg.acc_columns), "x_start": in_pb, "x_count": FIELD_BITS,
            "a_start": dr_pb + psh, "a_count": FIELD_BITS, "row0": FIELD_BITS, "col0": FIELD_BITS,
            "first": 1, "last": 1, "free_in": FIELD_BITS, "free_lines": FIELD_BITS,
            "narrow": 1,                        # (ROW_GROUP at W / 2: the descriptor's NARROW)
        })
        JQ = JOB_RING
        jb = bits_for(2 * JQ - 1)
        jring = Array(Signal(job_layout.size, name=f"jq{i}") for i in range(JQ))
        jwp = Signal(jb)
        rp_x, rp_a, rp_w = Signal(jb, name="rp_xfeed"), Signal(jb, name="rp_afeed"), Signal(jb, name="rp_write")

        def job(rp):
            return job_layout(jring[rp[:jb - 1]])

        def jhas(rp):
            return rp != jwp

        jfull = ((jwp - rp_x)[:jb] == JQ) | ((jwp - rp_a)[:jb] == JQ) | ((jwp - rp_w)[:jb] == JQ)
        g_in = Signal(in_pb)                   # input ring position of the next command's input
        g_dr = Signal(dr_pb + psh)             # DRAM ring beat position of the next command's operand
        g_p = Signal(FIELD_BITS)               # row0 of the current pass
        g_c = Signal(FIELD_BITS)               # col0 of the current group
        g_started = Signal()
        ge = entry(rp_g)
        gc = ge.cmd
        K, N = gc.operand_dim0, gc.operand_dim1
        # GROUP: the input's R rows of K = n W are R / g PE rows of n packed beats each (NARROW: R / 2 g rows of
        # 2 n beats)
        gsh = exact_log2(cfg.group_segments) if cfg.group_lanes else 0
        nar = gc.narrow if cfg.group_narrow else Const(0)
        B = Mux(gc.op == DescOp.GEMV, 1, Mux(gc.group, gc.input_dim0 >> (gsh + nar), gc.input_dim0))
        G = cfg.acc_columns
        mode = Signal(PEMode)
        m.d.comb += mode.eq(Mux(gc.trans, Mux((K & (L - 1)) == 0, PEMode.TRANS, PEMode.TRANS_HALF),
                                Mux(gc.group, PEMode.ROW_GROUP,
                                    Mux((N & (L - 1)) == 0, PEMode.ROW, PEMode.ROW_HALF))))
        is_trans = (mode == PEMode.TRANS) | (mode == PEMode.TRANS_HALF)
        row_like = (mode == PEMode.ROW) | (mode == PEMode.ROW_GROUP)
        kw = (K + (L - 1)) >> lsh
        if cfg.group_lanes:     # GROUP: K = n W, one x word per W-slice of the rows (hdl/ndp/pe_array.py ROW_GROUP)
            gl = exact_log2(cfg.group_lanes)
            kw = Mux(gc.group, Mux(nar, K >> (gl - 1), K >> gl) if cfg.group_narrow else K >> gl, kw)
        gcols = Mux(is_trans, Mux(N - g_c > G, G, N - g_c), Mux(row_like, N >> lsh, 1))
        grp_beats = Mux(mode == PEMode.TRANS, (K >> lsh) * gcols, gcols >> 1)   # TRANS / TRANS_HALF
        full_grp = Mux(mode == PEMode.TRANS, (K >> lsh) * G, G >> 1)
        beats_mm = Mux(is_trans, grp_beats, Mux(row_like, K * (N >> lsh), K >> 1))
        rows_p = Mux(B - g_p > cfg.pe_batch, cfg.pe_batch, B - g_p)
        last_pass = g_p + rows_p >= B
        last_grp = ~is_trans | (g_c + G >= N)
        gen_lines = lines_of(gc)
        # GEMV at two beats per cycle (config.gemv_pairs): a one-row TRANS job of an even column count
        if cfg.gemv_pairs:
            pair = (mode == PEMode.TRANS) & (rows_p == 1) & ~gcols[0]
        else:
            pair = Const(0)
        jr = Signal(job_layout)
        with m.If(has(rp_g) & ~jfull):
            m.d.comb += [jr.first.eq(~g_started), jr.x_start.eq(g_in), jr.a_start.eq(g_dr)]
            ok = gc.status == ErrorCode.OK
            with m.If(~ok):
                m.d.comb += [jr.kind.eq(KIND_NONE), jr.last.eq(1)]
            with m.Elif(gc.type == DescType.STORE):
                m.d.comb += [jr.kind.eq(KIND_STORE), jr.last.eq(1), jr.x_count.eq(gc.input_beats),
                             jr.free_in.eq(gc.input_beats)]
            with m.Elif(gc.type == DescType.LOAD):
                m.d.comb += [jr.kind.eq(KIND_LOAD), jr.last.eq(1),
                             jr.a_count.eq((gc.operand_elems + (L - 1)) >> lsh), jr.free_lines.eq(gen_lines)]
            with m.Elif(gc.op == DescOp.SOFTMAX):
                m.d.comb += [jr.kind.eq(KIND_SFU), jr.last.eq(1), jr.x_count.eq(gc.input_beats),
                             jr.free_in.eq(gc.input_beats), jr.row0.eq(gc.input_dim0), jr.k.eq(gc.input_dim1)]
            with m.Else():
                last = last_pass & last_grp
                m.d.comb += [
                    jr.kind.eq(KIND_PE), jr.mode.eq(Mux(pair, PEMode.TRANS_PAIR, mode)), jr.rows.eq(rows_p),
                    jr.narrow.eq(gc.group & nar),
                    jr.k.eq(K),
                    jr.cols.eq(Mux(is_trans, gcols, Mux(row_like, N >> lsh, 1))),
                    jr.x_start.eq(g_in + g_p * kw), jr.x_count.eq(rows_p * kw),
                    jr.a_start.eq(g_dr + Mux(is_trans, (g_c >> exact_log2(G)) * full_grp, 0)),
                    jr.a_count.eq(Mux(pair, beats_mm >> 1, beats_mm)), jr.row0.eq(g_p), jr.col0.eq(g_c),
                    jr.last.eq(last),
                    jr.free_in.eq(Mux(last, gc.input_beats, 0)), jr.free_lines.eq(Mux(last, gen_lines, 0)),
                ]
            for i in range(JQ):
                with m.If(jwp[:jb - 1] == i):
                    m.d.sync += jring[i].eq(jr.as_value())
            m.d.sync += [jwp.eq(jwp + 1), g_started.eq(1)]
            with m.If(jr.last):
                m.d.sync += [rp_g.eq(rp_g + 1), g_started.eq(0), g_p.eq(0), g_c.eq(0)]
                with m.If(ok):
                    m.d.sync += [g_in.eq(g_in + Mux(gc.type == DescType.LOAD, 0, gc.input_beats)),
                                 g_dr.eq(g_dr + (Mux((gc.type == DescType.STORE) | (gc.op == DescOp.SOFTMAX)
                                                     & (gc.type == DescType.READ_COMPUTE), 0, gen_lines) << psh))]
            with m.Elif(is_trans & ~last_grp):
                m.d.sync += g_c.eq(g_c + G)
            with m.Else():
                m.d.sync += [g_c.eq(0), g_p.eq(g_p + rows_p)]

        # ============================================================== x feeder (input ring -> PE / SFU / STORE)
        m.submodules.in_rd = in_rd = _RingReader(inbuf.read_port(), in_pb, FIELD_BITS, W)
        m.d.comb += in_rd.avail.eq((w_i - in_rd.pos)[:in_pb] != 0)
        xj = job(rp_x)
        x_busy = Signal()
        x_cmd_sent = Signal()
        SL = cfg.sfu_lanes
        gear = L // SL
        gear_buf = Signal(W)
        gear_n = Signal(range(gear + 1))
        with m.If(~x_busy & jhas(rp_x)):
            with m.If((xj.kind == KIND_NONE) | (xj.kind == KIND_LOAD)):
                m.d.sync += rp_x.eq(rp_x + 1)
            with m.Else():
                m.d.comb += [in_rd.go.eq(1), in_rd.start.eq(xj.x_start), in_rd.count.eq(xj.x_count)]
                m.d.sync += [x_busy.eq(1), x_cmd_sent.eq(0), gear_n.eq(0)]
        x_kind = xj.kind
        # commands to the PE / SFU first
        m.d.comb += [
            pe.cmd.valid.eq(x_busy & (x_kind == KIND_PE) & ~x_cmd_sent),
            pe.cmd.payload.mode.eq(xj.mode), pe.cmd.payload.rows.eq(xj.rows), pe.cmd.payload.k.eq(xj.k),
            pe.cmd.payload.cols.eq(xj.cols),
        ]
        if cfg.group_narrow:
            m.d.comb += pe.cmd.payload.narrow.eq(xj.narrow)
        # the SFU's job shape (row0 = R, k = L_len): R rows of L_len / sfu_lanes sub-beats
        m.d.comb += [
            sfu.cmd.valid.eq(x_busy & (x_kind == KIND_SFU) & ~x_cmd_sent),
            sfu.cmd.payload.rows.eq(xj.row0), sfu.cmd.payload.nb.eq(xj.k >> exact_log2(cfg.sfu_lanes)),
        ]
        with m.If((pe.cmd.valid & pe.cmd.ready) | (sfu.cmd.valid & sfu.cmd.ready)):
            m.d.sync += x_cmd_sent.eq(1)
        x_go = x_busy & (x_cmd_sent | (x_kind == KIND_STORE))
        with m.If(x_go & (x_kind == KIND_PE)):
            m.d.comb += [pe.x.valid.eq(in_rd.o.valid), pe.x.payload.eq(in_rd.o.payload),
                         in_rd.o.ready.eq(pe.x.ready)]
        with m.If(x_go & (x_kind == KIND_STORE)):
            m.d.comb += [store_fifo.w_en.eq(in_rd.o.valid), store_fifo.w_data.eq(in_rd.o.payload),
                         in_rd.o.ready.eq(store_fifo.w_rdy)]
        # the SFU's input: straight, or through a FIFO of ``sfu_fifo`` words (config.sfu_fifo), so that the feeder
        # need not wait for the SFU's row slots (the SFU's cmd still goes first: its words stay in order). An
        # empty FIFO is bypassed (a word the SFU takes at once costs no cycle); its level counts every word written
        # before this cycle, so a bypassed word never passes a queued one
        si_valid, si_ready, si_data = Signal(), Signal(), Signal(16 * SL)
        if cfg.sfu_fifo:
            m.submodules.sfu_fifo = sfu_q = SyncFIFO(width=16 * SL, depth=cfg.sfu_fifo)
            bypass = ~sfu_q.r_rdy & sfu.i.ready
            m.d.comb += [
                sfu.i.valid.eq(sfu_q.r_rdy | si_valid),
                sfu.i.payload.eq(Mux(sfu_q.r_rdy, sfu_q.r_data, si_data)),
                sfu_q.r_en.eq(sfu.i.ready),
                sfu_q.w_en.eq(si_valid & ~bypass), sfu_q.w_data.eq(si_data),
                si_ready.eq(bypass | sfu_q.w_rdy),
            ]
        else:
            m.d.comb += [sfu.i.valid.eq(si_valid), sfu.i.payload.eq(si_data), si_ready.eq(sfu.i.ready)]
        with m.If(x_go & (x_kind == KIND_SFU)):
            # gearbox: one input beat -> `gear` SFU beats
            if gear == 1:
                m.d.comb += [si_valid.eq(in_rd.o.valid), si_data.eq(in_rd.o.payload),
                             in_rd.o.ready.eq(si_ready)]
            else:
                # a row of half a beat (L_len = lanes / 2, a KEEP SOFTMAX): the lower gear / 2 sub-beats of each
                # input beat, the rest is the row's padding
                g_last = Mux(xj.k == L // 2, gear // 2 - 1, gear - 1)
                m.d.comb += [si_valid.eq(in_rd.o.valid),
                             si_data.eq(in_rd.o.payload.word_select(gear_n[:exact_log2(gear)], 16 * SL)),
                             in_rd.o.ready.eq(si_ready & (gear_n == g_last))]
                with m.If(si_valid & si_ready):
                    m.d.sync += gear_n.eq(Mux(gear_n == g_last, 0, gear_n + 1))
        with m.If(x_busy & x_go & ~in_rd.busy):
            m.d.sync += [x_busy.eq(0), rp_x.eq(rp_x + 1), f_i.eq(f_i + xj.free_in)]

        # ============================================================== A feeder (DRAM ring -> PE / LOAD)
        m.submodules.d_rd = d_rd = _RingReader(dbuf.read_port(), dr_pb + psh, FIELD_BITS, W, sel_bits=psh,
                                               pairs=cfg.gemv_pairs)
        m.d.comb += d_rd.avail.eq((w_m - (d_rd.pos >> psh))[:dr_pb] != 0)
        m.submodules.load_fifo = load_fifo = SyncFIFOBuffered(width=W, depth=4)
        aj = job(rp_a)
        a_busy = Signal()
        with m.If(~a_busy & jhas(rp_a)):
            with m.If((aj.kind == KIND_PE) | (aj.kind == KIND_LOAD)):
                m.d.comb += [d_rd.go.eq(1), d_rd.start.eq(aj.a_start), d_rd.count.eq(aj.a_count),
                             d_rd.two.eq(aj.mode == PEMode.TRANS_PAIR)]
                m.d.sync += a_busy.eq(1)
            with m.Else():
                m.d.sync += rp_a.eq(rp_a + 1)
        with m.If(a_busy & (aj.kind == KIND_PE)):
            m.d.comb += [pe.a.valid.eq(d_rd.o.valid), pe.a.payload.eq(d_rd.o.payload), d_rd.o.ready.eq(pe.a.ready)]
        with m.If(a_busy & (aj.kind == KIND_LOAD)):
            m.d.comb += [load_fifo.w_en.eq(d_rd.o.valid), load_fifo.w_data.eq(d_rd.o.payload[:W]),
                         d_rd.o.ready.eq(load_fifo.w_rdy)]
        # a job ends in the cycle its last word is taken (or once the reader is idle: a job of no words); the
        # next job's reader starts in that same cycle when it is already in the ring and reads the DRAM ring, so
        # back-to-back jobs (passes, K-tiles, descriptors) lose one cycle on the A stream instead of three
        a_end = a_busy & (~d_rd.busy | (d_rd.o.valid & d_rd.o.ready & d_rd.last))
        rp_a1 = (rp_a + 1)[:jb]
        nj = job(rp_a1)
        with m.If(a_end):
            m.d.sync += [rp_a.eq(rp_a1), f_e.eq(f_e + aj.free_lines)]
            with m.If(jhas(rp_a1) & ((nj.kind == KIND_PE) | (nj.kind == KIND_LOAD))):
                m.d.comb += [d_rd.go.eq(1), d_rd.start.eq(nj.a_start), d_rd.count.eq(nj.a_count),
                             d_rd.two.eq(nj.mode == PEMode.TRANS_PAIR)]
            with m.Else():
                m.d.sync += a_busy.eq(0)

        # ============================================================== output writer
        a_r = Signal(ret_pb)                   # return ring beats allocated
        f_r = Signal(ret_pb)                   # return ring beats freed by the return unit
        wj = job(rp_w)
        oe = entry(rp_o)
        oc = oe.cmd
        w_busy = Signal()
        ret_start = Signal(ret_pb)
        w_cnt = Signal(FIELD_BITS + 1)         # outputs written in this job
        w_in = Signal(FIELD_BITS + 1)          # PE outputs taken in this job (the next job's must wait)
        w_b = Signal(FIELD_BITS)               # (row, column) of the next scalar / beat written
        w_j = Signal(FIELD_BITS)
        ret_beats_o = (oc.ret_elems + (L - 1)) >> lsh
        o_N = oc.operand_dim1
        nbw = (o_N + (L - 1)) >> lsh           # kept beats per row
        kept_base = oe.slot * KB
        part_base = oe.slot * PS
        is_keep = oc.keep
        with m.If(~w_busy & jhas(rp_w)):
            space = ((a_r - f_r)[:ret_pb] + ret_beats_o) <= RET_CAP
            with m.If(~wj.first | space):
                m.d.sync += [w_busy.eq(1), w_cnt.eq(0), w_in.eq(0), w_b.eq(0), w_j.eq(0)]
                with m.If(wj.first):
                    m.d.sync += [ret_start.eq(a_r), a_r.eq(a_r + ret_beats_o)]
        w_kind = wj.kind
        w_mode = wj.mode
        w_row_like = (w_mode == PEMode.ROW) | (w_mode == PEMode.ROW_GROUP)
        w_row_mode = w_row_like | (w_mode == PEMode.ROW_HALF)
        job_outs = Mux(w_kind == KIND_PE,
                       Mux(w_row_mode, Mux(w_row_like, wj.rows * wj.cols, wj.rows), wj.rows * wj.cols),
                       Mux(w_kind == KIND_LOAD, wj.a_count, 0))
        full_mask = Const((1 << L) - 1, L)
        lo_mask = Const((1 << half) - 1, L)
        # -- row-mode words: FP32 -> FP16 per lane (free-running: the destination never stalls)
        row_valid = Signal()
        row_data = Signal(W)
        if cfg.acc == "fp32":
            convs = []
            for lane in range(L):
                cv = FPConvert(src=FP32, dst=FP16)
                m.submodules[f"cvt{lane}"] = cv
                m.d.comb += [cv.i.valid.eq(pe.y.valid & pe.y.ready),
                             cv.i.payload.a.eq(pe.y.payload[32 * lane:32 * lane + 32]), cv.o.ready.eq(1)]
                convs.append(cv)
            m.d.comb += [row_valid.eq(convs[0].o.valid), row_data.eq(Cat(*[cv.o.payload.z for cv in convs]))]
        else:
            m.d.comb += [row_valid.eq(pe.y.valid & pe.y.ready), row_data.eq(pe.y.payload)]
        more_in = w_in != job_outs
        m.d.comb += pe.y.ready.eq(w_busy & (w_kind == KIND_PE) & w_row_mode & more_in)
        with m.If((pe.y.valid & pe.y.ready) | (pe.ys.valid & pe.ys.ready)):
            m.d.sync += w_in.eq(w_in + 1)
        # -- TRANS scalars: + partial (ACC; else + -0, which is exact) -> partial or FP16 -> element write
        s_val = Signal(aw)
        s_acc = Signal()
        s_in = Signal()                         # scalar pipeline input stage holds a scalar
        s_adv = Signal()
        s_b, s_j = Signal(FIELD_BITS), Signal(FIELD_BITS)      # read-side (row, column) counters
        padd = FPAdd(fmt=acc_fmt)
        m.submodules.post_add = padd
        flat_r = (wj.row0 + s_b) * o_N + wj.col0 + s_j
        m.d.comb += [
            s_adv.eq(~s_in | padd.i.ready),
            pe.ys.ready.eq(w_busy & (w_kind == KIND_PE) & ~w_row_mode & s_adv & more_in),
            p_r.addr.eq(part_base + flat_r), p_r.en.eq(s_adv),
        ]
        with m.If(s_adv):
            m.d.sync += [s_in.eq(pe.ys.valid & pe.ys.ready), s_val.eq(pe.ys.payload)]
        with m.If(pe.ys.valid & pe.ys.ready):
            with m.If(s_j == wj.cols - 1):
                m.d.sync += [s_j.eq(0), s_b.eq(s_b + 1)]
            with m.Else():
                m.d.sync += s_j.eq(s_j + 1)
        neg_zero = Const(1 << (aw - 1), aw)
        m.d.comb += [padd.i.valid.eq(s_in), padd.i.payload.a.eq(Mux(oc.acc, p_r.data, neg_zero)),
                     padd.i.payload.b.eq(s_val)]
        scal_valid = Signal()
        scal_data = Signal(16)
        to_partial = oc.partial
        if cfg.acc == "fp32":
            scv = FPConvert(src=FP32, dst=FP16)
            m.submodules.post_cvt = scv
            m.d.comb += [scv.i.valid.eq(padd.o.valid & ~to_partial), scv.i.payload.a.eq(padd.o.payload.z),
                         scv.o.ready.eq(1), padd.o.ready.eq(1)]
            m.d.comb += [scal_valid.eq(scv.o.valid), scal_data.eq(scv.o.payload.z)]
        else:
            m.d.comb += [padd.o.ready.eq(1), scal_valid.eq(padd.o.valid & ~to_partial),
                         scal_data.eq(padd.o.payload.z)]
        # write-side (row, column) of the scalars
        flat_w = (wj.row0 + w_b) * o_N + wj.col0 + w_j
        part_w_valid = padd.o.valid & to_partial
        m.d.comb += [p_w.addr.eq(part_base + flat_w), p_w.data.eq(padd.o.payload.z), p_w.en.eq(part_w_valid)]
        scal_done = Mux(to_partial, part_w_valid, scal_valid)
        with m.If(w_busy & (w_kind == KIND_PE) & ~w_row_mode & scal_done):
            m.d.sync += w_cnt.eq(w_cnt + 1)
            with m.If(w_j == wj.cols - 1):
                m.d.sync += [w_j.eq(0), w_b.eq(w_b + 1)]
            with m.Else():
                m.d.sync += w_j.eq(w_j + 1)
        with m.If(~w_busy):
            m.d.sync += [s_b.eq(0), s_j.eq(0)]
        # -- SFU outputs: exponentials (collected to lanes) and anchors
        sfu_gear_buf = Signal(W)
        sfu_gear_n = Signal(range(gear + 1))
        sfu_word_valid = Signal()
        sfu_word = Signal(W)
        half_row = oc.input_dim1 == L // 2                       # a KEEP SOFTMAX of half-beat rows
        sfu_words = Mux(half_row, oc.input_dim0, (oc.input_dim0 * oc.input_dim1) >> lsh)   # R * L_len / lanes
        m.d.comb += sfu.o.ready.eq(w_busy & (w_kind == KIND_SFU) & (w_cnt != sfu_words))
        if gear == 1:
            m.d.comb += [sfu_word_valid.eq(sfu.o.valid & sfu.o.ready), sfu_word.eq(sfu.o.payload)]
        else:
            o_last = Mux(half_row, gear // 2 - 1, gear - 1)
            with m.If(sfu.o.valid & sfu.o.ready):
                m.d.sync += [sfu_gear_buf.eq(Cat(sfu_gear_buf[16 * SL:], sfu.o.payload)),
                             sfu_gear_n.eq(Mux(sfu_gear_n == o_last, 0, sfu_gear_n + 1))]
            full_word = Cat(sfu_gear_buf[16 * SL:], sfu.o.payload)
            # a half row's gear / 2 sub-beats are the upper half of the shift register: moved to the lower lanes,
            # the upper lanes (the row's padding) zero
            m.d.comb += [sfu_word_valid.eq(sfu.o.valid & sfu.o.ready & (sfu_gear_n == o_last)),
                         sfu_word.eq(Mux(half_row, full_word[W // 2:], full_word))]
        anc_cnt = Signal(FIELD_BITS)
        anc_second = Signal()
        # -- the one result write per cycle (return ring or kept slot)
        wr_addr = Signal(max(ret_pb, bits_for(max(NS * KB, 2))))
        wr_data = Signal(W)
        wr_en = Signal(L)
        wr_kept = Signal()
        with m.If(w_busy):
            with m.If(w_kind == KIND_LOAD):
                m.d.comb += [load_fifo.r_en.eq(w_cnt != job_outs)]
                with m.If(load_fifo.r_en & load_fifo.r_rdy):
                    m.d.comb += [wr_addr.eq(ret_start + w_cnt), wr_data.eq(load_fifo.r_data), wr_en.eq(full_mask)]
                    m.d.sync += w_cnt.eq(w_cnt + 1)
            with m.Elif((w_kind == KIND_PE) & w_row_like):      # (GROUP: a beat of g rows of W, packed)
                r = wj.row0 + w_b
                word = r * wj.cols + w_j
                m.d.comb += [wr_kept.eq(is_keep), wr_data.eq(row_data),
                             wr_addr.eq(Mux(is_keep, kept_base + word, ret_start + word)),
                             wr_en.eq(Mux(row_valid, full_mask, 0))]
                with m.If(row_valid):
                    m.d.sync += w_cnt.eq(w_cnt + 1)
                    with m.If(w_j == wj.cols - 1):
                        m.d.sync += [w_j.eq(0), w_b.eq(w_b + 1)]
                    with m.Else():
                        m.d.sync += w_j.eq(w_j + 1)
            with m.Elif((w_kind == KIND_PE) & (w_mode == PEMode.ROW_HALF)):
                r = wj.row0 + w_b
                odd = r[0] & ~is_keep
                m.d.comb += [wr_kept.eq(is_keep),
                             wr_data.eq(Mux(odd, row_data << (16 * half), row_data)),
                             wr_addr.eq(Mux(is_keep, kept_base + r, ret_start + (r >> 1))),
                             wr_en.eq(Mux(row_valid, Mux(odd, lo_mask << half, lo_mask), 0))]
                with m.If(row_valid):
                    m.d.sync += [w_cnt.eq(w_cnt + 1), w_b.eq(w_b + 1)]
            with m.Elif(w_kind == KIND_PE):
                r = wj.row0 + w_b
                col = wj.col0 + w_j
                kept_word = kept_base + r * nbw + (col >> lsh)
                flat = r * o_N + col
                lane = Mux(is_keep, col[:lsh], flat[:lsh])
                m.d.comb += [wr_kept.eq(is_keep), wr_data.eq(scal_data.replicate(L)),
                             wr_addr.eq(Mux(is_keep, kept_word, ret_start + (flat >> lsh))),
                             wr_en.eq(Mux(scal_valid, Const(1, L) << lane, 0))]
            with m.Elif(w_kind == KIND_SFU):
                m.d.comb += [wr_kept.eq(is_keep), wr_data.eq(sfu_word),
                             wr_addr.eq(Mux(is_keep, kept_base + w_cnt, ret_start + w_cnt)),
                             wr_en.eq(Mux(sfu_word_valid, full_mask, 0))]
                with m.If(sfu_word_valid):
                    m.d.sync += w_cnt.eq(w_cnt + 1)
        m.d.comb += [
            r_w.addr.eq(wr_addr[:ret_pb - 1]), r_w.data.eq(wr_data), r_w.en.eq(Mux(wr_kept, 0, wr_en)),
            k_w.addr.eq(wr_addr), k_w.data.eq(wr_data), k_w.en.eq(Mux(wr_kept, wr_en, 0)),
        ]
        # anchors: 3 elements at element index base + 3r (two cycles when they straddle a beat)
        anc_elem = (ret_start << lsh) + Mux(is_keep, 0, oc.input_dim0 * oc.input_dim1) + anc_cnt * ANCHOR_ELEMS
        a_lane = anc_elem[:lsh]
        a_word = anc_elem >> lsh
        a_val = Cat(sfu.anchor.payload.max, sfu.anchor.payload.sum)
        straddle = a_lane > L - ANCHOR_ELEMS
        with m.If(w_busy & (w_kind == KIND_SFU) & (anc_cnt != oc.input_dim0)):
            with m.If(~anc_second):
                m.d.comb += [
                    r_wa.addr.eq(a_word[:ret_pb - 1]),
                    r_wa.data.eq((a_val << (a_lane * 16))[:W]),
                    r_wa.en.eq(Mux(sfu.anchor.valid, (Const(0b111, L) << a_lane)[:L], 0)),
                    sfu.anchor.ready.eq(~straddle),
                ]
                with m.If(sfu.anchor.valid & straddle):
                    m.d.sync += anc_second.eq(1)
            with m.Else():
                done_n = Signal(range(L + 1))
                m.d.comb += [
                    done_n.eq(L - a_lane),
                    r_wa.addr.eq((a_word + 1)[:ret_pb - 1]),
                    r_wa.data.eq((a_val >> (done_n * 16))[:W]),
                    r_wa.en.eq(Const(0b111, 3) >> done_n),
                    sfu.anchor.ready.eq(1),
                ]
                m.d.sync += anc_second.eq(0)
            with m.If(sfu.anchor.valid & sfu.anchor.ready):
                m.d.sync += anc_cnt.eq(anc_cnt + 1)
        # end of a job
        sfu_done = (w_cnt == sfu_words) & (anc_cnt == oc.input_dim0)
        job_done = Mux(w_kind == KIND_SFU, sfu_done, w_cnt == job_outs)
        with m.If(w_busy & job_done):
            m.d.sync += [w_busy.eq(0), rp_w.eq(rp_w + 1), anc_cnt.eq(0)]
            with m.If(wj.last):
                m.d.sync += rp_o.eq(rp_o + 1)

        # ============================================================== return unit
        re_ = entry(rp_r)
        rc = re_.cmd
        m.submodules.ret_rd = ret_rd = _RingReader(retbuf.read_port(), ret_pb, FIELD_BITS, W)
        m.d.comb += ret_rd.avail.eq(1)
        r_state = Signal(2)                     # 0 wait, 1 return beats, 2 completion
        r_cnt = Signal(FIELD_BITS)
        r_beats = (rc.ret_elems + (L - 1)) >> lsh
        stores_seen = Signal(qb)
        done_r = (rp_o != rp_r) & ((rc.type != DescType.STORE) | (rc.status != ErrorCode.OK)
                                   | (stores_done != stores_seen))
        with m.If((r_state == 0) & has(rp_r) & done_r):
            m.d.comb += [ret_rd.go.eq(1), ret_rd.start.eq(f_r), ret_rd.count.eq(r_beats)]
            m.d.sync += [r_state.eq(1), r_cnt.eq(0)]
            with m.If((rc.type == DescType.STORE) & (rc.status == ErrorCode.OK)):
                m.d.sync += stores_seen.eq(stores_seen + 1)
        last_r = r_cnt == r_beats - 1
        tail = rc.ret_elems - ((r_beats - 1) << lsh)
        lane_mask = Cat(*[Mux(last_r & (tail <= lane), Const(0, 16), Const(0xFFFF, 16)) for lane in range(L)])
        with m.If(r_state == 1):
            m.d.comb += [self.y.valid.eq(ret_rd.o.valid), self.y.payload.eq(ret_rd.o.payload & lane_mask),
                         ret_rd.o.ready.eq(self.y.ready)]
            with m.If(self.y.valid & self.y.ready):
                m.d.sync += r_cnt.eq(r_cnt + 1)
            with m.If(~ret_rd.busy):
                m.d.sync += r_state.eq(2)
        with m.If(r_state == 2):
            m.d.comb += [self.cpl.valid.eq(1), self.cpl.payload.seq.eq(rc.seq), self.cpl.payload.status.eq(rc.status)]
            with m.If(self.cpl.ready):
                m.d.sync += [r_state.eq(0), rp_r.eq(rp_r + 1), f_r.eq(f_r + r_beats)]
        return m


class NDPCore(wiring.Component):
    """One NDP core for ``config`` (:class:`NDPConfig`) on a memory with ``mem_burst_bits``-bit lines and
    ``mem_addr_bits``-bit line addresses (``MemoryController.request_layout``; ``mem_tag_width`` must match;
    tags are driven 0, responses must come back in request order).

    Requirements checked at construction (ValueError): ``lanes >= 4``; a line holds a power-of-two number of
    beats; ``align_bytes`` is a multiple of the line; the input, DRAM and return rings and the kept slots hold
    a power-of-two number of beats (lines for the DRAM ring); ``sfu_lanes`` divides ``lanes``.
    """

    def __init__(self, *, config: NDPConfig, mem_burst_bits: int, mem_addr_bits: int, mem_tag_width: int = 0):
        if not isinstance(config, NDPConfig):
            raise ValueError(f"config must be an NDPConfig, got {config!r}")
        L = config.lanes
        if L < 4:
            raise ValueError(f"NDPCore needs config.lanes >= 4, got {L}")
        if mem_burst_bits % (16 * L) or not _pow2(mem_burst_bits // (16 * L)):
            raise ValueError(f"mem_burst_bits ({mem_burst_bits}) must be a power-of-two multiple of one beat "
                             f"(16 x lanes = {16 * L})")
        line_bytes = mem_burst_bits // 8
        if config.align_bytes % line_bytes:
            raise ValueError(f"config.align_bytes ({config.align_bytes}) must be a multiple of the memory line "
                             f"({line_bytes} bytes)")
        if not 1 <= mem_addr_bits <= 64:
            raise ValueError(f"mem_addr_bits must be in 1..64, got {mem_addr_bits}")
        beat = 2 * L
        for name, v in (("input_buffer_bytes / beat", config.input_buffer_bytes // beat),
                        ("output_buffer_bytes / beat", config.output_buffer_bytes // beat),
                        ("dram_buffer_bytes / line", config.dram_buffer_bytes // line_bytes),
                        ("kept slot bytes / beat", config.kept_slot_bytes // beat)):
            if not _pow2(v) or v < 2:
                raise ValueError(f"NDPCore needs {name} to be a power of two >= 2, got {v}")
        if config.dram_buffer_bytes % line_bytes:
            raise ValueError(f"dram_buffer_bytes must be a multiple of the line ({line_bytes} bytes)")
        if L % config.sfu_lanes:
            raise ValueError(f"config.sfu_lanes ({config.sfu_lanes}) must divide lanes ({L})")
        if not _pow2(config.acc_columns):
            raise ValueError(f"config.acc_columns must be a power of two, got {config.acc_columns}")
        self.config = config
        self.lanes = L
        self.beat_bits = 16 * L
        self.line_bytes = line_bytes
        self.burst_bits = mem_burst_bits
        self.beats_per_line = mem_burst_bits // (16 * L)
        self.mem_addr_bits = mem_addr_bits
        self.mem_tag_width = mem_tag_width
        self.in_cap = config.input_buffer_bytes // beat
        self.ret_cap = config.output_buffer_bytes // beat
        self.dram_lines = config.dram_buffer_bytes // line_bytes
        self.kept_beats = config.kept_slot_bytes // beat
        self.partial_elems = config.partial_slot_elems
        self.decoder = DescriptorDecoder(config=config)
        if config.gemv_pairs and self.beats_per_line < 2:
            raise ValueError(f"config.gemv_pairs needs a memory line of >= 2 beats (mem_burst_bits >= "
                             f"{32 * L}), got {mem_burst_bits}")
        self.pe = PEArray(lanes=L, batch=config.pe_batch, acc=config.acc, max_k=config.max_k,
                          acc_columns=config.acc_columns, a_beats=2 if config.gemv_pairs else 1,
                          group=config.group_lanes, narrow=config.group_narrow)
        SL = config.sfu_lanes
        self.sfu = SoftmaxUnit(lanes=SL, max_len=-(-config.max_k // SL) * SL, max_rows=self.in_cap)
        self.request_layout = data.StructLayout({
            "addr": mem_addr_bits, "write": 1, "wdata": mem_burst_bits, "tag": mem_tag_width})
        self.response_layout = data.StructLayout({"rdata": mem_burst_bits, "tag": mem_tag_width})
        ports = self._ports()
        ports["ce"] = In(1, init=1)
        super().__init__(ports)

    def _ports(self):
        return {
            "desc": In(stream.Signature(REQUEST_LAYOUT)),
            "x": In(stream.Signature(unsigned(self.beat_bits))),
            "y": Out(stream.Signature(unsigned(self.beat_bits))),
            "cpl": Out(stream.Signature(completion_layout())),
            "mem_req": Out(stream.Signature(self.request_layout)),
            "mem_rsp": In(stream.Signature(self.response_layout)),
        }

    def elaborate(self, platform):
        m = Module()
        inner = _Core(self)
        m.submodules.core = EnableInserter({"sync": self.ce})(inner)
        # Every handshake crosses the boundary only in enabled cycles (the core's registers hold otherwise).
        for name in ("desc", "x", "mem_rsp"):
            outer, inn = getattr(self, name), getattr(inner, name)
            m.d.comb += [inn.valid.eq(outer.valid & self.ce), inn.payload.eq(outer.payload),
                         outer.ready.eq(inn.ready & self.ce)]
        for name in ("y", "cpl", "mem_req"):
            outer, inn = getattr(self, name), getattr(inner, name)
            m.d.comb += [outer.valid.eq(inn.valid & self.ce), outer.payload.eq(inn.payload),
                         inn.ready.eq(outer.ready & self.ce)]
        return m
