"""What one forward processes: groups of requests in the same phase.

The simulator describes each forward as a few groups; each group carries the count of requests, the
query tokens per request and the KV tokens each reads. A group whose requests all have the same query
count (every decode or verify group) carries only the sum of KV tokens, which is all a memory-bound
attention cost needs; per-request KV arrays are given where the cost is not linear in KV.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.formats.names import PHASES

# Indices of the phases (in the order of Result.time_share) keep per-iteration accounting in flat lists.
PREFILL, DECODE, VERIFY, PARTIAL, FULL, DRAFT, SELECTION, TRANSFER, OVERHEAD = range(len(PHASES))


# Not frozen: a frozen dataclass's __init__ costs twice a plain one's, and groups are built every
# iteration. Treat a group as a value; `dataclasses.replace` makes a changed copy.
@dataclass(kw_only=True, slots=True)
class Group:
    """Requests of one phase in one forward.

    tokens: query tokens of the whole group (what the linear layers see).
    query_max: the largest query count of one request; while it is below the attention ridge, every
        request is memory-bound and the sums are exact.
    query_tokens, kv_tokens: per-request values [n] (numpy arrays, or lists for a few prefill
        chunks), or None when only the sums are known.
    kv_tokens_sum: KV tokens read by the whole group, the new tokens included (a float where it is
        a mean's multiple: a draft forward's mean drafted tokens).
    logits_tokens: tokens whose logits the LM head computes.
    """
    phase: int
    requests: int
    tokens: int
    query_max: int
    kv_tokens_sum: float
    logits_tokens: int
    query_tokens: np.ndarray | list[int] | None = None
    kv_tokens: np.ndarray | list[int] | None = None

    def without_logits(self) -> Group:
        """The same requests and tokens, no logits (a draft's own KV taking a prompt)."""
        return Group(phase=self.phase, requests=self.requests, tokens=self.tokens, query_max=self.query_max,
                     kv_tokens_sum=self.kv_tokens_sum, logits_tokens=0, query_tokens=self.query_tokens,
                     kv_tokens=self.kv_tokens)


def uniform_group(phase: int, requests: int, query: int, kv_tokens_sum: float, logits: bool = True,
                  kv_tokens: np.ndarray | None = None) -> Group:
    """A group whose requests all run `query` tokens (decode, verify, draft forwards)."""
    tokens = requests * query
    return Group(phase=phase, requests=requests, tokens=tokens, query_max=query, kv_tokens_sum=kv_tokens_sum,
                 logits_tokens=tokens if logits else 0, kv_tokens=kv_tokens)


def prefill_group(query_tokens: list[int], kv_tokens: list[int], logits_tokens: int) -> Group:
    """Prompt chunks of one forward: each request's new tokens and the KV it reads, those included."""
    return Group(phase=PREFILL, requests=len(query_tokens), tokens=sum(query_tokens), query_max=max(query_tokens),
                 kv_tokens_sum=sum(kv_tokens), logits_tokens=logits_tokens, query_tokens=query_tokens,
                 kv_tokens=kv_tokens)


def prompt_group(tokens: int, logits_tokens: int = 1) -> Group:
    """One request's whole prompt of `tokens`, in one forward (logits of its last token by default)."""
    return Group(phase=PREFILL, requests=1, tokens=tokens, query_max=tokens, kv_tokens_sum=tokens,
                 logits_tokens=logits_tokens, query_tokens=[tokens], kv_tokens=[tokens])
