"""`profiler calibrate --budget-s SECONDS`: a calibration that fits its time slot and always ends
with a complete, checked bundle.

A GPU is lent for minutes at a time, and a calibration planned by grid (`--quick`: 478 points of
Llama-3.1-8B's shape at 2.5 points a second on an H200) can run out of its slot before it writes
anything. With a budget the grid is chosen by measured time instead, coarse first:

1. The minimum, always timed: the ends of every operator's axes (what a table needs to
   interpolate anywhere on its grid), the held-out points, one round of the engine's whole
   forwards (--quick's shapes), then the fits, the held-out error and the bundle, written at once:
   from here on a checked bundle exists, and how long the fits and the write took is measured.
2. Refinement, level by level (a few geometric points between the ends, then --quick's grid,
   then the full grid). A step adds one axis value to one operator: all its grid points on the
   axes timed so far, so every table stays a full grid; an operator's next value is the one of
   its level farthest in log from those timed. In a turn every operator with values left at the
   level takes one step, their points timed in one shuffled order. A step joins a turn only if it
   projects to end before the reserve: each new point's time interpolated in log-log from the
   timed points beside it in the new value's dim, times how far the turns so far overran their
   projections. A step that does not fit is dropped (cheaper ones may still fit); steps a turn
   does not finish before the reserve are cut off and their points discarded.
3. More rounds over every point (grid and held out), each with an engine round, the median kept,
   only once the grid is complete and while one projects to fit.
4. The fits, the held-out error and the bundle again. The reserve for it is the minimum's own
   fits and write, 1.5 times, plus END_MARGIN_S.

meta.json's "budget" records the budget, the points timed per operator against the finest grid's,
and whether refinement stopped for time (`profiler inspect` prints it: `budget_line`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from profiler.calibrate.grid import grid_points, prefill_cell
from profiler.calibrate.rounds import MAX_ROUNDS, PointTimer, frame_of

LEVELS = ("ends", "coarse", "quick", "full")
# Geometric points between an axis's ends in the coarse level: with the ends, about one point per
# factor of 8 in tokens (1, 8, 64, 1,024, 8,192) and the middle of short axes (batch 1, 4, 16).
COARSE_INTERIOR = 3
# The reserve after the last timing: the minimum's fits and write this many times over, and this
# many seconds more for the summary, the process's exit and the interpreter's start before
# calibrate() began counting.
TAIL_SAFETY = 1.5
# The time kept for the held-out points' second timing: their first timings' sum this many times
# over, so that a shared machine's slower spell does not leave the last of them with its first alone.
RETIME_SLACK = 1.25
END_MARGIN_S = 3.0
# How far the observed / projected ratio of the steps' times may correct the next projection.
RATIO_BOUNDS = (0.5, 4.0)


def coarse_axis(axis: list[int], interior: int = COARSE_INTERIOR) -> list[int]:
    """The axis's ends and the values nearest (in log) to `interior` geometric points between them."""
    lo, hi = axis[0], axis[-1]
    chosen = {lo, hi}
    for i in range(1, interior + 1):
        target = math.log(lo) + (math.log(hi) - math.log(lo)) * i / (interior + 1)
        chosen.add(min(axis, key=lambda v: (abs(math.log(v) - target), v)))
    return sorted(chosen)


def axis_levels(finest: list[int], quick: list[int] | None) -> dict[int, int]:
    """Each value of the finest axis and its level (an index into LEVELS): its ends, a coarse
    subset of --quick's axis, the rest of --quick's, the rest of the full axis. quick None: the
    finest axis is --quick's."""
    quick = finest if quick is None else quick
    levels = {v: 3 for v in finest}
    levels.update({v: 2 for v in quick if v in levels})
    levels.update({v: 1 for v in coarse_axis(quick) if v in levels})
    levels.update({finest[0]: 0, finest[-1]: 0})
    return levels


