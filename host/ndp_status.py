"""What a completion status means for *this* descriptor: the field, its value and the limit it broke.

The core reports a 5-bit status (``hdl.ndp.descriptor.ErrorCode``; WINDOW_VIOLATION comes from the front end);
:func:`explain` turns ``(status, descriptor, config)`` into a sentence naming the buffer or field and the limit,
e.g. ``OPERAND_TOO_LARGE: the operand (688 x 16 FP16 = 22016 bytes) exceeds the DRAM buffer
(config.dram_buffer_bytes = 4096 bytes of NDP config 'tiny')``. The checks follow
``firmware.ndp.descriptor.Descriptor.validate`` (the decoder's order); the wording is the host's.
"""

from hdl.ndp.descriptor import ErrorCode, DescType, DescOp, ELEMENT_BYTES, FIELD_BITS

__all__ = ["explain", "status_text"]


def status_text(status) -> str:
    from sim.golden.cxl_device import status_name
    return status_name(int(status.value if isinstance(status, ErrorCode) else status))


def explain(status, desc, config, *, window=None) -> str:
    """A sentence for ``status`` of ``desc`` (a :class:`firmware.ndp.descriptor.Descriptor`) on ``config``
    (an :class:`hdl.ndp.config.NDPConfig`). ``window``: ``(win_base, win_limit)`` of the queue, for
    WINDOW_VIOLATION."""
    code = int(status.value if isinstance(status, ErrorCode) else status)
    name = status_text(code)
    who = f"NDP config {config.name!r}"
    esize = ELEMENT_BYTES.get(desc.dtype, 2) if not isinstance(desc.dtype, int) else 2
    opd = f"{desc.operand_dim0} x {desc.operand_dim1} FP16 = {desc.operand_bytes} bytes"
    inp = f"{desc.input_dim0} x {desc.input_dim1} FP16 = {desc.input_bytes} bytes"
    try:
        ec = ErrorCode(code)
    except ValueError:
        ec = None
    if ec is None or ec == ErrorCode.WINDOW_VIOLATION:
        if window is not None:
            lo, hi = window
            return (f"{name}: the operand [{desc.base_addr:#x}, {desc.base_addr + desc.operand_bytes:#x}) (whole "
                    f"64-byte lines) is not inside the queue's window [{lo:#x}, {hi:#x})")
        return f"{name}: the operand [{desc.base_addr:#x}, +{desc.operand_bytes}) is outside the queue's window"
    E = ErrorCode
    msg = {
        E.OK: "OK",
        E.UNKNOWN_TYPE: f"type {desc.type!r} is not LOAD, STORE or READ_COMPUTE",
        E.UNKNOWN_OP: f"op {desc.op!r} is not allowed for type {desc.type!r} (READ_COMPUTE: GEMV, GEMM, SOFTMAX; "
                      f"LOAD / STORE: NONE)",
        E.UNKNOWN_DTYPE: f"dtype {desc.dtype!r}: the core computes FP16 only",
        E.ZERO_DIMENSION: f"a dimension is 0 (operand {desc.operand_dim0} x {desc.operand_dim1}, input "
                          f"{desc.input_dim0} x {desc.input_dim1})",
        E.SIZE_MISMATCH: f"byte sizes disagree with the dimensions (operand {desc.operand_bytes} bytes for "
                         f"{desc.operand_dim0} x {desc.operand_dim1}; input {desc.input_bytes} bytes for "
                         f"{desc.input_dim0} x {desc.input_dim1}; {esize} bytes per element)",
        E.OPERAND_TOO_LARGE: f"the operand ({opd}) exceeds the DRAM buffer (config.dram_buffer_bytes = "
                             f"{config.dram_buffer_bytes} bytes of {who}); split it over several descriptors",
        E.INPUT_TOO_LARGE: f"the input ({inp}) exceeds the input buffer (config.input_buffer_bytes = "
                           f"{config.input_buffer_bytes} bytes of {who}); use fewer rows per descriptor",
        E.ADDRESS_OVERFLOW: f"base_addr {desc.base_addr:#x} + operand {desc.operand_bytes} bytes passes the device "
                            f"memory (config.device_bytes = {config.device_bytes:#x})",
        E.SHAPE_MISMATCH: f"input {desc.input_dim0} x {desc.input_dim1} does not fit operand {desc.operand_dim0} x "
                          f"{desc.operand_dim1} for {getattr(desc.op, 'name', desc.op)} (GEMV: input 1 x K with K "
                          f"= operand dim0; GEMM: input B x K; STORE: input dims = operand dims)",
        E.BATCH_TOO_LARGE: f"GEMM batch {desc.input_dim0} exceeds config.max_batch = {config.max_batch} of {who}",
        E.OUTPUT_TOO_LARGE: (f"the result ({desc.output_elems()} FP16 = {2 * desc.output_elems()} bytes) exceeds "
                             f"where it goes: the return ring (config.output_buffer_bytes = "
                             f"{config.output_buffer_bytes} bytes), a kept slot with KEEP (row-padded; "
                             f"config.state_buffer_bytes / state_slots = {config.kept_slot_bytes} bytes), a "
                             f"partial slot with ACC / PARTIAL (config.partial_slot_elems = "
                             f"{config.partial_slot_elems} accumulators), or in the row dataflow N / lanes > "
                             f"config.acc_columns = {config.acc_columns} (N = {desc.operand_dim1}, lanes = "
                             f"{config.lanes}) of {who}; tile it (firmware.ndp.kernels)"),
        E.MISALIGNED: f"base_addr {desc.base_addr:#x} is not a multiple of config.align_bytes = "
                      f"{config.align_bytes}",
        E.NOT_MULTIPLE: (f"GEMV/GEMM: N (TRANS: K) must be a multiple of config.lanes = {config.lanes} or lanes / 2 "
                         f"with K (TRANS: N) even (operand {desc.operand_dim0} x {desc.operand_dim1}); SOFTMAX "
                         f"length ({desc.input_dim1}) a multiple of lanes; a STORE's bytes "
                         f"({desc.operand_bytes}) a multiple of config.align_bytes = {config.align_bytes}"),
        E.BAD_FLAGS: ("flags not allowed here: any flag on LOAD / STORE; ACC, PARTIAL or TRANS on SOFTMAX; ACC or "
                      "PARTIAL without TRANS; KEEP with PARTIAL"),
        E.NO_CHAIN_INPUT: (f"CHAIN / ACC needs the owner's kept result ({desc.input_dim0} x {desc.input_dim1}) or "
                           f"partial of the result's shape, and the owner's state slot holds none of that shape"),
        E.FOREIGN_STATE: ("CHAIN / ACC from an owner (PASID << 8 | queue) without state while another owner holds "
                          "state: a queue cannot read what another queue kept"),
    }[ec]
    return msg if ec == E.OK else f"{name}: {msg}"
