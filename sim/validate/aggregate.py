"""The comparisons' errors in aggregate: median, P90 and worst |error| per prediction and metric,
the measurement's own repeatability beside them, and the table `sim validate` prints."""
from __future__ import annotations

import math

import numpy as np

from sim.validate.compare import AT_PROBE, METRICS, PREDICTIONS, SERVED_METRICS, Comparison

def leave_one_out(values: tuple) -> list[float]:
    """|each value / the median of the others - 1|: how far one repeat lands from what the others
    measured."""
    return [abs(v / float(np.median(values[:i] + values[i + 1:])) - 1) for i, v in enumerate(values)]


def repeatability(rows: list[Comparison]) -> list[dict]:
    """The measurement's own error, in the aggregate's form: each repeat of a run against the median
    of its other repeats. Throughput and speedup from runs of 3 or more repeats; the served p50 TTFT
    and TPOT of open-loop runs from 2 or more (with two, each against the other). A prediction
    cannot be held to closer than this (a prediction is compared with the median repeat, whose own
    error is smaller than one repeat's but not zero)."""
    out = []
    for metric, field_name, fewest in (("tok_s", "repeat_tok_s", 3), ("speedup", "repeat_speedup", 3),
                                       ("ttft_p50_ms", "repeat_ttft_p50_ms", 2),
                                       ("tpot_p50_ms", "repeat_tpot_p50_ms", 2)):
        seen, errors = set(), []
        for r in rows:
            values = getattr(r, field_name)
            if metric in SERVED_METRICS and not r.open_loop:
                continue
            if len(values) >= fewest and r.run not in seen:
                seen.add(r.run)
                errors += leave_one_out(values)
        if errors:
            out.append({"prediction": "repeats", "metric": metric, "runs": len(seen),
                        "median": float(np.median(errors)), "p90": float(np.percentile(errors, 90)),
                        "worst": float(max(errors))})
    return out


def aggregate(rows: list[Comparison]) -> list[dict]:
    """Median, P90 and worst |error| per prediction and metric; then the repeats' own
    (`repeatability`) where runs were repeated."""
    out = []
    for prediction in (*PREDICTIONS, *(f"{p} {AT_PROBE}" for p in PREDICTIONS)):
        mine = [r for r in rows if r.prediction == prediction]
        if not mine:
            continue
        for metric in (*METRICS, "share"):
            if prediction.startswith("cost model") and metric == "tokens_per_step":
                continue            # one token per step by definition
            errors = np.array([abs(r.share_error) if metric == "share" else abs(r.error(metric))
                               for r in mine if (metric == "share" or r.error(metric) is not None)
                               and (metric not in SERVED_METRICS or r.open_loop)])
            if errors.size == 0:
                continue
            out.append({"prediction": prediction, "metric": metric, "runs": int(errors.size),
                        "median": float(np.median(errors)), "p90": float(np.percentile(errors, 90)),
                        "worst": float(errors.max())})
    # Runs under a speculation policy (`--policy`), apart: what issue 27's targets are about.
    for prediction in PREDICTIONS[1:]:
        mine = [r for r in rows if r.prediction == prediction and r.policy != "static"]
        for metric in ("tok_s", "speedup") if mine else ():
            errors = np.array([abs(r.error(metric)) for r in mine if r.error(metric) is not None])
            if errors.size:
                out.append({"prediction": f"{prediction}, policy runs", "metric": metric, "runs": int(errors.size),
                            "median": float(np.median(errors)), "p90": float(np.percentile(errors, 90)),
                            "worst": float(errors.max())})
    return out + repeatability(rows)


def format_comparisons(rows: list[Comparison]) -> str:
    pct = lambda x: "" if x is None else f"{x:+.1%}"
    num = lambda x, f: "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, f)
    lines = [f"{'run':<32} {'prediction':<18} {'tok/s meas':>10} {'pred':>7} {'err':>7} {'speedup meas':>12} "
             f"{'pred':>6} {'err':>7} {'tok/step meas':>13} {'pred':>6} {'TPOT err':>8} {'share':>6}"]
    for r in rows:
        lines.append(f"{r.run[:32]:<32} {r.prediction:<18} {r.measured_tok_s:>10.2f} {r.predicted_tok_s:>7.2f} "
                     f"{pct(r.error('tok_s')):>7} {num(r.measured_speedup, '.3f'):>12} "
                     f"{num(r.predicted_speedup, '.3f'):>6} {pct(r.error('speedup')):>7} "
                     f"{r.measured_tokens_per_step:>13.2f} {r.predicted_tokens_per_step:>6.2f} "
                     f"{pct(r.error('tpot_ms')):>8} {r.share_error:>6.1%}")
    lines.append("")
    lines.append(f"{'prediction':<18} {'metric':<16} {'runs':>4} {'median':>7} {'P90':>7} {'worst':>7}   |error|")
    for a in aggregate(rows):
        lines.append(f"{a['prediction']:<18} {a['metric']:<16} {a['runs']:>4} {a['median']:>7.1%} "
                     f"{a['p90']:>7.1%} {a['worst']:>7.1%}")
    return "\n".join(lines)
