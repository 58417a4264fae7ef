"""Acceptance models: how many drafted tokens each verification keeps.

Every model answers one vectorized question: for these running requests (global ids, steps taken so
far, current context), how many drafts does this step accept (0 .. depth)? The committed tokens are
that plus one (the target's bonus or corrected token). Forms:

- constant tokens_per_step: deterministic; after s steps a request has committed round(s x tps)
  tokens, so the mean is reproduced to within half a token per request.
- rate: i.i.d. per-token acceptance a, truncated geometric: P(accepted >= j) = a^j.
- per_position: conditional rates r_1..r_depth: P(accepted >= j) = r_1 ... r_j.
- request_spread: each request draws its own rate from a Beta with the given mean and std.
- context_slope: the rate moves by this much per doubling of context beyond 1,024 tokens.
- trace: replay per-step accepted counts from a file, one recorded request per simulated request.
- draft_share: a request's step drafts with this probability (an n-gram drafter proposes only where
  its history matches); a step without a draft verifies and commits one token.

For a tree, "position" means depth: the rate that the accepted path extends one level deeper.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.errors import InputError
from sim.scenario.schema import Scenario
from sim.scenario.speculation import Acceptance
from sim.traces import numeric_column, read_table

CONTEXT_REFERENCE_TOKENS = 1024
MAX_RATE = 0.999


class AcceptanceModel:
    depth: int
    # What draw() reads; the engine passes None for the rest (each slice it skips is time saved).
    uses_rids = True
    uses_steps = False
    uses_context = False

    def draw(self, n: int, rids: np.ndarray | None, steps: np.ndarray | None,
             context: np.ndarray | None) -> tuple[np.ndarray, int]:
        """Tokens committed by one verification step for n requests (accepted drafts + 1): an int
        array [n] in [1, depth + 1] that is never written again, and its sum. rids, steps, context:
        the requests' global ids, verification steps so far and current context, each [n]."""
        raise NotImplementedError

    def survival(self) -> np.ndarray:
        """[depth] mean P(accepted >= j), j = 1..depth, over requests and steps: what a goodput
        policy expects of a step before drawing it."""
        raise NotImplementedError

    # A replayed live run whose recorded steps that drafted nothing were plain decode steps (a live
    # policy's): priced as such, and not counted among the verification steps.
    plain_steps = False

    @property
    def verify_tokens(self):
        """(rids, steps) -> [n] tokens each request verifies at its step (its proposal + 1), where
        drafters propose fewer than the full depth at some steps; None when every step verifies the
        full proposal."""
        return None

    @property
    def rolled_back(self):
        """(rids, steps) -> [n] tokens a SpecPV rectify rolled back at the request's step (a replayed
        live run's own); None to draw them from the disagreement model."""
        return None


class ConstantAcceptance(AcceptanceModel):
    uses_rids = False
    uses_steps = True

    def __init__(self, tokens_per_step: float, depth: int):
        self.depth = depth
        self.accepted_per_step = tokens_per_step - 1.0

    def draw(self, n, rids, steps, context):
        # After s steps a request has accepted round(s * m) drafts: never more than half a token
        # from the exact mean, and never more than ceil(m) <= depth in one step.
        m = self.accepted_per_step
        tokens = (np.floor((steps + 1) * m + 0.5) - np.floor(steps * m + 0.5)).astype(np.int64) + 1
        return tokens, int(tokens.sum())

    def survival(self):
        # Accepted drafts m per step on average, as whole tokens first: position j is kept
        # entirely below m, for the fraction left at ceil(m).
        return np.clip(self.accepted_per_step - np.arange(self.depth), 0.0, 1.0)


class GeometricAcceptance(AcceptanceModel):
    """i.i.d. acceptance with one rate for all: draws come from a pre-drawn pool (the hot path)."""
    uses_rids = False
    POOL = 16384

    def __init__(self, rate: float, depth: int, rng: np.random.Generator):
        self.depth = depth
        self.rate = rate
        self.rng = rng
        self._pool = np.empty(0, dtype=np.int64)
        self._cumsum = np.zeros(1, dtype=np.int64)
        self._next = 0

    def _refill(self, need: int) -> None:
        u = 1.0 - self.rng.random(max(self.POOL, need))   # (0, 1]
        # Committed tokens = 1 + accepted drafts with P(accepted >= j) = rate^j, truncated at depth:
        # inverse transform of the geometric law (about 10 ns a draw; numpy's geometric takes 30).
        if self.rate <= 0.0:
            pool = np.ones(len(u), dtype=np.int64)
        else:
            pool = np.minimum(np.floor(np.log(u) / np.log(self.rate)), self.depth).astype(np.int64) + 1
        self._pool = np.concatenate([self._pool[self._next:], pool])
        # Running sums make a draw's total one subtraction instead of a reduction.
        self._cumsum = np.concatenate([[0], np.cumsum(self._pool)])
        self._next = 0

    def draw(self, n, rids, steps, context):
        if self._next + n > len(self._pool):
            self._refill(n)
        start = self._next
        self._next = start + n
        return self._pool[start:start + n], int(self._cumsum[start + n] - self._cumsum[start])

    def survival(self):
        return self.rate ** np.arange(1, self.depth + 1)


