"""`python -m profiler calibrate`: time every operator of the live engine on this device and write a
calibration bundle (sim/formats/bundle.py) for the simulator's calibrated cost model.

1. Operators (operators.py) on a grid (grid.py), timed in rounds, the median round kept
   (rounds.py): on a shared machine the median is the state whole forwards meet.
2. Whole forwards against the composed operators, SpecPV's selection inside partial-verification
   forwards, and the engine's host time per step, a round of them after each round of operators
   (fits.py): the factors the cost model multiplies the composition by, and the step terms.
   `--refit BUNDLE` redoes only this step.
3. The held-out error: each off-grid point against the tables' interpolation, and whole forwards
   at off-grid shapes against the composed prediction; with the rounds' spread (the machine's
   timing noise during the calibration), which the held-out error follows.

The bundle also holds its GEMM and attention times in the published measured tables' layout
(BUNDLE/operator_tables, sim/formats/operator_layout.py): a scenario's `operator_tables` lays them
over aiconfigurator-core's tables for the GPU they were timed on.

`--budget-s SECONDS` chooses the grid by measured time instead, coarse first, so that the command
ends within its budget with a checked bundle (budget.py).
"""
from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from profiler.calibrate.budget import budget_line, measure_within_budget
from profiler.calibrate.fits import DECODE_BURSTS_WITHIN_ROUND
from profiler.calibrate.grid import grid_for, grid_of, held_out_points
from profiler.calibrate.rounds import MAX_ROUNDS, MIN_ROUNDS, ROUNDS_BUDGET_S, measure_operators
from profiler.device import cpu_model, hardware_name, memory_gb, tables_system
from sim.errors import InputError
from sim.formats.bundle import (HELD_OUT_TARGET, META, MODEL_FIELDS, PROFILE, SCHEMA_VERSION, model_hash,
                                round_spread, timing_noise_line, write_bundle)
from sim.formats.provenance import git_revision, repo_relative

# The operators whole forwards are composed of: without them (an --operators subset) no engine fits.
FORWARD_OPERATORS = (*(f"linear.{n}" for n in ("qkv", "o", "gate_up", "down")), "elementwise", "attention",
                     "attention_prefill", "lm_head")
# Held-out points per operator: --quick's count with a budget too, where they are part of the
# minimum every budget pays (budget.py).
HELD_OUT_PER_OP = {"full": 6, "quick": 3, "budget": 3}


@dataclass(frozen=True)
class CalibrateConfig:
    device: Literal["auto", "cpu", "cuda"] = "auto"     # auto: cuda when available
    model: str = "smollm2"                              # smollm2, a model preset, or a config.json
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"   # auto: fp32 on the CPU, bf16 on CUDA
    quick: bool = False                                 # a coarser grid and one round
    out: Path | None = None                             # None: calibration/<cpu|gpu preset>/<model>
    rounds: int | None = None                           # None: MIN_ROUNDS up to MAX_ROUNDS (quick: 1)
    operators: tuple[str, ...] | None = None            # a subset of operators
    refit: Path | None = None                           # redo only the engine fits of this bundle
    threads: int | None = None                          # torch CPU threads
    seed: int = 0
    engine: Literal["live", "hf"] = "live"              # hf: transformers as a black box (profiler/blackbox)
    budget_s: float | None = None                       # end within this many seconds (budget.py)


@dataclass(frozen=True)
class Plan:
    """What a calibration times, resolved from its config and the machine."""
    model_config: object          # profiler.engine.model.LlamaConfig
    model_name: str
    device: str                   # cpu | cuda
    device_name: str
    dtype_name: str
    grid: dict
    rounds: int
    max_rounds: int
    out: Path


def check_config(config: CalibrateConfig) -> None:
    if config.threads is not None and config.threads < 1:
        raise InputError("--threads", f"{config.threads} must be at least 1")
    if config.rounds is not None and config.rounds < 1:
        raise InputError("--rounds", f"{config.rounds} must be at least 1")
    if config.engine == "hf":
        for flag, value in (("--operators", config.operators), ("--refit", config.refit),
                            ("--budget-s", config.budget_s)):
            if value is not None:
                raise InputError(flag, "applies to the live engine's operators, not to --engine hf")
    if config.budget_s is not None:
        if not (math.isfinite(config.budget_s) and config.budget_s > 0):
            raise InputError("--budget-s", f"{config.budget_s:g} must be a number of seconds above 0")
        # The budget decides the rounds (more only while one fits) and times a grid; --refit times none.
        for flag, value in (("--rounds", config.rounds), ("--refit", config.refit)):
            if value is not None:
                raise InputError("--budget-s", f"chooses the grid and the rounds by time; it cannot be combined "
                                               f"with {flag}")


