"""What `sim validate --published` writes: errors.csv (one row per case, provenance first), the
parity plot (measured against predicted speedup, fit and held half apart, anchors marked) and the
Markdown tables for docs/validation-published.md."""
from __future__ import annotations

import json

import pandas as pd

from sim.validate.published.predict import Prediction


def predictions_frame(predictions: list[Prediction]) -> pd.DataFrame:
    return pd.DataFrame([p.row() for p in predictions])


def read_published(path=None) -> pd.DataFrame | None:
    """The committed errors.csv of the published catalogue, or None where there is none."""
    from sim.bands import PUBLISHED
    from sim.validate.parity import read_validation

    path = PUBLISHED if path is None else path
    return read_validation(path) if path.exists() else None


def summarize(frame: pd.DataFrame) -> dict[str, dict]:
    """Per half of an errors.csv frame: scored cases and their sources, anchors, median, P90 and
    worst |error|, and which cases whose measured speedup is more than 10% from 1 are predicted
    on the other side of 1."""
    out = {}
    for half in ("fit", "held"):
        mine = frame[frame.half == half]
        scored = mine[mine.role == "predicted"]
        if scored.empty:
            continue
        errors = scored.error.abs()
        decisive = scored[(scored.measured_speedup - 1).abs() > 0.10]
        wrong = decisive[(decisive.measured_speedup - 1) * (decisive.predicted_speedup - 1) <= 0]
        out[half] = {"cases": len(scored), "anchors": int((mine.role == "anchor").sum()),
                     "sources": scored.source.nunique(), "median_abs_error": float(errors.median()),
                     "p90_abs_error": float(errors.quantile(0.9)), "worst_abs_error": float(errors.max()),
                     "decisive": len(decisive), "wrong_side": list(wrong.case)}
    return out


def halves_text(frame: pd.DataFrame) -> str:
    """Each half's scored cases and median / P90 |error|, in words."""
    return "; ".join(f"{half} half: {s['cases']} cases, median |error| {s['median_abs_error']:.1%}, "
                     f"P90 {s['p90_abs_error']:.1%}" for half, s in sorted(summarize(frame).items(), key=lambda t: t[0] != "held"))


def parity_html(frame: pd.DataFrame, title: str) -> str:
    return published_figure(frame, title).to_html(include_plotlyjs=True, full_html=True)


def published_figure(frame: pd.DataFrame, title: str):
    """Measured against predicted speedup, one marker per case: fit and held half apart, anchors
    (which set acceptance and are not scored) as crosses, the ±20% lines."""
    import plotly.graph_objects as go

    fig = go.Figure()
    both = pd.concat([frame.measured_speedup, frame.predicted_speedup]).astype(float)
    lo, hi = float(both.min()) * 0.9, float(both.max()) * 1.1
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"color": "#888", "dash": "dash"}, name="y = x"))
    for lines in (0.8, 1.2):
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo * lines, hi * lines], mode="lines", showlegend=lines == 0.8,
                                 line={"color": "#ccc", "dash": "dot"}, name="±20%"))
    styles = {("held", "predicted"): ("#ef553b", "circle"), ("fit", "predicted"): ("#636efa", "circle"),
              ("held", "anchor"): ("#ef553b", "x"), ("fit", "anchor"): ("#636efa", "x")}
    for (half, role), (color, symbol) in styles.items():
        rows = frame[(frame.half == half) & (frame.role == role)]
        if rows.empty:
            continue
        text = [f"{r.case}<br>{r.source}: {r.model} on {r.gpus}x {r.hardware}, {r.engine}, {r.dtype}<br>{r.method}, "
                f"{r.metric}, batch {r.batch if pd.notna(r.batch) else '-'}"
                + (f"<br>error {r.error:+.1%}" if pd.notna(r.error) else "<br>anchor (sets acceptance)")
                for r in rows.itertuples()]
        fig.add_trace(go.Scatter(x=rows.measured_speedup, y=rows.predicted_speedup, mode="markers",
                                 name=f"{half} half, {'anchors' if role == 'anchor' else 'predicted'}",
                                 marker={"color": color, "symbol": symbol, "size": 9}, text=text,
                                 hovertemplate="%{text}<br>measured %{x:.2f}x<br>predicted %{y:.2f}x<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="measured speedup", yaxis_title="predicted speedup",
                      template="plotly_white", height=620, width=900)
    return fig


def csv_text(frame: pd.DataFrame, provenance: dict) -> str:
    return f"# provenance: {json.dumps(provenance)}\n" + frame.to_csv(index=False)


def markdown_tables(frame: pd.DataFrame, summary: dict, command: str) -> str:
    pct = lambda x: f"{x:.1%}"
    lines = [f"Reproduce: `{command}`", "",
             "| half | scored cases (sources) | anchors | median abs error | P90 | worst | measured >10% from 1: on the wrong side |",
             "|---|---|---|---|---|---|---|"]
    for half, s in summary.items():
        wrong = f"{len(s['wrong_side'])} of {s['decisive']}" + (f" ({', '.join(s['wrong_side'])})" if s["wrong_side"] else "")
        lines.append(f"| {half} | {s['cases']} ({s['sources']}) | {s['anchors']} | {pct(s['median_abs_error'])} | "
                     f"{pct(s['p90_abs_error'])} | {pct(s['worst_abs_error'])} | {wrong} |")
    lines += ["", "Per source: over its scored cases, the median abs error and the signed errors' range; over "
              "all its cases, anchors included, drafting's share of the speculative runs' time (its range) and "
              "the cases whose layers a published kernel table priced, and those whose kernels the measured operator "
              "tables priced (aiconfigurator-core: the GPU, engine and version), the rest by the roofline", "",
              "| source | half | cases | anchors | median abs error | error range | draft share | measured kernels "
              "| measured tables | hardware | engine | method |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for source, rows in frame.groupby("source", sort=False):
        errors = rows[rows.role == "predicted"].error
        listed = lambda values: ", ".join(sorted(set(values)))
        cells = (f"{pct(errors.abs().median())} | {errors.min():+.0%} to {errors.max():+.0%}" if len(errors) else "- | -")
        share = f"{rows.draft_share.min():.0%}-{rows.draft_share.max():.0%}"
        kernels = (rows.kernels.fillna("") != "").sum()
        measured = rows.cost.fillna("").str.startswith("measured:")
        tables = (f"{measured.sum()} of {len(rows)}"
                  + (f" ({listed(c.removeprefix('measured:') for c in rows.cost[measured])})" if measured.any() else ""))
        lines.append(f"| {source} | {rows.half.iloc[0]} | {len(errors)} | {len(rows) - len(errors)} | {cells} | "
                     f"{share} | {kernels} of {len(rows)} | {tables} | "
                     f"{listed(f'{g}x {h}' for g, h in zip(rows.gpus, rows.hardware))} | {listed(rows.engine)} | "
                     f"{listed(rows.method)} |")
    return "\n".join(lines)
