"""The scenario's speculation section: the method, its drafts (chain or tree), its acceptance, the
draft's own settings, SpecPV's partial verification and the policy that picks k per step."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, model_validator

from sim.formats.names import METHODS
from sim.scenario.strict import Strict


class Tree(Strict):
    """A static tree: `width` candidates at each of `depth` levels, or `tokens` spread over `depth`.

    topk (with tokens): EAGLE-2/3 and SGLang's form: each of `depth` draft forwards expands the
    `topk` best branches (topk query tokens per request), and the best `tokens` of the candidates
    are verified."""
    width: PositiveInt | None = None
    depth: PositiveInt
    tokens: PositiveInt | None = None
    topk: PositiveInt | None = None

    @model_validator(mode="after")
    def _check_form(self):
        if (self.width is None) == (self.tokens is None):
            raise ValueError("give exactly one of width or tokens (with depth)")
        if self.tokens is not None and self.tokens < self.depth:
            raise ValueError(f"tokens ({self.tokens}) must be at least depth ({self.depth})")
        if self.topk is not None and self.tokens is None:
            raise ValueError("topk goes with tokens (width already is the per-level count)")
        return self

    @property
    def draft_tokens(self) -> int:
        """Drafted tokens in the tree, root excluded."""
        return self.width * self.depth if self.width is not None else self.tokens

    @property
    def tokens_per_draft_forward(self) -> int:
        if self.width is not None:
            return self.width
        return self.topk if self.topk is not None else math.ceil(self.tokens / self.depth)


class Acceptance(Strict):
    """How many drafted tokens the target keeps. Exactly one of the four forms."""
    tokens_per_step: float | None = Field(default=None, ge=1.0)
    rate: float | None = Field(default=None, ge=0.0, lt=1.0)
    per_position: Annotated[list[Annotated[float, Field(ge=0.0, le=1.0)]], Field(min_length=1)] | None = None
    trace: Path | None = None
    request_spread: NonNegativeFloat = 0.0   # std of the per-request rate across requests (Beta)
    context_slope: float = 0.0               # change of the rate per doubling of context past 1024
    # Share of a request's steps at which the drafter proposes at all (an n-gram drafter only where
    # the history matches); at the others the request verifies and commits one token.
    draft_share: float = Field(default=1.0, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _check_one_form(self):
        forms = [name for name in ("tokens_per_step", "rate", "per_position", "trace")
                 if getattr(self, name) is not None]
        if len(forms) != 1:
            got = ", ".join(forms) if forms else "none"
            raise ValueError(f"give exactly one of tokens_per_step, rate, per_position, trace (got {got})")
        if (self.request_spread or self.context_slope) and forms[0] not in ("rate", "per_position"):
            raise ValueError("request_spread and context_slope apply to rate or per_position")
        if self.draft_share < 1.0 and forms[0] == "trace":
            raise ValueError("draft_share does not apply to a trace (it records every step)")
        return self


STREAMING_KV_BUDGET = 512     # a streaming self-draft's KV tokens where draft.kv_budget is unset


class Draft(Strict):
    model: str | None = None          # draft_model: preset or config.json
    bits: Literal[4, 8] = 4           # shadow: weight-only quantization of the target's layers
    group_size: PositiveInt = 64      # shadow
    exit_layer: PositiveInt | None = None   # layerskip
    # streaming: sink + recent window the self-draft attends to (unset: 512); draft_model: set, the
    # draft model's own KV is a StreamingLLM cache of this many tokens (MagicDec), unset, the whole context.
    kv_budget: PositiveInt | None = None
    sink: PositiveInt = 32            # streaming / draft_model with kv_budget: of kv_budget, the sink part
    layers: PositiveInt = 1           # eagle / eagle3 / mtp / medusa head depth
    vocab: PositiveInt | None = None  # head vocabulary; default 32000 for eagle3, the target's otherwise


class Disagreement(Strict):
    """SpecPV: probability that a token accepted under partial attention differs from full attention.

    p = per_token * (at_budget / budget) ** budget_exponent * (context / at_context) ** context_exponent,
    clipped to [0, 1]; zero while the whole context fits in the partial cache.
    """
    per_token: float = Field(default=0.002, ge=0.0, le=1.0)
    at_budget: PositiveInt = 4096
    at_context: PositiveInt = 32768
    budget_exponent: NonNegativeFloat = 1.0
    context_exponent: NonNegativeFloat = 0.5


class PartialVerify(Strict):
    budget: PositiveInt
    sink: PositiveInt = 32
    window: PositiveInt = 128
    block: PositiveInt = 16
    period: PositiveInt = 20
    period_unit: Literal["tokens", "steps"] = "tokens"
    rectify: bool = False
    # When blocks are chosen: at each full verification, for the partial steps until the next one
    # (SpecPV), or at every partial step from the step's own queries (Quest; the live engine).
    reselect: Literal["refresh", "step"] = "refresh"
    disagreement: Disagreement = Disagreement()

    @property
    def static_tokens(self) -> int:
        """Partial-cache tokens besides the buffer of tokens accepted since the last refresh."""
        return self.sink + self.budget + self.window


class Goodput(Strict):
    """k chosen each iteration for the whole batch, to maximize expected committed tokens per second."""
    allow_off: bool = True            # k = 0 (a plain decode step) is one of the choices


class SecondDrafter(Strict):
    """A drafter beside the scenario's method (route, combine): prompt lookup on the host, whose
    acceptance (draft_share: the share of steps at which its history matches) is its own, or, in a
    route, `none` (those requests decode without speculation) or the scenario's own method with
    the category's acceptance."""
    method: Literal[METHODS] = "ngram"
    num_speculative_tokens: PositiveInt | None = None     # unset: the scenario's
    acceptance: Acceptance | None = None

    @model_validator(mode="after")
    def _check_form(self):
        if self.method == "none" and (self.acceptance is not None or self.num_speculative_tokens is not None):
            raise ValueError("method none takes no acceptance or num_speculative_tokens")
        if self.method != "none" and self.acceptance is None:
            raise ValueError(f"method {self.method} needs acceptance")
        if self.acceptance is not None and self.acceptance.trace is not None:
            raise ValueError("a second drafter's acceptance takes rate, per_position or tokens_per_step, not a trace")
        return self


