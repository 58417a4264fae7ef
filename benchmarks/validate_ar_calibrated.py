"""Autoregressive decoding throughput predicted with a calibration bundle, against live runs.

    python benchmarks/validate_ar_calibrated.py --text ../shared/data/pride_and_prejudice.txt

Runs `profiler live --method none` (SmolLM2, fp32) at batch 1 and 8, on long-context prompts cut
from a text (every prompt exactly --context tokens, so a batch has no padding) and on the packaged
chat prompts (ragged lengths), each with `--probe` (two fixed forwards timed before and after the
run), then `python -m sim validate` on the runs with the bundle, and prints measured and predicted
throughput and the error: the bundle's prediction ("cost model") and the same put at the machine's
speed the probes measured ("cost model @ probe", sim/machine_speed.py; runs made without probes
have only the first). Each live setting runs --repeats times; the table keeps each run, the
summary lines give the median error per prediction and batch size over the runs, and then over the
settings, each measured by the median of its repeats.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def live(out: Path, batch: int, requests: int, max_new: int, context: int | None, text: Path | None) -> None:
    argv = [sys.executable, "-m", "profiler", "live", "--method", "none", "--batch", str(batch),
            "--limit", str(requests), "--max-new-tokens", str(max_new), "--probe", "--out", str(out)]
    if context is not None:
        argv += ["--context", str(context), "--text", str(text)]
    subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=ROOT / "calibration" / "cpu" / "smollm2-135m")
    parser.add_argument("--text", type=Path, help="a long text for the fixed-length prompts (skipped without)")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, help="keep the live runs here (default: a temporary folder)")
    args = parser.parse_args()

    settings = [(1, 2, None), (8, 8, None)]
    if args.text is not None:
        settings = [(1, 2, args.context), (8, 8, args.context)] + settings
    with tempfile.TemporaryDirectory() as scratch:
        root = args.out or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        runs = []
        for repeat in range(args.repeats):
            for batch, requests, context in settings:
                name = f"{'context' + str(context) if context else 'chat'}-b{batch}-r{repeat}"
                run = root / name
                if not run.exists():
                    live(run, batch, requests, args.max_new_tokens, context, args.text)
                runs.append((batch, run))
        out = subprocess.run([sys.executable, "-m", "sim", "validate", *(str(r) for _, r in runs),
                              "--calibration", str(args.bundle), "--out", str(root / "validation")],
                             capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        print(out.stdout)
        rows = read_validation_rows(root / "validation" / "validation.csv")
        for prediction in sorted({r["prediction"] for r in rows}):
            for batch in sorted({b for b, _ in runs}):
                errors = [abs(float(r["tok_s_error"])) for r in rows
                          if int(r["batch"]) == batch and r["prediction"] == prediction]
                print(f"{prediction}, batch {batch}: median |error| {statistics.median(errors):.1%}, "
                      f"worst {max(errors):.1%} over {len(errors)} runs")
        print_median_of_repeats(rows)
        print_decode_forwards([r for _, r in runs], args.bundle)
    return 0


def print_decode_forwards(run_dirs: list[Path], bundle: Path) -> None:
    """Per setting and per batch size alive, the live engine's decode forward (each run's median
    over those steps, then the median and range over the repeats) at their median KV, against the
    bundle's price of that forward: where a throughput error comes from, step by step. A static
    batch shrinks as its requests finish (the chat prompts' batch of 8 decodes its last 41 steps
    at batch 3), and on this CPU a forward at batch 3 or 6 can cost more than one at batch 8."""
    import pandas as pd

    from profiler.engine_fits import predicted_forward
    from sim.cost.calibrated import cost_model_for
    from sim.cost.stack import build_stacks
    from sim.scenario import load_scenario

    scenario = load_scenario({"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32",
                              "calibration": str(bundle)})
    cost, target = cost_model_for(scenario), build_stacks(scenario).target
    by_phase: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    for run in run_dirs:
        batch_size = json.loads((run / "summary.json").read_text())["batch"]
        steps = pd.read_parquet(run / "steps.parquet")
        # Requests are numbered across the run and steps within each static batch, whose requests
        # share each step's forward (one row per request alive).
        steps = steps[steps.step > 0].assign(static_batch=lambda s: s.request // batch_size)
        per_step = steps.groupby(["static_batch", "step"]).agg(seconds=("verify_s", "first"),
                                                               kv=("kv_tokens", "max"), alive=("kv_tokens", "size"))
        for alive, phase in per_step.groupby("alive"):
            by_phase.setdefault((run.name.rsplit("-r", 1)[0], int(alive)), []).append(
                (float(phase.seconds.median()), float(phase.kv.median()), len(phase)))
    print("\ndecode forwards, live (median of each run's steps at that batch) against the bundle's price:")
    for (setting, alive), values in sorted(by_phase.items(), key=lambda item: (item[0][0], -item[0][1])):
        seconds = [v[0] for v in values]
        kv = statistics.median(v[1] for v in values)
        priced = predicted_forward(cost, target, alive, 1, kv)
        print(f"  {setting:<14} batch {alive:>2}, {statistics.median(v[2] for v in values):3.0f} steps, about "
              f"{kv:5.0f} KV tokens: live {statistics.median(seconds) * 1e3:6.1f} ms "
              f"(runs {min(seconds) * 1e3:.1f}-{max(seconds) * 1e3:.1f}), priced {priced * 1e3:6.1f} ms")


def read_validation_rows(path: Path) -> list[dict]:
    """The rows of `sim validate`'s validation.csv (its provenance comment line skipped)."""
    import csv

    with path.open() as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def median_of_repeats(rows: list[dict]) -> dict[tuple[str, int, str], tuple[float, float, int]]:
    """(prediction, batch, setting) -> the median measured and the median predicted tok/s over the
    setting's repeats (its runs SETTING-rN), and how many repeats."""
    by_setting: dict[tuple, list[dict]] = {}
    for r in rows:
        by_setting.setdefault((r["prediction"], int(r["batch"]), r["run"].rsplit("-r", 1)[0]), []).append(r)
    return {key: (statistics.median(float(r["measured_tok_s"]) for r in group),
                  statistics.median(float(r["predicted_tok_s"]) for r in group), len(group))
            for key, group in sorted(by_setting.items())}


def print_median_of_repeats(rows: list[dict]) -> None:
    """Each setting's median repeat against the median prediction: one run of this VM lands several
    percent from the next (slow spells), so a setting is measured by the median of its repeats, as
    the validation study measures each of its runs (sim.live_runs.merge_repeats)."""
    print("\nmedian of the repeats, per setting:")
    summary: dict[tuple, list[float]] = {}
    for (prediction, batch, setting), (measured, predicted, repeats) in median_of_repeats(rows).items():
        error = predicted / measured - 1
        summary.setdefault((prediction, batch), []).append(abs(error))
        print(f"  {prediction:<20} batch {batch:>2} {setting:<14} measured {measured:7.2f} tok/s over {repeats} "
              f"repeats, predicted {predicted:7.2f}, error {error:+.1%}")
    for (prediction, batch), errors in sorted(summary.items()):
        print(f"{prediction}, batch {batch}, median of repeats: median |error| {statistics.median(errors):.1%}, "
              f"worst {max(errors):.1%} over {len(errors)} settings")


if __name__ == "__main__":
    raise SystemExit(main())
