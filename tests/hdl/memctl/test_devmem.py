"""The device memory system (hdl/memctl/devmem.py) on N DRAM channel models (sim/devmem/system.py).

Data: both ports write and read random 64-byte lines / N x 64-byte lines over a small address set that the two
ports share, under random valid gaps and backpressure; :class:`sim.devmem.model.DeviceMemoryModel` replays the
requests in the arbiter's grant order and every response (data and tag, in each port's request order) must match
bit for bit. Every channel's command trace passes the independent timing checker and the device models report no
violation. Amaranth runs are short (the simulator does ~100 cycles/s on this design); Verilator runs use the
hierarchical build (one channel module, one DRAM model module).
"""

import gc
import warnings
from dataclasses import replace

import numpy as np
import pytest

from amaranth.hdl import UnusedElaboratable

from hdl.memctl.devmem import DeviceMemory, GRANULE_BYTES, NDP, HOST
from hdl.memctl.timing import DRAMConfig, LPDDR5X_8533, LPDDR5X_8533_TINY, DDR4_3200_TINY
from sim.backends import Traffic
from sim.devmem.backend import backend as devmem_backend
from sim.devmem.model import DeviceMemoryModel, grants_order, storage_fill
from sim.devmem.system import DeviceMemorySystem
from sim.dram.checker import check_trace, describe
from sim.dram.device import flat_burst_address
from sim.dram.trace import decode_trace

# LPDDR5X-8533 timing on 4 rows per bank (1024 granules per channel): quick to convert with storage.
DATA_CFG = DRAMConfig(name="lpddr5x-8533-4rows", org=replace(LPDDR5X_8533_TINY.org, name="lpddr5x-8533-4rows", rows=4),
                      timing=LPDDR5X_8533_TINY.timing)

_systems = {}


def data_system(channels, hierarchical, init):
    key = (channels, hierarchical)
    if key not in _systems:
        _systems[key] = DeviceMemorySystem(config=DATA_CFG, channels=channels, hierarchical=hierarchical,
                                           device_init=init, ndp_tag_width=8, host_tag_width=24)
    return _systems[key]


def random_init(seed, org, n=64):
    rng = np.random.default_rng(seed)
    total = org.ranks * org.banks * org.rows * org.bursts_per_row
    return {int(a): int.from_bytes(rng.bytes(org.burst_bytes), "little") for a in rng.choice(total, n, replace=False)}


def check_channels(sys_, run):
    """Every channel's trace is legal for the checker and its device model reported nothing."""
    cfg = sys_.config
    for c in range(sys_.channels):
        cmds = decode_trace(run.outputs[f"trace{c}"], cfg.org)
        v = check_trace(cmds, cfg, end_cycle=run.cycles - 1)
        assert not v, f"channel {c}: " + describe(v[:10])
        assert run.outputs[f"errors{c}"] == [], f"channel {c}: device errors {run.outputs[f'errors{c}'][:5]}"


def random_streams(rng, mem, n_ndp, n_host, *, lines=6):
    """Random read/write streams for both ports over a few NDP lines; the host's granules lie inside them (and a
    few outside), so the ports read each other's writes."""
    codec = DeviceMemoryModel(mem).codec
    N = mem.channels
    ndp_lines = rng.choice(1 << mem.ndp_addr_bits, lines, replace=False)
    host_granules = np.concatenate([ndp_lines * N + rng.integers(0, N, lines),
                                    rng.choice(1 << mem.host_addr_bits, 3, replace=False)])
    ndp, host = [], []
    for k in range(n_ndp):
        a = int(rng.choice(ndp_lines))
        if rng.random() < 0.5:
            ndp.append(codec.ndp(a, True, int.from_bytes(rng.bytes(mem.line_bytes), "little"), tag=k & 0xFF))
        else:
            ndp.append(codec.ndp(a, False, tag=k & 0xFF))
    for k in range(n_host):
        a = int(rng.choice(host_granules))
        if rng.random() < 0.5:
            host.append(codec.host(a, True, int.from_bytes(rng.bytes(GRANULE_BYTES), "little"), tag=(k * 7919) & 0xFFFFFF))
        else:
            host.append(codec.host(a, False, tag=(k * 7919) & 0xFFFFFF))
    return ndp, host


