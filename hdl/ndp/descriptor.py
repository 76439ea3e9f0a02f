"""The PLoRA read-compute descriptor (204 bits, one 256-byte CXL 3.1 flit) and the decoder's command/status.

Source: [PLoRA], Section IV-C: "a request packs Type (load, store,
read-compute), OP (GEMM, GEMV, Softmax) and data type into 20 bits, the 64-bit base address of the
device-resident operand, and the byte size and two dimensions of that operand and of the GPU-supplied input at
20 bits each. This 204-bit layout needs no parsing, fits one 256-Byte CXL 3.1 flit". The split of the 20-bit
header (three 4-bit codes and 8 reserved bits) and the code values are this project's choice, documented with
every bit position in ``docs/ndp_descriptor.md``.

The wire header carries *raw* 4-bit codes, not enum-typed fields: a descriptor comes from the GPU and may hold
any code, and an enum-typed field cannot represent an unknown code at all (``Layout.const``/``from_bits`` raise
``ValueError``), so the decoder could not be tested against malformed input. :class:`DescType`, :class:`DescOp`
and :class:`DType` define what the codes mean; the decoded command (:func:`command_layout`), which only ever
holds known codes, is enum-typed.

Shape conventions (``dim0`` = rows, ``dim1`` = columns, row-major; ``bytes = dim0 * dim1 * element size``):

========  ==================  ===========================  ====================  ===========================
Type/OP   input (GPU)         operand (device, base_addr)  shape rule            result
========  ==================  ===========================  ====================  ===========================
LOAD      unused (ignored)    R x C                        --                    R x C (the operand itself)
STORE     R x C (the data)    R x C (destination)          input == operand      nothing
GEMV      x: 1 x K            A: K x N                     in.dim0 == 1,         y = x A: 1 x N
                                                           in.dim1 == op.dim0
GEMM      X: B x K            A: K x N                     in.dim1 == op.dim0,   Y = X A: B x N
                                                           B <= max_batch
SOFTMAX   P: R x L (scores)   unused (ignored)             --                    R x L values exp(p - m_r),
                                                                                 then R anchors (m_r, s_r)
========  ==================  ===========================  ====================  ===========================

SOFTMAX is FlashAttention's partial softmax over one device's share of the sequence (PLoRA V-B, "Integral
Execution"): m_r is the row maximum, s_r the FP32 sum of the row's exponentials; the anchors follow the R x L
values as 3 FP16 slots per row (m_r, then the low and high halves of s_r's binary32 bits), so the result has
R * (L + 3) elements. The GPU merges the devices' partial outputs with the anchors.

Header flags (``header.flags``, READ_COMPUTE only, so a device keeps intermediates off the link -- PLoRA V-B).
State that survives a descriptor (the kept result, the FP32 partial) belongs to the *owner* of the descriptor
that made it (the requester queue, carried beside the descriptor on the core's ``desc`` stream):

* ``KEEP`` (bit 0): the result stays in the owner's state slot (FP16) and is not returned; a SOFTMAX still
  returns its anchors (R x 3 elements), keeping the R x L values.
* ``CHAIN`` (bit 1): the input is not sent by the GPU; it is the owner's kept result, whose shape must equal
  the input shape (e.g. LoRA E3: ``m = xA`` KEEP, then ``y = mB`` CHAIN, possibly several CHAINs over column
  panels of B; attention: scores KEEP, SOFTMAX CHAIN KEEP, context CHAIN).
* ``ACC`` (bit 2): the result is added (in the accumulator format) to the owner's FP32 partial of the same
  shape before it is rounded, kept or returned (K-tiled GEMV/GEMM: several descriptors accumulate on the
  device). TRANS only.
* ``PARTIAL`` (bit 3): the result (after ACC) stays in the owner's partial slot in the accumulator format and
  is not returned. TRANS only; not with KEEP.
* ``TRANS`` (bit 4): the operand A (K x N) is stored k-major: for each group of ``acc_columns`` columns, for
  each block of ``lanes`` rows, for each column of the group, the block's rows contiguous. The GEMV-PE dataflow
  (lane = contraction index, a lane-reduction tree at drain) for small N. See ``docs/ndp_descriptor.md``.
* ``GROUP`` (bit 5; GEMM and SOFTMAX of a core with ``config.group_lanes`` = W > 0, never with TRANS, ACC or
  PARTIAL): rows of W elements, packed g = lanes / W to a beat (the input, the result and the kept result:
  ``R W / lanes`` beats; R a multiple of g). GEMM: input X is R x W, operand A is W x lanes (row-major), the
  result Y is R x W with ``Y[r, j] = sum_k X[r, k] A[k, s W + j]``, s = r mod g: row r of a beat multiplies
  the operand's segment s (the row dataflow with a per-segment broadcast, ``hdl.ndp.pe_array.PEMode.ROW_GROUP``).
  SOFTMAX: R rows of W (the partial softmax of each, R anchors). Decode attention of g KV heads of head dim W in
  one pass (docs/ndp_core.md, "Grouped attention"). Shapes otherwise: SHAPE_MISMATCH.
* ``NARROW`` (bit 6; with GROUP, on a core with ``config.group_narrow``): the same with W / 2 in place of W
  (segments of W / 2, ``2 lanes / W`` to a beat): short KV shares as tiles of W / 2 tokens of twice the heads.

Without the state a CHAIN or ACC needs, the descriptor completes with NO_CHAIN_INPUT, or FOREIGN_STATE if
the owner has no state at all while another owner does: nothing is read either way.

Error codes are checked in the order of their values (the lowest failing check is reported); see
:class:`ErrorCode`. ``firmware.ndp.descriptor.Descriptor.validate`` is the software mirror.
"""

