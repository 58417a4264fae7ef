"""One GPU's and engine's measured operator tables (aiconfigurator-core, sim/cost/operator_tables.py)
as grids a pricer looks latencies up in (sim/cost/log_grid.py).

    gemm                  by dtype: (k, m, n)
    generation attention  one query token a row, by heads, KV heads, head dim and KV dtype: (batch, KV tokens)
    context attention     a whole prompt a row, the same keys: (batch, prompt tokens)
    MLA generation        SGLang's and TensorRT-LLM's absorbed MLA kernel, by heads a GPU: (batch, KV tokens)
    fused MoE             by hidden, expert width, top-k, experts, MoE TP and EP and dtype: (tokens)
    custom all-reduce     by GPUs: (message bytes)
    MoE all-to-all        DeepEP's dispatch and combine by backend, GPUs, hidden, top-k, experts: (tokens a GPU sends)

Where a table times an operator with several kernels, the one with the most measured points is
taken (on an H100 that is FlashAttention 3 for attention, vLLM's Triton experts for bf16 MoE).
The tables' latencies are milliseconds; every grid here is in seconds. A table that lacks a column
its family needs is bad input (`InputError`), as is a version the package does not hold.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost.log_grid import LogGrid
from sim.cost.operator_tables import TableSet, current_version, package_provenance, table_sets, version_key
from sim.errors import InputError
from sim.formats.provenance import repo_relative

# The columns each table must have (besides framework, version, device and latency).
COLUMNS = {
    "gemm_perf": ("kernel_source", "gemm_dtype", "m", "n", "k"),
    "generation_attention_perf": ("kernel_source", "batch_size", "num_heads", "num_key_value_heads", "head_dim",
                                  "kv_cache_dtype", "step"),
    "context_attention_perf": ("kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
                               "kv_cache_dtype"),
    "generation_mla_perf": ("kernel_source", "batch_size", "num_heads", "kv_cache_dtype", "step"),
    "moe_perf": ("kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                 "moe_tp_size", "moe_ep_size", "distribution"),
    "custom_allreduce_perf": ("kernel_source", "num_gpus", "message_size"),
    "moe_a2a_perf": ("kernel_source", "comm_backend", "phase", "ep_size", "hidden_size", "topk", "num_experts",
                     "num_tokens", "transmit_us", "notify_us"),
}
FAMILY_OF = {"gemm_perf": "gemm", "generation_attention_perf": "attention", "context_attention_perf": "attention",
             "generation_mla_perf": "mla", "moe_perf": "moe", "custom_allreduce_perf": "comm", "moe_a2a_perf": "comm"}
# The routing a fused-MoE table measured that real traffic is closest to (aiconfigurator's default too).
MOE_DISTRIBUTIONS = ("power_law_1.01", "balanced")
# Bytes of an element -> the tables' dtype names.
TABLE_DTYPE = {4: "float32", 2: "bfloat16", 1: "fp8"}


@dataclass(frozen=True)
class AttentionGrid:
    """An attention table's grid at the (heads, KV heads) it measured nearest to the asked ones."""
    grid: LogGrid
    heads: int
    kv_heads: int
    exact: bool


