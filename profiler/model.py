"""A Llama-family decoder in plain torch (gpt-fast style), batched with per-request positions.

RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, tied or separate LM head. Rotary
embeddings use the interleaved layout (pairs (2i, 2i+1) rotate together, as in llama.cpp's GGUF
and gpt-fast), applied to Q and K in one complex multiplication; Hugging Face checkpoints, whose Q
and K rows are in the half-split layout, are permuted at load time. The KV
cache is a preallocated [B, H_kv, S_max, D] buffer per layer indexed by position: a request's new
tokens are written at its own positions, and rejected speculative tokens need no rollback, because
attention only reads positions below each query's own and the next write overwrites them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sim.presets.models import ModelSpec


@dataclass(frozen=True)
class LlamaConfig(ModelSpec):
    """The simulator's model shape (sim.presets.ModelSpec: a live run and its scenario share it)
    plus what running the model needs besides."""
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


def rope_table(config: LlamaConfig, device=None) -> Tensor:
    """[max_context, head_dim / 2] complex64: e^(i * position * theta^(-2j / D))."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, device=device, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(config.max_context, device=device, dtype=torch.float64), inv_freq)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def apply_rope(x: Tensor, rotation: Tensor) -> Tensor:
    """x: [B, T, H, D] real, interleaved pairs; rotation: [B, T, 1, D/2] complex, per token."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        q_out = config.heads * config.head_dim
        kv_out = config.kv_heads * config.head_dim
        # One fused QKV matmul: fewer, larger kernels on the decode path.
        self.wqkv = nn.Linear(config.hidden, q_out + 2 * kv_out, bias=False)
        self.wo = nn.Linear(q_out, config.hidden, bias=False)
        self.k_cache: Tensor | None = None   # [B, H_kv, S_max, D]
        self.v_cache: Tensor | None = None

    def forward(self, x: Tensor, cache_index: Tensor, rotation: Tensor, mask: Tensor) -> Tensor:
        # x: [B, T, hidden]; cache_index: [B, H_kv, T, D] positions of the new tokens;
        # rotation: [B, T, 1, D/2]; mask: [B, 1, T, S] bool, True = may attend
        B, T, _ = x.shape
        qkv = self.wqkv(x).view(B, T, self.heads + 2 * self.kv_heads, self.head_dim)
        qk = apply_rope(qkv[:, :, :self.heads + self.kv_heads], rotation).transpose(1, 2)
        q, k = qk.split([self.heads, self.kv_heads], dim=1)
        v = qkv[:, :, self.heads + self.kv_heads:].transpose(1, 2)
        # Write the new K/V at each request's own positions.
        self.k_cache.scatter_(2, cache_index, k)
        self.v_cache.scatter_(2, cache_index, v)
        S = mask.shape[-1]
        keys, values = self.k_cache[:B, :, :S], self.v_cache[:B, :, :S]
        if T <= SMALL_QUERY:
            out = attend_small_query(q, keys, values, mask)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                 enable_gqa=self.heads != self.kv_heads)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))


# Up to this many new tokens per request (decode, chain and small-tree verification), attention is
# two small matmuls with the GQA group folded into the query rows: on CPU that is several times
# cheaper than SDPA's dispatch for a 1-token query. Longer queries (prefill) use SDPA.
SMALL_QUERY = 64


def attend_small_query(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """q: [B, H, T, D]; keys, values: [B, H_kv, S, D]; mask: [B, 1, T, S] bool -> [B, H, T, D]."""
    B, H, T, D = q.shape
    kv_heads = keys.shape[1]
    group = H // kv_heads
    # Query heads j*group .. j*group+group-1 share KV head j: fold them into rows of one matmul.
    rows = q.reshape(B, kv_heads, group * T, D)
    scores = torch.matmul(rows, keys.transpose(-1, -2)) * (D ** -0.5)      # [B, H_kv, group*T, S]
    blocked = ~mask.expand(B, group, T, mask.shape[-1]).reshape(B, 1, group * T, mask.shape[-1])
    probs = torch.softmax(scores.masked_fill_(blocked, float("-inf")), dim=-1)
    return torch.matmul(probs, values).reshape(B, H, T, D)


class FeedForward(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.w_gate_up = nn.Linear(config.hidden, 2 * config.ffn, bias=False)
        self.w_down = nn.Linear(config.ffn, config.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.hidden, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cache_index, rotation, mask):
        x = x + self.attention(self.attention_norm(x), cache_index, rotation, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)
        if config.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("rope", torch.empty(0, dtype=torch.complex64), persistent=False)

    def setup_cache(self, batch: int, max_seq: int) -> None:
        """Allocate each layer's KV cache [batch, H_kv, max_seq, D] and the RoPE tables."""
        c = self.config
        if max_seq > c.max_context:
            raise ValueError(f"context {max_seq} is beyond the model's maximum {c.max_context}")
        weight = self.lm_head.weight
        for layer in self.layers:
            shape = (batch, c.kv_heads, max_seq, c.head_dim)
            layer.attention.k_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            layer.attention.v_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.rope = rope_table(c, weight.device)

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,
                logits_from: int = 0, logits_at: Tensor | None = None, exit_layer: int | None = None) -> Tensor:
        """tokens, positions: [B, T]; returns logits [B, T - logits_from, vocab] in fp32.

        mask: [B, 1, T, S] bool (True = may attend), default causal by position over S =
        max(positions) + 1 cache slots; a tree passes its own mask over the new tokens.
        logits_from: skip the LM head for the first tokens (prefill needs only the last).
        logits_at: [B] index of the one token per row whose logits to return ([B, 1, vocab]),
        for ragged prefills padded to a common length.
        exit_layer: run only the first layers, then the final norm and LM head (LayerSkip draft).
        """
        if mask is None:
            mask = causal_mask(positions, int(positions.max()) + 1)
        c = self.config
        B, T = tokens.shape
        rotation = self.rope[positions][:, :, None]   # [B, T, 1, D/2]
        cache_index = positions[:, None, :, None].expand(B, c.kv_heads, T, c.head_dim)
        x = self.embed(tokens)
        for layer in self.layers[:exit_layer]:
            x = layer(x, cache_index, rotation, mask)
        if logits_at is not None:
            x = x[torch.arange(B, device=x.device), logits_at][:, None]
        else:
            x = x[:, logits_from:]
        return self.lm_head(self.norm(x)).float()


def causal_mask(positions: Tensor, slots: int) -> Tensor:
    """[B, 1, T, slots] bool: a query at position p sees cache slots 0..p."""
    keys = torch.arange(slots, device=positions.device)
    return (keys[None, None, None, :] <= positions[:, None, :, None])


def streaming_mask(positions: Tensor, slots: int, sink: int, window: int) -> Tensor:
    """Causal, restricted to the first `sink` slots and the `window` slots up to each query
    (StreamingLLM's KV budget, MagicDec's self-draft)."""
    keys = torch.arange(slots, device=positions.device)[None, None, None, :]
    query = positions[:, None, :, None]
    return (keys <= query) & ((keys < sink) | (keys > query - window))
