"""`python -m profiler calibrate`: time every operator of the live engine on this device and write a
calibration bundle (DIR/profile.parquet + DIR/meta.json) for the simulator's calibrated cost model.

1. Operators (profiler/operators.py), each cycling through enough copies of its weights and KV to
   miss the CPU's caches as a real forward does, on a grid geometric in tokens and KV and dense at
   small batch, plus off-grid points held out of the tables. Each point is timed in several rounds
   (each round a median of many calls), the points of a round in a fresh seeded random order, and
   the median round kept (every round's time stays in the bundle, `round_seconds`): a shared
   machine changes speed for seconds to minutes at a time (on the CI VM, calibrations hours apart
   differ in level by up to 7% and point by point by about 10%),
   and interleaving spreads those states over the grid. The median, not the best round: on the
   VM of 2026-12-01 the best of 3 rounds gives a lower held-out error in one bundle of three
   (3.4% against 5.5%; 3.2% and 3.0% against 3.2% in the other two), but that bundle built from
   its best rounds predicts the day's live runs worse (the validation study's six autoregressive
   runs 4.6% against 0.9%, median): whole forwards run at the machine's usual state, and the
   whole-forward factor cannot carry a level that differs operator by operator. Rounds help
   there: the median of 1, 2 and 3 rounds gives 5.1%, 4.7% and 3.2% in the committed bundle
   (averaged over the choices of rounds; 5.9%, 5.4%, 5.5% in the 01:59 one); on the slower VM of
   2026-11-30, 3 of 5 rounds gave 9.9% (7.8-12.5% by which 3) and all 5 7.8%, in 953 s
   (`benchmarks/calibration_repeatability.py`). So a full calibration times at least 3 rounds
   and goes on to 4 or 5 while one more still ends within its time budget (MIN_ROUNDS,
   MAX_ROUNDS, ROUNDS_BUDGET_S). Two calibrations of one machine time the same
   point 2.0-3.6% apart (median; 8.2-13.3% on 2026-11-30), the floor under any held-out error.
2. Whole forwards against the composed operators: the factor measured / composed against the
   forward's query tokens and KV tokens (decode batches 1-16 and verification at KV 256, 1024 and
   4096; prompts), which the cost model multiplies every forward by. SpecPV's block selection
   timed inside partial-verification forwards against its table, a factor over batch and context
   (1.05-1.84 times its time alone here; the forward's factor missed most of it). The engine's
   host time per step: `speculative_generate` decoding at batch 1 to 16, its wall time minus its
   forwards (timed by hooks on the model) and its acceptance, fitted as fixed + per request.
   A round of these follows each round of operators, and each is the median of its rounds: the
   operators' median rounds give each term's shape, whole forwards over the same minutes give the
   level the engine meets on this machine in its usual state (profiler/engine_fits.py;
   `--refit BUNDLE` redoes only this step, its rounds back to back). The decode forwards, whose
   level moves most from one burst to the next, are also timed twice more within each round of
   operators, so their median is over three bursts a round instead of one.
3. Held-out error: each held-out point against the tables' interpolation, and whole forwards at
   off-grid shapes against the composed prediction; median, P90 and worst go in meta.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from profiler.engine_fits import DECODE_BURSTS_WITHIN_ROUND
from sim.cost.bundle import HELD_OUT_TARGET, round_spread, timing_noise_line
from sim.errors import ScenarioError

# Axes per operator. Full: geometric steps of at most 2 (1.5 at small token counts, where the
# matmul library switches kernels); quick: about every other point. Tokens reach 8,192, a batch's
# whole prefill (4 x 2,048, 16 x 512): past about 4,096 tokens a layer's activations outgrow the
# CPU's caches and the elementwise work per token doubles, which a line from 4,096 did not see.
TOKENS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096,
          6144, 8192]
TOKENS_QUICK = [1, 2, 4, 6, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192]
# A quantized drafter's tokens (one per request of the batch): 48 since held-out points at 40-63
# tokens read 8-25% off the line from 32 to 64 (int8 and int4 matmuls, bundle of 2026-12-01 01:59).
DRAFT_TOKENS = [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64]
BATCH = [1, 2, 4, 8, 16]
QUERY = [1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64]
KV = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
PREFILL_QUERY = [128, 256, 512, 1024, 2048, 4096]
PREFILL_KV = [128, 256, 512, 1024, 2048, 4096, 8192]
CONTEXT = [256, 512, 1024, 2048, 4096, 8192]
BUDGET = [256, 512, 1024, 2048, 4096]
ACCEPT_TOKENS = [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32]
BYTES = [1 << 16, 1 << 20, 1 << 24, 1 << 26, 1 << 28]
# Rounds of a full calibration without --rounds: at least MIN_ROUNDS, and more, up to MAX_ROUNDS,
# while one more round as long as the longest so far still ends within ROUNDS_BUDGET_S of the
# start (the fits and held-out error take seconds after), so a calibration stays within its
# limit (15 minutes on a 2-core CPU, 10 on an H200) and a faster machine spends the time on more
# samples of every point: the held-out error falls with rounds (module docstring).
MIN_ROUNDS, MAX_ROUNDS = 3, 5
ROUNDS_BUDGET_S = {"cpu": 13 * 60.0, "cuda": 9 * 60.0}


def every_other(axis: list[int]) -> list[int]:
    """Quick grids: every other point, always keeping both ends."""
    kept = axis[::2]
    return kept if kept[-1] == axis[-1] else kept + [axis[-1]]


def grid_for(config, quick: bool, cuda: bool) -> dict[str, dict[str, list[int]]]:
    """op -> {dim: axis}, clipped to the model's context."""
    q = every_other if quick else (lambda a: a)
    ctx = lambda axis: [x for x in axis if x <= config.max_context] or axis[:1]
    tokens = TOKENS_QUICK if quick else TOKENS
    grid = {f"linear.{n}": {"tokens": tokens} for n in ("qkv", "o", "gate_up", "down")}
    grid.update({f"int{b}.{n}": {"tokens": q(DRAFT_TOKENS)} for b in (8, 4) for n in ("qkv", "o", "gate_up", "down")})
    grid["elementwise"] = {"tokens": tokens}
    grid["lm_head"] = {"tokens": [t for t in tokens if t <= 512]}
    grid["attention"] = {"batch": q(BATCH), "query": q(QUERY), "kv": ctx(q(KV))}
    grid["attention_partial"] = {"batch": [1, 4, 16], "query": q([1, 2, 5, 9, 17]), "kv": q([256, 512, 1024, 2048, 4096])}
    grid["attention_prefill"] = {"query": ctx(q(PREFILL_QUERY)), "kv": ctx(q(PREFILL_KV))}
    grid["attention_prompt"] = {"query": ctx(q(PREFILL_KV))}
    grid["forward_base"] = {"batch": [1, 4, 16], "query": [1, 8, 64, 512], "kv": ctx([128, 1024, 8192])}
    grid["summaries"] = {"batch": [1, 4, 16], "context": ctx(q(CONTEXT))}
    grid["selection"] = {"batch": [1, 4, 16], "context": ctx(q(CONTEXT)), "budget": q(BUDGET)}
    grid["ngram"] = {"context": ctx(q(CONTEXT))}
    grid["accept"] = {"batch": q([1, 2, 3, 4, 6, 8, 12, 16, 32, 64]), "tokens": q(ACCEPT_TOKENS)}
    if cuda:
        grid["h2d_pinned"] = {"bytes": BYTES}
        grid["h2d_pageable"] = {"bytes": BYTES}
    return grid


