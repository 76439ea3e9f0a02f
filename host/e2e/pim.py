"""The DIMM-PIM rank of the end-to-end run behind one interface: decode-attention heads in, outputs and cycles
out, on the ``rtl`` (the fused kernel's simulation top :class:`sim.pim.fused.PIMChannelSystem`: rank PU, bank
PUs, DDR4 device model), ``golden`` (:func:`sim.golden.pim_attention.pim_attention`) or ``perf``
(:class:`sim.perf.pim.PIMPerfModel`) backend.

**The rank.** :func:`e2e_pim_config`: DDR4-3200 with the paper's per-chip geometry (x8 chips holding 16
elements of every K / V vector, 4 bursts per token per chip, 4 token sets, a 1 KB page) and head dim 64, i.e.
4 chips per rank (the paper's rank has 8 chips for head dim 128: the same datapath per chip, half the chips),
16 banks (4 groups x 4), a rank PU buffer that holds two heads of the run's longest context (so consecutive
heads overlap, L3 4.3), and as many rows as the run's heads need.

**KV placement.** A run places every (request, layer, head) the PIM holds in its own K and V row regions
(:func:`hdl.pim.mapping.head_layout`, all heads sized for the run's longest context); a launch names the head's
rows and its current length ``L``: the rank PU reads only tokens ``< L``. The DRAM device model is initialised
with the image (:func:`hdl.pim.mapping.kv_store_image`) when the design is built, so the image is fixed per
build (a run-time image needs the memory to be loaded at run time, not by the design). :class:`PIMDevice` with
``image="final"`` builds once per run from the *final* KV of every head (the caller computes it with the golden
backend first, :func:`host.e2e.run.run_e2e`), launches each decode step's heads with their current ``L``, and
checks before every launch that the K / V the step computed are the ones the image holds for positions
``< L`` (the rtl run's own values, bit for bit); ``image="step"`` rebuilds the design for every launch batch
(slow: for checks only). The host's KV writes into the DIMM are not simulated (their cost is the PCIe link's,
priced by the host model).
"""

from dataclasses import dataclass, field, replace
import time

import numpy as np

from hdl.memctl.timing import DRAMConfig, DRAMOrg, DDR4_3200_TIMING
from hdl.pim.config import PIMConfig
from sim.golden.attention import prepare_query

__all__ = ["e2e_pim_config", "PIMJob", "PIMRun", "PIMDevice", "run_cycles_model"]


def _pow2(n):
    return 1 << max(0, int(n - 1).bit_length())


def e2e_pim_config(head_dim: int = 64, max_tokens: int = 2048, heads: int = 8, *, ranks: int = 1,
                   bank_groups: int = 4) -> PIMConfig:
    """The rank for ``heads`` heads of up to ``max_tokens`` tokens of width ``head_dim`` (module docstring).
    ``bank_groups``: 4 (the paper's 16 banks) or 1 (4 banks: a quarter of the bank PUs, for quick tests; a
    softmax chunk is then 4 scores)."""
    from hdl.pim.mapping import region_rows
    chips = head_dim // 16                      # 16 elements of a K / V vector per x8 chip, as on PAPER / TINY
    buf = _pow2(4 * max_tokens)                 # two heads of max_tokens FP16 exponentials (overlap, L3 4.3)
    probe = _org(chips, 1 << 20, ranks, bank_groups)
    cfg0 = PIMConfig(name="probe", dram=DRAMConfig(name=probe.name, org=probe, timing=DDR4_3200_TIMING),
                     head_dim=head_dim, rank_buffer_bytes=buf, rank_adders=chips)
    rows = _pow2(heads * sum(region_rows(cfg0, max_tokens)))
    org = _org(chips, rows, ranks, bank_groups)
    tag = "" if bank_groups == 4 else f"-g{bank_groups}"
    return PIMConfig(name=f"e2e-d{head_dim}-r{rows}{tag}", dram=DRAMConfig(name=org.name, org=org,
                                                                           timing=DDR4_3200_TIMING),
                     head_dim=head_dim, rank_buffer_bytes=buf,
                     rank_adders=8 if bank_groups == 4 else 4)


def _org(chips, rows, ranks, bank_groups=4):
    # DDR4-3200 x8 devices, 4 bank groups x 4 banks, 1 KB page = 1024 columns (JESD79-4, 8 Gb x8; [L3] Table 2)
    return DRAMOrg(name=f"ddr4-3200-pim-e2e-c{chips}-r{rows}-k{ranks}-g{bank_groups}", channels=1, ranks=ranks,
                   bank_groups=bank_groups, banks_per_group=4, rows=rows, columns=1024, device_width=8,
                   devices_per_rank=chips, burst_length=8, beats_per_clock=2)


