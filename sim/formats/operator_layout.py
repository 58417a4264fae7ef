"""A calibration bundle's operator times in the measured tables' layout (sim/cost/operator_tables.py),
so that one loader reads a user's own measurements and aiconfigurator-core's published ones.

    DIR/SYSTEM/FAMILY/FRAMEWORK/VERSION/TABLE.parquet     (and collection_meta.yaml)

`python -m profiler calibrate` writes them into every bundle of the live engine, as
BUNDLE/operator_tables/, from the bundle's own rows (the median round of each grid point, held-out
points left out):

    gemm_perf                  linear.{qkv,o,gate_up,down}: m = tokens, n = out, k = in features
    generation_attention_perf  attention at one query token a row: batch_size, step = kv - 1
    context_attention_perf     attention_prompt: one prompt of isl tokens attending to itself

with the columns of the published tables (framework, version, device, op_name, kernel_source, the
operator's axes, latency in milliseconds). SYSTEM is the name the published tables know the GPU by
(meta.json's device.tables_system: a hardware preset's `operator_tables`, else the preset's own
name, "cpu", "rtx-4090"); FRAMEWORK
is `live` and VERSION this project's version with the bundle's git revision. A scenario's
`operator_tables: DIR` lays them over the published ones (sim/cost/measured_tables.py).
"""
from __future__ import annotations

from pathlib import Path
from string import hexdigits

import pandas as pd
import yaml

from sim.errors import InputError

FRAMEWORK = "live"
FOLDER = "operator_tables"
TABLE_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
FAMILY = {"gemm_perf": "gemm", "generation_attention_perf": "attention", "context_attention_perf": "attention"}


def layout_version(meta: dict) -> str:
    """This project's version and the bundle's git revision, a PEP 440 version ("0.1.0+g1a2b3c4")."""
    from importlib import metadata

    try:
        project = metadata.version("specsim")
    except metadata.PackageNotFoundError:
        project = "0"
    revision = str(meta.get("git_revision") or "")[:7]
    return f"{project}+g{revision}" if len(revision) == 7 and all(c in hexdigits for c in revision) else project


def bundle_tables(frame: pd.DataFrame, meta: dict) -> dict[str, pd.DataFrame]:
    """table name -> its rows, from a live-engine bundle's timed grid points (empty where the
    bundle timed none of an operator)."""
    model, dtype = meta["model"], TABLE_DTYPE.get(meta["dtype"], meta["dtype"])
    hidden, heads, kv_heads, head_dim, ffn = (int(model[f]) for f in ("hidden", "heads", "kv_heads", "head_dim", "ffn"))
    base = {"framework": FRAMEWORK.upper(), "version": layout_version(meta), "device": meta["device"]["name"]}
    rows = frame[~frame["held_out"].astype(bool)]
    tables: dict[str, pd.DataFrame] = {}
    shapes = {"qkv": (hidden, (heads + 2 * kv_heads) * head_dim), "o": (heads * head_dim, hidden),
              "gate_up": (hidden, 2 * ffn), "down": (ffn, hidden)}
    gemm = [pd.DataFrame({"op_name": "gemm", "kernel_source": "torch.nn.functional.linear", "gemm_dtype": dtype,
                          "m": part["tokens"].astype("int64"), "n": n, "k": k, "latency": part["seconds"] * 1e3})
            for name, (k, n) in shapes.items() if not (part := rows[rows["op"] == f"linear.{name}"]).empty]
    if gemm:
        tables["gemm_perf"] = pd.concat(gemm, ignore_index=True)
    attention = {"num_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim, "beam_width": 1,
                 "attn_dtype": dtype, "kv_cache_dtype": dtype, "window_size": 0}
    decode = rows[(rows["op"] == "attention") & (rows["query"] == 1)]
    if not decode.empty:
        tables["generation_attention_perf"] = pd.DataFrame({
            "op_name": "generation_attention", "kernel_source": "profiler.engine.Attention",
            "batch_size": decode["batch"].astype("int64"), "isl": 1, **attention,
            "step": decode["kv"].astype("int64") - 1, "latency": decode["seconds"] * 1e3})
    prompt = rows[rows["op"] == "attention_prompt"]
    if not prompt.empty:
        tables["context_attention_perf"] = pd.DataFrame({
            "op_name": "context_attention", "kernel_source": "profiler.engine.Attention", "batch_size": 1,
            "isl": prompt["query"].astype("int64"), **attention, "step": 0, "latency": prompt["seconds"] * 1e3})
    return {name: pd.DataFrame({**base, **table.reset_index(drop=True).to_dict("list")})
            for name, table in tables.items()}


def write_operator_layout(folder: Path, frame: pd.DataFrame, meta: dict) -> list[Path]:
    """Write a bundle's tables under `folder` (a fresh folder inside the bundle being written);
    returns the files written."""
    system, version = meta["device"].get("tables_system") or meta["device"]["hardware"], layout_version(meta)
    written = []
    for name, table in bundle_tables(frame, meta).items():
        target = folder / system / FAMILY[name] / FRAMEWORK / version
        target.mkdir(parents=True, exist_ok=True)
        table.to_parquet(target / f"{name}.parquet", index=False)
        written.append(target / f"{name}.parquet")
        (target / "collection_meta.yaml").write_text(yaml.safe_dump({
            "schema_version": 1, "provenance": "profiler calibrate",
            "runtime": {"framework": FRAMEWORK, "version": version}, "device": meta["device"]["name"],
            "dtype": meta["dtype"], "model": meta["model"]["name"], "git_revision": meta.get("git_revision")},
            sort_keys=False))
    return written


def user_tables_root(folder: Path) -> Path:
    """A scenario's `operator_tables`: a folder laid out as the published tables, or a calibration
    bundle holding one; bad input where it holds no table."""
    folder = Path(folder)
    if (folder / FOLDER).is_dir():
        folder = folder / FOLDER
    if not folder.is_dir():
        raise InputError("operator_tables", f"no such folder: {folder}")
    if not any(folder.glob("*/*/*/*/*.parquet")):
        raise InputError("operator_tables", f"{folder} holds no table laid out as SYSTEM/FAMILY/FRAMEWORK/VERSION/"
                                            f"TABLE.parquet")
    return folder.resolve()
