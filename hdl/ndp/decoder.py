"""Instruction buffer and descriptor decoder of the PLoRA NDP core (Fig. 5(c): instruction buffer -> decoder
-> control unit; [PLoRA] Section IV-B).

Architecture::

    i ──> InstructionBuffer (SyncFIFOBuffered, config.instr_buffer_depth descriptors)
      ──> stage 1: products dim0*dim1 (operand, input), result rows*cols; decoded type/op flags; seq number
      ──> stage 2: the checks of ErrorCode, priority-encoded (lowest failing code wins); the command
      ──> o  (command_layout(config): status + seq, and the decoded fields when status is OK)

Every descriptor produces exactly one output, in order: a decoded command (status OK) or a completion with its
:class:`ErrorCode` (every other field 0), so a rejected descriptor never reaches the control unit's memory
requests (it forwards OK commands only) and never stalls the descriptors behind it. The checks, their
precedence and the shape conventions are documented in :mod:`hdl.ndp.descriptor` and mirrored by
``firmware.ndp.descriptor.Descriptor.validate``.

Latency: a descriptor accepted on ``i`` in cycle t is offered on ``o`` in cycle t + :attr:`latency` (4: 2 cycles
through the buffered FIFO + 2 pipeline stages) when the buffer is empty and ``o`` ready; throughput one
descriptor per cycle. The pipeline is lock-step (``hdl.fp.pipeline``): no combinational path from ``i`` to
``o``.
"""

from amaranth.hdl import Module, Signal, Mux, Const
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFOBuffered

from ..fp.pipeline import Pipeline
from .config import NDPConfig
from .descriptor import (REQUEST_LAYOUT, SEQ_BITS, DescType, DescOp, DType, ELEMENT_BYTES, ErrorCode,
                         DECODER_CODES, ANCHOR_ELEMS, FLAG_KEEP, FLAG_CHAIN, FLAG_ACC, FLAG_PARTIAL, FLAG_TRANS,
                         FLAG_GROUP, FLAG_NARROW, command_layout)

__all__ = ["InstructionBuffer", "DescriptorDecoder"]


def _check_config(config):
    if not isinstance(config, NDPConfig):
        raise ValueError(f"config must be an NDPConfig, got {config!r}")


