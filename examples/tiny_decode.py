"""A few tokens of the tiny model through the hybrid system on the golden backend (no RTL build), with the
per-step table and the float32 reference check; ``ndpim demo`` is the full run.

    python examples/tiny_decode.py [--tokens 3] [--backend golden|perf|rtl]
"""

import argparse

from host.e2e.run import E2EConfig, run_e2e, reference_check
from host.e2e.demo import step_table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=3)
    ap.add_argument("--backend", default="golden", choices=["golden", "perf", "rtl"])
    args = ap.parse_args(argv)
    cfg = E2EConfig(model="micro", requests=3, long_requests=0, tokens=args.tokens, budget_kb=24)
    run = run_e2e(cfg, args.backend)
    for line in step_table(run.system):
        print(line)
    for rid, toks in run.tokens.items():
        print(f"request {rid}: {toks}")
    if args.backend != "perf":
        chk = reference_check(run)
        print(f"float32 reference: tokens match {chk['tokens_match']}, max logit error {chk['max_rel_err']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
