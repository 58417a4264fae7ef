"""The calibration bundle: DIR/profile.parquet (measured operator times) + DIR/meta.json (provenance,
grid, fits, held-out error). `python -m profiler calibrate` writes it through `write_bundle`; the
simulator reads it with `load_bundle` into one OperatorTable per operator (sim/formats/table.py),
the whole-forward and selection factors, and checks it against a scenario (`check_bundle`). Every
way a bundle can be unusable is an InputError on `calibration` with one line saying what is wrong.

profile.parquet, one row per measurement:
  op         operator name (profiler/calibrate/operators.py)
  batch, query, kv, tokens, context, budget, bytes   the point (0 for dims the op does not have)
  seconds    the median of the point's timing rounds (each round the median of many calls)
  spread     (slowest - fastest round) / median (one round: that round's interquartile range / median)
  runs       timed calls, all rounds together
  round_seconds   every round's time (optional: bundles before it lack the column)
  held_out   True for the off-grid points that measure the interpolation's error
  flops, bytes_moved   the work at that point (profiler inspect's achieved rates)

operator_tables/ (the live engine's bundles): the same GEMM and attention times in the published
measured tables' layout, for a scenario's `operator_tables` (sim/formats/operator_layout.py).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.errors import InputError
from sim.formats.files import write_folder_atomic
from sim.formats.operator_layout import FOLDER as OPERATOR_LAYOUT
from sim.formats.operator_layout import write_operator_layout
from sim.formats.provenance import repo_relative
from sim.formats.table import OperatorTable, monotone_in_every_dim

SCHEMA_VERSION = 1
META, PROFILE = "meta.json", "profile.parquet"
DIMS = ("batch", "query", "kv", "tokens", "context", "budget", "bytes")
COLUMNS = (*DIMS, "op", "seconds", "spread", "runs", "held_out", "flops", "bytes_moved")
# What a bundle's tables should hold out within: the median |interpolated / measured - 1|
# over its off-grid points. A scenario reading a bundle above it carries a warning.
HELD_OUT_TARGET = 0.05
MODEL_FIELDS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "tied_embeddings")


def model_hash(model) -> str:
    """A short hash of the dims that decide every operator's shape."""
    dims = {f: getattr(model, f) for f in MODEL_FIELDS}
    return hashlib.sha256(json.dumps(dims, sort_keys=True).encode()).hexdigest()[:16]


def write_bundle(out: Path, frame, meta: dict) -> None:
    """Write DIR/profile.parquet and DIR/meta.json, and for the live engine its GEMM and attention
    times as measured tables (DIR/operator_tables/, sim/formats/operator_layout.py); an existing
    bundle is replaced only once the new one is complete."""
    def fill(folder: Path) -> None:
        frame.to_parquet(folder / PROFILE, index=False)
        (folder / META).write_text(json.dumps(meta, indent=2) + "\n")
        if meta.get("engine") == "profiler.live":
            write_operator_layout(folder / OPERATOR_LAYOUT, frame, meta)
    write_folder_atomic(out, fill, replace=True)


def round_spread(frame, rounds: int) -> float | None:
    """The machine's timing noise over a calibration of `rounds` rounds a point: the median over its
    timed points of their `spread`, (slowest round - fastest round) / median round, put at three
    rounds (below); None with one round (then `spread` is within the round). The held-out error
    compares timings with timings, so it follows this (docs/validation.md).

    The range of more rounds is wider for the same noise: by d2(n), the expected range of n
    normal draws in standard deviations (1.69 at three rounds, 2.33 at five). Calibrations time 3
    to 5 rounds, so the figure is scaled by d2(3) / d2(rounds) to read the same for any of them; a
    bundle of three rounds keeps its plain median range."""
    if rounds < 2:
        return None
    # attention_prefill's cells below its diagonal are copies of the diagonal, not timings.
    timed = frame[~((frame.op == "attention_prefill") & (frame.kv < frame["query"]))]
    return float(timed.spread.median()) * expected_range(3) / expected_range(rounds)


def rounds_note(rounds: int) -> str:
    """What follows a round_spread figure of a bundle of `rounds` rounds where it was scaled."""
    return "" if rounds == 3 else f" (scaled to three rounds; {rounds} timed)"


