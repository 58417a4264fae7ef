"""Stochastic verification: rejection sampling that keeps the target's distribution (Leviathan et
al. 2023, chains).

For drafts d_1..d_k drawn from the draft's distributions q_1..q_k and the target's p_1..p_{k+1}
(all after temperature and top-p): accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at
the first rejection sample the replacement from normalize(max(0, p_i - q_i)); if all k are
accepted, sample the bonus token from p_{k+1}. A deterministic drafter (n-gram) is the case where
q_i is one-hot on d_i.
"""
from __future__ import annotations

import torch
from torch import Tensor


def probs_from_logits(logits: Tensor, temperature: float, top_p: float = 1.0) -> Tensor:
    """[..., V] fp32 probabilities after temperature and nucleus (top-p) filtering."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # Keep the smallest prefix whose mass reaches top_p (the token crossing it included).
    keep_sorted = (sorted_probs.cumsum(-1) - sorted_probs) < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    filtered = probs * keep
    return filtered / filtered.sum(-1, keepdim=True)


def sample(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row of [..., V] probabilities."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def verify_chain(target_probs: Tensor, drafts: Tensor, draft_probs: Tensor | None,
                 generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
    """target_probs [B, k+1, V]; drafts [B, k]; draft_probs [B, k, V] or None (one-hot drafts).

    Returns accept flags [B, k] (True up to and including each accepted position, as drawn), the
    accepted count [B], and the next token [B] (the replacement at the first rejection, or the
    bonus token when every draft is accepted).
    """
    B, k = drafts.shape
    p_draft = target_probs[:, :k].gather(-1, drafts[..., None])[..., 0]             # p_i(d_i)
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.gather(-1, drafts[..., None])[..., 0]
    u = torch.rand(B, k, generator=generator, device=target_probs.device)
    flags = u * q_draft < p_draft                       # u < p/q without dividing by a zero q
    accepted = flags.long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(B, device=target_probs.device)
    position = accepted.clamp(max=k)
    p_next = target_probs[rows, position]                                            # [B, V]
    rejected = accepted < k
    if rejected.any():
        if draft_probs is None:
            q_next = torch.zeros_like(p_next)
            q_next[rows[rejected], drafts[rows[rejected], position[rejected]]] = 1.0
        else:
            q_next = torch.zeros_like(p_next)
            q_next[rejected] = draft_probs[rows[rejected], position[rejected]]
        residual = (p_next - q_next).clamp_min(0)
        mass = residual.sum(-1, keepdim=True)
        # Where p == q exactly the residual is empty (the draft would have been accepted surely);
        # fall back to p, which cannot be reached with probability > 0 then.
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
        p_next = torch.where(rejected[:, None], residual, p_next)
    return flags, accepted, sample(p_next, generator)
