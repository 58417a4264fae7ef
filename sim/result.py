"""Metrics of a simulated run, and the Result that pairs a speculative run with its baseline."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from sim.cost.batch import PHASES
from sim.scenario.schema import Scenario

PERCENTILES = (50, 90, 99)


@dataclass
class RunRecord:
    """What one simulated run produced, before metrics are computed from it."""
    first_token_s: np.ndarray
    finish_s: np.ndarray
    arrival_s: np.ndarray
    output_tokens: np.ndarray
    step_s: list[float] = field(default_factory=list)          # per iteration
    decoding: list[int] = field(default_factory=list)          # decoding requests per iteration
    committed: list[np.ndarray] = field(default_factory=list)  # tokens committed per request-step
    phase_s: list[float] = field(default_factory=lambda: [0.0] * len(PHASES))
    peak_kv_tokens: int = 0
    # Adaptive policies only: tokens each iteration's requests drafted (0: speculation off; the
    # oracle's: the mean of its rows').
    drafted_k: list[float] = field(default_factory=list)
    lookup_share: float | None = None      # route, combine: request-steps verifying prompt lookup's proposal
    partial_accepted_tokens: int = 0       # SpecPV: tokens accepted under partial verification
    divergent_tokens: float = 0.0          # expected tokens that differ from full verification
    rolled_back_tokens: int = 0            # SpecPV rectify: tokens discarded at a full verification
    partial_steps: int = 0                 # SpecPV: request-steps verified against the partial KV
    full_verifications: int = 0            # SpecPV: request-steps verified against the full KV
    preemptions: int = 0
    # Decode-only accounting, as long-context papers measure it: iterations that prefill nothing,
    # and the output tokens they commit (nothing of an iteration with a prefill chunk counts).
    decode_only_s: float = 0.0
    decode_only_tokens: int = 0


def percentiles_ms(values_s: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """p50/p90/p99 in milliseconds (NaN when there are no values).

    Unweighted: linear interpolation between order statistics. Weighted (ITL: each iteration counts
    once per request decoding in it): the inverted CDF, as if each value were repeated `weights`
    times, without materializing the repeats.
    """
    values_s = np.asarray(values_s, dtype=float)
    keep = ~np.isnan(values_s)
    if weights is not None:
        keep &= np.asarray(weights) > 0
    values_s = values_s[keep]
    if values_s.size == 0:
        return {f"p{p}": math.nan for p in PERCENTILES}
    if weights is None:
        points = np.percentile(values_s, PERCENTILES)
    else:
        points = np.percentile(values_s, PERCENTILES, weights=np.asarray(weights)[keep], method="inverted_cdf")
    return {f"p{p}": float(v * 1e3) for p, v in zip(PERCENTILES, points)}


@dataclass
class RunMetrics:
    makespan_s: float
    output_tokens: int
    throughput_tok_s: float
    decode_throughput_tok_s: float
    iterations: int
    tokens_per_step: float                 # mean committed per verification step, bonus included
    tokens_per_step_histogram: dict[int, int]
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    time_share: dict[str, float]
    phase_s: dict[str, float]
    peak_kv_tokens: int
    peak_batch: int                        # most requests decoding in one iteration
    preemptions: int
    # Adaptive speculation policies: share of request-steps that drafted, and their mean drafts.
    drafting_share: float | None = None
    mean_drafted_k: float | None = None
    lookup_share: float | None = None      # route, combine: request-steps that verified prompt lookup's proposal
    goodput_tok_s: float | None = None    # output tokens/s of requests within both SLO thresholds
    slo_attainment: float | None = None   # fraction of requests within both thresholds
    slo_met: bool | None = None           # p90 TTFT and p90 TPOT within their thresholds
    ttft_s: np.ndarray = field(default=None, repr=False)
    tpot_s: np.ndarray = field(default=None, repr=False)


def summarize(record: RunRecord, scenario: Scenario) -> RunMetrics:
    start_s = float(np.nanmin(record.arrival_s))
    end_s = float(np.nanmax(record.finish_s))
    makespan = end_s - start_s
    outputs = record.output_tokens
    total_out = int(outputs.sum())
    ttft = record.first_token_s - record.arrival_s
    tpot = np.where(outputs > 1, (record.finish_s - record.first_token_s) / np.maximum(outputs - 1, 1), np.nan)
    e2e = record.finish_s - record.arrival_s
    steps = np.asarray(record.step_s)
    decoding = np.asarray(record.decoding, dtype=np.int64)
    phase_s = dict(zip(PHASES, record.phase_s))
    busy = sum(record.phase_s)
    share = {k: (v / busy if busy else 0.0) for k, v in phase_s.items()}
    if record.committed:
        committed = np.concatenate(record.committed)
        hist = np.bincount(committed)
        tps = float(committed.mean())
    else:  # no speculation: every decode step commits one token
        hist = np.array([0, int(decoding.sum())])
        tps = 1.0
    # Decode-only throughput (long-context papers): output tokens committed by iterations that
    # prefill nothing, over those iterations' time.
    decode_time = record.decode_only_s
    decode_tokens = record.decode_only_tokens
    metrics = RunMetrics(
        makespan_s=makespan, output_tokens=total_out,
        throughput_tok_s=total_out / makespan if makespan > 0 else math.inf,
        decode_throughput_tok_s=decode_tokens / decode_time if decode_time > 0 else math.nan,
        iterations=len(steps), tokens_per_step=tps,
        tokens_per_step_histogram={int(i): int(c) for i, c in enumerate(hist) if c},
        ttft_ms=percentiles_ms(ttft), tpot_ms=percentiles_ms(tpot),
        itl_ms=percentiles_ms(steps, decoding), e2e_ms=percentiles_ms(e2e),
        time_share=share, phase_s=phase_s, peak_kv_tokens=record.peak_kv_tokens,
        peak_batch=int(decoding.max()) if decoding.size else 0,
        preemptions=record.preemptions, lookup_share=record.lookup_share, ttft_s=ttft, tpot_s=tpot)
    if record.drafted_k:
        k = np.asarray(record.drafted_k)
        weights = decoding[decoding > 0]             # the iterations that decoded, as drafted_k
        drafted = weights[k > 0]
        metrics.drafting_share = float(drafted.sum() / weights.sum())
        metrics.mean_drafted_k = float((k[k > 0] * drafted).sum() / drafted.sum()) if drafted.sum() else 0.0
    slo = scenario.slo
    if slo.ttft_ms_p90 is not None or slo.tpot_ms_p90 is not None:
        ok = np.ones(len(outputs), dtype=bool)
        if slo.ttft_ms_p90 is not None:
            ok &= ttft * 1e3 <= slo.ttft_ms_p90
        if slo.tpot_ms_p90 is not None:
            ok &= ~(tpot * 1e3 > slo.tpot_ms_p90)      # single-token outputs have no TPOT
        metrics.slo_attainment = float(ok.mean())
        metrics.slo_met = bool((slo.ttft_ms_p90 is None or metrics.ttft_ms["p90"] <= slo.ttft_ms_p90)
                               and (slo.tpot_ms_p90 is None or not metrics.tpot_ms["p90"] > slo.tpot_ms_p90))
        metrics.goodput_tok_s = float(outputs[ok].sum() / makespan) if makespan > 0 else math.nan
    return metrics


@dataclass
class Result:
    """A speculative run and its no-speculation baseline on the same requests and seed."""
    scenario: Scenario
    speculative: RunMetrics | None
    baseline: RunMetrics
    memory: dict
    partial_verify: dict | None
    provenance: dict

    @property
    def run(self) -> RunMetrics:
        return self.speculative or self.baseline

    @property
    def throughput_tok_s(self) -> float:
        return self.run.throughput_tok_s

    @property
    def speedup(self) -> float:
        return self.run.throughput_tok_s / self.baseline.throughput_tok_s

    @cached_property
    def speedup_band(self):
        """sim.bands.Band: the error of the validated cases nearest in regime, or None (no
        speculation, or no comparable case). Found on first use: sweeps and `sim run` show it,
        the simulations inside a search (anchors, capacity) never ask."""
        if self.speculative is None:
            return None
        from sim.bands import speedup_band

        return speedup_band(self.scenario, self.speedup)

    @property
    def decode_speedup(self) -> float:
        base = self.baseline.decode_throughput_tok_s
        # Single-token outputs have no decode phase: no decode speedup either.
        return self.run.decode_throughput_tok_s / base if base > 0 else math.nan

    def to_dict(self) -> dict:
        """The JSON object of `python -m sim run --json`."""
        run, base = self.run, self.baseline
        out = {
            "throughput_tok_s": run.throughput_tok_s,
            "baseline_throughput_tok_s": base.throughput_tok_s,
            "speedup": self.speedup,
            "decode_throughput_tok_s": run.decode_throughput_tok_s,
            "baseline_decode_throughput_tok_s": base.decode_throughput_tok_s,
            "decode_speedup": self.decode_speedup,
            "tokens_per_step": run.tokens_per_step,
            "tokens_per_step_histogram": run.tokens_per_step_histogram,
            "tpot_ms": run.tpot_ms, "ttft_ms": run.ttft_ms, "itl_ms": run.itl_ms, "e2e_ms": run.e2e_ms,
            "time_share": run.time_share,
            "baseline_tpot_ms": base.tpot_ms, "baseline_ttft_ms": base.ttft_ms,
            "baseline_time_share": base.time_share,
            "makespan_s": run.makespan_s, "baseline_makespan_s": base.makespan_s,
            "output_tokens": run.output_tokens,
            "iterations": run.iterations, "baseline_iterations": base.iterations,
            "peak_kv_gb": self.memory["peak_kv_gb"], "baseline_peak_kv_gb": self.memory["baseline_peak_kv_gb"],
            "preemptions": run.preemptions,
            "drafting_share": run.drafting_share, "mean_drafted_k": run.mean_drafted_k,
            "lookup_share": run.lookup_share,
            "peak_batch": run.peak_batch, "baseline_peak_batch": base.peak_batch,
            "goodput_tok_s": run.goodput_tok_s, "baseline_goodput_tok_s": base.goodput_tok_s,
            "slo_attainment": run.slo_attainment, "baseline_slo_attainment": base.slo_attainment,
            "slo_met": run.slo_met, "baseline_slo_met": base.slo_met,
            "baseline_itl_ms": base.itl_ms, "baseline_e2e_ms": base.e2e_ms,
            "baseline_preemptions": base.preemptions,
            "memory": self.memory,
            "partial_verify": self.partial_verify,
            "speedup_band": None if self.speedup_band is None else {
                "relative": self.speedup_band.relative, "half_width": self.speedup_band.half_width,
                "cases": list(self.speedup_band.cases), "basis": self.speedup_band.basis,
                "widened": self.speedup_band.widened},
            "provenance": self.provenance,
        }
        return json_safe(out)


def json_safe(value):
    """NaN and infinities become null, so the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value

