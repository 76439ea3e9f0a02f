"""Golden model of ``hdl/ndp/core.NDPCore``: the descriptors' results, returned data and completions, bit-exact.

The model works at descriptor granularity (no timing) and mirrors the core (``hdl/ndp/core.py``,
``docs/ndp_descriptor.md``, ``docs/ndp_core.md``):

* Descriptors complete in order; each gets one :class:`Completion` ``(seq, status, result)``. ``seq`` counts
  descriptors from 0 modulo 2**16 (rejected ones included). ``status`` is :meth:`Descriptor.validate`; if that
  is OK, the control unit's state check (:class:`StateTable`): a CHAIN needs the owner's kept result of the
  input's shape, an ACC the owner's partial of the result's shape; otherwise FOREIGN_STATE if the owner holds
  no state while another owner does, else NO_CHAIN_INPUT.
* State (per owner, in one of ``config.state_slots`` slots): an OK KEEP sets the owner's kept result (FP16;
  GEMV/GEMM: the result, SOFTMAX: the R x L exponentials); an OK PARTIAL sets the owner's partial (accumulator
  format); an OK ACC without PARTIAL consumes it. Other descriptors leave every slot unchanged. An owner
  without a slot takes a free one (lowest index) or evicts the slot at a round-robin pointer.
* Device memory is byte-addressed, little-endian FP16 elements. LOAD returns ``operand_bytes / 2`` elements
  from ``base_addr``; STORE writes its input to ``base_addr`` and returns nothing.
* GEMV/GEMM: :func:`sim.golden.pe_array.gemm_mode` in ``config.acc`` (row, row_half, trans or trans_half
  dataflow; GROUP: :func:`sim.golden.pe_array.gemm_group` on the R / g packed beats, the result R x W, ``docs/ndp_pe_array.md``; a TRANS operand is read in its k-major layout of column groups and
  row blocks, :func:`trans_layout`); ACC adds the partial (``partial + y`` in the accumulator format); PARTIAL keeps the
  result in the accumulator format; otherwise, for ``acc="fp32"``, each result is rounded to FP16
  (:func:`sim.golden.fp16.from_f32`, RNE). Row-major B x N.
* SOFTMAX: :func:`sim.golden.softmax.softmax_rows` on the R x L input with the SFU's ``sfu_lanes``; the result
  is the exponentials row-major, then per row ``[m_r, sum_r & 0xFFFF, sum_r >> 16]``: ``R * (L + 3)`` elements.
* Returned elements (the ``y`` stream, packed row-major): LOAD, GEMV, GEMM: the whole result, or nothing with
  KEEP or PARTIAL; SOFTMAX: the whole result, or with KEEP only the ``3 R`` anchor elements.
* The GPU sends ``x`` only for descriptors that complete OK, have an input and no CHAIN (:func:`x_beats`):
  a READ_COMPUTE's input rows each padded to whole beats, a STORE's bytes as they are.

State (device memory, the ``seq`` counter and the state slots) persists across :meth:`GoldenCore.run` calls,
as in the hardware; :meth:`GoldenCore.reset` clears the counter and the state (not the memory).

:func:`accuracy_report` measures the kernels of :mod:`firmware.ndp.kernels` (LoRA E3/E4, integral attention)
run through this model against float64 references.
"""

from dataclasses import dataclass, field

import numpy as np

from hdl.ndp.config import NDPConfig
from hdl.ndp.descriptor import DescType, DescOp, ErrorCode, SEQ_BITS, OWNER_BITS
from hdl.fp.format import FP16, FP32
from . import fp16
from .bits import as_bits, canonicalize_nan
from .pe_array import gemm_mode, gemm_group, mode_of
from .softmax import softmax_rows

__all__ = ["Completion", "GoldenCore", "StateTable", "beats", "unbeats", "x_beats", "trans_layout",
           "trans_unlayout", "accuracy_report", "accuracy_table"]


@dataclass(frozen=True)
class Completion:
    """One descriptor's completion: ``seq`` (mod 2**16), ``status`` and ``result``, the elements the core
    *returns* on ``y`` (uint16 1-D, possibly empty; not padded to whole beats: see :func:`beats`)."""
    seq: int
    status: ErrorCode
    result: np.ndarray = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.status == ErrorCode.OK


def _check_config(config):
    if not isinstance(config, NDPConfig):
        raise ValueError(f"config must be an NDPConfig, got {config!r}")