def timing_noise_line(spread: float, rounds: int) -> str:
    """The line `profiler calibrate` and `profiler inspect` print for a bundle's round_spread."""
    return f"timing noise: the rounds of one point span a median {spread:.1%} of its time{rounds_note(rounds)}"


@lru_cache(maxsize=None)
def expected_range(n: int) -> float:
    """d2(n): the expected range of n independent standard normal draws,
    the integral over x of 1 - Phi(x)^n - (1 - Phi(x))^n."""
    from scipy import integrate, stats

    value, _ = integrate.quad(lambda x: 1 - stats.norm.cdf(x) ** n - stats.norm.sf(x) ** n, -np.inf, np.inf)
    return value


# Past its longest prompt, a whole prompt's causal attention grows with the prompt's square (its
# work is query x (query + 1) / 2 pairs); every other operator table linearly (sim/formats/table.py).
POWER_ABOVE = {"attention_prompt": 2.0}


@dataclass
class Bundle:
    path: Path
    meta: dict
    tables: dict[str, OperatorTable]
    fits: dict = field(default_factory=dict)
    round_spread: float | None = None       # the timing noise of its calibration (`round_spread`)

    def forward_factor(self) -> OperatorTable | None:
        """Whole forwards measured / composed from operators, against query tokens and mean KV: the
        measured ratios, interpolated in log space between their shapes like any operator table and
        held outside them.

        A table, not a smooth surface through them: the ratio has structure (a bump at three tokens,
        more at 12-64 tokens over short caches) that a plane in log tokens and log KV misses; the
        plane priced batch-1 decoding 4-15% slow where the table is within 4% (docs/journal.md)."""
        fit = self.factor_fit("forward_factor", ("tokens", "kv"))
        if fit is None:
            return None
        axes, measured = fit
        return OperatorTable("forward_factor", ("tokens", "kv"), axes, measured, power_above=0.0)

    def selection_factor(self) -> OperatorTable | None:
        """SpecPV's selection timed inside partial-verification forwards / the selection table, against
        batch and context (profiler/calibrate/fits.py); None in a bundle without it (the whole-forward
        factor prices selection then). Held, not extrapolated, outside its shapes."""
        fit = self.factor_fit("selection_factor", ("batch", "context"))
        if fit is None:
            return None
        axes, measured = fit
        return OperatorTable("selection_factor", ("batch", "context"), axes, measured, power_above=0.0)

    def factor_fit(self, name: str, dims: tuple[str, str]) -> tuple[list[np.ndarray], np.ndarray] | None:
        """A fit of measured ratios over two axes (its `dims` and `factor` in meta.json): the axes and
        the ratios, checked for shape; None when the bundle has no such fit."""
        fit = self.fits.get(name)
        if not fit:
            return None
        axes = [np.asarray(fit[d], dtype=float) for d in dims]
        measured = np.asarray(fit["factor"], dtype=float)
        if measured.shape != tuple(len(a) for a in axes):
            raise ValueError(f"{name} has {measured.shape} values for {len(axes[0])} x {len(axes[1])} shapes")
        return axes, measured

    @property
    def label(self) -> str:
        m = self.meta
        return f"{m['model']['name']} {m['dtype']} on {m['device']['name']}"

    def table(self, name: str) -> OperatorTable | None:
        return self.tables.get(name)


def load_bundle(path: str | Path) -> Bundle:
    """Read and validate a bundle; a missing or corrupted file or an unknown schema is a one-line
    InputError on `calibration`."""
    folder = Path(path)
    stamp = tuple((folder / name).stat().st_mtime_ns if (folder / name).exists() else 0
                  for name in (META, PROFILE))
    return _load(folder.resolve(), stamp)


