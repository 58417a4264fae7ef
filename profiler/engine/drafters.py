"""Drafters: what proposes the tokens the target verifies.

Every drafter fills a static tree (profiler.engine.tree.TreeShape; a chain of k is width 1, depth k)
below each request's root, the last committed token at position p:
  ngram        prompt lookup: the continuations of the latest earlier matches of the last
               3, 2 or 1 tokens, one distinct candidate per branch;
  layerskip    the target's first layers + final norm + LM head;
  streaming    the whole target attending a sink + recent window only (MagicDec);
  shadow       the target's layers weight-only quantized (SubSpec);
  draft_model  a separate smaller model with its own KV cache.
A model draft runs one forward per level: the root first, then the `width` nodes of each level.
The first level takes the top-`width` tokens (greedy) or `width` i.i.d. samples (sampled
verification needs them i.i.d. from one q); each branch then continues with its own argmax or
sample. Self-drafters share the target's KV cache and write their K/V at the node slots, which
the verification overwrites.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from profiler.engine.graphs import chain_mask, forward_new_tokens
from profiler.engine.model import KernelLayout, Llama, add_tree_edges, causal_mask, context_mask
from profiler.engine.tree import TreeShape


@dataclass
class DraftInput:
    """What a drafter sees for one step: B requests, the root of each at `positions`."""
    model: Llama                  # the target
    history: list[list[int]]      # prompt + output so far, per request
    last: Tensor                  # [B] root tokens (the last committed)
    positions: Tensor             # [B] their positions (= cache slots)
    shape: TreeShape
    prompt_tokens: list[int] | None = None   # per request: how much of its history is the prompt
    kernels: bool = False         # the step's forwards use the attention kernel (the CUDA path)


class Drafter:
    name = "none"

    def prepare(self, model: Llama, prompts: list[list[int]], max_seq: int) -> None:
        """Called once the target's KV cache exists (a drafter sharing it links to it here)."""

    def propose(self, step: DraftInput, sampler=None) -> tuple[Tensor, Tensor | None]:
        """Node tokens [B, nodes] and the distributions they were drawn from [B, nodes, V]
        (None: deterministic candidates)."""
        raise NotImplementedError

    def keep_rows(self, model: Llama, rows: Tensor) -> None:
        """The batch dropped finished requests; `model` has kept cache rows `rows`."""

    def move_kv(self, rows: Tensor, source: Tensor, target: Tensor) -> None:
        """The accepted path's nodes moved from tree slots to positions (own caches only)."""

    # Serving (profiler.engine.serving): requests come and go in the rows of one cache.
    def prepare_rows(self, model: Llama, rows: int, max_seq: int) -> None:
        """The target's cache of `rows` rows exists; requests will take and leave its rows."""
        self.prepare(model, [], max_seq)

    def follow(self, model: Llama, alive: list) -> None:
        """A step that drafts nothing (a policy turned drafting off): a drafter with its own KV
        reads the step's input tokens, as the target does, so that it can draft at any later step.
        Nothing for drafters sharing the target's KV."""

    def prefill(self, chunks: list[list[int]], start: int, first_row: int) -> None:
        """The target just prefilled these prompt tokens, at positions start.. of rows first_row..
        (own caches only)."""

    def swap_rows(self, a: int, b: int, length: int) -> None:
        """The target exchanged cache rows a and b (own caches only)."""

    def graph_models(self) -> list[Llama]:
        """The models whose forwards this drafter runs besides the target's (their chain drafts
        replay CUDA graphs when the engine captures them: profiler.engine.graphs)."""
        return []

    # A drafter that reads the target's hidden states (EAGLE) sets reads_hidden; the engine then
    # keeps them (Llama.keep_hidden) and hands over those of the committed positions.
    reads_hidden = False

    def take_hidden(self, hidden: Tensor, spans: list[tuple[int, int, list[int]]]) -> None:
        """After a verification (or a plain decode step): the forward's hidden states [M, T, H]
        and, per decoding row, (row, first position, the indices in T of the committed positions
        first, first + 1, ...)."""


