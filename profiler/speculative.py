"""Speculative decoding on the torch Llama: drafters, greedy chain verification, per-step records.

One engine step for a batch of requests, each at its own position p (the last committed token,
whose KV is not written yet):
  1. the drafter proposes k tokens per request;
  2. one target forward runs [t_p, d_1 .. d_k] at positions p .. p+k, writing their KV;
  3. each request keeps the longest prefix of drafts equal to the target's greedy choices, plus
     the target's own next token (the bonus or the correction), and advances by that many.
Rejected drafts need no rollback: their KV sits past the request's position, where no query looks
until the next step overwrites it. Greedy verification is lossless: the output is the target's
greedy output token for token. With a temperature, drafts are sampled and verified by rejection
sampling (profiler.sampling), which keeps the target's output distribution.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from profiler.model import Llama, causal_mask, streaming_mask
from profiler.sampling import probs_from_logits, sample, verify_chain


@dataclass(frozen=True)
class Sampler:
    """Temperature > 0 with nucleus filtering; greedy decoding uses no Sampler."""
    temperature: float
    top_p: float = 1.0
    generator: torch.Generator | None = None

    def probs(self, logits: Tensor) -> Tensor:
        return probs_from_logits(logits, self.temperature, self.top_p)

    def draw(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        probs = self.probs(logits)
        return sample(probs, self.generator), probs


class Drafter:
    name = "none"

    def prepare(self, model: Llama) -> None:
        """Called once the target's KV cache exists (a drafter sharing it links to it here)."""

    def propose(self, model: Llama, history: list[list[int]], last: Tensor, positions: Tensor, k: int,
                sampler: Sampler | None = None) -> tuple[Tensor, Tensor | None]:
        """Drafts [B, k] for requests whose last committed token `last` [B] sits at `positions` [B],
        and the draft distributions [B, k, V] they were sampled from (None: deterministic drafts)."""
        raise NotImplementedError


class NgramDrafter(Drafter):
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the history's last
    n-gram (n from max_ngram down to 1); no match proposes the last token repeated."""
    name = "ngram"

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def propose(self, model, history, last, positions, k, sampler=None):
        return torch.tensor([self.lookup(tokens, k) for tokens in history]), None

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == tail:
                    follow = tokens[start + n:start + n + k]
                    return follow + [follow[-1]] * (k - len(follow))
        return [tokens[-1]] * k


class SelfDrafter(Drafter):
    """The target drafting for itself with less work: its first layers (LayerSkip) or all layers
    over a sink + recent-window KV budget (streaming, MagicDec). Its KV writes at draft positions
    are overwritten by the verification."""

    def __init__(self, exit_layer: int | None = None, sink: int | None = None, window: int | None = None):
        self.exit_layer, self.sink, self.window = exit_layer, sink, window
        self.name = "layerskip" if exit_layer is not None else "streaming"

    def propose(self, model, history, last, positions, k, sampler=None):
        drafts, probs = [], []
        token = last
        for i in range(k):
            pos = (positions + i)[:, None]
            slots = int(pos.max()) + 1
            mask = (streaming_mask(pos, slots, self.sink, self.window) if self.window is not None
                    else causal_mask(pos, slots))
            logits = model(token[:, None], pos, mask=mask, exit_layer=self.exit_layer)[:, -1]
            if sampler is None:
                token = logits.argmax(-1)
            else:
                token, q = sampler.draw(logits)
                probs.append(q)
            drafts.append(token)
        return torch.stack(drafts, dim=1), (torch.stack(probs, dim=1) if probs else None)


class ShadowDrafter(SelfDrafter):
    """SubSpec: the target's own layers quantized (profiler.shadow), sharing its KV cache."""

    def __init__(self, target: Llama, bits: int = 4, group_size: int = 64):
        from profiler.shadow import shadow_model

        super().__init__()
        self.name = f"shadow-int{bits}"
        self.shadow = shadow_model(target, bits, group_size)

    def prepare(self, model: Llama) -> None:
        from profiler.shadow import share_caches

        share_caches(self.shadow, model)

    def propose(self, model, history, last, positions, k, sampler=None):
        return super().propose(self.shadow, history, last, positions, k, sampler)


@dataclass
class StepRecord:
    step: int
    request: int
    mode: str
    query_tokens: int
    kv_tokens: int
    drafted: int
    accepted: int
    committed: int
    accept_flags: list[bool]
    draft_s: float
    verify_s: float
    other_s: float


