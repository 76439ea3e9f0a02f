"""Verilog of a top at your own configuration, and its port bit layout.

    python examples/verilog_custom.py [--out build/examples]

The NDP descriptor decoder at a 16-lane, 2-row geometry with a 8 KiB operand buffer (``ndpim verilog --top
ndp_decoder --preset tiny --set lanes=16 --set macs=32 --set dram_buffer_bytes=8192`` does the same).
"""

import argparse
from pathlib import Path

from host.topcfg import configure, describe, port_table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/examples")
    args = ap.parse_args(argv)
    spec, cfg = configure("ndp_decoder", "tiny", [("lanes", "16"), ("macs", "32"), ("dram_buffer_bytes", "8192")])
    print(f"{spec.name}: {describe(cfg)}")
    try:
        configure("ndp_decoder", "tiny", [("lanes", "12")])
    except ValueError as exc:
        print(f"refused: {exc}")
    from sim.backends.verilog import verilog_text
    comp = spec.build(cfg)
    for port, direction, width, flds in port_table(comp):
        print(f"  {port:<6} {direction:<11} {width:>4} bits  " + ", ".join(f"{n}[{lo}:{hi})" for n, lo, hi in flds[:6]))
    path = Path(args.out) / f"{spec.name}_lanes16.v"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(verilog_text(comp, spec.name))
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
