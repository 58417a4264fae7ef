"""The field's measured operator tables: aiconfigurator-core's per-GPU, per-engine latencies.

NVIDIA's `aiconfigurator-core` (PyPI, Apache-2.0) ships operator latencies measured on H100 SXM,
H200 SXM, B200, B300, GB200, GB300, A100 SXM, L40S and RTX PRO 6000, each for vLLM, SGLang and
TensorRT-LLM at named versions, in its package folder `systems/data`:

    SYSTEM/FAMILY/FRAMEWORK/VERSION/*.parquet        (and collection_meta.yaml)

a family being GEMMs (`gemm`), context and generation attention (`attention`), MLA (`mla`,
`mla_bmm`), fused MoE (`moe`), collectives and all-to-all (`comm`), quantisation kernels
(`quantize`) and others; every row carries its framework, version and device and the operator's
axes and latency. Nothing of them is copied into this repository: they are read where the package
installed them. A GPU preset names the system its tables are filed under
(`HardwareSpec.operator_tables`); an engine preset is a framework by name (`FRAMEWORKS`). The
package marks each GPU's and framework's newest complete collection as its current version
(`current_version`). Nothing prices a step from these tables yet (issue 64): `sim tables` shows
what they cover.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version

PACKAGE = "aiconfigurator-core"
# Engine presets (sim/scenario/presets/engines.py) whose tables the package holds, by its names.
FRAMEWORKS = {"vllm": "vllm", "sglang": "sglang", "tensorrt-llm": "trtllm"}


@dataclass(frozen=True)
class TableSet:
    """One collection: an operator family's tables for one GPU, framework and version."""
    system: str
    family: str
    framework: str
    version: str
    tables: tuple[str, ...]      # the parquet files' names, without the extension
    folder: Path


def data_root() -> Path | None:
    """The package's measured data folder, or None where the package is not installed."""
    try:
        import aiconfigurator_core
    except ImportError:
        return None
    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    return root if root.is_dir() else None


@lru_cache(maxsize=4)
def table_sets(root: Path | None = None) -> tuple[TableSet, ...]:
    """Every collection under `root` (default: the package's) that holds at least one table."""
    root = root if root is not None else data_root()
    if root is None:
        return ()
    sets = []
    for folder in sorted(root.glob("*/*/*/*")):
        tables = tuple(sorted(p.stem for p in folder.glob("*.parquet")))
        if folder.is_dir() and tables:
            system, family, framework, version = folder.relative_to(root).parts
            sets.append(TableSet(system, family, framework, version, tables, folder))
    return tuple(sets)


@lru_cache(maxsize=None)
def current_version(system: str, framework: str) -> str | None:
    """The version the package's maintainers mark as this GPU's and framework's newest complete
    collection (its `current` slot), or None where it has none."""
    try:
        from aiconfigurator_core.sdk.perf_database import get_version_slots
    except ImportError:
        return None
    slots = get_version_slots(system, framework) or {}
    return slots.get("current")


def version_key(version: str) -> tuple:
    """Versions in release order (0.5.9 before 0.5.10); one that is no PEP 440 version first."""
    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)


def package_provenance() -> dict:
    """The package, its version and its licence, as every result priced from its tables records them."""
    try:
        version = metadata.version(PACKAGE)
        meta = metadata.metadata(PACKAGE)
        licence = meta["License-Expression"] or meta["License"]
    except metadata.PackageNotFoundError:
        return {"package": PACKAGE, "version": None}
    return {"package": PACKAGE, "version": version, "licence": licence}


def coverage(gpus: dict[str, str], frameworks: dict[str, str] = FRAMEWORKS) -> list[dict]:
    """One row per GPU preset, engine and version the tables hold: its operator families and
    whether it is the package's current version. gpus: preset name -> the system its tables are
    filed under."""
    by_system: dict[str, list[str]] = {}
    for preset, system in gpus.items():
        by_system.setdefault(system, []).append(preset)
    engine_of = {framework: engine for engine, framework in frameworks.items()}
    grouped: dict[tuple, list[str]] = {}
    for s in table_sets():
        if s.system in by_system and s.framework in engine_of:
            grouped.setdefault((s.system, s.framework, s.version), []).append(s.family)
    rows = []
    for (system, framework, version), families in sorted(grouped.items(), key=lambda kv: (kv[0][:2],
                                                                                         version_key(kv[0][2]))):
        current = current_version(system, framework)
        for preset in by_system[system]:
            rows.append({"gpu": preset, "system": system, "engine": engine_of[framework], "version": version,
                         "current": version == current, "families": sorted(families)})
    return rows


def coverage_text(rows: list[dict], provenance: dict) -> str:
    """`sim tables`'s printout: per GPU preset and engine, each version's operator families (the
    package's current version marked)."""
    lines = [f"{provenance['package']} {provenance['version']} ({provenance.get('licence')}): measured operator "
             f"tables by GPU preset, engine and version (* the package's current version)"]
    width = max((len(f"{r['gpu']} ({r['system']})") for r in rows), default=0)
    for r in rows:
        mark = "*" if r["current"] else " "
        lines.append(f"  {r['gpu'] + ' (' + r['system'] + ')':<{width}}  {r['engine']:<12} {r['version']:<14}{mark} "
                     f"{', '.join(r['families'])}")
    return "\n".join(lines)
