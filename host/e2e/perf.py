"""Performance model of the end-to-end run's CXL NDP device, calibrated on its RTL, and the PIM rank's model.

**NDP device** (:class:`NDPTiming`). A wave run is replayed event by event, as the RTL runs it:

* the host's CXL.mem stream (the driver script's ``hmem`` requests, in order): one line per cycle; a request
  gated on ``after = a`` completions waits until ``gate`` cycles after the ``a``-th completion; descriptor
  ``k`` is *issued* when its valid word is written;
* the queue engine takes one descriptor at a time: descriptor ``k`` starts ``lat(k)`` cycles after its issue
  (header fetch, window check, staging its input lines) or ``gap(k)`` cycles after the previous completion,
  whichever is later; it completes ``service(k)`` cycles after its start;
* on the LPDDR5X device memory, the DRAM's refreshes (:class:`RankRefresh`: per rank, when the controller takes
  them) stall the descriptors whose operand reads meet a refreshing rank, and ``gap(k)`` is the calibration's
  median per (previous class, class).

``service``, ``lat`` and (on the burst memory) ``gap`` are linear in the descriptor's sizes (:func:`features`:
operand beats times PE passes, input / output beats and lines, softmax terms), one coefficient set per operation
class (LOAD, STORE, GEMV and GEMM in the row dataflow, GEMV_T and GEMM_T in the TRANS (GEMV-PE) dataflow, SOFTMAX)
over the features of :data:`CLASS_FEATURES`; the coefficients are fitted by least squares on the per-descriptor
cycle stamps of RTL runs (:func:`fit`, ``ndpim e2e calibrate``: data/e2e_ndp_calibration*.json) -- measured, never
typed in. A wave's cycles are its last completion minus its first issue, plus one, as on the RTL.

:class:`NDPTiming` also answers the PLoRA host's device-timing interface (``load_s``, ``lora_e3_s``,
``lora_e4_s``, ``attention_s``, ``descriptor_overhead_s``: :mod:`host.plora.ndp_model`) for the e2e device, by
replaying the kernels' programs back to back, so the memory manager's cost model ranks strategies with the
device the run actually has.

**PIM rank**: :class:`sim.perf.pim.PIMPerfModel` of the e2e config with its ``fixed_cycles`` fitted to RTL single
heads (:func:`sim.perf.pim.calibrate`), runs of heads by :func:`host.e2e.pim.run_cycles_model`.
"""

import json
from functools import lru_cache
from math import ceil, log2
from pathlib import Path

import numpy as np

from hdl.ndp.descriptor import DescType, DescOp

__all__ = ["features", "op_class", "NDPTiming", "RankRefresh", "rank_of", "gap_key", "fit", "CALIBRATION",
           "calibration_path", "load_calibration", "CLASSES", "CLASS_FEATURES"]

CALIBRATION = Path(__file__).resolve().parents[2] / "data" / "e2e_ndp_calibration.json"


def calibration_path(memory: str = "burst", channels: int = 2) -> Path:
    """The NDP calibration file of the device on ``memory``: the burst memory's is :data:`CALIBRATION`; the
    LPDDR5X device memory's (``channels`` channels) ``data/e2e_ndp_calibration_lpddr5x<channels>.json``. Each is
    measured on its own RTL (``ndpim e2e calibrate --ndp-memory ...``): the memory changes every descriptor's
    service time."""
    if memory == "burst":
        return CALIBRATION
    return CALIBRATION.with_name(f"e2e_ndp_calibration_{memory}{channels}.json")
CLASSES = ("LOAD", "STORE", "GEMV", "GEMV_T", "GEMM", "GEMM_T", "SOFTMAX")
#: feature names of :func:`features` (the same vector for every class; unused ones are 0)
FEATURES = ("one", "op_beats", "pass_beats", "in_beats", "in_lines", "out_beats", "out_lines", "sm_nb", "sm_rows_nb",
            "acc_elems", "part_elems", "out_tail", "drain_excess")


