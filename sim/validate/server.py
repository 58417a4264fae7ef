"""The simulator against a real engine's server: `profiler serve-live` run folders (vLLM's server,
llama.cpp's llama-server) predicted and compared.

A server run is a client's view: per request its prompt and output tokens, when it was sent, its
time to first token and time per output token, and the server's speculative counters over the run
(drafts, draft tokens, accepted tokens per draft position). The matching simulation serves the same
requests the same way: a closed loop at the run's concurrency taking the prompts in order, or the
requests at the times the Poisson client sent them; the engine's scheduler (continuous batching,
chunked prefill in a 2,048-token budget, ragged verification; llama.cpp: at most its slots decode)
with the engine priced by a black-box bundle of that engine (`profiler calibrate --engine ENGINE`).

Two predictions per speculative run:
- own: acceptance from the run's own counters: the share of request-steps that drafted (an n-gram
  drafter proposes only where the history matches) and, at those, the conditional acceptance per
  position; what remains is the cost model's and the scheduler's error;
- fitted: the same two from the pooled counters of the other runs with the same drafter, never this
  one's: the prediction a user gets.
Runs without speculation have one prediction ("cost model"). Measured speedup is the run's
throughput over its own `--baseline` pass, else over the run without speculation of its setting.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sim.errors import InputError
from sim.formats.names import scenario_dtype
from sim.validate.runs import ServerRun

PREDICTIONS = ("cost model", "own", "fitted")
METRICS = ("tok_s", "speedup", "ttft_p50_ms", "tpot_p50_ms", "tokens_per_step")
# vLLM's CPU server defaults (vllm/engine/arg_utils.py: max_num_batched_tokens 2,048 and
# max_num_seqs 128 for the OpenAI server on a CPU).
VLLM_CPU_SCHEDULER = {"max_batch": 128, "prefill_chunk": 2048, "pad_ragged": False, "budget_includes_decode": True}
# llama-server: its slots decode together, and each llama_decode takes the slots' decode (and draft)
# tokens and then prompt tokens up to its logical batch, --batch-size 2,048 (tools/server).
LLAMA_CPP_PREFILL_CHUNK = 2048
# A speculative run's prediction is the mean over seeds: one draw of a few hundred drafting steps
# moves tokens per step by several percent on its own.
REPLICATIONS = 8
def engine_scheduler(run: ServerRun) -> dict:
    """The scheduler of the run's server."""
    if run.meta["engine"] == "llama.cpp":
        return {"max_batch": int(run.args["parallel"]), "prefill_chunk": LLAMA_CPP_PREFILL_CHUNK, "pad_ragged": False,
                "budget_includes_decode": True}
    return dict(VLLM_CPU_SCHEDULER)


def server_acceptance(runs: list[ServerRun]) -> dict | None:
    """The acceptance block of these runs' pooled counters: conditional per-position rates at the
    steps that drafted, and the share of request-steps that drafted. None without drafts."""
    from sim.validate.fit_acceptance import rates_from_counts

    drafts = sum(float(r.counters.get("drafts", 0.0)) for r in runs)
    if drafts <= 0:
        return None
    depth = max(len(r.counters.get("accepted_per_position", [])) for r in runs)
    counts = np.zeros(depth + 1)
    for r in runs:
        per_position = list(r.counters.get("accepted_per_position", []))
        counts += np.array([float(r.counters.get("drafts", 0.0))] + per_position + [0.0] * (depth - len(per_position)))
    steps = sum(r.decode_steps for r in runs)
    return {"per_position": [round(float(x), 4) for x in rates_from_counts(counts)],
            "draft_share": round(min(max(drafts / steps, 1e-3), 1.0), 4)}


def server_scenario(run: ServerRun, calibration: Path, trace_dir: Path, acceptance: dict | None) -> dict:
    """The scenario that serves the run's requests as its client did."""
    from sim.formats.bundle import load_bundle
    from sim.validate.compare import model_preset_of

    requests = run.requests
    prompts = [int(x) for x in requests.prompt_tokens]
    outputs = [int(x) for x in requests.output_tokens]
    if run.args.get("rate"):
        trace = trace_dir / f"{run.name}.csv"
        sent = requests.sent_s.to_numpy(float)
        trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
            f"{s - sent.min():.6f},{p},{o}\n" for s, p, o in zip(sent, prompts, outputs)))
        workload = {"arrival": "trace", "trace": str(trace)}
    else:
        workload = {"arrival": "closed", "concurrency": int(run.args["batch"]), "requests": len(prompts),
                    "prompt_tokens": prompts, "output_tokens": outputs}
    scenario = {"hardware": load_bundle(calibration).meta["device"].get("hardware", "cpu"),
                "model": model_preset_of(run.meta["config"]),
                "dtype": scenario_dtype(run.meta["dtype"]), "engine": run.meta["engine"],
                "calibration": str(calibration), "workload": workload, "scheduler": engine_scheduler(run),
                "seed": int(run.meta.get("seed", 0))}
    if acceptance is not None:
        # The run's drafter: n-gram prompt lookup, or (vLLM) an EAGLE head, priced by the bundle's
        # engine_draft tables (profiler calibrate --engine vllm --head DIR).
        scenario["speculation"] = {"method": run.method, "num_speculative_tokens": int(run.args["k"]),
                                   "acceptance": acceptance}
    return scenario