def _trans_order(k: int, n: int, lanes: int, group: int):
    """(column-group, block) pieces of the TRANS storage order: [(c0, c1, k0, k1), ...]."""
    for c0 in range(0, n, group):
        for k0 in range(0, k, lanes):
            yield c0, min(n, c0 + group), k0, min(k, k0 + lanes)


def trans_layout(a_bits, lanes: int, group: int) -> np.ndarray:
    """The storage order of a TRANS operand A (K x N, uint16), uint16 1-D: for each group of ``group`` columns
    (the PE accumulator words, ``config.acc_columns``; the last group may be narrower), for each block of
    ``lanes`` rows (K < lanes: one block of K rows), for each column of the group, that block's rows of it."""
    a = np.asarray(a_bits)
    if a.ndim != 2:
        raise ValueError(f"A must be 2-D (K, N), got shape {a.shape}")
    k, n = a.shape
    return np.concatenate([np.ascontiguousarray(a[k0:k1, c0:c1].T).reshape(-1)
                           for c0, c1, k0, k1 in _trans_order(k, n, lanes, group)]).astype(np.uint16)


def trans_unlayout(flat, k: int, n: int, lanes: int, group: int) -> np.ndarray:
    """Inverse of :func:`trans_layout`: A (K x N) from its TRANS storage order."""
    flat = np.asarray(flat).reshape(-1)
    if flat.size != k * n:
        raise ValueError(f"expected {k * n} elements, got {flat.size}")
    a = np.zeros((k, n), np.uint16)
    pos = 0
    for c0, c1, k0, k1 in _trans_order(k, n, lanes, group):
        cnt = (c1 - c0) * (k1 - k0)
        a[k0:k1, c0:c1] = flat[pos:pos + cnt].reshape(c1 - c0, k1 - k0).T
        pos += cnt
    return a


class StateTable:
    """The control unit's state check and slot bookkeeping (shapes only): ``config.state_slots`` slots, each
    ``owner``, ``kept`` (rows, cols) or None, ``partial`` (rows, cols) or None, and a round-robin victim
    pointer. :meth:`check` gives the status of an accepted descriptor; :meth:`commit` applies an OK one and
    returns its slot index (or None)."""

    def __init__(self, slots: int, config=None):
        self.slots = slots
        self.config = config            # the core's: a GROUP GEMM's result is R x group_lanes (K = n W)
        self.reset()

    def reset(self):
        self.owner = [0] * self.slots
        self.kept = [None] * self.slots
        self.partial = [None] * self.slots
        self.victim = 0

    def _valid(self, i):
        return self.kept[i] is not None or self.partial[i] is not None

    def slot_of(self, owner):
        for i in range(self.slots):
            if self._valid(i) and self.owner[i] == owner:
                return i
        return None

    def check(self, desc, owner) -> ErrorCode:
        if not (desc.chain or desc.acc):
            return ErrorCode.OK
        i = self.slot_of(owner)
        ok = i is not None
        if ok and desc.chain:
            ok = self.kept[i] == (desc.input_dim0, desc.input_dim1)
        if ok and desc.acc:
            ok = self.partial[i] == desc.result_shape(self.config)
        if ok:
            return ErrorCode.OK
        if i is None and any(self._valid(j) for j in range(self.slots)):
            return ErrorCode.FOREIGN_STATE
        return ErrorCode.NO_CHAIN_INPUT

    def commit(self, desc, owner):
        """Slot used by an OK descriptor (for CHAIN/ACC reads and KEEP/PARTIAL writes), after updating the
        table; None if it uses none."""
        i = self.slot_of(owner)
        if not (desc.keep or desc.partial or desc.chain or desc.acc):
            return None
        if i is None:                           # only KEEP / PARTIAL get here without a slot
            free = [j for j in range(self.slots) if not self._valid(j)]
            if free:
                i = free[0]
            else:
                i = self.victim
                self.victim = (self.victim + 1) % self.slots
            self.owner[i], self.kept[i], self.partial[i] = owner, None, None
        if desc.keep:
            self.kept[i] = desc.result_shape(self.config)
        if desc.partial:
            self.partial[i] = desc.result_shape(self.config)
        elif desc.acc:
            self.partial[i] = None
        return i


