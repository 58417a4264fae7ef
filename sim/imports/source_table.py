"""A source's CSV read with its checks (unreadable, a column missing or a value that is not a
positive number is one line naming the file: InputError), and its rows parted into the grid and
the rows held out to check it."""
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


def hold_out_fifths(rows, size: str = "tokens"):
    """Every fifth `size` (token count, batch) of each (op, ranks) held out; the rest the grid, a
    point per size (the median of the source's rows there; rows that come as medians keep their
    source_rows)."""
    if "source_rows" not in rows.columns:
        rows = (rows.groupby(["op", "ranks", size]).seconds.agg(["median", "size"]).reset_index()
                .rename(columns={"median": "seconds", "size": "source_rows"}))
    rows = rows.sort_values(["op", "ranks", size], ignore_index=True)
    held = rows.groupby(["op", "ranks"]).cumcount() % 5 == 4
    return rows[~held], rows[held]
