"""The simulator against live runs: each `profiler live` run folder turned into the scenarios that
reproduce it, predicted twice, and compared.

A live run decodes its prompts in static batches (`--batch`): each batch is prefilled in one
forward, decoded until its last request finishes, then the next batch starts. The matching
simulation runs each batch on its own (a closed workload of exactly those requests, each with its
own prompt and output length, every prompt prefilled in the first iteration) and adds the
batches' times, so the prediction prices the same forwards the run timed. A run served
continuously (`--serving continuous`) is one simulation of the simulator's own continuous
batching: its requests in a closed loop at the run's concurrency or at the times they arrived,
`--batch` rows, its prefill chunk, each chunk a forward of its own.

Two predictions per speculative run:
- replay: every simulated request takes its live request's accepted count at each step (and, with
  SpecPV rectify, its roll-backs): what remains is the cost model's error;
- fitted: acceptance (and SpecPV disagreement) fitted by `sim.validate.fit_acceptance` on the other runs
  with the same drafter, never on this one: the full prediction a user gets. A run whose drafter
  has no other run gets none.
Autoregressive runs have one prediction (no acceptance to replay or fit).

Measured speedup is the run's throughput over its autoregressive baseline: its own `--baseline`
run, else the autoregressive run of the same setting among the given runs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sim.errors import InputError
from sim.formats.names import SHARE_GROUPS
from sim.validate.machine_speed import at_run_speed, other_machine_state
from sim.validate.runs import SHARES, LiveRun, baselines_by_setting, measured, per_request_steps, repeat_speedups

# The predictions of a run, in report order; each again with this suffix when put at the run's
# measured machine speed (`at_run_speed`).
PREDICTIONS = ("cost model", "replay", "fitted")
AT_PROBE = "@ probe"
METRICS = ("tok_s", "speedup", "decode_speedup", "tpot_ms", "tokens_per_step", "ttft_p50_ms", "tpot_p50_ms")
# Summarized over open-loop runs only (Poisson or trace arrivals), where their targets are set.
SERVED_METRICS = ("ttft_p50_ms", "tpot_p50_ms")
# A fitted acceptance model is a distribution: its prediction is the mean over this many seeded
# simulations (a run of 1-16 requests is too few to average one draw of per-request rates).
FITTED_REPLICATIONS = 8


@dataclass
class Comparison:
    run: str
    method: str
    drafter: str
    batch: int
    context: float
    requests: int
    prediction: str                     # "cost model" (autoregressive), "replay" or "fitted"
    measured_tok_s: float
    predicted_tok_s: float
    measured_speedup: float | None
    predicted_speedup: float | None
    measured_decode_speedup: float | None
    predicted_decode_speedup: float | None
    measured_tpot_ms: float
    predicted_tpot_ms: float
    measured_tokens_per_step: float
    predicted_tokens_per_step: float
    measured_share: dict = field(default_factory=dict)
    predicted_share: dict = field(default_factory=dict)
    repeats: int = 1
    measured_spread: float = 0.0        # fastest / slowest repeat's throughput - 1
    note: str = ""
    # Every repeat's throughput and speedup (over the baseline's repeat of the same index), in the
    # order the run folders were given: the machine's own repeatability (`repeatability`).
    repeat_tok_s: tuple = ()
    repeat_speedup: tuple = ()
    # Served continuously: the median request's time to first token and time per output token
    # (NaN for static batches, whose requests wait for their batch rather than for a server).
    measured_ttft_p50_ms: float = math.nan
    predicted_ttft_p50_ms: float = math.nan
    measured_tpot_p50_ms: float = math.nan
    predicted_tpot_p50_ms: float = math.nan
    # Arrivals on their own clock (Poisson, trace): the load the p50 TTFT and TPOT targets are set
    # at (a closed loop's TTFT is mostly its queue). Every repeat's p50s, as repeat_tok_s.
    open_loop: bool = False
    repeat_ttft_p50_ms: tuple = ()
    repeat_tpot_p50_ms: tuple = ()
    policy: str = "static"              # the run's `--policy`

    def error(self, metric: str) -> float | None:
        measured, predicted = getattr(self, f"measured_{metric}"), getattr(self, f"predicted_{metric}")
        if measured is None or predicted is None or not measured or math.isnan(measured) or math.isnan(predicted):
            return None
        return predicted / measured - 1

    @property
    def share_error(self) -> float:
        """Largest absolute difference of a time share (fraction of the run's time)."""
        return max(abs(self.predicted_share.get(k, 0.0) - self.measured_share.get(k, 0.0)) for k in SHARES)

    def row(self) -> dict:
        out = {k: v for k, v in asdict(self).items()
               if k not in ("measured_share", "predicted_share", "repeat_tok_s", "repeat_speedup",
                            "repeat_ttft_p50_ms", "repeat_tpot_p50_ms", "policy")}
        for metric in METRICS:
            out[f"{metric}_error"] = self.error(metric)
        for k in SHARES:
            out[f"measured_share_{k}"] = self.measured_share.get(k, 0.0)
            out[f"predicted_share_{k}"] = self.predicted_share.get(k, 0.0)
        out["share_error"] = self.share_error
        return out


# ---- scenarios ------------------------------------------------------------------------------------

def model_preset_of(config: dict) -> str:
    """The simulator's model preset with the run's dimensions."""
    from sim.scenario.presets.models import preset_with_shape

    name = preset_with_shape(config)
    if name is None:
        raise InputError("RUN_DIR", f"no model preset has the run's dimensions ({config.get('name')})")
    return name


def speculation_of(run: LiveRun, acceptance: dict, disagreement: dict | None) -> dict:
    """The scenario's speculation block for the run's drafter and settings."""
    a = run.args
    if run.method == "draft_model":
        raise InputError("RUN_DIR", f"{run.path}: draft_model runs are not covered by validation yet")
    if a.get("temperature"):
        raise InputError("RUN_DIR", f"{run.path}: sampled runs (--temperature) are not covered by validation yet")
    if run.method == "synthetic":
        # The synthetic drafter (profiler/engine/synthetic.py) sets acceptance and pays for the forwards
        # of a random-weight draft: priced as the method that runs those. Its head is one decoder layer
        # of the target's shape with its own KV and the target's LM head (the simulator's EAGLE head,
        # less the fusion linear); none drafts on the host (prompt lookup's cost); a preset is a
        # draft model of that shape.
        shape = a.get("draft_shape") or "head"
        method, draft = {"head": ("eagle", {"layers": 1}), "none": ("ngram", None)}.get(
            shape, ("draft_model", {"model": shape}))
    else:
        method, draft = run.method, None
    spec: dict = {"method": method, "acceptance": acceptance, **({"draft": draft} if draft else {})}
    if a.get("tree"):
        spec["tree"] = {"width": int(a["tree"][0]), "depth": int(a["tree"][1])}
    else:
        spec["num_speculative_tokens"] = int(a["k"])
    if run.method == "shadow":
        spec["draft"] = {"bits": int(a["bits"]), "group_size": int(a["group_size"])}
    elif run.method == "eagle":
        # The live head (profiler/engine/eagle_head.py): one decoder layer of the target's shape, the fusion
        # linear and the target's own LM head, with a KV cache of its own: the simulator's eagle.
        spec["draft"] = {"layers": 1}
    elif run.method == "layerskip":
        spec["draft"] = {"exit_layer": int(a["exit_layer"])}
    elif run.method == "streaming":
        # The live engine's streaming self-draft masks the whole cache down to sink + window
        # (profiler.engine.model.context_mask) instead of compacting it, so it reads every KV token: its
        # scenario is a self-draft whose window covers the whole context.
        longest = int((run.requests.prompt_tokens + run.requests.output_tokens).max()) + run.depth + 1
        spec["draft"] = {"kv_budget": max(longest, int(a["sink"]) + 1), "sink": int(a["sink"])}
    if run.policy != "static":
        kind, _, batch = run.policy.partition(":")
        spec["policy"] = {"off_above_batch": int(batch)} if kind == "off_above_batch" else kind
    if run.partial:
        spec["partial_verify"] = {
            "budget": int(a["budget"]), "sink": int(a["partial_sink"]), "window": int(a["partial_window"]),
            "block": int(a["block"]), "period": int(a["period"]), "period_unit": a["period_unit"],
            "rectify": bool(a.get("rectify")), "reselect": "step", **({"disagreement": disagreement} if disagreement else {})}
    return spec


def batch_scenarios(run: LiveRun, calibration: Path | None, speculation: dict | None = None,
                    hardware: str | None = None) -> list[tuple[list[int], dict]]:
    """(request ids, scenario mapping) per static batch of the run, in order; a continuously
    served run is one scenario of all its requests, arriving as they did."""
    if hardware is None:
        if calibration is not None:
            from sim.formats.bundle import load_bundle

            hardware = load_bundle(calibration).meta["device"].get("hardware", "cpu")
        else:
            from sim.scenario.presets.hardware import preset_of_device

            hardware = preset_of_device(run.meta["device"])
            if hardware == "custom":
                raise InputError(run.name, f"no hardware preset for the run's device {run.meta['device']!r}; "
                                           f"give --calibration")
    requests = run.requests
    base = {"hardware": hardware, "model": model_preset_of(run.meta["config"]),
            "dtype": {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[run.meta["dtype"]],
            "calibration": str(calibration) if calibration is not None else None,
            "seed": int(run.meta.get("seed", 0)), **({"speculation": speculation} if speculation is not None else {})}
    # The live engine pads a step's rows to the longest (profiler.engine.speculative lays every
    # row out at T tokens).
    pad_ragged = run.meta.get("engine") is None
    if run.continuous:
        a = run.args
        if a.get("kv_budget") is not None:
            raise InputError("RUN_DIR", f"{run.path}: runs with --kv-budget are not covered by validation yet")
        prompts = [int(x) for x in requests.prompt_tokens]
        outputs = [int(x) for x in requests.output_tokens]
        if a.get("rate") is not None or a.get("arrivals") is not None:
            workload = {"arrival": "trace", "arrival_s": [float(x) for x in requests.arrival_s]}
        else:
            workload = {"arrival": "closed", "concurrency": int(a.get("concurrency") or run.batch),
                        "requests": len(prompts)}
        # Each prefilling request's chunk is a forward of its own (profiler.engine.serving).
        scheduler = {"max_batch": run.batch, "prefill_chunk": int(a["prefill_chunk"]), "pad_ragged": pad_ragged,
                     "prefill_forward": "per_request"}
        scenario = {**base, "workload": {**workload, "prompt_tokens": prompts, "output_tokens": outputs},
                    "scheduler": scheduler}
        return [([int(x) for x in requests.request], scenario)]
    out = []
    for first in range(0, len(requests), run.batch):
        chunk = requests.iloc[first:first + run.batch]
        prompts = [int(x) for x in chunk.prompt_tokens]
        outputs = [int(x) for x in chunk.output_tokens]
        # Each static batch on its own, its prompts prefilled in one forward.
        scenario = {**base, "workload": {"arrival": "closed", "concurrency": len(chunk), "requests": len(chunk),
                                         "prompt_tokens": prompts, "output_tokens": outputs},
                    "scheduler": {"max_batch": len(chunk), "prefill_chunk": sum(prompts), "pad_ragged": pad_ragged}}
        out.append(([int(x) for x in chunk.request], scenario))
    return out


# ---- predictions ----------------------------------------------------------------------------------

def predict(run: LiveRun, calibration: Path | None, prediction: str, fitted: dict | None = None,
            disagreement: dict | None = None, steps_of=None, policy=None) -> dict:
    """Predicted metrics of a run: prediction "cost model" (autoregressive), "replay" or "fitted"
    (with `fitted`, the drafter's acceptance block, and `disagreement` for SpecPV). What-ifs
    (sim/validate/oracle.py): `steps_of(rids)` gives the accepted drafts of each request's steps to
    replay instead of the run's own, and `policy` the scenario's speculation.policy."""
    from sim.simulate import simulate

    speculation = None
    if run.speculative:
        if prediction == "replay":
            tps = float(run.summary.get("tokens_per_step") or 1.0)
            placeholder = {"tokens_per_step": min(max(tps, 1.0), run.depth + 1)}
            speculation = speculation_of(run, placeholder, disagreement)
        else:
            speculation = speculation_of(run, fitted, disagreement)
        if policy is not None:
            speculation["policy"] = policy
        elif prediction == "replay" and steps_of is None:
            # Replay follows the run's own drafts step by step (a policy's choices included).
            speculation.pop("policy", None)
    totals = {"seconds": 0.0, "base_seconds": 0.0, "prefill": 0.0, "base_prefill": 0.0, "tokens": 0,
              "requests": 0, "steps": 0, "committed": 0}
    tpots, phases = [], {}
    ttft_p50s, tpot_p50s = [], []
    replications = FITTED_REPLICATIONS if prediction == "fitted" else 1
    batches = batch_scenarios(run, calibration, speculation)
    for replication in range(replications):
        for index, (rids, scenario) in enumerate(batches):
            build = None
            if run.speculative and prediction == "replay":
                build = replay_builder(run, rids)
                if steps_of is not None:
                    from sim.acceptance import ReplayAcceptance

                    accepted = steps_of(rids)
                    build = lambda config, n, rng, accepted=accepted: ReplayAcceptance(accepted, run.depth)  # noqa: E731
            # Every batch and replication draws its own requests' rates.
            result = simulate({**scenario, "seed": scenario["seed"] + 7919 * replication + index}, acceptance=build)
            metrics, base = result.run, result.baseline
            totals["seconds"] += metrics.makespan_s
            totals["base_seconds"] += base.makespan_s
            totals["prefill"] += metrics.phase_s["prefill"]
            totals["base_prefill"] += base.phase_s["prefill"]
            totals["tokens"] += metrics.output_tokens
            totals["requests"] += len(rids)
            histogram = metrics.tokens_per_step_histogram
            totals["steps"] += sum(histogram.values())
            totals["committed"] += sum(k * c for k, c in histogram.items())
            tpots.extend(x for x in metrics.tpot_s if not math.isnan(x))
            if run.continuous:
                ttft_p50s.append(float(np.nanmedian(metrics.ttft_s)))
                tpot_p50s.append(float(np.nanmedian(metrics.tpot_s)))
            for phase, seconds in metrics.phase_s.items():
                phases[phase] = phases.get(phase, 0.0) + seconds
    busy = sum(phases.values()) or 1.0
    share = {k: sum(phases.get(p, 0.0) for p in SHARE_GROUPS[k]) / busy for k in SHARES}
    decode_s = totals["seconds"] - totals["prefill"]
    base_decode_s = totals["base_seconds"] - totals["base_prefill"]
    return {"tok_s": totals["tokens"] / totals["seconds"],
            "speedup": totals["base_seconds"] / totals["seconds"] if run.speculative else None,
            "decode_speedup": base_decode_s / decode_s if run.speculative and decode_s > 0 else None,
            "tpot_ms": float(np.mean(tpots)) * 1e3 if tpots else math.nan,
            "tokens_per_step": totals["committed"] / totals["steps"] if run.speculative and totals["steps"] else 1.0,
            "ttft_p50_ms": float(np.mean(ttft_p50s)) * 1e3 if ttft_p50s else math.nan,
            "tpot_p50_ms": float(np.mean(tpot_p50s)) * 1e3 if tpot_p50s else math.nan,
            "share": share, "seconds": totals["seconds"], "prefill_s": totals["prefill"],
            "base_seconds": totals["base_seconds"], "base_prefill_s": totals["base_prefill"]}


def replay_builder(run: LiveRun, rids: list[int]):
    """The acceptance factory that replays these requests of the run step by step."""
    from sim.acceptance import ReplayAcceptance

    # A policy's run replays its own choices: every step, those that drafted nothing as plain steps.
    policy = run.every_step is not None
    steps = per_request_steps(run, rids, every_step=policy)
    rectify = run.partial and bool(run.args.get("rectify"))
    short = policy or (any((d < run.depth).any() for d in steps["drafted"]) and not run.args.get("tree"))
    return lambda config, n, rng: ReplayAcceptance(steps["accepted"], run.depth,
                                                   steps["rolled_back"] if rectify else None,
                                                   steps["drafted"] if short else None, plain_steps=policy)


def compare_runs(runs: list[LiveRun], calibration: Path | None, progress: bool = False) -> list[Comparison]:
    """Every run predicted (replay and fitted for speculative runs) against its measurement."""
    from sim.validate.fit_acceptance import acceptance_runs, disagreement_from_runs, fit_drafter

    baselines = baselines_by_setting(runs)
    speeds = {run.name: run_speed(run, calibration) for run in runs}
    comparisons = []
    iterator = runs
    if progress:
        from tqdm import tqdm

        iterator = tqdm(runs, desc="validate", unit="run", leave=False)
    for run in iterator:
        truth = measured(run, baselines)
        if not run.speculative:
            plans = [("cost model", None, None, "")]
        else:
            others = [r for r in runs if r is not run]
            # Replay takes the run's own roll-backs; disagreement only counts divergent tokens.
            plans = [("replay", None, None, "")]
            peers = [r for r in others if r.drafter == run.drafter and len(r.steps)]
            if peers:
                fitted = fit_drafter(acceptance_runs(peers))["acceptance"]
                disagreement, note = None, ""
                if run.partial:
                    disagreement = disagreement_from_runs([r for r in others if r.partial], runs)[0]
                    note = "" if disagreement else "no other SpecPV run: default disagreement"
                plans.append(("fitted", fitted, disagreement, note))
        ratios = speeds[run.name]
        drift = other_machine_state(ratios) if ratios is not None and not ratios["priced"] else None
        for prediction, fitted, disagreement, note in plans:
            guess = predict(run, calibration, prediction, fitted, disagreement)
            guesses = [(prediction, guess, "; ".join(n for n in (note, drift) if n))]
            if ratios is not None:
                # Speedup is over the run's own --baseline (same process) if it has one, else over
                # its setting's autoregressive run; decode speedup always over the latter (measured).
                setting_base = baselines.get(run.setting)
                setting_ratios = speeds.get(setting_base.name) if setting_base is not None else None
                base_ratios = ratios if run.summary.get("baseline_throughput_tok_s") else setting_ratios
                notes = [note, drift] + [PRICED_PROBE_NOTE] * ratios["priced"]
                if run.speculative and base_ratios is None:
                    notes.append("baseline without a probe: taken at the run's speed")
                guesses.append((f"{prediction} {AT_PROBE}",
                                at_run_speed(guess, ratios, base_ratios or ratios, setting_ratios or ratios),
                                "; ".join(n for n in notes if n)))
            for label, guess, note in guesses:
                comparisons.append(Comparison(
                    run.name, run.method, run.drafter, run.batch, run.context_tokens, len(run.requests), label,
                    truth["tok_s"], guess["tok_s"], truth["speedup"], guess["speedup"], truth["decode_speedup"],
                    guess["decode_speedup"], truth["tpot_ms"],
                    guess["tpot_ms"], truth["tokens_per_step"], guess["tokens_per_step"], truth["share"],
                    guess["share"], len(run.repeat_tok_s) or 1,
                    max(run.repeat_tok_s) / min(run.repeat_tok_s) - 1 if run.repeat_tok_s else 0.0, note,
                    run.repeat_tok_s, repeat_speedups(run, baselines),
                    measured_ttft_p50_ms=truth["ttft_p50_ms"], predicted_ttft_p50_ms=guess["ttft_p50_ms"],
                    measured_tpot_p50_ms=truth["tpot_p50_ms"], predicted_tpot_p50_ms=guess["tpot_p50_ms"],
                    open_loop=run.open_loop, repeat_ttft_p50_ms=run.repeat_ttft_p50_ms,
                    repeat_tpot_p50_ms=run.repeat_tpot_p50_ms, policy=run.policy))
    return comparisons


# The note on a prediction at the run's speed whose reference is the bundle's price of the probe.
PRICED_PROBE_NOTE = "speed against the bundle's price of the probe (the bundle has no probe of its own)"


def run_speed(run: LiveRun, calibration: Path | None) -> dict | None:
    """The machine's speed at the run over its bundle's (sim/validate/machine_speed.py): ratios per probe
    and whether the reference was priced rather than timed; None for a run without a probe or a
    prediction without a bundle."""
    from sim.formats.bundle import load_bundle
    from sim.validate.machine_speed import calibration_probe, measured_probe, priced_probe, speed_ratios

    measured_now = measured_probe(run.meta)
    if measured_now is None or calibration is None:
        return None
    reference = calibration_probe(load_bundle(calibration).meta, measured_now["shapes"])
    priced = reference is None
    if priced:
        reference = priced_probe(batch_scenarios(run, calibration)[0][1], measured_now["shapes"])
    return {**speed_ratios(measured_now, reference), "priced": priced}
