"""Stacks priced by an engine timed from outside, whole forwards at a time (`profiler calibrate
--engine hf | vllm | llama.cpp`): nothing inside a forward is known, only what a step of so many
requests, query tokens and KV tokens took, with the engine's host work of a step inside it."""
from __future__ import annotations

from typing import Sequence

from sim.cost.batch import PREFILL, Group
from sim.cost.roofline import RooflinePricer
from sim.cost.table import select_from_tables
from sim.cost.work import Forward, Selection, UniformForward
from sim.formats.bundle import Bundle
from sim.formats.provenance import repo_relative


class _WholeSteps:
    """What both black boxes share: a step's groups priced together, each group's part of it
    going to its phase; SpecPV's selection from the bundle's tables (or the roofline's)."""

    def __init__(self, stack, bundle: Bundle, roofline: RooflinePricer):
        self.stack = stack
        self.bundle = bundle
        self.roofline = roofline
        self.origin = f"{bundle.meta.get('engine')} timed whole ({repo_relative(bundle.path)})"
        self.forward_factor = bundle.forward_factor()
        self.selection_factor = bundle.selection_factor()

    def needs_kv_tokens(self, query: int) -> bool:
        return False

    def step_s(self, groups: Sequence[Group], draft_k: int | None = None) -> tuple[float, list[float]]:
        """A step of these groups and each group's own time (each black box's own)."""
        raise NotImplementedError

    def forward(self, forward: Forward, shares: list[float]) -> float:
        groups = forward.groups
        seconds, own = self.step_s(groups, forward.draft_k)
        total = sum(own)
        repeat = forward.repeat
        for g, part in zip(groups, own):
            if part:
                shares[g.phase] += part * seconds / total * repeat
        return seconds * repeat

    def forward_uniform(self, forward: UniformForward, shares: list[float]) -> float:
        return self.forward(forward.as_forward(kv_per_request=self.stack.kv_window is not None), shares)

    def selection(self, selection: Selection, shares: list[float]) -> float:
        return select_from_tables(self.bundle, self.forward_factor, self.selection_factor, self.roofline, selection,
                                  shares)


class BlackBoxPricer(_WholeSteps):
    """A target priced by the engine's whole forwards: engine_forward (requests, query tokens, KV
    tokens) and engine_prefill (requests, prompt tokens)."""

    def __init__(self, stack, bundle: Bundle, roofline: RooflinePricer):
        super().__init__(stack, bundle, roofline)
        # A bundle of the engine timed whole holds both (profiler/serve/calibrate.py).
        self.forward_table = bundle.tables["engine_forward"]
        self.prefill = bundle.tables["engine_prefill"]
        self.query_max = float(self.forward_table.axes[1][-1])
        # Every measured point is a whole step of its own, so each holds the step's fixed cost (the
        # weights read, the host's step work); the cheapest step measured is taken as that cost.
        self.fixed_s = float(self.forward_table(1, 1, float(self.forward_table.axes[2][0])))

    def step_s(self, groups: Sequence[Group], draft_k: int | None = None) -> tuple[float, list[float]]:
        """A step of these groups and each group's own time: a continuous-batching engine runs them
        as one forward, which pays the step's fixed cost once, not once a group (never less than
        its costliest group)."""
        own = [self.group_s(g) if g.tokens else 0.0 for g in groups]
        parts = sum(1 for g in groups if g.tokens)
        return max(sum(own) - (parts - 1) * self.fixed_s, max(own, default=0.0)), own

    def group_s(self, group: Group) -> float:
        n = max(group.requests, 1)
        q = group.tokens / n
        kv = group.kv_tokens_sum / n
        if group.phase == PREFILL or q > self.query_max:
            return self.prefill(n, q)
        return self.forward_table(n, q, max(kv, q))


class BlackBoxDraftPricer(_WholeSteps):
    """An EAGLE head priced by the drafting an engine's steps add (`profiler calibrate --engine vllm
    --head DIR`): engine_draft (requests, query tokens verified, KV tokens), a step's whole drafting
    of query - 1 tokens, and engine_draft_prefill (requests, prompt tokens), the head's part of a
    prompt's first token. A chain of k drafts runs k head forwards a step (the catch-up that gives
    the first draft, then one a draft), each priced a k-th of the step's drafting at k: the table
    at k + 1 verified tokens, k the step's own (a policy may draft fewer than the scenario's)."""

    def __init__(self, stack, bundle: Bundle, roofline: RooflinePricer, k: int):
        super().__init__(stack, bundle, roofline)
        # Timed with the head, the bundle holds both (profiler/serve/calibrate.py).
        self.draft = bundle.tables["engine_draft"]
        self.prefill = bundle.tables["engine_draft_prefill"]
        self.k = k                          # the scenario's: a forward priced without the step's k

    def step_s(self, groups: Sequence[Group], draft_k: int | None = None) -> tuple[float, list[float]]:
        own = [self.group_s(g, draft_k or self.k) if g.tokens else 0.0 for g in groups]
        return sum(own), own

    def group_s(self, group: Group, k: int) -> float:
        n = max(group.requests, 1)
        if group.phase == PREFILL:
            return self.prefill(n, group.tokens / n)
        kv = group.kv_tokens_sum / n
        return self.draft(n, k + 1, kv) / k
