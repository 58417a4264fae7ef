"""`python -m sim capacity SCENARIO`: the highest Poisson request rate that still meets the scenario's
SLOs (p90 TTFT and p90 TPOT), with speculation and without, by bracketing then bisection.

The scenario's requests arrive as a Poisson process at the trial rate (same seed at every rate, so
the arrival pattern only stretches or shrinks and the search sees a steady function of the rate).
"""
from __future__ import annotations

import copy
import math

from sim.errors import InputError

MAX_DOUBLINGS = 24


def find_capacity(mapping: dict, tolerance: float = 0.02, max_rate_qps: float | None = None) -> dict:
    from sim.scenario.load import load_scenario

    if not 0 < tolerance < 1:
        raise InputError("--tolerance", f"must be in (0, 1) (got {tolerance})")
    if max_rate_qps is not None and max_rate_qps <= 0:
        raise InputError("--max-rate", f"must be positive (got {max_rate_qps})")
    load_scenario(mapping)     # the scenario as given must be valid before its workload is changed
    scenario = load_scenario(poisson_at(mapping, 1.0))
    if scenario.slo.ttft_ms_p90 is None and scenario.slo.tpot_ms_p90 is None:
        raise InputError("slo", "capacity needs slo.ttft_ms_p90 or slo.tpot_ms_p90 (the target the rate must meet)")
    start = mapping.get("workload", {}).get("rate_qps") or 1.0
    out = {"scenario": scenario.model_dump(mode="json", exclude={"workload": {"rate_qps"}}),
           "slo": scenario.slo.model_dump(exclude_none=True), "tolerance": tolerance}
    sides = [("baseline", True)]
    if scenario.speculation.enabled:
        sides.insert(0, ("speculative", False))
    baselines: dict[float, dict] = {}
    for name, baseline_only in sides:
        out[name] = bisect_rate(mapping, baseline_only, start, tolerance, max_rate_qps, baselines)
    capped = any(out[name]["at_max_rate"] for name, _ in sides)
    if "speculative" in out and out["baseline"]["rate_qps"] and not capped:
        out["capacity_gain"] = out["speculative"]["rate_qps"] / out["baseline"]["rate_qps"]
    return out


def poisson_at(mapping: dict, rate_qps: float) -> dict:
    point = copy.deepcopy(mapping)
    workload = point.setdefault("workload", {})
    workload.update(arrival="poisson", rate_qps=float(rate_qps))
    return point


def outcome(run, rate_qps: float) -> dict:
    return {"rate_qps": rate_qps, "slo_met": bool(run.slo_met), "throughput_tok_s": run.throughput_tok_s,
            "ttft_ms_p90": run.ttft_ms["p90"], "tpot_ms_p90": run.tpot_ms["p90"],
            "slo_attainment": run.slo_attainment}


def evaluate(mapping: dict, rate_qps: float, baseline_only: bool, baselines: dict) -> dict:
    """One trial. A speculative trial simulates the baseline at the same rate too (same requests
    and seed): it is kept in `baselines`, so the baseline's own search, which starts from the same
    rates, does not run it again."""
    from sim.scenario.load import load_scenario
    from sim.simulate import simulate

    if baseline_only and rate_qps in baselines:
        return baselines[rate_qps]
    result = simulate(load_scenario(poisson_at(mapping, rate_qps)), baseline_only=baseline_only)
    baselines[rate_qps] = outcome(result.baseline, rate_qps)
    return outcome(result.run, rate_qps)


def bisect_rate(mapping: dict, baseline_only: bool, start: float, tolerance: float, max_rate: float | None,
                baselines: dict) -> dict:
    """Bracket [meets, fails] by doubling or halving from `start`, then bisect until the bracket is
    narrower than `tolerance` of its upper end. Returns the highest rate found to meet the SLOs."""
    trials = []

    def meets(rate):
        trials.append(evaluate(mapping, rate, baseline_only, baselines))
        return trials[-1]["slo_met"]

    rate = min(start, max_rate) if max_rate else start
    if meets(rate):
        lo, hi = rate, None
        for _ in range(MAX_DOUBLINGS):
            if max_rate is not None and lo >= max_rate:
                break
            nxt = lo * 2 if max_rate is None else min(lo * 2, max_rate)
            if meets(nxt):
                lo = nxt
                before, now = trials[-2], trials[-1]
                if abs(now["throughput_tok_s"] - before["throughput_tok_s"]) <= 1e-3 * before["throughput_tok_s"]:
                    break    # the requests already arrive as one burst: a higher rate changes nothing
            else:
                hi = nxt
                break
        if hi is None:   # still meeting at the cap: report the cap
            note = None if max_rate is not None else (
                f"the SLOs are met at every rate up to {lo:g} req/s: this workload never saturates the engine "
                f"(more requests, or --max-rate)")
            return finish(lo, trials, capped=True, note=note)
    else:
        lo, hi = None, rate
        for _ in range(MAX_DOUBLINGS):
            nxt = hi / 2
            if meets(nxt):
                lo = nxt
                break
            hi = nxt
        if lo is None:
            return finish(0.0, trials, capped=False, note="the SLOs are missed even at the lowest rate tried")
    while (hi - lo) / hi > tolerance:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return finish(lo, trials, capped=False, upper=hi)


def finish(rate: float, trials: list[dict], capped: bool, upper: float | None = None, note: str | None = None) -> dict:
    at = next((t for t in trials if t["rate_qps"] == rate), None)
    out = {"rate_qps": rate, "first_failing_rate_qps": upper, "at_max_rate": capped, "evaluations": len(trials),
           "at_capacity": at, "trials": sorted(trials, key=lambda t: t["rate_qps"])}
    if note:
        out["note"] = note
    return out


def format_capacity(result: dict) -> str:
    s = result["scenario"]
    spec = s["speculation"]
    slo = ", ".join(f"{k.replace('_ms_p90', '')} p90 <= {v:g} ms" for k, v in result["slo"].items())
    lines = [f"{s['model']} on {s['hardware'] if isinstance(s['hardware'], str) else 'custom hardware'}, "
             f"method {spec['method']}, Poisson arrivals, SLOs {slo}"]
    for name in ("speculative", "baseline"):
        if name not in result:
            continue
        r = result[name]
        at = r["at_capacity"] or {}
        extra = f" ({r['note']})" if r.get("note") else (
            " (the --max-rate cap; it still meets the SLOs there)" if r["at_max_rate"] else "")
        lines.append(f"  {name:<12} {r['rate_qps']:9.3f} req/s{extra}: {at.get('throughput_tok_s', math.nan):9.1f} tok/s, "
                     f"TTFT p90 {at.get('ttft_ms_p90', math.nan):8.1f} ms, TPOT p90 {at.get('tpot_ms_p90', math.nan):6.2f} ms "
                     f"[{r['evaluations']} trials]")
    if "capacity_gain" in result:
        lines.append(f"  capacity with speculation: {result['capacity_gain']:.3f}x the baseline's")
    return "\n".join(lines)
