"""One Triton attention kernel for decode, chain and tree verification, and partial verification.

Semantics: spec_kernels/reference.py. The program for (request b, KV head h, split s) packs the
query heads of h's GQA group into the rows of one tile (row = head_in_group * Q + token), so each
KV tile is read once per group. Its keys are a virtual list: first the prefix positions the
request reads (all of them, or kv_index[b, h, :kv_index_lens[b]]), then the Q new tokens at
kv_lens[b] - Q ..; split s takes one contiguous part of that list. Prefix entries are visible to
every query; new token j is visible to query i where the tree mask (default causal) allows.
Each split keeps an online softmax (running max m, normalizer l, accumulator) in fp32 and writes
them out; a second kernel's log-sum-exp combine over the splits gives the output. Long contexts use
more splits, so a batch of a few requests still fills the GPU. A program takes at most 64 rows
(a third grid axis tiles longer verifies): more would not fit an H200's shared memory.

The host side is two launches and no wait on the GPU: on an H200 the earlier wrapper's twenty or so
eager PyTorch launches and a read-back of kv_lens cost 470-780 us a call, several times the
kernel (docs/performance.md). What changes from step to step is a runtime argument Triton does not
specialise on (SPLIT_RUNTIME_INTS, COMBINE_RUNTIME_INTS: the query length, split count, padding, and
the strides that follow the query length or a partial index's length), so a kernel compiles once per (dtype, GQA group,
head dim, row tile, tree, index): `warm_up` compiles all of them before anything is timed, and a
SpecPV re-feed of 26-31 tokens or an index whose length changes every step compiles nothing
(spec_kernels/variants.py counts what a launch would compile).

Written for triton 3.6-3.9 and its CPU interpreter: pointer arithmetic only (no block pointers),
every load of the caller's tensors masked, fp32 dots in IEEE precision (TF32 would miss the 1e-5
tolerance).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from spec_kernels.variants import KernelVariants

# Integers that vary from step to step (see the module docstring): never specialised.
SPLIT_RUNTIME_INTS = ("q_len", "splits", "rows_padded", "stride_qb", "stride_qh", "stride_qq", "stride_tb", "stride_ti",
                      "stride_ib", "stride_ih")
COMBINE_RUNTIME_INTS = ("q_len", "splits", "rows_padded", "stride_ob", "stride_oh", "stride_oq")


@triton.jit(do_not_specialize=SPLIT_RUNTIME_INTS)
def _split_attention(
    Q, K, V, KV_LENS, TREE, KV_INDEX, KV_INDEX_LENS, ACC, M_OUT, L_OUT,
    stride_qb, stride_qh, stride_qq, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_tb, stride_ti, stride_tj,
    stride_ib, stride_ih, stride_in,
    kv_heads, sm_scale, splits, rows_padded, q_len,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_TREE: tl.constexpr, HAS_INDEX: tl.constexpr, PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    row_block = tl.program_id(2)
    b = (pid // kv_heads).to(tl.int64)
    h = (pid % kv_heads).to(tl.int64)
    kv_len = tl.load(KV_LENS + b).to(tl.int64)
    prefix = kv_len - q_len
    if HAS_INDEX:
        n_prefix = tl.load(KV_INDEX_LENS + b).to(tl.int64)
    else:
        n_prefix = prefix
    total = n_prefix + q_len
    per_split = (total + splits - 1) // splits
    start = split * per_split
    end = tl.minimum(start + per_split, total)

    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < GROUP * q_len
    head = h * GROUP + rows // q_len                     # the query head of each row
    token = rows % q_len                                 # and its new token
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    q = tl.load(Q + b * stride_qb + head[:, None] * stride_qh + token[:, None] * stride_qq + dims[None, :] * stride_qd,
                mask=row_valid[:, None] & dim_valid[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        entries = n0 + tl.arange(0, BLOCK_N)
        in_range = entries < end
        is_prefix = entries < n_prefix
        new_j = entries - n_prefix
        if HAS_INDEX:
            indexed = tl.load(KV_INDEX + b * stride_ib + h * stride_ih + entries * stride_in,
                              mask=in_range & is_prefix, other=0).to(tl.int64)
            position = tl.where(is_prefix, indexed, prefix + new_j)
        else:
            position = entries
        position = tl.where(in_range, position, 0)
        k = tl.load(K + b * stride_kb + h * stride_kh + position[:, None] * stride_ks + dims[None, :] * stride_kd,
                    mask=in_range[:, None] & dim_valid[None, :], other=0.0)
        v = tl.load(V + b * stride_vb + h * stride_vh + position[:, None] * stride_vs + dims[None, :] * stride_vd,
                    mask=in_range[:, None] & dim_valid[None, :], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale          # [BLOCK_M, BLOCK_N]
        is_new = in_range & (entries >= n_prefix)
        if HAS_TREE:
            tree = tl.load(TREE + b * stride_tb + token[:, None] * stride_ti + new_j[None, :] * stride_tj,
                           mask=row_valid[:, None] & is_new[None, :], other=0)
            new_ok = (tree != 0) | (new_j[None, :] == token[:, None])
        else:
            new_ok = new_j[None, :] <= token[:, None]
        allowed = row_valid[:, None] & in_range[None, :] & (is_prefix[None, :] | new_ok)
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)        # a row with nothing visible yet
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    # Partial results [B * Hkv, splits, rows_padded, BLOCK_D] (+ m, l [.., rows_padded]), contiguous;
    # every program writes its whole tile, padding rows included, so the scratch needs no fill.
    base = (pid.to(tl.int64) * splits + split) * rows_padded      # int64: large scratch tiles
    tl.store(ACC + (base + rows[:, None]) * BLOCK_D + dims[None, :], acc)
    tl.store(M_OUT + base + rows, m_i)
    tl.store(L_OUT + base + rows, l_i)


@triton.jit(do_not_specialize=COMBINE_RUNTIME_INTS)
def _combine_splits(
    ACC, M, L, OUT, stride_ob, stride_oh, stride_oq, stride_od, kv_heads, splits, rows_padded, q_len,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Log-sum-exp combine of one (request, KV head, row tile)'s split states, written in OUT's dtype."""
    pid = tl.program_id(0)
    row_block = tl.program_id(1)
    b = (pid // kv_heads).to(tl.int64)
    h = (pid % kv_heads).to(tl.int64)
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    m_all = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for s in range(0, splits):
        m_all = tl.maximum(m_all, tl.load(M + (pid.to(tl.int64) * splits + s) * rows_padded + rows))
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)           # padding rows saw nothing
    numerator = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    denominator = tl.zeros([BLOCK_M], dtype=tl.float32)
    for s in range(0, splits):
        at = (pid.to(tl.int64) * splits + s) * rows_padded + rows
        weight = tl.exp(tl.load(M + at) - m_safe)                      # 0 for a split that saw nothing
        numerator += tl.load(ACC + at[:, None] * BLOCK_D + dims[None, :]) * weight[:, None]
        denominator += tl.load(L + at) * weight
    row_valid = rows < GROUP * q_len
    head = h * GROUP + rows // q_len
    token = rows % q_len
    out = numerator / tl.where(row_valid, denominator, 1.0)[:, None]
    tl.store(OUT + b * stride_ob + head[:, None] * stride_oh + token[:, None] * stride_oq + dims[None, :] * stride_od,
             out.to(OUT.dtype.element_ty), mask=row_valid[:, None] & (dims < HEAD_DIM)[None, :])


