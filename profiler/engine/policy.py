"""Speculation policies of the live engine: how many tokens each step drafts (0: a plain decode
step), as the simulator's `speculation.policy` describes them (sim/policy.py).

- OffAboveBatch: no drafting while more than N requests are in the running batch (decoding or
  prefilling), k otherwise (vLLM's disable-by-batch-size).
- Goodput: each step drafts the k in 0..K that maximizes expected committed tokens per second,
  the seconds priced by the simulator's cost model (a calibration bundle of this machine,
  sim.step_price) and the expectation from the acceptance the engine has seen so far: per draft
  position, the share of steps that reached it and accepted it, starting from an optimistic prior
  so that positions a short k never reaches are still tried.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from profiler.engine.speculative import StepRecord
from sim.policy import expected_tokens

# Prior of each position's conditional acceptance: 0.9 as if seen once. Optimistic, so that goodput
# drafts a position before it has evidence against it.
PRIOR_RATE = 0.9
PRIOR_STEPS = 1.0


class StepPolicy:
    """Chooses each step's drafts per request; sees every step's records."""

    def __init__(self, max_k: int):
        self.max_k = max_k

    def choose_k(self, contexts: Sequence[int], running: int) -> int:
        """contexts: the decoding requests' tokens in the cache; running: requests in the batch
        (decoding or prefilling)."""
        return self.max_k

    def observe(self, records: list[StepRecord]) -> None:
        pass


class OffAboveBatch(StepPolicy):
    def __init__(self, max_k: int, batch: int):
        super().__init__(max_k)
        self.batch = batch

    def choose_k(self, contexts, running):
        return 0 if running > self.batch else self.max_k


class Goodput(StepPolicy):
    def __init__(self, max_k: int, pricer, allow_off: bool = True):
        super().__init__(max_k)
        self.pricer = pricer                     # sim.step_price.DecodeStepPricer
        self.first = 0 if allow_off else 1
        self.reached = np.full(max_k, PRIOR_STEPS)
        self.accepted = np.full(max_k, PRIOR_RATE * PRIOR_STEPS)

    def survival(self) -> np.ndarray:
        """[K] P(accepted >= j), j = 1..K, from each position's conditional acceptance so far."""
        return np.cumprod(self.accepted / self.reached)

    def choose_k(self, contexts, running):
        survival = self.survival()
        seconds = self.pricer.seconds(contexts, survival)
        rate = expected_tokens(survival, self.max_k)[self.first:] / seconds[self.first:]
        return self.first + int(np.argmax(rate))

    def observe(self, records):
        for r in records:
            if r.mode == "decode":
                continue
            # Position j counts only if the drafts before it were accepted: a conditional rate.
            for j in range(min(r.drafted, len(r.accept_flags))):
                self.reached[j] += 1
                if not r.accept_flags[j]:
                    break
                self.accepted[j] += 1
