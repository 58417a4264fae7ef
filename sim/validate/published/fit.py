"""The roofline's few settings that are not datasheet facts, searched on the catalogue's fit half.

`python -m sim validate --published --fit` runs this search and prints what it finds; the presets
(sim/scenario/presets: HardwareSpec.gemm_corner per hardware class, the engines' speculative host
times) hold its result. Only fit-half cases are simulated, so nothing here sees the held half.

The search is coordinate descent over a small grid per knob: each round tries every grid value of
one knob with the others held, keeps the best, and stops when a round changes nothing. Best means
the smallest mean |error| over the fit half's scored cases: every case counts (a median would not
move while one engine's few cases change), and the tables report median and P90 beside it.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from sim.scenario.presets import ENGINES, HARDWARE
from sim.validate.published.catalogue import Catalogue
from sim.validate.published.scenarios import Settings

MAX_ROUNDS = 4


@dataclass(frozen=True)
class Knob:
    name: str
    kind: str                   # "hardware" or "engine": which presets it sets
    presets: tuple[str, ...]    # every preset it sets to the same value
    field: str
    grid: tuple[float, ...]

    def current(self) -> float:
        """The preset's own value (a corner of None, the plain roofline, as infinity)."""
        table = HARDWARE if self.kind == "hardware" else ENGINES
        value = getattr(table[self.presets[0]], self.field)
        return math.inf if value is None else value

    def settings(self, value: float) -> Settings:
        return {(self.kind, preset, self.field): value for preset in self.presets}


def hardware_of_class(geforce: bool) -> tuple[str, ...]:
    """GPU presets of one class: GeForce cards, or datacenter parts (everything but the CPU)."""
    return tuple(name for name in HARDWARE if name != "cpu" and name.startswith("rtx") == geforce)


# A corner of 64 is the plain roofline's max within 1.1%.
CORNERS = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 64.0)
KNOBS = (
    Knob("GEMM corner, datacenter GPUs", "hardware", hardware_of_class(False), "gemm_corner", CORNERS),
    Knob("GEMM corner, GeForce cards", "hardware", hardware_of_class(True), "gemm_corner", CORNERS),
    Knob("SGLang speculative host time per request (s)", "engine", ("sglang",), "speculation_request_overhead_s",
         (0.0, 5e-6, 10e-6, 20e-6, 40e-6, 80e-6, 160e-6)),
    Knob("SGLang speculative host time per step (s)", "engine", ("sglang",), "speculation_step_overhead_s",
         (0.0, 0.25e-3, 0.5e-3, 1e-3, 2e-3)),
    Knob("Hugging Face eager launch time per decoder layer (s)", "engine", ("hf-eager",), "layer_overhead_s",
         (0.1e-3, 0.25e-3, 0.5e-3, 0.75e-3, 1e-3)),
    Knob("Hugging Face eager share of tensor-core peak", "engine", ("hf-eager",), "compute_efficiency",
         (0.5, 0.65, 0.8)),
    Knob("Hugging Face eager share of memory bandwidth", "engine", ("hf-eager",), "mem_efficiency", (0.6, 0.7, 0.8)),
    Knob("Hugging Face loops' host time per speculative step (s)", "engine", ("hf-eager",),
         "speculation_step_overhead_s", (0.0, 0.5e-3, 1e-3, 2e-3, 3e-3)),
    Knob("Hugging Face loops' host time per draft forward (s)", "engine", ("hf-eager",), "draft_forward_overhead_s",
         (0.0, 0.25e-3, 0.5e-3, 1e-3, 2e-3, 3e-3)),
)


def nearest(grid: tuple[float, ...], value: float) -> float:
    """The grid point nearest `value` (infinity: the largest)."""
    return max(grid) if math.isinf(value) else min(grid, key=lambda v: abs(v - value))


@dataclass(frozen=True)
class Score:
    mean_abs_error: float
    median_abs_error: float
    p90_abs_error: float

    @property
    def key(self) -> float:
        return round(self.mean_abs_error, 6)

    def __str__(self) -> str:
        return (f"mean |error| {self.mean_abs_error:.1%}, median {self.median_abs_error:.1%}, "
                f"P90 {self.p90_abs_error:.1%}")


def score_fit_half(catalogue: Catalogue, settings: Settings) -> Score:
    """The fit half's |error| with `settings` in place of the presets' fields."""
    from sim.validate.published.predict import predict_catalogue

    errors = [abs(p.error) for p in predict_catalogue(catalogue, half="fit", settings=settings)
              if p.role == "predicted"]
    return Score(float(np.mean(errors)), float(np.median(errors)), float(np.quantile(errors, 0.9)))


def _score(job: tuple[Catalogue, Settings]) -> Score:
    return score_fit_half(*job)


@dataclass
class FitResult:
    values: dict[str, float]          # knob name -> fitted value
    score: Score                      # the fit half at the fitted values
    presets_score: Score              # the fit half at the presets' own values
    rounds: int


def fit_settings(catalogue: Catalogue, knobs: tuple[Knob, ...] = KNOBS, workers: int | None = None,
                 log=print) -> FitResult:
    """Coordinate descent from the presets' values (snapped to each grid) to the best grid point."""
    values = {k.name: nearest(k.grid, k.current()) for k in knobs}

    def settings_of(chosen: dict[str, float]) -> Settings:
        out: Settings = {}
        for k in knobs:
            out |= k.settings(chosen[k.name])
        return out

    workers = workers or os.cpu_count() or 1
    with ProcessPoolExecutor(max_workers=workers) as pool:
        presets_score = score_fit_half(catalogue, {})
        best = score_fit_half(catalogue, settings_of(values))
        rounds = 0
        for rounds in range(1, MAX_ROUNDS + 1):
            changed = False
            for k in knobs:
                trials = [dict(values, **{k.name: v}) for v in k.grid]
                scores = list(pool.map(_score, [(catalogue, settings_of(t)) for t in trials]))
                i = min(range(len(trials)), key=lambda j: scores[j].key)
                if scores[i].key < best.key:
                    values, best, changed = trials[i], scores[i], True
                log(f"round {rounds}: {k.name} = {values[k.name]:g} (fit half {best})")
            if not changed:
                break
    return FitResult(values, best, presets_score, rounds)
