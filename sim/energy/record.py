"""The fast DRAM model's command stream, recorded from its Python path without changing it.

``sim.perf.dram.DRAMPerfModel`` counts ACT / PRE / REF and returns each request's column-command cycle, but not
the command list the energy model needs (when each bank opens and closes). :func:`record_stream` runs the
model's own Python path (``_simulate_py``, the reference the compiled kernel is tested against) under a line
tracer (``sys.settrace``) that fires on the five statements where the replay issues a command -- ``acts += 1``
(ACT), the two ``pres += 1`` (PREA, then PRE, in source order), ``refs += 1`` (REF) and ``col[j] = t + 1``
(RD / WR) -- and reads the decision cycle ``t`` and the request / bank / rank in the frame's locals. A command
decided in cycle ``t`` is on the bus in ``t + 1`` (the model's ``col[j] = t + 1``), as in the RTL trace.

The statements are found by their text in the model's source at call time, so a rewrite that changes them makes
this raise instead of recording wrongly; the recorded counts are checked against the model's own, and
tests/sim/energy/test_dram_energy.py checks the recorded stream equal, command for command, to the RTL trace.
"""

import inspect
import sys

from hdl.memctl.commands import Cmd
from sim.dram.trace import TraceCommand
from sim.perf.dram import DRAMPerfModel

__all__ = ["record_stream", "record_ndp_stream"]

_TARGETS = {}


def _targets():
    if not _TARGETS:
        fn = DRAMPerfModel._simulate_py
        lines, first = inspect.getsourcelines(fn)
        found = {"acts": [], "pres": [], "refs": [], "col": []}
        for i, text in enumerate(lines):
            s = text.strip()
            if s == "acts += 1":
                found["acts"].append(first + i)
            elif s == "pres += 1":
                found["pres"].append(first + i)
            elif s == "refs += 1":
                found["refs"].append(first + i)
            elif s == "col[j] = t + 1":
                found["col"].append(first + i)
        shape = {k: len(v) for k, v in found.items()}
        if shape != {"acts": 1, "pres": 2, "refs": 1, "col": 1}:
            raise RuntimeError(f"sim.perf.dram._simulate_py no longer has the command statements this recorder "
                               f"hooks (found {shape}); update sim/energy/record.py")
        _TARGETS.update({found["acts"][0]: "ACT", found["pres"][0]: "PREA", found["pres"][1]: "PRE",
                         found["refs"][0]: "REF", found["col"][0]: "COL"})
        _TARGETS["code"] = fn.__code__
    return _TARGETS


def record_stream(model: DRAMPerfModel, addresses, writes=None, *, frontend=None):
    """``(StreamResult, commands)``: the model's Python-path schedule of the stream and the command list it
    issued (TraceCommand, bus cycles, issue order)."""
    tg = _targets()
    code = tg["code"]
    org = model.config.org
    G, K = org.bank_groups, org.banks_per_group
    out = []
    append = out.append

    def local(frame, event, arg):
        if event == "line":
            what = tg.get(frame.f_lineno)
            if what is not None:
                v = frame.f_locals
                t = v["t"] + 1
                if what == "COL":
                    j, b = v["j"], v["b"]
                    kind = Cmd.WR if v["wr_l"][j] else Cmd.RD
                    append(TraceCommand(t, kind, v["r"], (b // K) % G, b % K, v["row_l"][j], v["col_l"][j]))
                elif what in ("ACT", "PRE"):
                    j, b = v["j"], v["b"]
                    # the RTL's trace carries the request's row on its PRE too (the row it makes way for)
                    append(TraceCommand(t, Cmd[what], v["r"], (b // K) % G, b % K, v["row_l"][j], 0))
                else:  # PREA, REF
                    append(TraceCommand(t, Cmd[what], v["ref_rank"]))
        return local

    def global_(frame, event, arg):
        return local if frame.f_code is code else None

    old = sys.gettrace()
    sys.settrace(global_)
    try:
        res = model._simulate_py(addresses, writes, frontend=frontend)
    finally:
        sys.settrace(old)
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
    import numpy as np
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
