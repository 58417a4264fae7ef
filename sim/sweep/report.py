"""The capacity-planning report: one self-contained HTML file (plotly inlined, no network) built from a
sweep's results table.

Sections: speedup heatmaps (batch x context) per method with the speedup < 1 region marked; speedup
and quality cost against partial-verification budget and period; where the time goes; throughput
against latency and cost per million tokens (those figures: sim/sweep/figures.py); the recommended
method per (batch, context) under the study's SLOs; the validation parity plot when given;
provenance.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim.sweep.engine_config import engine_config_html, engine_configs
from sim.sweep.figures import budget_period_figure, heatmap_figure, throughput_latency_figure, time_share_figure
from sim.sweep.frames import METHOD_COLORS, best_settings, context_label, eligible, y_axis_of
from sim.sweep.policy_figure import policy_gap_figure
from sim.validate.parity import parity_figure
from sim.validate.published.report import halves_text, published_figure, read_published


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
                "seeds", "versions", "calibrations", "cost_models", "hardware", "warnings", "skipped"):
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
