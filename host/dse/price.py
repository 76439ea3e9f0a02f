"""One design point of ``ndpim dse``: area, power and throughput (docs/dse.md).

* **Area** (mm^2 per NDP core): :func:`sim.energy.area.module_areas` on the ``ndp_core`` top at the point's
  configuration (the same one ``ndpim verilog --top ndp_core --preset paper --set ...`` builds), NanGate45 cells +
  SRAM macros, each distinct module mapped once and cached on disk (``sim.energy.area.AREA_CACHE_DIR``); the core's
  and the PE array's own glue, which are not mapped (:data:`sim.energy.area.NDP_COUNTS_ONLY`), are charged
  :func:`glue_generic_cells` x the mapped um^2 per generic gate of the decoder (``sim.energy.area._glue_estimate``:
  an *estimate*, its own column).
* **Power** (W per core, peak): the area model's activity (``sim.energy.area.ndp_power``: every FPMAC one
  FP16 multiply + accumulator add per cycle, one A beat written and read in the DRAM ring per cycle) + leakage of
  the cells, the SRAM and the glue estimate.
* **Throughput** (tok/s): the PLoRA host (host.plora.run) with the calibrated NDP model at the point's geometry
  (``hardware=(("ndp.macs", ...), ...)``, as ``ndpim plora run --set ndp.macs=...``) on a fixed closed-loop
  workload (:class:`Workload`). The system has ``devices`` NDP devices (the run reports it); area and power of the
  system's NDP logic = devices x per core.

The DIMM-PIM family (:class:`host.dse.space.PIMPoint`, priced by :func:`price_pim`):

* **Area** (mm^2 per rank): :func:`sim.energy.area.pim_area` at the point's :class:`hdl.pim.config.PIMConfig`: the
  rank PU (``pim_rank_pu``: sequencer, adder / softmax units, normalizer, 256 KB buffer) + ``chips x banks`` = 128
  bank PUs ([L3] 4.4: one per bank of each chip), the tops ``ndpim verilog --top pim_rank_pu / pim_bank_pu
  --preset paper --set rank_adders=N`` builds; the system's PIM logic = every rank of the host memory
  (``HostMemoryConfig.ranks``: 16 channels x 4 ranks, [L3] Table 2).
* **Power** (W per rank, peak): :func:`sim.energy.area.pim_power` at the config (one all-bank RD every tCCD_L,
  every bank PU's multipliers / adders and every rank-PU FP unit one operation per RD, one 64-bit buffer read per
  RD, + leakage).
* **Throughput** (tok/s): the L3 host (host.l3.run.run_l3, ``ndpim l3 run --set pim.rank_adders=N``) on a fixed
  offline workload (:class:`PIMWorkload`) with the DIMM-PIM model calibrated on the RTL of that rank PU
  (data/pim_rtl_calibration.json); a point without a calibration is a failed row naming the command that measures
  it (no stand-in model).

Failures are rows (``status`` "failed", ``reason``), never raised.
"""

import time
import traceback
from dataclasses import dataclass, asdict, replace

__all__ = ["Workload", "WORKLOADS", "PIMWorkload", "PIM_WORKLOADS", "core_config", "price_point", "price_pim",
           "glue_generic_cells", "point_sets", "pim_point_sets", "rank_area_power", "run_pim_perf"]


@dataclass(frozen=True)
class Workload:
    """The fixed workload every point runs: PLoRA's ``skewed-long`` preset (host/workloads/synthetic.py: 1,024 to
    3,072-token prompts, 256 to 1,024 output tokens, skewed adapter popularity) on Llama-2-7B, closed loop
    (``concurrency`` clients, so the hardware, not the arrival rate, sets the throughput)."""
    model: str = "llama2-7b"
    workload: str = "skewed-long"
    n_requests: int = 48
    concurrency: int = 16
    seed: int = 0


WORKLOADS = {"full": Workload(), "small": Workload(n_requests=8, concurrency=4)}


