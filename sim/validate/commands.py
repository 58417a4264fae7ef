"""`python -m sim validate` and `python -m sim fit-acceptance` (their arguments parsed in sim/cli.py).
Both read run folders and campaign folders; neither runs anything live."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import yaml

from sim.errors import InputError
from sim.formats.files import write_atomic
from sim.formats.provenance import REPO_ROOT, git_revision, repo_relative, versions


def validate(paths: list[Path], calibration: Path | None = None, out: Path | None = None,
             docs: Path | None = None) -> int:
    """Predict every run (campaign folders expanded to their runs), print the comparison, and with
    `out` write validation.csv (provenance first) and parity.html; with `docs`, replace the table
    between the Markdown file's markers named after `out`."""
    from sim.formats.campaign import expand_run_folders, is_campaign, read_record
    from sim.validate.aggregate import format_comparisons
    from sim.validate.compare import compare_runs
    from sim.validate.parity import comparisons_frame, parity_html
    from sim.validate.runs import ServerRun, read_runs

    if docs is not None and out is None:
        raise InputError("--docs", "names its table after the --out folder: give --out")
    campaigns = [read_record(p) for p in paths if is_campaign(p)]
    run_dirs = expand_run_folders(paths)
    if calibration is None:        # a campaign's own bundle, when its campaigns agree on one
        own = {c.get("calibration") for c in campaigns}
        if len(own) == 1 and None not in own:
            calibration = REPO_ROOT / own.pop()
    if calibration is not None:
        from sim.formats.bundle import load_bundle

        load_bundle(calibration)
    runs = read_runs(run_dirs)
    server = [r for r in runs if isinstance(r, ServerRun)]
    if server:
        if len(server) != len(runs):
            raise InputError("RUN_DIR", "give server runs (profiler serve-live) and live runs to separate validations")
        return validate_server(server, paths, run_dirs, calibration, out, docs)
    rows = compare_runs(runs, calibration, progress=True)
    text = format_comparisons(rows)
    if out is not None:
        provenance = {"runs": [repo_relative(p) for p in run_dirs], "calibration": repo_relative(calibration),
                      "campaigns": sorted({c["campaign"] for c in campaigns}), "git_revision": git_revision(),
                      "versions": versions(), "live_devices": sorted({r.meta["device"] for r in runs}),
                      "live_dtypes": sorted({r.meta["dtype"] for r in runs}),
                      "live_git_revisions": sorted({str(r.meta.get("git_revision")) for r in runs}),
                      "seeds": sorted({int(r.meta.get("seed", 0)) for r in runs})}
        frame = comparisons_frame(rows)
        try:
            write_atomic(out / "validation.csv", f"# provenance: {json.dumps(provenance)}\n" + frame.to_csv(index=False))
            title = f"Predicted against measured: {out.name}, {len(runs)} live runs " \
                    f"({'calibrated: ' + repo_relative(calibration) if calibration else 'roofline'}), git {git_revision()[:12]}"
            write_atomic(out / "parity.html", parity_html(rows, title))
        except OSError as exc:
            raise InputError("--out", f"cannot write into {out}: {exc.strerror or exc}") from None
    if docs is not None:
        command = " ".join(["python -m sim validate", *(repo_relative(p) for p in paths),
                            *(["--calibration", repo_relative(calibration)] if calibration is not None else []),
                            "--out", repo_relative(out), "--docs", repo_relative(docs)])
        update_docs(docs, out.name, markdown_tables(rows, command))
    print(text)
    if out is not None:
        print(f"\nwrote {out / 'validation.csv'} and {out / 'parity.html'}")
    return 0


