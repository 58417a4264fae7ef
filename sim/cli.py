"""python -m sim run SCENARIO [--set FIELD=VALUE ...] [--vary FIELD=V1,V2,...] [--cost auto|measured|roofline] [--json] [--out FILE]
python -m sim sweep [STUDY.yaml] [--executor local|ray] [--address ADDR] [--workers N] [--resume] [--out DIR] [--cost C]
python -m sim report RESULTS_DIR [--validation CSV] [--out FILE]
python -m sim capacity SCENARIO [--set FIELD=VALUE ...] [--tolerance F] [--max-rate QPS] [--json]
python -m sim capacity SCENARIO --pools [--max-gpus N] [--json]
python -m sim recommend SCENARIO [--set FIELD=VALUE ...] [--batches B1,B2,...] [--contexts C1,...] [--max-k K] [--json]
python -m sim validate RUN_DIR|CAMPAIGN_DIR... [--calibration DIR] [--out DIR] [--docs FILE]
python -m sim validate --published [CATALOGUE] [--out DIR] [--docs FILE] [--scenarios DIR]
python -m sim validate --published [CATALOGUE] --fit
python -m sim fit-acceptance RUN_DIR|CAMPAIGN_DIR... [--vllm FILE ...] -o acceptance.yaml
python -m sim oracle POSITIONS RUN_DIR|CAMPAIGN_DIR... [--calibration DIR] [--pair A,B ...] [--docs FILE]
python -m sim tables [--gpu PRESET] [--engine NAME] [--check [--docs FILE]]
python -m sim import-profile vidur-collectives|collectives-csv|vidur-mlp|vidur-cpu-overheads FILE... --out DIR
    --repository URL --path PATH --commit SHA --licence L --hardware PRESET [--interconnect LINK]
    [--library nccl|rccl|...|deepep] [--engine NAME] [--source NAME]

run: simulates a scenario with its speculation and without (the baseline), on the same requests and
seed. --set overrides one field (dotted path, YAML value); --vary runs the scenario once per value
and prints one row each.
sweep: runs a study (a grid of scenarios; with no argument, the embedded default study) and writes
results.parquet and report.html (docs/scenario.md, "Studies").
report: rebuilds report.html from a sweep's results.parquet.
capacity: the highest Poisson request rate meeting the scenario's SLOs, with and without speculation.
recommend: per load and context, the best static k, goodput k and the oracle bound, and the best
k per batch size as vLLM's --speculative-config (num_speculative_tokens_per_batch_size) and SGLang's flags.
validate: predicts each `profiler live` run (or every run of a `profiler campaign` folder), replaying
its acceptance and with acceptance fitted on the other runs, and reports the errors; with
--published, predicts the catalogue of published GPU measurements (validation/published) instead
(docs/validation-published.md); --fit searches the presets' non-datasheet settings on its fit half alone.
fit-acceptance: per drafter, the acceptance block of a scenario fitted on live runs (or vLLM's
counters), and SpecPV's disagreement with full verification.
oracle: from live runs and their drafters' acceptance at every position (profiler positions), the
predicted speedup of the run's static k, goodput k, Oracle Proposal and Oracle Combine with a second
drafter on the same prompts.
tables: the measured operator tables aiconfigurator-core holds for each GPU preset and engine, by
version and operator family (sim/cost/operator_tables.py).
import-profile: a table others measured on GPUs (Vidur's NCCL collectives, an engine's own all-reduce or
DeepEP's all-to-all transcribed from a page, a model's layer kernels, or an engine's host work per
iteration) as a published profile under calibration/published/, its source recorded and its held-out
rows checked (calibration/README.md).

Every parser of the simulator is here, in the form both command lines share (sim/command_line.py);
below this module, functions take typed arguments.
"""
from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
from pathlib import Path

from sim.cli_arguments import (
    add_run_arguments,
    add_sweep_arguments,
    add_report_arguments,
    add_capacity_arguments,
    add_recommend_arguments,
    add_validate_arguments,
    add_fit_acceptance_arguments,
    add_oracle_arguments,
    add_tables_arguments,
    add_import_profile_arguments,
)
from sim.command_line import CommandLine
from sim.errors import InputError
from sim.formats.files import write_atomic
from sim.scenario import load_scenario, read_mapping, resolve_relative_paths
from sim.scenario.overrides import parse_value, set_field, split_assignment


# ---- the commands, in the order --help lists them ----------------------------------------------

CLI = CommandLine("python -m sim", __doc__)


