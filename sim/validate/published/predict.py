"""Predict every case of the catalogue: anchors first (the per-token acceptance rate that makes the
simulated speedup equal the measured one), then every other case from its measured or anchored
acceptance, and the error of each against its measurement."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from scipy.optimize import brentq

from sim.errors import InputError
from sim.workload import mean_length
from sim.validate.published.catalogue import Catalogue, Entry
from sim.validate.published.scenarios import Settings, case_scenario, depth

# The rate an anchor may take: a geometric acceptance of 0.98 already commits nearly every draft.
MAX_RATE = 0.98


@dataclass
class Prediction:
    entry: Entry
    role: str                    # "predicted" (scored) or "anchor" (sets acceptance; not scored)
    measured: float
    predicted: float
    acceptance: dict             # the scenario's acceptance block
    tokens_per_step: float       # committed per step in the simulation
    seconds: float               # wall time of this case's simulations
    prompt_tokens: float = 0     # the prompt length simulated, its mean where lengths are drawn
    note: str = ""
    draft_share: float = 0.0     # drafting's share of the speculative run's time (host drafting included)
    kernels: str = ""            # the published kernel table its layers were priced by ("": the roofline)
    cost: str = ""               # what priced its GPU kernels: measured:GPU/ENGINE/VERSION, roofline or calibrated:...

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    def row(self) -> dict:
        c = self.entry.case
        w = c.workload
        return {"case": c.id, "source": self.entry.source.id, "half": self.entry.half, "role": self.role,
                "hardware": c.hardware, "gpus": c.gpus, "model": c.model, "engine": c.engine, "dtype": c.dtype,
                "method": c.method, "metric": c.metric, "batch": w.batch, "rate_qps": w.rate_qps,
                "prompt_tokens": self.prompt_tokens, "measured_speedup": self.measured,
                "predicted_speedup": self.predicted, "error": self.error if self.role == "predicted" else None,
                "acceptance": ", ".join(f"{k} {v:.4g}" for k, v in self.acceptance.items()),
                "tokens_per_step": self.tokens_per_step, "draft_share": self.draft_share,
                "kernels": self.kernels, "cost": self.cost, "note": self.note}


def speedup_of(result, case) -> float:
    """The simulated speedup as the case measures it."""
    spec, base = result.speculative, result.baseline
    if case.metric == "decode_only":
        return spec.decode_throughput_tok_s / base.decode_throughput_tok_s
    if case.metric == "end_to_end" and case.workload.rate_qps is not None:
        return base.e2e_ms["p50"] / spec.e2e_ms["p50"]
    return spec.throughput_tok_s / base.throughput_tok_s


def simulate_case(entry: Entry, catalogue: Catalogue, acceptance: dict, settings: Settings | None = None,
                  cost: str = "auto"):
    from sim.simulate import simulate

    try:
        return simulate(case_scenario(entry, catalogue, acceptance, settings, cost))
    except InputError as exc:
        raise InputError(f"{entry.file}: case {entry.case.id}", f"cannot be simulated: {exc}") from None


def solve_anchor(entry: Entry, catalogue: Catalogue, settings: Settings | None = None,
                 cost: str = "auto") -> Prediction:
    """The per-token acceptance rate at which the simulated speedup equals the measured one."""
    started = time.perf_counter()
    case = entry.case
    evaluated: dict[float, tuple] = {}

    def gap(rate: float) -> float:
        result = simulate_case(entry, catalogue, {"rate": rate}, settings, cost)
        evaluated[rate] = (result, speedup_of(result, case))
        return evaluated[rate][1] - case.speedup

    note = ""
    low, high = gap(0.0), gap(MAX_RATE)
    if not (math.isfinite(low) and math.isfinite(high)):
        raise InputError(f"{entry.file}: case {case.id}",
                         f"its simulated {case.metric} speedup is undefined (no iteration measures it)")
    if low >= 0:
        rate, note = 0.0, "measured speedup at or below the model's with no draft accepted"
    elif high <= 0:
        rate, note = MAX_RATE, f"measured speedup above the model's at acceptance {MAX_RATE}"
    else:
        rate = brentq(gap, 0.0, MAX_RATE, xtol=1e-4, rtol=1e-4)
        if rate not in evaluated:
            gap(rate)
    result, predicted = evaluated[rate]
    return Prediction(entry, "anchor", case.speedup, predicted, {"rate": rate}, result.speculative.tokens_per_step,
                      time.perf_counter() - started, mean_length(result.scenario.workload.prompt_tokens), note,
                      **pricing_columns(result))


def predict_case(entry: Entry, catalogue: Catalogue, acceptance: dict, settings: Settings | None = None,
                 cost: str = "auto") -> Prediction:
    started = time.perf_counter()
    result = simulate_case(entry, catalogue, acceptance, settings, cost)
    return Prediction(entry, "predicted", entry.case.speedup, speedup_of(result, entry.case), acceptance,
                      result.speculative.tokens_per_step, time.perf_counter() - started,
                      mean_length(result.scenario.workload.prompt_tokens), **pricing_columns(result))


def pricing_columns(result) -> dict:
    """What a prediction shows beside its speedup: drafting's share of the speculative run's time,
    the published kernel table that priced its layers, if one did, and what priced its kernels."""
    calibration = result.scenario.calibration
    return {"draft_share": result.speculative.time_share["draft"],
            "kernels": calibration.name if calibration is not None else "",
            "cost": result.provenance["cost_model"]}


def acceptance_block(entry: Entry, anchors: dict[str, Prediction], by_id: dict[str, Entry]) -> dict:
    """The case's acceptance: measured tokens per step (capped at what a step can commit), or the
    rate of the case it takes acceptance from."""
    case = entry.case
    source = case if case.acceptance is not None else by_id[case.acceptance_from].case
    if source.acceptance is not None:
        return {"tokens_per_step": min(source.acceptance.tokens_per_step, depth(case) + 1)}
    return {"rate": anchors[source.id].acceptance["rate"]}


def predict_catalogue(catalogue: Catalogue, progress: bool = False, half: str | None = None,
                      settings: Settings | None = None, cost: str = "auto") -> list[Prediction]:
    """Every case of the catalogue (or of one half), anchors first; `settings` replace preset fields;
    `cost` is every case's scenario field (auto: the measured tables where they cover it)."""
    from tqdm import tqdm

    entries = catalogue.entries if half is None else catalogue.half(half)
    by_id = {e.case.id: e for e in catalogue.entries}
    order = [e for e in entries if e.case.anchor] + [e for e in entries if not e.case.anchor]
    anchors: dict[str, Prediction] = {}
    predictions = []
    for entry in tqdm(order, desc="published cases", unit="case", disable=not progress):
        if entry.case.anchor:
            anchors[entry.case.id] = prediction = solve_anchor(entry, catalogue, settings, cost)
        else:
            prediction = predict_case(entry, catalogue, acceptance_block(entry, anchors, by_id), settings, cost)
        predictions.append(prediction)
    index = {e.case.id: i for i, e in enumerate(catalogue.entries)}
    return sorted(predictions, key=lambda p: index[p.entry.case.id])
