"""Rank PU softmax unit of the DIMM-PIM ([L3] 4.3 / 4.4, docs/references.md; 6.1 set-up: "softmax unit
pipelined over chunks of sixteen FP16 elements (one per logic bank)"): the chunk softmax with the running
max / sum update (:class:`PIMSoftmaxUnit`) and the normalization of the stored exponentials
(:class:`PIMNormalizer`), in exactly the order of docs/pim.md. Golden model: ``sim/golden/pim_rank.py``
(:func:`chunk_softmax`, :func:`normalize`). Pipelines, latencies and unit counts: docs/pim_rank_pu.md.
"""

from amaranth.hdl import Module, Signal, Array, Mux, Cat, Const, signed
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from hdl.fp.add import FPAdd
from hdl.fp.convert import FPConvert
from hdl.fp.div import FPDiv
from hdl.fp.exp import FPExp
from hdl.fp.format import FP16, FP32
from hdl.fp.max import FPMax
from hdl.fp.mul import FPMul
from hdl.pim.config import PIMConfig

__all__ = ["PIMSoftmaxUnit", "PIMNormalizer", "scale_bits_rtl"]

W = FP16.width
NEG_INF = 0xFC00          # FP16 -inf: the score of a padded token (docs/pim.md)
SIGN = FP16.sign_mask     # negation is a sign flip (exact)
ONE32_EXP = FP32.bias << FP32.frac_bits   # binary32 exponent field of [1, 2)
S_WIDTH = 9               # s = binary32 exponent - 127, in [-127, 128]
# Running-update sequencers: part A (per chunk, at its exponential-pass start) and part B (per chunk, in order).
PA_IDLE, PA_MAX, PA_B = range(3)
PB_IDLE, PB_MUL1, PB_MULW, PB_ADDW, PB_FIN, PB_FINW = range(6)


def _check_chunk(config):
    if not isinstance(config, PIMConfig):
        raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
    ch = config.chunk
    if ch < 2 or ch & (ch - 1):
        raise ValueError(f"PIMConfig {config.name!r}: chunk = banks = {ch} must be a power of two >= 2 "
                         "(balanced max / sum trees over a chunk)")
    return ch


