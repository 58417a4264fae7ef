"""python -m sim run SCENARIO [--set FIELD=VALUE ...] [--vary FIELD=V1,V2,...] [--json] [--out FILE]
python -m sim sweep [STUDY.yaml] [--executor local|ray] [--address ADDR] [--workers N] [--resume] [--out DIR]
python -m sim report RESULTS_DIR [--validation CSV] [--out FILE]
python -m sim capacity SCENARIO [--set FIELD=VALUE ...] [--tolerance F] [--max-rate QPS] [--json]
python -m sim recommend SCENARIO [--set FIELD=VALUE ...] [--batches B1,B2,...] [--contexts C1,...] [--max-k K] [--json]
python -m sim validate RUN_DIR|CAMPAIGN_DIR... [--calibration DIR] [--out DIR] [--docs FILE]
python -m sim validate --published [CATALOGUE] [--out DIR] [--docs FILE] [--scenarios DIR]
python -m sim validate --published [CATALOGUE] --fit
python -m sim fit-acceptance RUN_DIR|CAMPAIGN_DIR... [--vllm FILE ...] -o acceptance.yaml
python -m sim oracle POSITIONS RUN_DIR|CAMPAIGN_DIR... [--calibration DIR] [--pair A,B ...] [--docs FILE]
python -m sim tables [--gpu PRESET] [--engine NAME]
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

from sim.command_line import CommandLine
from sim.errors import InputError
from sim.formats.files import write_atomic
from sim.scenario import load_scenario, read_mapping, resolve_relative_paths
from sim.scenario.overrides import parse_value, set_field, split_assignment


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", type=Path, help="scenario YAML (docs/scenario.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field, e.g. workload.concurrency=64 (repeatable)")
    parser.add_argument("--vary", metavar="FIELD=V1,V2,...",
                        help="run once per value of one field and print a row per run")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", nargs="?", help="study YAML, or an embedded study's name (default, smoke); "
                                                  "default: the embedded default study")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="local: a process pool on this machine; ray: a Ray cluster (or a local Ray instance)")
    parser.add_argument("--address", help="with --executor ray: the cluster's address (auto, or HOST:PORT)")
    parser.add_argument("--workers", type=int, help="worker processes (default: the CPU count)")
    parser.add_argument("--resume", action="store_true", help="continue a sweep in --out, skipping finished points")
    parser.add_argument("--overwrite", action="store_true", help="discard the results already in --out and start again")
    parser.add_argument("--out", type=Path, help="output folder (default reports/STUDY_NAME)")
    parser.add_argument("--validation", type=Path, help="a validation.csv from sim validate, for the report's parity "
                                                        "plot (default: the study's `validation`, when present)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--no-baseline-reuse", action="store_true",
                        help="simulate every point's baseline afresh (same results, slower; for checking)")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, metavar="RESULTS", help="a sweep's folder or its results.parquet")
    parser.add_argument("--validation", type=Path, help="a validation.csv for the parity plot")
    parser.add_argument("--out", type=Path, help="HTML file to write (default: report.html beside the results)")


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", type=Path, help="scenario YAML with an slo block")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field (repeatable)")
    parser.add_argument("--tolerance", type=float, default=0.02,
                        help="stop when the bracket is narrower than this fraction of the rate (default 0.02)")
    parser.add_argument("--max-rate", type=float, help="highest rate to try, in requests/s")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a summary")


def add_recommend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", type=Path, help="scenario YAML with a speculation method")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field (repeatable)")
    parser.add_argument("--batches", type=_int_list("--batches"), default=None, metavar="B1,B2,...",
                        help="batch sizes (closed-loop clients) to try (default 1,2,4,...,256)")
    parser.add_argument("--contexts", type=_int_list("--contexts"), default=None, metavar="C1,C2,...",
                        help="prompt tokens to try (default: the scenario's own)")
    parser.add_argument("--max-k", type=int, default=None,
                        help="longest chain tried (default: the larger of the scenario's k and 6)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="*", metavar="RUN_DIR",
                        help="folders written by profiler live, or campaign folders written by profiler campaign "
                             "(every run of every repeat)")
    parser.add_argument("--calibration", type=Path,
                        help="calibration bundle (default: a campaign's own, else the roofline model)")
    parser.add_argument("--published", type=Path, nargs="?", const=Path("-"), metavar="CATALOGUE",
                        help="predict the published-measurement catalogue instead (default folder: "
                             "validation/published): errors.csv and parity.html, fit and held half apart")
    parser.add_argument("--scenarios", type=Path, metavar="DIR",
                        help="with --published: also write each case's scenario as DIR/CASE.yaml (for sim run)")
    parser.add_argument("--fit", action="store_true",
                        help="with --published: search the GEMM corners and speculative host times on the fit "
                             "half and print them (the presets hold the result)")
    parser.add_argument("--out", type=Path, help="write validation.csv and parity.html here (with --published: "
                                                 "errors.csv and parity.html; default the catalogue folder)")
    parser.add_argument("--docs", type=Path, help="with --out: replace the table between this Markdown file's "
                                                  "validation markers named after the --out folder")


def add_fit_acceptance_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="*", metavar="RUN_DIR",
                        help="folders written by profiler live, or campaign folders")
    parser.add_argument("--vllm", type=Path, action="append", default=[], metavar="FILE",
                        help="vLLM speculative decoding counters: a /metrics scrape or JSON lines (repeatable)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="acceptance YAML to write")


def add_oracle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("positions", type=Path, metavar="POSITIONS", help="the table written by profiler positions")
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR", help="live run folders, or campaign folders "
                                                                               "(their autoregressive runs included)")
    parser.add_argument("--calibration", type=Path, help="the bundle that prices the runs (as sim validate)")
    parser.add_argument("--pair", action="append", default=[], metavar="A,B",
                        help="drafter labels (as sim validate prints them) to combine per step, A's pricing "
                             "(repeatable)")
    parser.add_argument("--docs", type=Path, help="a markdown file whose oracle table to replace")



def add_tables_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", help="a hardware preset: its tables only")
    parser.add_argument("--engine", help="an engine preset (vllm, sglang, tensorrt-llm): its tables only")


def add_import_profile_arguments(parser: argparse.ArgumentParser) -> None:
    from sim.imports import KINDS

    parser.add_argument("kind", choices=tuple(KINDS),
                        help="the source's format: Vidur's network/*/<collective>.csv; a collective table "
                             "transcribed from a page (op, ranks, elements, dtype_bytes, ms, library); Vidur's "
                             "compute/<gpu>/<model>/mlp.csv; or Vidur's <gpu>/cpu_overheads.csv")
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE", help="the source's tables (one a collective)")
    parser.add_argument("--out", type=Path, required=True, help="the published profile's folder to write")
    parser.add_argument("--source", default="Vidur", help="who published the table")
    parser.add_argument("--repository", required=True, help="the repository or page the files come from")
    parser.add_argument("--path", required=True, help="where in it")
    parser.add_argument("--commit", required=True, help="the repository's commit (or the page's date)")
    parser.add_argument("--licence", required=True, help="the source's licence")
    parser.add_argument("--hardware", required=True, help="the hardware preset the source measured on")
    parser.add_argument("--interconnect",
                        help="collectives: the GPU-to-GPU link class, as hardware presets name it (nvlink4, nvlink3, ...)")
    parser.add_argument("--library", default="nccl",
                        help="the collectives' library: nccl, rccl, vllm-custom, sglang-custom, trtllm-custom, custom "
                             "or deepep (an all-to-all)")
    parser.add_argument("--engine", help="host tables: the engine whose iterations were timed")


# ---- the commands, in the order --help lists them ----------------------------------------------

CLI = CommandLine("python -m sim", __doc__)


@CLI.command("run", add_run_arguments)
def run_command(args: argparse.Namespace) -> int:
    """simulate one scenario and its no-speculation baseline"""
    from sim.simulate import simulate
    from sim.summary import format_rows, format_summary

    vary, out = args.vary, args.out
    mapping = scenario_with_overrides(args.scenario, args.overrides)
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
                              reuse_baselines=not args.no_baseline_reuse))


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

    result = find_capacity(scenario_with_overrides(args.scenario, args.overrides), tolerance=args.tolerance,
                           max_rate_qps=args.max_rate)
    print(json.dumps(json_safe(result)) if args.json else format_capacity(result))
    return 0


@CLI.command("recommend", add_recommend_arguments)
def recommend_command(args: argparse.Namespace) -> int:
    """the speculation to run at each load, as vLLM's and SGLang's config"""
    from sim.recommend import format_recommendation, recommend
    from sim.result import json_safe

    out = recommend(scenario_with_overrides(args.scenario, args.overrides), args.batches, args.contexts, args.max_k)
    print(json.dumps(json_safe(out)) if args.json else format_recommendation(out))
    return 0


@CLI.command("validate", add_validate_arguments)
def validate_command(args: argparse.Namespace) -> int:
    """predict profiler live runs, or the published GPU measurements, and report the error"""
    from sim.validate.commands import validate, validate_published

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
        return validate_published(catalogue, out=args.out, docs=args.docs, scenarios=args.scenarios)
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
    print(coverage_text(coverage(gpus, frameworks), package_provenance()))
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

def _int_list(flag: str):
    def parse(text: str) -> list[int]:
        try:
            return [int(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects integers separated by commas (got {text!r})") from None
    return parse


def scenario_with_overrides(path: Path, overrides: list[str]) -> dict:
    """The scenario file's mapping, its relative paths resolved, each `--set FIELD=VALUE` applied."""
    mapping = resolve_relative_paths(read_mapping(path), path.parent)
    for override in overrides:
        set_field(mapping, *split_assignment(override, "--set"))
    return mapping
