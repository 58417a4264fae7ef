"""How far to trust a predicted speedup: the measured error of the validated cases nearest in regime.

A GPU point takes the held half of the published catalogue (validation/published/errors.csv: the
cases nothing was tuned on); a CPU point takes the CPU live campaign (validation/cpu-default,
fitted acceptance, the full prediction a user gets). Cases are compared by regime: hardware class
(CPU, datacenter GPU, GeForce card), method family (draft heads, draft model, n-gram, the target
drafting for itself), batch and context. The band is the median |error| of the up to five nearest
cases within reach, times the predicted speedup; where none is within reach, there is no band:
nothing comparable was measured.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from sim.formats.provenance import REPO_ROOT, read_results_csv
from sim.workload import mean_length

PUBLISHED = REPO_ROOT / "validation/published/errors.csv"
CPU_LIVE = REPO_ROOT / "validation/cpu-default/validation.csv"
FAMILIES = {"eagle": "head", "eagle3": "head", "mtp": "head", "medusa": "head", "draft_model": "draft model",
            "ngram": "n-gram", "streaming": "self", "layerskip": "self", "shadow": "self"}
NEAREST = 5
REACH = 1.5          # farthest regime distance a case may be and still count


@dataclass(frozen=True)
class Reference:
    case: str
    hardware_class: str
    family: str
    batch: float
    context: float
    abs_error: float


@dataclass(frozen=True)
class Band:
    relative: float          # median |error| of the nearest cases
    half_width: float        # in speedup units, at the predicted speedup
    cases: tuple[str, ...]
    basis: str               # which table they come from

    def describe(self) -> str:
        return (f"within about ±{self.half_width:.2f} (median |error| {self.relative:.0%} on {len(self.cases)} "
                f"comparable {self.basis})")


def hardware_class(name: str) -> str:
    if name == "cpu":
        return "cpu"
    return "geforce" if name.startswith("rtx") else "datacenter"


def distance(a: Reference, family: str, batch: float, context: float) -> float:
    """0 for the same regime; a different method family counts 1, a factor of 4 in batch or context 1."""
    return ((a.family != family) + abs(math.log2(max(a.batch, 1) / max(batch, 1))) / 2
            + abs(math.log2(max(a.context, 1) / max(context, 1))) / 2)


@lru_cache(maxsize=1)
def references() -> tuple[Reference, ...]:
    """Every validated case with a scored speedup error, from the committed tables (none when the
    tables are not there, e.g. an installed copy without the repository)."""
    def published() -> list[Reference]:
        frame = read_results_csv(PUBLISHED)
        return [Reference(r.case, hardware_class(r.hardware), FAMILIES[r.method],
                          float(r.batch) if r.batch == r.batch else 16.0,
                          float(r.prompt_tokens) if r.prompt_tokens == r.prompt_tokens else 256.0, abs(float(r.error)))
                for r in frame[(frame.half == "held") & (frame.role == "predicted")].itertuples()]

    def cpu_live() -> list[Reference]:
        frame = read_results_csv(CPU_LIVE)
        fitted = frame[(frame.prediction == "fitted") & frame.speedup_error.notna()]
        return [Reference(r.run, "cpu", FAMILIES.get(r.method, "self"), float(r.batch), float(r.context),
                          abs(float(r.speedup_error))) for r in fitted.itertuples()]

    refs = []
    for path, read in ((PUBLISHED, published), (CPU_LIVE, cpu_live)):
        try:
            refs += read() if path.exists() else []
        except (OSError, ValueError, KeyError, AttributeError):
            pass        # a table this version cannot read gives no band, never a failed simulation
    return tuple(refs)


def speedup_band(scenario, speedup: float) -> Band | None:
    """The band of a predicted speedup for this scenario, or None where no validated case is near."""
    spec = scenario.speculation
    if not spec.enabled or not math.isfinite(speedup):
        return None
    hardware = hardware_class(scenario.hardware_spec.name)
    family = FAMILIES[spec.method]
    work = scenario.workload
    batch = float(min(work.concurrency or 16, scenario.scheduler.max_batch)) if work.arrival == "closed" else 16.0
    context = mean_length(work.prompt_tokens)
    near = sorted(((distance(r, family, batch, context), r) for r in references()
                   if r.hardware_class == hardware), key=lambda t: (t[0], t[1].case))
    near = [r for d, r in near if d <= REACH][:NEAREST]
    if not near:
        return None
    errors = sorted(r.abs_error for r in near)
    mid = len(errors) // 2
    relative = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
    basis = "CPU live runs" if hardware == "cpu" else "held-out published cases"
    return Band(relative, relative * speedup, tuple(r.case for r in near), basis)
