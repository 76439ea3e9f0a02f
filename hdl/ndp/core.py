"""The PLoRA NDP core: instruction buffer + decoder, control unit, input/DRAM/output buffers, PE array, softmax SFU.

Fig. 5(c) of /work/shared/papers/plora.txt (Section IV-B, line ~86): "the instruction buffer holds instructions
until they issue, and the decoder turns each into control code for the control unit, which drives the DRAM
controller and the Compute Unit. The Compute Unit holds an input buffer for GPU data, a DRAM buffer for
device-resident data, and an output buffer for intermediate and final results, and its logic pairs PEs
optimized for GEMV and GEMM with a Special Function Unit (SFU) for softmax." See ``docs/ndp_core.md`` for the
dataflow of every descriptor type, the stream protocol and measured figures.

Streams (all ``amaranth.lib.stream``; a *beat* is ``lanes`` FP16 elements, element ``l`` in bits
``[16 l, 16 l + 16)``):

* ``desc`` (in): descriptors (``DESCRIPTOR_LAYOUT``), into the instruction buffer.
* ``x`` (in): the GPU-supplied input of every *accepted* descriptor with an input (STORE and READ_COMPUTE
  without CHAIN), in descriptor order: ``input elements / lanes`` beats, row-major. A rejected descriptor (any
  status but OK) and a CHAIN descriptor take no ``x`` beats.
* ``y`` (out): the result of every accepted LOAD and READ_COMPUTE, in order: ``ceil(result elements / lanes)``
  beats of FP16, row-major; lanes past the end of the result in the last beat are 0. A KEEP result is not
  returned, except a SOFTMAX's anchors (``ceil(3 R / lanes)`` beats).
* ``cpl`` (out): one completion ``{seq, status}`` per descriptor, in order, after its ``y`` beats.
* ``mem_req`` (out) / ``mem_rsp`` (in): the memory controller's request and read-response streams (burst
  granularity, responses in request order: an ``"in-order"`` :class:`hdl.memctl.controller.MemoryController`).

One descriptor executes at a time; the instruction buffer and the decoder's pipeline hide the decode latency.
"""

from amaranth.hdl import Module, Signal, Const, Cat, Mux, Elaboratable, unsigned
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..fp.convert import FPConvert
from ..fp.format import FP16, FP32
from .config import NDPConfig
from .decoder import DescriptorDecoder
from .descriptor import DESCRIPTOR_LAYOUT, DescType, DescOp, ErrorCode, SEQ_BITS, ANCHOR_ELEMS
from .pe_array import PEArray
from .softmax import SoftmaxUnit

__all__ = ["NDPCore", "completion_layout"]


def completion_layout() -> data.StructLayout:
    """One completion: the descriptor's sequence number and its status."""
    return data.StructLayout({"seq": SEQ_BITS, "status": ErrorCode})


class _Reader(Elaboratable):
    """Streams words ``[start, start + count)`` of a synchronous read port: ``go`` (one cycle) loads
    ``start``/``count``; ``valid``/``ready``/``data`` is a stream (one word per cycle at full rate, data held
    under backpressure); ``busy`` while words remain or one is offered."""

    def __init__(self, port, depth):
        self.port = port
        self.start = Signal(range(depth + 1))
        self.count = Signal(range(depth + 1))
        self.go = Signal()
        self.valid = Signal()
        self.ready = Signal()
        self.data = port.data
        self.busy = Signal()
        self._depth = depth

    def elaborate(self, platform):
        m = Module()
        ptr = Signal(range(self._depth + 1))
        rem = Signal(range(self._depth + 1))
        adv = ~self.valid | self.ready
        m.d.comb += [
            self.port.addr.eq(ptr),
            self.port.en.eq(adv),
            self.busy.eq(self.valid | (rem != 0)),
        ]
        with m.If(self.go):
            m.d.sync += [ptr.eq(self.start), rem.eq(self.count), self.valid.eq(0)]
        with m.Elif(adv):
            m.d.sync += self.valid.eq(rem != 0)
            with m.If(rem != 0):
                m.d.sync += [ptr.eq(ptr + 1), rem.eq(rem - 1)]
        return m


