"""python -m sim run SCENARIO [--set FIELD=VALUE ...] [--vary FIELD=V1,V2,...] [--json] [--out FILE]
python -m sim validate RUN_DIR... | --study NAME --text FILE [--probe] [--calibration DIR] [--out DIR] [--docs FILE]
python -m sim fit-acceptance RUN_DIR... [--vllm FILE ...] -o acceptance.yaml
python -m sim sweep [STUDY.yaml] [--executor local|ray] [--address ADDR] [--workers N] [--resume] [--out DIR]
python -m sim report RESULTS_DIR [--validation CSV] [--out FILE]
python -m sim capacity SCENARIO [--set FIELD=VALUE ...] [--tolerance F] [--max-rate QPS] [--json]

run: simulates a scenario with its speculation and without (the baseline), on the same requests and
seed. --set overrides one field (dotted path, YAML value); --vary runs the scenario once per value
and prints one row each.
validate: predicts each `profiler live` run, replaying its acceptance and with acceptance fitted on
the other runs, and reports the errors (docs/validation.md); --study first runs a study's live runs.
fit-acceptance: per drafter, the acceptance block of a scenario fitted on live runs (or vLLM's
counters), and SpecPV's disagreement with full verification.
sweep: runs a study (a grid of scenarios; with no argument, the embedded default study) and writes
results.parquet and report.html (docs/scenario.md, "Studies").
report: rebuilds report.html from a sweep's results.parquet.
capacity: the highest Poisson request rate meeting the scenario's SLOs, with and without speculation.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

from sim.errors import ScenarioError
from sim.scenario import Scenario, load_scenario


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes are bad input too: one line, exit code 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see python -m sim {self.prog.split()[-1]} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m sim", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    run = commands.add_parser("run", help="simulate one scenario and its no-speculation baseline")
    run.add_argument("scenario", type=Path, help="scenario YAML (docs/scenario.md)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                     help="override a field, e.g. workload.concurrency=64 (repeatable)")
    run.add_argument("--vary", metavar="FIELD=V1,V2,...",
                     help="run once per value of one field and print a row per run")
    run.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    run.add_argument("--out", type=Path, help="also write the JSON to this file")
    validate = commands.add_parser("validate", help="predict profiler live runs and report the error")
    validate.add_argument("runs", type=Path, nargs="*", metavar="RUN_DIR", help="folders written by profiler live")
    validate.add_argument("--study", help="run this validation study's live runs first (profiler/studies: "
                                          "cpu-default, smoke, or a YAML file), then validate them")
    validate.add_argument("--text", type=Path, help="with --study: the long text prompts are cut from")
    validate.add_argument("--probe", action="store_true",
                          help="with --study: time the machine probe around every live run (profiler live --probe; "
                               "about 7 s a run here) and add each prediction at the machine's measured speed")
    validate.add_argument("--repeats", type=int, help="with --study: how many times to run it (default: the "
                                                      "study's `repeats`); each run is measured by its median repeat")
    validate.add_argument("--calibration", type=Path,
                          help="calibration bundle (default: the study's, else the roofline model)")
    validate.add_argument("--out", type=Path, help="write validation.csv and parity.html here (with --study: "
                                                   "also its run folders; default validation/STUDY)")
    validate.add_argument("--docs", type=Path, help="replace the study's table in this Markdown file "
                                                    "(between its validation markers)")
    fit = commands.add_parser("fit-acceptance", help="fit acceptance per drafter from live runs or vLLM counters")
    fit.add_argument("runs", type=Path, nargs="*", metavar="RUN_DIR", help="folders written by profiler live")
    fit.add_argument("--vllm", type=Path, action="append", default=[], metavar="FILE",
                     help="vLLM speculative decoding counters: a /metrics scrape or JSON lines (repeatable)")
    fit.add_argument("-o", "--out", type=Path, required=True, help="acceptance YAML to write")
    sweep = commands.add_parser("sweep", help="run a study's grid of scenarios; write results.parquet and report.html")
    sweep.add_argument("study", nargs="?", help="study YAML, or an embedded study's name (default, smoke); "
                                                 "default: the embedded default study")
    sweep.add_argument("--executor", choices=("local", "ray"), default="local",
                       help="local: a process pool on this machine; ray: a Ray cluster (or a local Ray instance)")
    sweep.add_argument("--address", help="with --executor ray: the cluster's address (auto, or HOST:PORT)")
    sweep.add_argument("--workers", type=int, help="worker processes (default: the CPU count)")
    sweep.add_argument("--resume", action="store_true", help="continue a sweep in --out, skipping finished points")
    sweep.add_argument("--overwrite", action="store_true", help="discard the results already in --out and start again")
    sweep.add_argument("--out", type=Path, help="output folder (default reports/STUDY_NAME)")
    sweep.add_argument("--validation", type=Path, help="a validation.csv from sim validate, for the report's parity "
                                                       "plot (default: the study's `validation`, when present)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.add_argument("--no-baseline-reuse", action="store_true",
                       help="simulate every point's baseline afresh (same results, slower; for checking)")
    report = commands.add_parser("report", help="rebuild report.html from a sweep's results.parquet")
    report.add_argument("results", type=Path, metavar="RESULTS", help="a sweep's folder or its results.parquet")
    report.add_argument("--validation", type=Path, help="a validation.csv for the parity plot")
    report.add_argument("--out", type=Path, help="HTML file to write (default: report.html beside the results)")
    capacity = commands.add_parser("capacity", help="highest Poisson request rate meeting the scenario's SLOs")
    capacity.add_argument("scenario", type=Path, help="scenario YAML with an slo block")
    capacity.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                          help="override a field (repeatable)")
    capacity.add_argument("--tolerance", type=float, default=0.02,
                          help="stop when the bracket is narrower than this fraction of the rate (default 0.02)")
    capacity.add_argument("--max-rate", type=float, help="highest rate to try, in requests/s")
    capacity.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return run_command(args)
        if args.command == "validate":
            from sim.validate_cli import validate_command

            return validate_command(args)
        if args.command == "fit-acceptance":
            from sim.validate_cli import fit_acceptance_command

            return fit_acceptance_command(args)
        if args.command in ("sweep", "report", "capacity"):
            from sim import sweep_cli

            return getattr(sweep_cli, f"{args.command}_command")(args)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1


def run_command(args) -> int:
    from sim.scenario import read_mapping, resolve_relative_paths
    from sim.simulate import simulate

    mapping = resolve_relative_paths(read_mapping(args.scenario), args.scenario.parent)
    for override in args.overrides:
        set_field(mapping, *split_assignment(override, "--set"))
    if args.vary is None:
        result = simulate(mapping)
        payload = result.to_dict()
        text = format_summary(result)
        for warning in result.provenance.get("warnings", []):
            print(f"warning: {warning}", file=sys.stderr)
    else:
        field, values = split_assignment(args.vary, "--vary")
        values = [parse_value(v) for v in values.split(",")]
        results = []
        for value in values:   # validate every point before running any
            point = copy.deepcopy(mapping)
            set_field(point, field, value)
            results.append(point)
        for point in results:
            load_scenario(point)
        results = [simulate(point) for point in results]
        payload = [{"field": field, "value": v, **r.to_dict()} for v, r in zip(values, results)]
        text = format_rows(field, values, results)
    if args.out is not None:
        try:
            write_atomic(args.out, json.dumps(payload, indent=2) + "\n")
        except OSError as exc:
            raise ScenarioError("--out", f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(json.dumps(payload) if args.json else text)
    return 0


def split_assignment(text: str, flag: str) -> tuple[str, str]:
    field, sep, value = text.partition("=")
    if not sep or not field:
        raise ScenarioError(flag, f"expected FIELD=VALUE, got {text!r}")
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
            raise ScenarioError(dotted, f"{key} is not a mapping")
        node = child
    node[leaf] = parse_value(value) if isinstance(value, str) else value


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        # mkstemp makes the file private: give it the mode of the file it replaces, or the umask's.
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def format_summary(result) -> str:
    s = result.scenario
    run, base = result.run, result.baseline
    spec = s.speculation
    method = spec.method if spec.enabled else "none"
    lines = [
        f"{s.model_spec.name} on {s.hardware_spec.name} ({s.dtype}, TP{s.tensor_parallel}, "
        f"{s.engine_spec.name if s.calibration is None else 'calibrated: ' + str(s.calibration)}), "
        f"method {method}, {len(run.ttft_s)} requests, seed {s.seed}",
        f"  throughput      {run.throughput_tok_s:10.1f} tok/s   baseline {base.throughput_tok_s:10.1f}   "
        f"speedup {result.speedup:.3f}x",
        f"  decode only     {run.decode_throughput_tok_s:10.1f} tok/s   baseline {base.decode_throughput_tok_s:10.1f}   "
        f"speedup {result.decode_speedup:.3f}x",
        f"  tokens/step     {run.tokens_per_step:10.3f}",
        "  latency (ms)         p50       p90       p99",
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        q = getattr(run, name)
        lines.append(f"    {name[:-3]:<12} {q['p50']:9.2f} {q['p90']:9.2f} {q['p99']:9.2f}")
    shares = ", ".join(f"{k} {v:.1%}" for k, v in run.time_share.items() if v >= 0.0005)
    lines.append(f"  time share      {shares}")
    mem = result.memory
    lines.append(f"  memory          {mem['resident_layers']} layers resident, {mem['offloaded_layers']} offloaded "
                 f"(baseline {mem['baseline_offloaded_layers']}); peak KV {mem['peak_kv_gb']:.2f} GB")
    if run.goodput_tok_s is not None:
        verdict = lambda m: "p90 SLO met" if m.slo_met else "p90 SLO missed"
        lines.append(f"  goodput         {run.goodput_tok_s:10.1f} tok/s   {run.slo_attainment:.1%} of requests within "
                     f"SLO, {verdict(run)} (baseline {base.goodput_tok_s:.1f} tok/s, {base.slo_attainment:.1%}, "
                     f"{verdict(base)})")
    if result.partial_verify is not None:
        pv = result.partial_verify
        lines.append(f"  partial verify  {pv['divergence_rate']:.4%} of output tokens diverge from full "
                     f"verification; {pv['rolled_back_tokens']} rolled back")
    return "\n".join(lines)


def format_rows(field: str, values: list, results: list) -> str:
    header = (f"{field:>24} {'tok/s':>10} {'baseline':>10} {'speedup':>8} {'decode':>8} {'tok/step':>8} "
              f"{'TPOT p50':>9} {'TTFT p50':>9}")
    rows = [header]
    for value, r in zip(values, results):
        rows.append(f"{str(value):>24} {r.throughput_tok_s:10.1f} {r.baseline.throughput_tok_s:10.1f} "
                    f"{r.speedup:8.3f} {r.decode_speedup:8.3f} {r.run.tokens_per_step:8.3f} "
                    f"{r.run.tpot_ms['p50']:9.2f} {r.run.ttft_ms['p50']:9.2f}")
    return "\n".join(rows)
