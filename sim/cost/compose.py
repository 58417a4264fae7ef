"""A forward's seconds from its terms, as every operator-level pricer composes them.

The roofline (sim/cost/roofline.py) and a bundle's operator tables (sim/cost/table.py) price the
same terms from different sources: the work the batch shares (linears, elementwise work, the
collectives, the engine's launches), the LM head, each group's attention in every layer, and the
host-link transfer of offloaded layers and KV. `compose` adds them and gives each group its part.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from sim.cost.batch import PARTIAL, TRANSFER, Group


class HostLink(Protocol):
    """The host link a forward streams offloaded weights and KV over (sim/cost/roofline.py
    RooflineRates): its achievable rate, and whether the transfer overlaps compute."""
    link_bytes_s: float
    overlap_transfer: bool


def token_counts(groups: Sequence[Group]) -> tuple[int, int]:
    """(query tokens, tokens that need logits) of a forward over `groups`."""
    tokens = logits = 0
    for g in groups:
        tokens += g.tokens
        logits += g.logits_tokens
    return tokens, logits


def compose(rates: HostLink, groups: Sequence[Group], tokens: int, logits: int, shared: float, lm_head: float,
            attention_of, c, shares: list[float], offloaded_layers: int, kv_offloaded: bool, repeat: int) -> float:
    """A forward's seconds from its terms: `shared` (split among the groups by query tokens),
    `lm_head` (by logits tokens), one layer's attention per group (`attention_of(group)`, or
    None for a stack without attention) times c.layers, and the host-link transfer of the
    offloaded layers and KV; each group's part goes to its phase in `shares`."""
    total = shared + lm_head
    kv_link_bytes = 0.0
    for g in groups:
        own = shared * g.tokens / tokens + (lm_head * g.logits_tokens / logits if logits else 0.0)
        if attention_of is not None:
            attention = c.layers * attention_of(g)
            own += attention
            total += attention
            if kv_offloaded and g.phase != PARTIAL:
                kv_link_bytes += c.layers * g.kv_tokens_sum * c.attn_bytes_per_kv
        shares[g.phase] += own * repeat
    transfer = (offloaded_layers * c.layer_weight_bytes + kv_link_bytes) / rates.link_bytes_s
    return with_transfer(rates, total, transfer, shares, repeat)


def with_transfer(rates: HostLink, compute_s: float, transfer_s: float, shares: list[float], repeat: int) -> float:
    """`repeat` forwards of compute_s each streaming transfer_s over the host link: the part of
    the transfer not hidden behind compute (all of it without overlap) is the `transfer` phase."""
    if transfer_s:
        exposed = max(0.0, transfer_s - compute_s) if rates.overlap_transfer else transfer_s
        shares[TRANSFER] += exposed * repeat
        compute_s += exposed
    return compute_s * repeat
