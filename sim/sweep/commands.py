"""`python -m sim sweep` and `python -m sim report` (their arguments parsed in sim/cli.py)."""
from __future__ import annotations

import datetime as dt
import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from sim.errors import InputError
from sim.formats.provenance import repo_relative


INTEGER_COLUMNS = ("batch", "requests", "k", "budget", "period", "seed", "tensor_parallel", "gpus", "peak_batch",
                   "baseline_peak_batch", "max_running", "preemptions", "rolled_back_tokens")


@dataclass(frozen=True)
class SweepOptions:
    study: str | None = None              # a study YAML or an embedded study's name; None: the default study
    out: Path | None = None               # None: reports/STUDY_NAME
    executor: Literal["local", "ray"] = "local"
    address: str | None = None            # Ray cluster address (executor ray)
    workers: int | None = None            # None: the CPU count
    resume: bool = False
    overwrite: bool = False
    validation: Path | None = None        # a validation.csv for the report's parity plot
    quiet: bool = False
    reuse_baselines: bool = True
    cost: str | None = None               # every point's `cost` without a calibration (None: the study's)


def sweep(options: SweepOptions) -> int:
    """Run a study's points (resuming or overwriting a folder's earlier results as asked), then
    write results.parquet and report.html."""
    from sim.sweep.study import check_points, expand_points, load_study, resolve_path
    from sim.sweep.executors import run_sweep
    from sim.sweep.store import REPORT, TABLE, ResultLog

    if options.workers is not None and options.workers < 1:
        raise InputError("--workers", f"must be at least 1 (got {options.workers})")
    if options.address and options.executor != "ray":
        raise InputError("--address", "applies to --executor ray")
    loaded = load_study(options.study)
    study = loaded.study
    out = options.out or Path("reports") / study.name
    log = ResultLog(out)
    if options.resume and options.overwrite:
        raise InputError("--overwrite", "cannot be combined with --resume")
    if log.exists() and not (options.resume or options.overwrite):
        raise InputError("--out", f"{out} already holds a sweep's results; pass --resume to finish it, "
                                     f"--overwrite to start again, or choose another --out")
    points = expand_points(loaded)
    if options.cost is not None:
        points = with_cost(points, options.cost)
    check_points(points)      # a bad grid value stops the sweep here, before any point runs
    if options.overwrite:
        log.discard()
    for note in loaded.skipped:
        print(f"note: {note}", file=sys.stderr)
    progress = not options.quiet
    if progress:
        print(f"sweep {study.name}: {len(points)} points checked; results in {out}", file=sys.stderr)
    previous = signal.signal(signal.SIGTERM, interrupt)      # `kill` stops as cleanly as Ctrl-C
    try:
        timing = run_sweep(points, log, executor=options.executor, workers=options.workers, address=options.address,
                           progress=progress, reuse_baselines=options.reuse_baselines)
    except KeyboardInterrupt:
        print(f"interrupted: {len(log.read())} of {len(points)} points are in {log.path}; "
              f"finish with --resume --out {out}", file=sys.stderr)
        return 130
    except OSError as exc:
        raise InputError("--out", f"cannot write to {out}: {exc.strerror or exc}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    frame = results_frame(points, log.read(), study)
    provenance = sweep_provenance(loaded, frame, timing)
    validation = None
    validation_path = options.validation or (resolve_path(study.validation, loaded.base_dir) if study.validation else None)
    if validation_path is not None:
        from sim.validate.parity import read_validation

        validation = read_validation(Path(validation_path))
        provenance["validation"] = repo_relative(validation_path)
    from sim.sweep.report import write_report
    from sim.sweep.store import write_table

    try:
        write_table(frame, out / TABLE, provenance)
        write_report(out / REPORT, frame, provenance, validation)
    except OSError as exc:
        raise InputError("--out", f"cannot write to {out}: {exc.strerror or exc}") from None
    print(summary_text(frame, timing, out))
    return 0


def interrupt(signum, frame):
    raise KeyboardInterrupt


def results_frame(points, rows: dict, study) -> pd.DataFrame:
    """The finished rows in study order, with each point's price and cost per million tokens."""
    missing = [p.id for p in points if p.id not in rows]
    if missing:
        raise InputError("sweep", f"{len(missing)} points have no result (rerun with --resume)")
    # Names come from the study as it is now (a renamed method keeps its points' digests).
    frame = pd.DataFrame([{**rows[p.id], "group": p.group, "method": p.method, "panel": panel_of(p, rows[p.id])}
                          for p in points])
    for column in INTEGER_COLUMNS:     # counts stay integers where some points have none (k of no SD)
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    frame["price_per_gpu_hour"] = frame["hardware"].map(study.price_for).astype(float)
    # Every GPU the deployment holds (rows cached before the gpus column: their tensor_parallel).
    gpus = frame["gpus"].fillna(frame["tensor_parallel"]) if "gpus" in frame else frame["tensor_parallel"]
    usd_per_s = frame["price_per_gpu_hour"] * gpus.astype(float) / 3600.0
    for prefix in ("", "baseline_"):
        frame[f"{prefix}cost_per_mtok_usd"] = usd_per_s / frame[f"{prefix}throughput_tok_s"] * 1e6
    return frame


# Grid axes that set the load or the prompt: the report's axes within a panel, not panels of their own.
LOAD_FIELDS = ("concurrency", "requests", "rate_qps", "prompt_tokens")


def panel_of(point, row: dict) -> str:
    """The report's panel of a point: its group and hardware, plus every other grid value that is
    neither speculation nor load (so that points differing in, say, tensor_parallel are never
    compared in one heatmap cell)."""
    parts = []
    for axis, value in point.labels:
        if axis.startswith("speculation") or axis == "hardware":
            continue
        if axis == "workload" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in LOAD_FIELDS}
            if value:
                parts.append(f"workload={json.dumps(value, sort_keys=True)}")
            continue
        if axis.startswith("workload.") and axis.removeprefix("workload.") in LOAD_FIELDS:
            continue
        parts.append(f"{axis}={json.dumps(value, sort_keys=True, default=str)}")
    return " · ".join([f"{point.group} on {row['hardware']}", *parts])