@dataclass(eq=False)     # hashed by identity: its grids are cached per instance
class OperatorTables:
    """The tables of one GPU (`system`), framework and version, read on first use."""
    system: str
    framework: str
    version: str
    sets: dict[str, TableSet] = field(default_factory=dict)     # family -> its collection
    devices: dict[str, str] = field(default_factory=dict)       # table -> the device its rows name
    # A user's own tables laid over the published ones (a scenario's `operator_tables`): table -> its
    # collection, and the folder as results record it.
    overrides: dict[str, TableSet] = field(default_factory=dict)
    user_folder: str | None = None

    @property
    def provenance(self) -> dict:
        """What every result priced from these tables records: the package and the tables read,
        each a user's (with its framework and version) or the package's."""
        tables = {}
        for name, device in sorted(self.devices.items()):
            user = self.overrides.get(name)
            tables[name] = {"family": FAMILY_OF[name], "device": device, "source": "package"} if user is None else \
                {"family": FAMILY_OF[name], "device": device, "source": "user", "framework": user.framework,
                 "version": user.version}
        return {"package": package_provenance(), "system": self.system, "framework": self.framework,
                "version": self.version, **({"user_tables": self.user_folder} if self.overrides else {}),
                "tables": tables}

    def frame(self, name: str) -> pd.DataFrame | None:
        """The table `name` (latency in seconds as latency_s), the user's where they gave one, or
        None where neither holds it."""
        s = self.overrides.get(name) or self.sets.get(FAMILY_OF[name])
        if s is None or name not in s.tables:
            return None
        return read_table(s.folder / f"{name}.parquet", name)

    def chosen(self, name: str, **keys) -> pd.DataFrame | None:
        """The rows of `name` matching `keys`, of the kernel with the most of them; None if none."""
        frame = self.frame(name)
        if frame is None:
            return None
        rows = frame
        for column, value in keys.items():
            rows = rows[rows[column] == value]
        if rows.empty:
            return None
        counts = rows["kernel_source"].value_counts()
        rows = rows[rows["kernel_source"] == counts.index[0]]
        self.devices[name] = str(rows["device"].iloc[0])
        return rows

    @lru_cache(maxsize=None)
    def gemm(self, dtype: str) -> LogGrid | None:
        """GEMM latency over (k, m, n) for `dtype` ("bfloat16", "fp8")."""
        rows = self.chosen("gemm_perf", gemm_dtype=dtype)
        return LogGrid.from_frame(rows, ("k", "m", "n")) if rows is not None else None

    @lru_cache(maxsize=None)
    def attention(self, name: str, heads: int, kv_heads: int, head_dim: int, kv_dtype: str) -> AttentionGrid | None:
        """Generation (over batch, KV tokens) or context attention (over batch, prompt tokens) of
        one layer at the measured (heads, KV heads) nearest the asked: the same pair if measured,
        else the nearest in log space with the same head dim, KV dtype and no KV window."""
        frame = self.frame(name)
        if frame is None:
            return None
        rows = frame[(frame["head_dim"] == head_dim) & (frame["kv_cache_dtype"] == kv_dtype)]
        if "window_size" in rows:
            rows = rows[rows["window_size"] == 0]
        if rows.empty:
            return None
        pairs = rows[["num_heads", "num_key_value_heads"]].drop_duplicates().to_numpy()
        distance = np.abs(np.log(pairs[:, 0] / heads)) + np.abs(np.log(pairs[:, 1] / kv_heads))
        h, kvh = (int(v) for v in pairs[distance.argmin()])
        chosen = self.chosen(name, head_dim=head_dim, kv_cache_dtype=kv_dtype, num_heads=h, num_key_value_heads=kvh,
                             **({"window_size": 0} if "window_size" in frame else {}))
        assert chosen is not None
        if name == "generation_attention_perf":
            chosen = chosen.assign(kv_tokens=chosen["step"] + 1)       # the query's own token and `step` before it
            grid = LogGrid.from_frame(chosen, ("batch_size", "kv_tokens"), fill_first="kv_tokens")
        else:
            grid = LogGrid.from_frame(chosen, ("batch_size", "isl"))
        return AttentionGrid(grid, h, kvh, (h, kvh) == (heads, kv_heads))

    @lru_cache(maxsize=None)
    def mla_generation(self, heads: int, kv_dtype: str) -> LogGrid | None:
        """MLA's absorbed decode kernel, `heads` query heads a GPU, over (batch, KV tokens)."""
        rows = self.chosen("generation_mla_perf", num_heads=heads, kv_cache_dtype=kv_dtype)
        if rows is None:
            return None
        return LogGrid.from_frame(rows.assign(kv_tokens=rows["step"] + 1), ("batch_size", "kv_tokens"),
                                  fill_first="kv_tokens")

    @lru_cache(maxsize=None)
    def moe(self, dtype: str, hidden: int, inter: int, topk: int, experts: int, tp: int, ep: int) -> LogGrid | None:
        """One fused-MoE layer (routing, the experts' GEMMs, the combine) over its tokens, for this
        exact expert shape and split; None where the table has no such shape."""
        for distribution in MOE_DISTRIBUTIONS:
            rows = self.chosen("moe_perf", moe_dtype=dtype, hidden_size=hidden, inter_size=inter, topk=topk,
                               num_experts=experts, moe_tp_size=tp, moe_ep_size=ep, distribution=distribution)
            if rows is not None:
                return LogGrid.from_frame(rows, ("num_tokens",))
        return None

    @lru_cache(maxsize=None)
    def all_to_all(self, backend: str, hidden: int, topk: int, experts: int, gpus: int) -> tuple[LogGrid, ...] | None:
        """DeepEP's dispatch and combine of an MoE layer (backend deepep_ll: the low-latency kernels;
        deepep_ht: the high-throughput ones) over the tokens each of `gpus` GPUs sends, for this
        hidden size, top-k and expert count; None where the table has no such shape. The table's
        times are microseconds (its transmit and notify columns)."""
        grids = []
        for phase in ("dispatch", "combine"):
            rows = self.chosen("moe_a2a_perf", comm_backend=backend, phase=phase, ep_size=gpus, hidden_size=hidden,
                               topk=topk, num_experts=experts)
            if rows is None:
                return None
            rows = rows.assign(exchange_s=(rows["transmit_us"] + rows["notify_us"]) * 1e-6)
            grids.append(LogGrid.from_frame(rows, ("num_tokens",), latency_s="exchange_s"))
        return tuple(grids)

    @lru_cache(maxsize=None)
    def all_reduce(self, gpus: int) -> LogGrid | None:
        """The engine's custom all-reduce (its CUDA-graph variant where timed) over message bytes."""
        frame = self.frame("custom_allreduce_perf")
        if frame is None:
            return None
        if "backend" in frame and frame["backend"].str.endswith("graph").any():
            frame = frame[frame["backend"].str.endswith("graph")]
        rows = frame[frame["num_gpus"] == gpus]
        if rows.empty:
            return None
        self.devices["custom_allreduce_perf"] = str(rows["device"].iloc[0])
        return LogGrid.from_frame(rows, ("message_size",))