#: the features each class's service is fitted on (design choice: what the class's dataflow streams -- the
#: operand beats, once per PE pass for GEMM, the staged input, the returned beats, the softmax's beats and rows;
#: for the TRANS classes, the cycles by which a PE job's drain outlasts the next job's operand beats (a short job,
#: e.g. the context GEMV of an 8-token share, waits for the previous drain: not linear in the sizes); a full
#: least-squares fit on every feature over-fits the calibration waves and mispredicts others by ~40 %)
CLASS_FEATURES = {
    "LOAD": ("one", "op_beats", "out_beats"),
    "STORE": ("one", "in_beats", "in_lines"),
    "GEMV": ("one", "op_beats", "out_beats"),
    "GEMV_T": ("one", "op_beats", "in_beats", "out_beats", "drain_excess"),
    "GEMM": ("one", "op_beats", "pass_beats", "in_beats", "out_beats"),
    "GEMM_T": ("one", "op_beats", "pass_beats", "in_beats", "out_beats", "drain_excess"),
    "SOFTMAX": ("one", "out_beats", "sm_nb", "sm_rows_nb"),
}


def op_class(desc) -> str:
    """LOAD, STORE, SOFTMAX, or GEMV / GEMM with ``_T`` for the TRANS (GEMV-PE) dataflow: the two dataflows
    stream the operand and drain the result differently (docs/ndp_pe_array.md)."""
    if desc.type == DescType.READ_COMPUTE:
        return desc.op.name + ("_T" if desc.op in (DescOp.GEMV, DescOp.GEMM) and desc.trans else "")
    return desc.type.name


def _returned(desc) -> int:
    return desc.returned_elems()


def _drain_excess(desc, config) -> float:
    """Sum over a TRANS descriptor's PE jobs of max(0, drain of job j - 1 - A beats of job j): the RTL's drain of
    one job overlaps the next job's compute and stalls it when longer (the jobs and their drain cycles of
    :meth:`sim.perf.ndp.NDPPerfModel.shape`, the RTL's own cycle formulas)."""
    m = _shape_model(config)
    ps = m.shape(desc)["pass"]
    return float(sum(max(0.0, ps[j - 1][1] - ps[j][0]) for j in range(1, len(ps))))


@lru_cache(maxsize=None)
def _shape_model(config):
    """An NDP model of ``config`` for its job shapes only (the memory model does not enter ``shape``'s passes)."""
    from sim.perf.ndp import NDPPerfModel, BurstMemoryModel
    return NDPPerfModel(config, BurstMemoryModel(2 * config.lanes * 4))


def features(desc, config) -> np.ndarray:
    """The descriptor's size features (:data:`FEATURES`)."""
    lanes, beat = config.lanes, 2 * config.lanes
    cls = op_class(desc)
    op_beats = desc.operand_bytes / beat if desc.has_operand else 0.0
    passes = ceil(desc.input_dim0 / config.pe_batch) if cls in ("GEMM", "GEMM_T") else 1
    gpu_input = desc.has_input and not desc.chain
    in_beats = desc.input_bytes / beat if desc.has_input else 0.0
    in_lines = ceil(desc.input_bytes / 64) if gpu_input else 0
    out = _returned(desc)
    nb = ceil(desc.input_dim1 / lanes) if cls == "SOFTMAX" else 0
    rows = desc.input_dim0 if cls == "SOFTMAX" else 0
    res = desc.output_elems() if cls in ("GEMV", "GEMV_T", "GEMM", "GEMM_T") else 0
    return np.array([1.0, op_beats, op_beats * (passes - 1), in_beats, in_lines, ceil(out / lanes),
                     ceil(2 * out / 64), nb, rows * nb, res if desc.acc else 0, res if desc.partial else 0,
                     1.0 if (2 * out) % 64 else 0.0,
                     _drain_excess(desc, config) if cls in ("GEMV_T", "GEMM_T") else 0.0],
                    np.float64)


