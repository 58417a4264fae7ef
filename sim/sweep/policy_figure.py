"""The report's policy figure: static best, adaptive and oracle speedups of one drafter, per load.

For each speculation method of a panel that the study also ran under a goodput or oracle policy:
the best static setting's speedup at each load (the highest over its static k), goodput's, and the
Oracle Proposal bound's, at the panel's smallest, middle and largest context. The gap between the
lines is what a policy could still win (static to goodput) and what no proposal length can
(goodput to the oracle).
"""
from __future__ import annotations

import pandas as pd

from sim.sweep.frames import METHOD_COLORS, context_label, within_divergence, y_axis_of

LINES = (("static", "solid", "best static k"), ("goodput", "dash", "goodput k"), ("oracle", "dot", "oracle proposal"))


def policy_gap_figure(frame: pd.DataFrame, title: str, max_divergence: float):
    """One panel's figure, or None when no method of it ran a goodput or oracle policy."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if "policy" not in frame:
        return None
    frame = frame[within_divergence(frame, max_divergence)]
    families = [m for m in frame["speculation"].unique()
                if m != "none" and frame.loc[frame.speculation == m, "policy"].isin(["goodput", "oracle"]).any()]
    if not families:
        return None
    y_name = y_axis_of(frame)
    contexts = sorted(frame["context"].dropna().unique())
    picks = list(dict.fromkeys([contexts[0], contexts[len(contexts) // 2], contexts[-1]])) if contexts else [None]
    fig = make_subplots(rows=1, cols=len(picks), subplot_titles=[f"context {context_label(c)}" for c in picks],
                        horizontal_spacing=0.06)
    for f, family in enumerate(families):
        color = METHOD_COLORS[f % len(METHOD_COLORS)]
        for j, context in enumerate(picks):
            sub = frame[(frame.speculation == family) & ((frame.context == context) if context is not None else True)]
            for policy, dash, label in LINES:
                best = sub[sub.policy == policy].groupby(y_name)["speedup"].max()
                if best.empty:
                    continue
                fig.add_trace(go.Scatter(
                    x=best.index, y=best.values, mode="lines+markers", name=f"{family}: {label}",
                    legendgroup=f"{family}-{policy}", showlegend=j == 0, line={"color": color, "dash": dash},
                    hovertemplate=f"{family}, {label}<br>{y_name} %{{x}}<br>speedup %{{y:.3f}}<extra></extra>"),
                    row=1, col=j + 1)
            fig.add_hline(y=1.0, line={"color": "#999", "width": 1}, row=1, col=j + 1)
        fig.update_xaxes(type="log", title_text=y_name)
    fig.update_yaxes(title_text="speedup", col=1)
    fig.update_layout(title=title, height=420, template="plotly_white")
    return fig
