"""Published measurements of large deployments: attention data parallel with expert parallelism,
prefill and decode on separate pools, many nodes (issue 65), each case a scenario in the
simulator's own terms and the throughput its source measured.

The catalogue is a folder of YAML files, one a source (validation/deployments/*.yaml):

    source: {id, title, authors, reference, url}
    cases:
    - id: ...
      where: the section or table
      evidence: the source's sentence or table row, verbatim
      scenario: {...}         # the deployment as a scenario: its layout as the source states it
      metric: decode_tok_s_per_gpu | output_tok_s_per_gpu
      measured: 2785.25       # in the metric's unit
      assumed: [what the source does not state and the case fills in]
      notes: ...

decode_tok_s_per_gpu: output tokens a second of the decode pool's steady decoding (its iterations
without a prompt chunk), over its GPUs (a decode pool measured alone); output_tok_s_per_gpu: every
output token over the run's makespan, over every GPU of the deployment (an end-to-end benchmark).
Nothing is fitted on these cases: they are all held out. `sim validate --deployments` predicts
each and writes errors.csv and the per-case table for docs/validation-published.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import yaml
from pydantic import Field, PositiveFloat, ValidationError

from sim.errors import InputError
from sim.scenario.strict import Strict
from sim.validate.published.catalogue import Source

METRICS = ("decode_tok_s_per_gpu", "output_tok_s_per_gpu")


class DeploymentCase(Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    where: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    scenario: dict[str, Any]
    metric: Literal[METRICS]
    measured: PositiveFloat
    assumed: list[str] = []
    notes: str | None = None


class DeploymentSource(Strict):
    source: Source
    cases: list[DeploymentCase] = Field(min_length=1)


@dataclass(frozen=True)
class Deployment:
    case: DeploymentCase
    source: Source
    file: str
    scenario: Any               # the case's scenario, validated (sim/scenario/schema.py Scenario)


def load_deployments(root: Path) -> list[Deployment]:
    """Every case of every source file under `root`, each scenario validated; InputError naming the
    file, the case and the field on the first bad one."""
    from sim.scenario.load import load_scenario

    root = Path(root)
    files = sorted(root.glob("*.yaml")) if root.is_dir() else []
    if not files:
        raise InputError("--deployments", f"{root} holds no source files (*.yaml)")
    found, seen = [], set()
    for path in files:
        name = f"{path.parent.name}/{path.name}"
        try:
            parsed = DeploymentSource.model_validate(yaml.safe_load(path.read_text()))
        except yaml.YAMLError:
            raise InputError(name, "not valid YAML") from None
        except ValidationError as exc:
            error = exc.errors()[0]
            raise InputError(f"{name}: {'.'.join(str(p) for p in error['loc'])}", error["msg"]) from None
        if parsed.source.id != path.stem:
            raise InputError(f"{name}: source.id", f"{parsed.source.id!r} must equal the file name {path.stem!r}")
        for case in parsed.cases:
            if case.id in seen:
                raise InputError(f"{name}: case {case.id}", "id is used by another case")
            seen.add(case.id)
            try:
                scenario = load_scenario(case.scenario)
            except InputError as exc:
                raise InputError(f"{name}: case {case.id}: scenario", str(exc)) from None
            found.append(Deployment(case, parsed.source, name, scenario))
    return found


def predicted_value(result, metric: str) -> float:
    """The simulated figure a case measures: its speculative run's where it speculates."""
    run = result.run
    s = result.scenario
    if metric == "decode_tok_s_per_gpu":
        return run.decode_throughput_tok_s / s.gpus
    return run.throughput_tok_s / s.deployment_gpus


def predict_deployments(deployments: list[Deployment], progress: bool = False) -> pd.DataFrame:
    """One row a case: its layout, the measured and the predicted figure, and the error."""
    import time

    from tqdm import tqdm

    from sim.simulate import simulate

    rows = []
    for d in tqdm(deployments, desc="deployments", unit="case", disable=not progress):
        started = time.perf_counter()
        c = d.case
        result = simulate(d.scenario, baseline_only=not d.scenario.speculation.enabled)
        predicted = predicted_value(result, c.metric)
        s = result.scenario
        rows.append({"case": c.id, "source": d.source.id, "half": "held", "hardware": s.hardware_spec.name,
                     "gpus": s.deployment_gpus, "layout": s.layout, "model": s.model_spec.name,
                     "engine": s.engine_spec.name, "method": s.speculation.method, "metric": c.metric,
                     "measured": c.measured, "predicted": predicted, "error": predicted / c.measured - 1.0,
                     "tokens_per_step": result.run.tokens_per_step, "cost": result.provenance["cost_model"],
                     "seconds": time.perf_counter() - started})
    return pd.DataFrame(rows)


def deployments_markdown(frame: pd.DataFrame, command: str) -> str:
    """The cases' table and their median and P90 |error| (all held out)."""
    errors = frame.error.abs()
    lines = [f"Reproduce: `{command}`", "",
             f"Held out, {len(frame)} cases from {frame.source.nunique()} sources: median |error| "
             f"{errors.median():.1%}, P90 {errors.quantile(0.9):.1%}, worst {errors.max():.1%}.", "",
             "| case | source | GPUs | layout | method | metric | measured | predicted | error | priced by |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples():
        lines.append(f"| {r.case} | {r.source} | {r.gpus}x {r.hardware} | {r.layout} | {r.method} | {r.metric} | "
                     f"{r.measured:,.1f} | {r.predicted:,.1f} | {r.error:+.1%} | {r.cost} |")
    return "\n".join(lines)
