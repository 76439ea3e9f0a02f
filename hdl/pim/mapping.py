"""KV-cache mapping of the DIMM-PIM (L3 section 4.2, ``docs/pim.md`` "Data placement"): one module for the RTL
generators, the golden models and the host.

Pure Python / numpy. Every function takes a :class:`hdl.pim.config.PIMConfig` (``B`` logic banks, ``C`` chips,
``E = d / C`` elements per chip, ``bpt = E / 4`` bursts per token per chip, ``G = B / bpt`` token sets, ``cpr``
bursts per bank row). Notation and formulas: ``docs/pim.md`` (contract) and ``docs/pim_mapping.md`` (this module).

* K (score) mapping: token ``t`` -> logic bank ``t mod B``, slot ``u = t div B``; its chip-``c`` burst ``k``
  (elements ``c E + 4k .. c E + 4k + 3``) at linear column ``u bpt + k`` of the head's K region.
* V (context) mapping: token ``t`` -> token set ``g = t mod G``, column ``v = t div G`` of the head's V region;
  slice ``k`` (elements ``c E + 4k .. + 3`` of chip ``c``) in logic bank ``g bpt + k``.
* A linear column ``lin`` of a region starting at row ``row0`` is row ``row0 + lin div cpr``, column
  ``lin mod cpr``. Logic bank ``b`` = bank group ``b div banks_per_group``, bank ``b mod banks_per_group``.
* Rank burst format (after the re-layout unit, section 4.1): ``org.burst_bits = 64 C`` bits, beat ``b`` in bits
  ``[8 C b, 8 C (b + 1))``, chip ``c``'s byte of beat ``b`` in bits ``[8 C b + 8 c, + 8)``; chip ``c``'s FP16
  element ``j`` (0..3) = its bytes of beats ``2 j`` (low) and ``2 j + 1`` (high).
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["flat_burst_address", "ELEMS_PER_BURST", "k_location", "v_location", "k_element_location", "v_element_location",
           "AllBankReads", "score_reads", "context_reads", "region_rows", "HeadLayout", "head_layout",
           "read_addresses", "pack_rank_bursts", "unpack_rank_bursts", "host_write_bursts", "kv_store_image", "kv_from_image"]

def flat_burst_address(org, rank, bg, bank, row, col):
    """Index of a burst in a channel's storage: ``((rank * banks + bg * banks_per_group + bank) * rows + row) *
    bursts_per_row + col`` (``org``: a :class:`hdl.memctl.timing.DRAMOrg`). The address the DRAM device model
    (``sim/dram/device.py``) indexes its ``init`` image with; kept here so that hdl/ needs nothing from sim/
    (``tests/hdl/pim/test_pim_mapping.py`` holds the two equal). Works on ints and numpy arrays."""
    return ((rank * org.banks + bg * org.banks_per_group + bank) * org.rows + row) * org.bursts_per_row + col


#: FP16 elements in one chip's 64-bit burst (x8 device, BL8) [L3 4.4: "the bank row buffer provides 64-bit data
#: for one RD"]; PIMConfig validates elems_per_burst == 4 through bank_pu_multipliers.
ELEMS_PER_BURST = 4


def _geom(config):
    org = config.dram.org
    return (config.banks, config.chips, config.elems_per_chip, config.bursts_per_token, config.token_sets,
            config.columns_per_row, org.banks_per_group)


def _arr(x, name, lo, hi):
    a = np.asarray(x, dtype=np.int64)
    if a.size and (a.min() < lo or a.max() >= hi):
        raise ValueError(f"{name} must be in [{lo}, {hi}), got values in [{a.min()}, {a.max()}]")
    return a


def _out(scalar, *arrays):
    if scalar:
        return tuple(int(a) for a in arrays)
    return arrays


def _row_check(config, row, name):
    rows = config.dram.org.rows
    if np.asarray(row).size and np.asarray(row).max() >= rows:
        raise ValueError(f"{name}: region exceeds the bank's rows (row {int(np.asarray(row).max())} >= "
                         f"org.rows = {rows})")


def k_location(config, t, chip, k, k_row0=0):
    """Location of token ``t``'s K burst ``k`` (0..bpt-1) of chip ``chip``: ``(bank_group, bank, row, col)``.

    Every chip of the rank holds its burst at the same (bank, row, col) (``chip`` only selects the byte lane of
    the rank burst, see :func:`pack_rank_bursts`). Scalars give ints; arrays broadcast and give int64 arrays."""
    B, C, E, bpt, G, cpr, bpg = _geom(config)
    scalar = all(np.ndim(x) == 0 for x in (t, chip, k))
    t = _arr(t, "t", 0, 1 << 40)
    _arr(chip, "chip", 0, C)
    k = _arr(k, "k", 0, bpt)
    b = t % B
    lin = (t // B) * bpt + k
    row = k_row0 + lin // cpr
    _row_check(config, row, "k_location")
    return _out(scalar, b // bpg, b % bpg, row, lin % cpr)


def v_location(config, t, chip, k, v_row0=0):
    """Location of token ``t``'s V slice ``k`` (0..bpt-1, elements ``chip E + 4k .. + 3``) in chip ``chip``:
    ``(bank_group, bank, row, col)``; logic bank ``(t mod G) bpt + k``, column ``t div G`` of the V region."""
    B, C, E, bpt, G, cpr, bpg = _geom(config)
    scalar = all(np.ndim(x) == 0 for x in (t, chip, k))
    t = _arr(t, "t", 0, 1 << 40)
    _arr(chip, "chip", 0, C)
    k = _arr(k, "k", 0, bpt)
    b = (t % G) * bpt + k
    v = t // G
    row = v_row0 + v // cpr
    _row_check(config, row, "v_location")
    return _out(scalar, b // bpg, b % bpg, row, v % cpr)


def _element_split(config, i):
    E = config.elems_per_chip
    i = _arr(i, "i (element index)", 0, config.head_dim)
    return i // E, (i % E) // ELEMS_PER_BURST, i % ELEMS_PER_BURST


def k_element_location(config, t, i, k_row0=0):
    """Element ``i`` (0..d-1) of token ``t``'s K: ``(bank_group, bank, row, col, chip, j)``, ``j`` = element slot
    (0..3) within the chip's 64-bit burst."""
    scalar = np.ndim(t) == 0 and np.ndim(i) == 0
    chip, k, j = _element_split(config, i)
    bg, bank, row, col = k_location(config, t, chip, k, k_row0)
    return _out(scalar, bg, bank, row, col, chip, j) if scalar else (bg, bank, row, col, chip, j)