def fit(records, config) -> dict:
    """Least-squares coefficients from RTL records ``[(descriptor, issue, start, done, prev_done)]`` (cycles;
    ``prev_done`` None for the first of a run). Returns ``{"service": {class: coef}, "lat": coef, "gap": coef,
    "gate": cycles, "points": n}``."""
    by = {}
    lat_X, lat_y, gap_X, gap_y = [], [], [], []
    for desc, issue, start, done, prev in records:
        f = features(desc, config)
        by.setdefault(op_class(desc), ([], []))
        by[op_class(desc)][0].append(f)
        by[op_class(desc)][1].append(done - start + 1)
        fl = np.array([1.0, f[4]])
        if prev is None or issue > prev + 64:          # the engine was idle waiting for this issue
            lat_X.append(fl), lat_y.append(start - issue)
        elif issue < prev:                              # valid long before the previous completion
            gap_X.append(fl), gap_y.append(start - prev)
    out = {"service": {}, "points": len(records), "lanes": config.lanes, "pe_batch": config.pe_batch}
    for cls, (X, y) in by.items():
        X, y = np.array(X), np.array(y, float)
        allowed = np.isin(np.array(FEATURES), CLASS_FEATURES[cls])
        used = np.flatnonzero(np.any(X != 0, axis=0) & allowed)
        coef = np.zeros(X.shape[1])
        sol, *_ = np.linalg.lstsq(X[:, used], y, rcond=None)
        coef[used] = sol
        out["service"][cls] = coef.tolist()
    for name, X, y in (("lat", lat_X, lat_y), ("gap", gap_X, gap_y)):
        if len(X) >= 2:
            sol, *_ = np.linalg.lstsq(np.array(X), np.array(y, float), rcond=None)
            out[name] = sol.tolist()
        else:
            out[name] = [float(np.mean(y)) if y else 0.0, 0.0]
    return out


def load_calibration(path=None, *, memory: str = "burst", channels: int = 2) -> dict:
    p = Path(path or calibration_path(memory, channels))
    if not p.exists():
        opt = "" if memory == "burst" else f" --ndp-memory {memory} --ndp-channels {channels}"
        raise FileNotFoundError(f"{p}: no NDP calibration; run `ndpim e2e calibrate --what ndp{opt}` (measures "
                                f"it on the RTL)")
    return json.loads(p.read_text())


def gap_key(prev_class, cls) -> str:
    """The calibration's ``gap_pair`` key of a descriptor of class ``cls`` after one of ``prev_class``."""
    return f"{prev_class}>{cls}"


def rank_of(addr: int, rank_bits) -> int:
    """Rank of device byte address ``addr``: bit ``j`` of the rank is address bit ``rank_bits[j]`` (the device's
    channel interleave and its controllers' address map are bit permutations:
    :func:`host.e2e.calibrate.rank_bits`)."""
    return sum(((addr >> p) & 1) << j for j, p in enumerate(rank_bits))