@dataclass
class PIMJob:
    """One head's decode attention: ``slot`` (the head's place in the rank's layout), the raw query ``q`` (d,)
    and ``K``, ``V`` (L, d) FP16 bits (every token so far, the new one included)."""
    key: tuple
    slot: int
    q: np.ndarray = field(repr=False)
    K: np.ndarray = field(repr=False)
    V: np.ndarray = field(repr=False)

    @property
    def L(self) -> int:
        return int(self.K.shape[0])


@dataclass
class PIMRun:
    """Outputs of one launch batch: ``outputs`` {key: (d,) FP16 bits} (empty on ``perf``), ``cycles`` (DDR4
    command clocks from the first command to the last result), ``head_done`` (cycle of each head's last
    result), ``tck_ps``."""
    outputs: dict
    cycles: int
    head_done: list
    tck_ps: int
    wall_s: float = 0.0
    #: pJ by term (sim.energy.pim.launch_energy on the model, trace_launch_energy on the rtl)
    energy: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.cycles * self.tck_ps * 1e-12


def run_cycles_model(model, Ls) -> int:
    """Predicted cycles of heads of lengths ``Ls`` run back to back from an idle rank: the first head's latency
    (its rows plus the pipeline fill / drain, ``fixed_cycles``) then every further head's steady-state cost
    (overlapped heads: their rows only). Refresh between heads as :meth:`PIMPerfModel.heads_period` has it."""
    if not Ls:
        return 0
    first = model.head(Ls[0]).cycles
    rest = 0.0
    for L in Ls[1:]:
        rest += model.steady_head_cycles(L) if model.overlaps(L) else model.head(L).cycles
    # refresh: one tRFC for every tREFI the run spans beyond the postponement the rank PU may use
    tm = model.tm
    total = first + rest
    refs = int(total // tm.tREFI)
    return int(round(total + refs * tm.tRFC))


class PIMDevice:
    """One DIMM-PIM rank on ``backend`` (``"rtl"``, ``"golden"``, ``"perf"``) for ``slots`` heads of up to
    ``max_tokens`` tokens. ``engine``: the RTL simulator (``"verilator"`` / ``"amaranth"``). ``perf``: a
    calibrated :class:`sim.perf.pim.PIMPerfModel` of the config (timing of the golden and perf backends)."""

    def __init__(self, backend: str, *, head_dim: int, slots: int, max_tokens: int, engine: str = "verilator",
                 perf=None, image: str = "final", bank_groups: int = 4):
        if backend not in ("rtl", "golden", "perf"):
            raise ValueError(f"backend must be rtl, golden or perf, got {backend!r}")
        if image not in ("final", "step"):
            raise ValueError(f"image must be 'final' or 'step', got {image!r}")
        self.backend, self.engine, self.image_mode = backend, engine, image
        self.slots, self.max_tokens = max(1, slots), max_tokens
        self.config = e2e_pim_config(head_dim, max_tokens, self.slots, bank_groups=bank_groups)
        from hdl.pim.mapping import head_layout
        self.layout = head_layout(self.config, max_tokens, self.slots)
        self.perf = perf
        self.final_kv = None          # slot -> (K, V) of the whole run, for image="final"
        #: largest DRAM (bits) built into a design with its image (Amaranth writes every bit: ~3-10 us each)
        self.max_image_bits = 8 << 20
        self._component = None
        self._image_key = None

    def set_final_kv(self, kv: dict):
        """The final K, V (each (L_final, d)) of every slot, for ``image="final"`` (module docstring)."""
        self.final_kv = {int(s): (np.asarray(k, np.uint16), np.asarray(v, np.uint16)) for s, (k, v) in kv.items()}
        self._component = None

    def _image(self, kv):
        from hdl.pim.mapping import kv_store_image
        d = self.config.head_dim
        K = np.zeros((self.slots, self.max_tokens, d), np.uint16)
        V = np.zeros_like(K)
        for s, (k, v) in kv.items():
            K[s, :len(k)] = k
            V[s, :len(v)] = v
        return kv_store_image(self.config, K, V, self.layout)

    def fast(self) -> bool:
        """The simulation top loads its KV image at run time (``PIMChannelSystem(..., fast=True)``, Verilator):
        one build per geometry, each run's image written as a file; then every run holds exactly the KV the run
        computed (no final image needed)."""
        import inspect
        from sim.pim.fused import PIMChannelSystem
        engine = getattr(self.engine, "name", self.engine)     # a name, or a backend object (a waveform's)
        return engine == "verilator" and "fast" in inspect.signature(PIMChannelSystem.__init__).parameters

    def check_buildable(self):
        """Raise (naming the size and the way out) if an ``rtl`` run would compile a DRAM image too large to
        generate (no run-time image: :meth:`fast` is False)."""
        if self.backend != "rtl" or self.fast():
            return
        org = self.config.dram.org
        bits = org.ranks * self.config.banks * org.rows * org.bursts_per_row * org.burst_bits
        if bits > self.max_image_bits:
            raise RuntimeError(
                f"the PIM rank's DRAM ({bits / 1e6:.0f} Mbit) would be compiled into the design with its KV image: "
                f"sim/pim/fused.PIMChannelSystem here has no run-time image (fast=True), and generating that "
                f"Verilog takes hours. Use a shorter context, the PIM on another backend (ndpim demo "
                f"--pim-backend golden), or a tree whose PIMChannelSystem loads its image at run time")

    def component(self, kv=None):
        """The simulation top holding ``kv`` (slot -> (K, V)); cached while the image is the same."""
        from sim.pim.fused import PIMChannelSystem
        if self.fast():
            if self._component is None:
                self._component = PIMChannelSystem(self.config, None, fast=True)
                cfg = self.config
                self._component.design_key = lambda: f"PIMChannelSystem(fast=True, config={cfg!r})"
            self._component.set_image(self._image(kv))
            return self._component
        kv = self.final_kv if kv is None else kv
        self.check_buildable()
        key = tuple(sorted((s, hash(k.tobytes()), hash(v.tobytes()), len(k)) for s, (k, v) in kv.items()))
        if self._component is None or key != self._image_key:
            self._component = PIMChannelSystem(self.config, self._image(kv))
            self._image_key = key
        return self._component

    def run(self, jobs) -> PIMRun:
        """Launch ``jobs`` (heads) back to back, in order."""
        t0 = time.perf_counter()
        tck = self.config.dram.timing.tck_ps
        if not jobs:
            return PIMRun({}, 0, [], tck)
        for j in jobs:
            if not 0 <= j.slot < self.slots:
                raise ValueError(f"PIM job {j.key}: slot {j.slot} outside the rank's {self.slots} slots")
            if not 1 <= j.L <= self.max_tokens:
                raise ValueError(f"PIM job {j.key}: L = {j.L} outside [1, {self.max_tokens}] (the rank's layout)")
        if self.backend == "rtl":
            r = self._rtl(jobs)
        else:
            outputs = self._golden(jobs) if self.backend == "golden" else {}
            cycles = run_cycles_model(self.perf, [j.L for j in jobs])
            r = PIMRun(outputs, cycles, [], tck)
            if self.perf is not None:
                from sim.energy.pim import launch_energy
                r.energy = launch_energy(self.perf, [j.L for j in jobs], int(cycles))
        r.wall_s = time.perf_counter() - t0
        return r

    def _golden(self, jobs):
        from sim.golden.pim_attention import pim_attention
        return {j.key: pim_attention(self.config, prepare_query(j.q), j.K, j.V).out for j in jobs}

    def _rtl(self, jobs):
        from sim.pim.fused import run_fused
        from sim.backends import get_backend
        if self.fast():
            comp = self.component({j.slot: (j.K, j.V) for j in jobs})
        elif self.image_mode == "final":
            if self.final_kv is None:
                raise RuntimeError("PIMDevice(image='final') needs set_final_kv() before an rtl run")
            for j in jobs:
                k, v = self.final_kv[j.slot]
                if len(k) < j.L or not (np.array_equal(k[:j.L], j.K) and np.array_equal(v[:j.L], j.V)):
                    raise RuntimeError(f"PIM job {j.key}: the K / V this run computed differ from the image "
                                       f"(the golden run's) within the first {j.L} tokens: rtl and golden diverged")
            comp = self.component()
        else:
            comp = self.component({j.slot: (j.K, j.V) for j in jobs})
        from .ndp import _engine
        be = _engine(self.engine)
        K = np.zeros((self.slots, self.max_tokens, self.config.head_dim), np.uint16)
        q = np.stack([prepare_query(j.q) for j in jobs])
        fr = run_fused(be, self.config, K, K, q, L=[j.L for j in jobs], heads_order=[j.slot for j in jobs],
                       component=comp, layout=self.layout, check=False)
        if fr.device_violations:
            raise RuntimeError(f"PIM rtl run: the DRAM device model reported {fr.device_violations} timing "
                               f"violations")
        first = fr.trace[0].cycle if fr.trace else 0
        done = [rec["cycle"] - first + 1 for rec in fr.done]
        from sim.energy.pim import trace_launch_energy
        energy = trace_launch_energy(self.config, fr.trace, [j.L for j in jobs], int(done[-1])) if fr.trace else {}
        return PIMRun({j.key: fr.out[i] for i, j in enumerate(jobs)}, done[-1], done,
                      self.config.dram.timing.tck_ps, energy=energy)
