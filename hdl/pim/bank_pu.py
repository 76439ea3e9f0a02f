"""DIMM-PIM bank PU ([L3] 4.2 and 4.4; docs/references.md): the processing unit beside one bank of
one x8 chip. Arithmetic contract: ``docs/pim.md`` (score phase / context phase); golden model
``sim/golden/pim_bank.py``; ports, pipeline and timing: ``docs/pim_bank_pu.md``.

``N = config.bank_pu_multipliers`` FP16 multipliers (``FPMul``) and ``N = config.bank_pu_adders`` FP16 adders
(``FPAdd``) with a configurable interconnect; ``N = 4`` for both presets (one 64-bit row-buffer word = 4 FP16
elements, [L3] 4.4). Elements are packed from the LSB: element ``j`` of a ``16 N``-bit word is bits
``[16 j, 16 j + 16)``.

Streams (payloads are ``data.StructLayout``s, fields from the LSB up):

``i`` (in), layout :attr:`BankPU.i_layout`: one item per RD (bit positions for ``N = 4``)
    * ``row``   ``[0, 64)``    the bank's row-buffer word (4 K elements / 4 V elements).
    * ``bcast`` ``[64, 128)``  the shared-buffer broadcast word (4 q elements / the ``G`` probabilities).
    * ``sel``   ``[128, 130)`` context mode: the bank's token set ``g = b div bpt``, ``p = bcast[16 sel,
      16 sel + 16)``; ignored in score mode. A per-item field (the rank PU ties it to the bank's constant).
    * ``mode``  ``[130]``      :data:`MODE_SCORE` = 0, :data:`MODE_CONTEXT` = 1.
    * ``first`` ``[131]``      clear the accumulator(s) to +0 before this item.
    * ``last``  ``[132]``      emit the result after this item.

    In general: ``row`` ``[0, 16 N)``, ``bcast`` ``[16 N, 32 N)``, ``sel`` ``max(1, log2 N)`` bits, then
    ``mode``, ``first``, ``last``.

    * score item: ``tree = add16(add16(mul16(q0,K0), mul16(q1,K1)), add16(mul16(q2,K2), mul16(q3,K3)))``
      (a balanced pairwise tree in index order for other ``N``; ``q = bcast``, ``K = row``), then
      ``acc = add16(acc, tree)`` in the last adder.
    * context item: ``p = bcast[sel]``; ``acc_j = add16(acc_j, mul16(p, row_j))`` for ``j < N``, every adder an
      accumulator.
    * A *job* is the items ``first .. last`` of one mode (a token's ``bpt`` bursts in score mode, a bank's
      tokens in context mode); a one-item job has ``first = last = 1``. Every job must start with
      ``first = 1`` and keep one mode (``first = 0`` after a mode change continues an unrelated register).

``o`` (out), layout :attr:`BankPU.o_layout`, one item per ``last`` input item, in input order
    ``data`` ``[0, 16 N)``: score: the FP16 partial in bits ``[0, 16)``, upper bits 0; context: ``acc_j`` in
    bits ``[16 j, 16 j + 16)``. ``mode`` ``[16 N]``: the job's mode.

Timing (``FPMul.latency`` = 3, ``FPAdd.latency`` = 4; attributes below, cycles of the PU clock):

* :attr:`latency` ``{"score": 17, "context": 9}`` (``N = 4``): a ``last`` item accepted on ``i`` in cycle
  ``t`` by an idle PU gives ``o.valid`` in cycle ``t + latency[mode]`` (1 input register + multiplier +
  ``log2 N`` tree levels + accumulator adder + 1 result-queue register; context skips the tree).
* :attr:`interval` = 4 = ``FPAdd.latency``: the minimum distance between issuing an item with ``first = 0``
  and the previous item (the accumulator loop; the adder result is bypassed into the next add). Items with
  ``first = 1`` need 1 cycle, except that a context item needs :attr:`switch_gap` = 9 cycles after a score item
  (adder sharing and in-order results). ``i.ready`` is low while the held item waits; nothing is dropped.
* :attr:`out_depth` results (default 4) may be pending (issued ``last`` items not yet taken from ``o``); a
  ``last`` item waits for a slot, so ``o`` backpressure stalls ``i`` and never loses data.
* Consequently, with items at least ``interval`` cycles apart (a context item ``switch_gap`` after a score
  item) and fewer than ``out_depth`` results pending, ``i.ready`` is high whenever an item arrives (the input
  register is free again 1 cycle after it is loaded). The real system (one RD_AB per tCCD_L = 8 cycles, the
  context phase long after the score phase, results drained) never sees ``i.ready`` low.
"""

