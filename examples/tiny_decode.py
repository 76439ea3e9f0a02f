"""A few tokens of the tiny model through the hybrid system on the golden backend (no RTL build), with the
per-step table and the float32 reference check; ``ndpim demo`` is the full run.

    python examples/tiny_decode.py [--tokens 3] [--backend golden|perf|rtl] [--waveform FILE.vcd|FILE.fst]

``--waveform`` (rtl backend) re-runs one decode step's NDP wave on the traced Verilator build and writes it
(1 ns per device cycle), as ``ndpim demo`` does.
"""

import argparse
import shutil
import tempfile
from pathlib import Path

from host.e2e.run import E2EConfig, run_e2e, reference_check
from host.e2e.demo import step_table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=3)
    ap.add_argument("--backend", default="golden", choices=["golden", "perf", "rtl"])
    ap.add_argument("--waveform", metavar="FILE", default=None,
                    help="rtl backend: write one decode step's NDP wave (.vcd or .fst; 1 ns per cycle)")
    args = ap.parse_args(argv)
    if args.tokens < 1:
        ap.error(f"--tokens must be >= 1, got {args.tokens}")
    if args.waveform is not None:
        from sim.e2e.waveform import WAVEFORM_SUFFIXES
        if args.backend != "rtl":
            ap.error(f"--waveform needs --backend rtl (the {args.backend} backend runs no RTL)")
        fmt = WAVEFORM_SUFFIXES.get(Path(args.waveform).suffix.lower())
        if fmt is None:
            ap.error(f"--waveform: the file name must end in .vcd or .fst, got {args.waveform!r}")
    cfg = E2EConfig(model="micro", requests=3, long_requests=0, tokens=args.tokens, budget_kb=24)
    run = run_e2e(cfg, args.backend)
    for line in step_table(run.system):
        print(line)
    for rid, toks in run.tokens.items():
        print(f"request {rid}: {toks}")
    if args.backend != "perf":
        chk = reference_check(run)
        print(f"float32 reference: tokens match {chk['tokens_match']}, max logit error {chk['max_rel_err']:.1e}")
    if args.waveform is not None:
        from host.e2e.demo import write_waveform
        with tempfile.TemporaryDirectory() as tmp:
            path, what = write_waveform(run.system, Path(tmp), "verilator", fmt)
            if path is None:
                print(f"FAILED: no waveform: {what}")
                return 1
            Path(args.waveform).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), args.waveform)
        print(f"waveform: {args.waveform} ({what})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
