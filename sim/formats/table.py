"""One measured operator: seconds on a regular grid over its dims, interpolated in log-log space.

Inside the grid: multilinear interpolation of log(seconds) over log(coordinates). Interpolating
logs keeps power laws exact (a linear's time is linear in tokens past its ridge, flat below it)
and never crosses zero; piecewise-linear pieces never leave the range of the neighbouring
measurements (monotone between grid points, no spline overshoot). The table interpolates what it
is given; sim/formats/bundle.py gives it the measured grid made monotone in every dim first
(`monotone_in_every_dim`: more tokens, KV or batch never cost less, so a dip is timing noise;
held-out error 7.8-10.1% median instead of 7.9-10.4% on the four CPU bundles of 04:34-13:14).

Outside the grid (documented in docs/architecture.md):
- below an axis's smallest value: the value there (a latency floor: fewer tokens cost no less);
- above its largest: the value there scaled by (x / largest) ** power_above: 1 (the default),
  linear in that dim, which is what a bandwidth- or compute-bound operator does once it is past its
  launch overheads; 2 for a whole prompt's attention, whose work grows with the square of the
  prompt; 0 for a table of ratios rather than times, which holds its last value.
"""
from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np


class OperatorTable:
    def __init__(self, name: str, dims: tuple[str, ...], axes: list[np.ndarray], seconds: np.ndarray,
                 power_above: float = 1.0):
        if seconds.shape != tuple(len(a) for a in axes):
            raise ValueError(f"{name}: {seconds.shape} values for a grid of {[len(a) for a in axes]}")
        if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
            raise ValueError(f"{name}: a grid value is missing, zero or negative")
        for a in axes:
            if len(a) < 1 or np.any(np.diff(a) <= 0) or a[0] <= 0:
                raise ValueError(f"{name}: grid axis {list(a)} is not positive and increasing")
        self.name = name
        self.dims = dims
        self.power_above = power_above
        self.axes = [np.asarray(a, dtype=float) for a in axes]
        self.seconds = np.asarray(seconds, dtype=float)
        self._log_axes = [[math.log(x) for x in a] for a in self.axes]
        self._max = [float(a[-1]) for a in self.axes]
        self._log_values = np.log(self.seconds)

    def __call__(self, *coords: float) -> float:
        """Seconds at one point (coords in the order of dims)."""
        scale = 1.0
        corners = [((), 1.0)]
        for axis, x in enumerate(coords):
            log_axis = self._log_axes[axis]
            if x > self._max[axis]:
                scale *= (x / self._max[axis]) ** self.power_above
                x = self._max[axis]
            lx = math.log(max(x, 1e-300))
            i = bisect_right(log_axis, lx) - 1
            if i < 0:
                options = ((0, 1.0),)
            elif i >= len(log_axis) - 1:
                options = ((len(log_axis) - 1, 1.0),)
            else:
                w = (lx - log_axis[i]) / (log_axis[i + 1] - log_axis[i])
                options = ((i, 1.0 - w), (i + 1, w))
            corners = [(index + (j,), weight * wj) for index, weight in corners for j, wj in options if wj > 0]
        log_seconds = sum(weight * self._log_values[index] for index, weight in corners)
        return math.exp(log_seconds) * scale


def monotone_in_every_dim(seconds: np.ndarray) -> np.ndarray:
    """A table that never decreases along any axis, close to the measured one.

    Each of an operator's dims is work (tokens, batch, KV, context, budget), so more of it never
    takes less time; a measured dip is timing noise. Isotonic regression (least squares in log
    seconds) along the first axis, then the next, and so on: each pass keeps the order the earlier
    ones made, so one pass over the axes leaves every axis non-decreasing. (Not the joint least-
    squares projection, which would need Dykstra's alternating scheme; on these grids the dips are
    a few neighbouring points and the difference is far below the timing noise.)
    """
    from scipy.optimize import isotonic_regression

    logs = np.log(np.asarray(seconds, dtype=float))
    for axis in range(logs.ndim):
        logs = np.apply_along_axis(lambda line: isotonic_regression(line).x, axis, logs)
    return np.exp(logs)
