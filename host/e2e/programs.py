"""Descriptor programs of the end-to-end run: the LoRA strategies and the attention share, on any adapted matrix.

The firmware kernels (:mod:`firmware.ndp.kernels`) do the work: the layouts decide the tiles (LoRA A's K-tiles in
the TRANS layout of the GEMV PEs, B's column panels, the KV share's token tiles) and
:func:`~firmware.ndp.kernels.lora_e4`, :func:`~firmware.ndp.kernels.lora_e3`,
:func:`~firmware.ndp.kernels.lora_e2_loads` and :func:`~firmware.ndp.kernels.attention_integral` build the
programs (K-tiles accumulating on the device with PARTIAL / ACC, E3's last tile KEEP then one CHAIN per panel).

The FFN matrices are rectangular (``A: d_in x r``, ``B: r x d_out`` with ``d_in != d_out``); the firmware's
``lora_layout`` / ``lora_e3`` / ``lora_e2_loads`` take ``d_in = d_out = d``. :func:`lora_layout` here builds the
same layout dict for two widths (A's K-tiles from ``k_tiles(d_in, r)``, B's panels from ``n_panels(r, d_out)``),
which :func:`~firmware.ndp.kernels.lora_e4` takes as it is; :func:`lora_e2` runs the firmware's E2 on the A part
and the B part of the layout; :func:`lora_e3` builds the firmware's E3 program (the same descriptors, the same
batch chunks) for ``d_out != d_in``. (Wanted in firmware/ndp/kernels.py: a ``d_out`` for the LoRA layout and
kernels; then these defer entirely.)
"""

import numpy as np

from firmware.ndp import kernels as fw
from firmware.ndp.descriptor import gemv, gemm
from hdl.ndp.descriptor import ErrorCode

__all__ = ["lora_layout", "lora_tensors", "kv_layout", "kv_tensors", "lora_e2", "lora_e3", "lora_e4",
           "attention", "STRATEGY_NAMES"]

STRATEGY_NAMES = ("E1", "E2", "E3", "E4")


def lora_layout(d_in, d_out, r, *, config, base=0) -> dict:
    """Regions of an adapter ``A (d_in x r)``, ``B (r x d_out)``: the firmware's layout dict
    (:func:`firmware.ndp.kernels.lora_layout`) with ``"d"`` = ``d_in`` and ``"d_out"``."""
    if d_in == d_out:
        lay = fw.lora_layout(d_in, r, config=config, base=base)
        lay["d_out"] = d_out
        return lay
    kt, npn = fw.k_tiles(d_in, r, config), fw.n_panels(r, d_out, config)
    addr, a, b = base, [], []
    for k0, k1 in kt:
        a.append((addr, k0, k1))
        addr += fw.region_bytes((k1 - k0) * r, config)
    for n0, n1 in npn:
        b.append((addr, n0, n1))
        addr += fw.region_bytes(r * (n1 - n0), config)
    if addr > config.device_bytes:
        raise ValueError(f"layout needs bytes up to {addr}, beyond config.device_bytes ({config.device_bytes})")
    return {"d": d_in, "d_out": d_out, "r": r, "a": a, "b": b, "end": addr}


def lora_tensors(a_bits, b_bits, layout, *, config, with_b=True) -> list:
    """``[(address, bits)]`` of the adapter as the layout stores it (A's K-tiles in the TRANS layout, B's
    panels row-major): what :func:`firmware.ndp.kernels.lora_store` writes, for a preload over CXL.mem."""
    out = [(addr, fw.trans_layout(a_bits[k0:k1], config)) for addr, k0, k1 in layout["a"]]
    if with_b:
        out += [(addr, np.ascontiguousarray(b_bits[:, n0:n1])) for addr, n0, n1 in layout["b"]]
    return out


def kv_layout(d, l, *, config, base=0) -> dict:
    """Regions of one head's KV share of ``l`` tokens (:func:`firmware.ndp.kernels.kv_layout`, one query row)."""
    return fw.kv_layout(d, l, config=config, rows=1, base=base)


def kv_tensors(k_bits, v_bits, layout, *, config) -> list:
    """``[(address, bits)]`` of the share as :func:`firmware.ndp.kernels.kv_store` writes it (K^T tiles, V
    tiles in the TRANS layout)."""
    out = []
    for kt_addr, v_addr, t0, t1 in layout["tiles"]:
        out += [(kt_addr, np.ascontiguousarray(k_bits[t0:t1].T)), (v_addr, fw.trans_layout(v_bits[t0:t1], config))]
    return out


