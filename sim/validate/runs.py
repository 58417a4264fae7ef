"""`profiler live` run folders (sim/formats/run_folder.py) as the validation harness reads them.

Runs are grouped two ways: by drafter (runs whose acceptance can be fitted together: same method
and draft settings) and by setting (runs on the same prompts and batches, so an autoregressive run
is the measured baseline of every speculative run of its setting).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import InputError
from sim.formats.names import SHARE_GROUPS, share_group
from sim.formats.run_folder import META, REQUESTS, RUN_PHASES, STEPS, SUMMARY

# The time-share groups a run's measured shares are summed into (sim/formats/names.py).
SHARES = tuple(SHARE_GROUPS)

# What makes two runs' acceptance comparable, per method (besides the method and the draft shape).
DRAFT_SETTINGS = {"ngram": (), "shadow": ("bits", "group_size"), "layerskip": ("exit_layer",),
                  "streaming": ("sink", "window"), "draft_model": ("draft_model", "draft_layers"), "eagle": ("head",),
                  "synthetic": ("acceptance", "draft_shape")}
# Engines whose runs are a server's (profiler serve-live): continuous batching, no step records.
SERVER_ENGINES = ("vllm", "llama.cpp")
# What makes two server runs serve the same requests the same way (speculation aside).
SERVER_SETTING = ("model", "dtype", "threads", "seed", "context", "text", "text_start", "prompts", "first_prompt",
                  "limit", "batch", "rate", "max_new_tokens", "max_model_len", "parallel")
# What makes two runs decode the same prompts in the same batches.
SETTING = ("model", "dtype", "device", "threads", "seed", "context", "text", "prompts", "limit", "per_category", "batch",
           "max_new_tokens", "temperature", "top_p")
# ... and, served continuously, the same arrivals and scheduling.
SERVING_SETTING = ("serving", "concurrency", "rate", "arrivals", "prefill_chunk", "kv_budget")


class RunFolder:
    """What every run folder says of itself (its fields: path, meta, summary)."""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def args(self) -> dict:
        return self.meta["arguments"]

    @property
    def method(self) -> str:
        return self.summary["method"]

    @property
    def speculative(self) -> bool:
        return self.method != "none"


@dataclass
class LiveRun(RunFolder):
    path: Path
    meta: dict
    summary: dict
    requests: "object"          # pandas DataFrame, sorted by request
    steps: "object"             # pandas DataFrame of the speculative run's rows
    repeat_tok_s: tuple = ()    # throughput of every repeat of this run (see merge_repeats)
    # A policy's run (`--policy`): every step, its plain decode steps (drafted 0) included.
    every_step: "object" = None
    # Served continuously: every repeat's median time to first token and per output token (ms).
    repeat_ttft_p50_ms: tuple = ()
    repeat_tpot_p50_ms: tuple = ()

    @property
    def batch(self) -> int:
        return int(self.args["batch"])

    @property
    def continuous(self) -> bool:
        """Served by continuous batching (`--serving continuous`), not in static batches."""
        return self.args.get("serving") == "continuous"

    @property
    def open_loop(self) -> bool:
        """Requests arrived on their own clock (Poisson or a trace), not when a client's last one ended."""
        return self.continuous and (self.args.get("rate") is not None or self.args.get("arrivals") is not None)

    @property
    def depth(self) -> int:
        """Longest chain of drafts one step can accept."""
        tree = self.args.get("tree")
        return int(tree[1]) if tree else int(self.args["k"])

    @property
    def partial(self) -> bool:
        return self.args.get("budget") is not None

    @property
    def policy(self) -> str:
        """`--policy`: static, off_above_batch:N or goodput."""
        return self.args.get("policy") or "static"

    @property
    def context_tokens(self) -> float:
        """Mean prompt length."""
        return float(self.requests.prompt_tokens.mean())

    @property
    def drafter(self) -> str:
        """A label naming the drafter and its settings: runs with the same label share acceptance."""
        if not self.speculative:
            return "none"
        a = self.args
        shape = f"tree {a['tree'][0]}x{a['tree'][1]}" if a.get("tree") else f"k={a['k']}"
        extra = " ".join(f"{key}={a.get(key)}" for key in DRAFT_SETTINGS.get(self.method, ()))
        sampled = f" T={a['temperature']}" if a.get("temperature") else ""
        return " ".join(part for part in (self.method, extra, shape) if part) + sampled

    @property
    def setting(self) -> tuple:
        a = self.args
        served = tuple(str(a.get(key)) for key in SERVING_SETTING) if self.continuous else ()
        return tuple(str(a.get(key)) for key in SETTING) + served

    def steps_of(self, requests) -> "object":
        """Steps of these requests, in step order."""
        return self.steps[self.steps.request.isin(list(requests))].sort_values(["request", "step"])


