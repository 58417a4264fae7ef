"""The capacity-planning report's figures of a sweep's results table (sim/sweep/report.py): speedup
heatmaps per method over batch x context with the speedup < 1 region marked, speedup and quality
cost against partial-verification budget and period, where the time goes, and throughput against
latency."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sim.formats.names import PHASES
from sim.sweep.frames import (METHOD_COLORS, PHASE_COLORS, best_settings, context_label, eligible, within_divergence,
                              y_axis_of)


def heatmap_figure(frame: pd.DataFrame, title: str, max_divergence: float):
    """One heatmap per speculative method: the best of its settings per (batch, context)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    y_name = y_axis_of(frame)
    methods = [m for m in frame["method"].unique() if (frame.loc[frame.method == m, "speculation"] != "none").any()]
    if not methods:
        return None
    contexts = sorted(frame["context"].dropna().unique())
    ys = sorted(frame[y_name].dropna().unique())
    cols = min(3, len(methods))
    rows = math.ceil(len(methods) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=methods, horizontal_spacing=0.08,
                        vertical_spacing=0.14 if rows > 1 else 0.1)
    x_labels = [context_label(c) for c in contexts]
    y_labels = [str(int(y)) if float(y).is_integer() else f"{y:g}" for y in ys]
    finite = frame.loc[frame.speculation != "none", "speedup"].dropna()
    zmax = max(1.5, float(finite.max()) if len(finite) else 1.5)
    zmin = min(0.5, float(finite.min()) if len(finite) else 0.5)
    one = (1 - zmin) / (zmax - zmin)     # white at speedup 1: red below, blue above
    colorscale = [[0, "#b2182b"], [one * 0.999, "#fddbc7"], [one, "#f7f7f7"], [1, "#2166ac"]]
    for i, method in enumerate(methods):
        row, col = i // cols + 1, i % cols + 1
        mine = frame[frame.method == method]
        # Per cell the best setting within the divergence limit; where every setting is too lossy,
        # the best of them, flagged.
        cells = (mine.assign(_flagged=~within_divergence(mine, max_divergence), _order=np.arange(len(mine)))
                 .sort_values(["_flagged", "speedup", "_order"], ascending=[True, False, True])
                 .drop_duplicates([y_name, "context"]))
        z = np.full((len(ys), len(contexts)), np.nan)
        text = np.full(z.shape, "", dtype=object)
        hover = np.full(z.shape, "not in the study", dtype=object)
        for _, r in cells.iterrows():
            if pd.isna(r["context"]) or pd.isna(r[y_name]):
                continue
            yi, xi = ys.index(r[y_name]), contexts.index(r["context"])
            flagged = r["_flagged"]
            z[yi, xi] = r["speedup"]
            text[yi, xi] = f"{r['speedup']:.2f}" + (" ▼" if r["speedup"] < 1 else "") + (" ⚠" if flagged else "")
            hover[yi, xi] = (
                f"{r['settings']}<br>speedup {r['speedup']:.3f}x (decode only {number_text(r['decode_speedup'], '.3f')}x)"
                + trust_text(r)
                + f"<br>{r['throughput_tok_s']:.0f} tok/s, TPOT p90 {number_text(r['tpot_ms_p90'], '.1f')} ms"
                + (f"<br>diverges on {r['divergence_rate']:.2%} of tokens" if pd.notna(r["divergence_rate"]) else "")
                + (f" (⚠ above the study's {max_divergence:.1%})" if flagged else ""))
        fig.add_trace(go.Heatmap(
            z=z, x=x_labels, y=y_labels, text=text, texttemplate="%{text}", customdata=hover,
            hovertemplate=f"{method}, {y_name} %{{y}}, context %{{x}}<br>%{{customdata}}<extra></extra>",
            colorscale=colorscale, zmin=zmin, zmax=zmax,
            showscale=i == 0, colorbar={"title": "speedup"}, xgap=1, ygap=1), row=row, col=col)
        for k, j in np.argwhere(z < 1):   # the speedup < 1 region, outlined cell by cell
            fig.add_shape(type="rect", x0=j - 0.5, x1=j + 0.5, y0=k - 0.5, y1=k + 0.5, row=row, col=col,
                          line={"color": "#b2182b", "width": 2})
        fig.update_xaxes(title_text="context (tokens)", type="category", row=row, col=col)
        fig.update_yaxes(title_text=y_name, type="category", row=row, col=col)
    fig.update_layout(title=title, height=330 * rows + 80, template="plotly_white", margin={"t": 90})
    return fig


