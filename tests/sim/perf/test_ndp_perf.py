"""The NDP performance model (sim/perf/ndp.py) against the RTL core, on shapes it was not calibrated on.

The RTL is tests/hdl/ndp/test_core.py's Verilator DUT (the tiny geometry, 8 lanes x 2 PE rows, on the 512-bit
burst memory; the same Verilog, so the same cached Verilator build; generating that Verilog is ~35 s of the
test's ~45 s). The model's constants come from
data/ndp_rtl_calibration.json (``python -m sim.perf.ndp --calibrate``, other shapes). Mutants: the model with
the descriptor overlap disabled, with the calibrated constants zeroed, or without gap and start, must fail the
same bound.
"""

from dataclasses import replace

import numpy as np
import pytest

from sim.perf.ndp import (NDPPerfModel, Calibration, load_calibration, calibration_programs, validation_programs,
                          rtl_config, rtl_dut, rtl_cycles, rtl_group_config, calibration_group_programs)

BOUND = 0.03
_RTL = {}


def _measured():
    """{name: (program, RTL cycles)} of the validation kernels (measured once per session)."""
    if not _RTL:
        from sim.backends import get_backend
        cfg, dut, mem = rtl_dut()
        be = get_backend("verilator")
        _RTL["cfg"], _RTL["mem"] = cfg, mem
        _RTL["runs"] = {n: (p, rtl_cycles(p, cfg, dut, be)) for n, p in validation_programs(cfg).items()}
    return _RTL["cfg"], _RTL["mem"], _RTL["runs"]


def _errors(model, runs):
    return {n: (model.program_cycles(p) - c) / c for n, (p, c) in runs.items()}


def test_validation_shapes_are_not_calibration_shapes():
    cfg, _ = rtl_config()
    cal = {tuple(d for d, _ in p) for p in calibration_programs(cfg).values()}
    for name, prog in validation_programs(cfg).items():
        assert tuple(d for d, _ in prog) not in cal, name
        assert not set(d for d, _ in prog) <= set(d for p in cal for d in p), name


def test_model_within_3_percent_of_rtl_and_mutants_fail():
    """One test (one Verilog generation under xdist): the calibrated model within 3 % of the RTL on every
    validation kernel, the streams of very short attention pairs included (issue 29: -0.7 .. +3.2 % before the
    TRANS jobs' DRAIN stage was freed as their last word enters the adder tree, 2026-12-05); the mutants
    (descriptor overlap disabled, all constants zero, ``gap`` and ``start`` zero, the DRAIN stage not shared across
    descriptors, a TRANS job holding the DRAIN stage until its adder tree has emptied, a job computing before the
    DRAIN stage has taken the one before it, the writer taking the next job's results without finishing the
    previous job) exceed 3 % on some kernel."""
    cfg, mem, runs = _measured()
    err = _errors(NDPPerfModel(cfg, mem), runs)
    print("\n" + "\n".join(f"{n:>18}: RTL {runs[n][1]:>5} cycles, model {100 * e:+.2f}%" for n, e in err.items()))
    assert len(err) >= 8
    short = {n for n in err if n.startswith("att_stream")}
    assert len(short) >= 4
    assert max(abs(e) for e in err.values()) <= BOUND, err
    cal = load_calibration()
    mutants = {"no_overlap": NDPPerfModel(cfg, mem, cal, overlap=False),
               "zero_constants": NDPPerfModel(cfg, mem, Calibration()),
               "no_gap_no_start": NDPPerfModel(cfg, mem, replace(cal, gap=0.0, start=0.0)),
               "drain_per_descriptor": NDPPerfModel(cfg, mem, cal)}
    mutants["drain_per_descriptor"].drain_stage = False
    mutants["tree_hold"] = NDPPerfModel(cfg, mem, cal)
    mutants["tree_hold"].tree_hold = True
    mutants["no_bank_limit"] = NDPPerfModel(cfg, mem, cal)      # COMPUTE any distance ahead of DRAIN
    mutants["no_bank_limit"].two_banks = False
    mutants["no_writer_hand_over"] = NDPPerfModel(cfg, mem, replace(cal, wjob=0.0))
    for name, model in mutants.items():
        merr = _errors(model, runs)
        assert max(abs(e) for e in merr.values()) > BOUND, (name, merr)


