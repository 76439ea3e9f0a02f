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

Failures are rows (``status`` "failed", ``reason``), never raised.
"""

import time
import traceback
from dataclasses import dataclass, asdict

__all__ = ["Workload", "WORKLOADS", "core_config", "price_point", "glue_generic_cells", "point_sets"]


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


def price_point(job) -> dict:
    """``job`` = ``(point, workload, cache)``: one row (module docstring). Picklable, never raises."""
    point, workload, cache = job
    t0 = time.perf_counter()
    row = {"point": point.name, **asdict(point), "status": "priced", "reason": ""}
    try:
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
