"""`python -m profiler calibrate --budget-s`: the grid chosen by measured time, coarse first, and a
complete, checked bundle within the budget (profiler/calibrate/budget.py). The budgeted calibration
of SmolLM2's shape end to end is the GPU check's dry run's, checked in tests/test_gpu_check.py (one
pytest-xdist worker runs both)."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from profiler.calibrate.budget import (END_MARGIN_S, LEVELS, Refinement, axis_levels, coarse_axis,
                                       measure_within_budget)
from conftest import FORWARD_OPERATORS, REPO
from sim.formats.bundle import table_from_rows

TINY = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512,
        "tie_word_embeddings": True, "max_position_embeddings": 1024}
# The operators a whole forward is composed of (profiler.calibrate.run.FORWARD_OPERATORS): enough
# for the engine fits and a plain scenario's price, without the dearest others (8,192-token
# prompts, SpecPV's partial attention, acceptance over 64 x 32 logits).
FORWARD = FORWARD_OPERATORS


def tiny_config(tmp_path: Path):
    from profiler.engine.loaders import hf_llama_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return hf_llama_config(path)


# ---- the levels and their order -----------------------------------------------------------------

def test_coarse_axis_keeps_the_ends_and_geometric_points_between():
    tokens = [1, 2, 4, 6, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192]
    assert coarse_axis(tokens) == [1, 8, 64, 1024, 8192]
    assert coarse_axis([1, 4, 16]) == [1, 4, 16]
    assert coarse_axis([256, 8192]) == [256, 8192]


def test_levels_nest_ends_in_coarse_in_quick_in_full(tmp_path):
    from profiler.calibrate.grid import grid_for

    config = tiny_config(tmp_path)
    full, quick = grid_for(config, False, False), grid_for(config, True, False)
    for op, axes in full.items():
        for dim, axis in axes.items():
            levels = axis_levels(axis, quick[op][dim])
            assert set(levels) == set(axis) and levels[axis[0]] == levels[axis[-1]] == 0
            # The coarse level is a subset of --quick's grid (whose own ends may lie inside the full
            # axis's where the model's context clips them).
            assert {v for v, level in levels.items() if 1 <= level <= 2} <= set(quick[op][dim])
    # With --quick the quick grid is the finest: no value is of the full level.
    assert set(axis_levels(quick["linear.o"]["tokens"], None).values()) == {0, 1, 2}


def test_refinement_spreads_each_level_over_every_operator_before_the_next():
    finest = {"linear.o": {"tokens": [1, 2, 4, 8, 16, 32, 64]}, "ngram": {"context": [256, 512, 1024, 2048, 4096]},
              "accept": {"batch": [1, 2, 4, 8, 16], "tokens": [1, 2, 4, 8, 16, 32]}}
    quick = {"linear.o": {"tokens": [1, 4, 16, 64]}, "ngram": {"context": [256, 1024, 4096]},
             "accept": {"batch": [1, 4, 16], "tokens": [1, 4, 16, 32]}}
    refinement = Refinement(finest, quick)
    assert refinement.axes == {"linear.o": {"tokens": [1, 64]}, "ngram": {"context": [256, 4096]},
                               "accept": {"batch": [1, 16], "tokens": [1, 32]}}
    taken = []
    while candidates := refinement.candidates():
        _, op, dim, value = candidates[0]
        assert refinement.step_keys(op, dim, value)           # a step is a whole grid line
        taken.append((refinement.levels[op][dim][value], op))
        refinement.add(op, dim, value)
    assert [level for level, _ in taken] == sorted(level for level, _ in taken)      # coarse first
    # The first steps of the coarse level go to every operator in turn.
    assert {op for _, op in taken[:3]} == set(finest)
    assert refinement.grid() == finest and all(refinement.reached(op) == "full" for op in finest)


# ---- the schedule, with a stand-in timer of known cost ------------------------------------------

POINT_S = 0.01


class FixedTimer:
    """PointTimer's interface: every point takes POINT_S to time and reads a power law."""

    def __init__(self, config, dtype, device, seed):
        self.pool, self.element_bytes = None, 4

    def time_point(self, op, point, generator_seed, pool_offset):
        from profiler.calibrate.timing import Timing

        time.sleep(POINT_S)
        return Timing(1e-6 * math.prod(point.values()) ** 0.5, 0.01, 10)


