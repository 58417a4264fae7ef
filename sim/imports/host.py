"""An engine's host work per iteration, timed by Vidur's profiler (microsoft/vidur,
data/profiling/<gpu>/cpu_overheads.csv, in the repository's history: 6d98aa8, 2024-05): a row per
(model, batch size, tensor-parallel GPUs) with the mean and median milliseconds of each part of a
decode iteration of Sarathi-Serve's engine, which Vidur profiled with vLLM's scheduler (a fork of
vLLM's 2023 engine: synchronous, its workers Ray actors, fp16): `schedule`, `prepare_inputs_e2e`
(the batch's input tensors and attention metadata), `sampler_e2e` (logits to tokens, its kernels included), `process_model_outputs`
(appending tokens, stop checks, detokenization) and `ray_comm_time` (the driver's round trip to its
Ray workers).

Read as one op per part, a point per (tensor-parallel size, batch) at the median over the models
profiled at that size (two each: their host work differs mainly through the sampler's vocabulary),
which sim/cost/host.py sums into the engine's host time of a step.
"""
from __future__ import annotations

from pathlib import Path

from sim.imports.source_table import check_positive, read_source_csv

OPS = {"schedule": "schedule_median", "prepare_inputs": "prepare_inputs_e2e_median",
       "sampler": "sampler_e2e_median", "process_outputs": "process_model_outputs_median",
       "ray_comm": "ray_comm_time_mean"}
COLUMNS = ("model_name", "batch_size", "tensor_parallel_degree")
MEASURED = {
    "seconds": "the source's <part>_median (ms; ray_comm_time has a mean only) in seconds, the median over the "
               "models profiled at the point: host time of one decode iteration of Sarathi-Serve's engine (a fork "
               "of vLLM's 2023 synchronous engine, Ray workers) with vLLM's scheduler: schedule, prepare_inputs "
               "(prepare_inputs_e2e), sampler (sampler_e2e, its GPU kernels included), process_outputs "
               "(process_model_outputs), ray_comm (ray_comm_time)",
    "batch": "the source's batch_size: requests in the decode iteration",
    "ranks": "the source's tensor_parallel_degree: GPUs of the tensor-parallel group",
}


def read_host(path: Path):
    """Rows of op, ranks, batch, seconds, source_rows: the median over the source's models at each point."""
    import pandas as pd

    frame = read_source_csv(path, [*COLUMNS, *OPS.values()], "a Vidur cpu_overheads.csv")
    check_positive(frame, ["batch_size", "tensor_parallel_degree", *OPS.values()], path)
    rows = [pd.DataFrame({"op": op, "ranks": frame.tensor_parallel_degree.astype(float),
                          "batch": frame.batch_size.astype(float), "seconds": frame[column].astype(float) * 1e-3})
            for op, column in OPS.items()]
    rows = pd.concat(rows, ignore_index=True)
    return (rows.groupby(["op", "ranks", "batch"]).seconds.agg(["median", "size"]).reset_index()
            .rename(columns={"median": "seconds", "size": "source_rows"}))
