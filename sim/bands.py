"""How far to trust a predicted speedup: the measured error of the validated cases nearest in regime.

A GPU point takes the held half of the published catalogue (validation/published/errors.csv: the
cases nothing was tuned on); a CPU point takes the CPU live campaign (validation/cpu-default,
fitted acceptance, the full prediction a user gets). Only cases of the scenario's hardware class
(CPU, datacenter GPU, GeForce card) count, and they are compared by regime: the model's kind (dense
or a mixture of experts), method family (draft heads, draft model, n-gram, the target drafting for
itself), engine, batch and context. The band is the median |error| of the up to five nearest cases
within reach, times the predicted speedup, when at least three of them are of the scenario's own
kind (and then of those alone). With fewer, the scenario lies outside what the catalogue measured
of its kind: the band widens to the held-out P90 of its kind's cases in its hardware class (of all
the class's cases where its kind has fewer than three), or to the nearest cases' median where
that is wider, and says so. Without any case of its hardware class there is no band.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sim.formats.provenance import REPO_ROOT, read_results_csv
from sim.scenario.presets.models import MODELS
from sim.workload import mean_length

PUBLISHED = REPO_ROOT / "validation/published/errors.csv"
CPU_LIVE = REPO_ROOT / "validation/cpu-default/validation.csv"
FAMILIES = {"eagle": "head", "eagle3": "head", "mtp": "head", "medusa": "head", "draft_model": "draft model",
            "ngram": "n-gram", "streaming": "self", "layerskip": "self", "shadow": "self"}
NEAREST = 5
REACH = 1.5          # farthest regime distance a case may be and still count
MIN_CASES = 3        # cases of the scenario's own kind a median band needs; fewer widen it
WIDE_PERCENTILE = 90


@dataclass(frozen=True)
class Reference:
    case: str
    hardware_class: str
    family: str
    moe: bool                # the model is a mixture of experts
    engine: str
    batch: float
    context: float
    abs_error: float


@dataclass(frozen=True)
class Band:
    relative: float          # median |error| of the nearest cases, or the P90 it was widened to
    half_width: float        # in speedup units, at the predicted speedup
    cases: tuple[str, ...]   # the cases the median is of (widened: the nearest within reach, if any)
    basis: str               # which table they come from
    widened: str | None = None   # why and to what the band was widened, or None

    def describe(self) -> str:
        if self.widened is not None:
            return f"within about ±{self.half_width:.2f} ({self.widened})"
        return (f"within about ±{self.half_width:.2f} (median |error| {self.relative:.0%} on {len(self.cases)} "
                f"comparable {self.basis})")


def hardware_class(name: str) -> str:
    if name == "cpu":
        return "cpu"
    return "geforce" if name.startswith("rtx") else "datacenter"


def is_moe(model: str) -> bool:
    """Whether a model preset is a mixture of experts (a name that is no preset counts as dense)."""
    spec = MODELS.get(model)
    return spec is not None and spec.experts is not None


def kind_name(moe: bool) -> str:
    return "mixture-of-experts" if moe else "dense"


def distance(a: Reference, family: str, moe: bool, engine: str, batch: float, context: float) -> float:
    """0 for the same regime; another method family or model kind counts 1 each, another engine
    1/2, a factor of 4 in batch or context 1."""
    return ((a.family != family) + (a.moe != moe) + (a.engine != engine) / 2
            + abs(math.log2(max(a.batch, 1) / max(batch, 1))) / 2
            + abs(math.log2(max(a.context, 1) / max(context, 1))) / 2)


@lru_cache(maxsize=1)
def references() -> tuple[Reference, ...]:
    """Every validated case with a scored speedup error, from the committed tables (none when the
    tables are not there, e.g. an installed copy without the repository)."""
    def published() -> list[Reference]:
        frame = read_results_csv(PUBLISHED)
        return [Reference(r.case, hardware_class(r.hardware), FAMILIES[r.method], is_moe(r.model), r.engine,
                          float(r.batch) if r.batch == r.batch else 16.0,
                          float(r.prompt_tokens) if r.prompt_tokens == r.prompt_tokens else 256.0, abs(float(r.error)))
                for r in frame[(frame.half == "held") & (frame.role == "predicted")].itertuples()]

    def cpu_live() -> list[Reference]:
        frame = read_results_csv(CPU_LIVE)
        fitted = frame[(frame.prediction == "fitted") & frame.speedup_error.notna()]
        # The live engine serves a dense model (SmolLM2-135M).
        return [Reference(r.run, "cpu", FAMILIES.get(r.method, "self"), False, "live", float(r.batch),
                          float(r.context), abs(float(r.speedup_error))) for r in fitted.itertuples()]

    refs = []
    for path, read in ((PUBLISHED, published), (CPU_LIVE, cpu_live)):
        try:
            refs += read() if path.exists() else []
        except (OSError, ValueError, KeyError, AttributeError):
            pass        # a table this version cannot read gives no band, never a failed simulation
    return tuple(refs)


def speedup_band(scenario, speedup: float) -> Band | None:
    """The band of a predicted speedup for this scenario (the module docstring), or None without
    speculation or without any validated case of its hardware class."""
    spec = scenario.speculation
    if not spec.enabled or not math.isfinite(speedup):
        return None
    hardware = hardware_class(scenario.hardware_spec.name)
    pool = [r for r in references() if r.hardware_class == hardware]
    if not pool:
        return None
    family = FAMILIES[spec.method]
    moe = scenario.model_spec.experts is not None
    # The CPU live runs are the project's own engine, whatever preset prices the scenario.
    engine = "live" if hardware == "cpu" else scenario.engine_spec.name
    work = scenario.workload
    batch = float(min(work.concurrency or 16, scenario.scheduler.max_batch)) if work.arrival == "closed" else 16.0
    context = mean_length(work.prompt_tokens)
    near = sorted(((distance(r, family, moe, engine, batch, context), r) for r in pool), key=lambda t: (t[0], t[1].case))
    near = [r for d, r in near if d <= REACH][:NEAREST]
    own = [r for r in near if r.moe == moe]
    basis = "CPU live runs" if hardware == "cpu" else "held-out published cases"
    if len(own) >= MIN_CASES:
        relative = float(np.median([r.abs_error for r in own]))
        return Band(relative, relative * speedup, tuple(r.case for r in own), basis)
    kind = [r for r in pool if r.moe == moe]
    floor = kind if len(kind) >= MIN_CASES else pool
    wide = float(np.percentile([r.abs_error for r in floor], WIDE_PERCENTILE))
    nearest = float(np.median([r.abs_error for r in near])) if near else 0.0
    relative = max(wide, nearest)
    of = f"{kind_name(moe)} " if floor is kind else ""
    source = "CPU live run" if hardware == "cpu" else "held-out case"
    what = (f"P{WIDE_PERCENTILE} |error| {wide:.0%} of the {len(floor)} {of}{source}s of its hardware class"
            if relative == wide else f"median |error| {nearest:.0%} of the {len(near)} nearest cases")
    return Band(relative, relative * speedup, tuple(r.case for r in near), basis,
                widened=f"{what}; {len(own)} comparable {kind_name(moe)} case{'s' if len(own) != 1 else ''} "
                        f"within reach, {MIN_CASES} needed")
