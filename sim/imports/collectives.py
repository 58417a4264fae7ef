"""Collectives timed by Vidur's profiler (microsoft/vidur, data/profiling/network/*/): one CSV per
collective, a row per (GPUs, message size, GPUs per node) with `time_stats.<collective>.median` in
milliseconds: the median over Vidur's profiling passes of the NCCL kernel's time in a kineto trace
(vidur/profiling/collectives: fp16 buffers, `size` already in bytes, CUDA graphs off, each pass 11
launches of which the kernels are aggregated by their median).

Only rows within one node are kept (GPUs per node = GPUs, which for send/recv is a pair on one
node): the interconnect the table is named after.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.errors import InputError
from sim.imports.source_table import check_positive, read_source_csv

# dispatch and combine: a mixture of experts' all-to-all under expert parallelism (each token's
# hidden state sent to the GPUs of its experts, and their outputs back).
COLLECTIVES = ("all_reduce", "all_gather", "send_recv", "reduce_scatter", "broadcast", "dispatch", "combine")
COLUMNS = ("num_workers", "size", "collective", "devices_per_node")
MEASURED = {
    "seconds": "the source's time_stats.<collective>.median (ms) in seconds: the median NCCL kernel time "
               "in a kineto trace over Vidur's profiling passes (11 launches each, CUDA graphs off, fp16 "
               "buffers); kernel time only, no launch or host time",
    "bytes": "the source's `size`: bytes of one GPU's buffer (all_gather: its part)",
    "ranks": "the source's `num_workers`: GPUs in the collective, all on one node",
}


def read_collectives(path: Path):
    """The within-node rows of one of Vidur's collective CSVs as (op, ranks, bytes, seconds)."""
    import pandas as pd

    frame = read_source_csv(path, list(COLUMNS), "a Vidur collective table, with time_stats.<collective>.median")
    ops = frame.collective.unique()
    if len(ops) != 1 or ops[0] not in COLLECTIVES:
        raise InputError(str(path), f"holds collectives {sorted(map(str, ops))}; one of {', '.join(COLLECTIVES)} "
                                    f"a file")
    op = str(ops[0])
    column = f"time_stats.{op}.median"
    if column not in frame.columns:
        raise InputError(str(path), f"lacks column {column}")
    check_positive(frame, [column, "size", "num_workers"], path)
    local = frame[frame.devices_per_node == frame.num_workers]
    if local.empty:
        raise InputError(str(path), "has no rows within one node (devices_per_node = num_workers)")
    return pd.DataFrame({"op": op, "ranks": local.num_workers.astype(float), "bytes": local["size"].astype(float),
                         "seconds": local[column].astype(float) * 1e-3})


def bin_by_size(rows, per_octave: int = 4):
    """Every fifth size of each (op, ranks) held out; the rest in bins of 1/per_octave of an octave,
    each bin's median time at the median size of the bin's rows (one size axis for every ranks).
    Returns (grid rows, held-out rows), both with a `source_rows` count."""
    import pandas as pd

    rows = rows.sort_values(["op", "ranks", "bytes"]).reset_index(drop=True)
    held = rows.groupby(["op", "ranks"]).cumcount() % 5 == 4
    fit = rows[~held].assign(bin=lambda f: np.floor(np.log2(f["bytes"]) * per_octave).astype(int))
    grid = []
    for op, of_op in fit.groupby("op"):
        sizes = of_op.groupby("bin")["bytes"].median()
        counts = of_op.groupby("bin").ranks.nunique()
        bins = counts[counts == of_op.ranks.nunique()].index       # a bin every ranks has
        for (ranks, b), cell in of_op[of_op.bin.isin(bins)].groupby(["ranks", "bin"]):
            grid.append({"op": op, "ranks": ranks, "bytes": float(sizes[b]), "seconds": float(cell.seconds.median()),
                         "source_rows": len(cell)})
    held_rows = rows[held].assign(source_rows=1)
    return pd.DataFrame(grid), held_rows


TRANSCRIBED = ("op", "ranks", "elements", "dtype_bytes", "ms", "library")
MEASURED_TRANSCRIBED = {
    "seconds": "the source's latency (ms) in seconds, as its table states it",
    "bytes": "the source's elements x bytes an element: one GPU's buffer (dispatch, combine: the tokens x top-k "
             "hidden states one GPU sends)",
    "ranks": "GPUs in the collective (on one node, unless the table's interconnect is a network)",
}


def read_transcribed(path: Path, library: str):
    """A collective table transcribed from a page (a pull request's or a blog's), the rows of one
    library: columns op, ranks, elements, dtype_bytes, ms, library. Returns (rows of op, ranks,
    bytes, seconds; each op's bytes an element where the table has one)."""
    import pandas as pd

    frame = read_source_csv(path, list(TRANSCRIBED), "a transcribed collective table")
    check_positive(frame, ["ranks", "elements", "dtype_bytes", "ms"], path)
    frame = frame[frame.library == library]
    if frame.empty:
        raise InputError(str(path), f"has no rows of library {library!r}")
    unknown = sorted(set(frame.op) - set(COLLECTIVES))
    if unknown:
        raise InputError(str(path), f"op {unknown[0]!r} is not one of {', '.join(COLLECTIVES)}")
    rows = pd.DataFrame({"op": frame.op, "ranks": frame.ranks.astype(float),
                         "bytes": (frame.elements * frame.dtype_bytes).astype(float),
                         "seconds": frame.ms.astype(float) * 1e-3})
    # Each op's element width where it has one (an all-to-all's pricer sends each op at its own).
    widths = frame.groupby("op").dtype_bytes.unique()
    return rows, {str(op): float(w[0]) for op, w in widths.items() if len(w) == 1}


def hold_out_sizes(rows):
    """Every fifth size of each (op, ranks) held out, the rest the grid: for tables of a few sizes,
    where binning would leave none. An op timed at one size per GPU count (DeepEP's table) holds out
    every fifth GPU count instead."""
    rows = rows.sort_values(["op", "ranks", "bytes"]).reset_index(drop=True).assign(source_rows=1)
    sizes = rows.groupby(["op", "ranks"]).bytes.transform("size")
    one_size = sizes.groupby(rows.op).transform("max") == 1
    held = (rows.groupby(["op", "ranks"]).cumcount() % 5 == 4).where(~one_size, rows.groupby("op").cumcount() % 5 == 4)
    return rows[~held], rows[held]
