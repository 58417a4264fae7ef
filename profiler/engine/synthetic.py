"""The synthetic drafter: speculation whose acceptance is set, on a model of any shape.

A random-weight model of a big shape (Llama-3.1-8B on a GPU) accepts nothing any real drafter
proposes, so its speculative runs measure nothing of speculation. This drafter knows what the
target will say: a recording pass (`record_continuations`) keeps each prompt's greedy
continuation, and at every step the drafter proposes, at draft position j, the recorded token with
probability a_j and a token the target will not choose otherwise, drawn independently per position
from a seeded generator. Verification stays the engine's own (greedy, lossless), so a step accepts
exactly the kept prefix and commits on average

    E = 1 + sum_{j=1..k} prod_{i<=j} a_i        ((1 - a^(k+1)) / (1 - a) for one rate a).

A tree's branch 0 is that chain; its other branches hold tokens that differ from the record's and
from each other at every level, so they never match and E is the chain's.

What drafting costs stays real: the drafter runs a draft of a stated shape with random weights
(`draft_cost`) as a DraftModelDrafter runs a draft model, and discards its tokens: "head" (one
decoder layer of the target's shape, reading the target's embeddings and LM head, with a KV cache
of its own: what an EAGLE head runs), a simulator model preset (a small draft model), or "none" (no
forwards: prompt lookup's cost).

Divergence: the record is the target decoding one token a forward; a verification runs k + 1 tokens
through other kernels, and in bf16 an argmax on a near-tie can flip. From there the output leaves
the record, whose tokens are then no longer what the target says, and the drafts get rejected.
Each step the drafter checks the tokens committed since its last look against the record, counts
the requests that left it and the steps it drafted for them while off it, and keeps drafting.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from profiler.engine.drafters import DraftInput, Drafter
from profiler.engine.model import Llama


def record_continuations(model: Llama, prompts: list[list[int]], max_new_tokens: int, lookahead: int, batch: int,
                         eos_id: int | None, cache_tokens: int = 0) -> dict[tuple[int, ...], list[int]]:
    """The target's greedy continuation of each prompt (keyed by its tokens), decoded one token a
    forward in static batches of `batch` as the run's, max_new_tokens + lookahead tokens long (or to
    EOS): a step near a request's end still drafts `lookahead` (the draft's depth) tokens past it,
    and its accept flags count them before the output is cut. cache_tokens: the run's KV cache size
    (profiler.engine.serving.serve), so that the run keeps this pass's cache and CUDA graphs."""
    from profiler.engine.serving import speculative_generate

    records: dict[tuple[int, ...], list[int]] = {}
    for first in range(0, len(prompts), batch):
        chunk = prompts[first:first + batch]
        generation = speculative_generate(model, chunk, max_new_tokens + lookahead, None, eos_id=eos_id,
                                          cache_tokens=cache_tokens, rows=batch)
        for prompt, output in zip(chunk, generation.outputs):
            records.setdefault(tuple(prompt), output)
    return records


def position_rates(acceptance: tuple[float, ...], depth: int) -> list[float]:
    """a_1..a_depth: the given rates, positions past the last taking the last."""
    return [acceptance[min(j, len(acceptance) - 1)] for j in range(depth)]


def closed_form_tokens_per_step(acceptance: tuple[float, ...], depth: int) -> float:
    """E = 1 + sum_{j=1..depth} prod_{i<=j} a_i: tokens a step commits on average."""
    survive, tokens = 1.0, 1.0
    for a in position_rates(acceptance, depth):
        survive *= a
        tokens += survive
    return tokens


def draft_cost(draft_shape: str, target: Llama, seed: int) -> Drafter | None:
    """The drafter whose forwards a synthetic drafter runs for their time: a DraftModelDrafter of
    random weights in the target's dtype and device, or None for "none". ValueError (ModelLoadError)
    for a preset the engine cannot run or whose vocabulary is not the target's."""
    from profiler.engine.drafters import DraftModelDrafter
    from profiler.engine.loaders import preset_config, random_model

    if draft_shape == "none":
        return None
    weight = target.lm_head.weight
    if draft_shape == "head":
        draft = random_model(replace(target.config, layers=1), weight.dtype, str(weight.device), seed).model
        # An EAGLE head reads the target's embeddings and LM head: no second copy of either.
        draft.embed, draft.lm_head = target.embed, target.lm_head
        return DraftModelDrafter(draft)
    config = preset_config(draft_shape)
    if config.vocab != target.config.vocab:
        raise ValueError(f"{draft_shape}'s vocabulary {config.vocab} differs from the target's {target.config.vocab}")
    return DraftModelDrafter(random_model(config, weight.dtype, str(weight.device), seed).model)


@dataclass
class _Track:
    """One request as the drafter follows it (found by its history list, which the engine extends in place)."""
    history: list[int]             # held, so that its id is not reused while tracked
    record: list[int]              # the recorded continuation of its prompt
    prompt_tokens: int
    matched: int = 0               # output tokens known to equal the record's
    off_at: int | None = None      # the first output position that differs from the record, while it does
    diverged: bool = False         # ever left the record