def validate_server(runs, paths: list[Path], run_dirs: list[Path], calibration: Path | None, out: Path | None,
                    docs: Path | None) -> int:
    """`validate` for server runs (sim/validate/server.py): the comparison printed, and with `out`
    validation.csv; with `docs`, the table between the markers named after `out`."""
    import pandas as pd

    from sim.validate.server import compare_server_runs, format_server_comparisons, same_work_spread, server_markdown

    rows = compare_server_runs(runs, calibration, progress=True)
    spread = same_work_spread(runs)
    if out is not None:
        provenance = {"runs": [repo_relative(p) for p in run_dirs], "calibration": repo_relative(calibration),
                      "git_revision": git_revision(), "versions": versions(),
                      "engines": sorted({f"{r.meta['engine']} {r.meta.get('engine_version')}" for r in runs}),
                      "live_dtypes": sorted({r.meta["dtype"] for r in runs}),
                      "live_git_revisions": sorted({str(r.meta.get("git_revision")) for r in runs}),
                      "seeds": sorted({int(r.meta.get("seed", 0)) for r in runs})}
        frame = pd.DataFrame([r.row() for r in rows])
        try:
            write_atomic(out / "validation.csv", f"# provenance: {json.dumps(provenance)}\n" + frame.to_csv(index=False))
        except OSError as exc:
            raise InputError("--out", f"cannot write into {out}: {exc.strerror or exc}") from None
    if docs is not None:
        command = " ".join(["python -m sim validate", *(repo_relative(p) for p in paths),
                            "--calibration", repo_relative(calibration), "--out", repo_relative(out),
                            "--docs", repo_relative(docs)])
        update_docs(docs, out.name, server_markdown(rows, command, spread))
    print(format_server_comparisons(rows, spread))
    if out is not None:
        print(f"\nwrote {out / 'validation.csv'}")
    return 0


def validate_published(catalogue: Path, out: Path | None = None, docs: Path | None = None,
                       scenarios: Path | None = None, cost: str = "auto") -> int:
    """Predict every case of the published catalogue, print the halves' errors, write errors.csv
    and parity.html into `out` (default: the catalogue folder) and, with `docs`, the tables between
    the Markdown file's `validation:published` markers; with `scenarios`, each case's scenario as
    SCENARIOS/CASE.yaml (the acceptance it was predicted with), ready for `sim run`; `cost` is
    every case's scenario field (auto: the measured operator tables where they cover it)."""
    import time

    from sim.cost.operator_tables import package_provenance
    from sim.validate.published.catalogue import load_catalogue
    from sim.validate.published.predict import predict_catalogue
    from sim.validate.published.report import csv_text, markdown_tables, parity_html, predictions_frame, summarize

    started = time.perf_counter()
    loaded = load_catalogue(catalogue)
    predictions = predict_catalogue(loaded, progress=True, cost=cost)
    frame = predictions_frame(predictions)
    summary = summarize(frame)
    elapsed = time.perf_counter() - started
    out = catalogue if out is None else out
    provenance = {"catalogue": repo_relative(catalogue), "cases": len(predictions), "sources": len(loaded.sources),
                  "fit": loaded.halves.fit,
                  "cost_model": f"cost {cost}: each case's in column cost (the measured operator tables, the roofline, "
                                "or a published kernel table for the layers: column kernels)",
                  "operator_tables": package_provenance(),
                  "git_revision": git_revision(),
                  "versions": versions(), "seed": 0}
    title = (f"Published GPU measurements: {len(predictions)} cases from {len(loaded.sources)} sources, "
             f"cost {cost} (measured operator tables, roofline and published kernels), "
             f"git {git_revision()[:12]}")
    try:
        write_atomic(out / "errors.csv", csv_text(frame, provenance))
        write_atomic(out / "parity.html", parity_html(frame, title))
    except OSError as exc:
        raise InputError("--out", f"cannot write into {out}: {exc.strerror or exc}") from None
    command = " ".join(["python -m sim validate --published", repo_relative(catalogue),
                        *(["--out", repo_relative(out)] if out != catalogue else []),
                        *(["--docs", repo_relative(docs)] if docs is not None else []),
                        *(["--cost", cost] if cost != "auto" else [])])
    if docs is not None:
        update_docs(docs, "published", markdown_tables(frame, summary, command))
    if scenarios is not None:
        write_case_scenarios(scenarios, loaded, predictions, cost)
    for half, s in summary.items():
        print(f"{half:>4}: {s['cases']} cases from {s['sources']} sources ({s['anchors']} anchors): median |error| "
              f"{s['median_abs_error']:.1%}, P90 {s['p90_abs_error']:.1%}, worst {s['worst_abs_error']:.1%}; "
              f"{len(s['wrong_side'])} of {s['decisive']} on the wrong side of 1")
    print(f"{len(predictions)} cases in {elapsed:.1f} s (slowest {max(p.seconds for p in predictions):.2f} s); "
          f"wrote {out / 'errors.csv'} and {out / 'parity.html'}")
    return 0