class SurvivalAcceptance(AcceptanceModel):
    """Per-position rates with per-request spread and context dependence (the general form)."""

    def __init__(self, rates: list[float], depth: int, request_spread: float, context_slope: float,
                 requests: int, rng: np.random.Generator):
        self.depth = depth
        self.uses_context = bool(context_slope)
        self.rates = np.asarray(rates[:depth], dtype=float)
        self.context_slope = context_slope
        self.rng = rng
        mean = float(self.rates.mean())
        if request_spread > 1e-6:   # below that the Beta is a point mass (and overflows)
            # Beta with the rates' mean and the given std; each request shifts every position by it.
            nu = mean * (1 - mean) / request_spread ** 2 - 1
            per_request = rng.beta(mean * nu, (1 - mean) * nu, requests)
            self.shift = per_request - mean
        else:
            self.shift = np.zeros(requests)

    def rates_for(self, rids: np.ndarray, context: np.ndarray) -> np.ndarray:
        """[n, depth] conditional acceptance rates for these requests at their current context."""
        shift = self.shift[rids]
        if self.context_slope:
            doublings = np.log2(np.maximum(context, CONTEXT_REFERENCE_TOKENS) / CONTEXT_REFERENCE_TOKENS)
            shift = shift + self.context_slope * doublings
        return np.clip(self.rates[None, :] + shift[:, None], 0.0, MAX_RATE)

    def draw(self, n, rids, steps, context):
        survival = np.cumprod(self.rates_for(rids, context), axis=1)   # P(accepted >= j), j = 1..depth
        u = self.rng.random(n)
        tokens = (survival > u[:, None]).sum(axis=1) + 1
        return tokens, int(tokens.sum())

    def survival(self):
        # Every request's own curve at the reference context, averaged.
        rates = np.clip(self.rates[None, :] + self.shift[:, None], 0.0, MAX_RATE)
        return np.cumprod(rates, axis=1).mean(axis=0)


class TraceAcceptance(AcceptanceModel):
    """Replays recorded accepted counts; simulated request i follows recorded request perm[i]."""

    uses_steps = True

    def __init__(self, path: Path, depth: int, requests: int, rng: np.random.Generator):
        self.depth = depth
        sequences = read_acceptance_trace(path)
        lengths = np.array([len(s) for s in sequences])
        self.offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self.lengths = lengths
        self.flat = np.minimum(np.concatenate(sequences), depth) + 1
        self.assigned = rng.permutation(np.resize(np.arange(len(sequences)), requests))

    def draw(self, n, rids, steps, context):
        trace = self.assigned[rids]
        tokens = self.flat[self.offsets[trace] + steps % self.lengths[trace]]
        return tokens, int(tokens.sum())

    def survival(self):
        return recorded_survival(self.flat, self.depth)