def forward_consecutive(model: Llama, tokens: Tensor, positions: Tensor) -> Tensor:
    """Logits [B, 1, V] after the last of T new tokens per row at consecutive positions (= cache
    slots), each seeing the cache below it and the new tokens before it (tokens, positions: [B, T])."""
    B, T = tokens.shape
    kernel = KernelLayout((positions[:, -1] + 1).to(torch.int32), chain_mask(T, tokens.device).expand(B, T, T))
    logits_at = torch.full((B, 1), T - 1, dtype=torch.long, device=tokens.device)
    return forward_new_tokens(model, tokens, positions, positions, kernel, logits_at)


class NgramDrafter(Drafter):
    """Prompt lookup over prompt + output: the tokens after the latest earlier occurrence of the
    history's last n-gram (n from max_ngram down to 1); a tree takes further matches with other
    next tokens. No match proposes the last token repeated."""
    name = "ngram"

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def propose(self, step, sampler=None):
        w, d = step.shape.width, step.shape.depth
        return torch.tensor([sum(self.lookup_many(tokens, d, w), []) for tokens in step.history]), None

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        return self.lookup_many(tokens, k, 1)[0]

    def match_length(self, tokens: list[int]) -> int:
        """n of the longest n-gram (up to max_ngram) ending the history that occurs earlier in it,
        0 where none does: what the lookup's proposal rests on."""
        for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
            tail = tokens[-n:]
            if any(tokens[start:start + n] == tail for start in range(len(tokens) - n - 1, -1, -1)):
                return n
        return 0

    def lookup_many(self, tokens: list[int], k: int, count: int) -> list[list[int]]:
        """Up to `count` continuations of k tokens with distinct first tokens, best match first."""
        found: list[list[int]] = []
        for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == tail:
                    follow = tokens[start + n:start + n + k]
                    if all(f[0] != follow[0] for f in found):
                        found.append(follow + [follow[-1]] * (k - len(follow)))
                        if len(found) == count:
                            return found
        found = found or [[tokens[-1]] * k]
        return found + [found[-1]] * (count - len(found))


class ModelDrafter(Drafter):
    """Drafts with a Llama (`draft_model(step)`), one forward per tree level."""
    sink: int | None = None
    window: int | None = None
    exit_layer: int | None = None

    def draft_model(self, step: DraftInput) -> Llama:
        return step.model

    def first_forward(self, model: Llama, step: DraftInput) -> Tensor:
        """Logits [B, V] after each root."""
        pos = step.positions[:, None]
        if self.on_kernels(step):
            return forward_consecutive(model, step.last[:, None], pos)[:, -1]
        mask = context_mask(pos, pos, int(pos.max()) + 1, self.sink, self.window)
        return model(step.last[:, None], pos, mask=mask, exit_layer=self.exit_layer)[:, -1]

    def on_kernels(self, step: DraftInput) -> bool:
        """A chain drafted by the whole draft model over its whole context is, at every forward, new
        tokens at consecutive slots: the attention kernel's layout, which CUDA graphs replay."""
        return step.kernels and step.shape.width == 1 and self.sink is None and self.exit_layer is None

    def propose(self, step, sampler=None):
        model, shape = self.draft_model(step), step.shape
        B, root = len(step.last), step.positions
        device = root.device
        nodes = torch.zeros(B, shape.nodes, dtype=torch.long, device=device)
        probs = None
        logits = self.first_forward(model, step)                                  # [B, V]
        for level in range(1, shape.depth + 1):
            at = shape.level_nodes(level).to(device)
            if sampler is None:
                chosen = logits.topk(shape.width, dim=-1).indices if level == 1 else logits.argmax(-1)
            else:
                q = sampler.probs(logits)
                if probs is None:
                    probs = torch.zeros(B, shape.nodes, q.shape[-1], device=device)
                if level == 1:        # width i.i.d. samples from one q, as SpecInfer's verification needs
                    chosen = torch.multinomial(q, shape.width, replacement=True, generator=sampler.generator)
                    probs[:, at] = q[:, None]
                else:
                    chosen = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=sampler.generator)
                    chosen = chosen.reshape(B, shape.width)
                    probs[:, at] = q
            nodes[:, at] = chosen.reshape(B, shape.width)
            if level == shape.depth:
                break
            logits = self.feed_level(model, step, level, nodes[:, at])                 # [B, W, V]
        return nodes, probs

    def feed_level(self, model: Llama, step: DraftInput, level: int, tokens: Tensor) -> Tensor:
        """Feed this level's nodes [B, W] (one per branch) and return the next level's logits [B, W, V]."""
        shape, root = step.shape, step.positions
        if self.on_kernels(step):          # the chain's node of this level at slot root + level
            return forward_consecutive(model, tokens, (root + level)[:, None])
        B, device = len(root), root.device
        at = shape.level_nodes(level).to(device)
        slots = root[:, None] + 1 + at
        positions = root[:, None] + level
        span = int(root.max()) + 1 + shape.nodes
        mask = context_mask(root[:, None].expand(B, shape.width), positions, span, self.sink, self.window)
        mask = add_tree_edges(mask, torch.arange(shape.width, device=device).expand(B, -1),
                              root[:, None] + 1 + torch.arange(shape.nodes, device=device), shape.ancestors[at.cpu()])
        return model(tokens, positions, mask=mask, slots=slots, exit_layer=self.exit_layer)


