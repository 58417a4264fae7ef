"""Greedy autoregressive decoding on `profiler.engine.model.Llama`: prefill, decode_one_token, generate.

Requests in a batch keep their own positions: a ragged batch of prompts is padded to a common
length, and the padding writes to a trash slot (the cache's last position) that no query attends.
"""
from __future__ import annotations

import torch
from torch import Tensor

from profiler.engine.model import Llama


def prefill_logits(model: Llama, prompts: list[list[int]], first_row: int = 0) -> Tensor:
    """Run the prompts (one per cache row, from `first_row`) and return each one's next-token
    logits: [B, V] fp32."""
    B = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    T = int(lengths.max())
    trash = model.layers[0].attention.k_cache.shape[2] - 1
    if T >= trash:
        raise ValueError(f"prompt of {T} tokens does not fit the cache of {trash} positions")
    tokens = torch.zeros(B, T, dtype=torch.long)
    positions = torch.full((B, T), trash, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        tokens[b, :len(prompt)] = torch.tensor(prompt)
        positions[b, :len(prompt)] = torch.arange(len(prompt))
    # Attention is causal over the first T slots (a prompt forward): padding tokens write to the
    # trash slot past them, so a real query never sees a padding key.
    device = model.lm_head.weight.device
    return model(tokens.to(device), positions.to(device), logits_at=(lengths - 1).to(device), prompt=True,
                 first_row=first_row)[:, -1]


def prefill_chunk_logits(model: Llama, chunk: list[int], start: int, row: int) -> Tensor:
    """Run one request's prompt tokens at positions start.. in cache row `row` (its earlier
    tokens already there) and return the logits after the last: [V] fp32. A chunked prefill
    computes what one prompt forward does, in pieces."""
    if start == 0:
        return prefill_logits(model, [chunk], row)[0]
    device = model.lm_head.weight.device
    positions = torch.arange(start, start + len(chunk), device=device)[None]
    tokens = torch.tensor([chunk], device=device)
    return model(tokens, positions, logits_at=torch.tensor([len(chunk) - 1], device=device), first_row=row)[0, -1]


def prefill(model: Llama, prompts: list[list[int]]) -> Tensor:
    """Run the prompts and return the greedy next token of each: [B] int64."""
    return prefill_logits(model, prompts).argmax(-1)


def decode_one_token(model: Llama, tokens: Tensor, positions: Tensor) -> Tensor:
    """tokens, positions: [B]; each row at its own position. Returns the next tokens [B]."""
    logits = model(tokens[:, None], positions[:, None])
    return logits[:, -1].argmax(-1)


@torch.inference_mode()
def generate(model: Llama, prompts: list[list[int]], max_new_tokens: int, eos_id: int | None = None,
             max_seq: int | None = None) -> list[list[int]]:
    """Greedy continuation of each prompt; a row stops at eos (kept) or after max_new_tokens."""
    B = len(prompts)
    longest = max(len(p) for p in prompts)
    model.setup_cache(B, max_seq or longest + max_new_tokens + 1)
    next_tokens = prefill(model, prompts)
    positions = torch.tensor([len(p) for p in prompts], device=next_tokens.device)
    outputs = [[int(t)] for t in next_tokens]
    done = [eos_id is not None and out[-1] == eos_id for out in outputs]
    for _ in range(max_new_tokens - 1):
        if all(done):
            break
        next_tokens = decode_one_token(model, next_tokens, positions)
        positions = positions + 1
        for b in range(B):
            if not done[b]:
                outputs[b].append(int(next_tokens[b]))
                done[b] = eos_id is not None and outputs[b][-1] == eos_id
    return outputs
