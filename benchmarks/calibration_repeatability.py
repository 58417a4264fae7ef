"""How well does one calibration repeat another? The floor under a bundle's held-out error.

    python benchmarks/calibration_repeatability.py BUNDLE [BUNDLE ...]

A bundle's held-out error compares off-grid measurements with the tables' interpolation of grid
measurements; both are timings, so it can be no smaller than the difference between two timings
of the same point. For each bundle: its held-out error recomputed with this checkout's tables
(`profiler.calibrate.held_out_error`) and, where it stores every timing round (`round_seconds`),
the held-out error each way of reducing the rounds to one time would give (the median or the best
of n rounds, averaged over every choice of n of the stored rounds: any one choice is one draw,
and the first three of the 5-round bundle happen to be its best) and how well the first half of
the rounds repeats the second half under each. For each pair of bundles of the same model, dtype
and device: the median |B / A - 1| over the points they share (grid and held-out), overall and
per operator. Only reads the bundles.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def read(folder: Path):
    import pandas as pd

    meta = json.loads((folder / "meta.json").read_text())
    return meta, pd.read_parquet(folder / "profile.parquet")


def print_estimators(folder: Path, meta: dict, frame) -> None:
    """Held-out error of the median and of the best of the first n stored rounds, and half-vs-half."""
    import numpy as np

    from profiler.calibrate import grid_of, held_out_error

    grid = grid_of(meta)
    rounds = [np.asarray(r, dtype=float) for r in frame.round_seconds]
    count = min(len(r) for r in rounds)
    if count < 2:
        return
    table = np.stack([r[:count] for r in rounds])
    print(f"\n{folder}: {count} rounds stored; held-out error (median over {int(frame.held_out.sum())} points) "
          f"by how n rounds become one time, mean [range] over every choice of n of them:")
    for n in range(1, count + 1):
        cells = []
        for name, reduce in (("median", np.median), ("best", np.min)):
            if n == 1 and name == "best":
                continue
            errors = [held_out_error(frame.assign(seconds=reduce(table[:, list(chosen)], axis=1)), grid, [])
                      ["median_abs_error"] for chosen in itertools.combinations(range(count), n)]
            cells.append(f"{name} of {n} {np.mean(errors):.1%} [{min(errors):.1%}-{max(errors):.1%}]")
        print("  " + ", ".join(cells))
    half = count // 2
    for name, reduce in (("median", np.median), ("best", np.min)):
        a, b = reduce(table[:, :half], axis=1), reduce(table[:, half:2 * half], axis=1)
        print(f"  {name} of rounds 1-{half} against {name} of rounds {half + 1}-{2 * half}: "
              f"median |B/A - 1| {np.median(np.abs(b / a - 1)):.1%}")


def main() -> int:
    import numpy as np

    from profiler.calibrate import grid_of, held_out_error
    from sim.cost.bundle import DIMS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundles", type=Path, nargs="+")
    args = parser.parse_args()
    bundles = []
    for folder in args.bundles:
        try:
            meta, frame = read(folder)
        except (OSError, ValueError) as exc:
            print(f"error: cannot read bundle {folder}: {exc.__class__.__name__}", file=sys.stderr)
            return 2
        bundles.append((folder, meta, frame))
    keys = {(m["model"].get("hash"), m["dtype"], m["device"].get("name")) for _, m, _ in bundles}
    if len(keys) > 1:
        print("error: the bundles are of different models, dtypes or devices", file=sys.stderr)
        return 2

    print("bundle | measured | wall time | held-out median (P90)")
    for folder, meta, frame in bundles:
        held = held_out_error(frame, grid_of(meta), [])
        print(f"{folder} | {meta['date']} | {meta.get('duration_s', '-')} s | "
              f"{held['median_abs_error']:.1%} ({held['p90_abs_error']:.1%}) over {held['points']} points")

    for folder, meta, frame in bundles:
        if "round_seconds" in frame.columns:
            print_estimators(folder, meta, frame)

    key = [*DIMS, "op", "held_out"]
    for (a, _, fa), (b, _, fb) in itertools.combinations(bundles, 2):
        both = fa.merge(fb, on=key, suffixes=("_a", "_b"))
        ratio = both.seconds_b / both.seconds_a
        per_op = both.assign(error=(ratio - 1).abs()).groupby("op").error.median()
        print(f"\n{b} against {a}: {len(both)} shared points, median |B/A - 1| {np.median((ratio - 1).abs()):.1%}, "
              f"P90 {np.percentile((ratio - 1).abs(), 90):.1%}; median B/A {ratio.median():.3f}")
        print("  per operator: " + ", ".join(f"{op} {e:.1%}" for op, e in per_op.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
