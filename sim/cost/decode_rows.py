"""Decode attention at one request count, as the measured pricer reads it every simulated step
(sim/cost/measured.py): the generation table's grid cut at that count, latency over KV tokens."""
from __future__ import annotations

import math
from bisect import bisect_right

from sim.cost.log_grid import LogGrid


class DecodeRow:
    """Decode attention at one request count: the generation grid cut there (latency over KV), with
    what the verify shape scales by; `seconds` is the pricer's hot path, its lookups counted here
    and handed to the stack's TermOrigins when they are read."""
    __slots__ = ("log_kv", "log_seconds", "shortest", "longest", "bytes_per_kv", "bytes_per_q", "scale",
                 "query_s", "measured", "extrapolated", "cell")

    def __init__(self, row: LogGrid, bytes_per_kv: float, bytes_per_q: float, scale: float, query_s: float):
        self.log_kv, self.log_seconds = row.log_axes[0], row.table
        self.shortest, self.longest = row.ends[0]
        self.bytes_per_kv, self.bytes_per_q, self.scale = bytes_per_kv, bytes_per_q, scale
        self.query_s = query_s         # the roofline's seconds of one more query token in every request
        self.measured = self.extrapolated = 0
        # The last cell read, as its KV bounds and the power law between them (kv ** slope x
        # factor, the log-log line): a run reads the same cell step after step as its KV grows.
        self.cell = (math.inf, -math.inf, 0.0, 0.0)

    def seconds(self, query: float, kv: float, count: bool = True) -> float | None:
        """One layer's attention of `query` tokens a request (at most the roofline's memory-bound
        query) over `kv`: the row at min(kv, longest measured), scaled by the KV bytes read past the
        longest, plus the roofline's time of the query tokens past the first (the verify shape);
        None below the shortest measured KV. `count`: add the lookup to the row's origins."""
        if kv < self.shortest or len(self.log_kv) < 2:
            return None
        measured_kv = kv if kv <= self.longest else self.longest
        low, high, factor, slope = self.cell
        if not low <= measured_kv <= high:
            xs, ys = self.log_kv, self.log_seconds
            i = min(bisect_right(xs, math.log(measured_kv)), len(xs) - 1) - 1
            slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
            factor = math.exp(ys[i] - slope * xs[i])
            self.cell = (math.exp(xs[i]), math.exp(xs[i + 1]), factor, slope)
        seconds = factor * measured_kv ** slope
        if measured_kv != kv:
            seconds *= (kv * self.bytes_per_kv + self.bytes_per_q) / (measured_kv * self.bytes_per_kv
                                                                      + self.bytes_per_q)
            self.extrapolated += count
        else:
            self.measured += count
        return self.scale * seconds + (query - 1) * self.query_s
