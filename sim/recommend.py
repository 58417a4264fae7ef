"""`python -m sim recommend SCENARIO`: which speculation to run at each load, as the engines' config.

For each batch size (a closed loop of that many clients) and context, the scenario is simulated
without speculation, with every static k from 1 to --max-k, with goodput k per iteration, and with
the Oracle Proposal bound. Each batch's best static k (0: no speculation) makes a k_by_batch
schedule, ranges split at the geometric midpoints between the batches tried, which is simulated
too, and written as vLLM's `num_speculative_tokens_per_batch_size` (a `--speculative-config` JSON)
and, at the scenario's own load, as SGLang's flags.
"""
from __future__ import annotations

import copy
import json
import math

from sim.errors import InputError
from sim.scenario.engine_flags import launch_flags

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# vLLM's and SGLang's names of the drafters they ship (the simulator's others have none).
VLLM_METHODS = {"ngram": "ngram", "eagle": "eagle", "eagle3": "eagle3", "draft_model": "draft_model",
                "mtp": "mtp", "medusa": "medusa"}
SGLANG_ALGORITHMS = {"ngram": "NGRAM", "eagle": "EAGLE", "eagle3": "EAGLE3", "draft_model": "STANDALONE",
                     "mtp": "EAGLE"}
DRAFT_PATH = "DRAFT_MODEL_PATH"      # what the user replaces: the scenario names no checkpoint


def recommend(mapping: dict, batches: list[int] | None = None, contexts: list[int] | None = None,
              max_k: int | None = None) -> dict:
    """The table of (context, batch) cells, the schedule and the engines' config (a JSON-ready dict)."""
    from sim.scenario.load import load_scenario
    from sim.simulate import simulate

    scenario = load_scenario(mapping)
    spec = scenario.speculation
    if not spec.enabled:
        raise InputError("speculation.method", "recommend compares speculation settings: give a method")
    if spec.tree is not None or spec.partial_verify is not None:
        raise InputError("speculation", "recommend chooses a chain's k: give no tree or partial_verify")
    batches = sorted(set(batches or DEFAULT_BATCHES))
    if batches[0] < 1:
        raise InputError("--batches", f"batch sizes must be >= 1 (got {batches[0]})")
    a = spec.acceptance
    if a.tokens_per_step is not None:
        raise InputError("speculation.acceptance", "recommend varies k: give a rate or per_position rates "
                                                   "(tokens_per_step holds for one k only)")
    max_k = max_k or max(spec.num_speculative_tokens, 6)
    if max_k < 1:
        raise InputError("--max-k", f"must be >= 1 (got {max_k})")
    if a.per_position is not None and max_k > len(a.per_position):
        raise InputError("--max-k", f"{max_k} drafts need as many per_position rates (the scenario gives "
                                    f"{len(a.per_position)})")
    own_k = spec.num_speculative_tokens
    contexts = contexts or [None]
    cache: dict = {}

    def speedup(context, batch, **speculation):
        point = at_load(mapping, batch, context)
        point["speculation"] = {**point["speculation"], **speculation}
        return simulate(point, baseline_cache=cache).speedup

    cells = []
    for context in contexts:
        for batch in batches:
            static = {k: speedup(context, batch, num_speculative_tokens=k, policy="static") for k in range(1, max_k + 1)}
            best_k = max(static, key=static.get)
            best = static[best_k]
            if best < 1.0:
                best_k, best = 0, 1.0
            cells.append({"context": context, "batch": batch, "best_k": best_k, "best_speedup": best,
                          "static_speedup": static, "own_k_speedup": static.get(own_k) or speedup(
                              context, batch, num_speculative_tokens=own_k, policy="static"),
                          "goodput_speedup": speedup(context, batch, num_speculative_tokens=max_k, policy="goodput"),
                          "oracle_speedup": speedup(context, batch, num_speculative_tokens=max_k, policy="oracle")})
    schedule = batch_schedule(cells, batches, scenario.scheduler.max_batch)
    drafts = max(k for _, _, k in schedule)
    for cell in cells:
        cell["schedule_speedup"] = (speedup(cell["context"], cell["batch"], num_speculative_tokens=drafts,
                                            policy={"k_by_batch": schedule}) if drafts else 1.0)
    own_batch = own_load(scenario, batches)
    own_cells = [c for c in cells if c["batch"] == own_batch]
    own_best = round(sum(c["best_k"] for c in own_cells) / len(own_cells))
    return {"method": spec.method, "hardware": scenario.hardware_spec.name, "model": scenario.model_spec.name,
            "scenario_k": own_k, "max_k": max_k, "cells": cells, "schedule": schedule,
            "vllm": vllm_config(spec.method, schedule), "sglang": sglang_flags(spec.method, own_best),
            "sglang_batch": own_batch, "layout": launch_flags(scenario)}


