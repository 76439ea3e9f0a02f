"""The device memory system's fast model (sim/perf/devmem.py) gives the RTL's energy: one mixed NDP read/write
stream on 2 LPDDR5X channels (hdl/memctl/devmem.py under Verilator); each channel's RTL trace equals the recorded
stream of the model's channel up to the model's last command, and energies agree (the RTL may start a refresh
in the response tail after the model's last command: those commands are reported, and must be REF/PREA only)."""

from dataclasses import replace

import numpy as np

from hdl.memctl.commands import Cmd
from hdl.memctl.timing import DRAMConfig, LPDDR5X_8533_TINY
from sim.devmem.backend import backend as devmem_backend
from sim.devmem.model import DeviceMemoryModel
from sim.devmem.system import DeviceMemorySystem
from sim.dram.checker import check_trace, describe
from sim.dram.trace import decode_trace
from sim.energy.dram import trace_energy
from sim.energy.record import record_ndp_stream
from sim.perf.devmem import DeviceMemoryPerfModel

# the timing-only 4-row set-up of tests/hdl/memctl/test_devmem.py (same Verilator build when no storage differs)
CFG = DRAMConfig(name="lpddr5x-8533-4rows", org=replace(LPDDR5X_8533_TINY.org, name="lpddr5x-8533-4rows", rows=4),
                 timing=LPDDR5X_8533_TINY.timing)


def test_devmem_fast_model_energy_equals_rtl():
    sys_ = DeviceMemorySystem(config=CFG, channels=2, hierarchical=True, device_init={}, ndp_tag_width=8,
                              host_tag_width=24)
    mem = sys_.memory
    codec = DeviceMemoryModel(mem).codec
    model = DeviceMemoryPerfModel(CFG, channels=2, ndp_slots=mem.ndp_slots, fifo_depth=mem.fifo_depth)
    rng = np.random.default_rng(5)
    n = 1500
    lines = rng.integers(0, 1 << mem.ndp_addr_bits, n)
    w = rng.random(n) < 0.3
    reqs = [codec.ndp(int(a), bool(x), 0, k & 0xFF) for k, (a, x) in enumerate(zip(lines, w))]
    run = devmem_backend("verilator").run_streams(sys_, {"ndp_req": reqs, "host_req": []},
                                                  {"ndp_rsp": int((~w).sum()), **sys_.collect_all()})
    res, fast = record_ndp_stream(model, lines, w)
    assert res.cycles == run.cycles
    assert sum(c.kind is Cmd.REF for c in fast) >= 1 and sum(c.kind is Cmd.WR for c in fast) >= 1
    e_fast = trace_energy(fast, CFG, end_cycle=res.cycles)
    last = fast[-1].cycle
    for ch in range(sys_.channels):
        rtl = decode_trace(run.outputs[f"trace{ch}"], CFG.org)
        v = check_trace(rtl, CFG, end_cycle=run.cycles - 1)
        assert not v, describe(v[:10])
        head = [c for c in rtl if c.cycle <= last]
        tail = [c for c in rtl if c.cycle > last]
        assert head == fast, f"channel {ch}"
        assert all(c.kind in (Cmd.PREA, Cmd.REF) for c in tail), tail
        e_rtl = trace_energy(rtl, CFG, end_cycle=run.cycles)
        e_head = trace_energy(head, CFG, end_cycle=run.cycles)
        print(f"\nchannel {ch}: RTL {e_rtl.total_pj:.1f} pJ, fast {e_fast.total_pj:.1f} pJ "
              f"({100 * (e_fast.total_pj - e_rtl.total_pj) / e_rtl.total_pj:+.4f} %), RTL tail: "
              f"{', '.join(map(str, tail)) or 'none'}")
        assert e_fast.total_pj == e_head.total_pj
        assert abs(e_fast.total_pj - e_rtl.total_pj) <= 0.01 * e_rtl.total_pj
