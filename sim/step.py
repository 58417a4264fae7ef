"""One engine step, planned and then priced: `plan_step` says what runs, `price` what it takes.

    plan = plan_step(config, config.shape(k), slots, n, chunks)     # which stack over which groups, how often
    seconds = price(plan, cost, shares)                              # the cost model, item by item

The pipeline (sim/pipeline.py) schedules: it chooses the step's requests, prompt chunks and k, and
commits what the step accepted; it never prices a forward. A step's plan is its `work`, in order:
the engine's host work for the step; the prompt chunks' forwards (the draft's own KV takes them
too); the drafter's work (a host lookup, Medusa's one forward, or the catch-up forward and the
rest of the draft forwards, and the speculative host work); then the target's one forward over
every group (prefill chunks, decode or verification rows, SpecPV's partial and full rows with their
block selection, sim/specpv.py). k is an argument, never state: goodput prices each candidate k
through the same two functions (`price_decode_steps`), and so does a live engine choosing k as it
runs (sim/step_price.py).

Work items are values (sim/cost/work.py): the host's work, forwards and selections; a forward
names its stack's pricer (the cost model's, sim/cost/model.py: a plan is priced by the cost model
its configuration was built with). `price` sums them in order (a Subtotal's items first), so the
floating-point sum is the same as the step's terms added up one after another.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol, cast

import numpy as np

from sim.cost.batch import DECODE, DRAFT, PHASES, VERIFY, Group, prefill_group, uniform_group
from sim.cost.memory import MemoryPlan, draft_offloaded_layers
from sim.cost.stack import Stacks
from sim.cost.work import (Forward, HostDraft, Pricer, SpeculationHost, StepHost, Subtotal, UniformForward,
                           WorkItem)
from sim.scenario.schema import Scenario
from sim.scenario.speculation import PartialVerify
from sim.ranks import plan_ranked_step
from sim.slots import DecodeSlots
from sim.specpv import plan_partial_verify


class Lanes(Protocol):
    """Route and combine's lanes (sim/lanes.py LaneAcceptance): whose drafter each row runs."""

    def drafting_rows(self, rids: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray | None, int]:
        """Rows that run the model drafter (a bool mask, None for all), and how many run a lookup."""
        ...

    def runs_method(self, rid: int) -> bool:
        """Whether a request ever runs the method's drafter."""
        ...


@dataclass(frozen=True)
class StepShape:
    """What a step drafting k tokens per request runs: k = 0 is a plain decode step."""
    k: int
    drafting: bool
    verify_tokens: int          # tokens each request verifies (1 without drafts)
    draft_forwards: int


@dataclass(frozen=True)
class StepConfig:
    """What every step of one simulated configuration shares (built once, `step_config`)."""
    stacks: Stacks
    target: Pricer                      # the target's pricer (sim/cost/model.py), and the draft's
    draft: Pricer | None
    method: str
    speculative: bool
    verify_tokens: int                  # the most a step verifies (the scenario's k + 1, or its tree's)
    tree_width: int                     # tokens per draft forward (1 for a chain)
    pad_ragged: bool                    # a static-shape engine: rows padded to the longest
    prefill_per_request: bool           # each prompt chunk a forward of its own
    offloaded_layers: int               # the target's layers streamed over the host link
    draft_offloaded_layers: int
    kv_offloaded: bool
    target_needs_kv: bool               # the target's pricing needs each row's KV, not the sum
    track_last: bool                    # a drafter with its own KV catches up on what a step committed
    partial: PartialVerify | None       # SpecPV
    proposal_lengths: Callable | None   # (rids, steps) -> [n] tokens each row verifies, where rows differ
    replayed_plain_steps: bool          # a replayed live run: a step nobody drafted at is a plain one
    lanes: Lanes | None = None          # route, combine (sim/lanes.py): whose drafter each row runs
    shapes: tuple[StepShape, ...] = ()  # by k, 0..K: a policy's steps
    # Every step of a static policy: all the scenario drafts (its k, or tree), verifying the longest
    # proposal of any drafter (route and combine's second drafter may propose more than k).
    full: StepShape | None = None
    data_parallel: int = 1              # attention data-parallel ranks stepping together (sim/ranks.py)
    two_batch_overlap: bool = False     # their all-to-all behind the other micro-batch's compute
    rank: "StepConfig | None" = None    # with ranks: what each one plans (data_parallel 1)

    def shape(self, k: int) -> StepShape:
        return self.shapes[k]


