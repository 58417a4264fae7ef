"""The engine's host work per iteration: its preset's constants, or a published host table the
preset names (`EngineSpec.host_profile`: calibration/published/NAME, `table: host`).

A host table times each part of an engine's iteration (scheduling, input preparation, sampling,
output processing, the driver's round trip to its workers) by batch and tensor-parallel size;
a step's host time is their sum at the step's requests (log-log between measured batches, the
smallest batch's time below it, linear above the largest) and the scenario's tensor-parallel size
(the largest measured one not above it, warned when not the scenario's own). Speculation's host
work and prompt lookup stay the preset's: the table times plain decode iterations.
"""
from __future__ import annotations

from pathlib import Path

from sim.cost.batch import DRAFT, OVERHEAD
from sim.errors import InputError
from sim.formats.provenance import repo_relative
from sim.formats.published import PUBLISHED, PublishedProfile, load_published
from sim.scenario.schema import Scenario


class RooflineHost:
    """The engine preset's host work: every step's, speculation's, and prompt lookup's."""

    def __init__(self, engine):
        self.engine = engine
        self.origin = f"engine preset {engine.name}"

    def host_draft(self, requests: int, shares: list[float], context_tokens: float | None = None) -> float:
        """Prompt-lookup drafting on the host, one lookup per request (the engine preset's time,
        whatever the context)."""
        seconds = requests * self.engine.ngram_lookup_s
        shares[DRAFT] += seconds
        return seconds

    def speculation_overhead(self, requests: int, draft_forwards: int, shares: list[float]) -> float:
        """The engine's host work of one speculative step over `requests` requests: the step's own
        (sampling, acceptance, tree bookkeeping), per request, and each draft forward's."""
        step = self.engine.speculation_step_overhead_s + requests * self.engine.speculation_request_overhead_s
        drafts = draft_forwards * self.engine.draft_forward_overhead_s
        shares[OVERHEAD] += step
        shares[DRAFT] += drafts
        return step + drafts

    def step_overhead(self, requests: int, shares: list[float], verify_tokens: int = 1) -> float:
        """The engine's host work of one iteration over `requests` requests (the preset's per step
        and per request; verify_tokens does not change it here, only in a calibrated bundle)."""
        seconds = self.engine.step_overhead_s + requests * self.engine.request_overhead_s
        shares[OVERHEAD] += seconds
        return seconds


class PublishedHost(RooflineHost):
    """Host work of each step from a published host table; speculation's and prompt lookup's from
    the engine preset (RooflineHost)."""

    def __init__(self, engine, profile: PublishedProfile, ranks: int):
        super().__init__(engine)
        self.tables = list(profile.tables.values())
        self.ranks = ranks
        self.origin = (f"published: {repo_relative(profile.path)}, {profile.meta['engine']} on "
                       f"{profile.meta['hardware']}'s host at tensor_parallel {ranks}, from {profile.source}")
        self._seconds: dict[int, float] = {}

    def step_seconds(self, requests: int) -> float:
        """Host time of one iteration over `requests` requests: the sum of the table's parts."""
        seconds = self._seconds.get(requests)
        if seconds is None:
            seconds = self._seconds[requests] = sum(t(self.ranks, max(requests, 1)) for t in self.tables)
        return seconds

    def step_overhead(self, requests: int, shares: list[float], verify_tokens: int = 1) -> float:
        """The table's host time of an iteration over `requests` requests (verify_tokens does not
        change it: the table timed decode iterations)."""
        seconds = self.step_seconds(requests)
        shares[OVERHEAD] += seconds
        return seconds


def host_for(scenario: Scenario, folder: Path = PUBLISHED) -> tuple[RooflineHost, list[str]]:
    """The scenario's host pricer (its engine preset's constants, or the host table the preset
    names) and the warnings it comes with."""
    engine = scenario.engine_spec
    if not engine.host_profile:
        return RooflineHost(engine), []
    profile = load_published(folder / engine.host_profile)
    # The tensor-parallel sizes every part was measured at.
    measured = sorted(set.intersection(*({int(r) for r in t.axes[0]} for t in profile.tables.values())))
    if not measured:
        raise InputError("engine.host_profile", f"{engine.host_profile}'s parts share no tensor-parallel size")
    tp = scenario.tensor_parallel
    ranks = max([r for r in measured if r <= tp], default=measured[0])
    warnings = [] if ranks == tp else [f"host work of tensor_parallel {tp} priced at {ranks}, the nearest size "
                                       f"{engine.host_profile} measured ({measured})"]
    return PublishedHost(engine, profile, ranks), warnings
