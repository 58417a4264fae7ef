"""What one decode step costs at each k: the simulator's own pricing of a batch, for an engine
that chooses k as it runs (`profiler live --policy goodput`).

A live engine's goodput policy and the simulated one must weigh k with the same prices, so this
module prices through the simulator's own step planner and pricer (sim/step.py: plan_step, price,
price_decode_steps), with the given requests' contexts in its decode slots, not through a second
copy of the pricing.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sim.cost.model import cost_model_for
from sim.cost.memory import plan_memory
from sim.cost.stack import build_stacks
from sim.scenario.load import load_scenario
from sim.scenario.schema import Scenario
from sim.slots import DecodeSlots
from sim.step import price_decode_steps, step_config


class DecodeStepPricer:
    """Seconds of a decode step of `contexts` (one per decoding request) drafting k = 0..K each.

    scenario: the engine's scenario with a goodput policy (its cost model, calibration bundle,
    drafter, K and scheduler); max_batch and max_context: the most requests and tokens a request
    the engine will price (the memory plan and the slots are sized for them).
    """

    def __init__(self, scenario: Scenario | dict, max_batch: int, max_context: int):
        scenario = load_scenario(scenario)
        if scenario.speculation.policy.goodput is None:
            raise ValueError("DecodeStepPricer prices a goodput policy's candidates")
        self.max_k = scenario.speculation.num_speculative_tokens
        stacks = build_stacks(scenario)
        memory = plan_memory(scenario, stacks, max_context + scenario.speculation.verify_tokens, max_batch)
        self.cost = cost_model_for(scenario)
        # An engine drafting k at every drafting step: no rows proposing fewer, no replayed plain steps.
        self.steps = step_config(scenario, stacks, memory, self.cost, speculative=True)
        rows = scenario.scheduler.max_batch
        self.slots = DecodeSlots(min(rows, memory.max_running or rows))

    def seconds(self, contexts: Sequence[int], ks: range, expected_tokens: np.ndarray) -> np.ndarray:
        """[len(ks)] seconds of the step at each k of ks; expected_tokens: [K + 1] what a step
        drafting k = 0..K is expected to commit (a drafter with its own KV catches up on it)."""
        self.slots.hold(contexts)
        return np.asarray(price_decode_steps(self.steps, self.cost, self.slots, len(contexts), ks, expected_tokens))