class ReplayAcceptance(AcceptanceModel):
    """Replays one live run exactly: simulated request i takes recorded request i's accepted
    counts step by step (cyclically, should it need more steps than were recorded), and with
    SpecPV rectify its roll-backs at the same steps. What `sim validate` uses to measure the cost
    model's error alone."""

    uses_steps = True

    def __init__(self, accepted: list[np.ndarray], depth: int, rolled_back: list[np.ndarray] | None = None,
                 drafted: list[np.ndarray] | None = None, plain_steps: bool = False):
        # plain_steps: a recorded step that drafted nothing was a plain decode step (a live
        # policy's), priced as one and not counted among the verification steps.
        self.plain_steps = plain_steps
        self.depth = depth
        lengths = np.array([max(len(a), 1) for a in accepted])
        self.offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self.lengths = lengths
        pad = lambda rows: np.concatenate([np.asarray(r, dtype=np.int64) if len(r) else np.zeros(1, np.int64)
                                           for r in rows])
        self.flat = np.minimum(pad(accepted), depth) + 1
        self._rolled_back = pad(rolled_back) if rolled_back is not None else None
        self._verify_tokens = np.minimum(pad(drafted), depth) + 1 if drafted is not None else None

    def _index(self, rids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        return self.offsets[rids] + steps % self.lengths[rids]

    def draw(self, n, rids, steps, context):
        tokens = self.flat[self._index(rids, steps)]
        return tokens, int(tokens.sum())

    def survival(self):
        proposed = None if self._verify_tokens is None else self._verify_tokens - 1
        return recorded_survival(self.flat, self.depth, proposed)

    @property
    def verify_tokens(self):
        """(rids, step indices) -> tokens each request verifies (its proposal + 1), or None when the
        drafter always proposed the full depth."""
        if self._verify_tokens is None:
            return None
        return lambda rids, steps: self._verify_tokens[self._index(rids, steps)]

    @property
    def rolled_back(self):
        """(rids, step indices) -> recorded roll-backs, or None when the run recorded none."""
        if self._rolled_back is None:
            return None
        return lambda rids, steps: self._rolled_back[self._index(rids, steps)]


class DraftShareAcceptance(AcceptanceModel):
    """Another model's draws at the steps where a request drafts, one token at the others. Whether
    request r drafts at its step s is a fixed hash of (seed, r, s), so the pricing of a step (which
    asks `verify_tokens` first) and its draw agree."""

    uses_steps = True

    def __init__(self, inner: AcceptanceModel, share: float, seed: int):
        self.inner = inner
        self.depth = inner.depth
        self.share = share
        self.seed = np.uint64(seed)
        self.uses_context = inner.uses_context

    def drafts(self, rids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """[n] bool: these requests' steps that propose drafts (a SplitMix64 hash to a uniform)."""
        with np.errstate(over="ignore"):
            x = (rids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + steps.astype(np.uint64)
                 * np.uint64(0xD1B54A32D192ED03) + self.seed)
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
        return (x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < self.share

    def draw(self, n, rids, steps, context):
        drafted = self.drafts(rids, steps)
        tokens = np.ones(n, dtype=np.int64)
        if drafted.any():
            inner_rids = rids[drafted] if self.inner.uses_rids else None
            inner_context = context[drafted] if context is not None else None
            tokens[drafted] = self.inner.draw(int(drafted.sum()), inner_rids, steps[drafted], inner_context)[0]
        return tokens, int(tokens.sum())

    def survival(self):
        return self.share * self.inner.survival()

    @property
    def verify_tokens(self):
        """(rids, step indices) -> tokens each request verifies: depth + 1 where it drafts, else 1."""
        return lambda rids, steps: np.where(self.drafts(rids, steps), self.depth + 1, 1)


def recorded_survival(committed: np.ndarray, depth: int, proposed: np.ndarray | None = None) -> np.ndarray:
    """[depth] P(accepted >= j) of the recorded steps (committed: accepted + 1). With `proposed`
    (the drafts each step proposed, fewer than depth at some), position j is judged only on the
    steps that proposed it: survival is the product of those conditional rates."""
    accepted = committed - 1
    if proposed is None:
        return np.array([(accepted >= j).mean() for j in range(1, depth + 1)])
    rates = []
    for j in range(1, depth + 1):
        reached = (accepted >= j - 1) & (proposed >= j)
        rates.append((accepted[reached] >= j).mean() if reached.any() else (rates[-1] if rates else 0.0))
    return np.cumprod(rates)


def read_acceptance_trace(path: Path) -> list[np.ndarray]:
    """Per-request sequences of accepted drafts from CSV/Parquet/JSONL with an `accepted` column.

    An optional `request` column groups rows by request (in file order); steps.parquet from
    `profiler live` also has `mode`, and only its verification rows are kept.
    """
    field = "speculation.acceptance.trace"
    frame = read_table(path, field)
    if "mode" in frame.columns:
        frame = frame[frame["mode"].isin(["verify", "partial", "full"])]
    if frame.empty:
        raise InputError(field, f"{path} has no verification rows")
    accepted = numeric_column(frame, "accepted", path, field, integer=True, minimum=0)
    if "request" not in frame.columns:
        return [accepted]
    groups = frame.groupby("request", sort=False).indices.values()
    return [accepted[rows] for rows in groups]


def build_acceptance(scenario: Scenario, requests: int, rng: np.random.Generator) -> AcceptanceModel:
    spec = scenario.speculation
    return build_acceptance_model(spec.acceptance, spec.draft_depth, requests, rng)


def build_acceptance_model(a: Acceptance, depth: int, requests: int, rng: np.random.Generator) -> AcceptanceModel:
    """The model of one drafter's acceptance: its steps' draws, with its draft share."""
    model = base_acceptance(a, depth, requests, rng)
    if a.draft_share < 1.0:
        return DraftShareAcceptance(model, a.draft_share, int(rng.integers(2 ** 63)))
    return model


def base_acceptance(a: Acceptance, depth: int, requests: int, rng: np.random.Generator) -> AcceptanceModel:
    """The model of a drafting step's acceptance (draft_share aside)."""
    if a.tokens_per_step is not None:
        return ConstantAcceptance(a.tokens_per_step, depth)
    if a.trace is not None:
        return TraceAcceptance(a.trace, depth, requests, rng)
    if a.rate is not None and not a.request_spread and not a.context_slope:
        return GeometricAcceptance(a.rate, depth, rng)
    rates = a.per_position if a.per_position is not None else [a.rate] * depth
    return SurvivalAcceptance(rates, depth, a.request_spread, a.context_slope, requests, rng)
