"""Per-step times of live runs, as docs/validation-gpu.md tabulates them: the first step apart
(on a GPU it carries Triton's just-in-time compiles and CUDA's start, unless a warm-up took
them), then the median and P90 of the remaining steps, whose every row is one forward of the
whole batch; with --read-gb-s, the time one step takes to read the weights at that bandwidth (the
decoder layers and the LM head, in the run's dtype) and the median step over it; and the
engine the run recorded (CUDA graphs, launches per step).

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
           "graphs": execution.get("cuda_graphs"), "launches_per_step": execution.get("launches_per_step")}
    if read_gb_s is not None:
        read_ms = weight_read_ms(meta, read_gb_s)
        row["weight_read_ms"] = round(read_ms, 2)
        row["step_over_read"] = round(float(rest_ms.median()) / read_ms, 2)
    return row


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
    runs = []
    for a in map(Path, argv):        # a campaign folder stands for its run folders
        runs += sorted(p.parent for p in a.glob("*/steps.parquet")) if not (a / "steps.parquet").exists() else [a]
    missing = [str(r) for r in runs if not (r / "steps.parquet").is_file() or not (r / "summary.json").is_file()]
    if not runs or missing:
        print(f"error: not a live run folder (steps.parquet and summary.json): {', '.join(missing) or 'none given'}",
              file=sys.stderr)
        return 2
    try:
        table = pd.DataFrame([step_times(r, read_gb_s) for r in runs]).sort_values(["batch", "method", "run"])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
