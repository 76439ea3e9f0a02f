"""The CXL NDP device top: CSR bank, HDM queue engine, NDP core, per-queue memory guard, memory arbiter.

[PLoRA] IV-C: "The GPU writes the operand and descriptor into an HDM
submission queue over CXL.mem, writes a per-descriptor valid flag last, then rings a CXL.io MMIO doorbell ... the
doorbell is only a wakeup hint and the in-HDM valid flag is the ordering point"; "The device writes the result and
then a completion flag to HDM, which the GPU polls or takes as an MSI-X interrupt. Per-requester queues bound to a
PASID isolate concurrent GPUs, and per-queue base and limit registers check every device-side address."
Register map and queue memory layout: ``docs/cxl_regmap.md``; this module: ``docs/cxl_device.md``.

Architecture::

    mmio ──> CSRBank ──(queue registers, doorbells, HEAD/ERRORS, int_set)──> irq
    hmem ──> HostFilter ───────────────────┐   HostFilter: queue window + PASID check (rejected reads: zeros + err)
    queue engine ── desc / x ──> NDPCore ──┼── mem_req ──> MemoryGuard(window of the running queue) ──┐
         ^  └── header / input reads,      │                                                          v
         |      result / completion writes ┴───────────────> arbiter (round robin) ──> mem_req (controller)
         └──── y / cpl ───────────────────── NDPCore         <── responses routed by a FIFO ── mem_rsp

Queue engine (one descriptor at a time, queues visited round robin): for a queue with CTRL.enable,
SQ_ENTRIES != 0 and HEAD != tail (the last DOORBELL value) it reads the header line of slot HEAD. A valid word
other than ``valid_word(HEAD)`` means the GPU has not finished writing: the queue is re-polled after
:attr:`CXLDevice.repoll_cycles` (an early doorbell waits; a coalesced doorbell just leaves HEAD != tail for
several slots). A descriptor whose operand lines (its byte range rounded out to 64-byte lines, what the core
reads) are not inside [WIN_BASE, WIN_LIMIT) completes with :data:`WINDOW_VIOLATION` without reaching the core. Otherwise the slot's input area (at most the input
buffer's size) is staged, the descriptor goes to the core, the staged input feeds the core's ``x`` (a rejected
descriptor takes none; the rest is discarded), the result beats are written, packed, to the completion record's
result area, and finally the record header (seq, status, result bytes, completion flag) in one 64-byte write.
HEAD (and ERRORS for a status other than OK) then advance and INT_STATUS bit q is set.

The core's memory requests pass a :class:`MemoryGuard` loaded with the running queue's window, so even a
descriptor the window check let through cannot make the core touch memory outside it (formally proven for the
guard, ``docs/cxl_isolation.md``). With a queue window programmed, the CSR placement rules keep every enabled
queue's data window off it, so no device-side descriptor operand reaches a queue ring. The host's accesses pass
:class:`hdl.cxl.filter.HostFilter` (queue window + PASID check, also formally proven).
"""

from amaranth.hdl import Module, Signal, Const, Cat, Mux, Array
from amaranth.utils import exact_log2
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFOBuffered

from hdl.ndp.config import NDPConfig
from hdl.ndp.core import NDPCore
from hdl.ndp.descriptor import DESCRIPTOR_LAYOUT, DescType, DescOp, FLAG_CHAIN, DESCRIPTOR_BITS, ErrorCode
from .regmap import (RegisterMap, QueueLayout, COUNTER_BITS, SLOT_HEADER_BYTES, VALID_OFFSET, VALID_TAG,
                     CPL_HEADER_BYTES, CPL_SEQ_OFFSET, CPL_STATUS_OFFSET, CPL_RESULT_BYTES_OFFSET, CPL_FLAG_OFFSET,
                     CPL_FLAG_TAG)
from .csr import CSRBank, mmio_request_layout, MMIO_RESPONSE_LAYOUT
from .guard import MemoryGuard, WindowCheck
from .filter import HostFilter

__all__ = ["CXLDevice", "WINDOW_VIOLATION", "LINE_BYTES", "event_layout", "core_req_layout", "line_window_ok",
           "owner_of", "OWNER_QUEUE_BITS"]

#: Completion status of a descriptor whose operand lies outside its queue's window (the front end's code of
#: ``ErrorCode``; the completion record's status is a u32).
WINDOW_VIOLATION = ErrorCode.WINDOW_VIOLATION.value
#: CXL.mem line = the memory burst the device top is built for (64 B: DDR4/LPDDR5 BL8/BL16 x64 bursts).
LINE_BYTES = 64