def held_out_points(grid: dict, rng, per_op: int) -> dict[str, list[dict]]:
    """Off-grid points inside each operator's grid: log-uniform in every dim, rounded to integers
    that are not grid values (dims with fewer than two values keep theirs)."""
    out = {}
    for op, axes in grid.items():
        points = []
        for _ in range(per_op * 20):
            point = {}
            for dim, axis in axes.items():
                if len(axis) < 2:
                    point[dim] = axis[0]
                    continue
                for _ in range(20):
                    value = int(round(math.exp(rng.uniform(math.log(axis[0]), math.log(axis[-1])))))
                    if value not in axis:
                        break
                point[dim] = value
            if op in ("attention_prefill",) and point["kv"] < point["query"]:
                continue
            if all(point[d] not in axes[d] for d in axes if len(axes[d]) > 1) and point not in points:
                points.append(point)
            if len(points) == per_op:
                break
        out[op] = points
    return out


def grid_points(axes: dict[str, list[int]]):
    """Every point of a regular grid, as {dim: value}."""
    import itertools

    dims = list(axes)
    for values in itertools.product(*(axes[d] for d in dims)):
        yield dict(zip(dims, values))


def prefill_cell(op: str, point: dict) -> dict:
    """attention_prefill's grid cells with kv < query stand for kv = query (a prompt attends at
    least to itself); the table never reads them below the diagonal."""
    if op == "attention_prefill" and point["kv"] < point["query"]:
        return {**point, "kv": point["query"]}
    return point


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to time (auto: cuda when available)")
    parser.add_argument("--model", default="smollm2",
                        help="smollm2, a model preset, or a Llama-family config.json (random weights: only shapes matter)")
    parser.add_argument("--dtype", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                        help="auto: fp32 on the CPU, bf16 on CUDA")
    parser.add_argument("--quick", action="store_true", help="a coarser grid and one round (at most 3 minutes here)")
    parser.add_argument("--out", type=Path, help="bundle folder (default calibration/<cpu|gpu name>/<model>)")
    parser.add_argument("--rounds", type=int,
                        help=f"timing rounds per point, the median kept (default {MIN_ROUNDS}, and up to {MAX_ROUNDS} "
                             f"while another fits the time limit; quick 1)")
    parser.add_argument("--operators", help="comma-separated subset of operators (default all)")
    parser.add_argument("--refit", type=Path, metavar="BUNDLE",
                        help="keep BUNDLE's operator times and redo only the engine fits (after an engine change)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", choices=("live", "hf"), default="live",
                        help="live: this project's engine, operator by operator; hf: Hugging Face transformers' "
                             "model forward as a black box (profiler/hf_engine.py)")