@dataclass
class Refinement:
    """Which axis values each operator has timed (`axes`) and which are still to come."""
    finest: dict[str, dict[str, list[int]]]
    quick: dict[str, dict[str, list[int]]] | None     # None: the finest grid is --quick's
    axes: dict[str, dict[str, list[int]]] = field(init=False)
    levels: dict[str, dict[str, dict[int, int]]] = field(init=False)
    pending: dict[str, set[tuple[str, int]]] = field(init=False)
    steps_at_level: dict[tuple[str, int], int] = field(init=False)

    def __post_init__(self):
        self.levels = {op: {d: axis_levels(a, self.quick[op][d] if self.quick else None) for d, a in axes.items()}
                       for op, axes in self.finest.items()}
        self.axes = {op: {d: sorted(v for v, level in lv.items() if level == 0) for d, lv in dims.items()}
                     for op, dims in self.levels.items()}
        self.pending = {op: {(d, v) for d, lv in dims.items() for v, level in lv.items() if level > 0}
                        for op, dims in self.levels.items()}
        self.steps_at_level = {}

    def grid(self) -> dict[str, dict[str, list[int]]]:
        return {op: {d: list(a) for d, a in axes.items()} for op, axes in self.axes.items()}

    def candidates(self) -> list[tuple[tuple, str, str, int]]:
        """Each operator's next step, (priority, op, dim, value), best first: the lowest level, the
        operator with the fewest steps at that level, then the grid's order; an operator's own
        next value is the one of its lowest pending level farthest in log from its dim's axis."""
        out = []
        for index, op in enumerate(self.finest):
            if not self.pending[op]:
                continue
            level, gap, dim, value = min(
                (self.levels[op][d][v], -min(abs(math.log(v / a)) for a in self.axes[op][d]), d, v)
                for d, v in self.pending[op])
            out.append(((level, self.steps_at_level.get((op, level), 0), index), op, dim, value))
        return sorted(out)

    def step_keys(self, op: str, dim: str, value: int) -> list[tuple]:
        """The timing keys (rounds.timing_items' form) of the grid points adding `value` to `dim`."""
        axes = {**self.axes[op], dim: [value]}
        keys = (tuple(sorted(prefill_cell(op, p).items())) for p in grid_points(axes))
        return [(op, point, False) for point in dict.fromkeys(keys)]

    def neighbours(self, op: str, dim: str, value: int) -> tuple[int, int]:
        """The timed values of `dim` on either side of `value` (ends are always timed)."""
        axis = self.axes[op][dim]
        return max(a for a in axis if a < value), min(a for a in axis if a > value)

    def add(self, op: str, dim: str, value: int) -> None:
        self.axes[op][dim] = sorted([*self.axes[op][dim], value])
        self.drop(op, dim, value)
        level = self.levels[op][dim][value]
        self.steps_at_level[(op, level)] = self.steps_at_level.get((op, level), 0) + 1

    def drop(self, op: str, dim: str, value: int) -> None:
        self.pending[op].discard((dim, value))

    def reached(self, op: str) -> str:
        """The finest level whose values this operator has all timed."""
        missing = [level for d, lv in self.levels[op].items() for v, level in lv.items() if v not in self.axes[op][d]]
        return LEVELS[min(missing) - 1] if missing else ("quick" if self.quick is None else "full")


@dataclass
class BudgetedTiming:
    """Every timed point's rounds and the wall time its first timing took (projections read it)."""
    timer: PointTimer
    rng: object                                   # numpy Generator: shuffles and pool offsets
    seed: int
    times: dict[tuple, list] = field(default_factory=dict)
    wall_s: dict[tuple, float] = field(default_factory=dict)
    index: dict[tuple, int] = field(default_factory=dict)      # seeds each point's bench
    spent_s: dict[str, float] = field(default_factory=dict)    # per operator, every timing kept or not

    def time_keys(self, keys: list[tuple], stop_at: float | None, project: Callable[[tuple], float],
                  bar) -> set[tuple]:
        """Time `keys` in a shuffled order, one more round each, until the next point's projected
        time would end past `stop_at` (a perf_counter value; None: never). Returns those timed."""
        done = set()
        for i in self.rng.permutation(len(keys)):
            key = keys[int(i)]
            if stop_at is not None and time.perf_counter() + project(key) > stop_at:
                break
            op, point, _ = key
            number = self.index.setdefault(key, len(self.index))
            pool = self.timer.pool
            offset = int(self.rng.integers(pool.numel())) if pool is not None else 0
            started = time.perf_counter()
            self.times.setdefault(key, []).append(
                self.timer.time_point(op, dict(point), self.seed * 100003 + number, offset))
            self.wall_s.setdefault(key, time.perf_counter() - started)
            self.spent_s[op] = self.spent_s.get(op, 0.0) + time.perf_counter() - started
            done.add(key)
            bar.update()
        return done

    def forget(self, keys) -> None:
        """Drop the last round of `keys` (timings of a step or round cut off at the reserve)."""
        for key in keys:
            self.times[key].pop()
            if not self.times[key]:
                del self.times[key], self.wall_s[key]


