"""Command-line overrides of a scenario mapping: `--set workload.concurrency=64`, `--vary FIELD=V1,V2`."""
from __future__ import annotations

import yaml

from sim.errors import InputError
from sim.scenario.schema import Scenario


def split_assignment(text: str, flag: str) -> tuple[str, str]:
    field, sep, value = text.partition("=")
    if not sep or not field:
        raise InputError(flag, f"expected FIELD=VALUE, got {text!r}")
    return field, value


def parse_value(text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def set_field(mapping: dict, dotted: str, value) -> None:
    """Set a dotted field in a scenario mapping; a string value is read as YAML (numbers, lists)."""
    node = mapping
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.get(key)
        if node is mapping and key in ("hardware", "engine") and not isinstance(child, dict):
            # `--set hardware.memory_gb=40` refines the scenario's preset (or the default one).
            child = {"preset": child if child is not None else Scenario.model_fields[key].default}
            node[key] = child
        elif child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise InputError(dotted, f"{key} is not a mapping")
        node = child
    node[leaf] = parse_value(value) if isinstance(value, str) else value
