"""The SimPy model of a serving engine running speculative decoding.

One replica serves a stream of requests with continuous batching. Each engine iteration is one SimPy
event: the scheduler admits waiting requests while batch slots and KV memory allow, gives prefilling
requests a chunk of the prefill token budget, and for every decoding request the drafter proposes
(k sequential draft forwards for a chain, `depth` forwards of `width` tokens for a tree), one target
forward verifies the whole batch, and each request commits its accepted drafts plus one token.
With SpecPV, each request verifies against its partial KV (sink + selected blocks + window + tokens
since the last refresh) until its period is reached, then once against the full KV, re-feeding the
tokens accepted since the refresh and re-selecting blocks; requests in one batch can be in
different modes. Closed-loop, Poisson and trace arrivals are SimPy processes feeding a queue.

Decoding requests live in compact arrays (slots 0..n-1), so an iteration of a 256-request batch is
a handful of numpy operations on views, not a loop over requests.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim.acceptance import AcceptanceModel, disagreement_probability
from sim.cost.batch import DECODE, DRAFT, FULL, PARTIAL, PHASES, PREFILL, VERIFY, Group, uniform_group
from sim.cost.memory import MemoryPlan, draft_offloaded_layers
from sim.cost.stack import Stacks
from sim.lanes import LaneAcceptance
from sim.policy import build_policy
from sim.scenario.schema import Scenario
from sim.workload import Requests

_INT = np.int64
BUCKETS_PER_DOUBLING = 8      # goodput re-decides when the context or the prompt chunk moves by ~9%


@dataclass
class RunRecord:
    """What one simulated run produced, before metrics are computed from it."""
    first_token_s: np.ndarray
    finish_s: np.ndarray
    arrival_s: np.ndarray
    output_tokens: np.ndarray
    step_s: list[float] = field(default_factory=list)          # per iteration
    decoding: list[int] = field(default_factory=list)          # decoding requests per iteration
    committed: list[np.ndarray] = field(default_factory=list)  # tokens committed per request-step
    phase_s: list[float] = field(default_factory=lambda: [0.0] * len(PHASES))
    peak_kv_tokens: int = 0
    # Adaptive policies only: tokens each iteration's requests drafted (0: speculation off; the
    # oracle's: the mean of its rows').
    drafted_k: list[float] = field(default_factory=list)
    lookup_share: float | None = None      # route, combine: request-steps verifying prompt lookup's proposal
    partial_accepted_tokens: int = 0       # SpecPV: tokens accepted under partial verification
    divergent_tokens: float = 0.0          # expected tokens that differ from full verification
    rolled_back_tokens: int = 0            # SpecPV rectify: tokens discarded at a full verification
    partial_steps: int = 0                 # SpecPV: request-steps verified against the partial KV
    full_verifications: int = 0            # SpecPV: request-steps verified against the full KV
    preemptions: int = 0
    # Decode-only accounting, as long-context papers measure it: iterations that prefill nothing,
    # and the output tokens they commit (nothing of an iteration with a prefill chunk counts).
    decode_only_s: float = 0.0
    decode_only_tokens: int = 0


class _DecodeSlots:
    """Per-request state of decoding requests, compact in slots 0..n-1.

    Every field is a row of one [fields, capacity] array, so adding or removing a request is one
    numpy assignment whatever the number of fields.
    """
    FIELDS = ("rid", "ctx", "finish", "steps", "last", "since", "steps_since", "selected", "admit", "final", "idle")
    # rid: request id; ctx: tokens with positions (prompt + committed output); finish: ctx at which
    # the request is done; steps: verification steps taken; last: tokens the previous step
    # committed; since / steps_since: SpecPV tokens and partial steps since the last refresh;
    # selected: SpecPV partial cache holds a selection (0/1); admit: admission order (preemption);
    # final: SpecPV rectify's last check before the request ends is due (0/1); idle: a static
    # batch's row whose request is done but which runs on, padding, until the batch ends (0/1).

    def __init__(self, capacity: int):
        self.n = 0
        self.state = np.zeros((len(self.FIELDS), capacity), _INT)
        for row, name in enumerate(self.FIELDS):
            setattr(self, name, self.state[row])

    def add(self, rid: int, ctx: int, finish: int, admit: int) -> None:
        self.state[:, self.n] = (rid, ctx, finish, 0, 1, 0, 0, 0, admit, 0, 0)
        self.n += 1

    def remove(self, i: int) -> None:
        self.n -= 1
        if i != self.n:
            self.state[:, i] = self.state[:, self.n]


class PipelineSimulation:
    def __init__(self, scenario: Scenario, requests: Requests, cost, stacks: Stacks,
                 memory: MemoryPlan, acceptance: AcceptanceModel | None, rng: np.random.Generator):
        self.scenario = scenario
        self.requests = requests
        self.cost = cost
        self.stacks = stacks
        self.memory = memory
        self.acceptance = acceptance
        self.rng = rng
        spec = scenario.speculation
        self.speculative = spec.enabled and acceptance is not None
        self.method = spec.method
        # The most a step verifies: what admission and the KV reservation count on.
        self.verify_tokens = spec.verify_tokens if self.speculative else 1
        self.draft_forwards = spec.draft_depth
        self.policy = build_policy(spec, acceptance.survival if self.speculative else None)
        self.adaptive = self.speculative and self.policy.adaptive
        self.chain = spec.tree is None
        # This iteration's speculation (a policy changes it per iteration): whether it drafts, its
        # drafts per request, the tokens each request verifies, and its draft forwards.
        self.drafting = self.speculative
        self.step_k = self.policy.max_k
        self.step_verify_tokens = self.verify_tokens
        self.step_draft_forwards = self.draft_forwards
        self.steady_catch_up: tuple[int, int] | None = None   # goodput's pricing (price_decode_steps)
        self.predrawn: tuple[np.ndarray, int] | None = None    # the oracle's outcome of this step
        self.tree_width = spec.tree.tokens_per_draft_forward if spec.tree is not None else 1
        self.partial = spec.partial_verify if self.speculative else None
        self.final_check = self.partial is not None and self.partial.rectify
        self.proposal_lengths = getattr(acceptance, "verify_tokens", None) if self.speculative else None
        # route, combine: each row verifies one of two drafters' proposals (sim/lanes.py)
        self.lanes = acceptance if self.speculative and isinstance(acceptance, LaneAcceptance) else None
        # A replayed live run's steps that drafted nothing are plain decode steps (sim validate).
        self.replayed_plain_steps = self.speculative and getattr(acceptance, "plain_steps", False)
        self.replayed_plain = False
        self.pad_ragged = scenario.scheduler.pad_ragged
        self.static = scenario.scheduler.batching == "static"
        self.static_end_first = self.static and scenario.scheduler.static_end == "first"
        self.max_batch = min(scenario.scheduler.max_batch, memory.max_running or scenario.scheduler.max_batch)
        self.prefill_chunk = scenario.scheduler.prefill_chunk
        self.budget_includes_decode = scenario.scheduler.budget_includes_decode
        self.prefill_per_request = scenario.scheduler.prefill_forward == "per_request"
        self.reserve_tokens = memory.partial_cache_tokens
        self.offloaded_layers = memory.offloaded_layers
        self.draft_offloaded_layers = draft_offloaded_layers(scenario, memory)
        self.kv_offloaded = scenario.offload.kv
        # What the hot path must keep per request; each skipped array op is a microsecond.
        self.track_steps = self.speculative and acceptance.uses_steps
        self.rids_for_draw = self.speculative and acceptance.uses_rids
        self.track_last = self.speculative and stacks.draft_owns_kv
        self.context_for_draw = self.speculative and acceptance.uses_context
        self.target_needs_kv = cost.needs_kv_tokens(stacks.target, self.verify_tokens)

        n = len(requests)
        self.record = RunRecord(first_token_s=np.full(n, np.nan), finish_s=np.full(n, np.nan),
                                arrival_s=requests.arrival_s.copy(), output_tokens=requests.output_tokens.copy())
        self.env = simpy.Environment()
        self.waiting: deque[int] = deque()
        self.prefilling: list[list[int]] = []   # [rid, tokens done, tokens to prefill]
        self.slots = _DecodeSlots(self.max_batch)
        # Per-request scalars as Python lists: the admission and finish paths index them one at a time.
        self.generated = [0] * n                # output tokens committed so far, kept across preemption
        self.prompt_tokens = requests.prompt_tokens.tolist()
        self.output_tokens = requests.output_tokens.tolist()
        self.kv_used_tokens = 0
        self.ctx_sum = 0                        # sum of slots.ctx over decoding requests
        self.last_sum = 0                       # sum of slots.last over decoding requests
        self.admitted = 0
        self.finished = 0
        self.next_closed = 0
        self.wake: simpy.Event | None = None

    # ---- arrivals -------------------------------------------------------------------------------
    def arrive(self, rid: int) -> None:
        self.record.arrival_s[rid] = self.env.now
        self.waiting.append(rid)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def open_loop_arrivals(self):
        """Poisson or trace arrivals: each request enters the queue at its arrival time."""
        for rid, at_s in enumerate(self.requests.arrival_s):
            if at_s > self.env.now:
                yield self.env.timeout(at_s - self.env.now)
            self.arrive(rid)

    def arrive_next_closed(self) -> None:
        if self.next_closed < len(self.requests):
            self.arrive(self.next_closed)
            self.next_closed += 1

    # ---- scheduling -----------------------------------------------------------------------------
    def admit_waiting(self) -> None:
        """FIFO admission while a batch slot and KV memory for the prompt are free."""
        capacity = self.memory.kv_capacity_tokens
        if self.static and (self.slots.n or self.prefilling):
            return                      # a static batch admits nobody until it is done
        while self.waiting and self.slots.n + len(self.prefilling) < self.max_batch:
            rid = self.waiting[0]
            prompt = self.prompt_tokens[rid] + self.generated[rid]
            need = prompt + self.reserve_tokens + self.verify_tokens
            if self.kv_used_tokens + need > capacity:
                break
            self.waiting.popleft()
            self.prefilling.append([rid, 0, prompt])
            self.kv_used_tokens += prompt + self.reserve_tokens

    def make_room_for_step(self) -> None:
        """Preempt the newest decoding requests (recompute) until this step's KV growth fits."""
        s = self.slots
        while s.n and self.kv_used_tokens + s.n * self.step_verify_tokens > self.memory.kv_capacity_tokens:
            i = int(np.argmax(s.admit[:s.n]))
            rid, ctx = self.release_slot(i)
            self.generated[rid] = ctx - self.prompt_tokens[rid]
            self.waiting.appendleft(rid)
            self.record.preemptions += 1

    def release_slot(self, i: int) -> tuple[int, int]:
        """Remove decoding slot i and its KV, context and catch-up tokens from the running sums."""
        s = self.slots
        rid, ctx, last = s.rid.item(i), s.ctx.item(i), s.last.item(i)
        self.kv_used_tokens -= ctx + self.reserve_tokens
        self.ctx_sum -= ctx
        self.last_sum -= last
        s.remove(i)
        return rid, ctx

    def decode_tokens(self, n: int) -> int:
        """Tokens decoding slots 0..n-1 feed this iteration's forward: each its verification's
        (its own proposal's length where drafters propose fewer), one without speculation."""
        if n == 0:
            return 0
        lengths = self.row_verify_tokens(n)
        if lengths is not None and not self.pad_ragged:
            return int(lengths.sum())
        return n * self.step_verify_tokens

    def row_verify_tokens(self, n: int) -> np.ndarray | None:
        """[n] tokens each decoding row verifies this step where rows differ (a drafter that
        proposes fewer than k at some steps, an oracle proposing what will be accepted), or None
        when every row verifies step_verify_tokens."""
        if not self.drafting:
            return None
        if self.predrawn is not None:
            return self.predrawn[0]
        if self.proposal_lengths is None:
            return None
        lengths = self.proposal_lengths(self.slots.rid[:n], self.slots.steps[:n])
        return np.minimum(lengths, self.step_verify_tokens) if self.step_verify_tokens < self.verify_tokens else lengths

    def prefill_chunks(self, decode_tokens: int = 0) -> list[tuple[list[int], int]]:
        """Share the iteration's prefill token budget among prefilling requests, oldest first
        (what the decoding requests' `decode_tokens` leave of it, where they count)."""
        budget = max(self.prefill_chunk - decode_tokens, 0)
        chunks = []
        for entry in self.prefilling:
            if budget == 0:
                break
            chunk = min(entry[2] - entry[1], budget)
            chunks.append((entry, chunk))
            budget -= chunk
        return chunks

    # ---- one iteration --------------------------------------------------------------------------
    def price_iteration(self, chunks, shares: list[float], n: int) -> tuple[float, dict]:
        """Seconds of one engine iteration decoding slots 0..n-1, and the per-request plan the
        commit needs."""
        cost, stacks, s = self.cost, self.stacks, self.slots
        lengths = self.row_verify_tokens(n) if n else None
        # A replayed step at which no request drafted (a live policy's plain decode step) is one;
        # so is a step at which no lane proposes (route, combine).
        no_proposal = (lengths is not None and (self.replayed_plain_steps or self.lanes is not None)
                       and lengths.max() == 1)
        drafting = self.drafting and not no_proposal
        self.replayed_plain = self.drafting and not drafting and self.lanes is None   # tokens/step skips it
        seconds = cost.step_overhead(n + len(chunks), shares, self.step_verify_tokens if n and drafting else 1)
        plan: dict = {}
        prefill = None
        # One prefill group of every chunk (mixed into the decode forward), or a group per chunk
        # priced as a forward of its own.
        pieces = [chunks] if not self.prefill_per_request else [[chunk] for chunk in chunks]
        for piece in (pieces if chunks else []):
            q = [c for _, c in piece]
            kv = [e[1] + c for e, c in piece]
            logits = sum(1 for e, c in piece if e[1] + c == e[2])
            if self.pad_ragged and len(piece) > 1:
                # A static-shape engine runs the prompts of one forward at the longest one's length.
                q, kv = [max(q)] * len(q), [max(kv)] * len(kv)
            prefill = Group(PREFILL, len(piece), sum(q), max(q), sum(kv), logits, q, kv)
            if stacks.draft is not None and stacks.draft_owns_kv:
                # The draft's own KV (EAGLE head, draft model) needs the prompt too: every prompt's,
                # or under route those of the requests in the method's lanes.
                draft_piece = piece if self.lanes is None else [c for c in piece if self.lanes.runs_method(c[0][0])]
                if draft_piece is piece:
                    seconds += cost.forward(stacks.draft, [prefill._replace(logits_tokens=0)], shares)
                elif draft_piece:
                    q = [c for _, c in draft_piece]
                    kv = [e[1] + c for e, c in draft_piece]
                    seconds += cost.forward(stacks.draft, [Group(PREFILL, len(q), sum(q), max(q), sum(kv), 0, q, kv)], shares)
            if self.prefill_per_request:
                seconds += cost.forward(stacks.target, [prefill], shares, offloaded_layers=self.offloaded_layers,
                                        kv_offloaded=self.kv_offloaded)
                prefill = None
        if n == 0:
            if prefill is None:
                return seconds, plan
            return seconds + cost.forward(stacks.target, [prefill], shares, offloaded_layers=self.offloaded_layers,
                                          kv_offloaded=self.kv_offloaded), plan
        ctx = s.ctx[:n]
        ctx_sum = self.ctx_sum
        span, span_sum = self.attended_spans(ctx, ctx_sum)
        if drafting and self.lanes is not None:
            seconds += self.price_lane_drafts(n, span, shares, ctx_sum / n)
        elif drafting:
            seconds += self.price_drafts(n, span, span_sum, shares, ctx_sum / n)
            # Draft forwards a step runs: none for a host drafter, one for Medusa's heads.
            forwards = 0 if stacks.draft is None else 1 if self.method == "medusa" else self.step_draft_forwards
            seconds += cost.speculation_overhead(n, forwards, shares)
        elif self.track_last and self.lanes is None:
            # Drafting off this step (a policy): a drafter with its own KV still reads the step's
            # input token, as the target does, so that it can propose again at any step (vLLM's
            # proposer runs on non-speculative steps too; an EAGLE head needs the target's hidden
            # state of every token, which no engine keeps for later).
            seconds += cost.forward_uniform(stacks.draft, DRAFT, n, 1, span_sum, shares, logits_tokens=0, context=span)
        if self.partial is not None:
            # Replayed proposal lengths are not applied here: the live engine's drafters always
            # propose k tokens (its n-gram drafter repeats the last token when nothing matches).
            groups = [prefill] if prefill is not None else []
            seconds += self.plan_partial_verify(n, ctx, span, groups, plan, shares)
        else:
            V = self.step_verify_tokens
            phase = VERIFY if drafting else DECODE
            if not drafting:
                V, lengths = 1, None
            if lengths is not None:
                # Steps where a request's drafter proposed fewer tokens (a replayed run, n-gram
                # drafting only where the history matches, an oracle): a static-shape engine pads
                # every row to the longest proposal; a flattening one (vLLM) verifies each row's own.
                if self.pad_ragged:
                    V = int(lengths.max())
                else:
                    kv = ctx + (lengths - 1)
                    tokens = int(lengths.sum())
                    verify = Group(phase, n, tokens, int(lengths.max()), int(kv.sum()), tokens, lengths,
                                   kv if self.target_needs_kv else None)
                    groups = [prefill, verify] if prefill is not None else [verify]
                    return seconds + cost.forward(stacks.target, groups, shares, offloaded_layers=self.offloaded_layers,
                                                  kv_offloaded=self.kv_offloaded), plan
            if prefill is None:
                return seconds + cost.forward_uniform(
                    stacks.target, phase, n, V, span_sum + n * (V - 1), shares, context=span, kv_offset=V - 1,
                    offloaded_layers=self.offloaded_layers, kv_offloaded=self.kv_offloaded), plan
            kv = span + (V - 1) if self.target_needs_kv else None
            groups = [prefill, uniform_group(phase, n, V, span_sum + n * (V - 1), kv_tokens=kv)]
        seconds += cost.forward(stacks.target, groups, shares, offloaded_layers=self.offloaded_layers,
                                kv_offloaded=self.kv_offloaded)
        return seconds, plan

    def attended_spans(self, ctx: np.ndarray, ctx_sum: int) -> tuple[np.ndarray, int]:
        """The context each decoding row's attention reads, and their sum: its own, or on a
        static-shape engine the longest row's (one dense cache tensor, the shorter rows masked)."""
        if not self.pad_ragged or len(ctx) < 2:
            return ctx, ctx_sum
        longest = int(ctx.max())
        return np.full(len(ctx), longest, dtype=ctx.dtype), longest * len(ctx)

    def price_lane_drafts(self, n: int, span: np.ndarray, shares: list[float], host_context: float) -> float:
        """route, combine: the method's drafter over the rows of its lanes, prompt lookup over
        those of lookup lanes, and the speculation overhead of every row that proposes."""
        s = self.slots
        model_rows, lookup_rows = self.lanes.drafting_rows(s.rid[:n], s.steps[:n])
        method_rows = n if model_rows is None else int(np.count_nonzero(model_rows))
        seconds = 0.0
        if method_rows:
            sub_span = span if model_rows is None else span[model_rows]
            behind = self.last_sum if model_rows is None else int(s.last[:n][model_rows].sum())
            seconds += self.price_drafts(method_rows, sub_span, int(sub_span.sum()), shares, host_context, behind)
        if lookup_rows:
            seconds += self.cost.host_draft(lookup_rows, shares, host_context)
        proposing = n if model_rows is None else method_rows + lookup_rows
        forwards = 0 if self.stacks.draft is None or not method_rows else self.step_draft_forwards
        return seconds + self.cost.speculation_overhead(proposing, forwards, shares)

    def price_drafts(self, n: int, ctx: np.ndarray, ctx_sum: int, shares: list[float], host_context: float,
                     behind_sum: int | None = None) -> float:
        """The drafter's work for n decoding requests before their verification; ctx: the context
        each row's draft attention reads, host_context: the mean history a host drafter searches;
        behind_sum: the tokens the rows' own-KV drafter catches up on (default: every row's)."""
        cost, draft = self.cost, self.stacks.draft
        if draft is None:                   # n-gram prompt lookup on the host
            return cost.host_draft(n, shares, host_context)
        if self.method == "medusa":         # all heads in one forward on the last hidden state
            return cost.forward_uniform(draft, DRAFT, n, 1, ctx_sum, shares)
        if self.track_last:
            # A drafter with its own KV first catches up on the tokens the last step committed.
            behind, behind_sum = self.verify_tokens, self.last_sum if behind_sum is None else behind_sum
            if self.steady_catch_up is not None:
                behind, behind_sum = self.steady_catch_up
            seconds = cost.forward_uniform(draft, DRAFT, n, behind, ctx_sum, shares,
                                           tokens=behind_sum, logits_tokens=n, context=ctx)
        else:
            seconds = cost.forward_uniform(draft, DRAFT, n, 1, ctx_sum, shares, context=ctx,
                                           offloaded_layers=self.draft_offloaded_layers)
        rest = self.step_draft_forwards - 1
        if rest:
            # Forward j (1 .. rest) reads j x width drafted tokens besides the context.
            width = self.tree_width
            mean_extra = width * (rest + 1) / 2
            seconds += cost.forward_uniform(draft, DRAFT, n, width, ctx_sum + n * mean_extra, shares,
                                            context=ctx, kv_offset=mean_extra, repeat=rest,
                                            offloaded_layers=self.draft_offloaded_layers)
        return seconds

    def plan_partial_verify(self, n, ctx, span, groups, plan, shares) -> float:
        """SpecPV: split decoding requests into full-attention, partial and full-refresh groups
        (appended to `groups` for the target forward); returns the block re-selection's seconds.
        ctx: each row's own context; span: the context its full attention reads."""
        pv, s, V = self.partial, self.slots, self.verify_tokens
        own = len(groups)                  # groups from here on are this method's
        eligible = ctx > pv.static_tokens
        period_reached = (s.since[:n] if pv.period_unit == "tokens" else s.steps_since[:n]) >= pv.period
        full = eligible & (period_reached | (s.selected[:n] == 0))
        partial = eligible & ~full
        plain = ~eligible
        plan["full"], plan["partial"] = full, partial
        seconds = 0.0
        if plain.any():
            kv = span[plain] + V - 1
            groups.append(uniform_group(VERIFY, len(kv), V, int(kv.sum()), kv_tokens=kv))
        if partial.any():
            buffer = s.since[:n][partial]
            kv = pv.static_tokens + buffer + V
            groups.append(uniform_group(PARTIAL, len(kv), V, int(kv.sum()), kv_tokens=kv))
            if pv.reselect == "step":
                # Quest: every partial step scores the blocks with its own queries.
                seconds += self.cost.selection(self.stacks.target, len(kv), int(ctx[partial].sum()), len(kv) * V,
                                               pv.budget, pv.block, shares, part="scores")
        if full.any():
            # Re-feed the tokens accepted since the refresh, then verify the new drafts.
            q = s.since[:n][full] + V
            kv = span[full] + V - 1
            groups.append(Group(FULL, len(q), int(q.sum()), int(q.max()), int(kv.sum()), int(q.sum()), q, kv))
            seconds += self.cost.selection(self.stacks.target, len(q), int(ctx[full].sum()) + len(q) * (V - 1), int(q.sum()),
                                           pv.budget, pv.block, shares,
                                           part="refresh" if pv.reselect == "refresh" else "summaries")
            if self.pad_ragged:
                # A static-shape engine runs every row of this step at the longest row's tokens.
                longest = int(q.max())
                for i in range(own, len(groups)):
                    g = groups[i]
                    groups[i] = g._replace(tokens=g.requests * longest, query_max=longest,
                                           query_tokens=None if g.query_tokens is None else np.full(g.requests, longest))
        return seconds

    def commit(self, chunks, plan, n: int) -> None:
        """Apply the iteration's outcome at its end time: prefill progress, accepted tokens of slots
        0..n-1, finishes."""
        now = self.env.now
        s, record = self.slots, self.record
        record.decoding.append(n)
        if n:
            ctx = s.ctx[:n]
            # A static batch's finished rows run on as padding and commit nothing.
            idle = s.idle[:n] == 1 if self.static else None
            padding = idle is not None and np.count_nonzero(idle)
            if self.drafting or self.predrawn is not None:
                if self.predrawn is not None:
                    # The oracle drew this step's outcome before choosing its proposals.
                    (committed, grown), self.predrawn = self.predrawn, None
                else:
                    committed, grown = self.acceptance.draw(n, s.rid[:n] if self.rids_for_draw else None,
                                                            s.steps[:n] if self.track_steps else None,
                                                            ctx if self.context_for_draw else None)
                    if self.step_verify_tokens < self.verify_tokens and self.chain:
                        # A chain cut at k keeps its first k drafts: min(accepted, k) of them.
                        committed = np.minimum(committed, self.step_verify_tokens)
                        grown = int(committed.sum())
                if padding:
                    committed = np.where(idle, 0, committed)
                    grown = int(committed.sum())
                if not self.replayed_plain:
                    record.committed.append(committed[~idle] if padding else committed)
                if self.track_steps:
                    s.steps[:n] += 1
                if self.track_last:
                    s.last[:n] = committed
                    self.last_sum = grown
                if self.partial is not None:
                    committed = self.apply_partial_verify(n, committed, plan)
                    grown = int(committed.sum())
            else:
                if padding:
                    committed = np.where(idle, 0, 1)
                    grown = int(committed.sum())
                else:
                    committed = 1
                    grown = n
                if self.track_last:
                    # Drafting off this step: the draft read the step's input token, and is as far
                    # behind as the target, by the token just committed.
                    s.last[:n] = 1
                    self.last_sum = n
            ctx += committed
            self.ctx_sum += grown
            self.kv_used_tokens += grown
            done = ctx >= s.finish[:n]
            if not chunks:
                record.decode_only_tokens += grown
                if self.drafting and np.count_nonzero(done):
                    # Output tokens only: a step may commit past a request's last token (only a
                    # request at or past its end can), ctx - max(finish, ctx before the step).
                    ended = ctx[done]
                    record.decode_only_tokens -= int((ended - np.maximum(s.finish[:n][done], ended - committed[done])).sum())
            if self.final_check and np.count_nonzero(done):
                # Rectify is lossless: tokens accepted under partial attention since the last
                # refresh are re-checked by one more full verification before the request ends.
                unchecked = done & (s.since[:n] > 0)
                if unchecked.any():
                    s.selected[:n][unchecked] = 0
                    s.final[:n][unchecked] = 1
                    done &= ~unchecked
            if self.static:
                self.finish_static(now, done)
            elif np.count_nonzero(done):      # far cheaper than done.any() on small arrays
                self.finish_requests(now, done.nonzero()[0])
        if chunks:
            for entry, chunk in chunks:
                entry[1] += chunk
            if any(e[1] == e[2] for e, _ in chunks):
                self.start_decoding(now)
        if self.kv_used_tokens > record.peak_kv_tokens:
            record.peak_kv_tokens = self.kv_used_tokens

    def apply_partial_verify(self, n, committed, plan) -> np.ndarray:
        """SpecPV bookkeeping; with rectify, full verification rolls back at the first disagreement."""
        pv, s, record = self.partial, self.slots, self.record
        full, partial = plan["full"], plan["partial"]
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
                replayed = getattr(self.acceptance, "rolled_back", None)
                if replayed is not None:
                    # A replayed live run: its own roll-backs at this step.
                    rollback = np.minimum(replayed(s.rid[:n][full], s.steps[:n][full] - 1), since)
                else:
                    p = disagreement_probability(pv.disagreement, pv.budget, pv.static_tokens, ctx[full])
                    # Index of the first disagreeing token in the buffer: geometric with parameter p.
                    u = 1.0 - self.rng.random(len(since))
                    with np.errstate(divide="ignore"):
                        first_bad = np.floor(np.log(u) / np.log1p(-np.minimum(p, 1 - 1e-12)))
                    rollback = since - np.minimum(first_bad, since).astype(_INT)
                bad = rollback > 0
                final = s.final[:n][full] == 1
                if bad.any() or final.any():
                    # Keep the tokens before the disagreement, replace it by the target's token and
                    # discard the rest of the buffer together with this step's drafts; a request's
                    # last check commits nothing new when nothing disagrees (it is already done).
                    committed = committed.copy()
                    committed[full] = np.where(bad, 1 - rollback, np.where(final, 0, committed[full]))
                    record.rolled_back_tokens += int(rollback.sum())
                s.final[:n][full] = 0
            s.since[:n][full] = 0
            s.steps_since[:n][full] = 0
            s.selected[:n][full] = 1
        return committed

    def start_decoding(self, now: float) -> None:
        """Requests whose prefill completed produced their first token and join the decode slots."""
        still = []
        one_token_output = False
        for entry in self.prefilling:
            rid, done, total = entry
            if done < total:
                still.append(entry)
                continue
            generated = self.generated[rid]
            if generated == 0:
                self.record.first_token_s[rid] = now
            output = self.output_tokens[rid]
            one_token_output |= generated + 1 >= output
            self.generated[rid] = generated + 1
            self.kv_used_tokens += 1
            self.admitted += 1
            self.ctx_sum += total + 1
            self.last_sum += 1
            self.slots.add(rid, total + 1, self.prompt_tokens[rid] + output, self.admitted)
        self.prefilling = still
        if one_token_output:   # done at prefill
            self.finish_requests(now)

    def finish_requests(self, now: float, done: np.ndarray | None = None) -> None:
        """Requests that reached their output length leave (slots `done`, default: find them)."""
        s, record = self.slots, self.record
        if done is None:
            done = np.flatnonzero(s.ctx[:s.n] >= s.finish[:s.n])
        pv = self.partial
        if pv is not None and pv.rectify:
            # Tokens accepted since the last full verification were never re-checked.
            unchecked = s.since[done]
            p = disagreement_probability(pv.disagreement, pv.budget, pv.static_tokens, s.ctx[done])
            record.divergent_tokens += float((p * unchecked).sum())
        closed = self.requests.closed_concurrency is not None
        for i in done[::-1].tolist():
            rid, _ = self.release_slot(i)
            record.finish_s[rid] = now
            self.finished += 1
            if closed:
                self.arrive_next_closed()

    def finish_static(self, now: float, done: np.ndarray) -> None:
        """A static batch: requests that reached their output length are done now, but their rows
        run on (idle) until every row of the batch is done; then the batch leaves together. With
        static_end first, the first request done ends the batch: every row is done with the output
        it has committed."""
        s, record = self.slots, self.record
        n = s.n
        newly = done & (s.idle[:n] == 0)
        if self.static_end_first and np.count_nonzero(newly):
            newly = s.idle[:n] == 0
            rids = s.rid[:n][newly]
            record.output_tokens[rids] = (np.minimum(s.ctx[:n][newly], s.finish[:n][newly])
                                          - self.requests.prompt_tokens[rids])
        if np.count_nonzero(newly):
            pv = self.partial
            if pv is not None and pv.rectify:
                p = disagreement_probability(pv.disagreement, pv.budget, pv.static_tokens, s.ctx[:n][newly])
                record.divergent_tokens += float((p * s.since[:n][newly]).sum())
            closed = self.requests.closed_concurrency is not None
            for rid in s.rid[:n][newly].tolist():
                record.finish_s[rid] = now
                self.finished += 1
                if closed:
                    self.arrive_next_closed()
            s.idle[:n][newly] = 1
        if n and np.count_nonzero(s.idle[:n]) == n:
            for i in range(n - 1, -1, -1):
                self.release_slot(i)

    # ---- the policy ------------------------------------------------------------------------------
    def choose_speculation(self) -> None:
        """Set this iteration's drafts per request from the policy (0: a plain decode step)."""
        n = self.slots.n
        if n == 0 or (self.static and self.prefilling):
            self.set_step_k(0)
            return
        if self.policy.kind == "oracle":
            # Oracle proposal: draw the step's outcome first, then propose exactly what will be
            # accepted (each row its own accepted drafts; the chain's forwards run to the longest).
            s = self.slots
            self.predrawn = self.acceptance.draw(n, s.rid[:n] if self.rids_for_draw else None,
                                                 s.steps[:n] if self.track_steps else None,
                                                 s.ctx[:n] if self.context_for_draw else None)
            self.set_step_k(int(self.predrawn[0].max()) - 1)
            return
        running = n + len(self.prefilling)
        # What goodput's choice depends on besides the batch: its mean context and the prompt
        # tokens riding in the step, each within about 9%.
        prefill = sum(min(e[2] - e[1], self.prefill_chunk) for e in self.prefilling[:4]) if self.prefilling else 0
        state = (int(math.log2(self.ctx_sum / n) * BUCKETS_PER_DOUBLING),
                 int(math.log2(1 + min(prefill, self.prefill_chunk)) * BUCKETS_PER_DOUBLING))
        self.set_step_k(self.policy.choose_k(running, n, state, self.price_decode_steps))

    def set_step_k(self, k: int) -> None:
        self.step_k = k
        self.drafting = k > 0
        if not self.chain:                      # a tree is drafted whole, or not at all
            self.step_verify_tokens = self.verify_tokens if k else 1
            self.step_draft_forwards = self.draft_forwards
        else:
            self.step_verify_tokens = k + 1
            self.step_draft_forwards = k

    def price_decode_steps(self, ks: range) -> list[float]:
        """Seconds that k drafts per request cost this iteration's decoding requests, for each k
        in ks, in the steady state of drafting k (goodput's denominators): a plain decode step's,
        plus what drafting k adds to this iteration with its prompt chunks (verification tokens
        beside a prefill chunk run at the chunk's compute-bound rate). A drafter with its own KV
        catches up on the tokens a step at k commits, so a longer k pays at the next step too.
        The phase shares are not touched."""
        current, n = self.step_k, self.slots.n
        scratch = [0.0] * len(PHASES)
        plain = self.price_with_k(0, (), scratch, n)
        with_chunks = lambda k: self.price_with_k(k, self.prefill_chunks(self.decode_tokens(n) if self.budget_includes_decode
                                                                          else 0), scratch, n)
        chunks_plain = with_chunks(0) if self.prefilling else None
        seconds = []
        for k in ks:
            if k == 0:
                seconds.append(plain)
            elif chunks_plain is not None:
                seconds.append(plain + with_chunks(k) - chunks_plain)
            else:
                seconds.append(self.price_with_k(k, (), scratch, n))
        self.set_step_k(current)
        return seconds

    def price_with_k(self, k: int, chunks, shares: list[float], n: int) -> float:
        self.set_step_k(k)
        if self.track_last and k:
            self.steady_catch_up = (k + 1, max(int(round(n * self.policy.expected_tokens[k])), n))
        seconds, _ = self.price_iteration(chunks, shares, n)
        self.steady_catch_up = None
        return seconds

    # ---- the engine process ---------------------------------------------------------------------
    def serve(self):
        record = self.record
        total = len(self.requests)
        shares = record.phase_s
        while self.finished < total:
            if self.waiting:
                self.admit_waiting()
            if self.slots.n == 0 and not self.prefilling:
                # plan_memory guarantees the longest request fits an empty cache, so an idle engine
                # means an empty queue: wait for the next arrival.
                self.wake = self.env.event()
                yield self.wake
                self.wake = None
                continue
            if self.adaptive:
                self.choose_speculation()
            if self.kv_used_tokens + self.slots.n * self.step_verify_tokens > self.memory.kv_capacity_tokens:
                self.make_room_for_step()
                if self.predrawn is not None and len(self.predrawn[0]) != self.slots.n:
                    self.choose_speculation()     # the oracle drew for requests since preempted
            # A static batch decodes only once all its prompts are prefilled (in chunks).
            n = 0 if self.static and self.prefilling else self.slots.n
            if self.adaptive and n:
                # The oracle's rows each draft their own accepted count: their mean.
                record.drafted_k.append(self.step_k if self.predrawn is None else float(self.predrawn[1] / n - 1))
            chunks = ()
            if self.prefilling:
                chunks = self.prefill_chunks(self.decode_tokens(n) if self.budget_includes_decode else 0)
            step_s, plan = self.price_iteration(chunks, shares, n)
            yield self.env.timeout(step_s)
            record.step_s.append(step_s)
            if not chunks:
                record.decode_only_s += step_s
            self.commit(chunks, plan, n)

    def run(self) -> RunRecord:
        if self.requests.closed_concurrency is not None:
            for _ in range(self.requests.closed_concurrency):
                self.arrive_next_closed()
        else:
            self.env.process(self.open_loop_arrivals())
        self.env.process(self.serve())
        self.env.run()
        if self.lanes is not None:
            self.record.lookup_share = self.lanes.lookup_share()
        return self.record
