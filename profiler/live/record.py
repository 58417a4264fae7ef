"""What a live run writes: its steps, requests, summary, outputs and meta, through the run-folder
format (sim/formats/run_folder.py)."""
from __future__ import annotations

import json
import platform

from profiler.live.config import LiveConfig
from sim.formats.provenance import git_revision
from sim.formats.run_folder import write_run_folder

def write_run(settings: LiveConfig, rows, prompts, tok, loaded, speculative, baseline, quiet: bool = False,
              probe: dict | None = None, drafter_summary: dict | None = None, execution: dict | None = None) -> None:
    """drafter_summary: what the drafter adds to summary.json (the synthetic drafter's rates and divergence);
    execution: what engine ran (meta.json `execution`: CUDA graphs, launches per step)."""
    import numpy as np
    import pandas as pd

    steps, requests, outputs = [], [], []
    for first, gen in speculative:
        for s in gen.steps:
            steps.append({"run": "speculative", "request": first + s.request, "step": s.step, "mode": s.mode,
                          "query_tokens": s.query_tokens, "kv_tokens": s.kv_tokens, "drafted": s.drafted,
                          "accepted": s.accepted, "accept_flags": s.accept_flags, "committed": s.committed,
                          "refed": s.refed, "rolled_back": s.rolled_back, "draft_s": s.draft_s,
                          "verify_s": s.verify_s, "selection_s": s.selection_s, "other_s": s.other_s,
                          "end_s": s.end_s})
        by_request: dict[int, list] = {}
        for s in gen.steps:
            by_request.setdefault(s.request, []).append(s)
        for b, out in enumerate(gen.outputs):
            rid = first + b
            own = by_request.get(b, [])
            decode_s = gen.finish_s[b] - gen.first_token_s[b]
            # Arrival, admission and finish since the batch's (static) or the run's (continuous) start.
            itl = np.diff([gen.first_token_s[b]] + [s.end_s for s in own if s.committed > 0])
            requests.append({"request": rid, "category": rows[rid]["category"], "prompt_tokens": len(prompts[rid]),
                             "output_tokens": len(out), "ttft_s": gen.first_token_s[b] - gen.arrival_s[b],
                             "tpot_s": decode_s / (len(out) - 1) if len(out) > 1 else None,
                             "tokens_per_step": sum(s.committed for s in own) / len(own) if own else None,
                             "arrival_s": gen.arrival_s[b], "queue_s": gen.admitted_s[b] - gen.arrival_s[b],
                             "finish_s": gen.finish_s[b],
                             "itl_mean_s": float(itl.mean()) if len(itl) else None,
                             "itl_p50_s": float(np.median(itl)) if len(itl) else None,
                             "itl_p90_s": float(np.percentile(itl, 90)) if len(itl) else None})
            outputs.append({"request": rid, "text": tok.decode(out), "tokens": out})
    summary = {**summarize_run(speculative, baseline, settings), **(drafter_summary or {})}
    meta = run_meta(settings, loaded)
    if execution is not None:
        meta["execution"] = execution
    if probe is not None:
        meta["machine_probe"] = probe
    write_run_folder(settings.out, pd.DataFrame(steps), pd.DataFrame(requests), summary, outputs, meta)
    if not quiet:
        print(json.dumps(summary, indent=2))