def read_table(path: Path, name: str) -> pd.DataFrame:
    """A measured table with its latency in seconds (`latency_s`); one line of InputError where a
    column its family needs is missing."""
    frame = _read(path)
    missing = [c for c in ("device", "latency", *COLUMNS[name]) if c not in frame.columns]
    if missing:
        raise InputError(f"operator table {path.parent.name}/{path.name}",
                         f"missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return frame


@lru_cache(maxsize=16)
def _read(path: Path) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    if "latency" in frame:
        frame["latency_s"] = frame["latency"].astype(float) * 1e-3
    return frame


def held_versions(system: str, framework: str, sets: tuple[TableSet, ...] | None = None) -> list[str]:
    """The versions of `framework` the tables hold GEMMs for on `system`, oldest first."""
    sets = table_sets() if sets is None else sets
    return sorted({s.version for s in sets if s.system == system and s.framework == framework and s.family == "gemm"},
                  key=version_key)


def user_overrides(root: Path, system: str, framework: str) -> dict[str, TableSet]:
    """The tables a user's folder (laid out as the package's) holds for `system`: table -> its
    collection, the engine's own where they timed it, else the newest of another framework (their
    own engine's, `profiler calibrate`'s `live`)."""
    ranked = sorted((s for s in table_sets(root) if s.system == system),
                    key=lambda s: (s.framework == framework, version_key(s.version)))
    return {name: s for s in ranked for name in s.tables if name in COLUMNS}


def operator_tables(system: str, framework: str, version: str | None = None,
                    user_root: Path | None = None) -> OperatorTables | None:
    """The tables of `system` and `framework` at `version` (default: the package's current one,
    else the newest held), with a user's own tables from `user_root` laid over them; None where
    neither holds any for them. A named version the package lacks is bad input."""
    overrides = user_overrides(user_root, system, framework) if user_root is not None else {}
    held = held_versions(system, framework)
    if not held and not overrides:
        return None
    if version:
        if version not in held:
            raise InputError("engine.version", f"no measured operator tables of {framework} {version} on {system} "
                                               f"(held: {', '.join(held) or 'none'})")
    elif held:
        current = current_version(system, framework)
        version = current if current in held else held[-1]
    else:       # the user's tables alone: named by the collection most of them come from
        chosen = max(overrides.values(), key=lambda s: sum(t.folder == s.folder for t in overrides.values()))
        framework, version = chosen.framework, chosen.version
    sets = {s.family: s for s in table_sets() if (s.system, s.framework, s.version) == (system, framework, version)}
    return _cached_tables(system, framework, version, tuple(sorted(sets.items())),
                          tuple(sorted(overrides.items())), repo_relative(user_root) if overrides else None)


@lru_cache(maxsize=16)
def _cached_tables(system: str, framework: str, version: str, sets: tuple, overrides: tuple,
                   user_folder: str | None) -> OperatorTables:
    # One OperatorTables per GPU, framework, version and user folder, so its grids are built once per process.
    return OperatorTables(system, framework, version, dict(sets), overrides=dict(overrides), user_folder=user_folder)
