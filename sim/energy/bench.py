"""``make bench-energy`` (``ndpim bench energy``): DRAM energy per bit of sequential and random reads on both
memories, from the fast model's command streams, against the outside model; RTL vs fast-model energy.

Writes build/bench/energy.json. Figures (pJ, one channel of the full preset, fr-fcfs, the controller's default
queue; every rank charged background for the whole stream):

* ``dram_<mem>_<pattern>_pj_per_bit`` and its split (``_act_pre``, ``_rd_wr``, ``_ref``, ``_background``
  ``_pj_per_bit``), ``_gbps`` achieved, ``_power_mw`` of the channel, ``_cycles``, ``_acts``, ``_refs``;
* ``dram_<mem>_<pattern>_refresh_due_pj_per_bit``: the same with the REFs due in the stream's time but postponed
  past its end charged (:func:`sim.energy.dram.owed_refresh_pj`; the steady-state figure);
* ``dram_<mem>_<pattern>_energydram_pj_per_bit``, ``_vs_energydram_pct`` (ours - energydram, % of energydram) and
  ``_unexplained_pj`` (the difference less the two documented terms, sim/energy/reference.py: 0 up to rounding);
* ``dram_<mem>_<cmd>_pj`` per rank and command, ``dram_<mem>_act_stby_mw`` / ``_pre_stby_mw`` per rank;
* ``dram_rtl_<tiny preset>_random_*`` (unless ``--no-rtl``): RTL trace vs the fast model's recorded stream on
  the same random reads (Verilator): energies, % difference, and the commands the RTL issued after the fast
  model's last one (a refresh the controller starts in the response tail, outside the model's replay).

NDP / PIM per-kernel energies and the area / power of the paper-geometry designs (issue 33 items 2-4) are not
produced here yet: their keys are absent.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["stream_energy", "main"]

MEMORIES = (("ddr4", "DDR4_3200"), ("lpddr5x", "LPDDR5X_8533"))


def _addresses(amap, pattern, n, seed=1):
    if pattern == "seq":
        return np.arange(n, dtype=np.int64) % amap.bursts
    return np.random.default_rng(seed).integers(0, amap.bursts, n)


def stream_energy(cfg, pattern, n):
    """(DRAMEnergy, energydram dict, StreamResult) of ``n`` reads of ``pattern`` through the fast model."""
    from sim.energy.dram import trace_energy
    from sim.energy.reference import energydram_energy
    from sim.energy.record import record_stream
    from sim.perf.dram import DRAMPerfModel
    m = DRAMPerfModel(cfg)
    res, cmds = record_stream(m, _addresses(m.amap, pattern, n))
    return trace_energy(cmds, cfg, end_cycle=res.cycles), energydram_energy(cmds, cfg, end_cycle=res.cycles), res


def _rtl_point(cfg, n, out):
    from sim.bench.dram import rtl_stream
    from sim.dram.trace import decode_trace
    from sim.energy.dram import trace_energy
    from sim.energy.record import record_stream
    from sim.perf.dram import DRAMPerfModel
    m = DRAMPerfModel(cfg)
    addrs = _addresses(m.amap, "random", n)
    run = rtl_stream(cfg, addrs)
    rtl = decode_trace(run.outputs["trace"], cfg.org)
    res, fast = record_stream(m, addrs)
    last = fast[-1].cycle
    e_r = trace_energy(rtl, cfg, end_cycle=run.cycles)
    e_f = trace_energy(fast, cfg, end_cycle=res.cycles)
    tail = [c for c in rtl if c.cycle > last]
    same = [c for c in rtl if c.cycle <= last] == fast
    key = f"dram_rtl_{cfg.name.replace('-', '_')}_random"
    out.update({f"{key}_requests": n, f"{key}_rtl_pj": e_r.total_pj, f"{key}_fast_pj": e_f.total_pj,
                f"{key}_diff_pct": 100 * (e_f.total_pj - e_r.total_pj) / e_r.total_pj,
                f"{key}_same_commands_to_last": same, f"{key}_rtl_commands_after_last": len(tail)})
    print(f"  {cfg.name:18s} RTL {e_r.total_pj / 1e6:9.3f} uJ  fast {e_f.total_pj / 1e6:9.3f} uJ  "
          f"({out[f'{key}_diff_pct']:+.4f} %); same commands up to the model's last: {same}; "
          f"RTL commands after it: {', '.join(str(c) for c in tail) or 'none'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ndpim bench energy", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16_000, help="reads per stream (default 16000)")
    ap.add_argument("--rtl-n", type=int, default=4_000, help="reads of the RTL point (default 4000)")
    ap.add_argument("--no-rtl", action="store_true", help="skip the RTL-vs-fast-model point (Verilator)")
    ap.add_argument("--no-area", action="store_true",
                    help="skip the paper designs' area and power (NanGate45 mapping of every distinct module: ~2 min)")
    ap.add_argument("--out", default="build/bench/energy.json")
    args = ap.parse_args(list(argv or []))
    from hdl.memctl import timing
    from sim.energy.dram import command_energy, owed_refresh_pj
    from sim.energy.reference import explained_difference
    from sim.energy.specs import power_spec
    t0 = time.time()
    out = {"scope": "DRAM energy (issue 33 item 1), NDP / PIM kernel energy (item 3), datapath area and power "
                    "(item 2)"}
    for mem, name in MEMORIES:
        cfg = getattr(timing, name)
        spec = power_spec(cfg)
        ce = command_energy(cfg, spec)
        tck = cfg.timing.tck_ps / 1000.0
        out[f"dram_{mem}_sources"] = spec.sources
        for k in ("act", "pre", "rd", "wr", "ref"):
            out[f"dram_{mem}_{k}_pj"] = getattr(ce, k)
        out[f"dram_{mem}_act_stby_mw"] = ce.act_stby / tck
        out[f"dram_{mem}_pre_stby_mw"] = ce.pre_stby / tck
        print(f"{cfg.name} (one channel, {cfg.org.ranks} ranks, {spec.dies_per_rank} die(s) charged per rank): per "
              f"rank ACT {ce.act:.0f} PRE {ce.pre:.0f} RD {ce.rd:.0f} WR {ce.wr:.0f} REF {ce.ref:.0f} pJ; standby "
              f"{ce.act_stby / tck:.0f} (active) / {ce.pre_stby / tck:.0f} (precharged) mW")
        for pat in ("seq", "random"):
            e, ref, res = stream_energy(cfg, pat, args.n)
            bits = e.dq_bits
            key = f"dram_{mem}_{pat}"
            gbps = bits / 8 / (res.cycles * cfg.timing.tck_ps) * 1000.0
            diff = e.total_pj - ref["total_pj"]
            out.update({
                f"{key}_pj_per_bit": e.pj_per_bit(),
                f"{key}_refresh_due_pj_per_bit": (e.total_pj + owed_refresh_pj(e, cfg, spec)) / bits,
                f"{key}_act_pre_pj_per_bit": (e.act_pj + e.pre_pj) / bits,
                f"{key}_rd_wr_pj_per_bit": (e.rd_pj + e.wr_pj) / bits,
                f"{key}_ref_pj_per_bit": e.ref_pj / bits,
                f"{key}_background_pj_per_bit": e.background_pj / bits,
                f"{key}_gbps": gbps, f"{key}_power_mw": e.total_pj / (res.cycles * tck),
                f"{key}_cycles": res.cycles, f"{key}_requests": args.n, f"{key}_acts": e.acts, f"{key}_refs": e.refs,
                f"{key}_energydram_pj_per_bit": ref["total_pj"] / bits,
                f"{key}_vs_energydram_pct": 100 * diff / ref["total_pj"],
                f"{key}_unexplained_pj": diff - explained_difference(ref, cfg, spec),
            })
            print(f"  {pat:6s} {args.n} reads: {e.pj_per_bit():6.2f} pJ/bit "
                  f"({out[key + '_refresh_due_pj_per_bit']:.2f} with the postponed REFs; ACT/PRE "
                  f"{out[key + '_act_pre_pj_per_bit']:.2f}, RD {out[key + '_rd_wr_pj_per_bit']:.2f}, REF "
                  f"{out[key + '_ref_pj_per_bit']:.2f}, background {out[key + '_background_pj_per_bit']:.2f}) at "
                  f"{gbps:.2f} GB/s, {out[key + '_power_mw']:.0f} mW; energydram {ref['total_pj'] / bits:.2f} pJ/bit "
                  f"({out[key + '_vs_energydram_pct']:+.3f} %, unexplained {out[key + '_unexplained_pj']:.2g} pJ)")
    from sim.energy.ndp import bench_figures
    kern = bench_figures()
    out.update(kern)
    print("NDP kernels (paper device) and a DIMM-PIM head (sim/energy/ndp.py, sim/energy/pim.py):")
    for key in sorted({k.rsplit("_pj_per_bit", 1)[0] for k in kern if k.endswith("_pj_per_bit")}):
        print(f"  {key:<28} {kern[key + '_pj_per_bit']:7.2f} pJ/bit {kern[key + '_pj_per_flop']:7.2f} pJ/FLOP "
              f"(DRAM {kern[key + '_dram_pj']:.3g}, datapath {kern[key + '_datapath_pj']:.3g}, SRAM "
              f"{kern[key + '_sram_pj']:.3g} pJ)")
    if not args.no_area:
        from sim.energy.area import bench_figures as area_figures, format_table, paper_figures
        print("Datapath area and power at 45 nm (sim/energy/area.py; NanGate45 mapping, takes ~2 min):", flush=True)
        figs = paper_figures()
        out.update(area_figures(figs))
        print(format_table(figs))
    if not args.no_rtl:
        print("RTL (Verilator) vs the fast model's recorded stream, random reads:")
        for cfg in (timing.DDR4_3200_TINY, timing.LPDDR5X_8533_TINY):
            _rtl_point(cfg, args.rtl_n, out)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"bench time {time.time() - t0:.1f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
