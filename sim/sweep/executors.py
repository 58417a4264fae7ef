"""`python -m sim sweep`: run a study's points on a local process pool or a Ray cluster, log each
finished point, then write results.parquet and report.html.

Points are independent and seeded by their own scenario, so where a point runs does not change
its row. Points that share a baseline (same scenario but for the speculation) travel together in one
task, so each worker simulates that baseline once.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict

from sim.cost.batch import PHASES
from sim.errors import InputError
from sim.formats.provenance import repo_relative
from sim.result import json_safe
from sim.sweep.study import Point

# Points per task: large enough that a shared baseline is simulated once per task, small enough
# that a killed sweep loses little work and the progress bar moves.
TASK_POINTS = 8


def run_point(point: Point, baseline_cache: dict | None = None) -> dict:
    """Simulate one point; its row of results (flat: one column per figure)."""
    from sim.simulate import simulate
    from sim.sweep.study import describe

    try:
        result = simulate(point.scenario, baseline_cache=baseline_cache)
    except InputError as exc:     # found only while running: say which point
        raise InputError(exc.field, f"{exc.reason} (point {describe(point)})") from None
    return result_row(point, result)


def run_task(points: list[Point], reuse_baselines: bool = True) -> list[dict]:
    """A worker's unit of work: points that share a baseline, simulated in order."""
    cache = _WORKER_CACHE if reuse_baselines else None
    if cache is not None and len(cache) > 64:      # baselines of other tasks are not needed again
        cache.clear()
    return [run_point(point, cache) for point in points]


_WORKER_CACHE: dict = {}


def result_row(point: Point, result) -> dict:
    s = result.scenario
    spec = s.speculation
    pv = spec.partial_verify
    work = s.workload
    run, base = result.run, result.baseline
    prompt = work.prompt_tokens
    row = {
        "id": point.id, "group": point.group, "method": point.method,
        "speculation": spec.method, "hardware": s.hardware_spec.name, "model": s.model_spec.name,
        "dtype": s.dtype, "tensor_parallel": s.tensor_parallel, "gpus": s.deployment_gpus, "engine": s.engine_spec.name,
        "calibration": None if s.calibration is None else repo_relative(s.calibration),
        "arrival": work.arrival, "batch": work.concurrency if work.arrival == "closed" else None,
        "rate_qps": work.rate_qps, "requests": work.requests,
        "context": mean_tokens(prompt),
        "output_tokens": mean_tokens(work.output_tokens),
        "k": spec.num_speculative_tokens if spec.enabled and spec.tree is None else None,
        "tree": None if spec.tree is None else f"{spec.tree.draft_tokens}/{spec.tree.depth}",
        "budget": None if pv is None else pv.budget, "period": None if pv is None else pv.period,
        "period_unit": None if pv is None else pv.period_unit, "rectify": None if pv is None else pv.rectify,
        "settings": settings_label(s), "seed": s.seed,
        "policy": spec.policy.kind if spec.enabled else None, "mean_drafted_k": run.mean_drafted_k,
        "throughput_tok_s": run.throughput_tok_s, "baseline_throughput_tok_s": base.throughput_tok_s,
        "speedup": result.speedup, "decode_speedup": result.decode_speedup,
        "speedup_band": None if result.speedup_band is None else result.speedup_band.half_width,
        "speedup_band_cases": None if result.speedup_band is None else len(result.speedup_band.cases),
        "speedup_band_widened": None if result.speedup_band is None else result.speedup_band.widened is not None,
        "tokens_per_step": run.tokens_per_step,
    }
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        for p, value in getattr(run, name).items():
            row[f"{name}_{p}"] = value
    for name in ("ttft_ms", "tpot_ms"):
        for p, value in getattr(base, name).items():
            row[f"baseline_{name}_{p}"] = value
    for phase in PHASES:
        row[f"share_{phase}"] = run.time_share.get(phase, 0.0)
    memory = result.memory
    row.update({
        "peak_batch": run.peak_batch, "baseline_peak_batch": base.peak_batch,
        "max_running": memory["max_running"], "preemptions": run.preemptions,
        "peak_kv_gb": memory["peak_kv_gb"],
        "divergence_rate": None if result.partial_verify is None else result.partial_verify["divergence_rate"],
        "rolled_back_tokens": None if result.partial_verify is None else result.partial_verify["rolled_back_tokens"],
        "goodput_tok_s": run.goodput_tok_s, "baseline_goodput_tok_s": base.goodput_tok_s,
        "slo_attainment": run.slo_attainment, "slo_met": run.slo_met, "baseline_slo_met": base.slo_met,
        "warnings": "; ".join(result.provenance.get("warnings", [])) or None,
        "cost_model": result.provenance.get("cost_model"),
    })
    return json_safe(row)     # NaN and infinities become None: the log is strict JSON


def mean_tokens(lengths) -> float:
    """A workload's prompt length as one number: itself, a list's mean, or a distribution's mean."""
    if isinstance(lengths, int):
        return lengths
    if isinstance(lengths, list):
        return float(sum(lengths) / len(lengths))
    return float(lengths.mean)