def predict_server(run: ServerRun, calibration: Path, acceptance: dict | None, replications: int = 1) -> dict:
    """Predicted throughput, speedup, p50 TTFT and TPOT, tokens per step (and the baseline's): the
    mean over `replications` seeds."""
    from sim.simulate import simulate

    totals: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="sim-validate-") as scratch:
        scenario = server_scenario(run, calibration, Path(scratch), acceptance)
        for replication in range(replications):
            result = simulate({**scenario, "seed": scenario["seed"] + 7919 * replication})
            unpriced = [w for w in result.provenance["warnings"] if w.startswith("stack target priced by the roofline")]
            if unpriced:
                # A server run is predicted from its engine's own measured steps or not at all.
                raise InputError("--calibration", f"{calibration} does not price {run.name}: {unpriced[0]}")
            spec, base = result.run, result.baseline
            histogram = spec.tokens_per_step_histogram
            steps = sum(histogram.values())
            values = {"tok_s": spec.output_tokens / spec.makespan_s,
                      "ttft_p50_ms": float(np.nanmedian(spec.ttft_s)) * 1e3,
                      "tpot_p50_ms": float(np.nanmedian(spec.tpot_s)) * 1e3,
                      "tokens_per_step": sum(k * c for k, c in histogram.items()) / steps if steps else 1.0,
                      "base_tok_s": base.output_tokens / base.makespan_s,
                      "base_ttft_p50_ms": float(np.nanmedian(base.ttft_s)) * 1e3,
                      "base_tpot_p50_ms": float(np.nanmedian(base.tpot_s)) * 1e3}
            values["speedup"] = values["tok_s"] / values["base_tok_s"] if acceptance is not None else None
            for key, value in values.items():
                totals.setdefault(key, []).append(value)
    return {k: (float(np.mean(v)) if v[0] is not None else None) for k, v in totals.items()}


def measured_server(run: ServerRun, baselines: dict) -> dict:
    s = run.summary
    base_tok_s = s.get("baseline_throughput_tok_s")
    base = baselines.get(run.setting)
    if base_tok_s is None and base is not None and run.speculative:
        base_tok_s = base.summary["throughput_tok_s"]
    # Every decode step commits 1 + its accepted drafts (greedy), whether it drafted or not.
    tokens_per_step = 1.0 + float(run.counters.get("accepted", 0.0)) / run.decode_steps if run.speculative else 1.0
    return {"tok_s": float(s["throughput_tok_s"]),
            "speedup": float(s["throughput_tok_s"]) / float(base_tok_s) if run.speculative and base_tok_s else None,
            "ttft_p50_ms": float(s["ttft_p50_ms"]), "tpot_p50_ms": s.get("tpot_p50_ms"),
            "tokens_per_step": tokens_per_step}


@dataclass
class ServerComparison:
    run: str
    drafter: str
    load: str
    context: float
    requests: int
    prediction: str
    acceptance: str
    measured: dict
    predicted: dict

    def error(self, metric: str) -> float | None:
        m, p = self.measured.get(metric), self.predicted.get(metric)
        if m is None or p is None or not m or math.isnan(m) or math.isnan(p):
            return None
        return p / m - 1

    def row(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("measured", "predicted")}
        for metric in METRICS:
            out[f"measured_{metric}"] = self.measured.get(metric)
            out[f"predicted_{metric}"] = self.predicted.get(metric)
            out[f"{metric}_error"] = self.error(metric)
        return out


