"""Speculation policies: how many tokens the engine drafts at each iteration.

- static: every iteration drafts the scenario's k (the default; what engines ship).
- off_above_batch N: no drafting while more than N requests are in the running batch (decoding or
  prefilling), the scenario's k otherwise (vLLM's disable-by-batch-size knob).
- oracle: a bound, not a policy: each iteration proposes exactly what its verification will accept
  (Oracle Proposal), so no drafted token is wasted and no acceptable one is left undrafted.
- k_by_batch: k from a table of batch-size ranges (vLLM's num_speculative_tokens_per_batch_size),
  0 switching drafting off; what `sim recommend` writes.
- goodput: each iteration drafts the k in 0..K (0 only with allow_off) that maximizes the expected
  committed tokens per second of its decode step: E[tokens | k] / seconds(k), with E from the
  acceptance model's mean survival and seconds from the same cost model that prices the step
  (SmartSpec's goodput). The choice is kept per (decoding requests, the engine's state key: mean
  context and prompt tokens in the step, each within 9%), so a steady batch is priced K + 1 times,
  not every iteration.

The simulator's engine (sim/pipeline.py) and the live one (profiler/engine/serving.py) ask the same
policies the same question, `choose_k(running, decoding, price_s, state)`, each pricing the step
with the simulator's cost model (the live engine through sim/step_price.py); a live engine's
goodput learns its acceptance from the steps it runs (`LearnedGoodput.observe`).

Truncating a chain at k < K keeps the first k drafted tokens, so a step drafting k accepts
min(accepted at K, k) tokens: exact for every chain drafter whose proposal of k is the prefix of its
proposal of K (greedy draft models and heads, prompt lookup).
"""
from __future__ import annotations

from typing import Callable, Hashable, Sequence

import numpy as np

from sim.scenario.speculation import Speculation

MAX_BATCH = 1 << 16       # no engine runs more requests at once; k_by_batch's table stops there

# Seconds of the decoding requests' step at each k of ks, given [K + 1] committed tokens a step
# drafting k = 0..K is expected to make (a drafter with its own KV catches up on them).
PriceS = Callable[[range, np.ndarray], Sequence[float]]


class SpeculationPolicy:
    """Answers, before each step: how many tokens does each decoding request draft (0: none)?"""
    kind = "static"
    adaptive = False

    def __init__(self, max_k: int):
        self.max_k = max_k

    def choose_k(self, running: int, decoding: int, price_s: PriceS | None = None, state: Hashable = None) -> int:
        """running: requests in the batch (decoding or prefilling); decoding: those about to
        verify; price_s: the step's price (what goodput weighs; None where nothing asks);
        state: what else the price depends on, bucketed, so that a choice can be kept for it
        (None: choose afresh)."""
        return self.max_k

    def observe(self, steps: Sequence) -> None:
        """What one step did, per request (a live engine's StepRecords: mode, drafted,
        accept_flags); policies that do not learn ignore it."""


class OracleProposal(SpeculationPolicy):
    """A what-if bound, not an engine's policy: each step proposes exactly what will be accepted
    (the pipeline draws the step's outcome first; every row verifies its accepted drafts + 1, the
    chain's draft forwards run to the batch's longest). Nothing drafted is ever rejected."""
    kind = "oracle"
    adaptive = True


class OffAboveBatch(SpeculationPolicy):
    kind = "off_above_batch"
    adaptive = True

    def __init__(self, max_k: int, batch: int):
        super().__init__(max_k)
        self.batch = batch

    def choose_k(self, running, decoding, price_s=None, state=None):
        return 0 if running > self.batch else self.max_k


class KByBatch(SpeculationPolicy):
    kind = "k_by_batch"
    adaptive = True

    def __init__(self, max_k: int, ranges: list[list[int]]):
        super().__init__(max_k)
        # k for every batch size up to the last range's end (at most MAX_BATCH); past it, the last k.
        self.k_at = [0] + [k for first, last, k in ranges for _ in range(first, min(last, MAX_BATCH) + 1)]

    def choose_k(self, running, decoding, price_s=None, state=None):
        return self.k_at[min(running, len(self.k_at) - 1)]


class GoodputPolicy(SpeculationPolicy):
    """The k maximizing expected committed tokens over the step's seconds; survival: [K] mean
    P(accepted >= j), j = 1..K."""
    kind = "goodput"
    adaptive = True

    def __init__(self, max_k: int, survival: np.ndarray, allow_off: bool = True):
        super().__init__(max_k)
        self.expected_tokens = expected_tokens(survival, max_k)
        self.candidates = range(0 if allow_off else 1, max_k + 1)
        self.chosen: dict[tuple, int] = {}

    def choose_k(self, running, decoding, price_s=None, state=None):
        key = (decoding, state)
        k = self.chosen.get(key) if state is not None else None
        if k is None:
            seconds = np.asarray(price_s(self.candidates, self.expected_tokens))
            k = self.candidates.start + int(np.argmax(self.expected_tokens[self.candidates.start:] / seconds))
            if state is not None:
                self.chosen[key] = k
        return k


# LearnedGoodput's prior of each position's conditional acceptance: 0.9 as if seen once. Optimistic,
# so that goodput drafts a position before it has evidence against it.
PRIOR_RATE = 0.9
PRIOR_STEPS = 1.0


class LearnedGoodput(GoodputPolicy):
    """Goodput with the acceptance it has seen so far (a live engine's): per draft position, the
    share of steps that reached it and accepted it, from an optimistic prior, so that positions a
    short k never reaches are still tried."""

    def __init__(self, max_k: int, allow_off: bool = True):
        self.reached = np.full(max_k, PRIOR_STEPS)
        self.accepted = np.full(max_k, PRIOR_RATE * PRIOR_STEPS)
        super().__init__(max_k, self.survival(), allow_off)

    def survival(self) -> np.ndarray:
        """[K] P(accepted >= j), j = 1..K, from each position's conditional acceptance so far."""
        return np.cumprod(self.accepted / self.reached)

    def observe(self, steps):
        for r in steps:
            if r.mode == "decode":
                continue
            # Position j counts only if the drafts before it were accepted: a conditional rate.
            for j in range(min(r.drafted, len(r.accept_flags))):
                self.reached[j] += 1
                if not r.accept_flags[j]:
                    break
                self.accepted[j] += 1
        self.expected_tokens = expected_tokens(self.survival(), self.max_k)


def expected_tokens(survival: np.ndarray, max_k: int) -> np.ndarray:
    """[max_k + 1] committed tokens of a step drafting k = 0..max_k (accepted drafts + 1), from the
    mean survival P(accepted >= j), j = 1..max_k."""
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.asarray(survival, dtype=float)[:max_k])])


def build_policy(spec: Speculation, survival: Callable[[], np.ndarray] | None) -> SpeculationPolicy:
    """The scenario's policy; survival() gives the acceptance model's mean P(accepted >= j),
    j = 1..K (asked only by goodput)."""
    policy = spec.policy
    k = spec.num_speculative_tokens if spec.tree is None else spec.draft_depth
    if policy.off_above_batch is not None:
        return OffAboveBatch(k, policy.off_above_batch)
    if policy.k_by_batch is not None:
        return KByBatch(k, policy.k_by_batch)
    if policy.goodput is not None:
        return GoodputPolicy(k, survival(), policy.goodput.allow_off)
    if policy.oracle:
        return OracleProposal(k)
    return SpeculationPolicy(k)
