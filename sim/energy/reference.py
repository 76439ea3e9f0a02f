"""The outside check: the same command stream through ``energydram`` (PyPI, Mingyu Gao; Micron TN-41-01's
method, the one DRAMsim3 and DRAMPower 4 also use), fed the same datasheet currents.

energydram takes counts and state cycles, not a trace, so :func:`energydram_energy` derives them from the
stream the way a user of its API would: bank activations (an ACT_AB counts every bank), bursts read and written
(RD_AB / WR_AB every bank), REFs, and per rank the cycles with a bank open (``cycles_bankact_ckehi``) and with
every bank closed (``cycles_bankpre_ckehi``); no power-down cycles. DDR4 goes through ``EnergyDDR(ddr=4)`` (VDD
and VPP domains); energydram has no LPDDR5 class (``EnergyLPDDR`` stops at LPDDR4 and checks LPDDR4 voltages), so
LPDDR5X goes through its ``VoltageDomain``, one per rail, summed -- the same per-domain formulas EnergyLPDDR sums.

Differences from :func:`sim.energy.dram.trace_energy`, both exact (:func:`explained_difference`):

* energydram charges a whole ACT-PRE pair (``IDD0 tRC - IDD3N tRAS - IDD2N tRP``) per ACT; ours charges the PRE
  part when the bank is precharged, so a bank still open at the window's end costs energydram one PRE more;
* energydram's refresh term subtracts IDD3N (``(IDD5 - IDD3N) tRFC``) but its background, fed the bank states,
  counts a refreshing rank (every bank closed) at IDD2N; ours counts tRFC after a REF as active standby, so
  energydram is lower by ``(IDD3N - IDD2N) tRFC`` per REF (the part of tRFC inside the window).
"""

from hdl.memctl.commands import Cmd

from .dram import _union_length, command_energy
from .specs import PowerSpec, power_spec

__all__ = ["stream_counts", "energydram_energy", "explained_difference"]


def stream_counts(commands, config, *, start_cycle=0, end_cycle=None) -> dict:
    """The counts and bank-state cycles energydram's API takes, from a command stream."""
    org = config.org
    commands = list(commands)
    if end_cycle is None:
        end_cycle = (commands[-1].cycle + 1) if commands else start_cycle
    R, K, NB = org.ranks, org.banks_per_group, org.banks
    opened = [dict() for _ in range(R)]
    spans = [[] for _ in range(R)]
    n = {"act": 0, "rd": 0, "wr": 0, "ref": 0, "ref_cycles": 0}  # ref_cycles: REF-to-tRFC cycles in the window
    for c in commands:
        ob, k = opened[c.rank], c.kind
        if k is Cmd.ACT:
            ob[c.bg * K + c.bank] = c.cycle
            n["act"] += 1
        elif k is Cmd.ACT_AB:
            ob.update({b: c.cycle for b in range(NB)})
            n["act"] += NB
        elif k in (Cmd.PRE, Cmd.PREA):
            banks = [c.bg * K + c.bank] if k is Cmd.PRE else list(ob)
            for b in banks:
                if b in ob:
                    spans[c.rank].append((ob.pop(b), c.cycle))
        elif k is Cmd.RD:
            n["rd"] += 1
        elif k is Cmd.WR:
            n["wr"] += 1
        elif k is Cmd.RD_AB:
            n["rd"] += NB
        elif k is Cmd.WR_AB:
            n["wr"] += NB
        elif k is Cmd.REF:
            n["ref"] += 1
            n["ref_cycles"] += max(0, min(c.cycle + config.timing.tRFC, end_cycle) - max(c.cycle, start_cycle))
    for r in range(R):
        spans[r] += [(s, end_cycle) for s in opened[r].values()]
    act = sum(_union_length(spans[r], start_cycle, end_cycle) for r in range(R))
    n.update(cycles_bankact=act, cycles_bankpre=R * (end_cycle - start_cycle) - act,
             open_at_end=sum(len(o) for o in opened))
    return n


def _idds(rail):
    from energydram import IDDs
    return IDDs(idd0=rail.idd0, idd2n=rail.idd2n, idd2p=rail.idd2p, idd3n=rail.idd3n,
                idd3p=max(rail.idd3p, rail.idd2p),  # unused (no power-down); energydram requires IDD3P >= IDD2P
                idd4r=rail.idd4r, idd4w=rail.idd4w, idd5=rail.idd5b)


def energydram_energy(commands, config, spec: PowerSpec | None = None, *, start_cycle=0, end_cycle=None) -> dict:
    """energydram's energy (pJ) of the stream, by term, with the counts it was fed."""
    from energydram import EnergyDDR, Timing, VoltageDomain
    spec = power_spec(config) if spec is None else spec
    tm, org = config.timing, config.org
    n = stream_counts(commands, config, start_cycle=start_cycle, end_cycle=end_cycle)
    tck = tm.tck_ps / 1000.0
    timing = Timing(RAS=tm.tRAS, REFI=tm.tREFI, RFC=tm.tRFC, RP=tm.tRC - tm.tRAS, RRD=tm.tRRD_S)
    if config.timing.name.startswith("ddr4"):
        vdd, vpp = spec.rails
        model = EnergyDDR(tck, timing, vdd.volts, _idds(vdd), spec.dies_per_rank, ddr=4, vpp=vpp.volts,
                          ipps=_idds(vpp))
        act = model.activate_energy(num_act=n["act"])
        rw = model.readwrite_energy(num_rd=n["rd"], num_wr=n["wr"])
        ref = model.refresh_energy(num_ref=n["ref"])
        bg = model.background_energy(cycles_bankpre_ckehi=n["cycles_bankpre"], cycles_bankact_ckehi=n["cycles_bankact"])
    else:
        doms = [VoltageDomain(tck, r.volts, _idds(r), spec.dies_per_rank, org.burst_cycles) for r in spec.rails]
        act = sum(d.activate_energy(timing, num_act=n["act"]) for d in doms)
        rw = sum(d.readwrite_energy(num_rd=n["rd"], num_wr=n["wr"]) for d in doms)
        ref = sum(d.refresh_energy(timing, num_ref=n["ref"]) for d in doms)
        bg = sum(d.background_energy(cycles_bankpre_ckehi=n["cycles_bankpre"],
                                     cycles_bankact_ckehi=n["cycles_bankact"]) for d in doms)
    return {"act_pre_pj": act, "rd_wr_pj": rw, "ref_pj": ref, "background_pj": bg, "total_pj": act + rw + ref + bg,
            "counts": n}


def explained_difference(outside: dict, config, spec: PowerSpec | None = None) -> float:
    """ours - energydram's total (pJ) predicted from the two documented method differences (module docstring)."""
    spec = power_spec(config) if spec is None else spec
    e = command_energy(config, spec)
    n = outside["counts"]
    tck = config.timing.tck_ps / 1000.0
    ref_bg = n["ref_cycles"] * tck * spec.dies_per_rank * \
        sum(r.volts * (r.idd3n - r.idd2n) for r in spec.rails)
    return ref_bg - n["open_at_end"] * e.pre
