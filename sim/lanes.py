"""Route and combine: a drafter beside the scenario's method, chosen per request and step.

Each decoding request verifies, at each step, the proposal of one lane:
- the scenario's method (lane 0; under route, a category may give it an acceptance of its own,
  another lane of the same kind);
- prompt lookup on the host (`ngram`), which proposes only where its history matches
  (acceptance.draft_share of the steps) and otherwise leaves the request a plain one-token step;
- no speculation (`none`, route only): the request verifies its one next token.

route: a request's lane is its category's, for its whole life. Only the requests in the model
drafter's lanes run its forwards, only those in lookup lanes search their history.
combine: both drafters propose at every step for every request (the model drafter's batched
forwards, lookup on the host), and the rule picks the proposal verified: lookup's wherever it has
one (`proposes`), or where it has one and expects more accepted drafts than the method does
(`confident`: each drafter's mean survival, per request where its acceptance has a request spread).

The lanes' acceptances are drawn independently: where lookup matches, the model drafter does as
well as anywhere else. On live traces prompt lookup and a model drafter do well on the same
repetitive text; `sim oracle` measures what that does to combine (docs/validation-policies.md).
Whether a request's lookup matches at its step s is a fixed hash of (seed, request, s), so pricing
a step (which asks for its rows' proposal lengths first) and drawing it agree.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.acceptance import MAX_RATE, AcceptanceModel, DraftShareAcceptance, SurvivalAcceptance, build_acceptance_model
from sim.scenario.schema import Scenario
from sim.scenario.speculation import SecondDrafter
from sim.workload import Requests

METHOD, LOOKUP, NONE = "method", "ngram", "none"


@dataclass
class Lane:
    kind: str                       # METHOD, LOOKUP or NONE
    model: AcceptanceModel | None   # None for NONE; a lookup lane's model includes its draft share
    drafts: int                     # tokens a proposal drafts (0 for NONE)


class LaneAcceptance(AcceptanceModel):
    uses_rids = True
    uses_steps = True

    def __init__(self, lanes: list[Lane], request_lane: np.ndarray | None, combine_rule: str | None,
                 confident: np.ndarray | None = None):
        """request_lane: [requests] each request's lane (route); combine_rule: combine's rule, lanes
        then being [method, lookup]; confident: [requests] bool, lookup expects more (`confident`)."""
        self.lanes = lanes
        self.depth = max(lane.drafts for lane in lanes)
        self.request_lane = request_lane
        self.combine_rule = combine_rule
        self.confident = confident
        self.uses_context = any(lane.model is not None and lane.model.uses_context for lane in lanes)
        self.kinds = np.array([lane.kind for lane in lanes])
        self.is_method = self.kinds == METHOD
        self.is_lookup = self.kinds == LOOKUP
        self.verify_of_lane = np.array([lane.drafts + 1 for lane in lanes], dtype=np.int64)
        # Request-steps that verified each lane's proposal, and all request-steps.
        self.steps_by_lane = np.zeros(len(lanes), dtype=np.int64)
        self.steps_total = 0

    def lanes_of(self, rids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """[n] the lane each request's proposal comes from at its step."""
        if self.request_lane is not None:
            return self.request_lane[rids]
        lookup = self.lanes[1].model
        proposes = lookup.drafts(rids, steps) if isinstance(lookup, DraftShareAcceptance) else np.ones(len(rids), bool)
        if self.combine_rule == "confident":
            proposes &= self.confident[rids]
        return proposes.astype(np.int64)

    def proposed_tokens(self, rids: np.ndarray, steps: np.ndarray, lanes: np.ndarray) -> np.ndarray:
        """[n] tokens each request verifies: its lane's drafts + 1; 1 where its lane's drafter
        proposes nothing at this step (an acceptance with a draft_share; combine takes lookup's
        lane only where it proposes)."""
        lengths = self.verify_of_lane[lanes]
        for i, lane in enumerate(self.lanes):
            if not isinstance(lane.model, DraftShareAcceptance) or (self.combine_rule is not None and lane.kind == LOOKUP):
                continue
            rows = lanes == i
            if rows.any():
                lengths[rows] = np.where(lane.model.drafts(rids[rows], steps[rows]), lengths[rows], 1)
        return lengths

    @property
    def verify_tokens(self):
        return lambda rids, steps: self.proposed_tokens(rids, steps, self.lanes_of(rids, steps))

    def drafting_rows(self, rids: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray | None, int]:
        """Rows that run the model drafter's forwards (a bool mask, None for all), and how many
        run a prompt lookup on the host, this step."""
        if self.request_lane is None:          # combine: both drafters, every row
            return None, len(rids)
        lanes = self.request_lane[rids]
        return self.is_method[lanes], int(np.count_nonzero(self.is_lookup[lanes]))

    def runs_method(self, rid: int) -> bool:
        """Whether a request ever runs the method's drafter (route: its lane is the method's)."""
        return self.request_lane is None or bool(self.is_method[self.request_lane[rid]])

    def draw(self, n, rids, steps, context):
        lanes = self.lanes_of(rids, steps)
        tokens = np.ones(n, dtype=np.int64)
        counts = np.bincount(lanes, minlength=len(self.lanes))
        for i in np.flatnonzero(counts):
            model = self.lanes[i].model
            if model is None:
                continue
            rows = lanes == i
            if isinstance(model, DraftShareAcceptance):
                if self.combine_rule is not None:
                    model = model.inner        # combine picked lookup only where it proposes
                else:                          # route: count the steps at which lookup proposed
                    counts[i] = np.count_nonzero(model.drafts(rids[rows], steps[rows]))
            tokens[rows] = model.draw(int(rows.sum()), rids[rows], steps[rows],
                                      context[rows] if context is not None else None)[0]
        self.steps_by_lane += counts
        self.steps_total += n
        return tokens, int(tokens.sum())

    def survival(self):
        return self.lanes[0].model.survival()

    def lookup_share(self) -> float:
        """Share of the request-steps that verified prompt lookup's proposal."""
        total = self.steps_total
        return float(self.steps_by_lane[self.is_lookup].sum() / total) if total else 0.0


