"""Descriptor programs ("kernels") the host runs on an NDP core: LoRA E2/E3/E4 and integral attention.

Every kernel returns a :class:`Kernel`: ``program``, a list of ``(Descriptor, input or None)`` in execution
order (``None`` for LOAD and CHAIN descriptors, which take no GPU input), and :meth:`Kernel.results`, which
turns the core's completions (anything with ``status`` and ``result``, e.g.
:class:`sim.golden.ndp_core.Completion`) into the kernel's outputs. Every descriptor is checked with
``Descriptor.validate(config)`` when the kernel is built: a kernel never holds a descriptor the decoder would
reject. Bad arguments raise ValueError naming the argument and the rule. See ``docs/ndp_kernels.md``.

Tensors are FP16 bit patterns (``uint16``; ``float16`` arrays are accepted and viewed as bits), row-major.
Device memory layout: :func:`lora_layout` / :func:`kv_layout` place tensors at addresses aligned to
``config.align_bytes``, each region padded to a whole number of STORE granules (:func:`store_granule`), and
:func:`store_tensor` / :func:`lora_store` / :func:`kv_store` build the STORE programs that write them.

Kernels (PLoRA Section V, /work/shared/papers/plora.txt):

* :func:`lora_e2_loads`: LOAD A (d x r) and B (r x d) for the GPU (E2: the GPU computes with the adapter).
* :func:`lora_e3`: ``y = x A B`` on the device: GEMM(X, A) KEEP, then GEMM(CHAIN, B) (GEMV for one row).
* :func:`lora_e4`: ``m = x A`` on the device, returned.
* :func:`attention_integral`: one device's share of the KV cache (K^T: d x l, V: l x d): GEMV(q, K^T) KEEP,
  SOFTMAX(CHAIN, KEEP) -> anchors, GEMV(CHAIN, V) -> unnormalized partial output ``o = e V``. The hardware
  applies no 1/sqrt(d): the host passes the pre-scaled query (:func:`host.attention.prepare_query`).
"""

from dataclasses import dataclass, field
from math import gcd
from typing import Callable

import numpy as np

from hdl.ndp.config import NDPConfig
from hdl.ndp.descriptor import ErrorCode, FIELD_BITS, ANCHOR_ELEMS
from .descriptor import Descriptor, gemv, gemm, softmax, load, store

__all__ = ["Kernel", "KernelError", "store_granule", "region_bytes", "lora_layout", "kv_layout", "store_tensor",
           "lora_store", "kv_store", "lora_e2_loads", "lora_e3", "lora_e4", "attention_integral"]

_FIELD_MAX = (1 << FIELD_BITS) - 1      # largest byte size one descriptor field can describe


class KernelError(RuntimeError):
    """A completion of a kernel's program did not report OK (raised by :meth:`Kernel.results`)."""


@dataclass
class Kernel:
    """A descriptor program and how to read its results.

    ``program``: ``[(Descriptor, input uint16 array or None), ...]``; ``meta``: the kernel's shapes and
    addresses; ``results(completions)`` -> the kernel's outputs (per kernel, documented there)."""
    name: str
    program: list
    meta: dict
    _assemble: Callable = field(repr=False, default=None)

    def results(self, completions):
        """Outputs from the completions of ``program`` (one per descriptor, in order; all must be OK)."""
        completions = list(completions)
        if len(completions) != len(self.program):
            raise ValueError(f"{self.name}: expected {len(self.program)} completions, got {len(completions)}")
        for i, c in enumerate(completions):
            if c.status != ErrorCode.OK:
                raise KernelError(f"{self.name}: descriptor {i} ({self.program[i][0].op.name}) completed with "
                                  f"{ErrorCode(c.status).name}")
        if self._assemble is None:
            return None
        return self._assemble([np.asarray(c.result, np.uint16).reshape(-1) for c in completions])


# ---- argument checks -----------------------------------------------------------------------------------------

def _cfg(config):
    if not isinstance(config, NDPConfig):
        raise ValueError(f"config must be an NDPConfig, got {config!r}")
    return config