def step_shapes(scenario: Scenario, max_k: int, verify_tokens: int) -> tuple[StepShape, ...]:
    """The step at each k = 0..max_k: a chain cut at k verifies k + 1 tokens in k draft forwards;
    a tree is drafted whole, or not at all."""
    spec = scenario.speculation
    if spec.tree is not None:
        return tuple(StepShape(k, k > 0, verify_tokens if k else 1, spec.draft_depth) for k in range(max_k + 1))
    return tuple(StepShape(k, k > 0, k + 1, k) for k in range(max_k + 1))


def step_config(scenario: Scenario, stacks: Stacks, memory: MemoryPlan, cost, speculative: bool,
                proposal_lengths: Callable | None = None, replayed_plain_steps: bool = False,
                lanes=None) -> StepConfig:
    """The steps of `scenario` (speculative, or its baseline) as priced by `cost` over `memory`'s
    plan; proposal_lengths and replayed_plain_steps: the acceptance model's (sim/acceptance.py
    AcceptanceModel.verify_tokens, .plain_steps); lanes: route and combine's (sim/lanes.py)."""
    spec = scenario.speculation
    speculative = spec.enabled and speculative
    verify_tokens = spec.verify_tokens if speculative else 1
    k = spec.num_speculative_tokens if spec.tree is None else spec.draft_depth
    config = StepConfig(
        stacks=stacks, target=cost.pricer(stacks.target),
        draft=cost.pricer(stacks.draft) if stacks.draft is not None and speculative else None,
        method=spec.method, speculative=speculative, verify_tokens=verify_tokens,
        tree_width=spec.tree.tokens_per_draft_forward if spec.tree is not None else 1,
        pad_ragged=scenario.scheduler.pad_ragged,
        prefill_per_request=scenario.scheduler.prefill_forward == "per_request",
        offloaded_layers=memory.offloaded_layers, draft_offloaded_layers=draft_offloaded_layers(scenario, memory),
        kv_offloaded=scenario.offload.kv, target_needs_kv=cost.needs_kv_tokens(stacks.target, verify_tokens),
        track_last=speculative and stacks.draft_owns_kv,
        partial=spec.partial_verify if speculative else None,
        proposal_lengths=proposal_lengths if speculative else None,
        replayed_plain_steps=speculative and replayed_plain_steps, lanes=lanes,
        shapes=step_shapes(scenario, k if speculative else 0, verify_tokens),
        full=StepShape(k, True, verify_tokens, spec.draft_depth) if speculative else StepShape(0, False, 1, 0),
        data_parallel=scenario.data_parallel, two_batch_overlap=scenario.engine_spec.two_batch_overlap)
    return replace(config, rank=replace(config, data_parallel=1)) if config.data_parallel > 1 else config


class StepPlan(list[WorkItem]):
    """What one step runs: its work items in pricing order (the module docstring); a list, so that
    pricing it is one loop (one is made every simulated step). replayed_plain: a replayed step at
    which nobody drafted, a plain decode step; full, partial (with SpecPV only): its rows verifying
    against the full KV and the partial KV ([n] bool)."""
    __slots__ = ("replayed_plain", "full", "partial")
    replayed_plain: bool
    full: np.ndarray
    partial: np.ndarray


def row_verify_tokens(config: StepConfig, shape: StepShape, slots: DecodeSlots, n: int,
                      predrawn: np.ndarray | None = None) -> np.ndarray | None:
    """[n] tokens each decoding row verifies at this step where rows differ (a drafter that proposes
    fewer than k at some steps, the oracle's `predrawn` accepted counts), or None when every row
    verifies shape.verify_tokens."""
    if not shape.drafting:
        return None
    if predrawn is not None:
        return predrawn
    if config.proposal_lengths is None:
        return None
    lengths = config.proposal_lengths(slots.rid[:n], slots.steps[:n])
    return np.minimum(lengths, shape.verify_tokens) if shape.verify_tokens < config.verify_tokens else lengths


def decode_tokens(config: StepConfig, shape: StepShape, slots: DecodeSlots, n: int,
                  predrawn: np.ndarray | None = None) -> int:
    """Tokens decoding slots 0..n-1 feed this step's forward, as plan_step runs it: each its
    verification's (its own proposal's length where drafters propose fewer; on a static-shape
    engine every row the longest proposal's), one without speculation."""
    if n == 0:
        return 0
    lengths = row_verify_tokens(config, shape, slots, n, predrawn)
    if lengths is None or config.partial is not None:     # SpecPV's forwards verify every row's k + 1
        return n * shape.verify_tokens
    return n * int(lengths.max()) if config.pad_ragged else int(lengths.sum())