from amaranth.lib import data, enum

__all__ = [
    "CODE_BITS", "FIELD_BITS", "ADDR_BITS", "HEADER_BITS", "DESCRIPTOR_BITS", "FLIT_BYTES", "SEQ_BITS",
    "DescType", "DescOp", "DType", "ELEMENT_BYTES", "ErrorCode", "FLAG_KEEP", "FLAG_CHAIN", "FLAG_ACC",
    "FLAG_PARTIAL", "FLAG_TRANS", "FLAG_GROUP", "FLAG_NARROW", "FLAG_BITS", "OWNER_BITS", "ANCHOR_ELEMS", "DECODER_CODES", "CONTROL_CODES",
    "REQUEST_LAYOUT",
    "HEADER_LAYOUT", "TENSOR_LAYOUT", "DESCRIPTOR_LAYOUT", "command_layout",
]

CODE_BITS = 4          # type, op and dtype codes: 3 x 4 bits of the 20-bit header (project choice)
FIELD_BITS = 20        # byte size and each dimension (PLoRA IV-C: "at 20 bits each")
ADDR_BITS = 64         # base address of the device-resident operand (PLoRA IV-C: "64-bit base address")
HEADER_BITS = 20       # Type + OP + data type (PLoRA IV-C: "into 20 bits")
DESCRIPTOR_BITS = 204  # PLoRA IV-C: "This 204-bit layout"
FLIT_BYTES = 256       # PLoRA IV-C: "fits one 256-Byte CXL 3.1 flit"
SEQ_BITS = 16          # decoder sequence number (descriptors accepted, modulo 2**16): project choice
FLAG_BITS = 7          # header.flags: KEEP, CHAIN, ACC, PARTIAL, TRANS, GROUP, NARROW (project choice, the header's
                       # spare bits: 20 - 3 x 4 code bits = 8)
FLAG_KEEP = 1          # result stays in the owner's state slot (not returned; SOFTMAX still returns its anchors)
FLAG_CHAIN = 2         # input = the owner's KEPT result, not GPU data
FLAG_ACC = 4           # result += the owner's partial (accumulator format) before rounding / keeping / returning
FLAG_PARTIAL = 8       # result (after ACC) kept as the owner's partial in the accumulator format, not returned
FLAG_TRANS = 16        # operand stored k-major in blocks of `lanes` rows: GEMV-PE dataflow (lane = k)
FLAG_GROUP = 32        # rows of config.group_lanes packed to beats; GEMM: each beat segment its own input row (issue 29)
FLAG_NARROW = 64       # with GROUP (config.group_narrow): segments of group_lanes / 2 instead of group_lanes
OWNER_BITS = 32        # owner of a descriptor (CXL front end: PASID << 8 | queue; project choice)
ANCHOR_ELEMS = 3       # SOFTMAX anchor slots per row: max (FP16), sum (FP32 as two FP16 slots, low half first)


