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
Speedups are over the setting's autoregressive run as the simulator predicts it, so the columns
compare like with like; the run's measured speedup stands beside them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.errors import InputError


def walk(accepted_at: np.ndarray, k: int) -> np.ndarray:
    """Accepted drafts of each step of a greedy chain of k over the output, from root 0."""
    steps, root = [], 0
    while root < len(accepted_at):
        a = min(int(accepted_at[root]), k)
        steps.append(a)
        root += a + 1
    return np.asarray(steps, dtype=np.int64)


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


def accepted_by_request(table, run_name: str) -> dict[int, np.ndarray]:
    own = table[table.run == run_name].sort_values(["request", "root"])
    return {int(rid): frame.accepted.to_numpy(np.int64) for rid, frame in own.groupby("request")}


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
        rows.append(row)
    if not rows:
        raise InputError("RUN_DIR", "no speculative run given has positions in the table")
    return rows


COLUMNS = ("measured", "replay", "static", "goodput", "oracle", "combine", "combine oracle")


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
        return "\n".join(lines)
    head = f"{'run':28s} {'batch':>5} {'context':>7} " + " ".join(f"{c:>14s}" for c in present)
    lines = [head]
    for r in rows:
        lines.append(f"{r['run']:28s} {r['batch']:>5} {r['context']:>7.0f} "
                     + " ".join(f"{cell(r.get(c)):>14s}" for c in present))
    return "\n".join(lines)
