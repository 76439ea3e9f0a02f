"""Software side of the NDP descriptor: build, encode (via ``DESCRIPTOR_LAYOUT.const``), decode and validate.

:meth:`Descriptor.validate` mirrors the hardware decoder (:mod:`hdl.ndp.decoder`) check for check, in the same
precedence (the value order of :class:`ErrorCode`), and :meth:`Descriptor.command` gives the exact decoded
command the decoder emits. It is written independently of the hardware: tests compare the two.
Bit positions: ``docs/ndp_descriptor.md``; shape conventions: :mod:`hdl.ndp.descriptor`.
"""

from dataclasses import dataclass, fields

from amaranth.lib import data

from hdl.ndp.descriptor import (
    CODE_BITS, FIELD_BITS, ADDR_BITS, HEADER_BITS, DESCRIPTOR_BITS, FLIT_BYTES, SEQ_BITS, FLAG_BITS,
    FLAG_KEEP, FLAG_CHAIN, FLAG_ACC, FLAG_PARTIAL, FLAG_TRANS, FLAG_GROUP, FLAG_NARROW, OWNER_BITS, ANCHOR_ELEMS, DescType, DescOp, DType,
    ELEMENT_BYTES, ErrorCode, DESCRIPTOR_LAYOUT, REQUEST_LAYOUT, command_layout,
)

__all__ = ["Descriptor", "decode", "gemv", "gemm", "softmax", "load", "store", "request"]

_CODES = {"type": DescType, "op": DescOp, "dtype": DType}
_WIDTHS = {
    "type": CODE_BITS, "op": CODE_BITS, "dtype": CODE_BITS, "flags": FLAG_BITS,
    "reserved": HEADER_BITS - 3 * CODE_BITS - FLAG_BITS,
    "base_addr": ADDR_BITS,
    "operand_bytes": FIELD_BITS, "operand_dim0": FIELD_BITS, "operand_dim1": FIELD_BITS,
    "input_bytes": FIELD_BITS, "input_dim0": FIELD_BITS, "input_dim1": FIELD_BITS,
}
_RC_OPS = (DescOp.GEMV, DescOp.GEMM, DescOp.SOFTMAX)
_SUPPORTED_DTYPES = (DType.FP16,)


def _code(value) -> int:
    return value.value if isinstance(value, (DescType, DescOp, DType)) else value