@dataclass(frozen=True)
class PIMWorkload:
    """The fixed workload every DIMM-PIM point runs: L3's ``dolphin`` trace (host/l3/traces.py, L3 Table 4
    Dolphin-r1: 202-token prompts, 3,926-token outputs on average: decode attention, the DIMM-PIM's work,
    dominates) on OPT-66B at its L3 Table 3 deployment (TP 2 x DP 4), the L3 system, every request at t = 0
    (offline, as L3's study: the hardware sets the throughput)."""
    model: str = "opt-66b"
    trace: str = "dolphin"
    system: str = "l3"
    n_requests: int = 32
    seed: int = 0


PIM_WORKLOADS = {"full": PIMWorkload(), "small": PIMWorkload(n_requests=8)}


def point_sets(point) -> list:
    """The ``ndpim verilog --top ndp_core --preset paper --set FIELD=VALUE`` values of ``point``: the core the
    calibrated host model prices (``NDPDeviceSpec.ndp_config``), field by field where it differs from PAPER."""
    from dataclasses import fields
    from hdl.ndp.config import PAPER
    cfg = _device_spec(point).ndp_config()
    return [(f"ndp.{f.name}", _fmt(getattr(cfg, f.name))) for f in fields(PAPER)
            if f.name != "name" and getattr(cfg, f.name) != getattr(PAPER, f.name)]


def _fmt(v):
    return str(v).lower() if isinstance(v, bool) else str(v)


def _device_spec(point):
    from dataclasses import replace
    from host.plora.ndp_model import PLORA_DEVICE
    return replace(PLORA_DEVICE, macs=point.macs, dram_buffer_bytes=point.dram_buffer_kib << 10,
                   input_buffer_bytes=point.input_buffer_kib << 10, output_buffer_bytes=point.output_buffer_kib << 10)


def core_config(point):
    """``(top spec, NDPCoreDevmemParams)`` of ``point``: the ``ndp_core`` top's ``paper`` preset with
    :func:`point_sets` applied (host.topcfg.configure), checked equal to the host model's core."""
    from host.topcfg import configure
    spec, cfg = configure("ndp_core", "paper", point_sets(point))
    want = _device_spec(point).ndp_config()
    from dataclasses import replace
    if replace(cfg.ndp, name=want.name) != want:
        raise ValueError(f"point {point.name}: the Verilog top's core {cfg.ndp} differs from the host model's {want}")
    return spec, cfg


def glue_generic_cells(cfg) -> dict:
    """Generic-gate counts of the two glue modules not mapped, at ``cfg``: the paper's measured counts
    (:data:`sim.energy.area.NDP_GLUE_GENERIC_CELLS`, at 512 lanes) scaled by ``lanes / 512`` (an estimate: the glue
    is beat-wide multiplexing and control; sim/energy/area.py already scales the PE array's glue by lanes)."""
    from hdl.ndp.config import PAPER
    from sim.energy.area import NDP_GLUE_GENERIC_CELLS
    return {k: round(v * cfg.lanes / PAPER.lanes) for k, v in NDP_GLUE_GENERIC_CELLS.items()}


def core_area_power(point, *, cache=True, progress=None) -> dict:
    """Area (um^2) and peak power (W) of one NDP core at ``point`` (module docstring)."""
    from sim.energy.area import module_areas, ndp_power, NDP_COUNTS_ONLY, AREA_CACHE_DIR
    spec, cfg = core_config(point)
    res = module_areas("ndp_core", spec.build(cfg), counts_only=NDP_COUNTS_ONLY,
                       cache_dir=AREA_CACHE_DIR if cache else None, progress=progress)
    c = cfg.ndp
    # sim/energy/area.py ndp_power's activity at this core: every MAC one FP16 multiply + one accumulator add per
    # cycle, one A beat written and read in the DRAM ring per cycle (Horowitz 45 nm), leakage incl. the glue
    pw = ndp_power(res, c, glue_counts=glue_generic_cells(c))
    glue, mac_w, sram_w, leak_w = pw["glue"], pw["mac_w"], pw["sram_w"], pw["leak_w"]
    return {"lanes": c.lanes, "pe_rows": c.pe_batch, "sfu_lanes": c.sfu_lanes,
            "logic_mm2": res["logic_um2"] * 1e-6, "glue_estimate_mm2": glue["area_um2"] * 1e-6,
            "sram_mm2": res["sram_um2"] * 1e-6, "sram_bits": res["sram_bits"],
            "core_mm2": (res["area_um2"] + glue["area_um2"]) * 1e-6,
            "mac_w": mac_w, "sram_w": sram_w, "leak_w": leak_w, "core_w": mac_w + sram_w + leak_w,
            "area_s": res["seconds"]}