def budget_period_figure(frame: pd.DataFrame, title: str):
    """Partial verification: speedup and divergence from full verification against the budget,
    one line per full-verify period, at the smallest batch, one row of panels per context."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    pv = frame[frame["budget"].notna()]
    if pv.empty:
        return None
    y_name = y_axis_of(pv)
    smallest = pv[y_name].min()
    pv = pv[pv[y_name] == smallest]
    contexts = sorted(pv["context"].dropna().unique())
    if not contexts:
        return None
    periods = sorted(pv["period"].unique())
    fig = make_subplots(rows=len(contexts), cols=2, horizontal_spacing=0.1, vertical_spacing=0.08,
                        subplot_titles=[t for c in contexts for t in
                                        (f"speedup, context {context_label(c)}",
                                         f"quality cost: tokens diverging from full verification, context {context_label(c)}")])
    for row, context in enumerate(contexts, start=1):
        for j, period in enumerate(periods):
            sub = pv[(pv.context == context) & (pv.period == period)]
            sub = best_settings(sub, ["budget"]).sort_values("budget")
            color = METHOD_COLORS[j % len(METHOD_COLORS)]
            for col, metric in ((1, "speedup"), (2, "divergence_rate")):
                fig.add_trace(go.Scatter(
                    x=sub["budget"], y=sub[metric], mode="lines+markers", name=f"period {period:g}",
                    legendgroup=f"p{period}", showlegend=row == 1 and col == 1, line={"color": color},
                    hovertemplate=f"period {period:g}, budget %{{x}}<br>{metric} %{{y:.4g}}<extra></extra>"),
                    row=row, col=col)
        fig.update_xaxes(type="log", title_text="budget (tokens)", row=row)
        fig.update_yaxes(tickformat=".1%", row=row, col=2)
    fig.update_layout(title=f"{title} ({y_name} {smallest:g})", height=300 * len(contexts) + 120,
                      template="plotly_white", margin={"t": 90})
    return fig


def time_share_figure(frame: pd.DataFrame, title: str, max_divergence: float):
    """Where the time goes: stacked shares per method (its best setting) at the smallest, middle
    and largest batch, at the middle context."""
    import plotly.graph_objects as go

    y_name = y_axis_of(frame)
    contexts = sorted(frame["context"].dropna().unique())
    ys = sorted(frame[y_name].dropna().unique())
    if not contexts or not ys:
        return None
    context = contexts[len(contexts) // 2]
    picked_ys = sorted({ys[0], ys[len(ys) // 2], ys[-1]})
    sub = eligible(frame[(frame.context == context) & frame[y_name].isin(picked_ys)], max_divergence)
    best = best_settings(sub, ["method", y_name])
    best = best.assign(_m=best["method"].map({m: i for i, m in enumerate(frame["method"].unique())}))
    best = best.sort_values([y_name, "_m"])
    labels = [f"{r['method']} · {y_name} {r[y_name]:g}" for _, r in best.iterrows()]
    fig = go.Figure()
    for phase in PHASES:
        values = best[f"share_{phase}"].fillna(0.0).to_numpy()
        if not (values > 0.0005).any():
            continue
        fig.add_trace(go.Bar(x=labels, y=values, name=phase, marker_color=PHASE_COLORS[phase],
                             hovertemplate=f"{phase} %{{y:.1%}}<extra>%{{x}}</extra>"))
    fig.update_layout(barmode="stack", title=f"{title}: share of engine time, context {context_label(context)}",
                      yaxis={"tickformat": ".0%", "title": "share of busy time"}, height=460,
                      template="plotly_white", xaxis={"tickangle": -35})
    return fig


def throughput_latency_figure(frame: pd.DataFrame, title: str, max_divergence: float, tpot_slo: float | None):
    """Throughput against TPOT (each method's best setting per batch), and the cost per million
    output tokens against batch, at the middle context."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    y_name = y_axis_of(frame)
    contexts = sorted(frame["context"].dropna().unique())
    if not contexts:
        return None
    context = contexts[len(contexts) // 2]
    sub = eligible(frame[frame.context == context], max_divergence)
    best = best_settings(sub, ["method", y_name], metric="throughput_tok_s")
    has_cost = best["cost_per_mtok_usd"].notna().any()
    fig = make_subplots(rows=1, cols=2 if has_cost else 1, horizontal_spacing=0.1,
                        subplot_titles=["throughput against TPOT p90"] + (["cost per million output tokens"] if has_cost else []))
    for i, method in enumerate(frame["method"].unique()):
        m = best[best.method == method].sort_values(y_name)
        if m.empty:
            continue
        color = METHOD_COLORS[i % len(METHOD_COLORS)]
        fig.add_trace(go.Scatter(
            x=m["tpot_ms_p90"], y=m["throughput_tok_s"], mode="lines+markers", name=method, legendgroup=method,
            line={"color": color}, text=[f"{y_name} {v:g}, {s}" for v, s in zip(m[y_name], m["settings"])],
            hovertemplate="%{text}<br>TPOT p90 %{x:.1f} ms<br>%{y:.0f} tok/s<extra>" + method + "</extra>"),
            row=1, col=1)
        if has_cost:
            fig.add_trace(go.Scatter(
                x=m[y_name], y=m["cost_per_mtok_usd"], mode="lines+markers", name=method, legendgroup=method,
                showlegend=False, line={"color": color},
                hovertemplate=f"{y_name} %{{x}}<br>$%{{y:.3f}} per million tokens<extra>{method}</extra>"),
                row=1, col=2)
    if tpot_slo is not None:    # a trace, not a shape: shapes take log10 coordinates on log axes
        top = float(best["throughput_tok_s"].max()) if len(best) else 1.0
        fig.add_trace(go.Scatter(x=[tpot_slo, tpot_slo], y=[0, top * 1.05], mode="lines", name=f"TPOT SLO {tpot_slo:g} ms",
                                 line={"dash": "dash", "color": "#b2182b"}, hoverinfo="skip"), row=1, col=1)
    fig.update_xaxes(title_text="TPOT p90 (ms)", row=1, col=1)
    fig.update_yaxes(title_text="output tokens/s", row=1, col=1)
    if has_cost:
        fig.update_xaxes(title_text=y_name, type="log", row=1, col=2)
        fig.update_yaxes(title_text="USD per million output tokens", type="log", row=1, col=2)
    fig.update_layout(title=f"{title}: context {context_label(context)}", height=480, template="plotly_white")
    return fig


# ---- tables ----------------------------------------------------------------------------------------


def number_text(value, spec: str) -> str:
    """`value` formatted by `spec`, or a dash where there is none."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def trust_text(row) -> str:
    """The speedup's error band (sim/bands.py) for a heatmap cell's hover."""
    band = row.get("speedup_band")
    if band is None or pd.isna(band):
        return "<br>no comparable validated case" if row.get("speculation") != "none" else ""
    widened = row.get("speedup_band_widened")      # absent from a results log written before it
    if widened is not None and not pd.isna(widened) and bool(widened):
        return (f"<br>within about ±{band:.2f}: its kind's held-out P90, {int(row['speedup_band_cases'])} "
                f"comparable cases within reach")
    return f"<br>within about ±{band:.2f} on {int(row['speedup_band_cases'])} comparable validated cases"