class NoForwards(Drafter):
    """The draft cost of `--draft-shape none` (as prompt lookup): no forwards, every hook a no-op."""

    def propose(self, step: DraftInput, sampler=None):
        return None, None


class SyntheticDrafter(Drafter):
    """Proposes the recorded continuation, each position kept with its rate (see the module docstring).
    records: record_continuations' result (set before the first step); acceptance: one rate, or one a
    position; vocab: the target's; cost: draft_cost's drafter, whose forwards run and whose tokens
    are discarded, and to which every hook is handed."""
    name = "synthetic"

    def __init__(self, records: dict[tuple[int, ...], list[int]], acceptance: tuple[float, ...], vocab: int,
                 seed: int = 0, cost: Drafter | None = None):
        if not acceptance or not all(0.0 <= a <= 1.0 for a in acceptance):
            raise ValueError(f"acceptance rates must be in [0, 1] (got {acceptance})")
        self.records = records
        self.acceptance = tuple(float(a) for a in acceptance)
        self.vocab = vocab
        self.seed = seed
        self.cost = cost if cost is not None else NoForwards()
        self.reset()

    def reset(self) -> None:
        """Start over from the seed with no request seen and nothing counted (after a warm-up)."""
        self.rng = np.random.default_rng(self.seed)
        self.tracks: dict[int, _Track] = {}
        self.diverged_requests = 0
        self.steps_after_divergence = 0

    def summary(self, depth: int) -> dict:
        """What summary.json records of the drafter (depth: the chain's k or the tree's depth)."""
        return {"acceptance": position_rates(self.acceptance, depth),
                "closed_form_tokens_per_step": closed_form_tokens_per_step(self.acceptance, depth),
                "diverged_requests": self.diverged_requests, "steps_after_divergence": self.steps_after_divergence}

    def propose(self, step: DraftInput, sampler=None):
        if sampler is not None:
            raise ValueError("the synthetic drafter proposes greedy continuations; it takes no sampler")
        if step.prompt_tokens is None:
            raise ValueError("the synthetic drafter needs each request's prompt length (DraftInput.prompt_tokens)")
        self.cost.propose(step)                # the draft's forwards, for their time; their tokens are not used
        W, D = step.shape.width, step.shape.depth
        keep = self.rng.random((len(step.history), D)) < np.array(position_rates(self.acceptance, D))   # [B, D]
        nodes = np.empty((len(step.history), W * D), dtype=np.int64)                                  # [B, W * D]
        for b, (history, prompt_tokens) in enumerate(zip(step.history, step.prompt_tokens)):
            track = self._follow(history, prompt_tokens)
            done = len(history) - prompt_tokens
            upcoming = track.record[done:done + D]
            for level in range(D):
                # Past the record's end nothing is known: any token, proposed as a wrong one.
                truth = upcoming[level] if level < len(upcoming) else history[-1]
                kept = level < len(upcoming) and keep[b, level]
                nodes[b, level] = truth if kept else (truth + 1) % self.vocab
                for branch in range(1, W):    # never the record's, never branch 0's, never each other's
                    nodes[b, branch * D + level] = (truth + 1 + branch) % self.vocab
        return torch.from_numpy(nodes), None

    def _follow(self, history: list[int], prompt_tokens: int) -> _Track:
        """The request's track, its new output checked against the record and the counts updated."""
        track = self.tracks.get(id(history))
        if track is None or track.history is not history:
            record = self.records.get(tuple(history[:prompt_tokens]))
            if record is None:
                raise ValueError(f"no recorded continuation of a {prompt_tokens}-token prompt")
            track = self.tracks[id(history)] = _Track(history, record, prompt_tokens)
        done = len(history) - prompt_tokens
        at = track.off_at
        if at is not None and (done <= at or at < len(track.record)
                               and history[prompt_tokens + at] == track.record[at]):
            # The differing token is gone (SpecPV's rectify rolls back to the first token partial
            # attention chose otherwise, which is where the output left the record): check it all again.
            track.off_at, track.matched = None, 0
        if track.off_at is None:
            output = history[prompt_tokens + track.matched:]
            expected = track.record[track.matched:done]
            if output != expected:
                track.off_at = track.matched + next((i for i, (x, y) in enumerate(zip(output, expected)) if x != y),
                                                    len(expected))
                self.diverged_requests += not track.diverged
                track.diverged = True
            else:
                track.matched = done
        self.steps_after_divergence += track.off_at is not None
        return track

    # Every hook goes to the draft whose cost is run; its cache follows the target's as a draft model's.
    def prepare(self, model, prompts, max_seq):
        self.tracks.clear()
        self.cost.prepare(model, prompts, max_seq)

    def prepare_rows(self, model, rows, max_seq):
        self.tracks.clear()
        self.cost.prepare_rows(model, rows, max_seq)

    def prefill(self, chunks, start, first_row):
        self.cost.prefill(chunks, start, first_row)

    def follow(self, model, alive):
        self.cost.follow(model, alive)

    def move_kv(self, rows, source, target):
        self.cost.move_kv(rows, source, target)

    def swap_rows(self, a, b, length):
        self.cost.swap_rows(a, b, length)

    def keep_rows(self, model, rows):
        self.cost.keep_rows(model, rows)

    def graph_models(self):
        return self.cost.graph_models()
