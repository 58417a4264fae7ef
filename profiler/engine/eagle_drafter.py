"""EAGLE in the live engine: a trained head (profiler/engine/eagle_head.py) drafting chains and trees.

The head keeps its own one-layer KV cache, one entry per sequence index: entry i was computed from
(f_i, t_(i+1)), the target's last hidden state at position i and the token after it. The target
hands over its states of the committed positions after every forward (prefill chunks, and each
verification: the root and the accepted nodes; Llama.keep_hidden). A step from root p:
  1. catch up: feed the entries not yet fed, up to p - 1, whose last reads (f_(p-1), t_p) and
     estimates f_p; the target's LM head on it gives the first level's logits;
  2. each level feeds its nodes, one per branch, with that branch's latest estimate: the node of
     level L reads (its branch's estimate of f_(p+L-1), the node) at index p + L - 1 and gives the
     branch's next logits. Branch w's entry of level L goes to slot p + (L - 1) W + w, past the
     fed entries; the next catch-up overwrites those slots with the target's own states.
As the other model drafters, the first level takes the top-W tokens (greedy) or W i.i.d. samples,
and each branch continues with its own argmax or sample (profiler.engine.drafters.ModelDrafter).
"""
from __future__ import annotations

import torch
from torch import Tensor

from profiler.engine.eagle_head import EagleHead
from profiler.engine.drafters import DraftInput, ModelDrafter
from profiler.engine.model import Llama, context_mask