def attended_spans(config: StepConfig, ctx: np.ndarray, ctx_sum: int) -> tuple[np.ndarray, int]:
    """The context each decoding row's attention reads, and their sum: its own, or on a
    static-shape engine the longest row's (one dense cache tensor, the shorter rows masked)."""
    if not config.pad_ragged or len(ctx) < 2:
        return ctx, ctx_sum
    longest = int(ctx.max())
    return np.full(len(ctx), longest, dtype=ctx.dtype), longest * len(ctx)


def plan_step(config: StepConfig, shape: StepShape, slots: DecodeSlots, n: int, chunks=(),
              predrawn: np.ndarray | None = None, catch_up: tuple[int, int] | None = None) -> StepPlan:
    """What one engine step runs: decoding slots 0..n-1 at `shape` (the step's k) beside the prompt
    `chunks` ([(prefilling entry [rid, done, total], tokens)]). predrawn: the oracle's [n] tokens
    each row verifies; catch_up: (tokens per request, in all) a drafter with its own KV catches up
    on instead of the last step's (goodput's steady state at k). Attention data-parallel ranks: each
    rank's own step (planned here with config.rank), in lockstep (sim/ranks.py)."""
    if config.rank is not None:
        return plan_ranked_step(plan_step, config, shape, slots, n, chunks, predrawn, catch_up)
    stacks = config.stacks
    lengths = None
    if n and (predrawn is not None or config.proposal_lengths is not None):
        lengths = row_verify_tokens(config, shape, slots, n, predrawn)
    # A replayed step at which no request drafted (a live policy's plain decode step) is one; so is
    # a step at which no lane proposes (route, combine).
    no_proposal = (lengths is not None and (config.replayed_plain_steps or config.lanes is not None)
                   and lengths.max() == 1)
    drafting = shape.drafting and not no_proposal
    replayed_plain = shape.drafting and not drafting and config.lanes is None
    work = StepPlan()
    work.replayed_plain = replayed_plain      # full and partial are set with SpecPV only
    work.append(StepHost(requests=n + len(chunks), verify_tokens=shape.verify_tokens if n and drafting else 1))
    prefill = _plan_prefill(config, chunks, work) if chunks else None
    if n == 0:
        if prefill is not None:
            work.append(Forward(pricer=config.target, groups=[prefill], offloaded_layers=config.offloaded_layers,
                                kv_offloaded=config.kv_offloaded))
        return work
    ctx, ctx_sum = slots.ctx[:n], slots.ctx_sum
    span, span_sum = attended_spans(config, ctx, ctx_sum) if config.pad_ragged else (ctx, ctx_sum)
    if drafting and config.lanes is not None:
        work.append(Subtotal(items=_lane_drafts(config, config.lanes, shape, slots, n, span, ctx_sum / n, catch_up)))
    elif drafting:
        add_subtotal(work, _drafts(config, shape, slots, n, span, span_sum, ctx_sum / n, catch_up))
        # Draft forwards a step runs: none for a host drafter, one for Medusa's heads.
        forwards = 0 if stacks.draft is None else 1 if config.method == "medusa" else shape.draft_forwards
        work.append(SpeculationHost(requests=n, draft_forwards=forwards))
    elif config.track_last and config.lanes is None:
        # Drafting off this step (a policy): a drafter with its own KV still reads the step's input
        # token, as the target does, so that it can propose again at any step (vLLM's proposer runs
        # on non-speculative steps too; an EAGLE head needs the target's hidden state of every token,
        # which no engine keeps for later).
        # track_last: the config has a draft (a drafter with its own KV), so its pricer is set.
        work.append(UniformForward(pricer=cast(Pricer, config.draft), phase=DRAFT, requests=n, query=1,
                                   kv_tokens_sum=span_sum, logits_tokens=0, context=span))
    groups: list[Group] | None
    if config.partial is not None:
        # Replayed proposal lengths are not applied here: the live engine's drafters always propose
        # k tokens (its n-gram drafter repeats the last token when nothing matches).
        groups = [prefill] if prefill is not None else []
        selections, work.full, work.partial = plan_partial_verify(config.partial, config.target, config.verify_tokens,
                                                                  config.pad_ragged, slots, n, ctx, span, groups)
        work.append(Subtotal(items=selections))
    else:
        V = shape.verify_tokens
        phase = VERIFY if drafting else DECODE
        if not drafting:
            V, lengths = 1, None
        groups = None
        if lengths is not None:
            # Steps where a request's drafter proposed fewer tokens (a replayed run, n-gram drafting
            # only where the history matches, an oracle): a static-shape engine pads every row to the
            # longest proposal; a flattening one (vLLM) verifies each row's own.
            if config.pad_ragged:
                V = int(lengths.max())
            else:
                kv = ctx + (lengths - 1)
                tokens = int(lengths.sum())
                verify = Group(phase=phase, requests=n, tokens=tokens, query_max=int(lengths.max()),
                               kv_tokens_sum=int(kv.sum()), logits_tokens=tokens, query_tokens=lengths,
                               kv_tokens=kv if config.target_needs_kv else None)
                groups = [prefill, verify] if prefill is not None else [verify]
        if groups is None:
            if prefill is None:
                work.append(UniformForward(pricer=config.target, phase=phase, requests=n, query=V,
                                           kv_tokens_sum=span_sum + n * (V - 1), context=span, kv_offset=V - 1,
                                           offloaded_layers=config.offloaded_layers,
                                           kv_offloaded=config.kv_offloaded))
                return work
            kv = span + (V - 1) if config.target_needs_kv else None
            groups = [prefill, uniform_group(phase, n, V, span_sum + n * (V - 1), kv_tokens=kv)]
    work.append(Forward(pricer=config.target, groups=groups, offloaded_layers=config.offloaded_layers,
                        kv_offloaded=config.kv_offloaded))
    return work