def run_perf(point, workload: Workload) -> dict:
    """The PLoRA host's run of ``workload`` at ``point``: throughput, devices, energy, the model that priced it."""
    from host.plora.run import RunSpec, run_spec
    from host.serving import EngineConfig
    spec = RunSpec(model=workload.model, workload=workload.workload, system="plora", n_requests=workload.n_requests,
                   concurrency=workload.concurrency, seed=workload.seed, hardware=point.hardware())
    s = run_spec(spec, engine_config=EngineConfig(trace=False, record_iterations=False)).summary
    if s.get("ndp_model") != "calibrated":
        raise RuntimeError(f"the run was priced by the {s.get('ndp_model')!r} NDP model, not the calibrated one")
    return {"throughput_tok_s": float(s["throughput_tok_s"]), "devices": int(s.get("devices", 1)),
            "finished": int(s["finished"]), "run_energy_ndp_j": float(s["energy_j"]["ndp"]),
            "run_energy_total_j": float(s["energy_j"]["total"]),
            "tpot_ms_mean": float(s["tpot_ms_mean"]), "ndp_geometry": s.get("ndp_geometry", "")}


def pim_point_sets(point) -> list:
    """The ``ndpim verilog --top pim_rank_pu --preset paper --set FIELD=VALUE`` values of ``point``: its
    PIMConfig's fields that differ from PAPER."""
    from dataclasses import fields
    from hdl.pim.config import PAPER
    cfg = point.config()
    return [(f.name, _fmt(getattr(cfg, f.name))) for f in fields(PAPER)
            if f.name != "name" and getattr(cfg, f.name) != getattr(PAPER, f.name)]


def rank_area_power(point, *, cache=True, progress=None) -> dict:
    """Area (mm^2) and peak power (W) of one rank's PIM logic at ``point`` (module docstring)."""
    from sim.energy.area import AREA_CACHE_DIR, pim_area, pim_power
    from host.topcfg import configure
    _spec, cfg = configure("pim_rank_pu", "paper", pim_point_sets(point))     # the Verilog top's configuration
    if replace(cfg, name=point.config().name) != point.config():
        raise ValueError(f"point {point.name}: the Verilog top's rank {cfg} differs from the host's {point.config()}")
    cfg = point.config()
    res = pim_area(cfg, progress=progress, cache_dir=AREA_CACHE_DIR if cache else None)
    pw = pim_power(res, cfg)
    rank, bank = res["rank_pu"], res["bank_pu"]
    # adders Yosys removed as dead logic (no input, no reader: sim/energy/area.py pim_area), not in area or power
    dead = sum(n for kids in rank["pruned"].values() for c, n in kids.items()
               if rank["modules"][c]["class"] == "FPAdd")
    return {"dead_adders": dead, "rank_pu_logic_mm2": rank["logic_um2"] * 1e-6,
            "rank_pu_sram_mm2": rank["sram_um2"] * 1e-6, "bank_pu_mm2": bank["area_um2"] * 1e-6,
            "bank_pus_per_rank": pw["bank_pus_per_rank"],
            "rank_mm2": pw["rank_total_mm2"], "rank_pu_w": pw["rank_w"], "bank_pu_w": pw["bank_w"],
            "rank_w": pw["rank_total_w"], "area_s": rank["seconds"] + bank["seconds"]}


