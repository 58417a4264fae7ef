"""How close can any prediction come to issue 5's check on this machine? Live against live.

    python benchmarks/ar_check_floor.py CHECK CHECK [CHECK ...]

Each CHECK is a folder of `benchmarks/validate_ar_calibrated.py --out` (runs named
SETTING-bBATCH-rREPEAT, and the check's own validation/validation.csv). The check measures each
setting by the median of its repeats and takes, per batch size, the median over the settings of
|predicted / measured - 1|. This benchmark puts one check's measured medians in the place of the
prediction for another check of the same settings: a predictor that knew the earlier runs exactly,
so whatever it misses is the machine moving between the two checks, not the cost model. Printed
per pair of checks and batch size, next to each check's own cost-model error (from its
validation.csv). Compare checks of one VM only: a new VM is another machine. Only reads the folders.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_ar_calibrated import median_of_repeats, read_validation_rows  # noqa: E402  (the check's own reading)


def read_setting_medians(check: Path) -> dict[tuple[int, str], float]:
    """(batch, setting) -> the median over the setting's repeats of the measured tok/s."""
    by_setting: dict[tuple[int, str], list[float]] = {}
    for summary_path in sorted(check.glob("*-b*-r*/summary.json")):
        summary = json.loads(summary_path.read_text())
        setting = summary_path.parent.name.rsplit("-r", 1)[0]
        by_setting.setdefault((int(summary["batch"]), setting), []).append(float(summary["throughput_tok_s"]))
    return {key: statistics.median(values) for key, values in by_setting.items()}


def read_model_errors(check: Path) -> dict[int, float]:
    """Per batch size, the check's figure for the bundle's prediction ("cost model"): the median
    over settings of |median predicted / median measured - 1|, as validate_ar_calibrated prints it."""
    path = check / "validation" / "validation.csv"
    if not path.exists():
        return {}
    per_batch: dict[int, list[float]] = {}
    for (prediction, batch, _), (measured, predicted, _) in median_of_repeats(read_validation_rows(path)).items():
        if prediction == "cost model":
            per_batch.setdefault(batch, []).append(abs(predicted / measured - 1))
    return {batch: statistics.median(errors) for batch, errors in per_batch.items()}


def live_to_live_errors(earlier: dict, later: dict) -> dict[int, list[tuple[str, float]]]:
    """Per batch size, each shared setting's error were `earlier` the prediction of `later`."""
    per_batch: dict[int, list[tuple[str, float]]] = {}
    for key in sorted(set(earlier) & set(later)):
        per_batch.setdefault(key[0], []).append((key[1], earlier[key] / later[key] - 1))
    return per_batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checks", type=Path, nargs="+", help="folders of validate_ar_calibrated.py --out, in time order")
    args = parser.parse_args()
    if len(args.checks) < 2:
        print("error: give at least two check folders", file=sys.stderr)
        return 2
    medians = {}
    for check in args.checks:
        medians[check] = read_setting_medians(check)
        if not medians[check]:
            print(f"error: {check} has no runs (SETTING-bBATCH-rREPEAT/summary.json)", file=sys.stderr)
            return 2

    print("each check, per batch size: the cost model's error (median over settings of the median repeat)")
    for check in args.checks:
        model = read_model_errors(check)
        cells = ", ".join(f"batch {b} {e:.1%}" for b, e in sorted(model.items())) or "no validation.csv"
        print(f"  {check}: {cells}")

    print("\nlive against live: the earlier check's medians as the prediction of the later one's")
    floor: dict[int, list[float]] = {}
    for earlier, later in itertools.combinations(args.checks, 2):
        for batch, errors in sorted(live_to_live_errors(medians[earlier], medians[later]).items()):
            figure = statistics.median(abs(e) for _, e in errors)
            floor.setdefault(batch, []).append(figure)
            settings = ", ".join(f"{setting} {error:+.1%}" for setting, error in errors)
            print(f"  {earlier.name} -> {later.name}, batch {batch}: {figure:.1%} ({settings})")
    if not floor:
        print("error: the checks share no setting", file=sys.stderr)
        return 2
    print("\nper batch size over the pairs: median (range) of the live-against-live figure")
    for batch, figures in sorted(floor.items()):
        print(f"  batch {batch}: {statistics.median(figures):.1%} ({min(figures):.1%}-{max(figures):.1%}) "
              f"over {len(figures)} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