class Combine(Strict):
    """Two drafters propose at every step; per request, one proposal is verified. `proposes`: the
    second drafter's wherever it has one (its history matches), the method's elsewhere (suffix or
    prompt lookup first, a model drafter as the fallback); `confident`: the second's where it has
    one and expects to have more drafts accepted than the method does (each from its own
    acceptance: mean survival, per request where the acceptance has a request spread)."""
    drafter: SecondDrafter
    rule: Literal["proposes", "confident"] = "proposes"

    @model_validator(mode="after")
    def _check_host(self):
        if self.drafter.method != "ngram":
            raise ValueError(f"combine's drafter is prompt lookup (method ngram), got {self.drafter.method}")
        return self


POLICIES = ("static", "off_above_batch", "k_by_batch", "goodput", "oracle", "route", "combine")
BatchRange = Annotated[list[NonNegativeInt], Field(min_length=3, max_length=3)]


class Policy(Strict):
    """How many tokens each iteration drafts: at most one field (none: static, the scenario's k
    at every step). Written `policy: static`, `policy: goodput`, `policy: oracle`,
    `policy: {off_above_batch: 8}`, `policy: {k_by_batch: [[1, 4, 5], [5, 32, 2], [33, 256, 0]]}`
    or `policy: {goodput: {allow_off: false}}`."""
    off_above_batch: NonNegativeInt | None = None   # no drafting while more requests than this run
    # [first batch, last batch, k] ranges (inclusive; batch: requests in the running batch), the
    # first from 1, sorted, without gaps; past the last range its k holds. vLLM's
    # num_speculative_tokens_per_batch_size.
    k_by_batch: Annotated[list[BatchRange], Field(min_length=1)] | None = None
    goodput: Goodput | None = None
    oracle: bool = False      # a bound: each step proposes exactly what will be accepted
    # category -> the drafter its requests use (categories from workload.categories or the trace);
    # categories not named keep the scenario's method.
    route: Annotated[dict[str, SecondDrafter], Field(min_length=1)] | None = None
    combine: Combine | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value):
        if isinstance(value, str):
            if value == "static":
                return {}
            if value == "goodput":
                return {"goodput": {}}
            if value == "oracle":
                return {"oracle": True}
            if value == "off_above_batch":
                raise ValueError("off_above_batch needs a batch size: {off_above_batch: N}")
            if value == "k_by_batch":
                raise ValueError("k_by_batch needs ranges: {k_by_batch: [[1, LAST, K], [LAST + 1, ..., K2], ...]}")
            if value in ("route", "combine"):
                raise ValueError(f"{value} needs its drafters (docs/scenario.md, speculation.policy)")
            raise ValueError(f"unknown policy {value!r} (known: {', '.join(POLICIES)})")
        return value

    @model_validator(mode="after")
    def _check_one(self):
        if sum((self.off_above_batch is not None, self.k_by_batch is not None, self.goodput is not None,
                self.oracle, self.route is not None, self.combine is not None)) > 1:
            raise ValueError("give at most one of off_above_batch, k_by_batch, goodput, oracle, route, combine")
        if self.k_by_batch is not None:
            expected = 1
            for first, last, _ in self.k_by_batch:
                if first != expected or last < first:
                    raise ValueError(f"k_by_batch ranges must run from batch 1 without gaps or overlaps "
                                     f"(expected [{expected}, last >= {expected}, k], got [{first}, {last}, ...])")
                expected = last + 1
        return self

    @property
    def kind(self) -> str:
        if self.off_above_batch is not None:
            return "off_above_batch"
        if self.k_by_batch is not None:
            return "k_by_batch"
        if self.route is not None:
            return "route"
        if self.combine is not None:
            return "combine"
        return "goodput" if self.goodput else "oracle" if self.oracle else "static"

    @property
    def second_drafters(self) -> list[SecondDrafter]:
        """The drafters besides the scenario's method that route or combine runs."""
        if self.route is not None:
            return list(self.route.values())
        return [self.combine.drafter] if self.combine is not None else []


