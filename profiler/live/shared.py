"""What the live runs of one process share, so that a campaign pays for each thing once.

A lent GPU's slot has minutes for twenty-odd runs of an 8B: loading the target, building a
synthetic run's draft head (0.5 GB of random weights), recording the target's greedy continuations
and profiling a pass for the launch count are each done once per campaign, not once per run, and
each run's KV cache is sized so that every run at a batch keeps one cache and the CUDA graphs
captured on it (`room_tokens`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from profiler.live.config import LiveConfig

# Settings that change what a run's engine steps launch: all of them but these.
NOT_LAUNCH_SHAPING = frozenset({"acceptance", "out", "probe", "baseline", "check_lossless", "warmup_tokens",
                                "threads", "seed"})


def room_tokens(settings: LiveConfig) -> int:
    """KV slots a run needs past its prompt and output (profiler.engine.serving.room_past_output)."""
    from profiler.engine.partial import PartialSpec
    from profiler.engine.serving import room_past_output

    if settings.method == "none":
        return room_past_output(0, None)
    drafted = settings.tree[0] * settings.tree[1] if settings.tree is not None else settings.k
    partial = (PartialSpec(settings.budget, period=settings.period, period_unit=settings.period_unit)
               if settings.budget is not None else None)
    return room_past_output(drafted, partial)


def cache_group(settings: LiveConfig) -> tuple:
    """Runs of one group read the same prompts on the same target at the same batch: they share a KV
    cache size (the largest room any of them needs), so its graphs are captured once."""
    return (settings.model, settings.dtype, settings.seed, settings.device, settings.batch, settings.serving,
            settings.context, settings.text, settings.prompts, settings.limit, settings.per_category,
            settings.max_new_tokens, settings.tokenizer)


def draft_depth(settings: LiveConfig) -> int:
    """Tokens a step drafts in a row (a chain's k, a tree's depth): how far past its output a synthetic
    run's record must reach."""
    return settings.tree[1] if settings.tree is not None else settings.k


def group_most(runs: list[LiveConfig], of) -> dict[tuple, int]:
    """Each cache group's largest `of(settings)` among its runs."""
    most: dict[tuple, int] = {}
    for settings in runs:
        key = cache_group(settings)
        most[key] = max(most.get(key, 0), of(settings))
    return most


@dataclass
class SharedAcrossRuns:
    """Loaded targets, draft-cost models, synthetic records and launch counts, each made once."""
    models: dict = field(default_factory=dict)       # (model, dtype, seed, device) -> LoadedModel
    drafts: dict = field(default_factory=dict)       # (target key, draft shape, seed) -> Drafter | None
    records: dict = field(default_factory=dict)      # (target key, batch, cache, eos, prompts) -> (tokens, records)
    launches: dict = field(default_factory=dict)     # (target key, launch-shaping settings) -> (run, counts)
    rooms: dict = field(default_factory=dict)        # cache_group -> the most room tokens its runs need
    depths: dict = field(default_factory=dict)       # cache_group -> its synthetic runs' deepest draft

    @classmethod
    def for_runs(cls, runs: list[LiveConfig]) -> "SharedAcrossRuns":
        """What `runs` will share, sized for all of them: each cache group's room, and its synthetic
        runs' deepest draft (their records recorded once, that far past the output)."""
        synthetic = [s for s in runs if s.method == "synthetic"]
        return cls(rooms=group_most(runs, room_tokens), depths=group_most(synthetic, draft_depth))

    def room_for(self, settings: LiveConfig) -> int:
        return max(room_tokens(settings), self.rooms.get(cache_group(settings), 0))

    def depth_for(self, settings: LiveConfig) -> int:
        return max(draft_depth(settings), self.depths.get(cache_group(settings), 0))

    def records_for(self, key: tuple, prompts: list[list[int]], tokens: int, record) -> dict:
        """The recorded greedy continuations of these prompts, at least `tokens` long, from an
        earlier run of the same target, batch, cache and end-of-sequence token (one recorded longer
        begins with the shorter one: the same batch runs the same steps up to there), else
        `record(tokens)`'s."""
        key = (*key, hash(tuple(tuple(p) for p in prompts)))
        have = self.records.get(key)
        if have is None or have[0] < tokens:
            self.records[key] = (tokens, record(tokens))
        return self.records[key][1]

    def launch_counts(self, key: tuple, settings: LiveConfig, count) -> dict:
        """Launches per step of this engine shape (the settings less those that do not change what
        a step launches), counted by `count()` on the first run of the shape; `launches_counted_by`
        names that run."""
        shape = (*key, tuple(sorted((k, str(v)) for k, v in settings.model_dump().items() if k not in NOT_LAUNCH_SHAPING)))
        if shape not in self.launches:
            self.launches[shape] = (settings.out.name, count())
        run, counts = self.launches[shape]
        return {**counts, "launches_counted_by": run}
