"""Simulation top of one DIMM-PIM channel running the fused decode-attention kernel through the real RTL: a
:class:`hdl.pim.rank_pu.RankPU` (buffer chip), ``chips x banks`` :class:`hdl.pim.bank_pu.BankPU` (one per bank per
chip) and the :class:`sim.dram.device.DRAMChannel` device model (real timing and storage, initialised with the KV
cache by :func:`hdl.pim.mapping.kv_store_image`). Design notes and measured cycles: ``docs/pim_rank_pu_sequencer.md``.

:class:`PIMChannelSystem` streams (runnable on both backends with ``run_streams``):

* ``launch`` (in, :func:`hdl.pim.rank_pu.launch_layout`): one head per item.
* ``result`` (out, 16): ``d`` FP16 per head, in element order.
* ``done`` (out, :data:`done_layout`): one item per head, in the cycle its last result element is taken:
  ``cycle``, the device model's ``violations`` count so far, ``refreshes`` / ``urgent`` (REFs issued so far /
  of them inside a head), ``errors`` (the rank PU's sticky error bits), ``dropped`` (trace records lost).
* ``trace`` (out, ``trace_layout(org)``): every command on the bus with its cycle; collect it whole
  (``expected=None``) and check it with :func:`sim.dram.checker.check_trace`.
* ``scores`` (out) / ``p_in`` (in): only with ``softmax=False`` (see :class:`RankPU`).

``fast=True`` (Verilator only): the bank PUs are instances of one compiled, clock-gated bank-PU module (their FP
stages on gated clocks shared per chip; docs/pim_bank_pu.md, "Clock gating") and the DRAM contents a run-time
image; the same cycles and bits as the inline build.

Python drivers: :func:`run_fused` (K, V, q -> outputs, cycles, trace, per-head cycle stamps), :func:`rtl_cycles`
(cycle counts per L for the perf model's calibration).
"""

import functools
import re
from dataclasses import dataclass, field

import numpy as np
from amaranth.hdl import Module, Signal, Cat, Const, Mux, Instance, ClockSignal, ResetSignal
from amaranth.hdl import Shape
from amaranth.lib import wiring, stream, data
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hdl.memctl.commands import Cmd, trace_layout, CYCLE_BITS
from hdl.fp.pipeline import gated_domain
from hdl.pim.bank_pu import BankPU, GATE_DOMAINS
from hdl.pim.config import PIMConfig
from hdl.pim.rank_pu import RankPU, launch_layout, head_cycle_bound
from sim.dram.device import DRAMChannel

__all__ = ["PIMChannelSystem", "done_layout", "FusedRun", "run_fused", "rtl_cycles", "ideal_cycles",
           "encode_launch", "tiny_rows", "micro", "phase_order", "bank_pu_verilog", "kv_array_verilog",
           "paper_rows", "add_bank_pus", "decode_done"]

done_layout = data.StructLayout({"cycle": CYCLE_BITS, "violations": 32, "refreshes": 32, "urgent": 16,
                                 "errors": 4, "dropped": 16})


