"""A study: many scenarios at once, as groups of a base scenario crossed with a grid and a list of
methods; `expand_points` turns it into independent, seeded points, each a scenario mapping.

    name: my-study
    slo: {ttft_ms_p90: 2000, tpot_ms_p90: 50}       # optional, applied to every point
    price_per_gpu_hour: {h100-sxm: 2.99, h200: 3.79} # optional: one number, or per hardware preset
    max_divergence: 0.01                             # lossy methods above this are never recommended
    validation: validation/cpu-default/validation.csv  # optional: parity plot in the report
    groups:
      - name: llama                                  # or put base/grid/methods at the top level
        base: {model: llama-3.1-8b, ...}             # a scenario mapping, or a scenario file
        grid:                                        # crossed: every value of every axis
          hardware: [h100-sxm, h200]
          workload.concurrency: [1, 16, 64]
          workload: [{concurrency: 1, requests: 8}, {concurrency: 64, requests: 128}]  # linked fields
        methods:
          - name: none
          - name: eagle
            set: {speculation: {method: eagle, num_speculative_tokens: 3, acceptance: {rate: 0.7}}}
            grid: {speculation.num_speculative_tokens: [2, 3, 5]}   # replaces a group axis of the same name

An axis is a dotted scenario field; a mapping value is merged into that field rather than replacing
it. Every point is validated (schema, presets, memory plan) before any runs: a bad value is named
with its field and the point's other settings.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import Field, NonNegativeFloat, PositiveFloat, ValidationError

from sim.errors import InputError
from sim.formats.provenance import REPO_ROOT, repo_relative
from sim.scenario.strict import Strict

EMBEDDED = {"default": "default.yaml", "smoke": "smoke.yaml"}


class Method(Strict):
    name: str = Field(min_length=1)
    set: dict[str, Any] = {}
    grid: dict[str, list] = {}


class Group(Strict):
    name: str = Field(min_length=1)
    base: Union[dict[str, Any], str] = {}
    grid: dict[str, list] = {}
    methods: list[Method] = Field(default=[Method(name="base")], min_length=1)
    # Skip the group (with a note) when this path is missing: a bundle that ships only with a checkout.
    requires: str | None = None


class Slo(Strict):
    ttft_ms_p90: PositiveFloat | None = None
    tpot_ms_p90: PositiveFloat | None = None


class Study(Strict):
    name: str = "study"
    slo: Slo | None = None
    price_per_gpu_hour: Union[PositiveFloat, dict[str, PositiveFloat], None] = None
    max_divergence: NonNegativeFloat = 0.01
    validation: str | None = None
    groups: list[Group] = Field(min_length=1)

    def price_for(self, hardware: str) -> float | None:
        if isinstance(self.price_per_gpu_hour, dict):
            return self.price_per_gpu_hour.get(hardware)
        return self.price_per_gpu_hour


@dataclass(frozen=True)
class Point:
    """One scenario of a study. id: a digest of the scenario mapping, stable across runs, so a
    resumed sweep recognises the points it has finished."""
    id: str
    group: str
    method: str
    scenario: dict
    labels: tuple = ()          # ((axis, value), ...): the grid values that made this point

    @property
    def key(self) -> str:
        """Points with the same key share a baseline (the scenario without its speculation)."""
        rest = {k: v for k, v in self.scenario.items() if k != "speculation"}
        return json.dumps(rest, sort_keys=True, default=str)


@dataclass
class LoadedStudy:
    study: Study
    source: str                 # the file, or "embedded:NAME"
    text: str                   # the study as written, for the report's provenance
    base_dir: Path              # relative paths in it resolve here (then the working directory)
    skipped: list[str]          # notes on groups left out (`requires` missing)


def load_study(source: str | Path | None) -> LoadedStudy:
    """A study from a YAML file, or an embedded one by name (None: the default study)."""
    name = "default" if source is None else str(source)
    if name in EMBEDDED and not Path(name).is_file():
        text = resources.files("sim.sweep.studies").joinpath(EMBEDDED[name]).read_text()
        where, base_dir = f"embedded:{name}", REPO_ROOT
    else:
        path = Path(name)
        try:
            text = path.read_text()
        except OSError as exc:
            raise InputError("study", f"cannot read {path}: {exc.strerror or exc}") from None
        where, base_dir = str(path), path.parent
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError("study", f"{where} is not valid YAML"
                                     f"{f' at line {mark.line + 1}' if mark else ''}") from None
    if not isinstance(mapping, dict):
        raise InputError("study", f"{where} must hold a mapping")
    if "groups" not in mapping and any(k in mapping for k in ("base", "grid", "methods")):
        single = {k: mapping.pop(k) for k in ("base", "grid", "methods", "requires") if k in mapping}
        mapping["groups"] = [{"name": mapping.get("name", "study"), **single}]
    try:
        study = Study.model_validate(mapping)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"]) or "study"
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        message = message.removeprefix("Value error, ")
        message = message[:1].lower() + message[1:]
        raise InputError(f"study.{field}", message) from None
    names = [g.name for g in study.groups]
    if len(set(names)) != len(names):
        raise InputError("study.groups", f"group names repeat: {names}")
    skipped = []
    for group in study.groups:
        if group.requires is not None and resolve_path(group.requires, base_dir) is None:
            skipped.append(f"group {group.name} skipped: {group.requires} not found")
    return LoadedStudy(study, where, text, base_dir, skipped)


def resolve_path(value: str, base_dir: Path) -> Path | None:
    """A path the study names: absolute, else beside the study, else under the working directory."""
    path = Path(value)
    for candidate in ([path] if path.is_absolute() else [base_dir / path, Path.cwd() / path]):
        if candidate.exists():
            return candidate
    return None


def expand_points(loaded: LoadedStudy) -> list[Point]:
    """Every point of the study, in study order: group, method, then the grid's product."""
    from sim.scenario.load import read_mapping, resolve_relative_paths

    study = loaded.study
    points, seen = [], set()
    for group in study.groups:
        if group.requires is not None and resolve_path(group.requires, loaded.base_dir) is None:
            continue
        if isinstance(group.base, str):
            path = resolve_path(group.base, loaded.base_dir)
            if path is None:
                raise InputError(f"study.groups.{group.name}.base", f"no such scenario file: {group.base}")
            base = resolve_relative_paths(read_mapping(path), path.parent)
        else:
            base = copy.deepcopy(group.base)
        if study.slo is not None:
            base["slo"] = {**study.slo.model_dump(exclude_none=True), **(base.get("slo") or {})}
        for method in group.methods:
            axes = {**group.grid, **method.grid}
            for field, values in axes.items():
                if not values:
                    raise InputError(f"study.groups.{group.name}.grid.{field}", "has no values")
            fields = list(axes)
            for values in itertools.product(*axes.values()):
                scenario = copy.deepcopy(base)
                for field, value in method.set.items():
                    assign(scenario, field, value)
                for field, value in zip(fields, values):
                    assign(scenario, field, value)
                resolve_scenario_paths(scenario, loaded.base_dir)
                digest = point_id(group.name, scenario)
                if digest in seen:   # two methods of the group that happen to produce the same scenario
                    continue
                seen.add(digest)
                points.append(Point(digest, group.name, method.name, scenario, tuple(zip(fields, values))))
    if not points:
        raise InputError("study", "has no points (every group skipped)")
    return points


