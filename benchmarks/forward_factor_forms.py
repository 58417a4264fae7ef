"""Which form of the whole-forward factor predicts live runs better: the measured ratios (the cost
model's, sim/cost/bundle.py) or the plane a + b log2(tokens) + c log2(KV) fitted through them (the
cost model's until 2026-12-01)?

    python benchmarks/forward_factor_forms.py --bundles calibration/cpu/repeats/smollm2-135m-0159 \\
        calibration/cpu/repeats/smollm2-135m-0450 calibration/cpu/smollm2-135m \\
        --studies validation/cpu-default validation/cpu-default-0417 --ar validation/ar-cpu validation/ar-cpu-2

For every bundle and every set of runs, the runs predicted with each form (`sim.validate.compare_runs`,
repeats merged as `sim validate` merges them) and the median |error|: for a study, of the
autoregressive runs, and of replayed and fitted throughput and speedup; for a folder of
`benchmarks/validate_ar_calibrated.py` runs, each setting's median repeat against its prediction.
Only reads bundles and run folders (about 3 s per bundle and study on 2 cores).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.cost.bundle import Bundle  # noqa: E402  (after the path: run as a script from anywhere)

# The cost model's own form, kept before `use_form` swaps it.
MEASURED_FACTOR = Bundle.forward_factor


def plane_through(bundle):
    """The least-squares plane in (log2 tokens, log2 KV) through the bundle's measured ratios."""
    import numpy as np

    from sim.cost.table import OperatorTable

    fit = bundle.factor_fit("forward_factor", ("tokens", "kv"))
    if fit is None:
        return None
    (tokens, kv), measured = fit
    x, y = np.meshgrid(np.log2(tokens), np.log2(kv), indexing="ij")
    design = np.stack([np.ones(x.size), x.ravel(), y.ravel()], axis=1)
    coef, *_ = np.linalg.lstsq(design, measured.ravel(), rcond=None)
    plane = np.maximum((design @ coef).reshape(measured.shape), 1e-3)
    return OperatorTable("forward_factor", ("tokens", "kv"), [tokens, kv], plane, power_above=0.0)


def use_form(form: str) -> None:
    """Make every bundle loaded from now on price forwards with `form` ("table" or "plane")."""
    import sim.cost.bundle as bundle_module

    bundle_module.Bundle.forward_factor = MEASURED_FACTOR if form == "table" else plane_through
    bundle_module._load.cache_clear()


def run_folders(root: Path) -> list[Path]:
    return [p.parent for p in sorted(root.rglob("summary.json"))]


def study_errors(rows) -> dict[str, float]:
    def median_error(prediction: str, metric: str) -> float:
        errors = [abs(r.error(metric)) for r in rows if r.prediction == prediction and r.error(metric) is not None]
        return statistics.median(errors) if errors else float("nan")

    return {"autoregressive": median_error("cost model", "tok_s"),
            "replay tok/s": median_error("replay", "tok_s"), "replay speedup": median_error("replay", "speedup"),
            "fitted tok/s": median_error("fitted", "tok_s"), "fitted speedup": median_error("fitted", "speedup")}


def ar_errors(rows) -> dict[str, float]:
    """Each setting (run name without its -rN) by its median repeat against the median prediction."""
    settings: dict[str, list] = {}
    for r in rows:
        if r.prediction == "cost model":
            settings.setdefault(r.run.rsplit("-r", 1)[0], []).append(r)
    return {name: statistics.median(r.predicted_tok_s for r in group) /
            statistics.median(r.measured_tok_s for r in group) - 1 for name, group in sorted(settings.items())}


def main() -> int:
    import warnings

    from sim.live_runs import read_runs
    from sim.validate import compare_runs

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundles", type=Path, nargs="+", required=True)
    parser.add_argument("--studies", type=Path, nargs="*", default=[], help="folders of validation-study runs")
    parser.add_argument("--ar", type=Path, nargs="*", default=[],
                        help="folders of benchmarks/validate_ar_calibrated.py runs")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    for folder in [*args.bundles, *args.studies, *args.ar]:
        if not folder.is_dir():
            print(f"error: no such folder: {folder}", file=sys.stderr)
            return 2
    runs = {folder: read_runs(run_folders(folder)) for folder in [*args.studies, *args.ar]}
    # A study's cells are median |error|; an AR check's are each setting's signed error.
    jobs = [(folder, study_errors, "{:.1%}") for folder in args.studies] + \
           [(folder, ar_errors, "{:+.1%}") for folder in args.ar]
    for bundle in args.bundles:
        for folder, errors_of, percent in jobs:
            cells = {}
            for form in ("plane", "table"):
                use_form(form)
                cells[form] = errors_of(compare_runs(runs[folder], bundle))
            print(f"{bundle} | {folder} | " + " | ".join(
                f"{name} {percent.format(cells['plane'][name])} -> {percent.format(cells['table'][name])}"
                for name in cells["table"]))
    use_form("table")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
