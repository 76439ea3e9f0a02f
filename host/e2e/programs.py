"""Descriptor programs of the end-to-end run: the LoRA strategies and the attention share, on any adapted matrix.

The firmware kernels (:mod:`firmware.ndp.kernels`) are used where they fit: :func:`firmware.ndp.kernels.lora_e4`
(any ``d_in x r``), :func:`~firmware.ndp.kernels.attention_integral`, and ``lora_e3`` / ``lora_e2_loads`` for
square matrices (Q, K, V, O). The FFN matrices are rectangular (``d_in != d_out``), which the firmware's E3 and
E2 builders do not take (they assume ``A: d x r``, ``B: r x d``); :func:`lora_e3` and :func:`lora_e2` here build
the same programs (GEMM(X, A) KEEP then GEMM(CHAIN, B) per batch chunk; LOADs split by rows to fit the buffers
and the 20-bit field, every chunk aligned) for ``A: d_in x r``, ``B: r x d_out``, validating every descriptor on
the config like the firmware does. (Wanted in firmware/ndp/kernels.py: a ``d_out`` argument; then these defer.)
"""

from math import gcd

import numpy as np

from firmware.ndp import kernels as fw
from firmware.ndp.descriptor import gemv, gemm, load
from hdl.ndp.descriptor import ErrorCode, FIELD_BITS

__all__ = ["lora_e2", "lora_e3", "lora_e4", "attention", "STRATEGY_NAMES"]

STRATEGY_NAMES = ("E1", "E2", "E3", "E4")
_FIELD_MAX = (1 << FIELD_BITS) - 1


def _checked(desc, config, what):
    st = desc.validate(config)
    if st != ErrorCode.OK:
        raise ValueError(f"{what}: descriptor rejected by config {config.name!r} with {st.name}")
    return desc


def _loads(addr, rows, cols, config, name):
    row_bytes = 2 * cols
    lim = min(config.output_buffer_bytes, config.dram_buffer_bytes, _FIELD_MAX)
    step = config.align_bytes // gcd(row_bytes, config.align_bytes)
    per = rows if rows * row_bytes <= lim else (lim // row_bytes) // step * step
    if per < 1:
        raise ValueError(f"{name}: an aligned chunk of {step} rows x {cols} columns exceeds min(output buffer, "
                         f"DRAM buffer, 2**20 - 1) = {lim} bytes")
    out = []
    for r0 in range(0, rows, per):
        n = min(per, rows - r0)
        out.append((_checked(load(addr + r0 * row_bytes, n, cols), config, f"{name} LOAD rows {r0}.."), None))
    return out


def lora_e2(a_addr, b_addr, d_in, d_out, r, *, config) -> fw.Kernel:
    """E2: LOAD A (d_in x r) and B (r x d_out) for the GPU. ``results`` -> (A, B) uint16."""
    if d_in == d_out:
        return fw.lora_e2_loads(a_addr, b_addr, d_in, r, config=config)
    pa = _loads(a_addr, d_in, r, config, "A")
    pb = _loads(b_addr, r, d_out, config, "B")
    na = len(pa)

    def assemble(res):
        return (np.concatenate(res[:na]).reshape(d_in, r), np.concatenate(res[na:]).reshape(r, d_out))
    return fw.Kernel("lora_e2_loads", pa + pb, {"d_in": d_in, "d_out": d_out, "r": r, "a_loads": na,
                                                "b_loads": len(pb)}, assemble)


def _mm(addr, b, k, n, *, keep=False, chain=False):
    return gemv(addr, k, n, keep=keep, chain=chain) if b == 1 else gemm(addr, b, k, n, keep=keep, chain=chain)


def lora_e3(x, a_addr, b_addr, d_in, d_out, r, *, config) -> fw.Kernel:
    """E3: ``y = (x A) B`` on the device, x (batch, d_in). ``results`` -> y uint16 (batch, d_out)."""
    xs = np.atleast_2d(np.asarray(x, np.uint16))
    if d_in == d_out:
        return fw.lora_e3(xs, a_addr, b_addr, d_in, r, config=config)
    total = xs.shape[0]
    for name, v in (("d_in", d_in), ("d_out", d_out), ("r", r)):
        if v % config.lanes:
            raise ValueError(f"{name} ({v}) must be a multiple of config.lanes ({config.lanes})")

    def steps(b):
        return [_mm(a_addr, b, d_in, r, keep=True), _mm(b_addr, b, r, d_out, chain=True)]
    per = 0
    for b in range(min(total, config.max_batch), 0, -1):
        try:
            if all(s.validate(config) == ErrorCode.OK for s in steps(b)):
                per = b
                break
        except ValueError:
            continue
    if per < 1:
        raise ValueError(f"lora_e3: one row does not fit config {config.name!r} (d_in={d_in}, d_out={d_out}, "
                         f"r={r}): statuses {[s.validate(config).name for s in steps(1)]}")
    program = []
    for r0 in range(0, total, per):
        n = min(per, total - r0)
        s1, s2 = steps(n)
        program += [(_checked(s1, config, "lora_e3 x A"), xs[r0:r0 + n].copy()),
                    (_checked(s2, config, "lora_e3 m B"), None)]

    def assemble(res):
        return np.concatenate(res[1::2]).reshape(total, d_out)
    return fw.Kernel("lora_e3", program, {"d_in": d_in, "d_out": d_out, "r": r, "batch": total, "chunk": per},
                     assemble)


def lora_e4(x, a_addr, d_in, r, *, config) -> fw.Kernel:
    """E4: ``m = x A`` on the device (the firmware kernel). ``results`` -> m uint16 (batch, r)."""
    return fw.lora_e4(np.atleast_2d(np.asarray(x, np.uint16)), a_addr, d_in, r, config=config)


def attention(q_scaled, kT_addr, v_addr, d, l, *, config) -> fw.Kernel:
    """One device's share of one head's decode attention (the firmware kernel)."""
    return fw.attention_integral(q_scaled, kT_addr, v_addr, d, l, config=config)
