"""`python -m profiler campaign NAME|FILE --out DIR`: the live runs of a validation campaign.

A campaign is a YAML file (profiler/campaigns/NAME.yaml): a `name`, optionally the `calibration`
bundle its runs are predicted with and how many `repeats`, `defaults`, and a list of `runs`, each
a mapping of LiveConfig fields and a `name`. Every run of every repeat is checked before the first
starts; they run in this process, which loads the model once, each written to DIR/NAME (repeat 1)
or DIR/repeats/N/NAME exactly as `profiler live --out` writes it. Runs share what they can
(profiler/live/shared.py): the target, draft-cost models, synthetic records and launch counts, and
one KV cache size for the runs of a batch, so its CUDA graphs are captured once. Even repeats run
in reverse order, so a slow spell of the machine does not hit the same runs every time. A run
whose folder exists is skipped, so an interrupted campaign resumes where it stopped. A run that
fails is recorded with its error and the others still run; the command then names the failed runs
and exits non-zero. Each repeat folder's campaign.json records the campaign, each run's wall time
and each failure (sim/formats/campaign.py); `sim validate DIR` predicts them all.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from profiler.live.config import LiveConfig, check_config
from profiler.live.shared import SharedAcrossRuns
from sim.errors import InputError
from sim.formats.campaign import failures, repeat_folder, wall_times, write_record

CAMPAIGNS = Path(__file__).resolve().parent / "campaigns"


@dataclass(frozen=True)
class CampaignConfig:
    campaign: str                   # a campaign's name (profiler/campaigns) or a YAML file
    out: Path                       # the campaign folder (resumed when it exists)
    text: Path | None = None        # the plain text long-context prompts are cut from
    prompts: Path | None = None     # the JSONL chat prompts of the runs that say `prompts: FILE`
    repeats: int | None = None      # None: the campaign's own `repeats` (default 1)
    only: tuple[str, ...] | None = None   # run only these runs
    probe: bool = False             # every run with the machine probe, whatever the campaign says


def campaign_names() -> list[str]:
    return sorted(p.stem for p in CAMPAIGNS.glob("*.yaml"))


def read_campaign(name_or_path: str) -> dict:
    """The campaign's mapping: name, path, defaults, runs (each with a unique `name`)."""
    import yaml

    path = Path(name_or_path)
    if not path.suffix:
        path = CAMPAIGNS / f"{name_or_path}.yaml"
        if not path.exists():
            raise InputError("CAMPAIGN", f"no campaign named {name_or_path} (known: {', '.join(campaign_names())})")
    try:
        campaign = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError("CAMPAIGN", f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError:
        raise InputError("CAMPAIGN", f"{path} is not YAML") from None
    if not isinstance(campaign, dict) or not isinstance(campaign.get("runs"), list) or not campaign["runs"]:
        raise InputError("CAMPAIGN", f"{path} has no `runs` list")
    names = [run.get("name") if isinstance(run, dict) else None for run in campaign["runs"]]
    if not all(isinstance(n, str) and n for n in names):
        raise InputError("CAMPAIGN", f"{path}: every run needs a `name`")
    if len(set(names)) != len(names):
        raise InputError("CAMPAIGN", f"{path}: run names repeat")
    campaign.setdefault("name", path.stem)
    campaign["path"] = path
    return campaign


# A campaign's run that takes its chat prompts from the file given to the command says so with this
# value (the data is the user's, by path; a campaign names no machine's file).
PROMPTS_BY_PATH = "FILE"


def run_settings(run: dict, defaults: dict, text: Path | None, out: Path, prompts: Path | None = None) -> LiveConfig:
    """One campaign run's LiveConfig: the campaign's defaults, the run's own fields, its folder."""
    options = {**(defaults or {}), **{k: v for k, v in run.items() if k != "name"}}
    if options.get("prompts") == PROMPTS_BY_PATH:
        if prompts is None:
            raise InputError("--prompts", f"run {run['name']} takes its chat prompts by path: give --prompts FILE "
                                             f"(JSONL, e.g. ../shared/data/spec_bench_questions.jsonl)")
        options["prompts"] = prompts
    if "context" in options:
        if text is None:
            raise InputError("--text", f"run {run['name']} builds {options['context']}-token prompts: give --text FILE "
                                          f"(a long plain text, e.g. ../shared/data/pride_and_prejudice.txt)")
        options["text"] = text
    try:
        return LiveConfig(**options, out=out)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise InputError("CAMPAIGN", f"run {run['name']}: {field}: {error['msg']}") from None


def plan_runs(campaign: dict, config: CampaignConfig, repeats: int) -> list[tuple[int, str, LiveConfig]]:
    """(repeat, name, settings) of every run to do, each checked before any starts; even repeats
    in reverse order."""
    runs = [r for r in campaign["runs"] if config.only is None or r["name"] in config.only]
    if config.only is not None:
        unknown = sorted(set(config.only) - {r["name"] for r in runs})
        if unknown:
            raise InputError("--only", f"the campaign has no run {unknown[0]}")
    defaults = {**(campaign.get("defaults") or {}), **({"probe": True} if config.probe else {})}
    planned = []
    for repeat in range(1, repeats + 1):
        folder = repeat_folder(config.out, repeat)
        order = runs if repeat % 2 else runs[::-1]
        for run in order:
            settings = run_settings(run, defaults, config.text, folder / run["name"], config.prompts)
            if not settings.out.exists():
                check_config(settings)
            planned.append((repeat, run["name"], settings))
    return planned


def run_campaign(config: CampaignConfig) -> None:
    """Run (or resume) every repeat of the campaign, recording each repeat's campaign.json."""
    from tqdm import tqdm

    from profiler.live.run import run_live

    campaign = read_campaign(config.campaign)
    repeats = config.repeats if config.repeats is not None else int(campaign.get("repeats", 1))
    if repeats < 1:
        raise InputError("--repeats", f"must be >= 1 (got {repeats})")
    planned = plan_runs(campaign, config, repeats)
    names = [r["name"] for r in campaign["runs"]]      # the whole campaign, whatever --only ran
    wall_s = {repeat: wall_times(repeat_folder(config.out, repeat)) for repeat in range(1, repeats + 1)}

    failed = {repeat: failures(repeat_folder(config.out, repeat)) for repeat in range(1, repeats + 1)}

    def record(repeat: int) -> None:
        write_record(repeat_folder(config.out, repeat), campaign["name"], campaign["path"],
                     campaign.get("calibration"), repeat, names, wall_s[repeat], failed[repeat])

    # Every planned run sizes the caches, those a resume skips too: a resumed campaign's runs keep
    # the sizes they would have had.
    shared = SharedAcrossRuns.for_runs([s for _, _, s in planned])
    started = time.perf_counter()
    todo = [(repeat, name, s) for repeat, name, s in planned if not s.out.exists()]
    for repeat, name, settings in tqdm(todo, desc=f"campaign {campaign['name']}", unit="run"):
        t0 = time.perf_counter()
        try:
            run_live(settings, shared=shared, quiet=True)
        except Exception as exc:       # one run's failure is recorded; the campaign goes on
            failed[repeat][name] = f"{exc.__class__.__name__}: {exc}".splitlines()[0][:500]
            print(f"campaign {campaign['name']}: run {name} failed: {failed[repeat][name]}", file=sys.stderr)
        else:
            wall_s[repeat][name] = round(time.perf_counter() - t0, 2)
            failed[repeat].pop(name, None)
        record(repeat)
    for repeat in range(1, repeats + 1):
        record(repeat)
    print(f"campaign {campaign['name']}: {len(planned) - len(todo)} runs already there, {len(todo)} run in "
          f"{time.perf_counter() - started:.0f} s; folders under {config.out}")
    now_failed = sorted({name for repeat, name, _ in todo if name in failed[repeat]})
    if now_failed:
        raise InputError("CAMPAIGN", f"{len(now_failed)} of {len(todo)} runs failed ({', '.join(now_failed)}); "
                                     f"their errors are in campaign.json")
