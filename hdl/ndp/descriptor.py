"""The PLoRA read-compute descriptor (204 bits, one 256-byte CXL 3.1 flit) and the decoder's command/status.

Source: /work/shared/papers/plora.txt, Section IV-C (line ~90): "a request packs Type (load, store,
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

Header flags (``header.flags``, READ_COMPUTE only, so a device keeps intermediates off the link -- PLoRA V-B):

* ``KEEP`` (bit 0): the result stays in the output buffer for the next descriptor and is not returned; a
  SOFTMAX still returns its anchors (R x 3 elements), keeping the R x L values.
* ``CHAIN`` (bit 1): the input is not sent by the GPU; it is the first ``input elements`` of the result the
  previous descriptor KEPT (e.g. LoRA E3: ``m = xA`` KEEP, then ``y = mB`` CHAIN; attention: scores KEEP,
  SOFTMAX CHAIN KEEP, context CHAIN). Without such a result the descriptor completes with NO_CHAIN_INPUT.

Error codes are checked in the order of their values (the lowest failing check is reported); see
:class:`ErrorCode`. ``firmware.ndp.descriptor.Descriptor.validate`` is the software mirror.
"""

from amaranth.lib import data, enum

__all__ = [
    "CODE_BITS", "FIELD_BITS", "ADDR_BITS", "HEADER_BITS", "DESCRIPTOR_BITS", "FLIT_BYTES", "SEQ_BITS",
    "DescType", "DescOp", "DType", "ELEMENT_BYTES", "ErrorCode", "FLAG_KEEP", "FLAG_CHAIN", "FLAG_BITS",
    "ANCHOR_ELEMS", "DECODER_CODES",
    "HEADER_LAYOUT", "TENSOR_LAYOUT", "DESCRIPTOR_LAYOUT", "command_layout",
]

CODE_BITS = 4          # type, op and dtype codes: 3 x 4 bits of the 20-bit header (project choice)
FIELD_BITS = 20        # byte size and each dimension (PLoRA IV-C: "at 20 bits each")
ADDR_BITS = 64         # base address of the device-resident operand (PLoRA IV-C: "64-bit base address")
HEADER_BITS = 20       # Type + OP + data type (PLoRA IV-C: "into 20 bits")
DESCRIPTOR_BITS = 204  # PLoRA IV-C: "This 204-bit layout"
FLIT_BYTES = 256       # PLoRA IV-C: "fits one 256-Byte CXL 3.1 flit"
SEQ_BITS = 16          # decoder sequence number (descriptors accepted, modulo 2**16): project choice
FLAG_BITS = 2          # header.flags: KEEP, CHAIN (project choice, from the header's spare bits)
FLAG_KEEP = 1          # result stays in the output buffer (not returned; SOFTMAX still returns its anchors)
FLAG_CHAIN = 2         # input = the previous KEPT result, not GPU data
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
    """Element data type (PLoRA IV-C: "data type"). The core's MACs are FP16 (PLoRA line ~177: "1024 FP16
    multiply-add units"), so only FP16 is accepted; FP32 is a reserved code rejected with UNKNOWN_DTYPE."""
    NONE = 0
    FP16 = 1
    FP32 = 2


#: Bytes per element of each data type.
ELEMENT_BYTES = {DType.FP16: 2, DType.FP32: 4}


