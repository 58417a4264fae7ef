"""Prompt chunks: an iteration's prefill token budget shared among the prompts being prefilled,
by an engine that also decodes (sim/pipeline.py) and by a prefill server (sim/pools.py)."""
from __future__ import annotations


def prefill_chunks(prefilling: list[list[int]], budget: int) -> list[tuple[list[int], int]]:
    """Share an iteration's prefill token budget among prefilling requests ([rid, done, total]),
    oldest first."""
    chunks = []
    for entry in prefilling:
        if budget == 0:
            break
        chunk = min(entry[2] - entry[1], budget)
        chunks.append((entry, chunk))
        budget -= chunk
    return chunks
