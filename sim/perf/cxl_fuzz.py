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

``python -m sim.perf.cxl_fuzz --cases N [--seed S] [--jobs J]`` runs a campaign and prints the counts.
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
from host.cxl_driver import Driver
from sim.golden.cxl_device import decode_descriptor, encode_descriptor

__all__ = ["FUZZ_CONFIG", "FUZZ_QUEUES", "FUZZ_DEPTH", "REGION_BYTES", "make_batch", "run_batch", "check_batch",
           "BatchResult", "campaign", "main"]

FUZZ_QUEUES = 16
REGION_BYTES = 8 << 10             # per queue: ring at +0, completion area at +3 KiB, window area +6..8 KiB
FUZZ_DEPTH = FUZZ_QUEUES * REGION_BYTES // 64
SQ_OFF, CQ_OFF, WIN_OFF = 0, 3 << 10, 6 << 10
#: A small core so rings and windows stay small: 512 B input / result areas, 2 KiB operands, 128 KiB memory.
FUZZ_CONFIG = replace(TINY, name="cxl-fuzz", input_buffer_bytes=512, output_buffer_bytes=512,
                      dram_buffer_bytes=2048, device_bytes=FUZZ_DEPTH * 64)
_ENTRIES = (1, 2, 4)
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
    kept: int = 0                     # elements the previous descriptor of this queue keeps (generator's guess)


@dataclass
class Case:
    """One random program: its queues and the steps that build its script."""
    id: int
    queues: list
    steps: list
    features: set = field(default_factory=set)


def _region(q):
    return q * REGION_BYTES


def _pick_window(rng, q, unaligned):
    lo_area, hi_area = _region(q) + WIN_OFF, _region(q) + REGION_BYTES
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
        return _region(qc.q) + SQ_OFF
    feats.add("escape_far")
    return 64 * int(rng.integers(0, (1 << 20)))


