"""`simulate(scenario) -> Result`: the speculative run and its baseline, on the same requests."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.acceptance import build_acceptance
from sim.formats.provenance import git_revision, repo_relative, versions
from sim.cost.memory import GB, plan_memory
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.lanes import build_lanes
from sim.pipeline import PipelineSimulation
from sim.pools import Disaggregated
from sim.result import Result, summarize
from sim.scenario.load import load_scenario
from sim.scenario.schema import Scenario
from sim.workload import Requests, build_requests


def simulate(scenario: Scenario | dict | str | Path, acceptance=None, baseline_cache: dict | None = None,
             baseline_only: bool = False) -> Result:
    """Simulate a scenario with speculation (if any) and without, and pair the two.

    acceptance: optionally, a function (scenario, requests, rng) -> AcceptanceModel used instead of
    the scenario's own acceptance (`sim validate` replays a live run's steps this way).
    baseline_cache: optionally, a dict shared across calls: a baseline already simulated (same
    baseline scenario, requests and memory plan) is taken from it instead of run again. A sweep's
    points that differ only in their speculation share one baseline this way; results are identical.
    baseline_only: run the baseline alone (planned exactly as beside the speculative run); the
    Result then has no speculative run (`sim capacity` searches the baseline's rate this way).

    Raises InputError (one line: field and reason) on bad input, before anything runs.
    """
    scenario = load_scenario(scenario)
    requests, planned = plan(scenario)
    if baseline_only:
        planned = planned[:1]

    runs, memories, warnings, origins = {}, {}, [], {}
    for name, config, stacks, memory in planned:
        key = None
        if name == "baseline" and baseline_cache is not None and acceptance is None:
            key = baseline_key(config, requests.max_tokens + scenario.speculation.verify_tokens)
            if key in baseline_cache:
                runs[name], memories[name], cost_warnings, origins[name] = baseline_cache[key]
                warnings += [w for w in cost_warnings if w not in warnings]
                continue
        record, cost = run_pipeline(config, requests, stacks, memory, acceptance)
        cost_warnings = list(cost.warnings)
        origins[name] = cost.origins()
        warnings += [w for w in cost_warnings if w not in warnings]
        runs[name] = (record, summarize(record, scenario))
        memories[name] = (memory, record)
        if key is not None:
            baseline_cache[key] = (runs[name], memories[name], cost_warnings, origins[name])

    base_memory, base_record = memories["baseline"]
    memory, record = memories.get("speculative", memories["baseline"])
    # A GPU's (with attention data parallel, the mean rank's: each holds its own requests' KV).
    ranks = scenario.data_parallel
    kv_gb = lambda mem, rec: (rec.peak_kv_tokens / ranks * mem.kv_bytes_per_token + mem.draft_window_kv_bytes) / GB
    memory_info = {
        "resident_layers": memory.resident_layers, "offloaded_layers": memory.offloaded_layers,
        "baseline_resident_layers": base_memory.resident_layers,
        "baseline_offloaded_layers": base_memory.offloaded_layers,
        "weights_resident_gb": memory.weight_bytes_resident / GB,
        "kv_capacity_tokens": memory.kv_capacity_tokens,
        "max_running": memory.max_running,
        "baseline_kv_capacity_tokens": base_memory.kv_capacity_tokens,
        "peak_kv_tokens": record.peak_kv_tokens, "baseline_peak_kv_tokens": base_record.peak_kv_tokens,
        "peak_kv_gb": kv_gb(memory, record), "baseline_peak_kv_gb": kv_gb(base_memory, base_record),
    }
    partial_info = None
    if scenario.speculation.partial_verify is not None and "speculative" in runs:
        partial_info = {
            "partial_accepted_tokens": record.partial_accepted_tokens,
            "divergent_tokens": record.divergent_tokens,
            "divergence_rate": record.divergent_tokens / max(int(requests.output_tokens.sum()), 1),
            "rolled_back_tokens": record.rolled_back_tokens,
            "partial_steps": record.partial_steps,
            "full_verifications": record.full_verifications,
        }
    speculative = runs["speculative"][1] if "speculative" in runs else None
    return Result(scenario, speculative, runs["baseline"][1], memory_info, partial_info,
                  provenance(scenario, warnings, origins.get("speculative") or origins.get("baseline")))



def plan(scenario: Scenario) -> tuple[Requests, list]:
    """The requests, and each configuration (baseline, then the speculative one) with its layer
    stacks and memory plan. A scenario that cannot run (weights that fit nowhere, ...) raises
    InputError here, before any engine runs: a sweep checks every point this way first."""
    requests = build_requests(scenario)
    concurrency = min(requests.closed_concurrency or len(requests), scenario.scheduler.max_batch)
    max_request_tokens = requests.max_tokens + scenario.speculation.verify_tokens
    configs = [("baseline", scenario.with_method_none())]
    if scenario.speculation.enabled:
        configs.append(("speculative", scenario))
    planned = []
    for name, config in configs:
        stacks = build_stacks(config)
        memory = plan_memory(config, stacks, max_request_tokens, concurrency)
        planned.append((name, config, stacks, memory))
    return requests, planned


def baseline_key(config: Scenario, max_request_tokens: int) -> str:
    """What a baseline run depends on: its scenario (speculation removed; the requests follow from
    its workload and seed) and the longest request its memory plan reserves, which includes the
    speculative configuration's verification tokens."""
    return f"{config.model_dump_json()}|{max_request_tokens}"


def run_pipeline(config: Scenario, requests: Requests, stacks, memory, build=None):
    """One SimPy run of one configuration, and the cost model that priced it; acceptance and
    engine draws seeded by the scenario. build: replaces build_acceptance (see simulate)."""
    cost = cost_model_for(config)
    acceptance = lanes = None
    if config.speculation.enabled:
        acceptance = (build or build_acceptance)(config, len(requests), np.random.default_rng([config.seed, 2]))
        if config.speculation.policy.second_drafters:
            # route, combine: the drafter beside the method, chosen per request and step; the lanes
            # draw each row's acceptance from its own drafter's
            acceptance = lanes = build_lanes(config, requests, acceptance, np.random.default_rng([config.seed, 4]))
    pipeline = PipelineSimulation(config, requests, cost, stacks, memory, acceptance,
                                  np.random.default_rng([config.seed, 3]), lanes=lanes)
    if isinstance(pipeline.arrivals, Disaggregated):     # the prefill pool's pricing, named too
        cost.warnings += [w for w in pipeline.arrivals.warnings if w not in cost.warnings]
    return pipeline.run(), cost


def bundle_provenance(path) -> dict:
    """Where a calibration bundle came from: its device, revision, date, dtype and held-out error
    (a published profile: its source, hardware and import)."""
    from sim.formats.bundle import load_bundle
    from sim.formats.published import is_published, load_published

    if is_published(path):
        profile = load_published(path)
        meta = profile.meta
        errors = [h["median_abs_error"] for h in meta["held_out"].values()]
        return {"path": repo_relative(path), "device": meta["hardware"], "source": profile.source,
                "git_revision": meta.get("git_revision"), "date": meta.get("created_utc"), "dtype": meta.get("dtype"),
                "held_out_median_error": max(errors) if errors else None}
    meta = load_bundle(path).meta
    return {"path": repo_relative(path), "device": meta["device"].get("name"), "git_revision": meta.get("git_revision"),
            "date": meta.get("date"), "dtype": meta.get("dtype"),
            "held_out_median_error": (meta.get("held_out") or {}).get("median_abs_error")}


def cost_model_name(scenario: Scenario, cost_origins: dict) -> str:
    """calibrated:BUNDLE, measured:GPU/FRAMEWORK/VERSION (the operator tables; +user:FOLDER where a
    user's own tables are laid over them) or roofline."""
    if scenario.calibration is not None:
        return f"calibrated:{repo_relative(scenario.calibration)}"
    tables = cost_origins.get("operator_tables")
    if tables:
        user = f"+user:{tables['user_tables']}" if tables.get("user_tables") else ""
        return f"measured:{tables['system']}/{tables['framework']}/{tables['version']}{user}"
    return "roofline"


def provenance(scenario: Scenario, warnings: list[str] | None = None, cost_origins: dict | None = None) -> dict:
    """cost_origins: where the speculative run's prices came from, per stack and for the host
    (sim/cost/model.py CostModel.origins; the baseline's when it alone ran from this call)."""
    bundle = None if scenario.calibration is None else bundle_provenance(scenario.calibration)
    return {
        "device": scenario.hardware_spec.name,
        "model": scenario.model_spec.name,
        "dtype": scenario.dtype,
        "engine": scenario.engine_spec.name,
        "cost_model": cost_model_name(scenario, cost_origins or {}),
        "calibration": bundle,
        "warnings": warnings or [],
        "cost_origins": cost_origins or {},
        "seed": scenario.seed,
        "git_revision": git_revision(),
        "versions": versions(),
    }
