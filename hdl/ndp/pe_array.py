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
   ``nb`` accumulators of a row are independent, so for ``nb >= 8`` the loop never stalls. For ``nb < 8``
   (small N, e.g. a LoRA rank below 8 x lanes) the array splits K over ``S = min(ceil(8 / nb), K)`` phases:
   beat ``t = k*nb + j`` accumulates into virtual column ``v = t mod (S*nb)``, i.e. phase ``s = k mod S``
   keeps its own partial sum of the k's congruent to s, so consecutive uses of an accumulator are
   ``S*nb >= 8`` beats apart and the loop runs at one beat per cycle (a 7-entry in-flight scoreboard still
   guards the accumulators and holds ``a.ready`` low when K is too small to fill the phases).
4. DRAIN: once the FPMAC pipelines are empty, ``y`` returns ``B * nb`` beats in the accumulator format,
   row-major: beat ``b * nb + j`` holds ``Y[b, j*lanes + l]`` in lane ``l``. With K split over S > 1 phases,
   each beat is first reduced in phase order, ``y = ((p_0 + p_1) + p_2) + ... + p_{S-1}``, by ``lanes``
   adders in the accumulator format (one add at a time: ``3 + (S - 1) * (FPAdd.latency + 2)`` cycles per
   beat, :meth:`PEArray.reduce_cycles`).