class ErrorCode(enum.Enum, shape=4):
    """Completion status of one descriptor. **Precedence = value order**: when several checks fail, the one
    with the lowest value is reported (the decoder's priority encoder and ``Descriptor.validate`` agree).
    "has input" = STORE or READ_COMPUTE (a LOAD's input fields are ignored; a CHAIN input is described and
    checked like a GPU input, only its source differs); "has operand" = everything but SOFTMAX (whose operand
    fields are ignored).
    Codes 1..14 come from the decoder; NO_CHAIN_INPUT from the control unit, after the decoder's checks."""
    OK = 0
    UNKNOWN_TYPE = 1       # type not LOAD/STORE/READ_COMPUTE
    UNKNOWN_OP = 2         # READ_COMPUTE with op not GEMV/GEMM/SOFTMAX, or LOAD/STORE with op != NONE
    UNKNOWN_DTYPE = 3      # dtype not supported by the core (anything but FP16)
    ZERO_DIMENSION = 4     # (has operand) an operand dim is 0, or (has input) an input dim is 0
    SIZE_MISMATCH = 5      # (has operand) operand bytes != dim0*dim1*element size, or the same for the input
    OPERAND_TOO_LARGE = 6  # (has operand) operand bytes > dram_buffer_bytes
    INPUT_TOO_LARGE = 7    # (has input) input bytes > input_buffer_bytes
    ADDRESS_OVERFLOW = 8   # (has operand) base_addr + operand bytes > device_bytes (covers wrapping past 2**64)
    SHAPE_MISMATCH = 9     # input/operand dims inconsistent for the type/OP (module docstring table)
    BATCH_TOO_LARGE = 10   # GEMM with input dim0 (batch) > max_batch
    OUTPUT_TOO_LARGE = 11  # result elements * element size > output_buffer_bytes
    MISALIGNED = 12        # (has operand) base_addr not a multiple of align_bytes
    NOT_MULTIPLE = 13      # GEMV/GEMM operand dims, or SOFTMAX L, not multiples of lanes; STORE bytes not a
                           # multiple of align_bytes
    BAD_FLAGS = 14         # KEEP or CHAIN on a LOAD or STORE
    NO_CHAIN_INPUT = 15    # (control unit) CHAIN, but the previous descriptor KEPT fewer than input elements


#: The codes the decoder can report (NO_CHAIN_INPUT is the control unit's).
DECODER_CODES = tuple(c for c in ErrorCode if c not in (ErrorCode.OK, ErrorCode.NO_CHAIN_INPUT))


#: Header: type, op, dtype codes from the LSB up, then reserved bits (write 0; ignored by the decoder).
HEADER_LAYOUT = data.StructLayout({
    "type": CODE_BITS,     # DescType code
    "op": CODE_BITS,       # DescOp code
    "dtype": CODE_BITS,    # DType code
    "flags": FLAG_BITS,    # FLAG_KEEP | FLAG_CHAIN
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

assert HEADER_LAYOUT.size == HEADER_BITS
assert DESCRIPTOR_LAYOUT.size == DESCRIPTOR_BITS <= 8 * FLIT_BYTES


def command_layout(config) -> data.StructLayout:
    """One decoded command / completion on the decoder's output, for an :class:`NDPConfig` ``config``.

    ``status`` OK: every field holds the decoded descriptor; element counts are ``bytes / element size``
    (``input_elems`` and the input dims are 0 for LOAD, the operand fields 0 for SOFTMAX, ``output_elems`` 0
    for STORE; ``input_elems`` of a CHAIN descriptor is the number of kept elements it consumes). Any other
    status: only
    ``status`` and ``seq`` are set, every other field is 0 -- the control unit forwards OK commands only, and
    a rejected descriptor never reaches the DRAM controller.
    """
    elem_bits = FIELD_BITS                                          # bytes / element size < 2**20
    out_bits = max(1, (config.output_buffer_bytes // min(ELEMENT_BYTES.values())).bit_length())
    return data.StructLayout({
        "status": ErrorCode,
        "seq": SEQ_BITS,              # index of the descriptor (order of arrival, modulo 2**SEQ_BITS)
        "type": DescType,
        "op": DescOp,
        "dtype": DType,
        "keep": 1,
        "chain": 1,
        "base_addr": ADDR_BITS,
        "operand_dim0": FIELD_BITS,
        "operand_dim1": FIELD_BITS,
        "input_dim0": FIELD_BITS,
        "input_dim1": FIELD_BITS,
        "operand_elems": elem_bits,
        "input_elems": elem_bits,
        "output_elems": out_bits,
    })
