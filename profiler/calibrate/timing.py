"""Timing one operator on the device: the median of many runs after a warm-up.

CPU: blocks of about 2 ms of calls on every thread torch uses, until `min_run_time_s` has passed
(the method of torch.utils.benchmark's Timer without its re-sizing and re-warming, see
_time_cpu). CUDA: triton.testing.do_bench (L2 flushed between runs, CUDA events), or CUDA events
directly when Triton is missing. Either way a measurement is a median and its interquartile
range relative to it, never a single run.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    median_s: float
    spread: float            # interquartile range / median
    runs: int


def time_call(fn: Callable[[], object], device: str, min_run_time_s: float = 0.05) -> Timing:
    """Median seconds of fn() on `device` ("cpu" or "cuda"), after two warm-up calls."""
    fn()
    if device == "cuda":
        fn()
        return _time_cuda(fn, min_run_time_s)
    return _time_cpu(fn, min_run_time_s)


# A CPU block's length: long enough that reading the clock (well under a microsecond) is under
# 0.1% of it, short enough that a point timed for 20 ms (calibrate's budget) still gives ten blocks.
CPU_BLOCK_S = 2e-3


def _time_cpu(fn: Callable[[], object], min_run_time_s: float) -> Timing:
    """Blocks of calls, each timed by the monotonic clock, until `min_run_time_s` has passed; the
    median and interquartile range of the blocks' per-call times. The block size comes from the
    second warm-up call.

    Not torch.utils.benchmark's Timer, though this is its method: its blocked_autorange first
    sizes blocks by running 1, 10, 100... calls, and its timeit warms up again before every block;
    for the sub-millisecond operators of a small model and the few-millisecond ones alike that
    spent two to three times the measurement itself, most of a calibration's time, for the same
    figures (interleaved with blocked_autorange's on this machine at five operators, 12 times each:
    minimums within 3%, medians within 7%, the machine's own noise)."""
    import time

    import numpy as np

    start = time.perf_counter()
    fn()
    per_call_s = time.perf_counter() - start
    number = max(1, int(CPU_BLOCK_S / max(per_call_s, 1e-9)))
    blocks, spent_s = [], 0.0
    while spent_s < min_run_time_s or not blocks:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        block_s = time.perf_counter() - start
        blocks.append(block_s / number)
        spent_s += block_s
    q25, median, q75 = np.percentile(blocks, [25, 50, 75])
    return Timing(float(median), float((q75 - q25) / median) if median > 0 else 0.0, len(blocks) * number)


def _time_cuda(fn, min_run_time_s: float) -> Timing:
    import torch

    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    rep_ms = max(min_run_time_s * 1e3, 10.0)
    if do_bench is not None:
        q25, q50, q75 = do_bench(fn, warmup=max(rep_ms / 4, 5.0), rep=rep_ms, quantiles=[0.25, 0.5, 0.75])
        estimate_runs = max(1, int(rep_ms / max(q50, 1e-3)))
        return Timing(q50 * 1e-3, (q75 - q25) / q50 if q50 > 0 else 0.0, estimate_runs)
    torch.cuda.synchronize()
    times = []
    budget_s = min_run_time_s
    spent = 0.0
    while spent < budget_s or len(times) < 10:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
        spent += times[-1]
    times.sort()
    n = len(times)
    median = times[n // 2]
    return Timing(median, (times[3 * n // 4] - times[n // 4]) / median if median > 0 else 0.0, n)


@contextmanager
def timed_forwards(model, sync: Callable[[], None] = lambda: None):
    """Hooks on `model` that append each forward's seconds to the yielded list (synchronized by
    `sync` before each clock read, for CUDA), its CUDA graph replays included when it has them on
    (profiler.engine.graphs: enable them before); removed on exit. A decoding loop's host time is its
    wall time minus these."""
    import time

    seconds: list[float] = []
    started: list[float] = []

    def before(module, inputs):
        sync()
        started.append(time.perf_counter())

    def after(module, inputs, output):
        sync()
        seconds.append(time.perf_counter() - started.pop())

    hooks = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    # A forward replayed from a CUDA graph (profiler/engine/graphs.py) does not call the model.
    graphs = getattr(model, "step_graphs", None)          # a model of ours, not transformers'
    replay = (lambda: before(None, None), lambda: after(None, None, None))
    if graphs is not None:
        graphs.replay_hooks.append(replay)
    try:
        yield seconds
    finally:
        for hook in hooks:
            hook.remove()
        if graphs is not None:
            graphs.replay_hooks.remove(replay)