def validate_deployments(folder: Path, out: Path | None = None, docs: Path | None = None) -> int:
    """Predict every published large deployment (sim/validate/deployments.py), print their errors,
    write errors.csv into `out` (default: the folder) and, with `docs`, the table between the
    Markdown file's `validation:deployments` markers."""
    import time

    from sim.cost.operator_tables import package_provenance
    from sim.validate.deployments import deployments_markdown, load_deployments, predict_deployments

    started = time.perf_counter()
    cases = load_deployments(folder)
    frame = predict_deployments(cases, progress=True)
    out = folder if out is None else out
    provenance = {"catalogue": repo_relative(folder), "cases": len(frame), "operator_tables": package_provenance(),
                  "git_revision": git_revision(), "versions": versions(), "seed": 0}
    try:
        write_atomic(out / "errors.csv", f"# provenance: {json.dumps(provenance)}\n"
                    + frame.drop(columns="seconds").to_csv(index=False))
    except OSError as exc:
        raise InputError("--out", f"cannot write into {out}: {exc.strerror or exc}") from None
    command = " ".join(["python -m sim validate --deployments", repo_relative(folder),
                        *(["--out", repo_relative(out)] if out != folder else []),
                        *(["--docs", repo_relative(docs)] if docs is not None else [])])
    if docs is not None:
        update_docs(docs, "deployments", deployments_markdown(frame, command))
    errors = frame.error.abs()
    for r in frame.itertuples():
        print(f"{r.case:<42} measured {r.measured:>10,.1f}  predicted {r.predicted:>10,.1f}  {r.error:+.1%}")
    print(f"held: {len(frame)} cases: median |error| {errors.median():.1%}, P90 {errors.quantile(0.9):.1%}; "
          f"{time.perf_counter() - started:.1f} s; wrote {out / 'errors.csv'}")
    return 0


def fit_published(catalogue: Path) -> int:
    """Search the presets' non-datasheet settings on the catalogue's fit half and print them beside
    the presets' own values (sim/validate/published/fit.py)."""
    import time

    from sim.validate.published.catalogue import load_catalogue
    from sim.validate.published.fit import KNOBS, fit_settings

    started = time.perf_counter()
    result = fit_settings(load_catalogue(catalogue))
    rounds = f"{result.rounds} round{'s' if result.rounds != 1 else ''}"
    print(f"\nfitted on the fit half in {rounds}, {time.perf_counter() - started:.0f} s:")
    for knob in KNOBS:
        print(f"  {knob.name}: {result.values[knob.name]:g} (preset {knob.current():g})")
    for label, score in (("fitted", result.score), ("presets", result.presets_score)):
        print(f"fit half at the {label} values: {score}")
    return 0


def write_case_scenarios(folder: Path, catalogue, predictions, cost: str = "auto") -> None:
    """Each case's scenario mapping as FOLDER/CASE.yaml, the folder replaced whole."""
    from sim.formats.files import write_folder_atomic
    from sim.validate.published.scenarios import case_scenario

    def fill(target: Path) -> None:
        for p in predictions:
            mapping = plain(case_scenario(p.entry, catalogue, p.acceptance, cost=cost))
            if "calibration" in mapping:    # relative to the scenario's folder, as sim run resolves it
                mapping["calibration"] = os.path.relpath(mapping["calibration"], folder.resolve())
            header = f"# {p.entry.case.id} ({p.entry.source.id}, {p.entry.case.where}): measured {p.measured:g}x {p.entry.case.metric}\n"
            (target / f"{p.entry.case.id}.yaml").write_text(header + yaml.safe_dump(mapping, sort_keys=False))
    try:
        write_folder_atomic(folder, fill, replace=True)
    except OSError as exc:
        raise InputError("--scenarios", f"cannot write {folder}: {exc.strerror or exc}") from None


MARK = "<!-- validation:{name}:{edge} -->"


