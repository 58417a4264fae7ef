"""A live campaign's folder: what `python -m profiler campaign` writes, `sim validate` and
`sim fit-acceptance` read.

    DIR/campaign.json          the record of repeat 1: {"campaign", "file", "calibration" (the bundle
                               that predicts it, or null), "repeat", "runs": [every run's name, in
                               the campaign's order], "wall_s": {name: s}, "total_s" (null where the
                               runs' times were not recorded), "failed": {name: the error's first line}}
    DIR/NAME/                  repeat 1's run folders (sim/formats/run_folder.py)
    DIR/repeats/N/campaign.json, DIR/repeats/N/NAME/   repeat N > 1

Runs of the same NAME in different repeats are passes of one run; `sim validate` takes the median.
"""
from __future__ import annotations

import json
from pathlib import Path

from sim.errors import InputError
from sim.formats.files import write_atomic
from sim.formats.provenance import repo_relative

RECORD = "campaign.json"


def repeat_folder(out: Path, repeat: int) -> Path:
    """Where repeat N of a campaign writes its run folders."""
    return out if repeat == 1 else out / "repeats" / str(repeat)


def is_campaign(folder: Path) -> bool:
    return (Path(folder) / RECORD).is_file()


def read_record(folder: Path) -> dict:
    path = Path(folder) / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError("RUN_DIR", f"{path} cannot be read ({exc.__class__.__name__})") from None
    if not isinstance(record, dict) or not isinstance(record.get("runs"), list):
        raise InputError("RUN_DIR", f"{path} is not a campaign record")
    return record


def write_record(folder: Path, campaign: str, file: Path, calibration: str | None, repeat: int, runs: list[str],
                 wall_s: dict[str, float], failed: dict[str, str] | None = None) -> None:
    """A repeat folder's campaign.json: the campaign, every run's name in its order, the wall times
    of the runs done so far and the errors of those that failed."""
    record = {"campaign": campaign, "file": repo_relative(file), "calibration": calibration, "repeat": repeat,
              "runs": runs, "wall_s": wall_s, "total_s": round(sum(wall_s.values()), 2), "failed": failed or {}}
    write_atomic(Path(folder) / RECORD, json.dumps(record, indent=2) + "\n")


def wall_times(folder: Path) -> dict[str, float]:
    """The wall times a repeat folder's record holds (none for a folder without one)."""
    return dict(read_record(folder).get("wall_s") or {}) if is_campaign(folder) else {}


def failures(folder: Path) -> dict[str, str]:
    """The failed runs a repeat folder's record names, with their errors (none without a record)."""
    return dict(read_record(folder).get("failed") or {}) if is_campaign(folder) else {}


def repeat_folders(folder: Path) -> list[Path]:
    """Repeat 1's folder, then every repeats/N holding a record, by N."""
    repeats = [p for p in (Path(folder) / "repeats").glob("*") if p.name.isdigit() and is_campaign(p)]
    return [Path(folder), *sorted(repeats, key=lambda p: int(p.name))]


def campaign_run_folders(folder: Path) -> list[Path]:
    """Every run folder of every repeat, in the campaign's order; a run its record lists but the
    folder lacks (an interrupted campaign) is an error."""
    out = []
    for repeat in repeat_folders(folder):
        for name in read_record(repeat)["runs"]:
            run = repeat / name
            if not run.is_dir():
                raise InputError("RUN_DIR", f"{run} is missing (finish the campaign: python -m profiler campaign "
                                               f"... --out {folder})")
            out.append(run)
    return out


def expand_run_folders(paths: list[Path]) -> list[Path]:
    """Run folders as given, each campaign folder replaced by its run folders, and a folder of run
    folders (`profiler serve-live` with several loads) by the run folders in it, by name."""
    from sim.formats.run_folder import META

    out = []
    for path in paths:
        path = Path(path)
        if is_campaign(path):
            out += campaign_run_folders(path)
        elif path.is_dir() and not (path / META).exists() and (inside := sorted(p for p in path.iterdir()
                                                                                 if (p / META).is_file())):
            out += inside
        else:
            out.append(path)
    return out
