"""A model configuration from a Hugging Face ``config.json`` (``--model-config F``; docs/inputs.md).

:func:`load_hf_config` maps the file's fields onto :class:`host.models.llm.LLMConfig` (the names in its comments):

=============================  =========================================================================
LLMConfig                      config.json
=============================  =========================================================================
``n_layers``                   ``num_hidden_layers`` (GPT-2: ``n_layer``)
``d_model``                    ``hidden_size`` (GPT-2: ``n_embd``)
``n_heads``                    ``num_attention_heads`` (GPT-2: ``n_head``)
``n_kv_heads``                 ``num_key_value_heads`` (absent: ``num_attention_heads``, no GQA)
``head_dim``                   ``head_dim`` (absent: ``hidden_size / num_attention_heads``)
``d_ff``                       ``intermediate_size`` (OPT: ``ffn_dim``; GPT-2: ``n_inner`` or 4 x ``n_embd``;
                               0 for a model whose every layer is MoE)
``vocab``                      ``vocab_size``
``max_context``                ``max_position_embeddings`` (GPT-2: ``n_positions``)
``gated_mlp``                  from ``model_type``: SwiGLU for llama, mistral, mixtral, qwen2, qwen3,
                               qwen3_moe; a plain two-matrix FFN for opt, gpt2
``n_experts``, ...             qwen3_moe: ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``
                               (every layer MoE: ``decoder_sparse_step`` 1, ``mlp_only_layers`` empty);
                               mixtral: ``num_local_experts``, ``num_experts_per_tok``, ``intermediate_size``
``dtype_bytes``                ``torch_dtype``: float16 or bfloat16 (2 bytes; the GPU, NDP and PIM models price
                               FP16 / BF16); absent: 2
=============================  =========================================================================

Every value is checked (an integer in its range; the head counts dividing); a bad one is a :class:`ValueError`
naming the file, the key and the allowed range.
"""

import json
from pathlib import Path

from host.models.hardware_file import read_file
from host.models.llm import LLMConfig

__all__ = ["load_hf_config", "HF_MODEL_TYPES", "HF_RANGES"]

GATED = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe")
PLAIN = ("opt", "gpt2")
HF_MODEL_TYPES = GATED + PLAIN

#: Allowed ranges of the integer fields (inclusive).
HF_RANGES = {
    "num_hidden_layers": (1, 1024), "hidden_size": (1, 1 << 17), "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024), "head_dim": (1, 4096), "intermediate_size": (1, 1 << 20),
    "vocab_size": (1, 1 << 22), "max_position_embeddings": (1, 1 << 24), "num_experts": (1, 4096),
    "num_experts_per_tok": (1, 4096), "moe_intermediate_size": (1, 1 << 20),
}
_ALIASES = {"gpt2": {"num_hidden_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head",
                     "max_position_embeddings": "n_positions", "intermediate_size": "n_inner"},
            "opt": {"intermediate_size": "ffn_dim"},
            "mixtral": {"num_experts": "num_local_experts", "moe_intermediate_size": "intermediate_size"}}
DTYPES = {"float16": 2, "bfloat16": 2}


def load_hf_config(path, *, name: str | None = None, tp: int = 1, dp: int = 1) -> LLMConfig:
    """The :class:`LLMConfig` of the Hugging Face ``config.json`` at ``path`` (module docstring). ``name``: the
    model's name in runs (default: the last part of ``_name_or_path``, else the file's directory name, lower
    case)."""
    path = Path(path)
    d = read_file(path, json.loads, "JSON", json.JSONDecodeError)
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a JSON object (a Hugging Face config.json), got {type(d).__name__}")
    mt = d.get("model_type")
    if mt not in HF_MODEL_TYPES:
        raise ValueError(f"{path}: model_type {mt!r} is not supported; allowed: {list(HF_MODEL_TYPES)}")
    alias = _ALIASES.get(mt, {})

    def get(key, default=None, required=True):
        k = alias.get(key, key)
        v = d.get(k)
        if v is None:
            if default is not None or not required:
                return default
            raise ValueError(f"{path}: missing key {k!r} (a {mt} config.json has it)")
        lo, hi = HF_RANGES[key]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"{path}: {k} must be an integer in {lo}..{hi}, got {v!r}")
        return v

    layers, d_model, heads = get("num_hidden_layers"), get("hidden_size"), get("num_attention_heads")
    kv = get("num_key_value_heads", heads)
    if kv > heads or heads % kv:
        raise ValueError(f"{path}: num_key_value_heads must divide num_attention_heads ({heads}), got {kv}")
    if "head_dim" in d and d["head_dim"] is not None:
        head_dim = get("head_dim")
    else:
        if d_model % heads:
            raise ValueError(f"{path}: {alias.get('hidden_size', 'hidden_size')} ({d_model}) must be a multiple of "
                             f"{alias.get('num_attention_heads', 'num_attention_heads')} ({heads}) when head_dim is "
                             f"not given")
        head_dim = d_model // heads
    moe = {}
    if mt in ("qwen3_moe", "mixtral"):
        if mt == "qwen3_moe":
            step, dense = d.get("decoder_sparse_step", 1), d.get("mlp_only_layers", [])
            if step != 1 or dense:
                raise ValueError(f"{path}: decoder_sparse_step {step!r} / mlp_only_layers {dense!r}: only models "
                                 f"whose every layer is MoE are modelled; allowed: decoder_sparse_step 1, "
                                 f"mlp_only_layers []")
        n_exp, act = get("num_experts"), get("num_experts_per_tok")
        if act > n_exp:
            raise ValueError(f"{path}: num_experts_per_tok must be in 1..{n_exp} (num_experts), got {act}")
        moe = dict(n_experts=n_exp, n_active_experts=act, d_expert_ff=get("moe_intermediate_size"))
        d_ff = 0
    elif mt == "gpt2":
        d_ff = get("intermediate_size", 4 * d_model)
    else:
        d_ff = get("intermediate_size")
    dtype = d.get("torch_dtype", "float16")
    if dtype not in DTYPES:
        raise ValueError(f"{path}: torch_dtype {dtype!r} is not modelled; allowed: {sorted(DTYPES)} (the GPU, NDP "
                         f"and PIM models price FP16 / BF16)")
    if name is None:
        src = d.get("_name_or_path")
        name = (str(src).rstrip("/").split("/")[-1] if src else
                (path.parent.name if path.name == "config.json" and path.parent.name else path.stem)).lower()
    sources = {"*": f"{path} (Hugging Face config.json, model_type {mt}; host/models/hf.py maps its fields)"}
    try:
        return LLMConfig(name=name, n_layers=layers, d_model=d_model, n_heads=heads, n_kv_heads=kv,
                         head_dim=head_dim, d_ff=d_ff, vocab=get("vocab_size"), gated_mlp=mt in GATED,
                         max_context=get("max_position_embeddings"), dtype_bytes=DTYPES[dtype], tp=tp, dp=dp,
                         sources=sources, **moe)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
