# amaranth: UnusedElaboratable=no
"""Property test of the CXL NDP device RTL under Verilator: random multi-queue programs (host/fuzz/cxl.py)
against the golden device replayed in the RTL's order.

Each Hypothesis example runs *batches* (seeds derived from the example's seed) until it has run
:data:`CASES_PER_EXAMPLE` cases; a batch packs as many independent random cases (2-4 queues each: random
rings, windows, descriptors mostly valid and small, out-of-window operands, malformed descriptors, early /
coalesced / late doorbells, interleavings, random stalls) as fit in the example's number of queues (of the 16 of
one device) and runs them concurrently in one Verilator run. Half of the batches use the queue-window layout (every
ring and completion area inside QWIN, data windows above it; some configurations are refused by the CSR); the
forging batches add accesses with other PASIDs (valid slot headers + input written into another queue's ring,
before or after its own valid word, some covered by a rogue DOORBELL; completion reads; reserved queue-window
space). Queue PASIDs come half from a small set, so queues share them. Properties, per case: every submission
completes within the run's cycle bound (no hang); every core memory request lies in its queue's window and in an
accepted operand of that queue; every window area read back at the end equals its initial data plus the queue's
own STOREs (nothing else wrote it, forged writes included); events, completion records, results, window data and
read error bits equal the golden device's; the golden filter rejects exactly the forged requests, the RTL answers
every forged read with zeros + err, refuses the refused configurations, and its final HMEM_REJECTS read equals
the golden count (exactly when the read could be held past every forged request, else at most).

``CXL_FUZZ_CASES`` (default 10,000) sets the cases, at least, over :data:`SHARDS` shards (so ``pytest -n 2``
spreads them over both workers and balances the end of the run): ``ceil(CXL_FUZZ_CASES / SHARDS /
CASES_PER_EXAMPLE)`` examples per shard. 10,000 cases take ~215 s of one core (~21 ms per case, idle core; the
filter features add no measurable time: same simulated cycles, docs/cxl_device.md "Measured").
``python -m host.fuzz.cxl --cases N`` runs long campaigns.
"""

import os

import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

import numpy as np

from firmware.ndp.descriptor import load, softmax
from host.cxl_driver import Driver, backend_named
from sim.backends import SimulationTimeout
from sim.golden.cxl_device import status_name
from hdl.cxl.device import WINDOW_VIOLATION
from host.fuzz.cxl import run_batch, make_batch, check_batch, _late_delay, FUZZ_QUEUES, FUZZ_CONFIG, FUZZ_DEPTH

CASES = int(os.environ.get("CXL_FUZZ_CASES", "10000"))
#: Cases per Hypothesis example (several batches: the per-example overhead stays small, and the case count is
#: exact whatever number of queues the example draws).
CASES_PER_EXAMPLE = 25
SHARDS = 4
EXAMPLES = max(1, -(-CASES // (SHARDS * CASES_PER_EXAMPLE)))


def _report(res):
    lines = [f"seed {res.seed}: {res.cases} cases"]
    lines += [f"hang: case {c}" for c in res.hangs]
    lines += [f"window escape: case {c}: {m}" for c, m in res.escapes[:5]]
    lines += [f"corrupted: case {c} q{q}: {m}" for c, q, m in res.corrupted[:5]]
    lines += [f"mismatch: case {c}: {m}" for c, m in res.mismatches[:10]]
    return "\n".join(lines)


@pytest.mark.parametrize("shard", range(SHARDS))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**55), max_subs=st.integers(1, 6),
       queues=st.sampled_from([2, 5, 8] + [FUZZ_QUEUES] * 9))
def test_random_programs(shard, seed, max_subs, queues):
    backend = backend_named("verilator")
    done = k = 0
    while done < CASES_PER_EXAMPLE:        # batch seeds (4 seed + shard) * 64 + k: at most 25 batches (1 case each)
        res = run_batch(backend, ((SHARDS * seed + shard) << 6) + k, max_subs=max_subs, queues=queues)
        assert res.ok, _report(res)
        done += res.cases
        k += 1


