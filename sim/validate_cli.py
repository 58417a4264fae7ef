"""The `validate` and `fit-acceptance` commands of `python -m sim` (argument parsing in sim.cli)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from sim.errors import ScenarioError

REPO = Path(__file__).resolve().parent.parent


def validate_command(args) -> int:
    from sim.cli import write_atomic
    from sim.live_runs import read_runs
    from sim.validate import compare_runs, comparisons_frame, format_comparisons, parity_html

    if args.study is None:
        for flag, value in (("--docs", args.docs), ("--text", args.text), ("--repeats", args.repeats),
                            ("--probe", args.probe or None)):
            if value is not None:
                raise ScenarioError(flag, "applies to a study: give --study NAME")
    study = None
    if args.study is not None:
        study, run_dirs = run_study(args)
        out = args.out if args.out is not None else REPO / "validation" / study["name"]
    else:
        if not args.runs:
            raise ScenarioError("RUN_DIR", "give run folders, or --study NAME")
        run_dirs, out = args.runs, args.out
    calibration = args.calibration
    if calibration is None and study is not None and study.get("calibration"):
        calibration = REPO / study["calibration"]
    if calibration is not None:
        from sim.cost.bundle import load_bundle

        load_bundle(calibration)
    runs = read_runs(run_dirs)
    rows = compare_runs(runs, calibration, progress=True)
    text = format_comparisons(rows)
    if out is not None:
        from sim.simulate import git_revision, versions

        provenance = {"runs": [str(p) for p in run_dirs], "calibration": str(calibration) if calibration else None,
                      "study": study["name"] if study else None, "git_revision": git_revision(),
                      "versions": versions(), "live_devices": sorted({r.meta["device"] for r in runs}),
                      "live_dtypes": sorted({r.meta["dtype"] for r in runs}),
                      "live_git_revisions": sorted({str(r.meta.get("git_revision")) for r in runs}),
                      "seeds": sorted({int(r.meta.get("seed", 0)) for r in runs})}
        frame = comparisons_frame(rows)
        try:
            write_atomic(out / "validation.csv", f"# provenance: {json.dumps(provenance)}\n" + frame.to_csv(index=False))
            title = f"Predicted against measured: {study['name'] if study else len(runs)} live runs " \
                    f"({'calibrated: ' + str(calibration) if calibration else 'roofline'}), git {git_revision()[:12]}"
            write_atomic(out / "parity.html", parity_html(rows, title))
        except OSError as exc:
            raise ScenarioError("--out", f"cannot write into {out}: {exc.strerror or exc}") from None
    if args.docs is not None:
        if study is None:
            raise ScenarioError("--docs", "updates a study's table: give --study")
        update_docs(args.docs, study, rows, args, calibration)
    print(text)
    if out is not None:
        print(f"\nwrote {out / 'validation.csv'} and {out / 'parity.html'}")
    return 0


def run_study(args) -> tuple[dict, list[Path]]:
    """Run (or resume) every repeat of the study's live runs, each in a `python -m profiler study`
    process; the run folders of all repeats."""
    from profiler.study import read_study, repeat_folder

    study = read_study(args.study)
    out = args.out if args.out is not None else REPO / "validation" / study["name"]
    repeats = args.repeats if args.repeats is not None else int(study.get("repeats", 1))
    if repeats < 1:
        raise ScenarioError("--repeats", f"must be >= 1 (got {repeats})")
    folders = []
    for repeat in range(1, repeats + 1):
        command = [sys.executable, "-m", "profiler", "study", args.study, "--out", str(out), "--repeat", str(repeat)]
        if args.text is not None:
            command += ["--text", str(args.text)]
        if args.probe:
            command.append("--probe")
        done = subprocess.run(command)
        if done.returncode != 0:
            raise ScenarioError("--study", f"the study's live runs stopped (exit {done.returncode}); rerun to resume")
        folders += [repeat_folder(out, repeat) / run["name"] for run in study["runs"]]
    return study, folders


MARK = "<!-- validation:{name}:{edge} -->"


def update_docs(path: Path, study: dict, rows, args, calibration) -> None:
    """Replace the text between the study's markers in a Markdown file with its tables."""
    from sim.cli import write_atomic

    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError("--docs", f"cannot read {path}: {exc.strerror or exc}") from None
    begin, end = MARK.format(name=study["name"], edge="begin"), MARK.format(name=study["name"], edge="end")
    if begin not in text or end not in text:
        raise ScenarioError("--docs", f"{path} has no {begin} ... {end} markers")
    command = f"python -m sim validate --study {args.study}"
    if args.text is not None:
        command += f" --text {args.text}"
    if args.probe:
        command += " --probe"
    if args.calibration is not None:
        command += f" --calibration {args.calibration}"
    table = markdown_tables(rows, command)
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    try:
        write_atomic(path, head + begin + "\n" + table + "\n" + end + tail)
    except OSError as exc:
        raise ScenarioError("--docs", f"cannot write {path}: {exc.strerror or exc}") from None


