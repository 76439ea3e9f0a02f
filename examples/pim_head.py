"""One DIMM-PIM decode-attention head through the rank PU RTL: the fused kernel (scores in the bank PUs, chunk
softmax and normalization in the rank PU, context, aggregation) on the DDR4 device model, against the golden
model bit for bit and against float64.

    python examples/pim_head.py [--tokens 48] [--engine verilator|amaranth] [--waveform FILE.vcd|FILE.fst]
"""

import argparse

import numpy as np

from sim.golden.attention import prepare_query, reference_attention
from host.e2e.pim import PIMDevice, PIMJob


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48, help="context length L")
    ap.add_argument("--engine", default="verilator", choices=["verilator", "amaranth"])
    ap.add_argument("--waveform", metavar="FILE", default=None,
                    help="write the run's waveform (.vcd, or .fst with Verilator; 1 ns per DDR4 clock cycle)")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.tokens > 64:
        ap.error(f"--tokens must be in 1..64 (the example rank's layout holds 64 tokens per head), got {args.tokens}")
    from sim.e2e.waveform import engine_for
    engine = engine_for(ap, args.engine, args.waveform)
    d = 64
    rng = np.random.default_rng(0)
    K = rng.standard_normal((args.tokens, d)).astype(np.float16).view(np.uint16)
    V = rng.standard_normal((args.tokens, d)).astype(np.float16).view(np.uint16)
    q = rng.standard_normal(d).astype(np.float16).view(np.uint16)
    job = PIMJob(("head",), 0, q, K, V)
    # a rank of 4 x8 chips x 4 banks (head dim 64, the paper's 16 elements per chip), two heads of 64 tokens
    kw = dict(head_dim=d, slots=2, max_tokens=64, bank_groups=1)    # the geometry of the e2e test's rank
    rtl = PIMDevice("rtl", engine=engine, **kw)
    rtl.set_final_kv({0: (K, V)})                  # the DRAM image: this head's K and V
    out = rtl.run([job])
    gold = PIMDevice("golden", **kw)
    gold.perf = None
    g = gold._golden([job])[("head",)]
    ref = reference_attention(q, K, V)
    y = out.outputs[("head",)].view(np.float16).astype(np.float64)
    print(f"L = {args.tokens}: {out.cycles} DDR4 cycles ({out.seconds * 1e6:.2f} us at DDR4-3200)")
    print(f"bit-exact against the golden model: {np.array_equal(out.outputs[('head',)], g)}")
    print(f"max |error| vs float64: {np.abs(y - ref).max():.2e} (output scale {np.abs(ref).max():.2f})")
    if args.waveform is not None:
        print(f"waveform: {args.waveform} (1 ns per DDR4 clock cycle of the simulation)")
    return 0 if np.array_equal(out.outputs[("head",)], g) else 1


if __name__ == "__main__":
    raise SystemExit(main())
