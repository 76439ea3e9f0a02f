"""The self-driven speed tops of sim/dram/speed.py measure a working system (Amaranth's simulator, short runs).

The rates ``python -m sim.dram.speed`` and ``make bench-dram`` print are only meaningful if the tops really move
requests through the controller and the device: responses arrive, the device sees no violation, and the device-only
top's violation counter is wired (an illegal command in its replayed trace is counted).
"""

from hdl.memctl.commands import Cmd
from hdl.memctl.timing import LPDDR5X_8533_TINY as CFG
from sim.dram.speed import SelfDrivenMemorySystem, DeviceOnly, amaranth_cycles_per_s
from sim.dram.trace import TraceCommand

# Legal on lpddr5x-8533-tiny (the first commands the controller issues on sequential reads): ACT at 2, RD after
# tRCD = 20, the next RD tCCD_L = 4 later.
LEGAL = [TraceCommand(2, Cmd.ACT), TraceCommand(22, Cmd.RD), TraceCommand(26, Cmd.RD, col=1)]


def test_memory_system_top_serves_reads():
    r = amaranth_cycles_per_s(SelfDrivenMemorySystem(CFG), 120)
    assert r["violations"] == 0
    assert r["responses"] > 0 and r["commands"] > r["responses"]
    assert r["cycles_per_s"] > 0


def test_device_only_top_counts_violations():
    ok = amaranth_cycles_per_s(DeviceOnly(CFG, LEGAL), 60)
    assert (ok["commands"], ok["violations"], ok["responses"]) == (3, 0, 2 * CFG.org.burst_cycles)
    # Mutant trace: the first RD before tRCD has passed (T_RCD) -- the top must report it (and drop the read).
    bad = [LEGAL[0], TraceCommand(10, Cmd.RD), LEGAL[2]]
    r = amaranth_cycles_per_s(DeviceOnly(CFG, bad), 60)
    assert r["commands"] == 3 and r["violations"] >= 1
    assert r["responses"] == CFG.org.burst_cycles


def test_bad_inputs_are_refused_with_the_limit():
    """DeviceOnly registers its commands, so a trace command in cycle 0 cannot be replayed; the DRAM model derives
    tRC and tRCD from the tRAS stamp, so it needs tRC >= tRAS >= tRCD."""
    import dataclasses
    import pytest
    from sim.dram.device import DRAMChannel
    with pytest.raises(ValueError, match="from cycle 1 on.*cycle 0"):
        DeviceOnly(CFG, [TraceCommand(0, Cmd.ACT)])
    bad = dataclasses.replace(CFG, timing=dataclasses.replace(CFG.timing, tRCD=CFG.timing.tRAS + 1))
    with pytest.raises(ValueError, match="tRC >= tRAS >= tRCD"):
        DRAMChannel(bad, storage=False)
