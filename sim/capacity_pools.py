"""`python -m sim capacity SCENARIO --pools`: the fewest GPUs whose prefill and decode pools meet the
scenario's SLOs at its own Poisson rate.

The scenario is disaggregated (`disaggregation.prefill`, sim/scenario/disaggregation.py): each
prefill server keeps its layout and each decode rank its `tensor_parallel`; what is sized is how
many prefill servers and how many decode ranks (`data_parallel`: an MoE's attention data-parallel
ranks, whose GPUs must divide the experts placed; a dense model's decode pool stays one replica).
For each decode size, smallest first, prefill servers are added until the p90 TTFT and p90 TPOT
both hold, or until the TTFT holds and the TPOT does not (more prefill servers cannot help the
decode pool), or the GPUs run out. The answer is the layout meeting both with the fewest GPUs
(the lower TPOT p90 among equals), with its prefill:decode GPU ratio and both engines' flags.
"""
from __future__ import annotations

import copy

from sim.errors import InputError


def decode_sizes(scenario, max_gpus: int) -> list[int]:
    """Decode ranks to try: every count whose GPUs fit `max_gpus` and divide the experts placed."""
    experts = scenario.model_spec.experts
    if experts is None:
        return [scenario.data_parallel]
    tp = scenario.tensor_parallel
    placed = experts.routed + scenario.redundant_experts
    return [d for d in range(1, max_gpus // tp + 1) if not scenario.expert_parallel or placed % (d * tp) == 0]


def with_pools(mapping: dict, ranks: int, servers: int) -> dict:
    """The scenario with `ranks` decode ranks and `servers` prefill servers."""
    from sim.scenario.engine_flags import apply_engine_flags

    point = copy.deepcopy(apply_engine_flags(mapping))
    point["data_parallel"] = ranks
    pools = point.setdefault("disaggregation", {})
    pools["prefill"] = {**pools.get("prefill", {}), "instances": servers}
    return point


def size_pools(mapping: dict, max_gpus: int = 64) -> dict:
    """Every layout tried (servers, ranks, GPUs, p90s, whether both SLOs hold) and the best."""
    from sim.scenario.engine_flags import launch_flags
    from sim.scenario.load import load_scenario
    from sim.simulate import simulate

    scenario = load_scenario(mapping)
    d = scenario.disaggregation
    if d is None or d.prefill == "unlimited":
        raise InputError("disaggregation.prefill", "--pools sizes a prefill pool and a decode pool: give the "
                                                   "scenario a prefill pool (disaggregation.prefill)")
    if scenario.workload.arrival != "poisson":
        raise InputError("workload.arrival", "--pools sizes the pools for the scenario's own load: give arrival: "
                                             "poisson and its rate_qps")
    if scenario.slo.ttft_ms_p90 is None or scenario.slo.tpot_ms_p90 is None:
        raise InputError("slo", "--pools needs both slo.ttft_ms_p90 and slo.tpot_ms_p90 (one per pool)")
    if max_gpus < 1:
        raise InputError("--max-gpus", f"must be >= 1 (got {max_gpus})")
    slo = scenario.slo
    rows = []
    for ranks in decode_sizes(scenario, max_gpus):
        decode_gpus = ranks * scenario.tensor_parallel
        met = [r["gpus"] for r in rows if r["slo_met"]]
        if met and min(met) <= decode_gpus + d.prefill.gpus:
            break               # every larger decode pool needs more GPUs than a layout already found
        for servers in range(1, (max_gpus - decode_gpus) // d.prefill.gpus + 1):
            run = simulate(with_pools(mapping, ranks, servers)).run
            ttft, tpot = run.ttft_ms["p90"], run.tpot_ms["p90"]
            rows.append({"prefill_servers": servers, "decode_ranks": ranks,
                         "prefill_gpus": servers * d.prefill.gpus, "decode_gpus": decode_gpus,
                         "gpus": servers * d.prefill.gpus + decode_gpus, "ttft_ms_p90": ttft, "tpot_ms_p90": tpot,
                         "throughput_tok_s": run.throughput_tok_s,
                         "slo_met": ttft <= slo.ttft_ms_p90 and tpot <= slo.tpot_ms_p90})
            if ttft <= slo.ttft_ms_p90:
                break           # met, or only the decode pool falls short: more servers cannot help
    met = [r for r in rows if r["slo_met"]]
    best = min(met, key=lambda r: (r["gpus"], r["tpot_ms_p90"])) if met else None
    out = {"scenario": scenario.model_dump(mode="json"), "slo": slo.model_dump(exclude_none=True),
           "max_gpus": max_gpus, "rows": rows, "best": best}
    if best is not None:
        chosen = load_scenario(with_pools(mapping, best["decode_ranks"], best["prefill_servers"]))
        out["layout"] = chosen.layout
        out["flags"] = launch_flags(chosen)
    return out


def format_pools(result: dict) -> str:
    s = result["scenario"]
    slo = ", ".join(f"{k.replace('_ms_p90', '')} p90 <= {v:g} ms" for k, v in result["slo"].items())
    lines = [f"{s['model']} on {s['hardware']}, Poisson {s['workload']['rate_qps']:g} requests/s, SLOs {slo}: "
             f"prefill servers x decode ranks, up to {result['max_gpus']} GPUs",
             f"{'prefill':>8} {'decode':>7} {'GPUs':>5} {'TTFT p90':>10} {'TPOT p90':>9} {'tok/s':>9}  SLOs"]
    for r in result["rows"]:
        lines.append(f"{r['prefill_servers']:>8} {r['decode_ranks']:>7} {r['gpus']:>5} {r['ttft_ms_p90']:>8.1f}ms "
                     f"{r['tpot_ms_p90']:>7.2f}ms {r['throughput_tok_s']:>9.1f}  {'met' if r['slo_met'] else '-'}")
    best = result["best"]
    if best is None:
        lines.append(f"no layout within {result['max_gpus']} GPUs meets both SLOs")
        return "\n".join(lines)
    lines.append(f"fewest GPUs: {best['gpus']} ({result['layout']}; prefill:decode GPUs "
                 f"{best['prefill_gpus']}:{best['decode_gpus']})")
    lines.append(f"SGLang: {result['flags']['sglang']}")
    lines.append(f"vLLM: {result['flags']['vllm']}")
    return "\n".join(lines)