class PIMChannelSystem(wiring.Component):
    """One channel: the rank PU of ``rank`` + its bank PUs + the DRAM device model.

    ``init``: DRAMChannel initial contents (``kv_store_image``); ``storage=False``: the timing-only device
    model (reads return addresses: outputs are garbage, cycle counts are exact -- the datapath's timing does
    not depend on values). ``softmax``, ``overlap``: see :class:`RankPU`. The channel's other ranks are idle;
    the top refreshes them every tREFI in command slots the rank PU leaves free.
    """

    TRACE_DEPTH = 64

    def __init__(self, config: PIMConfig, init=None, *, rank: int = 0, storage: bool = True,
                 softmax: bool = True, overlap: bool = True, fast: bool = False):
        if not isinstance(config, PIMConfig):
            raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
        self.config = config
        self.org = org = config.dram.org
        self.softmax = softmax
        self.rank = rank
        self.fast = bool(fast)
        self.rank_pu = RankPU(config, rank=rank, softmax=softmax, overlap=overlap)
        if self.fast:
            # Verilator-only build (module docstring): the device model keeps its timing, state and checks; the
            # burst data comes from a run-time image, the bank PUs from one compiled module.
            self.dram = DRAMChannel(config.dram, None, storage=False)
            self._image = {}
            self.set_image(init)
        else:
            self.dram = DRAMChannel(config.dram, init, storage=storage)
        ports = {
            "launch": In(stream.Signature(launch_layout(config))),
            "result": Out(stream.Signature(16)),
            "done": Out(stream.Signature(done_layout)),
            "trace": Out(stream.Signature(trace_layout(org))),
        }
        if not softmax:
            ports["scores"] = Out(stream.Signature(16))
            ports["p_in"] = In(stream.Signature(16 * config.token_sets))
        super().__init__(ports)

    # ---- the fast (Verilator-only) build: extra Verilog modules and the run-time KV image ------------------
    def set_image(self, init):
        """``fast`` systems: the DRAM contents (``{flat burst address: int}``, e.g. ``kv_store_image``) for the
        following runs; the compiled executable is reused (the image is a run-time file)."""
        if not self.fast:
            raise ValueError("set_image needs a PIMChannelSystem(..., fast=True); otherwise the image is "
                             "the DRAMChannel's init")
        org = self.org
        total = org.ranks * org.banks * org.rows * org.bursts_per_row
        img = {}
        items = (init or {}).items() if isinstance(init, dict) or init is None else enumerate(init)
        for a, v in items:
            a, v = int(a), int(v)
            if not 0 <= a < total:
                raise ValueError(f"image address {a} outside 0..{total - 1}")
            if not 0 <= v < 1 << org.burst_bits:
                raise ValueError(f"image word at {a} does not fit {org.burst_bits} bits")
            if v:
                img[a] = v
        self._image = img

    def verilog_modules(self):
        """Extra Verilog modules of the ``fast`` build (sim/backends/verilog.verilog_text appends them)."""
        if not self.fast:
            return []
        return [bank_pu_verilog(self.config), kv_array_verilog(self.org)]

    def verilator_flags(self):
        """``fast`` build: Verilator without its DFG optimiser, so that the bank PU instances share one copy of
        their evaluation code (see :func:`bank_pu_verilog`)."""
        return ["-fno-dfg"] if self.fast else []

    def verilator_runtime_files(self):
        """``fast`` build: ``{plusarg: file text}`` the Verilator backend writes next to each run (``+pim_kv=``:
        the KV image in ``$readmemh`` format, sparse)."""
        if not self.fast:
            return {}
        nd = self.org.burst_bits // 4
        lines = [f"@{a:x} {v:0{nd}x}" for a, v in sorted(self._image.items())]
        return {"pim_kv": "\n".join(lines) + "\n"}

    def elaborate(self, platform):
        m = Module()
        cfg, org = self.config, self.org
        C, B, bpt = cfg.chips, cfg.banks, cfg.bursts_per_token
        BB = org.burst_bits
        m.submodules.rank_pu = rpu = self.rank_pu
        m.submodules.dram = dram = self.dram
        m.d.comb += rpu.ab_valid.eq(dram.ab_valid)
        # The other ranks of the channel are idle (precharged): a REF for each every tREFI, in a cycle the rank PU
        # leaves the command bus free (so the device and the checker see a fully refreshed channel).
        tm = cfg.dram.timing
        bus = Signal.like(rpu.cmd)
        m.d.comb += bus.eq(rpu.cmd)
        for r in range(org.ranks):
            if r == self.rank:
                continue
            due = Signal(range(-8, 16), name=f"idle_ref_due_{r}")
            ph = Signal(range(tm.tREFI), name=f"idle_ref_phase_{r}")
            tick = (ph == tm.tREFI - 1)
            m.d.sync += ph.eq(Mux(tick, 0, ph + 1))
            go = (due > 0) & (rpu.cmd.kind == Cmd.NOP)
            with m.If(go):
                m.d.comb += [bus.kind.eq(Cmd.REF), bus.rank.eq(r)]
            m.d.sync += due.eq(due + tick - go)
        m.d.comb += dram.cmd.eq(bus)

        # ---- bank PUs: one per (chip, logic bank), fed by the bank's row word and the chip's broadcast -----
        if self.fast:
            # the timing-only device model returns each bank's flat burst address; the image array maps it to
            # the burst (combinationally, in the ab_valid cycle)
            AW = _addr_bits(org)
            kv_data = Signal(B * BB)
            m.submodules.kv_array = Instance(
                _kv_module_name(org),
                i_addr=Cat(*[dram.ab_rdata[b * BB:b * BB + AW] for b in range(B)]),
                o_data=kv_data)
        else:
            kv_data = dram.ab_rdata
        add_bank_pus(m, cfg, rpu, kv_data, instance=self.fast)

        wiring.connect(m, wiring.flipped(self.launch), rpu.launch)
        if not self.softmax:
            wiring.connect(m, wiring.flipped(self.p_in), rpu.p_in)
            wiring.connect(m, rpu.scores, wiring.flipped(self.scores))

        # ---- results and the per-head done record -----------------------------------------------------------
        d = cfg.head_dim
        nres = Signal(range(d))
        dropped = Signal(16)
        done_q = m.submodules.done_q = SyncFIFOBuffered(width=done_layout.size, depth=4)
        res_fire = Signal()
        m.d.comb += [
            self.result.valid.eq(rpu.result.valid & done_q.w_rdy),
            self.result.payload.eq(rpu.result.payload),
            rpu.result.ready.eq(self.result.ready & done_q.w_rdy),
            res_fire.eq(self.result.valid & self.result.ready),
        ]
        with m.If(res_fire):
            m.d.sync += nres.eq(Mux(nres == d - 1, 0, nres + 1))
        rec = Signal(done_layout)
        m.d.comb += [rec.cycle.eq(dram.cycle), rec.violations.eq(dram.violations), rec.refreshes.eq(rpu.refreshes),
                     rec.urgent.eq(rpu.urgent_refreshes), rec.errors.eq(rpu.errors), rec.dropped.eq(dropped)]
        m.d.comb += [done_q.w_en.eq(res_fire & (nres == d - 1)), done_q.w_data.eq(rec),
                     self.done.valid.eq(done_q.r_rdy), self.done.payload.eq(done_q.r_data),
                     done_q.r_en.eq(self.done.ready)]

        # ---- command trace ----------------------------------------------------------------------------------
        tw = Shape.cast(trace_layout(org)).width
        tq = m.submodules.trace_q = SyncFIFOBuffered(width=tw, depth=self.TRACE_DEPTH)
        m.d.comb += [tq.w_en.eq(bus.kind != Cmd.NOP), tq.w_data.eq(Cat(bus.as_value(), dram.cycle)),
                     self.trace.valid.eq(tq.r_rdy), self.trace.payload.eq(tq.r_data), tq.r_en.eq(self.trace.ready)]
        with m.If(tq.w_en & ~tq.w_rdy):
            m.d.sync += dropped.eq(dropped + 1)
        return m