def assign(scenario: dict, field: str, value) -> None:
    """Set a dotted field; a mapping is merged key by key into what is there (so linked fields can
    share an axis)."""
    from sim.scenario.overrides import set_field

    if isinstance(value, dict):
        for key, sub in value.items():
            assign(scenario, f"{field}.{key}", sub)
    else:
        set_field(scenario, field, copy.deepcopy(value))


PATH_FIELDS = ("calibration", "model", "workload.trace", "speculation.acceptance.trace", "speculation.draft.model")


def resolve_scenario_paths(scenario: dict, base_dir: Path) -> None:
    """Files a point names, made absolute: beside the study first, then the working directory. A
    model preset name stays a name. (A point's id then does not depend on where the sweep starts.)"""
    from sim.scenario.presets import MODELS

    for dotted in PATH_FIELDS:
        parent, _, leaf = dotted.rpartition(".")
        node = lookup(scenario, parent) if parent else scenario
        if not isinstance(node, dict) or not isinstance(node.get(leaf), str) or node[leaf] in MODELS:
            continue
        found = resolve_path(node[leaf], base_dir)
        if found is not None:
            node[leaf] = str(found.resolve())


def point_id(group: str, scenario: dict) -> str:
    """A digest of the point's group and scenario, its files named relative to the repository, so
    a point has the same id in every checkout."""
    portable = scenario
    for dotted in PATH_FIELDS:
        parent, _, leaf = dotted.rpartition(".")
        node = lookup(portable, parent) if parent else portable
        if isinstance(node, dict) and isinstance(node.get(leaf), str) and Path(node[leaf]).is_absolute():
            if portable is scenario:          # copied once, and only when a file is named
                portable = copy.deepcopy(scenario)
                node = lookup(portable, parent) if parent else portable
            node[leaf] = repo_relative(node[leaf])
    text = json.dumps([group, portable], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def describe(point: Point) -> str:
    """The point's group, method and grid values, for error messages."""
    values = ", ".join(f"{axis}={json.dumps(value, default=str)}" for axis, value in point.labels)
    return f"{point.group}/{point.method}" + (f" at {values}" if values else "")


def check_points(points: list[Point]) -> None:
    """Validate every point (schema, presets, memory plan) before any runs. A bad grid value fails
    the whole study with one line naming the field, the value and the point."""
    import numpy as np

    from sim.acceptance import build_acceptance
    from sim.scenario.load import load_scenario
    from sim.simulate import plan

    for point in points:
        try:
            scenario = load_scenario(point.scenario)
            requests, _ = plan(scenario)
            if scenario.speculation.enabled:      # reads an acceptance trace, checks its form
                build_acceptance(scenario, len(requests), np.random.default_rng(0))
        except InputError as exc:
            value = lookup(point.scenario, exc.field)
            shown = "" if value is _MISSING else f"={json.dumps(value, default=str)}"
            raise InputError(f"{exc.field}{shown}", f"{exc.reason} (point {describe(point)})") from None


_MISSING = object()


def lookup(mapping: dict, dotted: str):
    node: Any = mapping
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node
