"""Simulated engine iterations per second (issue 2's target: >= 50,000 on one core of the CI machine).

The scenario: 1,000 requests, closed loop at concurrency 64, Llama-3.1-8B on h100-sxm, an EAGLE head
with k = 3 and i.i.d. acceptance 0.7; `simulate` runs the speculative run and its baseline, and both
runs' iterations count. Reported: the best of --repeats timings of the whole `simulate` call
(scenario validation, request sampling and metrics included) and, separately, of the engine runs
alone. Run: python benchmarks/bench_sim_iterations.py
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import sim
from sim.cost.memory import plan_memory
from sim.cost.stack import build_stacks
from sim.simulate import run_engine
from sim.workload import build_requests

SCENARIO = {
    "hardware": "h100-sxm", "model": "llama-3.1-8b", "engine": "vllm",
    "workload": {"arrival": "closed", "concurrency": 64, "requests": 1000,
                 "prompt_tokens": 94, "output_tokens": 166},
    "speculation": {"method": "eagle", "num_speculative_tokens": 3, "acceptance": {"rate": 0.7}},
    "seed": 0,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # one core

    scenario = sim.load_scenario(SCENARIO)
    result = sim.simulate(scenario)
    iterations = result.run.iterations + result.baseline.iterations
    whole = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        sim.simulate(scenario)
        whole.append(time.perf_counter() - start)

    requests = build_requests(scenario)
    configs = [scenario.with_method_none(), scenario]
    prepared = []
    for config in configs:
        stacks = build_stacks(config)
        prepared.append((config, stacks, plan_memory(config, stacks, requests.max_tokens + 4, 64)))
    engine_only = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for config, stacks, memory in prepared:
            run_engine(config, requests, stacks, memory)
        engine_only.append(time.perf_counter() - start)

    report = {
        "iterations": iterations,
        "simulate_s": min(whole),
        "iterations_per_s": iterations / min(whole),
        "engine_only_iterations_per_s": iterations / min(engine_only),
        "median_iterations_per_s": iterations / float(np.median(whole)),
        "speedup": result.speedup,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
