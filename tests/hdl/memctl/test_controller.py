"""MemoryController + DRAM channel model: data integrity, exact latencies, bandwidth, refresh, legality.

Every run goes through :class:`sim.dram.system.MemorySystem`, and every recorded command trace must pass the
independent checker (``sim.dram.checker.check_trace``) with zero violations while the device model reports
none. Short runs take the ``backend`` fixture (both engines); long measurements run on Verilator only.
"""

import numpy as np
import pytest

from amaranth.hdl import Module, Signal

from hdl.memctl.commands import Cmd
from dataclasses import replace

from hdl.memctl.timing import DRAMConfig, DDR4_3200_TINY, LPDDR5X_8533_TINY
from hdl.memctl.addrmap import AddressMap, DEFAULT_ORDER
from hdl.memctl.controller import MemoryController
from sim.backends import get_backend, Traffic
from sim.dram.system import MemorySystem
from sim.dram.trace import decode_trace
from sim.dram.checker import check_trace, describe
from sim.dram.device import flat_burst_address

CFG = DDR4_3200_TINY
# Data-integrity runs need the device's storage, which Amaranth converts to Verilog at ~2-3 us per bit: the
# same DDR4 organisation with 4 rows per bank (2 Mbit instead of 16 Mbit) keeps those runs fast.
DATA_CFG = DRAMConfig(name="ddr4-3200-tiny-4rows", org=replace(CFG.org, name="ddr4-3200-tiny-4rows", rows=4),
                      timing=CFG.timing)

def make_system(config=None, policy="fr-fcfs", storage=True, **kw):
    """Every test uses one of few configurations (queue 16, 16-bit tags), so Verilator builds are shared.

    ``storage=False``: timing-only device (a read returns its own flat burst address); converts to Verilog in
    seconds instead of ~40 s for the 16 Mbit of DDR4_3200_TINY storage.
    """
    kw.setdefault("tag_width", 16)
    config = config or (DATA_CFG if storage else CFG)
    return MemorySystem(controller_config=config, policy=policy,
                        device_kwargs=None if storage else {"storage": False}, **kw)


def flat_addr(ctl, addr):
    """What a timing-only device returns for a read of burst address ``addr``."""
    d = ctl.amap.decode_py(int(addr))
    return flat_burst_address(ctl.config.org, d["rank"], d["bg"], d["bank"], d["row"], d["col"])


_REQ_FIELDS = {}


def req(ctl, addr, write=False, wdata=0, tag=0):
    """The packed request payload (``ctl.request_layout``), by shifts at the layout's field offsets: the same int
    as ``request_layout.const({...}).as_value().value`` (tests build up to 60k requests; that is ~50x faster)."""
    fields = _REQ_FIELDS.get(id(ctl.request_layout))
    if fields is None:
        fields = _REQ_FIELDS[id(ctl.request_layout)] = (
            ctl.request_layout, {name: (f.offset, f.width) for name, f in ctl.request_layout})
    out = 0
    for name, v in (("addr", addr), ("write", int(write)), ("wdata", wdata), ("tag", tag)):
        off, width = fields[1][name]
        v = int(v)
        if not 0 <= v < 1 << width:
            raise ValueError(f"request field {name}: {v} does not fit {width} bits")
        out |= v << off
    return out


def unpack_resp(ctl, payload):
    bb = ctl.config.org.burst_bits
    return payload & ((1 << bb) - 1), payload >> bb


def check_legal(sys_, run, config=None):
    """The trace passes the independent checker and the device reported nothing. Returns the commands."""
    config = config or sys_.device_config
    cmds = decode_trace(run.outputs["trace"], config.org)
    v = check_trace(cmds, config, end_cycle=run.cycles - 1)
    assert not v, describe(v[:20])
    assert run.outputs["errors"] == [], [hex(e) for e in run.outputs["errors"][:10]]
    return cmds


def run_system(backend, sys_, reqs, n_reads, traffic=None, max_cycles=None):
    return backend.run_streams(sys_, {"i": reqs}, {"o": n_reads, "trace": None, "errors": None},
                               traffic=traffic, max_cycles=max_cycles)


