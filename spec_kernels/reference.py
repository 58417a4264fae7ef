"""Plain-torch references of the kernels: the same signatures, the definitions the Triton code is
tested against, and what runs on the CPU.

Attention semantics, shared with `spec_kernels.attention`:
  q [B, Hq, Q, D]            queries of each request's Q newest tokens
  k_cache, v_cache [B, Hkv, S, D], Hq a multiple of Hkv (query head h reads KV head h // group)
  kv_lens [B]                valid cache length including the Q new tokens, which sit at
                             positions kv_lens[b] - Q .. kv_lens[b] - 1
  tree_mask [B, Q, Q] bool   new token i may attend new token j (default: causal, j <= i)
  kv_index [B, Hkv, N] int   prefix positions to read per KV head (default: the whole prefix),
  kv_index_lens [B]          valid up to kv_index_lens[b]; entries past it are ignored
Every query attends its prefix positions and the new tokens its mask allows; softmax and
accumulation in fp32 (float64 inputs stay float64); the output has q's dtype.
"""
from __future__ import annotations

import torch
from torch import Tensor


def prefix_index(k_cache: Tensor, kv_lens: Tensor, Q: int, kv_index: Tensor | None,
                 kv_index_lens: Tensor | None) -> tuple[Tensor, Tensor]:
    """(index [B, Hkv, N] long, valid [B, Hkv, N] bool): the prefix positions each KV head reads."""
    B, Hkv = k_cache.shape[:2]
    device = k_cache.device
    if kv_index is None:
        prefix = (kv_lens.to(device).long() - Q)
        N = max(int(prefix.max()), 0)
        index = torch.arange(N, device=device).expand(B, Hkv, N)
        valid = index < prefix[:, None, None]
    else:
        N = kv_index.shape[-1]
        lens = kv_index_lens.to(device).long()
        valid = torch.arange(N, device=device)[None, None, :] < lens[:, None, None]
        valid = valid.expand(B, Hkv, N)
        index = kv_index.long()
    return torch.where(valid, index, 0), valid


def attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, kv_lens: Tensor, *, tree_mask: Tensor | None = None,
              kv_index: Tensor | None = None, kv_index_lens: Tensor | None = None,
              sm_scale: float | None = None) -> Tensor:
    B, Hq, Q, D = q.shape
    Hkv = k_cache.shape[1]
    group = Hq // Hkv
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = sm_scale if sm_scale is not None else D ** -0.5
    index, valid = prefix_index(k_cache, kv_lens, Q, kv_index, kv_index_lens)
    rows = torch.arange(B, device=q.device)[:, None, None]
    heads = torch.arange(Hkv, device=q.device)[None, :, None]
    # The new tokens' keys and values: positions kv_lens - Q .. kv_lens - 1.
    new_positions = (kv_lens.to(q.device).long()[:, None] - Q + torch.arange(Q, device=q.device))[:, None, :]
    keys = torch.cat([k_cache[rows, heads, index], k_cache[rows, heads, new_positions.expand(B, Hkv, Q)]], dim=2)
    values = torch.cat([v_cache[rows, heads, index], v_cache[rows, heads, new_positions.expand(B, Hkv, Q)]], dim=2)
    if tree_mask is None:
        tree_mask = torch.ones(Q, Q, dtype=torch.bool, device=q.device).tril().expand(B, Q, Q)
    tree_mask = tree_mask | torch.eye(Q, dtype=torch.bool, device=q.device)
    allowed = torch.cat([valid[:, :, None, :].expand(B, Hkv, Q, valid.shape[-1]),
                         tree_mask[:, None].expand(B, Hkv, Q, Q)], dim=-1)                 # [B, Hkv, Q, N + Q]
    rows_q = q.to(compute).reshape(B, Hkv, group * Q, D)            # query heads of a group packed as rows
    scores = rows_q @ keys.to(compute).transpose(-1, -2) * scale                           # [B, Hkv, group*Q, N+Q]
    allowed = allowed[:, :, None].expand(B, Hkv, group, Q, allowed.shape[-1]).reshape(scores.shape)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return (probs @ values.to(compute)).reshape(B, Hq, Q, D).to(q.dtype)


def block_summaries(k_cache: Tensor, kv_lens: Tensor, block: int = 16) -> tuple[Tensor, Tensor]:
    """Per-channel key max and min of every complete block below each request's length:
    (k_max, k_min) [B, Hkv, n_blocks, D] with n_blocks = max(kv_lens) // block; blocks at or past a
    request's own length are zero."""
    B, Hkv, S, D = k_cache.shape
    n_blocks = int(kv_lens.max()) // block
    blocks = k_cache[:, :, :n_blocks * block].reshape(B, Hkv, n_blocks, block, D)
    complete = (torch.arange(n_blocks, device=k_cache.device)[None, :] + 1) * block <= kv_lens.to(k_cache.device)[:, None]
    keep = complete[:, None, :, None]
    return blocks.amax(dim=3) * keep, blocks.amin(dim=3) * keep


