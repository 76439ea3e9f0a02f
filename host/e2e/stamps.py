"""Per-descriptor cycle stamps of any CXL driver script: :func:`run_stamped` runs a
:class:`host.cxl_driver.Driver` script on :class:`sim.e2e.stamped.StampedCXLSystem` and returns every read's
bytes, the completion events and, per submission, its issue / start / completion cycles -- one run, no
subtraction of a second run.
"""

from dataclasses import dataclass

__all__ = ["Stamp", "StampedRun", "run_stamped", "stamped_system"]


@dataclass(frozen=True)
class Stamp:
    """Cycles (from the end of reset) of submission ``index`` of ``queue``: ``issue`` (its valid word accepted by
    the device), ``start`` (taken by the NDP core; None if it never reached the core, e.g. a window violation),
    ``done`` (its completion record posted); ``status`` its completion status."""
    queue: int
    index: int
    issue: int
    start: int | None
    done: int
    status: int

    @property
    def latency(self) -> int:
        return self.done - self.issue + 1

    @property
    def service(self) -> int | None:
        return None if self.start is None else self.done - self.start + 1


@dataclass
class StampedRun:
    reads: dict          # handle id -> bytes
    events: list         # sim.golden.cxl_device.Event, in completion order
    stamps: list         # Stamp per submission, in script order
    cycles: int

    def data(self, handle) -> bytes:
        return self.reads[handle.id]

    def completion(self, handle):
        from host.cxl_driver import CompletionRecord
        return CompletionRecord.from_bytes(handle.queue, handle.index, self.reads[handle.id])


_SYSTEMS = {}


def stamped_system(config, num_queues: int, depth: int, latency: int = 8, *, memory: str = "burst",
                   channels: int = 2):
    """One :class:`StampedCXLSystem` per parameter set and process (``memory`` / ``channels``: the device memory,
    as :func:`host.cxl_driver.system_for`)."""
    key = (config, num_queues, depth, latency, memory, channels)
    if key not in _SYSTEMS:
        from host.cxl_driver import system_for
        from sim.e2e.stamped import StampedCXLSystem
        _SYSTEMS[key] = StampedCXLSystem(system_for(config, num_queues, depth, latency, memory=memory,
                                                    channels=channels))
    return _SYSTEMS[key]


def run_stamped(driver, handles=(), *, engine="verilator") -> StampedRun:
    """Run ``driver``'s script on the stamped device (``engine``: ``"verilator"``, ``"amaranth"`` or a backend
    object); ``handles``: the read / completion handles whose bytes to return."""
    from sim.backends import Traffic
    from sim.golden.cxl_device import port_fields, Event
    from .ndp import _engine
    sysm = stamped_system(driver.config, driver.num_queues, driver.depth, driver.latency,
                          memory=getattr(driver, "memory", "burst"), channels=getattr(driver, "channels", 2))
    fields = port_fields(driver.regmap, driver.mem_addr_bits)
    streams = driver.streams(fields)
    mark = 1 << sysm.hmem_inner_bits
    hmem = list(streams["hmem"])
    subs = driver.submissions
    for s in subs:
        hmem[s.valid_pos] |= mark
    expected = {k: v for k, v in driver.expected().items() if k != "core_req"}
    expected.update({"stamp_issue": None, "stamp_start": None, "stamp_done": None})
    collect = getattr(sysm.inner, "collect_all", None)          # DRAM channels: traces and model reports
    channels = dict(collect()) if callable(collect) else {}
    expected.update(channels)
    run = _engine(engine).run_streams(sysm, {"mmio": streams["mmio"], "hmem": hmem}, expected, traffic=Traffic(),
                                      max_cycles=driver.max_cycles())
    if channels:
        problems = sysm.inner.channel_problems({k: run.outputs.get(k) for k in channels}, run.cycles)
        if problems:
            raise RuntimeError(f"device on {driver.memory}: {len(problems)} DRAM problems, first: "
                               + "; ".join(problems[:3]))
    hf, ef = fields["hmem_rsp"], fields["events"]
    lines = [hf.unpack(w)[0].to_bytes(64, "little") for w in run.outputs["hmem_rsp"]]
    reads = {h.id: b"".join(lines[h.first:h.first + h.lines])[:h.n_bytes] for h in handles}
    events = [Event(*ef.unpack(w)) for w in run.outputs["events"]]
    issue = run.outputs["stamp_issue"]
    start = list(run.outputs["stamp_start"])
    done = run.outputs["stamp_done"]
    from hdl.cxl.device import WINDOW_VIOLATION
    pos = {(s.queue, s.index): k for k, s in enumerate(subs)}
    st_of, si = {}, 0
    for k, e in enumerate(events):
        s = None
        if e.status != WINDOW_VIOLATION and si < len(start):
            s, si = start[si], si + 1
        st_of[(e.queue, e.index)] = (s, done[k], e.status)
    stamps = []
    for s in subs:
        if (s.queue, s.index) in st_of:
            st, dn, status = st_of[(s.queue, s.index)]
            stamps.append(Stamp(s.queue, s.index, issue[pos[(s.queue, s.index)]], st, dn, status))
    return StampedRun(reads, events, stamps, run.cycles)
