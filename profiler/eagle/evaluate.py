"""How many drafts of an EAGLE head greedy verification accepts, at every root of the target's output.

At root p (the last committed token t_p, the target's hidden state f_(p-1) known) a chain of k
drafts runs: index p - 1 reads (f_(p-1), t_p) and estimates f_p, whose LM head gives d_1; index
p + j - 2 reads (its own estimate, d_(j-1)) and gives d_j. Every index below p reads the target's
own hidden states (the head's KV after catching up on the committed tokens), its drafts only
their own chain: exactly what a live engine's head computes at that step. Greedy verification
accepts the leading drafts that equal the target's output t_(p+1), t_(p+2), ...

`chain_accepted` computes every root of one sequence at once; walking them from the first root
(each step from root p accepts a(p) drafts and moves a(p) + 1 on) gives the steps a live run makes.

Two references put a head's figure in context: the same walk over training sequences (what the head
does on text like what it learned from; far above the held-out figure, it says the data, not the
head's mechanics, bounds acceptance) and over a bigram chain (each draft the commonest token after
the one before it in the training continuations: what token statistics alone accept).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from torch import Tensor

from profiler.engine.eagle_head import EagleHead, rotations
from profiler.engine.model import Llama


def chain_accepted(head: EagleHead, target: Llama, tokens: Tensor, hidden: Tensor, first_root: int, k: int) -> np.ndarray:
    """[roots] accepted drafts (0..k) of a chain of k at each root first_root..L-2 of one sequence:
    tokens [L], hidden [L, H] (the target's)."""
    L = len(tokens)
    if first_root >= L - 1:
        return np.zeros(0, dtype=np.int64)
    roots = torch.arange(first_root, L - 1)
    proposed = chain_drafts(head, target, tokens, hidden, first_root, k)          # [R, k]
    offsets = roots[:, None] + torch.arange(1, k + 1)[None]
    hits = (proposed == tokens[offsets.clamp(max=L - 1)]) & (offsets <= L - 1)
    return torch.cumprod(hits.long(), 1).sum(1).numpy()


@torch.inference_mode()
def chain_drafts(head: EagleHead, target: Llama, tokens: Tensor, hidden: Tensor, first_root: int, k: int) -> Tensor:
    """[roots, k] the chain of k drafts the head proposes at each root first_root..L-2."""
    dtype = target.lm_head.weight.dtype
    tokens, hidden = tokens.to(hidden.device), head.features(hidden.to(dtype), target)
    L = len(tokens)
    roots = torch.arange(first_root, L - 1)
    a = head.layer.attention
    # Teacher entries e_i = (f_i, t_(i+1)), i = 0..L-2, at position i.
    x = head.fuse(hidden[None, :-1], tokens[None, 1:], target)                    # [1, L-1, H]
    n = L - 1
    q_t, keys, values = head.project(x, rotations(target, torch.arange(n))[None, :, None])
    out = torch.nn.functional.scaled_dot_product_attention(q_t, keys, values, is_causal=True,
                                                           enable_gqa=a.heads != a.kv_heads)
    estimates = head.estimate(x + head.feed(x, out))[0]                           # [L-1, H]: estimate of f_(i+1)
    group = a.heads // a.kv_heads
    keys, values = keys[0].repeat_interleave(group, 0), values[0].repeat_interleave(group, 0)   # [Hq, n, D]

    feature = estimates[roots - 1]                                                # estimate of f_p
    draft = head.logits(feature, target).argmax(-1)                               # d_1, [R]
    drafts = [draft]
    own_k, own_v = [], []                                                         # the chain's entries
    visible = torch.arange(n)[None, :] < roots[:, None]                           # [R, n]: indices < p
    scale = a.head_dim ** -0.5
    for j in range(2, k + 1):
        position = roots + j - 2
        x = head.fuse(feature[:, None], draft[:, None], target)                   # [R, 1, H]
        q, k_new, v_new = head.project(x, rotations(target, position)[:, None, None])
        q = q[:, :, 0]                                                            # [R, Hq, D]
        own_k.append(k_new[:, :, 0].repeat_interleave(group, 1))                  # [R, Hq, D]
        own_v.append(v_new[:, :, 0].repeat_interleave(group, 1))
        teacher = torch.einsum("rhd,hnd->rhn", q, keys) * scale
        teacher = teacher.masked_fill(~visible[:, None, :], float("-inf"))
        chain_k, chain_v = torch.stack(own_k, 2), torch.stack(own_v, 2)           # [R, Hq, j-1, D]
        chain = torch.einsum("rhd,rhcd->rhc", q, chain_k) * scale
        weights = torch.softmax(torch.cat([teacher, chain], -1).float(), -1).to(q.dtype)
        attended = (torch.einsum("rhn,hnd->rhd", weights[..., :n], values)
                    + torch.einsum("rhc,rhcd->rhd", weights[..., n:], chain_v))
        feature = head.estimate(x + head.feed(x, attended[:, :, None]))[:, 0]
        draft = head.logits(feature, target).argmax(-1)
        drafts.append(draft)
    return torch.stack(drafts, 1)


def bigram_table(examples) -> dict[int, int]:
    """The commonest next token after each token of the training continuations (the target's own
    output: positions from the last prompt token on), ties to the smaller id."""
    counts: dict[int, Counter] = {}
    for e in examples:
        tokens = e.tokens.tolist()
        for p in range(max(e.prompt_tokens - 1, 0), len(tokens) - 1):
            counts.setdefault(tokens[p], Counter())[tokens[p + 1]] += 1
    return {a: min(c.items(), key=lambda item: (-item[1], item[0]))[0] for a, c in counts.items()}


def bigram_accepted(table: dict[int, int], tokens: Tensor, first_root: int, k: int) -> np.ndarray:
    """[roots] accepted drafts of a bigram chain of k (each draft the table's successor of the one
    before, the first of the root's token; no draft where the table has none) at each root
    first_root..L-2 of one sequence."""
    tokens = tokens.tolist()
    L = len(tokens)
    accepted = []
    for p in range(first_root, L - 1):
        current, a = tokens[p], 0
        while a < k and p + a + 1 <= L - 1 and table.get(current) == tokens[p + a + 1]:
            current = tokens[p + a + 1]
            a += 1
        accepted.append(a)
    return np.asarray(accepted, dtype=np.int64)


def walk(accepted_at: np.ndarray, k: int) -> np.ndarray:
    """Accepted drafts of each step from the first root (a step from root p moves a(p) + 1 on)."""
    steps, root = [], 0
    while root < len(accepted_at):
        steps.append(min(int(accepted_at[root]), k))
        root += steps[-1] + 1
    return np.asarray(steps, dtype=np.int64)


def acceptance_report(per_category_steps: dict[str, list[np.ndarray]], k: int) -> dict:
    """Per category and over all: steps, mean accepted drafts and committed tokens per step, and
    the per-position conditional acceptance P(accepted >= j | accepted >= j - 1)."""
    def summary(steps: np.ndarray) -> dict:
        rates = []
        for j in range(1, k + 1):
            reached = steps >= j - 1
            rates.append(float((steps[reached] >= j).mean()) if reached.any() else 0.0)
        return {"steps": int(len(steps)), "accepted_per_step": float(steps.mean()),
                "tokens_per_step": float(steps.mean() + 1), "per_position": rates}

    out = {category: summary(np.concatenate(steps)) for category, steps in sorted(per_category_steps.items())}
    out["all"] = summary(np.concatenate([np.concatenate(s) for s in per_category_steps.values()]))
    return out
