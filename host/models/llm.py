"""LLM architecture configurations, each value with its source.

:class:`LLMConfig` is a frozen, validated dataclass; :data:`MODELS` holds the presets by CLI name. Field names
follow the Hugging Face ``config.json`` names in their comments so a value can be checked against the model
card. Derived quantities (per-layer GEMM shapes, weight bytes, KV bytes per token) are methods, never repeated
numbers.

Conventions: ``head_dim`` is the attention head width (Q, K and V heads alike); the Q projection is
``n_heads * head_dim`` wide and K, V are ``n_kv_heads * head_dim`` each (GQA when ``n_kv_heads < n_heads``).
The FFN is gated (SwiGLU: up and gate projections of width ``d_ff`` fused as one ``2 * d_ff`` GEMM, as Vidur's
``mlp_up_proj`` measures it) or plain (one ``d_ff`` up projection, OPT / GPT). An MoE model has ``n_experts``
experts of width ``d_expert_ff`` of which ``n_active_experts`` run per token.
"""

from dataclasses import dataclass, field

__all__ = ["LLMConfig", "LinearShape", "MODELS", "get_model"]


@dataclass(frozen=True)
class LinearShape:
    """One GEMM of a layer: ``tokens x k`` times ``k x n`` (per tensor-parallel shard: see
    :meth:`LLMConfig.linears`). ``count`` is how many times it runs per token per layer (MoE: active experts)."""

    name: str
    k: int
    n: int
    count: float = 1.0


