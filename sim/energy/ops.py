"""Per-operation energy of the datapath: stated, sourced figures at one named process (45 nm, 0.9 V).

Source (every figure below): M. Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014,
the table "Rough energy costs for various operations in 45nm 0.9V" (also in Han et al., EIE, ISCA 2016, Table I,
and Sze et al., Proc. IEEE 2017, Fig. 4, which reproduce it):

| operation | energy |
|---|---|
| 16-bit FP add | 0.4 pJ |
| 16-bit FP multiply | 1.1 pJ |
| 32-bit FP add | 0.9 pJ |
| 32-bit FP multiply | 3.7 pJ |
| 8-bit integer add | 0.03 pJ |
| 32-bit integer add | 0.1 pJ |
| 8-bit integer multiply | 0.2 pJ |
| 32-bit integer multiply | 3.1 pJ |
| 64-bit read, 8 KB SRAM | 10 pJ |
| 64-bit read, 32 KB SRAM | 20 pJ |
| 64-bit read, 1 MB SRAM | 100 pJ |

These are the *stated per-op figures* the energy model uses where it does not measure switching from the RTL
(issue 33 item 2 allows either); a unit of ours is charged as the operations it performs, in the formats it
performs them (an FP16 x FP16 product accumulated in FP32 is one 16-bit multiply and one 32-bit add). SRAM
reads between the listed sizes take the next larger size's figure (an upper bound), per 64 bits read.
"""

__all__ = ["PROCESS", "OP_PJ", "SRAM_READ_64B_PJ", "op_pj", "sram_read_pj"]

#: The process node and supply the figures belong to (Horowitz, ISSCC 2014).
PROCESS = "45 nm, 0.9 V (Horowitz, ISSCC 2014)"

#: pJ per operation (module docstring table; Horowitz ISSCC 2014).
OP_PJ = {
    "fp16_add": 0.4,
    "fp16_mul": 1.1,
    "fp32_add": 0.9,
    "fp32_mul": 3.7,
    "int8_add": 0.03,
    "int32_add": 0.1,
    "int8_mul": 0.2,
    "int32_mul": 3.1,
}

#: pJ per 64-bit SRAM read by array size in bytes (Horowitz ISSCC 2014: 8 KB 10 pJ, 32 KB 20 pJ, 1 MB 100 pJ).
SRAM_READ_64B_PJ = ((8 * 1024, 10.0), (32 * 1024, 20.0), (1024 * 1024, 100.0))


def op_pj(name: str) -> float:
    """pJ of one operation ``name`` (a key of :data:`OP_PJ`)."""
    try:
        return OP_PJ[name]
    except KeyError:
        raise ValueError(f"unknown operation {name!r}; allowed: {sorted(OP_PJ)}") from None


def sram_read_pj(bits: int, array_bytes: int) -> float:
    """pJ to read ``bits`` from an SRAM array of ``array_bytes``: per 64 bits, the figure of the smallest listed
    array at least this large. Arrays over 1 MB are outside the source's table (an error)."""
    if bits < 0:
        raise ValueError(f"bits must be >= 0, got {bits}")
    if array_bytes < 1:
        raise ValueError(f"array_bytes must be >= 1, got {array_bytes}")
    for size, pj in SRAM_READ_64B_PJ:
        if array_bytes <= size:
            return pj * bits / 64
    raise ValueError(f"array_bytes {array_bytes} is over the largest sourced SRAM figure (1 MB; "
                     f"Horowitz ISSCC 2014); allowed: 1 .. {SRAM_READ_64B_PJ[-1][0]}")
