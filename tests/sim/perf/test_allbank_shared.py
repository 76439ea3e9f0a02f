"""One table of all-bank rules (hdl/pim/allbank.py) for the firmware program, the DRAM model and the PIM model.

``firmware/pim_stream.all_bank_schedule`` (the greedy program), ``sim/perf/dram.DRAMPerfModel.all_bank_cycles``
(closed form) and ``sim/perf/pim.PIMPerfModel`` (row stream) must all read :func:`hdl.pim.allbank.allbank_gaps`:
each test mutates one rule of the table and checks that all three change and still agree with each other (a
model with its own copy of the rules would keep its old answer and fail). The RTL sequencer's counters come from
the same function (``hdl/pim/rank_pu.py``; held to the PIM model by tests/hdl/pim)."""

import pytest

import hdl.pim.allbank as allbank
from firmware.pim_stream import all_bank_schedule, schedule_end
from hdl.memctl.commands import Cmd
from hdl.memctl.timing import DDR4_3200_TINY, LPDDR5X_8533_TINY
from hdl.pim.config import PAPER
from sim.perf.dram import DRAMPerfModel
from sim.perf.pim import PIMPerfModel, _Rank

A, R, P, F = Cmd.ACT_AB, Cmd.RD_AB, Cmd.PREA, Cmd.REF
#: (next kind, previous kind, cycles added to the rule): every rule that shapes a row or a refresh.
MUTATIONS = [(R, R, 1), (R, A, 5), (P, R, 3), (P, A, 200), (A, P, 7), (A, A, 300), (F, P, 40), (A, F, 100)]


def _rows(cfg, n):
    """Rows of n RD_ABs that last at least 1.5 tREFI (a row takes more than n tCCD_L + tRCD cycles)."""
    tm = cfg.timing
    return 3 * tm.tREFI // (2 * (n * tm.tCCD_L + tm.tRCD)) + 1


def _mutate(monkeypatch, nxt, prev, add):
    real = allbank.allbank_gaps

    def mutated(timing):
        g = {k: dict(v) for k, v in real(timing).items()}
        g[nxt][prev] += add
        return g
    monkeypatch.setattr(allbank, "allbank_gaps", mutated)


def _answers(cfg, n):
    """(firmware program's last command, DRAM model, REFs in the program): _rows(cfg, n) rows of n RD_ABs, 1 rank."""
    s = all_bank_schedule(cfg, _rows(cfg, n), n)
    return schedule_end(s), DRAMPerfModel(cfg).all_bank_cycles(_rows(cfg, n), n), sum(c.kind is F for c in s)


@pytest.mark.parametrize("cfg", [DDR4_3200_TINY, LPDDR5X_8533_TINY, PAPER.dram], ids=lambda c: c.name)
def test_dram_model_equals_program(cfg):
    """Unmutated: the closed form lands on the program's last command, refreshes included (1 and 2 ranks: the
    second rank one command-bus cycle behind)."""
    for n in (1, 3, cfg.org.bursts_per_row):
        prog, model, refs = _answers(cfg, n)
        assert model == prog and refs >= 1, (n, model, prog, refs)
    two = schedule_end(all_bank_schedule(cfg, 40, None, ranks=(0, 1)))
    assert abs(DRAMPerfModel(cfg).all_bank_cycles(40, ranks=2) - two) <= 0.01 * two


@pytest.mark.parametrize("mut", MUTATIONS, ids=lambda m: f"{m[0].name}-after-{m[1].name}+{m[2]}")
def test_mutated_rule_moves_all_three(monkeypatch, mut):
    """One rule of hdl/pim/allbank.py changed: the firmware program, the DRAM model and the PIM model all move,
    and the DRAM model (closed form) and the PIM model (row stream) still equal the program. Rows of one RD_AB
    where the rule binds only short rows (tRAS, the ACT_AB-to-ACT_AB window), else full rows."""
    nxt, prev, _ = mut
    short = (nxt, prev) in {(P, A), (A, A)}
    cfgs = (DDR4_3200_TINY, PAPER.dram)
    ns = [1 if short else c.org.bursts_per_row for c in cfgs]
    base = [_answers(c, n) for c, n in zip(cfgs, ns)]
    base_pim = _pim_stream(ns[1])
    _mutate(monkeypatch, *mut)
    for c, n, b in zip(cfgs, ns, base):
        prog, model, refs = _answers(c, n)
        assert model == prog and refs >= 1, (c.name, mut, model, prog)
        assert prog != b[0] and model != b[1], (c.name, mut, b, prog)
    pim = _pim_stream(ns[1])
    s = all_bank_schedule(PAPER.dram, _rows(PAPER.dram, ns[1]), ns[1])
    assert pim == (schedule_end(s), sum(c.kind is F for c in s)) and pim[0] != base_pim[0], (mut, pim, base_pim)
    if not short:       # a whole head of the PIM model (PAPER L = 4096: 16 rows of 128 RD_ABs)
        h = PIMPerfModel(PAPER, refresh="in_head").head(4096)
        assert h.command_cycles == schedule_end(all_bank_schedule(PAPER.dram, 16, 128)) + 1


def _pim_stream(n):
    """The PIM model's row stream (sim/perf/pim._Rank) of _rows rows of n RD_ABs on PAPER: (last command,
    REFs)."""
    tm = PAPER.dram.timing
    r = _Rank(tm, tm.tREFI)
    return r.stream([n] * _rows(PAPER.dram, n), in_head_refresh=True), r.refs
