"""What the report's figures share: colours, the context label, and the selections of a results
table (settings within the divergence limit, each cell's best setting, a panel's load axis)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sim.formats.names import PHASES

METHOD_COLORS = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880",
                 "#ff97ff", "#fecb52"]
PHASE_COLORS = dict(zip(PHASES, ["#8c8c8c", "#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#ff7f0e", "#d62728",
                                 "#e377c2", "#bcbd22"]))


def context_label(tokens) -> str:
    if tokens is None or (isinstance(tokens, float) and math.isnan(tokens)):
        return "mixed"
    tokens = int(tokens)
    return f"{tokens // 1024}K" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def within_divergence(frame: pd.DataFrame, max_divergence: float) -> pd.Series:
    """Whether each point's quality cost is acceptable: lossless, or diverging from full
    verification on at most `max_divergence` of output tokens."""
    div = frame["divergence_rate"].astype(float)
    return div.isna() | (div <= max_divergence)


def eligible(frame: pd.DataFrame, max_divergence: float) -> pd.DataFrame:
    return frame[within_divergence(frame, max_divergence)]


def best_settings(frame: pd.DataFrame, by: list[str], metric: str = "speedup") -> pd.DataFrame:
    """Per cell of `by`, the row with the highest `metric` (ties: the first in study order)."""
    if frame.empty:
        return frame
    ranked = frame.assign(_order=np.arange(len(frame))).sort_values([metric, "_order"], ascending=[False, True])
    return ranked.drop_duplicates(by).drop(columns="_order")


def y_axis_of(frame: pd.DataFrame) -> str:
    """The load axis of a panel: closed-loop batch, else Poisson rate, else (traces) requests."""
    for name in ("batch", "rate_qps"):
        if frame[name].notna().any():
            return name
    return "requests"