class RankRefresh:
    """All-bank refreshes of each rank of the device's channels, as the memory controller schedules them
    (hdl/memctl/controller.py): rank ``r`` owes a refresh at ``owed + r * stagger + k * interval`` cycles after reset
    (the controller's staggered tREFI timers and the cycles from its tick to the PREA on the bus) and takes it as
    soon as it has no queued request for that rank: at once when the rank is idle, else when the requests to it
    end. The rank is then blocked for ``prea + cycles`` (tRPab, then tRFC). A descriptor's operand reads are
    spread evenly over its service, rank by rank in address order (:func:`rank_of`); reads to a blocked rank
    wait for it, which delays the rest of the descriptor. The channels' controllers refresh in step (one reset).
    ``params``: the calibration's ``refresh`` entry; ``first_abs``: the run's first issue, cycles after reset."""

    def __init__(self, params, first_abs):
        self.p = params
        self.ranks = int(params["ranks"])
        self.next_k = [0] * self.ranks
        self.first = float(first_abs)
        self.blocked = [-1e18] * self.ranks
        self.last = [-1e18] * self.ranks

    def _owed(self, r, k) -> float:
        p = self.p
        return p["owed"] + r * p["stagger"] + k * p["interval"] - self.first

    def windows(self, desc, s, e) -> list:
        """``[(rank, from, to)]``: the descriptor's operand accesses in time (a STORE's writes, every other
        operand's reads), one window per rank region; none for a SOFTMAX (no operand)."""
        if not desc.has_operand or desc.operand_bytes <= 0:
            return []
        lo, n, bits = desc.base_addr, desc.operand_bytes, self.p["rank_bits"]
        if not bits:
            return [(0, s, e)]
        step = 1 << min(bits)
        out, a = [], lo
        while a < lo + n:
            b = min(lo + n, (a // step + 1) * step)
            r = rank_of(a, bits)
            t0, t1 = s + (a - lo) / n * (e - s), s + (b - lo) / n * (e - s)
            if out and out[-1][0] == r:
                out[-1] = (r, out[-1][1], t1)
            else:
                out.append((r, t0, t1))
            a = b
        return out

    def stall(self, desc, s, e) -> tuple:
        """``(done, stalled cycles)`` of a descriptor that runs ``[s, e]`` without refresh (run-relative cycles)."""
        block = self.p["prea"] + self.p["cycles"]
        tot = 0.0
        for r, a, b in self.windows(desc, s, e):
            a, b = a + tot, b + tot
            while self._owed(r, self.next_k[r]) <= a:          # owed before these reads: taken when the rank idled
                fire = max(self._owed(r, self.next_k[r]), self.last[r])
                self.blocked[r] = max(self.blocked[r], fire + block)
                self.next_k[r] += 1
            if a < self.blocked[r]:
                d = self.blocked[r] - a
                tot, a, b = tot + d, a + d, b + d
            while self._owed(r, self.next_k[r]) <= b:          # owed during them: taken when they end
                self.blocked[r] = max(self.blocked[r], b + block)
                self.next_k[r] += 1
            self.last[r] = b
        return e + tot, tot


class NDPTiming:
    """The calibrated event model of the NDP device (module docstring). ``coef``: :func:`fit`'s output."""

    kind = "calibrated-e2e"

    def __init__(self, config, coef: dict | None = None, *, clock_hz: float = 1e9, gate: int = 4):
        self.config = config
        self.coef = coef if coef is not None else load_calibration()
        self.clock_hz = clock_hz
        self.gate = int(self.coef.get("gate", gate))
        #: cycles per line of the host's CXL.mem stream: 1 on the burst memory (one line per cycle); on the LPDDR5X
        #: device memory the lines go at the channels' rate (fitted by the calibration, ``hmem_line_cycles``)
        self.line_cycles = float(self.coef.get("hmem_line_cycles", 1.0))
        #: DRAM refresh (LPDDR5X memory: :class:`RankRefresh`'s parameters, None on the burst memory); the run's
        #: first issue is ``a + b * preload lines`` cycles after reset (``first_issue``, fitted on the RTL's stamps)
        self.refresh = self.coef.get("refresh")
        if self.refresh is not None and self.refresh.get("model") != "rank":
            raise ValueError("the calibration's refresh entry is not the rank model of RankRefresh (an older "
                             "calibration): run `ndpim e2e calibrate --what ndp` with its --ndp-memory again")
        #: median completion-to-start gaps per (previous class, class) and per class (LPDDR5X calibration;
        #: ``None``: the linear ``gap`` for every descriptor)
        self._gap_pair = self.coef.get("gap_pair")
        self._gap_class = self.coef.get("gap_class")
        self._svc = {k: np.asarray(v) for k, v in self.coef["service"].items()}
        self.cache_key = ("e2e-ndp", json.dumps(self.coef, sort_keys=True))

    # ---- per descriptor --------------------------------------------------------------------------------
    def service(self, desc) -> float:
        c = self._svc.get(op_class(desc))
        if c is None:
            raise ValueError(f"no calibration for {op_class(desc)} descriptors")
        return max(1.0, float(features(desc, self.config) @ c))

    def _lat(self, desc, which) -> float:
        a, b = self.coef[which]
        return max(0.0, a + b * features(desc, self.config)[4])

    def _gap(self, prev, desc) -> float:
        """Cycles from the previous descriptor's completion to this one's start when it was issued earlier."""
        if self._gap_pair is not None:
            v = self._gap_pair.get(gap_key(op_class(prev), op_class(desc)))
            if v is None:
                v = self._gap_class.get(op_class(desc))
            if v is not None:
                return float(v)
        return self._lat(desc, "gap")

    # ---- a wave run ------------------------------------------------------------------------------------
    def first_issue(self, pre_lines) -> float | None:
        """Cycles after reset of a run's first issue (refresh model only)."""
        if self.refresh is None:
            return None
        a, b = self.refresh["first_issue"]
        return a + b * pre_lines

    def replay(self, descs, hmem=None, pre_lines=None) -> list:
        """``[(issue, start, done)]`` per descriptor, relative to the first issue. ``hmem``: the script's
        requests ``[(lines, after, is_valid_word)]`` in order (None: descriptors issued back to back, the
        steady state of a long stream); ``pre_lines``: the preload's lines (with a refresh model: the run's
        phase against the refreshes)."""
        n = len(descs)
        first_abs = self.first_issue(pre_lines) if pre_lines is not None else None
        # the run's refresh state: local, as two devices' waves may be replayed at once (one model, two threads)
        rr = RankRefresh(self.refresh, first_abs) if self.refresh is not None and first_abs is not None else None
        issue = [0.0] * n
        if hmem is not None:
            t, k, first = 0.0, 0, None
            done_at = {}
            pending = []
            # two passes are not needed: gates refer to earlier descriptors, resolved in order below
            ops = list(hmem)
            out, starts, dones = [], [], []
            prev_done = None
            oi = 0
            for k in range(n):
                # advance the host stream to this descriptor's valid word
                while oi < len(ops):
                    lines, after, valid = ops[oi]
                    if after and after > len(dones):
                        raise ValueError("hmem gate on a completion that comes later")
                    g = (dones[after - 1] + self.gate) if after else -1e18
                    t = max(t, g) + lines * self.line_cycles
                    oi += 1
                    if valid:
                        break
                if first is None:
                    first = t
                iss = t - first
                d = descs[k]
                s = iss + self._lat(d, "lat")
                if prev_done is not None:
                    s = max(s, prev_done + self._gap(descs[k - 1], d))
                e = s + self.service(d) - 1
                if rr is not None:
                    e = rr.stall(d, s, e)[0]
                out.append((iss, s, e))
                dones.append(e + first)
                prev_done = e
            return out
        out, prev = [], None
        for k, d in enumerate(descs):
            s = 0.0 if prev is None else prev + self._gap(descs[k - 1], d)
            e = s + self.service(d) - 1
            out.append((0.0, s, e))
            prev = e
        return out

    def stamps(self, script) -> list:
        """Predicted :class:`host.e2e.ndp.DescriptorStamp` of a :class:`host.e2e.ndp.WaveScript`."""
        from host.e2e.ndp import DescriptorStamp, _op_name
        rows = self.replay([d for _, d, _ in script.items], script_hmem(script), getattr(script, "pre_lines", None))
        return [DescriptorStamp(script.jobs[j].key, _op_name(d), int(round(i)), int(round(s)), int(round(e)))
                for (j, d, _), (i, s, e) in zip(script.items, rows)]

    # ---- the PLoRA host's device-timing interface ------------------------------------------------------
    def program_s(self, program) -> float:
        descs = [d for d, _ in program]
        if not descs:
            return 0.0
        rows = self.replay(descs)
        return (rows[-1][2] + 1 + self._lat(descs[0], "lat")) / self.clock_hz

    @property
    def descriptor_overhead_s(self) -> float:
        return float(self.coef["gap"][0]) / self.clock_hz

    def load_s(self, nbytes) -> float:
        from firmware.ndp.descriptor import load
        from firmware.ndp.kernels import load_chunk_bytes
        if nbytes <= 0:
            return 0.0
        cols = 8 * self.config.lanes
        rows = max(1, ceil(nbytes / 2 / cols))
        per = max(1, load_chunk_bytes(self.config) // (2 * cols))      # the firmware's LOAD chunks
        prog = [(load(0, min(per, rows - r0), cols), None) for r0 in range(0, rows, per)]
        return self.program_s(prog)

    def lora_e3_s(self, d_in, d_out, rank, batch) -> float:
        return self._e3(int(d_in), int(d_out), int(rank), int(batch))

    def _layout(self, d_in, d_out, rank):
        from . import programs
        L = self.config.lanes
        return programs.lora_layout(_up(d_in, L), _up(d_out, L), _up(rank, 2), config=self.config)

    def _e3(self, d_in, d_out, rank, batch):
        from . import programs
        lay = self._layout(d_in, d_out, rank)
        x = np.zeros((batch, lay["d"]), np.uint16)
        return self.program_s(programs.lora_e3(x, lay, config=self.config).program)

    def lora_e4_s(self, d_in, rank, batch) -> float:
        from . import programs
        lay = self._layout(d_in, d_in, rank)
        x = np.zeros((int(batch), lay["d"]), np.uint16)
        return self.program_s(programs.lora_e4(x, lay, config=self.config).program)

    def max_share(self, head_dim) -> int:
        """Tokens of one attention job at most: one token tile of the firmware kernel
        (:func:`firmware.ndp.kernels.token_tile`: K^T in half the DRAM ring, the scores in the accumulators
        and a kept slot)."""
        from firmware.ndp.kernels import token_tile
        return token_tile(head_dim, 1 << 16, 1, self.config)

    def _att_one(self, t, head_dim):
        from . import programs
        key = (t, head_dim)
        c = self._att_cache.get(key)
        if c is None:
            q = np.zeros(head_dim, np.uint16)
            lay = programs.kv_layout(head_dim, t, config=self.config)
            c = self._att_cache[key] = self.program_s(programs.attention(q, lay, config=self.config).program)
        return c

    def _att_inc(self, t, head_dim):
        """Seconds one attention job of ``t`` tokens adds to a wave of such jobs (the wave's descriptors back to
        back: three jobs minus two)."""
        from . import programs
        key = ("inc", t, head_dim)
        c = self._att_cache.get(key)
        if c is None:
            q = np.zeros(head_dim, np.uint16)
            lay = programs.kv_layout(head_dim, t, config=self.config)
            prog = programs.attention(q, lay, config=self.config).program
            c = self._att_cache[key] = self.program_s(prog * 3) - self.program_s(prog * 2)
        return c

    def _att_jobs(self, tokens, head_dim, kv_heads, fn):
        if not hasattr(self, "_att_cache"):
            self._att_cache = {}
        tok = np.asarray(tokens, np.float64)
        L = self.config.lanes
        cap = self.max_share(head_dim)

        def one(t):
            t = int(t) // L * L
            if t <= 0:
                return 0.0
            full, rest = divmod(t, cap)
            return kv_heads * (full * fn(cap, head_dim) + (fn(rest, head_dim) if rest else 0))
        out = np.vectorize(one, otypes=[float])(tok)
        return float(out) if np.ndim(tokens) == 0 else out

    def attention_s(self, tokens, head_dim, q_heads, kv_heads):
        """One request's decode attention over ``tokens`` on this device (all its KV heads; whole beats only:
        the share's tail stays on the GPU), in jobs of at most :meth:`max_share` tokens, from an idle device."""
        return self._att_jobs(tokens, head_dim, kv_heads, self._att_one)

    def attention_stream_s(self, tokens, head_dim, q_heads, kv_heads):
        """As :meth:`attention_s`, each job at its cost inside a layer's attention wave (the device runs the
        wave's jobs back to back: :class:`host.e2e.ndp.WaveScript`; sim/perf/ndp.py ``attention_stream_s``)."""
        return self._att_jobs(tokens, head_dim, kv_heads, self._att_inc)

    def attention_fixed_s(self, tokens, head_dim, q_heads, kv_heads) -> float:
        """Once per wave: the first job's time that the stream costs leave out, the largest over the shares'
        jobs (sim/perf/ndp.py ``attention_fixed_s``); 0 for no share."""
        first = np.atleast_1d(self.attention_first_s(tokens, head_dim, q_heads, kv_heads))
        return float(first.max()) if first.size else 0.0

    def attention_first_s(self, tokens, head_dim, q_heads, kv_heads):
        """Per request (vectorized): the largest over its share's jobs of the time the stream cost leaves out
        (sim/perf/ndp.py ``attention_first_s``); 0 for no share."""
        if not hasattr(self, "_att_cache"):
            self._att_cache = {}
        L, cap = self.config.lanes, self.max_share(head_dim)

        def one(t):
            t = int(t) // L * L
            best = 0.0
            for j in ({cap} if t >= cap else set()) | ({t % cap} if t % cap else set()):
                best = max(best, self._att_one(j, head_dim) - self._att_inc(j, head_dim))
            return best
        out = np.vectorize(one, otypes=[float])(np.asarray(tokens, np.float64))
        return float(out) if np.ndim(tokens) == 0 else out


def _up(v, m):
    return -(-int(v) // m) * m


def script_hmem(script) -> list:
    """``[(lines, after, is_valid_word)]`` of a wave script's hmem requests from its first submission on (the
    preload stores before it are not part of the wave)."""
    return script.hmem_ops
