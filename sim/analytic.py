"""Closed forms for single-request steady state, and their costs taken from the cost model.

Leviathan et al. (2023): with i.i.d. acceptance a, k drafts per step and draft/target cost ratio c,
    E[tokens per step] = (1 - a^(k+1)) / (1 - a),   speedup = E[tokens] / (k c + 1),
assuming a verification of k+1 tokens costs one target decode. MagicDec (Chen et al. 2024) drops
that premise and writes the speedup with measured ratios:
    speedup = E[tokens] / (k T_draft / T_target + T_verify(k) / T_target).
`steady_state` prices T_target, T_draft and T_verify for one request at one context through the
simulator's own step planner and pricer, so the SimPy model and the closed form share every cost
term and every forward a step runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.cost.batch import PHASES
from sim.cost.memory import plan_memory
from sim.cost.model import CostModel, cost_model_for
from sim.cost.stack import build_stacks
from sim.scenario.load import load_scenario
from sim.scenario.schema import Scenario
from sim.slots import DecodeSlots
from sim.step import StepPlan, plan_step, price, step_config


def expected_tokens_per_step(rate: float, k: int) -> float:
    """Leviathan: committed tokens per step (bonus included) with i.i.d. acceptance `rate`."""
    if rate >= 1.0:
        return k + 1.0
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)


def leviathan_speedup(rate: float, k: int, cost_ratio: float) -> float:
    """Speedup when verifying k+1 tokens costs one target decode; cost_ratio = T_draft / T_target."""
    return expected_tokens_per_step(rate, k) / (k * cost_ratio + 1.0)


def magicdec_speedup(tokens_per_step: float, k: int, draft_to_target: float, verify_to_target: float) -> float:
    """Speedup with the verification's own cost: E[tokens] / (k T_d / T_t + T_v / T_t)."""
    return tokens_per_step / (k * draft_to_target + verify_to_target)


@dataclass(frozen=True)
class SteadyState:
    target_step_s: float       # one autoregressive step: target forward of one token + host overhead
    draft_step_s: float        # all draft work of one speculative step (k forwards, or host lookup, and
                               # the engine's speculative host work)
    verify_step_s: float       # the target forward verifying k+1 tokens + host overhead
    tokens_per_step: float
    k: int

    @property
    def speedup(self) -> float:
        per_draft = self.draft_step_s / self.k
        return magicdec_speedup(self.tokens_per_step, self.k, per_draft / self.target_step_s,
                                self.verify_step_s / self.target_step_s)


def steady_state(scenario: Scenario | dict | str, context_tokens: int, tokens_per_step: float) -> SteadyState:
    """Price one request's AR and SD steps at `context_tokens` with the scenario's cost model,
    through the simulator's own step planner and pricer (sim/step.py: plan_step, price): the
    baseline's decode step; the speculative step's drafting (its draft forwards or host lookup,
    and the engine's speculative host work), a drafter with its own KV first catching up on the
    `tokens_per_step` the last step committed; its verification of k + 1 tokens.

    Chains only (a tree's draft forwards carry `width` tokens; the closed forms assume one).
    """
    scenario = load_scenario(scenario)
    spec = scenario.speculation
    if spec.tree is not None or spec.partial_verify is not None:
        raise ValueError("steady_state covers chain speculation with full verification")
    baseline = scenario.with_method_none()
    k = spec.num_speculative_tokens
    target_plan, base_cost = _one_request_step(baseline, context_tokens, 0, None)
    # A drafter with its own KV catches up on what a step commits: k + 1 positions, tokens_per_step of them kept.
    plan, cost = _one_request_step(scenario, context_tokens, k, (k + 1, tokens_per_step))
    *drafting, verification = plan
    shares = [0.0] * len(PHASES)
    return SteadyState(target_step_s=price(target_plan, base_cost, shares),
                       draft_step_s=price(drafting[1:], cost, shares),
                       verify_step_s=price([plan[0], verification], cost, shares),
                       tokens_per_step=tokens_per_step, k=k)


def _one_request_step(scenario: Scenario, context_tokens: int, k: int, catch_up) -> tuple[StepPlan, CostModel]:
    """The plan of a step drafting k for one request at `context_tokens` (k = 0: a plain decode
    step), and the cost model that prices it."""
    stacks = build_stacks(scenario)
    memory = plan_memory(scenario, stacks, context_tokens + scenario.speculation.verify_tokens, 1)
    cost = cost_model_for(scenario)
    config = step_config(scenario, stacks, memory, cost, speculative=k > 0)
    slots = DecodeSlots(1)
    slots.hold([context_tokens])
    return plan_step(config, config.shape(k), slots, 1, catch_up=catch_up), cost