def test_generator_covers_the_features():
    """The generator produces every feature the properties are about (checked on the scripts and the golden
    device, no RTL); the golden filter rejects exactly the forged requests (every forged read, nothing else) and
    the CSR refuses exactly the refused configurations."""
    feats, statuses, delays, layouts = set(), set(), set(), set()
    exact = 0
    for seed in range(40):
        b = make_batch(seed)
        for c in b.cases:
            feats |= c.features
        g = b.driver.run("golden")
        statuses |= {e.status for e in g.events}
        late = _late_delay(b.driver)
        delays.add("none" if b.mmio_delay == 0 else "late" if b.mmio_delay == late else "partial")
        layouts.add(b.qwin)
        assert sorted(g.golden.rejected) == sorted(k for ks in b.forged.values() for k in ks)
        refused = {i for ids in b.refused.values() for i in ids}
        assert {i for i, r in enumerate(g.mmio) if r.err} == refused
        for c in b.cases:
            for kind, _, _, h in b.handles[c.id]:
                assert g.rejected(h) == (kind == "forged")
        exact += b.rejects_read is not None and b.rejects_exact and any(b.forged.values())
    assert delays == {"none", "partial", "late"} and layouts == {False, True} and exact >= 2
    assert {"escape_other_window", "escape_straddle", "escape_below", "escape_wrap", "malformed", "ring_wrap",
            "doorbell_early", "doorbell_defer", "coalesced", "keep", "chain", "empty_window", "cross_chain",
            "chain_trans", "trans", "acc", "partial"} <= feats
    assert {"qwin", "pasid_shared", "forge_slot_before", "forge_slot_after", "rogue_doorbell", "forge_cpl_read",
            "reserved_read", "reserved_write", "refused_ring", "refused_cq", "refused_window", "dead_queue",
            "forged_early"} <= feats
    names = {status_name(s) for s in statuses}
    assert {"OK", "WINDOW_VIOLATION", "NO_CHAIN_INPUT", "FOREIGN_STATE", "UNKNOWN_TYPE", "MISALIGNED",
            "SIZE_MISMATCH", "BAD_FLAGS", "NOT_MULTIPLE"} <= names


def test_unaligned_window_limit_load():
    """Window [W, W + 32): LOAD of 3 elements at W (6 bytes, inside) would read the burst [W, W + 64): the
    engine checks whole lines, so it completes with WINDOW_VIOLATION (it used to hang the device: the guard
    dropped the burst read and the core waited for it)."""
    d = Driver(FUZZ_QUEUES, config=FUZZ_CONFIG, depth=FUZZ_DEPTH)
    w = 6 << 10
    d.configure(0, sq_base=0, entries=2, cq_base=3 << 10, win_base=w, win_limit=w + 32)
    d.store(w, np.arange(32, dtype=np.uint16))
    d.submit(0, load(w, 1, 3))
    d.submit(0, softmax(1, 8), np.zeros(8, np.uint16))
    h = d.read_completion(0, 0, result_bytes=16)
    try:
        rtl = d.run("verilator", max_cycles=20_000)
    except SimulationTimeout:
        pytest.fail("the device hangs")
    gold = d.run("golden", order=rtl.events)
    assert rtl.data(h) == gold.data(h)
    assert [e.status for e in rtl.events][0] == WINDOW_VIOLATION


def test_campaign_catches_an_owner_blind_device(monkeypatch):
    """Mutant check of the campaign's per-queue state property (issue 11 item 5): a device whose core ignores
    the owner (every queue's KEEP / CHAIN / PARTIAL state shared, as before per-queue state) is caught by the
    generated batches' completion statuses. The golden device plays both parts (the mutant: owner_of patched
    to 0), replayed in the same order; the correct device agrees with itself."""
    import sim.golden.cxl_device as gd
    caught = cross = 0
    for seed in range(16):
        batch = make_batch(seed)
        feats = set().union(*(c.features for c in batch.cases))
        gold = batch.driver.run("golden")
        same = check_batch(batch, gold, gold)
        assert not [m for m in same.mismatches if "events" in m[1]]
        with monkeypatch.context() as mp:
            mp.setattr(gd, "owner_of", lambda queue, pasid: 0)
            mutant = batch.driver.run("golden", order=gold.events)
        bad = [m for m in check_batch(batch, mutant, gold).mismatches if "events" in m[1]]
        cross += "cross_chain" in feats
        caught += bool(bad)
    assert cross >= 4 and caught >= 4, (cross, caught)
