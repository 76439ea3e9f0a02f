"""Calibration of the end-to-end run's performance models on the RTL (``ndpim e2e calibrate``).

* NDP device: random waves of the kernels the run uses (E2 loads, E3, E4 of rank 8 / 16 on matrices of the
  model's widths, attention shares of 8-64 tokens), run on the RTL with per-descriptor cycle stamps; the
  coefficients of :class:`host.e2e.perf.NDPTiming` are fitted on them (least squares) and the host stream's gate
  latency chosen to minimise the waves' error; written to ``data/e2e_ndp_calibration.json`` with the fit's
  residuals. The test (tests/host/e2e) holds the model to the RTL on *other* waves: the run's own.
* PIM rank: ``fixed_cycles`` of :class:`sim.perf.pim.PIMPerfModel` from RTL single heads
  (:func:`sim.pim.fused.rtl_cycles` on the timing-only DRAM model: cycle counts do not depend on the data).
"""

import json
import time

import numpy as np

from .model import TINY_LLAMA, make_adapters
from .ndp import NDPDevices, NDPJob, WaveScript, plan_runs
from .perf import fit, NDPTiming, RankRefresh, calibration_path, op_class, gap_key

__all__ = ["calibration_waves", "measure_ndp", "calibrate_ndp", "calibrate_pim", "wave_errors", "rank_bits",
           "refresh_params"]