def v_element_location(config, t, i, v_row0=0):
    """Element ``i`` of token ``t``'s V: ``(bank_group, bank, row, col, chip, j)``."""
    scalar = np.ndim(t) == 0 and np.ndim(i) == 0
    chip, k, j = _element_split(config, i)
    bg, bank, row, col = v_location(config, t, chip, k, v_row0)
    return _out(scalar, bg, bank, row, col, chip, j) if scalar else (bg, bank, row, col, chip, j)


@dataclass(frozen=True)
class AllBankReads:
    """The RD_AB sequence of one phase of one head, in issue order (``n`` reads, ``B`` logic banks).

    ``row``, ``col``: (n,) int64, the all-bank read address; ``token``: (n, B) the token each logic bank's
    burst belongs to (may be >= L: padding, whose data is 0 and whose result the rank PU masks); ``burst``:
    (n, B) which burst of that token (score: K burst ``k``, same in every bank; context: V slice
    ``b mod bpt``); ``valid``: (n, B) ``token < L``."""
    row: np.ndarray
    col: np.ndarray
    token: np.ndarray
    burst: np.ndarray
    valid: np.ndarray

    def __len__(self):
        return len(self.row)

    def row_runs(self):
        """``[(row, bursts)]``: consecutive reads of one row (an ACT_AB ... PREA each)."""
        out = []
        for r in self.row.tolist():
            if out and out[-1][0] == r:
                out[-1][1] += 1
            else:
                out.append([r, 1])
        return [tuple(x) for x in out]