def sweep_provenance(loaded, frame: pd.DataFrame, timing: dict) -> dict:
    from sim.formats.provenance import REPO_ROOT, git_revision, versions
    from sim.simulate import bundle_provenance

    calibrations = {path: bundle_provenance(REPO_ROOT / path) for path in frame["calibration"].dropna().unique()}
    return {
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(), "versions": versions(("pandas", "pyarrow", "plotly", "ray")),
        "study": loaded.study.model_dump(mode="json"), "study_source": loaded.source if loaded.source.startswith("embedded:") else repo_relative(loaded.source), "study_text": loaded.text,
        "skipped": loaded.skipped, "calibrations": calibrations,
        "hardware": sorted(frame["hardware"].unique().tolist()),
        "dtypes": sorted(frame["dtype"].unique().tolist()),
        "seeds": sorted(int(s) for s in frame["seed"].unique()),
        "points": len(frame), "executor": timing["executor"], "workers": timing["workers"],
        "seconds": round(timing["seconds"], 2), "resumed_points": timing["resumed"],
        "baselines_reused": timing["reuse_baselines"],
        "warnings": sorted({w for w in frame["warnings"].dropna()}),
        "cost_models": cost_models(frame),
    }


def cost_models(frame: pd.DataFrame) -> dict:
    """What priced the points' kernels, with how many points each (the measured operator tables by
    GPU, engine and version, the roofline, a bundle), and the tables' package where it priced any."""
    from sim.cost.operator_tables import package_provenance

    counts = frame["cost_model"].fillna("unknown").value_counts() if "cost_model" in frame else pd.Series(dtype=int)
    out: dict = {str(k): int(v) for k, v in counts.items()}
    if any(str(k).startswith("measured:") for k in out):
        out["operator_tables"] = package_provenance()
    return out


def summary_text(frame: pd.DataFrame, timing: dict, out: Path) -> str:
    lines = [f"{timing['points']} points ({timing['ran']} run now, {timing['resumed']} from before) in "
             f"{timing['seconds']:.1f} s on {timing['workers']} {timing['executor']} workers",
             f"wrote {out / 'results.parquet'} and {out / 'report.html'}"]
    spec = frame[frame.speculation != "none"]
    if "policy" in spec:
        spec = spec[spec.policy != "oracle"]      # a bound, not a configuration
    for panel, sub in spec.groupby("panel", sort=False):
        best = sub.loc[sub["speedup"].idxmax()]
        hurts = int((sub["speedup"] < 1).sum())
        load = (f"batch {best['batch']:g}" if pd.notna(best["batch"]) else
                f"{best['rate_qps']:g} req/s" if pd.notna(best["rate_qps"]) else f"{best['requests']} requests")
        lines.append(f"  {panel}: best speedup {best['speedup']:.2f}x ({best['method']}, "
                     f"{best['settings']}, {load}, context {best['context']:g}); "
                     f"speedup < 1 at {hurts} of {len(sub)} points")
    return "\n".join(lines)


def rebuild_report(folder: Path, validation_csv: Path | None = None, out: Path | None = None) -> int:
    """report.html again from a sweep's folder (or its results.parquet), with an optional parity plot."""
    from sim.sweep.report import write_report
    from sim.validate.parity import read_validation
    from sim.sweep.store import REPORT, TABLE, read_table

    table = folder / TABLE if folder.is_dir() else folder
    if not table.exists():
        raise InputError("RESULTS", f"no results table at {table} (run python -m sim sweep first)")
    frame, provenance = read_table(table)
    validation = read_validation(validation_csv) if validation_csv else None
    out = out or table.parent / REPORT
    write_report(out, frame, provenance, validation)
    print(f"wrote {out}")
    return 0


def with_cost(points: list, cost: str) -> list:
    """The points with `cost` set where no calibration prices them (`--cost`), each with the id of
    its new scenario (a resumed sweep tells the two apart)."""
    from dataclasses import replace

    from sim.sweep.study import point_id

    out = []
    for point in points:
        if point.scenario.get("calibration") is None:
            scenario = {**point.scenario, "cost": cost}
            point = replace(point, scenario=scenario, id=point_id(point.group, scenario))
        out.append(point)
    return out
