"""A waveform from either simulator: an FP16 multiplier's stream run written as VCD by Amaranth's simulator and
by a traced Verilator build (open with ``gtkwave``).

    python examples/waveform.py [--engine amaranth|verilator] [--out build/examples]
"""

import argparse
from pathlib import Path

import numpy as np

from hdl.fp import FPMul, FP16
from sim.e2e.waveform import waveform_backend


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="amaranth", choices=["amaranth", "verilator"])
    ap.add_argument("--out", default="build/examples")
    args = ap.parse_args(argv)
    path = Path(args.out) / f"fp16_mul_{args.engine}.vcd"
    a = np.array([1.5, -2.0, 0.25], np.float16).view(np.uint16).astype(np.int64)
    b = np.array([2.0, 3.0, 8.0], np.float16).view(np.uint16).astype(np.int64)
    run = waveform_backend(args.engine, path).run_streams(FPMul(fmt=FP16), {"i": list(a | (b << 16))},
                                                          {"o": len(a)})
    print("products:", np.array(run.outputs["o"], np.uint16).view(np.float16))
    print(f"wrote {path} ({path.stat().st_size} bytes, {run.cycles} cycles)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
