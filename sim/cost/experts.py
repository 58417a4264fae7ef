"""Routing in a mixture of experts: how many experts a forward reads, and on the busiest GPU.

With T tokens each picking k of E experts, roughly uniformly and independently, an expert is
touched with probability q = 1 - (1 - k/E)^T, so a forward reads E q distinct experts: a decode
step at batch B reads far fewer expert weights than a verification of B (k+1) tokens, the
MoE-specific cost of speculation. Placed whole across n GPUs (expert parallelism), a GPU's
distinct experts and its token-expert pairs are binomial, and the busiest GPU sets the layer's time.
"""
from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist


def distinct_experts(routed: int, top_k: int, tokens: float) -> float:
    """Expected experts read by a forward of `tokens` tokens: E (1 - (1 - k/E)^T)."""
    return routed * (1.0 - (1.0 - top_k / routed) ** tokens)


@lru_cache(maxsize=64)
def expected_max_normal(n: int) -> float:
    """E[max of n standard normals], by Blom's approximation: Phi^-1((n - 0.375) / (n + 0.25))."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def busiest_gpu(routed: int, top_k: int, tokens: float, gpus: int) -> tuple[float, float]:
    """(distinct experts, token-expert pairs) on the busiest of `gpus` GPUs holding routed / gpus
    whole experts each: each count at its mean + z_n standard deviations (binomial), capped at
    its maximum."""
    z = expected_max_normal(gpus)
    local = routed / gpus
    q = distinct_experts(routed, top_k, tokens) / routed
    experts = min(local, local * q + z * math.sqrt(local * q * (1 - q)))
    pairs = tokens * top_k
    pairs_here = min(pairs, pairs / gpus + z * math.sqrt(pairs * (1 / gpus) * (1 - 1 / gpus)))
    return experts, pairs_here
