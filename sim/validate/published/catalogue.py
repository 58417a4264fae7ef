"""The published-measurement catalogue: one YAML file per source under `sources/`, and
`catalogue.yaml` beside it, which fixes the two halves (the sources engine presets and efficiency
curves may be set from, and those nothing is tuned on).

A case is one measured speedup: the setting it was measured in (model, hardware, engine, dtype,
method and its parameters, workload), the measured acceptance where the source states it, what the
speedup measures, and the number. `load_catalogue` validates every file and raises InputError with
one line naming the file, the case and the field.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError

from sim.errors import InputError
from sim.scenario.strict import Strict

METRICS = ("throughput", "end_to_end", "decode_only")
HALVES = ("fit", "held")


class Source(Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    title: str = Field(min_length=1)
    authors: str = Field(min_length=1)
    reference: str = Field(min_length=1)
    url: str = Field(pattern=r"^https?://")


class TreeParameters(Strict):
    depth: PositiveInt
    topk: PositiveInt | None = None
    # Drafted tokens verified per step, the root (last committed token) excluded: SGLang's and
    # TensorRT-LLM's num_draft_tokens count the root, so theirs is this plus one.
    tokens: PositiveInt | None = None


class Parameters(Strict):
    num_speculative_tokens: PositiveInt | None = None
    tree: TreeParameters | None = None
    draft_model: str | None = None          # a model preset
    draft_kv_budget: PositiveInt | None = None
    draft_layers: PositiveInt | None = None
    prompt_lookup_max: PositiveInt | None = None


class CaseWorkload(Strict):
    dataset: str = Field(min_length=1)
    prompt_tokens: PositiveInt | None = None
    output_tokens: PositiveInt | None = None
    # A benchmark tool's random dataset: each request's prompt and output lengths drawn uniformly
    # between range_ratio x the stated length (at least 1) and the stated length
    # (sglang.bench_serving --random-range-ratio, 0.0 unless given).
    range_ratio: float | None = Field(default=None, ge=0.0, lt=1.0)
    batch: PositiveInt | None = None
    rate_qps: PositiveFloat | None = None


class MeasuredAcceptance(Strict):
    tokens_per_step: float = Field(ge=1.0)
    convention: str = Field(min_length=1)


class Case(Strict):
    """One measured speedup. Beside what the source states, three fields say how the catalogue
    uses it: `assumed` names the fields whose values the source does not state (the catalogue's
    choice, documented in notes or catalogue.yaml's dataset lengths); `anchor: true` makes the case
    set acceptance for others (its own error is zero by construction and it is not scored);
    `acceptance_from` takes the acceptance of another case of the same source (measured there, or
    anchored) where this one states none."""
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    where: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    model: str = Field(min_length=1)
    model_repo: str | None = None
    hardware: str = Field(min_length=1)
    hardware_note: str | None = None
    gpus: PositiveInt = 1
    tensor_parallel: PositiveInt = 1
    # tensor: the model split across gpus by tensor parallelism; pipeline: consecutive layers on
    # consecutive GPUs, one at a time (Hugging Face device_map), which costs what one GPU with
    # their memory would.
    parallelism: Literal["tensor", "pipeline"] = "tensor"
    engine: Literal["vllm", "sglang", "tensorrt-llm", "hf-eager", "gpt-fast"]
    engine_version: str = "not stated"
    dtype: Literal["bf16", "fp16", "fp32", "fp8", "int4"]
    method: Literal["ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa", "streaming"]
    parameters: Parameters = Parameters()
    workload: CaseWorkload
    # How the source's harness ends a static batch (scheduler.static_end): last, when its last row
    # is done (generate-style loops); first, when one row reaches the output length, counting what
    # every row committed (loops that time a fixed number of new tokens per batch).
    static_end: Literal["last", "first"] = "last"
    temperature: NonNegativeFloat = 0.0
    acceptance: MeasuredAcceptance | None = None
    metric: Literal[METRICS]
    speedup: PositiveFloat
    speedup_note: str | None = None
    notes: str | None = None
    assumed: list[str] = []
    anchor: bool = False
    acceptance_from: str | None = None


class SourceFile(Strict):
    source: Source
    cases: list[Case] = Field(min_length=1)


class Lengths(Strict):
    prompt_tokens: PositiveInt
    output_tokens: PositiveInt
    why: str = Field(min_length=1)


class Halves(Strict):
    """catalogue.yaml: which sources form the fit half (every other source is held out) and the
    rule that chose them; the prompt and output lengths assumed per dataset where a source states
    none."""
    fit: list[str] = Field(min_length=1)
    rule: str = Field(min_length=1)
    lengths: dict[str, Lengths] = {}


@dataclass(frozen=True)
class Entry:
    """A case with its source and half."""
    case: Case
    source: Source
    half: str
    file: str


@dataclass(frozen=True)
class Catalogue:
    root: Path
    sources: tuple[Source, ...]
    entries: tuple[Entry, ...]
    halves: Halves

    def half(self, name: str) -> list[Entry]:
        return [e for e in self.entries if e.half == name]


def load_catalogue(root: Path) -> Catalogue:
    """Every source file under root/sources and root/catalogue.yaml, validated; InputError on the
    first bad entry (`FILE: case ID: field: reason`)."""
    root = Path(root)
    if not root.is_dir():
        raise InputError("--published", f"{root} is not a catalogue folder (it needs sources/ and catalogue.yaml)")
    files = sorted((root / "sources").glob("*.yaml"))
    if not files:
        raise InputError("--published", f"{root / 'sources'} holds no source files (*.yaml)")
    halves = _validated(Halves, _read(root / "catalogue.yaml"), root / "catalogue.yaml", None)
    sources, entries, seen = [], [], set()
    for path in files:
        parsed = _read(path)
        if not isinstance(parsed, dict):
            raise InputError(_name(path), "must hold a mapping with source and cases")
        source_file = _validated(SourceFile, parsed, path, parsed)
        source = source_file.source
        if source.id != path.stem:
            raise InputError(f"{_name(path)}: source.id", f"{source.id!r} must equal the file name {path.stem!r}")
        if source.id in {s.id for s in sources}:
            raise InputError(f"{_name(path)}: source.id", f"{source.id!r} is given by another file")
        sources.append(source)
        for case in source_file.cases:
            if case.id in seen:
                raise InputError(f"{_name(path)}: case {case.id}", "id is used by another case")
            seen.add(case.id)
            half = "fit" if source.id in halves.fit else "held"
            entries.append(Entry(case, source, half, _name(path)))
    by_id = {e.case.id: e for e in entries}
    for e in entries:
        c = e.case
        if c.acceptance_from is not None:
            other = by_id.get(c.acceptance_from)
            if other is None or other.source.id != e.source.id:
                raise InputError(f"{e.file}: case {c.id}: acceptance_from", f"{c.acceptance_from!r} is no case of this source")
            if other.case.acceptance is None and not other.case.anchor:
                raise InputError(f"{e.file}: case {c.id}: acceptance_from",
                                 f"{c.acceptance_from} states no acceptance and is no anchor")
        if c.acceptance is None and not c.anchor and c.acceptance_from is None:
            raise InputError(f"{e.file}: case {c.id}", "states no acceptance: give anchor: true or acceptance_from")
        if c.anchor and c.acceptance is not None:
            raise InputError(f"{e.file}: case {c.id}: anchor", "a case with measured acceptance needs no anchor")
        tree = c.parameters.tree
        if tree is not None and tree.topk == 1 and (tree.tokens or 0) > tree.depth:
            raise InputError(f"{e.file}: case {c.id}: parameters.tree",
                             f"top-k 1 is a chain of {tree.depth}: it verifies at most {tree.depth} drafts, not {tree.tokens}")
        if c.tensor_parallel > c.gpus:
            raise InputError(f"{e.file}: case {c.id}: tensor_parallel", f"{c.tensor_parallel} exceeds gpus ({c.gpus})")
        w = c.workload
        if (w.batch is None) == (w.rate_qps is None):
            raise InputError(f"{e.file}: case {c.id}: workload", "give exactly one of batch and rate_qps")
        if (w.prompt_tokens is None or w.output_tokens is None) and w.dataset not in halves.lengths:
            raise InputError(f"{e.file}: case {c.id}: workload",
                             f"no prompt/output length and catalogue.yaml assumes none for dataset {w.dataset!r}")
    unknown = sorted(set(halves.fit) - {s.id for s in sources})
    if unknown:
        raise InputError(f"{_name(root / 'catalogue.yaml')}: fit", f"names no source file: {unknown[0]}")
    return Catalogue(root, tuple(sources), tuple(entries), halves)


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _read(path: Path):
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(_name(path), f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(_name(path), "not valid YAML" + (f" at line {mark.line + 1}" if mark else "")) from None


def _validated(model, mapping, path: Path, document):
    try:
        return model.model_validate(mapping)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = list(error["loc"])
        where = _name(path)
        if loc[:1] == ["cases"] and len(loc) > 1 and isinstance(loc[1], int):
            cases = (document or {}).get("cases") or []
            case = cases[loc[1]] if loc[1] < len(cases) else {}
            where += f": case {case.get('id', loc[1]) if isinstance(case, dict) else loc[1]}"
            loc = loc[2:]
        field = ".".join(str(p) for p in loc) or "entry"
        if error["type"] == "extra_forbidden":
            raise InputError(f"{where}: {field}", "unknown field") from None
        if error["type"] == "missing":
            raise InputError(f"{where}: {field}", "missing") from None
        if error["type"] == "literal_error" and loc and loc[-1] == "metric":
            raise InputError(f"{where}: {field}", f"{error['input']!r} is not one of {', '.join(METRICS)}") from None
        message = error["msg"].removeprefix("Value error, ")
        raise InputError(f"{where}: {field}", f"{message[0].lower() + message[1:]} (got {error.get('input')!r})") from None
