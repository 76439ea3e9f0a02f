"""``ndpim demo`` and ``ndpim e2e {calibrate,check}`` (plugged into host/cli.py)."""

import argparse
import sys

from host.cli import UsageError, check_run_dir, float_range, int_range, out_dir

__all__ = ["add_parser"]

DEMO_OUT = "build/demo"


def _demo_args(p):
    p.add_argument("--backend", choices=["rtl", "golden", "perf"], default="rtl",
                   help="device fidelity: rtl (the RTL, cycle counts are the run's device timings), golden (golden "
                        "models, timing from the calibrated models), perf (timing only)")
    p.add_argument("--pim-backend", choices=["rtl", "golden", "perf"], default=None,
                   help="the DIMM-PIM rank's backend (default: --backend)")
    p.add_argument("--engine", choices=["verilator", "amaranth"], default="verilator",
                   help="RTL simulator of the rtl backend")
    p.add_argument("--model", choices=["tiny", "micro"], default="tiny",
                   help="tiny: 2 layers, hidden 256, 4 heads of 64, FFN 688, vocabulary 512; micro: 1 layer, "
                        "hidden 128")
    p.add_argument("--requests", type=int_range(1), default=5, help="concurrent requests (each on its own adapter)")
    p.add_argument("--long", type=int_range(0), default=1,
                   help="of which long (decode attention on the DIMM-PIM; 0..--requests)")
    p.add_argument("--tokens", type=int_range(1), default=16, help="output tokens per request")
    p.add_argument("--long-context", type=int_range(1), default=1024, help="prompt tokens of the long requests")
    p.add_argument("--budget-kb", type=float_range(0.0), default=400.0,
                   help="GPU memory for adapter caches and KV duplicates")
    p.add_argument("--short-prompt", type=int_range(1), nargs=2, default=(24, 64), metavar=("MIN", "MAX"),
                   help="prompt lengths of the short requests (1 <= MIN <= MAX)")
    p.add_argument("--pim-bank-groups", type=int, choices=[1, 4], default=4,
                   help="bank groups of the PIM rank (4: 16 banks as the paper's DIMMs; 1: 4 banks, quick)")
    p.add_argument("--ndp-memory", choices=["burst", "lpddr5x"], default="lpddr5x",
                   help="the NDP devices' memory in the RTL: lpddr5x (the default: LPDDR5X-8533 channels with their "
                        "memory controllers and DRAM models; ~2.5 min cold on 2 cores, ~1 min with the builds "
                        "cached) or burst (a fixed-latency memory, quicker to build and simulate)")
    p.add_argument("--ndp-channels", type=int, choices=[1, 2, 4, 8], default=2,
                   help="LPDDR5X channels per NDP device (--ndp-memory lpddr5x)")
    p.add_argument("--seed", type=int_range(0), default=0)
    p.add_argument("--waveform", action=argparse.BooleanOptionalAction, default=True,
                   help="write a waveform of one decode step's NDP wave (default: on)")
    p.add_argument("--waveform-engine", choices=["amaranth", "verilator"], default=None,
                   help="amaranth: VCD from Amaranth's simulator (the default on the burst memory: a traced build "
                        "would compile ~25 s longer); verilator: the rtl run's NDP devices run on a traced Verilator "
                        "build with tracing off, and the waveform's re-run of one wave uses that build (the default "
                        "with --ndp-memory lpddr5x, whose DRAM models run at a few hundred cycles/s under Amaranth)")
    p.add_argument("--waveform-format", choices=["vcd", "fst"], default="vcd")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="rtl: compare logits with the golden run bit for bit, tokens with the float32 reference, "
                        "device cycles with the performance model")
    p.add_argument("--parallel", action=argparse.BooleanOptionalAction, default=True,
                   help="run independent parts in processes of their own (Verilator builds beside the golden run, "
                        "the waveform beside the rtl run; default: on)")
    p.add_argument("--out", default=DEMO_OUT, type=out_dir,
                   help=f"run directory (default {DEMO_OUT}, rewritten by every run; another directory that already "
                        f"holds files needs --force)")
    p.add_argument("--force", action="store_true", help="write into an --out directory that already holds files")


def add_parser(sub):
    p = sub.add_parser("demo", help="the tiny LLM decoding through the RTL of both devices (the main job)",
                       description="Serve a tiny LLaMA-style model on the hybrid PLoRA + L3 system: GPU layers in "
                                   "numpy, LoRA adapters and a token-interleaved KV share on CXL NDP devices, "
                                   "long-context decode attention on a DIMM-PIM rank; prints a per-step table and a "
                                   "summary, writes the run directory and a waveform.")
    _demo_args(p)
    p.set_defaults(func=_demo)

    p = sub.add_parser("e2e", help="end-to-end run tools: calibrate the timing models on the RTL")
    esub = p.add_subparsers(dest="e2e_command", required=True)
    c = esub.add_parser("calibrate", help="measure the NDP device and PIM rank timing models on the RTL "
                                          "(writes data/e2e_ndp_calibration.json, data/e2e_pim_calibration.json)")
    c.add_argument("--what", choices=["all", "ndp", "pim"], default="all")
    c.add_argument("--waves", type=int_range(1), default=24, help="random NDP waves measured")
    c.add_argument("--seed", type=int_range(0), default=0)
    c.add_argument("--engine", choices=["verilator", "amaranth"], default="verilator")
    c.add_argument("--model", choices=["tiny", "micro"], default="tiny")
    c.add_argument("--long-context", type=int_range(1), default=1024)
    c.add_argument("--tokens", type=int_range(1), default=16)
    c.add_argument("--pim-bank-groups", type=int, choices=[1, 4], default=4)
    c.add_argument("--ndp-memory", choices=["burst", "lpddr5x"], default="burst",
                   help="the NDP device memory to calibrate on (each has its own file)")
    c.add_argument("--ndp-channels", type=int, choices=[1, 2, 4, 8], default=2,
                   help="LPDDR5X channels per NDP device (--ndp-memory lpddr5x)")
    c.set_defaults(func=_calibrate)


def _demo(args):
    if args.long > args.requests:
        raise UsageError(f"argument --long: must be <= --requests ({args.requests}), got {args.long}")
    lo, hi = args.short_prompt
    if lo > hi:
        raise UsageError(f"argument --short-prompt: MIN must be <= MAX, got {lo} {hi}")
    if args.waveform and args.waveform_format == "fst":
        from sim.e2e.waveform import fst_available
        engine = args.waveform_engine or ("verilator" if args.ndp_memory == "lpddr5x" else "amaranth")  # (demo.py)
        if engine == "amaranth":
            raise UsageError("argument --waveform-format: fst needs --waveform-engine verilator (Amaranth's "
                             "simulator writes VCD only; it is the default with --ndp-memory burst)")
        if not fst_available():
            raise UsageError("argument --waveform-format: fst needs the lz4 development headers (lz4.h) for "
                             "Verilator's FST writer, and this machine has none: use vcd")
    check_run_dir(args, default=DEMO_OUT)
    from .demo import demo
    return demo(args)


def _calibrate(args):
    from .calibrate import calibrate_ndp, calibrate_pim_for
    if args.what in ("all", "ndp"):
        calibrate_ndp(seed=args.seed, n=args.waves, engine=args.engine, memory=args.ndp_memory,
                      channels=args.ndp_channels)
    if args.what in ("all", "pim"):
        calibrate_pim_for(args.model, args.long_context, args.tokens, bank_groups=args.pim_bank_groups,
                          engine=args.engine)
    return 0