def summarize_run(speculative, baseline, settings: LiveConfig) -> dict:
    def throughput(runs) -> float:
        tokens = sum(len(o) for _, gen in runs for o in gen.outputs)
        return tokens / sum(gen.wall_s for _, gen in runs)

    records = [s for _, gen in speculative for s in gen.steps]
    # Tokens per step counts verification steps, as the simulator does: a policy's plain decode
    # steps (drafting off) are not among them.
    verified = [s for s in records if s.mode != "decode"] if settings.method != "none" else records
    steps = list(_one_per_step(speculative))
    # A batch step's target forward is charged to its mode (verify / partial / full), or to
    # "mixed" when its requests verified in different modes.
    modes_of_step = {}
    for (first, gen) in speculative:
        for s in gen.steps:
            modes_of_step.setdefault((first, s.step), set()).add(s.mode)
    seconds = {"prefill": sum(gen.prefill_s for _, gen in speculative), "draft": sum(s.draft_s for s in steps)}
    for first, s in _one_per_step(speculative, with_batch=True):
        modes = modes_of_step[(first, s.step)]
        key = next(iter(modes)) if len(modes) == 1 else "mixed"
        key = "verify" if key == "decode" else key
        seconds[key] = seconds.get(key, 0.0) + s.verify_s
    seconds["selection"] = sum(s.selection_s for s in steps)
    seconds["other"] = sum(s.other_s for s in steps)
    total = sum(seconds.values())
    summary = {"method": settings.method, "k": settings.k if settings.method != "none" and settings.tree is None else None,
               "tree": list(settings.tree) if settings.tree is not None and settings.method != "none" else None,
               "batch": settings.batch, "serving": settings.serving,
               "requests": sum(len(gen.outputs) for _, gen in speculative),
               "throughput_tok_s": throughput(speculative),
               "tokens_per_step": sum(s.committed for s in verified) / len(verified) if verified else None,
               "time_share": {k: v / total for k, v in seconds.items() if v > 0} if total else {}}
    if settings.policy != "static":
        summary["policy"] = settings.policy
        summary["drafting_share"] = len(verified) / len(records) if records else None
        summary["mean_drafted_k"] = sum(s.drafted for s in verified) / len(verified) if verified else 0.0
    if settings.budget is not None:
        summary["partial_verification"] = {
            "budget": settings.budget, "period": settings.period, "period_unit": settings.period_unit, "rectify": settings.rectify,
            "partial_steps": sum(s.mode == "partial" for s in records), "full_steps": sum(s.mode == "full" for s in records),
            "plain_steps": sum(s.mode == "verify" for s in records),
            "rollbacks": sum(s.rolled_back > 0 for s in records),
            "rolled_back_tokens": sum(s.rolled_back for s in records)}
    if baseline is not None:
        summary["baseline_throughput_tok_s"] = throughput(baseline)
        summary["speedup"] = summary["throughput_tok_s"] / summary["baseline_throughput_tok_s"]
        summary["agreement"] = agreement_with_baseline(speculative, baseline)
    if settings.check_lossless:
        summary["lossless_mismatches"] = [{"request": r["request"], "first_divergence": r["first_divergence"]}
                                          for r in _compare_outputs(speculative, baseline) if not r["identical"]]
    return summary


def _compare_outputs(speculative, baseline):
    for (first, gen), (_, ar) in zip(speculative, baseline):
        for b, (out, ref) in enumerate(zip(gen.outputs, ar.outputs)):
            diverge = next((i for i, (x, y) in enumerate(zip(out, ref)) if x != y), min(len(out), len(ref)))
            yield {"request": first + b, "identical": out == ref, "first_divergence": diverge,
                   "matching": sum(x == y for x, y in zip(out, ref)), "length": max(len(out), len(ref))}


def agreement_with_baseline(speculative, baseline) -> dict:
    """How far the output follows autoregressive decoding's (lossy settings: partial verification
    without rectify, bf16, sampling): identical requests, position-wise token agreement, and the
    mean position of the first divergence (a request's length when it never diverges)."""
    rows = list(_compare_outputs(speculative, baseline))
    return {"identical_requests": sum(r["identical"] for r in rows) / len(rows),
            "token_agreement": sum(r["matching"] for r in rows) / sum(r["length"] for r in rows),
            "mean_first_divergence": sum(r["first_divergence"] for r in rows) / len(rows)}


def _one_per_step(runs, with_batch: bool = False):
    """The batch step's wall times are repeated on every request's row: take each step once."""
    for first, gen in runs:
        seen = set()
        for s in gen.steps:
            if s.step not in seen:
                seen.add(s.step)
                yield (first, s) if with_batch else s


def run_meta(settings: LiveConfig, loaded) -> dict:
    import torch


    device = torch.cuda.get_device_name() if settings.device == "cuda" else "cpu"
    return {"device": device, "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "cuda": torch.version.cuda if settings.device == "cuda" else None,
            "torch": torch.__version__, "python": platform.python_version(),
            "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
            "model": loaded.source, "model_hash": loaded.sha256_prefix, "random_weights": loaded.random_weights,
            "config": loaded.config.__dict__,
            "arguments": settings.recorded(),
            "git_revision": git_revision(), "seed": settings.seed}
