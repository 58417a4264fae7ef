"""The requests a scenario serves: arrival times and prompt and output lengths, drawn once by seed.

Speculative and baseline runs replay the same Requests, so their ratio measures speculation only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import ScenarioError
from sim.scenario import LengthDist, Scenario


@dataclass(frozen=True)
class Requests:
    arrival_s: np.ndarray      # [N] float; closed-loop requests carry NaN (they arrive on completions)
    prompt_tokens: np.ndarray  # [N] int
    output_tokens: np.ndarray  # [N] int
    closed_concurrency: int | None

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def max_tokens(self) -> int:
        return int((self.prompt_tokens + self.output_tokens).max())


def sample_lengths(spec, count: int, rng: np.random.Generator) -> np.ndarray:
    """Token counts for `count` requests from an int, a list (cycled in order) or a distribution."""
    if isinstance(spec, int):
        return np.full(count, spec, dtype=np.int64)
    if isinstance(spec, list):
        return np.resize(np.asarray(spec, dtype=np.int64), count)
    assert isinstance(spec, LengthDist)
    if spec.dist == "lognormal":
        # Parameterised by the distribution's own mean and std, not the underlying normal's.
        variance = spec.std ** 2
        sigma2 = np.log1p(variance / spec.mean ** 2)
        values = rng.lognormal(np.log(spec.mean) - sigma2 / 2, np.sqrt(sigma2), count)
    elif spec.dist == "normal":
        values = rng.normal(spec.mean, spec.std, count)
    else:  # uniform with this mean and std: width = std * sqrt(12)
        half_width = spec.std * np.sqrt(3.0)
        values = rng.uniform(spec.mean - half_width, spec.mean + half_width, count)
    upper = spec.max if spec.max is not None else np.inf
    return np.clip(np.rint(values), spec.min, upper).astype(np.int64)


def build_requests(scenario: Scenario) -> Requests:
    """Draw the scenario's requests and check that each fits the model's context."""
    workload = scenario.workload
    rng = np.random.default_rng([scenario.seed, 1])  # a stream of its own: acceptance draws don't shift it
    if workload.arrival == "trace":
        arrival, prompt, output = read_trace(workload.trace)
        closed = None
    else:
        n = workload.requests
        prompt = sample_lengths(workload.prompt_tokens, n, rng)
        output = sample_lengths(workload.output_tokens, n, rng)
        if workload.arrival == "poisson":
            arrival = np.cumsum(rng.exponential(1.0 / workload.rate_qps, n))
            arrival -= arrival[0]
            closed = None
        else:
            arrival = np.full(n, np.nan)
            closed = min(workload.concurrency, n)
    requests = Requests(arrival.astype(float), prompt, output, closed)
    model = scenario.model_spec
    drafted = scenario.speculation.verify_tokens - 1     # drafts in flight at the last step
    need = prompt + output + drafted
    worst = int(np.argmax(need))
    if need[worst] > model.max_context:
        parts = f"prompt {int(prompt[worst])} + output {int(output[worst])}" + (f" + {drafted} drafted" if drafted else "")
        raise ScenarioError("workload.prompt_tokens",
                            f"request {worst} needs {int(need[worst])} tokens of context ({parts}), "
                            f"beyond {model.name}'s maximum {model.max_context}")
    return requests


def read_trace(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A request trace: CSV, Parquet or JSONL with arrival_s, prompt_tokens, output_tokens."""
    import pandas as pd

    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            frame = pd.read_parquet(path)
        elif suffix in (".jsonl", ".json"):
            frame = pd.read_json(path, lines=True)
        else:
            frame = pd.read_csv(path)
    except Exception as exc:  # pandas raises many types for unreadable files
        raise ScenarioError("workload.trace", f"cannot read {path}: {exc.__class__.__name__}") from None
    for column in ("arrival_s", "prompt_tokens", "output_tokens"):
        if column not in frame.columns:
            raise ScenarioError("workload.trace", f"{path} lacks column {column}")
    if frame.empty:
        raise ScenarioError("workload.trace", f"{path} has no rows")
    frame = frame.sort_values("arrival_s", kind="stable")
    prompt = frame["prompt_tokens"].to_numpy(np.int64)
    output = frame["output_tokens"].to_numpy(np.int64)
    if (prompt <= 0).any() or (output <= 0).any():
        raise ScenarioError("workload.trace", f"{path} has a non-positive token count")
    arrival = frame["arrival_s"].to_numpy(float)
    if np.isnan(arrival).any() or (arrival < 0).any():
        raise ScenarioError("workload.trace", f"{path} has a missing or negative arrival_s")
    return arrival, prompt, output
