"""Golden model of ``hdl/ndp/core.NDPCore``: the descriptors' results, returned data and completions, bit-exact.

The model works at descriptor granularity (no timing) and mirrors the core's control unit
(``hdl/ndp/core.py``, ``docs/ndp_descriptor.md``):

* Descriptors execute one at a time, in order; each gets one :class:`Completion` ``(seq, status, result)``.
  ``seq`` counts descriptors from 0 modulo 2**16 (rejected ones included). ``status`` is
  :meth:`Descriptor.validate`; if that is OK and the descriptor has CHAIN and its input elements exceed the
  elements *kept* by the immediately previous descriptor, NO_CHAIN_INPUT.
* *kept*: GEMV/GEMM with KEEP keep their whole result (``output_elems``); SOFTMAX with KEEP keeps the ``R * L``
  exponentials. Every completion sets *kept* for the next descriptor: 0 unless it completed OK with KEEP.
* Device memory is byte-addressed, little-endian FP16 elements. LOAD returns ``operand_bytes / 2`` elements
  from ``base_addr``; STORE writes its input to ``base_addr`` and returns nothing.
* GEMV/GEMM: ``Y = X A`` by :func:`sim.golden.pe_array.gemm` (sequential-in-k from +0, in ``config.acc``);
  for ``acc="fp32"`` each result is rounded to FP16 (:func:`sim.golden.fp16.from_f32`, RNE). Row-major R x N.
  (A GEMM batch over ``pe_batch`` runs as several passes in hardware; rows are independent, so the result is
  the whole ``gemm``.)
* SOFTMAX: :func:`sim.golden.softmax.softmax_rows` on the R x L input; the result is the exponentials
  row-major, then per row ``[m_r, sum_r & 0xFFFF, sum_r >> 16]``: ``R * (L + 3)`` elements.
* Returned elements (the ``y`` stream): LOAD, GEMV, GEMM: the whole result, or nothing with KEEP; SOFTMAX:
  the whole result, or with KEEP only the ``3 R`` anchor elements. Rejected descriptors return nothing.
* CHAIN input: the first ``input elements`` of the previous descriptor's kept result (row-major); the GPU sends
  no ``x`` for CHAIN descriptors nor for rejected ones (:func:`x_beats` gives exactly the beats it does send).

State (device memory, the ``seq`` counter and the kept result) persists across :meth:`GoldenCore.run` calls,
as in the hardware; :meth:`GoldenCore.reset` clears the counter and the kept result (not the memory).

:func:`accuracy_report` measures the kernels of :mod:`firmware.ndp.kernels` (LoRA E3/E4, integral attention)
run through this model against float64 references.
"""

from dataclasses import dataclass, field

import numpy as np

from hdl.ndp.config import NDPConfig
from hdl.ndp.descriptor import DescType, DescOp, ErrorCode, SEQ_BITS
from hdl.fp.format import FP16
from . import fp16
from .bits import as_bits
from .pe_array import gemm as pe_gemm
from .softmax import softmax_rows

__all__ = ["Completion", "GoldenCore", "beats", "unbeats", "x_beats", "accuracy_report"]


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


def _check_program(program):
    if not isinstance(program, (list, tuple)):
        raise ValueError(f"program must be a list of (Descriptor, input or None), got {type(program).__name__}")
    from firmware.ndp.descriptor import Descriptor
    for i, entry in enumerate(program):
        if not isinstance(entry, (list, tuple)) or len(entry) != 2 or not isinstance(entry[0], Descriptor):
            raise ValueError(f"program[{i}] must be a (Descriptor, input or None) pair, got {entry!r}")