def resolve_config(name: str):
    """(LlamaConfig, model name) for --model."""
    from dataclasses import fields

    from profiler.loaders import hf_llama_config
    from profiler.model import LlamaConfig
    from sim.presets.models import MODELS

    key = "smollm2-135m" if name == "smollm2" else name
    if key in MODELS:
        spec = MODELS[key]
        return LlamaConfig(**{f.name: getattr(spec, f.name) for f in fields(spec)}), key
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        try:
            config = hf_llama_config(path)
        except (ScenarioError, ValueError, KeyError, OSError) as exc:
            raise ScenarioError("--model", f"cannot read {path}: {exc}") from None
        return config, str(path)
    raise ScenarioError("--model", f"{name!r} is not smollm2, a model preset or a config.json file")


def hardware_name(device_name: str, cuda: bool) -> str:
    """The simulator's hardware preset a device corresponds to (a bundle from another one warns)."""
    if not cuda:
        return "cpu"
    name = device_name.lower()
    for needle, preset in (("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"),
                           ("a100-sxm4-40", "a100-40g"), ("a100", "a100-80g"), ("l40", "l40"), ("4090", "rtx-4090"),
                           ("3090", "rtx-3090"), ("4070", "rtx-4070"), ("4060 ti", "rtx-4060-ti-8g"),
                           ("2080 ti", "rtx-2080-ti")):
        if needle in name:
            return preset
    return "custom"


