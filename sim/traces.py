"""Reading the tables a scenario names (request traces, acceptance traces): CSV, Parquet or JSONL."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.errors import InputError


def read_table(path: Path, field: str):
    """A pandas DataFrame from CSV, Parquet (.parquet) or JSON lines (.jsonl/.json)."""
    import pandas as pd

    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".jsonl", ".json"):
            return pd.read_json(path, lines=True)
        return pd.read_csv(path)
    except Exception as exc:  # pandas raises many types for unreadable files
        raise InputError(field, f"cannot read {path}: {exc.__class__.__name__}") from None


def numeric_column(frame, column: str, path: Path, field: str, *, integer: bool, minimum: float) -> np.ndarray:
    """A column as finite numbers >= minimum (whole numbers when `integer`), or a one-line error."""
    import pandas as pd

    if column not in frame.columns:
        raise InputError(field, f"{path} lacks column {column}")
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values < minimum)
    if integer:   # whole numbers that survive the int64 cast (token counts are far below this)
        bad |= (values != np.round(values)) | (values > np.iinfo(np.int32).max)
    if bad.any():
        row = int(np.argmax(bad))
        kind = "an integer below 2^31" if integer else "a number"
        raw = frame[column].iloc[row]
        raw = raw.item() if hasattr(raw, "item") else raw    # numpy scalar -> plain value
        raise InputError(field, f"{path} row {row}: {column} must be {kind}, >= {minimum:g} (got {raw!r})")
    return values.astype(np.int64) if integer else values