class SelfDrafter(ModelDrafter):
    """The target drafting for itself with less work: its first layers (LayerSkip) or all layers
    over a sink + recent-window KV budget (streaming, MagicDec). Its KV writes at the node slots
    are overwritten by the verification."""

    def __init__(self, exit_layer: int | None = None, sink: int | None = None, window: int | None = None):
        self.exit_layer, self.sink, self.window = exit_layer, sink, window
        self.name = "layerskip" if exit_layer is not None else "streaming"


class ShadowDrafter(ModelDrafter):
    """SubSpec: the target's own layers quantized (profiler.engine.shadow), sharing its KV cache."""

    def __init__(self, target: Llama, bits: int = 4, group_size: int = 64, use_kernels: bool | None = None):
        from profiler.engine.shadow import shadow_model

        self.name = f"shadow-int{bits}"
        self.shadow = shadow_model(target, bits, group_size, use_kernels)

    def prepare(self, model, prompts, max_seq):
        from profiler.engine.shadow import share_caches

        share_caches(self.shadow, model)

    def keep_rows(self, model, rows):
        self.prepare(model, [], 0)

    def draft_model(self, step):
        return self.shadow

    def graph_models(self):
        return [self.shadow]


class DraftModelDrafter(ModelDrafter):
    """A separate smaller model with its own KV cache, prefilled with the prompts. Each step it
    catches up by re-feeding the token before the root with the root (the token before the root
    may be a fully accepted last draft it never ran)."""
    name = "draft_model"

    def __init__(self, draft: Llama):
        self.draft = draft

    def prepare(self, model, prompts, max_seq):
        from profiler.engine.generate import prefill_logits

        self.draft.setup_cache(len(prompts), max_seq)
        prefill_logits(self.draft, prompts)

    def draft_model(self, step):
        return self.draft

    def first_forward(self, model, step):
        device = step.positions.device
        pos = step.positions[:, None] + torch.tensor([-1, 0], device=device)                  # [B, 2]
        previous = torch.tensor([h[-2] for h in step.history], device=device)
        tokens = torch.stack([previous, step.last], dim=1)
        if self.on_kernels(step):
            return forward_consecutive(model, tokens, pos)[:, -1]
        return model(tokens, pos, mask=causal_mask(pos, int(pos.max()) + 1))[:, -1]

    def graph_models(self):
        return [self.draft]

    def keep_rows(self, model, rows):
        self.draft.keep_rows(rows)

    def follow(self, model, alive):
        # As a drafting step's first forward: the token before the root (a fully accepted last draft
        # the draft never ran) and the root.
        device = model.lm_head.weight.device
        pos = torch.tensor([[r.position - 1, r.position] for r in alive], device=device)
        tokens = torch.tensor([r.history[-2:] for r in alive], device=device)
        self.draft(tokens, pos, mask=causal_mask(pos, int(pos.max()) + 1))

    def move_kv(self, rows, source, target):
        self.draft.move_kv(rows, source, target)

    def prepare_rows(self, model, rows, max_seq):
        self.draft.setup_cache(rows, max_seq)

    def prefill(self, chunks, start, first_row):
        from profiler.engine.generate import prefill_chunk_logits, prefill_logits

        if start == 0:
            prefill_logits(self.draft, chunks, first_row)
        else:
            for i, chunk in enumerate(chunks):
                prefill_chunk_logits(self.draft, chunk, start, first_row + i)

    def swap_rows(self, a, b, length):
        self.draft.swap_rows(a, b, length)
