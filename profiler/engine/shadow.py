"""SubSpec's shadow draft: the target's own decoder layers, weight-only quantized (int8, or int4 in
groups of 64), sharing the target's embeddings, norms, LM head and KV cache.

The weights are packed by `spec_kernels.quantize` (asymmetric round-to-nearest per group of
`group_size` input columns, scale and zero in fp32, the scheme HQQ and GPTQ-style int4 kernels
store). On CUDA each quantized linear runs `spec_kernels.quant_matmul`, which reads the packed codes:
the draft crosses memory at 4 or 8 bits a weight. On the CPU it runs with the weights dequantized
once ("fake quantization"): its outputs, hence its acceptance, are the quantized model's, its
speed is not a real int4 kernel's.
"""
from __future__ import annotations

import copy

import torch.nn.functional as F
from torch import Tensor, nn

import spec_kernels
from spec_kernels.reference import dequantize
from profiler.engine.model import Llama


class QuantLinear(nn.Module):
    """A bias-free linear layer with weight-only quantized weights."""

    def __init__(self, linear: nn.Linear, bits: int, group_size: int, use_kernel: bool):
        super().__init__()
        self.packed = spec_kernels.quantize(linear.weight.data.float(), bits, group_size)
        self.use_kernel = use_kernel
        # The CPU path keeps the dequantized weight; the kernel path only the packed codes.
        self.dense = None if use_kernel else dequantize(self.packed).to(linear.weight.dtype)

    def clone(self) -> "QuantLinear":
        """The same layer in new memory (calibration's copies of one operator)."""
        return copy.deepcopy(self)

    def forward(self, x: Tensor) -> Tensor:
        if self.use_kernel:
            return spec_kernels.quant_matmul(x, self.packed)
        return F.linear(x, self.dense)


def shadow_model(target: Llama, bits: int = 4, group_size: int = 64, use_kernels: bool | None = None) -> Llama:
    """A copy of `target` whose decoder-layer linears are QuantLinear; embeddings, norms and LM
    head are the target's own modules, and so are the KV caches once `share_caches` is called
    after `target.setup_cache`. use_kernels: spec_kernels.quant_matmul (default: on CUDA)."""
    if use_kernels is None:
        use_kernels = target.lm_head.weight.is_cuda
    graphs, target.step_graphs = target.step_graphs, None        # captured graphs are not copied
    try:
        shadow = copy.deepcopy(target)
    finally:
        target.step_graphs = graphs
    shadow.embed, shadow.norm, shadow.lm_head = target.embed, target.norm, target.lm_head
    for mine, theirs in zip(shadow.layers, target.layers):
        mine.attention_norm, mine.ffn_norm = theirs.attention_norm, theirs.ffn_norm
        mine.attention.wqkv = QuantLinear(theirs.attention.wqkv, bits, group_size, use_kernels)
        mine.attention.wo = QuantLinear(theirs.attention.wo, bits, group_size, use_kernels)
        mine.feed_forward.w_gate_up = QuantLinear(theirs.feed_forward.w_gate_up, bits, group_size, use_kernels)
        mine.feed_forward.w_down = QuantLinear(theirs.feed_forward.w_down, bits, group_size, use_kernels)
    return shadow


def share_caches(shadow: Llama, target: Llama) -> None:
    """Point the shadow's attention at the target's KV cache tensors (and RoPE table)."""
    for mine, theirs in zip(shadow.layers, target.layers):
        mine.attention.k_cache = theirs.attention.k_cache
        mine.attention.v_cache = theirs.attention.v_cache
    shadow.rope = target.rope
