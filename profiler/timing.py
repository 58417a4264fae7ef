"""Timing one operator on the device: the median of many runs after a warm-up.

CPU: torch.utils.benchmark (blocked runs until `min_run_time_s` has passed, every thread torch
uses). CUDA: triton.testing.do_bench (L2 flushed between runs, CUDA events), or CUDA events
directly when Triton is missing. Either way a measurement is a median and its interquartile range
relative to it, never a single run.
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
    import torch

    fn()
    fn()
    if device == "cuda":
        return _time_cuda(fn, min_run_time_s)
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=min_run_time_s)
    return Timing(m.median, m.iqr / m.median if m.median > 0 else 0.0, len(m.times) * m.number_per_run)


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
    `sync` before each clock read, for CUDA); removed on exit. A decoding loop's host time is its
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
    try:
        yield seconds
    finally:
        for hook in hooks:
            hook.remove()