@dataclass(frozen=True, kw_only=True)
class Descriptor:
    """One descriptor. ``type``/``op``/``dtype`` are enum members, or plain ints for codes outside the enums
    (malformed descriptors; a known int is converted to its member). Every field must fit its bit width."""

    type: DescType | int
    op: DescOp | int
    dtype: DType | int
    base_addr: int
    operand_bytes: int
    operand_dim0: int
    operand_dim1: int
    input_bytes: int = 0
    input_dim0: int = 0
    input_dim1: int = 0
    flags: int = 0
    reserved: int = 0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            enum_cls = _CODES.get(f.name)
            if enum_cls is not None and isinstance(value, enum_cls):
                continue
            width = _WIDTHS[f.name]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << width):
                raise ValueError(f"Descriptor: {f.name} must be "
                                 f"{'a ' + enum_cls.__name__ + ' or ' if enum_cls else ''}an int in "
                                 f"0..{(1 << width) - 1}, got {value!r}")
            if enum_cls is not None and value in {m.value for m in enum_cls}:
                object.__setattr__(self, f.name, enum_cls(value))

    # ---- encoding ---------------------------------------------------------------------------------------

    def const(self) -> data.Const:
        """The descriptor as a ``DESCRIPTOR_LAYOUT`` constant."""
        return DESCRIPTOR_LAYOUT.const({
            "header": {"type": _code(self.type), "op": _code(self.op), "dtype": _code(self.dtype),
                       "flags": self.flags, "reserved": self.reserved},
            "base_addr": self.base_addr,
            "operand": {"bytes": self.operand_bytes, "dim0": self.operand_dim0, "dim1": self.operand_dim1},
            "input": {"bytes": self.input_bytes, "dim0": self.input_dim0, "dim1": self.input_dim1},
        })

    def encode(self) -> int:
        """The 204-bit descriptor as an int (bit 0 = LSB of the header)."""
        return self.const().as_value().value

    def to_flit(self) -> bytes:
        """One 256-byte CXL flit: the descriptor little-endian in bytes 0..25, zero padded."""
        return self.encode().to_bytes(FLIT_BYTES, "little")

    # ---- checks -----------------------------------------------------------------------------------------

    @property
    def keep(self) -> bool:
        return bool(self.flags & FLAG_KEEP)

    @property
    def chain(self) -> bool:
        return bool(self.flags & FLAG_CHAIN)

    @property
    def acc(self) -> bool:
        return bool(self.flags & FLAG_ACC)

    @property
    def partial(self) -> bool:
        return bool(self.flags & FLAG_PARTIAL)

    @property
    def trans(self) -> bool:
        return bool(self.flags & FLAG_TRANS)

    @property
    def group(self) -> bool:
        return bool(self.flags & FLAG_GROUP)

    @property
    def narrow(self) -> bool:
        return bool(self.flags & FLAG_NARROW)

    def narrowed(self, config=None) -> bool:
        """Whether the NARROW semantics apply (segments of ``config.group_lanes / 2``): the NARROW flag on a
        :meth:`grouped` descriptor of a core with ``group_narrow`` (otherwise the flag is BAD_FLAGS and the shapes
        are checked at W)."""
        return self.narrow and self.grouped(config) and (config is None or config.group_narrow)

    def grouped(self, config=None) -> bool:
        """Whether the GROUP semantics apply (packed rows of ``config.group_lanes``; GEMM R x W results): the
        GROUP flag on a GEMM or SOFTMAX, on a core with ``group_lanes`` (``config`` None: assumed so)."""
        return (self.group and self.type == DescType.READ_COMPUTE and self.op in (DescOp.GEMM, DescOp.SOFTMAX)
                and (config is None or config.group_lanes > 0))

    @property
    def is_mm(self) -> bool:
        """READ_COMPUTE GEMV or GEMM."""
        return self.type == DescType.READ_COMPUTE and self.op in (DescOp.GEMV, DescOp.GEMM)

    @property
    def is_softmax(self) -> bool:
        return self.type == DescType.READ_COMPUTE and self.op == DescOp.SOFTMAX

    def input_beats(self, lanes: int, config=None) -> int:
        """``x`` beats of the input (as the GPU sends it): a STORE's bytes as whole beats; a READ_COMPUTE's
        rows, each padded to whole beats (``input_dim0 * ceil(input_dim1 / lanes)``), or packed for GROUP
        (``input_dim0 * input_dim1 / lanes``, :meth:`grouped`); 0 for LOAD."""
        if self.type == DescType.STORE:
            return -(-self.input_bytes // (2 * lanes))
        if self.type == DescType.READ_COMPUTE:
            if self.grouped(config):
                return self.input_dim0 * self.input_dim1 // lanes
            return self.input_dim0 * -(-self.input_dim1 // lanes)
        return 0

    def result_shape(self, config=None) -> tuple:
        """(rows, columns) of the result (GEMV 1 x N, GEMM B x N or GROUP R x W, SOFTMAX R x L values, LOAD the
        operand); (0, 0) for STORE. A SOFTMAX's anchors come on top (:meth:`output_elems`)."""
        if self.type == DescType.LOAD:
            return (self.operand_dim0, self.operand_dim1)
        if self.is_mm:
            if self.grouped(config):
                return (self.input_dim0, self.group_width(config))
            return (1 if self.op == DescOp.GEMV else self.input_dim0, self.operand_dim1)
        if self.is_softmax:
            return (self.input_dim0, self.input_dim1)
        return (0, 0)

    def returned_elems(self, element_bytes: int = 2, config=None) -> int:
        """Elements the core returns on ``y``: LOAD its operand; GEMV/GEMM the result unless KEEP or PARTIAL;
        SOFTMAX the values and anchors, or only the anchors with KEEP; STORE nothing."""
        if self.type == DescType.LOAD:
            return self.operand_bytes // element_bytes
        if self.is_mm:
            return 0 if (self.keep or self.partial) else self.output_elems(element_bytes, config)
        if self.is_softmax:
            return ANCHOR_ELEMS * self.input_dim0 if self.keep else self.output_elems(element_bytes)
        return 0

    @property
    def has_operand(self) -> bool:
        """Everything but SOFTMAX reads a device-resident operand (a SOFTMAX's operand fields are ignored)."""
        return not (self.type == DescType.READ_COMPUTE and self.op == DescOp.SOFTMAX)

    @property
    def has_input(self) -> bool:
        """STORE and READ_COMPUTE carry a GPU-supplied input; a LOAD's input fields are ignored."""
        return self.type in (DescType.STORE, DescType.READ_COMPUTE)

    def output_elems(self, element_bytes: int = 2, config=None) -> int:
        """Elements of the result (module table in :mod:`hdl.ndp.descriptor`); 0 for STORE."""
        t, op = self.type, self.op
        if t == DescType.LOAD:
            return self.operand_bytes // element_bytes
        if t == DescType.STORE:
            return 0
        if op == DescOp.GEMV:
            return self.operand_dim1
        if op == DescOp.GEMM:
            return self.input_dim0 * (self.group_width(config) if self.grouped(config) else self.operand_dim1)
        if op == DescOp.SOFTMAX:
            return self.input_dim0 * (self.input_dim1 + ANCHOR_ELEMS)
        return 0

    def group_width(self, config) -> int:
        """W of a GROUP GEMM's result rows: ``config.group_lanes``, half of it with NARROW (:meth:`narrowed`)
        (without a config, K: the rows of a K = W GEMM)."""
        if config is not None and config.group_lanes:
            return config.group_width(self.narrowed(config))
        return self.operand_dim0

    def _shape_ok(self, config) -> bool:
        t, op = self.type, self.op
        if t == DescType.STORE:
            return self.input_dim0 == self.operand_dim0 and self.input_dim1 == self.operand_dim1
        if t == DescType.READ_COMPUTE:
            grp = self.grouped(config)
            W = self.group_width(config) if grp else 0
            rows_ok = grp and self.input_dim0 % (config.lanes // W) == 0
            if op == DescOp.GEMV:
                return self.input_dim0 == 1 and self.input_dim1 == self.operand_dim0
            if op == DescOp.GEMM:
                if grp:         # rows of K = n W, the operand K x lanes (one segment per row of a beat; n x
                    #               words per PE row, at most the PE array's ceil(max_k / lanes))
                    k = self.operand_dim0
                    return (self.input_dim1 == k and k % W == 0 and 0 < k <= W * -(-config.max_k // config.lanes)
                            and self.operand_dim1 == config.lanes and rows_ok)
                return self.input_dim1 == self.operand_dim0
            if op == DescOp.SOFTMAX and grp:
                return self.input_dim1 == W and rows_ok
        return True

    def _not_multiple(self, config) -> bool:
        t, lanes = self.type, config.lanes
        k, n = self.operand_dim0, self.operand_dim1
        if self.is_mm:
            if self.trans:
                return not (k % lanes == 0 or (2 * k == lanes and n % 2 == 0))
            return not (n % lanes == 0 or (2 * n == lanes and k % 2 == 0))
        if self.is_softmax:
            # rows of whole beats, or (KEEP, an SFU at most half a beat wide) rows of half a beat: a decode
            # share of lanes / 2 tokens (issue 29; hdl/ndp/core.py's SFU gearbox takes half of each beat)
            half = 2 * self.input_dim1 == lanes and self.keep and 2 * config.sfu_lanes <= lanes
            return self.input_dim1 % lanes != 0 and not half and not self.grouped(config)
        return t == DescType.STORE and self.operand_bytes % config.align_bytes != 0

    def _bad_flags(self, config) -> bool:
        f = self.flags
        if self.type != DescType.READ_COMPUTE:
            return f != 0
        if self.group and (not self.grouped(config) or f & (FLAG_ACC | FLAG_PARTIAL | FLAG_TRANS)):
            return True
        if self.narrow and not self.narrowed(config):       # NARROW: with GROUP, on a core with group_narrow
            return True
        if self.op == DescOp.SOFTMAX:
            return bool(f & (FLAG_ACC | FLAG_PARTIAL | FLAG_TRANS))
        if f & (FLAG_ACC | FLAG_PARTIAL) and not f & FLAG_TRANS:
            return True
        return bool(f & FLAG_KEEP and f & FLAG_PARTIAL)

    def _input_too_large(self, config) -> bool:
        if not self.has_input:
            return False
        if self.input_bytes > config.input_buffer_bytes:
            return True
        if self.input_beats(config.lanes, config) * 2 * config.lanes > config.input_buffer_bytes:
            return True
        if self.is_mm or self.is_softmax:
            return self.input_dim1 > config.max_k
        return False

    def _output_too_large(self, config, esize) -> bool:
        lanes = config.lanes
        ret = self.returned_elems(esize, config)
        if -(-ret // lanes) * 2 * lanes > config.output_buffer_bytes:
            return True
        rows, cols = self.result_shape(config)
        if self.keep and self.type == DescType.READ_COMPUTE:
            kept_beats = rows * cols // lanes if self.grouped(config) else rows * -(-cols // lanes)
            if kept_beats * 2 * lanes > config.kept_slot_bytes:
                return True
        if self.is_mm and (self.acc or self.partial) and rows * cols > config.partial_slot_elems:
            return True
        if self.is_mm and not self.trans:
            return -(-cols // lanes) > config.acc_columns
        return False

    def validate(self, config) -> ErrorCode:
        """The decoder's verdict for this descriptor on an :class:`NDPConfig` (first failing check wins)."""
        if self.type not in (DescType.LOAD, DescType.STORE, DescType.READ_COMPUTE):
            return ErrorCode.UNKNOWN_TYPE
        if self.type == DescType.READ_COMPUTE:
            if self.op not in _RC_OPS:
                return ErrorCode.UNKNOWN_OP
        elif self.op != DescOp.NONE:
            return ErrorCode.UNKNOWN_OP
        if self.dtype not in _SUPPORTED_DTYPES:
            return ErrorCode.UNKNOWN_DTYPE
        esize = ELEMENT_BYTES[self.dtype]
        inp, opd = self.has_input, self.has_operand
        if ((opd and (self.operand_dim0 == 0 or self.operand_dim1 == 0))
                or (inp and (self.input_dim0 == 0 or self.input_dim1 == 0))):
            return ErrorCode.ZERO_DIMENSION
        if ((opd and self.operand_bytes != self.operand_dim0 * self.operand_dim1 * esize)
                or (inp and self.input_bytes != self.input_dim0 * self.input_dim1 * esize)):
            return ErrorCode.SIZE_MISMATCH
        if opd and self.operand_bytes > config.dram_buffer_bytes:
            return ErrorCode.OPERAND_TOO_LARGE
        if self._input_too_large(config):
            return ErrorCode.INPUT_TOO_LARGE
        if opd and self.base_addr + self.operand_bytes > config.device_bytes:
            return ErrorCode.ADDRESS_OVERFLOW
        if not self._shape_ok(config):
            return ErrorCode.SHAPE_MISMATCH
        if self.type == DescType.READ_COMPUTE and self.op == DescOp.GEMM and self.input_dim0 > config.max_batch:
            return ErrorCode.BATCH_TOO_LARGE
        if self._output_too_large(config, esize):
            return ErrorCode.OUTPUT_TOO_LARGE
        if opd and self.base_addr % config.align_bytes:
            return ErrorCode.MISALIGNED
        if self._not_multiple(config):
            return ErrorCode.NOT_MULTIPLE
        if self._bad_flags(config):
            return ErrorCode.BAD_FLAGS
        return ErrorCode.OK

    def command(self, config, seq: int = 0, owner: int = 0) -> dict:
        """The decoder's output for this descriptor as a ``command_layout(config)`` initializer (a dict)."""
        status = self.validate(config)
        seq %= 1 << SEQ_BITS
        if status != ErrorCode.OK:
            return {"status": status, "seq": seq, "owner": owner}
        esize = ELEMENT_BYTES[self.dtype]
        inp, opd = self.has_input, self.has_operand
        return {
            "status": status, "seq": seq, "owner": owner, "type": self.type, "op": self.op, "dtype": self.dtype,
            "keep": int(self.keep), "chain": int(self.chain), "acc": int(self.acc), "partial": int(self.partial),
            "trans": int(self.trans), "group": int(self.grouped(config)),
            "narrow": int(self.narrowed(config)),
            "base_addr": self.base_addr if opd else 0,
            "operand_dim0": self.operand_dim0 if opd else 0, "operand_dim1": self.operand_dim1 if opd else 0,
            "input_dim0": self.input_dim0 if inp else 0, "input_dim1": self.input_dim1 if inp else 0,
            "operand_elems": self.operand_bytes // esize if opd else 0,
            "input_elems": self.input_bytes // esize if inp else 0,
            "output_elems": self.output_elems(esize, config),
            "input_beats": self.input_beats(config.lanes, config),
            "ret_elems": self.returned_elems(esize, config),
        }

    def command_bits(self, config, seq: int = 0, owner: int = 0) -> int:
        """:meth:`command` packed by ``command_layout(config).const`` (what the decoder's ``o`` carries)."""
        return command_layout(config).const(self.command(config, seq, owner)).as_value().value

    def request(self, owner: int = 0) -> int:
        """The core's ``desc`` stream payload (``REQUEST_LAYOUT``): this descriptor and its ``owner``."""
        return request(self, owner)


def decode(raw: int | bytes) -> Descriptor:
    """A :class:`Descriptor` from a 204-bit int or a 256-byte flit (whose padding beyond bit 203 must be 0)."""
    if isinstance(raw, (bytes, bytearray)):
        if len(raw) != FLIT_BYTES:
            raise ValueError(f"a descriptor flit is {FLIT_BYTES} bytes, got {len(raw)}")
        raw = int.from_bytes(raw, "little")
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw < (1 << (8 * FLIT_BYTES)):
        raise ValueError(f"a descriptor is a non-negative int or {FLIT_BYTES} bytes, got {raw!r}")
    if raw >> DESCRIPTOR_BITS:
        raise ValueError(f"bits above bit {DESCRIPTOR_BITS - 1} of a descriptor must be 0")
    c = data.Const(DESCRIPTOR_LAYOUT, raw)
    h = c.header
    return Descriptor(type=h.type, op=h.op, dtype=h.dtype, flags=h.flags, reserved=h.reserved,
                      base_addr=c.base_addr,
                      operand_bytes=c.operand.bytes, operand_dim0=c.operand.dim0, operand_dim1=c.operand.dim1,
                      input_bytes=c.input.bytes, input_dim0=c.input.dim0, input_dim1=c.input.dim1)


def _nbytes(rows, cols, dtype):
    return rows * cols * ELEMENT_BYTES[DType(_code(dtype))]


def request(desc: "Descriptor | int", owner: int = 0) -> int:
    """A ``REQUEST_LAYOUT`` payload: descriptor ``desc`` (a :class:`Descriptor` or its 204-bit encoding) of
    ``owner`` (0..2**32 - 1)."""
    raw = desc.encode() if isinstance(desc, Descriptor) else desc
    if isinstance(owner, bool) or not isinstance(owner, int) or not 0 <= owner < 1 << OWNER_BITS:
        raise ValueError(f"owner must be an int in 0..{(1 << OWNER_BITS) - 1}, got {owner!r}")
    return raw | owner << DESCRIPTOR_BITS


def _flags(keep=False, chain=False, acc=False, partial=False, trans=False, group=False, narrow=False):
    return ((FLAG_KEEP if keep else 0) | (FLAG_CHAIN if chain else 0) | (FLAG_ACC if acc else 0)
            | (FLAG_PARTIAL if partial else 0) | (FLAG_TRANS if trans else 0) | (FLAG_GROUP if group else 0)
            | (FLAG_NARROW if narrow else 0))


def gemv(base_addr: int, k: int, n: int, *, dtype=DType.FP16, keep=False, chain=False, acc=False,
         partial=False, trans=False) -> Descriptor:
    """y[1 x N] = x[1 x K] A[K x N], A at ``base_addr``. ``keep``/``chain``/``acc``/``partial``/``trans``:
    header flags (module docs of :mod:`hdl.ndp.descriptor`)."""
    return Descriptor(type=DescType.READ_COMPUTE, op=DescOp.GEMV, dtype=dtype, base_addr=base_addr,
                      flags=_flags(keep, chain, acc, partial, trans),
                      operand_bytes=_nbytes(k, n, dtype), operand_dim0=k, operand_dim1=n,
                      input_bytes=_nbytes(1, k, dtype), input_dim0=1, input_dim1=k)


def gemm(base_addr: int, b: int, k: int, n: int, *, dtype=DType.FP16, keep=False, chain=False, acc=False,
         partial=False, trans=False, group=False, narrow=False) -> Descriptor:
    """Y[B x N] = X[B x K] A[K x N] (a batch of B GEMVs sharing A), A at ``base_addr``. ``group``: the GROUP
    flag (K = n W with W = config.group_lanes, N = lanes, B a multiple of lanes / W, the input rows packed as
    :func:`sim.golden.pe_array.gemm_group` takes them; the result is B x W). ``narrow``: the NARROW flag (with
    ``group``: W = config.group_lanes / 2)."""
    return Descriptor(type=DescType.READ_COMPUTE, op=DescOp.GEMM, dtype=dtype, base_addr=base_addr,
                      flags=_flags(keep, chain, acc, partial, trans, group, narrow),
                      operand_bytes=_nbytes(k, n, dtype), operand_dim0=k, operand_dim1=n,
                      input_bytes=_nbytes(b, k, dtype), input_dim0=b, input_dim1=k)


def softmax(rows: int, cols: int, *, dtype=DType.FP16, keep=False, chain=False, group=False,
            narrow=False) -> Descriptor:
    """Partial softmax of ``rows x cols`` scores (GPU input, or the kept scores with ``chain``): the exponentials
    and per-row anchors (max, FP32 sum). No device-resident operand (base address and operand fields 0).
    ``group``: rows of ``config.group_lanes`` packed to beats (``narrow``: of half of it)."""
    return Descriptor(type=DescType.READ_COMPUTE, op=DescOp.SOFTMAX, dtype=dtype, base_addr=0,
                      operand_bytes=0, operand_dim0=0, operand_dim1=0, flags=_flags(keep, chain, group=group, narrow=narrow),
                      input_bytes=_nbytes(rows, cols, dtype), input_dim0=rows, input_dim1=cols)


def load(base_addr: int, rows: int, cols: int, *, dtype=DType.FP16) -> Descriptor:
    """Return the ``rows x cols`` tensor at ``base_addr`` (input fields 0)."""
    return Descriptor(type=DescType.LOAD, op=DescOp.NONE, dtype=dtype, base_addr=base_addr,
                      operand_bytes=_nbytes(rows, cols, dtype), operand_dim0=rows, operand_dim1=cols)


def store(base_addr: int, rows: int, cols: int, *, dtype=DType.FP16) -> Descriptor:
    """Write the GPU's ``rows x cols`` input to ``base_addr``."""
    nbytes = _nbytes(rows, cols, dtype)
    return Descriptor(type=DescType.STORE, op=DescOp.NONE, dtype=dtype, base_addr=base_addr,
                      operand_bytes=nbytes, operand_dim0=rows, operand_dim1=cols,
                      input_bytes=nbytes, input_dim0=rows, input_dim1=cols)