def random_workload(rng, ctl, n, addrs, write_frac=0.5):
    """Requests plus the expected read data per tag, from a dict model of memory (unwritten bursts read 0)."""
    model, reqs, expect = {}, [], {}
    bb = ctl.config.org.burst_bits
    for k in range(n):
        a = int(rng.choice(addrs))
        if rng.random() < write_frac:
            d = int.from_bytes(rng.bytes(bb // 8), "little")
            model[a] = d
            reqs.append(req(ctl, a, True, d, tag=k))
        else:
            reqs.append(req(ctl, a, False, 0, tag=k))
            expect[k] = model.get(a, 0)
    return reqs, expect


# ---------------------------------------------------------------------------------------------------------
# Address map and parameter validation
# ---------------------------------------------------------------------------------------------------------

def test_address_map_default_order():
    amap = AddressMap(CFG.org)
    assert amap.order == DEFAULT_ORDER
    assert amap.addr_bits == 15 and amap.bursts == 2 * 16 * 32 * 32
    d = amap.decode_py(np.arange(8))
    assert list(d["bg"]) == [0, 1, 2, 3, 0, 1, 2, 3]
    assert list(d["col"]) == [0, 0, 0, 0, 1, 1, 1, 1]
    a = np.arange(amap.bursts)
    d = amap.decode_py(a)
    assert np.array_equal(amap.encode_py(**d), a)
    assert amap.decode_py(4 * 32) == {"rank": 0, "bg": 0, "bank": 1, "row": 0, "col": 0}
    with pytest.raises(ValueError):
        AddressMap(CFG.org, order=("bg", "col", "bank", "row"))
    with pytest.raises(ValueError):
        AddressMap(CFG.org, order=("bg", "col", "bank", "rank", "row", "row"))
    with pytest.raises(ValueError):
        amap.decode_py(amap.bursts)


def test_address_map_hdl_matches_python():
    from amaranth.sim import Simulator
    amap = AddressMap(CFG.org, order=("col", "bank", "bg", "row", "rank"))
    m = Module()
    a = Signal(amap.addr_bits)
    fields = amap.decode(a)
    outs = {f: Signal(max(1, len(v)), name=f) for f, v in fields.items()}
    m.d.comb += [outs[f].eq(v) for f, v in fields.items()]
    rng = np.random.default_rng(3)
    samples = rng.integers(0, amap.bursts, 50)

    async def tb(ctx):
        for s in samples:
            ctx.set(a, int(s))
            exp = amap.decode_py(int(s))
            assert {f: ctx.get(outs[f]) for f in outs} == exp

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("kw", [dict(queue_depth=1), dict(policy="fifo"), dict(tag_width=-1),
                                dict(max_postponed_refresh=9), dict(max_postponed_refresh=0),
                                dict(response_depth=1), dict(addr_order=("row",))])
def test_controller_rejects_bad_parameters(kw):
    import gc
    import warnings
    from amaranth.hdl import UnusedElaboratable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError) as info:
            MemoryController(config=CFG, **kw)
        del info
        gc.collect()


# ---------------------------------------------------------------------------------------------------------
# Short runs on both engines
# ---------------------------------------------------------------------------------------------------------

def test_unloaded_latencies_exact(backend):
    """Closed-bank, row-hit and row-miss read latencies equal the documented formulas, cycle-exact."""
    tm, bc = CFG.timing, CFG.org.burst_cycles
    sys_ = make_system(storage=False)
    ctl = sys_.controller
    amap = ctl.amap
    a0 = amap.encode_py(bank=1, row=3, col=5)
    hit = amap.encode_py(bank=1, row=3, col=9)
    miss = amap.encode_py(bank=1, row=7, col=2)
    gap = 300
    pattern = np.zeros(3 * gap, dtype=bool)
    pattern[[0, gap, 2 * gap]] = True
    traffic = Traffic(valid={"i": pattern})
    lat = {}
    for n, name in ((1, "closed"), (2, "hit"), (3, "miss")):
        reqs = [req(ctl, a, tag=k) for k, a in enumerate([a0, hit, miss][:n])]
        run = run_system(backend, sys_, reqs, n, traffic)
        check_legal(sys_, run)
        lat[name] = run.cycles - 1 - (n - 1) * gap
    print(f"\nunloaded read latency (cycles): {lat}")
    assert lat["hit"] == tm.CL + bc + MemoryController.pipeline_cycles == ctl.read_latency("hit")
    assert lat["closed"] == tm.tRCD + tm.CL + bc + MemoryController.pipeline_cycles == ctl.read_latency("closed")
    assert lat["miss"] == tm.tRP + tm.tRCD + tm.CL + bc + MemoryController.pipeline_cycles \
        == ctl.read_latency("miss")


def test_trcd_counter_when_trc_does_not_exceed_trcd(backend):
    """The controller reads tRCD off each bank's ACT counter when tRC > tRCD, and keeps a tRCD counter per bank
    otherwise. That second path, scheduled with tRCD = tRC + 5 (the device keeps the real, shorter tRCD, so every
    command stays legal): a closed-bank read waits exactly the controller's tRCD, a row hit does not, and the
    device and the checker see no violation."""
    tm, bc = CFG.timing, CFG.org.burst_cycles
    slow = DRAMConfig(name="ddr4-3200-tiny-slow-trcd", org=CFG.org, timing=replace(tm, tRCD=tm.tRC + 5))
    sys_ = MemorySystem(controller_config=slow, device_config=CFG, device_kwargs={"storage": False},
                        tag_width=16, queue_depth=8)
    ctl = sys_.controller
    amap = ctl.amap
    gap = 300
    traffic = Traffic(valid={"i": np.isin(np.arange(2 * gap), [0, gap])})
    reqs = [req(ctl, amap.encode_py(bank=2, row=5, col=1), tag=0), req(ctl, amap.encode_py(bank=2, row=5, col=7), tag=1)]
    run = run_system(backend, sys_, reqs, 2, traffic, max_cycles=3000)
    cmds = check_legal(sys_, run, config=CFG)
    act = next(c.cycle for c in cmds if c.kind == Cmd.ACT)
    rds = [c.cycle for c in cmds if c.kind == Cmd.RD]
    assert rds[0] - act == tm.tRC + 5
    assert run.cycles - 1 - gap == tm.CL + bc + MemoryController.pipeline_cycles     # the row hit


@pytest.mark.parametrize("policy", ["fr-fcfs", "in-order"])
def test_random_read_write_bit_exact(backend, policy):
    """Random reads/writes to a small address set (hits, misses, RAW/WAR/WAW on the same burst)."""
    rng = np.random.default_rng(11 if policy == "fr-fcfs" else 12)
    sys_ = make_system(policy=policy)
    ctl = sys_.controller
    amap = ctl.amap
    addrs = np.unique(np.concatenate([
        rng.integers(0, amap.bursts, 12),
        amap.encode_py(rank=0, bg=0, bank=0, row=np.array([1, 2, 1, 2]), col=np.array([0, 0, 1, 1])),
    ]))
    reqs, expect = random_workload(rng, ctl, 80, addrs)
    run = run_system(backend, sys_, reqs, len(expect))
    check_legal(sys_, run)
    got = [unpack_resp(ctl, p) for p in run.outputs["o"]]
    tags = [t for _, t in got]
    assert sorted(tags) == sorted(expect)
    if policy == "in-order":
        assert tags == sorted(expect)  # request order
    for d, t in got:
        assert d == expect[t], f"tag {t}"
    print(f"\n{policy}: {len(reqs)} requests in {run.cycles} cycles")


def test_backpressure_loses_nothing(backend):
    """Random valid gaps on i and random ready on o: every read returns once, with the right data."""
    rng = np.random.default_rng(5)
    sys_ = make_system(storage=False)
    ctl = sys_.controller
    addrs = rng.integers(0, ctl.amap.bursts, 10)
    reqs, expect = random_workload(rng, ctl, 70, addrs, write_frac=0.3)
    # timing-only device: a read returns its own flat burst address
    expect = {t: flat_addr(ctl, reqs[t] & ((1 << ctl.amap.addr_bits) - 1)) for t in expect}
    traffic = Traffic(valid={"i": rng.random(501) < 0.8}, ready={"o": rng.random(499) < 0.25})
    run = run_system(backend, sys_, reqs, len(expect), traffic)
    check_legal(sys_, run)
    got = [unpack_resp(ctl, p) for p in run.outputs["o"]]
    assert sorted(t for _, t in got) == sorted(expect)
    for d, t in got:
        assert d == expect[t]


# ---------------------------------------------------------------------------------------------------------
# Long runs and measurements (Verilator)
# ---------------------------------------------------------------------------------------------------------

def _bw(n_bursts, cycles, bc):
    return n_bursts * bc / cycles


#: Sequential reads of the refresh run: 32,000 bursts x 4 cycles = 128k cycles = 10.3 tREFI of DDR4-3200, so
#: every rank owes at least 10 REFs and the bound below needs >= 2 of them (a controller without REF fails).
REFRESH_RUN_READS = 32_000


def refresh_problems(cmds, cycles, config, max_postponed):
    """Why the REF commands of a run of ``cycles`` cycles are wrong, or [] if they are right. Rank r's refresh
    timer first ticks at cycle tREFI - 1 + r tREFI / ranks (the controller's stagger), so by the end of the run it
    owes ``due_r = floor((cycles - r tREFI / ranks) / tREFI)`` REFs; the controller postpones at most
    ``max_postponed`` of them and never refreshes ahead: ``due_r - max_postponed <= REFs_r <= due_r``. Also the
    checker's JEDEC rule (at most 8 postponed, checked at every cycle)."""
    tm, org = config.timing, config.org
    out = []
    for r in range(org.ranks):
        due = (cycles - r * (tm.tREFI // org.ranks)) // tm.tREFI
        refs = sum(1 for c in cmds if c.kind is Cmd.REF and c.rank == r)
        if not due - max_postponed <= refs <= due:
            out.append(f"rank {r}: {refs} REFs, expected {due - max_postponed}..{due} ({due} due)")
    out += [f"T_REFI: {v}" for v in check_trace(cmds, config, end_cycle=cycles - 1) if v.violation.name == "T_REFI"]
    return out


def test_sequential_read_bandwidth_and_refresh():
    """Sequential reads over 10 refresh intervals: >= 95% of peak x (1 - tRFC/tREFI); REF count per rank within
    the postponement bound (which, over this many intervals, requires REFs: see the mutant test below)."""
    vl = get_backend("verilator")
    tm, org = CFG.timing, CFG.org
    eff = 1 - tm.tRFC / tm.tREFI
    n = REFRESH_RUN_READS
    for policy in ("in-order", "fr-fcfs"):
        sys_ = make_system(policy=policy, storage=False)
        ctl = sys_.controller
        reqs = [req(ctl, a % ctl.amap.bursts, tag=a) for a in range(n)]  # n < 2**16: tags are unique
        run = run_system(vl, sys_, reqs, n)
        cmds = check_legal(sys_, run)
        got = [unpack_resp(ctl, p) for p in run.outputs["o"]]
        assert sorted(t for _, t in got) == list(range(n))
        assert all(d == flat_addr(ctl, t % ctl.amap.bursts) for d, t in got)
        bw = _bw(n, run.cycles, org.burst_cycles)
        refs = [sum(1 for c in cmds if c.kind is Cmd.REF and c.rank == r) for r in range(org.ranks)]
        print(f"\n{policy}: sequential reads {n} bursts in {run.cycles} cycles ({run.cycles / tm.tREFI:.1f} tREFI) "
              f"= {100 * bw:.2f}% of peak (bound {100 * 0.95 * eff:.2f}%), REFs per rank {refs}, "
              f"{run.wall_seconds:.2f} s")
        assert bw >= 0.95 * eff
        assert run.cycles >= 10 * tm.tREFI
        assert refresh_problems(cmds, run.cycles, CFG, ctl.max_postponed_refresh) == []


class _NoRefreshSystem(MemorySystem):
    """Mutant: the controller's REF commands never reach the bus (nor the trace, nor the device): a controller
    that does not refresh, as seen from the DRAM."""

    def elaborate(self, platform):
        from amaranth.hdl import Value
        m = Module()
        m.submodules.controller = ctl = self.controller
        m.submodules.device = dev = self.device
        from amaranth.lib import wiring
        wiring.connect(m, wiring.flipped(self.i), ctl.i)
        wiring.connect(m, wiring.flipped(self.o), ctl.o)
        cmd = Signal.like(ctl.cmd)
        m.d.comb += Value.cast(cmd).eq(Value.cast(ctl.cmd))
        with m.If(ctl.cmd.kind == Cmd.REF):
            m.d.comb += cmd.kind.eq(Cmd.NOP)
        m.d.comb += [Value.cast(dev.cmd).eq(Value.cast(cmd)), dev.wdata.eq(ctl.wdata), ctl.rdata.eq(dev.rdata),
                     ctl.rdata_valid.eq(dev.rdata_valid)]
        cycle = Signal(64)
        m.d.sync += cycle.eq(cycle + 1)
        m.d.comb += [self.trace.valid.eq(cmd.kind != Cmd.NOP), Value.cast(self.trace.payload.cmd).eq(Value.cast(cmd)),
                     self.trace.payload.cycle.eq(cycle), self.errors.valid.eq(dev.violation),
                     self.errors.payload.code.eq(dev.violation_code), self.errors.payload.cycle.eq(dev.violation_cycle)]
        return m


def test_refresh_check_catches_a_controller_without_refresh():
    """The same run with the controller's REFs removed from the bus fails the refresh check: no REF at all where
    >= 2 per rank are required, the checker's T_REFI (more than 8 postponed), and the device model's own T_REFI
    reports. (Over the 6.4 tREFI of the old 20k-read run, the bound owed - 8 was negative: this mutant passed.)"""
    vl = get_backend("verilator")
    n = REFRESH_RUN_READS
    sys_ = _NoRefreshSystem(controller_config=CFG, policy="fr-fcfs", tag_width=16, device_kwargs={"storage": False})
    ctl = sys_.controller
    run = run_system(vl, sys_, [req(ctl, a % ctl.amap.bursts, tag=a) for a in range(n)], n)
    cmds = decode_trace(run.outputs["trace"], CFG.org)
    problems = refresh_problems(cmds, run.cycles, CFG, ctl.max_postponed_refresh)
    print(f"\nno-refresh mutant: {len(problems)} problems, e.g. {problems[:3]}; "
          f"{len(run.outputs['errors'])} device error reports")
    assert any("REFs, expected" in p for p in problems)
    assert any("T_REFI" in p for p in problems)
    assert run.outputs["errors"]


@pytest.mark.parametrize("policy", ["in-order", "fr-fcfs"])
def test_short_sequential_stream_on_both_engines(backend, policy):
    """The bandwidth validation at a length the Amaranth simulator affords (no refresh crossed): >= 95% of
    peak x (1 - tRFC/tREFI), and exactly the cycle count of the fast model (sim/perf/dram.py), on both engines."""
    from sim.perf.dram import DRAMPerfModel
    import numpy as np
    tm, org = CFG.timing, CFG.org
    sys_ = make_system(policy=policy, storage=False)
    ctl = sys_.controller
    n = 400
    run = run_system(backend, sys_, [req(ctl, a, tag=a) for a in range(n)], n)
    check_legal(sys_, run)
    assert [unpack_resp(ctl, p) for p in run.outputs["o"]] == [(flat_addr(ctl, a), a) for a in range(n)]
    assert _bw(n, run.cycles, org.burst_cycles) >= 0.95 * (1 - tm.tRFC / tm.tREFI)
    assert run.cycles == DRAMPerfModel(CFG, policy=policy).stream_cycles(np.arange(n))


def write_then_read_back(cfg, n, *, seed):
    """Writes random data to bursts 0..n-1 (all bursts when n is None), reads them back on Verilator, checks
    the data bit-exactly (matching tags: FR-FCFS may reorder) and the trace; returns (n, run, commands)."""
    rng = np.random.default_rng(seed)
    sys_ = make_system(cfg)
    ctl = sys_.controller
    n = ctl.amap.bursts if n is None else n
    data = [int.from_bytes(rng.bytes(cfg.org.burst_bytes), "little") for _ in range(n)]
    reqs = [req(ctl, a, True, data[a]) for a in range(n)] + [req(ctl, a, tag=a) for a in range(n)]
    run = run_system(get_backend("verilator"), sys_, reqs, n)
    cmds = check_legal(sys_, run)
    got = sorted(unpack_resp(ctl, p)[::-1] for p in run.outputs["o"])
    assert [d for _, d in got] == data
    return n, run, cmds


def test_sequential_write_then_read_back():
    org = CFG.org
    n, run, cmds = write_then_read_back(DATA_CFG, None, seed=9)  # every burst of the (4-row) channel
    last_wr = max(c.cycle for c in cmds if c.kind is Cmd.WR)
    print(f"\nsequential writes: {n} bursts by cycle {last_wr} = "
          f"{100 * _bw(n, last_wr + 1, org.burst_cycles):.2f}% of peak; total {run.cycles} cycles")


def test_random_read_throughput_and_integrity():
    vl = get_backend("verilator")
    org = CFG.org
    rng = np.random.default_rng(21)
    results = {}
    for policy in ("fr-fcfs", "in-order"):
        sys_ = make_system(policy=policy, storage=False)
        ctl = sys_.controller
        n = 20_000
        addrs = rng.integers(0, ctl.amap.bursts, n)
        reqs = [req(ctl, int(a), tag=k) for k, a in enumerate(addrs)]
        run = run_system(vl, sys_, reqs, n)
        check_legal(sys_, run)
        got = [unpack_resp(ctl, p) for p in run.outputs["o"]]
        assert sorted(t for _, t in got) == list(range(n))
        assert all(d == flat_addr(ctl, addrs[t]) for d, t in got)
        results[policy] = _bw(n, run.cycles, org.burst_cycles)
        print(f"\n{policy}: random reads {n} in {run.cycles} cycles = {100 * results[policy]:.2f}% of peak")
    assert results["fr-fcfs"] >= results["in-order"] * 0.98


def test_random_mixed_long_fr_fcfs():
    """A long random mixed run: bit-exact data, legal trace, refreshes postponed within the bound."""
    vl = get_backend("verilator")
    rng = np.random.default_rng(33)
    sys_ = make_system()
    ctl = sys_.controller
    addrs = rng.integers(0, ctl.amap.bursts, 200)
    reqs, expect = random_workload(rng, ctl, 30_000, addrs, write_frac=0.4)
    run = run_system(vl, sys_, reqs, len(expect))
    cmds = check_legal(sys_, run)
    got = [unpack_resp(ctl, p) for p in run.outputs["o"]]
    assert sorted(t for _, t in got) == sorted(expect)
    for d, t in got:
        assert d == expect[t]
    print(f"\nmixed random: {len(reqs)} requests in {run.cycles} cycles; "
          f"{sum(c.kind is Cmd.REF for c in cmds)} REFs")


def test_lpddr5x_config_sequential():
    """The same controller on the LPDDR5X organisation (BL16, 8 beats per clock)."""
    cfg = LPDDR5X_8533_TINY
    org = cfg.org
    n, run, cmds = write_then_read_back(cfg, 8192, seed=4)
    first_rd = min(c.cycle for c in cmds if c.kind is Cmd.RD)
    bw = _bw(n, run.cycles - first_rd, org.burst_cycles)
    print(f"\nlpddr5x: sequential reads {100 * bw:.2f}% of peak")