def update_docs(path: Path, name: str, table: str) -> None:
    """Replace the text between the markers `validation:NAME:begin` and `...:end` of a Markdown file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError("--docs", f"cannot read {path}: {exc.strerror or exc}") from None
    begin, end = MARK.format(name=name, edge="begin"), MARK.format(name=name, edge="end")
    if begin not in text or end not in text:
        raise InputError("--docs", f"{path} has no {begin} ... {end} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    try:
        write_atomic(path, head + begin + "\n" + table + "\n" + end + tail)
    except OSError as exc:
        raise InputError("--docs", f"cannot write {path}: {exc.strerror or exc}") from None


def markdown_tables(rows, command: str) -> str:
    from sim.validate.aggregate import aggregate
    from sim.validate.compare import AT_PROBE, METRICS, PREDICTIONS

    pct = lambda x: "" if x is None else f"{x:+.1%}"
    ms = lambda x: "" if math.isnan(x) else f"{x:.0f}"
    by_run: dict[str, dict] = {}
    for r in rows:
        by_run.setdefault(r.run, {})[r.prediction] = r
    # Runs recorded with --probe add the throughput error at the machine's measured speed.
    probed = any(r.prediction.endswith(AT_PROBE) for r in rows)
    probe_head, probe_rule = ("error at the probe's speed | ", "---|") if probed else ("", "")
    # Runs served continuously add their median request's latencies.
    served = any(not math.isnan(r.measured_ttft_p50_ms) for r in rows)
    served_head, served_rule = (" TTFT p50 ms measured | error | TPOT p50 ms measured | error |", "---|" * 4) if served else ("", "")
    lines = [f"Reproduce: `{command}`", "",
             "| run | drafter | batch | context | tok/s measured | repeats spread | predicted (replay / fitted) | error | "
             f"{probe_head}speedup measured | predicted (replay / fitted) | error | tokens/step measured | fitted |{served_head}",
             f"|---|---|---|---|---|---|---|---|{probe_rule}---|---|---|---|---|{served_rule}"]
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
        latency = ""
        if served:
            latency = "".join(f" {ms(getattr(first, f'measured_{m}'))} | " + " / ".join(pct(r.error(m)) for r in order) + " |"
                              for m in ("ttft_p50_ms", "tpot_p50_ms"))
        lines.append(f"| {name} | {first.drafter} | {first.batch} | {first.context:.0f} | {first.measured_tok_s:.2f} | "
                     f"{first.measured_spread:.0%} ({first.repeats}) | {tok} | {tok_err} | {measured_speed} | {speed} | {speed_err} | "
                     f"{first.measured_tokens_per_step:.2f} | {tps} |{latency}")
    # The aggregate, one row per prediction: each metric's |error| as median (P90, worst) over its runs.
    summary = aggregate(rows)
    metrics = [m for m in (*METRICS, "share") if any(a["metric"] == m for a in summary)]
    caption = "|error| by prediction: median (P90, worst) over the runs"
    if served:
        caption += ("; p50 TTFT and TPOT over the open-loop (Poisson or trace) runs only; `repeats`: each repeat "
                    "against the median of the others, the measurement's own error")
    lines += ["", caption, "",
              "| prediction | runs | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for prediction in dict.fromkeys(a["prediction"] for a in summary):
        mine = {a["metric"]: a for a in summary if a["prediction"] == prediction}
        cells = [f"{m['median']:.1%} ({m['p90']:.1%}, {m['worst']:.1%})" if (m := mine.get(metric)) else ""
                 for metric in metrics]
        runs = "/".join(dict.fromkeys(str(a["runs"]) for a in mine.values()))
        lines.append(f"| {prediction} | {runs} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plain(value):
    """numpy scalars as Python numbers, so the YAML holds only plain types."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def fit_acceptance(paths: list[Path], vllm: list[Path], out: Path) -> int:
    """Fit each drafter's acceptance (and SpecPV's disagreement) on live runs or vLLM's counters and
    write it as a scenario's acceptance block."""
    from sim.formats.campaign import expand_run_folders
    from sim.validate.fit_acceptance import disagreement_from_runs, fit_drafters, read_vllm_metrics
    from sim.validate.runs import read_runs

    if not paths and not vllm:
        raise InputError("RUN_DIR", "give live run folders and/or --vllm FILE")
    run_dirs = expand_run_folders(paths)
    runs = read_runs(run_dirs)
    drafters = fit_drafters(runs)
    for path in vllm:
        drafters[f"vllm {path.name}"] = read_vllm_metrics(path)
    if not drafters:
        raise InputError("RUN_DIR", "no speculative run among them (method none has no acceptance)")
    disagreement, observations = disagreement_from_runs([r for r in runs if r.partial], runs)
    document = {
        "provenance": {"runs": [repo_relative(p) for p in run_dirs], "vllm": [repo_relative(p) for p in vllm],
                       "git_revision": git_revision(), "live_devices": sorted({r.meta["device"] for r in runs}),
                       "seeds": sorted({int(r.meta.get("seed", 0)) for r in runs})},
        "drafters": drafters}
    if observations:
        document["partial_verify"] = {"disagreement": disagreement, "observations": observations}
    try:
        write_atomic(out, yaml.safe_dump(plain(document), sort_keys=False, width=110))
    except OSError as exc:
        raise InputError("--out", f"cannot write {out}: {exc.strerror or exc}") from None
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
    print(f"wrote {out}")
    return 0