def run_and_check(engine, sys_, ndp, host, init, traffic):
    mem = sys_.memory
    codec = DeviceMemoryModel(mem).codec
    n_ndp_rd = sum(1 for p in ndp if not codec.request_fields(NDP, p)["write"])
    n_host_rd = sum(1 for p in host if not codec.request_fields(HOST, p)["write"])
    run = engine.run_streams(sys_, {"ndp_req": ndp, "host_req": host},
                             {"ndp_rsp": n_ndp_rd, "host_rsp": n_host_rd, **sys_.collect_all()}, traffic=traffic)
    check_channels(sys_, run)
    order = grants_order(run.outputs["grants"])
    assert len(order) == len(ndp) + len(host)
    model = DeviceMemoryModel(mem, fill=storage_fill(mem, init))
    exp_ndp, exp_host = model.replay(ndp, host, order)
    got_ndp = [codec.ndp_response(p) for p in run.outputs["ndp_rsp"]]
    got_host = [codec.host_response(p) for p in run.outputs["host_rsp"]]
    assert [t for _, t in got_ndp] == [t for _, t in exp_ndp]
    assert [t for _, t in got_host] == [t for _, t in exp_host]
    for k, (g, e) in enumerate(zip(got_ndp, exp_ndp)):
        assert g == e, f"NDP read {k}: got {g[0]:#x}, expected {e[0]:#x}"
    for k, (g, e) in enumerate(zip(got_host, exp_host)):
        assert g == e, f"host read {k}: got {g[0]:#x}, expected {e[0]:#x}"
    both = sum(1 for a, b in zip(order, order[1:]) if a != b)
    return run, both


# ---------------------------------------------------------------------------------------------------------
# Parameters and address map
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(channels=3), dict(channels=0), dict(channels=128), dict(ndp_slots=3),
                                dict(ndp_slots=1), dict(host_slots=0), dict(host_outstanding=0),
                                dict(fifo_depth=0), dict(ndp_tag_width=33), dict(host_tag_width=-1),
                                dict(policy="fifo"), dict(queue_depth=1)])
def test_rejects_bad_parameters(kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError) as info:
            DeviceMemory(config=LPDDR5X_8533_TINY, **{"channels": 2, **kw})
        del info
        gc.collect()


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_address_interleave():
    mem = DeviceMemory(config=LPDDR5X_8533, channels=64)
    # 64 channels x 8 GiB: 512 GiB; a 4 KiB NDP line; 2**27 lines; 2**33 host lines.
    assert mem.bytes == 512 << 30 and mem.line_bytes == 4096 and mem.line_bits == 32768
    assert mem.ndp_addr_bits == 27 and mem.host_addr_bits == 33
    org = LPDDR5X_8533.org
    amap = mem.amap
    # neighbouring granules go to neighbouring channels; both bursts of a granule share bank and row
    for g in (0, 1, 63, 64, 65, 12345 * 64 + 17):
        c0, b0, o0 = mem.locate(g * 64)
        c1, b1, o1 = mem.locate(g * 64 + 32)
        assert c0 == c1 == g % 64 and o0 == o1 == 0
        d0, d1 = amap.decode_py(b0), amap.decode_py(b1)
        assert {k: d0[k] for k in ("rank", "bg", "bank", "row")} == {k: d1[k] for k in ("rank", "bg", "bank", "row")}
        assert d1["col"] == d0["col"] + 1
    # consecutive granules of a channel rotate over the bank groups (full-rate column commands)
    bgs = [amap.decode_py(mem.channel_burst(e, 0))["bg"] for e in range(8)]
    assert bgs == [0, 1, 2, 3, 0, 1, 2, 3]
    # the mapping is a bijection on the channel's bursts
    bursts = np.array([mem.channel_burst(e, s) for e in range(1 << 12) for s in (0, 1)])
    assert len(np.unique(bursts)) == bursts.size and bursts.max() < 1 << 13
    with pytest.raises(ValueError):
        mem.locate(mem.bytes)
    del mem
    gc.collect()


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_ddr4_burst_is_the_granule():
    """On DDR4 (64-byte bursts) a granule is one burst: no splitting, a host line is one burst."""
    mem = DeviceMemory(config=DDR4_3200_TINY, channels=2)
    assert mem.bursts_per_granule == 1 and mem.locate(3 * 64) == (1, 1, 0)
    del mem
    gc.collect()


# ---------------------------------------------------------------------------------------------------------
# Bit-exact data through both ports, both engines
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("channels", [1])
def test_both_ports_bit_exact_amaranth(channels):
    rng = np.random.default_rng(100 + channels)
    init = [random_init(7 + c, DATA_CFG.org) for c in range(channels)]
    sys_ = DeviceMemorySystem(config=DATA_CFG, channels=channels, device_init=init, ndp_tag_width=8,
                              host_tag_width=24)
    ndp, host = random_streams(rng, sys_.memory, 14, 14, lines=4)
    traffic = Traffic(valid={"ndp_req": rng.random(97) < 0.6, "host_req": rng.random(89) < 0.6},
                      ready={"ndp_rsp": rng.random(83) < 0.5, "host_rsp": rng.random(79) < 0.5})
    from sim.backends import get_backend
    run, switches = run_and_check(get_backend("amaranth"), sys_, ndp, host, init, traffic)
    print(f"\n{channels} channel(s): {len(ndp)} NDP + {len(host)} host requests in {run.cycles} cycles, "
          f"{switches} port switches in the grant order")