def _valid_descriptor(rng, qc, others, feats):
    r = rng.random()                                 # gemv 0.3, gemm 0.2, softmax 0.15, load 0.15, store 0.2
    kind = "gemv" if r < 0.3 else "gemm" if r < 0.5 else "softmax" if r < 0.65 else "load" if r < 0.8 else "store"
    keep = rng.random() < 0.25
    chain = qc.kept > 0 and rng.random() < 0.5
    if kind in ("gemv", "gemm"):
        n = 8 * int(rng.integers(1, 3))
        b = int(rng.integers(1, 5)) if kind == "gemm" else 1
        k = 8 * int(rng.integers(1, 3))
        if chain:                                    # consume the kept result: B x K = kept
            fits = [bb for bb in ((1,) if kind == "gemv" else (1, 2, 3, 4))
                    if qc.kept % bb == 0 and qc.kept // bb in (8, 16)]
            if fits:
                b = fits[int(rng.integers(0, len(fits)))]
                k = qc.kept // b
            else:
                chain = False
        nbytes = k * n * 2
        base = _operand_base(rng, qc, nbytes, others, feats)
        d = (gemv(base, k, n, keep=keep, chain=chain) if kind == "gemv"
             else gemm(base, b, k, n, keep=keep, chain=chain))
        inp = None if chain else _fp16(rng, b * k, 1.0)
        kept = b * n if keep else 0
    elif kind == "softmax":
        rows, cols = int(rng.integers(1, 4)), 8 * int(rng.integers(1, 3))
        if chain and qc.kept % 8 == 0 and qc.kept <= 32:
            rows, cols = 1, qc.kept
        else:
            chain = False
        d = softmax(rows, cols, keep=keep, chain=chain)
        inp = None if chain else _fp16(rng, rows * cols, 3.0)
        kept = rows * cols if keep else 0
    elif kind == "load":
        rows, cols = int(rng.integers(1, 9)), int(rng.integers(1, 17))
        base = _operand_base(rng, qc, rows * cols * 2, others, feats)
        d, inp, kept = load(base, rows, cols), None, 0
    else:
        rows, cols = _STORE_SHAPES[int(rng.integers(0, len(_STORE_SHAPES)))]
        base = _operand_base(rng, qc, rows * cols * 2, others, feats)
        d, inp, kept = store(base, rows, cols), _fp16(rng, rows * cols, 1.0), 0
    if d.chain:
        feats.add("chain")
    if d.keep:
        feats.add("keep")
    return d, inp, kept


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
        d = gemv(w(192), 12, 8) if rng.random() < 0.5 else store(w(64), 1, 8)           # NOT_MULTIPLE
    elif k == 11:
        d = replace(load(w(64), 2, 8) if rng.random() < 0.5 else store(w(64), 1, 32),
                    flags=int(rng.integers(1, 4)))                                       # BAD_FLAGS
    elif k == 12:
        d = replace(gemv(w(256), 8, 16), reserved=int(rng.integers(1, 64)))              # ignored: OK
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
    if d.keep:
        elems = 3 * d.input_dim0 if d.op.name == "SOFTMAX" else 0
    else:
        elems = d.output_elems()
    beat = 2 * FUZZ_CONFIG.lanes
    return min(-(-elems * 2 // beat) * beat, FUZZ_CONFIG.output_buffer_bytes)


def _case(rng, case_id, queues, *, max_subs, unaligned):
    feats = set()
    qcs = []
    steps = []
    for q in queues:
        entries = _ENTRIES[int(rng.integers(0, len(_ENTRIES)))]
        wb, wl, feat = _pick_window(rng, q, unaligned)
        if feat:
            feats.add(feat)
        area = (_region(q) + WIN_OFF, _region(q) + REGION_BYTES)
        qc = _QueueCase(q, entries, wb, wl, area)
        steps.append(("configure", q, dict(sq_base=_region(q) + SQ_OFF, entries=entries,
                                           cq_base=_region(q) + CQ_OFF, win_base=wb, win_limit=wl,
                                           pasid=int(rng.integers(0, 1 << 20)))))
        # initial data: the window lines (the rest of the area stays zero)
        lo, hi = wb // 64 * 64, -(-wl // 64) * 64
        data = _fp16(rng, (hi - lo) // 2, 1.0).astype("<u2").tobytes() if hi > lo else b""
        init = bytearray(area[1] - area[0])
        init[lo - area[0]:hi - area[0]] = data
        qc.initial = bytes(init)
        if data:
            steps.append(("store", lo, data))
        qcs.append(qc)
    # submissions, interleaved over the case's queues
    nsubs = {qc.q: int(rng.integers(1, max_subs + 1)) for qc in qcs}
    order = [qc for qc in qcs for _ in range(nsubs[qc.q])]
    rng.shuffle(order)
    deferred = set()
    for qc in order:
        others = [o for o in qcs if o is not qc] + []
        index = len(qc.subs)
        if index >= qc.entries:
            prev = qc.subs[index - qc.entries]
            steps.append(("read_cpl", qc.q, prev[0], prev[3]))
            feats.add("ring_wrap")
        if rng.random() < 0.12:
            desc, inp = _malformed(rng, qc, others, feats)
            kept = 0
        else:
            desc, inp, kept = _valid_descriptor(rng, qc, others, feats)
        rbytes = _returned_bytes(desc)
        qc.kept = kept
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
    for qc in qcs:
        steps.append(("ring", qc.q))
    for qc in qcs:
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
    handles: dict                 # case id -> list of (kind, q, index or None, handle)
    mmio_delay: int = 0
    traffic_seed: int | None = None


def _apply(drv, step, handles):
    kind = step[0]
    if kind == "configure":
        drv.configure(step[1], **step[2])
    elif kind == "store":
        drv.store(step[1], step[2], after=0)
    elif kind == "submit":
        _, q, desc, inp, mode = step
        drv.submit(q, desc, inp, doorbell=mode != "defer", early_doorbell=mode == "early")
    elif kind == "ring":
        drv.ring(step[1])
    elif kind == "read_cpl":
        handles.append(("cpl", step[1], step[2], drv.read_completion(step[1], step[2], result_bytes=step[3])))
    elif kind == "read_area":
        handles.append(("area", step[1], None, drv.read(step[2], step[3])))
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
               queues: int = FUZZ_QUEUES) -> Batch:
    """A batch of random cases filling ``queues`` queues (or the first ``cases`` cases), scripts interleaved."""
    rng = np.random.default_rng(seed)
    case_list, q = [], 0
    while queues - q >= 2 and (cases is None or len(case_list) < cases):
        n = min(int(rng.integers(2, 5)), queues - q)
        if queues - q - n == 1:
            n += 1 if n < 4 else -1
        case_list.append(_case(rng, len(case_list), list(range(q, q + n)), max_subs=max_subs,
                               unaligned=unaligned))
        q += n
    drv = Driver(FUZZ_QUEUES, config=FUZZ_CONFIG, depth=FUZZ_DEPTH)
    handles = {c.id: [] for c in case_list}
    pos = [0] * len(case_list)
    live = [i for i, c in enumerate(case_list) if c.steps]
    for u in rng.random(sum(len(c.steps) for c in case_list)).tolist():   # each step: a live case at random
        i = live[int(u * len(live))]
        c = case_list[i]
        _apply(drv, c.steps[pos[i]], handles[i])
        pos[i] += 1
        if pos[i] == len(c.steps):
            live.remove(i)
    r = rng.random()
    late = _late_delay(drv)
    delay = 0 if r < 0.5 else int(rng.integers(1, late)) if r < 0.8 else late
    tseed = int(rng.integers(0, 1 << 31)) if rng.random() < 0.3 else None
    return Batch(seed, case_list, drv, handles, delay, tseed)


def _single(batch, case):
    drv = Driver(FUZZ_QUEUES, config=FUZZ_CONFIG, depth=FUZZ_DEPTH)
    handles = []
    for step in case.steps:
        _apply(drv, step, handles)
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
    for e in rtl.events:
        res.statuses[e.status] = res.statuses.get(e.status, 0) + 1
    for c in batch.cases:
        for f in c.features:
            res.features[f] = res.features.get(f, 0) + 1
    return res


def _system():
    from host.cxl_driver import system_for
    return system_for(FUZZ_CONFIG, FUZZ_QUEUES, FUZZ_DEPTH)


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
        rtl = batch.driver.run(backend, system=system, traffic=traffic, mmio_delay=batch.mmio_delay)
    except SimulationTimeout:
        res = BatchResult(seed, len(batch.cases))
        for c in batch.cases:          # attribute the hang
            try:
                _single(batch, c).run(backend, system=system)
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
              "corrupted_queues": 0, "mismatches": 0, "statuses": {}, "features": {}, "failures": []}
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
    p = argparse.ArgumentParser(prog="python -m sim.perf.cxl_fuzz", description=__doc__.split("\n")[0])
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
    print(f"statuses: {_status_text(t['statuses'])}")
    print("features: " + ", ".join(f"{k} {v}" for k, v in sorted(t["features"].items())))
    for f in t["failures"][:10]:
        print("FAIL seed", f)
    return 0 if not (t["hangs"] or t["window_escapes"] or t["corrupted_queues"] or t["mismatches"]) else 1


if __name__ == "__main__":
    sys.exit(main())