#: Low bits of the NDP core's owner field that hold the queue index; the queue's PASID is above them.
OWNER_QUEUE_BITS = 8


def owner_of(queue: int, pasid: int) -> int:
    """The owner the device gives the core for a descriptor of ``queue`` bound to ``pasid``: kept results and
    partials belong to that queue *and* PASID (a queue re-bound to another requester cannot read them)."""
    return pasid << OWNER_QUEUE_BITS | queue


def line_window_ok(base_addr: int, size: int, win_base: int, win_limit: int, has_operand: bool = True) -> bool:
    """The queue engine's window check (Python mirror): the operand's whole 64-byte lines
    ``[floor64(base), ceil64(base + size))`` must lie in ``[win_base, win_limit)`` (the core reads whole bursts,
    so a byte-exact check would let a burst past an unaligned limit through to the guard, which drops it)."""
    if not has_operand:
        return True
    lo = base_addr - base_addr % LINE_BYTES
    hi = -(-(base_addr + size) // LINE_BYTES) * LINE_BYTES
    return win_base <= lo and hi <= win_limit and hi <= 1 << 64


def event_layout() -> data.StructLayout:
    """One posted completion: queue, submission index, status."""
    return data.StructLayout({"queue": 8, "index": COUNTER_BITS, "status": 8})


def core_req_layout(addr_bits) -> data.StructLayout:
    """One memory request of the NDP core that passed the guard, with the queue it ran for."""
    return data.StructLayout({"queue": 8, "addr": addr_bits, "write": 1})


class CXLDevice(wiring.Component):
    """The device for NDP core ``config`` and ``num_queues`` requester queues, on a memory controller with
    ``mem_addr_bits``-bit addresses of 64-byte bursts (``mem_tag_width`` as the controller's; responses must come
    back in request order: an in-order controller).

    Ports: ``mmio`` / ``mmio_rsp`` (CXL.io register access), ``hmem`` / ``hmem_rsp`` (CXL.mem line accesses of the
    GPU: ``{addr, write, wdata, pasid}`` -> ``{rdata, err}`` per read, in order; ``err``: the address filter
    rejected the read, ``rdata`` = 0), ``irq``, ``events`` (a completion record
    was written: ``event_layout``; never stalls the device: ``ready`` is ignored), ``core_req`` (every core
    memory request forwarded by the guard: ``core_req_layout``; ``ready`` ignored), ``mem_req`` / ``mem_rsp``.
    """

    #: Cycles before a queue whose slot was not valid yet is polled again (design choice: long enough that a
    #: re-poll costs < 10 % of the memory port while the GPU finishes its stores, short against a descriptor).
    repoll_cycles = 32

    def __init__(self, *, config: NDPConfig, num_queues: int, mem_addr_bits: int, mem_tag_width: int = 0):
        if not isinstance(config, NDPConfig):
            raise ValueError(f"config must be an NDPConfig, got {config!r}")
        if not 1 <= num_queues <= 64:
            raise ValueError(f"num_queues must be in 1..64, got {num_queues}")
        self.config = config
        self.num_queues = num_queues
        self.regmap = RegisterMap(num_queues)
        self.layout = QueueLayout.for_config(config)
        self.mem_addr_bits = mem_addr_bits
        self.burst_bits = 8 * LINE_BYTES
        self.csr = CSRBank(self.regmap, layout=self.layout)
        self.core = NDPCore(config=config, mem_burst_bits=self.burst_bits, mem_addr_bits=mem_addr_bits,
                            mem_tag_width=mem_tag_width)
        self.guard = MemoryGuard(mem_addr_bits, LINE_BYTES, data_bits=self.burst_bits, tag_width=mem_tag_width)
        self.request_layout = self.core.request_layout
        self.response_layout = self.core.response_layout
        self.filter = HostFilter(num_queues, mem_addr_bits, self.layout, data_bits=self.burst_bits)
        # host CXL.mem request: line address, write, data, and the requester's PASID (hdl/cxl/filter.py)
        self.hmem_layout = self.filter.request_layout
        self.engine_layout = data.StructLayout({"addr": mem_addr_bits, "write": 1, "wdata": self.burst_bits})
        super().__init__({
            "mmio": In(stream.Signature(mmio_request_layout(self.regmap.addr_bits))),
            "mmio_rsp": Out(stream.Signature(MMIO_RESPONSE_LAYOUT)),
            "hmem": In(stream.Signature(self.hmem_layout)),
            "hmem_rsp": Out(stream.Signature(data.StructLayout({"rdata": self.burst_bits, "err": 1}))),
            "irq": Out(1),
            "events": Out(stream.Signature(event_layout())),
            "core_req": Out(stream.Signature(core_req_layout(mem_addr_bits))),
            "mem_req": Out(stream.Signature(self.request_layout)),
            "mem_rsp": In(stream.Signature(self.response_layout)),
        })

    def elaborate(self, platform):
        cfg, N = self.config, self.num_queues
        A, B = self.mem_addr_bits, self.burst_bits
        L = cfg.lanes
        W = 16 * L
        P = B // W                                   # core beats per line
        lay = self.layout
        m = Module()
        m.submodules.csr = csr = self.csr
        m.submodules.core = core = self.core
        m.submodules.guard = guard = self.guard
        m.submodules.hfilter = hf = self.filter
        wiring.connect(m, wiring.flipped(self.mmio), csr.mmio)
        wiring.connect(m, wiring.flipped(self.hmem), hf.i)
        for q in range(N):
            fq, cq_ = hf.queue[q], csr.queue[q]
            m.d.comb += [fq.sq_base.eq(cq_.sq_base), fq.sq_entries.eq(cq_.sq_entries), fq.cq_base.eq(cq_.cq_base),
                         fq.pasid.eq(cq_.pasid), fq.enable.eq(cq_.ctrl.enable)]
        m.d.comb += [hf.qwin_base.eq(csr.qwin_base), hf.qwin_limit.eq(csr.qwin_limit),
                     csr.hmem_rejects.eq(hf.rejects)]
        wiring.connect(m, wiring.flipped(self.mmio_rsp), csr.rsp)
        m.d.comb += self.irq.eq(csr.irq)

        # ---- per-queue state: tail (last doorbell), HEAD, ERRORS, re-poll countdown
        tail = Array(Signal(COUNTER_BITS, name=f"tail{q}") for q in range(N))
        head = Array(Signal(COUNTER_BITS, name=f"head{q}") for q in range(N))
        errs = Array(Signal(COUNTER_BITS, name=f"errors{q}") for q in range(N))
        wait = Array(Signal(range(self.repoll_cycles + 1), name=f"repoll{q}") for q in range(N))
        for q in range(N):
            with m.If(csr.doorbell[q].valid):
                m.d.sync += tail[q].eq(csr.doorbell[q].tail)
            with m.If(wait[q] != 0):
                m.d.sync += wait[q].eq(wait[q] - 1)
            m.d.comb += [csr.head[q].eq(head[q]), csr.errors[q].eq(errs[q])]
        qregs = Array(csr.queue[q] for q in range(N))

        # ---- engine memory port (requests / responses) and the arbiter
        e_req = stream.Signature(self.engine_layout).create(path=("e_req",))
        e_rsp_valid, e_rsp_ready = Signal(), Signal()
        h_rsp_ready = self.hmem_rsp.ready
        c_rsp_ready = core.mem_rsp.ready
        wiring.connect(m, core.mem_req, guard.i)
        m.d.comb += guard.violation.ready.eq(1)

        # source 0: the host (after the address filter; a rejected read is answered without a memory access)
        h_rej = hf.o.payload.reject
        srcs = [(hf.o.valid, hf.o.payload.addr, hf.o.payload.write, hf.o.payload.wdata),
                (e_req.valid, e_req.payload.addr, e_req.payload.write, e_req.payload.wdata),
                (guard.o.valid, guard.o.payload.addr, guard.o.payload.write, guard.o.payload.wdata)]
        readies = [hf.o.ready, e_req.ready, guard.o.ready]
        NS = len(srcs)
        # source of every read in flight, in request order (design choice: 64 > the controller's 16 queued
        # requests + its response buffer, so the FIFO never limits the reads in flight)
        m.submodules.route = route = SyncFIFOBuffered(width=2, depth=64)
        rr = Signal(range(NS))
        grant = Signal(NS)
        # round robin: the first requester at or after rr (reads need room in the route FIFO)
        elig = [Signal(name=f"elig{i}") for i in range(NS)]
        for i, (v, _, w, _) in enumerate(srcs):
            m.d.comb += elig[i].eq(v & (w | route.w_rdy))
        for start in range(NS):
            with m.If(rr == start):
                taken = Const(0)
                for k in range(NS):
                    i = (start + k) % NS
                    m.d.comb += grant[i].eq(elig[i] & ~taken)
                    taken = taken | elig[i]
        skip = Signal()                              # a rejected host read takes its turn without memory
        m.d.comb += [skip.eq(grant[0] & h_rej), self.mem_req.valid.eq(grant.any() & ~skip)]
        sel_addr, sel_write, sel_wdata = Signal(A), Signal(), Signal(B)
        for i, (v, a, w, d) in enumerate(srcs):
            with m.If(grant[i]):
                m.d.comb += [sel_addr.eq(a), sel_write.eq(w), sel_wdata.eq(d)]
            m.d.comb += readies[i].eq(grant[i] & (self.mem_req.ready | (skip if i == 0 else 0)))
        # one assignment of the whole payload (tags 0: responses return in request order)
        m.d.comb += self.mem_req.payload.as_value().eq(
            Cat(sel_addr, sel_write, sel_wdata, Const(0, len(self.mem_req.payload.as_value()) - A - 1 - B)))
        fire = self.mem_req.valid & self.mem_req.ready
        with m.If(fire | skip):
            m.d.sync += rr.eq(Mux(rr == NS - 1, 0, rr + 1))
        # route FIFO: 0 host, 1 engine, 2 core, 3 host read rejected by the filter (no memory response)
        m.d.comb += [
            route.w_en.eq((fire & ~self.mem_req.payload.write) | skip),
            route.w_data.eq(Mux(skip, 3, Mux(grant[0], 0, Mux(grant[1], 1, 2)))),
        ]
        dest = route.r_data
        rsp_ok = self.mem_rsp.valid & route.r_rdy
        rej_rsp = route.r_rdy & (dest == 3)
        m.d.comb += [
            self.hmem_rsp.valid.eq((rsp_ok & (dest == 0)) | rej_rsp),
            self.hmem_rsp.payload.rdata.eq(Mux(dest == 3, 0, self.mem_rsp.payload.rdata)),
            self.hmem_rsp.payload.err.eq(dest == 3),
            e_rsp_valid.eq(rsp_ok & (dest == 1)),
            core.mem_rsp.valid.eq(rsp_ok & (dest == 2)),
            core.mem_rsp.payload.eq(self.mem_rsp.payload),
            self.mem_rsp.ready.eq(route.r_rdy & Mux(dest == 0, h_rsp_ready, Mux(dest == 1, e_rsp_ready,
                                                                               Mux(dest == 2, c_rsp_ready, 0)))),
            route.r_en.eq((self.mem_rsp.valid & self.mem_rsp.ready) | (rej_rsp & h_rsp_ready)),
        ]
        e_rdata = self.mem_rsp.payload.rdata

        # ---- engine state
        cur = Signal(range(max(N, 2)))
        idx = Signal(COUNTER_BITS)
        desc = Signal(DESCRIPTOR_LAYOUT)
        status = Signal(8)
        slot_line = Signal(A)                        # line address of the slot header
        cpl_line = Signal(A)                         # line address of the completion record header
        in_lines = Signal(range(lay.input_bytes // LINE_BYTES + 1))
        issued = Signal.like(in_lines)
        got = Signal.like(in_lines)
        y_beats = Signal(range(lay.result_bytes // 16 + 2))
        res_lines = Signal(range(lay.result_bytes // LINE_BYTES + 2))
        qr = qregs[cur]
        m.d.comb += [guard.win_base.eq(qr.win_base), guard.win_limit.eq(qr.win_limit)]

        # staging buffer of the slot's input lines
        stage_depth = max(lay.input_bytes // LINE_BYTES, 2)
        m.submodules.stage = stage = memory.Memory(shape=B, depth=stage_depth, init=[])
        st_w = stage.write_port()
        st_r = stage.read_port()
        st_ptr = Signal(range(stage_depth + 1))      # next line to read out
        st_hold = Signal(B)                          # line being fed to x
        st_hold_valid = Signal()
        st_beat = Signal(range(max(P, 2)))
        st_rd_pending = Signal()

        # result packer
        line = Signal(B)
        line_n = Signal(range(P + 1))
        line_full = Signal()

        slot_mask = qr.sq_entries - 1
        slot_bytes_lines = lay.slot_bytes // LINE_BYTES
        cpl_bytes_lines = lay.cpl_bytes // LINE_BYTES

        IDLE, HDR, HDR_WAIT, CHECK, STAGE, PUSH, RUN, CPL, DONE = range(9)
        state = Signal(range(9), name="eng_state")
        ready_q = qr.ctrl.enable & (qr.sq_entries != 0) & (head[cur] != tail[cur]) & (wait[cur] == 0)

        with m.If(state == IDLE):
            with m.If(ready_q):
                m.d.sync += [
                    idx.eq(head[cur]),
                    slot_line.eq((qr.sq_base >> 6) + (head[cur] & slot_mask) * slot_bytes_lines),
                    cpl_line.eq((qr.cq_base >> 6) + (head[cur] & slot_mask) * cpl_bytes_lines),
                    state.eq(HDR),
                ]
            with m.Else():
                m.d.sync += cur.eq(Mux(cur == N - 1, 0, cur + 1))
        with m.Elif(state == HDR):
            m.d.comb += [e_req.valid.eq(1), e_req.payload.addr.eq(slot_line), e_req.payload.write.eq(0)]
            with m.If(e_req.ready):
                m.d.sync += state.eq(HDR_WAIT)
        with m.Elif(state == HDR_WAIT):
            m.d.comb += e_rsp_ready.eq(1)
            with m.If(e_rsp_valid):
                valid_word = e_rdata[8 * VALID_OFFSET:8 * VALID_OFFSET + 64]
                with m.If(valid_word == (Const(VALID_TAG, 64) | idx)):
                    m.d.sync += [desc.as_value().eq(e_rdata[:DESCRIPTOR_BITS]), state.eq(CHECK)]
                with m.Else():
                    m.d.sync += [state.eq(IDLE), cur.eq(Mux(cur == N - 1, 0, cur + 1))]
                    for q in range(N):          # (explicit per queue: no incomplete case statements)
                        with m.If(cur == q):
                            m.d.sync += wait[q].eq(self.repoll_cycles)
        with m.Elif(state == CHECK):
            h = desc.header
            is_rc = h.type == DescType.READ_COMPUTE
            has_operand = ~(is_rc & (h.op == DescOp.SOFTMAX))
            # the operand's whole 64-byte lines: the core reads (and the guard checks) whole bursts
            lo = Cat(Const(0, 6), desc.base_addr[6:])
            span = ((desc.base_addr[:6] + desc.operand.bytes + (LINE_BYTES - 1)) >> 6) << 6
            ok = WindowCheck.check(lo, span, qr.win_base, qr.win_limit, has_operand)
            gpu_input = ((h.type == DescType.STORE) | is_rc) & ((h.flags & FLAG_CHAIN) == 0)
            # the x stream: a READ_COMPUTE's rows each padded to whole beats, a STORE's bytes
            row_beats = (desc.input.dim1 + (L - 1)) >> exact_log2(L)
            in_bytes = Mux(is_rc, desc.input.dim0 * row_beats * (2 * L), desc.input.bytes)
            nlines = (in_bytes + (LINE_BYTES - 1)) >> 6
            cap = lay.input_bytes // LINE_BYTES
            m.d.sync += [issued.eq(0), got.eq(0), y_beats.eq(0), res_lines.eq(0), line_n.eq(0),
                         line_full.eq(0), st_ptr.eq(0), st_hold_valid.eq(0), st_beat.eq(0), st_rd_pending.eq(0)]
            with m.If(~ok):
                m.d.sync += [status.eq(WINDOW_VIOLATION), state.eq(CPL)]
            with m.Else():
                m.d.sync += [in_lines.eq(Mux(gpu_input, Mux(nlines > cap, cap, nlines), 0)), state.eq(STAGE)]
        with m.Elif(state == STAGE):
            m.d.comb += [
                e_req.valid.eq(issued != in_lines),
                e_req.payload.addr.eq(slot_line + SLOT_HEADER_BYTES // LINE_BYTES + issued),
                e_req.payload.write.eq(0),
                e_rsp_ready.eq(1),
                st_w.addr.eq(got), st_w.data.eq(e_rdata), st_w.en.eq(e_rsp_valid),
            ]
            with m.If(e_req.valid & e_req.ready):
                m.d.sync += issued.eq(issued + 1)
            with m.If(e_rsp_valid):
                m.d.sync += got.eq(got + 1)
            with m.If(got == in_lines):
                m.d.sync += state.eq(PUSH)
        with m.Elif(state == PUSH):
            # the owner of any state the descriptor keeps or uses: this queue and its PASID
            m.d.comb += [core.desc.valid.eq(1), core.desc.payload.desc.eq(desc),
                         core.desc.payload.owner.eq(Cat(cur, Const(0, OWNER_QUEUE_BITS - len(cur)), qr.pasid))]
            with m.If(core.desc.ready):
                m.d.sync += state.eq(RUN)
        with m.Elif(state == RUN):
            # x: staged lines, P beats each
            m.d.comb += [st_r.addr.eq(st_ptr), st_r.en.eq(1)]
            with m.If(~st_hold_valid & ~st_rd_pending & (st_ptr != in_lines)):
                m.d.sync += [st_rd_pending.eq(1), st_ptr.eq(st_ptr + 1)]
            with m.If(st_rd_pending):
                m.d.sync += [st_hold.eq(st_r.data), st_hold_valid.eq(1), st_rd_pending.eq(0), st_beat.eq(0)]
            m.d.comb += [core.x.valid.eq(st_hold_valid),
                         core.x.payload.eq(st_hold.word_select(st_beat, W) if P > 1 else st_hold)]
            with m.If(core.x.valid & core.x.ready):
                with m.If(st_beat == P - 1):
                    m.d.sync += st_hold_valid.eq(0)
                with m.Else():
                    m.d.sync += st_beat.eq(st_beat + 1)
            # y -> result lines
            m.d.comb += core.y.ready.eq(~line_full)
            with m.If(core.y.valid & ~line_full):
                m.d.sync += [line.eq(Cat(line[W:], core.y.payload) if P > 1 else core.y.payload),
                             line_n.eq(line_n + 1), y_beats.eq(y_beats + 1)]
                with m.If(line_n == P - 1):
                    m.d.sync += line_full.eq(1)
            m.d.comb += [
                e_req.valid.eq(line_full),
                e_req.payload.addr.eq(cpl_line + CPL_HEADER_BYTES // LINE_BYTES + res_lines),
                e_req.payload.write.eq(1),
                e_req.payload.wdata.eq(line),
            ]
            with m.If(e_req.valid & e_req.ready):
                m.d.sync += [line_full.eq(0), line_n.eq(0), res_lines.eq(res_lines + 1), line.eq(0)]
            # completion from the core: flush a partial line first
            m.d.comb += core.cpl.ready.eq(~line_full & (line_n == 0))
            with m.If(~line_full & (line_n != 0) & core.cpl.valid):
                # shift the partial line down into place (beats enter at the top)
                m.d.sync += line_full.eq(1)
                for n in range(1, P):
                    with m.If(line_n == n):
                        m.d.sync += line.eq(line >> (W * (P - n)))
            with m.If(core.cpl.valid & core.cpl.ready):
                m.d.sync += [status.eq(core.cpl.payload.status.as_value()), state.eq(CPL)]
        with m.Elif(state == CPL):
            hdr = Signal(B)
            m.d.comb += hdr.eq(
                (idx.as_unsigned() << (8 * CPL_SEQ_OFFSET))
                | (status.as_unsigned() << (8 * CPL_STATUS_OFFSET))
                | ((y_beats * (2 * L)) << (8 * CPL_RESULT_BYTES_OFFSET))
                | ((Const(CPL_FLAG_TAG, 64) | idx) << (8 * CPL_FLAG_OFFSET)))
            m.d.comb += [e_req.valid.eq(1), e_req.payload.addr.eq(cpl_line), e_req.payload.write.eq(1),
                         e_req.payload.wdata.eq(hdr)]
            with m.If(e_req.ready):
                m.d.sync += state.eq(DONE)
        with m.Else():  # DONE
            m.d.sync += [state.eq(IDLE), cur.eq(Mux(cur == N - 1, 0, cur + 1))]
            for q in range(N):
                with m.If(cur == q):
                    m.d.sync += head[q].eq(head[q] + 1)
                    with m.If(status != 0):
                        m.d.sync += errs[q].eq(errs[q] + 1)
            m.d.comb += csr.int_set.eq((Const(1, N) << cur)[:N])

        # ---- observation streams (never stall the device)
        m.d.comb += [
            self.events.valid.eq(state == DONE),
            self.events.payload.queue.eq(cur), self.events.payload.index.eq(idx),
            self.events.payload.status.eq(status),
            self.core_req.valid.eq(guard.o.valid & guard.o.ready),
            self.core_req.payload.queue.eq(cur), self.core_req.payload.addr.eq(guard.o.payload.addr),
            self.core_req.payload.write.eq(guard.o.payload.write),
        ]
        return m
