"""A step's work as values: what `plan_step` (sim/step.py) says a step runs, item by item, and what
each item costs when priced.

    StepHost          the engine's host work of the step (its requests, the tokens each verifies)
    HostDraft         prompt lookup on the host
    SpeculationHost   the engine's host work of drafting (its requests, its draft forwards)
    Forward           one stack's forward over groups of requests (sim/cost/batch.py Group)
    UniformForward    one stack's forward over one group whose requests all run the same query
                      tokens: decode, verification and draft forwards, the hot path
    Selection         SpecPV's block selection in every layer of a stack
    Subtotal          items summed first (a step's drafting)
    RankedStep        attention data-parallel ranks in lockstep: the slowest rank's own work, then
                      each forward's MoE layers over every rank's tokens (ExpertsWork)

Every item prices itself (`price(host, shares)`: seconds, each phase's part added to `shares`,
indexed by the phases of sim/cost/batch.py): the host items by the engine's host work (`HostWork`:
an engine preset's, a published host table's or a bundle's fits, sim/cost/host.py and table.py),
the forwards and selections by their stack's `Pricer` (the roofline, sim/cost/roofline.py, the
reference; a bundle's operator tables, sim/cost/table.py; an engine timed whole,
sim/cost/blackbox.py). Each names where its figures come from in `origin`; the simulator sees
nothing else of them (sim/cost/model.py composes them).

The items are slotted and keyword-only, built every simulated step, and not frozen: a frozen
dataclass's __init__ costs twice a plain one's. Treat them as values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, Union

import numpy as np

from sim.cost.batch import Group
from sim.cost.stack import Stack


class Pricer(Protocol):
    """One stack's forwards and block selection, in seconds; each phase's part into `shares`."""
    stack: Stack
    origin: str

    def needs_kv_tokens(self, query: int) -> bool:
        """Does pricing a group of `query`-token requests need each request's KV, not just the sum?"""
        ...

    def forward(self, forward: Forward, shares: list[float]) -> float:
        """Seconds of `forward.repeat` forwards over `forward.groups`."""
        ...

    def forward_uniform(self, forward: UniformForward, shares: list[float]) -> float:
        """Seconds of `forward`, one uniform group: the same as `forward` over its group."""
        ...

    def selection(self, selection: Selection, shares: list[float]) -> float:
        """Seconds of SpecPV's block selection in every layer of the stack."""
        ...


class AllReduce(Protocol):
    """A tensor-parallel all-reduce's price (sim/cost/collectives.py, sim/cost/measured.py)."""
    origin: str

    def all_reduce_s(self, message_bytes: float, ranks: int) -> float:
        """One all-reduce of `message_bytes` across `ranks` GPUs."""
        ...


class AllToAll(Protocol):
    """Expert parallelism's dispatch and combine (sim/cost/collectives.py, sim/cost/measured_model.py)."""
    origin: str

    def exchange_s(self, elements: float, ranks: int, element_bytes: float) -> float:
        """Dispatch and combine of `elements` values a GPU sends (tokens x top-k x hidden) across `ranks` GPUs."""
        ...


class HostWork(Protocol):
    """The engine's host work, in seconds; each phase's part into `shares`."""
    origin: str

    def step_overhead(self, requests: int, shares: list[float], verify_tokens: int = 1) -> float:
        """One iteration over `requests` requests, each verifying `verify_tokens` (1: plain decode)."""
        ...

    def speculation_overhead(self, requests: int, draft_forwards: int, shares: list[float]) -> float:
        """A speculative step's drafting bookkeeping over `requests` requests and `draft_forwards`."""
        ...

    def host_draft(self, requests: int, shares: list[float], context_tokens: float | None = None) -> float:
        """Prompt lookup for `requests` requests over `context_tokens` of history each."""
        ...


@dataclass(slots=True, kw_only=True)
class StepHost:
    """The engine's host work of one iteration over `requests` requests, each verifying
    `verify_tokens` (1: a plain decode step)."""
    requests: int
    verify_tokens: int = 1

    def price(self, host: HostWork, shares: list[float]) -> float:
        return host.step_overhead(self.requests, shares, self.verify_tokens)


@dataclass(slots=True, kw_only=True)
class HostDraft:
    """Prompt lookup on the host for `requests` requests searching `context_tokens` of history
    each (the mean), where known."""
    requests: int
    context_tokens: float | None = None

    def price(self, host: HostWork, shares: list[float]) -> float:
        return host.host_draft(self.requests, shares, self.context_tokens)


@dataclass(slots=True, kw_only=True)
class SpeculationHost:
    """The engine's host work of a speculative step over `requests` requests that runs
    `draft_forwards` draft forwards."""
    requests: int
    draft_forwards: int

    def price(self, host: HostWork, shares: list[float]) -> float:
        return host.speculation_overhead(self.requests, self.draft_forwards, shares)


@dataclass(slots=True, kw_only=True)
class Forward:
    """`repeat` identical forwards of the stack `pricer` prices, over `groups`.

    offloaded_layers: the stack's layers whose weights stream over the host link each forward;
    kv_offloaded: its KV read over the link too; draft_k: the step's drafts, where this is a draft
    forward (what an engine timed whole prices by)."""
    pricer: Pricer
    groups: Sequence[Group]
    offloaded_layers: int = 0
    kv_offloaded: bool = False
    repeat: int = 1
    draft_k: int | None = None

    def price(self, host: HostWork, shares: list[float]) -> float:
        return self.pricer.forward(self, shares)