def measure_within_budget(config, dtype, device: str, finest: dict, quick: dict | None, held: dict, seed: int,
                          budget_s: float, started: float, probe, checkpoint: Callable) -> tuple:
    """Time a grid chosen by measured time so that the whole calibration, begun at `started`
    (perf_counter), ends within `budget_s` (module docstring). `checkpoint(frame, grid, rounds,
    budget)` fits, checks and writes a bundle. Returns (frame, grid, rounds, budget) for the last
    one."""
    import numpy as np
    import torch
    from tqdm import tqdm

    timing = BudgetedTiming(PointTimer(config, dtype, device, seed), np.random.default_rng(seed), seed)
    run = BudgetedRun(config, Refinement(finest, quick), timing, held, probe, budget_s, started)
    with torch.inference_mode(), tqdm(desc="calibrate (budget)", unit="point") as run.bar:
        run.time_minimum()
        checkpoint(run.frame(), run.refinement.grid(), 1, run.record("in progress"))
        run.reserve_tail()
        run.refine()
        run.retime_held_out()
        run.time_more_rounds()
    state = "stopped for time" if run.stopped_for_time else "complete"
    return run.frame(), run.refinement.grid(), run.rounds, run.record(state)


class BudgetedRun:
    """The phases of a budgeted calibration (the module docstring), each a method; the deadline,
    the projections and what each phase took."""

    def __init__(self, config, refinement: Refinement, timing: BudgetedTiming, held: dict, probe, budget_s: float,
                 started: float):
        self.config, self.refinement, self.timing, self.probe = config, refinement, timing, probe
        self.budget_s, self.started, self.deadline = budget_s, started, started + budget_s
        self.held_keys = [(op, tuple(sorted(p.items())), True) for op, points in held.items() for p in points]
        self.phases_s = {"setup": time.perf_counter() - started}
        self.projected_s = self.measured_s = 0.0           # refinement turns so far
        self.engine_s = 0.0
        self.stop_at = self.deadline                       # reserve_tail sets the last timing's end
        self.stopped_for_time = False
        self.rounds = 1
        # Held-out points timed again through the refinement: their minimum's timings, an early
        # spell of a shared machine's, would read as interpolation error against a grid timed
        # later (the minimum's held out 15% slower than the tables of the 2-core CPU, median).
        self.retime: list[tuple] = []
        self.retimed: set[tuple] = set()
        self.bar = None

    def frame(self):
        return frame_of(self.config, self.timing.timer.element_bytes, self.refinement.grid(), self.timing.times)

    def ratio(self) -> float:
        """How far the turns so far overran their projections (1 until a second of them)."""
        if self.projected_s < 1.0:
            return 1.0
        return min(max(self.measured_s / self.projected_s, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])

    def project(self, key: tuple) -> float:
        return project_point_s(self.refinement, self.timing.wall_s, key) * self.ratio()

    def time_minimum(self) -> None:
        """The axes' ends and the held-out points, shuffled, then an engine round."""
        minimum = [k for op in self.refinement.finest for k in refinement_keys(self.refinement, op)] + self.held_keys
        self.bar.total = len(minimum)
        self.bar.set_postfix_str("ends of every axis and the held-out points")
        self.timing.time_keys(minimum, None, self.project, self.bar)
        self.phases_s["minimum"] = time.perf_counter() - self.started - self.phases_s["setup"]
        if self.probe is not None:
            self.bar.set_postfix_str("engine round")
            before = time.perf_counter()
            self.probe.measure_round()
            self.engine_s = self.phases_s["engine_round"] = time.perf_counter() - before

    def reserve_tail(self) -> None:
        """After the minimum's checkpoint (its fits and write just measured): when timing stops."""
        self.phases_s["checkpoint"] = time.perf_counter() - self.started - sum(self.phases_s.values())
        self.stop_at = self.deadline - TAIL_SAFETY * self.phases_s["checkpoint"] - END_MARGIN_S
        self.retime = [self.held_keys[int(i)] for i in self.timing.rng.permutation(len(self.held_keys))]

    def retime_s(self) -> float:
        """The time kept for the held-out points still to time again, with RETIME_SLACK for a
        point that runs over its first timing."""
        return sum(self.timing.wall_s[k] for k in self.retime) * self.ratio() * RETIME_SLACK

    def refine(self) -> None:
        """Turns: the next step of each operator with values left at the coarsest level any has
        left, while the turn (and the held-out points still to time again) projects to end
        before the reserve, its points timed in one shuffled order with a share of the held-out
        points (as a round's are: a shared machine's spells then fall on every operator, not on
        one operator's line)."""
        before = time.perf_counter()
        refinement, timing = self.refinement, self.timing
        while candidates := refinement.candidates():
            stop_at = self.stop_at - self.retime_s()
            turn, turn_s = [], 0.0
            level = candidates[0][0][0]
            for _, op, dim, value in (c for c in candidates if c[0][0] == level):
                keys = [k for k in refinement.step_keys(op, dim, value) if k not in timing.times]
                cost_s = sum(self.project(k) for k in keys)
                if time.perf_counter() + cost_s > stop_at:
                    refinement.drop(op, dim, value)        # time only runs out: it will not fit later
                    self.stopped_for_time = True
                elif time.perf_counter() + turn_s + cost_s <= stop_at:
                    turn.append((op, dim, value, keys))
                    turn_s += cost_s
            if not turn:
                continue
            # The held-out points' share of this turn: as much of the time left as the turn takes.
            share = turn_s / max(stop_at - time.perf_counter(), turn_s)
            again = [self.retime.pop() for _ in range(min(len(self.retime), math.ceil(share * len(self.retime))))]
            keys = [k for *_, ks in turn for k in ks] + again
            self.bar.total += len(keys)
            self.bar.set_postfix_str(f"{LEVELS[level]} level, {len(turn)} operator{'s' if len(turn) > 1 else ''}")
            turn_started = time.perf_counter()
            # A turn that runs over its projection is cut where it would eat into the time kept for
            # the held-out points still to time again (its unfinished lines dropped below).
            done = timing.time_keys(keys, self.stop_at - self.retime_s(), self.project, self.bar)
            for op, dim, value, step in turn:
                if done.issuperset(step):
                    refinement.add(op, dim, value)
                else:           # cut off at the reserve: a table needs every point of the line
                    timing.forget(done.intersection(step))
                    refinement.drop(op, dim, value)
                    self.stopped_for_time = True
            self.retimed.update(done.intersection(again))
            self.retime += [k for k in again if k not in done]
            self.projected_s += turn_s / self.ratio() + sum(timing.wall_s[k] for k in again)
            self.measured_s += time.perf_counter() - turn_started
        self.phases_s["refinement"] = time.perf_counter() - before

    def retime_held_out(self) -> None:
        """The held-out points not yet timed again, then each keeps only its later timing."""
        if self.retime:
            self.bar.total += len(self.retime)
            self.bar.set_postfix_str("held-out points")
            self.retimed.update(self.timing.time_keys(self.retime, self.stop_at, self.project, self.bar))
        for key in self.retimed:
            del self.timing.times[key][0]

    def time_more_rounds(self) -> None:
        """Rounds of every point and an engine round each, once the grid is complete, while one
        projects to end before the reserve; a round cut off is forgotten whole."""
        before = time.perf_counter()
        keys = list(self.timing.times)
        while not self.stopped_for_time and self.rounds < MAX_ROUNDS:
            round_s = sum(self.timing.wall_s[k] for k in keys) * self.ratio() + self.engine_s
            if time.perf_counter() + round_s > self.stop_at:
                break
            self.bar.total += len(keys)
            self.bar.set_postfix_str(f"round {self.rounds + 1}")
            done = self.timing.time_keys(keys, self.stop_at - self.engine_s, project_wall(self.timing, self.ratio()),
                                         self.bar)
            if len(done) < len(keys):
                self.timing.forget(done)
                break
            if self.probe is not None:
                self.bar.set_postfix_str(f"engine round {self.rounds + 1}")
                self.probe.measure_round()
            self.rounds += 1
        self.phases_s["rounds"] = time.perf_counter() - before

    def record(self, state: str) -> dict:
        return budget_record(self.budget_s, self.refinement, self.held_keys, len(self.retimed), state, self.rounds,
                             self.phases_s, self.timing.spent_s, self.projected_s, self.measured_s,
                             time.perf_counter() - self.started)