def build_lanes(scenario: Scenario, requests: Requests, method_model: AcceptanceModel,
                rng: np.random.Generator) -> LaneAcceptance:
    """The route or combine policy's lanes, the scenario's own acceptance model first."""
    spec = scenario.speculation
    policy = spec.policy
    lanes = [Lane(METHOD, method_model, spec.num_speculative_tokens)]
    if policy.combine is not None:
        lookup = second_lane(policy.combine.drafter, spec.num_speculative_tokens, len(requests), rng)
        lanes.append(lookup)
        confident = None
        if policy.combine.rule == "confident":
            inner = lookup.model.inner if isinstance(lookup.model, DraftShareAcceptance) else lookup.model
            confident = expected_accepted(inner, len(requests)) > expected_accepted(method_model, len(requests))
        return LaneAcceptance(lanes, None, policy.combine.rule, confident)
    lane_of_category = np.zeros(len(requests.category_names), dtype=np.int64)
    for category, drafter in policy.route.items():
        lanes.append(second_lane(drafter, spec.num_speculative_tokens, len(requests), rng))
        lane_of_category[requests.category_names.index(category)] = len(lanes) - 1
    return LaneAcceptance(lanes, lane_of_category[requests.category], None)


def second_lane(drafter: SecondDrafter, default_k: int, requests: int, rng: np.random.Generator) -> Lane:
    if drafter.method == NONE:
        return Lane(NONE, None, 0)
    k = drafter.num_speculative_tokens or default_k
    kind = LOOKUP if drafter.method == LOOKUP else METHOD
    return Lane(kind, build_acceptance_model(drafter.acceptance, k, requests, rng), k)


def expected_accepted(model: AcceptanceModel, requests: int) -> np.ndarray:
    """[requests] mean accepted drafts of a step: the request's own where the model has a spread."""
    if isinstance(model, SurvivalAcceptance):
        rates = np.clip(model.rates[None, :] + model.shift[:, None], 0.0, MAX_RATE)
        return np.cumprod(rates, axis=1).sum(axis=1)
    return np.full(requests, float(np.sum(model.survival())))