from amaranth.hdl import Module, Signal, Mux, Cat, Const
from amaranth.lib import wiring, stream, data
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from hdl.fp.add import FPAdd
from hdl.fp.convert import FPConvert
from hdl.fp.format import FP16, FP32
from hdl.fp.mul import FPMul
from hdl.pim.config import PIMConfig

__all__ = ["BankPU", "MODE_SCORE", "MODE_CONTEXT", "GATE_DOMAINS"]

MODE_SCORE = 0
MODE_CONTEXT = 1

W = FP16.width
#: The clock domains of a gated bank PU (``BankPU(..., gated=True)``): the input register, then each stage of the
#: multipliers and of the adders; ``gate_en`` bit k is domain k's load in the cycle (docs/pim_bank_pu.md).
GATE_DOMAINS = ("h",) + tuple(f"mul_s{k + 1}" for k in range(FPMul.latency)) + \
    tuple(f"add_s{k + 1}" for k in range(FPAdd.latency))
_CTRL = data.StructLayout({"mode": 1, "first": 1, "last": 1})   # sideband carried through the FP units


class BankPU(wiring.Component):
    """One bank PU: ``N`` FP16 multipliers + ``N`` FP16 adders, score (tree + accumulator) or context
    (``N`` accumulators) mode per item. See the module docstring for ports, payloads and timing.

    Parameters: ``config`` (:class:`PIMConfig`: ``bank_pu_multipliers`` = ``N``, a power of two, and
    ``bank_pu_adders`` = ``N``), ``out_depth`` (keyword: result-queue entries, 2..64).
    """

    def __init__(self, config: PIMConfig, *, out_depth: int = 4, gated: bool = False):
        if not isinstance(config, PIMConfig):
            raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
        n = config.bank_pu_multipliers
        if n & (n - 1):
            raise ValueError(f"PIMConfig {config.name!r}: bank_pu_multipliers = {n} must be a power of two "
                             f"(balanced adder tree)")
        if config.bank_pu_adders != n:
            raise ValueError(f"PIMConfig {config.name!r}: bank_pu_adders = {config.bank_pu_adders} must equal "
                             f"bank_pu_multipliers = {n} (N - 1 tree adders + 1 accumulator; N accumulators)")
        # >= 2: a 1-deep SyncFIFO has zero-width pointers (lint ASCRANGE); 2 already covers tCCD_L pacing.
        if not isinstance(out_depth, int) or not 2 <= out_depth <= 64:
            raise ValueError(f"out_depth = {out_depth!r} outside [2, 64]")
        if not isinstance(gated, bool):
            raise ValueError(f"gated must be True or False, got {gated!r}")
        self.config = config
        #: Clock-gated input register and FP16 pipeline stages (docs/pim_bank_pu.md, "Clock gating"): the
        #: registers of :data:`GATE_DOMAINS` are clocked by domains of those names that the parent provides, gated
        #: clocks whose enables include ``gate_en`` (bit k: domain k loads in this cycle). The same bits and
        #: cycles; for simulators with Verilog's scheduling (Verilator), not Amaranth's simulator.
        self.gated = gated
        self.lanes = n
        self.levels = exact_log2(n)
        self.out_depth = out_depth
        self.context_acc = config.context_acc
        self.sel_width = max(1, ceil_log2(n))
        self.i_layout = data.StructLayout({"row": W * n, "bcast": W * n, "sel": self.sel_width,
                                           "mode": 1, "first": 1, "last": 1})
        self.o_layout = data.StructLayout({"data": W * n, "mode": 1})
        # Issue (cycle s) -> result at the output of the last adder (cycle s + *_out).
        self.score_out = FPMul.latency + FPAdd.latency * (self.levels + 1)
        # fp32 context accumulators: exact FP32 product + FP32 add, then the FP32 -> FP16 conversion of the job's
        # result (its own multipliers, adders and converters; the score path is the same in both formats)
        self.context_out = FPMul.latency + FPAdd.latency + (FPConvert.latency if self.context_acc == "fp32" else 0)
        #: ``last`` item accepted in cycle t by an idle PU -> ``o.valid`` in cycle ``t + latency[mode]``:
        #: +1 input register, +1 result-queue write.
        self.latency = {"score": self.score_out + 2, "context": self.context_out + 2}
        #: Minimum issue distance of a ``first = 0`` item from its predecessor (accumulator loop).
        self.interval = FPAdd.latency
        #: Minimum issue distance of a context item after a score item: the score item uses tree level l's
        #: adders at s + 3 + 4 l and the accumulator at s + 3 + 4 log2 N, a context item all adders at s' + 3,
        #: and the results must stay in order.
        self.switch_gap = self.score_out - self.context_out + 1
        ports = {
            "i": In(stream.Signature(self.i_layout)),
            "o": Out(stream.Signature(self.o_layout)),
        }
        if gated:
            ports["gate_en"] = Out(len(GATE_DOMAINS))
        super().__init__(ports)

    # -- cycle model ------------------------------------------------------------------------------------------
    def issue_gap(self, prev_mode, mode, first) -> int:
        """Cycles required between issuing the previous item (``prev_mode``, None if none) and this one."""
        if prev_mode is None:
            return 0
        gap = 1 if first else self.interval
        if prev_mode == MODE_SCORE and mode == MODE_CONTEXT:
            gap = max(gap, self.switch_gap)
        return gap

    def cycles(self, jobs) -> int:
        """Cycles of a stream run (``sim.backends`` counting) of ``jobs`` = [(mode, items), ...] with ``i``
        always valid and ``o`` always ready: from the first cycle to the cycle the last result is taken,
        inclusive. The RTL's issue rule, cycle by cycle: input register, issue gaps, result slots."""
        out = {MODE_SCORE: self.score_out + 1, MODE_CONTEXT: self.context_out + 1}   # issue -> o.valid
        accepted, prev_s, prev_mode, pending, end = 0, None, None, [], 0
        for mode, items in jobs:
            if items < 1:
                raise ValueError(f"a job needs at least one item, got {items}")
            for k in range(items):
                first, last = k == 0, k == items - 1
                s = accepted + 1
                if prev_s is not None:
                    s = max(s, prev_s + self.issue_gap(prev_mode, mode, first))
                if last:
                    # A result slot is free in cycle s once fewer than out_depth results are issued and
                    # not yet taken (taken in cycle r -> slot free from r + 1).
                    while sum(1 for r in pending if r >= s) >= self.out_depth:
                        s += 1
                    pending.append(s + out[mode])
                    end = s + out[mode] + 1
                accepted, prev_s, prev_mode = s, s, mode
        return end

    # -- hardware ---------------------------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        N, L = self.lanes, self.levels

        # ---- input register (no combinational path from i.payload / i.valid to i.ready)
        h = Signal(self.i_layout)
        h_valid = Signal()
        issue = Signal()
        m.d.comb += self.i.ready.eq(~h_valid | issue)
        with m.If(self.i.ready):
            m.d.sync += h_valid.eq(self.i.valid)
        # gated: h on its own clock, ticking when h loads (the multipliers' operands depend on h only)
        with m.If(self.i.ready & self.i.valid):
            m.d["h" if self.gated else "sync"] += h.eq(self.i.payload)
        if self.gated:
            m.d.comb += self.gate_en[0].eq(self.i.ready & self.i.valid)

        # ---- issue rule: accumulator loop / mode switch distance, result-queue slots
        gap_max = max(self.switch_gap, self.interval)
        since = Signal(range(gap_max + 1), init=gap_max)   # cycles since the last issue (saturating)
        prev_mode = Signal()
        pending = Signal(range(self.out_depth + 1))        # issued `last` items whose result is not taken
        need = Signal(range(gap_max + 1))
        m.d.comb += need.eq(Mux(h.first, 1, self.interval))
        with m.If((prev_mode == MODE_SCORE) & (h.mode == MODE_CONTEXT)):
            m.d.comb += need.eq(self.switch_gap)
        m.d.comb += issue.eq(h_valid & (since >= need) & (~h.last | (pending < self.out_depth)))
        with m.If(issue):
            m.d.sync += [since.eq(1), prev_mode.eq(h.mode)]
        with m.Elif(since != gap_max):
            m.d.sync += since.eq(since + 1)
        taken = self.o.valid & self.o.ready
        m.d.sync += pending.eq(pending + (issue & h.last) - taken)

        def elem(word, j):
            return word[W * j: W * (j + 1)]

        # ---- multipliers: a = q_j (score) or p (context), b = the row-buffer element
        p = elem(h.bcast, 0) if N == 1 else h.bcast.word_select(h.sel, W)
        fp32 = self.context_acc == "fp32"
        # Clock gating: stage k of every multiplier in domain mul_s<k>, of every adder in add_s<k>, each clocked in
        # the cycles one of its units loads that stage. The multipliers' operands come from h alone (gated): their
        # first stage is written in every tick; the adders' operands come through muxes whose selects change in
        # any cycle: their first stage is written only when it loads.
        mul_doms = [f"mul_s{k + 1}" for k in range(FPMul.latency)] if self.gated else None
        add_doms = [f"add_s{k + 1}" for k in range(FPAdd.latency)] if self.gated else None
        # fp32: context items go to the context lanes below; these serve the score items only
        mul_valid = Signal()
        m.d.comb += mul_valid.eq(issue & ~(h.mode == MODE_CONTEXT) if fp32 else issue)
        muls = []
        for j in range(N):
            mul = FPMul(fmt=FP16, user_width=_CTRL.size if j == 0 else 0, stage_domains=mul_doms,
                         load_first=False)
            m.submodules[f"mul{j}"] = mul
            m.d.comb += [
                mul.i.valid.eq(mul_valid),
                mul.i.payload.a.eq(Mux(h.mode == MODE_CONTEXT, p, elem(h.bcast, j))),
                mul.i.payload.b.eq(elem(h.row, j)),
                mul.o.ready.eq(1),
            ]
            muls.append(mul)
        m.d.comb += muls[0].i.payload.user.eq(Cat(h.mode, h.first, h.last))
        prod = [mul.o.payload.z for mul in muls]
        prod_valid = muls[0].o.valid
        prod_ctrl = data.View(_CTRL, muls[0].o.payload.user)

        # ---- adders (free running: o.ready = 1, so i.ready = 1); each carries the item's control bits
        adds = []
        for j in range(N):
            add = FPAdd(fmt=FP16, user_width=_CTRL.size, stage_domains=add_doms)
            m.submodules[f"add{j}"] = add
            m.d.comb += add.o.ready.eq(1)
            adds.append(add)
        if self.gated:
            # The multipliers share one valid input, so their stage loads are multiplier 0's (and the other three's
            # valid bits, read by nothing else, drop out of the netlist); the adders' differ.
            for units, doms in ((muls[:1], mul_doms), (adds, add_doms)):
                for k, name in enumerate(doms):
                    m.d.comb += self.gate_en[GATE_DOMAINS.index(name)].eq(Cat(u.stage_load[k] for u in units).any())
        z = [add.o.payload.z for add in adds]
        z_ctrl = [data.View(_CTRL, add.o.payload.user) for add in adds]

        def out_is(j, mode):
            return adds[j].o.valid & (z_ctrl[j].mode == mode)

        acc_s = Signal(W)                                   # score accumulator (adder N-1)
        acc_c = [Signal(W, name=f"acc_c{j}") for j in range(N)]   # context accumulators
        with m.If(out_is(N - 1, MODE_SCORE)):
            m.d.sync += acc_s.eq(z[N - 1])
        for j in range(N):
            with m.If(out_is(j, MODE_CONTEXT)):
                m.d.sync += acc_c[j].eq(z[j])

        def drive(add, valid, a, b, ctrl):
            m.d.comb += [add.i.valid.eq(valid), add.i.payload.a.eq(a), add.i.payload.b.eq(b),
                         add.i.payload.user.eq(ctrl)]

        # Sources of each adder. The issue rule guarantees at most one is valid in any cycle.
        ctx_valid = prod_valid & (prod_ctrl.mode == MODE_CONTEXT)
        score_src = []          # (valid, a, b, ctrl) per adder in score mode
        level_in = (prod_valid & (prod_ctrl.mode == MODE_SCORE), prod, prod_ctrl)
        base = 0
        for lvl in range(L):
            valid, vals, ctrl = level_in
            count = N >> (lvl + 1)
            for i in range(count):
                score_src.append((valid, vals[2 * i], vals[2 * i + 1], ctrl))
            idx = range(base, base + count)
            level_in = (out_is(base, MODE_SCORE), [z[k] for k in idx], z_ctrl[base])
            base += count
        tree_valid, tree_vals, tree_ctrl = level_in          # the tree result (the products if N == 1)
        acc_s_op = Mux(tree_ctrl.first, 0, Mux(out_is(N - 1, MODE_SCORE), z[N - 1], acc_s))
        score_src.append((tree_valid, acc_s_op, tree_vals[0], tree_ctrl))

        for j in range(N):
            acc_op = Mux(prod_ctrl.first, 0, Mux(out_is(j, MODE_CONTEXT), z[j], acc_c[j]))
            s_valid, s_a, s_b, s_ctrl = score_src[j]
            with m.If(ctx_valid):
                drive(adds[j], 1, acc_op, prod[j], prod_ctrl)
            with m.Else():
                drive(adds[j], s_valid, s_a, s_b, s_ctrl)

        # ---- fp32 context lanes: mul16 -> exact FP32 product, FP32 accumulator, FP32 -> FP16 of the job's result
        if fp32:
            ctx_res, ctx_done = self._fp32_context(m, h, issue, p, elem)
        else:
            ctx_res = Cat(*z)
            ctx_done = out_is(0, MODE_CONTEXT) & z_ctrl[0].last

        # ---- result queue: out_depth entries; `pending` guarantees it never overflows
        m.submodules.results = q = SyncFIFO(width=self.o_layout.size, depth=self.out_depth)
        score_done = out_is(N - 1, MODE_SCORE) & z_ctrl[N - 1].last
        m.d.comb += [
            q.w_en.eq(score_done | ctx_done),
            q.w_data.eq(Mux(ctx_done, Cat(ctx_res, Const(MODE_CONTEXT, 1)),
                            Cat(z[N - 1], Const(0, W * (N - 1)), Const(MODE_SCORE, 1)))),
            self.o.valid.eq(q.r_rdy),
            self.o.payload.eq(q.r_data),
            q.r_en.eq(self.o.ready),
        ]
        return m

    def _fp32_context(self, m, h, issue, p, elem):
        """Context mode with FP32 accumulators: per lane ``j`` an FPMul(FP16 -> FP32, exact), an FP32 FPAdd closing
        the accumulator loop (bypassed like the FP16 one), and an FPConvert(FP32 -> FP16) that rounds the job's
        accumulator once, on its ``last`` item. Returns (the 16 N-bit result, its valid)."""
        N = self.lanes
        valid = issue & (h.mode == MODE_CONTEXT)
        cmuls, cadds, convs = [], [], []
        for j in range(N):
            mul = FPMul(fmt=FP16, out_fmt=FP32, user_width=_CTRL.size if j == 0 else 0)
            add = FPAdd(fmt=FP32, user_width=_CTRL.size)
            conv = FPConvert(src=FP32, dst=FP16, user_width=_CTRL.size if j == 0 else 0)
            m.submodules[f"cmul{j}"], m.submodules[f"cadd{j}"], m.submodules[f"cconv{j}"] = mul, add, conv
            m.d.comb += [mul.i.valid.eq(valid), mul.i.payload.a.eq(p), mul.i.payload.b.eq(elem(h.row, j)),
                         mul.o.ready.eq(1), add.o.ready.eq(1), conv.o.ready.eq(1)]
            cmuls.append(mul)
            cadds.append(add)
            convs.append(conv)
        m.d.comb += cmuls[0].i.payload.user.eq(Cat(h.mode, h.first, h.last))
        pctrl = data.View(_CTRL, cmuls[0].o.payload.user)
        for j in range(N):
            acc = Signal(32, name=f"acc32_{j}")
            z = cadds[j].o.payload.z
            with m.If(cadds[j].o.valid):
                m.d.sync += acc.eq(z)
            op = Mux(pctrl.first, 0, Mux(cadds[j].o.valid, z, acc))
            actrl = data.View(_CTRL, cadds[j].o.payload.user)
            m.d.comb += [
                cadds[j].i.valid.eq(cmuls[0].o.valid),
                cadds[j].i.payload.a.eq(op), cadds[j].i.payload.b.eq(cmuls[j].o.payload.z),
                cadds[j].i.payload.user.eq(pctrl),
                convs[j].i.valid.eq(cadds[j].o.valid & actrl.last),
                convs[j].i.payload.a.eq(z),
            ]
            if j == 0:
                m.d.comb += convs[0].i.payload.user.eq(cadds[0].o.payload.user)
        done = convs[0].o.valid & data.View(_CTRL, convs[0].o.payload.user).last
        return Cat(*[c.o.payload.z for c in convs]), done
