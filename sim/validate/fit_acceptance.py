"""Acceptance fitted from recorded speculative decoding: live runs, or vLLM's counters.

Per drafter (method and draft settings, `LiveRun.drafter`):
- per-position rates r_j = P(accepted >= j | accepted >= j - 1), pooled over every verification
  step of every run (a step that drafted nothing counts as rejected at position 1, which is what
  it costs);
- request spread: the standard deviation across requests of each request's own per-token rate
  (accepted / (accepted + rejections)), less the binomial noise of its finite steps;
- context slope: the weighted least-squares slope of the per-request rate against doublings of
  context beyond 1,024 tokens (a request's context: prompt + half the output budget), the simulator's
  `context_slope`, zero when the requests span less than half a doubling; the per-position rates
  are then those at 1,024 tokens.
The result is the scenario's `speculation.acceptance` block.

SpecPV disagreement: the chance that a token chosen under partial attention differs from the one
full attention picks. Observed two ways: rectify runs re-check every partial-mode token at the next
full verification and roll back at the first disagreement (so each full step with a buffer of B
tokens is B Bernoulli trials, stopped at the first failure); runs without rectify whose setting
has an autoregressive run show the first position where the output leaves the autoregressive
one (each partial-mode token before it is a trial, and the divergence itself a failure when a
partial step produced it). The geometric likelihood over all runs is maximized for
p = per_token * (at_budget / budget)^budget_exponent * (context / at_context)^context_exponent;
an exponent is fitted only when the runs span more than one value of its variable.

vLLM: a Prometheus text scrape of /metrics (`vllm:spec_decode_num_drafts_total` and
`vllm:spec_decode_num_accepted_tokens_per_pos_total{position="j"}`), or JSON lines each with
`num_drafts` and `num_accepted_tokens_per_pos` (one line per request gives the request spread).
"""
from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.acceptance import CONTEXT_REFERENCE_TOKENS
from sim.errors import InputError
from sim.formats.run_folder import OUTPUTS
from sim.validate.runs import LiveRun, baselines_by_setting

MIN_RATE = 1e-4


def rates_from_counts(at_least: np.ndarray) -> list[float]:
    """Conditional per-position rates from counts of steps with accepted >= j, j = 0..depth."""
    return conditional_rates(np.asarray(at_least[:-1], dtype=float), np.asarray(at_least[1:], dtype=float))


def conditional_rates(reached: np.ndarray, kept: np.ndarray) -> list[float]:
    """Per-position rates r_j = kept_j / reached_j (steps that accepted position j over those that
    proposed it with every earlier draft accepted); a position no step reached takes the one before."""
    rates = []
    for r, k in zip(reached, kept):
        rates.append(float(k / r) if r > 0 else (rates[-1] if rates else 0.0))
    return rates


def request_rates(accepted: np.ndarray, depth: np.ndarray | int) -> tuple[float, int]:
    """A request's per-token rate (geometric MLE over its steps) and its trials; depth: the drafts
    each step proposed (a step that accepted all of them saw no rejection)."""
    trials = int(accepted.sum() + (accepted < depth).sum())
    return (float(accepted.sum() / trials) if trials else 0.0), trials


def fit_drafter(runs: list[LiveRun]) -> dict:
    """The acceptance block of one drafter from its runs (all with the same depth)."""
    depth = runs[0].depth
    reached, kept = np.zeros(depth), np.zeros(depth)   # per position j: steps that reached it, accepted it
    rates, trials, contexts = [], [], []
    steps = 0
    for run in runs:
        # A request's context: its prompt plus half the run's output budget (the mean over its
        # decode), not what it accepted (which would tie context to acceptance).
        half = float(run.args.get("max_new_tokens") or 0) / 2
        prompt = dict(zip(run.requests.request, run.requests.prompt_tokens + half))
        for rid, frame in run.steps.groupby("request"):
            frame = frame.sort_values("step")
            accepted = np.minimum(frame.accepted.to_numpy(np.int64), depth)
            # Drafts the step proposed: fewer than the depth where a policy chose a shorter k, and
            # position j then tells nothing (censored), not a rejection.
            proposed = np.minimum(frame.drafted.to_numpy(np.int64), depth) if "drafted" in frame else depth
            steps += len(accepted)
            reached += [((accepted >= j - 1) & (proposed >= j)).sum() for j in range(1, depth + 1)]
            kept += [((accepted >= j) & (proposed >= j)).sum() for j in range(1, depth + 1)]
            rate, n = request_rates(accepted, proposed)
            if n:
                rates.append(rate)
                trials.append(n)
                contexts.append(prompt.get(rid, 0))
    pooled = np.array(conditional_rates(reached, kept))
    rates, trials, contexts = np.array(rates), np.array(trials, float), np.array(contexts, float)
    spread = 0.0
    slope = 0.0
    if len(rates) >= 2:
        doublings = np.log2(np.maximum(contexts, CONTEXT_REFERENCE_TOKENS) / CONTEXT_REFERENCE_TOKENS)
        if np.ptp(doublings) > 0.5:
            slope = float(np.polyfit(doublings, rates, 1, w=np.sqrt(trials))[0])
            # The pooled rates are those of the runs' mean context; the scenario's rates are those
            # at 1,024 tokens or fewer, where the slope adds nothing.
            pooled = pooled - slope * float(np.average(doublings, weights=trials))
            rates = rates - slope * doublings
        mean = np.average(rates, weights=trials)
        between = np.average((rates - mean) ** 2, weights=trials) - np.mean(rates * (1 - rates) / trials)
        spread = math.sqrt(max(between, 0.0))
    accepted = sum(int(r.steps.accepted.clip(upper=depth).sum()) for r in runs)
    return {"acceptance": {"per_position": [round(float(np.clip(r, 0.0, 1.0)), 4) for r in pooled],
                           "request_spread": round(spread, 4), "context_slope": round(slope, 4)},
            "runs": [r.name for r in runs], "steps": steps,
            "tokens_per_step": round(1 + accepted / steps, 4) if steps else None}