def at_load(mapping: dict, batch: int, context: int | None) -> dict:
    """The scenario as a closed loop of `batch` clients (at least the scenario's requests, and two
    waves), at `context` prompt tokens when given."""
    point = copy.deepcopy(mapping)
    workload = point.setdefault("workload", {})
    requests = max(int(workload.get("requests", 200)), 2 * batch)
    workload.update(arrival="closed", concurrency=batch, requests=requests)
    workload.pop("rate_qps", None)
    if context is not None:
        workload["prompt_tokens"] = context
    point.setdefault("scheduler", {})["max_batch"] = max(batch, int(point.get("scheduler", {}).get("max_batch", 256)))
    return point


def batch_schedule(cells: list[dict], batches: list[int], max_batch: int) -> list[list[int]]:
    """[first, last, k] ranges: each batch tried covers the batch sizes up to the geometric midpoint
    with the next; its k is the best static k, the mean over the contexts rounded; ranges with the
    same k merge."""
    ks = {}
    for batch in batches:
        own = [c["best_k"] for c in cells if c["batch"] == batch]
        ks[batch] = round(sum(own) / len(own))
    ranges: list[list[int]] = []
    first = 1
    for i, batch in enumerate(batches):
        last = max(max_batch, batch) if i == len(batches) - 1 else max(batch, math.isqrt(batch * batches[i + 1]))
        if ranges and ranges[-1][2] == ks[batch]:
            ranges[-1][1] = last
        else:
            ranges.append([first, last, ks[batch]])
        first = last + 1
    return ranges


def own_load(scenario, batches: list[int]) -> int:
    """The batch tried nearest the scenario's own closed-loop concurrency (the first one otherwise)."""
    own = scenario.workload.concurrency if scenario.workload.arrival == "closed" else None
    if own is None:
        return batches[0]
    return min(batches, key=lambda b: (abs(math.log(b / own)), b))


def vllm_config(method: str, schedule: list[list[int]]) -> dict | None:
    """vLLM's --speculative-config for the schedule, or None for a drafter vLLM does not ship."""
    method = VLLM_METHODS.get(method)
    if method is None:
        return None
    drafts = max(k for _, _, k in schedule)
    if drafts == 0:
        return {}
    config: dict = {"method": method}
    if method in ("eagle", "eagle3", "draft_model", "medusa"):
        config["model"] = DRAFT_PATH
    config["num_speculative_tokens"] = drafts
    if len(schedule) > 1:
        config["num_speculative_tokens_per_batch_size"] = schedule
    return config


def sglang_flags(method: str, k: int) -> str | None:
    """SGLang's server flags for a chain of k (SGLang has no per-batch schedule), or None."""
    algorithm = SGLANG_ALGORITHMS.get(method)
    if algorithm is None:
        return None
    if k == 0:
        return ""
    flags = f"--speculative-algorithm {algorithm}"
    if method in ("eagle", "eagle3", "draft_model"):
        flags += f" --speculative-draft-model-path {DRAFT_PATH}"
    if method == "ngram":
        return flags + f" --speculative-num-draft-tokens {k + 1}"
    return flags + f" --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"


def format_recommendation(out: dict) -> str:
    own = out["scenario_k"]
    lines = [f"{out['method']} on {out['hardware']}, {out['model']}: speedup over no speculation at each load "
             f"(closed loop of `batch` clients); static k from 1 to {out['max_k']}",
             f"{'context':>8} {'batch':>6} {'best k':>6} {'speedup':>8} {'k=' + str(own):>8} {'goodput':>8} "
             f"{'oracle':>8} {'schedule':>8} {'vs none':>8} {'vs k=' + str(own):>8}"]
    for c in out["cells"]:
        context = "scenario" if c["context"] is None else str(c["context"])
        lines.append(f"{context:>8} {c['batch']:>6} {c['best_k']:>6} {c['best_speedup']:>7.3f}x "
                     f"{c['own_k_speedup']:>7.3f}x {c['goodput_speedup']:>7.3f}x {c['oracle_speedup']:>7.3f}x "
                     f"{c['schedule_speedup']:>7.3f}x {c['best_speedup'] - 1:>+8.1%} "
                     f"{c['best_speedup'] / c['own_k_speedup'] - 1:>+8.1%}")
    schedule = ", ".join(f"batch {a}-{b}: k={k}" for a, b, k in out["schedule"])
    lines.append(f"schedule (best static k per batch, ranges split between the batches tried): {schedule}")
    if out["vllm"] is None:
        lines.append(f"vLLM: no {out['method']} drafter")
    elif not out["vllm"]:
        lines.append("vLLM: no speculation at any batch tried (leave --speculative-config unset)")
    else:
        lines.append(f"vLLM: --speculative-config '{json.dumps(out['vllm'])}'")
    if out["sglang"] is None:
        lines.append(f"SGLang: no {out['method']} drafter")
    else:
        flags = out["sglang"] or "(no speculation)"
        lines.append(f"SGLang at batch {out['sglang_batch']} (no per-batch schedule): {flags}")
    lines.append(f"layout, vLLM: {out['layout']['vllm']}")
    lines.append(f"layout, SGLang: {out['layout']['sglang']}")
    return "\n".join(lines)