class PIMSoftmaxUnit(wiring.Component):
    """Chunk softmax of one head's scores after another, one score per cycle (``CH = config.chunk`` = 16).

    Ports (payloads packed from the LSB):

    ``i`` (in) :attr:`in_layout` = ``{s: 16, pad: 1, last: 1}``
        Scores ``s_t`` in token order, chunk after chunk (``CH`` items per chunk; a head is a whole number of
        chunks). ``pad``: token ``t >= L``, its score is replaced by -inf (0xFC00). ``last``: this chunk is the
        head's last (only the flag on the chunk's final item is used). Heads follow back to back.
    ``e`` (out) :attr:`e_layout` = ``{e: 16}``
        ``e_t = exp16(add16(s_t, -m_j))`` for every input item, in order (the rank PU buffer).
    ``m`` (out) :attr:`m_layout` = ``{m: 16}``
        ``m_j`` (FP16 max of the chunk's scores) once per chunk, in order; it is handed over when the chunk's
        exponentials start (before its first ``e``, not necessarily accepted before it).
    ``head`` (out) :attr:`head_layout` = ``{M: 16, z_m: 16, s: signed 9, Z: 32}``
        Once per head, after its last chunk: the running max ``M``, ``z_m = f16(Z mantissa in [1, 2))``
        and ``s`` (``Z = z_m32 * 2**s``: binary32 exponent field - 127, so ``0 <= s <= 17`` for real heads
        of <= 128K tokens) of the running sum ``Z`` (docs/pim.md), and ``Z`` itself (binary32; for
        observation: the normalization needs only ``M``, ``z_m``, ``s``).

    Pipeline (docs/pim_rank_pu.md): input pass (score -> 4-chunk score buffer, running ``FPMax`` per chunk:
    equal to the balanced max tree bit for bit, as max is exact); exponential pass (buffer read,
    ``FPAdd16(s, -m_j)``, ``FPExp``; starts a chunk in the cycle after the previous chunk's last read, so no
    bubbles); sum (``FPConvert`` 16->32 of every accepted ``e``, then a streaming balanced FP32 tree of
    ``log2(CH)`` ``FPAdd32``, one per level, pairs in index order); running update per chunk (``FPMax``
    ``M' = max(M, m_j)``, one ``FPAdd16 -> FPExp -> FPConvert`` chain for ``a`` and ``b``, one ``FPMul32``
    for ``Z a`` and ``z_j b``, one ``FPAdd32``); end of head (``FPConvert`` 32->16 of ``z_m``).
    Throughput: one score per cycle in steady state with all outputs ready (chunks back to back, heads back
    to back). Fill latency: :attr:`e_latency` cycles from a chunk's last score accepted to its first ``e``
    valid; a head's ``head`` item follows its last ``e`` after at most :attr:`head_latency` cycles.
    Backpressure on any output stalls the input (``i.ready`` low), nothing is dropped.
    """

    #: Score-buffer slots (chunks): design choice, 4 so the input pass never waits for the exponential pass
    #: at full rate (a slot is free again 2 chunk times after it was filled) and the slot pointer wraps.
    SLOTS = 4
    #: Chunks between the start of their exponential pass and their running update (ring of a / b / z_j):
    #: design choice, 4 >= 1 + ceil((exp chain 12 + sum tree 18 + update 12) / 16).
    RING = 4

    def __init__(self, config: PIMConfig):
        self.chunk = _check_chunk(config)
        self.config = config
        self.levels = exact_log2(self.chunk)
        #: last score of a chunk accepted in cycle t -> its first e valid in cycle t + e_latency:
        #: FPMax 1, slot-ready register 1, buffer read 1, FPAdd 4, FPExp 7 (sources: hdl/fp/*.py latency).
        self.e_latency = FPMax.latency + 1 + 1 + FPAdd.latency + FPExp.latency
        #: last e of a head accepted in cycle t -> head valid by t + head_latency (FPConvert 2, sum tree
        #: 4 per level, capture 1, update: issue 2 + FPMul 3 + FPAdd 4 + 1, end: 1 + FPConvert 2 + 1).
        self.head_latency = (FPConvert.latency + FPAdd.latency * self.levels + 1
                             + 2 + FPMul.latency + FPAdd.latency + 1 + 1 + FPConvert.latency + 1)
        self.in_layout = data.StructLayout({"s": W, "pad": 1, "last": 1})
        self.e_layout = data.StructLayout({"e": W})
        self.m_layout = data.StructLayout({"m": W})
        self.head_layout = data.StructLayout({"M": W, "z_m": W, "s": signed(S_WIDTH), "Z": FP32.width})
        super().__init__({
            "i": In(stream.Signature(self.in_layout)),
            "e": Out(stream.Signature(self.e_layout)),
            "m": Out(stream.Signature(self.m_layout)),
            "head": Out(stream.Signature(self.head_layout)),
        })

    def elaborate(self, platform):
        m = Module()
        CH, NS, NR = self.chunk, self.SLOTS, self.RING
        ip = self.i.payload
        qb = self.levels
        sb = exact_log2(NS)
        rb = exact_log2(NR)

        # ================= input pass: score buffer + running max per chunk
        m.submodules.buf = buf = memory.Memory(shape=W, depth=NS * CH, init=[])
        wr = buf.write_port()
        rd = buf.read_port()
        q = Signal(qb)
        wslot = Signal(sb)
        busy = Array(Signal(name=f"busy{k}") for k in range(NS))      # slot allocated (until read out)
        sready = Array(Signal(name=f"sready{k}") for k in range(NS))  # m_j known, exp pass may start
        slot_m = Array(Signal(W, name=f"slot{k}_m") for k in range(NS))
        slot_last = Array(Signal(name=f"slot{k}_last") for k in range(NS))

        x = Mux(ip.pad, NEG_INF, ip.s)
        in_fire = Signal()
        m.d.comb += [
            self.i.ready.eq((q != 0) | ~busy[wslot]),
            in_fire.eq(self.i.valid & self.i.ready),
            wr.addr.eq(Cat(q, wslot)),
            wr.data.eq(x),
            wr.en.eq(in_fire),
        ]
        with m.If(in_fire):
            m.d.sync += q.eq(q + 1)     # wraps at CH (power of two)
            with m.If(q == CH - 1):
                m.d.sync += wslot.eq(wslot + 1)

        m.submodules.rmax = rmax = FPMax(user_width=2 + sb)   # user: {chunk end, head last, slot}
        racc = Signal(W)
        fwd = Mux(rmax.o.valid, rmax.o.payload.z, racc)
        m.d.comb += [
            rmax.i.valid.eq(in_fire),
            rmax.i.payload.a.eq(x),
            rmax.i.payload.b.eq(Mux(q == 0, x, fwd)),
            rmax.i.payload.user.eq(Cat(q == CH - 1, ip.last, wslot)),
            rmax.o.ready.eq(1),
        ]
        with m.If(rmax.o.valid):
            m.d.sync += racc.eq(rmax.o.payload.z)
        r_end, r_last, r_slot = rmax.o.payload.user[0], rmax.o.payload.user[1], rmax.o.payload.user[2:]

        # ================= exponential pass
        m.submodules.eadd = eadd = FPAdd(fmt=FP16)
        m.submodules.eexp = eexp = FPExp()
        ract = Signal()
        rslot = Signal(sb)
        rq = Signal(qb)
        rm = Signal(W)
        s0_valid = Signal()
        s0_m = Signal(W)
        rd_adv = Signal()
        m.d.comb += rd_adv.eq(~s0_valid | eadd.i.ready)

        # running-update ring (allocated at an exp-pass start, freed by the update)
        r_count = Signal(range(NR + 1))
        r_tail = Signal(rb)
        r_head = Signal(rb)
        r_z_ptr = Signal(rb)
        ring_Mn = Array(Signal(W, name=f"ring{k}_M") for k in range(NR))
        ring_a = Array(Signal(32, name=f"ring{k}_a") for k in range(NR))
        ring_b = Array(Signal(32, name=f"ring{k}_b") for k in range(NR))
        ring_z = Array(Signal(32, name=f"ring{k}_z") for k in range(NR))
        ring_first = Array(Signal(name=f"ring{k}_first") for k in range(NR))
        ring_last = Array(Signal(name=f"ring{k}_last") for k in range(NR))
        ring_a_ok = Array(Signal(name=f"ring{k}_a_ok") for k in range(NR))
        ring_b_ok = Array(Signal(name=f"ring{k}_b_ok") for k in range(NR))
        ring_z_ok = Array(Signal(name=f"ring{k}_z_ok") for k in range(NR))
        pop = Signal()

        def put(cond, idx, *pairs):
            # Ring writes as one comparison per entry (an Array-indexed target becomes an incomplete case).
            for k in range(NR):
                with m.If(cond & (idx == k)):
                    m.d.sync += [arr[k].eq(val) for arr, val in pairs]

        pa_idle = Signal()
        hfirst = Signal(init=1)      # the next chunk to start is a head's first
        m_valid = Signal()
        m_data = Signal(W)
        m.d.comb += [self.m.valid.eq(m_valid), self.m.payload.m.eq(m_data)]
        with m.If(self.m.valid & self.m.ready):
            m.d.sync += m_valid.eq(0)

        start = Signal()
        issue = Signal()
        cur_idx = Mux(ract, rq, 0)
        cur_m = Mux(ract, rm, slot_m[rslot])
        m.d.comb += [
            start.eq(~ract & sready[rslot] & (~m_valid | self.m.ready) & (r_count < NR) & pa_idle & rd_adv),
            issue.eq(rd_adv & (ract | start)),
            rd.addr.eq(Cat(cur_idx, rslot)),
            rd.en.eq(rd_adv),
        ]
        with m.If(rd_adv):
            m.d.sync += [s0_valid.eq(issue), s0_m.eq(cur_m)]
        with m.If(issue):
            with m.If(cur_idx == CH - 1):
                m.d.sync += [ract.eq(0), rslot.eq(rslot + 1)]
            with m.Else():
                m.d.sync += [ract.eq(1), rq.eq(cur_idx + 1), rm.eq(cur_m)]
        free = issue & (cur_idx == CH - 1)
        for k in range(NS):
            with m.If(in_fire & (q == 0) & (wslot == k)):
                m.d.sync += busy[k].eq(1)
            with m.Elif(free & (rslot == k)):
                m.d.sync += busy[k].eq(0)
            with m.If(rmax.o.valid & r_end & (r_slot == k)):
                m.d.sync += [sready[k].eq(1), slot_m[k].eq(rmax.o.payload.z), slot_last[k].eq(r_last)]
            with m.Elif(free & (rslot == k)):
                m.d.sync += sready[k].eq(0)
        with m.If(start):
            m.d.sync += [m_valid.eq(1), m_data.eq(slot_m[rslot]), hfirst.eq(slot_last[rslot]),
                         r_tail.eq(r_tail + 1)]
        m.d.sync += r_count.eq(r_count + start - pop)

        m.d.comb += [
            eadd.i.valid.eq(s0_valid),
            eadd.i.payload.a.eq(rd.data),
            eadd.i.payload.b.eq(s0_m ^ SIGN),
            eexp.i.valid.eq(eadd.o.valid),
            eexp.i.payload.x.eq(eadd.o.payload.z),
            eadd.o.ready.eq(eexp.i.ready),
            self.e.valid.eq(eexp.o.valid),
            self.e.payload.e.eq(eexp.o.payload.z),
            eexp.o.ready.eq(self.e.ready),
        ]

        # ================= chunk sum: FPConvert, then a streaming balanced FP32 tree (one adder per level)
        e_fire = self.e.valid & self.e.ready
        m.submodules.econv = econv = FPConvert(src=FP16, dst=FP32)
        m.d.comb += [econv.i.valid.eq(e_fire), econv.i.payload.a.eq(self.e.payload.e), econv.o.ready.eq(1)]
        v, val = econv.o.valid, econv.o.payload.z
        for k in range(self.levels):
            add = FPAdd(fmt=FP32)
            m.submodules[f"zsum{k}"] = add
            left = Signal(32, name=f"zsum{k}_left")
            have = Signal(name=f"zsum{k}_have")
            with m.If(v):
                m.d.sync += [have.eq(~have), left.eq(val)]
            m.d.comb += [add.i.valid.eq(v & have), add.i.payload.a.eq(left), add.i.payload.b.eq(val),
                         add.o.ready.eq(1)]
            v, val = add.o.valid, add.o.payload.z
        put(v, r_z_ptr, (ring_z, val), (ring_z_ok, 1))
        with m.If(v):
            m.d.sync += r_z_ptr.eq(r_z_ptr + 1)

        # ================= running update, part A (at the exp-pass start): M' = max(M, m_j), a, b
        M = Signal(W)
        pa_mj = Signal(W)
        pa_Mp = Signal(W)
        pa_Mold = Signal(W)
        pa_idx = Signal(rb)
        m.submodules.mmax = mmax = FPMax()
        m.submodules.uadd = uadd = FPAdd(fmt=FP16, user_width=rb + 1)
        m.submodules.uexp = uexp = FPExp(user_width=rb + 1)
        m.submodules.uconv = uconv = FPConvert(src=FP16, dst=FP32, user_width=rb + 1)
        m.d.comb += [
            mmax.i.payload.a.eq(M), mmax.i.payload.b.eq(slot_m[rslot]), mmax.o.ready.eq(1),
            uexp.i.valid.eq(uadd.o.valid), uexp.i.payload.x.eq(uadd.o.payload.z),
            uexp.i.payload.user.eq(uadd.o.payload.user), uadd.o.ready.eq(uexp.i.ready),
            uconv.i.valid.eq(uexp.o.valid), uconv.i.payload.a.eq(uexp.o.payload.z),
            uconv.i.payload.user.eq(uexp.o.payload.user), uexp.o.ready.eq(uconv.i.ready),
            uconv.o.ready.eq(1),
        ]
        pa_state = Signal(2)
        with m.If(pa_state == PA_IDLE):
            m.d.comb += pa_idle.eq(1)
            with m.If(start):
                mj = slot_m[rslot]
                put(1, r_tail, (ring_last, slot_last[rslot]), (ring_first, hfirst), (ring_a_ok, hfirst),
                    (ring_b_ok, hfirst), (ring_z_ok, 0))
                with m.If(hfirst):
                    m.d.sync += M.eq(mj)
                    put(1, r_tail, (ring_Mn, mj))
                with m.Else():
                    m.d.comb += mmax.i.valid.eq(1)
                    m.d.sync += [pa_mj.eq(mj), pa_idx.eq(r_tail), pa_Mold.eq(M)]
                    m.d.sync += pa_state.eq(PA_MAX)
        with m.Elif(pa_state == PA_MAX):      # FPMax latency 1: M' at the output now
            Mp = mmax.o.payload.z
            m.d.comb += [uadd.i.valid.eq(1), uadd.i.payload.a.eq(pa_Mold), uadd.i.payload.b.eq(Mp ^ SIGN),
                         uadd.i.payload.user.eq(Cat(Const(0, 1), pa_idx))]
            m.d.sync += [pa_Mp.eq(Mp), M.eq(Mp)]
            put(1, pa_idx, (ring_Mn, Mp))
            m.d.sync += pa_state.eq(PA_B)
        with m.Else():   # PA_B
            m.d.comb += [uadd.i.valid.eq(1), uadd.i.payload.a.eq(pa_mj), uadd.i.payload.b.eq(pa_Mp ^ SIGN),
                         uadd.i.payload.user.eq(Cat(Const(1, 1), pa_idx))]
            m.d.sync += pa_state.eq(PA_IDLE)
        u_which, u_idx = uconv.o.payload.user[0], uconv.o.payload.user[1:]
        put(uconv.o.valid & u_which, u_idx, (ring_b, uconv.o.payload.z), (ring_b_ok, 1))
        put(uconv.o.valid & ~u_which, u_idx, (ring_a, uconv.o.payload.z), (ring_a_ok, 1))

        # ================= running update, part B (per chunk, in order): Z = Z a + z_j b; end of head
        Z = Signal(32)
        P0 = Signal(32)
        M_fin = Signal(W)
        s_fin = Signal(signed(S_WIDTH))
        head_valid = Signal()
        head_zm = Signal(W)
        m.d.comb += [self.head.valid.eq(head_valid), self.head.payload.M.eq(M_fin),
                     self.head.payload.z_m.eq(head_zm), self.head.payload.s.eq(s_fin),
                     self.head.payload.Z.eq(Z)]
        with m.If(self.head.valid & self.head.ready):
            m.d.sync += head_valid.eq(0)
        m.submodules.umul = umul = FPMul(fmt=FP32, user_width=1)
        m.submodules.zadd = zadd = FPAdd(fmt=FP32)
        m.submodules.zconv = zconv = FPConvert(src=FP32, dst=FP16)
        m.d.comb += [umul.o.ready.eq(1), zadd.o.ready.eq(1), zconv.o.ready.eq(1)]
        h_ok = (r_count != 0) & ring_a_ok[r_head] & ring_b_ok[r_head] & ring_z_ok[r_head]
        h_last = ring_last[r_head]
        m.d.comb += [zadd.i.payload.a.eq(P0), zadd.i.payload.b.eq(umul.o.payload.z),
                     zconv.i.payload.a.eq(Cat(Z[:FP32.frac_bits], Const(FP32.bias, FP32.exp_bits), Const(0, 1)))]
        with m.If(umul.o.valid & ~umul.o.payload.user):
            m.d.sync += P0.eq(umul.o.payload.z)
        pb_state = Signal(3)
        with m.If(pb_state == PB_IDLE):
            with m.If(h_ok & (~h_last | ~head_valid)):
                with m.If(ring_first[r_head]):
                    m.d.comb += pop.eq(1)
                    m.d.sync += [Z.eq(ring_z[r_head]), r_head.eq(r_head + 1)]
                    with m.If(h_last):
                        m.d.sync += M_fin.eq(ring_Mn[r_head])
                        m.d.sync += pb_state.eq(PB_FIN)
                with m.Else():
                    m.d.comb += [umul.i.valid.eq(1), umul.i.payload.a.eq(Z),
                                 umul.i.payload.b.eq(ring_a[r_head]), umul.i.payload.user.eq(0)]
                    m.d.sync += pb_state.eq(PB_MUL1)
        with m.Elif(pb_state == PB_MUL1):
            m.d.comb += [umul.i.valid.eq(1), umul.i.payload.a.eq(ring_z[r_head]),
                         umul.i.payload.b.eq(ring_b[r_head]), umul.i.payload.user.eq(1)]
            m.d.sync += pb_state.eq(PB_MULW)
        with m.Elif(pb_state == PB_MULW):
            with m.If(umul.o.valid & umul.o.payload.user):
                m.d.comb += zadd.i.valid.eq(1)
                m.d.sync += pb_state.eq(PB_ADDW)
        with m.Elif(pb_state == PB_ADDW):
            with m.If(zadd.o.valid):
                m.d.comb += pop.eq(1)
                m.d.sync += [Z.eq(zadd.o.payload.z), r_head.eq(r_head + 1)]
                with m.If(h_last):
                    m.d.sync += M_fin.eq(ring_Mn[r_head])
                    m.d.sync += pb_state.eq(PB_FIN)
                with m.Else():
                    m.d.sync += pb_state.eq(PB_IDLE)
        with m.Elif(pb_state == PB_FIN):
            m.d.comb += zconv.i.valid.eq(1)
            m.d.sync += s_fin.eq(Z[FP32.frac_bits:FP32.frac_bits + FP32.exp_bits] - FP32.bias)
            m.d.sync += pb_state.eq(PB_FINW)
        with m.Else():   # PB_FINW
            with m.If(zconv.o.valid):
                m.d.sync += [head_valid.eq(1), head_zm.eq(zconv.o.payload.z)]
                m.d.sync += pb_state.eq(PB_IDLE)
        return m