def _takes_x(desc, status_ok: bool) -> bool:
    """Whether the GPU sends ``x`` beats for this descriptor (accepted by the decoder, has input, no CHAIN)."""
    return status_ok and desc.has_input and not desc.chain


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
        """Clear the sequence counter and the kept result (memory is kept)."""
        self.seq = 0
        self._kept = np.zeros(0, np.uint16)

    @property
    def kept(self) -> int:
        """Elements kept by the last descriptor (what a CHAIN descriptor may consume)."""
        return int(self._kept.size)

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

    def _execute(self, desc, inp):
        """Result (all elements, uint16 1-D), kept elements, returned elements of an accepted descriptor."""
        cfg = self.config
        empty = np.zeros(0, np.uint16)
        if desc.type == DescType.LOAD:
            res = self.read(desc.base_addr, desc.operand_bytes // 2)
            return res, empty, res
        if desc.type == DescType.STORE:
            self.write(desc.base_addr, inp)
            return empty, empty, empty
        if desc.op in (DescOp.GEMV, DescOp.GEMM):
            a = self.read(desc.base_addr, desc.operand_dim0 * desc.operand_dim1)
            a = a.reshape(desc.operand_dim0, desc.operand_dim1)
            x = inp.reshape(desc.input_dim0, desc.input_dim1)
            y = pe_gemm(x, a, acc=cfg.acc, lanes=cfg.lanes)
            if cfg.acc == "fp32":
                y = fp16.from_f32(y)
            res = y.astype(np.uint16).reshape(-1)
            if desc.keep:
                return res, res, empty
            return res, empty, res
        # SOFTMAX
        rows, length = desc.input_dim0, desc.input_dim1
        e, m, s = softmax_rows(inp.reshape(rows, length), cfg.lanes)
        anchors = np.stack([m, (s & 0xFFFF).astype(np.uint16), (s >> 16).astype(np.uint16)], axis=1)
        anchors = anchors.astype(np.uint16).reshape(-1)
        res = np.concatenate([e.reshape(-1), anchors]).astype(np.uint16)
        if desc.keep:
            return res, e.reshape(-1).astype(np.uint16), anchors
        return res, empty, res

    def step(self, desc, inp=None) -> Completion:
        """Execute one descriptor (``inp``: its GPU input, ignored unless it takes ``x``; see :func:`x_beats`)."""
        _check_program([(desc, inp)])
        status = desc.validate(self.config)
        if status == ErrorCode.OK and desc.chain and desc.input_dim0 * desc.input_dim1 > self._kept.size:
            status = ErrorCode.NO_CHAIN_INPUT
        seq = self.seq
        self.seq = (self.seq + 1) % (1 << SEQ_BITS)
        if status != ErrorCode.OK:
            self._kept = np.zeros(0, np.uint16)
            return Completion(seq, status, np.zeros(0, np.uint16))
        if desc.type == DescType.LOAD or desc.chain:
            if inp is not None:
                raise ValueError(f"descriptor {seq}: {'CHAIN' if desc.chain else 'LOAD'} descriptors take no GPU "
                                 f"input; pass None")
        if desc.chain:
            x = self._kept[:desc.input_dim0 * desc.input_dim1].copy()
        elif desc.has_input:
            x = _input_bits(desc, inp, f"descriptor seq {seq}")
        else:
            x = None
        _, kept, returned = self._execute(desc, x)
        self._kept = kept
        return Completion(seq, status, returned.copy())

    def run(self, program) -> list[Completion]:
        """Execute ``program`` (a list of ``(Descriptor, input uint16 array or None)``) in order."""
        _check_program(program)
        return [self.step(d, x) for d, x in program]


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
    """The ``x`` beats the GPU sends for ``program``: the input of every descriptor the decoder accepts
    (``validate == OK``) that has an input and no CHAIN, in order, ``input elements / lanes`` beats each
    (row-major; a partial last beat, which the core's constraints rule out, would be zero-padded).
    NO_CHAIN_INPUT needs no special case: it only ever hits CHAIN descriptors, which take no ``x``."""
    _check_config(config)
    _check_program(program)
    out = []
    for i, (desc, data) in enumerate(program):
        if _takes_x(desc, desc.validate(config) == ErrorCode.OK):
            out += beats(_input_bits(desc, data, f"program[{i}]"), config.lanes)
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
      :func:`host.attention.merge_partials` (float32), vs :func:`host.attention.reference_attention` (float64,
      on the unscaled FP16 q, K, V with scale 1/sqrt(d); the FP16 rounding of the pre-scaled q is included).

    Returns ``{"config", "acc", "e3": stats, "e4": stats, "attention": stats}``, stats as :func:`_errors`.
    """
    from firmware.ndp import kernels
    from host import attention as host_attn
    _check_config(config)
    rng = np.random.default_rng(seed)
    x = _fp16(rng.standard_normal((batch, d)))
    a = _fp16(rng.standard_normal((d, r)) / np.sqrt(d))
    b = _fp16(rng.standard_normal((r, d)) / np.sqrt(r))
    lay = kernels.lora_layout(d, r, config=config)
    core = GoldenCore(config, lay["end"])
    core.run(kernels.lora_store(a, b, lay, config=config).program)
    e4 = kernels.lora_e4(x, lay["a"], d, r, config=config)
    m = e4.results(core.run(e4.program))
    e3 = kernels.lora_e3(x, lay["a"], lay["b"], d, r, config=config)
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
        att = kernels.attention_integral(qs, kv["kT"], kv["v"], hd, l, config=config)
        o, mm, ss = att.results(core.run(att.program))
        partials.append((dev, o, mm, ss))
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
