"""Random-program fuzzing of the CXL NDP device RTL (``sim.cxl.system.CXLSystem``) against the golden device.

One *case* is an independent random program on 2-4 queues: random rings (1, 2 or 4 slots, so rings wrap),
random data windows (64-byte aligned, sometimes empty or, unless ``unaligned=False``, with an unaligned limit),
random descriptors (mostly small valid GEMV / GEMM / SOFTMAX / LOAD / STORE with KEEP / CHAIN, some with operands
outside the queue's window -- in another queue's window, straddling the limit, below the base, near 2**64 -- and
some malformed in every decoder field), normal, early and coalesced doorbells. A *batch* packs as many cases as fit
into the queues of one device (:data:`FUZZ_QUEUES`) and interleaves their scripts at random, so the cases run
concurrently on one Verilator run (the per-run cost of a few ms dominates short programs).

Checks per case (:func:`check_batch`):

* **hang**: the run does not produce every event within the driver's cycle bound (``SimulationTimeout``); the
  batch is then re-run case by case to find the hanging case(s);
* **window escape**: a ``core_req`` outside its queue's window, or outside every operand of that queue's accepted
  descriptors (writes: its STOREs);
* **corrupted queue**: a queue's whole window area (read back at the end by gated CXL.mem reads) differs from its
  initial data with that queue's own OK STOREs applied (an independent model, not the golden core);
* **mismatch**: anything differing from the golden device replayed in the RTL's execution order: per-queue
  events (index order, status), completion records and results (every record is read before its slot is reused),
  the window areas; or an RTL order the golden device could not follow.

``python -m host.fuzz.cxl --cases N [--seed S] [--jobs J]`` runs a campaign and prints the counts.
"""

import argparse
import os
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np

from hdl.ndp.config import TINY
from hdl.ndp.descriptor import ErrorCode, DescType
from firmware.ndp.descriptor import Descriptor, gemv, gemm, softmax, load, store
from hdl.cxl.regmap import QueueLayout, valid_word, VALID_OFFSET, DESC_OFFSET
from host.cxl_driver import Driver
from sim.golden.cxl_device import decode_descriptor, encode_descriptor

__all__ = ["FUZZ_CONFIG", "FUZZ_QUEUES", "FUZZ_DEPTH", "REGION_BYTES", "make_batch", "run_batch", "check_batch",
           "BatchResult", "campaign", "main"]

FUZZ_QUEUES = 16
REGION_BYTES = 8 << 10             # per queue: ring at +0, completion area at +3 KiB, window area +6..8 KiB
FUZZ_DEPTH = FUZZ_QUEUES * REGION_BYTES // 64
SQ_OFF, CQ_OFF, WIN_OFF = 0, 3 << 10, 6 << 10
#: Queue-window layout (half of the batches): every queue's ring and completion area in one block of
#: ``QBLOCK_BYTES`` per queue, the queue window [0, QWIN_BYTES) holding all of them, the 2 KiB data window areas
#: above it. The same 128 KiB memory as the plain layout: one compiled design serves both.
QBLOCK_BYTES = 6 << 10
QWIN_BYTES = FUZZ_QUEUES * QBLOCK_BYTES
AREA_BYTES = REGION_BYTES - WIN_OFF
assert QWIN_BYTES + FUZZ_QUEUES * AREA_BYTES == FUZZ_DEPTH * 64
#: A small core so rings and windows stay small: 512 B input / result areas, 2 KiB operands, 128 KiB memory.
FUZZ_CONFIG = replace(TINY, name="cxl-fuzz", input_buffer_bytes=512, output_buffer_bytes=512,
                      dram_buffer_bytes=2048, device_bytes=FUZZ_DEPTH * 64)
_ENTRIES = (1, 2, 4)
_LAYOUT = QueueLayout.for_config(FUZZ_CONFIG)
#: Queue PASIDs: half from this small set (queues of a batch often share one; 0 = DEFAULT_DATA_PASID), half
#: random 20-bit values.
_PASID_SET = (1, 2, 3, 0)


@dataclass(frozen=True)
class FuzzLayout:
    """Where queue q's ring, completion area and 2 KiB data window area lie: the plain layout (8 KiB per queue,
    no queue window) or, with ``qwin``, the queue-window layout."""
    qwin: bool = False

    def ring(self, q):
        return q * QBLOCK_BYTES if self.qwin else q * REGION_BYTES + SQ_OFF

    def cq(self, q):
        return q * QBLOCK_BYTES + CQ_OFF if self.qwin else q * REGION_BYTES + CQ_OFF

    def area(self, q):
        lo = QWIN_BYTES + q * AREA_BYTES if self.qwin else q * REGION_BYTES + WIN_OFF
        return lo, lo + AREA_BYTES

    def gaps(self, q, entries):
        """Reserved queue-window space in queue q's block (qwin layout): [first, end) ranges of whole lines."""
        r, c = self.ring(q), self.cq(q)
        out = [(r + _LAYOUT.sq_bytes(entries), c), (c + _LAYOUT.cq_bytes(entries), q * QBLOCK_BYTES + QBLOCK_BYTES)]
        return [(a, b) for a, b in out if b > a]
_STORE_SHAPES = ((1, 32), (2, 32), (4, 16), (2, 64), (4, 32))


def _fp16(rng, n, scale=1.0):
    if rng.random() < 0.05:                          # now and then raw bit patterns (inf, NaN, subnormals)
        return rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    return (rng.standard_normal(n) * scale).astype(np.float16).view(np.uint16)


@dataclass
class _QueueCase:
    q: int
    entries: int
    win_base: int
    win_limit: int
    area: tuple                       # (first byte, end) of the queue's window area, read back at the end
    initial: bytes = b""              # initial content of the area
    subs: list = field(default_factory=list)      # (index, descriptor or raw int, input bytes or None)
    kept: tuple = None                # shape this queue's state keeps (generator's guess; the golden decides)
    partial: tuple = None             # shape of this queue's partial (same)
    sq_base: int = 0
    cq_base: int = 0
    pasid: int = 0
    dead: bool = False                # its configuration was refused and never fixed: nothing is submitted


