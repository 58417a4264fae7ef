"""`python -m sim oracle POSITIONS RUN_DIR...`: how much speculation leaves on the table, from live runs.

POSITIONS (written by `python -m profiler positions`) holds, for each speculative run, its drafter's
accepted drafts at every root position of the greedy output. Walking the output from the first
root, a step at root p accepts a(p) drafts and the next starts a(p) + 1 on. Per run, at its own
batches and contexts, the simulator (the bundle's cost model, the run's scenario) prices:
- `static`: the walk at the run's k, which is the run's own steps again (a check of POSITIONS);
- `oracle`: Oracle Proposal, the same walk with each step proposing exactly what it accepts;
- with a second drafter's run on the same prompts and batches (`--pair A,B`: drafter labels),
  `combine`: per step the better of the two proposals at the run's k (a(p) = max of the two), and
  `combine oracle`: that, proposing exactly what it accepts. A combined step is priced as the first
  run's drafter (give the model drafter first: prompt lookup's host work is small beside it).
  And the combine policy as an engine can run it: `lookup first`, prompt lookup's proposal where
  its history matches an n-gram of at least MIN_MATCH tokens, the model drafter's elsewhere, walked
  on the traces (priced as the model drafter's step, as above), beside `lookup first (sim)`, the
  simulator's `combine` policy given each drafter's acceptance as its own static run measures it
  (per-position rates over its steps; prompt lookup's over the steps at which it matched, and their
  share as its draft_share): the two differ by what the simulator assumes, that the two drafters'
  acceptances are independent of each other and of where the walk is (and by prompt lookup's host
  work, which the simulator prices).
Speedups are over the setting's autoregressive run as the simulator predicts it, so the columns
compare like with like; the run's measured speedup stands beside them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.errors import InputError


def walk(accepted_at: np.ndarray, k: int) -> np.ndarray:
    """Accepted drafts of each step of a greedy chain of k over the output, from root 0."""
    return np.minimum(accepted_at[walk_roots(accepted_at, k)], k)


def walk_roots(accepted_at: np.ndarray, k: int) -> np.ndarray:
    """The roots that walk's steps start from."""
    roots, root = [], 0
    while root < len(accepted_at):
        roots.append(root)
        root += min(int(accepted_at[root]), k) + 1
    return np.asarray(roots, dtype=np.int64)


def read_positions(path: Path):
    import pandas as pd

    try:
        table = pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise InputError("POSITIONS", f"cannot read {path} ({exc.__class__.__name__})") from None
    missing = {"run", "request", "root", "accepted"} - set(table.columns)
    if missing:
        raise InputError("POSITIONS", f"{path} lacks column {sorted(missing)[0]} (write it with profiler positions)")
    return table


MIN_MATCH = 2          # lookup first: prompt lookup proposes where it matches an n-gram this long


def accepted_by_request(table, run_name: str, column: str = "accepted") -> dict[int, np.ndarray]:
    own = table[table.run == run_name].sort_values(["request", "root"])
    return {int(rid): frame[column].to_numpy(np.int64) for rid, frame in own.groupby("request")}


def conditional_rates(accepted: np.ndarray, k: int) -> list[float]:
    """Per-position acceptance r_1..r_k of chains of k: P(accepted >= j | accepted >= j - 1)."""
    accepted = np.minimum(accepted, k)
    rates = []
    for j in range(1, k + 1):
        reached = accepted >= j - 1
        rates.append(float((accepted[reached] >= j).mean()) if reached.any() else 0.0)
    return rates


def lookup_first(model: dict[int, np.ndarray], lookup: dict[int, np.ndarray], match: dict[int, np.ndarray],
                 min_match: int) -> dict[int, np.ndarray]:
    """Per request and root: prompt lookup's accepted drafts where it matched min_match tokens,
    the model drafter's elsewhere."""
    out = {}
    for rid, a in model.items():
        b, m = lookup.get(rid, np.zeros(0, np.int64)), match.get(rid, np.zeros(0, np.int64))
        n = min(len(a), len(b))
        out[rid] = np.concatenate([np.where(m[:n] >= min_match, b[:n], a[:n]), a[n:]])
    return out


def fitted_combine(model: dict[int, np.ndarray], lookup: dict[int, np.ndarray], match: dict[int, np.ndarray],
                   k: int, min_match: int) -> tuple[dict, dict] | None:
    """The two drafters' acceptance blocks as each drafter's own run at k measures them, step by
    step (what an engine's counters give): the model drafter's per-position rates over its steps;
    prompt lookup's over its steps that matched min_match tokens, and their share. None if prompt
    lookup never matched."""
    model_steps = np.concatenate([walk(a, k) for a in model.values()])
    roots = {r: walk_roots(a, k) for r, a in lookup.items()}
    lookup_steps = np.concatenate([np.minimum(lookup[r][roots[r]], k) for r in lookup])
    matched = np.concatenate([match[r][roots[r]] >= min_match for r in lookup])
    if not matched.any():
        return None
    return ({"per_position": conditional_rates(model_steps, k)},
            {"per_position": conditional_rates(lookup_steps[matched], k), "draft_share": float(matched.mean())})


