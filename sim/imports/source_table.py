"""A source's CSV read with its checks: unreadable, a column missing or a value that is not a
positive number is one line naming the file (InputError)."""
from __future__ import annotations

from pathlib import Path

from sim.errors import InputError


def read_source_csv(path: Path, needed: list[str], what: str):
    """The file's table, with every `needed` column; `what` says which table was expected."""
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise InputError(str(path), f"cannot be read as CSV ({exc.__class__.__name__})") from None
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise InputError(str(path), f"lacks columns {', '.join(missing)} ({what})")
    return frame


def check_positive(frame, columns: list[str], path: Path) -> None:
    """Every value of `columns` a positive number."""
    import pandas as pd

    for name in columns:
        values = pd.to_numeric(frame[name], errors="coerce")
        bad = values.isna() | (values <= 0)
        if bad.any():
            raise InputError(str(path), f"{name} must be a positive number in every row "
                                        f"(got {frame.loc[bad, name].iloc[0]!r})")