def _input_bits(desc, data, where):
    """The GPU input of a descriptor (``where`` names it in errors) as uint16 (input_dim0 * input_dim1,)."""
    if data is None:
        raise ValueError(f"{where}: {desc.type.name}/{desc.op.name} descriptor without CHAIN needs a "
                         f"GPU input array, got None")
    arr = np.asarray(data)
    if arr.dtype == np.float16:
        arr = arr.view(np.uint16)
    arr = as_bits(arr, FP16, f"{where} input")
    n = desc.input_dim0 * desc.input_dim1
    if arr.size != n or arr.ndim not in (1, 2) or (arr.ndim == 2 and arr.shape != (desc.input_dim0,
                                                                                  desc.input_dim1)):
        raise ValueError(f"{where}: input must be ({desc.input_dim0}, {desc.input_dim1}) or "
                         f"({n},) FP16 bits, got shape {arr.shape}")
    return arr.reshape(-1).astype(np.uint16)


def _entries(program):
    """``program`` as (Descriptor, input, owner) triples (entries may omit the owner: 0)."""
    if not isinstance(program, (list, tuple)):
        raise ValueError(f"program must be a list of (Descriptor, input or None[, owner]), got "
                         f"{type(program).__name__}")
    from firmware.ndp.descriptor import Descriptor
    out = []
    for i, entry in enumerate(program):
        if (not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3)
                or not isinstance(entry[0], Descriptor)):
            raise ValueError(f"program[{i}] must be a (Descriptor, input or None[, owner]) tuple, got {entry!r}")
        owner = entry[2] if len(entry) == 3 else 0
        if isinstance(owner, bool) or not isinstance(owner, (int, np.integer)) or not 0 <= owner < 1 << OWNER_BITS:
            raise ValueError(f"program[{i}]: owner must be an int in 0..2**{OWNER_BITS} - 1, got {owner!r}")
        out.append((entry[0], entry[1], int(owner)))
    return out


def _check_program(program):
    _entries(program)


def statuses(program, config) -> list:
    """The completion status of every descriptor of ``program`` (decoder + state check), without executing."""
    _check_config(config)
    table = StateTable(config.state_slots, config)
    out = []
    for desc, _, owner in _entries(program):
        st = desc.validate(config)
        if st == ErrorCode.OK:
            st = table.check(desc, owner)
        if st == ErrorCode.OK:
            table.commit(desc, owner)
        out.append(st)
    return out


