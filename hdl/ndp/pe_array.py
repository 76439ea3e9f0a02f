"""Streaming GEMV/GEMM PE array of the NDP compute unit: ``Y[b, n] = sum_k X[b, k] * A[k, n]``.

See ``docs/ndp_pe_array.md`` for the dataflows, the order of operations, the cycle formulas and measured
figures; the bit-exact golden model is ``sim/golden/pe_array.py``.

``batch x lanes`` FPMAC PEs (PE row b, lane l) all work on one A beat per cycle. Four dataflows
(:class:`PEMode`), chosen per job:

* ``ROW`` (the GEMM PEs, N a multiple of ``lanes``): lane l of beat ``k*nb + j`` holds ``A[k, j*lanes + l]``;
  every lane of row b multiplies the broadcast ``X[b, k]``; accumulator word ``j`` holds the running sums of
  columns ``j*lanes ..``. For ``nb < min_nb`` the array splits K over ``S = min(ceil(min_nb / nb), K)``
  phases (virtual columns), reduced in phase order at drain.
* ``ROW_HALF`` (N = lanes / 2, K even): a beat holds two rows of A (lower lanes row 2t, upper lanes 2t+1),
  the lanes multiply ``X[b, 2t]`` resp. ``X[b, 2t+1]``; K split as in ROW over the K/2 beats; at drain the
  upper half is added onto the lower half.
* ``TRANS`` (the GEMV PEs, A stored k-major in blocks of ``lanes`` rows, K a multiple of ``lanes``): lane l of
  beat ``w*N + j`` holds ``A[w*lanes + l, j]`` and multiplies ``X[b, w*lanes + l]`` (lane-aligned, no
  broadcast); accumulator word j holds column j's per-lane partial sums; at drain a pairwise tree of FP adders
  reduces each word to one scalar (``ys``).
* ``TRANS_HALF`` (K = lanes / 2, N even): beat t holds columns 2t (lower lanes) and 2t+1 (upper lanes) of the
  half block; the tree's last level is skipped: two scalars per word.
* ``TRANS_PAIR`` (arrays built with ``a_beats=2`` and ``batch >= 2``; one input row, K a multiple of
  ``lanes``, N even): the GEMV PEs at two A beats per cycle. Each ``a`` transfer carries two consecutive beats
  of the TRANS layout, ``A[w*lanes + l, 2j]`` (low half) and ``A[w*lanes + l, 2j + 1]`` (high half); PE row 0
  takes column 2j, PE row 1 (idle in a one-row TRANS job) column 2j + 1, both multiplying the same x block.
  Accumulator word j holds the two columns (row 0, row 1); the drain sends word j's row 0 then row 1 through
  the tree, so ``ys`` is in column order. Every column's sum is the TRANS one, operation for operation: the
  results are bit-identical to TRANS, in half the A transfers (docs/ndp_pe_array.md).

* ``ROW_GROUP`` (arrays built with ``group`` = W > 0; K = n W, n >= 1, N = lanes): the row dataflow with one
  broadcast per *segment* of W lanes. A PE row's x is n words; word j holds ``lanes / W`` rows' elements
  [j W, (j + 1) W) (one row per segment); lane l of segment s = l // W multiplies element k of its row, i.e.
  lane s W + k mod W of x word k // W: ``Y[b, s W + c] = sum_k X_s[b, k] A[k, s W + c]``, g = lanes / W
  independent (1 x K) @ (K x W) products in one pass over A. Accumulation, K split and drain are ROW's
  (nb = 1), operation for operation. Decode attention of lanes / W KV heads at once (docs/ndp_core.md); K > W
  lets a head dim of n W run on segments of W tokens. Arrays built with ``narrow`` also take ROW_GROUP jobs at
  segments of W / 2 (the cmd's ``narrow`` bit; 2 lanes / W segments, K = n W / 2, x words of W / 2-slices),
  chosen per job: a 2:1 choice of each lane's broadcast.

**Overlap.** A job flows through three stages, each with its own job registers: LOAD (x into one of two x
banks), COMPUTE (A beats into one of two accumulator banks) and DRAIN (one bank out through ``y`` / ``ys``).
Consecutive jobs alternate banks, so job i+1 loads while job i computes, and job i drains while job i+1
computes: passes and descriptors follow each other without the drain in between.

Every floating-point operation is an :class:`hdl.fp.FPMAC` or :class:`hdl.fp.FPAdd`; this module only moves
data.
"""

from amaranth.hdl import Module, Signal, Const, Cat, Mux, unsigned
from amaranth.lib import wiring, stream, data, memory, enum
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2, exact_log2

from hdl.fp.mac import FPMAC, ACCUMULATORS
from hdl.fp.add import FPAdd

__all__ = ["PEArray", "PEMode"]


class PEMode(enum.Enum, shape=3):
    """Dataflow of one PE-array job (module docstring)."""
    ROW = 0
    ROW_HALF = 1
    TRANS = 2
    TRANS_HALF = 3
    TRANS_PAIR = 4
    ROW_GROUP = 5


