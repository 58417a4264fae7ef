"""What `sim run` prints: a result's summary (throughput, speedup and how far to trust it, latency
percentiles, time shares, memory, the policy, goodput, SpecPV's divergence), and the one-row-a-value
table of `sim run --vary FIELD=...`."""
from __future__ import annotations


def trust_line(result) -> str:
    """How far to trust the speedup: the error of comparable validated cases (sim/bands.py)."""
    if not result.scenario.speculation.enabled:
        return "no speculation"
    band = result.speedup_band
    if band is None:
        return f"speedup {result.speedup:.2f}x; no comparable validated case (docs/validation.md)"
    return f"speedup {result.speedup:.2f}x {band.describe()}"


def format_summary(result) -> str:
    s = result.scenario
    run, base = result.run, result.baseline
    spec = s.speculation
    method = spec.method if spec.enabled else "none"
    lines = [
        f"{s.model_spec.name} on {s.hardware_spec.name} ({s.dtype}, {s.layout}, "
        f"{s.engine_spec.name if s.calibration is None else 'calibrated: ' + str(s.calibration)}), "
        f"method {method}, {len(run.ttft_s)} requests, seed {s.seed}",
        f"  throughput      {run.throughput_tok_s:10.1f} tok/s   baseline {base.throughput_tok_s:10.1f}   "
        f"speedup {result.speedup:.3f}x",
        f"  decode only     {run.decode_throughput_tok_s:10.1f} tok/s   baseline {base.decode_throughput_tok_s:10.1f}   "
        f"speedup {result.decode_speedup:.3f}x",
        f"  trust           {trust_line(result)}",
        f"  tokens/step     {run.tokens_per_step:10.3f}",
        "  latency (ms)         p50       p90       p99",
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        q = getattr(run, name)
        lines.append(f"    {name[:-3]:<12} {q['p50']:9.2f} {q['p90']:9.2f} {q['p99']:9.2f}")
    shares = ", ".join(f"{k} {v:.1%}" for k, v in run.time_share.items() if v >= 0.0005)
    lines.append(f"  time share      {shares}")
    mem = result.memory
    lines.append(f"  memory          {mem['resident_layers']} layers resident, {mem['offloaded_layers']} offloaded "
                 f"(baseline {mem['baseline_offloaded_layers']}); peak KV {mem['peak_kv_gb']:.2f} GB")
    if spec.enabled and spec.policy.kind != "static":
        lines.append(f"  policy          {policy_line(spec.policy, run)}")
    if run.goodput_tok_s is not None:
        verdict = lambda m: "p90 SLO met" if m.slo_met else "p90 SLO missed"
        lines.append(f"  goodput         {run.goodput_tok_s:10.1f} tok/s   {run.slo_attainment:.1%} of requests within "
                     f"SLO, {verdict(run)} (baseline {base.goodput_tok_s:.1f} tok/s, {base.slo_attainment:.1%}, "
                     f"{verdict(base)})")
    if result.partial_verify is not None:
        pv = result.partial_verify
        lines.append(f"  partial verify  {pv['divergence_rate']:.4%} of output tokens diverge from full "
                     f"verification; {pv['rolled_back_tokens']} rolled back")
    return "\n".join(lines)


def policy_line(policy, run) -> str:
    """The speculation policy and what it did: how often requests drafted, or whose proposals they verified."""
    if policy.route is not None:
        routes = ", ".join(f"{category}: {d.method}" for category, d in policy.route.items())
        return f"route ({routes}); {run.lookup_share:.1%} of request-steps verified prompt lookup's proposal"
    if policy.combine is not None:
        return (f"combine, rule {policy.combine.rule}; {run.lookup_share:.1%} of request-steps verified prompt "
                f"lookup's proposal, the others the method's")
    label = {"off_above_batch": f"off above batch {policy.off_above_batch}", "k_by_batch": "k by batch"}.get(
        policy.kind, policy.kind)
    return f"{label}; drafted at {run.drafting_share:.1%} of request-steps, {run.mean_drafted_k:.2f} drafts on average"


def format_rows(field: str, values: list, results: list) -> str:
    header = (f"{field:>24} {'tok/s':>10} {'baseline':>10} {'speedup':>8} {'decode':>8} {'tok/step':>8} "
              f"{'TPOT p50':>9} {'TTFT p50':>9}")
    rows = [header]
    for value, r in zip(values, results):
        rows.append(f"{str(value):>24} {r.throughput_tok_s:10.1f} {r.baseline.throughput_tok_s:10.1f} "
                    f"{r.speedup:8.3f} {r.decode_speedup:8.3f} {r.run.tokens_per_step:8.3f} "
                    f"{r.run.tpot_ms['p50']:9.2f} {r.run.ttft_ms['p50']:9.2f}")
    return "\n".join(rows)
