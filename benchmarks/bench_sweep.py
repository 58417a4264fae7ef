"""Sweep throughput (issue 7's targets: a 1,000-point study of 200-request scenarios at concurrency 16,
speculative run and baseline each, in at most 2 minutes with the local executor on the 2-core CI
machine; the default study, `python -m sim sweep`, in at most 3 minutes).

The 1,000 points: 5 GPUs (h100-sxm, h200, a100-80g, h100-pcie, l40) x 5 prompt lengths (256-4,096
tokens) x 40 speculative configurations (EAGLE k 1-5 at acceptance 0.5-0.8; n-gram k 2-5 at 0.3 and
0.5; an int4 shadow k 2 and 4 at 0.8 and 0.9; a streaming self-draft k 2-5 at 0.7 and 0.8), Llama-3.1-8B,
166 output tokens. Every point's row carries its own baseline; points that share one (same scenario
but for the speculation and the same k) reuse it within a worker, and the figure says how many
distinct baselines were simulated; the study is timed again with every baseline simulated afresh
(`--no-baseline-reuse`), and the two tables compared. Timed: the whole `python -m sim sweep` command (process start,
checking every point, the pool, the Parquet table and the HTML report).

Run: python benchmarks/bench_sweep.py [--workers 2] [--limit N] [--skip-default]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

STUDY = {
    "name": "bench-1000",
    "base": {"model": "llama-3.1-8b", "engine": "vllm", "seed": 0,
             "workload": {"arrival": "closed", "concurrency": 16, "requests": 200, "output_tokens": 166}},
    "grid": {"hardware": ["h100-sxm", "h200", "a100-80g", "h100-pcie", "l40"],
             "workload.prompt_tokens": [256, 512, 1024, 2048, 4096]},
    "methods": [
        {"name": "eagle", "set": {"speculation": {"method": "eagle"}},
         "grid": {"speculation.num_speculative_tokens": [1, 2, 3, 4, 5],
                  "speculation.acceptance": [{"rate": r} for r in (0.5, 0.6, 0.7, 0.8)]}},
        {"name": "ngram", "set": {"speculation": {"method": "ngram"}},
         "grid": {"speculation.num_speculative_tokens": [2, 3, 4, 5],
                  "speculation.acceptance": [{"rate": r} for r in (0.3, 0.5)]}},
        {"name": "shadow", "set": {"speculation": {"method": "shadow", "draft": {"bits": 4}}},
         "grid": {"speculation.num_speculative_tokens": [2, 4],
                  "speculation.acceptance": [{"rate": r} for r in (0.8, 0.9)]}},
        {"name": "streaming", "set": {"speculation": {"method": "streaming", "draft": {"kv_budget": 512}}},
         "grid": {"speculation.num_speculative_tokens": [2, 3, 4, 5],
                  "speculation.acceptance": [{"rate": r} for r in (0.7, 0.8)]}},
    ],
}


def timed_sweep(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sim", "sweep", *args, "--quiet"], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, help="a quick check: one GPU, one prompt length, EAGLE at k = 1..N (x 4 rates)")
    parser.add_argument("--skip-default", action="store_true", help="do not time the default study")
    args = parser.parse_args()

    from sim.scenario.load import load_scenario
    from sim.simulate import baseline_key
    from sim.sweep.study import expand_points, load_study
    from sim.sweep.store import read_table

    study = STUDY
    if args.limit:
        study = json.loads(json.dumps(STUDY))
        study["grid"] = {"hardware": ["h100-sxm"], "workload.prompt_tokens": [1024]}
        study["methods"] = study["methods"][:1]
        study["methods"][0]["grid"]["speculation.num_speculative_tokens"] = list(range(1, args.limit + 1))
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(yaml.safe_dump(study))
        points = expand_points(load_study(path))
        baselines = set()
        for point in points:
            scenario = load_scenario(point.scenario)
            tokens = max(scenario.workload.prompt_tokens if isinstance(scenario.workload.prompt_tokens, int) else 0, 0)
            baselines.add(baseline_key(scenario.with_method_none(),
                                       tokens + scenario.workload.output_tokens + scenario.speculation.verify_tokens))
        seconds = timed_sweep([str(path), "--out", str(Path(tmp) / "out"), "--workers", str(args.workers)])
        frame, provenance = read_table(Path(tmp) / "out" / "results.parquet")
        fresh = timed_sweep([str(path), "--out", str(Path(tmp) / "fresh"), "--workers", str(args.workers),
                             "--no-baseline-reuse"])
        same = frame.equals(read_table(Path(tmp) / "fresh" / "results.parquet")[0])
        report["study_1000"] = {
            "points": len(frame), "requests_per_point": 200, "concurrency": 16, "workers": args.workers,
            "seconds": round(seconds, 1), "points_per_s": round(len(frame) / seconds, 1),
            "pool_seconds": provenance["seconds"], "distinct_baselines": len(baselines),
            "seconds_without_baseline_reuse": round(fresh, 1), "identical_without_reuse": same,
            "target_seconds": 120, "met": seconds <= 120,
            "speedup_range": [round(float(frame.speedup.min()), 3), round(float(frame.speedup.max()), 3)],
        }
        if not args.skip_default:
            seconds = timed_sweep(["--out", str(Path(tmp) / "default"), "--workers", str(args.workers)])
            frame, provenance = read_table(Path(tmp) / "default" / "results.parquet")
            report["default_study"] = {"points": len(frame), "workers": args.workers, "seconds": round(seconds, 1),
                                       "pool_seconds": provenance["seconds"], "target_seconds": 180,
                                       "met": seconds <= 180}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