def add_bank_pus(m, config, rpu, ab_data, *, instance=False, prefix=""):
    """The ``chips x banks`` bank PUs of the rank of ``rpu`` (a :class:`RankPU`), each fed by its chip's 64 bits
    of its bank's burst in ``ab_data`` (the DRAM's ``ab_rdata`` format) and the chip's broadcast word, results to
    ``rpu.pu_res``. ``instance``: instances of :func:`bank_pu_verilog`'s module (Verilator only), clock-gated: per
    chip one gated clock per domain of :data:`GATE_DOMAINS` (``<prefix>pu_c<c>_<domain>``, defined here in ``m``),
    enabled in the cycles any bank PU of the chip loads that domain's registers (docs/pim_bank_pu.md, "Clock
    gating")."""
    C, B, bpt = config.chips, config.banks, config.bursts_per_token
    BB = config.dram.org.burst_bits
    readies = []
    for c in range(C):
        chip_pus = []
        for b in range(B):
            pu = _BankPUInstance(config, f"{prefix}pu_c{c}_") if instance else BankPU(config)
            chip_pus.append(pu)
            m.submodules[f"{prefix}bank_pu_c{c}_b{b}"] = pu
            burst = ab_data[b * BB:(b + 1) * BB]
            # chip c's element j = its bytes of beats 2j (low) and 2j + 1 (high) (hdl/pim/mapping.py)
            row = Cat(*[Cat(burst[8 * C * (2 * j) + 8 * c:][:8], burst[8 * C * (2 * j + 1) + 8 * c:][:8])
                        for j in range(4)])
            k = c * B + b
            m.d.comb += [
                pu.i.valid.eq(rpu.pu_valid),
                pu.i.payload.row.eq(row),
                pu.i.payload.bcast.eq(rpu.pu_bcast[c]),
                pu.i.payload.sel.eq(b // bpt),
                pu.i.payload.mode.eq(rpu.pu_ctrl.mode),
                pu.i.payload.first.eq(rpu.pu_ctrl.first),
                pu.i.payload.last.eq(rpu.pu_ctrl.last),
                rpu.pu_res[k].eq(pu.o.payload.data),
                rpu.pu_res_valid[k].eq(pu.o.valid),
                pu.o.ready.eq(rpu.pu_res_ready[k]),
            ]
            readies.append(pu.i.ready)
        if instance:
            for k, domain in enumerate(GATE_DOMAINS):
                gated_domain(m, f"{prefix}pu_c{c}_{domain}", Cat(pu.gate_en[k] for pu in chip_pus).any())
    m.d.comb += rpu.pu_ready.eq(Cat(*readies).all())


# ---- the fast build's Verilog modules -----------------------------------------------------------------------

def _bank_pu_proto(config):
    """A BankPU used only for its parameters and layouts (never elaborated: no UnusedElaboratable warning)."""
    pu = BankPU(config)
    pu._MustUse__silence = True
    return pu


def _bank_pu_module_name(config):
    pu = _bank_pu_proto(config)
    return f"pim_bank_pu_n{pu.lanes}_d{pu.out_depth}"


@functools.lru_cache(maxsize=8)
def _bank_pu_verilog(n, out_depth, config):
    from sim.backends.verilog import verilog_text
    name = _bank_pu_module_name(config)
    text = verilog_text(BankPU(config, out_depth=out_depth, gated=True), name)   # GATE_DOMAINS: clock ports
    # One C++ class for all bank PUs: keep the module (and its FP units) out of the parent's inlining, and make its
    # inputs real variables of the instance (public_flat_rd): otherwise Verilator reads each instance's inputs
    # straight from the parent's nets, so every instance gets its own copy of the evaluation code (128 copies
    # on PAPER: 2.1x slower). With -fno-dfg (verilator_flags) the copies are identical and Verilator keeps one.
    head = f"module {name}("
    i = text.index(head)
    j = text.index(");", i) + 2
    end = text.index("\nendmodule", j)
    body = text[j:end]
    for port in ("i__payload", "i__valid", "o__ready"):
        body, n = re.subn(r"^(  input (?:\[\d+:0\] )?" + port + r");$", r"\1 /*verilator public_flat_rd*/;", body,
                          flags=re.M)
        if n != 1:
            raise RuntimeError(f"bank PU Verilog: input {port!r} not found once ({n})")
    return _sorted_port_lists(text[:j] + "\n  /*verilator no_inline_module*/" + body + text[end:])


def _sorted_port_lists(text: str) -> str:
    """Every module header's port list in sorted order. Amaranth lists a module's clock-domain ports in an order
    that changes from one Python process to the next (string hashing), which changed the Verilog -- and so the
    Verilator build's cache key -- on every run; the instances connect by name (Yosys' ``.port(net)``), so the
    order of the header's list carries no meaning."""
    def fix(mo):
        # (an escaped identifier ends at whitespace: keep each name's own trailing space)
        names = [n.lstrip() for n in mo.group(2).split(",")]
        names = [n if n.startswith("\\") else n.rstrip() for n in names]
        return f"{mo.group(1)}({', '.join(sorted(names, key=str.strip))});"
    return re.sub(r"^(module [^\n(]+?\s?)\(([^;]*?)\);", fix, text, flags=re.M)


def bank_pu_verilog(config):
    """Verilog of :class:`BankPU` for ``config`` as module ``pim_bank_pu_n<N>_d<depth>`` (generated once per
    process), marked ``no_inline_module`` so Verilator compiles it once for all instances."""
    pu = _bank_pu_proto(config)
    return _bank_pu_verilog(pu.lanes, pu.out_depth, config)


class _BankPUInstance(wiring.Component):
    """An instance of :func:`bank_pu_verilog`'s module (a gated :class:`BankPU`) with its ports (Verilator only);
    its gated clocks are the domains ``<domains>h``, ``<domains>mul_s1``, ... (:data:`GATE_DOMAINS`) of the
    parent."""

    def __init__(self, config, domains):
        proto = _bank_pu_proto(config)
        self.config = config
        self.domains = domains
        self.i_layout, self.o_layout = proto.i_layout, proto.o_layout
        super().__init__({"i": In(stream.Signature(proto.i_layout)), "o": Out(stream.Signature(proto.o_layout)),
                          "gate_en": Out(len(GATE_DOMAINS))})

    def elaborate(self, platform):
        m = Module()
        clocks = {}
        for d in GATE_DOMAINS:
            clocks[f"i_{d}_clk"] = ClockSignal(self.domains + d)
            clocks[f"i_{d}_rst"] = Const(0, 1)     # the gated registers have no reset
        m.submodules.pu = Instance(
            _bank_pu_module_name(self.config),
            i_clk=ClockSignal(), i_rst=ResetSignal(), **clocks, o_gate_en=self.gate_en,
            i_i__valid=self.i.valid, i_i__payload=self.i.payload.as_value(), o_i__ready=self.i.ready,
            o_o__valid=self.o.valid, o_o__payload=self.o.payload.as_value(), i_o__ready=self.o.ready)
        return m


def _addr_bits(org):
    return (org.ranks * org.banks * org.rows * org.bursts_per_row - 1).bit_length()


def _kv_module_name(org):
    return f"pim_kv_array_w{org.burst_bits}_a{_addr_bits(org)}_p{org.banks}"


def kv_array_verilog(org):
    """A simulation model (Verilog, not synthesizable): the channel's burst array, ``org.banks`` combinational
    read ports (port ``b`` at ``addr[b AW +: AW]``, ``AW`` = flat burst address bits), loaded at time 0 from the
    ``$readmemh`` file named by the plusarg ``+pim_kv=<file>`` (zeros without it)."""
    W, AW, P = org.burst_bits, _addr_bits(org), org.banks
    name = _kv_module_name(org)
    return f"""module {name}(addr, data);
  input [{AW * P - 1}:0] addr;
  output [{W * P - 1}:0] data;
  reg [{W - 1}:0] mem [0:{(1 << AW) - 1}];
  string path;
  integer i;
  initial begin
    for (i = 0; i < {1 << AW}; i = i + 1) mem[i] = {W}'d0;
    if ($value$plusargs("pim_kv=%s", path)) $readmemh(path, mem);
  end
  genvar g;
  generate for (g = 0; g < {P}; g = g + 1) begin : rd
    assign data[g * {W} +: {W}] = mem[addr[g * {AW} +: {AW}]];
  end endgenerate
endmodule
"""


# ---- Python drivers ---------------------------------------------------------------------------------------

def encode_launch(config, L, k_row0, v_row0, q, postpone=None) -> int:
    q = np.asarray(q, dtype=np.uint16)
    if q.shape != (config.head_dim,):
        raise ValueError(f"q must have shape ({config.head_dim},), got {q.shape}")
    if not 1 <= L <= config.max_tokens:
        raise ValueError(f"L = {L} outside [1, config.max_tokens = {config.max_tokens}]")
    if postpone is None:
        postpone = config.max_postponed_refresh
    if not 0 <= postpone <= config.max_postponed_refresh:
        raise ValueError(f"postpone = {postpone} outside [0, config.max_postponed_refresh = "
                         f"{config.max_postponed_refresh}]")
    qv = int.from_bytes(q.astype("<u2").tobytes(), "little")
    return launch_layout(config).const({"L": L, "k_row0": k_row0, "v_row0": v_row0, "postpone": postpone,
                                        "q": qv}).as_value().value


def phase_order(config, Ls, *, overlap=True):
    """The rank PU's phase order for launches of lengths ``Ls`` when every launch is queued before it is
    needed (a Python model of :class:`hdl.pim.rank_pu.PIMSequencer`'s decisions): ``[(launch, "S" | "C")]``.
    With ``overlap`` the next head's score phase runs before the pending head's context phase when both heads'
    ``ceil(L / B) B`` rank-buffer entries fit ``config.max_tokens`` (S0 S1 C0 S2 C1 ...)."""
    B = config.banks
    slots = [-(-L // B) * B for L in Ls]
    n = len(Ls)
    fits = (lambda a, b: overlap and slots[a] + slots[b] <= config.max_tokens)
    out, pend, sc, i, last = [], None, None, 0, None   # last: the phase that just ended (None: idle)
    while True:
        if last is None:
            if i >= n:
                return out
            out.append((i, "S"))
            sc, i, last = i, i + 1, "S"
        elif last == "S":
            if pend is not None:
                out.append((pend, "C"))
                pend, last = sc, "C"
            elif i < n and fits(sc, i):
                out.append((i, "S"))
                pend, sc, i = sc, i, i + 1
            else:
                out.append((sc, "C"))
                last = "C"
        elif pend is not None:
            if i < n and fits(pend, i):
                out.append((i, "S"))
                sc, i, last = i, i + 1, "S"
            else:
                out.append((pend, "C"))
                pend = None
        else:
            last = None


def ideal_cycles(config, L) -> int:
    """The all-bank ideal of one head: every RD_AB of both phases back to back at tCCD_L."""
    B, G, bpt = config.banks, config.token_sets, config.bursts_per_token
    return (-(-L // B) * bpt + -(-L // G)) * config.dram.timing.tCCD_L


@dataclass
class FusedRun:
    out: np.ndarray              # (heads, d) uint16
    cycles: int                  # run_streams cycles (reset to the last result taken)
    trace: list                  # TraceCommand list
    done: list                   # per head: dict of done_layout fields
    violations: list             # sim.dram.checker violations of the trace
    scores: np.ndarray | None = None
    wall_seconds: float = 0.0
    head_cycles: list = field(default_factory=list)
    cpu_seconds: float | None = None   # CPU time of the simulation (sim.backends.StreamRun.cpu_seconds)   # per head: cycles from its first command to its result

    @property
    def device_violations(self) -> int:
        return self.done[-1]["violations"] if self.done else 0


def decode_done(payloads):
    """``done`` stream payloads -> dicts of :data:`done_layout` fields."""
    out = []
    for p in payloads:
        rec = {}
        for name, f in done_layout:
            w = Shape.cast(f.shape).width
            rec[name] = (int(p) >> f.offset) & ((1 << w) - 1)
        out.append(rec)
    return out


def run_fused(backend, config, K, V, q, *, L=None, heads_order=None, component=None, layout=None, traffic=None,
              softmax=True, p_words=None, max_cycles=None, check=True, postpone=None) -> FusedRun:
    """Run heads through :class:`PIMChannelSystem` on ``backend`` (a name or a Backend).

    ``K``, ``V``: (heads, L, d) FP16 bits stored in rank 0 (:func:`head_layout`); ``q``: (n, d) queries, one
    launch each, of head ``heads_order[i]`` (default ``i``). ``component`` / ``layout``: reuse a built system
    (its image must hold ``K``/``V`` at ``layout``). ``softmax=False``: ``p_words`` (list of int, all
    launches' context RD_ABs in order) are fed on ``p_in``."""
    from hdl.pim.mapping import head_layout, kv_store_image
    from sim.backends import get_backend
    from sim.dram.trace import decode_trace
    from sim.dram.checker import check_trace
    if isinstance(backend, str):
        backend = get_backend(backend)
    K = np.asarray(K, np.uint16)
    V = np.asarray(V, np.uint16)
    if K.ndim == 2:
        K, V = K[None], V[None]
    q = np.asarray(q, np.uint16)
    if q.ndim == 1:
        q = q[None]
    H, Lk, d = K.shape
    if layout is None:
        layout = head_layout(config, Lk, H)
    if component is None:
        component = PIMChannelSystem(config, kv_store_image(config, K, V, layout), softmax=softmax)
    order = list(range(len(q))) if heads_order is None else list(heads_order)
    Ls = [Lk if L is None else (L[i] if isinstance(L, (list, tuple)) else L) for i in range(len(q))]
    pp = [postpone[i] if isinstance(postpone, (list, tuple)) else postpone for i in range(len(q))]
    launches = [encode_launch(config, Ls[i], layout.k_row0[h], layout.v_row0[h], q[i], pp[i])
                for i, h in enumerate(order)]
    inputs = {"launch": launches}
    expected = {"result": d * len(q), "done": len(q), "trace": None}
    if not softmax:
        inputs["p_in"] = list(p_words or [])
        expected["scores"] = None
    if max_cycles is None:
        max_cycles = sum(4 * head_cycle_bound(config, x, drain=RankPU.drain_bound(config)) for x in Ls) + 20000
    run = backend.run_streams(component, inputs, expected, traffic=traffic, max_cycles=max_cycles)
    out = np.array(run.outputs["result"], np.uint16).reshape(len(q), d)
    trace = decode_trace(run.outputs["trace"], config.dram.org)
    done = decode_done(run.outputs["done"])
    viol = check_trace(trace, config.dram, end_cycle=run.cycles) if check else []
    scores = np.array(run.outputs["scores"], np.uint16) if not softmax else None
    # per head: first command of the head (first ACT_AB after the previous head's done) -> its done cycle
    head_cycles, start_i = [], 0
    for rec in done:
        first = next((c.cycle for c in trace[start_i:] if c.kind is Cmd.ACT_AB), None)
        head_cycles.append(rec["cycle"] - first + 1 if first is not None else None)
        while start_i < len(trace) and trace[start_i].cycle <= rec["cycle"]:
            start_i += 1
    return FusedRun(out=out, cycles=run.cycles, trace=trace, done=done, violations=viol, scores=scores,
                    wall_seconds=run.wall_seconds, head_cycles=head_cycles, cpu_seconds=run.cpu_seconds)


def tiny_rows(rows=64):
    """TINY with ``rows`` rows per bank (the same 2 chips x 16 banks, head dim 32, 4 KiB rank buffer = 2K
    tokens). More rows: room for L = 2K (TINY's 16 rows hold ~1K tokens of K + V); fewer: a smaller device
    model for the Amaranth simulator (its storage is initialised bit by bit)."""
    from dataclasses import replace
    from hdl.pim.config import TINY
    org = replace(TINY.dram.org, name=f"ddr4-3200-pim-tiny-r{rows}", rows=rows)
    return replace(TINY, name=f"tiny-r{rows}", dram=replace(TINY.dram, name=org.name, org=org))


def paper_rows(rows=32):
    """PAPER (8 chips x 16 banks, head dim 128, 256 KB rank buffer, DDR4-3200) with ``rows`` rows per bank: the
    paper's rank for the RTL bench (the device model's arrays and the run-time image cover ``rows`` rows; the
    datapath, page and command program are PAPER's). 32 rows hold two heads of L = 4K (16 rows each)."""
    from dataclasses import replace
    from hdl.pim.config import PAPER
    org = replace(PAPER.dram.org, name=f"{PAPER.dram.org.name}-r{rows}", rows=rows)
    return replace(PAPER, name=f"paper-r{rows}", dram=replace(PAPER.dram, name=org.name, org=org))


def tiny_page(rows=16):
    """TINY's 2 chips x 16 banks with the paper's 1 KB page (1024 columns = 128 bursts per bank row, JESD79-4 8 Gb
    x8) and a 16 KiB rank buffer (two 2K-token heads overlap): the paper's DRAM timing per row, for cycle counts
    (the number of chips changes only the datapath width, not the command program)."""
    from dataclasses import replace
    from hdl.pim.config import TINY
    org = replace(TINY.dram.org, name=f"ddr4-3200-pim-tiny-page-r{rows}", rows=rows, columns=1024)
    return replace(TINY, name=f"tiny-page-r{rows}", dram=replace(TINY.dram, name=org.name, org=org),
                   rank_buffer_bytes=16 << 10)


def rtl_cycles(config=None, L_list=(64, 128, 256, 512, 1024, 2048), *, backend="verilator", storage=False,
               component=None, heads=5):
    """Measured RTL cycles per ``L`` (one system, built once; timing-only DRAM storage by default: cycle counts do
    not depend on the data).

    Per ``L``: one head from reset (every head starts on an idle rank), then ``heads`` back-to-back launches
    (two stored heads alternating) for the steady state with overlapped heads. Returns ``{L: {...}}`` with
    ``head_cycles`` (single head: first command to its last result element taken, inclusive), ``ideal``
    (:func:`ideal_cycles`), ``ratio`` = head_cycles / ideal, ``score_span`` (first to last score RD_AB +
    tCCD_L), ``gap`` (last score RD_AB to first context RD_AB), ``context_span``, ``tail`` (last context
    RD_AB to the last result), ``commands``, ``violations`` (device model); ``steady_cycles`` (cycles per head
    between the done records of launches 0 and ``heads - 2`` -- the last launch has no successor to overlap
    with), ``steady_ratio`` = steady_cycles / ideal, ``overlapped`` (the launches' phases interleave:
    :func:`phase_order`), ``steady_violations``. For the perf model's calibration (sim/bench/pim.py)."""
    from hdl.pim.mapping import head_layout
    from sim.backends import get_backend
    from sim.dram.trace import decode_trace
    if config is None:
        config = tiny_rows()
    if heads < 3:
        raise ValueError(f"heads = {heads} must be >= 3")
    be = get_backend(backend) if isinstance(backend, str) else backend
    comp = component if component is not None else PIMChannelSystem(config, None, storage=storage)
    tm = config.dram.timing
    out = {}
    for L in L_list:
        layout = head_layout(config, L, 1)
        q = np.zeros(config.head_dim, np.uint16)
        launch = encode_launch(config, L, layout.k_row0[0], layout.v_row0[0], q)
        bound = head_cycle_bound(config, L, drain=RankPU.drain_bound(config))
        run = be.run_streams(comp, {"launch": [launch]},
                             {"result": config.head_dim, "done": 1, "trace": None},
                             max_cycles=4 * bound + 20000)
        trace = [c for c in decode_trace(run.outputs["trace"], config.dram.org) if c.rank == 0]
        done = decode_done(run.outputs["done"])[0]
        rds = [c.cycle for c in trace if c.kind is Cmd.RD_AB]
        nS = -(-L // config.banks) * config.bursts_per_token
        first = trace[0].cycle
        hc = done["cycle"] - first + 1
        ideal = ideal_cycles(config, L)
        rec = {"head_cycles": hc, "ideal": ideal, "ratio": hc / ideal,
               "score_span": rds[nS - 1] - rds[0] + tm.tCCD_L, "gap": rds[nS] - rds[nS - 1],
               "context_span": rds[-1] - rds[nS] + tm.tCCD_L, "tail": done["cycle"] - rds[-1],
               "commands": len(trace), "refreshes": done["refreshes"], "violations": done["violations"],
               "run_cycles": run.cycles}
        # steady state: `heads` launches of two stored heads, alternating
        lay2 = head_layout(config, L, 2)
        launches = [encode_launch(config, L, lay2.k_row0[i % 2], lay2.v_row0[i % 2], q) for i in range(heads)]
        run = be.run_streams(comp, {"launch": launches},
                             {"result": config.head_dim * heads, "done": heads, "trace": None},
                             max_cycles=heads * 4 * bound + 20000)
        dn = decode_done(run.outputs["done"])
        steady = (dn[heads - 2]["cycle"] - dn[0]["cycle"]) / (heads - 2)
        order = phase_order(config, [L] * heads)
        rec.update({"steady_cycles": steady, "steady_ratio": steady / ideal,
                    "overlapped": order[1] == (1, "S"), "steady_violations": dn[-1]["violations"],
                    "steady_refreshes": dn[-1]["refreshes"], "steady_errors": dn[-1]["errors"]})
        out[L] = rec
    return out


def micro(rows=8, ranks=2):
    """A reduced channel for fast simulation of the whole system (tests): 2 x8 chips, 1 bank group x 4 banks
    (a softmax chunk of 4 scores), head dim 16 (bpt = 2 bursts per token per chip, G = 2 token sets), ``rows``
    rows x 32 bursts per bank, 2 rank adders, a 512-byte rank buffer (256 tokens). DDR4-3200 timing. The
    same RTL as TINY / PAPER with every size parameter smaller (4 x fewer bank PUs than TINY)."""
    from hdl.memctl.timing import DRAMConfig, DRAMOrg, DDR4_3200_TIMING
    org = DRAMOrg(name=f"ddr4-3200-pim-micro-r{rows}-k{ranks}", channels=1, ranks=ranks, bank_groups=1,
                  banks_per_group=4, rows=rows, columns=256, device_width=8, devices_per_rank=2, burst_length=8,
                  beats_per_clock=2)
    return PIMConfig(name=f"micro-r{rows}-k{ranks}", dram=DRAMConfig(name=org.name, org=org,
                                                                     timing=DDR4_3200_TIMING),
                     head_dim=16, rank_adders=2, rank_buffer_bytes=512)