def test_calibration_file_is_a_measurement():
    """The constants were fitted to RTL cycles recorded with their programs, and reproduce them."""
    import json
    from sim.perf.ndp import CALIBRATION_PATH
    data = json.loads(CALIBRATION_PATH.read_text())
    cfg, mem = rtl_config()
    gcfg, _ = rtl_group_config()
    progs = {n: (p, cfg) for n, p in calibration_programs(cfg).items()}
    progs.update({n: (p, gcfg) for n, p in calibration_group_programs(gcfg).items()})
    assert {r["name"] for r in data["measured"]} == set(progs)
    assert any(p.endswith("_pipelined") for p in progs) and any(p.startswith("cal_mixed") for p in progs)
    for r in data["measured"]:
        prog, conf = progs[r["name"]]
        assert r["config"] == conf.name and len(r["rtl_written"]) == len(prog)
        assert r["rtl_written"] == sorted(r["rtl_written"]) and r["rtl_written"][-1] < r["rtl_cycles"]
        model = NDPPerfModel(conf, mem, load_calibration())
        assert abs(model.program_cycles(prog) - r["model_cycles"]) < 1e-6
        assert abs(r["model_cycles"] - r["rtl_cycles"]) / r["rtl_cycles"] <= BOUND


def test_paper_interface_and_bounds():
    """The PLoRA host's interface (host/plora/ndp_model.py): seconds, positive, monotone, and never faster than
    the device's bandwidth or MAC peak."""
    m = NDPPerfModel.paper()
    assert m.lanes == 512 and m.kind == "calibrated"
    bw, peak = 64 * 64 * 1066.67e6, 2 * 1024 * 1e9
    assert 0 < m.descriptor_overhead_s < 1e-6
    for d, r, b in ((4096, 16, 1), (4096, 128, 4), (768, 8, 256), (11008, 64, 1)):
        e4, e3 = m.lora_e4_s(d, r, b), m.lora_e3_s(d, d, r, b)
        assert e4 >= max(d * r * 2 / bw, 2 * b * d * r / peak)
        assert e3 > e4 and e3 >= 2 * d * r * 2 / bw
    assert m.lora_e4_s(4096, 16, 8) >= m.lora_e4_s(4096, 16, 4) >= m.lora_e4_s(4096, 16, 1)
    assert m.load_s(0) == 0 and m.load_s(1 << 20) >= (1 << 20) / bw
    a = m.attention_s(np.array([0, 512, 4096, 32768]), 128, 32, 8)
    assert a[0] == 0 and np.all(np.diff(a) > 0) and a[3] >= 8 * 2 * 32768 * 128 * 2 / bw
    assert isinstance(m.attention_s(1000, 128, 32, 8), float)
    # the steady-state shortcuts of attention_s / load_s equal the whole firmware program
    from firmware.ndp.descriptor import load
    full = m.program_cycles(m.kernel_program("attention", 128, 30208, 4)) / 1e9
    assert m.attention_s(30000, 128, 4, 1) == pytest.approx(full, rel=1e-12)
    from firmware.ndp.kernels import load_chunk_bytes
    per = load_chunk_bytes(m.config)                 # 512 KiB: the return ring
    assert m.load_s(5 << 20) == pytest.approx(m.program_cycles([load(0, 1, per // 2)] * ((5 << 20) // per)) / 1e9,
                                              rel=1e-12)
    for bad in (lambda: m.lora_e4_s(0, 16, 1), lambda: m.attention_s(-1, 128, 8, 8),
                lambda: m.attention_s(64, 128, 6, 4), lambda: m.load_s(float("nan"))):
        with pytest.raises(ValueError):
            bad()


def test_paper_gemv_reaches_the_delivered_bandwidth():
    """Issue 11 item 1 in the model: a GEMV over device-resident data (E4 D = 14336, R = 128, batch 1: 3.5 MiB in
    K-tiles) runs at >= 95 % of what the device memory delivers on the same reads alone, because the GEMV PEs take
    two beats per cycle (gemv_pairs); the same core with one beat per cycle cannot (<= 93.75 % of the peak)."""
    from dataclasses import replace
    from sim.bench.ndp import paper_figures
    from sim.perf.ndp import DeviceMemoryModel
    from hdl.ndp.config import PAPER
    f = paper_figures(NDPPerfModel.paper(table=None))
    assert f["gemv_delivered_bw_frac"] >= 0.95, f["gemv_delivered_bw_frac"]
    one = NDPPerfModel(replace(PAPER, gemv_pairs=False), DeviceMemoryModel(64))
    g = paper_figures(one)
    assert g["gemv_delivered_bw_frac"] < 0.93 and g["gemv_device_bw_frac"] <= 15 / 16, g["gemv_delivered_bw_frac"]


def _greedy_k_tiles(d, r, config):
    """The K-tiling before issue 29 item 2 (the mutant): whole tiles of the limit, the rest in a short last tile,
    the half-block tail last."""
    from firmware.ndp.kernels import tile_bytes
    L = config.lanes
    per = min(tile_bytes(config) // (2 * r), config.max_k) // L * L
    tail = d % L
    full = d - tail
    out = [(k0, min(full, k0 + per)) for k0 in range(0, full, per)]
    return out + ([(full, d)] if tail else [])


def test_paper_batch4_gemm_tails_and_loads(monkeypatch):
    """Issue 29 items 2 and 3 in the model at the paper geometry. Balanced K-tiles with the half-block tail first:
    E4 and E3 at R = 128, batch 4, alone from an idle device, >= 90 % of the MAC peak at every D >= 4096
    (D = 5120 and 11008 included); the greedy tiling (the mutant) is slower at both and below 90 % at 11008. E2 LOADs: >= 85 % of
    the lesser of the device and the CXL link from 1 MiB up (the link); at the device alone whole-ring chunks take
    turns with their returns (< 50 %), quarter-ring chunks (measured, not kept: each descriptor costs the CXL
    front end) would not (>= 85 % from 4 MiB)."""
    import sim.perf.ndp as ndp
    from sim.bench.ndp import paper_figures
    from firmware.ndp import kernels as K
    f = paper_figures(NDPPerfModel.paper(table=None))
    alone = {(g["kernel"], g["D"]): g["alone"] for g in f["gemm_batch4"] if g["R"] == 128}
    assert min(v for (_, d), v in alone.items() if d >= 4096) >= 0.90, alone
    assert f["gemm_batch4_min_frac_alone_d4096"] >= 0.90
    assert all(le["efficiency"] >= 0.85 for le in f["load_eff"] if le["bytes"] >= 1 << 20), f["load_eff"]
    assert max(le["device_efficiency"] for le in f["load_eff"]) < 0.50, f["load_eff"]
    monkeypatch.setattr(K, "k_tiles", _greedy_k_tiles)
    monkeypatch.setattr(K, "load_chunk_bytes", lambda c: c.output_buffer_bytes // 4)
    # the mutants' kernel times in caches of their own (the shared ones and the table's status stay as they were)
    monkeypatch.setattr(ndp, "_KERNEL_CACHES", {})
    monkeypatch.setattr(ndp, "_TABLES_LOADED", {})
    g = paper_figures(NDPPerfModel.paper(table=None))
    worse = {(x["kernel"], x["D"]): x["alone"] for x in g["gemm_batch4"] if x["R"] == 128}
    # greedy tiles are slower at both D (the short last tiles' drains exposed at the end) and miss 90 % at 11008
    assert worse["e4", 5120] < alone["e4", 5120] and worse["e4", 11008] < alone["e4", 11008], (worse, alone)
    assert worse["e4", 11008] < 0.90, worse
    assert all(le["device_efficiency"] >= 0.85 for le in g["load_eff"] if le["bytes"] >= 4 << 20), g["load_eff"]


def test_paper_attention_batch_stream_prices_the_whole_program():
    """Issue 29 item 1 in the model: ``attention_batch_s`` (each pair at its steady cost in the stream, plus the
    first pair's unhidden latency once) within 3 % of the model run over the batch's whole descriptor program
    (kernels.attention_batch at the paper geometry, mixed shares, GQA 1 and 4), and below the same pairs priced
    one by one from an idle device (``attention_s``)."""
    from firmware.ndp import kernels as K
    from hdl.ndp.config import PAPER
    from dataclasses import replace
    m = NDPPerfModel.paper(table=None)
    big = replace(PAPER, device_bytes=1 << 40)
    rng = np.random.default_rng(1)
    for g, kvh in ((1, 3), (4, 2)):
        toks = rng.integers(1, 5000, size=5)
        entries, base = [], 0
        for t in toks:
            padded = int(-(-t // m.lanes) * m.lanes)
            for _ in range(kvh):
                kv = K.kv_layout(128, padded, config=big, rows=g, base=base)
                base = kv["end"]
                entries.append((np.zeros((g, 128), np.uint16), kv))
        whole = m.program_cycles(K.attention_batch(entries, config=big).program) / 1e9
        est = m.attention_batch_s(toks, 128, g * kvh, kvh)
        alone = float(np.sum(m.attention_s(toks, 128, g * kvh, kvh)))
        assert abs(est - whole) / whole <= 0.03, (g, toks, est, whole)
        assert whole < alone
    assert m.attention_batch_s(np.zeros(3), 128, 32, 8) == 0.0


def test_paper_grouped_attention_stream_prices_the_whole_program():
    """The grouped decode attention (kernels.attention_grouped: 4 KV heads of head dim 128 per entry, or 8 in
    NARROW tiles of 64 tokens; issue 29) in the model at the paper geometry: ``attention_batch_s`` within 3 % of the
    model run over the batch's whole program in the order the hosts issue it (software-pipelined; shares of 1-200
    tokens, each in the tiles the model chooses for it: NARROW ones among them for GQA 1; GQA 1 and 4), that order
    over 15 % faster than the plain one, and faster than the per-head kernel on those shares;
    ``grouped_attention=False`` prices the per-head kernel only."""
    from firmware.ndp import kernels as K
    from hdl.ndp.config import PAPER
    from dataclasses import replace
    m = NDPPerfModel.paper(table=None)
    per_head = NDPPerfModel.paper(table=None, grouped_attention=False)
    big = replace(PAPER, device_bytes=1 << 40)
    rng = np.random.default_rng(2)
    for g, kvh in ((1, 8), (4, 4)):
        toks = rng.integers(1, 200, size=6)
        units = []
        m._attention_vec(toks, 128, g * kvh, kvh, m._attention_inc, units)
        assert set(units[0]) <= {1, 2} and (2 in units[0]) == (g == 1)     # (NARROW: 8 KV heads per entry)
        entries, base = [], 0
        for t, code in zip(toks, units[0]):
            W = 128 >> int(code == 2)
            padded = int(-(-t // W) * W)
            for _ in range(kvh // (512 // W)):
                kv = K.kv_group_layout(128, padded, config=big, rows=g, base=base, narrow=bool(code == 2))
                base = kv["end"]
                entries.append((np.zeros((g, kv["group"], 128), np.uint16), kv))
        # the batch as the hosts issue it: software-pipelined over two owners
        whole = m.program_cycles(K.attention_batch(entries, config=big, pipelined=True).entries()) / 1e9
        plain = m.program_cycles(K.attention_batch(entries, config=big).program) / 1e9
        est = m.attention_batch_s(toks, 128, g * kvh, kvh)
        assert m.uses_grouped(128, g * kvh, kvh) and not per_head.uses_grouped(128, g * kvh, kvh)
        assert abs(est - whole) / whole <= 0.03, (g, toks, est, whole)
        assert whole < 0.85 * plain
        assert est < per_head.attention_batch_s(toks, 128, g * kvh, kvh)
    assert not m.uses_grouped(128, 6, 3) and not m.uses_grouped(64, 32, 32)
    assert m.uses_grouped(64, 32, 32, narrow=True) and not m.uses_grouped(128, 16, 4, narrow=True)


def test_writer_waveform_reader_reads_the_core_and_refuses_a_missing_signal(tmp_path):
    """The calibration's per-descriptor writes come from a waveform (sim.perf.ndp.rtl_written): the reader takes
    the core's ``rp_out`` advances after reset, in cycles, ignores the same name in another scope, and fails when
    the core's signal is missing instead of returning nothing."""
    from sim.perf.ndp import _vcd_advances
    vcd = tmp_path / "w.vcd"
    vcd.write_text("$scope module bench $end\n$scope module top $end\n"
                   "$scope module other $end\n$var wire 4 \" rp_out $end\n$upscope $end\n"
                   "$scope module core $end\n$scope module core $end\n$var wire 4 ! rp_out $end\n$upscope $end\n"
                   "$upscope $end\n$upscope $end\n$upscope $end\n$enddefinitions $end\n"
                   "#0\nb0 !\nb0 \"\n#1500000\nb1 \"\n#3500000\nb1 !\nb10 \"\n#7500000\nb10 !\n")
    assert _vcd_advances(vcd, "rp_out") == [3, 7]
    with pytest.raises(RuntimeError, match="no signal"):
        _vcd_advances(vcd, "rp_in")