def calibrate_command(args) -> int:
    import numpy as np
    import torch
    from tqdm import tqdm

    if args.engine == "hf":
        from profiler.hf_engine import calibrate_hf

        if args.threads is not None and args.threads < 1:
            raise ScenarioError("--threads", f"{args.threads} must be at least 1")
        if args.rounds is not None and args.rounds < 1:
            raise ScenarioError("--rounds", f"{args.rounds} must be at least 1")
        for flag, value in (("--operators", args.operators), ("--refit", args.refit)):
            if value is not None:
                raise ScenarioError(flag, "applies to the live engine's operators, not to --engine hf")
        return calibrate_hf(args)

    if args.threads is not None:
        if args.threads < 1:
            raise ScenarioError("--threads", f"{args.threads} must be at least 1")
        torch.set_num_threads(args.threads)
    if args.rounds is not None and args.rounds < 1:
        raise ScenarioError("--rounds", f"{args.rounds} must be at least 1")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise ScenarioError("--device", "cuda is not available here (torch " + torch.__version__ + ")")
    device = "cuda" if cuda else "cpu"
    dtype_name = args.dtype if args.dtype != "auto" else ("bf16" if cuda else "fp32")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    config, model_name = resolve_config(args.model)
    device_name = torch.cuda.get_device_name() if cuda else _cpu_model()
    model_label = Path(model_name).parent.name if model_name.endswith("config.json") else model_name
    out = args.out or Path("calibration") / ("cpu" if not cuda else hardware_name(device_name, True)) / model_label
    grid = grid_for(config, args.quick, cuda)
    if args.operators:
        wanted = [o.strip() for o in args.operators.split(",") if o.strip()]
        unknown = [o for o in wanted if o not in grid]
        if unknown:
            raise ScenarioError("--operators", f"unknown operator {unknown[0]!r} (choose from {', '.join(grid)})")
        grid = {op: grid[op] for op in wanted}
    started = time.perf_counter()
    if args.rounds:
        rounds = max_rounds = args.rounds
    else:
        rounds, max_rounds = (1, 1) if args.quick else (MIN_ROUNDS, MAX_ROUNDS)
    if args.refit is not None:
        frame, meta = reuse_operators(args.refit, config, dtype_name, device_name)
        grid = grid_of(meta)
        out = args.out or args.refit
    needed = [op for op in (*(f"linear.{n}" for n in ("qkv", "o", "gate_up", "down")), "elementwise",
                            "attention", "attention_prefill", "lm_head") if op not in grid]
    probe = None
    if needed:
        if args.refit is not None:
            raise ScenarioError("--refit", f"{args.refit} has no {', '.join(needed)} to fit the engine against")
        print(f"note: no engine fits without {', '.join(needed)} (an --operators subset)")
    else:
        from profiler.engine_fits import EngineProbe

        probe = EngineProbe(config, dtype, device, args.seed, args.quick,
                            selection="selection" in grid and "summaries" in grid)
    if args.refit is not None:
        for _ in tqdm(range(rounds), desc="engine rounds", unit="round"):
            probe.measure_round()
            for _ in range(DECODE_BURSTS_WITHIN_ROUND):
                probe.measure_decode_burst()
    else:
        rng = np.random.default_rng(args.seed)
        held = held_out_points(grid, rng, per_op=3 if args.quick else 6)
        frame, rounds = measure_operators(config, dtype, device, grid, held, rounds, args.seed,
                                          after_round=probe.measure_round if probe is not None else None,
                                          within_round=probe.measure_decode_burst if probe is not None else None,
                                          within_round_calls=DECODE_BURSTS_WITHIN_ROUND, max_rounds=max_rounds,
                                          deadline=started + ROUNDS_BUDGET_S[device])
        meta = bundle_meta(args, config, model_name, dtype_name, device, device_name, grid, rounds)
    fits, forward_checks = {}, []
    if probe is not None:
        with tempfile.TemporaryDirectory() as provisional:
            write_bundle(Path(provisional), frame, meta)
            fits, forward_checks = probe.fit(model_name, dtype_name, meta["device"]["hardware"], Path(provisional))
    meta["fits"] = fits
    meta["held_out"] = held_out_error(frame, grid, forward_checks)
    spread = round_spread(frame, meta["rounds"])
    meta["held_out"]["round_spread"] = None if spread is None else round(spread, 4)
    if args.refit is not None:
        from sim.simulate import git_revision

        meta["refit"] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         "git_revision": git_revision(), "duration_s": round(time.perf_counter() - started, 1),
                         "rounds": rounds}
    else:
        meta["duration_s"] = round(time.perf_counter() - started, 1)
    write_bundle(out, frame, meta)
    print(format_calibration_summary(out, meta))
    return 0


def grid_of(meta: dict) -> dict[str, dict[str, list[int]]]:
    """A bundle's grid (meta.json's "grid") as calibrate builds it: axes per operator."""
    return {op: spec["axes"] for op, spec in meta["grid"].items()}