def fit_drafters(runs: list[LiveRun]) -> dict[str, dict]:
    by_drafter: dict[str, list[LiveRun]] = {}
    for run in runs:
        if run.speculative and len(run.steps):
            by_drafter.setdefault(run.drafter, []).append(run)
    return {label: {"method": group[0].method, **fit_drafter(acceptance_runs(group))}
            for label, group in sorted(by_drafter.items())}


def acceptance_runs(runs: list[LiveRun]) -> list[LiveRun]:
    """The runs a drafter's acceptance is fitted on: those verified against full attention where
    there are any. A SpecPV run's partial steps accept against partial attention, so its counts
    already carry the disagreement that the scenario's `partial_verify.disagreement` adds again.
    Pooled in, the six SpecPV runs of the validation study (2,048 and 6,144 tokens) flattened the
    prompt-lookup fit's context slope from +0.096 to +0.069 per doubling: its 6,144-token runs were
    fitted 1.40 tokens per step against 1.83 measured (1.67 without them)."""
    full = [r for r in runs if not r.partial]
    return full or runs


# ---- SpecPV disagreement -------------------------------------------------------------------------

def disagreement_observations(run: LiveRun, baseline: LiveRun | None) -> dict | None:
    """Trials and failures of partial-mode tokens in one SpecPV run, or None if it shows none."""
    if not run.partial:
        return None
    steps = run.steps
    trials = failures = 0
    if run.args.get("rectify"):
        full = steps[(steps["mode"] == "full") & (steps.refed > 0)]
        for refed, rolled in zip(full.refed.to_numpy(), full.rolled_back.to_numpy()):
            if rolled > 0:
                trials += int(refed - rolled) + 1
                failures += 1
            else:
                trials += int(refed)
        source = "rectify roll-backs"
    else:
        if baseline is None:
            return None
        own, reference = read_outputs(run.path), read_outputs(baseline.path)
        for rid, frame in steps.groupby("request"):
            out, ref = own.get(rid), reference.get(rid)
            if out is None or ref is None:
                continue
            first = next((i for i, (x, y) in enumerate(zip(out, ref)) if x != y), None)
            position = 1          # output position 0 comes from the prefill
            ordered = frame.sort_values("step")
            for mode, committed in zip(ordered["mode"], ordered.committed):
                end = position + int(committed)
                if first is not None and first < end:
                    if mode == "partial":
                        trials += first - position + 1
                        failures += 1
                    break
                if mode == "partial":
                    trials += int(committed)
                position = end
        source = "divergence from the autoregressive run"
    return {"run": run.name, "budget": int(run.args["budget"]), "period": int(run.args["period"]),
            "rectify": bool(run.args.get("rectify")), "context": round(run.context_tokens, 1),
            "trials": trials, "failures": failures, "rate": round(failures / trials, 5) if trials else None,
            "source": source}


@lru_cache(maxsize=64)
def read_outputs(run_dir: Path) -> dict[int, list[int]]:
    """A run's output tokens per request (read once per run: leave-one-out fits ask again)."""
    try:
        lines = (run_dir / OUTPUTS).read_text().splitlines()
    except OSError:
        return {}
    rows = [json.loads(line) for line in lines if line.strip()]
    return {int(r["request"]): list(r["tokens"]) for r in rows}