def splits_for(total_keys: int, programs: int) -> int:
    """More splits for long contexts and few programs: about 132 SMs' worth of programs, each at
    least 256 keys (an H100/H200 has 132)."""
    by_length = max(1, total_keys // 256)
    by_occupancy = max(1, -(-132 // max(programs, 1)))
    return int(min(16, by_length, by_occupancy))


def attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, kv_lens: Tensor, *, tree_mask: Tensor | None = None,
              kv_index: Tensor | None = None, kv_index_lens: Tensor | None = None, sm_scale: float | None = None,
              splits: int | None = None, block_n: int = 64) -> Tensor:
    B, Hq, Q, D = q.shape
    Hkv = k_cache.shape[1]
    group = Hq // Hkv
    if Hq % Hkv:
        raise ValueError(f"query heads {Hq} are not a multiple of KV heads {Hkv}")
    block_m = row_tile(group, Q)
    row_blocks = triton.cdiv(group * Q, block_m)
    rows_padded = row_blocks * block_m
    block_d = max(16, triton.next_power_of_2(D))
    # The cache's length bounds the keys without reading kv_lens back from the GPU (a sync per
    # call); the kernel shares the actual keys among the splits.
    longest = int(kv_index.shape[-1]) + Q if kv_index is not None else int(k_cache.shape[2])
    splits = splits or splits_for(longest, B * Hkv)
    device = q.device
    acc = torch.empty((B * Hkv, splits, rows_padded, block_d), dtype=torch.float32, device=device)
    m = torch.empty((B * Hkv, splits, rows_padded), dtype=torch.float32, device=device)
    l = torch.empty_like(m)
    kv_lens = kv_lens.to(device=device, dtype=torch.int32)
    if tree_mask is None:
        tree = kv_lens                                                  # a dummy pointer
    else:           # a bool mask read as its bytes: no copy (the engine passes the same mask to every layer)
        tree = tree_mask.view(torch.int8) if tree_mask.dtype == torch.bool else tree_mask.to(torch.int8)
    index = kv_index.to(torch.int32) if kv_index is not None else kv_lens
    index_lens = kv_index_lens.to(device=device, dtype=torch.int32) if kv_index is not None else kv_lens
    tree_strides = tree.stride() if tree_mask is not None else (0, 0, 0)
    index_strides = index.stride() if kv_index is not None else (0, 0, 0)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"    # ignored for 16-bit inputs
    args = (q, k_cache, v_cache, kv_lens, tree, index, index_lens, acc, m, l,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), *tree_strides, *index_strides,
            Hkv, sm_scale if sm_scale is not None else D ** -0.5, splits, rows_padded, Q)
    constexprs = dict(GROUP=group, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                      HAS_TREE=tree_mask is not None, HAS_INDEX=kv_index is not None, PRECISION=precision)
    SPLIT_VARIANTS.note_launch(args, constexprs)
    _split_attention[(B * Hkv, splits, row_blocks)](*args, **constexprs)
    out = torch.empty_like(q)
    args = (acc, m, l, out, *out.stride(), Hkv, splits, rows_padded, Q)
    constexprs = dict(GROUP=group, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_D=block_d)
    COMBINE_VARIANTS.note_launch(args, constexprs)
    _combine_splits[(B * Hkv, row_blocks)](*args, **constexprs)
    return out


SPLIT_VARIANTS = KernelVariants(_split_attention, SPLIT_RUNTIME_INTS)
COMBINE_VARIANTS = KernelVariants(_combine_splits, COMBINE_RUNTIME_INTS)


def row_tile(group: int, q_len: int) -> int:
    """Rows a program takes (BLOCK_M): the query's rows (tokens x GQA group) to a power of two, 16 to 64.
    At most 64: one tile of a Llama-8B verify of 64 tokens (256 rows of 128 dims) asked for 256 KiB
    of shared memory on an H200, which has 227 KiB."""
    return min(64, max(16, triton.next_power_of_2(group * q_len)))


def warm_up(q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device, max_query_tokens: int,
            indexed: bool) -> None:
    """Launch every variant of the kernel that the engine's forwards of this model can launch (module
    docstring) on a small cache laid out as the engine's: each row tile a query of up to
    `max_query_tokens` tokens needs, with the engine's tree mask, and with a partial index too when
    `indexed` (SpecPV). On a GPU each compiles now, so that no timed step waits on Triton's compiler."""
    group = q_heads // kv_heads
    slots = 128
    cache = torch.zeros(1, kv_heads, slots, head_dim, dtype=dtype, device=device)
    kv_lens = torch.full((1,), slots, dtype=torch.int32, device=device)
    tiles = {row_tile(group, T): T for T in range(max_query_tokens, 0, -1)}       # each tile's shortest query
    for T in tiles.values():
        # q as the engine's: a view of the fused projection [B, T, heads, D] with heads second.
        q = torch.zeros(1, T, q_heads + kv_heads, head_dim, dtype=dtype, device=device).transpose(1, 2)[:, :q_heads]
        tree = torch.ones(1, T, T, dtype=torch.bool, device=device).tril()
        attention(q, cache, cache, kv_lens, tree_mask=tree)
        if indexed:
            index = torch.arange(slots - T, dtype=torch.int32, device=device).expand(1, kv_heads, slots - T)
            attention(q, cache, cache, kv_lens, tree_mask=tree, kv_index=index.contiguous(),
                      kv_index_lens=torch.full((1,), slots - T, dtype=torch.int32, device=device))
