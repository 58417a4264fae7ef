"""Per-step times of live runs, as docs/validation-gpu.md tabulates them: the first step apart
(on a GPU it carries Triton's just-in-time compiles and CUDA's start), then the median and P90 of
the remaining steps, whose every row is one forward of the whole batch.

    python scripts/step_times.py validation/gpu-h200/live/*/
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def step_times(run: Path) -> dict:
    """One run's step table -> first step (s), median and P90 of the others (ms), its throughput."""
    steps = pd.read_parquet(run / "steps.parquet")
    steps = steps[steps["run"] == "speculative"] if "run" in steps else steps     # not the baseline's
    summary = json.loads((run / "summary.json").read_text())
    if summary.get("serving", "static") != "static" or steps.empty:
        raise ValueError(f"{run}: step times read static batches with steps only")
    # Step numbers restart with each static batch; the steps' rows are requests, in batches of `batch`.
    forward = [steps["request"] // summary["batch"], steps["step"]]
    per_step_s = steps.groupby(forward)[["draft_s", "verify_s", "selection_s", "other_s"]].max().sum(axis=1)
    rest_ms = per_step_s.iloc[1:] * 1e3
    return {"run": run.name, "batch": summary["batch"], "method": summary["method"], "steps": len(per_step_s),
            "first_step_s": round(float(per_step_s.iloc[0]), 2), "median_step_ms": round(float(rest_ms.median()), 1),
            "p90_step_ms": round(float(rest_ms.quantile(0.9)), 1),
            "tokens_per_step": summary.get("tokens_per_step"),
            "throughput_tok_s": round(summary["throughput_tok_s"], 1)}


def main(argv: list[str]) -> int:
    runs = [Path(a) for a in argv]
    missing = [str(r) for r in runs if not (r / "steps.parquet").is_file() or not (r / "summary.json").is_file()]
    if not runs or missing:
        print(f"error: not a live run folder (steps.parquet and summary.json): {', '.join(missing) or 'none given'}",
              file=sys.stderr)
        return 2
    try:
        table = pd.DataFrame([step_times(r) for r in runs]).sort_values(["batch", "method"])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
