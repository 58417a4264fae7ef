"""SubSpec's shadow draft: the target's own decoder layers, weight-only quantized (int8, or int4 in
groups of 64), sharing the target's embeddings, norms, LM head and KV cache.

`quantize_groupwise` is asymmetric round-to-nearest per group of `group_size` input columns
(scale and zero in fp32), the scheme HQQ and GPTQ-style int4 kernels store. On the CPU the shadow
runs with its weights dequantized once ("fake quantization"): its outputs, hence its acceptance,
are exactly those of the quantized model, while its speed is not that of a real int4 kernel (the
Triton kernels issue brings those).
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor

from profiler.model import Llama


def quantize_groupwise(weight: Tensor, bits: int, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """weight [out, in] -> (codes uint8 [out, in], scale [out, in/group], zero [out, in/group])."""
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(f"input width {in_features} is not a multiple of group_size {group_size}")
    levels = 2 ** bits - 1
    groups = weight.float().reshape(out_features, in_features // group_size, group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / levels).clamp_min(1e-12)
    zero = low
    codes = torch.round((groups - zero[..., None]) / scale[..., None]).clamp(0, levels).to(torch.uint8)
    return codes.reshape(out_features, in_features), scale, zero


def dequantize_groupwise(codes: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    out_features, in_features = codes.shape
    groups = codes.float().reshape(out_features, scale.shape[1], -1)
    return (groups * scale[..., None] + zero[..., None]).reshape(out_features, in_features)


def shadow_model(target: Llama, bits: int = 4, group_size: int = 64) -> Llama:
    """A copy of `target` whose decoder-layer linears carry quantized-then-dequantized weights;
    embeddings, norms and LM head are the target's own modules, and so are the KV caches once
    `share_caches` is called after `target.setup_cache`."""
    shadow = copy.deepcopy(target)
    shadow.embed, shadow.norm, shadow.lm_head = target.embed, target.norm, target.lm_head
    for mine, theirs in zip(shadow.layers, target.layers):
        mine.attention_norm, mine.ffn_norm = theirs.attention_norm, theirs.ffn_norm
        for linear in (mine.attention.wqkv, mine.attention.wo, mine.feed_forward.w_gate_up,
                       mine.feed_forward.w_down):
            codes, scale, zero = quantize_groupwise(linear.weight.data, bits, group_size)
            linear.weight.data = dequantize_groupwise(codes, scale, zero).to(linear.weight.dtype)
    return shadow


def share_caches(shadow: Llama, target: Llama) -> None:
    """Point the shadow's attention at the target's KV cache tensors (and RoPE table)."""
    for mine, theirs in zip(shadow.layers, target.layers):
        mine.attention.k_cache = theirs.attention.k_cache
        mine.attention.v_cache = theirs.attention.v_cache
    shadow.rope = target.rope
