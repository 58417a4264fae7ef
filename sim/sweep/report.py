"""The capacity-planning report: one self-contained HTML file (plotly inlined, no network) built from a
sweep's results table.

Sections: speedup heatmaps (batch x context) per method with the speedup < 1 region marked; speedup
and quality cost against partial-verification budget and period; where the time goes; throughput
against latency and cost per million tokens; the recommended method per (batch, context) under the
study's SLOs; the validation parity plot when given; provenance.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim.formats.names import PHASES
from sim.sweep.engine_config import engine_config_html, engine_configs
from sim.sweep.policy_figure import policy_gap_figure
from sim.sweep.frames import (METHOD_COLORS, PHASE_COLORS, best_settings, context_label, eligible, within_divergence,
                              y_axis_of)
from sim.validate.parity import parity_figure
from sim.validate.published.report import halves_text, published_figure, read_published

# ---- figures ---------------------------------------------------------------------------------------

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
                f"{r['settings']}<br>speedup {r['speedup']:.3f}x (decode only {_num(r['decode_speedup'], '.3f')}x)"
                + trust_text(r)
                + f"<br>{r['throughput_tok_s']:.0f} tok/s, TPOT p90 {_num(r['tpot_ms_p90'], '.1f')} ms"
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

def slo_overshoot(frame: pd.DataFrame, slo: dict) -> pd.Series:
    """Per point, the larger of p90 TTFT / its SLO and p90 TPOT / its SLO (1 = exactly at the SLO)."""
    ratios = [frame[f"{name}_p90"].astype(float) / slo[f"{name}_p90"] for name in ("ttft_ms", "tpot_ms")
              if slo.get(f"{name}_p90")]
    if not ratios:
        return pd.Series(0.0, index=frame.index)
    return pd.concat(ratios, axis=1).max(axis=1).fillna(np.inf)


def recommendations(frame: pd.DataFrame, max_divergence: float, slo: dict | None = None) -> pd.DataFrame:
    """Per panel and (load, context) cell: the configuration with the highest throughput among
    those meeting the SLOs (p90 TTFT and TPOT, when the study sets them) whose quality cost is
    within `max_divergence`, and its speedup over its own baseline. `choice` is None where nothing
    meets the SLOs."""
    slo = slo or {}
    out = []
    for panel, points in frame.groupby("panel", sort=False):
        y_name = y_axis_of(points)
        for (y, context), sub in points.groupby([y_name, "context"], dropna=False, sort=True):
            ok = eligible(sub, max_divergence)
            ok = ok[ok["slo_met"].isna() | (ok["slo_met"] == True)]   # noqa: E712 (nullable column)
            row = {"panel": panel, "load_axis": y_name, "load": y, "context": context}
            if ok.empty:
                # The nearest miss: the point whose worse SLO ratio is smallest, to say by how much.
                near = sub.assign(_over=slo_overshoot(sub, slo)).sort_values("_over").iloc[0]
                row.update(choice=None, settings=None, speedup=None, throughput_tok_s=None,
                           tpot_ms_p90=near["tpot_ms_p90"], ttft_ms_p90=near["ttft_ms_p90"], cost_per_mtok_usd=None,
                           nearest=f"{near['method']} {near['settings']}".replace(" -", ""))
            else:
                best = best_settings(ok, [y_name, "context"], metric="throughput_tok_s").iloc[0]
                row.update(choice=best["method"], settings=best["settings"], speedup=best["speedup"],
                           throughput_tok_s=best["throughput_tok_s"], tpot_ms_p90=best["tpot_ms_p90"],
                           ttft_ms_p90=best["ttft_ms_p90"], cost_per_mtok_usd=best["cost_per_mtok_usd"])
            out.append(row)
    return pd.DataFrame(out)


def recommendation_html(rec: pd.DataFrame, method_colors: dict) -> str:
    """A (batch x context) grid per group and hardware: the recommended method, its settings and
    its speedup over no speculation."""
    parts = []
    for panel, sub in rec.groupby("panel", sort=False):
        y_name = sub["load_axis"].iloc[0]
        contexts = sorted(sub["context"].dropna().unique())
        ys = sorted(sub["load"].dropna().unique())
        head = "".join(f"<th>{context_label(c)}</th>" for c in contexts)
        body = []
        for y in ys:
            cells = []
            for c in contexts:
                r = sub[(sub["load"] == y) & (sub.context == c)]
                if r.empty:
                    cells.append("<td class='na'>-</td>")
                    continue
                r = r.iloc[0]
                if r["choice"] is None or (isinstance(r["choice"], float) and math.isnan(r["choice"])):
                    cells.append(f"<td class='miss' title='no configuration meets the SLOs; nearest: "
                                 f"{html.escape(str(r.get('nearest')))}'>SLO missed<br><small>nearest: TTFT p90 "
                                 f"{r['ttft_ms_p90'] / 1e3:.1f} s, TPOT p90 {r['tpot_ms_p90']:.0f} ms</small></td>")
                    continue
                color = method_colors.get(r["choice"], "#999")
                cost = "" if pd.isna(r["cost_per_mtok_usd"]) else f", ${r['cost_per_mtok_usd']:.3f}/Mtok"
                cells.append(
                    f"<td style='border-left:4px solid {color}' title='{html.escape(str(r['settings']))}: "
                    f"{r['throughput_tok_s']:.0f} tok/s, TPOT p90 {r['tpot_ms_p90']:.1f} ms, TTFT p90 "
                    f"{r['ttft_ms_p90']:.0f} ms{cost}'><b>{html.escape(r['choice'])}</b> {r['speedup']:.2f}x"
                    f"<br><small>{html.escape(str(r['settings']))}</small></td>")
            body.append(f"<tr><th>{y:g}</th>{''.join(cells)}</tr>")
        parts.append(f"<h3>{html.escape(str(panel))}</h3>"
                     f"<table class='rec'><tr><th>{y_name} \\ context</th>{head}</tr>{''.join(body)}</table>")
    return "\n".join(parts)


def _num(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


# ---- the page --------------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 24px auto; max-width: 1400px; color: #222; }
h1 { margin-bottom: 4px; } h2 { margin-top: 40px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.note { color: #555; max-width: 1000px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 24px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
table.rec td { min-width: 110px; } td.miss { background: #fbe3e4; color: #8a1f11; } td.na { color: #aaa; }
pre { background: #f6f8fa; padding: 12px; overflow-x: auto; font-size: 12px; }
nav a { margin-right: 14px; }
"""