def reuse_operators(bundle_dir: Path, config, dtype_name: str, device_name: str):
    """The operator rows and meta of an existing bundle of the same model, dtype and device."""
    import pandas as pd

    from sim.cost.bundle import SCHEMA_VERSION, model_hash

    try:     # the old fits may be of another form: read the operator rows only
        meta = json.loads((bundle_dir / "meta.json").read_text())
        frame = pd.read_parquet(bundle_dir / "profile.parquet")
    except (OSError, ValueError) as exc:
        raise ScenarioError("--refit", f"cannot read {bundle_dir} ({exc.__class__.__name__})") from None
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ScenarioError("--refit", f"{bundle_dir} has schema version {meta.get('schema_version')!r}")
    meta = {k: v for k, v in meta.items() if k not in ("fits", "held_out", "refit")}
    if meta["model"].get("hash") != model_hash(config) or meta["dtype"] != dtype_name or \
            meta["device"].get("name") != device_name:
        raise ScenarioError("--refit", f"{bundle_dir} holds {meta['model'].get('name')} {meta['dtype']} on "
                                       f"{meta['device'].get('name')}, not {dtype_name} on {device_name}")
    return frame, meta


def evenly_spaced_positions(points: int, calls: int) -> list[int]:
    """Where in a round of `points` timings `calls` extra calls go: before the timing at 1/(n+1),
    2/(n+1)... of the round; positions repeat when there are more calls than points."""
    return [points * (k + 1) // (calls + 1) for k in range(calls)]


def another_round(done: int, rounds: int, max_rounds: int, now_s: float, longest_round_s: float,
                  deadline: float | None) -> bool:
    """Whether to time another round after `done`: always below `rounds`; below `max_rounds` if
    one as long as the longest so far ends by `deadline` (perf_counter seconds; None: never)."""
    if done < rounds:
        return True
    return done < max_rounds and deadline is not None and now_s + longest_round_s <= deadline


def measure_operators(config, dtype, device, grid, held, rounds, seed, after_round=None, within_round=None,
                      within_round_calls: int = 0, max_rounds: int | None = None, deadline: float | None = None):
    """Time every grid and held-out point `rounds` times in shuffled order, calling `after_round()`
    after each round (the engine's whole forwards) and `within_round()` `within_round_calls` times
    evenly spaced through it (more bursts of the decode forwards); then more rounds, up to
    `max_rounds`, while one as long as the longest so far ends before `deadline` (a
    time.perf_counter() value). Returns one row per point, the median round (`seconds`), every
    round (`round_seconds`) and their range over the median (`spread`), and the rounds timed."""
    import numpy as np
    import pandas as pd
    import torch
    from tqdm import tqdm

    from profiler.operators import OPERATORS, Bench, random_pool
    from profiler.timing import time_call
    from sim.cost.bundle import DIMS

    items = []
    for op, axes in grid.items():
        items += [(op, prefill_cell(op, p), False) for p in grid_points(axes)]
        items += [(op, p, True) for p in held.get(op, [])]
    # Duplicates (prefill cells below the diagonal) are timed once.
    unique = list(dict.fromkeys((op, tuple(sorted(p.items())), h) for op, p, h in items))
    element_bytes = torch.finfo(dtype).bits // 8
    min_run_time_s = 0.02
    times: dict[tuple, list] = {key: [] for key in unique}
    rng = np.random.default_rng(seed)
    # Enough shared random values for the copies of any operator to overflow the caches 4 times.
    pool = random_pool(max(4 * last_level_cache_bytes() // element_bytes, 1 << 22), dtype, device, seed) \
        if device == "cpu" else None
    # Spread through the round, the extra bursts meet the machine in the states the operators do.
    within_at = evenly_spaced_positions(len(unique), within_round_calls if within_round is not None else 0)
    max_rounds = max(rounds, max_rounds or rounds)
    longest_round_s, r = 0.0, 0
    with torch.inference_mode(), tqdm(total=len(unique) * rounds, desc="calibrate", unit="point") as bar:
        while another_round(r, rounds, max_rounds, time.perf_counter(), longest_round_s, deadline):
            if r >= rounds:                           # a round beyond the planned ones
                bar.total += len(unique)
                bar.refresh()
            round_started = time.perf_counter()
            order = rng.permutation(len(unique))
            for position, i in enumerate(order):
                for _ in range(within_at.count(position)):
                    bar.set_postfix_str(f"decode forwards, round {r + 1}")
                    within_round()
                    bar.set_postfix_str("")
                op, point, _ = key = unique[i]
                bench = Bench(config, dtype, device, torch.Generator().manual_seed(seed * 100003 + int(i)), pool,
                              int(rng.integers(pool.numel())) if pool is not None else 0)
                fn = build_cold(OPERATORS[op], bench, dict(point), element_bytes)
                times[key].append(time_call(fn, device, min_run_time_s))
                del fn, bench
                bar.update()
            if after_round is not None:
                bar.set_postfix_str(f"engine round {r + 1}")
                after_round()
                bar.set_postfix_str("")
            longest_round_s = max(longest_round_s, time.perf_counter() - round_started)
            r += 1
    rows = []
    for (op, point, held_out), timings in times.items():
        p = dict(point)
        rounds_s = [t.median_s for t in timings]
        median = float(np.median(rounds_s))
        spread = (max(rounds_s) - min(rounds_s)) / median if len(rounds_s) > 1 else timings[0].spread
        flops, moved = OPERATORS[op].work(config, element_bytes, p)
        rows.append({**{d: int(p.get(d, 0)) for d in DIMS}, "op": op, "seconds": median, "spread": spread,
                     "round_seconds": rounds_s,
                     "runs": sum(t.runs for t in timings), "held_out": held_out, "flops": flops,
                     "bytes_moved": moved})
    # Cells below attention_prefill's diagonal read the diagonal's time.
    frame = pd.DataFrame(rows)
    for op, axes in grid.items():
        if op != "attention_prefill":
            continue
        for p in grid_points(axes):
            if p["kv"] < p["query"]:
                source = frame[(frame.op == op) & (frame["query"] == p["query"]) & (frame.kv == p["query"]) & ~frame.held_out]
                row = source.iloc[0].to_dict()
                row["kv"] = p["kv"]
                frame = pd.concat([frame, pd.DataFrame([row])], ignore_index=True)
    return frame.sort_values(["op", "held_out", *DIMS]).reset_index(drop=True), r


# Host-side operators whose inputs a real step has just produced (warm in cache).
# forward_base gathers a few rows of an embedding too large to copy.
WARM_OPERATORS = {"elementwise", "ngram", "accept", "forward_base"}


def last_level_cache_bytes() -> int:
    """The CPU's largest cache (Linux sysfs), default 32 MiB."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
            sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text))
        except (OSError, ValueError, KeyError):
            continue
    return max(sizes, default=32 << 20)


def build_cold(operator, bench, point: dict, element_bytes: int):
    """The operator's callable, cycling on the CPU through enough copies of its weights and KV to
    overflow the last-level cache twice: in a real forward each layer's weights and KV come from
    memory, and timing one copy in a loop would time the cache instead. (CUDA: do_bench flushes L2.)"""
    import itertools

    if bench.device == "cuda" or operator.name in WARM_OPERATORS:
        return operator.build(bench, point)
    working_set = max(operator.work(bench.config, element_bytes, point)[1], 1.0)
    copies = int(min(64, max(1, math.ceil(2 * last_level_cache_bytes() / working_set))))
    calls = itertools.cycle([operator.build(bench, point) for _ in range(copies)])
    return lambda: next(calls)()


def bundle_meta(args, config, model_name, dtype_name, device, device_name, grid, rounds) -> dict:
    import torch

    from sim.cost.bundle import MODEL_FIELDS, SCHEMA_VERSION, model_hash
    from sim.simulate import git_revision

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    memory_gb = (torch.cuda.get_device_properties(0).total_memory / 1e9 if device == "cuda"
                 else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9)
    return {
        "schema_version": SCHEMA_VERSION,
        "engine": "profiler.live",
        "device": {"kind": device, "name": device_name, "memory_gb": round(memory_gb, 1),
                   "hardware": hardware_name(device_name, device == "cuda")},
        "cpu": {"model": _cpu_model(), "threads": torch.get_num_threads(), "cores": os.cpu_count()},
        "versions": {"torch": torch.__version__, "triton": triton_version,
                     "cuda": torch.version.cuda if device == "cuda" else None, "python": platform.python_version()},
        "dtype": dtype_name,
        "model": {"name": model_name, "hash": model_hash(config), **{f: getattr(config, f) for f in MODEL_FIELDS}},
        "grid": {op: {"dims": list(axes), "axes": axes} for op, axes in grid.items()},
        "rounds": rounds, "quick": bool(args.quick), "seed": args.seed,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_bundle(out: Path, frame, meta: dict) -> None:
    """Write DIR/profile.parquet and DIR/meta.json into a fresh folder, then put it in place; an
    existing bundle is replaced only once the new one is complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        frame.to_parquet(tmp / "profile.parquet", index=False)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old."))
            os.rename(out, old / out.name)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def held_out_error(frame, grid, forward_checks) -> dict:
    """|interpolated - measured| / measured at every held-out point, and of the composed forwards."""
    import numpy as np

    from sim.cost.bundle import table_from_rows

    errors, per_op = [], {}
    for op, axes in grid.items():
        spec = {"dims": list(axes), "axes": axes}
        table = table_from_rows(op, spec, frame[(frame.op == op) & ~frame.held_out])
        rows = frame[(frame.op == op) & frame.held_out]
        op_errors = [abs(table(*(row[d] for d in axes)) / row["seconds"] - 1) for _, row in rows.iterrows()]
        if op_errors:
            per_op[op] = round(float(np.median(op_errors)), 4)
            errors += op_errors
    forward = [abs(c["predicted_s"] / c["measured_s"] - 1) for c in forward_checks]
    return {"points": len(errors), "median_abs_error": round(float(np.median(errors)), 4) if errors else None,
            "p90_abs_error": round(float(np.percentile(errors, 90)), 4) if errors else None,
            "max_abs_error": round(float(max(errors)), 4) if errors else None, "per_operator": per_op,
            "forward_median_abs_error": round(float(np.median(forward)), 4) if forward else None,
            "forward_checks": forward_checks}


def format_calibration_summary(out: Path, meta: dict) -> str:
    import numpy as np

    held = meta["held_out"]
    fits = meta["fits"]
    percent = lambda value: "-" if value is None else f"{value:.1%}"
    took = (f"engine fits redone in {meta['refit']['duration_s']:.0f} s" if "refit" in meta
            else f"{meta['duration_s']:.0f} s")
    lines = [f"wrote {out}/profile.parquet and meta.json ({took}, {meta['device']['name']}, "
             f"{meta['dtype']}, {meta['model']['name']})",
             f"held-out error of the tables: median {percent(held['median_abs_error'])}, P90 "
             f"{percent(held['p90_abs_error'])}, worst {percent(held['max_abs_error'])} over {held['points']} points"]
    if held.get("round_spread") is not None:
        lines.append(timing_noise_line(held["round_spread"], int(meta["rounds"])))
    if held["median_abs_error"] is not None and held["median_abs_error"] > HELD_OUT_TARGET:
        lines.append(f"note: the held-out error is above its target ({HELD_OUT_TARGET:.0%}); the larger the timing noise, "
                     f"the more the machine moved under the timings (docs/validation.md): calibrate again when it is quieter")
    if fits:
        lines += [f"whole forwards at off-grid shapes: median error {percent(held['forward_median_abs_error'])}",
                  f"whole forward / composed operators: {np.min(fits['forward_factor']['factor']):.2f} to "
                  f"{np.max(fits['forward_factor']['factor']):.2f}; step overhead {fits['step_overhead_s'] * 1e6:.0f} us "
                  f"+ {fits['request_overhead_s'] * 1e6:.0f} us per request"]
        if "selection_factor" in fits:
            lines.append(f"selection in forwards / alone: {np.min(fits['selection_factor']['factor']):.2f} to "
                         f"{np.max(fits['selection_factor']['factor']):.2f}")
    return "\n".join(lines)