@pytest.mark.parametrize("channels", [2])
def test_both_ports_bit_exact_verilator(channels):
    rng = np.random.default_rng(200 + channels)
    init = random_init(11, DATA_CFG.org, 256)
    sys_ = data_system(channels, True, init)
    for trial, (vp, rp) in enumerate(((1.0, 1.0), (0.5, 0.3), (0.8, 0.1))):
        ndp, host = random_streams(rng, sys_.memory, 400, 400, lines=12)
        traffic = Traffic(valid={"ndp_req": rng.random(1009) < vp, "host_req": rng.random(1013) < vp},
                          ready={"ndp_rsp": rng.random(1019) < rp, "host_rsp": rng.random(1021) < rp})
        run, switches = run_and_check(devmem_backend("verilator"), sys_, ndp, host, init, traffic)
        print(f"\n{channels} channel(s), valid {vp} ready {rp}: 800 requests in {run.cycles} cycles, "
              f"{switches} port switches")
        assert switches > 100  # the two ports really interleave


# ---------------------------------------------------------------------------------------------------------
# Latency and the fast model (Verilator, the same build)
# ---------------------------------------------------------------------------------------------------------

def test_unloaded_latency():
    """NDP and host reads of a closed bank, a row hit and a row miss: the controller's latency of the granule's
    bursts plus the device memory system's fixed cycles (DeviceMemory.read_latency), cycle-exact."""
    init = random_init(11, DATA_CFG.org, 256)
    sys_ = data_system(2, True, init)
    mem = sys_.memory
    codec = DeviceMemoryModel(mem).codec
    gap = 300
    pattern = np.zeros(3 * gap, dtype=bool)
    pattern[[0, gap, 2 * gap]] = True
    rows = mem.amap.widths["row"]
    e0 = 5
    hit = e0 + 4          # the next granule of the same bank group and row
    miss = e0 + (1 << (mem.entry_addr_bits - rows)) * 1  # same bank and column, next row
    d0, dm = mem.amap.decode_py(mem.channel_burst(e0, 0)), mem.amap.decode_py(mem.channel_burst(miss, 0))
    assert (d0["rank"], d0["bg"], d0["bank"]) == (dm["rank"], dm["bg"], dm["bank"]) and d0["row"] != dm["row"]
    for port in (NDP, HOST):
        lat = {}
        for n, kind in ((1, "closed"), (2, "hit"), (3, "miss")):
            entries = [e0, hit, miss][:n]
            if port == NDP:
                ins = {"ndp_req": [codec.ndp(e, tag=k) for k, e in enumerate(entries)], "host_req": []}
                exp = {"ndp_rsp": n}
                traffic = Traffic(valid={"ndp_req": pattern})
            else:
                ins = {"ndp_req": [], "host_req": [codec.host(e * 2 + 1, tag=k) for k, e in enumerate(entries)]}
                exp = {"host_rsp": n}
                traffic = Traffic(valid={"host_req": pattern})
            run = devmem_backend("verilator").run_streams(sys_, ins, {**exp, **sys_.collect_all()}, traffic=traffic)
            check_channels(sys_, run)
            lat[kind] = run.cycles - 1 - (n - 1) * gap
        print(f"\n{('NDP', 'host')[port]} read latency (cycles): {lat}")
        for kind, v in lat.items():
            assert v == mem.read_latency(kind), (port, kind, v)


def test_fast_model_cycle_exact_on_ndp_streams():
    """sim/perf/devmem.py against the RTL: NDP-only streams (sequential, strided, random, mixed reads and writes;
    the random ones are bounded by the reorder buffer's slots), exact cycle counts."""
    from sim.perf.devmem import DeviceMemoryPerfModel
    init = random_init(11, DATA_CFG.org, 256)
    sys_ = data_system(2, True, init)
    mem = sys_.memory
    codec = DeviceMemoryModel(mem).codec
    model = DeviceMemoryPerfModel(DATA_CFG, channels=2, ndp_slots=mem.ndp_slots, fifo_depth=mem.fifo_depth)
    nl = 1 << mem.ndp_addr_bits
    rng = np.random.default_rng(5)
    n = 2000
    for name, lines, wr in (("seq", np.arange(n) % nl, None), ("stride3", (np.arange(n) * 3) % nl, None),
                            ("stride64", (np.arange(n) * 64) % nl, None), ("random", rng.integers(0, nl, n), None),
                            ("mixed", rng.integers(0, nl, n), rng.random(n) < 0.3)):
        w = np.zeros(n, bool) if wr is None else wr
        reqs = [codec.ndp(int(a), bool(x), 0, k & 0xFF) for k, (a, x) in enumerate(zip(lines, w))]
        run = devmem_backend("verilator").run_streams(sys_, {"ndp_req": reqs, "host_req": []},
                                                      {"ndp_rsp": int((~w).sum()), **sys_.collect_all()})
        check_channels(sys_, run)
        fast = model.ndp_stream_cycles(lines, w)
        print(f"\n{name:8s} rtl {run.cycles:6d} fast {fast:6d}")
        assert fast == run.cycles, name