def plan_calibration(config: CalibrateConfig) -> Plan:
    import torch

    from profiler.engine.gguf_loader import ModelLoadError
    from profiler.engine.loaders import model_shape

    cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise InputError("--device", "cuda is not available here (torch " + torch.__version__ + ")")
    try:
        model_config, model_name = model_shape(config.model)
    except ModelLoadError as exc:
        raise InputError("--model", str(exc)) from None
    device_name = torch.cuda.get_device_name() if cuda else cpu_model()
    model_label = Path(model_name).parent.name if model_name.endswith("config.json") else model_name
    grid = grid_for(model_config, config.quick, cuda)
    if config.operators:
        unknown = [o for o in config.operators if o not in grid]
        if unknown:
            raise InputError("--operators", f"unknown operator {unknown[0]!r} (choose from {', '.join(grid)})")
        grid = {op: grid[op] for op in config.operators}
    if config.rounds:
        rounds = max_rounds = config.rounds
    elif config.budget_s is not None:
        rounds, max_rounds = 1, MAX_ROUNDS          # more only while one fits the budget (budget.py)
    else:
        rounds, max_rounds = (1, 1) if config.quick else (MIN_ROUNDS, MAX_ROUNDS)
    out = config.out or config.refit or \
        Path("calibration") / ("cpu" if not cuda else hardware_name(device_name, True)) / model_label
    return Plan(model_config, model_name, "cuda" if cuda else "cpu", device_name,
                config.dtype if config.dtype != "auto" else ("bf16" if cuda else "fp32"), grid, rounds, max_rounds, out)


def calibrate(config: CalibrateConfig) -> Path:
    """Time, fit and check; write the bundle and print its summary. Returns the bundle's folder."""
    started = time.perf_counter()       # a budget counts from here: torch's import is part of it
    import numpy as np
    import torch
    from tqdm import tqdm

    check_config(config)
    if config.engine != "live":
        raise InputError("--engine", "calibrate() times the live engine's operators; transformers is calibrated by "
                                     "profiler.blackbox.transformers.calibrate_transformers")
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    plan = plan_calibration(config)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[plan.dtype_name]
    grid, rounds = plan.grid, plan.rounds
    if config.refit is not None:
        frame, meta = reuse_operators(config.refit, plan.model_config, plan.dtype_name, plan.device_name)
        grid = grid_of(meta)
    needed = [op for op in FORWARD_OPERATORS if op not in grid]
    probe = None
    if needed:
        if config.refit is not None:
            raise InputError("--refit", f"{config.refit} has no {', '.join(needed)} to fit the engine against")
        print(f"note: no engine fits without {', '.join(needed)} (an --operators subset)")
    else:
        from profiler.calibrate.fits import EngineProbe

        # With a budget the engine round is --quick's: one full round took 70 s on the 2-core CPU
        # (328 s with the machine shared), more than a small budget's whole.
        probe = EngineProbe(plan.model_config, dtype, plan.device, config.seed,
                            config.quick or config.budget_s is not None,
                            selection="selection" in grid and "summaries" in grid)
    if config.refit is not None:
        for _ in tqdm(range(rounds), desc="engine rounds", unit="round"):
            probe.measure_round()
            for _ in range(DECODE_BURSTS_WITHIN_ROUND):
                probe.measure_decode_burst()
    elif config.budget_s is not None:
        levels = None if config.quick else \
            {op: axes for op, axes in grid_for(plan.model_config, True, plan.device == "cuda").items() if op in grid}

        def checkpoint(frame, timed_grid: dict, timed_rounds: int, budget: dict) -> None:
            meta = bundle_meta(plan.model_config, plan.model_name, plan.dtype_name, plan.device, plan.device_name,
                               timed_grid, timed_rounds, config.quick, config.seed)
            write_checked_bundle(plan, frame, {**meta, "budget": budget}, timed_grid, probe, started)

        held = held_out_points(grid, np.random.default_rng(config.seed), per_op=HELD_OUT_PER_OP["budget"])
        frame, grid, rounds, budget = measure_within_budget(plan.model_config, dtype, plan.device, grid, levels, held,
                                                            config.seed, config.budget_s, started, probe, checkpoint)
        meta = {**bundle_meta(plan.model_config, plan.model_name, plan.dtype_name, plan.device, plan.device_name,
                              grid, rounds, config.quick, config.seed), "budget": budget}
    else:
        held = held_out_points(grid, np.random.default_rng(config.seed),
                               per_op=HELD_OUT_PER_OP["quick" if config.quick else "full"])
        frame, rounds = measure_operators(plan.model_config, dtype, plan.device, grid, held, rounds, config.seed,
                                          after_round=probe.measure_round if probe is not None else None,
                                          within_round=probe.measure_decode_burst if probe is not None else None,
                                          within_round_calls=DECODE_BURSTS_WITHIN_ROUND, max_rounds=plan.max_rounds,
                                          deadline=started + ROUNDS_BUDGET_S[plan.device])
        meta = bundle_meta(plan.model_config, plan.model_name, plan.dtype_name, plan.device, plan.device_name, grid,
                           rounds, config.quick, config.seed)
    meta = write_checked_bundle(plan, frame, meta, grid, probe, started,
                                refit_rounds=rounds if config.refit is not None else None)
    print(format_calibration_summary(plan.out, meta))
    return plan.out


