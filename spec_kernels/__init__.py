"""Math only: Triton kernels for attention (decode, chain and tree verification, partial KV), block
selection and weight-only quantized matmul, each with a torch reference (spec_kernels/reference.py).

Dispatch: CUDA tensors run the Triton kernels; CPU tensors run the references, unless
TRITON_INTERPRET=1 was set before this package was imported, which runs the Triton code through
Triton's CPU interpreter (the tests do this). Importing this package does not import triton;
the first Triton call does.
"""
from __future__ import annotations

import os

from spec_kernels import reference
from spec_kernels.variants import variants_met

__all__ = ["attention", "block_summaries", "select_blocks", "quantize", "quant_matmul", "reference", "uses_triton",
           "variants_met", "warm_up_attention"]

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def uses_triton(tensor) -> bool:
    """Whether a call on `tensor` runs Triton code (on the GPU, or interpreted on the CPU)."""
    return tensor.is_cuda or INTERPRET


def attention(q, k_cache, v_cache, kv_lens, *, tree_mask=None, kv_index=None, kv_index_lens=None, sm_scale=None):
    """Attention of each request's Q new tokens over its cache (see spec_kernels/reference.py):
    q [B, Hq, Q, D]; k_cache, v_cache [B, Hkv, S, D]; kv_lens [B]; tree_mask [B, Q, Q] bool;
    kv_index [B, Hkv, N] int32 with kv_index_lens [B]. Returns [B, Hq, Q, D] in q's dtype."""
    if uses_triton(q):
        from spec_kernels.attention_triton import attention as triton_attention

        return triton_attention(q, k_cache, v_cache, kv_lens, tree_mask=tree_mask, kv_index=kv_index,
                                kv_index_lens=kv_index_lens, sm_scale=sm_scale)
    return reference.attention(q, k_cache, v_cache, kv_lens, tree_mask=tree_mask, kv_index=kv_index,
                               kv_index_lens=kv_index_lens, sm_scale=sm_scale)


def warm_up_attention(q_heads: int, kv_heads: int, head_dim: int, dtype, device, max_query_tokens: int,
                      indexed: bool) -> None:
    """Compile every variant of the attention kernel that forwards of a model of these heads and dtype
    can launch, queries up to `max_query_tokens` long, with a partial index when `indexed`
    (spec_kernels/attention_triton.py `warm_up`); nothing where the references run."""
    import torch

    if uses_triton(torch.empty(0, device=device)):
        from spec_kernels.attention_triton import warm_up

        warm_up(q_heads, kv_heads, head_dim, dtype, device, max_query_tokens, indexed)


def block_summaries(k_cache, kv_lens, block: int = 16):
    """Per-channel key max and min of every complete block below each request's length:
    (k_max, k_min) [B, Hkv, max(kv_lens) // block, D]; incomplete blocks are zero."""
    if uses_triton(k_cache):
        from spec_kernels.selection_triton import block_summaries as triton_summaries

        return triton_summaries(k_cache, kv_lens, block)
    return reference.block_summaries(k_cache, kv_lens, block)


def select_blocks(q, k_max, k_min, budget_blocks, *, sink_tokens, window_tokens, kv_lens, block: int = 16,
                  reduce: str = "mean"):
    """SpecPV's partial KV for `attention` (see spec_kernels/reference.py): (kv_index, kv_index_lens)."""
    if uses_triton(q):
        from spec_kernels.selection_triton import block_scores

        scores = block_scores(q, k_max, k_min, reduce)
    else:
        scores = reference.block_scores(q, k_max, k_min, reduce)
    return reference.assemble_index(scores, budget_blocks, sink_tokens, window_tokens,
                                    kv_lens.to(q.device).long() - q.shape[2], block)


def quantize(w, bits: int = 4, group_size: int = 64) -> dict:
    return reference.quantize(w, bits, group_size)


def quant_matmul(x, packed: dict):
    """x [..., in] @ dequantize(packed).T -> [..., out] in x's dtype, fp32 accumulation."""
    if uses_triton(x):
        from spec_kernels.quant_triton import quant_matmul as triton_quant_matmul

        return triton_quant_matmul(x, packed)
    return reference.quant_matmul(x, packed)