@dataclass(slots=True, kw_only=True)
class UniformForward:
    """A Forward over one group of `requests` requests of `query` query tokens each in `phase`,
    reading `kv_tokens_sum` KV tokens in all: described without building the group, which a
    memory-bound pricer never needs.

    tokens: the group's query tokens (default requests x query; fewer where rows are ragged and
    `query` is the longest); logits_tokens: default tokens; context: per-request tokens [n], of which
    each request reads context + kv_offset (needed only where pricing is per request)."""
    pricer: Pricer
    phase: int
    requests: int
    query: int
    kv_tokens_sum: float
    tokens: int | None = None
    logits_tokens: int | None = None
    context: np.ndarray | None = None
    kv_offset: float = 0
    offloaded_layers: int = 0
    kv_offloaded: bool = False
    repeat: int = 1
    draft_k: int | None = None

    def price(self, host: HostWork, shares: list[float]) -> float:
        return self.pricer.forward_uniform(self, shares)

    def group(self, kv_per_request: bool) -> Group:
        """The one group, with each request's KV (context + kv_offset) where asked and known."""
        tokens = self.requests * self.query if self.tokens is None else self.tokens
        kv = self.context + self.kv_offset if kv_per_request and self.context is not None else None
        return Group(phase=self.phase, requests=self.requests, tokens=tokens, query_max=self.query,
                     kv_tokens_sum=self.kv_tokens_sum,
                     logits_tokens=tokens if self.logits_tokens is None else self.logits_tokens, kv_tokens=kv)

    def as_forward(self, kv_per_request: bool) -> Forward:
        """The same forward over its one group (`group`)."""
        return Forward(pricer=self.pricer, groups=[self.group(kv_per_request)], offloaded_layers=self.offloaded_layers,
                       kv_offloaded=self.kv_offloaded, repeat=self.repeat, draft_k=self.draft_k)


@dataclass(slots=True, kw_only=True)
class Selection:
    """SpecPV's block selection in every layer of the stack `pricer` prices, for `requests`
    requests reading `context_sum` tokens with `query_tokens_sum` query tokens, keeping
    `budget_tokens` in blocks of `block_tokens`. part "refresh": the blocks' summaries, the scores
    and the copy of the chosen blocks; "summaries" or "scores": that part alone."""
    pricer: Pricer
    requests: int
    context_sum: int
    query_tokens_sum: int
    budget_tokens: int
    block_tokens: int
    part: str = "refresh"

    def price(self, host: HostWork, shares: list[float]) -> float:
        return self.pricer.selection(self, shares)


@dataclass(slots=True, kw_only=True)
class Subtotal:
    """Items summed first, then added to the step's seconds as one term."""
    items: list[WorkItem] = field(default_factory=list)

    def price(self, host: HostWork, shares: list[float]) -> float:
        seconds = 0.0
        for item in self.items:
            seconds += item.price(host, shares)
        return seconds


class ExpertsPricer(Protocol):
    """A stack's MoE layers over every attention data-parallel rank's tokens (sim/cost/roofline.py
    RooflinePricer, sim/cost/measured.py MeasuredPricer)."""

    def experts_s(self, tokens: float, rank_tokens: float) -> tuple[float, float]:
        """One forward's routed experts over `tokens` (all ranks') and their exchange across the
        GPUs, the busiest rank sending `rank_tokens`: (experts, exchange) seconds."""
        ...


@dataclass(slots=True, kw_only=True)
class ExpertsWork:
    """`repeat` forwards' MoE layers over every rank's `tokens`, in `phase`."""
    pricer: ExpertsPricer
    phase: int
    tokens: float
    rank_tokens: float
    repeat: int = 1

    def terms_s(self) -> tuple[float, float]:
        """(experts, exchange) seconds of the `repeat` forwards."""
        experts, exchange = self.pricer.experts_s(self.tokens, self.rank_tokens)
        return experts * self.repeat, exchange * self.repeat


@dataclass(slots=True, kw_only=True)
class RankedStep:
    """One step of attention data-parallel ranks in lockstep (sim/ranks.py): each rank's own work
    (its scheduler's host work, its requests' drafting and forwards without the routed experts),
    of which the slowest sets the step, then every forward's MoE layers over all ranks' tokens and
    their exchange. overlap (two-batch overlap): the exchange runs behind the other micro-batch's
    compute, so only what exceeds the step's compute is paid."""
    ranks: list[list[WorkItem]]
    experts: list[ExpertsWork]
    overlap: bool = False

    def price(self, host: HostWork, shares: list[float]) -> float:
        slowest, slowest_shares = -1.0, shares
        for work in self.ranks:
            scratch = [0.0] * len(shares)
            seconds = 0.0
            for item in work:
                seconds += item.price(host, scratch)
            if seconds > slowest:
                slowest, slowest_shares = seconds, scratch
        for phase, part in enumerate(slowest_shares):
            shares[phase] += part
        terms = [(e.phase, *e.terms_s()) for e in self.experts]
        compute = slowest + sum(experts for _, experts, _ in terms)
        exchange = sum(exchange for _, _, exchange in terms)
        # Paid exchange: all of it, or under overlap what the compute does not hide, each forward its share.
        paid = (max(0.0, exchange - compute) / exchange if exchange else 0.0) if self.overlap else 1.0
        for phase, experts, exchange_s in terms:
            shares[phase] += experts + exchange_s * paid
        return compute + exchange * paid


WorkItem = Union[StepHost, HostDraft, SpeculationHost, Forward, UniformForward, Selection, Subtotal, RankedStep]
