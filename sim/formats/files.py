"""Writing results so that nothing is ever half-written: a temporary file or folder beside the
target, renamed over it once complete."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def write_file_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Let `write(tmp)` write a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp makes the file private: give it the mode of the file it replaces, or the umask's.
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it."""
    write_file_atomic(path, lambda tmp: tmp.write_text(text))


def write_folder_atomic(out: Path, fill: Callable[[Path], None], replace: bool = False) -> None:
    """Let `fill(folder)` write a fresh temporary folder beside `out`, then rename it to `out`.
    replace: an existing `out` is swapped out only once the new folder is complete (a calibration
    bundle); otherwise `out` must not exist (a live run folder)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        fill(tmp)
        tmp.chmod(0o777 & ~_umask())          # mkdtemp makes it private; the result is an ordinary folder
        if replace and out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old."))
            os.rename(out, old / out.name)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
