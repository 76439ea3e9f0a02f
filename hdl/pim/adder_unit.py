"""Rank PU adder unit of the DIMM-PIM ([L3] 4.3 / 4.4, docs/references.md; 6.1 set-up: "adder unit of eight
FP16 adders"): ``config.rank_adders`` FP16 ``FPAdd`` units, configurable per item as the score adder tree over
the chips or as per-lane accumulators for the final context aggregation (docs/pim.md, docs/pim_rank_pu.md).
Golden model: ``sim/golden/pim_rank.py`` (:func:`score_tree`, :func:`aggregate`).
"""

from amaranth.hdl import Module, Signal, Array, Mux, Cat
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, exact_log2

from hdl.fp.add import FPAdd
from hdl.fp.format import FP16
from hdl.pim.config import PIMConfig

__all__ = ["AdderUnit"]

W = FP16.width
NEG_ZERO = FP16.sign_mask  # -0: add16(-0, x) == x for every non-NaN x (and -0 + +0 = +0), NaN -> canonical NaN


class AdderUnit(wiring.Component):
    """``A = config.rank_adders`` FP16 adders shared by two modes, selected per item.

    Ports (payloads packed from the LSB; :attr:`lanes` ``N = max(A, chips)`` lanes, 8 for PAPER and TINY;
    ``S = config.elems_per_chip`` accumulator slots):

    ``i`` (in) :attr:`in_layout`
        ``data`` (``N x 16``: lane ``l`` in bits ``[16 l, 16 l + 16)``), ``mode`` (1: :attr:`TREE` = 0,
        :attr:`ACC` = 1), ``idx`` (``bits_for(S - 1)``, acc mode: accumulator slot), ``first`` (1), ``last`` (1).
    ``o`` (out) :attr:`out_layout`
        ``data`` (``N x 16``), ``mode`` (1), ``idx`` (slot, acc mode; 0 in tree mode).

    **Tree mode** (``mode = TREE``): one item per token, lane ``c`` = chip ``c``'s partial score ``p_c``
    (lanes ``>= chips`` ignored; ``idx/first/last`` ignored). Output: one item per input item, in order,
    ``data`` lane 0 = ``s_t`` = balanced tree over the chips, pairs ``(0,1), (2,3), ..`` then pairs of those
    (docs/pim.md score phase), other lanes 0. Adders ``0 .. chips/2 - 1`` are level 0, the next ``chips/4``
    level 1, ...: ``chips - 1`` adders (7 for 8 chips, 1 for 2). One token per cycle; latency
    :attr:`tree_latency` = ``4 * log2(chips)`` cycles (12 for PAPER, 4 for TINY) from acceptance on ``i`` to
    ``o.valid``.

    **Accumulator mode** (``mode = ACC``): every lane ``l`` has ``S`` accumulator registers ``r[l][idx]``; an
    item updates slot ``idx`` of lanes ``0 .. A-1``: ``r = add16(-0, data)`` when ``first`` (i.e. ``r = data``,
    NaN canonicalized), else ``r = add16(r, data)``; every adder is lane ``l``'s adder, ``a = r`` (or -0),
    ``b = data``. When ``last`` is set the item also produces one output item (``data`` = the updated
    ``r[.][idx]``, ``idx``) after :attr:`acc_latency` = 4 cycles; other items produce no output. Final context
    aggregation (docs/pim.md): lane ``c`` = chip ``c``, slot ``idx = 4 k + j``; feed ``g = 0 .. G-1`` with
    ``first`` on ``g = 0`` and ``last`` on ``g = G-1`` (``data`` lane ``c`` = accumulator ``j`` of bank
    ``g bpt + k`` of chip ``c``); output lane ``c`` = ``out[c E + idx]``. Any order works; an item whose slot
    has an add in flight (loop-carried: FPAdd latency 4) waits (``i.ready`` low) unless it is ``first``, so
    feeding the slots round-robin (``g`` outer, ``idx`` inner, the order the bank PUs' results arrive over
    the DQ links) runs at one item per cycle with ``S >= 4`` slots.

    Mode switches: an item whose ``mode`` differs from the items in flight waits until the unit is empty
    (the adders are rewired between the modes). Real ``valid``/``ready`` handshakes on both ports; ``o``
    backpressure stalls the adders (and, in acc mode, only items that write ``o`` need ``o.ready`` to retire).
    """

    TREE = 0
    ACC = 1
    #: Both modes: one FPAdd per level / per item (source: hdl/fp/add.py).
    acc_latency = FPAdd.latency

    def __init__(self, config: PIMConfig):
        if not isinstance(config, PIMConfig):
            raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
        C = config.chips
        if C < 2 or C & (C - 1):
            raise ValueError(f"PIMConfig {config.name!r}: chips = {C} must be a power of two >= 2 "
                             "(balanced adder tree over the chips)")
        self.config = config
        self.adders = config.rank_adders
        #: Item lanes: one per adder (acc mode) and at least one per chip (tree mode).
        self.lanes = max(config.rank_adders, C)
        self.chips = C
        self.slots = config.elems_per_chip
        self.levels = exact_log2(C)
        self.tree_latency = FPAdd.latency * self.levels
        self.idx_bits = bits_for(self.slots - 1)
        self.in_layout = data.StructLayout({
            "data": W * self.lanes, "mode": 1, "idx": self.idx_bits, "first": 1, "last": 1})
        self.out_layout = data.StructLayout({"data": W * self.lanes, "mode": 1, "idx": self.idx_bits})
        super().__init__({
            "i": In(stream.Signature(self.in_layout)),
            "o": Out(stream.Signature(self.out_layout)),
        })

    def elaborate(self, platform):
        m = Module()
        N, C, S = self.adders, self.chips, self.slots
        ip = self.i.payload
        uw = self.idx_bits + 1
        adders = [FPAdd(fmt=FP16, user_width=uw) for _ in range(N)]
        for k, a in enumerate(adders):
            m.submodules[f"add{k}"] = a

        # ---- mode: the adders are wired for `mode` while anything is in flight
        mode = Signal()
        inflight = Signal(range(self.tree_latency + 2))   # a tree holds <= 4 items per level
        mode_ok = (inflight == 0) | (ip.mode == mode)
        cur_acc = Mux(inflight == 0, ip.mode, mode)   # wiring used for an issue this cycle
        i_fire = Signal()
        o_fire = Signal()
        acc_retire = Signal()

        # ---- tree wiring: level k uses adders base_k .. base_k + C / 2**(k+1) - 1
        levels, base = [], 0
        for k in range(self.levels):
            n = C >> (k + 1)
            levels.append(list(range(base, base + n)))
            base += n
        final = levels[-1][0]

        # ---- accumulator registers and the per-slot in-flight count (hazard: a read of a slot being written)
        regs = [Array(Signal(W, name=f"acc{l}_{s}") for s in range(S)) for l in range(N)]
        pend = Array(Signal(range(FPAdd.latency + 2), name=f"pend{s}") for s in range(S))
        hazard = (pend[ip.idx] != 0) & ~ip.first

        # Representative handshake: adder 0 is level 0 in tree mode and lane 0 in acc mode; every adder used
        # by one mode gets the same valid/ready as adder 0 (tree: as its level's first adder), so they stay
        # in lock step.
        lead = adders[0]
        acc_mode = Signal()
        m.d.comb += acc_mode.eq(cur_acc)
        ok = mode_ok & Mux(acc_mode, ~hazard, 1)
        m.d.comb += [
            self.i.ready.eq(lead.i.ready & ok),
            i_fire.eq(self.i.valid & self.i.ready),
        ]
        last_out = lead.o.payload.user[-1]
        acc_out_ready = ~last_out | self.o.ready
        with m.If(acc_mode):
            for l, a in enumerate(adders):
                x = ip.data[W * l:W * (l + 1)]
                m.d.comb += [
                    a.i.valid.eq(self.i.valid & ok),
                    a.i.payload.a.eq(Mux(ip.first, NEG_ZERO, regs[l][ip.idx])),
                    a.i.payload.b.eq(x),
                    a.i.payload.user.eq(ip.idx | (ip.last << self.idx_bits)),
                    a.o.ready.eq(acc_out_ready),
                ]
        with m.Else():
            for k, lv in enumerate(levels):
                for j, ai in enumerate(lv):
                    a = adders[ai]
                    if k == 0:
                        src_a = ip.data[W * 2 * j:W * (2 * j + 1)]
                        src_b = ip.data[W * (2 * j + 1):W * (2 * j + 2)]
                        valid = self.i.valid & ok
                    else:
                        prev = levels[k - 1]
                        src_a = adders[prev[2 * j]].o.payload.z
                        src_b = adders[prev[2 * j + 1]].o.payload.z
                        valid = adders[prev[0]].o.valid
                    m.d.comb += [a.i.valid.eq(valid), a.i.payload.a.eq(src_a), a.i.payload.b.eq(src_b)]
                    nxt_ready = self.o.ready if k == self.levels - 1 else adders[levels[k + 1][0]].i.ready
                    m.d.comb += a.o.ready.eq(nxt_ready)

        # ---- output
        acc_data = Signal(W * self.lanes)
        m.d.comb += acc_data.eq(Cat(*[a.o.payload.z for a in adders]))
        with m.If(acc_mode):
            m.d.comb += [
                self.o.valid.eq(lead.o.valid & last_out),
                self.o.payload.data.eq(acc_data),
                self.o.payload.idx.eq(lead.o.payload.user[:self.idx_bits]),
                self.o.payload.mode.eq(self.ACC),
                acc_retire.eq(lead.o.valid & acc_out_ready),
            ]
        with m.Else():
            m.d.comb += [
                self.o.valid.eq(adders[final].o.valid),
                self.o.payload.data.eq(adders[final].o.payload.z),
                self.o.payload.mode.eq(self.TREE),
            ]
        m.d.comb += o_fire.eq(self.o.valid & self.o.ready)

        # ---- bookkeeping
        done = Mux(acc_mode, acc_retire, o_fire & ~acc_mode)
        m.d.sync += inflight.eq(inflight + i_fire - done)
        with m.If(i_fire):
            m.d.sync += mode.eq(ip.mode)
        ridx = lead.o.payload.user[:self.idx_bits]
        for s in range(S):
            inc = i_fire & acc_mode & (ip.idx == s)
            dec = acc_retire & (ridx == s)
            m.d.sync += pend[s].eq(pend[s] + inc - dec)
            with m.If(dec):
                for l in range(N):
                    m.d.sync += regs[l][s].eq(adders[l].o.payload.z)
        return m