def markdown_tables(rows, command: str) -> str:
    from sim.validate import AT_PROBE, PREDICTIONS, aggregate

    pct = lambda x: "" if x is None else f"{x:+.1%}"
    by_run: dict[str, dict] = {}
    for r in rows:
        by_run.setdefault(r.run, {})[r.prediction] = r
    # Runs recorded with --probe add the throughput error at the machine's measured speed.
    probed = any(r.prediction.endswith(AT_PROBE) for r in rows)
    probe_head, probe_rule = ("error at the probe's speed | ", "---|") if probed else ("", "")
    lines = [f"Reproduce: `{command}`", "",
             "| run | drafter | batch | context | tok/s measured | repeats spread | predicted (replay / fitted) | error | "
             f"{probe_head}speedup measured | predicted (replay / fitted) | error | tokens/step measured | fitted |",
             f"|---|---|---|---|---|---|---|---|{probe_rule}---|---|---|---|---|"]
    for name, preds in by_run.items():
        first = next(iter(preds.values()))
        order = [preds[p] for p in PREDICTIONS if p in preds]
        tok = " / ".join(f"{r.predicted_tok_s:.2f}" for r in order)
        tok_err = " / ".join(pct(r.error("tok_s")) for r in order)
        if probed:
            at_probe = [preds[f"{p} {AT_PROBE}"] for p in PREDICTIONS if f"{p} {AT_PROBE}" in preds]
            tok_err += " | " + " / ".join(pct(r.error("tok_s")) for r in at_probe)
        if first.measured_speedup is not None:
            speed = " / ".join(f"{r.predicted_speedup:.3f}" for r in order)
            speed_err = " / ".join(pct(r.error("speedup")) for r in order)
            measured_speed = f"{first.measured_speedup:.3f}"
        else:
            speed = speed_err = measured_speed = ""
        fitted = preds.get("fitted")
        tps = f"{fitted.predicted_tokens_per_step:.2f}" if fitted else ""
        lines.append(f"| {name} | {first.drafter} | {first.batch} | {first.context:.0f} | {first.measured_tok_s:.2f} | "
                     f"{first.measured_spread:.0%} ({first.repeats}) | {tok} | {tok_err} | {measured_speed} | {speed} | {speed_err} | "
                     f"{first.measured_tokens_per_step:.2f} | {tps} |")
    lines += ["", "| prediction | metric | runs | median | P90 | worst |", "|---|---|---|---|---|---|"]
    for a in aggregate(rows):
        lines.append(f"| {a['prediction']} | {a['metric']} | {a['runs']} | {a['median']:.1%} | {a['p90']:.1%} | "
                     f"{a['worst']:.1%} |")
    return "\n".join(lines)


def plain(value):
    """numpy scalars as Python numbers, so the YAML holds only plain types."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def fit_acceptance_command(args) -> int:
    from sim.cli import write_atomic
    from sim.fit_acceptance import disagreement_from_runs, fit_drafters, read_vllm_metrics
    from sim.live_runs import read_runs
    from sim.simulate import git_revision

    if not args.runs and not args.vllm:
        raise ScenarioError("RUN_DIR", "give live run folders and/or --vllm FILE")
    runs = read_runs(args.runs)
    drafters = fit_drafters(runs)
    for path in args.vllm:
        drafters[f"vllm {path.name}"] = read_vllm_metrics(path)
    if not drafters:
        raise ScenarioError("RUN_DIR", "no speculative run among them (method none has no acceptance)")
    disagreement, observations = disagreement_from_runs([r for r in runs if r.partial], runs)
    document = {
        "provenance": {"runs": [str(p) for p in args.runs], "vllm": [str(p) for p in args.vllm],
                       "git_revision": git_revision(), "live_devices": sorted({r.meta["device"] for r in runs}),
                       "seeds": sorted({int(r.meta.get("seed", 0)) for r in runs})},
        "drafters": drafters}
    if observations:
        document["partial_verify"] = {"disagreement": disagreement, "observations": observations}
    try:
        write_atomic(args.out, yaml.safe_dump(plain(document), sort_keys=False, width=110))
    except OSError as exc:
        raise ScenarioError("--out", f"cannot write {args.out}: {exc.strerror or exc}") from None
    for label, fit in drafters.items():
        rates = ", ".join(f"{r:.3f}" for r in fit["acceptance"]["per_position"])
        print(f"{label:<32} {fit['steps']:>6} steps  tokens/step {fit['tokens_per_step']}  rates [{rates}]  "
              f"spread {fit['acceptance']['request_spread']}  slope {fit['acceptance']['context_slope']}")
    if observations:
        for o in observations:
            rate = "-" if o["rate"] is None else f"{o['rate']:.4f}"
            print(f"  SpecPV {o['run']:<30} budget {o['budget']:>5} period {o['period']:>3} context {o['context']:>7.0f} "
                  f"{o['failures']:>3}/{o['trials']:<5} disagree per token {rate} ({o['source']})")
        print(f"  disagreement fit: {disagreement}")
    print(f"wrote {args.out}")
    return 0
