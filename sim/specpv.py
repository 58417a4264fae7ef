"""SpecPV in the simulated engine: which rows verify against which KV, and what that leaves behind.

Each decoding request verifies against its partial KV (sink + selected blocks + window + the tokens
accepted since its last refresh) until its period is reached, then once against the full KV,
re-feeding the tokens accepted since the refresh and re-selecting blocks; a request whose context
is still within sink + budget + window verifies plainly. Rows of one step can be in different
modes. `plan_partial_verify` splits a step's rows into those groups (and the block selection they
pay); `account_partial_verify` keeps the per-request state and the run's counts after the step:
tokens accepted under partial attention, those expected to differ from what full attention picks,
and, with rectify, the roll-back at the first disagreement.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from sim.cost.batch import FULL, PARTIAL, VERIFY, Group, uniform_group
from sim.cost.work import Pricer, Selection, WorkItem
from sim.scenario.speculation import Disagreement, PartialVerify
from sim.slots import INT, DecodeSlots


def plan_partial_verify(pv: PartialVerify, target: Pricer, verify_tokens: int, pad_ragged: bool, slots: DecodeSlots,
                        n: int, ctx: np.ndarray, span: np.ndarray, groups: list[Group]):
    """Split decoding slots 0..n-1 into full-attention, partial and full-refresh groups (appended
    to `groups`, the target forward's); ctx: each row's own context; span: the context its full
    attention reads. Returns the block selections (sim/cost/work.py Selection) and the rows' full
    and partial masks [n]."""
    s, V = slots, verify_tokens
    own = len(groups)                  # groups from here on are this method's
    selections: list[WorkItem] = []
    eligible = ctx > pv.static_tokens
    period_reached = (s.since[:n] if pv.period_unit == "tokens" else s.steps_since[:n]) >= pv.period
    full = eligible & (period_reached | (s.selected[:n] == 0))
    partial = eligible & ~full
    plain = ~eligible
    if plain.any():
        kv = span[plain] + V - 1
        groups.append(uniform_group(VERIFY, len(kv), V, int(kv.sum()), kv_tokens=kv))
    if partial.any():
        buffer = s.since[:n][partial]
        kv = pv.static_tokens + buffer + V
        groups.append(uniform_group(PARTIAL, len(kv), V, int(kv.sum()), kv_tokens=kv))
        if pv.reselect == "step":
            # Quest: every partial step scores the blocks with its own queries.
            selections.append(Selection(pricer=target, requests=len(kv), context_sum=int(ctx[partial].sum()),
                                        query_tokens_sum=len(kv) * V, budget_tokens=pv.budget, block_tokens=pv.block,
                                        part="scores"))
    if full.any():
        # Re-feed the tokens accepted since the refresh, then verify the new drafts.
        q = s.since[:n][full] + V
        kv = span[full] + V - 1
        groups.append(Group(phase=FULL, requests=len(q), tokens=int(q.sum()), query_max=int(q.max()),
                            kv_tokens_sum=int(kv.sum()), logits_tokens=int(q.sum()), query_tokens=q, kv_tokens=kv))
        selections.append(Selection(pricer=target, requests=len(q), context_sum=int(ctx[full].sum()) + len(q) * (V - 1),
                                    query_tokens_sum=int(q.sum()), budget_tokens=pv.budget, block_tokens=pv.block,
                                    part="refresh" if pv.reselect == "refresh" else "summaries"))
        if pad_ragged:
            # A static-shape engine runs every row of this step at the longest row's tokens.
            longest = int(q.max())
            for i in range(own, len(groups)):
                g = groups[i]
                groups[i] = replace(g, tokens=g.requests * longest, query_max=longest,
                                       query_tokens=None if g.query_tokens is None else np.full(g.requests, longest))
    return selections, full, partial


def account_partial_verify(pv: PartialVerify, slots: DecodeSlots, n: int, committed: np.ndarray, full: np.ndarray,
                           partial: np.ndarray, record, rolled_back, rng: np.random.Generator) -> np.ndarray:
    """After a step of slots 0..n-1 committed `committed` [n]: the rows' SpecPV state and the run's
    counts (`record`, a RunRecord); with rectify, a full verification rolls back at the first
    disagreement (`rolled_back(rids, steps)`: a replayed live run's own, else drawn from `rng`).
    Returns the tokens each row keeps."""
    s = slots
    ctx = s.ctx[:n]
    if partial.any():
        taken = committed[partial]
        record.partial_accepted_tokens += int(taken.sum())
        record.partial_steps += len(taken)
        if not pv.rectify:   # final as accepted: each may differ from what full attention picks
            p = disagreement_probability(pv.disagreement, pv.budget, pv.static_tokens, ctx[partial])
            record.divergent_tokens += float((p * taken).sum())
        s.since[:n][partial] += taken
        s.steps_since[:n][partial] += 1
    if full.any():
        record.full_verifications += int(full.sum())
        if pv.rectify:
            since = s.since[:n][full]
            if rolled_back is not None:
                # A replayed live run: its own roll-backs at this step.
                rollback = np.minimum(rolled_back(s.rid[:n][full], s.steps[:n][full] - 1), since)
            else:
                p = disagreement_probability(pv.disagreement, pv.budget, pv.static_tokens, ctx[full])
                # Index of the first disagreeing token in the buffer: geometric with parameter p.
                u = 1.0 - rng.random(len(since))
                with np.errstate(divide="ignore"):
                    first_bad = np.floor(np.log(u) / np.log1p(-np.minimum(p, 1 - 1e-12)))
                rollback = since - np.minimum(first_bad, since).astype(INT)
            bad = rollback > 0
            final = s.final[:n][full] == 1
            if bad.any() or final.any():
                # Keep the tokens before the disagreement, replace it by the target's token and
                # discard the rest of the buffer together with this step's drafts; a request's last
                # check commits nothing new when nothing disagrees (it is already done).
                committed = committed.copy()
                committed[full] = np.where(bad, 1 - rollback, np.where(final, 0, committed[full]))
                record.rolled_back_tokens += int(rollback.sum())
            s.final[:n][full] = 0
        s.since[:n][full] = 0
        s.steps_since[:n][full] = 0
        s.selected[:n][full] = 1
    return committed


def hold_last_check(slots: DecodeSlots, n: int, done: np.ndarray) -> np.ndarray:
    """Rectify is lossless: tokens accepted under partial attention since the last refresh are
    re-checked by one more full verification before the request ends. Rows of `done` [n] with such
    tokens are held for it (no longer done); returns the rows done now."""
    s = slots
    unchecked = done & (s.since[:n] > 0)
    if unchecked.any():
        s.selected[:n][unchecked] = 0
        s.final[:n][unchecked] = 1
        done &= ~unchecked
    return done


def unchecked_divergence(pv: PartialVerify, since: np.ndarray, ctx: np.ndarray) -> float:
    """Expected tokens that differ from full attention's among the `since` tokens [m] each leaving
    request accepted after its last full verification (rectify never re-checked them), at
    contexts `ctx` [m]."""
    p = disagreement_probability(pv.disagreement, pv.budget, pv.static_tokens, ctx)
    return float((p * since).sum())


def disagreement_probability(d: Disagreement, budget_tokens: int, static_tokens: int,
                             context: np.ndarray) -> np.ndarray:
    """SpecPV: chance that a token accepted under partial attention differs from full attention."""
    p = (d.per_token * (d.at_budget / budget_tokens) ** d.budget_exponent
         * (np.maximum(context, 1) / d.at_context) ** d.context_exponent)
    return np.where(context > static_tokens, np.minimum(p, 1.0), 0.0)