def trust_text(row) -> str:
    """The speedup's error band (sim/bands.py) for a heatmap cell's hover."""
    band = row.get("speedup_band")
    if band is None or pd.isna(band):
        return "<br>no comparable validated case" if row.get("speculation") != "none" else ""
    return f"<br>within about ±{band:.2f} on {int(row['speedup_band_cases'])} comparable validated cases"


def build_report(frame: pd.DataFrame, provenance: dict, validation: pd.DataFrame | None = None) -> str:
    """The whole HTML page for a sweep's results."""
    from plotly.offline import get_plotlyjs

    study = provenance.get("study", {})
    max_div = float(study.get("max_divergence", 0.01))
    slo = study.get("slo") or {}
    figures: list[tuple[str, str, object]] = []      # (section, anchor, figure)
    methods = list(frame["method"].unique())
    method_colors = {m: METHOD_COLORS[i % len(METHOD_COLORS)] for i, m in enumerate(methods)}

    if "panel" not in frame:     # a table from before panels were recorded
        frame = frame.assign(panel=frame["group"] + " on " + frame["hardware"])
    for name, sub in frame.groupby("panel", sort=False):
        figures.append(("policies", name, policy_gap_figure(sub, f"Static best, goodput and oracle: {name}", max_div)))
    if "policy" in frame:
        # The oracle is a bound, not a configuration: no heatmap, share, cost or recommendation.
        frame = frame[frame.policy != "oracle"]
    panels = list(frame.groupby("panel", sort=False))
    for name, sub in panels:
        figures.append(("heatmaps", name, heatmap_figure(sub, f"Speedup over no speculation: {name}", max_div)))
    for name, sub in panels:
        figures.append(("partial", name, budget_period_figure(sub, f"Partial verification: {name}")))
    for name, sub in panels:
        figures.append(("shares", name, time_share_figure(sub, name, max_div)))
    for name, sub in panels:
        figures.append(("latency", name, throughput_latency_figure(sub, name, max_div, slo.get("tpot_ms_p90"))))
    if validation is not None and not validation.empty:
        figures.append(("validation", "validation", parity_figure(
            validation, "Validation: the simulator against live runs (sim validate)")))
    published = read_published()
    if published is not None:
        figures.append(("published", "published", published_figure(
            published, "Published GPU measurements: predicted against measured speedup (sim validate --published)")))
    figures = [(s, n, f) for s, n, f in figures if f is not None]

    def section_html(section: str) -> str:
        out = []
        for i, (s, name, fig) in enumerate(figures):
            if s == section:
                out.append(fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{section}-{i}",
                                       config={"displaylogo": False, "responsive": True}))
        return "\n".join(out) or "<p class='note'>Not in this study.</p>"

    rec = recommendations(frame, max_div, slo)
    slo_text = ", ".join(f"{k.replace('_ms_p90', '')} p90 ≤ {v:g} ms" for k, v in slo.items() if v) or "none set"
    n_points = len(frame)
    hurts = frame[(frame.speculation != "none") & (frame.speedup < 1)]
    headline = (f"{n_points} points; speculation slows the engine down (speedup &lt; 1) at {len(hurts)} of "
                f"{int((frame.speculation != 'none').sum())} speculative points.")
    sections = [
        ("heatmaps", "Speedup by batch and context",
         "Each panel is one method at the best of its settings (highest throughput speedup over the same "
         f"workload without speculation; lossy settings only within {max_div:.1%} divergence, and ⚠ where every "
         "setting diverges more). Red cells, outlined and marked ▼, are where speculation hurts. Hover for the "
         "settings, decode-only speedup and TPOT."),
        ("policies", "Static best, goodput and oracle",
         "For the drafters the study also ran under a goodput policy (k chosen each iteration from the "
         "acceptance and cost models) and as the Oracle Proposal bound (each step proposes exactly what it "
         "accepts): the best static k's speedup per load, goodput's and the oracle's. The oracle is a bound, "
         "not a configuration: it appears nowhere else in this report."),
        ("partial", "Partial verification: budget and period",
         "SpecPV-style partial verification: speedup (left) and the quality cost, the share of output tokens "
         "that differ from what full verification would have produced (right), against the partial-KV budget, "
         "one line per full-verify period."),
        ("shares", "Where the time goes",
         "Share of engine busy time by phase for each method's best setting at the smallest, middle and largest batch."),
        ("latency", "Throughput, latency and cost",
         f"Each method's best setting per batch: throughput against p90 TPOT, and the cost per million output "
         f"tokens at the study's price per GPU-hour ({html.escape(json.dumps(study.get('price_per_gpu_hour')))})."),
    ]
    body = [f"<h1>Speculative decoding capacity report: {html.escape(str(study.get('name', '')))}</h1>",
            f"<p class='note'>{headline} SLOs: {html.escape(slo_text)}.</p>",
            "<nav>" + "".join(f"<a href='#{s}'>{html.escape(t)}</a>" for s, t, _ in sections)
            + "<a href='#recommend'>Recommendations</a>"
            + ("<a href='#validation'>Validation</a>" if validation is not None else "")
            + ("<a href='#published'>Published GPU cases</a>" if published is not None else "")
            + "<a href='#provenance'>Provenance</a></nav>"]
    for section, title, note in sections:
        body.append(f"<h2 id='{section}'>{html.escape(title)}</h2><p class='note'>{note}</p>{section_html(section)}")
    body.append("<h2 id='recommend'>Recommendations</h2><p class='note'>Per batch and context, the configuration "
                f"with the highest throughput among those meeting the SLOs ({html.escape(slo_text)}) and within "
                f"{max_div:.1%} divergence; the figure is its speedup over no speculation. Hover a cell for "
                "throughput, latency and cost.</p>" + recommendation_html(rec, method_colors)
                + "<h3 id='engine-config'>As engine config</h3><p class='note'>Per panel and context, the method "
                "recommended most often with its best static k per batch, as vLLM's speculative config (a "
                "per-batch-size schedule) and SGLang's flags (one setting per server: per batch range).</p>"
                + engine_config_html(engine_configs(frame, rec, max_div)))
    if validation is not None:
        body.append("<h2 id='validation'>Validation</h2><p class='note'>How far to trust the figures above: the "
                    "simulator's predictions of live runs on this project's engine (docs/validation.md).</p>"
                    + section_html("validation"))
    if published is not None:
        body.append("<h2 id='published'>Published GPU measurements</h2><p class='note'>How far to trust GPU figures: "
                    f"the simulator against speedups others measured on GPUs ({html.escape(halves_text(published))}; "
                    "validation/published, docs/validation-published.md). Each speedup above carries the error of the held "
                    "cases nearest it in regime.</p>" + section_html("published"))
    body.append("<h2 id='provenance'>Provenance</h2>" + provenance_html(provenance))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>specsim report: {html.escape(str(study.get('name', '')))}</title>"
            f"<style>{STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body>{''.join(body)}</body></html>")


def provenance_html(provenance: dict) -> str:
    rows = []
    for key in ("created", "git_revision", "study_source", "executor", "workers", "points", "seconds",
                "seeds", "versions", "calibrations", "hardware", "warnings", "skipped"):
        if key in provenance:
            value = provenance[key]
            text = value if isinstance(value, str) else json.dumps(value, indent=1, default=str)
            rows.append(f"<tr><th>{html.escape(key)}</th><td><pre>{html.escape(str(text))}</pre></td></tr>")
    study_text = provenance.get("study_text", "")
    return (f"<table>{''.join(rows)}</table>"
            f"<details><summary>Study file</summary><pre>{html.escape(study_text)}</pre></details>")


def write_report(path: Path, frame: pd.DataFrame, provenance: dict, validation: pd.DataFrame | None = None) -> None:
    from sim.formats.files import write_atomic

    write_atomic(path, build_report(frame, provenance, validation))
