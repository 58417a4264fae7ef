"""A scenario's hardware, engine and model: a preset's name, a mapping of overrides on a preset (or
every datasheet field), or a config.json path, resolved into the preset's spec; InputError naming
the field otherwise."""
from __future__ import annotations

import math
from pathlib import Path

from sim.errors import InputError
from sim.scenario.presets.engines import COLLECTIVES_LIBRARIES
from sim.scenario.presets import ENGINES, HARDWARE, MODELS, EngineSpec, HardwareSpec, ModelSpec, load_hf_config


def resolve_hardware(value: str | dict) -> HardwareSpec:
    if not isinstance(value, (str, dict)):
        raise InputError("hardware", f"must be a preset name or a mapping (got {value!r})")
    if isinstance(value, dict) and "preset" in value and not isinstance(value["preset"], str):
        raise InputError("hardware.preset", f"must be a preset name (got {value['preset']!r})")
    if isinstance(value, str):
        if value not in HARDWARE:
            raise InputError("hardware", f"unknown preset {value!r} (known: {', '.join(HARDWARE)})")
        return HARDWARE[value]
    known = set(HardwareSpec.__dataclass_fields__)
    unknown = set(value) - known - {"preset"}
    if unknown:
        raise InputError(f"hardware.{sorted(unknown)[0]}", "unknown field")
    if "preset" in value:
        base = resolve_hardware(value["preset"])
        overrides = {k: v for k, v in value.items() if k != "preset"}
        _check_positive_numbers("hardware", overrides)
        return _check_link(base.with_overrides(**overrides))
    missing = [f for f, spec in HardwareSpec.__dataclass_fields__.items()
               if f not in value and spec.default is spec.default_factory]
    missing = [f for f in missing if f not in ("name", "host_memory_gb", "link_gb_s")]
    if missing:
        raise InputError(f"hardware.{missing[0]}", "missing (give a preset or every datasheet field)")
    _check_positive_numbers("hardware", value)
    return _check_link(HardwareSpec(**{"name": "custom", **value}))


def _check_link(spec: HardwareSpec) -> HardwareSpec:
    from sim.scenario.presets.hardware import PCIE_X16_GB_S
    if spec.link_gb_s is None and spec.pcie_gen not in PCIE_X16_GB_S:
        raise InputError("hardware.pcie_gen", f"{spec.pcie_gen} is not one of {sorted(PCIE_X16_GB_S)} "
                                                 f"(or give link_gb_s)")
    return spec


def resolve_engine(value: str | dict) -> EngineSpec:
    if not isinstance(value, (str, dict)):
        raise InputError("engine", f"must be a preset name or a mapping (got {value!r})")
    if isinstance(value, dict) and not isinstance(value.get("preset", "vllm"), str):
        raise InputError("engine.preset", f"must be a preset name (got {value['preset']!r})")
    if isinstance(value, str):
        if value not in ENGINES:
            raise InputError("engine", f"unknown preset {value!r} (known: {', '.join(ENGINES)})")
        return ENGINES[value]
    known = set(EngineSpec.field_names())
    unknown = set(value) - known - {"preset"}
    if unknown:
        raise InputError(f"engine.{sorted(unknown)[0]}", "unknown field")
    base = resolve_engine(value.get("preset", "vllm"))
    overrides = {k: v for k, v in value.items() if k != "preset"}
    if overrides.get("collectives", "nccl") not in COLLECTIVES_LIBRARIES:
        raise InputError("engine.collectives", f"must be one of {', '.join(COLLECTIVES_LIBRARIES)} "
                                               f"(got {overrides['collectives']!r})")
    if "host_profile" in overrides:
        check_published_name("host_profile", overrides["host_profile"], "host")
    if "all_to_all" in overrides:
        check_published_name("all_to_all", overrides["all_to_all"], "collectives", ("dispatch", "combine"))
    if overrides.get("host_profile", base.host_profile):
        # A host table prices each step's host work: the preset's constants for it would be ignored.
        for key in ("step_overhead_s", "request_overhead_s"):
            if key in overrides:
                raise InputError(f"engine.{key}", f"has no effect beside host_profile "
                                                  f"{overrides.get('host_profile', base.host_profile)!r}, which "
                                                  f"prices each step's host work (set host_profile: '' to use it)")
    if "version" in overrides and not isinstance(overrides["version"], str):
        raise InputError("engine.version", f"must be a version string such as '0.24.0', quoted in YAML "
                                           f"(got {overrides['version']!r})")
    if not isinstance(overrides.get("two_batch_overlap", False), bool):
        raise InputError("engine.two_batch_overlap", f"must be true or false (got {overrides['two_batch_overlap']!r})")
    for key, number in overrides.items():
        if key in ("name", "collectives", "host_profile", "all_to_all", "version", "two_batch_overlap"):
            continue
        if not _is_finite_number(number) or number < 0:
            raise InputError(f"engine.{key}", f"must be a non-negative number (got {number!r})")
    for key in ("mem_efficiency", "compute_efficiency", "link_efficiency"):
        if key in overrides and not 0 < overrides[key] <= 1:
            raise InputError(f"engine.{key}", f"must be in (0, 1] (got {overrides[key]})")
    if overrides.get("int4_mem_efficiency", 0) > 1:
        raise InputError("engine.int4_mem_efficiency", f"must be in [0, 1] (got {overrides['int4_mem_efficiency']})")
    return EngineSpec(**{**base.__dict__, **overrides, "name": value.get("name", f"{base.name}+custom")})


def check_published_name(field: str, name, table: str, ops: tuple[str, ...] = ()) -> None:
    """An engine field that names a published table under calibration/published: one of `table`
    kind holding every op of `ops`, or "" for none."""
    if name == "":
        return
    from sim.formats.published import PUBLISHED, load_published, published_metas

    names = sorted(published_metas(PUBLISHED, table, ops))
    what = f"{table} table" + (f" with {' and '.join(ops)}" if ops else "")
    if not isinstance(name, str) or name not in names:
        raise InputError(f"engine.{field}", f"must name a published {what} in calibration/published "
                                            f"({', '.join(names) or 'none there'}; got {name!r})")
    load_published(PUBLISHED / name)


def resolve_model(value: str, field: str) -> ModelSpec:
    if value in MODELS:
        return MODELS[value]
    path = Path(value)
    if path.suffix == ".json" or path.exists():
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise InputError(field, f"no such config.json: {path}")
        try:
            return load_hf_config(path)
        except ValueError as exc:
            raise InputError(field, str(exc)) from None
    raise InputError(field, f"unknown preset {value!r} and not a config.json path "
                               f"(known: {', '.join(MODELS)})")


# Hardware fields that may be null (gemm_corner: the plain roofline) or 0 (fp8_tflops: no FP8
# tensor cores) besides a positive number.
NULLABLE = {"gemm_corner"}
ZERO_OK = {"fp8_tflops", "network_gb_s"}


def _check_positive_numbers(prefix: str, mapping: dict) -> None:
    for key, number in mapping.items():
        if key in ("name", "interconnect") or (number is None and key in NULLABLE) or (key in ZERO_OK and _is_finite_number(number) and number == 0):
            continue
        if not _is_finite_number(number) or number <= 0:
            raise InputError(f"{prefix}.{key}", f"must be a positive number (got {number!r})")


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
