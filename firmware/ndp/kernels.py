"""Descriptor programs ("kernels") the host runs on an NDP core: LoRA E2/E3/E4 and integral attention.

Every kernel returns a :class:`Kernel`: ``program``, a list of ``(Descriptor, input or None)`` in execution
order (``None`` for LOAD and CHAIN descriptors, which take no GPU input), and :meth:`Kernel.results`, which
turns the core's completions (anything with ``status`` and ``result``, e.g.
:class:`sim.golden.ndp_core.Completion`) into the kernel's outputs. Every descriptor is checked with
``Descriptor.validate(config)`` when the kernel is built: a kernel never holds a descriptor the decoder would
reject. Bad arguments raise ValueError naming the argument and the rule. See ``docs/ndp_kernels.md``.

Tensors are FP16 bit patterns (``uint16``; ``float16`` arrays are accepted and viewed as bits), row-major.

**Tiling** (shapes beyond one descriptor: the 20-bit byte fields, the buffers). A *tile* is one operand of
at most :func:`tile_bytes` (half the DRAM ring, so one tile computes while the next streams in; at most
2**20 - 1 bytes). The layouts (:func:`lora_layout`, :func:`kv_layout`) decide the tiles and place each in its
own aligned region; the STORE programs (:func:`lora_store`, :func:`kv_store`) write them:

* LoRA A (d x r), the contraction over d: **K-tiles** of whole blocks of ``lanes`` rows in the TRANS layout
  (:func:`sim.golden.ndp_core.trans_layout`; the GEMV-PE dataflow keeps every lane busy for any rank), balanced
  (block counts within one of each other), after a half-block tail descriptor when ``d mod lanes = lanes / 2``
  (:func:`k_tiles`). The tiles of one batch chunk accumulate on the device: the first with PARTIAL, the middle
  ones ACC + PARTIAL, the last ACC (E4: returned; E3: KEEP).
* LoRA B (r x d), the output over d: **column panels** (row-major r x P, P a multiple of ``lanes``), plus a
  ``lanes / 2``-wide tail panel; each panel is a CHAIN descriptor on the same kept ``m = xA``.
* Attention: the KV share is cut into **token tiles** of ``L_t`` tokens (a multiple of ``lanes``); each tile is
  scores GEMM/GEMV on K^T (d x L_t, KEEP), SOFTMAX (CHAIN, KEEP: anchors returned), context GEMM/GEMV TRANS on
  V (L_t x d, CHAIN): one partial output per tile, merged by the host (:func:`sim.golden.attention.merge_partials`)
  exactly like the partials of several devices. A decode batch's shares on one device run as one descriptor
  stream (:func:`attention_batch`), so one share's fixed costs overlap the next share's reads.

Batches beyond the buffers are cut into **batch chunks** (the largest for which every descriptor validates).
"""

from dataclasses import dataclass, field
from math import gcd
from typing import Callable

import numpy as np

from hdl.ndp.config import NDPConfig
from hdl.ndp.descriptor import ErrorCode, FIELD_BITS, ANCHOR_ELEMS
from .descriptor import Descriptor, gemv, gemm, softmax, load, store

__all__ = ["Kernel", "KernelError", "store_granule", "region_bytes", "tile_bytes", "k_tiles", "n_panels",
           "token_tile", "half_beat_shares", "share_tokens", "load_chunk_bytes", "lora_layout", "kv_layout",
           "store_tensor", "lora_store", "kv_store", "lora_e2_loads", "lora_e3", "lora_e4", "attention_integral",
           "attention_batch", "trans_layout", "trans_unlayout", "grouped_attention", "kv_group_layout",
           "kv_group_store", "attention_grouped"]

_FIELD_MAX = (1 << FIELD_BITS) - 1      # largest byte size one descriptor field can describe


class KernelError(RuntimeError):
    """A completion of a kernel's program did not report OK (raised by :meth:`Kernel.results`)."""


@dataclass
class Kernel:
    """A descriptor program and how to read its results.

    ``program``: ``[(Descriptor, input uint16 array or None), ...]``; ``meta``: the kernel's shapes and
    addresses; ``results(completions)`` -> the kernel's outputs (per kernel, documented there); ``owners``:
    per descriptor, the offset of the owner (requester queue, whose state slot it keeps and chains on) it must be
    issued as, from the caller's base owner (None: all 0; :meth:`entries`)."""
    name: str
    program: list
    meta: dict
    _assemble: Callable = field(repr=False, default=None)
    owners: list | None = None

    def entries(self, owner: int = 0) -> list:
        """``[(Descriptor, input, owner + offset), ...]``: the program with each descriptor's owner."""
        offs = self.owners if self.owners is not None else [0] * len(self.program)
        return [(d, x, owner + o) for (d, x), o in zip(self.program, offs)]

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


def _checked(desc: Descriptor, config, what) -> Descriptor:
    st = desc.validate(config)
    if st != ErrorCode.OK:
        raise ValueError(f"{what}: descriptor rejected by config {config.name!r} with {st.name}")
    return desc