def run_pim_perf(point, workload: PIMWorkload) -> dict:
    """The L3 host's run of ``workload`` with ``point``'s rank PUs: throughput, ranks, energy, the calibration that
    timed it (checked to be the RTL calibration of the point's own geometry)."""
    from host.l3.config import check_calibrated, l3_setup
    from host.l3.run import FAST_ENGINE, run_l3
    from sim.perf.pim import calibration_key
    setup = l3_setup(workload.model, hardware=point.hardware())
    cal = check_calibrated(setup.host)
    run = run_l3(workload.model, workload.trace, workload.system, seed=workload.seed, n_requests=workload.n_requests,
                 engine=FAST_ENGINE, setup=setup)
    s = run.summary
    if s.get("oom"):
        raise RuntimeError(f"the run did not fit: {s.get('oom_reason')}")
    timing = {(sy.pim.timing.config, sy.pim.timing.fixed_cycles) for sy in run.systems}
    if timing != {(point.config(), int(cal["fixed_cycles"]))}:
        raise RuntimeError(f"the run was timed by {timing}, not {point.config().name}'s RTL calibration "
                           f"(fixed_cycles {cal['fixed_cycles']})")
    return {"throughput_tok_s": float(s["throughput_tok_s"]), "ranks": setup.host.ranks,
            "finished": int(s["finished"]), "run_energy_pim_j": float(s["energy_j"]["pim"]),
            "run_energy_total_j": float(s["energy_j"]["total"]), "tbt_ms_mean": float(s["tbt_ms_mean"]),
            "calibration_key": calibration_key(point.config()), "pim_fixed_cycles": int(cal["fixed_cycles"]),
            "pim_gap": int(cal["gap"]), "pim_tail": int(cal["tail"])}


def price_pim(point, workload: PIMWorkload, cache=True) -> dict:
    """One DIMM-PIM row (module docstring); raises on a failure (:func:`price_point` makes it a row)."""
    from host.l3.config import check_calibrated
    row = {}
    check_calibrated(point.host())       # before the area: an uncalibrated point fails in milliseconds
    row.update(rank_area_power(point, cache=cache))
    row.update(run_pim_perf(point, workload))
    if row["finished"] < workload.n_requests:
        raise RuntimeError(f"{row['finished']} of {workload.n_requests} requests finished")
    row["area_mm2"] = row["ranks"] * row["rank_mm2"]
    row["power_w"] = row["ranks"] * row["rank_w"]
    row["tok_s_per_mm2"] = row["throughput_tok_s"] / row["area_mm2"]
    row["tok_s_per_w"] = row["throughput_tok_s"] / row["power_w"]
    return row


def price_point(job) -> dict:
    """``job`` = ``(point, workload, cache)``: one row (module docstring) of either family (``point.family``:
    ``ndp`` a :class:`host.dse.space.Point`, ``pim`` a :class:`host.dse.space.PIMPoint`). Picklable, never
    raises."""
    point, workload, cache = job
    t0 = time.perf_counter()
    row = {"point": point.name, "family": point.family, **asdict(point), "status": "priced", "reason": ""}
    try:
        if point.family == "pim":
            row.update(price_pim(point, workload, cache))
            row["seconds"] = time.perf_counter() - t0
            return row
        row.update(core_area_power(point, cache=cache))
        row.update(run_perf(point, workload))
        if row["finished"] < workload.n_requests:
            raise RuntimeError(f"{row['finished']} of {workload.n_requests} requests finished")
        n = row["devices"]
        row["area_mm2"] = n * row["core_mm2"]
        row["power_w"] = n * row["core_w"]
        row["tok_s_per_mm2"] = row["throughput_tok_s"] / row["area_mm2"]
        row["tok_s_per_w"] = row["throughput_tok_s"] / row["power_w"]
    except Exception as exc:         # noqa: BLE001 - a point that cannot be priced is a row saying why
        row.update(status="failed", reason=f"{type(exc).__name__}: {exc}".splitlines()[0][:400],
                   traceback=traceback.format_exc(limit=4))
    row["seconds"] = time.perf_counter() - t0
    return row