def _bits(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def calibration_waves(seed: int = 0, n: int = 24) -> list:
    """``n`` random waves (lists of :class:`NDPJob`) over the shapes the run meets."""
    rng = np.random.default_rng([seed, 0xCA1])
    dims = (128, 256, 344, 688)
    waves = []
    for w in range(n):
        jobs = []
        for k in range(int(rng.integers(2, 6))):
            kind = str(rng.choice(["E2", "E3", "E4", "ATT"]))
            key = (w, k, kind)
            if kind == "ATT":
                l = int(rng.integers(1, 9)) * 8
                jobs.append(NDPJob(key, kind, {"K": _bits(rng, (l, 64)), "V": _bits(rng, (l, 64))},
                                   _bits(rng, (64,))))
                continue
            d_in, d_out = int(rng.choice(dims)), int(rng.choice(dims))
            r = int(rng.choice([8, 16]))
            b = int(rng.integers(1, 7))
            t = {"A": _bits(rng, (d_in, r), 0.1), "B": _bits(rng, (r, d_out), 0.1)}
            jobs.append(NDPJob(key, kind, t, None if kind == "E2" else _bits(rng, (b, d_in))))
        waves.append(jobs)
    return waves


def measure_ndp(devices: NDPDevices, waves) -> list:
    """RTL records ``(wave, [(descriptor, issue, start, done, prev_done)], measured cycles)`` per run."""
    out = []
    for jobs in waves:
        for run_jobs in plan_runs(jobs, devices.config, devices.depth):
            script = WaveScript(run_jobs, devices.config, devices.depth)
            _, st = devices._rtl(script)
            recs, prev = [], None
            for (j, desc, _), s in zip(script.items, st):
                recs.append((desc, s.issue, s.start, s.done, prev))
                prev = s.done
            out.append((script, recs, max(s.done for s in st) + 1))
    return out


def wave_errors(timing: NDPTiming, measured) -> np.ndarray:
    """Relative error (model - rtl) / rtl of each measured run's cycles."""
    err = []
    for script, _, cycles in measured:
        st = timing.stamps(script)
        err.append((max(s.done for s in st) + 1 - cycles) / cycles)
    return np.array(err)


def rank_bits(memory) -> list:
    """Address bits of a device byte address that select its rank, rank bit 0 first (``memory``: the device's
    :class:`hdl.memctl.devmem.DeviceMemory`): probed one address bit at a time through the memory's own mapping
    (:meth:`DeviceMemory.locate`, the controllers' address map), which is a bit permutation."""
    amap, R = memory.amap, memory.config.org.ranks
    off = amap.offsets["rank"]
    out = [None] * (R.bit_length() - 1)
    for p in range(memory.bytes.bit_length() - 1):
        _, burst, _ = memory.locate(1 << p)
        r = (burst >> off) & (R - 1)
        if r:
            if r & (r - 1) or out[r.bit_length() - 1] is not None:
                raise ValueError(f"address bit {p} maps to rank {r}: not a bit permutation")
            out[r.bit_length() - 1] = p
    if None in out:
        raise ValueError(f"no address bit selects rank bits {out}")
    return out


def refresh_params(dev, first_issue) -> dict:
    """:class:`host.e2e.perf.RankRefresh`'s parameters for the device of ``dev`` (LPDDR5X memory), from its timing
    set and its controllers' refresh rules (hdl/memctl/controller.py: rank ``r``'s tREFI timer starts at
    ``tREFI - 1 + r * (tREFI // ranks)``; its tick makes the refresh owed in the next cycle, the scheduler takes it
    in the one after and the PREA is on the bus one cycle later: 3 cycles), plus the runs' fitted first issue."""
    inner = dev.system().inner
    tm, org = inner.dram_config.timing, inner.dram_config.org
    return {"model": "rank", "interval": int(tm.tREFI), "cycles": int(tm.tRFC), "prea": int(tm.tRPab or tm.tRP),
            "ranks": int(org.ranks), "stagger": int(tm.tREFI) // int(org.ranks), "owed": int(tm.tREFI) - 1 + 3,
            "rank_bits": rank_bits(inner.memory.memory), "first_issue": first_issue}


def _fit_refresh(dev, measured) -> dict:
    """The service fit with the DRAM's refreshes taken out (LPDDR5X memory): the runs' first issue after reset is
    fitted linear in their preload lines; each descriptor's refresh stall (:class:`host.e2e.perf.RankRefresh` on
    its measured start and completion) is subtracted before the least-squares fit of the services; the gaps
    between a completion and the next start are the medians per (previous class, class) with >= 3 runs'
    points, else per class (the gap includes the next header's fetch from the DRAM, whose row and refresh state
    the linear model cannot see: medians keep a refresh in the gap from pulling the fit). Returns :func:`fit`'s
    coefficients plus ``refresh``, ``gap_pair`` and ``gap_class``."""
    X = np.array([[1.0, s.pre_lines] for s, _, _ in measured])
    y = np.array([float(s.first_issue) for s, _, _ in measured])
    ref = refresh_params(dev, np.linalg.lstsq(X, y, rcond=None)[0].tolist())
    adj, pairs, classes = [], {}, {}
    for s, rr, _ in measured:
        model = RankRefresh(ref, s.first_issue)
        pc = None
        for desc, issue, start, done, prev in rr:
            _, stall = model.stall(desc, start, done)
            adj.append((desc, issue, start, done - stall, prev))
            if prev is not None and issue < prev:
                pairs.setdefault(gap_key(pc, op_class(desc)), []).append(start - prev)
                classes.setdefault(op_class(desc), []).append(start - prev)
            pc = op_class(desc)
    coef = fit(adj, dev.config)
    coef["refresh"] = ref
    coef["gap_pair"] = {k: float(np.median(v)) for k, v in sorted(pairs.items()) if len(v) >= 3}
    coef["gap_class"] = {k: float(np.median(v)) for k, v in sorted(classes.items())}
    return coef


def calibrate_ndp(seed: int = 0, n: int = 24, engine: str = "verilator", path=None, log=print, *,
                  memory: str = "burst", channels: int = 2) -> dict:
    """Measure the NDP device on ``memory`` (``channels``) and fit :class:`NDPTiming`; written to ``path``
    (default: :func:`host.e2e.perf.calibration_path` of the memory; False: not written)."""
    t0 = time.perf_counter()
    if path is None:
        path = calibration_path(memory, channels)
    dev = NDPDevices("rtl", engine=engine, memory=memory, channels=channels)
    measured = measure_ndp(dev, calibration_waves(seed, n))
    recs = [r for _, rr, _ in measured for r in rr]
    coef = fit(recs, dev.config)
    if memory != "burst":
        coef = _fit_refresh(dev, measured)
    best = None
    # the host stream's gate latency and, on the LPDDR5X memory, its cycles per line (the burst memory takes one
    # line per cycle: not fitted there)
    rates = [1.0] if memory == "burst" else [1.0 + 0.125 * k for k in range(17)]
    for rate in rates:
        for gate in range(0, 17):
            coef["gate"] = gate
            if memory != "burst":
                coef["hmem_line_cycles"] = rate
            e = wave_errors(NDPTiming(dev.config, coef), measured)
            if best is None or np.abs(e).max() < best[1]:
                best = (gate, float(np.abs(e).max()), float(np.abs(e).mean()), rate)
    coef["gate"] = best[0]
    if memory != "burst":
        coef["hmem_line_cycles"] = best[3]
    svc_err = []
    tm = NDPTiming(dev.config, coef)
    for desc, issue, start, done, prev in recs:
        svc_err.append(tm.service(desc) - (done - start + 1))
    coef["fit"] = {"runs": len(measured), "descriptors": len(recs), "wave_max_rel_err": best[1],
                   "wave_mean_rel_err": best[2], "service_max_abs_err_cycles": float(np.abs(svc_err).max()),
                   "seed": seed, "config": dev.config.name, "seconds": round(time.perf_counter() - t0, 1),
                   "memory": memory if memory == "burst" else f"{memory} x {channels} channels"}
    if path:
        from pathlib import Path
        Path(path).write_text(json.dumps(coef, indent=1) + "\n")
        log(f"wrote {path}")
    log(f"NDP calibration: {len(measured)} runs, {len(recs)} descriptors; wave error max {best[1]:.2%}, "
        f"mean {best[2]:.2%}; service max |error| {np.abs(svc_err).max():.1f} cycles")
    return coef


def calibrate_pim(config, L_list=(64, 128, 256, 512, 1024), engine: str = "verilator") -> dict:
    """``fixed_cycles`` of the PIM model for ``config`` from RTL single heads (timing-only DRAM model)."""
    from sim.pim.fused import rtl_cycles
    from sim.perf.pim import PIMPerfModel, calibrate
    pts = rtl_cycles(config, [L for L in L_list if L <= config.max_tokens // 2], backend=engine, heads=3)
    model, resid = calibrate(PIMPerfModel(config), [(L, p["head_cycles"]) for L, p in pts.items()])
    return {"fixed_cycles": model.fixed_cycles, "residuals": resid,
            "points": {int(L): {"head_cycles": p["head_cycles"], "steady_cycles": p["steady_cycles"]}
                       for L, p in pts.items()}}


def calibrate_pim_for(model: str = "tiny", long_context: int = 1024, tokens: int = 16, *, long_requests: int = 1,
                      bank_groups: int = 4, engine: str = "verilator", log=print) -> dict:
    """Measure the PIM rank of the run ``(model, long_context, tokens)`` and record it in
    data/e2e_pim_calibration.json (keyed by the rank's config name)."""
    from .model import get_tiny
    from .pim import e2e_pim_config
    from .run import PIM_CALIBRATION, config_fields
    tiny = get_tiny(model)
    max_tokens = -(-(long_context + tokens) // 16) * 16
    cfg = e2e_pim_config(tiny.head_dim, max_tokens, max(1, long_requests) * tiny.n_layers * tiny.n_heads,
                         bank_groups=bank_groups)
    L = [x for x in (16, 32, 64, 256, 1024, 2048) if x <= max_tokens][-3:] or [max_tokens]
    t0 = time.perf_counter()
    res = calibrate_pim(cfg, tuple(L), engine=engine)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["config"] = config_fields(cfg)
    res["measured_by"] = "ndpim e2e calibrate --what pim (sim.pim.fused.rtl_cycles, Verilator, timing-only DRAM model)"
    table = json.loads(PIM_CALIBRATION.read_text()) if PIM_CALIBRATION.exists() else {}
    table[cfg.name] = res
    PIM_CALIBRATION.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    log(f"PIM calibration of {cfg.name}: fixed_cycles {res['fixed_cycles']}, residuals {res['residuals']} "
        f"(wrote {PIM_CALIBRATION})")
    return res