def oracle_rows(positions: Path, run_dirs: list[Path], calibration: Path | None,
                pairs: list[tuple[str, str]]) -> list[dict]:
    """A row per speculative run with positions: measured speedup and the what-ifs' predictions."""
    from sim.formats.campaign import expand_run_folders
    from sim.validate.compare import predict
    from sim.validate.runs import baselines_by_setting, measured_baseline_tok_s, read_runs

    table = read_positions(positions)
    runs = read_runs(expand_run_folders(run_dirs))     # repeats merged: the median pass, as sim validate
    baselines = baselines_by_setting(runs)
    by_setting_drafter = {(r.setting, r.drafter): r for r in runs if r.speculative}
    rows = []
    for run in runs:
        if not run.speculative or run.policy != "static" or run.name not in set(table.run):
            continue                        # a policy's run is its own what-if already
        own = accepted_by_request(table, run.name)
        k = run.depth

        def what_if(accepted: dict[int, np.ndarray], policy, run=run, k=k) -> float:
            steps_of = lambda rids: [walk(accepted[int(r)], k) for r in rids]       # noqa: E731
            return predict(run, calibration, "replay", steps_of=steps_of, policy=policy)["speedup"]

        base = measured_baseline_tok_s(run, baselines)
        row = {"run": run.name, "drafter": run.drafter, "batch": run.batch, "context": run.context_tokens,
               "measured": float(run.summary["throughput_tok_s"]) / base if base else None,
               "replay": predict(run, calibration, "replay")["speedup"],
               "static": what_if(own, None), "goodput": what_if(own, "goodput"), "oracle": what_if(own, "oracle")}
        for first, second in pairs:
            if run.drafter != first:
                continue
            partner = by_setting_drafter.get((run.setting, second))
            if partner is None or partner.name not in set(table.run):
                continue
            other = accepted_by_request(table, partner.name)
            combined = {rid: np.maximum(a, other[rid][:len(a)]) if rid in other else a for rid, a in own.items()}
            row["partner"] = partner.name
            row["combine"] = what_if(combined, None)
            row["combine oracle"] = what_if(combined, "oracle")
            if "lookup_match" not in table.columns:
                continue                    # a table written before the column existed
            match = accepted_by_request(table, partner.name, "lookup_match")
            traced = lookup_first(own, other, match, MIN_MATCH)
            steps_of = lambda rids, traced=traced, k=k: [walk(traced[int(r)], k) for r in rids]      # noqa: E731
            on_traces = predict(run, calibration, "replay", steps_of=steps_of)
            row["lookup first"], row["lookup first tok/step"] = on_traces["speedup"], on_traces["tokens_per_step"]
            fits = fitted_combine(own, other, match, k, MIN_MATCH)
            if fits is not None:
                policy = {"combine": {"drafter": {"method": "ngram", "num_speculative_tokens": k, "acceptance": fits[1]}}}
                simulated = predict(run, calibration, "fitted", fitted=fits[0], policy=policy)
                row["lookup first (sim)"] = simulated["speedup"]
                row["lookup first (sim) tok/step"] = simulated["tokens_per_step"]
                row["lookup share"] = fits[1]["draft_share"]
        rows.append(row)
    if not rows:
        raise InputError("RUN_DIR", "no speculative run given has positions in the table")
    return rows


COLUMNS = ("measured", "replay", "static", "goodput", "oracle", "combine", "combine oracle", "lookup first",
           "lookup first (sim)")


def format_oracle(rows: list[dict], markdown: bool = False) -> str:
    """The rows as a table of speedups (markdown for the docs)."""
    present = [c for c in COLUMNS if any(r.get(c) is not None for r in rows)]
    cell = lambda v: "" if v is None else f"{v:.3f}"                        # noqa: E731
    if markdown:
        lines = ["| run | drafter | batch | context | " + " | ".join(present) + " | combined with |",
                 "|---|---|---|---|" + "---|" * len(present) + "---|"]
        for r in rows:
            lines.append(f"| {r['run']} | {r['drafter']} | {r['batch']} | {r['context']:.0f} | "
                         + " | ".join(cell(r.get(c)) for c in present) + f" | {r.get('partner', '')} |")
        return "\n".join(lines + combine_check(rows))
    head = f"{'run':28s} {'batch':>5} {'context':>7} " + " ".join(f"{c:>14s}" for c in present)
    lines = [head]
    for r in rows:
        lines.append(f"{r['run']:28s} {r['batch']:>5} {r['context']:>7.0f} "
                     + " ".join(f"{cell(r.get(c)):>14s}" for c in present))
    return "\n".join(lines)


def combine_check(rows: list[dict]) -> list[str]:
    """Markdown lines: the combine policy on the traces against the simulator's, per paired run."""
    paired = [r for r in rows if r.get("lookup first (sim)") is not None]
    if not paired:
        return []
    lines = ["", f"Lookup first (prompt lookup where it matches {MIN_MATCH}+ tokens, else the model drafter): "
                 "on the traces and as the simulator's combine policy fitted on them",
             "", "| run | lookup share | tok/step traces | tok/step sim | error | speedup traces | speedup sim |",
             "|---|---|---|---|---|---|---|"]
    for r in paired:
        traced, simulated = r["lookup first tok/step"], r["lookup first (sim) tok/step"]
        lines.append(f"| {r['run']} | {r['lookup share']:.2f} | {traced:.3f} | {simulated:.3f} | "
                     f"{simulated / traced - 1:+.1%} | {r['lookup first']:.3f} | {r['lookup first (sim)']:.3f} |")
    return lines
