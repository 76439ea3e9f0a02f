"""The CXL NDP devices of the end-to-end run behind one interface: a *wave* of kernels in, results and cycle
stamps out, on the ``rtl`` (the device RTL through :mod:`host.cxl_driver`), ``golden`` (the same driver script
on the golden device model) or ``perf`` (no data; the calibrated timing model) backend.

A wave is what one device does between two points where the GPU needs its results: e.g. the Q/K/V LoRA jobs of
one layer (E2 loads, E3, E4) or the attention shares of one layer. Each :class:`NDPJob` names the tensors it
needs in device memory (an adapter's A and B, a request's K and V share) and its GPU input.

**Device memory.** The host model keeps the device's contents (every adapter, every KV share) as arrays; a
simulation run starts from reset, so each run first writes the tensors its jobs use into the simulated
device's memory over CXL.mem (``Driver.store``, the host path PLoRA IV-C uses to place adapters), at addresses
allocated per run in a window of :data:`DEPTH` 64-byte lines, and then submits the descriptors. The cycle
stamps of :class:`sim.e2e.stamped.StampedCXLSystem` separate the two: a wave's device time runs from the issue
of its first descriptor (its valid word accepted) to its last completion, so the preload is not charged (its
cost in the serving model is the link's, priced by the host model). A wave whose tensors do not fit one window
is split into several runs, in job order, and their times add up.
"""

from dataclasses import dataclass, field, replace
import threading
import time

import numpy as np

from hdl.ndp.config import TINY
from hdl.ndp.descriptor import DescType, DescOp, ErrorCode
from hdl.cxl.regmap import RegisterMap, QueueLayout, CPL_HEADER_BYTES
from host.cxl_driver import Driver, CompletionRecord, backend_named
from sim.golden.attention import prepare_query
from sim.cxl.devmem_system import channel_problems
from . import programs

__all__ = ["DEPTH", "ENTRIES", "e2e_ndp_config", "NDPJob", "DescriptorStamp", "WaveResult", "NDPDevices",
           "returned_elems", "WaveScript", "plan_runs"]

#: Lines (64 B) of the simulated device memory window of one run (128 KiB): large enough for the biggest wave
#: of the tiny model (the FFN gate/up adapters of a device), small because every memory bit costs Verilog
#: generation time (Amaranth writes each bit's initial value).
DEPTH = 2048
#: Submission ring entries of the one queue the GPU uses (slots are re-used once their completion was read).
ENTRIES = 4


def e2e_ndp_config(depth: int = DEPTH):
    """The NDP core of the end-to-end run: the ``tiny`` PE geometry (8 lanes x 2 PE rows, one channel's slice
    of the paper core; its state slots, accumulator columns and ``max_k``) with a 32 KiB DRAM ring, so that a
    K-tile (:func:`firmware.ndp.kernels.tile_bytes`: half the ring) holds 256 rows of A at rank 16 and a token
    tile 128 tokens of head dim 64, and 4 KiB input and return rings (a batch of FFN inputs, an E2 LOAD chunk).
    Design choice: fewer, larger tiles keep the descriptor count (and the simulation time) of a wave small; the
    kernels tile everything larger (d_in = 688 at rank 16: balanced K-tiles of 232, 232, 224 rows; B panels of 128
    columns)."""
    return replace(TINY, name="e2e", input_buffer_bytes=4096, output_buffer_bytes=4096, dram_buffer_bytes=32768,
                   device_bytes=depth * 64)


