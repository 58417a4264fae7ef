"""The `sweep`, `report` and `capacity` subcommands of `python -m sim`."""
from __future__ import annotations

import datetime as dt
import json
import signal
import sys
from pathlib import Path

import pandas as pd

from sim.errors import ScenarioError


INTEGER_COLUMNS = ("batch", "requests", "k", "budget", "period", "seed", "tensor_parallel", "peak_batch",
                   "baseline_peak_batch", "max_running", "preemptions", "rolled_back_tokens")


def sweep_command(args) -> int:
    from sim.study import check_points, expand_points, load_study, resolve_path
    from sim.sweep import run_sweep
    from sim.sweep_store import REPORT, TABLE, ResultLog

    if args.workers is not None and args.workers < 1:
        raise ScenarioError("--workers", f"must be at least 1 (got {args.workers})")
    if args.address and args.executor != "ray":
        raise ScenarioError("--address", "applies to --executor ray")
    loaded = load_study(args.study)
    study = loaded.study
    out = args.out or Path("reports") / study.name
    log = ResultLog(out)
    if args.resume and args.overwrite:
        raise ScenarioError("--overwrite", "cannot be combined with --resume")
    if log.exists() and not (args.resume or args.overwrite):
        raise ScenarioError("--out", f"{out} already holds a sweep's results; pass --resume to finish it, "
                                     f"--overwrite to start again, or choose another --out")
    points = expand_points(loaded)
    check_points(points)      # a bad grid value stops the sweep here, before any point runs
    if args.overwrite:
        log.discard()
    for note in loaded.skipped:
        print(f"note: {note}", file=sys.stderr)
    progress = not args.quiet
    if progress:
        print(f"sweep {study.name}: {len(points)} points checked; results in {out}", file=sys.stderr)
    previous = signal.signal(signal.SIGTERM, interrupt)      # `kill` stops as cleanly as Ctrl-C
    try:
        timing = run_sweep(points, log, executor=args.executor, workers=args.workers, address=args.address,
                           progress=progress, reuse_baselines=not args.no_baseline_reuse)
    except KeyboardInterrupt:
        print(f"interrupted: {len(log.read())} of {len(points)} points are in {log.path}; "
              f"finish with --resume --out {out}", file=sys.stderr)
        return 130
    except OSError as exc:
        raise ScenarioError("--out", f"cannot write to {out}: {exc.strerror or exc}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    frame = results_frame(points, log.read(), study)
    provenance = sweep_provenance(loaded, frame, timing)
    validation = None
    validation_path = args.validation or (resolve_path(study.validation, loaded.base_dir) if study.validation else None)
    if validation_path is not None:
        from sim.report import read_validation

        validation = read_validation(Path(validation_path))
        provenance["validation"] = str(validation_path)
    from sim.report import write_report
    from sim.sweep_store import write_table

    try:
        write_table(frame, out / TABLE, provenance)
        write_report(out / REPORT, frame, provenance, validation)
    except OSError as exc:
        raise ScenarioError("--out", f"cannot write to {out}: {exc.strerror or exc}") from None
    print(summary_text(frame, timing, out))
    return 0


def interrupt(signum, frame):
    raise KeyboardInterrupt


def results_frame(points, rows: dict, study) -> pd.DataFrame:
    """The finished rows in study order, with each point's price and cost per million tokens."""
    missing = [p.id for p in points if p.id not in rows]
    if missing:
        raise ScenarioError("sweep", f"{len(missing)} points have no result (rerun with --resume)")
    # Names come from the study as it is now (a renamed method keeps its points' digests).
    frame = pd.DataFrame([{**rows[p.id], "group": p.group, "method": p.method, "panel": panel_of(p, rows[p.id])}
                          for p in points])
    for column in INTEGER_COLUMNS:     # counts stay integers where some points have none (k of no SD)
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    frame["price_per_gpu_hour"] = frame["hardware"].map(study.price_for).astype(float)
    usd_per_s = frame["price_per_gpu_hour"] * frame["tensor_parallel"].astype(float) / 3600.0
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
    from sim.simulate import bundle_provenance, git_revision, versions

    calibrations = {path: bundle_provenance(path) for path in frame["calibration"].dropna().unique()}
    return {
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(), "versions": versions(("pandas", "pyarrow", "plotly", "ray")),
        "study": loaded.study.model_dump(mode="json"), "study_source": loaded.source, "study_text": loaded.text,
        "skipped": loaded.skipped, "calibrations": calibrations,
        "hardware": sorted(frame["hardware"].unique().tolist()),
        "dtypes": sorted(frame["dtype"].unique().tolist()),
        "seeds": sorted(int(s) for s in frame["seed"].unique()),
        "points": len(frame), "executor": timing["executor"], "workers": timing["workers"],
        "seconds": round(timing["seconds"], 2), "resumed_points": timing["resumed"],
        "baselines_reused": timing["reuse_baselines"],
        "warnings": sorted({w for w in frame["warnings"].dropna()}),
    }


def summary_text(frame: pd.DataFrame, timing: dict, out: Path) -> str:
    lines = [f"{timing['points']} points ({timing['ran']} run now, {timing['resumed']} from before) in "
             f"{timing['seconds']:.1f} s on {timing['workers']} {timing['executor']} workers",
             f"wrote {out / 'results.parquet'} and {out / 'report.html'}"]
    spec = frame[frame.speculation != "none"]
    for panel, sub in spec.groupby("panel", sort=False):
        best = sub.loc[sub["speedup"].idxmax()]
        hurts = int((sub["speedup"] < 1).sum())
        load = (f"batch {best['batch']:g}" if pd.notna(best["batch"]) else
                f"{best['rate_qps']:g} req/s" if pd.notna(best["rate_qps"]) else f"{best['requests']} requests")
        lines.append(f"  {panel}: best speedup {best['speedup']:.2f}x ({best['method']}, "
                     f"{best['settings']}, {load}, context {best['context']:g}); "
                     f"speedup < 1 at {hurts} of {len(sub)} points")
    return "\n".join(lines)


def report_command(args) -> int:
    from sim.report import read_validation, write_report
    from sim.sweep_store import REPORT, TABLE, read_table

    folder = args.results
    table = folder / TABLE if folder.is_dir() else folder
    if not table.exists():
        raise ScenarioError("RESULTS", f"no results table at {table} (run python -m sim sweep first)")
    frame, provenance = read_table(table)
    validation = read_validation(args.validation) if args.validation else None
    out = args.out or table.parent / REPORT
    write_report(out, frame, provenance, validation)
    print(f"wrote {out}")
    return 0


def capacity_command(args) -> int:
    from sim.capacity import find_capacity, format_capacity
    from sim.cli import set_field, split_assignment
    from sim.scenario import read_mapping, resolve_relative_paths

    mapping = resolve_relative_paths(read_mapping(args.scenario), args.scenario.parent)
    for override in args.overrides:
        set_field(mapping, *split_assignment(override, "--set"))
    result = find_capacity(mapping, tolerance=args.tolerance, max_rate_qps=args.max_rate)
    from sim.result import json_safe

    print(json.dumps(json_safe(result)) if args.json else format_capacity(result))
    return 0
