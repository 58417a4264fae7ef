"""A published profile: GPU timings others measured and published, kept in the bundle's two files.

DIR/profile.parquet, one row per point:
  op          what was timed: a collective (all_reduce, send_recv, ...), a layer's operator
              named as a calibration names it (linear.qkv, ..., elementwise), or a part of an
              engine's host work in an iteration (schedule, prepare_inputs, sampler, ...)
  ranks       GPUs taking part (collectives), the tensor-parallel size whose shard was timed
              (operators), or the tensor-parallel group the engine drove (host)
  bytes       message size of one GPU, bytes (collectives)
  tokens      tokens in the forward (operators)
  batch       requests in the iteration (host)
  seconds     the source's figure at that point (see meta.json `measured`)
  held_out    True for the source's rows kept apart to check the table (every fifth size)
  source_rows the source's rows behind a point (a point is their median)

DIR/meta.json: `kind: published`, `table: collectives | kernels | host`, the source (name,
repository or URL, path, commit, licence), the hardware it was measured on, for collectives the
interconnect and library (and each all-to-all op's element width), for kernels the model's shape
and dtype, for host the engine, what each column measured, the grid of every op and its held-out
error. `python -m sim import-profile` writes one (sim/imports/); `load_published` reads one, every
way it can be unusable an InputError naming the folder.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sim.errors import InputError
from sim.formats.bundle import META, PROFILE, SCHEMA_VERSION, table_from_rows
from sim.formats.provenance import REPO_ROOT, repo_relative
from sim.formats.table import OperatorTable

KIND = "published"
# Where the committed published profiles live (calibration/README.md lists them).
PUBLISHED = REPO_ROOT / "calibration/published"
COLUMNS = ("op", "seconds", "held_out", "source_rows")
# What meta.json holds besides the source, by the kind of table.
TABLE_KEYS = {"collectives": ("interconnect", "library"), "kernels": ("model", "dtype"), "host": ("engine",)}
# What an imported table must hold out within: median |interpolated / the source's row - 1| over
# its held-out rows (issue 57).
HELD_OUT_TARGET = 0.10


@dataclass(frozen=True)
class PublishedProfile:
    path: Path
    meta: dict
    tables: dict[str, OperatorTable]

    @property
    def kind(self) -> str:
        """collectives, kernels or host."""
        return self.meta["table"]

    @property
    def source(self) -> str:
        s = self.meta["source"]
        return f"{s['name']} ({s['repository']}, {s['path']} at {s['commit'][:12]}, {s['licence']})"

    def table(self, op: str) -> OperatorTable | None:
        return self.tables.get(op)


def is_published(path: str | Path) -> bool:
    """Is the folder a published profile rather than a calibration bundle? (Asked by the scenario's
    checks, the cost model and the provenance of every run.)"""
    meta = read_meta(Path(path) / META)
    return meta is not None and meta.get("kind") == KIND


def read_meta(path: Path) -> dict | None:
    """A meta.json's mapping, None where it cannot be read: parsed once per file version, since
    every scenario's cost model searches the published folder."""
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _parse_meta(path.resolve(), stamp)


@lru_cache(maxsize=64)
def _parse_meta(path: Path, stamp: int) -> dict | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def published_metas(folder: Path = PUBLISHED, table: str | None = None, ops: tuple[str, ...] = ()) -> dict[str, dict]:
    """Each published profile's meta.json under `folder`, by folder name: those of `table` kind
    holding every op of `ops` where given. An unreadable meta.json is left out of the search
    (naming that folder loads it, and its error says what is wrong)."""
    metas = {}
    for path in sorted(Path(folder).glob("*/meta.json")):
        meta = read_meta(path)
        if meta is None or meta.get("kind") != KIND or (table is not None and meta.get("table") != table):
            continue
        grid = meta.get("grid")
        if all(isinstance(grid, dict) and op in grid for op in ops):
            metas[path.parent.name] = meta
    return metas


def load_published(path: str | Path) -> PublishedProfile:
    """Read and check a published profile's folder."""
    folder = Path(path).resolve()
    stamp = tuple((folder / name).stat().st_mtime_ns if (folder / name).exists() else 0 for name in (META, PROFILE))
    return _load(folder, stamp)