@dataclass
class NDPJob:
    """One kernel on one device. ``kind``: ``E2`` (LOAD A, B), ``E3`` (y = x A B), ``E4`` (m = x A) or ``ATT``
    (a share of one head's decode attention). ``tensors``: ``A`` (d_in, r), ``B`` (r, d_out) or ``K``, ``V``
    (l, d) FP16 bits; ``x``: (batch, d_in) input, or the raw query (d,) for ``ATT`` (pre-scaled here)."""

    key: tuple
    kind: str
    tensors: dict = field(repr=False)
    x: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.kind not in ("E2", "E3", "E4", "ATT"):
            raise ValueError(f"NDPJob kind must be E2, E3, E4 or ATT, got {self.kind!r}")
        need = {"E2": ("A", "B"), "E3": ("A", "B"), "E4": ("A",), "ATT": ("K", "V")}[self.kind]
        missing = [n for n in need if n not in self.tensors]
        if missing:
            raise ValueError(f"NDPJob {self.key}: {self.kind} needs tensors {need}, missing {missing}")

    def layout(self, config, base: int = 0) -> dict:
        """The firmware layout of the job's tensors at ``base`` (:mod:`host.e2e.programs`): an adapter's
        K-tiles and panels, or a KV share's token tiles."""
        if self.kind == "ATT":
            l, d = self.tensors["K"].shape
            return programs.kv_layout(d, l, config=config, base=base)
        d_in, r = self.tensors["A"].shape
        d_out = self.tensors["B"].shape[1] if "B" in self.tensors else d_in
        lay = programs.lora_layout(d_in, d_out, r, config=config, base=base)
        if self.kind == "E4":                      # only A is placed: B's panels are not used
            lay = dict(lay, b=[], end=lay["b"][0][0] if lay["b"] else lay["end"])
        return lay

    def placed(self, layout, config) -> list:
        """``[(address, bits as stored)]`` of the job's tensors in ``layout``: A's K-tiles in the TRANS
        layout, B's column panels, K^T tiles, V tiles in the TRANS layout."""
        if self.kind == "ATT":
            return programs.kv_tensors(self.tensors["K"], self.tensors["V"], layout, config=config)
        return programs.lora_tensors(self.tensors["A"], self.tensors.get("B"), layout, config=config,
                                     with_b=self.kind != "E4")

    def kernel(self, layout: dict, config):
        """The descriptor program on the placed ``layout``."""
        if self.kind != "E2" and self.x is None:
            raise ValueError(f"NDPJob {self.key}: {self.kind} needs an input x")
        if self.kind == "ATT":
            return programs.attention(prepare_query(self.x), layout, config=config)
        if self.kind == "E4":
            return programs.lora_e4(self.x, layout, config=config)
        if self.kind == "E3":
            return programs.lora_e3(self.x, layout, config=config)
        return programs.lora_e2(layout, config=config)

    def tensor_bytes(self, config) -> int:
        """Bytes of device memory the job's layout takes (whether or not they fit ``config.device_bytes``)."""
        return self.layout(replace(config, device_bytes=1 << 62))["end"]


