"""LoRA adapter shapes and the per-strategy cost terms of one adapter in one layer (PLoRA V-A, VI-B).

An adapter puts ``A (d_in x R)`` and ``B (R x d_out)`` on every weight matrix of the model (PLoRA VII-A: "we
add adapters to all weight matrices, including Q/K/V, projection, and FFN"; for the MoE model, on every
expert). :func:`lora_matrices` lists them per layer as :class:`LoraMatrix` rows; matrices of one *input
group* read the same activation, which a strategy that ships activations to the device (E3, E4) sends once
per token (Q/K/V share the layer input, gate/up share the FFN input, also across experts). An expert's down
projection has its own input per expert.

:func:`strategy_terms` gives, for one adapter of rank R serving a batch of ``B`` tokens in one layer, the
five cost terms of each strategy E1..E4 (PLoRA V-A, Fig. 6(b)):

=========  ==========================  ======================  ==========================================
strategy   link GPU->device (out)      link device->GPU (in)   device / GPU work
=========  ==========================  ======================  ==========================================
E1 (P1)    0                           0                       GPU: read A, B from HBM; 2 B R (d_in+d_out)
E2 (P2)    0                           A, B                    device: LOAD A, B; GPU: 2 B R (d_in+d_out)
E3 (P2)    x (B d_in per input group)  y (B d_out)             device: y = x A B
E4 (P3)    x                           m (B R)                 device: m = x A; GPU: read B, 2 B R d_out
=========  ==========================  ======================  ==========================================

Two more terms count the host-mediated operations the strategy needs when the GPU cannot load or store into the
pool (PLoRA-NoCXL, VII-A "must launch a kernel per adapter"; I: "every access pays a kernel stop and a
CPU-initiated copy"): ``host_ops`` before the device works, a copy of the input per input group and a device
kernel per touched matrix instance (E3, E4), and ``host_ops_after``, a copy of each instance's result (y, m) or
of its A and B (E2) back to the GPU; E1 needs none. Other systems ignore them.

and the HBM each needs resident (E1: A and B of every layer; E4: B of every layer). For experts, ``B``
tokens each pick ``active`` of ``instances`` experts, independently and uniformly (a design choice: the
router is not modelled), so the expected number of experts touched is ``n (1 - (1 - k/n)^B)`` and each
touched expert sees ``B k / touched`` tokens (rounded up for the device kernels). Dense matrices are exact.
"""

from dataclasses import dataclass
from functools import lru_cache
from math import ceil

import numpy as np

__all__ = ["LoraMatrix", "ModelShape", "lora_matrices", "STRATEGIES", "E1", "E2", "E3", "E4", "TERMS",
           "strategy_terms", "adapter_bytes", "resident_bytes", "LEVEL_NONE", "LEVEL_B", "LEVEL_AB",
           "LEVEL_OF", "LEVEL_NAMES", "RANKS"]

FP16_BYTES = 2
#: PLoRA VII-A: "Each LoRA adapter takes a dimension randomly chosen from [8, 16, 32, 64, 128]".
RANKS = (8, 16, 32, 64, 128)

E1, E2, E3, E4 = 0, 1, 2, 3
STRATEGIES = ("E1", "E2", "E3", "E4")
#: Caching states (PLoRA V-A): P2 = nothing cached, P3 = B cached, P1 = A and B cached.
LEVEL_NONE, LEVEL_B, LEVEL_AB = 0, 1, 2
LEVEL_NAMES = ("P2", "P3", "P1")
#: The caching level each strategy needs in HBM.
LEVEL_OF = (LEVEL_AB, LEVEL_NONE, LEVEL_NONE, LEVEL_B)
#: Columns of strategy_terms: bytes out over the link, bytes in, device seconds, GPU HBM bytes, GPU FLOPs, and the
#: host-mediated operations (kernel launches and copies) a system without accelerator load/store pays.
TERMS = ("out_bytes", "in_bytes", "dev_s", "gpu_bytes", "gpu_flops", "host_ops", "host_ops_after")