def schedule(tmp_path, monkeypatch, finest, quick, budget_s):
    import torch

    from profiler.calibrate import budget
    from profiler.calibrate.grid import held_out_points
    import numpy as np

    monkeypatch.setattr(budget, "PointTimer", FixedTimer)
    config = tiny_config(tmp_path)
    held = held_out_points(finest, np.random.default_rng(0), per_op=3)
    checkpoints = []
    started = time.perf_counter()
    frame, grid, rounds, record = measure_within_budget(
        config, torch.float32, "cpu", finest, quick, held, 0, budget_s, started, None,
        lambda *args: checkpoints.append(args))
    return frame, grid, rounds, record, checkpoints, time.perf_counter() - started


def test_refinement_stops_for_time_and_ends_before_the_reserve(tmp_path, monkeypatch):
    from profiler.calibrate.grid import grid_for

    config = tiny_config(tmp_path)
    finest, quick = grid_for(config, False, False), grid_for(config, True, False)
    # About 150 points of minimum (1.5 s at 10 ms), then refinement until the reserve.
    budget_s = END_MARGIN_S + 4.0
    frame, grid, rounds, record, checkpoints, took_s = schedule(tmp_path, monkeypatch, finest, quick, budget_s)
    assert took_s <= budget_s - END_MARGIN_S + 0.2
    assert len(checkpoints) == 1 and checkpoints[0][3]["refinement"] == "in progress"       # the minimum's bundle
    assert record["stopped_for_time"] and rounds == 1
    minimum = sum(math.prod(len(a) for a in Refinement(finest, quick).axes[op].values()) for op in finest)
    assert minimum < record["grid_points_timed"] < record["grid_points_finest"]
    # Every operator's table is complete on the axes it reports, however far it got.
    for op, axes in grid.items():
        spec = {"dims": list(axes), "axes": axes}
        table_from_rows(op, spec, frame[(frame.op == op) & ~frame.held_out])
        assert record["operators"][op]["timed"] == math.prod(len(a) for a in axes.values())
        assert record["operators"][op]["level"] in LEVELS
    assert frame.held_out.sum() == record["held_out_points"] > 0
    # The held-out points were timed again through the refinement (their time reserved first), and
    # each keeps that later timing alone.
    assert record["held_out_timed_again"] == record["held_out_points"]
    assert all(len(r) == 1 for r in frame[frame.held_out].round_seconds)


def test_a_budget_with_room_completes_the_grid_then_times_more_rounds(tmp_path, monkeypatch):
    finest = {"linear.o": {"tokens": [1, 2, 4, 8, 16]}, "accept": {"batch": [1, 2, 4], "tokens": [1, 2, 4]}}
    frame, grid, rounds, record, _, took_s = schedule(tmp_path, monkeypatch, finest, None, END_MARGIN_S + 3.0)
    assert grid == finest and record["refinement"] == "complete" and not record["stopped_for_time"]
    assert rounds == record["rounds"] > 1 and all(len(r) == rounds for r in frame.round_seconds)
    assert record["operators"]["linear.o"]["level"] == "quick"        # with --quick, its grid is the finest


@pytest.mark.parametrize("argv, message", [
    (["--budget-s", "0"], "error: --budget-s: 0 must be a number of seconds above 0"),
    (["--budget-s", "-5"], "error: --budget-s: -5 must be a number of seconds above 0"),
    (["--budget-s", "nan"], "error: --budget-s: nan must be a number of seconds above 0"),
    (["--budget-s", "soon"], "error: argument --budget-s: invalid float value: 'soon'"),
    (["--budget-s", "60", "--rounds", "3"], "error: --budget-s: chooses the grid and the rounds by time; it "
                                            "cannot be combined with --rounds"),
    (["--budget-s", "60", "--refit", "calibration/cpu/smollm2-135m"], "error: --budget-s: chooses the grid"),
    (["--budget-s", "60", "--engine", "hf"], "error: --budget-s: applies to the live engine's operators, not to "
                                             "--engine hf"),
    (["--budget-s", "60", "--engine", "vllm"], "error: --budget-s: applies to the live engine's operators"),
])
def test_bad_budget_is_one_line(argv, message, capsys, monkeypatch):
    # The command's own entry point, in this process: the parsing, checks and error path of
    # `python -m profiler calibrate`, without a process start each.
    from profiler.cli import main

    monkeypatch.chdir(REPO)
    try:
        code = main(["calibrate", *argv])
    except SystemExit as exc:          # argparse's usage errors
        code = exc.code
    stderr = capsys.readouterr().err
    assert code == 2
    assert stderr.startswith(message) and stderr.count("\n") == 1, stderr