class DescType(enum.Enum, shape=CODE_BITS):
    """Descriptor type (PLoRA IV-C: "Type (load, store, read-compute)"). Code 0 is never valid, so an all-zero
    (never written) flit is rejected with UNKNOWN_TYPE."""
    NONE = 0
    LOAD = 1           # return the device-resident operand to the GPU
    STORE = 2          # write the GPU-supplied input to the device at base_addr
    READ_COMPUTE = 3   # compute OP on the input and the device-resident operand, return only the result


class DescOp(enum.Enum, shape=CODE_BITS):
    """Operation of a READ_COMPUTE descriptor (PLoRA IV-C: "OP (GEMM, GEMV, Softmax)"). LOAD and STORE must
    carry NONE."""
    NONE = 0
    GEMV = 1
    GEMM = 2
    SOFTMAX = 3


class DType(enum.Enum, shape=CODE_BITS):
    """Element data type (PLoRA IV-C: "data type"). The core's MACs are FP16 (PLoRA: "1024 FP16
    multiply-add units"), so only FP16 is accepted; FP32 is a reserved code rejected with UNKNOWN_DTYPE."""
    NONE = 0
    FP16 = 1
    FP32 = 2


#: Bytes per element of each data type.
ELEMENT_BYTES = {DType.FP16: 2, DType.FP32: 4}


class ErrorCode(enum.Enum, shape=5):
    """Completion status of one descriptor. **Precedence = value order**: when several checks fail, the one
    with the lowest value is reported (the decoder's priority encoder and ``Descriptor.validate`` agree).
    "has input" = STORE or READ_COMPUTE (a LOAD's input fields are ignored; a CHAIN input is described and
    checked like a GPU input, only its source differs); "has operand" = everything but SOFTMAX (whose operand
    fields are ignored).
    Codes 1..14 come from the decoder; NO_CHAIN_INPUT and FOREIGN_STATE from the control unit's state check,
    after the decoder's checks; WINDOW_VIOLATION from the CXL front end (the core never sees the descriptor)."""
    OK = 0
    UNKNOWN_TYPE = 1       # type not LOAD/STORE/READ_COMPUTE
    UNKNOWN_OP = 2         # READ_COMPUTE with op not GEMV/GEMM/SOFTMAX, or LOAD/STORE with op != NONE
    UNKNOWN_DTYPE = 3      # dtype not supported by the core (anything but FP16)
    ZERO_DIMENSION = 4     # (has operand) an operand dim is 0, or (has input) an input dim is 0
    SIZE_MISMATCH = 5      # (has operand) operand bytes != dim0*dim1*element size, or the same for the input
    OPERAND_TOO_LARGE = 6  # (has operand) operand bytes > dram_buffer_bytes
    INPUT_TOO_LARGE = 7    # (has input) input bytes > input_buffer_bytes
    ADDRESS_OVERFLOW = 8   # (has operand) base_addr + operand bytes > device_bytes (covers wrapping past 2**64)
    SHAPE_MISMATCH = 9     # input/operand dims inconsistent for the type/OP (module docstring table; GROUP)
    BATCH_TOO_LARGE = 10   # GEMM with input dim0 (batch) > max_batch
    OUTPUT_TOO_LARGE = 11  # result elements * element size > output_buffer_bytes
    MISALIGNED = 12        # (has operand) base_addr not a multiple of align_bytes
    NOT_MULTIPLE = 13      # GEMV/GEMM: N (TRANS: K) not a multiple of lanes nor lanes/2 (then K, resp. N, even);
                           # SOFTMAX L not a multiple of lanes; STORE bytes not a multiple of align_bytes
    BAD_FLAGS = 14         # a flag on LOAD/STORE; ACC/PARTIAL/TRANS on SOFTMAX; ACC/PARTIAL without TRANS;
                           # KEEP with PARTIAL; GROUP on GEMV, with TRANS/ACC/PARTIAL or without group_lanes;
                           # NARROW without GROUP or without config.group_narrow
    NO_CHAIN_INPUT = 15    # (control unit) CHAIN / ACC without the owner's kept result / partial of that shape
    WINDOW_VIOLATION = 16  # (CXL front end) operand lines outside the queue's window; never reaches the core
    FOREIGN_STATE = 17     # (control unit) CHAIN / ACC from an owner with no state while another owner has state


