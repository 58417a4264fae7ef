"""Timing every grid point in rounds: each round a fresh seeded random order of all points (a
shared machine changes speed for seconds to minutes at a time, and interleaving spreads its
states over the grid), the median round kept, every round's time stored. Each operator cycles
through enough copies of its weights and KV to miss the CPU's caches as a real forward does.
Between rounds (and at evenly spaced points within one) the caller times the engine's whole
forwards, so operators and forwards meet the machine over the same minutes (fits.py).

Why the median round and not the best: whole forwards run at the machine's usual state, and a
bundle built from its best rounds predicted live runs worse (docs/journal.md). Why several: the
held-out error falls with the rounds timed, so a full calibration times at least MIN_ROUNDS and
goes on, up to MAX_ROUNDS, while one more round as long as the longest so far still ends within
ROUNDS_BUDGET_S of the start (a calibration stays within 15 minutes on a 2-core CPU, 10 on an H200).
"""
from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

from profiler.calibrate.grid import grid_points, prefill_cell
from sim.formats.bundle import DIMS

# Rounds of a full calibration without --rounds (module docstring); the fits take seconds after.
MIN_ROUNDS, MAX_ROUNDS = 3, 5
ROUNDS_BUDGET_S = {"cpu": 13 * 60.0, "cuda": 9 * 60.0}


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


class PointTimer:
    """Times one operator at one point: builds it on its seeded bench (cold copies on the CPU,
    build_cold) and times it (timing.py). Holds what every point shares: on the CPU one pool of
    random values, enough for the copies of any operator to overflow the caches 4 times."""

    def __init__(self, config, dtype, device: str, seed: int):
        import torch

        from profiler.calibrate.operators import random_pool

        self.config, self.dtype, self.device = config, dtype, device
        self.element_bytes = torch.finfo(dtype).bits // 8
        self.pool = random_pool(max(4 * last_level_cache_bytes() // self.element_bytes, 1 << 22), dtype, device,
                                seed) if device == "cpu" else None

    def time_point(self, op: str, point: dict, generator_seed: int, pool_offset: int):
        """The Timing of `op` at `point`; the bench's generator is seeded by `generator_seed` and
        its copies start at `pool_offset` of the shared pool."""
        import torch

        from profiler.calibrate.operators import OPERATORS, Bench
        from profiler.calibrate.timing import time_call

        bench = Bench(self.config, self.dtype, self.device, torch.Generator().manual_seed(generator_seed), self.pool,
                      pool_offset)
        fn = build_cold(OPERATORS[op], bench, dict(point), self.element_bytes)
        return time_call(fn, "cpu" if OPERATORS[op].host else self.device, MIN_RUN_TIME_S)


# Each point's timing runs its operator for at least this long (timing.py's blocks of about 2 ms).
MIN_RUN_TIME_S = 0.02


def timing_items(grid: dict, held: dict) -> list[tuple]:
    """Every grid and held-out point as (op, point items, held_out), each timed once: cells of
    attention_prefill below its diagonal are its diagonal (prefill_cell)."""
    items = []
    for op, axes in grid.items():
        items += [(op, tuple(sorted(prefill_cell(op, p).items())), False) for p in grid_points(axes)]
        items += [(op, tuple(sorted(p.items())), True) for p in held.get(op, [])]
    return list(dict.fromkeys(items))


def measure_operators(config, dtype, device, grid, held, rounds, seed, after_round=None, within_round=None,
                      within_round_calls: int = 0, max_rounds: int | None = None, deadline: float | None = None):
    """Time every grid and held-out point `rounds` times in shuffled order, calling `after_round()`
    after each round (the engine's whole forwards) and `within_round()` `within_round_calls` times
    evenly spaced through it (more bursts of the decode forwards); then more rounds, up to
    `max_rounds`, while one as long as the longest so far ends before `deadline` (a
    time.perf_counter() value). Returns one row per point, the median round (`seconds`), every
    round (`round_seconds`) and their range over the median (`spread`), and the rounds timed."""
    import numpy as np
    import torch
    from tqdm import tqdm

    unique = timing_items(grid, held)
    times: dict[tuple, list] = {key: [] for key in unique}
    rng = np.random.default_rng(seed)
    timer = PointTimer(config, dtype, device, seed)
    pool = timer.pool
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
                offset = int(rng.integers(pool.numel())) if pool is not None else 0
                times[key].append(timer.time_point(op, dict(point), seed * 100003 + int(i), offset))
                bar.update()
            if after_round is not None:
                bar.set_postfix_str(f"engine round {r + 1}")
                after_round()
                bar.set_postfix_str("")
            longest_round_s = max(longest_round_s, time.perf_counter() - round_started)
            r += 1
    return frame_of(config, timer.element_bytes, grid, times), r


def frame_of(config, element_bytes: int, grid: dict, times: dict):
    """profile.parquet's rows from each timed point's rounds (`times`: timing_items' keys -> their
    Timings): the median round (`seconds`), every round (`round_seconds`) and their range over the
    median (`spread`; one round: its interquartile range); attention_prefill's cells below its
    diagonal copy the diagonal's time."""
    import numpy as np
    import pandas as pd

    from profiler.calibrate.operators import OPERATORS

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
    return frame.sort_values(["op", "held_out", *DIMS]).reset_index(drop=True)


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
    if bench.device == "cuda" or operator.name in WARM_OPERATORS:
        return operator.build(bench, point)
    working_set = max(operator.work(bench.config, element_bytes, point)[1], 1.0)
    copies = int(min(64, max(1, math.ceil(2 * last_level_cache_bytes() / working_set))))
    calls = itertools.cycle([operator.build(bench, point) for _ in range(copies)])
    return lambda: next(calls)()


