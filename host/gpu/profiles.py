"""Reading Vidur operator profiles (``mlp.csv``) into operator shapes, the GPU model's training and test rows.

A Vidur ``mlp.csv`` row is one (model, num_tokens, TP degree) point with measured per-layer times of the
non-attention operators. :func:`op_shapes` derives, for every row and operator, the shape the GPU model prices:

* GEMMs (``M x K`` times ``K x N``, one tensor-parallel shard): ``attn_pre_proj`` (fused QKV: K = n_embd,
  N = (q + 2 kv) / TP), ``attn_post_proj`` (K = q / TP, N = n_embd), ``mlp_up_proj`` (K = n_embd,
  N = (2 if gated) x n_expanded_embd / TP), ``mlp_down_proj`` (K = n_expanded_embd / TP, N = n_embd);
* memory-bound element-wise ops, by the bytes they move per token (FP16): ``emb`` (gather + write, 4 H),
  ``input_layernorm`` / ``post_attention_layernorm`` (read + write, 4 H), ``attn_rope`` (read + write q and k of
  this shard, 4 (q + kv) / TP), ``mlp_act`` (gated: read 2 F / TP, write F / TP -> 6 F / TP; plain: 4 F / TP),
  ``add`` (residual: read 2 H, write H -> 6 H).
"""

from pathlib import Path

import numpy as np

__all__ = ["GEMM_OPS", "ELT_OPS", "PROFILE_COLUMNS", "DATA_DIR", "VIDUR_PROFILES", "read_profile", "op_shapes",
           "training_rows"]

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELT_OPS = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
PROFILE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
                   "num_tensor_parallel_workers")

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
_COMPUTE = DATA_DIR / "vidur" / "profiling" / "compute"
# (gpu, label) -> file: every measured operator profile in data/ (see data/README.md).
VIDUR_PROFILES = {
    ("h100", "llama2-7b"): _COMPUTE / "h100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv",
    ("a100", "llama2-7b"): _COMPUTE / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv",
    ("a100", "llama2-70b"): _COMPUTE / "a100" / "meta-llama" / "Llama-2-70b-hf" / "mlp.csv",
}


def read_profile(path):
    """A Vidur ``mlp.csv`` as a pandas DataFrame, checked for the shape columns."""
    import pandas as pd
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"profile {path} does not exist")
    df = pd.read_csv(path)
    missing = [c for c in PROFILE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not a Vidur mlp.csv profile, missing columns {missing} "
                         f"(needs {list(PROFILE_COLUMNS)})")
    bad = df["num_tokens"] < 1
    if bad.any():
        raise ValueError(f"{path}: num_tokens must be >= 1 (row {int(np.flatnonzero(bad)[0])})")
    tp = df["num_tensor_parallel_workers"]
    if (tp < 1).any() or (df["n_head"] % tp != 0).any():
        raise ValueError(f"{path}: num_tensor_parallel_workers must be >= 1 and divide n_head")
    return df


def op_shapes(df) -> dict:
    """Per operator: ``("gemm", M, K, N)`` or ``("elt", M, bytes)`` arrays, one entry per profile row."""
    M = df["num_tokens"].to_numpy(np.float64)
    tp = df["num_tensor_parallel_workers"].to_numpy(np.float64)
    H = df["n_embd"].to_numpy(np.float64)
    heads = df["n_head"].to_numpy(np.float64)
    hd = H / heads
    q = heads * hd
    kv = df["n_kv_head"].to_numpy(np.float64) * hd
    F = df["n_expanded_embd"].to_numpy(np.float64)
    gated = df["use_gated_mlp"].astype(str).str.lower().isin(["true", "1"]).to_numpy()
    up = np.where(gated, 2.0, 1.0) * F
    return {
        "attn_pre_proj": ("gemm", M, H, (q + 2 * kv) / tp),
        "attn_post_proj": ("gemm", M, q / tp, H),
        "mlp_up_proj": ("gemm", M, H, up / tp),
        "mlp_down_proj": ("gemm", M, F / tp, H),
        "emb": ("elt", M, 4 * M * H),
        "input_layernorm": ("elt", M, 4 * M * H),
        "attn_rope": ("elt", M, 4 * M * (q + kv) / tp),
        "post_attention_layernorm": ("elt", M, 4 * M * H),
        "mlp_act": ("elt", M, np.where(gated, 6.0, 4.0) * M * F / tp),
        "add": ("elt", M, 6 * M * H),
    }


def training_rows(keys=None):
    """Long-format rows of every measured profile in data/ (or those in ``keys``): a DataFrame with columns
    gpu, label, tp, op, kind, M, K, N, bytes, t_s (measured median, seconds)."""
    import pandas as pd
    frames = []
    for (gpu, label), path in VIDUR_PROFILES.items():
        if keys is not None and (gpu, label) not in keys:
            continue
        df = read_profile(path)
        for op, shape in op_shapes(df).items():
            col = f"time_stats.{op}.median"
            if col not in df.columns:
                continue
            if shape[0] == "gemm":
                _, M, K, N = shape
                nbytes = 2 * (M * K + K * N + M * N)
            else:
                _, M, nbytes = shape
                K = N = np.zeros_like(M)
            frames.append(pd.DataFrame({"gpu": gpu, "label": label, "tp": df["num_tensor_parallel_workers"].to_numpy(),
                                        "op": op, "kind": shape[0], "M": M, "K": K, "N": N, "bytes": nbytes,
                                        "t_s": df[col].to_numpy(np.float64) * 1e-3}))
    return pd.concat(frames, ignore_index=True)
