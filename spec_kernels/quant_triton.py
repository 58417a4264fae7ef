"""Weight-only int4 / int8 matmul for the shadow draft: y = x @ dequantize(W).T.

W is stored as spec_kernels.reference.quantize packs it: codes [N, K] uint8 (int8) or [N, K/2] (int4,
two per byte, low nibble first), scale and zero [N, K / group_size] fp32. Each program computes a
BLOCK_M x BLOCK_N tile of y, walking K in steps of BLOCK_K (a divisor of the group size, so one
scale and zero per row per step), dequantizing the codes in registers and accumulating in fp32:
the weights cross memory at 4 or 8 bits, which is what makes the shadow draft cheap. The row count
M changes with the batch and is not specialised on (spec_kernels/variants.py): a batch that shrinks
as requests finish compiles nothing new within a row tile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from spec_kernels.variants import KernelVariants


@triton.jit(do_not_specialize=["M"])
def _quant_matmul(X, CODES, SCALE, ZERO, Y, M, N, K,
                  stride_xm, stride_xk, stride_cn, stride_ck, stride_sn, stride_sg, stride_ym, stride_yn,
                  BITS: tl.constexpr, GROUP_SIZE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_valid = rows < M
    col_valid = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_valid = ks < K
        x = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + ks[None, :] * stride_xk,
                    mask=row_valid[:, None] & k_valid[None, :], other=0.0).to(tl.float32)
        if BITS == 4:
            packed = tl.load(CODES + cols[:, None].to(tl.int64) * stride_cn + (ks[None, :] // 2) * stride_ck,
                             mask=col_valid[:, None] & k_valid[None, :], other=0)
            codes = (packed.to(tl.int32) >> ((ks[None, :] % 2) * 4)) & 0xF
        else:
            codes = tl.load(CODES + cols[:, None].to(tl.int64) * stride_cn + ks[None, :] * stride_ck,
                            mask=col_valid[:, None] & k_valid[None, :], other=0).to(tl.int32)
        group = k0 // GROUP_SIZE
        scale = tl.load(SCALE + cols.to(tl.int64) * stride_sn + group * stride_sg, mask=col_valid, other=0.0)
        zero = tl.load(ZERO + cols.to(tl.int64) * stride_sn + group * stride_sg, mask=col_valid, other=0.0)
        w = codes.to(tl.float32) * scale[:, None] + zero[:, None]                   # [BLOCK_N, BLOCK_K]
        w = tl.where(k_valid[None, :], w, 0.0)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    tl.store(Y + rows[:, None].to(tl.int64) * stride_ym + cols[None, :] * stride_yn, acc,
             mask=row_valid[:, None] & col_valid[None, :])


def quant_matmul(x: Tensor, packed: dict) -> Tensor:
    lead, K = x.shape[:-1], x.shape[-1]
    if K != packed["in_features"]:
        raise ValueError(f"x has {K} input features, the weights {packed['in_features']}")
    group = packed["group_size"]
    if group < 16 or group & (group - 1):
        raise ValueError(f"the Triton kernel needs a power-of-two group_size >= 16 (got {group})")
    x2 = x.reshape(-1, K)
    M, N = x2.shape[0], packed["codes"].shape[0]
    y = torch.full((M, N), float("nan"), dtype=torch.float32, device=x.device)
    block_k = min(64, packed["group_size"])
    block_m = max(16, min(64, triton.next_power_of_2(M)))
    block_n = 64
    codes, scale, zero = packed["codes"], packed["scale"], packed["zero"]
    args = (x2, codes, scale, zero, y, M, N, K, *x2.stride(), *codes.stride(), *scale.stride(), *y.stride())
    constexprs = dict(BITS=packed["bits"], GROUP_SIZE=packed["group_size"], BLOCK_M=block_m, BLOCK_N=block_n,
                      BLOCK_K=block_k)
    VARIANTS.note_launch(args, constexprs)
    _quant_matmul[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](*args, **constexprs)
    return y.to(x.dtype).reshape(*lead, N)


VARIANTS = KernelVariants(_quant_matmul, ("M",))