@dataclass(frozen=True, kw_only=True)
class LLMConfig:
    name: str
    n_layers: int            # num_hidden_layers
    d_model: int             # hidden_size
    n_heads: int             # num_attention_heads
    n_kv_heads: int          # num_key_value_heads
    head_dim: int            # head_dim (or hidden_size / num_attention_heads)
    d_ff: int                # intermediate_size (dense FFN width; 0 when every layer is MoE)
    vocab: int               # vocab_size
    gated_mlp: bool          # SwiGLU (LLaMA / Qwen) vs. plain 2-matrix FFN (OPT / GPT)
    n_experts: int = 0       # num_experts (0: dense)
    n_active_experts: int = 0  # num_experts_per_tok
    d_expert_ff: int = 0     # moe_intermediate_size
    max_context: int = 0     # max_position_embeddings
    dtype_bytes: int = 2     # FP16 / BF16 weights and KV
    tp: int = 1              # default tensor-parallel degree for this model's deployment
    dp: int = 1              # default data-parallel replicas
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "vocab", "dtype_bytes", "tp",
                     "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"LLMConfig({self.name}).{name} must be >= 1, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LLMConfig({self.name}): n_heads {self.n_heads} must be a multiple of n_kv_heads "
                             f"{self.n_kv_heads}")
        if self.n_experts:
            if not (1 <= self.n_active_experts <= self.n_experts) or self.d_expert_ff < 1:
                raise ValueError(f"LLMConfig({self.name}): MoE needs 1 <= n_active_experts <= n_experts and "
                                 f"d_expert_ff >= 1")
        elif self.d_ff < 1:
            raise ValueError(f"LLMConfig({self.name}).d_ff must be >= 1 for a dense model")

    # --- derived -------------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def ffn_width(self) -> int:
        """Width of one token's FFN as run (dense: d_ff; MoE: one expert's width)."""
        return self.d_expert_ff if self.is_moe else self.d_ff

    def linears(self, tp: int | None = None) -> list:
        """The per-layer GEMMs of one tensor-parallel shard (Megatron split: QKV and up column-parallel,
        O and down row-parallel; MoE experts are split the same way inside each expert)."""
        tp = self.tp if tp is None else tp
        self._check_tp(tp)
        up_n = (2 if self.gated_mlp else 1) * self.ffn_width()
        count = self.n_active_experts if self.is_moe else 1
        return [
            LinearShape("attn_pre_proj", self.d_model, (self.q_dim + 2 * self.kv_dim) // tp),
            LinearShape("attn_post_proj", self.q_dim // tp, self.d_model),
            LinearShape("mlp_up_proj", self.d_model, up_n // tp, count),
            LinearShape("mlp_down_proj", self.ffn_width() // tp, self.d_model, count),
        ]

    def _check_tp(self, tp):
        if tp < 1 or self.n_heads % tp or self.n_kv_heads % tp and tp % self.n_kv_heads:
            raise ValueError(f"{self.name}: tensor-parallel degree {tp} must divide the {self.n_heads} heads "
                             f"(and divide or be a multiple of the {self.n_kv_heads} KV heads)")

    def layer_weight_params(self) -> int:
        """Weights of one layer (all experts), norms and biases neglected (< 0.1 %)."""
        attn = self.d_model * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.d_model
        ffn_one = (3 if self.gated_mlp else 2) * self.d_model * self.ffn_width()
        ffn = ffn_one * (self.n_experts if self.is_moe else 1)
        router = self.d_model * self.n_experts
        return attn + ffn + router

    def active_layer_params(self) -> int:
        """Weights one token touches per layer (MoE: only its active experts)."""
        attn = self.d_model * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.d_model
        ffn_one = (3 if self.gated_mlp else 2) * self.d_model * self.ffn_width()
        return attn + ffn_one * (self.n_active_experts if self.is_moe else 1) + self.d_model * self.n_experts

    def params(self) -> int:
        """All parameters: layers + input embedding + LM head (counted separately: untied)."""
        return self.n_layers * self.layer_weight_params() + 2 * self.vocab * self.d_model

    def weight_bytes(self, tp: int | None = None) -> float:
        """Weight bytes held by one GPU of a ``tp``-way shard."""
        tp = self.tp if tp is None else tp
        return self.params() * self.dtype_bytes / tp

    def kv_bytes_per_token(self, tp: int | None = None, dtype_bytes: float | None = None) -> float:
        """KV-cache bytes per token (all layers) held by one GPU of a ``tp``-way shard (KV heads replicated when
        ``tp`` exceeds their number)."""
        tp = self.tp if tp is None else tp
        self._check_tp(tp)
        b = self.dtype_bytes if dtype_bytes is None else dtype_bytes
        kv_heads_per_gpu = max(self.n_kv_heads // tp, 1)
        return 2 * self.n_layers * kv_heads_per_gpu * self.head_dim * b

    def flops_per_token(self) -> float:
        """Forward FLOPs per token in the linear layers (2 x active weights), attention excluded."""
        return 2.0 * (self.n_layers * self.active_layer_params() + self.vocab * self.d_model)


_HF = "Hugging Face config.json of {repo} (fields: num_hidden_layers, hidden_size, num_attention_heads, " \
      "num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings{extra})"

LLAMA2_7B = LLMConfig(
    name="llama2-7b", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=32, head_dim=128, d_ff=11008,
    vocab=32000, gated_mlp=True, max_context=4096,
    sources={"*": _HF.format(repo="meta-llama/Llama-2-7b-hf", extra=""),
             "head_dim": "hidden_size / num_attention_heads",
             "cross-check": "data/vidur/.../Llama-2-7b-hf/mlp.csv: n_head=32, n_kv_head=32, n_embd=4096, "
                            "n_expanded_embd=11008, vocab_size=32000, use_gated_mlp=True"})

LLAMA2_13B = LLMConfig(
    name="llama2-13b", n_layers=40, d_model=5120, n_heads=40, n_kv_heads=40, head_dim=128, d_ff=13824,
    vocab=32000, gated_mlp=True, max_context=4096,
    sources={"*": _HF.format(repo="meta-llama/Llama-2-13b-hf", extra=""),
             "head_dim": "hidden_size / num_attention_heads"})

LLAMA2_70B = LLMConfig(
    name="llama2-70b", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, head_dim=128, d_ff=28672,
    vocab=32000, gated_mlp=True, max_context=4096,
    sources={"*": _HF.format(repo="meta-llama/Llama-2-70b-hf", extra=""),
             "cross-check": "data/vidur/.../Llama-2-70b-hf/mlp.csv: n_head=64, n_kv_head=8, n_embd=8192, "
                            "n_expanded_embd=28672"})

LLAMA3_8B = LLMConfig(
    name="llama3-8b", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=14336,
    vocab=128256, gated_mlp=True, max_context=8192,
    sources={"*": _HF.format(repo="meta-llama/Meta-Llama-3-8B", extra=""),
             "n_kv_heads": "num_key_value_heads = 8 (GQA); Llama 3 herd paper (arXiv:2407.21783) Table 3"})

QWEN3_30B_A3B = LLMConfig(
    name="qwen3-30b-a3b", n_layers=48, d_model=2048, n_heads=32, n_kv_heads=4, head_dim=128, d_ff=0,
    vocab=151936, gated_mlp=True, n_experts=128, n_active_experts=8, d_expert_ff=768, max_context=40960,
    sources={"*": _HF.format(repo="Qwen/Qwen3-30B-A3B",
                             extra=", head_dim, num_experts, num_experts_per_tok, moe_intermediate_size"),
             "d_ff": "every layer is MoE (decoder_sparse_step = 1, mlp_only_layers = []), so the dense "
                     "intermediate_size (6144) is unused"})

OPT_66B = LLMConfig(
    name="opt-66b", n_layers=64, d_model=9216, n_heads=72, n_kv_heads=72, head_dim=128, d_ff=36864,
    vocab=50272, gated_mlp=False, max_context=2048, tp=2, dp=4,
    sources={"n_layers, n_heads, d_model, tp, dp": "L3 Table 3 (OPT-66B: 64 layers, 72 heads, 9216, TP 2, DP 4)",
             "head_dim": "L3 Table 3 footnote: D_h = D_e / N_h = 128",
             "d_ff, vocab, max_context": "Hugging Face facebook/opt-66b config.json: ffn_dim 36864, "
                                         "vocab_size 50272, max_position_embeddings 2048",
             "gated_mlp": "OPT uses a ReLU two-matrix FFN (Zhang et al. 2022, arXiv:2205.01068)"})

GPT_89B = LLMConfig(
    name="gpt-89b", n_layers=48, d_model=12288, n_heads=96, n_kv_heads=96, head_dim=128, d_ff=4 * 12288,
    vocab=50257, gated_mlp=False, max_context=2048, tp=4, dp=2,
    sources={"n_layers, n_heads, d_model, tp, dp": "L3 Table 3 (GPT-89B: 48 layers, 96 heads, 12288, TP 4, DP 2)",
             "head_dim": "L3 Table 3 footnote: D_h = 128",
             "d_ff, vocab": "GPT-3 family (Brown et al. 2020, arXiv:2005.14165, 2.1): d_ff = 4 d_model, "
                            "GPT-2 BPE vocabulary of 50257",
             "max_context": "GPT-3 n_ctx = 2048 (same paper, Table 2.1); long traces exceed it: the model is "
                            "run as the L3 paper runs it, without a context limit"})

GPT_175B = LLMConfig(
    name="gpt-175b", n_layers=96, d_model=12288, n_heads=96, n_kv_heads=96, head_dim=128, d_ff=4 * 12288,
    vocab=50257, gated_mlp=False, max_context=2048, tp=8, dp=1,
    sources={"n_layers, n_heads, d_model, tp, dp": "L3 Table 3 (GPT-175B: 96 layers, 96 heads, 12288, TP 8, "
                                                   "DP 1); GPT-3 paper Table 2.1 (96, 96, 12288, d_head 128)",
             "head_dim": "L3 Table 3 footnote: D_h = 128",
             "d_ff, vocab": "GPT-3 (arXiv:2005.14165, 2.1): d_ff = 4 d_model; vocabulary 50257",
             "max_context": "GPT-3 n_ctx = 2048 (not enforced, see gpt-89b)"})

MODELS = {m.name: m for m in (LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, LLAMA3_8B, QWEN3_30B_A3B, OPT_66B, GPT_89B,
                              GPT_175B)}


def get_model(name: str) -> LLMConfig:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; allowed: {sorted(MODELS)}") from None