def refinement_keys(refinement: Refinement, op: str) -> list[tuple]:
    """The timing keys of an operator's grid on the axes timed so far."""
    keys = (tuple(sorted(prefill_cell(op, p).items())) for p in grid_points(refinement.axes[op]))
    return [(op, point, False) for point in dict.fromkeys(keys)]


def project_point_s(refinement: Refinement, wall_s: dict, key: tuple) -> float:
    """How long timing a new grid point will take: log-log between the timed points beside it in
    the one dim whose value is new (its other coordinates are on the timed axes); the operator's
    median before anything of it is timed there."""
    op, point, held_out = key
    if key in wall_s:
        return wall_s[key]
    p = dict(point)
    axes = refinement.axes[op]
    new = [d for d in axes if p[d] not in axes[d]]
    if len(new) == 1 and not held_out:
        dim = new[0]
        lo, hi = refinement.neighbours(op, dim, p[dim])
        walls = [wall_s.get((op, tuple(sorted(prefill_cell(op, {**p, dim: v}).items())), False)) for v in (lo, hi)]
        if None not in walls:
            w = math.log(p[dim] / lo) / math.log(hi / lo)
            return math.exp((1 - w) * math.log(walls[0]) + w * math.log(walls[1]))
    same = [s for (o, _, _), s in wall_s.items() if o == op]
    return float(sorted(same)[len(same) // 2]) if same else 1.0


def project_wall(timing: BudgetedTiming, ratio: float) -> Callable[[tuple], float]:
    """A point's projected time in another round: its first round's, corrected."""
    return lambda key: timing.wall_s[key] * ratio


def budget_record(budget_s: float, refinement: Refinement, held_keys: list, retimed: int, state: str, rounds: int,
                  phases_s: dict, spent_s: dict, projected_s: float, measured_s: float, elapsed_s: float) -> dict:
    """meta.json's "budget": what was timed against the finest grid (per operator: grid points
    timed, the finest grid's, the finest level all of whose values are timed, and the seconds its
    timings took, held-out points and every round included), and why it stopped."""
    count = lambda axes: math.prod(len(a) for a in axes.values())
    timed = {op: count(axes) for op, axes in refinement.axes.items()}
    finest = {op: count(axes) for op, axes in refinement.finest.items()}
    return {"budget_s": budget_s, "finest_grid": "quick" if refinement.quick is None else "full",
            "refinement": state, "stopped_for_time": state == "stopped for time", "rounds": rounds,
            "grid_points_timed": sum(timed.values()), "grid_points_finest": sum(finest.values()),
            "held_out_points": len(held_keys), "held_out_timed_again": retimed,
            "operators": {op: {"timed": timed[op], "finest": finest[op], "level": refinement.reached(op),
                               "timing_s": round(spent_s.get(op, 0.0), 1)} for op in timed},
            "steps_projected_s": round(projected_s, 1), "steps_measured_s": round(measured_s, 1),
            "phases_s": {k: round(v, 1) for k, v in phases_s.items()}, "elapsed_s": round(elapsed_s, 1)}


def budget_line(meta: dict) -> str | None:
    """What `profiler calibrate` and `inspect` print of a budgeted calibration; None without one."""
    budget = meta.get("budget")
    if not budget:
        return None
    timed, finest = budget["grid_points_timed"], budget["grid_points_finest"]
    took = meta.get("duration_s")
    return (f"budget {budget['budget_s']:g} s{f' (took {took:.0f} s)' if took is not None else ''}: "
            f"{timed:,} of the {budget['finest_grid']} grid's {finest:,} points timed ({timed / finest:.0%}), "
            f"{budget['rounds']} round{'s' if budget['rounds'] > 1 else ''}, refinement {budget['refinement']}")