def _check_L(L):
    if not isinstance(L, (int, np.integer)) or L < 1:
        raise ValueError(f"L (tokens) must be an integer >= 1, got {L!r}")


def score_reads(config, L, k_row0=0) -> AllBankReads:
    """Score phase: ``ceil(L / B) * bpt`` RD_ABs; read ``n = u bpt + k`` gives bank ``b`` burst ``k`` of token
    ``u B + b`` (chunk ``u`` = the tokens of slot ``u``)."""
    _check_L(L)
    B, C, E, bpt, G, cpr, bpg = _geom(config)
    n = -(-L // B) * bpt
    lin = np.arange(n, dtype=np.int64)
    row = k_row0 + lin // cpr
    _row_check(config, row, f"score_reads (L = {L}, k_row0 = {k_row0})")
    token = (lin // bpt)[:, None] * B + np.arange(B, dtype=np.int64)[None, :]
    burst = np.broadcast_to((lin % bpt)[:, None], (n, B)).copy()
    return AllBankReads(row, lin % cpr, token, burst, token < L)


def context_reads(config, L, v_row0=0) -> AllBankReads:
    """Context phase: ``ceil(L / G)`` RD_ABs; read ``v`` gives bank ``b`` slice ``b mod bpt`` of token
    ``v G + b div bpt``."""
    _check_L(L)
    B, C, E, bpt, G, cpr, bpg = _geom(config)
    n = -(-L // G)
    v = np.arange(n, dtype=np.int64)
    row = v_row0 + v // cpr
    _row_check(config, row, f"context_reads (L = {L}, v_row0 = {v_row0})")
    b = np.arange(B, dtype=np.int64)
    token = v[:, None] * G + (b // bpt)[None, :]
    burst = np.broadcast_to(b % bpt, (n, B)).copy()
    return AllBankReads(row, v % cpr, token, burst, token < L)


def region_rows(config, L):
    """``(k_rows, v_rows)``: bank rows of one head's K and V regions for ``L`` tokens."""
    _check_L(L)
    B, C, E, bpt, G, cpr, bpg = _geom(config)
    return -(-(-(-L // B) * bpt) // cpr), -(-(-(-L // G)) // cpr)


@dataclass(frozen=True)
class HeadLayout:
    """Row allocation of ``heads`` heads of ``L`` tokens in one rank: head ``h`` has its K region at rows
    ``k_row0[h] .. + k_rows - 1`` and its V region right after it (``v_row0[h] = k_row0[h] + k_rows``); heads
    follow each other from ``row_base``. The same rows in every bank of every chip of rank ``rank``."""
    L: int
    heads: int
    rank: int
    row_base: int
    k_rows: int
    v_rows: int
    k_row0: tuple
    v_row0: tuple

    @property
    def rows_per_head(self) -> int:
        return self.k_rows + self.v_rows

    @property
    def rows_used(self) -> int:
        return self.heads * self.rows_per_head


def head_layout(config, L, heads, *, rank=0, row_base=0, rows=None) -> HeadLayout:
    """Allocate K-then-V row ranges for ``heads`` heads of ``L`` tokens within rows ``row_base ..
    row_base + rows - 1`` (default: to the end of the bank) of ``rank``.

    Raises ValueError naming L / heads and the allowed maximum when they do not fit, or when ``L`` exceeds the
    rank PU buffer (``config.max_tokens``, one FP16 exponential per token)."""
    org = config.dram.org
    _check_L(L)
    if L > config.max_tokens:
        raise ValueError(f"L = {L} exceeds the rank PU buffer: at most config.max_tokens = {config.max_tokens} "
                         f"tokens per head ({config.rank_buffer_bytes} bytes / 2)")
    if not isinstance(heads, (int, np.integer)) or heads < 1:
        raise ValueError(f"heads must be an integer >= 1, got {heads!r}")
    if not 0 <= rank < org.ranks:
        raise ValueError(f"rank = {rank} outside [0, {org.ranks})")
    if rows is None:
        rows = org.rows - row_base
    if not 0 <= row_base or row_base + rows > org.rows or rows < 1:
        raise ValueError(f"row_base = {row_base}, rows = {rows}: must lie within the bank's {org.rows} rows")
    kr, vr = region_rows(config, L)
    per = kr + vr
    if heads * per > rows:
        # largest L whose regions fit `heads` times: rows per head is monotone in L
        cap = rows // heads
        lo, hi = 0, config.max_tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if sum(region_rows(config, mid)) <= cap:
                lo = mid
            else:
                hi = mid - 1
        raise ValueError(f"L = {L} tokens x heads = {heads} need {heads * per} rows per bank ({kr} K + {vr} V "
                         f"rows per head), only {rows} available: at most heads = {rows // per} for L = {L}, "
                         f"at most L = {lo} for heads = {heads}")
    k0 = tuple(row_base + h * per for h in range(heads))
    return HeadLayout(L=int(L), heads=int(heads), rank=rank, row_base=row_base, k_rows=kr, v_rows=vr,
                      k_row0=k0, v_row0=tuple(k + kr for k in k0))


# ---- burst format -------------------------------------------------------------------------------------------

def _fp16_bits(x, name):
    a = np.asarray(x)
    if a.dtype == np.uint16:
        return a
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be FP16 bits (uint16) or floats, got dtype {a.dtype}")
    with np.errstate(over="ignore"):
        return a.astype(np.float16).view(np.uint16)


def pack_rank_bursts(config, elems):
    """``elems``: (..., C, 4) FP16 bits, element ``j`` of chip ``c``'s burst -> list of rank-burst ints
    (``org.burst_bits`` bits, the DRAMChannel data format after re-layout; module docstring)."""
    C = config.chips
    e = np.ascontiguousarray(_fp16_bits(elems, "elems")).reshape(-1, C, ELEMS_PER_BURST)
    by = e.astype("<u2").view(np.uint8).reshape(-1, C, ELEMS_PER_BURST, 2)   # [n, c, j, lo/hi]
    by = np.ascontiguousarray(by.transpose(0, 2, 3, 1)).reshape(len(e), -1)  # [n, beat 2j + hi, c]
    return [int.from_bytes(r.tobytes(), "little") for r in by]


def unpack_rank_bursts(config, bursts):
    """Inverse of :func:`pack_rank_bursts`: ints -> (n, C, 4) uint16."""
    C = config.chips
    nbytes = config.dram.org.burst_bits // 8
    raw = b"".join(int(x).to_bytes(nbytes, "little") for x in bursts)
    by = np.frombuffer(raw, np.uint8).reshape(-1, ELEMS_PER_BURST, 2, C)
    return np.ascontiguousarray(by.transpose(0, 3, 1, 2)).reshape(-1, C * ELEMS_PER_BURST * 2) \
        .view("<u2").reshape(-1, C, ELEMS_PER_BURST).astype(np.uint16)


def host_write_bursts(config, elems):
    """What the host puts on the DQ bus (before the re-layout unit) so that the rank stores
    :func:`pack_rank_bursts` ``(elems)``: beat pair ``j`` carries the ``C`` elements ``(chip 0..C-1, j)`` as
    consecutive little-endian FP16 (element ``c`` in bytes ``2c, 2c + 1`` of the pair; ``docs/pim.md`` 4.1)."""
    C = config.chips
    e = np.ascontiguousarray(_fp16_bits(elems, "elems")).reshape(-1, C, ELEMS_PER_BURST)
    by = np.ascontiguousarray(e.transpose(0, 2, 1)).astype("<u2").view(np.uint8).reshape(len(e), -1)
    return [int.from_bytes(r.tobytes(), "little") for r in by]


def _kv_heads(config, K, V, layout):
    d = config.head_dim
    K = _fp16_bits(K, "K")
    V = _fp16_bits(V, "V")
    if K.ndim == 2:
        K = K[None]
    if V.ndim == 2:
        V = V[None]
    if K.shape != V.shape or K.ndim != 3 or K.shape[2] != d or K.shape[0] != layout.heads or \
            K.shape[1] != layout.L:
        raise ValueError(f"K and V must be (L, d) or (heads, L, d) = ({layout.heads}, {layout.L}, {d}); got "
                         f"{K.shape}, {V.shape}")
    return K, V


def _region_elems(config, X, L, kind):
    """(n_reads * B, C, 4) elements of every burst of a head's region in (read, logic bank) order."""
    B, C, E, bpt, G, cpr, bpg = _geom(config)
    reads = score_reads(config, L) if kind == "k" else context_reads(config, L)
    tok = reads.token.ravel()
    kk = reads.burst.ravel()
    Xp = np.zeros((int(tok.max()) + 1, config.head_dim), np.uint16)
    Xp[:L] = X
    idx = (np.arange(C)[None, :, None] * E + kk[:, None, None] * ELEMS_PER_BURST
           + np.arange(ELEMS_PER_BURST)[None, None, :])
    return reads, Xp[tok[:, None, None], idx]


def read_addresses(config, reads, rank=0, row0=0):
    """(n, B) flat burst addresses (:func:`flat_burst_address`) of every bank's burst of each RD_AB
    of ``reads`` (rows offset by ``row0`` when ``reads`` was built with row base 0)."""
    B = config.banks
    b = np.arange(B, dtype=np.int64)[None, :]
    return flat_burst_address(config.dram.org, rank, 0, b, (reads.row + row0)[:, None], reads.col[:, None]) \
        .astype(np.int64)


def _addresses(config, layout, reads, row0):
    return read_addresses(config, reads, layout.rank, row0).ravel()


def kv_store_image(config, K, V, layout) -> dict:
    """DRAMChannel ``init`` contents ``{flat burst address: int}`` holding ``K``, ``V`` ((L, d) for one head or
    (heads, L, d), FP16 bits or floats) at ``layout`` (:func:`head_layout`). Every burst the kernel reads is
    present; padding tokens' (``t >= L``) K/V are 0."""
    K, V = _kv_heads(config, K, V, layout)
    img = {}
    for h in range(layout.heads):
        for X, kind, row0 in ((K[h], "k", layout.k_row0[h]), (V[h], "v", layout.v_row0[h])):
            reads, el = _region_elems(config, X, layout.L, kind)
            addr = _addresses(config, layout, reads, row0)
            img.update(zip(addr.tolist(), pack_rank_bursts(config, el)))
    return img


def kv_from_image(config, image, layout):
    """Inverse of :func:`kv_store_image`: ``(K, V)`` as (heads, L, d) uint16 read back from ``image`` (a dict,
    missing bursts = 0, or a sequence indexed by flat burst address)."""
    B, C, E, bpt, G, cpr, bpg = _geom(config)
    get = image.get if isinstance(image, dict) else (lambda a, default=0: image[a] if a < len(image) else 0)
    L, d = layout.L, config.head_dim
    out = []
    for kind, rows0 in (("k", layout.k_row0), ("v", layout.v_row0)):
        X = np.zeros((layout.heads, L, d), np.uint16)
        for h in range(layout.heads):
            reads = score_reads(config, L) if kind == "k" else context_reads(config, L)
            addr = _addresses(config, layout, reads, rows0[h])
            el = unpack_rank_bursts(config, [get(int(a), 0) for a in addr])   # (n*B, C, 4)
            tok = reads.token.ravel()
            kk = reads.burst.ravel()
            m = tok < L
            idx = (np.arange(C)[None, :, None] * E + kk[:, None, None] * ELEMS_PER_BURST
                   + np.arange(ELEMS_PER_BURST)[None, None, :])
            X[h][tok[m][:, None, None], idx[m]] = el[m]
        out.append(X)
    return tuple(out)