def trans_layout(a_bits, config: NDPConfig) -> np.ndarray:
    """A (K x N) in the TRANS storage order of ``config`` (:func:`sim.golden.ndp_core.trans_layout` with
    ``lanes`` and ``acc_columns``)."""
    from sim.golden.ndp_core import trans_layout as tl
    return tl(a_bits, _cfg(config).lanes, config.acc_columns)


def trans_unlayout(flat, k, n, config: NDPConfig) -> np.ndarray:
    """Inverse of :func:`trans_layout`."""
    from sim.golden.ndp_core import trans_unlayout as tu
    return tu(flat, k, n, _cfg(config).lanes, config.acc_columns)


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


def tile_bytes(config) -> int:
    """Largest operand of one tile: half the DRAM ring (design choice: one tile computes while the next one
    streams in), at most 2**20 - 1 bytes (the 20-bit byte field)."""
    return min(_cfg(config).dram_buffer_bytes // 2, _FIELD_MAX)


def k_tiles(d: int, r: int, config) -> list:
    """K ranges ``[(k0, k1), ...]`` of LoRA A (d x r) for the TRANS dataflow, in execution order: a ``lanes / 2``
    tail first when ``d mod lanes = lanes/2``, then the whole blocks of ``lanes`` rows in **balanced** tiles of at
    most :func:`tile_bytes` and ``max_k`` each (as few tiles as the limit allows, their block counts differing by
    at most one, the larger first).

    Why (issue 29 item 2): a TRANS pass drains ``rows x r`` scalars through the adder tree (one per cycle) while
    the next pass computes, so a pass shorter than that drain stalls the array. Cutting d greedily left short
    last tiles (D = 5120 at r = 128: 2048 + 2048 + 1024 rows; D = 11008: five of 2048, then 512 and a 256-row
    tail), whose passes waited for the drains of the passes before them, and at the end of the kernel their
    own drains were exposed one after the other. Balanced tiles keep every pass long, and the short half-block
    tail runs first, where its drains hide under the long tiles' passes (docs/ndp_perf.md)."""
    _cfg(config)
    d, r, L = _pos_int("d", d), _pos_int("r", r), config.lanes
    tail = d % L
    if tail not in (0, L // 2) or (tail and (r % 2 or L < 2)):
        raise ValueError(f"d ({d}) must be a multiple of lanes ({L}) or of lanes / 2 with an even rank r "
                         f"({r}): the TRANS dataflow reads whole or half blocks of lanes rows")
    per = min(tile_bytes(config) // (2 * r), config.max_k) // L
    if d >= L and per < 1:
        raise ValueError(f"one block of {L} rows x r = {r} ({2 * L * r} bytes) exceeds the tile limit "
                         f"({tile_bytes(config)} bytes) of config {config.name!r}")
    blocks = (d - tail) // L
    out = [(d - tail, d)] if tail else []
    if blocks:
        n = -(-blocks // per)                       # fewest tiles within the limit
        k0 = 0
        for i in range(n):
            k1 = k0 + (blocks // n + (i < blocks % n)) * L
            out.append((k0, k1))
            k0 = k1
    return out


def n_panels(r: int, d: int, config) -> list:
    """Column ranges ``[(n0, n1), ...]`` of LoRA B (r x d) for the row dataflow: multiples of ``lanes`` wide,
    at most :func:`tile_bytes` and ``acc_columns`` beats wide, then a ``lanes / 2``-wide tail panel when
    ``d mod lanes = lanes / 2``."""
    _cfg(config)
    r, d, L = _pos_int("r", r), _pos_int("d", d), config.lanes
    tail = d % L
    if tail not in (0, L // 2) or (tail and r % 2):
        raise ValueError(f"d ({d}) must be a multiple of lanes ({L}) or of lanes / 2 with an even rank r "
                         f"({r}): the row dataflow needs whole beats or a half beat of columns")
    per = min(tile_bytes(config) // (2 * r) // L, config.acc_columns) * L
    if d >= L and per < L:
        raise ValueError(f"one panel of {L} columns x r = {r} rows exceeds the tile limit of config "
                         f"{config.name!r}")
    full = d - tail
    out = [(n0, min(full, n0 + per)) for n0 in range(0, full, per)] if full else []
    if tail:
        out.append((full, d))
    return out


def half_beat_shares(config) -> bool:
    """Whether a KV share of ``lanes / 2`` tokens runs as one tile of half a beat (instead of being padded to a
    whole beat of ``lanes`` tokens): the SOFTMAX of half-beat rows needs an SFU at most half a beat wide
    (``2 sfu_lanes <= lanes``; PAPER: 128 of 512 lanes; issue 29)."""
    return 2 * _cfg(config).sfu_lanes <= config.lanes


def share_tokens(l, config):
    """Tokens a KV share of ``l`` tokens occupies on the device (vectorized): ``l`` padded up to whole beats of
    ``lanes`` tokens, or to half a beat when ``l <= lanes / 2`` and :func:`half_beat_shares` (the host masks the
    padded keys). 0 stays 0. The one rule the performance model and the hosts pad with."""
    _cfg(config)
    L = config.lanes
    t = np.asarray(l, dtype=np.float64)
    out = np.ceil(t / L) * L
    if half_beat_shares(config):
        out = np.where((t > 0) & (t <= L // 2), L // 2, out)
    return out if np.ndim(l) else float(out)


def token_tile(d: int, l: int, rows: int, config) -> int:
    """Tokens per attention tile: the largest multiple of ``lanes`` (at most ``l``) whose K^T tile (d x L_t)
    fits :func:`tile_bytes`, whose scores row fits ``max_k`` and the PE accumulators (L_t / lanes <=
    ``acc_columns``), and whose ``rows x L_t`` kept scores fit a state slot."""
    _cfg(config)
    L = config.lanes
    if l == L // 2 and half_beat_shares(config):
        return l                    # one tile of half a beat (scores ROW_HALF, SOFTMAX of half rows, TRANS_HALF)
    per = min(tile_bytes(config) // (2 * d), config.max_k, config.acc_columns * L,
              config.kept_slot_bytes // (2 * rows), l)
    per = per // L * L
    if per < L:
        raise ValueError(f"no token tile of {L} tokens fits config {config.name!r} (d={d}, rows={rows})")
    return per


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
    """Regions of a LoRA adapter: ``{"d", "r", "a": [(addr, k0, k1), ...] (A's K-tiles, TRANS layout),
    "b": [(addr, n0, n1), ...] (B's column panels, row-major), "end": first free byte}``."""
    _cfg(config)
    d, r = _pos_int("d", d), _pos_int("r", r)
    kt, npn = k_tiles(d, r, config), n_panels(r, d, config)
    regions = [(f"a{i}", (k1 - k0) * r) for i, (k0, k1) in enumerate(kt)] + \
              [(f"b{i}", r * (n1 - n0)) for i, (n0, n1) in enumerate(npn)]
    lay = _layout(base, config, regions)
    return {"d": d, "r": r, "a": [(lay[f"a{i}"], k0, k1) for i, (k0, k1) in enumerate(kt)],
            "b": [(lay[f"b{i}"], n0, n1) for i, (n0, n1) in enumerate(npn)], "end": lay["end"]}


def kv_layout(d: int, l: int, *, config: NDPConfig, rows: int = 1, base: int = 0) -> dict:
    """Regions of one device's KV share of one KV head (``l`` tokens, head dim ``d``) for query groups of
    ``rows`` query heads: ``{"d", "l", "rows", "tile": L_t, "tiles": [(kT_addr, v_addr, t0, t1), ...],
    "end"}``; tile i holds K^T (d x (t1 - t0), row-major) and V ((t1 - t0) x d, TRANS layout)."""
    _cfg(config)
    d, l, rows = _pos_int("d", d), _pos_int("l", l), _pos_int("rows", rows)
    if l % config.lanes and not (2 * l == config.lanes and half_beat_shares(config)):
        raise ValueError(f"l ({l}) must be a multiple of config.lanes ({config.lanes}), or lanes / 2 with an SFU "
                         f"at most half a beat wide: the softmax and the scores work on whole or half beats of "
                         f"tokens")
    if rows > config.max_batch:
        raise ValueError(f"rows ({rows}) must be <= config.max_batch ({config.max_batch})")
    lt = token_tile(d, l, rows, config)
    spans = [(t0, min(l, t0 + lt)) for t0 in range(0, l, lt)]
    regions = []
    for i, (t0, t1) in enumerate(spans):
        regions += [(f"k{i}", d * (t1 - t0)), (f"v{i}", d * (t1 - t0))]
    lay = _layout(base, config, regions)
    return {"d": d, "l": l, "rows": rows, "tile": lt,
            "tiles": [(lay[f"k{i}"], lay[f"v{i}"], t0, t1) for i, (t0, t1) in enumerate(spans)],
            "end": lay["end"]}


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


def _concat(kernels, name, meta):
    return Kernel(name, [e for k in kernels for e in k.program], meta)


def lora_store(a_bits, b_bits, layout: dict, *, config: NDPConfig) -> Kernel:
    """STOREs of A (d x r, its K-tiles in the TRANS layout) and B (r x d, its column panels row-major) into the
    regions of ``layout`` (:func:`lora_layout`)."""
    a = _bits("a_bits", a_bits, "(d, r)", (2,))
    b = _bits("b_bits", b_bits, "(r, d)", (2,))
    if a.shape != (layout["d"], layout["r"]) or b.shape != (layout["r"], layout["d"]):
        raise ValueError(f"a_bits must be (d, r) = ({layout['d']}, {layout['r']}) and b_bits (r, d), got "
                         f"{a.shape} and {b.shape}")
    ks = [store_tensor(addr, trans_layout(a[k0:k1], config), config=config) for addr, k0, k1 in layout["a"]]
    ks += [store_tensor(addr, np.ascontiguousarray(b[:, n0:n1]), config=config) for addr, n0, n1 in layout["b"]]
    return _concat(ks, "lora_store", {"d": a.shape[0], "r": a.shape[1]})


def kv_store(k_bits, v_bits, layout: dict, *, config: NDPConfig) -> Kernel:
    """STOREs of one KV head's share: K (l x d, as the model holds it) as K^T tiles, V (l x d) as TRANS tiles,
    into the regions of ``layout`` (:func:`kv_layout`)."""
    k = _bits("k_bits", k_bits, "(l, d)", (2,))
    v = _bits("v_bits", v_bits, "(l, d)", (2,))
    if k.shape != (layout["l"], layout["d"]) or v.shape != k.shape:
        raise ValueError(f"k_bits and v_bits must be (l, d) = ({layout['l']}, {layout['d']}), got {k.shape} "
                         f"and {v.shape}")
    ks = []
    for kt_addr, v_addr, t0, t1 in layout["tiles"]:
        ks.append(store_tensor(kt_addr, np.ascontiguousarray(k[t0:t1].T), config=config))
        ks.append(store_tensor(v_addr, trans_layout(v[t0:t1], config), config=config))
    return _concat(ks, "kv_store", {"l": k.shape[0], "d": k.shape[1]})


def grouped_attention(head_dim: int, config, narrow: bool = False) -> bool:
    """Whether KV heads of ``head_dim`` run in the grouped dataflow (descriptor flag GROUP): the core has one
    (``config.group_lanes`` = W > 0) and the head dim is n W with n at most the PE array's x words
    (``ceil(max_k / lanes)``): a beat holds the W tokens of ``lanes / W`` heads (a tile is W tokens of g heads,
    the scores' K = n W over n x words, the context n GEMMs of one W-slice of the head dim each). ``narrow``: the
    same at W / 2 (flag NARROW; needs ``config.group_narrow``)."""
    cfg = _cfg(config)
    if narrow and not cfg.group_narrow:
        return False
    W = cfg.group_width(narrow)
    return W > 0 and head_dim % W == 0 and 0 < head_dim // W <= -(-config.max_k // config.lanes)


def kv_group_layout(d: int, l: int, *, config: NDPConfig, rows: int = 1, base: int = 0,
                    narrow: bool = False) -> dict:
    """Regions of one device's KV share of g = ``config.group_segments`` KV heads of head dim ``d`` = n W
    (W = ``config.group_lanes``; :func:`grouped_attention`; ``l`` tokens, a multiple of W), for query groups of
    ``rows`` query heads per KV head: ``{"group": g, "d", "l", "rows", "tile": W, "slices": n, "tiles": [(k_addr,
    v_addr, t0, t1), ...], "v_slices": [[v_addr of slice j, ...] per tile], "end"}``. Tile i holds the tokens
    ``[t0, t1)`` (W of them) of the g heads: K as ``d x lanes`` (row ``dd``: head s's keys of the tile's tokens at
    dim dd in lanes ``s W ..``), V as n slices of ``W x lanes``, each its own aligned region (``v_addr`` the first;
    slice j, row ``t``: dims ``[j W, (j + 1) W)`` of head s's value vector of token t in lanes ``s W ..``): the
    operands of the GROUP scores and contexts (:func:`attention_grouped`).

    ``narrow`` (a core with ``config.group_narrow``): tiles of W / 2 tokens of 2 g heads (the NARROW descriptors):
    a short share is not padded to W tokens (docs/ndp_core.md, "Narrow tiles"); the layout records
    ``"narrow": True``."""
    _cfg(config)
    d, l, rows = _pos_int("d", d), _pos_int("l", l), _pos_int("rows", rows)
    if not isinstance(narrow, bool):
        raise ValueError(f"narrow must be a bool, got {narrow!r}")
    if narrow and not config.group_narrow:
        raise ValueError(f"narrow tiles need config.group_narrow (config {config.name!r} has none)")
    if not grouped_attention(d, config, narrow):
        raise ValueError(f"d ({d}) must be n x the group width {config.group_width(narrow)} "
                         f"(config.group_lanes {config.group_lanes}{' / 2' if narrow else ''}, > 0), n <= "
                         f"ceil(max_k / lanes) = {-(-config.max_k // config.lanes)}, for the grouped attention of "
                         f"config {config.name!r}")
    W = config.group_width(narrow)
    g = config.lanes // W
    if l % W:
        raise ValueError(f"l ({l}) must be a multiple of the group width {W} (a tile is W tokens of every head)")
    if rows * g > config.max_batch or rows * W * g * 2 > config.kept_slot_bytes:
        raise ValueError(f"rows ({rows}) x {g} heads must be <= config.max_batch ({config.max_batch}) and their "
                         f"scores fit a state slot ({config.kept_slot_bytes} bytes)")
    spans = [(t0, t0 + W) for t0 in range(0, l, W)]
    regions, n = [], d // W
    for i in range(len(spans)):
        regions += [(f"k{i}", d * config.lanes)] + [(f"v{i}_{j}", W * config.lanes) for j in range(n)]
    lay = _layout(base, config, regions)
    return {"group": g, "d": d, "l": l, "rows": rows, "tile": W, "slices": n, "narrow": narrow,
            "tiles": [(lay[f"k{i}"], lay[f"v{i}_0"], t0, t1) for i, (t0, t1) in enumerate(spans)],
            "v_slices": [[lay[f"v{i}_{j}"] for j in range(n)] for i in range(len(spans))],
            "end": lay["end"]}


def kv_group_store(k_bits, v_bits, layout: dict, *, config: NDPConfig) -> Kernel:
    """STOREs of the share of :func:`kv_group_layout`: ``k_bits``, ``v_bits`` (g, l, d), the g heads' keys and
    values as the model holds them, arranged into the grouped tiles."""
    g, l, d = layout["group"], layout["l"], layout["d"]
    k = _bits("k_bits", k_bits, "(g, l, d)", (3,))
    v = _bits("v_bits", v_bits, "(g, l, d)", (3,))
    if k.shape != (g, l, d) or v.shape != k.shape:
        raise ValueError(f"k_bits and v_bits must be (g, l, d) = ({g}, {l}, {d}), got {k.shape} and {v.shape}")
    ks = []
    for (k_addr, _, t0, t1), v_addrs in zip(layout["tiles"], layout["v_slices"]):
        kt = k[:, t0:t1, :].transpose(2, 0, 1).reshape(d, g * (t1 - t0))     # row d: [head][token]
        ks.append(store_tensor(k_addr, kt, config=config))
        W = t1 - t0
        for j, v_addr in enumerate(v_addrs):                                 # slice j, row t: [head][dims of j]
            vt = v[:, t0:t1, j * W:(j + 1) * W].transpose(1, 0, 2).reshape(W, g * W)
            ks.append(store_tensor(v_addr, vt, config=config))
    return _concat(ks, "kv_group_store", {"l": l, "d": d, "group": g})


# ---- LoRA ----------------------------------------------------------------------------------------------------

def load_chunk_bytes(config) -> int:
    """Bytes of one LOAD of :func:`lora_e2_loads`: as much as the return ring, the DRAM ring and the 20-bit field
    take, a whole number of :func:`store_granule`.

    A LOAD needs room in the return ring for all of its beats, so LOADs as large as the ring return one after the
    other (reads and returns take turns: ~46 % of the device's bandwidth at the paper geometry). Smaller chunks
    overlap them at the core (quarter-ring chunks: 88 % at 4 MiB) but were not kept (issue 29 item 3,
    docs/ndp_perf.md "E2 LOADs"): the GPU reads a LOAD through the CXL link, 8.5x slower than the device, so the
    device side never shows (>= 99 % of the link from 1 MiB up either way), while every extra descriptor costs
    the CXL front end its queue round trip (the end-to-end demo's prefill steps with E2: +18.5 % device cycles
    with quarter-ring chunks)."""
    g = store_granule(_cfg(config))
    return min(config.output_buffer_bytes, config.dram_buffer_bytes, _FIELD_MAX) // g * g


def _load_chunks(addr, nbytes, config, name):
    """LOADs of ``nbytes`` bytes (an even count) at ``addr``, in aligned chunks of :func:`load_chunk_bytes`;
    ``[(desc, None)]``."""
    per = load_chunk_bytes(config)
    if per < 1:
        raise ValueError(f"{name}: a LOAD granule of {store_granule(config)} bytes exceeds the buffers")
    out = []
    for off in range(0, nbytes, per):
        n = min(per, nbytes - off)
        out.append((_checked(load(addr + off, 1, n // 2), config, f"{name} LOAD at {addr + off}"), None))
    return out


def lora_e2_loads(layout: dict, *, config: NDPConfig) -> Kernel:
    """LOAD A and B (every tile and panel of ``layout``) for the GPU (E2), in chunks that fit the buffers.
    ``results`` -> ``(A uint16 (d, r), B uint16 (r, d))``."""
    _cfg(config)
    d, r = layout["d"], layout["r"]
    program, parts = [], []
    for addr, k0, k1 in layout["a"]:
        loads = _load_chunks(addr, 2 * (k1 - k0) * r, config, "A")
        parts.append(("a", k0, k1, len(loads)))
        program += loads
    for addr, n0, n1 in layout["b"]:
        loads = _load_chunks(addr, 2 * r * (n1 - n0), config, "B")
        parts.append(("b", n0, n1, len(loads)))
        program += loads

    def assemble(res):
        a, b = np.zeros((d, r), np.uint16), np.zeros((r, d), np.uint16)
        i = 0
        for kind, lo, hi, n in parts:
            flat = np.concatenate(res[i:i + n])
            i += n
            if kind == "a":
                a[lo:hi] = trans_unlayout(flat, hi - lo, r, config)
            else:
                b[:, lo:hi] = flat.reshape(r, hi - lo)
        return a, b
    return Kernel("lora_e2_loads", program, {"d": d, "r": r, "loads": len(program)}, assemble)


def _rows_input(name, x, d):
    arr = _bits(name, x, f"(d,) or (batch, d) with d = {d}")
    if arr.shape[-1] != d or (arr.ndim == 2 and arr.shape[0] < 1):
        raise ValueError(f"{name} must be (d,) or (batch, d) with d = {d}, got shape {arr.shape}")
    return arr.ndim == 1, np.atleast_2d(arr)


def _mm(addr, b, k, n, **flags):
    if b == 1:
        return gemv(addr, k, n, **flags)
    return gemm(addr, b, k, n, **flags)


def _batch_ok(config, steps, b):
    try:
        descs = steps(b)
    except ValueError:                  # a byte size past the 20-bit field: too large by construction
        return False
    return all(d.validate(config) == ErrorCode.OK for d in descs)


def _max_batch(config, steps, total):
    """Largest batch <= total (and <= max_batch) for which every descriptor of ``steps(b)`` validates OK.

    Batches >= 2 are GEMMs whose buffer needs grow with the batch, so their validity is monotone and found by
    bisection; batch 1 (GEMV) is checked on its own. Equal to the linear search from the top
    (tests/firmware/test_ndp_kernels.py)."""
    hi = min(total, config.max_batch)
    if hi >= 2 and _batch_ok(config, steps, 2):
        lo = 2                          # ok(lo) holds; find the largest ok batch in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _batch_ok(config, steps, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo
    return 1 if hi >= 1 and _batch_ok(config, steps, 1) else 0


def _a_tiles(layout, b, *, last_keep):
    """The K-tile descriptors of ``x A`` for a batch chunk of ``b`` rows: PARTIAL, ACC + PARTIAL, ..., ACC
    (+ KEEP if ``last_keep``); a single tile has neither ACC nor PARTIAL."""
    r, tiles = layout["r"], layout["a"]
    out = []
    for i, (addr, k0, k1) in enumerate(tiles):
        last = i == len(tiles) - 1
        out.append(_mm(addr, b, k1 - k0, r, trans=True, acc=i > 0, partial=not last, keep=last and last_keep))
    return out


def _chunk(config, steps, total, what):
    per = _max_batch(config, steps, total)
    if per < 1:
        try:
            st = [s.validate(config).name for s in steps(1)]
        except ValueError as exc:
            st = [str(exc)]
        raise ValueError(f"{what}: even one row does not fit config {config.name!r}: statuses {st}")
    return per


def lora_e4(x, layout: dict, *, config: NDPConfig) -> Kernel:
    """LoRA E4 on the device: ``m = x A`` returned to the GPU; x (d,) or (batch, d); A in the regions of
    ``layout`` (:func:`lora_layout`). Per batch chunk: the K-tiles of A accumulating on the device (TRANS
    GEMV/GEMM). ``results`` -> m uint16, (r,) or (batch, r)."""
    _cfg(config)
    d, r = layout["d"], layout["r"]
    one, xs = _rows_input("x", x, d)
    total = xs.shape[0]
    steps = lambda b: _a_tiles(layout, b, last_keep=False)  # noqa: E731
    per = _chunk(config, steps, total, "lora_e4")
    program = []
    for r0 in range(0, total, per):
        n = min(per, total - r0)
        for desc, (_, k0, k1) in zip(steps(n), layout["a"]):
            program.append((_checked(desc, config, "lora_e4 x A"), xs[r0:r0 + n, k0:k1].copy()))
    nt = len(layout["a"])

    def assemble(res):
        m = np.concatenate(res[nt - 1::nt]).reshape(total, r)
        return m[0] if one else m
    return Kernel("lora_e4", program, {"d": d, "r": r, "batch": total, "chunk": per, "tiles": nt}, assemble)


def lora_e3(x, layout: dict, *, config: NDPConfig) -> Kernel:
    """LoRA E3 on the device: ``y = (x A) B``; x (d,) or (batch, d). Per batch chunk: the K-tiles of A (the
    last one KEEPs ``m = xA`` on the device in FP16), then one CHAIN descriptor per column panel of B (row
    dataflow), each returning its columns of y. ``results`` -> y uint16, (d,) or (batch, d)."""
    _cfg(config)
    d, r = layout["d"], layout["r"]
    one, xs = _rows_input("x", x, d)
    total = xs.shape[0]

    def steps(b):
        return _a_tiles(layout, b, last_keep=True) + [_mm(addr, b, r, n1 - n0, chain=True)
                                                       for addr, n0, n1 in layout["b"]]
    per = _chunk(config, steps, total, "lora_e3")
    nt, npn = len(layout["a"]), len(layout["b"])
    program = []
    for r0 in range(0, total, per):
        n = min(per, total - r0)
        descs = steps(n)
        for desc, (_, k0, k1) in zip(descs[:nt], layout["a"]):
            program.append((_checked(desc, config, "lora_e3 x A"), xs[r0:r0 + n, k0:k1].copy()))
        program += [(_checked(desc, config, "lora_e3 m B"), None) for desc in descs[nt:]]

    def assemble(res):
        y = np.zeros((total, d), np.uint16)
        i, r0 = 0, 0
        while r0 < total:
            n = min(per, total - r0)
            i += nt
            for _, n0, n1 in layout["b"]:
                y[r0:r0 + n, n0:n1] = res[i].reshape(n, n1 - n0)
                i += 1
            r0 += n
        return y[0] if one else y
    return Kernel("lora_e3", program, {"d": d, "r": r, "batch": total, "chunk": per, "tiles": nt,
                                       "panels": npn}, assemble)


# ---- attention -----------------------------------------------------------------------------------------------

def attention_integral(q, layout: dict, *, config: NDPConfig) -> Kernel:
    """One device's share of integral attention (PLoRA V-B) for one KV head over the tokens of ``layout``
    (:func:`kv_layout`).

    ``q``: the *pre-scaled* query (``q / sqrt(d)`` rounded to FP16, :func:`sim.golden.attention.prepare_query`),
    (d,) or (R, d) for the R query heads of a GQA group sharing the KV head (R = ``layout["rows"]``). Per
    token tile (GEMV for R = 1, else GEMM):

    1. ``p = q K^T`` (R x L_t), KEEP;
    2. SOFTMAX(R x L_t, CHAIN, KEEP): keeps ``e = exp(p - m)``, returns the anchors ``m`` and ``sum``;
    3. ``o = e V`` (R x d, TRANS), CHAIN: the unnormalized partial output, returned.

    ``results`` -> a list with one ``(o uint16, m uint16, sum uint32)`` per tile: shapes (d,), (), () for a
    1-D q, else (R, d), (R,), (R,). Merge them (and other devices' partials) with
    :func:`sim.golden.attention.merge_partials`."""
    _cfg(config)
    d, rows_l = layout["d"], layout["rows"]
    one, qs = _rows_input("q", q, d)
    rows = qs.shape[0]
    if rows != rows_l:
        raise ValueError(f"q has {rows} rows; the layout was made for rows = {rows_l}")
    program = []
    for kt_addr, v_addr, t0, t1 in layout["tiles"]:
        lt = t1 - t0
        descs = [_mm(kt_addr, rows, d, lt, keep=True), softmax(rows, lt, keep=True, chain=True),
                 _mm(v_addr, rows, lt, d, chain=True, trans=True)]
        for name, desc in zip(("scores q K^T", "softmax", "context e V"), descs):
            _checked(desc, config, f"attention_integral {name} (d={d}, tile={lt}, rows={rows})")
        program += [(descs[0], qs.copy()), (descs[1], None), (descs[2], None)]

    def assemble(res):
        out = []
        for i in range(len(layout["tiles"])):
            anc = res[3 * i + 1].reshape(rows, ANCHOR_ELEMS)
            m = anc[:, 0].copy()
            s = anc[:, 1].astype(np.uint32) | (anc[:, 2].astype(np.uint32) << 16)
            o = res[3 * i + 2].reshape(rows, d)
            out.append((o[0], m[0], s[0]) if one else (o, m, s))
        return out
    return Kernel("attention_integral", program, {"d": d, "l": layout["l"], "rows": rows,
                                                  "tiles": len(layout["tiles"]), "tile": layout["tile"]},
                  assemble)


def attention_grouped(q, layout: dict, *, config: NDPConfig) -> Kernel:
    """One device's share of integral attention for the g KV heads of ``layout`` (:func:`kv_group_layout`) at
    once, in the grouped dataflow (descriptor flag GROUP; docs/ndp_core.md "Grouped attention").

    ``q``: the pre-scaled queries (B, g, d): query row b (of a GQA group of B = ``layout["rows"]``) of every KV
    head s. Per tile (W tokens of every head; R = B g rows, row b g + s = query b of head s; d = n W):

    1. ``p = q K^T`` GEMM GROUP (R x W, operand d x lanes; the input R rows of d packed as n words per PE row,
       word j the W-slice j of its g rows), KEEP;
    2. SOFTMAX GROUP (R x W, CHAIN, KEEP): keeps ``e = exp(p - m)``, returns R anchors;
    3. ``o = e V`` as n GEMMs GROUP (R x W each, CHAIN on the one kept ``e``, operand V slice j): dims
       ``[j W, (j + 1) W)`` of the unnormalized partial outputs of the R rows, returned.

    ``results`` -> a list with one ``(o (B, g, d) uint16, m (B, g) uint16, sum (B, g) uint32)`` per tile; each
    (b, s) merges with :func:`sim.golden.attention.merge_partials` like :func:`attention_integral`'s."""
    _cfg(config)
    g, d, rows = layout["group"], layout["d"], layout["rows"]
    qs = _bits("q", q, f"(B, g, d) = ({rows}, {g}, {d})", (3,))
    if qs.shape != (rows, g, d):
        raise ValueError(f"q must be (B, g, d) = ({rows}, {g}, {d}), got {qs.shape}")
    R, W, L = rows * g, layout["tile"], config.lanes
    n = d // W
    # the scores' input: per PE row (query b of the g heads), n words; word j = each head's dims [j W, (j + 1) W)
    packed = qs.reshape(rows, g, n, W).transpose(0, 2, 1, 3).reshape(-1).copy()
    program = []
    for (k_addr, _, t0, t1), v_addrs in zip(layout["tiles"], layout["v_slices"]):
        nar = layout.get("narrow", False)          # (NARROW: W = group_lanes / 2)
        descs = [gemm(k_addr, R, d, L, keep=True, group=True, narrow=nar),
                 softmax(R, W, keep=True, chain=True, group=True, narrow=nar)]
        descs += [gemm(v_addr, R, W, L, chain=True, group=True, narrow=nar) for v_addr in v_addrs]
        names = ["scores q K^T", "softmax"] + [f"context e V (slice {j})" for j in range(n)]
        for name, desc in zip(names, descs):
            _checked(desc, config, f"attention_grouped {name} (d={d}, g={g}, rows={rows})")
        program += [(descs[0], packed.copy())] + [(desc, None) for desc in descs[1:]]

    def assemble(res):
        out, per = [], 2 + n
        for i in range(len(layout["tiles"])):
            anc = res[per * i + 1].reshape(rows, g, ANCHOR_ELEMS)
            m = anc[..., 0].copy()
            s = anc[..., 1].astype(np.uint32) | (anc[..., 2].astype(np.uint32) << 16)
            o = np.concatenate([res[per * i + 2 + j].reshape(rows, g, W) for j in range(n)], axis=2)
            out.append((o, m, s))
        return out
    return Kernel("attention_grouped", program, {"d": d, "l": layout["l"], "rows": rows, "group": g,
                                                 "tiles": len(layout["tiles"]), "tile": W, "slices": n}, assemble)


def attention_batch(entries, *, config: NDPConfig, pipelined: bool = False) -> Kernel:
    """A decode batch's attention shares on one device as **one descriptor stream** (issue 29 item 1): for each
    entry ``(q, layout)`` -- one (request, KV head) share, ``q`` its pre-scaled query (or GQA group) and ``layout``
    its :func:`kv_layout` -- the descriptors of :func:`attention_integral`, one entry after the other.

    Why one stream: the core overlaps successive descriptors (the memory engine reads the next operand while
    earlier descriptors compute, drain and return; docs/ndp_core.md), so an entry's fixed costs (decode, the
    scores' drain, the SOFTMAX, the context's drain and the return of its partial) hide under the next entry's
    K^T reads, instead of being paid from an idle device per entry. The entries share the owner's state slot in
    order: each scores KEEP replaces the kept result after the previous entry's context CHAIN has read it (the
    core's in-order units; the golden core's sequential semantics).

    An entry whose layout is a :func:`kv_group_layout` (g KV heads at once) runs :func:`attention_grouped`.
    ``pipelined``: issue consecutive grouped entries' tiles software-pipelined over two owners
    (:func:`_pipeline_grouped`; issue with :meth:`Kernel.entries`): exact, faster on the RTL, but not priced by
    the performance model (docs/ndp_core.md, "Grouped attention"), so the hosts do not issue it.

    ``results`` -> one list per entry of its tiles' ``(o, m, sum)`` partials (as :func:`attention_integral`),
    merged by the host with the other devices' partials (:func:`sim.golden.attention.merge_partials`)."""
    _cfg(config)
    entries = list(entries)
    if not entries:
        raise ValueError("entries must hold at least one (q, layout) share")
    ks = []
    for i, e in enumerate(entries):
        if not (isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], dict)):
            raise ValueError(f"entries[{i}] must be a (q, kv_layout dict) pair, got {type(e).__name__}")
        kern = attention_grouped if "group" in e[1] else attention_integral
        ks.append(kern(e[0], e[1], config=config))
    counts = [len(k.program) for k in ks]
    flat = [e for k in ks for e in k.program]
    if not isinstance(pipelined, bool):
        raise ValueError(f"pipelined must be a bool, got {pipelined!r}")
    order, owners = _pipeline_grouped(ks) if pipelined else (list(range(len(flat))), None)

    def assemble(res):
        res = list(res)
        orig = [None] * len(flat)
        for pos, oi in enumerate(order):
            orig[oi] = res[pos]
        out, i = [], 0
        for k, n in zip(ks, counts):
            out.append(k._assemble(orig[i:i + n]))
            i += n
        return out
    return Kernel("attention_batch", [flat[i] for i in order],
                  {"entries": len(ks), "descriptors": counts, "tokens": [k.meta["l"] for k in ks],
                   "rows": [k.meta["rows"] for k in ks]}, assemble, owners)


def _pipeline_grouped(ks):
    """Issue order (indices into the concatenated programs of ``ks``) and owner offsets of a batch stream.

    Grouped tiles (scores S, SOFTMAX SM, context C -- its n slice GEMMs in order -- of :func:`attention_grouped`)
    in a run of consecutive grouped entries are **software-pipelined**: S0, SM0, S1, C0, SM1, S2, C1, ..., so the
    PE array computes the next
    tile's scores while the current tile's SOFTMAX runs on the SFU, and a tile's SOFTMAX output is written (the
    output writer is in order) before the next scores' results (issue 29). Successive
    tiles alternate between two owners (state slots), so a tile's scores never replace the kept result the
    previous tile's SOFTMAX and context still read; the core copies a CHAIN's input once its producer (the
    slot's last KEEP before it) has written it (hdl/ndp/core.py), not after every earlier descriptor. Per-head
    entries keep their order, owner 0."""
    order, owners, base = [], [], 0
    run = []                        # tiles (start index of S, context slices) of the current grouped run

    def flush():
        n = len(run)
        seq = [(run[0][0], 0), (run[0][0] + 1, 0)] if n else []     # S0, SM0
        for t in range(n):
            if t + 1 < n:
                seq.append((run[t + 1][0], t + 1))                  # S_{t+1}
            seq += [(run[t][0] + 2 + j, t) for j in range(run[t][1])]   # C_t (its slices)
            if t + 1 < n:
                seq.append((run[t + 1][0] + 1, t + 1))              # SM_{t+1}
        for i, t in seq:
            order.append(i)
            owners.append(t % 2)
        run.clear()
    for k in ks:
        n = len(k.program)
        if k.name == "attention_grouped":
            per = 2 + k.meta["slices"]
            run.extend((i, k.meta["slices"]) for i in range(base, base + n, per))
        else:
            flush()
            order.extend(range(base, base + n))
            owners.extend([0] * n)
        base += n
    flush()
    return order, owners