def write_checked_bundle(plan: Plan, frame, meta: dict, grid: dict, probe, started: float,
                         refit_rounds: int | None = None) -> dict:
    """The engine fits against the operator tables, the held-out error and the time taken, then the
    bundle, written at once; returns its meta. refit_rounds: the engine rounds of a --refit."""
    fits, forward_checks = {}, []
    if probe is not None:
        # The fits price whole forwards with the simulator's calibrated cost model, which reads a bundle.
        with tempfile.TemporaryDirectory() as provisional:
            write_bundle(Path(provisional), frame, meta)
            fits, forward_checks = probe.fit(plan.model_name, plan.dtype_name, meta["device"]["hardware"],
                                             Path(provisional))
    meta["fits"] = fits
    meta["held_out"] = held_out_error(frame, grid, forward_checks)
    spread = round_spread(frame, meta["rounds"])
    meta["held_out"]["round_spread"] = None if spread is None else round(spread, 4)
    if refit_rounds is not None:
        meta["refit"] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         "git_revision": git_revision(), "duration_s": round(time.perf_counter() - started, 1),
                         "rounds": refit_rounds}
    else:
        meta["duration_s"] = round(time.perf_counter() - started, 1)
    write_bundle(plan.out, frame, meta)
    return meta


def reuse_operators(bundle_dir: Path, config, dtype_name: str, device_name: str):
    """The operator rows and meta of an existing bundle of the same model, dtype and device."""
    import pandas as pd

    try:     # the old fits may be of another form: read the operator rows only
        meta = json.loads((bundle_dir / META).read_text())
        frame = pd.read_parquet(bundle_dir / PROFILE)
    except (OSError, ValueError) as exc:
        raise InputError("--refit", f"cannot read {bundle_dir} ({exc.__class__.__name__})") from None
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise InputError("--refit", f"{bundle_dir} has schema version {meta.get('schema_version')!r}")
    meta = {k: v for k, v in meta.items() if k not in ("fits", "held_out", "refit")}
    if meta["model"].get("hash") != model_hash(config) or meta["dtype"] != dtype_name or \
            meta["device"].get("name") != device_name:
        raise InputError("--refit", f"{bundle_dir} holds {meta['model'].get('name')} {meta['dtype']} on "
                                       f"{meta['device'].get('name')}, not {dtype_name} on {device_name}")
    return frame, meta


def bundle_meta(config, model_name: str, dtype_name: str, device: str, device_name: str, grid: dict, rounds: int,
                quick: bool, seed: int) -> dict:
    """meta.json of a bundle of the live engine: device, versions, dtype, model, grid, rounds, provenance."""
    import torch


    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "schema_version": SCHEMA_VERSION,
        "engine": "profiler.live",
        "device": {"kind": device, "name": device_name, "memory_gb": round(memory_gb(device), 1),
                   "hardware": hardware_name(device_name, device == "cuda"),
                   "tables_system": tables_system(hardware_name(device_name, device == "cuda"))},
        "cpu": {"model": cpu_model(), "threads": torch.get_num_threads(), "cores": os.cpu_count()},
        "versions": {"torch": torch.__version__, "triton": triton_version,
                     "cuda": torch.version.cuda if device == "cuda" else None, "python": platform.python_version()},
        "dtype": dtype_name,
        # A config.json is named as every path a result records: relative to the repository.
        "model": {"name": repo_relative(model_name) if model_name.endswith(".json") else model_name,
                  "hash": model_hash(config), **{f: getattr(config, f) for f in MODEL_FIELDS}},
        "grid": {op: {"dims": list(axes), "axes": axes} for op, axes in grid.items()},
        "rounds": rounds, "quick": bool(quick), "seed": seed,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(),
    }


def held_out_error(frame, grid, forward_checks) -> dict:
    """|interpolated - measured| / measured at every held-out point, and of the composed forwards."""
    import numpy as np

    from sim.formats.bundle import table_from_rows  # the simulator's own interpolation is what is checked

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
    layout = " and operator_tables/ (for a scenario's operator_tables)" if (out / "operator_tables").is_dir() else ""
    lines = [f"wrote {out}/profile.parquet, meta.json{layout} ({took}, {meta['device']['name']}, "
             f"{meta['dtype']}, {meta['model']['name']})",
             f"held-out error of the tables: median {percent(held['median_abs_error'])}, P90 "
             f"{percent(held['p90_abs_error'])}, worst {percent(held['max_abs_error'])} over {held['points']} points"]
    if held.get("round_spread") is not None:
        lines.append(timing_noise_line(held["round_spread"], int(meta["rounds"])))
    if budget_line(meta) is not None:
        lines.append(budget_line(meta))
        if meta.get("duration_s", 0.0) > meta["budget"]["budget_s"]:
            phases = meta["budget"]["phases_s"]
            minimum_s = sum(phases.get(k, 0.0) for k in ("setup", "minimum", "engine_round", "checkpoint"))
            lines.append(f"note: over the budget: the least a checked bundle takes (every axis's ends, the held-out "
                         f"points, an engine round, the fits) took {minimum_s:.0f} s here; give a larger --budget-s")
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
