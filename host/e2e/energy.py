"""Energy of the end-to-end run's device work (issue 33 item 3), on the RTL from its traces and on the perf backend
from the fast models, by the same accounting (docs/energy.md "Energy in runs"):

* an NDP device's run (:func:`ndp_run_energy`): the datapath and SRAM work of the descriptors it ran
  (sim.energy.ndp.program_counts / work_pj: the same on every backend), and its device memory's energy over the
  run's window (first issue to last completion, in memory clocks): on ``rtl`` with the LPDDR5X memory, every
  channel's command trace of the window (sim.energy.dram.trace_energy); otherwise the device memory's fast model
  (sim.perf.devmem, one channel per granule interleave: the e2e device's 64-byte line is one granule of channel
  ``line mod channels``) recording the descriptors' lines (sim.energy.record.record_ndp_stream) over the window.
  The e2e device on the ``burst`` memory has no DRAM in its RTL: both backends then charge the fast model of the
  ``lpddr5x`` option's channels;
* a PIM launch batch: sim.energy.pim.trace_launch_energy (rtl) or launch_energy (the perf model).
"""

from functools import lru_cache

import numpy as np

from sim.energy.ndp import lines_of

__all__ = ["ndp_run_energy", "ndp_dram_config"]


@lru_cache(maxsize=None)
def ndp_dram_config(depth: int, channels: int):
    """The LPDDR5X configuration of the e2e device memory (sim.cxl.devmem_system.dram_config_for)."""
    from sim.cxl.devmem_system import dram_config_for
    return dram_config_for(depth, channels)


@lru_cache(maxsize=None)
def _devmem1(dram_config):
    from sim.perf.devmem import DeviceMemoryPerfModel
    return DeviceMemoryPerfModel(dram_config, channels=1)


def ndp_run_energy(config, descs, window: int, *, channels: int, depth: int, traces=None, first_issue: int = 0,
                   dram_config=None, link=(0, 0), refreshes=None) -> dict:
    """pJ of one NDP run (module docstring): ``logic`` (datapath + SRAM) and ``dram`` (every channel), with
    ``source`` (``rtl-trace`` or ``fast-model``). ``window``: memory clocks from the first issue; ``traces``:
    {channel: [TraceCommand]} of an RTL run (cycles since reset; ``first_issue`` the run's first issue).
    ``link``: (bytes the host sends, bytes it reads back) -- on the CXL device both pass through the device memory
    (the host writes descriptors and inputs to the submission ring, the core reads them; the core writes results
    and completion records, the host reads them), so the fast model streams them too: the host's lines written
    then read, the operand lines, the results written then read; and it charges the refreshes due in the window
    that its short stream does not issue: ``refreshes`` ([(rank, cycle in the window)], every channel alike) where
    the caller knows the controller's refresh schedule (host.e2e.perf.RankRefresh: the LPDDR5X calibration), each a
    PREA of the rank and its REF, else the steady-state share (sim.energy.dram.owed_refresh_pj)."""
    from sim.energy.ndp import program_counts, work_pj
    from sim.energy.dram import trace_energy, owed_refresh_pj, command_energy
    from sim.energy.record import record_ndp_stream
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    cfg_dram = dram_config if dram_config is not None else ndp_dram_config(depth, channels)
    line = 64                                          # one CXL.mem line = one granule (hdl/cxl/device.py)
    counts = program_counts(descs, config, line)
    dp, sram = work_pj(counts, config)
    dram = 0.0
    if traces is not None:
        for c in range(channels):
            tr = [x for x in traces[c] if first_issue <= x.cycle < first_issue + window]
            dram += trace_energy(tr, cfg_dram, start_cycle=first_issue, end_cycle=first_issue + max(1, window)
                                 ).total_pj
        src = "rtl-trace"
    else:
        lines, writes = lines_of(descs, line)
        top = int(lines.max()) + 1 if lines.size else 0
        n_out, n_in = -(-int(link[0]) // line), -(-int(link[1]) // line)
        lo = np.arange(top, top + n_out, dtype=np.int64)
        li = np.arange(top + n_out, top + n_out + n_in, dtype=np.int64)
        lines = np.concatenate([lo, lo, lines, li, li])
        writes = np.concatenate([np.ones(n_out, bool), np.zeros(n_out, bool), writes, np.ones(n_in, bool),
                                 np.zeros(n_in, bool)])
        dm = _devmem1(cfg_dram)
        for c in range(channels):
            sel = lines % channels == c
            lc, wc = lines[sel] // channels, writes[sel]
            if lc.size:
                res, cmds = record_ndp_stream(dm, lc % (1 << dm.line_addr_bits), wc if wc.any() else None)
                end = max(int(res.cycles), int(window), 1)
            else:
                cmds, end = [], max(int(window), 1)
            if refreshes is None:
                e = trace_energy(cmds, cfg_dram, end_cycle=end)
                dram += e.total_pj + owed_refresh_pj(e, cfg_dram)
            else:
                # the controller's refreshes at their cycles: PREA (closing the rank's open rows), REF tRPab later
                from hdl.memctl.commands import Cmd
                from sim.dram.trace import TraceCommand
                tm = cfg_dram.timing
                extra = []
                for r, t in refreshes:
                    extra += [TraceCommand(int(t), Cmd.PREA, r), TraceCommand(int(t) + tm.tRPab, Cmd.REF, r)]
                allc = sorted(list(cmds) + extra, key=lambda x: x.cycle)
                dram += trace_energy(allc, cfg_dram, end_cycle=max(end, allc[-1].cycle + 1) if allc else end).total_pj
        src = "fast-model"
    return {"logic": dp + sram, "dram": dram, "source": src}