@dataclass
class ServerRun(RunFolder):
    """A server's run (`profiler serve-live`): requests and counters, no steps (sim/validate/server.py)."""
    path: Path
    meta: dict
    summary: dict
    requests: "object"           # pandas DataFrame, sorted by request
    repeat_tok_s: tuple = ()

    @property
    def drafter(self) -> str:
        if not self.speculative:
            return "none"
        a = self.args
        if self.method == "eagle":
            return f"eagle k={a['k']}"
        if self.meta.get("engine") == "llama.cpp":        # ngram-simple looks up one n-gram length
            return f"{self.method} k={a['k']} n={a['prompt_lookup_min']}"
        return f"{self.method} k={a['k']} n={a['prompt_lookup_min']}-{a['prompt_lookup_max']}"

    @property
    def setting(self) -> tuple:
        return tuple(str(self.args.get(key)) for key in SERVER_SETTING)

    @property
    def load(self) -> str:
        return f"{self.args['rate']:g}/s" if self.args.get("rate") else f"batch {self.args['batch']}"

    @property
    def counters(self) -> dict:
        return self.summary.get("spec_decode") or {}

    @property
    def decode_steps(self) -> int:
        """Request-steps after each request's first token: decode tokens less the accepted ones."""
        tokens = int((self.requests.output_tokens - 1).clip(lower=0).sum())
        return max(tokens - int(self.counters.get("accepted", 0)), 1)


def read_run(run_dir: Path) -> "LiveRun | ServerRun":
    """A live run folder (a ServerRun for a server's: sim/validate/server.py), or a one-line error
    naming what is wrong with it."""
    import pandas as pd

    run_dir = Path(run_dir)
    try:
        meta = json.loads((run_dir / META).read_text())
        summary = json.loads((run_dir / SUMMARY).read_text())
        requests = pd.read_parquet(run_dir / REQUESTS).sort_values("request").reset_index(drop=True)
        steps = pd.read_parquet(run_dir / STEPS)
    except FileNotFoundError as exc:
        raise InputError("RUN_DIR", f"{run_dir} is not a profiler live run ({Path(exc.filename).name} missing)") from None
    except (OSError, ValueError) as exc:
        raise InputError("RUN_DIR", f"{run_dir} cannot be read ({exc.__class__.__name__})") from None
    if "arguments" not in meta or "method" not in summary:
        raise InputError("RUN_DIR", f"{run_dir}: meta.json or summary.json is not a live run's")
    if meta.get("engine") in SERVER_ENGINES:
        return ServerRun(run_dir, meta, summary, requests)
    every_step = None
    if len(steps):
        steps = steps[steps.run == "speculative"]
        if summary["method"] != "none":
            # A policy's steps that drafted nothing (`--policy`) are plain decode steps: acceptance
            # is read from the verification steps only, as the simulator draws it; replay takes all.
            if (meta["arguments"].get("policy") or "static") != "static":
                every_step = steps
            steps = steps[steps["mode"] != "decode"]
    return LiveRun(run_dir, meta, summary, requests, steps, every_step=every_step)


def read_runs(paths: list[Path]) -> list[LiveRun]:
    """The runs, repeats merged (`merge_repeats`)."""
    return merge_repeats([read_run(p) for p in paths])


