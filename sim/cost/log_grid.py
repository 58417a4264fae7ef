"""A measured latency over a rectilinear grid of positive axes, interpolated in log space.

Operator latencies are close to power laws in each axis over a few points (a GEMM's time in m is
flat, then linear; attention's in KV length linear past a floor), so a straight line between two
measured points in log(axis)-log(latency) is the interpolation that keeps both regimes: multilinear
over the grid's cell, in logs. A point outside an axis's measured range is clamped to it, and the
caller scales the clamped point's latency by its own model (the roofline's ratio, sim/cost/measured.py):
`lookup` says which axes it clamped. sim/cost/table_check.py holds the interpolation's own check.

A table need not fill its grid: the holes (a shape its collector skipped, a point held out by the check) are filled before lookups, each along the axes in the order given, from that
line's measured neighbours in log-log, so the first should be the smoothest one (a GEMM's k, generation attention's KV length).
"""
from __future__ import annotations

import math
from bisect import bisect_right
from itertools import product
from typing import Sequence

import numpy as np
import pandas as pd


class LogGrid:
    """Latency (seconds) over `axes`: multilinear interpolation in log(axis), log(latency)."""

    def __init__(self, axes: Sequence[np.ndarray], log_latency: np.ndarray):
        self.axes = [np.asarray(a, dtype=float) for a in axes]
        self.log_axes = [np.log(a).tolist() for a in self.axes]
        self.ends = [(float(a[0]), float(a[-1])) for a in self.axes]
        self.values = log_latency
        self.table = log_latency.tolist()     # nested lists: indexing them beats numpy's per scalar

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, axis_columns: Sequence[str], latency_s: str = "latency_s",
                   fill_first: str | None = None) -> "LogGrid":
        """The grid of `frame`'s rows over `axis_columns` (the mean where a point repeats), its holes
        filled along each axis in turn, `fill_first` (default the first axis) first (the module
        docstring)."""
        means = frame.groupby(list(axis_columns))[latency_s].mean()
        axes = [np.sort(frame[c].unique()).astype(float) for c in axis_columns]
        values = np.full([len(a) for a in axes], np.nan)
        index = tuple(np.searchsorted(a, np.asarray(means.index.get_level_values(i), dtype=float))
                      for i, a in enumerate(axes))
        values[index] = np.log(means.to_numpy(dtype=float))
        first = list(axis_columns).index(fill_first) if fill_first is not None else 0
        for dim in [first] + [d for d in range(len(axes)) if d != first]:
            fill_along(values, np.log(axes[dim]), dim)
        if np.isnan(values).any():
            fill_nearest(values)
        return cls(axes, values)

    def __call__(self, *point: float) -> float:
        return self.lookup(*point)[0]

    def lookup(self, *point: float) -> tuple[float, tuple[float, ...] | None]:
        """(seconds at `point`, the clamped point where some axis lies outside the grid, else None)."""
        cells = []
        clamped = None
        for dim, x in enumerate(point):
            logs = self.log_axes[dim]
            lx = math.log(x) if x > 0 else -math.inf
            if lx <= logs[0] or lx >= logs[-1]:
                end = 0 if lx <= logs[0] else -1
                if lx != logs[end]:
                    if clamped is None:
                        clamped = list(point)
                    clamped[dim] = self.ends[dim][end]
                last = len(logs) - 1
                cells.append((0, 0.0) if end == 0 or last == 0 else (last - 1, 1.0))
                continue
            i = bisect_right(logs, lx) - 1
            cells.append((i, (lx - logs[i]) / (logs[i + 1] - logs[i])))
        # Multilinear in the cell: off the hot path (the pricers cut a grid once to one axis and
        # read it with `inside1`), so one general sum over the cell's corners.
        value = 0.0
        for corner in product((0, 1), repeat=len(cells)):
            weight = 1.0
            node = self.table
            for (i, t), side in zip(cells, corner):
                weight *= t if side else 1.0 - t
                node = node[i + side] if (side and t) else node[i]
            if weight:
                value += weight * node
        return math.exp(value), (tuple(clamped) if clamped is not None else None)

    def section(self, dim: int, x: float) -> "LogGrid | None":
        """The grid of the other axes at `x` on axis `dim` (interpolated there as `lookup` would),
        or None where `x` lies outside that axis: a pricer's fixed shapes looked up once."""
        logs = self.log_axes[dim]
        lx = math.log(x) if x > 0 else -math.inf
        if not logs[0] <= lx <= logs[-1] or len(self.axes) < 2:
            return None
        if len(logs) == 1:
            values = np.take(self.values, 0, axis=dim)
        else:
            i = min(bisect_right(logs, lx), len(logs) - 1) - 1
            t = (lx - logs[i]) / (logs[i + 1] - logs[i])
            values = np.take(self.values, i, axis=dim) * (1.0 - t) + np.take(self.values, i + 1, axis=dim) * t
        return LogGrid([a for d, a in enumerate(self.axes) if d != dim], values)

    def inside1(self, x: float) -> float | None:
        """`lookup` of a 1-axis grid where x lies inside it, else None: the pricers' hot path."""
        xs = self.log_axes[0]
        lx = math.log(x)
        if not xs[0] <= lx <= xs[-1] or len(xs) < 2:
            return None
        i = min(bisect_right(xs, lx), len(xs) - 1) - 1
        row = self.table
        return math.exp(row[i] + (row[i + 1] - row[i]) * (lx - xs[i]) / (xs[i + 1] - xs[i]))


def fill_along(values: np.ndarray, log_axis: np.ndarray, dim: int) -> None:
    """Fill NaNs of every line along `dim` that has two or more measured points, linearly in logs
    between its neighbours (and from the nearest two beyond its ends); in place."""
    lines = np.ascontiguousarray(np.moveaxis(values, dim, -1))
    for line in lines.reshape(-1, lines.shape[-1]):     # views of the contiguous copy
        known = ~np.isnan(line)
        if known.all() or known.sum() < 2:
            continue
        x, y = log_axis[known], line[known]
        at = log_axis[~known]
        filled = np.interp(at, x, y)
        below, above = at < x[0], at > x[-1]
        # Beyond a line's measured ends: its end slope, kept within what an operator's latency can
        # do along one axis (never faster with more work, at most proportional to it).
        filled[below] = y[0] + (at[below] - x[0]) * np.clip((y[1] - y[0]) / (x[1] - x[0]), 0.0, 1.0)
        filled[above] = y[-1] + (at[above] - x[-1]) * np.clip((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0, 1.0)
        line[~known] = filled
    values[...] = np.moveaxis(lines, -1, dim)


def fill_nearest(values: np.ndarray) -> None:
    """The holes no line could fill (one measured point on every line through them): the nearest
    measured point's value, by index distance; in place."""
    known = np.argwhere(~np.isnan(values))
    for hole in np.argwhere(np.isnan(values)):
        nearest = known[np.abs(known - hole).sum(axis=1).argmin()]
        values[tuple(hole)] = values[tuple(nearest)]