def _pos_int(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return int(v)


def _dim(name, v, config):
    v = _pos_int(name, v)
    if v % config.lanes:
        raise ValueError(f"{name} ({v}) must be a multiple of config.lanes ({config.lanes}): GEMV/GEMM operand "
                         f"dimensions and softmax lengths are whole beats")
    return v


def _addr(name, v, config):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    if v % config.align_bytes:
        raise ValueError(f"{name} ({v}) must be a multiple of config.align_bytes ({config.align_bytes})")
    return int(v)


def _bits(name, value, shape_desc, ndims=(1, 2)):
    arr = np.asarray(value)
    if arr.dtype == np.float16:
        arr = arr.view(np.uint16)
    if arr.dtype != np.uint16:
        raise ValueError(f"{name} must be FP16 bit patterns (uint16) or float16, got dtype {arr.dtype}")
    if arr.ndim not in ndims:
        raise ValueError(f"{name} must be {shape_desc}, got shape {arr.shape}")
    return arr


def _operand_fits(name, rows, cols, config):
    nbytes = 2 * rows * cols
    lim = min(config.dram_buffer_bytes, _FIELD_MAX)
    if nbytes > lim:
        raise ValueError(f"{name} ({rows} x {cols} FP16 = {nbytes} bytes) must fit one operand: at most "
                         f"min(config.dram_buffer_bytes, 2**20 - 1) = {lim} bytes")


def _checked(desc: Descriptor, config, what) -> Descriptor:
    st = desc.validate(config)
    if st != ErrorCode.OK:
        raise ValueError(f"{what}: descriptor rejected by config {config.name!r} with {st.name}")
    return desc


# ---- memory layout and STOREs --------------------------------------------------------------------------------

def store_granule(config) -> int:
    """Bytes every STORE (and every layout region) is a multiple of: lcm(align_bytes, one beat = 2 lanes)."""
    _cfg(config)
    a, b = config.align_bytes, 2 * config.lanes
    return a * b // gcd(a, b)


def region_bytes(elems: int, config) -> int:
    """Bytes of a layout region holding ``elems`` FP16 elements, padded to :func:`store_granule`."""
    g = store_granule(config)
    return -(-2 * _pos_int("elems", elems) // g) * g


def _layout(base, config, regions):
    _addr("base", base, config)
    out, addr = {}, base
    for name, elems in regions:
        out[name] = addr
        addr += region_bytes(elems, config)
    out["end"] = addr
    if addr > config.device_bytes:
        raise ValueError(f"layout needs bytes up to {addr}, beyond config.device_bytes ({config.device_bytes})")
    return out


def lora_layout(d: int, r: int, *, config: NDPConfig, base: int = 0) -> dict:
    """Addresses of a LoRA adapter: ``{"a": A (d x r), "b": B (r x d), "end": first free byte}``."""
    _cfg(config)
    d, r = _pos_int("d", d), _pos_int("r", r)
    return _layout(base, config, [("a", d * r), ("b", r * d)])


def kv_layout(d: int, l: int, *, config: NDPConfig, base: int = 0) -> dict:
    """Addresses of one device's KV share: ``{"kT": K^T (d x l), "v": V (l x d), "end": first free byte}``."""
    _cfg(config)
    d, l = _pos_int("d", d), _pos_int("l", l)
    return _layout(base, config, [("kT", d * l), ("v", l * d)])


def store_tensor(addr: int, bits, *, config: NDPConfig) -> Kernel:
    """STOREs writing ``bits`` (any shape, row-major) at ``addr``, zero-padded to a whole number of
    :func:`store_granule`; so the region ``[addr, addr + region_bytes(bits.size))`` is written. Each STORE is
    ``rows x cols`` with ``cols = granule / 2`` elements and at most min(input buffer, DRAM buffer, 2**20 - 1)
    bytes. ``results`` -> None."""
    _cfg(config)
    addr = _addr("addr", addr, config)
    arr = _bits("bits", bits, "an FP16 array", ndims=tuple(range(0, 8))).reshape(-1)
    if arr.size == 0:
        raise ValueError("bits must not be empty")
    g = store_granule(config)
    cols = g // 2
    total = region_bytes(arr.size, config) // 2
    flat = np.zeros(total, np.uint16)
    flat[:arr.size] = arr
    max_rows = min(config.input_buffer_bytes, config.dram_buffer_bytes, _FIELD_MAX) // g
    if max_rows < 1:
        raise ValueError(f"config {config.name!r}: a STORE granule ({g} bytes) does not fit the buffers")
    program = []
    for row0 in range(0, total // cols, max_rows):
        rows = min(max_rows, total // cols - row0)
        a = addr + row0 * g
        program.append((_checked(store(a, rows, cols), config, f"STORE at {a}"),
                        flat[row0 * cols:(row0 + rows) * cols].reshape(rows, cols).copy()))
    return Kernel("store", program, {"addr": addr, "elems": int(arr.size), "bytes": total * 2})


def _concat(*kernels, name, meta):
    return Kernel(name, [e for k in kernels for e in k.program], meta)


def lora_store(a_bits, b_bits, layout: dict, *, config: NDPConfig) -> Kernel:
    """STOREs of A (d x r) at ``layout["a"]`` and B (r x d) at ``layout["b"]`` (:func:`lora_layout`)."""
    a = _bits("a_bits", a_bits, "(d, r)", (2,))
    b = _bits("b_bits", b_bits, "(r, d)", (2,))
    if b.shape != a.shape[::-1]:
        raise ValueError(f"b_bits must be (r, d) = {a.shape[::-1]} for a_bits {a.shape}, got {b.shape}")
    return _concat(store_tensor(layout["a"], a, config=config), store_tensor(layout["b"], b, config=config),
                   name="lora_store", meta={"d": a.shape[0], "r": a.shape[1]})


def kv_store(k_bits, v_bits, layout: dict, *, config: NDPConfig) -> Kernel:
    """STOREs of one device's KV share: K (l x d, as the model holds it) is written transposed (d x l) at
    ``layout["kT"]``, V (l x d) at ``layout["v"]`` (:func:`kv_layout`)."""
    k = _bits("k_bits", k_bits, "(l, d)", (2,))
    v = _bits("v_bits", v_bits, "(l, d)", (2,))
    if v.shape != k.shape:
        raise ValueError(f"v_bits must have k_bits' shape {k.shape}, got {v.shape}")
    return _concat(store_tensor(layout["kT"], np.ascontiguousarray(k.T), config=config),
                   store_tensor(layout["v"], v, config=config),
                   name="kv_store", meta={"l": k.shape[0], "d": k.shape[1]})


# ---- LoRA ----------------------------------------------------------------------------------------------------

def _load_chunks(addr, rows, cols, config, name):
    """LOADs of a rows x cols tensor at addr, by row chunks: each chunk's bytes fit the output and DRAM
    buffers and the 20-bit field, and every chunk starts aligned."""
    row_bytes = 2 * cols
    lim = min(config.output_buffer_bytes, config.dram_buffer_bytes, _FIELD_MAX)
    step = config.align_bytes // gcd(row_bytes, config.align_bytes)   # rows per aligned chunk boundary
    per = rows if rows * row_bytes <= lim else (lim // row_bytes) // step * step
    if per < 1:
        raise ValueError(f"{name}: a chunk of {step} rows x {cols} columns (the aligned unit) exceeds "
                         f"min(output buffer, DRAM buffer, 2**20 - 1) = {lim} bytes")
    out = []
    for r0 in range(0, rows, per):
        n = min(per, rows - r0)
        a = addr + r0 * row_bytes
        out.append((_checked(load(a, n, cols), config, f"{name} LOAD rows {r0}..{r0 + n - 1}"), None))
    return out


def lora_e2_loads(a_addr: int, b_addr: int, d: int, r: int, *, config: NDPConfig) -> Kernel:
    """LOAD A (d x r) at ``a_addr`` and B (r x d) at ``b_addr``, each split by rows into LOADs that fit the
    buffers and the 20-bit byte field. ``results`` -> ``(A uint16 (d, r), B uint16 (r, d))``."""
    _cfg(config)
    d, r = _pos_int("d", d), _pos_int("r", r)
    a_addr, b_addr = _addr("a_addr", a_addr, config), _addr("b_addr", b_addr, config)
    pa = _load_chunks(a_addr, d, r, config, "A")
    pb = _load_chunks(b_addr, r, d, config, "B")
    na = len(pa)

    def assemble(res):
        return (np.concatenate(res[:na]).reshape(d, r), np.concatenate(res[na:]).reshape(r, d))
    return Kernel("lora_e2_loads", pa + pb, {"d": d, "r": r, "a_loads": na, "b_loads": len(pb)}, assemble)


def _rows_input(name, x, d):
    arr = _bits(name, x, f"(d,) or (batch, d) with d = {d}")
    if arr.shape[-1] != d or (arr.ndim == 2 and arr.shape[0] < 1):
        raise ValueError(f"{name} must be (d,) or (batch, d) with d = {d}, got shape {arr.shape}")
    return arr.ndim == 1, np.atleast_2d(arr)


def _mm(addr, b, k, n, config, *, keep=False, chain=False):
    if b == 1:
        return gemv(addr, k, n, keep=keep, chain=chain)
    return gemm(addr, b, k, n, keep=keep, chain=chain)


def _max_batch(config, steps, total):
    """Largest batch <= total (and <= max_batch) for which every descriptor of ``steps(b)`` validates OK."""
    for b in range(min(total, config.max_batch), 0, -1):
        try:
            descs = steps(b)
        except ValueError:              # a byte size past the 20-bit field: too large by construction
            continue
        if all(d.validate(config) == ErrorCode.OK for d in descs):
            return b
    return 0


def lora_e3(x, a_addr: int, b_addr: int, d: int, r: int, *, config: NDPConfig) -> Kernel:
    """LoRA E3 on the device: ``y = (x A) B``; x (d,) or (batch, d), A d x r at ``a_addr``, B r x d at
    ``b_addr``. Per batch chunk (the largest the buffers and ``max_batch`` allow): GEMM(X, A) KEEP then
    GEMM(CHAIN, B) (GEMVs for a one-row chunk); ``m = x A`` stays on the device in FP16.
    ``results`` -> y uint16, (d,) for a 1-D x else (batch, d)."""
    _cfg(config)
    d, r = _dim("d", d, config), _dim("r", r, config)
    a_addr, b_addr = _addr("a_addr", a_addr, config), _addr("b_addr", b_addr, config)
    _operand_fits("A", d, r, config)
    _operand_fits("B", r, d, config)
    one, xs = _rows_input("x", x, d)
    total = xs.shape[0]
    steps = lambda b: [_mm(a_addr, b, d, r, config, keep=True), _mm(b_addr, b, r, d, config, chain=True)]  # noqa
    per = _max_batch(config, steps, total)
    if per < 1:
        try:
            st = [s.validate(config).name for s in steps(1)]
        except ValueError as exc:
            st = [str(exc)]
        raise ValueError(f"lora_e3: even one row does not fit config {config.name!r} (d={d}, r={r}, a_addr, "
                         f"b_addr): statuses {st}")
    program = []
    for r0 in range(0, total, per):
        n = min(per, total - r0)
        s1, s2 = steps(n)
        program += [(_checked(s1, config, "lora_e3 x A"), xs[r0:r0 + n].copy()),
                    (_checked(s2, config, "lora_e3 m B"), None)]

    def assemble(res):
        y = np.concatenate(res[1::2]).reshape(total, d)
        return y[0] if one else y
    return Kernel("lora_e3", program, {"d": d, "r": r, "batch": total, "chunk": per}, assemble)


def lora_e4(x, a_addr: int, d: int, r: int, *, config: NDPConfig) -> Kernel:
    """LoRA E4 on the device: ``m = x A`` returned to the GPU; x (d,) or (batch, d), A d x r at ``a_addr``.
    GEMM per batch chunk (GEMV for one row). ``results`` -> m uint16, (r,) or (batch, r)."""
    _cfg(config)
    d, r = _dim("d", d, config), _dim("r", r, config)
    a_addr = _addr("a_addr", a_addr, config)
    _operand_fits("A", d, r, config)
    one, xs = _rows_input("x", x, d)
    total = xs.shape[0]
    steps = lambda b: [_mm(a_addr, b, d, r, config)]  # noqa: E731
    per = _max_batch(config, steps, total)
    if per < 1:
        try:
            st = steps(1)[0].validate(config).name
        except ValueError as exc:
            st = str(exc)
        raise ValueError(f"lora_e4: even one row does not fit config {config.name!r} (d={d}, r={r}, a_addr): "
                         f"{st}")
    program = [(_checked(steps(min(per, total - r0))[0], config, "lora_e4 x A"), xs[r0:r0 + per].copy())
               for r0 in range(0, total, per)]

    def assemble(res):
        m = np.concatenate(res).reshape(total, r)
        return m[0] if one else m
    return Kernel("lora_e4", program, {"d": d, "r": r, "batch": total, "chunk": per}, assemble)


# ---- attention -----------------------------------------------------------------------------------------------

def attention_integral(q, kT_addr: int, v_addr: int, d: int, l: int, *, config: NDPConfig) -> Kernel:
    """One device's share of integral attention (PLoRA V-B) over ``l`` cached positions.

    ``q``: the *pre-scaled* query (``q / sqrt(d)`` rounded to FP16, :func:`host.attention.prepare_query`),
    (d,) or (R, d) for R query rows sharing the KV share (R <= ``max_batch``); K^T (d x l) at ``kT_addr``,
    V (l x d) at ``v_addr`` (:func:`kv_layout`, :func:`kv_store`). Program (GEMV for R = 1, else GEMM):

    1. ``p = q K^T`` (R x l), KEEP;
    2. SOFTMAX(R x l, CHAIN, KEEP): keeps ``e = exp(p - m)``, returns the anchors ``m`` and ``sum``;
    3. ``o = e V`` (R x d), CHAIN: the unnormalized partial output, returned.

    ``results`` -> ``(o uint16, m uint16, sum uint32)``: shapes (d,), (), () for a 1-D q, else (R, d), (R,),
    (R,). Merge the devices' partials with :func:`host.attention.merge_partials`."""
    _cfg(config)
    d, l = _dim("d", d, config), _dim("l", l, config)
    kT_addr, v_addr = _addr("kT_addr", kT_addr, config), _addr("v_addr", v_addr, config)
    _operand_fits("K^T", d, l, config)
    _operand_fits("V", l, d, config)
    one, qs = _rows_input("q", q, d)
    rows = qs.shape[0]
    if rows > config.max_batch:
        raise ValueError(f"q has {rows} rows; at most config.max_batch ({config.max_batch}) query rows")
    descs = [_mm(kT_addr, rows, d, l, config, keep=True),
             softmax(rows, l, keep=True, chain=True),
             _mm(v_addr, rows, l, d, config, chain=True)]
    for name, desc in zip(("scores q K^T", "softmax", "context e V"), descs):
        _checked(desc, config, f"attention_integral {name} (d={d}, l={l}, rows={rows})")
    program = [(descs[0], qs.copy()), (descs[1], None), (descs[2], None)]

    def assemble(res):
        anc = res[1].reshape(rows, ANCHOR_ELEMS)
        m = anc[:, 0].copy()
        s = anc[:, 1].astype(np.uint32) | (anc[:, 2].astype(np.uint32) << 16)
        o = res[2].reshape(rows, d)
        return (o[0], m[0], s[0]) if one else (o, m, s)
    return Kernel("attention_integral", program, {"d": d, "l": l, "rows": rows}, assemble)