@lru_cache(maxsize=16)
def _load(folder: Path, stamp: tuple) -> PublishedProfile:
    import pandas as pd

    for name in (META, PROFILE):
        if not (folder / name).is_file():
            raise InputError("published profile", f"{folder / name} is missing")
    try:
        meta = json.loads((folder / META).read_text())
        frame = pd.read_parquet(folder / PROFILE)
    except Exception as exc:     # json and pyarrow raise several types for a damaged file
        raise InputError("published profile", f"{folder} cannot be read ({exc.__class__.__name__})") from None
    if not isinstance(meta, dict) or meta.get("schema_version") != SCHEMA_VERSION or meta.get("kind") != KIND:
        raise InputError("published profile", f"{folder / META} is not a published profile of schema {SCHEMA_VERSION}")
    try:
        dims = {d for spec in meta["grid"].values() for d in spec["dims"]}
        missing = [c for c in (*COLUMNS, *sorted(dims)) if c not in frame.columns]
        if missing:
            raise InputError("published profile", f"{folder / PROFILE} lacks columns {', '.join(missing)}")
        tables = {op: grid_table(op, spec, frame[(frame.op == op) & ~frame.held_out])
                  for op, spec in meta["grid"].items()}
        for key in ("source", "hardware", "measured", *TABLE_KEYS[meta["table"]]):
            meta[key]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError("published profile", f"{folder} is inconsistent: {exc.__class__.__name__} {exc}") from None
    return PublishedProfile(folder, meta, tables)



def grid_table(op: str, spec: dict, rows) -> OperatorTable:
    """The op's grid filled from its rows, as measured: not made monotone like a calibration's
    tables, since a published point is already the median of the source's neighbouring rows, and a
    collective over more GPUs can be faster (NVSwitch's in-network reduction)."""
    return table_from_rows(op, spec, rows, monotone=False)


def layer_shape(spec) -> tuple[int, int, int, int]:
    """(hidden, heads, KV heads, FFN) of a model's or a stack's decoder layers."""
    return spec.hidden, spec.heads, spec.kv_heads, spec.ffn


def timed_layer_shape(meta: dict) -> tuple[int, int, int, int]:
    """(hidden, heads, KV heads, FFN) of the layers a kernel profile timed."""
    m = meta["model"]
    return m["hidden"], m["heads"], m["kv_heads"], m["ffn"]


def check_kernels(profile: PublishedProfile, scenario) -> list[str]:
    """Errors (InputError on `calibration`) for a kernel profile that cannot price the scenario's
    target: a collectives table, another model shape, weights other than 16-bit, a tensor-parallel
    size it did not time; warnings (returned) for one measured on other hardware."""
    where = repo_relative(profile.path)
    if profile.kind != "kernels":
        priced_by = {"collectives": "by interconnect on its own (sim/cost/collectives.py)",
                     "host": "through an engine's host_profile (sim/cost/host.py)"}[profile.kind]
        raise InputError("calibration", f"{where} is a published {profile.kind} table, priced {priced_by}, "
                                        f"not a scenario's calibration")
    model, m = scenario.model_spec, profile.meta["model"]
    if layer_shape(model) != timed_layer_shape(profile.meta) or model.experts is not None or model.latent is not None:
        raise InputError("calibration", f"{where} timed layers of hidden {m['hidden']}, {m['heads']}/{m['kv_heads']} "
                                        f"heads, FFN {m['ffn']}; {model.name} is another shape")
    if scenario.dtype not in ("bf16", "fp16"):
        raise InputError("calibration", f"{where} timed {profile.meta['dtype']} weights; the scenario runs "
                                        f"{scenario.dtype}")
    ranks = [int(r) for r in profile.table("linear.qkv").axes[0]]
    if scenario.tensor_parallel not in ranks:
        raise InputError("calibration", f"{where} timed tensor_parallel {ranks}, the scenario runs "
                                        f"{scenario.tensor_parallel}")
    if profile.meta["hardware"] != scenario.hardware_spec.name:
        return [f"calibration {where} was measured on {profile.meta['hardware']}, the scenario's hardware is "
                f"{scenario.hardware_spec.name}"]
    return []
