"""How many launches the host issues per engine step: what a run folder says of the engine it timed.

A bundle made from a run prices the engine that ran: an eager engine issuing a dozen launches per
layer, or one replaying a CUDA graph per step. A short untimed pass under torch's profiler counts,
inside each engine step (the serving loop's `engine_step` range, profiler.engine.serving.STEP_RANGE):
  on CUDA  the host's kernel launch calls (runtime and driver API, Triton's included) and graph
           launches: about 15 per layer eagerly, one per forward with graphs;
  on CPU   the operator calls Python makes (direct children of the step's range): the dispatch
           work an eager engine repeats every step.
"""
from __future__ import annotations

from typing import Callable

# Host calls that start GPU work: CUDA runtime and driver kernel launches and graph launches.
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                          "cudaGraphLaunch", "cuGraphLaunch", "cudaLaunchCooperativeKernel"})
CUDA_COUNTED = "host kernel and graph launch calls (CUDA runtime and driver API)"
CPU_COUNTED = "operator calls from Python (CPU)"


def count_launches(run_pass: Callable[[], object], cuda: bool) -> dict:
    """Run `run_pass` under torch's profiler; returns the engine steps it saw, launches per step
    (module docstring) and what was counted."""
    from torch.profiler import ProfilerActivity, profile

    from profiler.engine.graphs import CAPTURE_RANGE
    from profiler.engine.serving import STEP_RANGE

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run_pass()
    events = list(prof.events())
    steps = [e for e in events if e.name == STEP_RANGE]
    if not steps:
        return {"profiled_steps": 0, "launches_per_step": None, "launches_counted": CUDA_COUNTED if cuda else CPU_COUNTED}
    if cuda:
        # A graph captured in the pass (none after a warm-up) is not a step's work.
        spans = sorted((e.time_range.start, e.time_range.end) for e in steps)
        captures = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == CAPTURE_RANGE)
        counted = sum(1 for e in events if e.name in LAUNCH_CALLS and _within(e.time_range.start, spans)
                      and not _within(e.time_range.start, captures))
    else:
        step_ids = {id(e) for e in steps}
        counted = sum(1 for e in events if e.cpu_parent is not None and id(e.cpu_parent) in step_ids)
    return {"profiled_steps": len(steps), "launches_per_step": counted / len(steps),
            "launches_counted": CUDA_COUNTED if cuda else CPU_COUNTED}


def _within(t: float, spans: list[tuple[float, float]]) -> bool:
    return any(start <= t <= end for start, end in spans)