#: The codes the core's control unit reports after the decoder accepted a descriptor.
CONTROL_CODES = (ErrorCode.NO_CHAIN_INPUT, ErrorCode.FOREIGN_STATE)
#: The codes the decoder can report.
DECODER_CODES = tuple(c for c in ErrorCode if c.value and c.value < ErrorCode.NO_CHAIN_INPUT.value)


#: Header: type, op, dtype codes from the LSB up, then reserved bits (write 0; ignored by the decoder).
HEADER_LAYOUT = data.StructLayout({
    "type": CODE_BITS,     # DescType code
    "op": CODE_BITS,       # DescOp code
    "dtype": CODE_BITS,    # DType code
    "flags": FLAG_BITS,    # FLAG_KEEP | FLAG_CHAIN | FLAG_ACC | FLAG_PARTIAL | FLAG_TRANS
    "reserved": HEADER_BITS - 3 * CODE_BITS - FLAG_BITS,
})

#: A 2-D tensor: byte size and two dimensions at 20 bits each (PLoRA IV-C).
TENSOR_LAYOUT = data.StructLayout({
    "bytes": FIELD_BITS,
    "dim0": FIELD_BITS,    # rows
    "dim1": FIELD_BITS,    # columns
})

#: The 204-bit descriptor, fields from the LSB up; bit i of the descriptor is bit i % 8 of flit byte i // 8.
DESCRIPTOR_LAYOUT = data.StructLayout({
    "header": HEADER_LAYOUT,
    "base_addr": ADDR_BITS,
    "operand": TENSOR_LAYOUT,   # device-resident operand at base_addr
    "input": TENSOR_LAYOUT,     # GPU-supplied input
})

#: The core's ``desc`` stream payload: the descriptor (bits 0..203, so a bare ``Descriptor.encode()`` is a
#: request of owner 0) and the owner the state it keeps belongs to.
REQUEST_LAYOUT = data.StructLayout({"desc": DESCRIPTOR_LAYOUT, "owner": OWNER_BITS})

assert HEADER_LAYOUT.size == HEADER_BITS
assert DESCRIPTOR_LAYOUT.size == DESCRIPTOR_BITS <= 8 * FLIT_BYTES


def command_layout(config) -> data.StructLayout:
    """One decoded command / completion on the decoder's output, for an :class:`NDPConfig` ``config``.

    ``status`` OK: every field holds the decoded descriptor; element counts are ``bytes / element size``
    (``input_elems`` and the input dims are 0 for LOAD, the operand fields 0 for SOFTMAX, ``output_elems`` 0
    for STORE; ``input_elems`` of a CHAIN descriptor is the number of kept elements it consumes). Any other
    status: only ``status``, ``seq`` and ``owner`` are set, every other field is 0 -- a rejected descriptor
    never reaches the memory.
    """
    elem_bits = FIELD_BITS                                          # bytes / element size < 2**20
    return data.StructLayout({
        "status": ErrorCode,
        "seq": SEQ_BITS,              # index of the descriptor (order of arrival, modulo 2**SEQ_BITS)
        "owner": OWNER_BITS,          # owner of the state the descriptor keeps or uses
        "type": DescType,
        "op": DescOp,
        "dtype": DType,
        "keep": 1,
        "chain": 1,
        "acc": 1,
        "partial": 1,
        "trans": 1,
        "group": 1,
        "narrow": 1,
        "base_addr": ADDR_BITS,
        "operand_dim0": FIELD_BITS,
        "operand_dim1": FIELD_BITS,
        "input_dim0": FIELD_BITS,
        "input_dim1": FIELD_BITS,
        "operand_elems": elem_bits,
        "input_elems": elem_bits,
        "output_elems": elem_bits + 1,  # SOFTMAX R x (L + 3) may exceed 2**20 elements
        "input_beats": elem_bits,       # x beats of the input (rows padded to whole beats; STORE: bytes / beat)
        "ret_elems": elem_bits + 1,     # elements returned on y (0 for KEEP / PARTIAL results and STORE)
    })