def _region(nbytes, align):
    return -(-nbytes // align) * align


def returned_elems(desc) -> int:
    """FP16 elements a descriptor's completion carries (:meth:`firmware.ndp.descriptor.Descriptor.returned_elems`:
    nothing for KEEP / PARTIAL results; a SOFTMAX with KEEP returns its 3 anchors per row)."""
    return desc.returned_elems()


@dataclass(frozen=True)
class DescriptorStamp:
    """One descriptor of a wave: the job it belongs to, its operation, and its device cycles (``None`` on
    backends without them): ``issue`` (valid word accepted), ``start`` (taken by the core), ``done``
    (completion record posted), all counted from the start of its run's wave window."""
    job: tuple
    op: str
    issue: int | None
    start: int | None
    done: int | None

    @property
    def service(self) -> int | None:
        return None if self.done is None else self.done - self.start + 1


@dataclass
class WaveResult:
    """Outputs of a wave: ``outputs`` {job key: kernel results} (empty on ``perf``), ``cycles`` (device
    cycles of the wave: per run, first issue to last completion, summed), ``pred_cycles`` (the performance
    model's cycles of the same runs; equal to ``cycles`` on the golden and perf backends), ``stamps`` (one per
    descriptor), ``job_cycles`` / ``job_pred`` {job key: cycles the job occupied the device: from the previous
    completion (or the run's first issue) to each of its completions, summed; they add up to ``cycles``},
    ``job_link`` {job key: (bytes to the device: inputs and descriptor lines, bytes back: results and
    completion records)}, ``runs`` (simulation runs), ``descriptors``, ``wall_s``."""
    device: int
    outputs: dict
    cycles: int
    pred_cycles: int
    stamps: list
    job_cycles: dict
    job_pred: dict
    job_link: dict
    runs: int
    descriptors: int
    wall_s: float = 0.0
    #: pJ of the wave's runs (host.e2e.energy.ndp_run_energy): ``logic``, ``dram``; ``source`` of the DRAM term
    energy: dict = field(default_factory=dict)

    @property
    def link_out(self) -> int:
        return sum(o for o, _ in self.job_link.values())

    @property
    def link_in(self) -> int:
        return sum(i for _, i in self.job_link.values())


def _occupancy(stamps) -> list:
    out, prev = [], -1
    for st in stamps:
        out.append(st.done - prev)
        prev = st.done
    return out


class WaveScript:
    """The driver script of one simulation run: preload the jobs' tensors, submit every descriptor, read each
    completion (re-using the ``ENTRIES`` slots in order). ``drive=False`` skips building the driver's streams
    (golden / perf backends): the program, the preload and :attr:`hmem_ops` are the same.

    ``hmem_ops``: the host's CXL.mem requests from the first submission on, ``[(lines, after, valid word)]`` (what
    :class:`host.e2e.perf.NDPTiming` replays); every request carries an explicit ``after`` (no barriers)."""

    def __init__(self, jobs, config, depth=DEPTH, entries=ENTRIES, *, drive: bool = True):
        self.jobs, self.config, self.depth, self.entries = list(jobs), config, depth, entries
        self.layout = QueueLayout.for_config(config)
        d = self.driver = Driver(RegisterMap(1), self.layout, config=config, depth=depth) if drive else None
        sq_bytes, cq_bytes = self.layout.sq_bytes(entries), self.layout.cq_bytes(entries)
        self.data_base = _region(sq_bytes + cq_bytes, 4096)
        if d is not None:
            d.configure(0, sq_base=0, entries=entries, cq_base=sq_bytes, win_base=self.data_base,
                        win_limit=depth * 64)
        addr = self.data_base
        self.kernels, self.items = [], []          # items: (job index, descriptor, input)
        self.layouts = []                          # each job's firmware layout, as placed
        self.stores = []                           # (address, bits) of the preload
        for j, job in enumerate(self.jobs):
            lay = job.layout(config, addr)
            self.layouts.append(lay)
            if lay["end"] > depth * 64:
                raise ValueError(f"wave run: the tensors need {lay['end']} bytes, the window holds {depth * 64}")
            for a, t in job.placed(lay, config):
                self.stores.append((a, t))
                if d is not None:
                    d.store(a, t)
            addr = _region(lay["end"], config.align_bytes)
            k = job.kernel(lay, config)
            self.kernels.append(k)
            for desc, inp in k.program:
                self.items.append((j, desc, inp))
        #: 64-byte lines of the preload (CXL.mem writes before the first submission)
        self.pre_lines = sum(-(-np.asarray(t).size * 2 // 64) for _, t in self.stores)
        self.subs, self.handles, self.hmem_ops = [], [], []
        self.job_link = [[0, 0] for _ in self.jobs]
        n = len(self.items)
        self.link_out = self.link_in = 0
        for i, (j, desc, inp) in enumerate(self.items):
            if i >= entries:
                self._read(i - entries)
            # the slot of submission i - entries is free once it completed: wait for that one only (one queue:
            # completions come in submission order), so up to `entries` descriptors are in flight
            gate = i - entries + 1 if i >= entries else 0
            if d is not None:
                self.subs.append(d.submit(0, desc, inp, after=gate))
            n_in = 0 if inp is None else -(-inp.size * 2 // 64)
            self.hmem_ops += [(1, gate, False)] * (n_in + 1) + [(1, gate, True)]
            nb = 64 * (1 + n_in)
            self.link_out += nb
            self.job_link[j][0] += nb
        for i in range(max(0, n - entries), n):
            self._read(i)

    def _read(self, i):
        desc = self.items[i][1]
        rb = min(self.layout.result_bytes, _region(2 * returned_elems(desc), 64))
        if self.driver is not None:
            self.handles.append((i, self.driver.read_completion(0, self.subs[i].index, result_bytes=rb,
                                                                after=i + 1)))
        self.hmem_ops += [(1, i + 1, False)] * (1 + rb // 64)
        self.link_in += CPL_HEADER_BYTES + rb
        self.job_link[self.items[i][0]][1] += CPL_HEADER_BYTES + rb

    def results(self, records) -> dict:
        """{job key: kernel results} from the completion records (index order)."""
        per_job = {}
        for (i, _), rec in zip(sorted(self.handles), records):
            if not rec.done:
                raise RuntimeError(f"descriptor {i} of the run did not complete (flag {rec.flag:#x})")
            if rec.status != 0:
                from host.ndp_status import explain
                raise RuntimeError(f"descriptor {i} of job {self.jobs[self.items[i][0]].key} failed: "
                                   f"{explain(rec.status, self.items[i][1], self.config)}")
            per_job.setdefault(self.items[i][0], []).append(_Cpl(ErrorCode(rec.status),
                                                                    rec.result_bits(returned_elems(self.items[i][1]))))
        return {self.jobs[j].key: self.kernels[j].results(per_job[j]) for j in range(len(self.jobs))}

    def stamps_from(self, issue, start, done, events) -> list:
        """Per descriptor (script order): issue / start / done cycles relative to the first issue."""
        n = len(self.items)
        if len(issue) != n or len(done) != n:
            raise RuntimeError(f"stamps: {len(issue)} issues, {len(done)} completions for {n} descriptors")
        by_index = {e.index: k for k, e in enumerate(events)}
        t0 = issue[0]
        out = []
        for i, (j, desc, _) in enumerate(self.items):
            k = by_index[self.subs[i].index]
            s = start[k] if k < len(start) else None
            out.append(DescriptorStamp(self.jobs[j].key, _op_name(desc), issue[i] - t0,
                                       None if s is None else s - t0, done[k] - t0))
        return out


@dataclass
class _Cpl:
    status: int
    result: np.ndarray


def _op_name(desc) -> str:
    if desc.type == DescType.READ_COMPUTE:
        return desc.op.name + "".join(f"+{c}" for c, f in (("T", desc.trans), ("A", desc.acc), ("P", desc.partial),
                                                             ("K", desc.keep), ("C", desc.chain)) if f)
    return desc.type.name


_ENGINES = {}


def _engine(name):
    """One simulator object per name and process; Verilator with the design cache (sim.e2e.design_cache);
    ``"verilator+vcd"`` / ``"verilator+fst"``: the traced build (sim.e2e.waveform), run without tracing, so that the
    waveform of one of the run's waves needs no build of its own."""
    if not isinstance(name, str):
        return name
    be = _ENGINES.get(name)
    if be is None:
        if name == "verilator":
            from sim.e2e.design_cache import CachedVerilatorBackend
            be = CachedVerilatorBackend()
        elif name in ("verilator+vcd", "verilator+fst"):
            from sim.e2e.waveform import TracingVerilatorBackend
            be = TracingVerilatorBackend(None, name.split("+")[1])
        else:
            be = backend_named(name)
        _ENGINES[name] = be
    return be


def plan_runs(jobs, config, depth=DEPTH, entries=ENTRIES) -> list:
    """Split ``jobs`` (in order) into runs whose tensors fit the window. Raises if one job alone does not."""
    layout = QueueLayout.for_config(config)
    base = _region(layout.sq_bytes(entries) + layout.cq_bytes(entries), 4096)
    room = depth * 64 - base
    runs, cur, used = [], [], 0
    for job in jobs:
        need = job.tensor_bytes(config)
        if need > room:
            raise ValueError(f"NDP job {job.key}: its tensors take {need} bytes, more than the {room} bytes of a "
                             f"run's data window (depth {depth} lines)")
        if used + need > room:
            runs.append(cur)
            cur, used = [], 0
        cur.append(job)
        used += need
    if cur:
        runs.append(cur)
    return runs


class NDPDevices:
    """``n`` NDP devices on one backend: ``"rtl"`` (``engine`` ``"verilator"`` or ``"amaranth"``),
    ``"golden"`` or ``"perf"``. :meth:`run_wave` runs one device's wave."""

    def __init__(self, backend: str, n: int = 2, *, engine: str = "verilator", config=None, depth: int = DEPTH,
                 perf=None, memory: str = "burst", channels: int = 2):
        from host.cxl_driver import MEMORIES
        if backend not in ("rtl", "golden", "perf"):
            raise ValueError(f"backend must be rtl, golden or perf, got {backend!r}")
        if memory not in MEMORIES:
            raise ValueError(f"memory must be one of {', '.join(MEMORIES)}, got {memory!r}")
        self.backend, self.n, self.engine, self.depth = backend, n, engine, depth
        #: the device memory of the RTL: ``burst`` (fixed latency) or ``lpddr5x`` (``channels`` LPDDR5X-8533
        #: channels: controllers and DRAM models, sim.cxl.devmem_system); the golden model's data is the same
        self.memory, self.channels = memory, channels
        self.config = config or e2e_ndp_config(depth)
        self.perf = perf
        self._system = None
        #: ``True``: the DRAM timing check of each rtl run's command traces (LPDDR5X) runs in a process of its own
        #: beside the simulation, and a problem is raised by a later :meth:`run_wave` or by :meth:`finish` (which
        #: the caller must then call); ``False``: checked before :meth:`run_wave` returns.
        self.check_beside = False
        self._checks, self._check_pool, self._check_lock = [], None, threading.Lock()

    def system(self):
        """The simulated device (built once per process and design)."""
        if self._system is None:
            from host.cxl_driver import system_for
            from sim.backends.amaranth_sim import AmaranthBackend
            from sim.e2e.stamped import StampedCXLSystem
            # Amaranth's simulator runs the LPDDR5X memory flat (it cannot run the hierarchical build's modules)
            flat = isinstance(_engine(self.engine), AmaranthBackend)
            self._system = StampedCXLSystem(system_for(self.config, 1, self.depth, memory=self.memory,
                                                       channels=self.channels, hierarchical=not flat))
        return self._system

    def run_wave(self, device: int, jobs) -> WaveResult:
        self._raise_problems(wait=False)
        t0 = time.perf_counter()
        outputs, stamps, cycles, pred, ndesc = {}, [], 0, 0, 0
        job_cycles, job_pred, job_link = {}, {}, {}
        energy = {"logic": 0.0, "dram": 0.0, "source": None}
        plans = plan_runs(jobs, self.config, self.depth) if jobs else []
        for run_jobs in plans:
            script = WaveScript(run_jobs, self.config, self.depth, drive=self.backend == "rtl")
            ndesc += len(script.items)
            pst = self.perf.stamps(script) if self.perf is not None else None
            if self.backend == "rtl":
                out, st = self._rtl(script)
            elif self.backend == "golden":
                out, st = self._golden(script), pst
            else:
                out, st = {}, pst
            outputs.update(out)
            stamps += st
            e = self._run_energy(script, st)
            energy["logic"] += e["logic"]
            energy["dram"] += e["dram"]
            energy["source"] = e["source"]
            cycles += max(x.done for x in st) + 1
            for key, occ in zip((script.jobs[j].key for j, _, _ in script.items), _occupancy(st)):
                job_cycles[key] = job_cycles.get(key, 0) + occ
            if pst is not None:
                pred += max(x.done for x in pst) + 1
                for key, occ in zip((script.jobs[j].key for j, _, _ in script.items), _occupancy(pst)):
                    job_pred[key] = job_pred.get(key, 0) + occ
            for job, (o, i) in zip(script.jobs, script.job_link):
                job_link[job.key] = (o, i)
        return WaveResult(device, outputs, cycles, pred if self.perf is not None else cycles, stamps, job_cycles,
                          job_pred or dict(job_cycles), job_link, len(plans), ndesc, time.perf_counter() - t0,
                          energy)

    def _run_energy(self, script, stamps) -> dict:
        """pJ of one run of ``script`` whose stamps are ``stamps`` (host.e2e.energy.ndp_run_energy): from the
        channels' RTL traces on ``rtl`` with the LPDDR5X memory, else from the device memory's fast model."""
        from .energy import ndp_run_energy
        window = max(x.done for x in stamps) + 1 if stamps else 0
        descs = [d for _, d, _ in script.items]
        traces = getattr(script, "channel_traces", None)
        dram_config = self.system().inner.dram_config if traces is not None else None
        refreshes = None
        ref = getattr(self.perf, "refresh", None) if traces is None else None
        pre = getattr(script, "pre_lines", None)
        if ref is not None and pre is not None:
            # the controller's refresh schedule (host.e2e.perf.RankRefresh): REFs due per channel in the window
            a = float(self.perf.first_issue(pre))
            refreshes = []
            for r in range(int(ref["ranks"])):
                t0 = ref["owed"] + r * ref["stagger"]
                lo = max(0, int(np.ceil((a - t0) / ref["interval"])))
                hi = int(np.ceil((a + window - t0) / ref["interval"]))
                refreshes += [(r, t0 + k * ref["interval"] - a) for k in range(lo, hi)]
        return ndp_run_energy(self.config, descs, window, channels=self.channels, depth=self.depth, traces=traces,
                              first_issue=getattr(script, "first_issue", 0), dram_config=dram_config,
                              link=(sum(o for o, _ in script.job_link), sum(i for _, i in script.job_link)),
                              refreshes=refreshes)

    def _check_channels(self, inner, outputs, cycles):
        """The DRAM timing check of one run's channel traces: here, or beside the run (:attr:`check_beside`)."""
        if not self.check_beside:
            self._raise(channel_problems(inner.dram_config, inner.channels, outputs, cycles))
            return
        with self._check_lock:
            if self._check_pool is None:
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor
                self._check_pool = ProcessPoolExecutor(max_workers=1,
                                                       mp_context=multiprocessing.get_context("spawn"))
            self._checks.append(self._check_pool.submit(channel_problems, inner.dram_config, inner.channels,
                                                        outputs, cycles))

    def _raise(self, problems):
        if problems:
            raise RuntimeError(f"NDP device on {self.memory}: {len(problems)} DRAM problems, first: "
                               + "; ".join(problems[:3]))

    def _raise_problems(self, wait: bool):
        with self._check_lock:
            done = [f for f in self._checks if wait or f.done()]
            self._checks = [f for f in self._checks if f not in done]
        for f in done:
            self._raise(f.result())

    def finish(self, raise_problems: bool = True):
        """Wait for the DRAM timing checks still running beside the simulation (:attr:`check_beside`) and raise
        the first problem (``raise_problems``); stops their process."""
        try:
            if raise_problems:
                self._raise_problems(wait=True)
        finally:
            with self._check_lock:
                pool, self._check_pool, self._checks = self._check_pool, None, []
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _golden(self, script):
        """The golden core (sim.golden.ndp_core) on the script's preload and program: the device front end moves
        data without changing it (the driver-level golden device, ``script.driver.run("golden")``, gives the same
        results and is what the tests compare the RTL with; this is its fast path)."""
        from sim.golden.ndp_core import GoldenCore
        core = GoldenCore(self.config, self.depth * 64)
        for addr, bits in script.stores:
            core.write(addr, bits)
        comps = core.run([(d, x) for _, d, x in script.items])
        for (j, d, _), c in zip(script.items, comps):
            if c.status != ErrorCode.OK:
                from host.ndp_status import explain
                raise RuntimeError(f"job {script.jobs[j].key} failed: {explain(c.status, d, self.config)}")
        per_job = {}
        for (j, _, _), c in zip(script.items, comps):
            per_job.setdefault(j, []).append(c)
        return {script.jobs[j].key: script.kernels[j].results(per_job[j]) for j in range(len(script.jobs))}

    def _rtl(self, script):
        from sim.backends import Traffic
        sysm = self.system()
        d = script.driver
        from sim.golden.cxl_device import port_fields
        fields = port_fields(d.regmap, d.mem_addr_bits)
        streams = d.streams(fields)
        mark = 1 << sysm.hmem_inner_bits
        hmem = list(streams["hmem"])
        for s in script.subs:
            hmem[s.valid_pos] |= mark
        be = _engine(self.engine)
        expected = {k: v for k, v in d.expected().items() if k != "core_req"}
        expected.update({"stamp_issue": None, "stamp_start": None, "stamp_done": None})
        collect = getattr(sysm.inner, "collect_all", None)          # DRAM channels: traces and model reports
        channels = dict(collect()) if callable(collect) else {}
        expected.update(channels)
        run = be.run_streams(sysm, {"mmio": streams["mmio"], "hmem": hmem}, expected,
                             traffic=Traffic(), max_cycles=d.max_cycles())
        if channels:
            self._check_channels(sysm.inner, {k: run.outputs.get(k) for k in channels}, run.cycles)
            from sim.dram.trace import decode_trace
            org = sysm.inner.dram_config.org
            script.channel_traces = {c: decode_trace(run.outputs.get(f"trace{c}") or [], org)
                                     for c in range(sysm.inner.channels)}
        hf, ef = fields["hmem_rsp"], fields["events"]
        lines = [hf.unpack(w)[0].to_bytes(64, "little") for w in run.outputs["hmem_rsp"]]
        from sim.golden.cxl_device import Event
        events = [Event(*ef.unpack(w)) for w in run.outputs["events"]]
        records = []
        for _, h in sorted(script.handles):
            raw = b"".join(lines[h.first:h.first + h.lines])[:h.n_bytes]
            records.append(CompletionRecord.from_bytes(h.queue, h.index, raw))
        out = script.results(records)
        stamps = script.stamps_from(run.outputs["stamp_issue"], run.outputs["stamp_start"],
                                    run.outputs["stamp_done"], events)
        script.first_issue = run.outputs["stamp_issue"][0]        # cycles since reset (the refresh's phase)
        return out, stamps
