"""Loading a scenario: a YAML path, a mapping or a Scenario into a validated Scenario, paths made
relative to the scenario's folder, the first pydantic error as one line, and the cross-field checks
that need resolved presets."""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from sim.errors import InputError
from sim.scenario.engine_flags import apply_engine_flags
from sim.formats.published import is_published
from sim.scenario.presets import MODELS
from sim.scenario.schema import Scenario


def load_scenario(source: "Scenario | dict | str | Path") -> Scenario:
    """Validate a scenario from a YAML path, a mapping or a Scenario; InputError on bad input."""
    if isinstance(source, Scenario):
        scenario = source
    else:
        if isinstance(source, (str, Path)):
            mapping = resolve_relative_paths(read_mapping(source), Path(source).parent)
        else:
            mapping = source
        if isinstance(mapping, dict):
            mapping = apply_engine_flags(mapping)       # a layout in SGLang's or vLLM's flags
        try:
            scenario = Scenario.model_validate(mapping)
        except ValidationError as exc:
            raise _one_line(exc) from None
    _check_semantics(scenario)
    return scenario


def resolve_relative_paths(mapping: dict, base: Path) -> dict:
    """Files a scenario names (traces, config.json) are relative to the scenario's own folder when
    they exist there; otherwise they are left as given (relative to the working directory)."""
    def fix(node: dict, key: str, only_paths: bool = False) -> None:
        value = node.get(key) if isinstance(node, dict) else None
        if not isinstance(value, str) or Path(value).is_absolute():
            return
        if only_paths and value in MODELS:
            return
        candidate = base / value
        if candidate.exists():
            node[key] = str(candidate)

    mapping = dict(mapping)
    fix(mapping, "model", only_paths=True)
    fix(mapping, "calibration")
    fix(mapping, "operator_tables")
    for section, keys in (("workload", ("trace",)), ("speculation", ())):
        if isinstance(mapping.get(section), dict):
            mapping[section] = dict(mapping[section])
            for key in keys:
                fix(mapping[section], key)
    spec = mapping.get("speculation")
    if isinstance(spec, dict):
        for sub, key, only in (("acceptance", "trace", False), ("draft", "model", True)):
            if isinstance(spec.get(sub), dict):
                spec[sub] = dict(spec[sub])
                fix(spec[sub], key, only)
    return mapping


