"""Streaming GEMV/GEMM PE array of the NDP compute unit: ``Y[b, n] = sum_k X[b, k] * A[k, n]``.

See ``docs/ndp_pe_array.md`` for the architecture, the cycle formula and measured figures.

Dataflow (one job = one ``cmd``):

1. ``cmd`` gives the job shape ``rows`` = B (1..batch), ``k`` = K (1..max_k), ``nb`` = N / lanes
   (1..max_n / lanes).
2. LOAD: ``x`` delivers X (the GPU-supplied input) row by row, ``ceil(K / lanes)`` beats per row, beat ``q``
   of row ``b`` holding ``X[b, q*lanes + l]`` in lane ``l`` (lanes past K are padding and ignored). They
   go into the input buffer, one memory word per ``q`` holding every batch row (write granularity
   ``lanes * 16`` bits).
3. COMPUTE: ``a`` delivers A (device-resident, K x N, row-major) as ``K * nb`` beats in order: row k,
   columns ``j*lanes .. j*lanes+lanes-1`` for ``j = 0..nb-1``. Each accepted beat issues ``B * lanes``
   FPMACs at once: PE (b, l) computes ``acc[b][j][l] = mac(X[b, k], A[k, j*lanes+l], acc[b][j][l])``, with
   ``acc = +0`` for ``k = 0``. Accumulators live in one memory (depth ``max_n / lanes``, one word =
   ``batch * lanes`` accumulators), read when the beat is accepted and written back 8 cycles later. The
   ``nb`` accumulators of a row are independent, so for ``nb >= 8`` the loop never stalls; for
   ``nb < 8`` a 7-entry in-flight scoreboard holds ``a.ready`` low until the accumulator is written back.
4. DRAIN: once the FPMAC pipelines are empty, ``y`` returns ``B * nb`` beats in the accumulator format,
   row-major: beat ``b * nb + j`` holds ``Y[b, j*lanes + l]`` in lane ``l``.

Every floating-point operation is an :class:`hdl.fp.FPMAC`; this module only moves data.
"""

from amaranth.hdl import Module, Signal, Const, Cat, Mux, unsigned
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from hdl.fp.mac import FPMAC, ACCUMULATORS

__all__ = ["PEArray"]


