"""The measured tables' own check: every fifth measured point held out and predicted by the
interpolation the pricer uses (sim/cost/log_grid.py) from the rest.

Each table is split into the grids the pricer reads (one per kernel and fixed key: a GEMM dtype, an
attention's heads and head dim, an MoE shape, an all-reduce's GPU count); within each grid, its
distinct points in axis order, every fifth held out. Only held points inside the rest's range are
scored: beyond it the pricer does not interpolate but scales the nearest point by the roofline,
which this check does not judge. `python -m sim tables --check` prints the table.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.cost.log_grid import LogGrid
from sim.cost.measured_tables import operator_tables

# table -> (family, the keys that pick one grid, the grid's axes in the pricer's order, the axis its
# holes are filled along first, as sim/cost/measured_tables.py builds it)
GRIDS = {
    "gemm_perf": ("gemm", ("kernel_source", "gemm_dtype"), ("k", "m", "n"), "k"),
    "generation_attention_perf": ("generation attention", ("kernel_source", "num_heads", "num_key_value_heads",
                                                          "head_dim", "kv_cache_dtype", "window_size"),
                                  ("batch_size", "kv_tokens"), "kv_tokens"),
    "context_attention_perf": ("context attention", ("kernel_source", "num_heads", "num_key_value_heads", "head_dim",
                                                     "kv_cache_dtype", "window_size"), ("batch_size", "isl"), "batch_size"),
    "generation_mla_perf": ("MLA generation", ("kernel_source", "num_heads", "kv_cache_dtype"), ("batch_size", "kv_tokens"), "kv_tokens"),
    "moe_perf": ("fused MoE", ("kernel_source", "moe_dtype", "hidden_size", "inter_size", "topk", "num_experts",
                               "moe_tp_size", "moe_ep_size", "distribution"), ("num_tokens",), "num_tokens"),
    "custom_allreduce_perf": ("all-reduce", ("kernel_source", "num_gpus"), ("message_size",), "message_size"),
}
EVERY = 5


@dataclass(frozen=True)
class CheckRow:
    system: str
    framework: str
    version: str
    family: str
    grids: int
    held: int
    median_abs_error: float
    p90_abs_error: float


def held_out_table(frame: pd.DataFrame, keys: tuple[str, ...], axes: tuple[str, ...], fill_first: str) -> np.ndarray:
    """|relative error| of every held point inside its grid's measured range, over all grids."""
    keys = tuple(k for k in keys if k in frame)
    errors = []
    for _, rows in frame.groupby(list(keys), sort=False) if keys else [((), frame)]:
        points = rows.groupby(list(axes), as_index=False, sort=False)["latency_s"].mean()   # in the table's order
        if len(points) < 2 * EVERY:
            continue
        held = np.zeros(len(points), dtype=bool)
        held[EVERY - 1::EVERY] = True
        kept = points[~held]
        inside = np.ones(held.sum(), dtype=bool)
        for axis in axes:
            values = points.loc[held, axis].to_numpy()
            inside &= (values >= kept[axis].min()) & (values <= kept[axis].max())
        if not inside.any():
            continue
        grid = LogGrid.from_frame(kept, axes, fill_first=fill_first)
        out = points[held][inside]
        predicted = np.array([grid(*p) for p in out[list(axes)].to_numpy(dtype=float)])
        errors.append(np.abs(predicted / out["latency_s"].to_numpy() - 1))
    return np.concatenate(errors) if errors else np.array([])


def check_tables(system: str, framework: str) -> list[CheckRow]:
    """One row per operator family of the GPU's and framework's current tables."""
    tables = operator_tables(system, framework)
    if tables is None:
        return []
    by_family: dict[str, list[np.ndarray]] = {}
    grids: dict[str, int] = {}
    for name, (family, keys, axes, fill_first) in GRIDS.items():
        frame = tables.frame(name)
        if frame is None:
            continue
        if "step" in frame and "kv_tokens" in axes:
            frame = frame.assign(kv_tokens=frame["step"] + 1)     # as the pricer reads it
        errors = held_out_table(frame, keys, axes, fill_first)
        by_family.setdefault(family, []).append(errors)
        present = [k for k in keys if k in frame]
        grids[family] = grids.get(family, 0) + (frame.groupby(present).ngroups if present else 1)
    rows = []
    for family, parts in by_family.items():
        errors = np.concatenate(parts)
        if len(errors):
            rows.append(CheckRow(system, framework, tables.version, family, grids[family], len(errors),
                                 float(np.median(errors)), float(np.quantile(errors, 0.9))))
    return rows


def check_markdown(rows: list[CheckRow], command: str) -> str:
    lines = [f"Reproduce: `{command}`", "",
             "| GPU | engine | version | family | grids | held points | median abs error | P90 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.system} | {r.framework} | {r.version} | {r.family} | {r.grids} | {r.held} | "
                     f"{r.median_abs_error:.1%} | {r.p90_abs_error:.1%} |")
    return "\n".join(lines)