def read_mapping(path: str | Path) -> dict:
    """The scenario file's mapping, unvalidated; InputError when it cannot be read as one."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError("scenario", f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError("scenario", f"{path} is not valid YAML{where}") from None
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise InputError("scenario", f"{path} must hold a mapping of fields")
    return mapping


def _one_line(exc: ValidationError) -> InputError:
    """The first pydantic error as `dotted.field: reason`."""
    error = exc.errors()[0]
    # Union members add their type names to the location; keep only the scenario's own keys.
    loc = [str(part) for part in error["loc"]
           if not (isinstance(part, str) and ("[" in part or part in _TYPE_TAGS))]
    field = ".".join(loc) or "scenario"
    if error["type"] == "extra_forbidden":
        return InputError(field, "unknown field")
    message = error["msg"].removeprefix("Value error, ")
    message = message[0].lower() + message[1:]
    if error["type"] not in ("value_error", "missing") and "input" in error:
        message += f" (got {error['input']!r})"
    return InputError(field, message)


_TYPE_TAGS = {"int", "float", "str", "bool", "list", "dict", "LengthDist", "function-after", "constrained-int",
              "constrained-float", "literal", "is-instance"}


def _check_semantics(scenario: Scenario) -> None:
    """Cross-field checks that need resolved presets; each raises InputError on its field."""
    model = scenario.model_spec
    scenario.hardware_spec, scenario.engine_spec, scenario.draft_spec  # resolve now, fail early
    tp = scenario.tensor_parallel
    if scenario.calibration is not None and not is_published(scenario.calibration) and (
            scenario.gpus != 1 or scenario.disaggregation is not None):
        raise InputError("calibration", "a bundle times one device; tensor_parallel and data_parallel must be 1, "
                                        "and no disaggregation, with calibration")
    check_layout(scenario, "", tp, scenario.data_parallel, scenario.expert_parallel, scenario.redundant_experts)
    if scenario.disaggregation is not None:
        check_disaggregation(scenario)
    draft = scenario.draft_spec
    # Families pad their embeddings differently (Qwen2.5: 151936 vs 152064), so allow a little slack.
    if draft is not None and abs(draft.vocab - model.vocab) > 0.01 * model.vocab:
        raise InputError("speculation.draft.model",
                            f"{draft.name}'s vocabulary ({draft.vocab}) is not {model.name}'s ({model.vocab}); "
                            f"a draft model must share the target's tokenizer")
    spec = scenario.speculation
    if spec.method == "layerskip" and spec.draft.exit_layer >= model.layers:
        raise InputError("speculation.draft.exit_layer",
                            f"{spec.draft.exit_layer} must be below {model.name}'s {model.layers} layers")
    if scenario.calibration is not None and is_published(scenario.calibration):
        from sim.formats.published import check_kernels, load_published

        check_kernels(load_published(scenario.calibration), scenario)  # another shape, dtype or TP: fail now
    elif scenario.calibration is not None:
        from sim.formats.bundle import check_bundle, load_bundle

        check_bundle(load_bundle(scenario.calibration), scenario)     # unreadable, other model or dtype: fail now
    if scenario.operator_tables is not None:
        from sim.formats.operator_layout import user_tables_root

        user_tables_root(scenario.operator_tables)      # no such folder, or no table in it: fail now
    pv = spec.partial_verify
    if pv is not None and pv.budget % pv.block:
        raise InputError("speculation.partial_verify.budget",
                            f"{pv.budget} is not a multiple of block {pv.block}")
    if pv is not None and pv.static_tokens >= model.max_context:
        raise InputError("speculation.partial_verify.budget",
                            f"sink + budget + window {spec.partial_verify.static_tokens} is not below "
                            f"{model.name}'s maximum context {model.max_context}")
    if scenario.workload.trace is not None and not scenario.workload.trace.exists():
        raise InputError("workload.trace", f"no such file: {scenario.workload.trace}")
    if spec.policy.route is not None:
        known = scenario.workload.categories
        if known is None and scenario.workload.trace is None:
            raise InputError("speculation.policy.route", "needs request categories: workload.categories, "
                                                         "or a workload.trace with a category column")
        unknown = sorted(set(spec.policy.route) - set(known or spec.policy.route))
        if unknown:
            raise InputError("speculation.policy.route", f"category {unknown[0]!r} is not among workload.categories "
                                                         f"({', '.join(known)})")
    if spec.acceptance is not None and spec.acceptance.trace is not None and not spec.acceptance.trace.exists():
        raise InputError("speculation.acceptance.trace", f"no such file: {spec.acceptance.trace}")
    a = spec.acceptance
    if a is not None and a.request_spread and (a.rate is not None or a.per_position is not None):
        mean = a.rate if a.rate is not None else sum(a.per_position[:spec.draft_depth]) / spec.draft_depth
        if a.request_spread ** 2 >= mean * (1 - mean):
            raise InputError("speculation.acceptance.request_spread",
                                f"{a.request_spread} is too wide for a Beta with mean {mean:g} "
                                f"(needs spread^2 < mean (1 - mean))")


def check_layout(scenario: Scenario, prefix: str, tp: int, dp: int, expert_parallel: bool, redundant: int = 0) -> None:
    """A pool's parallel layout against the model and the hardware (prefix: where its fields are,
    "" for the scenario's own)."""
    model, hw = scenario.model_spec, scenario.hardware_spec
    gpus = tp * dp
    if (expert_parallel or redundant) and model.experts is None:
        raise InputError(f"{prefix}expert_parallel", f"{model.name} has no experts")
    if redundant and not expert_parallel:
        raise InputError(f"{prefix}redundant_experts", "copies experts placed whole: it needs expert_parallel: true")
    if expert_parallel and (model.experts.routed + redundant) % gpus:
        placed = f"{model.experts.routed} routed experts" + (f" and {redundant} redundant copies" if redundant else "")
        raise InputError(f"{prefix}expert_parallel", f"{gpus} GPUs (tensor_parallel x data_parallel) do not divide "
                                                     f"{model.name}'s {placed}")
    if gpus > hw.nvlink_domain and not hw.network_gb_s:
        raise InputError("hardware.network_gb_s", f"{hw.name} has no network between nodes; {gpus} GPUs "
                                                  f"(tensor_parallel x data_parallel) exceed the {hw.nvlink_domain} "
                                                  f"its interconnect joins")
    if dp > 1 and model.experts is None:
        raise InputError(f"{prefix}data_parallel", f"{model.name} has no experts: its data-parallel ranks never step "
                                                   f"together; simulate one replica at concurrency / data_parallel")
    for shaped in filter(None, (model, scenario.draft_spec)):
        if shaped.heads % tp or (shaped.kv_heads % tp and tp % shaped.kv_heads):
            raise InputError(f"{prefix}tensor_parallel", f"{tp} does not divide {shaped.name}'s {shaped.heads} heads "
                                                         f"and {shaped.kv_heads} KV heads")


def check_disaggregation(scenario: Scenario) -> None:
    """The prefill pool's layout, and the link between the pools: one the hardware has, joining
    pools it can hold."""
    d = scenario.disaggregation
    hw = scenario.hardware_spec
    if scenario.scheduler.batching != "continuous":
        raise InputError("disaggregation", "a decode pool batches continuously (scheduler.batching: continuous)")
    if d.prefill != "unlimited":
        p = d.prefill
        check_layout(scenario, "disaggregation.prefill.", p.tensor_parallel, p.data_parallel, p.expert_parallel)
    link = d.transfer.link
    if link == "network" and d.transfer.gb_s is None and not hw.network_gb_s:
        raise InputError("disaggregation.transfer.link", f"{hw.name} has no network between nodes (network_gb_s 0); "
                                                         f"use link: nvlink within {hw.nvlink_domain} GPUs, or give gb_s")
    if link == "nvlink" and scenario.deployment_gpus > hw.nvlink_domain:
        raise InputError("disaggregation.transfer.link", f"nvlink joins {hw.nvlink_domain} GPUs of {hw.name}; the pools "
                                                         f"hold {scenario.deployment_gpus} (prefill "
                                                         f"{d.prefill_gpus} + decode {scenario.gpus})")
