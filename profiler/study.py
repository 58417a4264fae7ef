"""`python -m profiler study NAME|FILE --text FILE --out DIR`: the live runs of a validation study.

A study is a YAML file (profiler/studies/NAME.yaml) with `defaults` and a list of `runs`, each a
mapping of `profiler live` arguments (underscored names) and a `name`. Every run is checked before
the first one starts; they run in one process that loads the model once, each written to DIR/NAME
exactly as `profiler live --out DIR/NAME` would write it. A run whose folder exists is skipped, so
an interrupted study resumes where it stopped. DIR/study.json records the study, each run's wall
time and the total.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from sim.errors import ScenarioError

STUDIES = Path(__file__).resolve().parent / "studies"


def add_study_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="a study name (" + ", ".join(study_names()) + ") or a study YAML file")
    parser.add_argument("--text", type=Path, default=None,
                        help="plain text the long-context prompts are cut from, e.g. a public-domain novel")
    parser.add_argument("--out", type=Path, required=True, help="folder of the run folders (resumed when it exists)")
    parser.add_argument("--only", nargs="+", default=None, metavar="RUN", help="run only these runs of the study")
    parser.add_argument("--repeat", type=int, default=1,
                        help="which repeat of the study to run: 1 writes DIR/NAME, N > 1 writes DIR/repeats/N/NAME; "
                             "even repeats run in reverse order (so a slow spell of the machine does not hit the "
                             "same runs every time)")
    parser.add_argument("--probe", action="store_true",
                        help="time the machine probe before and after every run (profiler live --probe): about 7 s "
                             "a run on a 2-core CPU, so `sim validate` adds predictions at the machine's speed")


def repeat_folder(out: Path, repeat: int) -> Path:
    """Where repeat N of a study writes its run folders."""
    return out if repeat == 1 else out / "repeats" / str(repeat)


def study_names() -> list[str]:
    return sorted(p.stem for p in STUDIES.glob("*.yaml"))


def read_study(name_or_path: str) -> dict:
    """The study's mapping: name, defaults, runs (each with a unique `name`)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = STUDIES / f"{name_or_path}.yaml"
        if not path.exists():
            raise ScenarioError("STUDY", f"no study named {name_or_path} (known: {', '.join(study_names())})")
    try:
        study = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError("STUDY", f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError:
        raise ScenarioError("STUDY", f"{path} is not YAML") from None
    if not isinstance(study, dict) or not isinstance(study.get("runs"), list) or not study["runs"]:
        raise ScenarioError("STUDY", f"{path} has no `runs` list")
    names = [run.get("name") if isinstance(run, dict) else None for run in study["runs"]]
    if not all(isinstance(n, str) and n for n in names):
        raise ScenarioError("STUDY", f"{path}: every run needs a `name`")
    if len(set(names)) != len(names):
        raise ScenarioError("STUDY", f"{path}: run names repeat")
    study.setdefault("name", path.stem)
    study["path"] = str(path)
    return study


def live_argv(run: dict, defaults: dict, text: Path | None, out: Path) -> list[str]:
    """The `profiler live` command line of one study run."""
    options = {**(defaults or {}), **{k: v for k, v in run.items() if k != "name"}}
    if "context" in options:
        if text is None:
            raise ScenarioError("--text", f"run {run['name']} builds {options['context']}-token prompts: give --text FILE "
                                          f"(a long plain text, e.g. ../shared/data/pride_and_prejudice.txt)")
        options["text"] = str(text)
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv + ["--out", str(out)]


def parse_runs(study: dict, text: Path | None, out: Path, only: list[str] | None,
               probe: bool = False) -> list[tuple[str, argparse.Namespace]]:
    """Every run's parsed and checked live arguments, before any run starts (`probe`: each with
    --probe, whatever the study says)."""
    from profiler.live import add_live_arguments, check_arguments

    runs = [r for r in study["runs"] if only is None or r["name"] in only]
    if only is not None:
        unknown = sorted(set(only) - {r["name"] for r in runs})
        if unknown:
            raise ScenarioError("--only", f"the study has no run {unknown[0]}")
    defaults = {**(study.get("defaults") or {}), **({"probe": True} if probe else {})}
    parsed = []
    for run in runs:
        parser = StudyRunParser(prog=f"study run {run['name']}")
        add_live_arguments(parser)
        args = parser.parse_args(live_argv(run, defaults, text, out / run["name"]))
        if not args.out.exists():
            check_arguments(args)
        parsed.append((run["name"], args))
    return parsed


class StudyRunParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ScenarioError("STUDY", f"{self.prog}: {message}")


def study_command(args) -> int:
    from tqdm import tqdm

    from profiler.live import live_command
    from sim.cli import write_atomic

    study = read_study(args.study)
    if args.repeat < 1:
        raise ScenarioError("--repeat", f"must be >= 1 (got {args.repeat})")
    out = repeat_folder(args.out, args.repeat)
    runs = parse_runs(study, args.text, out, args.only, args.probe)
    if args.repeat % 2 == 0:
        runs = runs[::-1]
    record_path = out / "study.json"
    record = {"study": study["name"], "file": study["path"], "runs": {}}
    if record_path.exists():
        try:
            record["runs"] = json.loads(record_path.read_text()).get("runs", {})
        except (OSError, ValueError):
            pass
    models: dict = {}
    started = time.perf_counter()
    todo = [(name, a) for name, a in runs if not a.out.exists()]
    for name, run_args in tqdm(todo, desc=f"study {study['name']}", unit="run"):
        t0 = time.perf_counter()
        live_command(run_args, models=models, quiet=True)
        record["runs"][name] = {"wall_s": round(time.perf_counter() - t0, 2)}
        record["total_s"] = round(sum(r["wall_s"] for r in record["runs"].values()), 2)
        write_atomic(record_path, json.dumps(record, indent=2) + "\n")
    print(f"study {study['name']}: {len(runs) - len(todo)} runs already there, {len(todo)} run in "
          f"{time.perf_counter() - started:.0f} s; folders under {out}")
    return 0
