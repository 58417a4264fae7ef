"""Triton kernels for SpecPV's block selection: per-block key max/min summaries, and Quest scores
of every block for a step's queries (reduced over the queries and the GQA group). The top-k and
the assembly of the index (sink, chosen blocks, window) stay in torch (spec_kernels/reference.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _block_summaries(K, KV_LENS, K_MAX, K_MIN, stride_kb, stride_kh, stride_ks, stride_kd,
                     kv_heads, n_blocks,
                     BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)                     # (b, h)
    blk = tl.program_id(1).to(tl.int64)
    b = (pid // kv_heads).to(tl.int64)
    h = (pid % kv_heads).to(tl.int64)
    kv_len = tl.load(KV_LENS + b).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    complete = (blk + 1) * BLOCK <= kv_len
    keys = tl.load(K + b * stride_kb + h * stride_kh + (blk * BLOCK + offsets)[:, None] * stride_ks
                   + dims[None, :] * stride_kd, mask=(offsets[:, None] < BLOCK) & dim_valid[None, :],
                   other=0.0).to(tl.float32)          # in bounds: every block below max(kv_lens) is
    k_max = tl.where(complete, tl.max(keys, 0), 0.0)
    k_min = tl.where(complete, tl.min(keys, 0), 0.0)
    out = (pid * n_blocks + blk) * HEAD_DIM + dims
    tl.store(K_MAX + out, k_max, mask=dim_valid)
    tl.store(K_MIN + out, k_min, mask=dim_valid)


def block_summaries(k_cache: Tensor, kv_lens: Tensor, block: int = 16) -> tuple[Tensor, Tensor]:
    B, Hkv, S, D = k_cache.shape
    n_blocks = int(kv_lens.max()) // block
    k_max = torch.full((B, Hkv, n_blocks, D), float("nan"), dtype=torch.float32, device=k_cache.device)
    k_min = torch.full_like(k_max, float("nan"))
    if n_blocks:
        _block_summaries[(B * Hkv, n_blocks)](
            k_cache, kv_lens.to(device=k_cache.device, dtype=torch.int32), k_max, k_min, *k_cache.stride(), Hkv,
            n_blocks, BLOCK=block, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)))
    return k_max.to(k_cache.dtype), k_min.to(k_cache.dtype)


@triton.jit
def _block_scores(Q, K_MAX, K_MIN, SCORES, stride_qb, stride_qh, stride_qq, stride_qd,
                  kv_heads, n_blocks,
                  Q_LEN: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, USE_MAX: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_NB: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    tile = tl.program_id(1)
    b = (pid // kv_heads).to(tl.int64)
    h = (pid % kv_heads).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    row_valid = rows < GROUP * Q_LEN
    head = h * GROUP + rows // Q_LEN
    token = rows % Q_LEN
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    q = tl.load(Q + b * stride_qb + head[:, None] * stride_qh + token[:, None] * stride_qq + dims[None, :] * stride_qd,
                mask=row_valid[:, None] & dim_valid[None, :], other=0.0).to(tl.float32)
    blocks = tile * BLOCK_NB + tl.arange(0, BLOCK_NB)
    block_valid = blocks < n_blocks
    at = (pid * n_blocks + blocks)[:, None] * HEAD_DIM + dims[None, :]
    k_max = tl.load(K_MAX + at, mask=block_valid[:, None] & dim_valid[None, :], other=0.0).to(tl.float32)
    k_min = tl.load(K_MIN + at, mask=block_valid[:, None] & dim_valid[None, :], other=0.0).to(tl.float32)
    # Quest's bound per channel: q_d * kmax_d where q_d > 0, q_d * kmin_d where q_d < 0.
    bound = (tl.dot(tl.maximum(q, 0.0), tl.trans(k_max), input_precision="ieee")
             + tl.dot(tl.minimum(q, 0.0), tl.trans(k_min), input_precision="ieee"))          # [BLOCK_M, BLOCK_NB]
    if USE_MAX:
        score = tl.max(tl.where(row_valid[:, None], bound, float("-inf")), 0)
    else:
        score = tl.sum(tl.where(row_valid[:, None], bound, 0.0), 0) / (GROUP * Q_LEN)
    tl.store(SCORES + pid * n_blocks + blocks, score, mask=block_valid)


def block_scores(q: Tensor, k_max: Tensor, k_min: Tensor, reduce: str = "mean") -> Tensor:
    B, Hq, Q, D = q.shape
    Hkv, n_blocks = k_max.shape[1], k_max.shape[2]
    scores = torch.full((B, Hkv, n_blocks), float("nan"), dtype=torch.float32, device=q.device)
    block_nb = 64
    if n_blocks:
        _block_scores[(B * Hkv, triton.cdiv(n_blocks, block_nb))](
            q, k_max.contiguous(), k_min.contiguous(), scores, *q.stride(), Hkv, n_blocks,
            Q_LEN=Q, GROUP=Hq // Hkv, HEAD_DIM=D, USE_MAX=reduce == "max",
            BLOCK_M=max(16, triton.next_power_of_2((Hq // Hkv) * Q)), BLOCK_NB=block_nb,
            BLOCK_D=max(16, triton.next_power_of_2(D)))
    return scores