def merge_repeats(runs: list[LiveRun]) -> list[LiveRun]:
    """Folders of the same name are repeats of one run (a campaign's repeats/N/NAME): the median pass by
    throughput stands for the run (of an even number, the faster of the middle two), and every
    repeat's throughput is kept to show the spread. This machine has slow spells of tens of
    seconds; the median pass is the machine's usual state, the level calibration measures too (the
    median of its rounds, and of interleaved whole forwards), where the fastest pass would set the
    measured side at its best state. Repeats must have the same arguments."""
    by_name: dict[str, list[LiveRun]] = {}
    for run in runs:
        by_name.setdefault(run.name, []).append(run)
    merged = []
    for name, group in by_name.items():
        # --out and --probe change where a run is written and what is measured around it, not the run.
        arguments = {json.dumps({k: v for k, v in r.args.items() if k not in ("out", "probe")}, sort_keys=True)
                     for r in group}
        if len(arguments) > 1:
            raise InputError("RUN_DIR", f"two runs named {name} have different arguments; give each run its own name")
        by_speed = sorted(group, key=lambda r: -float(r.summary["throughput_tok_s"]))
        median = by_speed[(len(by_speed) - 1) // 2]
        median.repeat_tok_s = tuple(float(r.summary["throughput_tok_s"]) for r in group)
        if isinstance(median, LiveRun) and median.continuous:      # a server's runs are compared elsewhere
            median.repeat_ttft_p50_ms = tuple(float(r.requests.ttft_s.median()) * 1e3 for r in group)
            median.repeat_tpot_p50_ms = tuple(float(r.requests.tpot_s.dropna().median()) * 1e3 for r in group)
        merged.append(median)
    return merged


def baselines_by_setting(runs: list[LiveRun]) -> dict[tuple, LiveRun]:
    """The autoregressive run of each setting (the first, if a setting has several)."""
    out: dict[tuple, LiveRun] = {}
    for run in runs:
        if not run.speculative:
            out.setdefault(run.setting, run)
    return out


def measured_baseline_tok_s(run: LiveRun, baselines: dict[tuple, LiveRun]) -> float | None:
    """The run's own --baseline throughput, else that of the autoregressive run of its setting."""
    if run.summary.get("baseline_throughput_tok_s"):
        return float(run.summary["baseline_throughput_tok_s"])
    base = baselines.get(run.setting)
    return float(base.summary["throughput_tok_s"]) if base is not None else None


def per_request_steps(run: LiveRun, requests, every_step: bool = False) -> dict[str, list[np.ndarray]]:
    """Per request (in the given order), at each verification step (with `every_step`, a policy
    run's plain decode steps too, drafted 0): accepted drafts, tokens rolled back (SpecPV rectify)
    and drafted tokens."""
    steps = run.steps_of(requests) if not every_step else \
        run.every_step[run.every_step.request.isin(list(requests))].sort_values(["request", "step"])
    groups = {rid: frame for rid, frame in steps.groupby("request", sort=False)}
    out: dict[str, list[np.ndarray]] = {"accepted": [], "rolled_back": [], "drafted": []}
    for rid in requests:
        frame = groups.get(rid)
        for column, values in out.items():
            values.append(np.zeros(0, np.int64) if frame is None else frame[column].to_numpy(np.int64))
    return out


def decode_tok_s(run: LiveRun) -> float | None:
    """Output tokens after each request's first, over the run's time outside prefill."""
    s = run.summary
    wall_s = float(run.requests.output_tokens.sum()) / float(s["throughput_tok_s"])
    decode_s = wall_s * (1.0 - s.get("time_share", {}).get("prefill", 0.0))
    tokens = float(run.requests.output_tokens.sum() - len(run.requests))
    return tokens / decode_s if decode_s > 0 else None


def measured(run: LiveRun, baselines: dict) -> dict:
    """What the run measured, as a prediction is compared with it: throughput, speedups, TPOT,
    tokens per step, served latencies and time shares."""
    s = run.summary
    base = measured_baseline_tok_s(run, baselines)
    base_run = baselines.get(run.setting)
    decode_speedup = None
    if run.speculative and base_run is not None:
        mine, theirs = decode_tok_s(run), decode_tok_s(base_run)
        decode_speedup = mine / theirs if mine and theirs else None
    share = s.get("time_share", {})
    tpot = run.requests.tpot_s.dropna()
    # Tokens per step as the simulator counts them: accepted drafts + 1, before any roll-back.
    tokens_per_step = float(run.steps.accepted.mean() + 1) if run.speculative and len(run.steps) else 1.0
    return {"tok_s": float(s["throughput_tok_s"]),
            "speedup": float(s["throughput_tok_s"]) / base if run.speculative and base else None,
            "decode_speedup": decode_speedup,
            "tpot_ms": float(tpot.mean()) * 1e3 if len(tpot) else math.nan,
            "tokens_per_step": tokens_per_step,
            "ttft_p50_ms": float(run.requests.ttft_s.median()) * 1e3 if run.continuous else math.nan,
            "tpot_p50_ms": float(tpot.median()) * 1e3 if run.continuous and len(tpot) else math.nan,
            "share": {k: sum(share.get(p, 0.0) for p in RUN_PHASES if share_group(RUN_PHASES[p]) == k)
                      for k in SHARES}}


def repeat_speedups(run: LiveRun, baselines: dict) -> tuple:
    """Each repeat's throughput over the baseline's repeat of the same index (a campaign's pass N of
    both), when both have the same number of repeats; empty otherwise."""
    base = baselines.get(run.setting)
    if not run.speculative or base is None or len(run.repeat_tok_s) < 2 \
            or len(base.repeat_tok_s) != len(run.repeat_tok_s):
        return ()
    return tuple(mine / theirs for mine, theirs in zip(run.repeat_tok_s, base.repeat_tok_s))