class NDPCore(wiring.Component):
    """One NDP core for ``config`` (:class:`NDPConfig`) on a memory controller with ``mem_burst_bits``-bit bursts
    and ``mem_addr_bits``-bit burst addresses (``MemoryController.request_layout``; ``mem_tag_width`` must
    match the controller's ``tag_width``; tags are driven 0, responses must come back in request order).

    ``config.lanes`` must be >= 4 (a softmax anchor spans at most two beats) and divide a burst
    (``mem_burst_bits % (16 * lanes) == 0``); ``config.align_bytes`` must be a multiple of the burst size.
    """

    def __init__(self, *, config: NDPConfig, mem_burst_bits: int, mem_addr_bits: int, mem_tag_width: int = 0):
        if not isinstance(config, NDPConfig):
            raise ValueError(f"config must be an NDPConfig, got {config!r}")
        L = config.lanes
        if L < 4:
            raise ValueError(f"NDPCore needs config.lanes >= 4, got {L}")
        if mem_burst_bits % (16 * L):
            raise ValueError(f"mem_burst_bits ({mem_burst_bits}) must be a multiple of one beat "
                             f"(16 x lanes = {16 * L})")
        burst_bytes = mem_burst_bits // 8
        if config.align_bytes % burst_bytes:
            raise ValueError(f"config.align_bytes ({config.align_bytes}) must be a multiple of the burst "
                             f"({burst_bytes} bytes)")
        if not 1 <= mem_addr_bits <= 64:
            raise ValueError(f"mem_addr_bits must be in 1..64, got {mem_addr_bits}")
        self.config = config
        self.lanes = L
        self.beat_bits = 16 * L
        self.burst_bits = mem_burst_bits
        self.burst_bytes = burst_bytes
        self.beats_per_burst = mem_burst_bits // (16 * L)
        self.mem_addr_bits = mem_addr_bits
        self.in_depth = config.input_buffer_bytes // (2 * L)
        self.dram_depth = config.dram_buffer_bytes // (2 * L)
        self.out_depth = config.output_buffer_bytes // (2 * L)
        self.decoder = DescriptorDecoder(config=config)
        self.pe = PEArray(lanes=L, batch=config.pe_batch, acc=config.acc,
                          max_k=config.input_buffer_bytes // 2, max_n=config.output_buffer_bytes // 2)
        self.sfu = SoftmaxUnit(lanes=L, max_len=config.input_buffer_bytes // 2, max_rows=self.in_depth)
        self.request_layout = data.StructLayout({
            "addr": mem_addr_bits, "write": 1, "wdata": mem_burst_bits, "tag": mem_tag_width})
        self.response_layout = data.StructLayout({"rdata": mem_burst_bits, "tag": mem_tag_width})
        super().__init__({
            "desc": In(stream.Signature(DESCRIPTOR_LAYOUT)),
            "x": In(stream.Signature(unsigned(self.beat_bits))),
            "y": Out(stream.Signature(unsigned(self.beat_bits))),
            "cpl": Out(stream.Signature(completion_layout())),
            "mem_req": Out(stream.Signature(self.request_layout)),
            "mem_rsp": In(stream.Signature(self.response_layout)),
        })

    def elaborate(self, platform):
        cfg = self.config
        L, W, P = self.lanes, self.beat_bits, self.beats_per_burst
        lsh = exact_log2(L)
        bsh = exact_log2(self.burst_bytes)
        m = Module()
        m.submodules.decoder = dec = self.decoder
        m.submodules.pe = pe = self.pe
        m.submodules.sfu = sfu = self.sfu
        wiring.connect(m, wiring.flipped(self.desc), dec.i)

        # ---- buffers
        m.submodules.inbuf = inbuf = memory.Memory(shape=unsigned(W), depth=max(self.in_depth, 2), init=[])
        m.submodules.dbuf = dbuf = memory.Memory(shape=unsigned(W), depth=max(self.dram_depth, 2), init=[])
        m.submodules.obuf = obuf = memory.Memory(shape=unsigned(W), depth=max(self.out_depth, 2), init=[])
        in_w = inbuf.write_port()
        d_w = dbuf.write_port()
        o_w = obuf.write_port(granularity=16)          # beats (results, exponentials, LOAD data)
        o_wa = obuf.write_port(granularity=16)         # softmax anchors (element writes)
        m.submodules.in_rd = in_rd = _Reader(inbuf.read_port(), self.in_depth)
        m.submodules.d_rd = d_rd = _Reader(dbuf.read_port(), self.dram_depth)
        m.submodules.o_rd = o_rd = _Reader(obuf.read_port(), self.out_depth)

        # ---- the command being executed
        cmd = Signal(dec.command_layout)
        c_is_load = cmd.type == DescType.LOAD
        c_is_store = cmd.type == DescType.STORE
        c_is_sfu = (cmd.type == DescType.READ_COMPUTE) & (cmd.op == DescOp.SOFTMAX)
        status = Signal(ErrorCode)
        kept = Signal(range(self.out_depth * L + 1))       # elements KEPT by the previous descriptor
        in_beats = Signal(range(self.in_depth + 1))
        nbursts = Signal(range(self.dram_depth // P + 2))
        nb = Signal(range(self.out_depth + 1))             # N / lanes (GEMV/GEMM), L / lanes (SOFTMAX)
        kbeats = Signal(range(self.in_depth + 1))          # K / lanes
        rows = Signal(20)                                  # B (GEMM) or R (SOFTMAX); 1 for GEMV
        out_elems = Signal(range(self.out_depth * L + 1))
        ret_start = Signal(range(self.out_depth + 1))
        ret_beats = Signal(range(self.out_depth + 1))
        ret_elems = Signal(range(self.out_depth * L + 1))  # elements returned (last-beat mask)

        # ---- memory read path: request issuer + burst unpacker
        rd_issue = Signal()                 # issuing read requests
        rd_next = Signal(range(self.dram_depth // P + 2))
        base_burst = Signal(self.mem_addr_bits)
        ub = Signal(self.burst_bits)        # unpacker burst register
        ub_valid = Signal()
        ub_idx = Signal(range(max(P, 2)))
        u_valid = Signal()
        u_ready = Signal()
        u_data = Signal(W)
        m.d.comb += [
            u_valid.eq(ub_valid),
            u_data.eq(ub.word_select(ub_idx, W) if P > 1 else ub),
        ]
        u_last = (ub_idx == P - 1) if P > 1 else Const(1)
        take_burst = ~ub_valid | (u_ready & u_last)
        m.d.comb += self.mem_rsp.ready.eq(take_burst)
        with m.If(self.mem_rsp.valid & take_burst):
            m.d.sync += [ub.eq(self.mem_rsp.payload.rdata), ub_valid.eq(1), ub_idx.eq(0)]
        with m.Elif(u_valid & u_ready):
            with m.If(u_last):
                m.d.sync += ub_valid.eq(0)
            with m.Else():
                m.d.sync += ub_idx.eq(ub_idx + 1)

        # ---- memory write path (STORE): beat packer
        wp = Signal(self.burst_bits)
        wp_idx = Signal(range(P + 1))
        wp_full = wp_idx == P
        wr_next = Signal(range(self.dram_depth // P + 2))

        req = self.mem_req
        req_addr = Signal(self.mem_addr_bits)
        with m.If(c_is_store):
            m.d.comb += [req.valid.eq(wp_full), req_addr.eq(base_burst + wr_next)]
        with m.Else():
            m.d.comb += [req.valid.eq(rd_issue & (rd_next != nbursts)), req_addr.eq(base_burst + rd_next)]
        # one assignment of the whole payload (tags are driven 0: responses return in request order)
        m.d.comb += req.payload.as_value().eq(
            Cat(req_addr, c_is_store, wp, Const(0, self.request_layout.size - self.mem_addr_bits - 1 - self.burst_bits)))
        with m.If(req.valid & req.ready):
            with m.If(c_is_store):
                m.d.sync += [wr_next.eq(wr_next + 1), wp_idx.eq(0)]
            with m.Else():
                m.d.sync += rd_next.eq(rd_next + 1)

        # ---- FP32 -> FP16 conversion of the PE results (acc="fp32"); lock-step, always ready
        pe_y_valid = Signal()
        pe_y_data = Signal(W)
        m.d.comb += pe.y.ready.eq(1)
        if cfg.acc == "fp32":
            convs = []
            for lane in range(L):
                cv = FPConvert(src=FP32, dst=FP16)
                m.submodules[f"cvt{lane}"] = cv
                m.d.comb += [
                    cv.i.valid.eq(pe.y.valid),
                    cv.i.payload.a.eq(pe.y.payload[32 * lane:32 * lane + 32]),
                    cv.o.ready.eq(1),
                ]
                convs.append(cv)
            m.d.comb += [pe_y_valid.eq(convs[0].o.valid), pe_y_data.eq(Cat(*[c.o.payload.z for c in convs]))]
        else:
            m.d.comb += [pe_y_valid.eq(pe.y.valid), pe_y_data.eq(pe.y.payload)]

        # ---- control unit
        IDLE, CHECK, INPUT, LOADRD, STORE_WR, PASS, PASS_RUN, SFU_RUN, RETURN, CPL = range(10)
        state = Signal(range(10), name="ctl_state")
        ptr = Signal(range(max(self.in_depth, self.out_depth, self.dram_depth) + P + 1))   # write pointer
        a_ptr = Signal(range(self.dram_depth + 1))        # A beats of pass 0 / expected per pass
        a_total = Signal(range(self.dram_depth + 1))
        y_cnt = Signal(range(self.out_depth + 1))
        y_total = Signal(range(self.out_depth + 1))
        row0 = Signal(20)                                  # first row of the current GEMM pass
        rows_p = Signal(range(cfg.pe_batch + 1))
        pass0 = Signal()
        anc_cnt = Signal(range(self.in_depth + 1))
        ret_cnt = Signal(range(self.out_depth + 1))

        m.d.comb += dec.o.ready.eq(state == IDLE)
        with m.If(state == IDLE):
            with m.If(dec.o.valid):
                p = dec.o.payload
                m.d.sync += [
                    cmd.eq(p), status.eq(p.status),
                    in_beats.eq(p.input_elems >> lsh),
                    nbursts.eq((p.operand_elems * 2 + (self.burst_bytes - 1)) >> bsh),
                    base_burst.eq(p.base_addr >> bsh),
                    out_elems.eq(p.output_elems),
                    rd_next.eq(0), wr_next.eq(0), wp_idx.eq(0), ptr.eq(0),
                    state.eq(CHECK),
                ]
        with m.Elif(state == CHECK):
            is_sfu = c_is_sfu
            m.d.sync += [
                nb.eq(Mux(is_sfu, cmd.input_dim1, cmd.operand_dim1) >> lsh),
                kbeats.eq(cmd.operand_dim0 >> lsh),
                rows.eq(Mux(cmd.op == DescOp.GEMV, 1, cmd.input_dim0)),
            ]
            with m.If(status != ErrorCode.OK):
                m.d.sync += state.eq(CPL)
            with m.Elif(cmd.chain & (cmd.input_elems > kept)):
                m.d.sync += [status.eq(ErrorCode.NO_CHAIN_INPUT), state.eq(CPL)]
            with m.Else():
                # Operand reads start at once (LOAD and GEMV/GEMM), overlapping the input transfer.
                m.d.sync += rd_issue.eq(~c_is_store & ~is_sfu)
                with m.If(cmd.chain):
                    m.d.comb += [o_rd.go.eq(1), o_rd.start.eq(0), o_rd.count.eq(in_beats)]
                with m.If(c_is_load):
                    m.d.sync += state.eq(LOADRD)
                with m.Else():
                    m.d.sync += state.eq(INPUT)
        with m.Elif(state == INPUT):
            # Input buffer <- x (GPU) or the kept result (CHAIN), in_beats beats.
            src_valid = Mux(cmd.chain, o_rd.valid, self.x.valid)
            m.d.comb += [
                self.x.ready.eq(~cmd.chain & (ptr != in_beats)),
                o_rd.ready.eq(cmd.chain & (ptr != in_beats)),
                in_w.addr.eq(ptr),
                in_w.data.eq(Mux(cmd.chain, o_rd.data, self.x.payload)),
                in_w.en.eq(src_valid & (ptr != in_beats)),
            ]
            with m.If(src_valid & (ptr != in_beats)):
                m.d.sync += ptr.eq(ptr + 1)
            with m.If(ptr == in_beats):
                m.d.sync += [ptr.eq(0), row0.eq(0), pass0.eq(1)]
                with m.If(c_is_store):
                    m.d.comb += [in_rd.go.eq(1), in_rd.start.eq(0), in_rd.count.eq(in_beats)]
                    m.d.sync += state.eq(STORE_WR)
                with m.Elif(c_is_sfu):
                    m.d.comb += [in_rd.go.eq(1), in_rd.start.eq(0), in_rd.count.eq(in_beats)]
                    m.d.sync += [anc_cnt.eq(0), y_cnt.eq(0), state.eq(SFU_RUN)]
                with m.Else():
                    m.d.sync += state.eq(PASS)
        with m.Elif(state == LOADRD):
            # Output buffer <- memory, out_beats beats; the tail of the last burst is dropped.
            obeats = (out_elems + (L - 1)) >> lsh
            m.d.comb += [
                u_ready.eq(1),
                o_w.addr.eq(ptr),
                o_w.data.eq(u_data),
                o_w.en.eq(Mux(u_valid & (ptr < obeats), (1 << L) - 1, 0)),
            ]
            with m.If(u_valid):
                m.d.sync += ptr.eq(ptr + 1)
            with m.If(ptr == nbursts * P):
                # every requested burst was answered and unpacked
                m.d.sync += [rd_issue.eq(0), ret_start.eq(0), ret_beats.eq(obeats), ret_elems.eq(out_elems),
                             state.eq(RETURN)]
                m.d.comb += [o_rd.go.eq(1), o_rd.start.eq(0), o_rd.count.eq(obeats)]
        with m.Elif(state == STORE_WR):
            m.d.comb += in_rd.ready.eq(~wp_full)
            with m.If(in_rd.valid & ~wp_full):
                m.d.sync += [wp.eq(Cat(wp[W:], in_rd.data) if P > 1 else in_rd.data), wp_idx.eq(wp_idx + 1)]
            with m.If((wr_next == nbursts) & ~in_rd.busy):
                m.d.sync += state.eq(CPL)
        with m.Elif(state == PASS):
            # Start one pass of the PE array over A: rows row0 .. row0 + rows_p - 1.
            left = rows - row0
            n_rows = Mux(left > cfg.pe_batch, cfg.pe_batch, left)
            m.d.comb += [
                pe.cmd.valid.eq(1),
                pe.cmd.payload.rows.eq(n_rows),
                pe.cmd.payload.k.eq(cmd.operand_dim0),
                pe.cmd.payload.nb.eq(nb),
            ]
            with m.If(pe.cmd.ready):
                m.d.sync += [rows_p.eq(n_rows), a_ptr.eq(0), a_total.eq(kbeats * L * nb),
                             y_cnt.eq(0), y_total.eq(n_rows * nb), state.eq(PASS_RUN)]
                m.d.comb += [in_rd.go.eq(1), in_rd.start.eq(row0 * kbeats), in_rd.count.eq(n_rows * kbeats),
                             d_rd.go.eq(~pass0), d_rd.start.eq(0), d_rd.count.eq(kbeats * L * nb)]
        with m.Elif(state == PASS_RUN):
            # x from the input buffer; A from memory (pass 0, also written to the DRAM buffer) or the DRAM buffer.
            m.d.comb += [
                pe.x.valid.eq(in_rd.valid), pe.x.payload.eq(in_rd.data), in_rd.ready.eq(pe.x.ready),
                pe.a.valid.eq(Mux(pass0, u_valid, d_rd.valid)),
                pe.a.payload.eq(Mux(pass0, u_data, d_rd.data)),
                u_ready.eq(pass0 & pe.a.ready & (a_ptr != a_total)),
                d_rd.ready.eq(~pass0 & pe.a.ready),
                d_w.addr.eq(a_ptr),
                d_w.data.eq(u_data),
                d_w.en.eq(pass0 & pe.a.valid & pe.a.ready),
                o_w.addr.eq(ptr),
                o_w.data.eq(pe_y_data),
                o_w.en.eq(Mux(pe_y_valid, (1 << L) - 1, 0)),
            ]
            with m.If(pe.a.valid & pe.a.ready):
                m.d.sync += a_ptr.eq(a_ptr + 1)
            with m.If(pe_y_valid):
                m.d.sync += [ptr.eq(ptr + 1), y_cnt.eq(y_cnt + 1)]
            with m.If(y_cnt == y_total):
                m.d.sync += [pass0.eq(0), row0.eq(row0 + rows_p)]
                with m.If(row0 + rows_p >= rows):
                    # Drop whatever the unpacker still holds of the last burst (N*K not a burst multiple).
                    m.d.sync += [rd_issue.eq(0), ub_valid.eq(0)]
                    with m.If(cmd.keep):
                        m.d.sync += state.eq(CPL)
                    with m.Else():
                        obeats = out_elems >> lsh
                        m.d.sync += [ret_start.eq(0), ret_beats.eq(obeats), ret_elems.eq(out_elems),
                                     state.eq(RETURN)]
                        m.d.comb += [o_rd.go.eq(1), o_rd.start.eq(0), o_rd.count.eq(obeats)]
                with m.Else():
                    m.d.sync += state.eq(PASS)
        with m.Elif(state == SFU_RUN):
            n_beats = rows * nb        # R * L / lanes exponential beats; anchors from element R * L
            # (pass0, set when the input transfer ended, doubles as "SFU command pending")
            m.d.comb += [
                sfu.cmd.valid.eq(pass0),
                sfu.cmd.payload.rows.eq(rows),
                sfu.cmd.payload.nb.eq(nb),
                sfu.i.valid.eq(in_rd.valid), sfu.i.payload.eq(in_rd.data), in_rd.ready.eq(sfu.i.ready),
                sfu.o.ready.eq(1),
                o_w.addr.eq(ptr),
                o_w.data.eq(sfu.o.payload),
                o_w.en.eq(Mux(sfu.o.valid, (1 << L) - 1, 0)),
            ]
            with m.If(sfu.cmd.valid & sfu.cmd.ready):
                m.d.sync += pass0.eq(0)
            with m.If(sfu.o.valid):
                m.d.sync += [ptr.eq(ptr + 1), y_cnt.eq(y_cnt + 1)]
            # Anchor writer: 3 elements at element index R*L + 3r; two cycles when they straddle a beat.
            a_elem = (n_beats << lsh) + anc_cnt * ANCHOR_ELEMS
            a_lane = a_elem[:lsh]
            a_word = a_elem >> lsh
            a_val = Cat(sfu.anchor.payload.max, sfu.anchor.payload.sum)
            second = Signal()
            straddle = a_lane > L - ANCHOR_ELEMS
            full_mask = (1 << L) - 1
            with m.If(~second):
                m.d.comb += [
                    o_wa.addr.eq(a_word),
                    o_wa.data.eq((a_val << (a_lane * 16))[:W]),
                    o_wa.en.eq(Mux(sfu.anchor.valid, (Const(0b111, L) << a_lane)[:L] & full_mask, 0)),
                    sfu.anchor.ready.eq(~straddle),
                ]
                with m.If(sfu.anchor.valid & straddle):
                    m.d.sync += second.eq(1)
            with m.Else():
                done_n = Signal(range(L + 1))          # anchor elements written in the first cycle
                m.d.comb += done_n.eq(L - a_lane)
                m.d.comb += [
                    o_wa.addr.eq(a_word + 1),
                    o_wa.data.eq((a_val >> (done_n * 16))[:W]),
                    o_wa.en.eq(Const(0b111, 3) >> done_n),
                    sfu.anchor.ready.eq(1),
                ]
                m.d.sync += second.eq(0)
            with m.If(sfu.anchor.valid & sfu.anchor.ready):
                m.d.sync += anc_cnt.eq(anc_cnt + 1)
            with m.If((y_cnt == n_beats) & (anc_cnt == rows) & ~pass0):
                anc_beats = (rows * ANCHOR_ELEMS + (L - 1)) >> lsh
                all_beats = (out_elems + (L - 1)) >> lsh
                m.d.sync += [
                    ret_start.eq(Mux(cmd.keep, n_beats, 0)),
                    ret_beats.eq(Mux(cmd.keep, anc_beats, all_beats)),
                    ret_elems.eq(Mux(cmd.keep, rows * ANCHOR_ELEMS, out_elems)),
                    state.eq(RETURN),
                ]
                m.d.comb += [o_rd.go.eq(1), o_rd.start.eq(Mux(cmd.keep, n_beats, 0)),
                             o_rd.count.eq(Mux(cmd.keep, anc_beats, all_beats))]
        with m.Elif(state == RETURN):
            last = ret_cnt == ret_beats - 1
            tail = ret_elems - ((ret_beats - 1) << lsh)        # valid elements of the last beat, 1..L
            lane_mask = Cat(*[Mux(last & (tail <= lane), Const(0, 16), Const(0xFFFF, 16)) for lane in range(L)])
            m.d.comb += [
                self.y.valid.eq(o_rd.valid),
                self.y.payload.eq(o_rd.data & lane_mask),
                o_rd.ready.eq(self.y.ready),
            ]
            with m.If(self.y.valid & self.y.ready):
                m.d.sync += ret_cnt.eq(ret_cnt + 1)
            with m.If(~o_rd.busy):
                m.d.sync += [ret_cnt.eq(0), state.eq(CPL)]
        with m.Else():  # CPL
            m.d.comb += [
                self.cpl.valid.eq(1),
                self.cpl.payload.seq.eq(cmd.seq),
                self.cpl.payload.status.eq(status),
            ]
            with m.If(self.cpl.ready):
                ok_keep = (status == ErrorCode.OK) & cmd.keep
                kept_n = Mux(c_is_sfu, rows * (nb << lsh), out_elems)
                m.d.sync += [kept.eq(Mux(ok_keep, kept_n, 0)), state.eq(IDLE)]
        return m