def settings_label(s) -> str:
    """The speculation settings in a few words, for tables."""
    spec = s.speculation
    if not spec.enabled:
        return "-"
    parts = [f"tree {spec.tree.draft_tokens}/{spec.tree.depth}" if spec.tree is not None
             else f"k={spec.num_speculative_tokens}"]
    if spec.method == "shadow":
        parts.append(f"int{spec.draft.bits}")
    if spec.draft_kv_window is not None:
        parts.append(f"draft KV {spec.draft_kv_window}")
    if spec.method == "layerskip":
        parts.append(f"exit {spec.draft.exit_layer}")
    if spec.policy.kind != "static":
        policy = spec.policy
        parts[0] = {"off_above_batch": f"k={spec.num_speculative_tokens}, off above batch {policy.off_above_batch}",
                    "k_by_batch": f"k by batch {policy.k_by_batch}", "goodput": f"goodput k ≤ {spec.num_speculative_tokens}",
                    "oracle": f"oracle k ≤ {spec.num_speculative_tokens}",
                    "route": f"k={spec.num_speculative_tokens}, route "
                             + " ".join(f"{c}: {d.method}" for c, d in (policy.route or {}).items()),
                    "combine": f"k={spec.num_speculative_tokens} + lookup "
                               f"k={policy.combine.drafter.num_speculative_tokens or spec.num_speculative_tokens} "
                               f"({policy.combine.rule})" if policy.combine else ""}[policy.kind]
    pv = spec.partial_verify
    if pv is not None:
        parts.append(f"budget {pv.budget}, period {pv.period}{'' if pv.period_unit == 'tokens' else ' steps'}"
                     f"{', rectify' if pv.rectify else ''}")
    return ", ".join(parts)


def make_tasks(points: list[Point], task_points: int = TASK_POINTS) -> list[list[Point]]:
    """Points grouped by shared baseline, cut into tasks of at most `task_points`; the heaviest
    groups first, so the pool does not end on one long task."""
    groups: dict[str, list[Point]] = defaultdict(list)
    for point in points:
        groups[point.key].append(point)
    tasks = [members[i:i + task_points] for members in groups.values()
             for i in range(0, len(members), task_points)]
    tasks.sort(key=lambda t: -estimated_cost(t))
    return tasks


def estimated_cost(task: list[Point]) -> float:
    """A rough relative cost: engine iterations grow with requests x output tokens."""
    w = task[0].scenario.get("workload", {})
    out = w.get("output_tokens", 166)
    out = out if isinstance(out, (int, float)) else 166
    return len(task) * w.get("requests", 200) * out


def run_local(tasks: list[list[Point]], workers: int, on_row, reuse_baselines: bool = True) -> None:
    if workers <= 1:
        for task in tasks:
            for row in run_task(task, reuse_baselines):
                on_row(row)
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # fork: workers inherit the imported simulator (and its presets) instead of importing it again.
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=leave_stopping_to_the_sweep)
    try:
        pending = {pool.submit(run_task, task, reuse_baselines) for task in tasks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                for row in future.result():
                    on_row(row)
    except BaseException:
        # An error, Ctrl-C or SIGTERM: stop the workers now rather than after their current tasks
        # (what they were computing is not logged, so a resumed sweep runs it again).
        workers_now = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in workers_now:
            process.terminate()
        raise
    pool.shutdown()


def leave_stopping_to_the_sweep() -> None:
    """A worker's signals: Ctrl-C reaches the whole process group and the sweep stops its workers
    itself, and the sweep's SIGTERM handler (raising KeyboardInterrupt), inherited by fork, would
    make each worker print a traceback when the sweep terminates it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_ray(tasks: list[list[Point]], address: str | None, workers: int | None, on_row,
            reuse_baselines: bool = True) -> None:
    try:
        import ray
    except ImportError:
        raise InputError("--executor", "ray is not installed (pip install 'specsim[ray]')") from None
    started = False
    if not ray.is_initialized():
        kwargs = {"address": address} if address else {"num_cpus": workers or os.cpu_count()}
        try:
            ray.init(**kwargs, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise InputError("--address", f"cannot reach a Ray cluster at {address}: {exc}") from None
        started = True
    try:
        remote = ray.remote(run_task)
        pending = [remote.remote(task, reuse_baselines) for task in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    rows = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    if isinstance(exc.cause, InputError):
                        raise exc.cause from None
                    raise
                for row in rows:
                    on_row(row)
    finally:
        if started:
            ray.shutdown()


def run_sweep(points: list[Point], log, executor: str = "local", workers: int | None = None,
              address: str | None = None, progress: bool = True, reuse_baselines: bool = True) -> dict:
    """Run the points not yet in the log, appending each row as it finishes. Returns timing facts."""
    from tqdm import tqdm

    done = log.read()
    todo = [p for p in points if p.id not in done]
    workers = workers or os.cpu_count() or 1
    tqdm.monitor_interval = 0      # no monitor thread: the pool forks its workers after the bar starts
    tasks = make_tasks(todo)
    started = time.perf_counter()
    bar = tqdm(total=len(points), initial=len(points) - len(todo), unit="point", disable=not progress,
               dynamic_ncols=True, desc="sweep", mininterval=0.5)
    with log:
        def on_row(row):
            log.append(row)
            bar.update(1)

        try:
            if executor == "ray":
                run_ray(tasks, address, workers if address is None else None, on_row, reuse_baselines)
            else:
                run_local(tasks, workers, on_row, reuse_baselines)
        finally:
            bar.close()
    return {"points": len(points), "ran": len(todo), "resumed": len(points) - len(todo),
            "tasks": len(tasks), "seconds": time.perf_counter() - started,
            "executor": executor, "workers": workers, "reuse_baselines": reuse_baselines}
