"""What an EAGLE head learns from: the target's own greedy continuations and its hidden states.

Prompts come by path: chat prompts from a JSONL file (Spec-Bench's questions: `prompt` or the first
of `turns`, with a `category`), minus the held-out categories, and excerpts of a plain text (each
continued as a summary request, as the live runs' long-context prompts are). The target continues
each prompt greedily (batched), then one forward over prompt + continuation gives the last hidden
state at every position and the target's greedy next token there (the label a head's draft must
match for greedy verification to accept it).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from profiler.engine.model import Llama, fp32_logits


@dataclass
class Example:
    tokens: Tensor         # [L] int64: prompt + the target's greedy continuation
    hidden: Tensor         # [L, H]: the target's last hidden state at each position (before the final norm)
    labels: Tensor         # [L] int64: the target's greedy next token after each position
    prompt_tokens: int
    category: str


def chat_prompts(tok, path: Path, held_out: set[str], limit: int | None) -> list[tuple[list[int], str]]:
    """(token ids, category) of the file's chat prompts outside the held-out categories."""
    from profiler.live.prompts import read_prompts

    rows = [r for r in read_prompts(path, None) if r["category"] not in held_out]
    return [(tok.encode_chat(r["text"]), r["category"]) for r in rows[:limit]]


def text_prompts(tok, path: Path, excerpt_tokens: int, count: int) -> list[tuple[list[int], str]]:
    """(token ids, "text") of `count` consecutive excerpts of the text, each a summary request."""
    from profiler.live.prompts import long_context_prompts

    return [(ids, "text") for ids in long_context_prompts(tok, path, excerpt_tokens, count)]


@torch.inference_mode()
def continue_greedily(model: Llama, prompts: list[list[int]], max_new_tokens: int, eos_id: int, batch: int,
                      progress=None) -> list[list[int]]:
    """Each prompt's greedy continuation (up to max_new_tokens, eos kept), `batch` at a time,
    prompts of similar length together."""
    from profiler.engine.generate import generate

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outputs: list[list[int] | None] = [None] * len(prompts)
    for start in range(0, len(order), batch):
        rows = order[start:start + batch]
        for i, out in zip(rows, generate(model, [prompts[i] for i in rows], max_new_tokens, eos_id)):
            outputs[i] = out
        if progress is not None:
            progress.update(len(rows))
    return outputs


@torch.inference_mode()
def hidden_states(model: Llama, sequence: list[int]) -> tuple[Tensor, Tensor]:
    """[L, H] last hidden states and [L] greedy next tokens of one sequence, in one forward."""
    device = model.lm_head.weight.device
    model.setup_cache(1, len(sequence) + 1)
    tokens = torch.tensor([sequence], device=device)
    positions = torch.arange(len(sequence), device=device)[None]
    hidden = model.last_hidden(tokens, positions)[0]
    labels = fp32_logits(model.norm(hidden), model.lm_head.weight).argmax(-1)
    return hidden.float().cpu(), labels.cpu()


def build_examples(model: Llama, tok, prompts: list[tuple[list[int], str]], max_new_tokens: int, batch: int,
                   progress=None) -> list[Example]:
    """The prompts continued (progress: a bar counting 2 per prompt, its continuation and its
    hidden states) and read back in one forward each."""
    outputs = continue_greedily(model, [p for p, _ in prompts], max_new_tokens, tok.eos_id, batch, progress)
    examples = []
    for (prompt, category), output in zip(prompts, outputs):
        sequence = prompt + output
        hidden, labels = hidden_states(model, sequence)
        examples.append(Example(torch.tensor(sequence), hidden, labels, len(prompt), category))
        if progress is not None:
            progress.update(1)
    return examples