class GoldenCore:
    """Descriptor-level golden model of one NDP core with ``memory_bytes`` bytes of device memory (zeroed).

    ``memory_bytes`` may be smaller than ``config.device_bytes`` (a test memory); an accepted descriptor that
    reaches past it raises ValueError (the test set-up is wrong, the hardware would have accepted it).
    """

    def __init__(self, config: NDPConfig, memory_bytes: int):
        _check_config(config)
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 1:
            raise ValueError(f"memory_bytes must be a positive int, got {memory_bytes!r}")
        if memory_bytes > config.device_bytes:
            raise ValueError(f"memory_bytes ({memory_bytes}) must be <= config.device_bytes "
                             f"({config.device_bytes})")
        if memory_bytes > 1 << 34:
            raise ValueError(f"memory_bytes ({memory_bytes}) is too large for a golden model (max 2**34)")
        self.config = config
        self.memory = bytearray(memory_bytes)
        self.reset()

    def reset(self):
        """Clear the sequence counter and the state slots (memory is kept)."""
        self.seq = 0
        self.table = StateTable(self.config.state_slots, self.config)
        self._kept = [None] * self.config.state_slots        # FP16 uint16 (rows, cols)
        self._partial = [None] * self.config.state_slots     # accumulator bits (rows, cols)

    def kept(self, owner: int = 0):
        """The owner's kept FP16 result (uint16 (rows, cols)) or None."""
        i = self.table.slot_of(owner)
        return None if i is None or self.table.kept[i] is None else self._kept[i].copy()

    def partial(self, owner: int = 0):
        """The owner's partial (accumulator-format bits (rows, cols)) or None."""
        i = self.table.slot_of(owner)
        return None if i is None or self.table.partial[i] is None else self._partial[i].copy()

    # ---- memory ------------------------------------------------------------------------------------------

    def _range(self, addr, nbytes, what):
        if isinstance(addr, bool) or not isinstance(addr, (int, np.integer)) or addr < 0:
            raise ValueError(f"{what}: addr must be a non-negative int, got {addr!r}")
        if addr + nbytes > len(self.memory):
            raise ValueError(f"{what}: bytes [{addr}, {addr + nbytes}) exceed the {len(self.memory)}-byte "
                             f"golden memory")

    def write(self, addr: int, bits):
        """Write FP16 elements (uint16, any shape, row-major) little-endian at byte ``addr``."""
        arr = np.asarray(bits)
        if arr.dtype == np.float16:
            arr = arr.view(np.uint16)
        arr = as_bits(arr, FP16, "bits").reshape(-1)
        self._range(addr, 2 * arr.size, "write")
        self.memory[addr:addr + 2 * arr.size] = arr.astype("<u2").tobytes()

    def read(self, addr: int, n: int) -> np.ndarray:
        """``n`` FP16 elements (uint16 1-D) from byte ``addr``."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"read: n must be a non-negative int, got {n!r}")
        self._range(addr, 2 * n, "read")
        return np.frombuffer(bytes(self.memory[addr:addr + 2 * n]), dtype="<u2").astype(np.uint16)

    # ---- execution ---------------------------------------------------------------------------------------

    def _operand(self, desc):
        k, n = desc.operand_dim0, desc.operand_dim1
        flat = self.read(desc.base_addr, k * n)
        if desc.trans:
            return trans_unlayout(flat, k, n, self.config.lanes, self.config.acc_columns)
        return flat.reshape(k, n)

    def _execute(self, desc, inp, slot):
        """(returned elements, kept FP16 (rows, cols) or None, partial or None) of an accepted descriptor."""
        cfg = self.config
        empty = np.zeros(0, np.uint16)
        if desc.type == DescType.LOAD:
            return self.read(desc.base_addr, desc.operand_bytes // 2), None, None
        if desc.type == DescType.STORE:
            self.write(desc.base_addr, inp)
            return empty, None, None
        if desc.is_mm:
            a = self._operand(desc)
            if desc.grouped(cfg):       # R rows of K = n W: R / g PE rows of n beats; the result R x W
                W = desc.group_width(cfg)                       # (NARROW: group_lanes / 2)
                x = inp.reshape(-1, (desc.operand_dim0 // W) * cfg.lanes)
                y = gemm_group(x, a, acc=cfg.acc, lanes=cfg.lanes, group=W)
                y = y.reshape(desc.input_dim0, W)
            else:
                x = inp.reshape(desc.input_dim0, desc.input_dim1)
                mode = mode_of(a.shape[0], a.shape[1], cfg.lanes, desc.trans)
                y = gemm_mode(x, a, acc=cfg.acc, lanes=cfg.lanes, mode=mode)
            if desc.acc:
                ftype = np.float32 if cfg.acc == "fp32" else np.float16
                with np.errstate(all="ignore"):
                    y = (self._partial[slot].view(ftype) + y.view(ftype)).view(y.dtype)
                y = canonicalize_nan(y, FP32 if cfg.acc == "fp32" else FP16)
            if desc.partial:
                return empty, None, y.copy()
            if cfg.acc == "fp32":
                y = fp16.from_f32(y)
            y = y.astype(np.uint16)
            if desc.keep:
                return empty, y, None
            return y.reshape(-1), None, None
        # SOFTMAX
        rows, length = desc.input_dim0, desc.input_dim1
        e, m, s = softmax_rows(inp.reshape(rows, length), cfg.sfu_lanes)
        anchors = np.stack([m, (s & 0xFFFF).astype(np.uint16), (s >> 16).astype(np.uint16)], axis=1)
        anchors = anchors.astype(np.uint16).reshape(-1)
        if desc.keep:
            return anchors, e.astype(np.uint16).reshape(rows, length), None
        return np.concatenate([e.reshape(-1), anchors]).astype(np.uint16), None, None

    def step(self, desc, inp=None, owner: int = 0) -> Completion:
        """Execute one descriptor of ``owner`` (``inp``: its GPU input, ignored unless it takes ``x``)."""
        _entries([(desc, inp, owner)])
        status = desc.validate(self.config)
        if status == ErrorCode.OK:
            status = self.table.check(desc, owner)
        seq = self.seq
        self.seq = (self.seq + 1) % (1 << SEQ_BITS)
        if status != ErrorCode.OK:
            return Completion(seq, status, np.zeros(0, np.uint16))
        if desc.type == DescType.LOAD or desc.chain:
            if inp is not None:
                raise ValueError(f"descriptor {seq}: {'CHAIN' if desc.chain else 'LOAD'} descriptors take no GPU "
                                 f"input; pass None")
        read_slot = self.table.slot_of(owner)
        if desc.chain:
            x = self._kept[read_slot].reshape(-1).copy()
        elif desc.has_input:
            x = _input_bits(desc, inp, f"descriptor seq {seq}")
        else:
            x = None
        slot = self.table.commit(desc, owner)
        returned, kept, partial = self._execute(desc, x, read_slot if desc.acc else None)
        if kept is not None:
            self._kept[slot] = kept
        if partial is not None:
            self._partial[slot] = partial
        return Completion(seq, status, returned.copy())

    def run(self, program) -> list[Completion]:
        """Execute ``program`` (a list of ``(Descriptor, input uint16 array or None[, owner])``) in order."""
        return [self.step(d, x, o) for d, x, o in _entries(program)]


# ---- streams -------------------------------------------------------------------------------------------------

def _check_lanes(lanes):
    if isinstance(lanes, bool) or not isinstance(lanes, (int, np.integer)) or lanes < 1:
        raise ValueError(f"lanes must be a positive int, got {lanes!r}")


def beats(result, lanes: int) -> list[int]:
    """Elements packed into ``lanes``-element beats: element ``l`` of a beat in bits ``[16 l, 16 l + 16)``,
    the last beat zero-padded. An empty result gives no beats."""
    _check_lanes(lanes)
    arr = np.asarray(result)
    if arr.dtype == np.float16:
        arr = arr.view(np.uint16)
    arr = as_bits(arr, FP16, "result").reshape(-1)
    n = -(-arr.size // lanes)
    padded = np.zeros(n * lanes, np.uint16)
    padded[:arr.size] = arr
    return [int.from_bytes(padded[i * lanes:(i + 1) * lanes].astype("<u2").tobytes(), "little")
            for i in range(n)]


def unbeats(words, lanes: int, n: int | None = None) -> np.ndarray:
    """Inverse of :func:`beats`: the first ``n`` elements (all if None) of the beats, uint16 1-D."""
    _check_lanes(lanes)
    out = []
    for w in words:
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or not 0 <= int(w) < 1 << (16 * lanes):
            raise ValueError(f"a beat must be an int in [0, 2**{16 * lanes}), got {w!r}")
        out.append(np.frombuffer(int(w).to_bytes(2 * lanes, "little"), dtype="<u2"))
    arr = np.concatenate(out).astype(np.uint16) if out else np.zeros(0, np.uint16)
    return arr if n is None else arr[:n]


def x_beats(program, config: NDPConfig) -> list[int]:
    """The ``x`` beats the GPU sends for ``program``: the input of every descriptor that completes OK (decoder
    and state check, :func:`statuses`), has an input and no CHAIN, in order: a READ_COMPUTE's rows each padded
    to whole beats (``input_dim0 * ceil(input_dim1 / lanes)`` beats), a STORE's bytes as they are."""
    _check_config(config)
    lanes = config.lanes
    out = []
    for i, ((desc, data, _), st) in enumerate(zip(_entries(program), statuses(program, config))):
        if st != ErrorCode.OK or not desc.has_input or desc.chain:
            continue
        bits = _input_bits(desc, data, f"program[{i}]")
        if desc.type == DescType.READ_COMPUTE and not desc.grouped(config):   # (GROUP: packed rows)
            rows, cols = desc.input_dim0, desc.input_dim1
            w = -(-cols // lanes) * lanes
            padded = np.zeros((rows, w), np.uint16)
            padded[:, :cols] = bits.reshape(rows, cols)
            bits = padded
        out += beats(bits, lanes)
    return out


# ---- accuracy ------------------------------------------------------------------------------------------------

def _fp16(values) -> np.ndarray:
    return np.asarray(values, np.float64).astype(np.float16).view(np.uint16)


def _f64(bits) -> np.ndarray:
    return np.asarray(bits).view(np.float16).astype(np.float64)


def _errors(y, ref) -> dict:
    """``max_rel``/``mean_rel``: ``|y - ref| / |ref|`` elementwise over ``ref != 0``; ``norm_rel``:
    ``max|y - ref| / max|ref|`` (stays meaningful when single outputs cancel to near 0)."""
    y = np.asarray(y, np.float64).reshape(-1)
    ref = np.asarray(ref, np.float64).reshape(-1)
    err = np.abs(y - ref)
    nz = ref != 0
    rel = err[nz] / np.abs(ref[nz])
    return {"max_rel": float(rel.max()), "mean_rel": float(rel.mean()),
            "norm_rel": float(err.max() / np.abs(ref).max()), "outputs": int(y.size),
            "nonfinite": int((~np.isfinite(y)).sum())}


def accuracy_report(config: NDPConfig, *, d: int = 64, r: int = 16, batch: int = 8, head_dim: int = 32,
                    l: int = 64, devices: int = 4, seed: int = 0) -> dict:
    """Error of the device kernels, run through :class:`GoldenCore`, against float64 references.

    Data (fixed seed): x ~ N(0, 1) (``batch`` x ``d``), A ~ N(0, 1/d) (``d`` x ``r``), B ~ N(0, 1/r)
    (``r`` x ``d``), all rounded to FP16; q, K, V ~ N(0, 1) of ``head_dim`` columns, sequence length
    ``devices * l`` split evenly over ``devices`` cores (each holds K^T and V of ``l`` positions).

    * ``e4``: ``m = x A`` (returned FP16) vs float64 ``x A`` of the FP16 inputs.
    * ``e3``: ``y = (x A) B`` on the device (m kept on the device in FP16) vs float64 ``x A B``.
    * ``attention``: :func:`firmware.ndp.kernels.attention_integral` on every core, merged by
      :func:`sim.golden.attention.merge_partials` (float32), vs :func:`sim.golden.attention.reference_attention` (float64,
      on the unscaled FP16 q, K, V with scale 1/sqrt(d); the FP16 rounding of the pre-scaled q is included).

    Returns ``{"config", "acc", "e3": stats, "e4": stats, "attention": stats}``, stats as :func:`_errors`.
    """
    from firmware.ndp import kernels
    from sim.golden import attention as host_attn
    _check_config(config)
    rng = np.random.default_rng(seed)
    x = _fp16(rng.standard_normal((batch, d)))
    a = _fp16(rng.standard_normal((d, r)) / np.sqrt(d))
    b = _fp16(rng.standard_normal((r, d)) / np.sqrt(r))
    lay = kernels.lora_layout(d, r, config=config)
    core = GoldenCore(config, lay["end"])
    core.run(kernels.lora_store(a, b, lay, config=config).program)
    e4 = kernels.lora_e4(x, lay, config=config)
    m = e4.results(core.run(e4.program))
    e3 = kernels.lora_e3(x, lay, config=config)
    y = e3.results(core.run(e3.program))
    xf, af, bf = _f64(x), _f64(a), _f64(b)
    out = {"config": config.name, "acc": config.acc,
           "e4": _errors(_f64(m), xf @ af), "e3": _errors(_f64(y), xf @ af @ bf)}

    hd = head_dim
    seq = devices * l
    q = _fp16(rng.standard_normal(hd))
    k = _fp16(rng.standard_normal((seq, hd)))
    v = _fp16(rng.standard_normal((seq, hd)))
    qs = host_attn.prepare_query(q)
    partials = []
    for dev in range(devices):
        kl, vl = k[dev * l:(dev + 1) * l], v[dev * l:(dev + 1) * l]
        kv = kernels.kv_layout(hd, l, config=config)
        core = GoldenCore(config, kv["end"])
        core.run(kernels.kv_store(kl, vl, kv, config=config).program)
        att = kernels.attention_integral(qs, kv, config=config)
        for tile, (o, mm, ss) in enumerate(att.results(core.run(att.program))):
            partials.append(((dev, tile), o, mm, ss))
    got = host_attn.merge_partials(partials)
    ref = host_attn.reference_attention(_f64(q), _f64(k), _f64(v))
    out["attention"] = _errors(got, ref)
    return out


def accuracy_table(configs, **kwargs) -> str:
    """:func:`accuracy_report` for each config as a Markdown table (rows: kernel x acc)."""
    lines = ["| kernel | acc | max rel | mean rel | norm rel (max err / max abs ref) |",
             "|---|---|---|---|---|"]
    for cfg in configs:
        rep = accuracy_report(cfg, **kwargs)
        for kern in ("e4", "e3", "attention"):
            s = rep[kern]
            lines.append(f"| {kern} | {rep['acc']} | {s['max_rel']:.3e} | {s['mean_rel']:.3e} | "
                         f"{s['norm_rel']:.3e} |")
    return "\n".join(lines)
