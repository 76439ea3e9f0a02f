"""One GEMV through the CXL NDP device: the host driver writes the operand into device memory over CXL.mem,
submits the descriptor on a queue and reads the completion record; the device RTL runs under Verilator.

    python examples/gemv_cxl.py [--engine verilator|amaranth] [--waveform FILE.vcd|FILE.fst]

Prints the result against numpy and the golden device model, and the descriptor's own cycles (issue, start,
completion) from the cycle stamps of the same run.
"""

import argparse

import numpy as np

from firmware.ndp.descriptor import gemv
from host.cxl_driver import Driver
from host.e2e.ndp import e2e_ndp_config, DEPTH
from host.e2e.stamps import run_stamped


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="verilator", choices=["verilator", "amaranth"])
    ap.add_argument("--k", type=int, default=256, help="input length (multiple of 8)")
    ap.add_argument("--n", type=int, default=16, help="output length (multiple of 8)")
    ap.add_argument("--waveform", metavar="FILE", default=None,
                    help="write the run's waveform (.vcd, or .fst with Verilator; 1 ns per device cycle)")
    args = ap.parse_args(argv)
    from sim.e2e.waveform import engine_for
    engine = engine_for(ap, args.engine, args.waveform)
    window = DEPTH * 64 - 0x10000                   # the queue's data window (below)
    for name, v in (("--k", args.k), ("--n", args.n)):
        if v < 8 or v % 8:
            ap.error(f"{name} must be a positive multiple of 8, got {v}")
    if 2 * args.k * args.n > window:
        ap.error(f"the operand ({args.k} x {args.n} FP16 = {2 * args.k * args.n} bytes) must fit the {window}-byte "
                 f"data window: --k x --n <= {window // 2}")

    config = e2e_ndp_config()                       # 8 lanes x 2 PE rows, 32 KiB operand buffer
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((args.k, args.n)) / np.sqrt(args.k)).astype(np.float16)
    x = rng.standard_normal(args.k).astype(np.float16)

    drv = Driver(1, config=config, depth=DEPTH)     # one queue on a 128 KiB device memory
    # queue 0: ring at 0 (4 slots), completions at 32 KiB, data window from 64 KiB to the end
    drv.configure(0, sq_base=0, entries=4, cq_base=0x8000, win_base=0x10000, win_limit=DEPTH * 64)
    drv.store(0x10000, a)                           # the operand, over CXL.mem
    sub = drv.submit(0, gemv(0x10000, args.k, args.n), x)   # input, descriptor, valid word, doorbell
    h = drv.read_completion(0, sub.index)           # waits for the completion, then reads the record

    run = run_stamped(drv, [h], engine=engine)
    rec = run.completion(h)
    y = rec.result_bits(args.n).view(np.float16)
    gold = drv.run("golden").completion(h)
    ref = (x.astype(np.float32) @ a.astype(np.float32))
    if rec.status_name != "OK":
        # the device refused the descriptor (docs/ndp_descriptor.md lists the statuses and the limits): no result
        print(f"FAILED: the device completed the GEMV with status {rec.status_name} (K = {args.k}, N = {args.n}; "
              f"the core's limits are in docs/ndp_descriptor.md); no result to compare")
        return 1
    print(f"status {rec.status_name}; y[:4] = {y[:4]} (numpy float32: {ref[:4].round(3)})")
    print(f"bit-exact against the golden device: {np.array_equal(rec.result_bits(args.n), gold.result_bits(args.n))}")
    s = run.stamps[0]
    print(f"cycles: issue {s.issue}, start {s.start}, completion {s.done}: service {s.service}, "
          f"issue-to-completion {s.latency} (whole run {run.cycles})")
    if args.waveform is not None:
        print(f"waveform: {args.waveform} ({run.cycles} cycles, 1 ns per cycle)")
    return 0 if np.array_equal(rec.result_bits(args.n), gold.result_bits(args.n)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
