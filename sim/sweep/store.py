"""A sweep's results on disk: an append-only JSON-lines log of finished points, and the Parquet table
and report written from it.

Why a log: a sweep may be killed at any moment. Each finished point is appended as one line in one
write(2) to a file opened O_APPEND, so a kill leaves whole lines and at worst one torn last line.
Reading drops a torn line (its point simply runs again) and a point already logged is never logged
twice: a killed and resumed sweep neither loses nor duplicates a point.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from sim.errors import InputError
from sim.formats.files import write_file_atomic

LOG = "results.jsonl"
TABLE = "results.parquet"
REPORT = "report.html"


class ResultLog:
    def __init__(self, out_dir: Path):
        self.path = out_dir / LOG
        self.out_dir = out_dir

    def exists(self) -> bool:
        return self.path.exists() and self.path.stat().st_size > 0

    def discard(self) -> None:
        """Start again: the old results go (only after the new study has been checked)."""
        self.path.unlink(missing_ok=True)
        for name in (TABLE, REPORT):
            (self.out_dir / name).unlink(missing_ok=True)

    def read(self) -> dict[str, dict]:
        """Finished rows by point id. A torn last line (a kill mid-write) is cut off the file."""
        rows: dict[str, dict] = {}
        if not self.path.exists():
            return rows
        data = self.path.read_bytes()
        good_end = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break
            rows.setdefault(row["id"], row)     # the first record of a point stands
            good_end += len(line)
        if good_end < len(data):
            with open(self.path, "r+b") as handle:
                handle.truncate(good_end)
        return rows

    def open(self):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self

    def append(self, row: dict) -> None:
        line = (json.dumps(row, allow_nan=True, default=str) + "\n").encode()
        written = os.write(self._fd, line)
        if written != len(line):     # a full disk: the torn line is dropped on the next read
            raise InputError("--out", f"could not append to {self.path} (disk full?)")

    def close(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()


def write_table(frame, path: Path, metadata: dict) -> None:
    """The results as Parquet, with the sweep's provenance in the file's metadata (key `specsim`);
    written to a temporary file and renamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"specsim"] = json.dumps(metadata, default=str).encode()
    table = table.replace_schema_metadata(meta)
    write_file_atomic(path, lambda tmp: pq.write_table(table, tmp))


def read_table(path: Path):
    """(frame, provenance) of a results.parquet."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        raise InputError("results", f"cannot read {path}: {exc}") from None
    meta = table.schema.metadata or {}
    provenance = json.loads(meta[b"specsim"]) if b"specsim" in meta else {}
    return table.to_pandas(), provenance