def fit_disagreement(observations: list[dict]) -> dict | None:
    """The scenario's `partial_verify.disagreement` block by maximum likelihood, or None."""
    from scipy.optimize import minimize

    obs = [o for o in observations if o and o["trials"] > 0]
    if not obs:
        return None
    budget = np.array([o["budget"] for o in obs], float)
    context = np.array([o["context"] for o in obs], float)
    trials = np.array([o["trials"] for o in obs], float)
    failures = np.array([o["failures"] for o in obs], float)
    at_budget = int(round(float(np.exp(np.log(budget).mean()))))
    at_context = int(round(float(np.exp(np.log(context).mean()))))
    free_budget = len(set(budget)) > 1
    free_context = len(set(context)) > 1
    if failures.sum() == 0:
        return {"per_token": 0.0, "at_budget": at_budget, "at_context": at_context,
                "budget_exponent": 1.0, "context_exponent": 0.5}

    def probability(theta):
        log_p0, be, ce = theta
        be = be if free_budget else 1.0
        ce = ce if free_context else 0.5
        p = np.exp(log_p0) * (at_budget / budget) ** be * (context / at_context) ** ce
        return np.clip(p, 1e-9, 1 - 1e-9)

    def negative_log_likelihood(theta):
        p = probability(theta)
        return -float((failures * np.log(p) + (trials - failures) * np.log1p(-p)).sum())

    start = [math.log(max(failures.sum() / trials.sum(), MIN_RATE)), 1.0, 0.5]
    best = minimize(negative_log_likelihood, start, method="L-BFGS-B",
                    bounds=[(math.log(1e-7), 0.0), (0.0, 4.0), (0.0, 4.0)])
    log_p0, be, ce = best.x
    return {"per_token": round(float(math.exp(log_p0)), 6), "at_budget": at_budget, "at_context": at_context,
            "budget_exponent": round(float(be), 3) if free_budget else 1.0,
            "context_exponent": round(float(ce), 3) if free_context else 0.5}


def disagreement_from_runs(runs: list[LiveRun], all_runs: list[LiveRun] | None = None) -> tuple[dict | None, list[dict]]:
    """(fitted disagreement, per-run observations) from the SpecPV runs among `runs`; the
    autoregressive baselines are looked up among `all_runs` (default `runs`)."""
    baselines = baselines_by_setting(all_runs if all_runs is not None else runs)
    observations = [o for o in (disagreement_observations(r, baselines.get(r.setting)) for r in runs) if o]
    return fit_disagreement(observations), observations


# ---- vLLM -----------------------------------------------------------------------------------------

PROMETHEUS_LINE = re.compile(r'^(?P<name>vllm:spec_decode_[a-z_]+?)(?:_total)?(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$')


def read_vllm_metrics(path: Path) -> dict:
    """The acceptance block from vLLM's speculative decoding counters (see the module docstring)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError("--vllm", f"cannot read {path}: {exc.strerror or exc}") from None
    records = []
    if text.lstrip().startswith("{"):
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                records.append((float(row["num_drafts"]), [float(x) for x in row["num_accepted_tokens_per_pos"]]))
            except (ValueError, KeyError, TypeError):
                raise InputError("--vllm", f"{path} line {number} lacks num_drafts / num_accepted_tokens_per_pos") from None
    else:
        drafts, per_pos = 0.0, {}
        for line in text.splitlines():
            m = PROMETHEUS_LINE.match(line.strip())
            if not m:
                continue
            value = float(m["value"])
            if m["name"] == "vllm:spec_decode_num_drafts":
                drafts += value
            elif m["name"] == "vllm:spec_decode_num_accepted_tokens_per_pos":
                pos = re.search(r'position="(\d+)"', m["labels"] or "")
                if pos:
                    per_pos[int(pos[1])] = per_pos.get(int(pos[1]), 0.0) + value
        if drafts and per_pos:
            records.append((drafts, [per_pos.get(j, 0.0) for j in range(max(per_pos) + 1)]))
    if not records or not any(d > 0 for d, _ in records):
        raise InputError("--vllm", f"{path} has no speculative decoding counters (vllm:spec_decode_*)")
    depth = max(len(p) for _, p in records)
    total = np.zeros(depth + 1)
    rates, trials = [], []
    for drafts, per_pos in records:
        counts = np.array([drafts] + per_pos + [0.0] * (depth - len(per_pos)))
        total += counts
        if drafts > 0:
            accepted = sum(per_pos)
            # Per-token rate of this record: accepted over accepted plus one rejection per draft
            # that stopped short of the record's own depth.
            tried = accepted + drafts - (per_pos[-1] if per_pos else 0.0)
            if tried > 0:
                rates.append(accepted / tried)
                trials.append(tried)
    spread = 0.0
    if len(rates) >= 2:
        # As for live runs: the spread between records, less the binomial noise of each.
        rates, trials = np.array(rates), np.array(trials)
        mean = np.average(rates, weights=trials)
        between = np.average((rates - mean) ** 2, weights=trials) - np.mean(rates * (1 - rates) / trials)
        spread = math.sqrt(max(between, 0.0))
    return {"method": "vllm", "acceptance": {"per_position": [round(r, 4) for r in rates_from_counts(total)],
                                             "request_spread": round(spread, 4), "context_slope": 0.0},
            "runs": [str(path)], "steps": int(total[0]),
            "tokens_per_step": round(float(1 + total[1:].sum() / total[0]), 4)}
