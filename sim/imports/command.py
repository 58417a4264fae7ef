"""`python -m sim import-profile`: a published table read from its files and written as a
published profile (sim/formats/published.py), with its source, and its own check: the source's
rows held out of the table (every fifth size or token count) against what the table interpolates
there."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import InputError
from sim.formats.bundle import SCHEMA_VERSION, write_bundle
from sim.formats.provenance import git_revision, repo_relative, versions
from sim.formats.published import HELD_OUT_TARGET, KIND, grid_table
from sim.imports import KINDS
from sim.scenario.presets import HARDWARE
from sim.scenario.presets.engines import ALL_TO_ALL_LIBRARIES, COLLECTIVES_LIBRARIES as LIBRARIES
from sim.scenario.presets.hardware import NETWORK_LINKS



@dataclass(frozen=True)
class ImportOptions:
    kind: str
    files: tuple[Path, ...]
    out: Path
    source: str               # who published it (Vidur)
    repository: str           # the repository or page it is read from
    path: str                 # the file or folder there
    commit: str               # the repository's commit, or the page's date
    licence: str
    hardware: str             # the hardware preset it was measured on
    interconnect: str | None = None   # collectives: the GPU-to-GPU link class (a hardware preset's `interconnect`)
    library: str = "nccl"             # collectives: their library
    engine: str | None = None         # host: the engine whose iterations were timed


def check_options(options: ImportOptions) -> None:
    if options.kind not in KINDS:
        raise InputError("KIND", f"{options.kind!r} is not one of {', '.join(KINDS)}")
    if options.hardware not in HARDWARE:
        raise InputError("--hardware", f"unknown preset {options.hardware!r} (known: {', '.join(HARDWARE)})")
    if KINDS[options.kind][0] == "collectives":
        links = sorted({h.interconnect for h in HARDWARE.values()}) + list(NETWORK_LINKS)
        if options.interconnect not in links:
            raise InputError("--interconnect", f"unknown interconnect {options.interconnect!r} "
                                               f"(known: {', '.join(links)})")
        if options.library not in LIBRARIES + ALL_TO_ALL_LIBRARIES:
            raise InputError("--library", f"{options.library!r} is not one of "
                                          f"{', '.join(LIBRARIES + ALL_TO_ALL_LIBRARIES)}")
    if KINDS[options.kind][0] == "host" and not options.engine:
        raise InputError("--engine", "a host table needs the engine whose iterations it timed")
    if KINDS[options.kind][0] != "host" and options.engine:
        raise InputError("--engine", f"only host tables name an engine ({options.kind} makes a "
                                     f"{KINDS[options.kind][0]} table)")
    for file in options.files:
        if not file.is_file():
            raise InputError(str(file), "no such file")


def read_source(options: ImportOptions):
    """(grid rows, held-out rows, what each column measured, the table's own meta keys)."""
    import pandas as pd

    if options.kind == "vidur-collectives":
        from sim.imports.collectives import MEASURED, bin_by_size, read_collectives

        frames = [read_collectives(f) for f in options.files]
        ops = [str(f.op.iloc[0]) for f in frames]
        if len(set(ops)) < len(ops):
            raise InputError("FILE", f"two files hold the same collective ({', '.join(ops)})")
        grid_rows, held_rows = bin_by_size(pd.concat(frames, ignore_index=True))
        return grid_rows, held_rows, MEASURED, {"interconnect": options.interconnect, "library": options.library}
    if options.kind == "collectives-csv":
        from sim.imports.collectives import MEASURED_TRANSCRIBED, hold_out_sizes, read_transcribed

        if len(options.files) != 1:
            raise InputError("FILE", "collectives-csv reads one transcribed table")
        rows, widths = read_transcribed(options.files[0], options.library)
        grid_rows, held_rows = hold_out_sizes(rows)
        return (grid_rows, held_rows, MEASURED_TRANSCRIBED,
                {"interconnect": options.interconnect, "library": options.library, "element_bytes": widths})
    if options.kind == "vidur-cpu-overheads":
        from sim.imports.host import MEASURED as HOST_MEASURED, read_host
        from sim.imports.source_table import hold_out_fifths

        if len(options.files) != 1:
            raise InputError("FILE", "vidur-cpu-overheads reads one cpu_overheads.csv")
        grid_rows, held_rows = hold_out_fifths(read_host(options.files[0]), "batch")
        return grid_rows, held_rows, HOST_MEASURED, {"engine": options.engine}
    from sim.imports.kernels import MEASURED, read_kernels
    from sim.imports.source_table import hold_out_fifths

    if len(options.files) != 1:
        raise InputError("FILE", "vidur-mlp reads one mlp.csv (one model on one GPU)")
    rows, shape = read_kernels(options.files[0])
    grid_rows, held_rows = hold_out_fifths(rows)
    model = {"heads": shape["n_head"], "kv_heads": shape["n_kv_head"], "hidden": shape["n_embd"],
             "ffn": shape["n_expanded_embd"], "vocab": shape["vocab_size"], "gated_mlp": shape["use_gated_mlp"]}
    return grid_rows, held_rows, MEASURED, {"model": model, "dtype": "fp16"}


def import_profile(options: ImportOptions) -> int:
    """Read, check and write; print each table's held-out error."""
    import pandas as pd

    check_options(options)
    table_kind, dims = KINDS[options.kind]
    grid_rows, held_rows, measured, own = read_source(options)
    grid, held_out, lines = {}, {}, []
    for op, of_op in grid_rows.groupby("op"):
        axes = {d: sorted(of_op[d].unique().tolist()) for d in dims}
        grid[op] = {"dims": list(dims), "axes": axes}
        table = grid_table(op, grid[op], of_op)
        held = held_rows[held_rows.op == op]
        if held.empty:
            raise InputError("FILE", f"{op} has too few rows to hold any out (every fifth size: five or more)")
        errors = np.array([table(*(getattr(r, d) for d in dims)) / r.seconds - 1 for r in held.itertuples()])
        held_out[op] = summary(errors)
        for ranks in sorted(held.ranks.unique()):
            mine = np.abs(errors[(held.ranks == ranks).to_numpy()])
            lines.append(f"{op:<16} {int(ranks):>5} {len(axes[dims[1]]):>6} {len(mine):>5} {np.median(mine):>7.1%} "
                         f"{np.percentile(mine, 90):>7.1%} {mine.max():>7.1%}")
    frame = pd.concat([grid_rows.assign(held_out=False), held_rows.assign(held_out=True)], ignore_index=True)
    meta = {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "table": table_kind,
        "source": {"name": options.source, "repository": options.repository, "path": options.path,
                   "commit": options.commit, "licence": options.licence,
                   "files": [f.name for f in options.files], "importer": options.kind},
        "hardware": options.hardware, **own,
        "measured": measured, "grid": grid, "held_out": held_out,
        "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(), "versions": versions(("pandas", "pyarrow")),
    }
    write_bundle(options.out, frame[["op", *dims, "seconds", "held_out", "source_rows"]], meta)
    print(f"{'op':<16} {'ranks':>5} {dims[1]:>6} {'held':>5} {'median':>7} {'P90':>7} {'worst':>7}   "
          f"|table / held-out row - 1|")
    print("\n".join(lines))
    for op, h in held_out.items():
        if not h["within_target"]:
            print(f"warning: {op} holds out within a median {h['median_abs_error']:.1%} "
                  f"(target {HELD_OUT_TARGET:.0%})")
    print(f"wrote {repo_relative(options.out)}")
    return 0


def summary(errors: np.ndarray) -> dict:
    """The held-out rows' errors, as meta.json keeps them."""
    magnitude = np.abs(errors)
    return {"rows": int(errors.size), "median_abs_error": float(np.median(magnitude)),
            "p90_abs_error": float(np.percentile(magnitude, 90)), "worst_abs_error": float(magnitude.max()),
            "median_signed_error": float(np.median(errors)),
            "within_target": bool(np.median(magnitude) <= HELD_OUT_TARGET)}
