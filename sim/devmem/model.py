"""Functional reference of the device memory system (hdl/memctl/devmem.py) and request / response codecs.

:class:`DeviceMemoryModel` holds the address space as 64-byte granules and replays both ports' requests in the
**grant order** (the order the arbiter accepted them: ``DeviceMemorySystem``'s ``grants`` stream), which is the
order in which the design makes same-address accesses of the two ports take effect. It returns the read data
each port must see, per port in request order. Unwritten granules read as ``fill(granule)`` (0, or a device
model's initial contents).
"""

import numpy as np

from hdl.memctl.devmem import GRANULE_BYTES, NDP, HOST

__all__ = ["Codec", "DeviceMemoryModel", "grants_order", "timing_only_fill", "storage_fill"]

GRANULE_BITS = 8 * GRANULE_BYTES


class Codec:
    """Packing of ``DeviceMemory`` request / response payloads (by the layouts' field offsets)."""

    def __init__(self, memory):
        self.memory = memory
        self._lay = {}
        for key, layout in (("ndp_req", memory.ndp_request_layout), ("ndp_rsp", memory.ndp_response_layout),
                            ("host_req", memory.host_request_layout), ("host_rsp", memory.host_response_layout)):
            self._lay[key] = {name: (f.offset, f.width) for name, f in layout}

    def _pack(self, key, fields):
        out = 0
        for name, v in fields.items():
            off, width = self._lay[key][name]
            v = int(v)
            if not 0 <= v < 1 << width:
                raise ValueError(f"{key} field {name}: {v} does not fit {width} bits")
            out |= v << off
        return out

    def ndp(self, addr, write=False, wdata=0, tag=0) -> int:
        return self._pack("ndp_req", {"addr": addr, "write": int(write), "wdata": wdata, "tag": tag})

    def host(self, addr, write=False, wdata=0, tag=0) -> int:
        return self._pack("host_req", {"addr": addr, "write": int(write), "wdata": wdata, "tag": tag})

    def _unpack(self, key, payload):
        return {name: (int(payload) >> off) & ((1 << w) - 1) for name, (off, w) in self._lay[key].items()}

    def ndp_response(self, payload) -> tuple:
        f = self._unpack("ndp_rsp", payload)
        return f["rdata"], f["tag"]

    def host_response(self, payload) -> tuple:
        f = self._unpack("host_rsp", payload)
        return f["rdata"], f["tag"]

    def request_fields(self, port, payload) -> dict:
        return self._unpack("ndp_req" if port == NDP else "host_req", payload)


def grants_order(grants) -> list:
    """Port (``NDP`` / ``HOST``) of each grant, in order, from ``DeviceMemorySystem``'s ``grants`` payloads."""
    return [int(g) & 1 for g in grants]


class DeviceMemoryModel:
    """The address space of ``memory`` (a :class:`DeviceMemory`) as granules; ``fill(granule) -> int`` gives
    the contents of a granule never written (default 0)."""

    def __init__(self, memory, fill=None):
        self.memory = memory
        self.codec = Codec(memory)
        self.n = memory.channels
        self.fill = fill or (lambda g: 0)
        self.granules = {}

    def read_granule(self, g: int) -> int:
        return self.granules[g] if g in self.granules else self.fill(g)

    def replay(self, ndp_reqs, host_reqs, order) -> tuple:
        """Apply the requests in grant ``order``; returns (NDP responses, host responses) as lists of
        ``(rdata, tag)`` in each port's request order."""
        n = self.n
        pos = {NDP: 0, HOST: 0}
        out = {NDP: [], HOST: []}
        reqs = {NDP: ndp_reqs, HOST: host_reqs}
        for port in order:
            if pos[port] >= len(reqs[port]):
                raise ValueError(f"grant order names more {('NDP', 'host')[port]} requests than were offered")
            f = self.codec.request_fields(port, reqs[port][pos[port]])
            pos[port] += 1
            if port == NDP:
                gs = [f["addr"] * n + c for c in range(n)]
            else:
                gs = [f["addr"]]
            if f["write"]:
                for k, g in enumerate(gs):
                    self.granules[g] = (f["wdata"] >> (GRANULE_BITS * k)) & ((1 << GRANULE_BITS) - 1)
            else:
                out[port].append((sum(self.read_granule(g) << (GRANULE_BITS * k) for k, g in enumerate(gs)),
                                  f["tag"]))
        return out[NDP], out[HOST]


def timing_only_fill(memory):
    """``fill`` for timing-only DRAM models (a read returns its own flat burst address): the granule's bursts."""
    from sim.dram.device import flat_burst_address
    org = memory.config.org
    amap = memory.amap
    S = memory.bursts_per_granule

    def fill(g):
        entry = g // memory.channels
        out = 0
        for s in range(S):
            d = amap.decode_py(memory.channel_burst(entry, s))
            out |= flat_burst_address(org, d["rank"], d["bg"], d["bank"], d["row"], d["col"]) << (s * org.burst_bits)
        return out
    return fill


def storage_fill(memory, inits):
    """``fill`` for DRAM models with storage initialised with ``inits[c]`` (``{flat burst address: int}`` per
    channel, as ``DeviceMemorySystem(device_init=...)``; one dict: the same for every channel)."""
    if isinstance(inits, dict):
        inits = [inits] * memory.channels
    from sim.dram.device import flat_burst_address
    org = memory.config.org
    amap = memory.amap
    S = memory.bursts_per_granule

    def fill(g):
        c, entry = g % memory.channels, g // memory.channels
        out = 0
        for s in range(S):
            d = amap.decode_py(memory.channel_burst(entry, s))
            fa = flat_burst_address(org, d["rank"], d["bg"], d["bank"], d["row"], d["col"])
            out |= int(inits[c].get(fa, 0)) << (s * org.burst_bits)
        return out
    return fill