@dataclass(frozen=True)
class LoraMatrix:
    """One adapted weight matrix of a layer: ``instances`` copies (experts), ``active`` of which a token uses;
    ``group`` names the activation it reads; ``shared_input`` says whether all instances read the same one."""

    name: str
    d_in: int
    d_out: int
    group: str
    instances: int = 1
    active: int = 1
    shared_input: bool = True


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What the PLoRA host needs of a model (from ``host.models`` configs; see :func:`shape_of`)."""

    name: str
    n_layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn_dim: int                 # dense FFN intermediate size (0 for an all-MoE model)
    n_experts: int = 0
    experts_active: int = 0
    expert_ffn_dim: int = 0
    weight_bytes: float = 0.0    # base model weights in HBM (FP16)
    gated: bool = True           # SwiGLU FFN (gate and up); False: one up projection (GPT / OPT)

    def __post_init__(self):
        for f in ("n_layers", "hidden", "q_heads", "kv_heads", "head_dim"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelShape {self.name!r}: {f} must be an int >= 1, got {v!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"ModelShape {self.name!r}: q_heads ({self.q_heads}) must be a multiple of "
                             f"kv_heads ({self.kv_heads})")
        if self.n_experts:
            if not (1 <= self.experts_active <= self.n_experts) or self.expert_ffn_dim < 1:
                raise ValueError(f"ModelShape {self.name!r}: an MoE model needs 1 <= experts_active <= n_experts "
                                 f"and expert_ffn_dim >= 1")
        elif self.ffn_dim < 1:
            raise ValueError(f"ModelShape {self.name!r}: a dense model needs ffn_dim >= 1")

    def kv_bytes_per_token_layer(self, kv_bits: int = 16) -> float:
        """K and V of one token in one layer."""
        return 2.0 * self.kv_heads * self.head_dim * kv_bits / 8.0

    def kv_bytes_per_token(self, kv_bits: int = 16) -> float:
        return self.n_layers * self.kv_bytes_per_token_layer(kv_bits)


@lru_cache(maxsize=256)
def lora_matrices(shape: ModelShape) -> tuple:
    """The adapted matrices of one layer."""
    h, qd, kvd = shape.hidden, shape.q_heads * shape.head_dim, shape.kv_heads * shape.head_dim
    mats = [LoraMatrix("q", h, qd, "attn_in"), LoraMatrix("k", h, kvd, "attn_in"),
            LoraMatrix("v", h, kvd, "attn_in"), LoraMatrix("o", qd, h, "attn_out")]
    if shape.n_experts:
        n, k, f = shape.n_experts, shape.experts_active, shape.expert_ffn_dim
        mats += ([LoraMatrix("gate", h, f, "ffn_in", n, k)] if shape.gated else []) + [
            LoraMatrix("up", h, f, "ffn_in", n, k), LoraMatrix("down", f, h, "ffn_mid", n, k, shared_input=False)]
    else:
        f = shape.ffn_dim
        mats += ([LoraMatrix("gate", h, f, "ffn_in")] if shape.gated else []) + [
            LoraMatrix("up", h, f, "ffn_in"), LoraMatrix("down", f, h, "ffn_mid")]
    return tuple(mats)


@lru_cache(maxsize=4096)
def _resident(shape: ModelShape, rank: int) -> tuple:
    a = sum(m.instances * m.d_in for m in lora_matrices(shape)) * rank * FP16_BYTES * shape.n_layers
    b = sum(m.instances * m.d_out for m in lora_matrices(shape)) * rank * FP16_BYTES * shape.n_layers
    return (float(a + b), 0.0, 0.0, float(b))


def resident_bytes(shape: ModelShape, rank: int) -> np.ndarray:
    """HBM bytes each strategy keeps resident for an adapter of ``rank`` (all layers): (4,) for E1..E4."""
    return np.array(_resident(shape, int(rank)))


def adapter_bytes(shape: ModelShape, rank: int) -> float:
    """Size of one adapter of ``rank`` (A and B of every matrix of every layer)."""
    return _resident(shape, int(rank))[E1]


def _touched(m: LoraMatrix, tokens: int) -> float:
    if m.instances == 1:
        return 1.0
    return m.instances * (1.0 - (1.0 - m.active / m.instances) ** tokens)


def strategy_terms(shape: ModelShape, rank: int, tokens: int, ndp, *, device_lora: bool = True) -> np.ndarray:
    """Per-layer cost terms (4 strategies x 7 :data:`TERMS`) of one adapter of ``rank`` serving ``tokens``
    tokens (its batch B_i in decode). ``ndp`` is the NDP timing model (``host.plora.ndp_model``).

    ``device_lora=False`` leaves out the NDP model's E3 / E4 kernel times (the ``dev_s`` terms of E3 and E4 are
    0, every other term is what the full call gives, bit for bit): the terms of E1 and E2 and a lower bound of
    E3's and E4's standalone times without pricing a kernel (``CostModel.prefill_choice``)."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"rank must be an int >= 1, got {rank!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 0:
        raise ValueError(f"tokens must be an int >= 0, got {tokens!r}")
    t = np.zeros((4, 7))
    if tokens == 0:
        return t
    rank, tokens = int(rank), int(tokens)
    groups_sent = set()
    dev_calls = {}          # identical matrix shapes share their device times
    for m in lora_matrices(shape):
        touched = _touched(m, tokens)
        rows = tokens * m.active                      # token-matrix products of this matrix type
        per = max(1, ceil(rows / touched))            # tokens per touched instance
        ab = (m.d_in + m.d_out) * rank * FP16_BYTES
        flops_ab = 2.0 * rows * rank * (m.d_in + m.d_out)
        # input activations: once per token per group (shared), else once per token per active instance
        if m.shared_input:
            x = 0.0 if m.group in groups_sent else tokens * m.d_in * FP16_BYTES
            x_copies = 0.0 if m.group in groups_sent else 1.0
            groups_sent.add(m.group)
        else:
            x = rows * m.d_in * FP16_BYTES
            x_copies = touched
        key = (m.d_in, m.d_out, per)
        dt = dev_calls.get(key)
        if dt is None:
            dt = dev_calls[key] = ((ndp.load_s(ab), ndp.lora_e3_s(m.d_in, m.d_out, rank, per),
                                    ndp.lora_e4_s(m.d_in, rank, per)) if device_lora else (ndp.load_s(ab), 0.0, 0.0))
        t[E1, 3] += touched * ab
        t[E1, 4] += flops_ab
        t[E2, 1] += touched * ab
        t[E2, 2] += touched * dt[0]
        t[E2, 4] += flops_ab
        t[E3, 0] += x
        t[E3, 1] += rows * m.d_out * FP16_BYTES
        t[E3, 2] += touched * dt[1]
        t[E4, 0] += x
        t[E4, 1] += rows * rank * FP16_BYTES
        t[E4, 2] += touched * dt[2]
        t[E4, 3] += touched * rank * m.d_out * FP16_BYTES
        t[E4, 4] += 2.0 * rows * rank * m.d_out
        t[E2, 6] += touched                              # a host copy of A and B per matrix instance
        t[E3, 5] += touched + x_copies                   # the input's copy, a kernel per instance
        t[E4, 5] += touched + x_copies
        t[E3, 6] += touched                              # a copy of each instance's result
        t[E4, 6] += touched
    return t