@CLI.command("run", add_run_arguments)
def run_command(args: argparse.Namespace) -> int:
    """simulate one scenario and its no-speculation baseline"""
    from sim.simulate import simulate
    from sim.summary import format_rows, format_summary

    vary, out = args.vary, args.out
    mapping = scenario_with_overrides(args.scenario, args.overrides, args.cost)
    if vary is None:
        result = simulate(mapping)
        payload = result.to_dict()
        text = format_summary(result)
        for warning in result.provenance.get("warnings", []):
            print(f"warning: {warning}", file=sys.stderr)
    else:
        field, values = split_assignment(vary, "--vary")
        values = [parse_value(v) for v in values.split(",")]
        points = []
        for value in values:   # validate every point before running any
            point = copy.deepcopy(mapping)
            set_field(point, field, value)
            points.append(point)
        for point in points:
            load_scenario(point)
        results = [simulate(point) for point in points]
        payload = [{"field": field, "value": v, **r.to_dict()} for v, r in zip(values, results)]
        text = format_rows(field, values, results)
    if out is not None:
        try:
            write_atomic(out, json.dumps(payload, indent=2) + "\n")
        except OSError as exc:
            raise InputError("--out", f"cannot write {out}: {exc.strerror or exc}") from None
    print(json.dumps(payload) if args.json else text)
    return 0


@CLI.command("sweep", add_sweep_arguments)
def sweep_command(args: argparse.Namespace) -> int:
    """run a study's grid of scenarios; write results.parquet and report.html"""
    from sim.sweep.commands import SweepOptions, sweep

    return sweep(SweepOptions(study=args.study, out=args.out, executor=args.executor, address=args.address,
                              workers=args.workers, resume=args.resume, overwrite=args.overwrite,
                              validation=args.validation, quiet=args.quiet,
                              reuse_baselines=not args.no_baseline_reuse, cost=args.cost))


@CLI.command("report", add_report_arguments)
def report_command(args: argparse.Namespace) -> int:
    """rebuild report.html from a sweep's results.parquet"""
    from sim.sweep.commands import rebuild_report

    return rebuild_report(args.results, args.validation, args.out)


@CLI.command("capacity", add_capacity_arguments)
def capacity_command(args: argparse.Namespace) -> int:
    """highest Poisson request rate meeting the scenario's SLOs"""
    from sim.capacity import find_capacity, format_capacity
    from sim.result import json_safe

    if args.pools:
        from sim.capacity_pools import format_pools, size_pools

        sized = size_pools(scenario_with_overrides(args.scenario, args.overrides, args.cost), max_gpus=args.max_gpus)
        print(json.dumps(json_safe(sized)) if args.json else format_pools(sized))
        return 0
    result = find_capacity(scenario_with_overrides(args.scenario, args.overrides, args.cost), tolerance=args.tolerance,
                           max_rate_qps=args.max_rate)
    print(json.dumps(json_safe(result)) if args.json else format_capacity(result))
    return 0


@CLI.command("recommend", add_recommend_arguments)
def recommend_command(args: argparse.Namespace) -> int:
    """the speculation to run at each load, as vLLM's and SGLang's config"""
    from sim.recommend import format_recommendation, recommend
    from sim.result import json_safe

    out = recommend(scenario_with_overrides(args.scenario, args.overrides, args.cost), args.batches, args.contexts, args.max_k)
    print(json.dumps(json_safe(out)) if args.json else format_recommendation(out))
    return 0


@CLI.command("validate", add_validate_arguments)
def validate_command(args: argparse.Namespace) -> int:
    """predict profiler live runs, or the published GPU measurements, and report the error"""
    from sim.validate.commands import validate, validate_published

    if args.deployments is not None:
        if args.runs or args.calibration is not None or args.published is not None or args.fit:
            raise InputError("--deployments", "predicts the deployments' catalogue alone: give no RUN_DIR, "
                                              "--calibration, --published or --fit with it")
        from sim.formats.provenance import REPO_ROOT
        from sim.validate.commands import validate_deployments

        folder = REPO_ROOT / "validation/deployments" if args.deployments == Path("-") else args.deployments
        return validate_deployments(folder, out=args.out, docs=args.docs)
    if args.published is not None:
        if args.runs or args.calibration is not None:
            raise InputError("--published", "predicts the catalogue with the roofline model: give no RUN_DIR "
                                            "or --calibration with it")
        from sim.formats.provenance import REPO_ROOT

        catalogue = REPO_ROOT / "validation/published" if args.published == Path("-") else args.published
        if args.fit:
            if args.out is not None or args.docs is not None or args.scenarios is not None:
                raise InputError("--fit", "prints the fitted settings and writes nothing: give no --out, --docs "
                                          "or --scenarios with it")
            from sim.validate.commands import fit_published

            return fit_published(catalogue)
        return validate_published(catalogue, out=args.out, docs=args.docs, scenarios=args.scenarios,
                                  cost=args.cost or "auto")
    if args.fit:
        raise InputError("--fit", "goes with --published")
    if not args.runs:
        raise InputError("RUN_DIR", "give run or campaign folders, or --published [CATALOGUE]")
    return validate(args.runs, calibration=args.calibration, out=args.out, docs=args.docs)


