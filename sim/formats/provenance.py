"""The provenance every result file carries: the git revision of this checkout, the versions of
what computed it, and paths relative to the repository, never a machine's absolute paths."""
from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def git_revision() -> str:
    """HEAD of the checkout this code runs from, `+dirty` with uncommitted changes to tracked files."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
        revision = out.stdout.strip() if out.returncode == 0 else "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return revision + ("+dirty" if dirty and revision != "unknown" else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@lru_cache(maxsize=4)
def versions(extra: tuple[str, ...] = ()) -> dict:
    """Installed versions of Python, the simulator's dependencies and `extra` packages (those not
    installed are left out)."""
    out = {"python": platform.python_version()}
    for package in ("specsim", "numpy", "simpy", "pydantic", "scipy", *extra):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return out


def repo_relative(path: str | Path | None) -> str | None:
    """`path` as result files record it: relative to the repository root (`../shared/x` for a file
    beside it), so a result names the same file on every machine. None stays None."""
    if path is None:
        return None
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return Path(os.path.relpath(absolute, REPO_ROOT)).as_posix()


def read_results_csv(path: str | Path):
    """A results table written with its provenance as a first `# provenance:` comment line
    (validation.csv, errors.csv), as a DataFrame. OSError or ValueError when unreadable."""
    import pandas as pd

    with open(path) as handle:
        skip = 1 if handle.readline().startswith("#") else 0
    return pd.read_csv(path, skiprows=skip)
