"""A decoder layer's kernels timed by Vidur's profiler (microsoft/vidur,
data/profiling/compute/<gpu>/<model>/mlp.csv): a row per (token count, tensor-parallel GPUs) with
`time_stats.<op>.median` in milliseconds, the median CUDA time of the op's kernels over 20 profiled
runs (vidur/profiling/mlp: vLLM's ColumnParallelLinear / RowParallelLinear and its norm, RoPE and
activation kernels, fp16, random weights, one GPU's shard at each tensor-parallel size).

Read as the operators a calibration bundle names (sim/cost/table.py prices a forward from them):
linear.qkv (attn_pre_proj), linear.o (attn_post_proj), linear.gate_up (mlp_up_proj),
linear.down (mlp_down_proj), and elementwise: the layer's two RMSNorms, RoPE, the activation and
its two residual adds (input_layernorm + post_attention_layernorm + attn_rope + mlp_act + 2 add).
Attention and the LM head are not in this table.
"""
from __future__ import annotations

from pathlib import Path

from sim.errors import InputError
from sim.imports.source_table import check_positive, read_source_csv

SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
COLUMNS = (*SHAPE, "num_tokens", "num_tensor_parallel_workers")
OPS = {"linear.qkv": ("attn_pre_proj",), "linear.o": ("attn_post_proj",), "linear.gate_up": ("mlp_up_proj",),
       "linear.down": ("mlp_down_proj",),
       "elementwise": ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add", "add")}
MEASURED = {
    "seconds": "the source's time_stats.<op>.median (ms) in seconds: the median CUDA time of the op's kernels "
               "over 20 profiled runs (vLLM's parallel linears and its norm, RoPE and activation kernels, fp16, "
               "one GPU's shard); elementwise is the sum of the layer's two norms, RoPE, activation and two adds",
    "tokens": "the source's num_tokens: tokens in the forward (a batch's query tokens)",
    "ranks": "the source's num_tensor_parallel_workers: the tensor-parallel size whose shard was timed",
}


def read_kernels(path: Path):
    """(rows of op, ranks, tokens, seconds; the model's shape as the source states it)."""
    import pandas as pd

    times = sorted({f"time_stats.{name}.median" for parts in OPS.values() for name in parts})
    needed = [*COLUMNS, *times]
    frame = read_source_csv(path, needed, "a Vidur mlp.csv")
    shapes = frame[list(SHAPE)].drop_duplicates()
    if len(shapes) != 1:
        raise InputError(str(path), f"holds {len(shapes)} model shapes; one a file")
    check_positive(frame, [c for c in needed if c != "use_gated_mlp"], path)
    rows = []
    for op, parts in OPS.items():
        seconds = sum(frame[f"time_stats.{name}.median"].astype(float) for name in parts) * 1e-3
        rows.append(pd.DataFrame({"op": op, "ranks": frame.num_tensor_parallel_workers.astype(float),
                                  "tokens": frame.num_tokens.astype(float), "seconds": seconds}))
    shape = {k: (bool(v) if k == "use_gated_mlp" else int(v)) for k, v in shapes.iloc[0].items()}
    return pd.concat(rows, ignore_index=True), shape

