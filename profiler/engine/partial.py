"""SpecPV partial verification in the live model: Quest block selection and attention over a
partial KV cache.

A request verifying in partial mode attends, in every layer and per KV head, to
  sink      the first `sink` tokens,
  selected  `budget` tokens in `block`-token blocks chosen by Quest's bound,
  recent    from `window` tokens before the last refresh through the step's new tokens (the
            local window plus every token accepted since the refresh),
instead of its whole context. Block summaries (per-channel key max and min of every complete
block) are taken at each refresh, after a full verification has rewritten the KV of the tokens
accepted under partial attention. A block's score for a step is Quest's upper bound on q.k,
sum_d max(q_d * kmax_d, q_d * kmin_d), averaged over the step's queries and the query heads of
the GQA group; the top budget / block blocks per KV head are read. Only blocks wholly between
the sink and the recent range compete.

The selected positions become an index [M, H_kv, N] into the cache, and attention gathers those
keys and values only: a partial verification reads sink + budget + recent tokens per head, which
is what makes it cheaper, and what the simulator's cost model charges.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from spec_kernels.reference import quest_bound


@dataclass(frozen=True)
class PartialSpec:
    budget: int
    sink: int = 32
    window: int = 128
    block: int = 16
    period: int = 20
    period_unit: str = "tokens"         # tokens accepted since the refresh, or partial steps
    rectify: bool = False

    @property
    def static_tokens(self) -> int:
        """Partial-cache tokens besides the buffer of tokens accepted since the refresh."""
        return self.sink + self.budget + self.window

    @property
    def budget_blocks(self) -> int:
        return self.budget // self.block


@dataclass
class PartialStep:
    """The partial rows of one target forward, shared by every layer."""
    spec: PartialSpec
    rows: Tensor            # [M] batch rows verifying against the partial cache
    window_start: Tensor    # [M] first slot of the recent range (refresh point - window)
    end: Tensor             # [M] one past the row's last query slot
    query_valid: Tensor     # [M, T] bool: real query tokens (not padding)
    selection_s: float = 0.0


def select_kv_index(q: Tensor, k_max: Tensor, k_min: Tensor, step: PartialStep) -> tuple[Tensor, Tensor]:
    """q [M, H, T, D]; k_max, k_min [M, H_kv, n_blocks, D]. Padding queries do not vote.

    Returns (index [M, H_kv, N] cache slots, valid [M, H_kv, N] bool): sink, the top
    budget_blocks blocks by Quest score per KV head, and the recent range up to `end`."""
    spec = step.spec
    M, H, T, D = q.shape
    kv_heads, n_blocks = k_max.shape[1], k_max.shape[2]
    bound = quest_bound(q, k_max, k_min)                                     # [M, H_kv, group*T, n_blocks]
    votes = step.query_valid[:, None, None, :].expand(M, 1, H // kv_heads, T).reshape(M, 1, -1, 1).to(bound.dtype)
    scores = (bound * votes).sum(dim=2) / votes.sum(dim=2)                   # [M, H_kv, n_blocks]
    first = -(-spec.sink // spec.block)                                      # first block past the sink
    block_ids = torch.arange(n_blocks, device=q.device)
    eligible = (block_ids[None, :] >= first) & ((block_ids[None, :] + 1) * spec.block <= step.window_start[:, None])
    scores = scores.masked_fill(~eligible[:, None, :], float("-inf"))
    top = min(spec.budget_blocks, n_blocks)
    best_scores, best = scores.topk(top, dim=-1) if top else (scores[..., :0], scores[..., :0].long())
    offsets = torch.arange(spec.block, device=q.device)
    selected = (best[..., None] * spec.block + offsets).flatten(-2)            # [M, H_kv, top*block]
    selected_valid = torch.isfinite(best_scores)[..., None].expand(*best.shape, spec.block).flatten(-2)
    sink = torch.arange(spec.sink, device=q.device).expand(M, kv_heads, spec.sink)
    recent_len = step.end - step.window_start
    recent = step.window_start[:, None] + torch.arange(int(recent_len.max()), device=q.device)
    recent_valid = recent < step.end[:, None]
    recent = torch.where(recent_valid, recent, 0)[:, None].expand(M, kv_heads, -1)
    index = torch.cat([sink, torch.where(selected_valid, selected, 0), recent], dim=-1)
    valid = torch.cat([torch.ones_like(sink, dtype=torch.bool), selected_valid,
                       recent_valid[:, None].expand(M, kv_heads, -1)], dim=-1)
    return index, valid


def attend_partial(q: Tensor, k_cache: Tensor, v_cache: Tensor, mask: Tensor, step: PartialStep,
                   k_max: Tensor, k_min: Tensor, attend) -> Tensor:
    """Attention of the partial rows: q [M, H, T, D]; caches [B, H_kv, S_max, D]; mask
    [M, 1, T, S] (causal or tree, over slots). Gathers the selected keys and values and attends
    them with `attend` (q, keys, values, mask [M, H_kv, T, N]) -> [M, H, T, D]."""
    t0 = time.perf_counter()
    index, valid = select_kv_index(q, k_max, k_min, step)
    step.selection_s += time.perf_counter() - t0
    return attend_selected(q, k_cache, v_cache, mask, step.rows, index, valid, attend)


def attend_selected(q: Tensor, k_cache: Tensor, v_cache: Tensor, mask: Tensor, rows: Tensor, index: Tensor,
                    valid: Tensor, attend) -> Tensor:
    """Gather the selected keys and values (index, valid [M, H_kv, N]) of cache rows `rows` [M]
    and attend them: the partial rows' attention once their blocks are chosen."""
    M, kv_heads, N = index.shape
    heads = torch.arange(kv_heads, device=q.device)[None, :, None]
    keys, values = k_cache[rows[:, None, None], heads, index], v_cache[rows[:, None, None], heads, index]
    T, S = mask.shape[2], mask.shape[3]
    seen = mask.expand(M, kv_heads, T, S).gather(3, index.clamp_max(S - 1)[:, :, None, :].expand(M, kv_heads, T, N))
    return attend(q, keys, values, seen & valid[:, :, None, :])
