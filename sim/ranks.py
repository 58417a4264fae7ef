"""Attention data parallel: one engine step of ranks that each serve their own requests and step together.

With attention data parallel (SGLang's --enable-dp-attention, vLLM's data-parallel ranks of an MoE),
each rank holds its own requests and their KV: it schedules them, drafts for them and runs their
attention and every dense linear on its own GPUs (its tensor-parallel group). The MoE layers see
every rank's tokens: dispatched to whichever GPU holds their experts and combined back, so the
ranks run every forward in lockstep and the slowest rank sets the step (a rank with no request
still joins the exchange). A request belongs to rank rid mod ranks: the engines' round-robin
dispatch in arrival order.

    plan = plan_ranked_step(config, shape, slots, n, chunks)   # one RankedStep (sim/cost/work.py)

Each rank's work is planned by the single-rank planner over its own rows (sim/step.py); the routed
experts are priced once per forward over all ranks' tokens (`ExpertsWork`), with the busiest
rank's share of the tokens for the exchange. Whole requests per rank are what makes the ranks
uneven: the slowest rank's own work is what the step pays, not the mean. With two-batch overlap
each rank runs its rows as two micro-batches (each reading the weights again), and one's exchange
hides behind the other's compute (sim/cost/work.py RankedStep).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from sim.cost.work import ExpertsWork, Forward, RankedStep, StepHost, Subtotal, UniformForward, WorkItem
from sim.slots import DecodeSlots


def rank_of(rids, ranks: int):
    """The rank each request is served on: round robin in arrival order."""
    return rids % ranks


def plan_ranked_step(plan_one: Callable, config, shape, slots: DecodeSlots, n: int, chunks=(),
                     predrawn: np.ndarray | None = None, catch_up: tuple[int, int] | None = None):
    """One lockstep step of config.data_parallel ranks (the module docstring); plan_one: the
    planner (sim/step.py plan_step), given a rank's config (config.rank), over all rows for what
    the step commits and its expert tokens, and over each rank's rows for what each rank runs."""
    ranks, one = config.data_parallel, config.rank
    whole = plan_one(one, shape, slots, n, chunks, predrawn, catch_up)
    owner = rank_of(slots.rid[:n], ranks)
    # Two-batch overlap: each rank's rows run as two micro-batches (alternate rows, its prompt
    # chunks with the first), each its own forwards over the weights; the host schedules once.
    batches = 2 if config.two_batch_overlap else 1
    per_rank: list[list[WorkItem]] = []
    rank_tokens = []
    for r in range(ranks):
        mine_all = np.flatnonzero(owner == r)
        work: list[WorkItem] = []
        for b in range(batches):
            rows = mine_all[b::batches]
            own_chunks = [c for c in chunks if rank_of(c[0][0], ranks) == r] if b == 0 else []
            own_catch_up = None
            if catch_up is not None:
                own_catch_up = (catch_up[0], round(catch_up[1] * len(rows) / n) if n else 0)
            planned = plan_one(one, shape, slots.subset(rows), len(rows), own_chunks,
                               predrawn[rows] if predrawn is not None else None, own_catch_up)
            work += list(planned) if b == 0 else [item for item in planned if not isinstance(item, StepHost)]
        per_rank.append(work)
        rank_tokens.append(sum(tokens for _, _, tokens, _ in expert_forwards(work)))
    total = sum(rank_tokens)
    busiest = max(rank_tokens) / total if total else 0.0
    # Each micro-batch's MoE layers over half of every rank's tokens.
    experts = [ExpertsWork(pricer=pricer, phase=phase, tokens=tokens / batches, rank_tokens=tokens * busiest / batches,
                           repeat=repeat * batches)
               for pricer, phase, tokens, repeat in expert_forwards(whole)]
    step = type(whole)([RankedStep(ranks=per_rank, experts=experts, overlap=config.two_batch_overlap)])
    step.replayed_plain = whole.replayed_plain
    if hasattr(whole, "full"):
        step.full, step.partial = whole.full, whole.partial
    return step


def expert_forwards(work) -> list[tuple]:
    """(pricer, phase, query tokens, repeat) of each forward in `work` whose stack has MoE layers,
    Subtotals' included; a forward over several groups counts in the phase with most tokens."""
    found = []
    for item in work:
        if isinstance(item, Subtotal):
            found += expert_forwards(item.items)
        elif isinstance(item, (Forward, UniformForward)) and item.pricer.stack.moe_layers:
            if isinstance(item, UniformForward):
                tokens = item.requests * item.query if item.tokens is None else item.tokens
                phase = item.phase
            else:
                tokens = sum(g.tokens for g in item.groups)
                phase = max(item.groups, key=lambda g: g.tokens).phase
            if tokens:
                found.append((item.pricer, phase, tokens, item.repeat))
    return found