@CLI.command("tables", add_tables_arguments)
def tables_command(args: argparse.Namespace) -> int:
    """the measured operator tables aiconfigurator-core holds for each GPU preset and engine"""
    from sim.cost.operator_tables import FRAMEWORKS, coverage, coverage_text, data_root, package_provenance
    from sim.scenario.presets.hardware import HARDWARE

    if data_root() is None:
        raise InputError("tables", "aiconfigurator-core is not installed (pip install -e .)")
    gpus = {name: spec.operator_tables for name, spec in HARDWARE.items() if spec.operator_tables}
    if args.gpu is not None:
        if args.gpu not in HARDWARE:
            raise InputError("--gpu", f"{args.gpu} is no hardware preset ({', '.join(HARDWARE)})")
        if args.gpu not in gpus:
            raise InputError("--gpu", f"aiconfigurator-core has no tables of {args.gpu} "
                                      f"(presets with tables: {', '.join(gpus)})")
        gpus = {args.gpu: gpus[args.gpu]}
    frameworks = FRAMEWORKS
    if args.engine is not None:
        if args.engine not in FRAMEWORKS:
            raise InputError("--engine", f"aiconfigurator-core has no tables of engine {args.engine} "
                                         f"(engines with tables: {', '.join(FRAMEWORKS)})")
        frameworks = {args.engine: FRAMEWORKS[args.engine]}
    if args.docs is not None and not args.check:
        raise InputError("--docs", "needs --check")
    if args.check:
        return check_tables_command(gpus, frameworks, args)
    print(coverage_text(coverage(gpus, frameworks), package_provenance()))
    return 0


def check_tables_command(gpus: dict[str, str], frameworks: dict[str, str], args: argparse.Namespace) -> int:
    """`sim tables --check`: the interpolation's held-out errors, printed and optionally into --docs."""
    from tqdm import tqdm

    from sim.cost.table_check import check_markdown, check_tables
    from sim.formats.provenance import repo_relative
    from sim.validate.commands import update_docs

    pairs = [(system, framework) for system in dict.fromkeys(gpus.values()) for framework in frameworks.values()]
    rows = [row for system, framework in tqdm(pairs, desc="tables", unit="engine") for row in
            check_tables(system, framework)]
    command = " ".join(["python -m sim tables --check", *(["--gpu", args.gpu] if args.gpu else []),
                        *(["--engine", args.engine] if args.engine else []),
                        *(["--docs", repo_relative(args.docs)] if args.docs is not None else [])])
    text = check_markdown(rows, command)
    if args.docs is not None:
        update_docs(args.docs, "operator-tables", text)
    print(text)
    return 0


@CLI.command("import-profile", add_import_profile_arguments)
def import_profile_command(args: argparse.Namespace) -> int:
    """a table others measured on GPUs (collectives, layer kernels or an engine's host work) as a
    published profile, with its source and its held-out check"""
    from sim.imports.command import ImportOptions, import_profile

    return import_profile(ImportOptions(kind=args.kind, files=tuple(args.files), out=args.out, source=args.source,
                                        repository=args.repository, path=args.path, commit=args.commit,
                                        licence=args.licence, hardware=args.hardware,
                                        interconnect=args.interconnect, library=args.library,
                                        engine=args.engine))


@CLI.command("oracle", add_oracle_arguments)
def oracle_command(args: argparse.Namespace) -> int:
    """static, goodput and oracle speedups of live runs, from their drafters' acceptance at every position"""
    from sim.validate.oracle import format_oracle, oracle_rows

    pairs = []
    for text in args.pair:
        first, sep, second = text.partition(",")
        if not sep or not first or not second:
            raise InputError("--pair", f"expects two drafter labels A,B (got {text!r})")
        pairs.append((first, second))
    rows = oracle_rows(args.positions, args.runs, args.calibration, pairs)
    print(format_oracle(rows))
    if args.docs is not None:
        from sim.formats.provenance import repo_relative
        from sim.validate.commands import update_docs

        command = " ".join(["python -m sim oracle", repo_relative(args.positions),
                            *(repo_relative(p) for p in args.runs),
                            *(["--calibration", repo_relative(args.calibration)] if args.calibration else []),
                            *(f"--pair {shlex.quote(a + ',' + b)}" for a, b in pairs), "--docs",
                            repo_relative(args.docs)])
        update_docs(args.docs, "oracle", f"Reproduce: `{command}`\n\n" + format_oracle(rows, markdown=True))
    return 0


@CLI.command("fit-acceptance", add_fit_acceptance_arguments)
def fit_acceptance_command(args: argparse.Namespace) -> int:
    """fit acceptance per drafter from live runs or vLLM counters"""
    from sim.validate.commands import fit_acceptance

    return fit_acceptance(args.runs, args.vllm, args.out)


def main(argv: list[str] | None = None) -> int:
    return CLI.main(argv)


# ---- helpers -------------------------------------------------------------------------------------

def scenario_with_overrides(path: Path, overrides: list[str], cost: str | None = None) -> dict:
    """The scenario file's mapping, its relative paths resolved, each `--set FIELD=VALUE` applied,
    then `--cost`."""
    mapping = resolve_relative_paths(read_mapping(path), path.parent)
    for override in overrides:
        set_field(mapping, *split_assignment(override, "--set"))
    if cost is not None:
        mapping["cost"] = cost
    return mapping
