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

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spec_kernels.reference import block_summaries
from profiler.engine.partial import PartialStep, attend_partial, select_kv_index
from sim.scenario.presets.models import ModelSpec


@dataclass(frozen=True)
class LlamaConfig(ModelSpec):
    """The simulator's model shape (sim.scenario.presets.ModelSpec: a live run and its scenario share it)
    plus what running the model needs besides."""
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


@dataclass
class KernelLayout:
    """A verification step in the form spec_kernels.attention takes, used on CUDA: each row's T new
    tokens sit at slots kv_lens - T .. kv_lens - 1, and tree_mask says which of them each sees."""
    kv_lens: Tensor            # [B] int32
    tree_mask: Tensor          # [B, T, T] bool


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
        self.block_max: Tensor | None = None  # SpecPV block summaries [B, H_kv, n_blocks, D]
        self.block_min: Tensor | None = None

    def forward(self, x: Tensor, cache_index: Tensor, rotation: Tensor, mask: Tensor,
                partial: PartialStep | None = None, kernel: KernelLayout | None = None, first_row: int = 0) -> Tensor:
        # x: [B, T, hidden]; cache_index: [B, H_kv, T, D] cache slots of the new tokens;
        # rotation: [B, T, 1, D/2]; mask: [B, 1, T, S] bool over cache slots, True = may attend;
        # first_row: the cache row of x's first row (a served request's prefill chunk in its own row)
        B, T, _ = x.shape
        qkv = self.wqkv(x).view(B, T, self.heads + 2 * self.kv_heads, self.head_dim)
        qk = apply_rope(qkv[:, :, :self.heads + self.kv_heads], rotation).transpose(1, 2)
        q, k = qk.split([self.heads, self.kv_heads], dim=1)
        v = qkv[:, :, self.heads + self.kv_heads:].transpose(1, 2)
        # Write the new K/V at each request's own slots (a slice of rows is a view of the cache).
        self.k_cache[first_row:first_row + B].scatter_(2, cache_index, k)
        self.v_cache[first_row:first_row + B].scatter_(2, cache_index, v)
        if first_row and (kernel is not None or partial is not None):
            raise ValueError("a forward from another cache row than the first takes no kernel layout or partial step")
        if kernel is not None:
            out = self.attend_kernel(q, kernel, partial)
        elif partial is None:
            out = self.attend_full(q, mask, first_row=first_row)
        else:
            # SpecPV: the partial rows read sink + selected blocks + recent tokens; the others all.
            out = torch.empty_like(q)
            whole = torch.ones(B, dtype=torch.bool, device=x.device)
            whole[partial.rows] = False
            if whole.any():
                out[whole] = self.attend_full(q[whole], mask[whole], whole.nonzero()[:, 0])
            out[partial.rows] = attend_partial(q[partial.rows], self.k_cache, self.v_cache, mask[partial.rows],
                                               partial, self.block_max[partial.rows], self.block_min[partial.rows],
                                               attend_small_query)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))

    def attend_kernel(self, q: Tensor, kernel: KernelLayout, partial: PartialStep | None) -> Tensor:
        """The Triton kernel (spec_kernels.attention): the whole prefix, or for SpecPV's partial rows the
        selected positions (sink + blocks + recent tokens before the new ones)."""
        import spec_kernels

        B, T = q.shape[0], q.shape[2]
        caches = self.k_cache[:B], self.v_cache[:B]
        if partial is None:
            return spec_kernels.attention(q, *caches, kernel.kv_lens, tree_mask=kernel.tree_mask)
        t0 = time.perf_counter()
        new_start = kernel.kv_lens.long() - T
        index_p, valid_p = select_kv_index(q[partial.rows], self.block_max[partial.rows],
                                           self.block_min[partial.rows], partial)
        valid_p &= index_p < new_start[partial.rows][:, None, None]          # the new tokens come as new
        whole = torch.ones(B, dtype=torch.bool, device=q.device)
        whole[partial.rows] = False
        N = max(index_p.shape[-1], int(new_start[whole].max()) if whole.any() else 0)
        positions = torch.arange(N, device=q.device).expand(B, self.kv_heads, N)
        index = positions.clone()
        valid = positions < new_start[:, None, None]
        index[partial.rows, :, :index_p.shape[-1]] = index_p
        valid[partial.rows] = False
        valid[partial.rows, :, :index_p.shape[-1]] = valid_p
        # The kernel reads the first kv_index_lens entries: put each row's valid ones first.
        order = torch.sort((~valid).to(torch.int8), dim=-1, stable=True).indices
        index = index.gather(-1, order).to(torch.int32)
        lens = valid[:, 0].sum(-1).to(torch.int32)
        partial.selection_s += time.perf_counter() - t0
        return spec_kernels.attention(q, *caches, kernel.kv_lens, tree_mask=kernel.tree_mask, kv_index=index,
                                 kv_index_lens=lens)

    def attend_full(self, q: Tensor, mask: Tensor | None, rows: Tensor | None = None, first_row: int = 0) -> Tensor:
        """Attention over every slot the mask allows; `rows`: the cache rows of q's rows (default
        the B rows from `first_row`). mask None: q [B, H, T, D] are prompts from slot 0, causal
        over T slots."""
        B, T = q.shape[0], q.shape[2]
        S = T if mask is None else mask.shape[-1]
        keys, values = (cache[first_row:first_row + B, :, :S] for cache in (self.k_cache, self.v_cache))
        if rows is not None:
            keys, values = self.k_cache[:, :, :S][rows], self.v_cache[:, :, :S][rows]
        if T <= SMALL_QUERY:
            if mask is None:
                mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()[None, None]
            return attend_small_query(q, keys, values, mask)
        if mask is None:
            # SDPA's causal kernel skips the masked half and never builds the T x T mask: a 6,144-token
            # prompt prefills in 25 s on a 2-core CPU against 46 s masked (benchmarks/bench_prefill.py).
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=self.heads != self.kv_heads)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)

    def refresh_summaries(self, rows: Tensor, lengths: Tensor, block: int) -> None:
        """SpecPV: per-block key max/min of the cache of `rows` [M] below `lengths` [M]."""
        B, H, S, D = self.k_cache.shape
        if self.block_max is None or self.block_max.shape[2] != S // block:
            self.block_max = self.k_cache.new_zeros(B, H, S // block, D)
            self.block_min = self.k_cache.new_zeros(B, H, S // block, D)
        below = int(lengths.max()) // block * block
        # Blocks at or past a row's own refresh point come back zero; selection never reaches them.
        k_max, k_min = block_summaries(self.k_cache[:, :, :below][rows], lengths, block)
        n_blocks = k_max.shape[2]
        self.block_max[rows, :, :n_blocks] = k_max
        self.block_min[rows, :, :n_blocks] = k_min


# Up to this many new tokens per request (decode, chain and small-tree verification), attention is
# two small matmuls with the GQA group folded into the query rows: on CPU that is several times
# cheaper than SDPA's dispatch for a 1-token query. Longer queries (prefill) use SDPA.
SMALL_QUERY = 64


def attend_small_query(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """q: [B, H, T, D]; keys, values: [B, H_kv, S, D]; mask: [B, 1 or H_kv, T, S] bool -> [B, H, T, D]."""
    B, H, T, D = q.shape
    kv_heads = keys.shape[1]
    group = H // kv_heads
    # Query heads j*group .. j*group+group-1 share KV head j: fold them into rows of one matmul.
    rows = q.reshape(B, kv_heads, group * T, D)
    scores = torch.matmul(rows, keys.transpose(-1, -2)) * (D ** -0.5)      # [B, H_kv, group*T, S]
    S, mask_heads = mask.shape[-1], mask.shape[1]
    blocked = ~mask[:, :, None].expand(B, mask_heads, group, T, S).reshape(B, mask_heads, group * T, S)
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

    def forward(self, x, cache_index, rotation, mask, partial=None, kernel=None, first_row=0):
        x = x + self.attention(self.attention_norm(x), cache_index, rotation, mask, partial, kernel, first_row)
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
        # An EAGLE drafter reads the target's last hidden states: with keep_hidden, every forward
        # leaves them, [B, T, hidden] before the final norm, in kept_hidden.
        self.keep_hidden = False
        self.kept_hidden: Tensor | None = None
        # Captured CUDA graphs of this model's forwards (profiler.engine.graphs), when on.
        self.step_graphs = None

    def setup_cache(self, batch: int, max_seq: int) -> None:
        """Allocate each layer's KV cache [batch, H_kv, max_seq, D] and the RoPE tables."""
        c = self.config
        if max_seq > c.max_context:
            raise ValueError(f"context {max_seq} is beyond the model's maximum {c.max_context}")
        weight = self.lm_head.weight
        if self.step_graphs is not None and self._cache_holds(batch, max_seq):
            # Captured graphs write this cache: keep it (stale K/V past each request's position is
            # never read, and every slot below it is written before it is read).
            for layer in self.layers:
                layer.attention.block_max = layer.attention.block_min = None
            return
        if self.step_graphs is not None:
            self.step_graphs.drop()           # bound to the cache about to go
        for layer in self.layers:
            shape = (batch, c.kv_heads, max_seq, c.head_dim)
            layer.attention.k_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            layer.attention.v_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.rope = rope_table(c, weight.device)
        for layer in self.layers:
            layer.attention.block_max = layer.attention.block_min = None

    def _cache_holds(self, batch: int, max_seq: int) -> bool:
        """Whether the current cache is exactly [batch, H_kv, max_seq, D] in the weights' dtype and
        device (a longer one would change the attention kernel's splits, and so its time)."""
        k, weight = self.layers[0].attention.k_cache, self.lm_head.weight
        return (k is not None and k.shape[0] == batch and k.shape[2] == max_seq and k.dtype == weight.dtype
                and k.device == weight.device)

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None, slots: Tensor | None = None,
                logits_from: int = 0, logits_at: Tensor | None = None, exit_layer: int | None = None,
                partial: PartialStep | None = None, kernel: KernelLayout | None = None, prompt: bool = False,
                first_row: int = 0) -> Tensor:
        """tokens, positions: [B, T]; returns logits [B, T - logits_from, vocab] in fp32.

        slots: [B, T] cache slots the new K/V go to (default: the positions; a tree's nodes share
        positions, so they take distinct slots). mask: [B, 1, T, S] bool over cache slots (True =
        may attend), default causal by position over S = max(positions) + 1 slots.
        logits_from: skip the LM head for the first tokens (prefill needs only the last).
        logits_at: [B] or [B, L] indices of the tokens per row whose logits to return
        ([B, 1 or L, vocab]), for ragged inputs padded to a common length.
        exit_layer: run only the first layers, then the final norm and LM head (LayerSkip draft).
        partial: SpecPV rows attending a partial KV cache (profiler.engine.partial).
        kernel: the same step for spec_kernels.attention, which replaces the torch attention on CUDA.
        prompt: each row's tokens are its prompt at positions and slots 0.. (a shorter prompt padded
        at the end, the padding's K/V sent past the first T slots): attention is causal over the
        first T slots, with no mask (SDPA's causal kernel). A padding query sees slots that are not
        its own; its output reaches only its own K/V, which no real query reads.
        first_row: the rows are cache rows first_row.. (default 0..B-1): a served request prefills
        its prompt in its own row while the rows below it decode.
        """
        x = self.hidden_states(tokens, positions, mask, slots, exit_layer, partial, kernel, prompt, first_row)
        return self.logits(x, logits_from, logits_at)

    def hidden_states(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None, slots: Tensor | None = None,
                      exit_layer: int | None = None, partial: PartialStep | None = None,
                      kernel: KernelLayout | None = None, prompt: bool = False, first_row: int = 0) -> Tensor:
        """The decoder layers of `forward` (its arguments): [B, T, hidden], before the final norm,
        also left in kept_hidden with keep_hidden. What a CUDA graph captures (profiler.engine.graphs);
        `logits` then runs eagerly, as vLLM computes logits outside its graphs."""
        if prompt and (mask is not None or kernel is not None or partial is not None):
            raise ValueError("a prompt forward takes no mask, kernel layout or partial step")
        # The kernel takes its layout, not a mask: building the default one would read positions back.
        x, cache_index, rotation, mask = self.embed_inputs(tokens, positions, mask, slots,
                                                           causal=not prompt and kernel is None)
        for layer in self.layers[:exit_layer]:
            x = layer(x, cache_index, rotation, mask, partial, kernel, first_row)
        if self.keep_hidden:
            self.kept_hidden = x
        return x

    def logits(self, x: Tensor, logits_from: int = 0, logits_at: Tensor | None = None) -> Tensor:
        """fp32 logits [B, L, vocab] of hidden states x [B, T, hidden] (`forward`'s logits_from, logits_at)."""
        if logits_at is not None:
            at = logits_at if logits_at.dim() == 2 else logits_at[:, None]
            x = x[torch.arange(x.shape[0], device=x.device)[:, None], at]
        else:
            x = x[:, logits_from:]
        return fp32_logits(self.norm(x), self.lm_head.weight)

    def last_hidden(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """[B, T, hidden]: the last decoder layer's output (before the final norm) of prompt
        forwards (tokens, positions: [B, T], each row its prompt from position 0): what an EAGLE
        head reads."""
        x, cache_index, rotation, mask = self.embed_inputs(tokens, positions, causal=False)
        for layer in self.layers:
            x = layer(x, cache_index, rotation, mask)
        return x

    def embed_inputs(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,
                     slots: Tensor | None = None, causal: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """What every layer of a forward shares: the embedded tokens [B, T, hidden], the cache
        index of the new K/V [B, H_kv, T, D], the rotations [B, T, 1, D/2], and the mask (default
        causal by position over max(positions) + 1 slots; None for a prompt forward, causal=False)."""
        if mask is None and causal:
            mask = causal_mask(positions, int(positions.max()) + 1)
        if slots is None:
            slots = positions
        c = self.config
        B, T = tokens.shape
        rotation = self.rope[positions][:, :, None]
        cache_index = slots[:, None, :, None].expand(B, c.kv_heads, T, c.head_dim)
        return self.embed(tokens), cache_index, rotation, mask

    def move_kv(self, rows: Tensor, source: Tensor, target: Tensor) -> None:
        """Copy each layer's K/V at slots `source` to slots `target` (rows, source, target: [M]);
        after a tree verification, the accepted path's nodes move to consecutive positions."""
        for layer in self.layers:
            for cache in (layer.attention.k_cache, layer.attention.v_cache):
                cache[rows, :, target] = cache[rows, :, source]

    def swap_rows(self, a: int, b: int, length: int) -> None:
        """Exchange cache rows a and b's first `length` slots (and SpecPV block summaries) in every
        layer, in place: a served request moves into the decoding rows 0..n-1 when its prefill
        ends, and the last decoding row fills the place of a request that leaves."""
        if a == b:
            return
        for layer in self.layers:
            att = layer.attention
            caches = [att.k_cache[:, :, :length], att.v_cache[:, :, :length]]
            if att.block_max is not None:
                caches += [att.block_max, att.block_min]
            for cache in caches:
                cache[[a, b]] = cache[[b, a]]

    def keep_rows(self, rows: Tensor) -> None:
        """Drop finished requests from the batch: keep cache rows `rows` [M], in that order."""
        for layer in self.layers:
            a = layer.attention
            a.k_cache, a.v_cache = a.k_cache[rows], a.v_cache[rows]
            if a.block_max is not None:
                a.block_max, a.block_min = a.block_max[rows], a.block_min[rows]

    def refresh_summaries(self, rows: Tensor, lengths: Tensor, block: int) -> None:
        """SpecPV: take every layer's block summaries for `rows` [M] at refresh points `lengths` [M]."""
        for layer in self.layers:
            layer.attention.refresh_summaries(rows, lengths, block)


def fp32_logits(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., hidden] @ weight [vocab, hidden].T in fp32: a 16-bit LM head's products accumulated
    and returned in fp32, never rounded to 16 bits. Rounded, the top logits of a 128K vocabulary lie
    on a grid about 0.03 apart against a mean top-1/top-2 gap of about 0.26 (a random 8B), so one
    token in ten or so is a tie that the accumulation order of another GEMM tiling breaks the other
    way: a decode and a verification of the same token would choose differently. On CUDA cuBLAS
    writes fp32 from 16-bit inputs at the 16-bit GEMM's speed (torch.mm's out_dtype); the CPU has no
    such kernel and multiplies by an fp32 copy of the weight, made once while the weight is unchanged
    (its version), kept on the weight."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.linear(x, weight)
    if x.is_cuda:
        out = torch.mm(x.reshape(-1, x.shape[-1]), weight.t(), out_dtype=torch.float32)
        return out.reshape(*x.shape[:-1], weight.shape[0])
    copy = getattr(weight, "fp32_copy", None)
    if copy is None or copy[0] != weight._version:
        copy = weight.fp32_copy = (weight._version, weight.detach().float())
    return F.linear(x.float(), copy[1])


def causal_mask(positions: Tensor, slots: int) -> Tensor:
    """[B, 1, T, slots] bool: a query at position p sees cache slots 0..p."""
    keys = torch.arange(slots, device=positions.device)
    return (keys[None, None, None, :] <= positions[:, None, :, None])


def context_mask(context_end: Tensor, query_positions: Tensor, slots: int, sink: int | None = None,
                 window: int | None = None) -> Tensor:
    """[B, 1, T, slots] bool: query t of row b sees the cache slots 0..context_end[b, t]; with a
    sink and window, only the first `sink` of them and those within `window` of the query's
    position. Tree edges among new tokens are added by `add_tree_edges`."""
    keys = torch.arange(slots, device=context_end.device)[None, None, :]
    mask = keys <= context_end[:, :, None]
    if window is not None:
        mask &= (keys < sink) | (keys > query_positions[:, :, None] - window)
    return mask[:, None]


def add_tree_edges(mask: Tensor, query_rows: Tensor, key_slots: Tensor, allowed: Tensor) -> Tensor:
    """Let query `query_rows[b, i]` of row b see cache slot `key_slots[b, j]` where allowed[i, j]:
    mask [B, 1, T, S]; query_rows [B, n]; key_slots [B, m]; allowed [n, m] bool."""
    b = torch.arange(mask.shape[0], device=mask.device)[:, None, None]
    rows, keys = query_rows[:, :, None], key_slots[:, None, :]
    mask[b, 0, rows, keys] |= allowed.to(mask.device)
    return mask