def compare_server_runs(runs: list[ServerRun], calibration: Path | None, progress: bool = False) -> list[ServerComparison]:
    """Every server run predicted (own and fitted acceptance for speculative runs) against its measurement."""
    if calibration is None:
        raise InputError("--calibration", "server runs are priced by a bundle of their engine "
                                          "(python -m profiler calibrate --engine vllm | llama.cpp)")
    from sim.formats.bundle import load_bundle

    engine = load_bundle(calibration).meta.get("engine")
    engines = {r.meta.get("engine") for r in runs}
    if engines != {engine}:
        raise InputError("--calibration", f"the bundle times {engine}; the runs are {', '.join(sorted(map(str, engines)))}'s")
    baselines = {}
    for run in runs:
        if not run.speculative:
            baselines.setdefault(run.setting, run)
    iterator = runs
    if progress:
        from tqdm import tqdm

        iterator = tqdm(runs, desc="validate", unit="run", leave=False)
    out = []
    for run in iterator:
        truth = measured_server(run, baselines)
        if not run.speculative:
            plans = [("cost model", None, 1)]
        else:
            plans = [("own", server_acceptance([run]), REPLICATIONS)]
            peers = [r for r in runs if r is not run and r.drafter == run.drafter]
            fitted = server_acceptance(peers) if peers else None
            if fitted is not None:
                plans.append(("fitted", fitted, REPLICATIONS))
        for prediction, acceptance, replications in plans:
            if run.speculative and acceptance is None:
                continue              # a run that never drafted has no acceptance to predict with
            guess = predict_server(run, calibration, acceptance, replications)
            label = "" if acceptance is None else (f"share {acceptance['draft_share']:.2f}, rates "
                                                   + "/".join(f"{r:.2f}" for r in acceptance["per_position"]))
            out.append(ServerComparison(run.name, run.drafter, run.load, float(run.requests.prompt_tokens.mean()),
                                        len(run.requests), prediction, label, truth, guess))
    return out


def aggregate_server(rows: list[ServerComparison]) -> list[dict]:
    """Median, P90 and worst |error| per prediction and metric, and the runs on the wrong side of 1
    (measured speedup more than 5% from 1, predicted across it)."""
    out = []
    for prediction in PREDICTIONS:
        mine = [r for r in rows if r.prediction == prediction]
        for metric in METRICS:
            errors = np.array([abs(e) for r in mine if (e := r.error(metric)) is not None])
            if errors.size == 0 or (prediction == "cost model" and metric in ("speedup", "tokens_per_step")):
                continue
            entry = {"prediction": prediction, "metric": metric, "runs": int(errors.size),
                     "median": float(np.median(errors)), "p90": float(np.percentile(errors, 90)),
                     "worst": float(errors.max())}
            if metric == "speedup":
                decisive = [r for r in mine if r.measured["speedup"] is not None and abs(r.measured["speedup"] - 1) > 0.05]
                entry["decisive"] = len(decisive)
                entry["wrong_side"] = sum((r.measured["speedup"] > 1) != (r.predicted["speedup"] > 1) for r in decisive)
            out.append(entry)
    return out


def same_work_spread(runs: list[ServerRun]) -> dict | None:
    """How far apart this machine times the same work on two servers of one setting: at batch 1 in a
    closed loop every drafter's server prefills the same prompts one at a time, so the summed time
    to first token of two servers should be equal; their ratio is the floor under a measured
    speedup's error (a speedup too sets two servers against each other). Median and P90 of the
    slower over the faster, less 1, over the pairs, and the pairs; None without two such runs of
    one setting."""
    groups: dict[tuple, list[ServerRun]] = {}
    for run in runs:
        if not run.args.get("rate") and int(run.args.get("batch") or 0) == 1:
            groups.setdefault(run.setting, []).append(run)
    spreads = []
    for group in groups.values():
        prefill_s = {}
        for run in group:
            ttft = run.requests.sort_values("request").ttft_s.to_numpy(float)
            prefill_s.setdefault(len(ttft), []).append(float(ttft.sum()))
        for totals in prefill_s.values():        # only runs of the same prompts are compared
            spreads += [max(a, b) / min(a, b) - 1 for i, a in enumerate(totals) for b in totals[i + 1:]]
    out = {}
    if spreads:
        out = {"median": float(np.median(spreads)), "p90": float(np.percentile(spreads, 90)), "pairs": len(spreads)}
    bracket = bracket_spread(runs)
    if bracket is not None:
        out["bracket"] = bracket
    return out or None


def bracket_spread(runs: list[ServerRun]) -> dict | None:
    """How far apart a setting's two baselines are (`serve-live --bracket`: the same server, prompts
    and load before and after the speculative servers): the slower's throughput over the faster's,
    less 1, median and P90 over the settings, at every load. A measured speedup's denominator is
    their mean; None without bracketed settings."""
    baselines: dict[tuple, dict[bool, list[float]]] = {}
    for run in runs:
        if not run.speculative:
            passes = baselines.setdefault(run.setting, {False: [], True: []})
            passes[bool(run.args.get("after"))].append(float(run.summary["throughput_tok_s"]))
    # Only a bracket's own pair: one pass before and one after (not two studies of one setting).
    spreads = [max(p[False][0], p[True][0]) / min(p[False][0], p[True][0]) - 1
               for p in baselines.values() if len(p[False]) == 1 and len(p[True]) == 1]
    if not spreads:
        return None
    return {"median": float(np.median(spreads)), "p90": float(np.percentile(spreads, 90)), "settings": len(spreads)}


