"""The fast DRAM model's command stream, recorded from its Python path.

``sim.perf.dram.DRAMPerfModel`` counts ACT / PRE / REF and returns each request's column-command cycle, but not
the command list the energy model needs (when each bank opens and closes). :func:`record_stream` runs the model's
own Python path (``_simulate_py``, the reference the compiled kernel is tested against) with its ``record`` hook,
which the replay calls for every command it issues (ACT, PRE, PREA, REF and the column commands) with its bus
cycle (a command decided in cycle ``t`` is on the bus in ``t + 1``, as in the RTL trace), rank, bank, row and
column. The recorded counts are checked against the model's own, and tests/sim/energy/test_dram_energy.py checks
the recorded stream equal, command for command, to the RTL trace.
"""

import numpy as np

from hdl.memctl.commands import Cmd
from sim.dram.trace import TraceCommand
from sim.perf.dram import DRAMPerfModel

__all__ = ["record_stream", "record_ndp_stream"]


def record_stream(model: DRAMPerfModel, addresses, writes=None, *, frontend=None):
    """``(StreamResult, commands)``: the model's Python-path schedule of the stream and the command list it
    issued (TraceCommand, bus cycles, issue order)."""
    org = model.config.org
    G, K = org.bank_groups, org.banks_per_group
    out = []

    def record(kind, t, r, b, row, col, write):
        if kind == "COL":
            out.append(TraceCommand(t, Cmd.WR if write else Cmd.RD, r, (b // K) % G, b % K, row, col))
        elif kind in ("ACT", "PRE"):
            # the RTL's trace carries the request's row on its PRE too (the row it makes way for)
            out.append(TraceCommand(t, Cmd[kind], r, (b // K) % G, b % K, row, 0))
        else:  # PREA, REF
            out.append(TraceCommand(t, Cmd[kind], r))

    res = model._simulate_py(addresses, writes, frontend=frontend, record=record)
    got = {k: sum(c.kind is k for c in out) for k in (Cmd.ACT, Cmd.REF)}
    pres = sum(c.kind in (Cmd.PRE, Cmd.PREA) for c in out)
    cols = sum(c.kind in (Cmd.RD, Cmd.WR) for c in out)
    if (got[Cmd.ACT], pres, got[Cmd.REF], cols) != (res.acts, res.pres, res.refs, len(res.col_cycles)):
        raise RuntimeError(f"recorded {got[Cmd.ACT]} ACT / {pres} PRE / {got[Cmd.REF]} REF / {cols} column commands,"
                           f" the model counted {res.acts} / {res.pres} / {res.refs} / {len(res.col_cycles)}")
    return res, out


def record_ndp_stream(devmem, lines, writes=None):
    """``(StreamResult, commands)`` of one channel of ``sim.perf.devmem.DeviceMemoryPerfModel`` ``devmem`` for a
    back-to-back stream of NDP ``lines``: the arguments its ``ndp_simulate`` builds (the channel's burst
    addresses, the writes per burst, the device memory system's front end), recorded by :func:`record_stream`.
    Every channel does the same (that model's premise), so the device's energy is ``devmem.channels`` times
    this channel's."""
    from sim.perf.dram import EntryFrontend
    S = devmem.bursts_per_granule
    w = None if writes is None else np.repeat(np.broadcast_to(np.asarray(writes, dtype=bool),
                                                              (np.asarray(lines).size,)), S)
    fe = EntryFrontend(bursts=S, fifo_depth=devmem.fifo_depth, slots=devmem.ndp_slots)
    res, cmds = record_stream(devmem.channel, devmem.channel_bursts(lines), w, frontend=fe)
    ref = devmem.ndp_simulate(lines, writes)
    if (res.cycles, res.acts, res.pres, res.refs) != (ref.cycles, ref.acts, ref.pres, ref.refs):
        raise RuntimeError("record_ndp_stream: the recorded schedule differs from DeviceMemoryPerfModel.ndp_simulate "
                           "(its arguments changed); update sim/energy/record.py")
    return res, cmds