@dataclass
class Generation:
    outputs: list[list[int]]
    steps: list[StepRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    first_token_s: list[float] = field(default_factory=list)
    finish_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0


@torch.inference_mode()
def speculative_generate(model: Llama, prompts: list[list[int]], max_new_tokens: int, drafter: Drafter | None,
                         k: int = 4, eos_id: int | None = None, sampler: Sampler | None = None) -> Generation:
    """Generation of every prompt, greedy (or sampled with `sampler`), speculative when `drafter`
    is given (chain of k)."""
    from profiler.generate import prefill_logits

    B = len(prompts)
    longest = max(len(p) for p in prompts)
    model.setup_cache(B, longest + max_new_tokens + k + 2)
    if drafter is not None:
        drafter.prepare(model)
    start = time.perf_counter()
    first_logits = prefill_logits(model, prompts)
    first = first_logits.argmax(-1) if sampler is None else sampler.draw(first_logits)[0]
    now = time.perf_counter()
    gen = Generation(outputs=[[int(t)] for t in first], prefill_s=now - start,
                     first_token_s=[now - start] * B, finish_s=[0.0] * B)
    history = [list(p) + out for p, out in zip(prompts, gen.outputs)]
    positions = torch.tensor([len(p) for p in prompts])       # where each last committed token goes
    last = first.clone()
    done = [_finished(out, max_new_tokens, eos_id) for out in gen.outputs]
    step = 0
    while not all(done):
        step += 1
        # Finished rows stay in the batch (their cache row is theirs) but stop advancing.
        active = torch.tensor([not d for d in done])
        t0 = time.perf_counter()
        drafts, draft_probs = (drafter.propose(model, history, last, positions, k, sampler)
                               if drafter is not None else (None, None))
        t1 = time.perf_counter()
        if drafts is None:
            tokens = last[:, None]
        else:
            tokens = torch.cat([last[:, None], drafts], dim=1)                       # [B, k+1]
        T = tokens.shape[1]
        query_positions = positions[:, None] + torch.arange(T)
        logits = model(tokens, query_positions)
        if sampler is None:
            choice = logits.argmax(-1)                                               # [B, T]
            if drafts is None:
                flags = torch.zeros(B, 0, dtype=torch.bool)
                accepted = torch.zeros(B, dtype=torch.long)
            else:
                flags = drafts == choice[:, :-1]
                accepted = flags.long().cumprod(dim=1).sum(dim=1)                      # longest prefix
            following = choice.gather(1, accepted[:, None])[:, 0]
        elif drafts is None:
            flags = torch.zeros(B, 0, dtype=torch.bool)
            accepted = torch.zeros(B, dtype=torch.long)
            following = sampler.draw(logits[:, -1])[0]
        else:
            flags, accepted, following = verify_chain(sampler.probs(logits), drafts, draft_probs, sampler.generator)
        t2 = time.perf_counter()
        for b in range(B):
            if done[b]:
                continue
            n = int(accepted[b])
            new = (drafts[b, :n].tolist() if drafts is not None else []) + [int(following[b])]
            new = _truncate(new, gen.outputs[b], max_new_tokens, eos_id)
            gen.outputs[b].extend(new)
            history[b].extend(new)
            gen.steps.append(StepRecord(step, b, "verify" if drafts is not None else "decode", T,
                                        int(positions[b]) + T, T - 1, n, len(new),
                                        flags[b].tolist(), t1 - t0, t2 - t1, 0.0))
            done[b] = _finished(gen.outputs[b], max_new_tokens, eos_id)
            if done[b]:
                gen.finish_s[b] = time.perf_counter() - start
        positions = positions + torch.where(active, accepted + 1, 0)
        last = following
        t3 = time.perf_counter()
        for record in gen.steps[-B:]:
            if record.step == step:
                record.other_s = t3 - t2
    gen.wall_s = time.perf_counter() - start
    return gen


def _finished(output: list[int], max_new_tokens: int, eos_id: int | None) -> bool:
    return len(output) >= max_new_tokens or (eos_id is not None and bool(output) and output[-1] == eos_id)


def _truncate(new: list[int], output: list[int], max_new_tokens: int, eos_id: int | None) -> list[int]:
    """Keep what the request may still emit: up to max_new_tokens, and nothing after EOS."""
    new = new[:max_new_tokens - len(output)]
    if eos_id is not None and eos_id in new:
        new = new[:new.index(eos_id) + 1]
    return new