class Speculation(Strict):
    method: Literal[METHODS] = "none"
    num_speculative_tokens: PositiveInt = 3
    tree: Tree | None = None
    acceptance: Acceptance | None = None
    draft: Draft = Draft()
    partial_verify: PartialVerify | None = None
    policy: Policy = Policy()

    @model_validator(mode="after")
    def _check_method(self):
        if self.method == "none":
            if self.acceptance is not None or self.tree is not None or self.partial_verify is not None:
                raise ValueError("method none takes no acceptance, tree or partial_verify")
            if self.policy.kind != "static":
                raise ValueError(f"policy {self.policy.kind} needs a speculation method")
        elif self.acceptance is None:
            raise ValueError(f"method {self.method} needs acceptance")
        if self.method == "draft_model" and self.draft.model is None:
            raise ValueError("method draft_model needs draft.model")
        if self.method == "layerskip" and self.draft.exit_layer is None:
            raise ValueError("method layerskip needs draft.exit_layer")
        if self.method == "medusa" and self.draft_depth > 8:
            raise ValueError("medusa has one head per draft position; more than 8 heads is unsupported")
        if self.draft_kv_window is not None and self.draft.sink >= self.draft_kv_window:
            raise ValueError("draft.sink must be below draft.kv_budget")
        if self.acceptance is not None and self.acceptance.tokens_per_step is not None:
            if self.acceptance.tokens_per_step > self.max_tokens_per_step:
                raise ValueError(f"acceptance.tokens_per_step {self.acceptance.tokens_per_step} exceeds "
                                 f"the {self.max_tokens_per_step} a step can commit")
        if self.policy.kind != "static" and self.partial_verify is not None:
            raise ValueError(f"policy {self.policy.kind} does not combine with partial_verify "
                             "(SpecPV verifies at every step)")
        if self.policy.kind in ("goodput", "oracle", "k_by_batch", "route", "combine") and self.tree is not None:
            raise ValueError(f"policy {self.policy.kind} takes a chain; a tree takes static or off_above_batch")
        for category, drafter in (self.policy.route or {}).items():
            if drafter.method not in ("ngram", "none", self.method):
                raise ValueError(f"route {category}: method {drafter.method} is neither ngram, none nor the "
                                 f"scenario's {self.method} (one model drafter per step)")
            if drafter.method == self.method and drafter.num_speculative_tokens not in (None, self.num_speculative_tokens):
                raise ValueError(f"route {category}: the scenario's method drafts its num_speculative_tokens "
                                 f"({self.num_speculative_tokens}) in every category")
        if self.policy.combine is not None and self.method in ("ngram", "none"):
            raise ValueError("combine pairs prompt lookup with a model drafter: the scenario's method must be one")
        for second in self.policy.second_drafters:
            a, k = second.acceptance, second.num_speculative_tokens or self.num_speculative_tokens
            if a is not None and a.tokens_per_step is not None and a.tokens_per_step > k + 1:
                raise ValueError(f"a second drafter's acceptance.tokens_per_step {a.tokens_per_step} exceeds "
                                 f"the {k + 1} a step of {k} drafts can commit")
            if a is not None and a.per_position is not None and len(a.per_position) < k:
                raise ValueError(f"a second drafter's acceptance.per_position has {len(a.per_position)} rates "
                                 f"for {k} drafts")
        if self.policy.k_by_batch is not None:
            most = max(k for _, _, k in self.policy.k_by_batch)
            if most > self.num_speculative_tokens:
                raise ValueError(f"policy k_by_batch drafts up to {most}, above num_speculative_tokens "
                                 f"{self.num_speculative_tokens} (the most a step drafts)")
        if self.acceptance is not None and self.acceptance.per_position is not None:
            if len(self.acceptance.per_position) < self.draft_depth:
                raise ValueError(f"acceptance.per_position has {len(self.acceptance.per_position)} rates; "
                                 f"the draft is {self.draft_depth} deep")
        return self

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def draft_kv_window(self) -> int | None:
        """KV tokens per request the draft attends to, None for the whole context: streaming's
        kv_budget, and a draft model's where the scenario sets one."""
        if self.method == "streaming":
            return self.draft.kv_budget or STREAMING_KV_BUDGET
        return self.draft.kv_budget if self.method == "draft_model" else None

    @property
    def draft_depth(self) -> int:
        """Longest chain of drafted tokens a step can accept."""
        return self.tree.depth if self.tree is not None else self.num_speculative_tokens

    @property
    def max_tokens_per_step(self) -> int:
        return self.draft_depth + 1

    @property
    def verify_tokens(self) -> int:
        """Query tokens per request in a verification forward: the drafts plus the last committed token."""
        drafted = self.tree.draft_tokens if self.tree is not None else self.num_speculative_tokens
        for second in self.policy.second_drafters:     # route, combine: the longest proposal
            drafted = max(drafted, second.num_speculative_tokens or 0)
        return drafted + 1
