"""The execution timeline of a host-memory baseline's iteration (S-LoRA, CPU-LoRA-Offload), apart from the formula
each system's estimate is (issue 30).

The adapters live in host DRAM behind each GPU's PCIe link. An iteration is executed item by item on three lanes
per GPU (tensor parallelism is symmetric: every GPU runs the same items on its own link and its share of the bytes,
so one GPU is executed and the trace repeats its lanes for the others):

==========  ===================================================================================================
lane        what it models
==========  ===================================================================================================
``GPU g``   one in-order stream: per layer the base model's share (its GEMMs and attention, the calibrated
            ``host.gpu`` model's iteration time / layers), then the batch's LoRA kernel (S-LoRA's MBGMM/MBGMV
            at Punica's measured efficiency; the GPU LoRA product of CPU-LoRA-Offload) and, with TP > 1, the
            all-reduce of the LoRA intermediate
``PCIe g``  the host -> GPU copy engine, FIFO: a copy occupies it for ``bytes / W`` and completes one round trip
            ``rtt`` later (a DMA read of host memory: the read requests out, the data and completions back);
            copies of one CUDA stream run one after another, each once the one before it completed (CUDA C
            Programming Guide, "Streams": the commands of a stream execute in order)
``host``    the CPU's staging path: a kernel stop (``KERNEL_STOP_S``: launch + synchronize, control back to the
            CPU) before each staged copy; the stop waits for the work the GPU has queued
==========  ===================================================================================================

What an iteration carries (:class:`StagedWork`):

* **fetches** (S-LoRA): the copies of the adapters first used by this iteration, in the order S-LoRA's code issues
  them: adapter by adapter, within an adapter layer by layer (S-LoRA/S-LoRA ``slora/models/peft/lora_adapter.py``
  ``LoraTpPartAdapter.load_to_gpu``: one ``w_combined_home.to("cuda", non_blocking=True)`` per layer, from pinned
  memory, ``layer_weights/lora_layer_weight.py``). Without prefetch they are on the compute stream ahead of the
  forward pass (``fetch_blocks``): the first layer starts once the last copy completed. With prefetch they are on
  S-LoRA's ``prefetch_stream``, concurrent with the forward pass, and a layer's LoRA kernel waits for every copy
  of that layer (design choice: the data dependency; S-LoRA's paper, section 5.2, only says the fetch overlaps);
* **staging** (CPU-LoRA-Offload, PLoRA III-B(1), Fig. 2(a)): in every layer, once the GPU finished the layer's base
  work, a kernel stop, then one synchronous copy of the layer's matrices of the adapters not in HBM into the
  staging buffer (``cudaMemcpy`` on the default stream: ordered after the queued kernels), then the LoRA kernel
  reads them.

The iteration ends when the GPU finished the last layer and every copy it started completed. Once a layer starts
with nothing pending that differs from the layer before (no fetch copies in flight), the rest repeat it and are
not recomputed.
"""

from dataclasses import dataclass, field

import numpy as np

from host.serving import Span

from .timeline import Executed

__all__ = ["StagedWork", "StagedTimeline"]


@dataclass
class StagedWork:
    """One iteration's work on a host-memory baseline (every layer carries the same GPU work)."""

    base_s: float = 0.0                  # GPU: the base model's per-layer share (GEMMs and attention)
    lora_s: float = 0.0                  # GPU: the LoRA kernel of the layer
    comm_s: float = 0.0                  # GPU: TP all-reduce of the LoRA intermediate (per layer)
    fetch_s: np.ndarray = field(default_factory=lambda: np.zeros(0))            # copy seconds (bytes / W), in order
    fetch_layer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # the layer each copy feeds
    fetch_blocks: bool = True            # fetches on the compute stream, before the forward pass (no prefetch)
    stage_s: float = 0.0                 # per layer: the staged copy's seconds (bytes / W); 0: nothing staged
    stop_s: float = 0.0                  # per staged exchange: the host's kernel stop