def scale_bits_rtl(s):
    """FP16 bits of ``2**-s`` for a signed Amaranth value ``s`` (exact for -15 <= s <= 24; +inf below,
    +0 above): the constant of the normalization's last multiply. Mirrored by ``pim_rank.scale_bits``."""
    field = Const(FP16.bias, 6) - s                      # biased exponent 15 - s
    sub = Const(1, 11) << (24 - s)[:5]                   # 2**-s = 2**(24 - s) ulps of 2**-24 for 15 <= s <= 24
    return Mux(s < -FP16.bias, FP16.inf_bits,
               Mux(s < FP16.bias, (field[:5] << FP16.frac_bits),
                   Mux(s <= 24, sub, 0)))[:W]


class PIMNormalizer(wiring.Component):
    """Normalization of the stored exponentials (docs/pim.md), one token per cycle, fully pipelined.

    Ports:

    ``i`` (in) :attr:`in_layout` = ``{e: 16, m: 16, M: 16, z_m: 16, s: signed 9, pad: 1}``
        Per token ``t`` of chunk ``j``: ``e = e_t`` and ``m = m_j`` from the rank PU buffer, and the head's
        ``M``, ``z_m``, ``s`` (as :class:`PIMSoftmaxUnit` ``head`` gave them, held by the rank PU); ``pad``:
        ``t >= L``.
    ``o`` (out) :attr:`out_layout` = ``{p: 16}``
        ``p_t = mul16(mul16(e_t, g_j), 2**-s)`` with ``f_j = exp16(add16(m_j, -M))``,
        ``g_j = div16(f_j, z_m)``; ``+0`` for padded tokens. In order.

    Chain: ``FPAdd16 -> FPExp -> FPDiv -> FPMul16 -> FPMul16`` with real handshakes between the units;
    ``f_j`` / ``g_j`` are recomputed per token (the same bits for every token of a chunk, and free in a
    pipeline that accepts one token per cycle). Latency :attr:`latency` = 4 + 7 + 7 + 3 + 3 = 24 cycles.
    """

    latency = FPAdd.latency + FPExp.latency + FPDiv.latency + 2 * FPMul.latency

    def __init__(self, config: PIMConfig):
        _check_chunk(config)
        self.config = config
        self.in_layout = data.StructLayout({"e": W, "m": W, "M": W, "z_m": W, "s": signed(S_WIDTH), "pad": 1})
        self.out_layout = data.StructLayout({"p": W})
        super().__init__({
            "i": In(stream.Signature(self.in_layout)),
            "o": Out(stream.Signature(self.out_layout)),
        })

    def elaborate(self, platform):
        m = Module()
        ip = self.i.payload
        m.submodules.add = add = FPAdd(fmt=FP16, user_width=3 * W + 1)     # user: e, z_m, scale, pad
        m.submodules.fexp = exp = FPExp(user_width=3 * W + 1)
        m.submodules.div = div = FPDiv(user_width=2 * W + 1)                 # user: e, scale, pad
        m.submodules.mul1 = mul1 = FPMul(fmt=FP16, user_width=W + 1)        # user: scale, pad
        m.submodules.mul2 = mul2 = FPMul(fmt=FP16, user_width=1)            # user: pad

        def link(src, dst):
            m.d.comb += [dst.i.valid.eq(src.o.valid), src.o.ready.eq(dst.i.ready)]

        m.d.comb += [
            add.i.valid.eq(self.i.valid), self.i.ready.eq(add.i.ready),
            add.i.payload.a.eq(ip.m), add.i.payload.b.eq(ip.M ^ SIGN),
            add.i.payload.user.eq(Cat(ip.e, ip.z_m, scale_bits_rtl(ip.s), ip.pad)),
        ]
        link(add, exp)
        m.d.comb += [exp.i.payload.x.eq(add.o.payload.z), exp.i.payload.user.eq(add.o.payload.user)]
        link(exp, div)
        u = exp.o.payload.user
        m.d.comb += [div.i.payload.a.eq(exp.o.payload.z), div.i.payload.b.eq(u[W:2 * W]),
                     div.i.payload.user.eq(Cat(u[:W], u[2 * W:]))]
        link(div, mul1)
        u = div.o.payload.user
        m.d.comb += [mul1.i.payload.a.eq(u[:W]), mul1.i.payload.b.eq(div.o.payload.z),
                     mul1.i.payload.user.eq(u[W:])]
        link(mul1, mul2)
        u = mul1.o.payload.user
        m.d.comb += [mul2.i.payload.a.eq(mul1.o.payload.z), mul2.i.payload.b.eq(u[:W]),
                     mul2.i.payload.user.eq(u[W])]
        m.d.comb += [
            self.o.valid.eq(mul2.o.valid), mul2.o.ready.eq(self.o.ready),
            self.o.payload.p.eq(Mux(mul2.o.payload.user, 0, mul2.o.payload.z)),
        ]
        return m