class PEArray(wiring.Component):
    """GEMV/GEMM engine: ``batch x lanes`` FPMAC PEs fed by one A beat per cycle.

    Parameters (keyword only):

    ``lanes``
        FP16 elements per A beat (the DRAM buffer / memory-controller beat width / 16); a power of two.
        Also the width (in elements) of the ``x`` load beats and of the ``y`` result beats.
    ``batch``
        Maximum batch B: the number of PE rows, all computing on the same A beat in parallel
        (``batch * lanes`` FPMACs; ``B * lanes`` MACs per accepted beat).
    ``acc``
        Accumulator format, ``"fp16"`` (the paper's FP16 MACs) or ``"fp32"``. Results leave in this format
        (conversion to FP16, if wanted, is a separate ``FPConvert`` stage).
    ``max_k``
        Largest K (size of the input buffer: ``batch * ceil(max_k / lanes)`` beats).
    ``max_n``
        Largest N, a multiple of ``lanes`` (accumulator memory depth ``max_n / lanes``).

    Streams (payloads packed from the LSB):

    ``cmd`` (in)
        ``rows`` [B, bits_for(batch)], ``k`` [K, bits_for(max_k)], ``nb`` [N / lanes, bits_for(max_n / lanes)];
        all must be >= 1 and within the maxima.
    ``x`` (in)
        ``lanes`` x FP16, lane ``l`` in bits ``[16 l, 16 l + 16)``.
    ``a`` (in)
        ``lanes`` x FP16, same layout.
    ``y`` (out)
        ``lanes`` x accumulator (``w`` = 16 or 32 bits), lane ``l`` in bits ``[w l, w l + w)``.

    Timing: the last A beat accepted in cycle ``t`` -> first ``y`` beat valid in cycle ``t +``
    :attr:`drain_latency`. Minimum ``nb`` for one A beat per cycle: :attr:`min_nb`.
    """

    #: Cycles from an accepted A beat to its accumulator write-back (1 operand-read stage + FPMAC).
    loop_latency = 1 + FPMAC.latency
    #: Same-accumulator spacing needed for full rate: nb >= min_nb keeps ``a.ready`` high in COMPUTE.
    min_nb = loop_latency
    #: Cycles from the last A beat's acceptance to the first ``y`` beat's valid.
    drain_latency = loop_latency + 1

    def __init__(self, *, lanes: int = 4, batch: int = 1, acc: str = "fp16", max_k: int = 64,
                 max_n: int = 64):
        if lanes < 1 or lanes & (lanes - 1):
            raise ValueError(f"lanes must be a power of two >= 1, got {lanes}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if acc not in ACCUMULATORS:
            raise ValueError(f"acc must be one of {sorted(ACCUMULATORS)}, got {acc!r}")
        if max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {max_k}")
        if max_n < lanes or max_n % lanes:
            raise ValueError(f"max_n must be a positive multiple of lanes={lanes}, got {max_n}")
        self.lanes = lanes
        self.batch = batch
        self.acc = acc
        self.acc_width = ACCUMULATORS[acc].width
        self.max_k = max_k
        self.max_n = max_n
        self.max_nb = max_n // lanes
        self.x_depth = -(-max_k // lanes)
        self.cmd_layout = data.StructLayout({
            "rows": bits_for(batch), "k": bits_for(max_k), "nb": bits_for(self.max_nb)})
        super().__init__({
            "cmd": In(stream.Signature(self.cmd_layout)),
            "x": In(stream.Signature(unsigned(16 * lanes))),
            "a": In(stream.Signature(unsigned(16 * lanes))),
            "y": Out(stream.Signature(unsigned(self.acc_width * lanes))),
        })

    def cycles(self, rows: int, k: int, nb: int) -> int:
        """Cycles of one job at full rate, from ``cmd`` accepted (cycle 0) to the last ``y`` beat recorded."""
        x_beats = rows * -(-k // self.lanes)
        return x_beats + (k - 1) * max(nb, self.min_nb) + nb + self.drain_latency + rows * nb

    def elaborate(self, platform):
        m = Module()
        L, NB, w = self.lanes, self.batch, self.acc_width
        lsh = ceil_log2(L)

        # ---- job registers and counters
        rows = Signal(range(self.batch + 1))
        kk = Signal(range(self.max_k + 1))
        nb = Signal(range(self.max_nb + 1))
        kbeats = Signal(range(self.x_depth + 1))
        # (counters are at least 1 bit wide so degenerate configurations give no zero-width Verilog vectors)
        ld_b = Signal(range(max(self.batch, 2)))
        ld_q = Signal(range(max(self.x_depth, 2)))
        c_j = Signal(range(max(self.max_nb, 2)))
        c_k = Signal(range(max(self.max_k, 2)))
        d_b = Signal(range(max(self.batch, 2)))
        d_j = Signal(range(max(self.max_nb, 2)))
        d_pending = Signal()

        # ---- memories: input buffer (X) and accumulators (depth >= 2: no zero-width address in Verilog)
        m.submodules.xmem = xmem = memory.Memory(shape=unsigned(16 * L * NB), depth=max(self.x_depth, 2),
                                                   init=[])
        x_wr = xmem.write_port(granularity=16 * L)
        x_rd = xmem.read_port()
        m.submodules.accmem = accmem = memory.Memory(shape=unsigned(w * L * NB), depth=max(self.max_nb, 2),
                                                       init=[])
        acc_wr = accmem.write_port()
        acc_rd = accmem.read_port(transparent_for=(acc_wr,))

        # ---- in-flight chain: chain[i] = beat accepted i+1 cycles ago; chain[0] is the operand stage.
        depth = self.loop_latency
        ch_valid = [Signal(name=f"ch{i}_valid") for i in range(depth)]
        ch_j = [Signal(range(max(self.max_nb, 2)), name=f"ch{i}_j") for i in range(depth)]
        s1_beat = Signal(16 * L)
        s1_first = Signal()
        s1_lane = Signal(range(max(L, 2)))

        hazard = Signal()
        m.d.comb += hazard.eq(Cat(*[ch_valid[i] & (ch_j[i] == c_j) for i in range(depth - 1)]).any())
        issue = Signal()
        chain_busy = Signal()
        m.d.comb += chain_busy.eq(Cat(*ch_valid[:depth - 1]).any())

        # ---- output register
        y_adv = Signal()
        out_b = Signal(range(max(self.batch, 2)))
        m.d.comb += y_adv.eq(~self.y.valid | self.y.ready)

        # Control state (plain if/elif rather than m.FSM, so the Verilog has no incomplete case statements).
        IDLE, LOAD, COMPUTE, DRAIN = range(4)
        state = Signal(2, name="ctl_state")
        with m.If(state == IDLE):
            m.d.comb += self.cmd.ready.eq(1)
            with m.If(self.cmd.valid):
                p = self.cmd.payload
                m.d.sync += [
                    rows.eq(p.rows), kk.eq(p.k), nb.eq(p.nb),
                    kbeats.eq((p.k + (L - 1)) >> lsh),
                    ld_b.eq(0), ld_q.eq(0), c_j.eq(0), c_k.eq(0),
                ]
                m.d.sync += state.eq(LOAD)
        with m.Elif(state == LOAD):
            m.d.comb += [
                self.x.ready.eq(1),
                x_wr.addr.eq(ld_q),
                x_wr.data.eq(self.x.payload.replicate(NB)),
                x_wr.en.eq(Mux(self.x.valid, Const(1, NB) << ld_b, 0)),
            ]
            with m.If(self.x.valid):
                with m.If(ld_q == kbeats - 1):
                    m.d.sync += ld_q.eq(0)
                    with m.If(ld_b == rows - 1):
                        m.d.sync += state.eq(COMPUTE)
                    with m.Else():
                        m.d.sync += ld_b.eq(ld_b + 1)
                with m.Else():
                    m.d.sync += ld_q.eq(ld_q + 1)
        with m.Elif(state == COMPUTE):
            m.d.comb += [
                self.a.ready.eq(~hazard),
                issue.eq(self.a.valid & ~hazard),
            ]
            with m.If(issue):
                with m.If(c_j == nb - 1):
                    m.d.sync += c_j.eq(0)
                    with m.If(c_k == kk - 1):
                        m.d.sync += [c_k.eq(0), d_b.eq(0), d_j.eq(0), d_pending.eq(1)]
                        m.d.sync += state.eq(DRAIN)
                    with m.Else():
                        m.d.sync += c_k.eq(c_k + 1)
                with m.Else():
                    m.d.sync += c_j.eq(c_j + 1)
        with m.Else():  # DRAIN
            # A read is issued once no write-back other than this cycle's is outstanding (the read port
            # is transparent to the write port).
            rd = Signal()
            m.d.comb += rd.eq(y_adv & d_pending & ~chain_busy)
            with m.If(y_adv):
                m.d.sync += [self.y.valid.eq(rd), out_b.eq(d_b)]
            with m.If(rd):
                with m.If(d_j == nb - 1):
                    m.d.sync += d_j.eq(0)
                    with m.If(d_b == rows - 1):
                        m.d.sync += d_pending.eq(0)
                    with m.Else():
                        m.d.sync += d_b.eq(d_b + 1)
                with m.Else():
                    m.d.sync += d_j.eq(d_j + 1)
            with m.If(~d_pending & y_adv):
                m.d.sync += state.eq(IDLE)

        in_drain = state == DRAIN
        # ---- operand reads (issued with the beat) and the chain
        m.d.comb += [
            x_rd.addr.eq(c_k >> lsh),
            acc_rd.addr.eq(Mux(in_drain, d_j, c_j)),
            acc_rd.en.eq(~in_drain | y_adv),
        ]
        m.d.sync += [ch_valid[0].eq(issue), ch_j[0].eq(c_j)]
        for i in range(1, depth):
            m.d.sync += [ch_valid[i].eq(ch_valid[i - 1]), ch_j[i].eq(ch_j[i - 1])]
        with m.If(issue):
            m.d.sync += [s1_beat.eq(self.a.payload), s1_first.eq(c_k == 0), s1_lane.eq(c_k[:lsh] if lsh else 0)]

        # ---- PEs
        zs = []
        for b in range(NB):
            xword = x_rd.data[16 * L * b:16 * L * (b + 1)]
            xval = xword.word_select(s1_lane, 16) if L > 1 else xword
            accword = acc_rd.data[w * L * b:w * L * (b + 1)]
            for lane in range(L):
                mac = FPMAC(acc=self.acc)
                m.submodules[f"pe_{b}_{lane}"] = mac
                m.d.comb += [
                    mac.i.valid.eq(ch_valid[0] & (b < rows)),
                    mac.i.payload.a.eq(xval),
                    mac.i.payload.b.eq(s1_beat[16 * lane:16 * (lane + 1)]),
                    mac.i.payload.c.eq(Mux(s1_first, 0, accword[w * lane:w * (lane + 1)])),
                    mac.o.ready.eq(1),
                ]
                zs.append(mac.o.payload.z)
        m.d.comb += [
            acc_wr.addr.eq(ch_j[depth - 1]),
            acc_wr.data.eq(Cat(*zs)),
            acc_wr.en.eq(ch_valid[depth - 1]),
        ]

        # ---- result beats
        m.d.comb += self.y.payload.eq(acc_rd.data.word_select(out_b, w * L) if NB > 1 else acc_rd.data)
        return m
