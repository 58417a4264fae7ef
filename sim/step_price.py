"""What one decode step costs at each k: the simulator's own pricing of a batch, for an engine
that chooses k as it runs (`profiler live --policy goodput`).

A live engine's goodput policy and the simulated one must weigh k with the same prices, so this
module prices through the simulator's engine (PipelineSimulation.price_decode_steps) with the
given requests' contexts in its decode slots, not through a second copy of the pricing.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sim.acceptance import build_acceptance
from sim.cost.calibrated import cost_model_for
from sim.cost.memory import plan_memory
from sim.cost.stack import build_stacks
from sim.pipeline import PipelineSimulation
from sim.policy import expected_tokens
from sim.scenario.schema import Scenario, load_scenario
from sim.workload import Requests


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
        requests = Requests(arrival_s=np.full(max_batch, np.nan), prompt_tokens=np.full(max_batch, max_context),
                            output_tokens=np.ones(max_batch, dtype=np.int64), closed_concurrency=max_batch)
        stacks = build_stacks(scenario)
        memory = plan_memory(scenario, stacks, max_context + scenario.speculation.verify_tokens, max_batch)
        rng = np.random.default_rng([scenario.seed, 2])
        self.pipeline = PipelineSimulation(scenario, requests, cost_model_for(scenario), stacks, memory,
                                           build_acceptance(scenario, max_batch, rng), rng)

    def seconds(self, contexts: Sequence[int], survival: np.ndarray) -> np.ndarray:
        """[K + 1] seconds of the step at k = 0..K; survival: [K] P(accepted >= j) the engine
        expects (a drafter with its own KV catches up on what a step commits)."""
        p, s = self.pipeline, self.pipeline.slots
        n = len(contexts)
        s.n = n
        s.ctx[:n] = contexts
        s.last[:n] = 1
        s.steps[:n] = 0
        p.ctx_sum, p.last_sum = int(s.ctx[:n].sum()), n
        p.policy.expected_tokens = expected_tokens(survival, self.max_k)
        return np.asarray(p.price_decode_steps(range(self.max_k + 1)))