@lru_cache(maxsize=8)
def _load(folder: Path, stamp: tuple) -> Bundle:
    import pandas as pd

    if not folder.is_dir():
        raise InputError("calibration", f"no such bundle folder: {folder}")
    for name in (META, PROFILE):
        if not (folder / name).is_file():
            raise InputError("calibration", f"{folder / name} is missing (run python -m profiler calibrate)")
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError("calibration", f"{folder / META} is not valid JSON ({exc.__class__.__name__})") from None
    if not isinstance(meta, dict) or meta.get("schema_version") != SCHEMA_VERSION:
        version = meta.get("schema_version") if isinstance(meta, dict) else None
        raise InputError("calibration", f"{folder / META} has schema version {version!r}; this simulator "
                                           f"reads version {SCHEMA_VERSION}")
    try:
        frame = pd.read_parquet(folder / PROFILE)
    except Exception as exc:     # pyarrow raises several types for a damaged file
        raise InputError("calibration", f"{folder / PROFILE} cannot be read "
                                           f"({exc.__class__.__name__})") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise InputError("calibration", f"{folder / PROFILE} lacks columns {', '.join(missing)}")
    try:
        tables = {name: table_from_rows(name, spec, frame[(frame.op == name) & ~frame.held_out])
                  for name, spec in meta["grid"].items()}
        for key in ("model", "dtype", "device"):
            meta[key]
        # A transformers black-box bundle keeps each point's best round and the spread within it:
        # no range over rounds to report.
        live = meta.get("engine", "profiler.live") == "profiler.live"
        noise = round_spread(frame, int(meta["rounds"])) if live else None
        bundle = Bundle(folder, meta, tables, meta.get("fits", {}), noise)
        bundle.forward_factor()
        bundle.selection_factor()
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError("calibration", f"{folder} is inconsistent: {exc.__class__.__name__} {exc}") from None
    return bundle


def table_from_rows(name: str, spec: dict, rows, monotone: bool = True) -> OperatorTable:
    """The operator's grid (meta.json) filled from its rows; every grid point must be measured.
    monotone: made non-decreasing along every dim (a calibration's operators, whose dims are work)."""
    dims = tuple(spec["dims"])
    axes = [np.asarray(spec["axes"][d], dtype=float) for d in dims]
    values = np.full([len(a) for a in axes], np.nan)
    position = [{v: i for i, v in enumerate(a)} for a in axes]
    for point in rows[list(dims) + ["seconds"]].itertuples(index=False):
        try:
            index = tuple(position[i][float(point[i])] for i in range(len(dims)))
        except KeyError:
            continue
        values[index] = point[-1]
    if np.isnan(values).any():
        raise ValueError(f"operator {name} misses {int(np.isnan(values).sum())} of its grid points")
    if np.any(values <= 0):
        raise ValueError(f"operator {name} has a time of zero or less")
    # Every dim is work: more never takes less time, and a dip between grid points is noise.
    return OperatorTable(name, dims, axes, monotone_in_every_dim(values) if monotone else values,
                         power_above=POWER_ABOVE.get(name, 1.0))


def check_bundle(bundle: Bundle, scenario) -> list[str]:
    """Errors for a bundle of another model or dtype than the scenario's; warnings (returned) for
    one measured on another device than the scenario's hardware, or whose tables miss their
    held-out points by more than HELD_OUT_TARGET (with how much its timing rounds disagreed)."""
    meta = bundle.meta
    model = scenario.model_spec
    if meta["model"].get("hash") != model_hash(model) or meta["dtype"] != scenario.dtype:
        raise InputError("calibration", f"{repo_relative(bundle.path)} was measured for {meta['model'].get('name')} "
                                           f"{meta['dtype']}, the scenario runs {model.name} {scenario.dtype}")
    warnings = []
    hardware = meta["device"].get("hardware")
    if hardware != scenario.hardware_spec.name:
        warnings.append(f"calibration {repo_relative(bundle.path)} was measured on {meta['device'].get('name')} "
                        f"({hardware}), the scenario's hardware is {scenario.hardware_spec.name}")
    held = meta.get("held_out") or {}
    if (held.get("median_abs_error") or 0.0) > HELD_OUT_TARGET:
        noise = bundle.round_spread
        warnings.append(f"calibration {repo_relative(bundle.path)} holds out within a median {held['median_abs_error']:.1%} "
                        f"(target {HELD_OUT_TARGET:.0%})"
                        + (f"; its timing rounds of one point spanned a median {noise:.1%}"
                           f"{rounds_note(int(meta['rounds']))}" if noise is not None else ""))
    return warnings
