"""The tiny LLaMA-style model of the end-to-end run: configuration, deterministic random weights, LoRA adapters.

A LLaMA block (RMSNorm, rotary position embedding, multi-head attention, SwiGLU FFN) at a size the RTL can run
token by token: :data:`TINY_LLAMA` is 2 layers, hidden 256, 4 heads of 64, FFN 688, vocabulary 512 (the issue's
shape; 688 = 256 x 8/3 rounded to a multiple of 8, LLaMA's FFN rule, and a multiple of the NDP core's 8 lanes).
Weights are FP16 (bit patterns, ``uint16``) drawn from a seeded generator, so a model is reproducible from
``(config, seed)``; nothing is trained: the point is that every bit of every token flows through the same code
on every backend.

Adapters (PLoRA VII-A: "we add adapters to all weight matrices, including Q/K/V, projection, and FFN"): every
adapter puts ``A (d_in x r)``, ``B (r x d_out)`` on each of the seven matrices of every layer; ranks alternate
8 and 16 (:func:`adapter_ranks`). ``y = x W + (x A) B`` (LoRA scaling folded into B). Initialisation (design
choice: random B instead of LoRA's zero B, so that an adapter changes the output and a wrong adapter is seen):
``W ~ N(0, 1/d_in)`` (activations stay O(1) through the layers), ``A ~ N(0, 1/d_in)``, ``B ~ N(0, (0.5/r))``
(the adapter's contribution is about half the base projection's scale).
"""

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

__all__ = ["TinyConfig", "TINY_LLAMA", "MODEL_SIZES", "get_tiny", "MATRICES", "LoraAdapter", "TinyWeights",
           "adapter_ranks", "make_weights", "make_adapters", "llm_config"]

#: The seven adapted matrices of a layer, in the order the forward pass uses them: (name, input, output).
MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True, kw_only=True)
class TinyConfig:
    """A LLaMA-style decoder. Validated on construction (ValueError names the field and the rule)."""

    name: str = "tiny-llama"
    n_layers: int = 2
    hidden: int = 256
    n_heads: int = 4
    head_dim: int = 64
    ffn: int = 688
    vocab: int = 512
    rope_theta: float = 10000.0      # LLaMA's RoPE base (Touvron et al. 2023, "LLaMA", Section 2.2 / Su et al.)
    rms_eps: float = 1e-5            # LLaMA's RMSNorm epsilon (Llama-2 config.json: rms_norm_eps 1e-5)
    max_context: int = 4096

    def __post_init__(self):
        for f in ("n_layers", "hidden", "n_heads", "head_dim", "ffn", "vocab", "max_context"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TinyConfig {self.name!r}: {f} must be an int >= 1, got {v!r}")
        if self.n_heads * self.head_dim != self.hidden:
            raise ValueError(f"TinyConfig {self.name!r}: n_heads x head_dim ({self.n_heads} x {self.head_dim}) "
                             f"must equal hidden ({self.hidden})")
        if self.head_dim % 2:
            raise ValueError(f"TinyConfig {self.name!r}: head_dim must be even (RoPE rotates pairs), got "
                             f"{self.head_dim}")

    def shape(self, matrix: str) -> tuple:
        """(d_in, d_out) of an adapted matrix."""
        h, f = self.hidden, self.ffn
        return {"q": (h, h), "k": (h, h), "v": (h, h), "o": (h, h), "gate": (h, f), "up": (h, f),
                "down": (f, h)}[matrix]

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer, FP16."""
        return 2 * self.hidden * 2


#: The issue's model: 2 layers, hidden 256, 4 heads of 64, FFN 688, vocabulary 512.
TINY_LLAMA = TinyConfig()
#: A smaller one for quick checks (``ndpim demo --model micro``): 1 layer, hidden 128, 2 heads of 64, FFN 344.
MICRO_LLAMA = TinyConfig(name="micro-llama", n_layers=1, hidden=128, n_heads=2, head_dim=64, ffn=344, vocab=256)
MODEL_SIZES = {"tiny": TINY_LLAMA, "micro": MICRO_LLAMA}


def get_tiny(name: str) -> TinyConfig:
    try:
        return MODEL_SIZES[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; allowed: {sorted(MODEL_SIZES)}") from None


def llm_config(cfg: TinyConfig):
    """The :class:`host.models.LLMConfig` of ``cfg`` (what the GPU model and the PLoRA cost model price)."""
    from host.models.llm import LLMConfig
    return LLMConfig(name=cfg.name, n_layers=cfg.n_layers, d_model=cfg.hidden, n_heads=cfg.n_heads,
                     n_kv_heads=cfg.n_heads, head_dim=cfg.head_dim, d_ff=cfg.ffn, vocab=cfg.vocab, gated_mlp=True,
                     max_context=cfg.max_context,
                     sources={"*": "host/e2e/model.py: the end-to-end run's tiny LLaMA-style model (design choice)"})


def _fp16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).view(np.uint16)


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter: ``rank`` and per layer and matrix ``(A bits (d_in, r), B bits (r, d_out))``."""

    id: int
    rank: int
    mats: tuple = field(repr=False)         # mats[layer][matrix] = (A, B), uint16

    def ab(self, layer: int, matrix: str) -> tuple:
        return self.mats[layer][matrix]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for layer in self.mats for a, b in layer.values())


