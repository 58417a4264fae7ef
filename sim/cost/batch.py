"""What one forward processes: groups of requests in the same phase.

The simulator describes each forward as a few groups; each group carries the count of requests, the
query tokens per request and the KV tokens each reads. A group whose requests all have the same query
count (every decode or verify group) carries only the sum of KV tokens, which is all a memory-bound
attention cost needs; per-request KV arrays are given where the cost is not linear in KV.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim.formats.names import PHASES

# Indices of the phases (in the order of Result.time_share) keep per-iteration accounting in flat lists.
PREFILL, DECODE, VERIFY, PARTIAL, FULL, DRAFT, SELECTION, TRANSFER, OVERHEAD = range(len(PHASES))


class Group(NamedTuple):
    """Requests of one phase in one forward.

    tokens: query tokens of the whole group (what the linear layers see).
    query_max: the largest query count of one request; while it is below the attention ridge, every
        request is memory-bound and the sums are exact.
    query_tokens, kv_tokens: per-request values [n] (numpy arrays, or lists for a few prefill
        chunks), or None when only the sums are known.
    kv_tokens_sum: KV tokens read by the whole group, the new tokens included.
    logits_tokens: tokens whose logits the LM head computes.
    """
    phase: int
    requests: int
    tokens: int
    query_max: int
    kv_tokens_sum: int
    logits_tokens: int
    query_tokens: np.ndarray | None = None
    kv_tokens: np.ndarray | None = None


def uniform_group(phase: int, requests: int, query: int, kv_tokens_sum: int, logits: bool = True,
                  kv_tokens: np.ndarray | None = None) -> Group:
    """A group whose requests all run `query` tokens (decode, verify, draft forwards)."""
    tokens = requests * query
    return Group(phase, requests, tokens, query, kv_tokens_sum, tokens if logits else 0, None, kv_tokens)
