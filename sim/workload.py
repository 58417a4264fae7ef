"""The requests a scenario serves: arrival times and prompt and output lengths, drawn once by seed.

Speculative and baseline runs replay the same Requests, so their ratio measures speculation only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import InputError
from sim.scenario.schema import LengthDist, Scenario
from sim.traces import numeric_column, read_table


@dataclass(frozen=True)
class Requests:
    arrival_s: np.ndarray      # [N] float; closed-loop requests carry NaN (they arrive on completions)
    prompt_tokens: np.ndarray  # [N] int
    output_tokens: np.ndarray  # [N] int
    closed_concurrency: int | None
    # Each request's category (an index into category_names), where the workload has categories.
    category: np.ndarray | None = None
    category_names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def max_tokens(self) -> int:
        return int((self.prompt_tokens + self.output_tokens).max())


def mean_length(spec) -> float:
    """The typical token count of an int, a list or a distribution (its mean before clipping)."""
    if isinstance(spec, int):
        return float(spec)
    if isinstance(spec, list):
        return sum(spec) / len(spec)
    return spec.mean


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
    # Clip in floating point first: a huge mean must not wrap around in the integer cast.
    upper = spec.max if spec.max is not None else float(np.iinfo(np.int32).max)
    return np.clip(np.rint(values), spec.min, upper).astype(np.int64)


def build_requests(scenario: Scenario) -> Requests:
    """Draw the scenario's requests and check that each fits the model's context."""
    workload = scenario.workload
    rng = np.random.default_rng([scenario.seed, 1])  # a stream of its own: acceptance draws don't shift it
    if workload.arrival == "trace" and workload.arrival_s is not None:
        arrival = np.asarray(workload.arrival_s, dtype=float)
        prompt = sample_lengths(workload.prompt_tokens, len(arrival), rng)
        output = sample_lengths(workload.output_tokens, len(arrival), rng)
        closed = None
    elif workload.arrival == "trace":
        arrival, prompt, output, labels = read_trace(workload.trace)
        closed = None
    else:
        n = workload.requests
        prompt = sample_lengths(workload.prompt_tokens, n, rng)
        output = sample_lengths(workload.output_tokens, n, rng)
        if workload.arrival == "poisson":
            arrival = np.cumsum(rng.exponential(1.0 / workload.rate_qps, n))
            arrival -= arrival[0]
            if not np.isfinite(arrival).all():
                raise InputError("workload.rate_qps", f"{workload.rate_qps!r} is too small: arrival times overflow")
            closed = None
        else:
            arrival = np.full(n, np.nan)
            closed = min(workload.concurrency, n)
    if workload.arrival != "trace" or workload.trace is None:
        labels = draw_categories(workload.categories, len(prompt), np.random.default_rng([scenario.seed, 5]))
    category, names = encode_categories(labels, scenario, tuple(workload.categories or ()))
    requests = Requests(arrival.astype(float), prompt, output, closed, category, names)
    model = scenario.model_spec
    drafted = scenario.speculation.verify_tokens - 1     # drafts in flight at the last step
    need = prompt + output + drafted
    worst = int(np.argmax(need))
    if need[worst] > model.max_context:
        parts = f"prompt {int(prompt[worst])} + output {int(output[worst])}" + (f" + {drafted} drafted" if drafted else "")
        field = "workload.output_tokens" if output[worst] > prompt[worst] else "workload.prompt_tokens"
        raise InputError(field,
                            f"request {worst} needs {int(need[worst])} tokens of context ({parts}), "
                            f"beyond {model.name}'s maximum {model.max_context}")
    return requests


def draw_categories(weights: dict[str, float] | None, count: int, rng: np.random.Generator) -> np.ndarray | None:
    """Each request's category, drawn with the weights (normalized), or None without categories."""
    if not weights:
        return None
    names = list(weights)
    p = np.array([weights[name] for name in names], dtype=float)
    return np.asarray(names, dtype=object)[rng.choice(len(names), size=count, p=p / p.sum())]


def encode_categories(labels: np.ndarray | None, scenario: Scenario,
                      declared: tuple[str, ...] = ()) -> tuple[np.ndarray | None, tuple[str, ...]]:
    """Category labels as indices into the sorted names (the labels' and the declared weights',
    which a small draw may leave without a request); a route's categories must be among them."""
    route = scenario.speculation.policy.route
    if labels is None:
        if route is not None:
            raise InputError("workload.trace", "has no category column, which speculation.policy.route needs")
        return None, ()
    names = np.array(sorted(set(labels.astype(str)) | set(declared)))
    index = np.searchsorted(names, labels.astype(str))
    missing = sorted(set(route or ()) - set(names))
    if missing:
        raise InputError("speculation.policy.route", f"category {missing[0]!r} has no request in the workload "
                                                     f"(categories: {', '.join(names)})")
    return index.astype(np.int64), tuple(str(n) for n in names)


def read_trace(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """A request trace: CSV, Parquet or JSONL with arrival_s, prompt_tokens, output_tokens, and
    optionally category."""
    field = "workload.trace"
    frame = read_table(path, field)
    if frame.empty:
        raise InputError(field, f"{path} has no rows")
    arrival = numeric_column(frame, "arrival_s", path, field, integer=False, minimum=0)
    prompt = numeric_column(frame, "prompt_tokens", path, field, integer=True, minimum=1)
    output = numeric_column(frame, "output_tokens", path, field, integer=True, minimum=1)
    order = np.argsort(arrival, kind="stable")
    labels = None
    if "category" in frame.columns:
        labels = frame["category"].to_numpy()
        if frame["category"].isna().any():
            raise InputError(field, f"{path}: column category has an empty value")
        labels = labels[order]
    return arrival[order], prompt[order], output[order], labels
