"""The parity plot: predicted against measured throughput and speedup, one marker per live run and
prediction, and the validation.csv it is drawn from (`sim validate` writes both; the sweep's
report draws the figure too)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from sim.errors import InputError
from sim.formats.provenance import read_results_csv

if TYPE_CHECKING:
    from sim.validate.compare import Comparison


def parity_figure(validation: pd.DataFrame, title: str):
    """Predicted against measured throughput and speedup, one marker per live run and prediction
    (the rows of `sim validate`'s validation.csv)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput (tok/s)", "speedup over autoregressive"))
    colors = {"cost model": "#636efa", "replay": "#00cc96", "fitted": "#ef553b"}
    for col, metric in ((1, "tok_s"), (2, "speedup")):
        rows = validation[validation[f"measured_{metric}"].notna() & validation[f"predicted_{metric}"].notna()]
        if rows.empty:
            continue
        both = pd.concat([rows[f"measured_{metric}"], rows[f"predicted_{metric}"]]).astype(float)
        lo, hi = float(both.min()) * 0.9, float(both.max()) * 1.1
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"color": "#888", "dash": "dash"},
                                 name="y = x", showlegend=col == 1), row=1, col=col)
        for prediction, color in colors.items():
            mine = rows[rows.prediction == prediction]
            if mine.empty:
                continue
            errors = mine.get(f"{metric}_error", pd.Series([None] * len(mine), index=mine.index))
            fig.add_trace(go.Scatter(
                x=mine[f"measured_{metric}"], y=mine[f"predicted_{metric}"], mode="markers", name=prediction,
                marker={"color": color, "size": 9}, showlegend=col == 1, legendgroup=prediction,
                text=[f"{r.run}<br>{r.drafter}, batch {r.batch}, context {float(r.context):.0f}<br>error "
                      f"{'-' if pd.isna(e) else format(float(e), '+.1%')}" for r, e in zip(mine.itertuples(), errors)],
                hovertemplate="%{text}<br>measured %{x:.3f}<br>predicted %{y:.3f}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="measured", row=1, col=col)
        fig.update_yaxes(title_text="predicted", row=1, col=col)
    fig.update_layout(title=title, height=520, template="plotly_white")
    return fig


def comparisons_frame(rows: list[Comparison]):
    return pd.DataFrame([r.row() for r in rows])


def parity_html(rows: list[Comparison], title: str) -> str:
    """A self-contained HTML page (plotly inlined, works offline): predicted against measured
    throughput and speedup, one marker per run and prediction, the y = x line."""
    fig = parity_figure(comparisons_frame(rows), title)
    fig.update_layout(width=1100)
    return fig.to_html(include_plotlyjs=True, full_html=True)


def read_validation(path: Path) -> pd.DataFrame:
    """A validation.csv or errors.csv written by `sim validate` (its first line is a provenance
    comment)."""
    try:
        return read_results_csv(path)
    except (OSError, ValueError) as exc:
        raise InputError("--validation", f"cannot read {path}: {exc}") from None
