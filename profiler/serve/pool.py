"""`python -m profiler calibrate --pool A B ... --out C`: black-box bundles of one engine's server
pooled into one, as if one calibration had timed every pass.

A server's step times follow the machine's hour (on this project's VMs the same points took 20% longer
an hour apart), and a study runs for an hour. Bundles timed before and after it, pooled, price
the study at its middle; bundles of several machines of one kind, pooled, price the fleet. What is
pooled is what was measured, never a table derived from it:
  decode points  (batch, prompt tokens, k, drafter): each bundle's mean gap, weighted by its gaps
                 (`pooled`, as the passes inside one calibration are), and so the mean query;
  prefill points the mean of the bundles' times to first token (each a median over its prompts);
and from those the tables are derived again as `calibrate --engine` derives them
(`server_tables`). The bundles must be of one engine and version, model, dtype, grid and device
kind, with the same server settings; anything else is one line naming what differs.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from profiler.serve.calibrate import StepPoint, pooled, server_tables
from sim.errors import InputError

# sim.validate.runs names the same engines; profiler may not import sim.validate (.importlinter).
SERVER_ENGINES = ("vllm", "llama.cpp")
# What must agree for two bundles' points to be the same measurement.
SAME = (("engine", lambda m: m.get("engine")), ("engine version", lambda m: m["versions"].get(m.get("engine"))),
        ("model", lambda m: m["model"]["hash"]), ("dtype", lambda m: m["dtype"]), ("grid", lambda m: m["grid"]),
        ("device", lambda m: m["device"]["name"]), ("threads", lambda m: m["cpu"]["threads"]),
        ("new tokens", lambda m: m.get("new_tokens")), ("max model length", lambda m: m.get("max_model_len")),
        ("slots", lambda m: m.get("slots")), ("draft head", lambda m: m.get("draft_head")))


def read_server_bundle(path: Path) -> tuple[dict, list[StepPoint], dict[str, dict[int, float]]]:
    """A server bundle's meta, its measured decode points and its prefill times by drafter."""
    from sim.formats.bundle import PROFILE, load_bundle

    bundle = load_bundle(path)
    meta = bundle.meta
    if meta.get("engine") not in SERVER_ENGINES or "measured_steps" not in meta:
        raise InputError("--pool", f"{path} is not a bundle of an engine's server "
                                   f"(python -m profiler calibrate --engine {' | '.join(SERVER_ENGINES)})")
    # Bundles from before EAGLE points name no drafter: n-gram where the server drafted.
    steps = [StepPoint(**{"method": "ngram" if s["k"] else "none", **s}) for s in meta["measured_steps"]]
    if "measured_prefill" in meta:
        prefill = {m: {int(t): float(s) for t, s in points.items()} for m, points in meta["measured_prefill"].items()}
    else:
        import pandas as pd

        frame = pd.read_parquet(Path(path) / PROFILE)
        rows = frame[frame.op == "engine_prefill"]
        prefill = {"none": {int(t): float(s) for t, s in zip(rows.tokens, rows.seconds)}}
    return meta, steps, prefill


def pool_bundles(paths: list[Path], out: Path) -> Path:
    """Pool the bundles at `paths` into a bundle at `out` (written whole, or not at all)."""
    from sim.formats.bundle import write_bundle
    from sim.formats.provenance import git_revision, repo_relative

    if len(paths) < 2:
        raise InputError("--pool", "give two or more bundles to pool")
    if out.exists() and any(out.iterdir()):
        raise InputError("--out", f"{out} exists; give a new folder")
    read = [read_server_bundle(p) for p in paths]
    first = read[0][0]
    for path, (meta, _, _) in zip(paths[1:], read[1:]):
        for name, value in SAME:
            if value(meta) != value(first):
                raise InputError("--pool", f"{path} differs from {paths[0]} in its {name} "
                                           f"({value(meta)} against {value(first)})")

    by_point: dict[tuple, list[StepPoint]] = {}
    for _, steps, _ in read:
        for s in steps:
            by_point.setdefault((s.batch, s.prompt_tokens, s.k, s.method), []).append(s)
    if any(len(points) != len(read) for points in by_point.values()):
        raise InputError("--pool", "the bundles did not measure the same decode points")
    steps = [pooled(points) for points in by_point.values()]
    prefill: dict[str, dict[int, float]] = {}
    for method in read[0][2]:
        tokens = read[0][2][method]
        prefill[method] = {t: float(np.mean([r[2][method][t] for r in read])) for t in tokens}

    grid = first["grid"]
    forward_axes = grid["engine_forward"]["axes"]
    batches = [int(b) for b in forward_axes["batch"]]
    ks = [int(q) - 1 for q in forward_axes["query"][1:]]
    prompt_axis = sorted({s.prompt_tokens for s in steps})
    prefill_axis = [int(t) for t in grid["engine_prefill"]["axes"]["tokens"]]
    rounds = int(sum(meta["rounds"] for meta, _, _ in read))
    frame, _ = server_tables(steps, prefill, batches, prompt_axis, ks, prefill_axis, rounds)

    meta = json.loads(json.dumps(first))
    meta["measured_steps"] = [s.__dict__ for s in steps]
    if "measured_prefill" in first:
        meta["measured_prefill"] = {m: {str(t): s for t, s in points.items()} for m, points in prefill.items()}
    meta["rounds"] = rounds
    meta["step_estimator"] = "mean gap, pooled over rounds and over the pooled bundles"
    meta["prefill_estimator"] = "the mean over the pooled bundles of each one's time to first token"
    meta["pooled_from"] = [{"bundle": repo_relative(p), "date": m["date"], "duration_s": m.get("duration_s"),
                            "git_revision": m.get("git_revision")} for p, (m, _, _) in zip(paths, read)]
    meta["duration_s"] = round(sum(float(m.get("duration_s") or 0.0) for m, _, _ in read), 1)
    meta["git_revision"] = git_revision()
    write_bundle(out, frame, meta)
    dates = ", ".join(m["date"] for m, _, _ in read)
    print(f"{out}: {len(paths)} {first['engine']} bundles pooled ({dates}), {len(steps)} decode points over "
          f"{rounds} passes and {len(prefill['none'])} prefill points")
    return out