def _plan_prefill(config: StepConfig, chunks, work: list[WorkItem]) -> Group | None:
    """The prompt chunks' groups: one of every chunk, mixed into the decode forward (returned), or
    a forward per chunk (appended to `work`, None returned); the draft's own KV takes them too."""
    stacks = config.stacks
    prefill = None
    pieces = [chunks] if not config.prefill_per_request else [[chunk] for chunk in chunks]
    for piece in pieces:
        q = [c for _, c in piece]
        kv = [e[1] + c for e, c in piece]
        logits = sum(1 for e, c in piece if e[1] + c == e[2])
        if config.pad_ragged and len(piece) > 1:
            # A static-shape engine runs the prompts of one forward at the longest one's length.
            q, kv = [max(q)] * len(q), [max(kv)] * len(kv)
        prefill = prefill_group(q, kv, logits)
        if stacks.draft is not None and stacks.draft_owns_kv:
            # The draft's own KV (EAGLE head, draft model) needs the prompt too: every prompt's, or
            # under route those of the requests in the method's lanes.
            lanes = config.lanes
            draft_piece = piece if lanes is None else [c for c in piece if lanes.runs_method(c[0][0])]
            # Set: a config with a draft stack that plans prompts is speculative (a baseline's
            # stacks have no draft).
            draft = cast(Pricer, config.draft)
            if draft_piece is piece:
                work.append(Forward(pricer=draft, groups=[prefill.without_logits()]))
            elif draft_piece:
                q = [c for _, c in draft_piece]
                kv = [e[1] + c for e, c in draft_piece]
                work.append(Forward(pricer=draft, groups=[prefill_group(q, kv, 0)]))
        if config.prefill_per_request:
            work.append(Forward(pricer=config.target, groups=[prefill], offloaded_layers=config.offloaded_layers,
                                kv_offloaded=config.kv_offloaded))
            prefill = None
    return prefill


def _lane_drafts(config: StepConfig, lanes: Lanes, shape: StepShape, slots: DecodeSlots, n: int, span: np.ndarray,
                 host_context: float, catch_up) -> list[WorkItem]:
    """route, combine: the method's drafter over the rows of its lanes, prompt lookup over those of
    lookup lanes, and the speculative host work of every row that proposes; lanes: config.lanes."""
    model_rows, lookup_rows = lanes.drafting_rows(slots.rid[:n], slots.steps[:n])
    method_rows = n if model_rows is None else int(np.count_nonzero(model_rows))
    work: list[WorkItem] = []
    if method_rows:
        sub_span = span if model_rows is None else span[model_rows]
        behind = slots.last_sum if model_rows is None else int(slots.last[:n][model_rows].sum())
        add_subtotal(work, _drafts(config, shape, slots, method_rows, sub_span, int(sub_span.sum()), host_context,
                                   catch_up, behind))
    if lookup_rows:
        work.append(HostDraft(requests=lookup_rows, context_tokens=host_context))
    proposing = n if model_rows is None else method_rows + lookup_rows
    forwards = 0 if config.stacks.draft is None or not method_rows else shape.draft_forwards
    work.append(SpeculationHost(requests=proposing, draft_forwards=forwards))
    return work