class EagleDrafter(ModelDrafter):
    name = "eagle"
    reads_hidden = True

    def __init__(self, head: EagleHead):
        self.head = head
        self.target: Llama | None = None
        self.features: Tensor | None = None     # [rows, max_seq, H]: the head's features of the target's states by position
        self.tokens: Tensor | None = None       # [rows, max_seq]: the tokens by position
        self.fed: Tensor | None = None          # [rows]: entries 0..fed - 1 hold the target's own states
        self.estimates: Tensor | None = None    # [B, W, H]: each branch's latest estimate (while drafting)

    def prepare_rows(self, model, rows, max_seq):
        c, weight = model.config, model.lm_head.weight
        attention = self.head.layer.attention
        shape = (rows, c.kv_heads, max_seq, c.head_dim)
        attention.k_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        attention.v_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.features = torch.zeros(rows, max_seq, c.hidden, dtype=weight.dtype, device=weight.device)
        self.tokens = torch.zeros(rows, max_seq, dtype=torch.long, device=weight.device)
        self.fed = torch.zeros(rows, dtype=torch.long, device=weight.device)
        self.target = model
        model.keep_hidden = True

    def prepare(self, model, prompts, max_seq):
        self.prepare_rows(model, max(len(prompts), 1), max_seq)

    def prefill(self, chunks, start, first_row):
        R = len(chunks)
        tokens, counts = padded(chunks, self.fed.device)
        T = tokens.shape[1]
        # Past a shorter prompt's end these hold padding, which take_hidden overwrites before any read.
        self.features[first_row:first_row + R, start:start + T] = self.head.features(self.target.kept_hidden[:, :T],
                                                                                 self.target)
        self.tokens[first_row:first_row + R, start:start + T] = tokens
        if start == 0:
            self.fed[first_row:first_row + R] = 0          # new requests in these rows: their entries start over
        # Every index whose next token is known is fed now, as EAGLE's prefill runs the head over the prompt.
        self.catch_up(first_row, (start + counts - 1).tolist())

    def take_hidden(self, hidden, spans):
        device = self.fed.device
        rows = torch.tensor([row for row, _, _ in spans], device=device)
        first = torch.tensor([start for _, start, _ in spans], device=device)
        layout, counts = padded([indices for _, _, indices in spans], device)
        write_rows(self.features, rows, first, self.head.features(hidden[rows[:, None], layout], self.target), counts)
        self.fed[rows] = torch.minimum(self.fed[rows], first)

    def first_forward(self, model, step: DraftInput) -> Tensor:
        roots = step.positions.tolist()
        starts = self.fed[:len(roots)].tolist()
        if any(start >= p for start, p in zip(starts, roots)):
            raise RuntimeError("an EAGLE row has no new committed state to draft from")
        # The tokens committed since the last catch-up (the root among them), by position.
        tokens, counts = padded([history[start:p + 1] for history, start, p in zip(step.history, starts, roots)],
                                self.fed.device)
        write_rows(self.tokens, torch.arange(len(roots), device=self.fed.device), self.fed[:len(roots)], tokens, counts)
        estimate = self.catch_up(0, roots)                                                  # [B, H]: of f_p
        self.estimates = estimate[:, None]
        return self.head.logits(estimate, self.target)

    def feed_level(self, model, step: DraftInput, level: int, tokens: Tensor) -> Tensor:
        W = step.shape.width
        root = step.positions
        B, device = len(root), root.device
        branch = torch.arange(W, device=device)
        slots = root[:, None] + (level - 1) * W + branch                                   # [B, W]
        index = (root + level - 1)[:, None].expand(B, W)
        # A branch's query sees the fed entries (below the root) and its own chain's entries.
        span = int(slots.max()) + 1
        mask = context_mask((root - 1)[:, None].expand(B, W), index, span)                 # [B, 1, W, S]
        own = root[:, None, None] + torch.arange(level, device=device)[None, None, :] * W + branch[None, :, None]
        mask[torch.arange(B, device=device)[:, None, None], 0, branch[None, :, None], own] = True
        estimate = self.run_head(self.estimates.expand(B, W, -1), tokens, index, slots, mask, 0)
        self.estimates = estimate
        return self.head.logits(estimate, self.target)

    def catch_up(self, first_row: int, ends: list[int]) -> Tensor | None:
        """Feed each row's entries fed..end - 1 (rows first_row.., one end per row) in one head
        forward; returns each row's estimate at its last fed entry [R, H] (of f_end), None when no
        row has an entry to feed."""
        R, device = len(ends), self.tokens.device
        starts, ends = self.fed[first_row:first_row + R], torch.tensor(ends, device=device)
        counts = (ends - starts).clamp(min=0)
        T = int(counts.max()) if R else 0
        if T == 0:
            return None
        offsets = torch.arange(T, device=device)
        valid = offsets[None, :] < counts[:, None]                                          # [R, T]
        index = torch.where(valid, starts[:, None] + offsets, 0)
        rows = torch.arange(first_row, first_row + R, device=device)[:, None]
        trash = self.tokens.shape[1] - 1
        slots = torch.where(valid, index, trash)
        # Padding queries see slot 0 only (no empty softmax); their outputs are dropped.
        mask = context_mask(index, index, int(index.max()) + 1)
        estimates = self.run_head(self.features[rows, index], self.tokens[rows, (index + 1).clamp(max=trash)],
                                  index, slots, mask, first_row)
        self.fed[first_row:first_row + R] = torch.maximum(starts, ends)
        return estimates[torch.arange(R, device=device), (counts - 1).clamp(min=0)]

    def run_head(self, hidden: Tensor, next_tokens: Tensor, index: Tensor, slots: Tensor, mask: Tensor,
                 first_row: int) -> Tensor:
        """The head's layer on [R, T] entries (hidden [R, T, H], next tokens [R, T], rotary index and
        cache slots [R, T], mask [R, 1, T, S] over its cache), writing their K/V; estimates [R, T, H]."""
        head, c = self.head, self.target.config
        x = head.fuse(hidden, next_tokens, self.target)
        R, T = index.shape
        cache_index = slots[:, None, :, None].expand(R, c.kv_heads, T, c.head_dim)
        rotation = self.target.rope[index][:, :, None]
        return head.estimate(head.layer(x, cache_index, rotation, mask, first_row=first_row))

    def keep_rows(self, model, rows):
        attention = self.head.layer.attention
        attention.k_cache, attention.v_cache = attention.k_cache[rows], attention.v_cache[rows]
        self.features, self.tokens = self.features[rows], self.tokens[rows]
        self.fed = self.fed[rows]

    def swap_rows(self, a, b, length):
        if a == b:
            return
        attention = self.head.layer.attention
        for cache in (attention.k_cache[:, :, :length], attention.v_cache[:, :, :length],
                      self.features[:, :length], self.tokens[:, :length]):
            cache[[a, b]] = cache[[b, a]]
        self.fed[[a, b]] = self.fed[[b, a]]


def padded(rows: list[list[int]], device) -> tuple[Tensor, Tensor]:
    """Ragged integer rows as [R, C] (padded with 0) and their lengths [R]."""
    C = max(1, max(len(row) for row in rows))
    values = torch.tensor([row + [0] * (C - len(row)) for row in rows], dtype=torch.long, device=device)
    return values, torch.tensor([len(row) for row in rows], device=device)


def write_rows(buffer: Tensor, rows: Tensor, first: Tensor, values: Tensor, counts: Tensor) -> None:
    """buffer[rows[i], first[i] + j] = values[i, j] for j < counts[i]; buffer [rows, max_seq, ...],
    the rest of each row's values go to the last (trash) slot."""
    offsets = torch.arange(values.shape[1], device=buffer.device)
    positions = torch.where(offsets < counts[:, None], first[:, None] + offsets, buffer.shape[1] - 1)
    buffer[rows[:, None], positions] = values.to(buffer.dtype)