def same_work_line(spread: dict | None) -> str:
    if spread is None:
        return ""
    parts = []
    if "median" in spread:
        parts.append(f"The same work on two servers of a setting (batch 1: the same prompts' time to first token, "
                     f"summed): {spread['median']:.1%} apart median (P90 {spread['p90']:.1%}; {spread['pairs']} pairs "
                     f"of servers).")
    if (bracket := spread.get("bracket")) is not None:
        parts.append(f"A setting's two baselines, before and after its speculative servers: throughput "
                     f"{bracket['median']:.1%} apart median (P90 {bracket['p90']:.1%}; {bracket['settings']} settings).")
    return " ".join(parts)


def format_server_comparisons(rows: list[ServerComparison], spread: dict | None = None) -> str:
    pct = lambda x: "" if x is None else f"{x:+.1%}"
    num = lambda x, f: "" if x is None else format(x, f)
    lines = [f"{'run':<28} {'load':<9} {'prediction':<10} {'tok/s':>7} {'pred':>7} {'err':>7} {'speedup':>7} "
             f"{'pred':>6} {'err':>7} {'TTFT p50 err':>12} {'TPOT p50 err':>12} {'tok/step':>8} {'pred':>5}"]
    for r in rows:
        m, p = r.measured, r.predicted
        lines.append(f"{r.run[:28]:<28} {r.load:<9} {r.prediction:<10} {m['tok_s']:>7.2f} {p['tok_s']:>7.2f} "
                     f"{pct(r.error('tok_s')):>7} {num(m['speedup'], '.3f'):>7} {num(p['speedup'], '.3f'):>6} "
                     f"{pct(r.error('speedup')):>7} {pct(r.error('ttft_p50_ms')):>12} {pct(r.error('tpot_p50_ms')):>12} "
                     f"{m['tokens_per_step']:>8.2f} {p['tokens_per_step']:>5.2f}")
    lines += ["", f"{'prediction':<10} {'metric':<16} {'runs':>4} {'median':>7} {'P90':>7} {'worst':>7}   |error|"]
    for a in aggregate_server(rows):
        side = f"   wrong side of 1: {a['wrong_side']} of {a['decisive']}" if "decisive" in a else ""
        lines.append(f"{a['prediction']:<10} {a['metric']:<16} {a['runs']:>4} {a['median']:>7.1%} {a['p90']:>7.1%} "
                     f"{a['worst']:>7.1%}{side}")
    if spread is not None:
        lines += ["", same_work_line(spread)]
    return "\n".join(lines)


def server_markdown(rows: list[ServerComparison], command: str, spread: dict | None = None) -> str:
    """The docs tables: measured speedup with its predictions, a row per (prompt length, load) and a
    column per drafter; then the errors by prediction. Every run's figures are in validation.csv."""
    by_setting: dict[tuple, dict] = {}
    drafters = list(dict.fromkeys(r.drafter for r in rows if r.drafter != "none"))
    for r in rows:
        by_setting.setdefault((round(r.context), r.load), {}).setdefault(r.drafter, {})[r.prediction] = r
    lines = [f"Reproduce: `{command}`", "",
             "Speedup measured (predicted with the run's own acceptance / fitted on the other runs), and the "
             "measured tokens per step:", "",
             "| prompt tokens | load | " + " | ".join(drafters) + " |", "|---|---|" + "---|" * len(drafters)]
    for (context, load), by_drafter in by_setting.items():
        cells = []
        for drafter in drafters:
            preds = by_drafter.get(drafter, {})
            first = next(iter(preds.values()), None)
            if first is None or first.measured["speedup"] is None:
                cells.append("")
                continue
            guesses = " / ".join(f"{preds[p].predicted['speedup']:.2f}" for p in ("own", "fitted") if p in preds)
            cells.append(f"{first.measured['speedup']:.2f} ({guesses}); {first.measured['tokens_per_step']:.2f}")
        lines.append(f"| {context} | {load} | " + " | ".join(cells) + " |")
    summary = aggregate_server(rows)
    lines += ["", "|error| by prediction: median (P90, worst; runs)", "",
              "| prediction | " + " | ".join(METRICS) + " | wrong side of 1 |", "|---|" + "---|" * (len(METRICS) + 1)]
    for prediction in dict.fromkeys(a["prediction"] for a in summary):
        mine = {a["metric"]: a for a in summary if a["prediction"] == prediction}
        cells = [f"{a['median']:.1%} ({a['p90']:.1%}, {a['worst']:.1%}; {a['runs']})" if (a := mine.get(m)) else ""
                 for m in METRICS]
        speed = mine.get("speedup")
        side = f"{speed['wrong_side']} of {speed['decisive']}" if speed else ""
        lines.append(f"| {prediction} | " + " | ".join(cells) + f" | {side} |")
    if spread is not None:
        lines += ["", same_work_line(spread)]
    return "\n".join(lines)