def _drafts(config: StepConfig, shape: StepShape, slots: DecodeSlots, n: int, ctx: np.ndarray, ctx_sum: int,
            host_context: float, catch_up, behind_sum: int | None = None) -> list[WorkItem]:
    """The drafter's work for n decoding requests before their verification; ctx: the context each
    row's draft attention reads, host_context: the mean history a host drafter searches;
    behind_sum: the tokens the rows' own-KV drafter catches up on (default: every row's)."""
    draft, k = config.draft, shape.k
    if draft is None:                   # n-gram prompt lookup on the host
        return [HostDraft(requests=n, context_tokens=host_context)]
    if config.method == "medusa":       # all heads in one forward on the last hidden state
        return [UniformForward(pricer=draft, phase=DRAFT, requests=n, query=1, kv_tokens_sum=ctx_sum, draft_k=k)]
    if config.track_last:
        # A drafter with its own KV first catches up on the tokens the last step committed.
        behind, behind_sum = config.verify_tokens, slots.last_sum if behind_sum is None else behind_sum
        if catch_up is not None:
            behind, behind_sum = catch_up
        work: list[WorkItem] = [UniformForward(pricer=draft, phase=DRAFT, requests=n, query=behind,
                                               kv_tokens_sum=ctx_sum, tokens=behind_sum, logits_tokens=n,
                                               context=ctx, draft_k=k)]
    else:
        work = [UniformForward(pricer=draft, phase=DRAFT, requests=n, query=1, kv_tokens_sum=ctx_sum, context=ctx,
                               offloaded_layers=config.draft_offloaded_layers, draft_k=k)]
    rest = shape.draft_forwards - 1
    if rest:
        # Forward j (1 .. rest) reads j x width drafted tokens besides the context.
        width = config.tree_width
        mean_extra = width * (rest + 1) / 2
        work.append(UniformForward(pricer=draft, phase=DRAFT, requests=n, query=width,
                                   kv_tokens_sum=ctx_sum + n * mean_extra, context=ctx, kv_offset=mean_extra,
                                   offloaded_layers=config.draft_offloaded_layers, repeat=rest, draft_k=k))
    return work


def add_subtotal(work: list[WorkItem], items: list[WorkItem]) -> None:
    """Append `items` summed first: one item as it is (0.0 + x is x exactly)."""
    if len(items) == 1:
        work.append(items[0])
    else:
        work.append(Subtotal(items=items))


def price(work: list[WorkItem], cost, shares: list[float]) -> float:
    """Seconds of the planned step (a StepPlan) as `cost` (sim/cost/model.py CostModel) prices
    it, its items in order; each term's part goes to its phase in `shares`."""
    host = cost.host
    seconds = 0.0
    for item in work:
        seconds += item.price(host, shares)
    return seconds


def price_decode_steps(config: StepConfig, cost, slots: DecodeSlots, n: int, ks, expected_tokens: np.ndarray,
                       chunks_at: Callable[[int], list] | None = None) -> list[float]:
    """Seconds that k drafts per request cost the decoding slots 0..n-1, for each k in ks, in the
    steady state of drafting k (goodput's denominators): a plain decode step's, plus what drafting
    k adds to a step with the prompt chunks `chunks_at(k)` (verification tokens beside a prefill
    chunk run at the chunk's compute-bound rate). A drafter with its own KV catches up on the
    tokens a step at k commits (expected_tokens[k] a request), so a longer k pays at the next
    step too. Priced into scratch shares: the run's are not touched."""
    scratch = [0.0] * len(PHASES)

    def priced(k: int, chunks) -> float:
        catch_up = (k + 1, max(int(round(n * expected_tokens[k])), n)) if config.track_last and k else None
        return price(plan_step(config, config.shape(k), slots, n, chunks, catch_up=catch_up), cost, scratch)

    plain = priced(0, ())
    chunks_plain = priced(0, chunks_at(0)) if chunks_at is not None else 0.0
    seconds = []
    for k in ks:
        if k == 0:
            seconds.append(plain)
        elif chunks_at is not None:
            seconds.append(plain + priced(k, chunks_at(k)) - chunks_plain)
        else:
            seconds.append(priced(k, ()))
    return seconds