def quest_bound(q: Tensor, k_max: Tensor, k_min: Tensor) -> Tensor:
    """Quest's upper bound on q.k over each block, sum_d max(q_d kmax_d, q_d kmin_d), for every
    query row: q [B, Hq, Q, D] -> [B, Hkv, group * Q, n_blocks] (row = head_in_group * Q + token),
    in fp32 (float64 stays float64)."""
    B, Hq, Q, D = q.shape
    Hkv = k_max.shape[1]
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    rows = q.to(compute).reshape(B, Hkv, (Hq // Hkv) * Q, D)
    # Per channel: q_d * kmax_d where q_d > 0, q_d * kmin_d where q_d < 0.
    return rows.clamp_min(0) @ k_max.to(compute).transpose(-1, -2) + rows.clamp_max(0) @ k_min.to(compute).transpose(-1, -2)


def block_scores(q: Tensor, k_max: Tensor, k_min: Tensor, reduce: str = "mean") -> Tensor:
    """Quest's bound per block, reduced ("mean" or "max") over the queries and the query heads of
    each GQA group: [B, Hkv, n_blocks]."""
    bound = quest_bound(q, k_max, k_min)
    return bound.mean(dim=2) if reduce == "mean" else bound.amax(dim=2)


def select_blocks(q: Tensor, k_max: Tensor, k_min: Tensor, budget_blocks: int, *, sink_tokens: int,
                  window_tokens: int, kv_lens: Tensor, block: int = 16, reduce: str = "mean") -> tuple[Tensor, Tensor]:
    """The partial KV of SpecPV for `attention`: per KV head the sink, the top `budget_blocks`
    blocks by Quest score among those wholly between the sink and the window, and the window (the
    `window_tokens` positions before the Q new tokens). Returns (kv_index [B, Hkv, N] int32,
    ascending, padded with 0 past kv_index_lens; kv_index_lens [B] int32), N = sink + budget + window."""
    scores = block_scores(q, k_max, k_min, reduce)
    return assemble_index(scores, budget_blocks, sink_tokens, window_tokens, kv_lens.to(q.device).long() - q.shape[2],
                          block)


def assemble_index(scores: Tensor, budget_blocks: int, sink_tokens: int, window_tokens: int, prefix: Tensor,
                   block: int) -> tuple[Tensor, Tensor]:
    """Top-k eligible blocks per KV head from scores [B, Hkv, n_blocks], then the index: sink,
    the chosen blocks in ascending order, the window; every head of a request gets as many."""
    B, Hkv, n_blocks = scores.shape
    device = scores.device
    window_start = (prefix - window_tokens).clamp_min(0)
    sink_end = torch.minimum(torch.full_like(prefix, sink_tokens), window_start)
    ids = torch.arange(n_blocks, device=device)
    eligible = (ids[None, :] * block >= sink_end[:, None]) & ((ids[None, :] + 1) * block <= window_start[:, None])
    scores = scores.float().masked_fill(~eligible[:, None, :], float("-inf"))
    top = min(budget_blocks, n_blocks)
    best_scores, best = scores.topk(top, dim=-1) if top else (scores[..., :0], scores[..., :0].long())
    count = torch.isfinite(best_scores[:, 0]).sum(-1) if top else torch.zeros(B, dtype=torch.long, device=device)
    # Unpicked slots sort to the end; the first count[b] are the chosen blocks, ascending.
    chosen = torch.where(torch.isfinite(best_scores), best, n_blocks).sort(dim=-1).values
    N = sink_tokens + budget_blocks * block + window_tokens
    j = torch.arange(N, device=device)[None, None, :]
    s_end = sink_end[:, None, None]
    sel_end = s_end + count[:, None, None] * block
    lens = sel_end[:, 0, 0] + (prefix - window_start)
    in_blocks = (j >= s_end) & (j < sel_end)
    which = ((j - s_end).clamp(0) // block).clamp_max(max(top - 1, 0))
    block_pos = chosen.gather(-1, which.expand(B, Hkv, N)) * block + (j - s_end).clamp(0) % block if top else j
    index = torch.where(j < s_end, j, torch.where(in_blocks, block_pos, window_start[:, None, None] + (j - sel_end)))
    index = torch.where(j < lens[:, None, None], index, 0).expand(B, Hkv, N)
    return index.to(torch.int32).contiguous(), lens.to(torch.int32)


def quantize(w: Tensor, bits: int = 4, group_size: int = 64) -> dict:
    """Weight-only asymmetric quantization of w [out, in] in groups of `group_size` input columns.
    int4 codes are packed two per byte along the input dimension (low nibble first)."""
    out_features, in_features = w.shape
    if in_features % group_size:
        raise ValueError(f"input width {in_features} is not a multiple of group_size {group_size}")
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8 (got {bits})")
    levels = 2 ** bits - 1
    groups = w.float().reshape(out_features, in_features // group_size, group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / levels).clamp_min(1e-12)
    codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, levels).to(torch.uint8)
    codes = codes.reshape(out_features, in_features)
    if bits == 4:
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return {"codes": codes.contiguous(), "scale": scale.contiguous(), "zero": low.contiguous(), "bits": bits,
            "group_size": group_size, "in_features": in_features}


def dequantize(packed: dict) -> Tensor:
    codes = packed["codes"]
    if packed["bits"] == 4:
        codes = torch.stack([codes & 0xF, codes >> 4], dim=-1).reshape(codes.shape[0], -1)
    groups = codes.float().reshape(codes.shape[0], packed["scale"].shape[1], packed["group_size"])
    return (groups * packed["scale"][..., None] + packed["zero"][..., None]).reshape(codes.shape[0], -1)


def quant_matmul(x: Tensor, packed: dict) -> Tensor:
    """x [..., in] @ dequantize(packed).T -> [..., out], accumulated in fp32, in x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (x.to(compute) @ dequantize(packed).to(compute).T).to(x.dtype)