Every floating-point operation is an :class:`hdl.fp.FPMAC`; this module only moves data.
"""

from amaranth.hdl import Module, Signal, Const, Cat, Mux, unsigned
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from hdl.fp.mac import FPMAC, ACCUMULATORS
from hdl.fp.add import FPAdd

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
        # accumulator words: nb columns, or S*nb < min_nb + nb virtual columns of a K-split job
        self.acc_depth = max(self.max_nb, 2 * self.min_nb)
        self.x_depth = -(-max_k // lanes)
        self.cmd_layout = data.StructLayout({
            "rows": bits_for(batch), "k": bits_for(max_k), "nb": bits_for(self.max_nb)})
        super().__init__({
            "cmd": In(stream.Signature(self.cmd_layout)),
            "x": In(stream.Signature(unsigned(16 * lanes))),
            "a": In(stream.Signature(unsigned(16 * lanes))),
            "y": Out(stream.Signature(unsigned(self.acc_width * lanes))),
        })

    def phases(self, k: int, nb: int) -> int:
        """K-split phases S of a job: ``min(ceil(min_nb / nb), k)`` for ``nb < min_nb``, else 1."""
        return 1 if nb >= self.min_nb else min(-(-self.min_nb // nb), k)

    def cycles(self, rows: int, k: int, nb: int) -> int:
        """Cycles of one job at full rate, from ``cmd`` accepted (cycle 0) to the last ``y`` beat recorded."""
        x_beats = rows * -(-k // self.lanes)
        S = self.phases(k, nb)
        if S == 1:
            return x_beats + (k - 1) * max(nb, self.min_nb) + nb + self.drain_latency + rows * nb
        # A beats: one per cycle once S*nb >= min_nb (the first k < S: spaced like nb' = S*nb); then the
        # reduction of every output beat.
        v = S * nb
        compute = (k * nb - 1) + max(0, self.min_nb - v) * ((k * nb - 1) // v) + 1
        return x_beats + compute + self.loop_latency + rows * nb * self.reduce_cycles(S) + 1

    def reduce_cycles(self, S: int) -> int:
        """Cycles per output beat of the K-split reduction (S partial sums, one adder pass at a time): read and
        hold p_0 (2), per further phase read (1) + issue (1) + the adder's latency, then offer the beat (1)."""
        return 3 + (S - 1) * (FPAdd.latency + 2)

    def elaborate(self, platform):
        m = Module()
        L, NB, w = self.lanes, self.batch, self.acc_width
        lsh = ceil_log2(L)
        fmt = ACCUMULATORS[self.acc]
        AD = self.acc_depth

        # ---- job registers and counters
        rows = Signal(range(self.batch + 1))
        kk = Signal(range(self.max_k + 1))
        nb = Signal(range(self.max_nb + 1))
        kbeats = Signal(range(self.x_depth + 1))
        S = Signal(range(self.min_nb + 1))            # K-split phases (1: no split)
        V = Signal(range(AD + 1))                      # accumulator columns in use: S * nb
        # (counters are at least 1 bit wide so degenerate configurations give no zero-width Verilog vectors)
        ld_b = Signal(range(max(self.batch, 2)))
        ld_q = Signal(range(max(self.x_depth, 2)))
        c_j = Signal(range(max(self.max_nb, 2)))
        c_k = Signal(range(max(self.max_k, 2)))
        c_v = Signal(range(max(AD, 2)))               # virtual column t mod V
        c_first = Signal()                             # first lap over the V columns: accumulators start at +0
        d_b = Signal(range(max(self.batch, 2)))
        d_j = Signal(range(max(self.max_nb, 2)))
        d_pending = Signal()

        # ---- memories: input buffer (X) and accumulators (depth >= 2: no zero-width address in Verilog)
        m.submodules.xmem = xmem = memory.Memory(shape=unsigned(16 * L * NB), depth=max(self.x_depth, 2),
                                                   init=[])
        x_wr = xmem.write_port(granularity=16 * L)
        x_rd = xmem.read_port()
        m.submodules.accmem = accmem = memory.Memory(shape=unsigned(w * L * NB), depth=AD, init=[])
        acc_wr = accmem.write_port()
        acc_rd = accmem.read_port(transparent_for=(acc_wr,))

        # ---- in-flight chain: chain[i] = beat accepted i+1 cycles ago; chain[0] is the operand stage.
        depth = self.loop_latency
        ch_valid = [Signal(name=f"ch{i}_valid") for i in range(depth)]
        ch_v = [Signal(range(max(AD, 2)), name=f"ch{i}_v") for i in range(depth)]
        s1_beat = Signal(16 * L)
        s1_first = Signal()
        s1_lane = Signal(range(max(L, 2)))

        hazard = Signal()
        m.d.comb += hazard.eq(Cat(*[ch_valid[i] & (ch_v[i] == c_v) for i in range(depth - 1)]).any())
        issue = Signal()
        chain_busy = Signal()
        m.d.comb += chain_busy.eq(Cat(*ch_valid[:depth - 1]).any())

        # ---- output register
        y_adv = Signal()
        out_b = Signal(range(max(self.batch, 2)))
        m.d.comb += y_adv.eq(~self.y.valid | self.y.ready)

        # ---- K-split reduction (DRAIN with S > 1): lanes adders in the accumulator format
        red_y = Signal(w * L)                          # running reduction of one output beat
        red_s = Signal(range(self.min_nb + 1))
        red_addr = Signal(range(max(AD, 2)))
        red_phase = Signal(2)                          # 0 read p_s, 1 operand ready, 2 adding, 3 offer y
        adders = []
        for lane in range(L):
            add = FPAdd(fmt=fmt)
            m.submodules[f"red_{lane}"] = add
            adders.append(add)
        red_go = Signal()
        red_done = adders[0].o.valid

        # ceil(min_nb / nb) for nb < min_nb, as a small table
        ceil_tab = Mux(nb >= self.min_nb, 1, 0)
        for n in range(self.min_nb - 1, 0, -1):
            ceil_tab = Mux(nb == n, -(-self.min_nb // n), ceil_tab)

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
            # (the phase count needs nb and k: computed here, one cycle after the command at the earliest)
            split = Mux(ceil_tab > kk, kk, ceil_tab)
            m.d.sync += [S.eq(split), V.eq(split * nb), c_v.eq(0), c_first.eq(1)]
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
                with m.If(c_v == V - 1):
                    m.d.sync += [c_v.eq(0), c_first.eq(0)]
                with m.Else():
                    m.d.sync += c_v.eq(c_v + 1)
                with m.If(c_j == nb - 1):
                    m.d.sync += c_j.eq(0)
                    with m.If(c_k == kk - 1):
                        m.d.sync += [c_k.eq(0), d_b.eq(0), d_j.eq(0), d_pending.eq(1), red_go.eq(1)]
                        m.d.sync += state.eq(DRAIN)
                    with m.Else():
                        m.d.sync += c_k.eq(c_k + 1)
                with m.Else():
                    m.d.sync += c_j.eq(c_j + 1)
        with m.Else():  # DRAIN
            with m.If(S == 1):
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
            with m.Else():
                # Per output beat (b, j): y = p_0, then y = y + p_s for s = 1..S-1 (p_s at column s*nb + j).
                rowword = acc_rd.data.word_select(d_b, w * L) if NB > 1 else acc_rd.data
                with m.If(red_phase == 0):
                    # read p_s (the chain must be empty before the first read of the job)
                    with m.If(d_pending & ~chain_busy & y_adv):
                        m.d.comb += acc_rd.en.eq(1)
                        m.d.sync += red_phase.eq(1)
                    with m.If(~d_pending & y_adv):
                        m.d.sync += state.eq(IDLE)
                with m.Elif(red_phase == 1):
                    with m.If(red_s == 0):
                        m.d.sync += [red_y.eq(rowword), red_s.eq(1), red_addr.eq(red_addr + nb),
                                     red_phase.eq(Mux(S == 1, 3, 0))]
                    with m.Else():
                        for lane, add in enumerate(adders):
                            m.d.comb += [
                                add.i.valid.eq(1),
                                add.i.payload.a.eq(red_y[w * lane:w * (lane + 1)]),
                                add.i.payload.b.eq(rowword[w * lane:w * (lane + 1)]),
                            ]
                        m.d.sync += red_phase.eq(2)
                with m.Elif(red_phase == 2):
                    with m.If(red_done):
                        m.d.sync += red_y.eq(Cat(*[a.o.payload.z for a in adders]))
                        with m.If(red_s == S - 1):
                            m.d.sync += [red_phase.eq(3), red_s.eq(0)]
                        with m.Else():
                            m.d.sync += [red_s.eq(red_s + 1), red_addr.eq(red_addr + nb), red_phase.eq(0)]
                with m.Else():
                    # offer the beat; move on to the next (b, j)
                    m.d.sync += [self.y.valid.eq(1), red_phase.eq(0), red_s.eq(0)]
                    with m.If(d_j == nb - 1):
                        m.d.sync += [d_j.eq(0), red_addr.eq(0)]
                        with m.If(d_b == rows - 1):
                            m.d.sync += d_pending.eq(0)
                        with m.Else():
                            m.d.sync += d_b.eq(d_b + 1)
                    with m.Else():
                        m.d.sync += [d_j.eq(d_j + 1), red_addr.eq(d_j + 1)]
                with m.If(self.y.valid & self.y.ready):
                    m.d.sync += self.y.valid.eq(0)
        with m.If(red_go):
            m.d.sync += [red_go.eq(0), red_addr.eq(0), red_s.eq(0), red_phase.eq(0)]
        for add in adders:
            m.d.comb += add.o.ready.eq(1)

        in_drain = state == DRAIN
        split_drain = in_drain & (S != 1)
        # ---- operand reads (issued with the beat) and the chain
        m.d.comb += [
            x_rd.addr.eq(c_k >> lsh),
            acc_rd.addr.eq(Mux(split_drain, red_addr, Mux(in_drain, d_j, c_v))),
        ]
        with m.If(~split_drain):
            m.d.comb += acc_rd.en.eq(~in_drain | y_adv)
        m.d.sync += [ch_valid[0].eq(issue), ch_v[0].eq(c_v)]
        for i in range(1, depth):
            m.d.sync += [ch_valid[i].eq(ch_valid[i - 1]), ch_v[i].eq(ch_v[i - 1])]
        with m.If(issue):
            m.d.sync += [s1_beat.eq(self.a.payload), s1_first.eq(c_first),
                         s1_lane.eq(c_k[:lsh] if lsh else 0)]

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
            acc_wr.addr.eq(ch_v[depth - 1]),
            acc_wr.data.eq(Cat(*zs)),
            acc_wr.en.eq(ch_valid[depth - 1]),
        ]

        # ---- result beats
        with m.If(split_drain):
            m.d.comb += self.y.payload.eq(red_y)
        with m.Else():
            m.d.comb += self.y.payload.eq(acc_rd.data.word_select(out_b, w * L) if NB > 1 else acc_rd.data)
        return m