class PEArray(wiring.Component):
    """GEMV/GEMM engine: ``batch x lanes`` FPMAC PEs fed by one A beat per cycle, four dataflows, three
    overlapped stages.

    Parameters (keyword only): ``lanes`` (FP16 elements per beat, a power of two >= 2), ``batch`` (PE rows),
    ``acc`` (accumulator format ``"fp16"`` or ``"fp32"``), ``max_k`` (largest K: x memory of
    ``ceil(max_k / lanes)`` words per bank), ``acc_columns`` (accumulator words per bank; ROW: nb, TRANS: N
    of one job; at least ``2 * min_nb`` words are built for the K split), ``a_beats`` (1, or 2 for the
    ``TRANS_PAIR`` dataflow: the ``a`` stream is two beats wide; needs ``batch >= 2``).

    Streams (payloads packed from the LSB):

    ``cmd`` (in)
        ``mode`` (:class:`PEMode`), ``rows`` = B (1..batch), ``k`` = K (1..max_k), ``cols``: ROW nb = N / lanes
        (1..acc_columns), ROW_HALF 1, TRANS N (1..acc_columns), TRANS_HALF N (even, 2..2 acc_columns),
        TRANS_PAIR N (even, 2..2 acc_columns; rows 1), ROW_GROUP 1 (K = n W, n <= ceil(max_k / lanes)); with
        ``narrow``, a ``narrow`` bit (ROW_GROUP at W / 2: K = n W / 2).
    ``x`` (in)
        ``B * ceil(K / lanes)`` beats, row by row (lanes past K are padding, ignored); ROW_GROUP ``B * K / W``.
    ``a`` (in)
        ROW ``K * nb`` beats, ROW_HALF ``K / 2``, TRANS ``(K / lanes) * N``, TRANS_HALF ``N / 2``, TRANS_PAIR
        ``(K / lanes) * N / 2`` transfers of two beats (module docs). With ``a_beats=2`` the payload is two beats
        wide; every mode but TRANS_PAIR uses the low beat only.
    ``y`` (out)
        ROW / ROW_HALF: ``B * nb`` (ROW_HALF: ``B``) beats of ``lanes`` accumulators, row-major (ROW_HALF: the
        result in the lower ``lanes / 2`` lanes).
    ``ys`` (out)
        TRANS / TRANS_HALF: ``B * N`` scalars (accumulator format), row-major.
    """

    #: Cycles from an accepted A beat to its accumulator write-back (1 operand-read stage + FPMAC).
    loop_latency = 1 + FPMAC.latency
    #: Same-accumulator spacing needed for full rate (ROW: nb >= min_nb keeps ``a.ready`` high).
    min_nb = loop_latency
    #: ROW, one phase: the last A beat accepted in cycle t -> first ``y`` beat valid in cycle t + drain_latency.
    drain_latency = loop_latency + 1

    def __init__(self, *, lanes: int = 4, batch: int = 1, acc: str = "fp16", max_k: int = 64,
                 acc_columns: int = 16, a_beats: int = 1, group: int = 0, narrow: bool = False):
        if lanes < 2 or lanes & (lanes - 1):
            raise ValueError(f"lanes must be a power of two >= 2, got {lanes}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if acc not in ACCUMULATORS:
            raise ValueError(f"acc must be one of {sorted(ACCUMULATORS)}, got {acc!r}")
        if max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {max_k}")
        if acc_columns < 1:
            raise ValueError(f"acc_columns must be >= 1, got {acc_columns}")
        if a_beats not in (1, 2) or (a_beats == 2 and batch < 2):
            raise ValueError(f"a_beats must be 1, or 2 with batch >= 2 (TRANS_PAIR uses PE rows 0 and 1), got "
                             f"a_beats={a_beats!r} with batch={batch}")
        if isinstance(group, bool) or not isinstance(group, int) or group < 0 or group & (group - 1) \
                or group > lanes // 2:
            raise ValueError(f"group must be 0 or a power of two <= lanes / 2 ({lanes // 2}), got {group!r}")
        if not isinstance(narrow, bool) or (narrow and group < 2):
            raise ValueError(f"narrow must be a bool, True only with group >= 2, got narrow={narrow!r} with "
                             f"group={group}")
        self.group = group
        #: ROW_GROUP jobs may take segments of ``group / 2`` (the cmd's ``narrow`` bit)
        self.narrow = narrow
        self.a_beats = a_beats
        self.lanes = lanes
        self.batch = batch
        self.acc = acc
        self.acc_width = ACCUMULATORS[acc].width
        self.max_k = max_k
        self.acc_columns = acc_columns
        self.acc_depth = max(acc_columns, 2 * self.min_nb)
        self.x_depth = -(-max_k // lanes)
        self.levels = exact_log2(lanes)
        #: ``ys``: a word read in cycle t gives its scalar at the tree output in cycle t + tree_latency.
        self.tree_latency = 1 + FPAdd.latency * self.levels
        cmd = {"mode": PEMode, "rows": bits_for(batch), "k": bits_for(max_k), "cols": bits_for(2 * acc_columns)}
        if narrow:
            cmd["narrow"] = 1           # ROW_GROUP: segments of group / 2
        self.cmd_layout = data.StructLayout(cmd)
        super().__init__({
            "cmd": In(stream.Signature(self.cmd_layout)),
            "x": In(stream.Signature(unsigned(16 * lanes))),
            "a": In(stream.Signature(unsigned(16 * lanes * a_beats))),
            "y": Out(stream.Signature(unsigned(self.acc_width * lanes))),
            "ys": Out(stream.Signature(unsigned(self.acc_width))),
        })

    # ---- job shape (Python mirror of the hardware's derived job registers) -------------------------------

    def job(self, mode, rows, k, cols) -> dict:
        """Derived shape of a job: ``steps`` (outer beat counter), ``inner`` (beats per step), ``S`` (K-split
        phases), ``V`` (accumulator words used), ``beats`` (A beats), ``words`` (drained words per row)."""
        mode = PEMode(mode)
        L = self.lanes
        if mode in (PEMode.ROW, PEMode.ROW_GROUP):
            steps, inner = k, cols
        elif mode == PEMode.ROW_HALF:
            steps, inner = k // 2, 1
        elif mode == PEMode.TRANS:
            steps, inner = k // L, cols
        elif mode == PEMode.TRANS_PAIR:
            steps, inner = k // L, cols // 2
        else:
            steps, inner = 1, cols // 2
        if mode in (PEMode.ROW, PEMode.ROW_HALF, PEMode.ROW_GROUP):
            S = 1 if inner >= self.min_nb else min(-(-self.min_nb // inner), steps)
        else:
            S = 1
        return {"steps": steps, "inner": inner, "S": S, "V": S * inner, "beats": steps * inner, "words": inner}

    def x_words(self, mode, k: int, narrow: bool = False) -> int:
        """x words per PE row of a job: ``ceil(k / lanes)``, ROW_GROUP ``k / W`` (each word one W-slice of the
        segments' rows, module docstring; ``narrow``: W = group / 2)."""
        if PEMode(mode) == PEMode.ROW_GROUP:
            return -(-k // (self.group >> int(bool(narrow))))
        return -(-k // self.lanes)

    def phases(self, k: int, nb: int) -> int:
        """ROW K-split phases S of a job: ``min(ceil(min_nb / nb), k)`` for ``nb < min_nb``, else 1."""
        return self.job(PEMode.ROW, 1, k, nb)["S"]

    def reduce_cycles(self, S: int, half: bool = False) -> int:
        """Cycles per output beat of the row-mode drain reduction (S partial sums, plus the half add for
        ROW_HALF; one adder pass at a time): read and hold p_0 (2), per phase add read (1) + issue (1) + the
        adder's latency, the half add issue (1) + latency, then offer the beat (1)."""
        return 3 + (S - 1) * (FPAdd.latency + 2) + ((FPAdd.latency + 1) if half else 0)

    def cycles(self, rows: int, k: int, nb: int) -> int:
        """ROW job alone at full rate: cycles from ``cmd`` accepted (cycle 0) to the last ``y`` beat recorded
        (the array is empty before and after)."""
        x_beats = rows * -(-k // self.lanes)
        S = self.phases(k, nb)
        if S == 1:
            return 1 + x_beats + (k - 1) * max(nb, self.min_nb) + nb + self.drain_latency + rows * nb
        v = S * nb
        compute = (k * nb - 1) + max(0, self.min_nb - v) * ((k * nb - 1) // v) + 1
        return 1 + x_beats + compute + self.loop_latency + rows * nb * self.reduce_cycles(S) + 1

    # ---- hardware ----------------------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        L, NB, w = self.lanes, self.batch, self.acc_width
        lsh = self.levels
        gsh = exact_log2(self.group) if self.group else 0
        fmt = ACCUMULATORS[self.acc]

        def kw_of(mode, k, narrow):
            """x words per row (:meth:`x_words`): ceil(k / lanes); ROW_GROUP k / W (narrow: k / (W / 2))."""
            if not self.group:
                return (k + (L - 1)) >> lsh
            kg = (k + (self.group - 1)) >> gsh
            if self.narrow:
                kg = Mux(narrow, (k + (self.group // 2 - 1)) >> (gsh - 1), kg)
            return Mux(mode == PEMode.ROW_GROUP, kg, (k + (L - 1)) >> lsh)
        AD, XD = self.acc_depth, max(self.x_depth, 2)
        half = L // 2

        def job_regs(prefix):
            return dict(
                mode=Signal(PEMode, name=f"{prefix}_mode"),
                rows=Signal(range(self.batch + 1), name=f"{prefix}_rows"),
                k=Signal(range(self.max_k + 1), name=f"{prefix}_k"),
                kw=Signal(range(self.x_depth + 1), name=f"{prefix}_kw"),
                steps=Signal(range(self.max_k + 1), name=f"{prefix}_steps"),
                inner=Signal(range(2 * self.acc_columns + 1), name=f"{prefix}_inner"),
                S=Signal(range(self.min_nb + 1), name=f"{prefix}_S"),
                V=Signal(range(AD + 1), name=f"{prefix}_V"),
                bank=Signal(name=f"{prefix}_bank"),
                narrow=Signal(name=f"{prefix}_narrow"),          # (ROW_GROUP at group / 2; 0 without narrow)
            )

        def copy(dst, src):
            return [dst[f].eq(src[f]) for f in dst]

        def count2(lo, lo_last, hi, hi_last, done):
            """Two nested counters, one step: ``lo`` wraps to 0 after ``lo_last`` and steps ``hi``; after both
            are last, the statement ``done``."""
            with m.If(lo_last):
                m.d.sync += lo.eq(0)
                with m.If(hi_last):
                    m.d.sync += done
                with m.Else():
                    m.d.sync += hi.eq(hi + 1)
            with m.Else():
                m.d.sync += lo.eq(lo + 1)

        # ---- memories: two x banks, two accumulator banks
        xmems, x_wr, x_rd, accs, acc_wr, acc_rd = [], [], [], [], [], []
        for bank in range(2):
            xm = memory.Memory(shape=unsigned(16 * L * NB), depth=XD, init=[])
            am = memory.Memory(shape=unsigned(w * L * NB), depth=AD, init=[])
            m.submodules[f"xmem{bank}"] = xm
            m.submodules[f"accmem{bank}"] = am
            xmems.append(xm)
            x_wr.append(xm.write_port(granularity=16 * L))
            x_rd.append(xm.read_port())
            aw = am.write_port()
            acc_wr.append(aw)
            acc_rd.append(am.read_port(transparent_for=(aw,)))

        # =========================================================================================== LOAD
        lj = job_regs("l")
        l_busy = Signal()
        l_loaded = Signal()
        l_bank = Signal()
        l_cols = Signal(range(2 * self.acc_columns + 1))
        ld_b = Signal(range(max(self.batch, 2)))
        ld_q = Signal(range(max(self.x_depth, 2)))
        l_derive = Signal()                       # derived fields are computed the cycle after the cmd

        m.d.comb += self.cmd.ready.eq(~l_busy)
        with m.If(self.cmd.valid & self.cmd.ready):
            p = self.cmd.payload
            m.d.sync += [
                lj["mode"].eq(p.mode), lj["rows"].eq(p.rows), lj["k"].eq(p.k), l_cols.eq(p.cols),
                lj["kw"].eq(kw_of(p.mode, p.k, p.narrow if self.narrow else 0)), lj["bank"].eq(l_bank),
                lj["narrow"].eq(p.narrow if self.narrow else 0),
                ld_b.eq(0), ld_q.eq(0), l_busy.eq(1), l_loaded.eq(0), l_derive.eq(1),
            ]
        # steps / inner / S / V from mode, k, cols (registered: one cycle after the cmd)
        with m.If(l_derive):
            m.d.sync += l_derive.eq(0)
            mode = lj["mode"]
            trans_k = (mode == PEMode.TRANS) | (mode == PEMode.TRANS_PAIR)
            row_like = (mode == PEMode.ROW) | (mode == PEMode.ROW_GROUP)
            steps = Mux(row_like, lj["k"],
                        Mux(mode == PEMode.ROW_HALF, lj["k"] >> 1, Mux(trans_k, lj["k"] >> lsh, 1)))
            inner = Mux(row_like, l_cols,
                        Mux(mode == PEMode.ROW_HALF, 1, Mux(mode == PEMode.TRANS, l_cols, l_cols >> 1)))
            ceil_tab = Const(1, 4)
            for n in range(self.min_nb - 1, 0, -1):
                ceil_tab = Mux(inner == n, -(-self.min_nb // n), ceil_tab)
            is_row = row_like | (mode == PEMode.ROW_HALF)
            split = Mux(is_row, Mux(ceil_tab > steps, steps, ceil_tab), 1)
            m.d.sync += [lj["steps"].eq(steps), lj["inner"].eq(inner), lj["S"].eq(split),
                         lj["V"].eq(split * inner)]
        # TRANS_PAIR: PE rows 0 and 1 both multiply the job's one x row
        l_rows_en = Mux(lj["mode"] == PEMode.TRANS_PAIR, Const((1 << NB) - 1, NB), Const(1, NB) << ld_b)
        with m.If(l_busy & ~l_loaded):
            m.d.comb += self.x.ready.eq(1)
            for bank in range(2):
                m.d.comb += [
                    x_wr[bank].addr.eq(ld_q),
                    x_wr[bank].data.eq(self.x.payload.replicate(NB)),
                    x_wr[bank].en.eq(Mux(self.x.valid & (l_bank == bank), l_rows_en, 0)),
                ]
            with m.If(self.x.valid):
                count2(ld_q, ld_q == lj["kw"] - 1, ld_b, ld_b == lj["rows"] - 1, l_loaded.eq(1))

        # ======================================================================================== COMPUTE
        cj = job_regs("c")
        d_busy = Signal()                          # DRAIN holds a job (declared here: COMPUTE hands over to it)
        c_busy = Signal()                          # issuing A beats
        c_wait = Signal()                          # all beats issued; waiting for DRAIN to take the job
        c_k = Signal(range(max(self.max_k, 2)))
        c_j = Signal(range(max(2 * self.acc_columns, 2)))
        c_v = Signal(range(max(AD, 2)))            # virtual column (row modes) t mod V
        c_first = Signal()                         # row modes: first lap over the V columns


        depth = self.loop_latency
        ch_valid = [Signal(name=f"ch{i}_valid") for i in range(depth)]
        ch_v = [Signal(range(max(AD, 2)), name=f"ch{i}_v") for i in range(depth)]
        ch_bank = [Signal(name=f"ch{i}_bank") for i in range(depth)]
        c_is_trans = (cj["mode"] == PEMode.TRANS) | (cj["mode"] == PEMode.TRANS_HALF) | \
            (cj["mode"] == PEMode.TRANS_PAIR)
        v_now = Mux(c_is_trans, c_j, c_v)
        hazard = Signal()
        m.d.comb += hazard.eq(Cat(*[ch_valid[i] & (ch_v[i] == v_now) & (ch_bank[i] == cj["bank"])
                                    for i in range(depth - 1)]).any())
        issue = Signal()
        m.d.comb += [self.a.ready.eq(c_busy & ~hazard), issue.eq(self.a.valid & self.a.ready)]
        last_beat = (c_j == cj["inner"] - 1) & (c_k == cj["steps"] - 1)
        with m.If(issue):
            with m.If(c_v == cj["V"] - 1):
                m.d.sync += [c_v.eq(0), c_first.eq(0)]
            with m.Else():
                m.d.sync += c_v.eq(c_v + 1)
            with m.If(c_j == cj["inner"] - 1):
                m.d.sync += [c_j.eq(0), c_k.eq(c_k + 1)]
            with m.Else():
                m.d.sync += c_j.eq(c_j + 1)
            with m.If(last_beat):
                m.d.sync += [c_busy.eq(0), c_wait.eq(d_busy)]      # (handed to DRAIN at once if it is free)

        # operand stage (cycle after issue)
        s1_beat = Signal(16 * L * self.a_beats)
        s1_first = Signal()
        s1_idx = Signal(range(max(L, 2)))           # broadcast x lane (row modes; ROW_HALF: even index)
        s1_mode = Signal(PEMode)
        s1_bank = Signal()
        s1_rows = Signal(range(self.batch + 1))
        s1_narrow = Signal()
        c_row_like = (cj["mode"] == PEMode.ROW) | (cj["mode"] == PEMode.ROW_GROUP)
        x_addr = Mux(c_row_like, c_k >> lsh,
                     Mux(cj["mode"] == PEMode.ROW_HALF, c_k >> (lsh - 1), c_k))
        if self.group:      # ROW_GROUP: word k // W holds the segments' elements [k - k mod W, ...) (K = n W)
            xg = Mux(cj["narrow"], c_k >> (gsh - 1), c_k >> gsh) if self.narrow else c_k >> gsh
            x_addr = Mux(cj["mode"] == PEMode.ROW_GROUP, xg, x_addr)
        x_idx = Mux(c_row_like, c_k[:lsh], Cat(Const(0, 1), c_k[:lsh - 1]))
        first_now = Mux(c_is_trans, c_k == 0, c_first)
        with m.If(issue):
            m.d.sync += [s1_beat.eq(self.a.payload), s1_first.eq(first_now), s1_idx.eq(x_idx),
                         s1_mode.eq(cj["mode"]), s1_bank.eq(cj["bank"]), s1_rows.eq(cj["rows"]),
                         s1_narrow.eq(cj["narrow"])]
        m.d.sync += [ch_valid[0].eq(issue), ch_v[0].eq(v_now), ch_bank[0].eq(cj["bank"])]
        for i in range(1, depth):
            m.d.sync += [ch_valid[i].eq(ch_valid[i - 1]), ch_v[i].eq(ch_v[i - 1]), ch_bank[i].eq(ch_bank[i - 1])]

        # ========================================================================================== DRAIN
        dj = job_regs("d")
        d_b = Signal(range(max(self.batch, 2)))
        d_j = Signal(range(max(2 * self.acc_columns, AD, 2)))
        d_pending = Signal()                       # words left to read
        # COMPUTE -> DRAIN in the cycle of the last beat (or later, once DRAIN is free); LOAD -> COMPUTE in the
        # same cycle: jobs follow each other with no bubble while DRAIN keeps up.
        last_issue = issue & last_beat
        take_c = ~d_busy & (c_wait | last_issue)
        with m.If(take_c):
            m.d.sync += copy(dj, cj) + [d_busy.eq(1), d_b.eq(0), d_j.eq(0), d_pending.eq(1), c_wait.eq(0)]
        take_l = l_loaded & ~l_derive & ((~c_busy & ~c_wait) | take_c)
        with m.If(take_l):
            m.d.sync += copy(cj, lj) + [c_busy.eq(1), c_k.eq(0), c_j.eq(0), c_v.eq(0), c_first.eq(1),
                                        l_busy.eq(0), l_loaded.eq(0), l_bank.eq(~l_bank)]
        # write-backs still in flight to the drained bank (the read port is transparent to the last one)
        d_chain_busy = Cat(*[ch_valid[i] & (ch_bank[i] == dj["bank"]) for i in range(depth - 1)]).any()
        d_is_trans = (dj["mode"] == PEMode.TRANS) | (dj["mode"] == PEMode.TRANS_HALF) | \
            (dj["mode"] == PEMode.TRANS_PAIR)

        # bank read ports: COMPUTE's bank while it computes, else DRAIN's
        d_addr = Signal(range(max(AD, 2)))
        d_en = Signal()
        for bank in range(2):
            c_owns = (c_busy | c_wait) & (cj["bank"] == bank) & ~(d_busy & (dj["bank"] == bank))
            m.d.comb += [
                x_rd[bank].addr.eq(x_addr),
                acc_rd[bank].addr.eq(Mux(c_owns, v_now, d_addr)),
                acc_rd[bank].en.eq(Mux(c_owns, 1, d_en & (dj["bank"] == bank))),
                acc_wr[bank].addr.eq(ch_v[depth - 1]),
                acc_wr[bank].en.eq(ch_valid[depth - 1] & (ch_bank[depth - 1] == bank)),
            ]
        d_word = Mux(dj["bank"], acc_rd[1].data, acc_rd[0].data)
        d_rowword = d_word.word_select(d_b, w * L) if NB > 1 else d_word

        # ---- PEs
        xword = Mux(s1_bank, x_rd[1].data, x_rd[0].data)
        accword = Mux(s1_bank, acc_rd[1].data, acc_rd[0].data)
        zs = []
        s1_pair = s1_mode == PEMode.TRANS_PAIR
        GW = self.group
        for b in range(NB):
            xw = xword[16 * L * b:16 * L * (b + 1)]
            pair = xw.word_select(s1_idx >> 1, 32)
            even, odd = pair[:16], pair[16:]
            accw = accword[w * L * b:w * L * (b + 1)]
            # ROW_GROUP: one broadcast per segment of GW lanes, element k of the segment's own W inputs
            segx = []
            for seg in range(L // GW if GW else 0):
                sx = Signal(16, name=f"segx_{b}_{seg}")
                sw = xw[16 * GW * seg:16 * GW * (seg + 1)]
                m.d.comb += sx.eq(sw.word_select(s1_idx[:exact_log2(GW)], 16) if GW > 1 else sw)
                segx.append(sx)
            # (narrow: segments of GW / 2, element k mod (GW / 2) of the segment's own inputs)
            segn = []
            for seg in range(2 * L // GW if self.narrow else 0):
                sx = Signal(16, name=f"segn_{b}_{seg}")
                sw = xw[16 * (GW // 2) * seg:16 * (GW // 2) * (seg + 1)]
                m.d.comb += sx.eq(sw.word_select(s1_idx[:exact_log2(GW) - 1], 16) if GW > 2 else sw)
                segn.append(sx)
            for lane in range(L):
                aligned = xw[16 * lane:16 * lane + 16]
                folded = xw[16 * (lane % half):16 * (lane % half) + 16]
                bcast = Mux(s1_idx[0], odd, even) if L > 1 else even
                xval = Signal(16, name=f"xval_{b}_{lane}")
                other = Mux(s1_mode == PEMode.ROW_HALF, even if lane < half else odd,
                            Mux(s1_mode == PEMode.TRANS_HALF, folded, aligned))
                if GW:
                    gx = Mux(s1_narrow, segn[lane // (GW // 2)], segx[lane // GW]) if self.narrow else segx[lane // GW]
                    other = Mux(s1_mode == PEMode.ROW_GROUP, gx, other)
                m.d.comb += xval.eq(Mux(s1_mode == PEMode.ROW, bcast, other))
                a_lo = s1_beat[16 * lane:16 * (lane + 1)]
                if self.a_beats == 2 and b == 1:        # TRANS_PAIR: row 1 takes the transfer's second beat
                    a_val = Mux(s1_pair, s1_beat[16 * (L + lane):16 * (L + lane + 1)], a_lo)
                else:
                    a_val = a_lo
                row_on = (s1_pair | (s1_rows > b)) if (self.a_beats == 2 and b < 2) else (s1_rows > b)
                mac = FPMAC(acc=self.acc)
                m.submodules[f"pe_{b}_{lane}"] = mac
                m.d.comb += [
                    mac.i.valid.eq(ch_valid[0] & row_on),
                    mac.i.payload.a.eq(xval),
                    mac.i.payload.b.eq(a_val),
                    mac.i.payload.c.eq(Mux(s1_first, 0, accw[w * lane:w * (lane + 1)])),
                    mac.o.ready.eq(1),
                ]
                zs.append(mac.o.payload.z)
        for bank in range(2):
            m.d.comb += acc_wr[bank].data.eq(Cat(*zs))

        # ---- DRAIN, row modes: direct (S = 1, ROW) or reduction through the lane adders
        y_adv = Signal()
        m.d.comb += y_adv.eq(~self.y.valid | self.y.ready)
        d_row_like = (dj["mode"] == PEMode.ROW) | (dj["mode"] == PEMode.ROW_GROUP)
        direct = d_busy & ~d_is_trans & (dj["S"] == 1) & d_row_like
        reduce = d_busy & ~d_is_trans & ~((dj["S"] == 1) & d_row_like)
        out_sel = Signal()                          # y payload: 0 direct (read data), 1 reduction register
        out_b = Signal(range(max(self.batch, 2)))
        red_y = Signal(w * L)
        red_s = Signal(range(self.min_nb + 2))
        red_addr = Signal(range(max(AD, 2)))
        red_phase = Signal(3)                       # 0 read p_s, 1 operand, 2 adding, 4/5 half add, 3 offer y
        adders = []
        for lane in range(L):
            add = FPAdd(fmt=fmt)
            m.submodules[f"red_{lane}"] = add
            adders.append(add)
            m.d.comb += add.o.ready.eq(1)
        red_done = adders[0].o.valid
        d_last = (d_j == dj["inner"] - 1) & (d_b == dj["rows"] - 1)

        def next_word():
            count2(d_j, d_j == dj["inner"] - 1, d_b, d_b == dj["rows"] - 1, d_pending.eq(0))

        with m.If(direct):
            rd = Signal()
            m.d.comb += [rd.eq(y_adv & d_pending & ~d_chain_busy), d_addr.eq(d_j), d_en.eq(y_adv)]
            with m.If(y_adv):
                m.d.sync += [self.y.valid.eq(rd), out_b.eq(d_b), out_sel.eq(0)]
            with m.If(rd):
                next_word()
            with m.If(~d_pending & y_adv):
                m.d.sync += d_busy.eq(0)
        with m.If(reduce):
            is_half = dj["mode"] == PEMode.ROW_HALF
            after_phases = Mux(is_half, 4, 3)
            m.d.comb += d_addr.eq(red_addr)
            # (if/elif rather than m.Switch: complete case statements in the Verilog)
            with m.If(red_phase == 0):          # read p_s of word (d_b, d_j)
                with m.If(d_pending & ~d_chain_busy & y_adv):
                    m.d.comb += d_en.eq(1)
                    m.d.sync += red_phase.eq(1)
                with m.If(~d_pending & y_adv):
                    m.d.sync += d_busy.eq(0)
            with m.Elif(red_phase == 1):        # p_0: hold it; p_s: issue red_y + p_s
                with m.If(red_s == 0):
                    m.d.sync += [red_y.eq(d_rowword), red_s.eq(1), red_addr.eq(red_addr + dj["inner"])]
                    m.d.sync += red_phase.eq(Mux(dj["S"] == 1, after_phases, 0))
                with m.Else():
                    for lane, add in enumerate(adders):
                        m.d.comb += [
                            add.i.valid.eq(1),
                            add.i.payload.a.eq(red_y[w * lane:w * (lane + 1)]),
                            add.i.payload.b.eq(d_rowword[w * lane:w * (lane + 1)]),
                        ]
                    m.d.sync += red_phase.eq(2)
            with m.Elif(red_phase == 2):        # wait for the phase add
                with m.If(red_done):
                    m.d.sync += red_y.eq(Cat(*[a.o.payload.z for a in adders]))
                    with m.If(red_s == dj["S"] - 1):
                        m.d.sync += [red_phase.eq(after_phases), red_s.eq(0)]
                    with m.Else():
                        m.d.sync += [red_s.eq(red_s + 1), red_addr.eq(red_addr + dj["inner"]),
                                     red_phase.eq(0)]
            with m.Elif(red_phase == 4):        # ROW_HALF: issue lower + upper half
                for lane, add in enumerate(adders):
                    hi = lane % half + half
                    m.d.comb += [
                        add.i.valid.eq(1),
                        add.i.payload.a.eq(red_y[w * lane:w * (lane + 1)]),
                        add.i.payload.b.eq(red_y[w * hi:w * (hi + 1)]),
                    ]
                m.d.sync += red_phase.eq(5)
            with m.Elif(red_phase == 5):
                with m.If(red_done):
                    m.d.sync += [red_y.eq(Cat(*[a.o.payload.z for a in adders])), red_phase.eq(3)]
            with m.Elif(red_phase == 3):        # offer the beat; move on to the next (b, j)
                m.d.sync += [self.y.valid.eq(1), out_sel.eq(1), red_phase.eq(0), red_s.eq(0)]
                with m.If(d_j == dj["inner"] - 1):
                    m.d.sync += red_addr.eq(0)
                with m.Else():
                    m.d.sync += red_addr.eq(d_j + 1)
                next_word()
            with m.If(self.y.valid & self.y.ready):
                m.d.sync += self.y.valid.eq(0)
        with m.If(take_c):
            m.d.sync += [red_addr.eq(0), red_s.eq(0), red_phase.eq(0)]
        m.d.comb += self.y.payload.eq(Mux(out_sel, red_y,
                                          d_word.word_select(out_b, w * L) if NB > 1 else d_word))

        # ---- DRAIN, TRANS modes: read word (b, j) -> pairwise FPAdd tree -> scalar(s) on ys
        t_valid = Signal()                          # a word is at the read port's output
        t_b = Signal(range(max(self.batch, 2)))     # its row
        tree_ready = Signal()
        t_adv = ~t_valid | tree_ready
        trans_drain = d_busy & d_is_trans
        with m.If(trans_drain):
            rd = Signal()
            m.d.comb += [d_addr.eq(d_j), d_en.eq(t_adv), rd.eq(d_pending & ~d_chain_busy & t_adv)]
            with m.If(t_adv):
                m.d.sync += [t_valid.eq(rd), t_b.eq(d_b)]
            with m.If(rd):
                if self.a_beats == 2:
                    # TRANS_PAIR: word j's row 0 (column 2j), then its row 1 (column 2j + 1): column order
                    with m.If(dj["mode"] == PEMode.TRANS_PAIR):
                        count2(d_b, d_b == 1, d_j, d_j == dj["inner"] - 1, d_pending.eq(0))
                    with m.Else():
                        next_word()
                else:
                    next_word()
        t_rowword = d_word.word_select(t_b, w * L) if NB > 1 else d_word
        level = [t_rowword[w * lane:w * (lane + 1)] for lane in range(L)]
        valid = t_valid & trans_drain
        ready_in = None
        units = []
        k = 0
        while len(level) > 1:
            nxt, lvl_units = [], []
            for j in range(0, len(level), 2):
                uw = 2 * w if (len(level) == 2) else 0
                unit = FPAdd(fmt=fmt, user_width=uw)
                m.submodules[f"tree_l{k}_{j // 2}"] = unit
                m.d.comb += [unit.i.valid.eq(valid), unit.i.payload.a.eq(level[j]),
                             unit.i.payload.b.eq(level[j + 1])]
                if uw:
                    m.d.comb += unit.i.payload.user.eq(Cat(level[j], level[j + 1]))
                nxt.append(unit.o.payload.z)
                lvl_units.append(unit)
            if ready_in is None:
                ready_in = lvl_units[0].i.ready
            if units:
                for u in units[-1]:
                    m.d.comb += u.o.ready.eq(lvl_units[0].i.ready)
            units.append(lvl_units)
            valid = lvl_units[0].o.valid
            level, k = nxt, k + 1
        root = units[-1][0]
        m.d.comb += tree_ready.eq(ready_in)
        # serializer: TRANS one scalar per word, TRANS_HALF two (the halves, from the root's user sideband). The
        # mode of every word in the tree travels in a FIFO beside it, so DRAIN may take the next job (reading the
        # other bank) while the tree still holds this job's last words.
        m.submodules.tree_modes = tmodes = SyncFIFO(width=1, depth=self.tree_latency + 4)
        ser_second = Signal()
        sq_half = tmodes.r_data[0]
        halves = root.o.payload.user
        t_in = t_valid & trans_drain & tree_ready
        t_out = root.o.valid & root.o.ready
        m.d.comb += [
            tmodes.w_en.eq(t_in), tmodes.w_data.eq(dj["mode"] == PEMode.TRANS_HALF), tmodes.r_en.eq(t_out),
            self.ys.valid.eq(root.o.valid),
            self.ys.payload.eq(Mux(sq_half, Mux(ser_second, halves[w:], halves[:w]), root.o.payload.z)),
            root.o.ready.eq(self.ys.ready & (~sq_half | ser_second)),
        ]
        with m.If(self.ys.valid & self.ys.ready & sq_half):
            m.d.sync += ser_second.eq(~ser_second)
        # the TRANS drain ends when every word of the job went into the tree
        with m.If(trans_drain & ~d_pending & ~t_valid):
            m.d.sync += d_busy.eq(0)
        return m
