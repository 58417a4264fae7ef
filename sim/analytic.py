"""Closed forms for single-request steady state, and their costs taken from the cost model.

Leviathan et al. (2023): with i.i.d. acceptance a, k drafts per step and draft/target cost ratio c,
    E[tokens per step] = (1 - a^(k+1)) / (1 - a),   speedup = E[tokens] / (k c + 1),
assuming a verification of k+1 tokens costs one target decode. MagicDec (Chen et al. 2024) drops
that premise and writes the speedup with measured ratios:
    speedup = E[tokens] / (k T_draft / T_target + T_verify(k) / T_target).
`steady_state` prices T_target, T_draft and T_verify for one request at one context with the
scenario's own cost model, so the SimPy model and the closed form share every cost term.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.cost.batch import DECODE, DRAFT, VERIFY, PHASES, Group, uniform_group
from sim.cost.memory import draft_offloaded_layers, plan_memory
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.scenario.load import load_scenario
from sim.scenario.schema import Scenario


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
    """Price one request's AR and SD steps at `context_tokens` with the scenario's cost model.

    Chains only (a tree's draft forwards carry `width` tokens; the closed forms assume one).
    """
    scenario = load_scenario(scenario)
    spec = scenario.speculation
    if spec.tree is not None or spec.partial_verify is not None:
        raise ValueError("steady_state covers chain speculation with full verification")
    shares = [0.0] * len(PHASES)
    stacks = build_stacks(scenario)
    base_stacks = build_stacks(scenario.with_method_none())
    tokens = context_tokens + spec.verify_tokens
    memory = plan_memory(scenario, stacks, tokens, 1)
    base_memory = plan_memory(scenario.with_method_none(), base_stacks, tokens, 1)
    cost = cost_model_for(scenario)

    target = cost.step_overhead(1, shares) + cost.forward(
        base_stacks.target, [uniform_group(DECODE, 1, 1, context_tokens)], shares,
        offloaded_layers=base_memory.offloaded_layers)
    k = spec.num_speculative_tokens
    V = k + 1                                  # a chain of k (a route or combine drafter aside)
    verify = cost.step_overhead(1, shares, V) + cost.forward(
        stacks.target, [uniform_group(VERIFY, 1, V, context_tokens + V - 1)], shares,
        offloaded_layers=memory.offloaded_layers)
    if stacks.draft is None:
        draft = cost.host_draft(1, shares, context_tokens)
    elif spec.method == "medusa":
        draft = cost.forward(stacks.draft, [uniform_group(DRAFT, 1, 1, context_tokens)], shares)
    else:
        # The first draft forward of a drafter with its own KV catches up on a step's commits.
        q_first = tokens_per_step if stacks.draft_owns_kv else 1
        first = Group(phase=DRAFT, requests=1, tokens=q_first, query_max=V, kv_tokens_sum=context_tokens,
                      logits_tokens=1)
        streamed = draft_offloaded_layers(scenario, memory)
        draft = cost.forward(stacks.draft, [first], shares, offloaded_layers=streamed)
        if k > 1:
            # Draft forward j reads j drafted tokens besides the context; j = 1 .. k-1 averages k/2.
            draft += cost.forward(stacks.draft, [uniform_group(DRAFT, 1, 1, context_tokens + k / 2)],
                                  shares, offloaded_layers=streamed, repeat=k - 1)
    # The engine's host work of a speculative step: its own and each draft forward's floor.
    forwards = 0 if stacks.draft is None else 1 if spec.method == "medusa" else k
    draft += cost.speculation_overhead(1, forwards, shares)
    return SteadyState(target, draft, verify, tokens_per_step, k)