class InstructionBuffer(wiring.Component):
    """FIFO of ``config.instr_buffer_depth`` descriptors (PLoRA Fig. 5(c) "instruction buffer").

    Ports: ``i``: In(stream of REQUEST_LAYOUT); ``o``: Out(stream of REQUEST_LAYOUT), registered output
    (a descriptor accepted in cycle t is offered in cycle t + :attr:`latency` when the buffer was empty).
    Full throughput: one descriptor per cycle in and out.
    """

    latency = 2   # amaranth SyncFIFOBuffered: storage write, then its output register (measured by the tests)

    def __init__(self, *, config: NDPConfig):
        _check_config(config)
        self.config = config
        self.depth = config.instr_buffer_depth
        super().__init__({
            "i": In(stream.Signature(REQUEST_LAYOUT)),
            "o": Out(stream.Signature(REQUEST_LAYOUT)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=REQUEST_LAYOUT.size, depth=self.depth)
        m.d.comb += [
            fifo.w_data.eq(self.i.payload.as_value()),
            fifo.w_en.eq(self.i.valid),
            self.i.ready.eq(fifo.w_rdy),
            self.o.payload.eq(fifo.r_data),
            self.o.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(self.o.ready),
        ]
        return m


class DescriptorDecoder(wiring.Component):
    """Instruction buffer + descriptor checks for an :class:`NDPConfig` ``config``.

    Ports: ``i``: In(stream of REQUEST_LAYOUT: a descriptor and its owner); ``o``: Out(stream of
    ``command_layout(config)``).
    Attribute :attr:`latency`: cycles from acceptance on ``i`` to the result on ``o`` (unloaded).
    """

    latency = InstructionBuffer.latency + 2   # + stage 1 (products) + stage 2 (checks, command)

    def __init__(self, *, config: NDPConfig):
        _check_config(config)
        self.config = config
        self.command_layout = command_layout(config)
        super().__init__({
            "i": In(stream.Signature(REQUEST_LAYOUT)),
            "o": Out(stream.Signature(self.command_layout)),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        m.submodules.buffer = buf = InstructionBuffer(config=cfg)
        wiring.connect(m, wiring.flipped(self.i), buf.i)

        src = buf.o
        pipe = Pipeline(m, src, self.o)

        seq = Signal(SEQ_BITS)
        with m.If(src.valid & src.ready):
            m.d.sync += seq.eq(seq + 1)

        # ---- stage 1: decode the codes, the products ----
        L = cfg.lanes
        lsh = L.bit_length() - 1
        d = src.payload.desc
        h, opd, inp = d.header, d.operand, d.input
        is_load = h.type == DescType.LOAD
        is_store = h.type == DescType.STORE
        is_rc = h.type == DescType.READ_COMPUTE
        is_gemv = is_rc & (h.op == DescOp.GEMV)
        is_gemm = is_rc & (h.op == DescOp.GEMM)
        is_softmax = is_rc & (h.op == DescOp.SOFTMAX)
        is_mm = is_gemv | is_gemm
        flags = h.flags
        keep, partial = (flags & FLAG_KEEP) != 0, (flags & FLAG_PARTIAL) != 0
        # GROUP (a core with group_lanes): the input, the result and the kept result are rows of W packed into
        # beats (R W / lanes beats), and a GEMM's result is R x W
        grp = (((flags & FLAG_GROUP) != 0) & (is_gemm | is_softmax)) if cfg.group_lanes else Const(0)
        # NARROW (a core with group_narrow, on a GROUP descriptor): W / 2 in place of W (else BAD_FLAGS, the shapes
        # checked at W)
        nar = (grp & ((flags & FLAG_NARROW) != 0)) if cfg.group_narrow else Const(0)
        gw = Mux(nar, cfg.group_lanes // 2, cfg.group_lanes) if cfg.group_narrow else Const(cfg.group_lanes)
        # Result shape rows x cols (descriptor module table): LOAD R x C, GEMV 1 x N, GEMM B x N (GROUP: R x W),
        # SOFTMAX R x (L + ANCHOR_ELEMS), STORE nothing; kept shape: GEMV/GEMM the result, SOFTMAX R x L.
        res_rows = Mux(is_load, opd.dim0, Mux(is_softmax | is_gemm, inp.dim0, Mux(is_gemv, 1, 0)))
        res_cols = Mux(is_softmax, inp.dim1, Mux(grp, gw, opd.dim1))
        out_cols = Mux(is_softmax, inp.dim1 + ANCHOR_ELEMS, res_cols)
        col_beats = (res_cols + (L - 1)) >> lsh
        in_row_beats = (inp.dim1 + (L - 1)) >> lsh
        s1 = pipe.stage(
            desc=d, owner=src.payload.owner, seq=seq,
            is_load=is_load, is_store=is_store, is_rc=is_rc,
            is_gemv=is_gemv, is_gemm=is_gemm, is_softmax=is_softmax, is_mm=is_mm,
            op_known=(h.op == DescOp.GEMV) | (h.op == DescOp.GEMM) | (h.op == DescOp.SOFTMAX),
            operand_elems=opd.dim0 * opd.dim1,
            input_elems=inp.dim0 * inp.dim1,
            output_elems=res_rows * out_cols,
            result_elems=res_rows * res_cols,
            kept_beats=Mux(grp, (res_rows * res_cols) >> lsh, res_rows * col_beats),
            col_beats=col_beats,
            rc_input_beats=Mux(grp, (inp.dim0 * inp.dim1) >> lsh, inp.dim0 * in_row_beats), grp=grp, nar=nar, gw=gw,
            anchor_elems=inp.dim0 * ANCHOR_ELEMS,
        )

        # ---- stage 2: checks in ErrorCode order, priority encoder, command ----
        d = s1.desc
        h, opd, inp = d.header, d.operand, d.input
        flags = h.flags
        keep, chain = (flags & FLAG_KEEP) != 0, (flags & FLAG_CHAIN) != 0
        acc, partial, trans = (flags & FLAG_ACC) != 0, (flags & FLAG_PARTIAL) != 0, (flags & FLAG_TRANS) != 0
        group, grp = (flags & FLAG_GROUP) != 0, s1.grp
        narrow, nar = (flags & FLAG_NARROW) != 0, s1.nar
        esize = ELEMENT_BYTES[DType.FP16]       # the only accepted dtype (UNKNOWN_DTYPE otherwise)
        has_input = s1.is_store | s1.is_rc
        has_operand = ~s1.is_softmax
        # GROUP: a GEMM's operand is K x lanes with K = n W (n x words per PE row, at most the PE array's x
        # memory, ceil(max_k / lanes) words) and its input rows of K, a SOFTMAX's rows W long, the rows a
        # multiple of the segments g = lanes / W (whole beats)
        # (NARROW: W / 2 and 2 g, s1.gw the descriptor's W)
        if cfg.group_lanes:
            gseg, xw = cfg.group_segments, -(-cfg.max_k // L)

            def at_width(value):
                """``value(W, g)`` at the descriptor's segment width (a constant per width)."""
                wide = value(cfg.group_lanes, gseg)
                return Mux(nar, value(cfg.group_lanes // 2, 2 * gseg), wide) if cfg.group_narrow else Const(wide)
            rows_bad = (inp.dim0 & at_width(lambda w, g: g - 1)) != 0
            k_bad = ((opd.dim0 & at_width(lambda w, g: w - 1)) != 0) | (opd.dim0 > at_width(lambda w, g: w * xw))
            grp_gemm_bad = k_bad | (opd.dim0 == 0) | (opd.dim1 != cfg.lanes) | rows_bad
            grp_sm_bad = (inp.dim1 != s1.gw) | rows_bad
        else:
            grp_gemm_bad = grp_sm_bad = Const(0)
        shape_bad = Mux(
            s1.is_store, (inp.dim0 != opd.dim0) | (inp.dim1 != opd.dim1),
            Mux(s1.is_gemv, (inp.dim0 != 1) | (inp.dim1 != opd.dim0),
                Mux(s1.is_gemm, (inp.dim1 != opd.dim0) | (grp & grp_gemm_bad), s1.is_softmax & grp & grp_sm_bad)))
        lane_mask, align_mask = L - 1, cfg.align_bytes - 1
        k, n = opd.dim0, opd.dim1
        trans_ok = ((k & lane_mask) == 0) | ((k == L // 2) & ~n[0])
        row_ok = ((n & lane_mask) == 0) | ((n == L // 2) & ~k[0])
        # SOFTMAX rows of whole beats, or with KEEP and an SFU at most half a beat wide rows of half a beat
        half_sm = ((inp.dim1 == L // 2) & keep) if 2 * cfg.sfu_lanes <= L else Const(0)
        not_multiple = Mux(
            s1.is_mm, Mux(trans, ~trans_ok, ~row_ok),
            Mux(s1.is_softmax, ((inp.dim1 & lane_mask) != 0) & ~half_sm & ~grp,
                s1.is_store & ((opd.bytes & align_mask) != 0)))
        store_beats = (inp.bytes + (2 * L - 1)) >> (lsh + 1)
        input_beats = Mux(s1.is_store, store_beats, Mux(s1.is_rc, s1.rc_input_beats, 0))
        input_big = has_input & ((inp.bytes > cfg.input_buffer_bytes)
                                 | (input_beats > cfg.input_buffer_bytes // (2 * L))
                                 | ((s1.is_mm | s1.is_softmax) & (inp.dim1 > cfg.max_k)))
        ret_elems = Mux(s1.is_load, s1.operand_elems,
                        Mux(s1.is_mm, Mux(keep | partial, 0, s1.output_elems),
                            Mux(s1.is_softmax, Mux(keep, s1.anchor_elems, s1.output_elems), 0)))
        ret_beats = (ret_elems + (L - 1)) >> lsh
        output_big = ((ret_beats > cfg.output_buffer_bytes // (2 * L))
                      | (s1.is_rc & keep & (s1.kept_beats > cfg.kept_slot_bytes // (2 * L)))
                      | (s1.is_mm & (acc | partial) & (s1.result_elems > cfg.partial_slot_elems))
                      | (s1.is_mm & ~trans & (s1.col_beats > cfg.acc_columns)))
        # GROUP: GEMM and SOFTMAX of a core with group_lanes, never with TRANS / ACC / PARTIAL
        bad_group = (group & (~grp | trans | acc | partial)) | (narrow & ~nar)
        bad_flags = Mux(~s1.is_rc, flags != 0,
                        Mux(s1.is_softmax, acc | partial | trans | bad_group,
                            ((acc | partial) & ~trans) | (keep & partial) | bad_group))
        checks = {
            ErrorCode.UNKNOWN_TYPE: ~(s1.is_load | s1.is_store | s1.is_rc),
            ErrorCode.UNKNOWN_OP: Mux(s1.is_rc, ~s1.op_known, h.op != DescOp.NONE),
            ErrorCode.UNKNOWN_DTYPE: h.dtype != DType.FP16,
            ErrorCode.ZERO_DIMENSION: (has_operand & ((opd.dim0 == 0) | (opd.dim1 == 0)))
                                      | (has_input & ((inp.dim0 == 0) | (inp.dim1 == 0))),
            ErrorCode.SIZE_MISMATCH: (has_operand & (opd.bytes != s1.operand_elems * esize))
                                     | (has_input & (inp.bytes != s1.input_elems * esize)),
            ErrorCode.OPERAND_TOO_LARGE: has_operand & (opd.bytes > cfg.dram_buffer_bytes),
            ErrorCode.INPUT_TOO_LARGE: input_big,
            ErrorCode.ADDRESS_OVERFLOW: has_operand & ((d.base_addr + opd.bytes) > Const(cfg.device_bytes, 65)),
            ErrorCode.SHAPE_MISMATCH: shape_bad,
            ErrorCode.BATCH_TOO_LARGE: s1.is_gemm & (inp.dim0 > cfg.max_batch),
            ErrorCode.OUTPUT_TOO_LARGE: output_big,
            ErrorCode.MISALIGNED: has_operand & ((d.base_addr & align_mask) != 0),
            ErrorCode.NOT_MULTIPLE: not_multiple,
            ErrorCode.BAD_FLAGS: bad_flags,
        }
        assert tuple(checks) == DECODER_CODES   # precedence = value order
        status = Signal(ErrorCode)
        code = Const(ErrorCode.OK.value, ErrorCode.as_shape().width)
        for err in reversed(list(checks)):
            code = Mux(checks[err], err.value, code)
        m.d.comb += status.eq(code)

        ok = status == ErrorCode.OK
        cmd = Signal(self.command_layout)
        m.d.comb += [cmd.status.eq(status), cmd.seq.eq(s1.seq), cmd.owner.eq(s1.owner)]
        with m.If(ok):
            m.d.comb += [
                cmd.type.eq(h.type),
                cmd.op.eq(h.op),
                cmd.dtype.eq(h.dtype),
                cmd.keep.eq(keep), cmd.chain.eq(chain), cmd.acc.eq(acc), cmd.partial.eq(partial),
                cmd.trans.eq(trans), cmd.group.eq(grp), cmd.narrow.eq(nar),
                cmd.output_elems.eq(s1.output_elems),
                cmd.input_beats.eq(input_beats),
                cmd.ret_elems.eq(ret_elems),
            ]
            with m.If(has_operand):
                m.d.comb += [
                    cmd.base_addr.eq(d.base_addr),
                    cmd.operand_dim0.eq(opd.dim0),
                    cmd.operand_dim1.eq(opd.dim1),
                    cmd.operand_elems.eq(s1.operand_elems),
                ]
            with m.If(has_input):
                m.d.comb += [
                    cmd.input_dim0.eq(inp.dim0),
                    cmd.input_dim1.eq(inp.dim1),
                    cmd.input_elems.eq(s1.input_elems),
                ]
        s2 = pipe.stage(cmd=cmd)
        assert InstructionBuffer.latency + pipe.latency == self.latency
        pipe.output()
        m.d.comb += self.o.payload.eq(s2.cmd)
        return m