@dataclass
class Case:
    """One random program: its queues and the steps that build its script."""
    id: int
    queues: list
    steps: list
    features: set = field(default_factory=set)


def _pick_window(rng, area, unaligned):
    lo_area, hi_area = area
    r = rng.random()
    base = lo_area + 64 * int(rng.integers(0, 8))
    if r < 0.05:
        return base, base, "empty_window"             # nothing admitted (but SOFTMAX)
    if r < 0.15:
        limit = base + 64 * int(rng.integers(1, 5))   # tiny: most operands do not fit
        feat = "tiny_window"
    else:
        limit = hi_area - 64 * int(rng.integers(0, 8))
        feat = None
    if unaligned and r > 0.85:
        limit -= int(rng.integers(1, 64))
        return base, max(limit, base + 1), "unaligned_window"
    return base, limit, feat


def _operand_base(rng, qc, nbytes, others, feats):
    """A base address for an operand of ``nbytes``: mostly inside the window, else one of the escape kinds."""
    wb, wl = qc.win_base, qc.win_limit
    r = rng.random()
    fits = wl - wb >= nbytes and nbytes > 0
    if r < 0.85 and fits:
        return wb + 64 * int(rng.integers(0, (wl - wb - nbytes) // 64 + 1)) if (wl - wb - nbytes) >= 0 else wb
    feats.add("escape")
    r = rng.random()
    if r < 0.35 and others:
        o = others[int(rng.integers(0, len(others)))]
        feats.add("escape_other_window")
        return o.win_base + 64 * int(rng.integers(0, max(1, (o.win_limit - o.win_base) // 64)))
    if r < 0.55:
        feats.add("escape_straddle")
        return max(0, (wl - max(nbytes // 2, 1)) // 64 * 64)
    if r < 0.7:
        feats.add("escape_below")
        return max(0, wb - 64 * int(rng.integers(1, 8)))
    if r < 0.8:
        feats.add("escape_wrap")
        return (1 << 64) - 64 * int(rng.integers(1, 4))
    if r < 0.9:
        feats.add("escape_ring")
        return qc.sq_base
    feats.add("escape_far")
    return 64 * int(rng.integers(0, (1 << 20)))


def _chain_source(rng, qc, others, feats):
    """The kept shape a CHAIN consumes: mostly the queue's own; now and then another queue's (a cross-queue
    CHAIN, which the device must refuse with FOREIGN_STATE or NO_CHAIN_INPUT); None: no CHAIN."""
    if rng.random() < 0.08:
        ks = [o.kept for o in others if o.kept is not None]
        if ks:
            feats.add("cross_chain")
            return ks[int(rng.integers(0, len(ks)))]
    if qc.kept is not None and rng.random() < 0.5:
        return qc.kept
    return None


def _valid_descriptor(rng, qc, others, feats):
    """A (mostly) valid descriptor, its input, and the kept / partial shapes it would leave (generator's guess:
    the golden device decides)."""
    r = rng.random()             # gemv 0.22, gemm 0.13, trans 0.15, softmax 0.15, load 0.15, store 0.2
    kind = ("gemv" if r < 0.22 else "gemm" if r < 0.35 else "trans" if r < 0.5 else "softmax" if r < 0.65
            else "load" if r < 0.8 else "store")
    keep = rng.random() < 0.25
    src = _chain_source(rng, qc, others, feats) if kind in ("gemv", "gemm", "trans", "softmax") else None
    chain = src is not None
    kept, partial = qc.kept, qc.partial
    if kind in ("gemv", "gemm", "trans"):
        trans = kind == "trans"
        b = 1 if kind == "gemv" else int(rng.integers(1, 5))
        if trans:
            half = rng.random() < 0.25
            k = 4 if half else 8 * int(rng.integers(1, 3))
            n = 2 * int(rng.integers(1, 7)) if half else int(rng.integers(1, 13))
        else:
            half = rng.random() < 0.25
            n = 4 if half else 8 * int(rng.integers(1, 3))
            k = 2 * int(rng.integers(1, 9)) if half else int(rng.integers(1, 17))
        if chain:                                    # consume the kept result: B x K = its shape
            cb, ck = src
            if cb <= 4 and ck <= 16 and (not trans or ck % 8 == 0 or 2 * ck == 8) and (not half or ck % 2 == 0):
                b, k = cb, ck
                feats.add("chain_trans" if trans else "chain")
            else:
                chain = False
        acc = False
        if trans and not chain and partial is not None and partial[0] <= 4 and rng.random() < 0.7:
            b, n, k = partial[0], partial[1], 8 * int(rng.integers(1, 3))     # the next K-tile of the partial
            acc = True
        part = trans and not keep and rng.random() < 0.3
        if acc:
            feats.add("acc")
        if part:
            feats.add("partial")
        nbytes = k * n * 2
        base = _operand_base(rng, qc, nbytes, others, feats)
        mk = gemv if b == 1 and kind == "gemv" else (lambda a, *r, **f: gemm(a, b, *r, **f))
        d = mk(base, k, n, keep=keep, chain=chain, trans=trans, acc=acc, partial=part)
        inp = None if chain else _fp16(rng, b * k, 1.0)
        if keep:
            kept = (b, n)
        if part:
            partial = (b, n)
        elif acc:
            partial = None
    elif kind == "softmax":
        rows, cols = int(rng.integers(1, 4)), 8 * int(rng.integers(1, 3))
        if chain and src[1] % 8 == 0 and src[0] * src[1] <= 48:
            rows, cols = src
        else:
            chain = False
        d = softmax(rows, cols, keep=keep, chain=chain)
        inp = None if chain else _fp16(rng, rows * cols, 3.0)
        if keep:
            kept = (rows, cols)
    elif kind == "load":
        rows, cols = int(rng.integers(1, 9)), int(rng.integers(1, 17))
        base = _operand_base(rng, qc, rows * cols * 2, others, feats)
        d, inp = load(base, rows, cols), None
    else:
        rows, cols = _STORE_SHAPES[int(rng.integers(0, len(_STORE_SHAPES)))]
        base = _operand_base(rng, qc, rows * cols * 2, others, feats)
        d, inp = store(base, rows, cols), _fp16(rng, rows * cols, 1.0)
    if d.keep:
        feats.add("keep")
    if d.trans:
        feats.add("trans")
    return d, inp, kept, partial


def _in_window(rng, qc, nbytes, others, feats, misalign=0):
    return _operand_base(rng, qc, nbytes + misalign, others, feats) + misalign


def _malformed(rng, qc, others, feats):
    """A descriptor the decoder rejects, aimed at one ErrorCode (its base mostly inside the window, so the
    decoder, not the window check, decides), or one with ignored bits set."""
    feats.add("malformed")
    w = lambda n, m=0: _in_window(rng, qc, n, others, feats, m)  # noqa: E731
    k = int(rng.integers(0, 14))
    if k == 0:
        d = replace(gemv(w(256), 8, 16), type=int(rng.choice((0, 4, 7, 15))))            # UNKNOWN_TYPE
    elif k == 1:
        d = (replace(load(w(64), 2, 8), op=1) if rng.random() < 0.5                       # UNKNOWN_OP
             else replace(softmax(1, 8), op=int(rng.choice((0, 4, 15)))))
    elif k == 2:
        d = replace(gemv(w(256), 8, 16), dtype=int(rng.choice((0, 2, 5))))                # UNKNOWN_DTYPE
    elif k == 3:
        d = replace(gemv(w(256), 8, 16), **({"operand_dim1": 0} if rng.random() < 0.5
                                             else {"input_dim1": 0}))                   # ZERO_DIMENSION
    elif k == 4:
        d = replace(store(w(64), 1, 32), operand_bytes=66)                               # SIZE_MISMATCH
    elif k == 5:
        d = replace(softmax(1, 8), input_bytes=4096, input_dim0=2, input_dim1=1024)       # INPUT_TOO_LARGE
    elif k == 6:
        d = replace(gemv(w(256), 8, 16), input_dim0=2, input_bytes=32)                   # SHAPE_MISMATCH
    elif k == 7:
        d = gemm(w(128), 5, 8, 8)                                                        # BATCH_TOO_LARGE
    elif k == 8:
        d = softmax(4, 64)                                                               # OUTPUT_TOO_LARGE
    elif k == 9:
        d = gemv(w(128, 2), 8, 8)                                                        # MISALIGNED
    elif k == 10:
        d = gemv(w(192), 12, 8, trans=True) if rng.random() < 0.5 else store(w(64), 1, 8)   # NOT_MULTIPLE
    elif k == 11:
        d = (replace(load(w(64), 2, 8) if rng.random() < 0.5 else store(w(64), 1, 32),
                     flags=int(rng.integers(1, 64))) if rng.random() < 0.6               # BAD_FLAGS
             else gemv(w(256), 8, 16, acc=True))
    elif k == 12:
        d = replace(gemv(w(256), 8, 16), reserved=1)                                      # ignored: OK
    else:
        d = replace(gemv(w(256), 8, 16), operand_dim0=16)                               # SIZE_MISMATCH
    raw = encode_descriptor(d)
    if rng.random() < 0.1:
        raw |= int(rng.integers(1, 16)) << 204        # bits 204..207 of the 26-byte field: not descriptor bits
        feats.add("raw_high_bits")
    n = min(d.input_bytes, FUZZ_CONFIG.input_buffer_bytes) // 2
    inp = _fp16(rng, n) if d.input_bytes and not d.chain else None
    return raw, inp


def _returned_bytes(desc):
    """Bytes of result a descriptor returns if the decoder accepts it (whole 16-byte beats), else 0."""
    d = desc if isinstance(desc, Descriptor) else decode_descriptor(desc)
    if d.validate(FUZZ_CONFIG) != ErrorCode.OK:
        return 0
    elems = d.returned_elems()
    beat = 2 * FUZZ_CONFIG.lanes
    return min(-(-elems * 2 // beat) * beat, FUZZ_CONFIG.output_buffer_bytes)


def _refused(rng, lay, qc, feats):
    """Registers of queue ``qc.q`` that the CSR must refuse under the queue window (the enabling CTRL write)."""
    regs = dict(sq_base=qc.sq_base, entries=qc.entries, cq_base=qc.cq_base, win_base=qc.win_base,
                win_limit=qc.win_limit, pasid=qc.pasid)
    k = int(rng.integers(0, 3))
    if k == 0:                                    # ring outside the window (in the queue's own data area)
        regs["sq_base"] = qc.area[0]
        feats.add("refused_ring")
    elif k == 1:                                  # completion area crossing the window's limit
        regs["cq_base"] = QWIN_BYTES - 64 * int(rng.integers(1, 4))
        feats.add("refused_cq")
    else:                                         # data window overlapping the queue window
        b = int(rng.choice((lay.ring(qc.q) + 64 * int(rng.integers(0, 40)), QWIN_BYTES - 256)))
        regs["win_base"], regs["win_limit"] = b, b + 512
        feats.add("refused_window")
    return regs


def _forger(rng, victim, qcs):
    """A PASID other than the victim's: another queue's (same case), one of the small set, or random."""
    while True:
        r = rng.random()
        if r < 0.4 and len(qcs) > 1:
            p = qcs[int(rng.integers(0, len(qcs)))].pasid
        elif r < 0.8:
            p = _PASID_SET[int(rng.integers(0, len(_PASID_SET)))]
        else:
            p = int(rng.integers(0, 1 << 20))
        if p != victim.pasid:
            return p


def _forged_step(rng, lay, qc, live, feats):
    """One forged access of the case (another PASID into a live queue's ring / completion area, or reserved
    queue-window space); the indices it targets are resolved when it is applied (:func:`_apply`)."""
    r = rng.random()
    victim = live[int(rng.integers(0, len(live)))]
    if lay.qwin and r < 0.2:
        gaps = lay.gaps(victim.q, victim.entries)
        a, b = gaps[int(rng.integers(0, len(gaps)))]
        addr = a + 64 * int(rng.integers(0, (b - a) // 64))
        write = rng.random() < 0.5
        feats.add("reserved_write" if write else "reserved_read")
        pasid = int(rng.choice((victim.pasid, _forger(rng, victim, live))))
        return ("reserved", victim.q, addr, write, pasid, rng.integers(0, 1 << 16, 32, dtype=np.uint16))
    if r < 0.45:
        feats.add("forge_cpl_read")
        rb = int(rng.choice((0, 64, 2 * 64)))
        return ("forge_cpl", victim.q, int(rng.integers(0, victim.entries)), rb, _forger(rng, victim, live))
    when = "before" if rng.random() < 0.5 else "after"
    rogue = rng.random() < 0.5
    feats.add(f"forge_slot_{when}")
    if rogue:
        feats.add("rogue_doorbell")
    wb = victim.win_base // 64 * 64
    kind = int(rng.integers(0, 3))              # a STORE over the victim's data, a LOAD, a GEMV
    d = store(wb, 1, 32) if kind == 0 else load(wb, 1, 8) if kind == 1 else gemv(wb, 8, 8)
    inp = rng.integers(0, 1 << 16, 32 if kind != 1 else 0, dtype=np.uint16)
    return ("forge_slot", victim, when, rogue, encode_descriptor(d), inp, _forger(rng, victim, live))


def _case(rng, case_id, queues, *, max_subs, unaligned, lay=FuzzLayout(), forge=0.0):
    feats = set()
    qcs = []
    steps = []
    if lay.qwin:
        feats.add("qwin")
    for q in queues:
        entries = _ENTRIES[int(rng.integers(0, len(_ENTRIES)))]
        area = lay.area(q)
        wb, wl, feat = _pick_window(rng, area, unaligned)
        if feat:
            feats.add(feat)
        pasid = (_PASID_SET[int(rng.integers(0, len(_PASID_SET)))] if rng.random() < 0.5
                 else int(rng.integers(0, 1 << 20)))
        qc = _QueueCase(q, entries, wb, wl, area, sq_base=lay.ring(q), cq_base=lay.cq(q), pasid=pasid)
        if lay.qwin and rng.random() < 0.12:
            steps.append(("refused", q, _refused(rng, lay, qc, feats)))
            if rng.random() < 0.4:
                qc.dead = True
                feats.add("dead_queue")
                if rng.random() < 0.5:
                    steps.append(("rogue_doorbell", q, 1))    # rings a disabled queue: nothing may run
                qcs.append(qc)
                continue
        steps.append(("configure", q, dict(sq_base=qc.sq_base, entries=entries, cq_base=qc.cq_base, win_base=wb,
                                           win_limit=wl, pasid=pasid)))
        # initial data: the window lines (the rest of the area stays zero)
        lo, hi = wb // 64 * 64, -(-wl // 64) * 64
        data = _fp16(rng, (hi - lo) // 2, 1.0).astype("<u2").tobytes() if hi > lo else b""
        init = bytearray(area[1] - area[0])
        init[lo - area[0]:hi - area[0]] = data
        qc.initial = bytes(init)
        if data:
            steps.append(("store", lo, data))
        qcs.append(qc)
    live = [qc for qc in qcs if not qc.dead]
    # submissions, interleaved over the case's queues
    nsubs = {qc.q: int(rng.integers(1, max_subs + 1)) for qc in live}
    order = [qc for qc in live for _ in range(nsubs[qc.q])]
    rng.shuffle(order)
    deferred = set()
    for qc in order:
        others = [o for o in live if o is not qc]
        if forge and rng.random() < forge:
            steps.append(_forged_step(rng, lay, qc, live, feats))
        index = len(qc.subs)
        if index >= qc.entries:
            prev = qc.subs[index - qc.entries]
            steps.append(("read_cpl", qc.q, prev[0], prev[3]))
            feats.add("ring_wrap")
        if rng.random() < 0.12:
            desc, inp = _malformed(rng, qc, others, feats)
        else:
            desc, inp, qc.kept, qc.partial = _valid_descriptor(rng, qc, others, feats)
        rbytes = _returned_bytes(desc)
        r = rng.random()
        mode = "normal" if r < 0.55 else "early" if r < 0.75 else "defer"
        feats.add(f"doorbell_{mode}")
        qc.subs.append((index, desc, None if inp is None else inp.astype("<u2").tobytes(), rbytes))
        steps.append(("submit", qc.q, desc, inp, mode))
        if mode == "defer":
            deferred.add(qc.q)
            if rng.random() < 0.4:
                steps.append(("ring", qc.q))
                deferred.discard(qc.q)
                feats.add("coalesced")
        elif qc.q in deferred:
            deferred.discard(qc.q)                   # this doorbell covers the deferred ones too
            feats.add("coalesced")
        if rng.random() < 0.15:
            steps.append(("read_cpl", qc.q, index, qc.subs[-1][3]))
    if forge and live and rng.random() < forge:
        steps.append(_forged_step(rng, lay, live[0], live, feats))
    for qc in live:
        steps.append(("ring", qc.q))
    for qc in live:
        n = len(qc.subs)
        for index, _, _, rbytes in qc.subs[max(0, n - qc.entries):]:
            steps.append(("read_cpl", qc.q, index, rbytes))
        steps.append(("read_area", qc.q, qc.area[0], qc.area[1] - qc.area[0]))
    return Case(case_id, qcs, steps, feats)


@dataclass
class Batch:
    seed: int
    cases: list
    driver: Driver
    handles: dict                 # case id -> list of (kind, q, index or None, handle); kind "forged": must be rejected
    mmio_delay: int = 0
    traffic_seed: int | None = None
    qwin: bool = False            # queue-window layout (FuzzLayout(qwin=True))
    forged: dict = field(default_factory=dict)     # case id -> hmem request indices the filter must reject
    refused: dict = field(default_factory=dict)    # case id -> MMIO indices of CTRL writes the CSR must refuse
    rejects_read: int | None = None                # MMIO index of the final HMEM_REJECTS read
    rejects_exact: bool = False   # the read is held until every forged request has passed the filter


@dataclass
class _Script:
    """What :func:`_apply` records for one case while the batch's script is built."""
    handles: list = field(default_factory=list)
    forged: list = field(default_factory=list)
    refused: list = field(default_factory=list)
    rogue: dict = field(default_factory=dict)      # queue -> highest DOORBELL value a forged step wrote
    fence: bool = False           # fence before each forged step (no queue window: configure does not fence)


def _doorbell(drv, sc, q, value):
    v = max(value, sc.rogue.get(q, 0))
    drv.mmio_write("DOORBELL", v, q)
    sc.rogue[q] = v


_FORGED = ("forge_slot", "forge_cpl", "reserved")


def _apply(drv, step, sc):
    kind = step[0]
    if kind == "configure":
        drv.configure(step[1], **step[2])
    elif kind == "refused":
        q, regs = step[1], step[2]
        for name, key in (("SQ_BASE", "sq_base"), ("SQ_ENTRIES", "entries"), ("CQ_BASE", "cq_base"),
                          ("WIN_BASE", "win_base"), ("WIN_LIMIT", "win_limit"), ("PASID", "pasid")):
            drv.mmio_write(name, regs[key], q)
        sc.refused.append(drv.mmio_write("CTRL", 1, q))
    elif kind == "rogue_doorbell":
        drv.mmio_write("DOORBELL", step[2], step[1])
    elif kind == "store":
        drv.store(step[1], step[2], after=0)
    elif kind == "submit":
        _, q, desc, inp, mode = step
        drv.submit(q, desc, inp, doorbell=mode != "defer", early_doorbell=mode == "early")
    elif kind == "ring":
        q = step[1]
        s = drv._q[q]
        if sc.rogue.get(q, 0) > s.submitted:    # a forged doorbell went further: never move DOORBELL back
            _doorbell(drv, sc, q, s.submitted)
            s.tail = max(s.tail, s.submitted)
        else:
            drv.ring(q)
    elif kind == "read_cpl":
        sc.handles.append(("cpl", step[1], step[2], drv.read_completion(step[1], step[2], result_bytes=step[3])))
    elif kind == "read_area":
        sc.handles.append(("area", step[1], None, drv.read(step[2], step[3])))
    elif kind in ("forge_slot", "forge_cpl", "reserved"):
        if sc.fence:
            drv.fence()          # the victim's configuration reaches the device first (else: ordinary data)
        k0 = len(drv._hmem)
        if kind == "forge_cpl":
            _, q, index, rb, pasid = step
            sc.handles.append(("forged", q, index, drv.read_completion(q, index, after=0, result_bytes=rb,
                                                                      pasid=pasid)))
        elif kind == "reserved":
            _, q, addr, write, pasid, data = step
            if write:
                drv.store(addr, data, after=0, pasid=pasid)
            else:
                sc.handles.append(("forged", q, None, drv.read(addr, 64, after=0, pasid=pasid)))
        else:
            _, victim, when, rogue, raw, inp, pasid = step
            s = drv._q[victim.q]
            n = s.submitted
            if when == "after" and n:           # a slot the victim has already written (maybe already run)
                index = n - 1 - int(raw % min(n, s.entries))
            else:                               # the victim's next slot, before its own valid word
                index = n
            if len(inp):
                drv.store(_LAYOUT.input_addr(s.sq_base, s.entries, index), inp, after=0, pasid=pasid)
            line = (raw << (8 * DESC_OFFSET)) | (valid_word(index) << (8 * VALID_OFFSET))
            drv.store(_LAYOUT.slot_addr(s.sq_base, s.entries, index), line.to_bytes(64, "little"), after=0,
                      pasid=pasid)
            # a rogue doorbell covering the forged slot: only up to slots the victim fills (else it polls forever)
            if rogue and index < len(victim.subs):
                _doorbell(drv, sc, victim.q, max(index + 1, n))
        sc.forged.extend(range(k0, len(drv._hmem)))
    else:
        raise ValueError(kind)


#: Upper bound on the cycles one hmem request takes while the device is idle (measured ~1 at full rate; the
#: random traffic patterns accept ~0.6 per cycle): a margin of 2.4x over the slowest.
HMEM_CYCLES_BOUND = 4


def _late_delay(drv) -> int:
    """An MMIO delay that makes every doorbell late: the hmem stream runs at most to its first gated request (one
    waiting for a completion, which needs a doorbell) before any MMIO request is taken, so holding the MMIO stream
    for longer than those requests take (with a wide margin) is as late as any doorbell can be; a longer delay
    would only add idle cycles (it used to be a fixed 20,000: ~35% of all simulated cycles)."""
    afters = drv._afters()
    first_gate = next((i for i, a in enumerate(afters) if a > 0), len(afters))
    return 200 + HMEM_CYCLES_BOUND * first_gate


def make_batch(seed: int, *, max_subs: int = 6, unaligned: bool = True, cases: int | None = None,
               queues: int = FUZZ_QUEUES, qwin: bool | None = None, forge: float | None = None) -> Batch:
    """A batch of random cases filling ``queues`` queues (or the first ``cases`` cases), scripts interleaved.
    ``qwin``: the queue-window layout (None: half of the batches); ``forge``: the probability of a forged step
    before each submission (None: 0.3 in the batches that forge: every queue-window batch, and the others without
    an MMIO delay, where the fence a forged step needs would not change the doorbell timing)."""
    rng = np.random.default_rng(seed)
    qwin = bool(rng.random() < 0.5) if qwin is None else qwin
    r = rng.random()                              # MMIO delay class: none / partial / late
    if forge is None:
        forge = 0.3 if qwin or r < 0.5 else 0.0
    lay = FuzzLayout(qwin)
    case_list, q = [], 0
    while queues - q >= 2 and (cases is None or len(case_list) < cases):
        n = min(int(rng.integers(2, 5)), queues - q)
        if queues - q - n == 1:
            n += 1 if n < 4 else -1
        case_list.append(_case(rng, len(case_list), list(range(q, q + n)), max_subs=max_subs,
                               unaligned=unaligned, lay=lay, forge=forge))
        q += n
    # PASIDs shared by queues of the batch
    owners = {}
    for c in case_list:
        for qc in c.queues:
            owners.setdefault(qc.pasid, []).append(c.id)
    for ids in owners.values():
        if len(ids) > 1:
            for i in ids:
                case_list[i].features.add("pasid_shared")
    drv = Driver(FUZZ_QUEUES, config=FUZZ_CONFIG, depth=FUZZ_DEPTH)
    if qwin:
        drv.set_queue_window(0, QWIN_BYTES)
    scripts = [_Script(fence=not qwin) for _ in case_list]
    pos = [0] * len(case_list)
    # hoist: a third of the forging batches apply every forged step right after the configurations and initial
    # stores (before any gated request), so the final HMEM_REJECTS read can be held past all of them
    hoist = bool(forge) and rng.random() < 0.35
    setup = ("configure", "refused", "store", "rogue_doorbell")
    phases = []
    if hoist:
        heads = [[st for st in c.steps if st[0] in setup] for c in case_list]
        forged_steps = [[st for st in c.steps if st[0] in _FORGED] for c in case_list]
        rests = [[st for st in c.steps if st[0] not in setup and st[0] not in _FORGED] for c in case_list]
        phases = [heads, forged_steps, rests]
        for c in case_list:
            if any(forged_steps[c.id]):
                c.features.add("forged_early")
    else:
        phases = [[c.steps for c in case_list]]
    for lists in phases:
        pos = [0] * len(case_list)
        live = [i for i, st in enumerate(lists) if st]
        for u in rng.random(sum(len(st) for st in lists)).tolist():   # each step: a live case at random
            i = live[int(u * len(live))]
            _apply(drv, lists[i][pos[i]], scripts[i])
            pos[i] += 1
            if pos[i] == len(lists[i]):
                live.remove(i)
    forged = sorted(k for sc in scripts for k in sc.forged)
    rejects_read, exact = None, False
    if forge:
        # a final HMEM_REJECTS read; held (run_batch) until every forged request has passed the filter when they
        # all precede the first gated hmem request (their timing is then bounded), else only checked <= golden
        rejects_read = drv.mmio_read("HMEM_REJECTS")
        afters = drv._afters()
        first_gate = next((i for i, a in enumerate(afters) if a > 0), len(afters))
        exact = not forged or forged[-1] < first_gate
    late = _late_delay(drv)
    delay = 0 if r < 0.5 else int(rng.integers(1, late)) if r < 0.8 else late
    tseed = int(rng.integers(0, 1 << 31)) if rng.random() < 0.3 else None
    return Batch(seed, case_list, drv, {c.id: scripts[c.id].handles for c in case_list}, delay, tseed, qwin,
                 {c.id: scripts[c.id].forged for c in case_list}, {c.id: scripts[c.id].refused for c in case_list},
                 rejects_read, exact)


def _single(batch, case):
    drv = Driver(FUZZ_QUEUES, config=FUZZ_CONFIG, depth=FUZZ_DEPTH)
    if batch.qwin:
        drv.set_queue_window(0, QWIN_BYTES)
    sc = _Script(fence=not batch.qwin)
    for step in case.steps:
        _apply(drv, step, sc)
    return drv


@dataclass
class BatchResult:
    seed: int
    cases: int
    descriptors: int = 0
    cycles: int = 0
    hangs: list = field(default_factory=list)           # case ids
    escapes: list = field(default_factory=list)         # (case id, message)
    corrupted: list = field(default_factory=list)       # (case id, queue, message)
    mismatches: list = field(default_factory=list)      # (case id, message)
    statuses: dict = field(default_factory=dict)        # status -> count
    features: dict = field(default_factory=dict)
    rejected: int = 0             # hmem requests the address filter rejected (golden; = the forged ones)
    rejects_exact: int = 0        # 1 if the final HMEM_REJECTS read was held past every forged request
    wall: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.hangs or self.escapes or self.corrupted or self.mismatches)


def _expected_area(qc, events):
    """The queue's window area from its initial data and its own OK STOREs (in its index order)."""
    area = bytearray(qc.initial)
    status = {e.index: e.status for e in events if e.queue == qc.q}
    for index, desc, inp, _ in qc.subs:
        if status.get(index) != 0:
            continue
        d = desc if isinstance(desc, Descriptor) else decode_descriptor(desc)
        if d.type != DescType.STORE:
            continue
        a0, a1 = qc.area                  # (clipped: only a broken device accepts a STORE leaving the window)
        lo, hi = max(d.base_addr, a0), min(d.base_addr + d.input_bytes, a1)
        if lo < hi:
            area[lo - a0:hi - a0] = inp[lo - d.base_addr:hi - d.base_addr]
    return bytes(area)


def _first_diff(a, b):
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))


def check_batch(batch: Batch, rtl, gold) -> BatchResult:
    """Per-case verdicts for one batch run (see the module docs)."""
    res = BatchResult(batch.seed, len(batch.cases), descriptors=len(rtl.events), cycles=rtl.cycles or 0)
    drv = batch.driver
    q2case = {qc.q: c.id for c in batch.cases for qc in c.queues}
    for q, msg in drv.core_req_violations(rtl, gold):
        res.escapes.append((q2case.get(q), msg))
    rq, gq = rtl.events_by_queue(), gold.events_by_queue()
    for c in batch.cases:
        for qc in c.queues:
            want = len(qc.subs)
            got = rq.get(qc.q, [])
            if [i for i, _ in got] != list(range(want)):
                res.mismatches.append((c.id, f"q{qc.q}: event indices {[i for i, _ in got]}, want 0..{want - 1}"))
            if got != gq.get(qc.q, []):
                res.mismatches.append((c.id, f"q{qc.q}: events {got} vs golden {gq.get(qc.q, [])}"))
        for kind, q, index, h in batch.handles[c.id]:
            a, b = rtl.data(h), gold.data(h)
            if rtl.rejected(h) != gold.rejected(h):
                res.mismatches.append((c.id, f"{kind} q{q} at {h.addr:#x}: read error bit rtl {rtl.rejected(h)} "
                                             f"golden {gold.rejected(h)}"))
            if kind == "forged":
                if not rtl.rejected(h) or any(a):
                    res.mismatches.append((c.id, f"forged read q{q} at {h.addr:#x} not rejected (err "
                                                 f"{rtl.rejected(h)}, data {'nonzero' if any(a) else 'zero'})"))
                continue
            if a != b:
                k = _first_diff(a, b)
                res.mismatches.append((c.id, f"{kind} q{q}{'' if index is None else '#' + str(index)}: byte "
                                             f"{k} (addr {h.addr + k:#x}) rtl {a[k:k + 1].hex()} golden {b[k:k + 1].hex()}"))
            if kind == "cpl":
                rec = rtl.completion(h)
                if not rec.done or rec.seq != index:
                    res.mismatches.append((c.id, f"q{q}#{index}: completion record not written "
                                                 f"(flag {rec.flag:#x}, seq {rec.seq})"))
            else:
                qc = next(x for x in c.queues if x.q == q)
                want = _expected_area(qc, rtl.events)
                if a != want:
                    k = _first_diff(a, want)
                    res.corrupted.append((c.id, q, f"window area of q{q} differs from its own STOREs at byte "
                                                   f"{h.addr + k:#x}"))
    # the address filter: exactly the forged requests rejected, refused configurations, HMEM_REJECTS
    g = gold.golden
    rejected = set(g.rejected)
    for c in batch.cases:
        want = set(batch.forged[c.id])
        lo, hi = (min(want), max(want)) if want else (None, None)
        if want - rejected:
            res.mismatches.append((c.id, f"forged hmem requests not rejected by the golden filter: "
                                         f"{sorted(want - rejected)[:5]}"))
        for i in batch.refused[c.id]:
            if rtl.mmio[i].err != 1 or gold.mmio[i].err != 1:
                res.mismatches.append((c.id, f"refused configuration accepted (MMIO {i}: rtl err "
                                             f"{rtl.mmio[i].err}, golden err {gold.mmio[i].err})"))
    extra = rejected - {k for ks in batch.forged.values() for k in ks}
    if extra:
        res.mismatches.append((-1, f"golden filter rejected {len(extra)} requests that were not forged: "
                                   f"{sorted(extra)[:5]}"))
    for i, (a, b) in enumerate(zip(rtl.mmio, gold.mmio)):
        if a.err != b.err:
            res.mismatches.append((-1, f"MMIO {i} ({a.register}): err rtl {a.err} golden {b.err}"))
    if batch.rejects_read is not None:
        v = rtl.mmio[batch.rejects_read].rdata
        if v > g.rejects or (batch.rejects_exact and v != g.rejects):
            res.mismatches.append((-1, f"HMEM_REJECTS reads {v}, golden {g.rejects} "
                                       f"({'exact' if batch.rejects_exact else 'at most'})"))
    res.rejected = len(rejected)
    res.rejects_exact = int(batch.rejects_read is not None and batch.rejects_exact)
    for e in rtl.events:
        res.statuses[e.status] = res.statuses.get(e.status, 0) + 1
    for c in batch.cases:
        for f in c.features:
            res.features[f] = res.features.get(f, 0) + 1
    return res


def _system():
    from host.cxl_driver import system_for
    return system_for(FUZZ_CONFIG, FUZZ_QUEUES, FUZZ_DEPTH)


def _hold_rejects_read(batch, traffic):
    """(traffic, max_cycles) that apply the batch's MMIO delay and hold its last MMIO request (the HMEM_REJECTS
    read) until cycle ``T``, a bound on when the last forged request (all of them precede the first gated hmem
    request) has passed the filter: ``2 x`` (the cycle the MMIO pattern presents the last request a forged
    request's fence waits for) + ``8 x`` (its position + 1) + 400 (a margin of 2x over the bounds of
    :func:`_late_delay`, for the engine's memory traffic and the random handshakes). At most ``k`` (the requests
    before the read) valid cycles precede the hold, so the read is taken at or after ``T``; ``mmio_rsp`` is kept
    ready so that those ``k`` are all taken before the hold."""
    from sim.backends import Traffic
    drv = batch.driver
    last = max(k for ks in batch.forged.values() for k in ks)
    fence = max(op[5] for op in drv._hmem[:last + 1])
    limit = drv.max_cycles() + batch.mmio_delay
    base = np.ones(1, bool) if traffic is None else np.asarray(traffic.valid.get("mmio", np.ones(1, bool)), bool)
    n = 2 * limit + 20 * len(drv._mmio) + 8 * len(drv._hmem) + 2000
    pat = np.tile(base, -(-n // base.size))[:n]
    pat[:batch.mmio_delay] = False
    trues = np.flatnonzero(pat)
    t_fence = int(trues[fence - 1]) if fence else 0
    hold = 2 * t_fence + 8 * (last + 1) + 400
    k = batch.rejects_read
    if int(trues[k]) < hold:
        pat[int(trues[k]):hold] = False
    valid = dict(traffic.valid) if traffic is not None else {}
    valid["mmio"] = pat
    # mmio_rsp always ready: the CSR then takes request j exactly at the j-th valid cycle, so the requests before
    # the read (the forged requests' fences among them) are all answered before the hold starts (with random
    # back-pressure the hold would also hold some of them, and the fenced forged requests with them)
    ready = {k: v for k, v in traffic.ready.items() if k != "mmio_rsp"} if traffic is not None else {}
    return Traffic(valid=valid, ready=ready), limit + hold


def run_batch(backend, seed: int, **kw) -> BatchResult:
    """Generate, run (RTL on ``backend``, then the golden device in the RTL's order) and check one batch."""
    from sim.backends import SimulationTimeout, Traffic, stream_ports
    from sim.golden.cxl_device import GoldenOrderError, GoldenHang
    t0 = time.perf_counter()
    batch = make_batch(seed, **kw)
    system = _system()
    traffic = None
    if batch.traffic_seed is not None:
        traffic = Traffic.random(stream_ports(system), seed=batch.traffic_seed, valid_prob=0.6, ready_prob=0.7)
    try:
        if batch.rejects_read is not None and batch.rejects_exact and any(batch.forged.values()):
            traffic, limit = _hold_rejects_read(batch, traffic)
            rtl = batch.driver.run(backend, system=system, traffic=traffic, max_cycles=limit)
        else:
            rtl = batch.driver.run(backend, system=system, traffic=traffic, mmio_delay=batch.mmio_delay)
    except SimulationTimeout:
        res = BatchResult(seed, len(batch.cases))
        for c in batch.cases:          # attribute the hang
            try:
                _single(batch, c).run(backend, system=system, mmio_delay=batch.mmio_delay)
            except SimulationTimeout:
                res.hangs.append(c.id)
        if not res.hangs:
            res.hangs.append(-1)       # only the batch as a whole hangs
        res.wall = time.perf_counter() - t0
        return res
    try:
        gold = batch.driver.run("golden", order=rtl.events)
    except (GoldenOrderError, GoldenHang) as e:
        res = BatchResult(seed, len(batch.cases), descriptors=len(rtl.events), cycles=rtl.cycles)
        res.mismatches.append((-1, f"golden cannot follow the RTL: {e}"))
        res.wall = time.perf_counter() - t0
        return res
    res = check_batch(batch, rtl, gold)
    res.wall = time.perf_counter() - t0
    return res


def _worker(args):
    backend_name, seeds, kw = args
    from host.cxl_driver import backend_named
    backend = backend_named(backend_name)       # inherited from the parent (fork): no Verilog regeneration
    return [run_batch(backend, s, **kw) for s in seeds]


def campaign(cases: int, *, seed: int = 0, jobs: int = 1, backend: str = "verilator", progress=None, **kw) -> dict:
    """Run batches from ``seed`` on until ``cases`` cases are done; returns the totals."""
    from host.cxl_driver import backend_named
    totals = {"cases": 0, "batches": 0, "descriptors": 0, "cycles": 0, "hangs": 0, "window_escapes": 0,
              "corrupted_queues": 0, "mismatches": 0, "rejected": 0, "rejects_exact": 0, "batch_seconds": 0.0,
              "statuses": {}, "features": {}, "failures": []}
    start = time.perf_counter()

    def add(r):
        totals["cases"] += r.cases
        totals["batches"] += 1
        totals["descriptors"] += r.descriptors
        totals["cycles"] += r.cycles
        totals["hangs"] += len(r.hangs)
        totals["window_escapes"] += len({c for c, _ in r.escapes})
        totals["corrupted_queues"] += len({(c, q) for c, q, _ in r.corrupted})
        totals["mismatches"] += len({c for c, _ in r.mismatches})
        totals["rejected"] += r.rejected
        totals["rejects_exact"] += r.rejects_exact
        totals["batch_seconds"] += r.wall
        for k, v in r.statuses.items():
            totals["statuses"][k] = totals["statuses"].get(k, 0) + v
        for k, v in r.features.items():
            totals["features"][k] = totals["features"].get(k, 0) + v
        if not r.ok:
            totals["failures"].append((r.seed, r.hangs, r.escapes[:3], r.corrupted[:3], r.mismatches[:3]))
        if progress:
            progress(totals)

    next_seed = seed
    if jobs <= 1:
        be = backend_named(backend)
        while totals["cases"] < cases:
            add(run_batch(be, next_seed, **kw))
            next_seed += 1
    else:
        import multiprocessing as mp
        _system()                                   # elaborate / build once before forking
        if backend == "verilator":
            backend_named(backend).executable(_system())
        ctx = mp.get_context("fork")
        with ctx.Pool(jobs) as pool:
            chunk = 8
            pending = []
            while totals["cases"] < cases or pending:
                while len(pending) < 2 * jobs and totals["cases"] + 5 * chunk * len(pending) < cases:
                    pending.append(pool.apply_async(_worker, ((backend, list(range(next_seed, next_seed + chunk)),
                                                               kw),)))
                    next_seed += chunk
                if not pending:
                    break
                for r in pending.pop(0).get():
                    add(r)
    totals["seconds"] = time.perf_counter() - start
    return totals


def _status_text(st):
    from sim.golden.cxl_device import status_name
    return ", ".join(f"{status_name(k)} {v}" for k, v in sorted(st.items()))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m host.fuzz.cxl", description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--max-subs", type=int, default=6, help="submissions per queue, at most")
    p.add_argument("--aligned-windows", action="store_true",
                   help="only window limits that are multiples of 64 bytes (default: some unaligned ones too)")
    p.add_argument("--backend", default="verilator")
    a = p.parse_args(argv)
    last = [0.0]

    def progress(t):
        now = time.perf_counter()
        if now - last[0] > 10:
            last[0] = now
            print(f"  ... {t['cases']} cases, {t['hangs']} hangs, {t['window_escapes']} escapes, "
                  f"{t['corrupted_queues']} corrupted, {t['mismatches']} mismatches", flush=True)

    t = campaign(a.cases, seed=a.seed, jobs=a.jobs, backend=a.backend, progress=progress,
                 max_subs=a.max_subs, unaligned=not a.aligned_windows)
    print(f"cases: {t['cases']} ({t['batches']} batches, {t['descriptors']} descriptors, "
          f"{t['cycles']} cycles) in {t['seconds']:.1f} s")
    print(f"hangs: {t['hangs']}")
    print(f"window escapes: {t['window_escapes']}")
    print(f"corrupted queues: {t['corrupted_queues']}")
    print(f"golden mismatches: {t['mismatches']}")
    print(f"rejected accesses: {t['rejected']} (all forged; HMEM_REJECTS read exact in {t['rejects_exact']} "
          f"batches)")
    print(f"per case: {1e3 * t['batch_seconds'] / max(t['cases'], 1):.1f} ms of one core (generation, RTL, "
          f"golden, checks)")
    print(f"statuses: {_status_text(t['statuses'])}")
    print("features: " + ", ".join(f"{k} {v}" for k, v in sorted(t["features"].items())))
    for f in t["failures"][:10]:
        print("FAIL seed", f)
    return 0 if not (t["hangs"] or t["window_escapes"] or t["corrupted_queues"] or t["mismatches"]) else 1


if __name__ == "__main__":
    sys.exit(main())
