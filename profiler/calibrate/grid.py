"""Where calibration times each operator: axes per operator, geometric in tokens and KV and dense
at small batch (where the matmul library switches kernels), clipped to the model's context, plus
off-grid points held out of the tables to measure their interpolation error.

Full grids step by at most 2 (1.5 at small token counts); quick grids keep about every other point.
Tokens reach 8,192, a batch's whole prefill (4 x 2,048, 16 x 512): past about 4,096 tokens a
layer's activations outgrow the CPU's caches and the elementwise work per token doubles, which a
line from 4,096 would not see.
"""
from __future__ import annotations

import itertools
import math

TOKENS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096,
          6144, 8192]
TOKENS_QUICK = [1, 2, 4, 6, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192]
# A quantized drafter's tokens (one per request of the batch): 48 since held-out points at 40-63
# tokens read 8-25% off the line from 32 to 64 (int8 and int4 matmuls).
DRAFT_TOKENS = [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64]
BATCH = [1, 2, 4, 8, 16]
QUERY = [1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64]
KV = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
PREFILL_QUERY = [128, 256, 512, 1024, 2048, 4096]
PREFILL_KV = [128, 256, 512, 1024, 2048, 4096, 8192]
CONTEXT = [256, 512, 1024, 2048, 4096, 8192]
BUDGET = [256, 512, 1024, 2048, 4096]
ACCEPT_TOKENS = [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32]
BYTES = [1 << 16, 1 << 20, 1 << 24, 1 << 26, 1 << 28]
def every_other(axis: list[int]) -> list[int]:
    """Quick grids: every other point, always keeping both ends."""
    kept = axis[::2]
    return kept if kept[-1] == axis[-1] else kept + [axis[-1]]


def grid_for(config, quick: bool, cuda: bool) -> dict[str, dict[str, list[int]]]:
    """op -> {dim: axis}, clipped to the model's context."""
    q = every_other if quick else (lambda a: a)
    ctx = lambda axis: [x for x in axis if x <= config.max_context] or axis[:1]
    tokens = TOKENS_QUICK if quick else TOKENS
    grid = {f"linear.{n}": {"tokens": tokens} for n in ("qkv", "o", "gate_up", "down")}
    grid.update({f"int{b}.{n}": {"tokens": q(DRAFT_TOKENS)} for b in (8, 4) for n in ("qkv", "o", "gate_up", "down")})
    grid["elementwise"] = {"tokens": tokens}
    grid["lm_head"] = {"tokens": [t for t in tokens if t <= 512]}
    grid["attention"] = {"batch": q(BATCH), "query": q(QUERY), "kv": ctx(q(KV))}
    grid["attention_partial"] = {"batch": [1, 4, 16], "query": q([1, 2, 5, 9, 17]), "kv": q([256, 512, 1024, 2048, 4096])}
    grid["attention_prefill"] = {"query": ctx(q(PREFILL_QUERY)), "kv": ctx(q(PREFILL_KV))}
    grid["attention_prompt"] = {"query": ctx(q(PREFILL_KV))}
    grid["forward_base"] = {"batch": [1, 4, 16], "query": [1, 8, 64, 512], "kv": ctx([128, 1024, 8192])}
    grid["summaries"] = {"batch": [1, 4, 16], "context": ctx(q(CONTEXT))}
    grid["selection"] = {"batch": [1, 4, 16], "context": ctx(q(CONTEXT)), "budget": q(BUDGET)}
    grid["ngram"] = {"context": ctx(q(CONTEXT))}
    grid["accept"] = {"batch": q([1, 2, 3, 4, 6, 8, 12, 16, 32, 64]), "tokens": q(ACCEPT_TOKENS)}
    if cuda:
        grid["h2d_pinned"] = {"bytes": BYTES}
        grid["h2d_pageable"] = {"bytes": BYTES}
    return grid


def held_out_points(grid: dict, rng, per_op: int) -> dict[str, list[dict]]:
    """Off-grid points inside each operator's grid: log-uniform in every dim, rounded to integers
    that are not grid values (dims with fewer than two values keep theirs)."""
    out = {}
    for op, axes in grid.items():
        points = []
        for _ in range(per_op * 20):
            point = {}
            for dim, axis in axes.items():
                if len(axis) < 2:
                    point[dim] = axis[0]
                    continue
                for _ in range(20):
                    value = int(round(math.exp(rng.uniform(math.log(axis[0]), math.log(axis[-1])))))
                    if value not in axis:
                        break
                point[dim] = value
            if op in ("attention_prefill",) and point["kv"] < point["query"]:
                continue
            if all(point[d] not in axes[d] for d in axes if len(axes[d]) > 1) and point not in points:
                points.append(point)
            if len(points) == per_op:
                break
        out[op] = points
    return out


def grid_points(axes: dict[str, list[int]]):
    """Every point of a regular grid, as {dim: value}."""
    dims = list(axes)
    for values in itertools.product(*(axes[d] for d in dims)):
        yield dict(zip(dims, values))


def prefill_cell(op: str, point: dict) -> dict:
    """attention_prefill's grid cells with kv < query stand for kv = query (a prompt attends at
    least to itself); the table never reads them below the diagonal."""
    if op == "attention_prefill" and point["kv"] < point["query"]:
        return {**point, "kv": point["query"]}
    return point


def grid_of(meta: dict) -> dict[str, dict[str, list[int]]]:
    """A bundle's grid (meta.json's "grid") as calibrate builds it: axes per operator."""
    return {op: spec["axes"] for op, spec in meta["grid"].items()}


