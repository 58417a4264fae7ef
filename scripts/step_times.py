"""Per-step times of live runs, as docs/validation-gpu.md tabulates them: the first step apart
(on a GPU it carries Triton's just-in-time compiles and CUDA's start, unless a warm-up took
them), then the median and P90 of the remaining steps, whose every row is one forward of the
whole batch; with --read-gb-s, the time one step takes to read the weights at that bandwidth (the
decoder layers and the LM head, in the run's dtype) and the median step over it; and the
engine the run recorded (CUDA graphs, launches per step, and what its timed passes waited on: graphs
captured and Triton kernel variants first launched, both zero after a proper warm-up). Below the
table, one line for each run whose measurement is suspect: something captured or compiled while
timed, or a synthetic run with more than 2% of its requests off their record (its acceptance is
then below the set rate: profiler/engine/synthetic.py). SpecPV without rectify commits what partial
attention chose, which may leave the record by design: its share is shown, not flagged.

    python scripts/step_times.py validation/gpu-h200/live/*/
    python scripts/step_times.py gpu-check-out/live --read-gb-s 3000     # a campaign folder: its runs
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def weight_read_ms(meta: dict, read_gb_s: float) -> float:
    """Milliseconds to read a step's weights once (every decoder layer's linears and the LM head;
    the embedding table is looked up, not read) at `read_gb_s`."""
    from sim.scenario.presets.models import ModelSpec

    config = meta["config"]
    spec = ModelSpec(**{k: config[k] for k in ("name", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn",
                                               "vocab", "tied_embeddings", "max_context")})
    element_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[meta["dtype"]]
    read_bytes = (spec.layers * spec.decoder_layer_params + spec.vocab * spec.hidden) * element_bytes
    return read_bytes / (read_gb_s * 1e9) * 1e3


def step_times(run: Path, read_gb_s: float | None = None) -> dict:
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
    meta = json.loads((run / "meta.json").read_text())
    execution = meta.get("execution") or {}
    row = {"run": run.name, "batch": summary["batch"], "method": summary["method"], "steps": len(per_step_s),
           "first_step_s": round(float(per_step_s.iloc[0]), 2), "median_step_ms": round(float(rest_ms.median()), 2),
           "p90_step_ms": round(float(rest_ms.quantile(0.9)), 2),
           "tokens_per_step": summary.get("tokens_per_step"),
           "throughput_tok_s": round(summary["throughput_tok_s"], 1),
           "graphs": execution.get("cuda_graphs"), "launches_per_step": execution.get("launches_per_step"),
           "captures_timed": execution.get("graph_captures_in_run"), "variants_timed": execution.get("kernel_variants_in_run"),
           "diverged": (round(summary["synthetic"]["diverged_requests"] / summary["requests"], 3)
                        if "synthetic" in summary else None),
           "approximate": meta["arguments"].get("budget") is not None and not meta["arguments"].get("rectify")}
    if read_gb_s is not None:
        read_ms = weight_read_ms(meta, read_gb_s)
        row["weight_read_ms"] = round(read_ms, 2)
        row["step_over_read"] = round(float(rest_ms.median()) / read_ms, 2)
    return row


# A synthetic run whose requests leave their record more often than this measures a lower acceptance
# than it was set to.
DIVERGED_LIMIT = 0.02


def suspect(row: dict) -> list[str]:
    """Why a run's times or acceptance are not what it set out to measure (empty: nothing)."""
    why = []
    if row.get("captures_timed"):
        why.append(f"{row['captures_timed']} CUDA graphs captured while timed")
    if row.get("variants_timed"):
        why.append(f"{row['variants_timed']} Triton kernel variants first launched (compiled) while timed")
    if row.get("diverged") is not None and row["diverged"] > DIVERGED_LIMIT and not row["approximate"]:
        why.append(f"{row['diverged']:.1%} of its requests left their record (over {DIVERGED_LIMIT:.0%}): "
                   f"acceptance below the set rate")
    return why


def main(argv: list[str]) -> int:
    read_gb_s = None
    if "--read-gb-s" in argv:
        at = argv.index("--read-gb-s")
        try:
            read_gb_s = float(argv[at + 1])
        except (IndexError, ValueError):
            print("error: --read-gb-s takes a bandwidth in GB/s", file=sys.stderr)
            return 2
        argv = argv[:at] + argv[at + 2:]
        if read_gb_s <= 0:          # gpu-check.sh writes 0 when its copy could not be measured
            read_gb_s = None
    runs = []
    for a in map(Path, argv):        # a campaign folder stands for its run folders
        runs += sorted(p.parent for p in a.glob("*/steps.parquet")) if not (a / "steps.parquet").exists() else [a]
    missing = [str(r) for r in runs if not (r / "steps.parquet").is_file() or not (r / "summary.json").is_file()]
    if not runs or missing:
        print(f"error: not a live run folder (steps.parquet and summary.json): {', '.join(missing) or 'none given'}",
              file=sys.stderr)
        return 2
    try:
        rows = [step_times(r, read_gb_s) for r in runs]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(pd.DataFrame(rows).sort_values(["batch", "method", "run"]).to_string(index=False))
    for row in rows:
        for why in suspect(row):
            print(f"SUSPECT {row['run']}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