class StagedTimeline:
    """Executes :class:`StagedWork` on one GPU stream, its PCIe copy engine (``W`` bytes/s, ``rtt_s`` per copy)
    and the host's staging path; ``n_gpus`` GPUs run alike (the trace shows each)."""

    def __init__(self, link_W: float, rtt_s: float, n_gpus: int = 1):
        if not link_W > 0 or rtt_s < 0 or n_gpus < 1:
            raise ValueError(f"StagedTimeline needs link_W > 0, rtt_s >= 0, n_gpus >= 1; got {link_W}, {rtt_s}, "
                             f"{n_gpus}")
        self.W, self.rtt, self.n_gpus = float(link_W), float(rtt_s), int(n_gpus)

    def run(self, w: StagedWork, n_layers: int, *, spans: bool = True) -> Executed:
        """Execute ``n_layers`` layers of ``w``. ``w.base_s`` may be an array over the iterations of a decode
        stretch (each the same work but its base model's share; the fetches, if any, belong to the first): the
        result's ``duration_s``, ``lora_s`` and ``busy_s`` values are then arrays over them, and the spans are the
        first iteration's."""
        rtt = self.rtt
        L = int(n_layers)
        out = []
        lora_comm = w.lora_s + w.comm_s
        if not spans and not len(w.fetch_s) and not w.stage_s > 0:
            # nothing to copy, no trace: the layers back to back on the GPU stream
            if np.ndim(w.base_s) == 0:
                busy = L * (float(w.base_s) + lora_comm)
                return Executed(busy, {"GPU 0": busy, "PCIe 0": 0.0, "host": 0.0}, L * lora_comm, 0.0, out)
            busy = L * (w.base_s + lora_comm)
            zero = np.zeros(len(busy))
            return Executed(busy, {"GPU 0": busy, "PCIe 0": zero, "host": zero}, np.full(len(busy), L * lora_comm),
                            0.0, out)
        base = np.asarray(w.base_s, float)
        scalar = base.ndim == 0
        base = np.atleast_1d(base)
        K = len(base)
        fs = np.asarray(w.fetch_s, float)
        if K > 1 and len(fs):
            raise ValueError("StagedTimeline.run: fetches belong to one iteration (give one base_s)")
        if len(fs) and w.stage_s > 0:
            # the staging below takes the copy engine as idle when each layer's base work ends
            raise ValueError("StagedTimeline.run: a work either fetches adapters or stages them, not both")
        busy_gpu = L * (base + lora_comm)
        if not len(fs) and not w.stage_s > 0:
            # nothing to copy: the layers run back to back on the GPU stream
            t = L * (base + lora_comm)
            if spans:
                layer_s = float(base[0]) + lora_comm
                for j in range(L):
                    self._gpu_spans(out, j * layer_s, float(base[0]), lora_comm)
                out = [Span(f"{s.lane} {gi}", s.name, s.start_s, s.dur_s) for s in out for gi in range(self.n_gpus)]
            zero = np.zeros(K)
            lora_tot = np.full(K, L * lora_comm)
            if scalar:
                return Executed(float(t[0]), {"GPU 0": float(busy_gpu[0]), "PCIe 0": 0.0, "host": 0.0},
                                float(lora_tot[0]), 0.0, out)
            return Executed(t, {"GPU 0": busy_gpu, "PCIe 0": zero, "host": zero}, lora_tot, 0.0, out)
        busy_pcie = float(fs.sum()) + L * max(w.stage_s, 0.0)
        busy_host = L * w.stop_s if w.stage_s > 0 else 0.0
        # copies of one stream: each starts once the one before it completed; completion = start + bytes/W + rtt
        done = np.cumsum(fs + rtt) if len(fs) else fs
        t = np.zeros(K)
        ready = None
        if len(fs):
            if spans:
                starts = done - fs - rtt
                out += [Span("PCIe", "adapter fetch", s0, d) for s0, d in zip(starts.tolist(), fs.tolist())]
            if w.fetch_blocks:
                t += float(done[-1])                        # the forward pass waits on the compute stream
            else:
                ready = np.full(L, -np.inf)                 # per layer: when its last copy completed
                np.maximum.at(ready, np.asarray(w.fetch_layer, np.int64), done)
        lora_tot = np.zeros(K)
        layer = 0
        while layer < L:
            if w.stage_s > 0:
                # every layer: the GPU's base work, the kernel stop (it waits for that work), the synchronous copy
                # into the staging buffer, the LoRA kernel once the copy completed. The host and the copy engine
                # are idle before the base work ends, so every layer is the same: execute one, repeat it
                t0 = t
                g = t0 + base
                host = g + w.stop_s
                start = host + w.stage_s + rtt
                end = start + lora_comm
                if spans:
                    g0, s0 = float(g[0]), float(start[0])
                    ls = [Span("GPU", "base", float(t0[0]), float(base[0])),
                          Span("host", "kernel stop", g0, w.stop_s),
                          Span("PCIe", "staged copy", g0 + w.stop_s, w.stage_s)]
                    if lora_comm > 0:
                        ls.append(Span("GPU", "LoRA", s0, lora_comm))
                    dur0 = float(end[0] - t0[0])
                    for j in range(L - layer):
                        out += [Span(x.lane, x.name, x.start_s + j * dur0, x.dur_s) for x in ls]
                k = L - layer
                lora_tot += k * (end - g)
                t = t0 + k * (end - t0)
                break
            if ready is None or float(t[0]) >= float(ready[layer:].max()):
                # nothing pending: the rest of the layers run back to back on the GPU stream
                k = L - layer
                if spans:
                    layer_s = float(base[0]) + lora_comm
                    for j in range(k):
                        self._gpu_spans(out, float(t[0]) + j * layer_s, float(base[0]), lora_comm)
                t = t + k * (base + lora_comm)
                lora_tot += k * lora_comm
                break
            # a layer whose LoRA kernel waits for its prefetched copies
            g = t + base
            start = np.maximum(g, ready[layer])
            end = start + lora_comm
            if spans:
                out.append(Span("GPU", "base", float(t[0]), float(base[0])))
                if float(end[0]) > float(start[0]):
                    out.append(Span("GPU", "LoRA", float(start[0]), lora_comm))
            lora_tot += end - g
            t = end
            layer += 1
        if len(fs):
            t = np.maximum(t, float(done[-1]))
        spans_out = []
        if spans:
            for s in out:
                if s.lane == "host":
                    spans_out.append(s)
                    continue
                for gi in range(self.n_gpus):
                    spans_out.append(Span(f"{s.lane} {gi}", s.name, s.start_s, s.dur_s, s.args))
        busy = {"GPU 0": busy_gpu, "PCIe 0": np.full(K, busy_pcie), "host": np.full(K, busy_host)}
        if scalar:
            return Executed(float(t[0]), {n: float(v[0]) for n, v in busy.items()}, float(lora_tot[0]), 0.0,
                            spans_out)
        return Executed(t, busy, lora_tot, 0.0, spans_out)

    @staticmethod
    def _gpu_spans(out, t, base_s, lora_s):
        out.append(Span("GPU", "base", t, base_s))
        if lora_s > 0:
            out.append(Span("GPU", "LoRA", t + base_s, lora_s))