@dataclass(frozen=True)
class TinyWeights:
    """FP16 weights (uint16 bit patterns) of a :class:`TinyConfig`. ``layers[l]`` maps ``attn_norm``,
    ``ffn_norm`` (hidden,), ``q``, ``k``, ``v``, ``o`` (hidden, hidden: ``x @ W``), ``gate``, ``up``
    (hidden, ffn), ``down`` (ffn, hidden)."""

    config: TinyConfig
    seed: int
    embed: np.ndarray = field(repr=False)       # (vocab, hidden)
    layers: tuple = field(repr=False)
    final_norm: np.ndarray = field(repr=False)  # (hidden,)
    lm_head: np.ndarray = field(repr=False)     # (hidden, vocab)

    @cached_property
    def f32(self) -> dict:
        """Every tensor as float32 (exact: FP16 values), for the float32 reference."""
        f = lambda a: a.view(np.float16).astype(np.float32)  # noqa: E731
        return {"embed": f(self.embed), "final_norm": f(self.final_norm), "lm_head": f(self.lm_head),
                "layers": [{k: f(v) for k, v in lay.items()} for lay in self.layers]}

    @property
    def nbytes(self) -> int:
        return (self.embed.nbytes + self.final_norm.nbytes + self.lm_head.nbytes
                + sum(v.nbytes for lay in self.layers for v in lay.values()))


def make_weights(config: TinyConfig = TINY_LLAMA, seed: int = 0) -> TinyWeights:
    """Deterministic random FP16 weights of ``config`` from ``seed``."""
    rng = np.random.default_rng([seed, 0x7E57])
    h, f = config.hidden, config.ffn

    def mat(d_in, d_out):
        return _fp16(rng.standard_normal((d_in, d_out)) / np.sqrt(d_in))

    def norm(n):
        return _fp16(1.0 + 0.1 * rng.standard_normal(n))

    embed = _fp16(rng.standard_normal((config.vocab, h)))
    layers = []
    for _ in range(config.n_layers):
        layers.append({"attn_norm": norm(h), "q": mat(h, h), "k": mat(h, h), "v": mat(h, h), "o": mat(h, h),
                       "ffn_norm": norm(h), "gate": mat(h, f), "up": mat(h, f), "down": mat(f, h)})
    return TinyWeights(config=config, seed=seed, embed=embed, layers=tuple(layers), final_norm=norm(h),
                       lm_head=mat(h, config.vocab))


def adapter_ranks(n: int) -> list:
    """Ranks of ``n`` adapters: 8 and 16 alternating (the issue: ">= 8 LoRA adapters of ranks 8 and 16")."""
    return [8 if i % 2 == 0 else 16 for i in range(n)]


def make_adapters(config: TinyConfig = TINY_LLAMA, n: int = 8, seed: int = 0, ranks=None) -> tuple:
    """``n`` deterministic random adapters (module docstring) on every matrix of every layer."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (adapters) must be an int >= 1, got {n!r}")
    ranks = adapter_ranks(n) if ranks is None else list(ranks)
    if len(ranks) != n or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
        raise ValueError(f"ranks must be {n} ints >= 1, got {ranks!r}")
    out = []
    for i, r in enumerate(ranks):
        rng = np.random.default_rng([seed, 0xADA, i])
        layers = []
        for _ in range(config.n_layers):
            mats = {}
            for m in MATRICES:
                d_in, d_out = config.shape(m)
                a = _fp16(rng.standard_normal((d_in, r)) / np.sqrt(d_in))
                b = _fp16(rng.standard_normal((r, d_out)) * np.sqrt(0.5 / r))
                mats[m] = (a, b)
            layers.append(mats)
        out.append(LoraAdapter(id=i, rank=r, mats=tuple(layers)))
    return tuple(out)