def lora_e2(layout, *, config) -> fw.Kernel:
    """E2: LOAD A (d_in x r) and B (r x d_out) for the GPU. ``results`` -> (A, B) uint16."""
    if layout["d"] == layout["d_out"]:
        return fw.lora_e2_loads(layout, config=config)
    la = {"d": layout["d"], "r": layout["r"], "a": layout["a"], "b": []}
    lb = {"d": layout["d_out"], "r": layout["r"], "a": [], "b": layout["b"]}
    ka, kb = fw.lora_e2_loads(la, config=config), fw.lora_e2_loads(lb, config=config)
    na = len(ka.program)

    def assemble(res):
        return ka._assemble(res[:na])[0], kb._assemble(res[na:])[1]
    return fw.Kernel("lora_e2_loads", ka.program + kb.program,
                     {"d_in": layout["d"], "d_out": layout["d_out"], "r": layout["r"], "a_loads": na,
                      "b_loads": len(kb.program)}, assemble)


def _mm(addr, b, k, n, **flags):
    return gemv(addr, k, n, **flags) if b == 1 else gemm(addr, b, k, n, **flags)


def _a_tiles(layout, b, *, last_keep):
    r, tiles = layout["r"], layout["a"]
    return [_mm(addr, b, k1 - k0, r, trans=True, acc=i > 0, partial=i < len(tiles) - 1,
                keep=last_keep and i == len(tiles) - 1) for i, (addr, k0, k1) in enumerate(tiles)]


def lora_e3(x, layout, *, config) -> fw.Kernel:
    """E3: ``y = (x A) B`` on the device, x (batch, d_in). ``results`` -> y uint16 (batch, d_out)."""
    xs = np.atleast_2d(np.asarray(x, np.uint16))
    if layout["d"] == layout["d_out"]:
        return fw.lora_e3(xs, layout, config=config)
    d_in, d_out, r = layout["d"], layout["d_out"], layout["r"]
    if xs.ndim != 2 or xs.shape[1] != d_in:
        raise ValueError(f"x must be (batch, d_in) with d_in = {d_in}, got shape {xs.shape}")
    total = xs.shape[0]

    def steps(b):
        return _a_tiles(layout, b, last_keep=True) + [_mm(addr, b, r, n1 - n0, chain=True)
                                                       for addr, n0, n1 in layout["b"]]
    per = 0
    for b in range(min(total, config.max_batch), 0, -1):
        if all(s.validate(config) == ErrorCode.OK for s in steps(b)):
            per = b
            break
    if per < 1:
        raise ValueError(f"lora_e3: one row does not fit config {config.name!r} (d_in={d_in}, d_out={d_out}, "
                         f"r={r}): statuses {[s.validate(config).name for s in steps(1)]}")
    nt = len(layout["a"])
    program = []
    for r0 in range(0, total, per):
        n = min(per, total - r0)
        descs = steps(n)
        program += [(d, xs[r0:r0 + n, k0:k1].copy()) for d, (_, k0, k1) in zip(descs[:nt], layout["a"])]
        program += [(d, None) for d in descs[nt:]]

    def assemble(res):
        y = np.zeros((total, d_out), np.uint16)
        i, r0 = 0, 0
        while r0 < total:
            n = min(per, total - r0)
            i += nt
            for _, n0, n1 in layout["b"]:
                y[r0:r0 + n, n0:n1] = res[i].reshape(n, n1 - n0)
                i += 1
            r0 += n
        return y
    return fw.Kernel("lora_e3", program, {"d_in": d_in, "d_out": d_out, "r": r, "batch": total, "chunk": per,
                                          "tiles": nt, "panels": len(layout["b"])}, assemble)


def lora_e4(x, layout, *, config) -> fw.Kernel:
    """E4: ``m = x A`` on the device (the firmware kernel). ``results`` -> m uint16 (batch, r)."""
    return fw.lora_e4(np.atleast_2d(np.asarray(x, np.uint16)), layout, config=config)


def attention(q_scaled, layout, *, config) -> fw.Kernel:
    """One device's share of one head's decode attention (the firmware kernel): ``results`` -> a list of
    ``(o, m, sum)`` per token tile."""
    return fw.attention_integral(q_scaled, layout, config=config)
