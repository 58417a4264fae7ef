"""What a collective between GPUs costs: a published profile's measured table where one matches the
scenario (calibration/published/: its interconnect class and its engine's collectives library;
for expert parallelism's all-to-all, the table the engine names), else the roofline's guess,
named in the result's warnings.

The guess: a ring all-reduce, ALLREDUCE_LATENCY_S plus 2 (n - 1) / n of the message over the
interconnect's datasheet rate; an all-to-all's dispatch and combine, each the same floor plus the
(n - 1) / n of the message that leaves a GPU. Measured: NCCL's kernel times on a DGX H100 and a DGX
A100 (Vidur's), 2 to 8 GPUs of one node, 2 KB to 64 MB, interpolated in log-log
(sim/formats/table.py; below 2 KB the 2 KB time, above 64 MB linear in bytes); DeepEP's
low-latency dispatch and combine at 8-256 GPUs. A scenario on GPU counts a table did not
measure, or whose engine reduces with another library, keeps the guess.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sim.errors import InputError
from sim.formats.provenance import repo_relative
from sim.formats.published import PUBLISHED, PublishedProfile, load_published, published_metas
from sim.scenario.schema import Scenario

# NCCL all-reduce latency floor for small messages over NVLink/PCIe (one hop ring), seconds.
ALLREDUCE_LATENCY_S = 8e-6
# The ops a published all-to-all table holds (engine.all_to_all names one).
ALL_TO_ALL_OPS = ("dispatch", "combine")


@dataclass
class InterconnectGuess:
    """The roofline's collectives over the interconnect's datasheet rate, each with a latency floor:
    a ring all-reduce, and an all-to-all's dispatch and combine. Past `domain` GPUs (those sharing
    the interconnect: a node's, or an NVL72 rack's), the traffic that leaves the domain crosses the
    scale-out network at `network_bytes_s` a GPU: a hierarchical all-reduce (reduce-scatter inside
    the domain, an all-reduce of each GPU's 1/domain across the domains, an all-gather inside), and
    an all-to-all whose share bound for other domains goes over the network beside the rest."""
    interconnect_bytes_s: float
    origin: str = "roofline guess (8 us + a ring at the interconnect's datasheet rate)"
    domain: int = 1 << 30
    network_bytes_s: float = 0.0

    def all_reduce_s(self, message_bytes: float, ranks: int) -> float:
        if ranks <= self.domain:
            return ALLREDUCE_LATENCY_S + 2 * (ranks - 1) / ranks * message_bytes / self.interconnect_bytes_s
        d, domains = self.domain, math.ceil(ranks / self.domain)
        inside = 2 * (d - 1) / d * message_bytes / self.interconnect_bytes_s
        across = 2 * (domains - 1) / domains * message_bytes / d / self.network_bytes_s
        return 2 * ALLREDUCE_LATENCY_S + inside + across

    def exchange_s(self, elements: float, ranks: int, element_bytes: float) -> float:
        """Dispatch and combine of `elements` values a GPU sends (tokens x top-k x hidden), each the
        latency floor and the (ranks - 1) / ranks of the message that leaves the GPU: past the
        domain, the larger of its share inside over the interconnect and its share outside over
        the network."""
        message = elements * element_bytes
        if ranks <= self.domain:
            return 2 * (ALLREDUCE_LATENCY_S + (ranks - 1) / ranks * message / self.interconnect_bytes_s)
        inside = (self.domain - 1) / ranks * message / self.interconnect_bytes_s
        outside = (ranks - self.domain) / ranks * message / self.network_bytes_s
        return 2 * (ALLREDUCE_LATENCY_S + max(inside, outside))


class MeasuredCollectives:
    """A published profile's all-reduce table at the scenario's GPU count."""
    kind = "published"

    def __init__(self, profile: PublishedProfile):
        self.table = profile.tables["all_reduce"]
        m = profile.meta
        self.origin = (f"published: {repo_relative(profile.path)}, {m['library']} on {m['hardware']} "
                       f"({m['interconnect']}), from {profile.source}")
        self._seconds: dict[tuple, float] = {}

    def all_reduce_s(self, message_bytes: float, ranks: int) -> float:
        key = (message_bytes, ranks)
        s = self._seconds.get(key)
        if s is None:
            s = self._seconds[key] = self.table(ranks, message_bytes)
        return s


class MeasuredAllToAll:
    """A published all-to-all table (dispatch and combine) at the scenario's expert-parallel size,
    each op at the element width its source measured (DeepEP: FP8 dispatch, BF16 combine), as the
    engine that uses those kernels sends them. A message smaller than the table's takes the table's
    time (the low-latency kernels' time at fewer tokens was not published: an upper bound), a
    larger one scales linearly in bytes."""

    def __init__(self, profile: PublishedProfile):
        self.tables = [(profile.tables[op], float(profile.meta["element_bytes"][op])) for op in ALL_TO_ALL_OPS]
        m = profile.meta
        self.origin = (f"published: {repo_relative(profile.path)}, {m['library']} over {m['interconnect']} on "
                       f"{m['hardware']}, from {profile.source}")

    def exchange_s(self, elements: float, ranks: int, element_bytes: float) -> float:
        """Dispatch and combine of `elements` values a GPU sends (the scenario's element width is
        the guess's; the table prices each op at its own)."""
        return sum(table(ranks, elements * width) for table, width in self.tables)


def all_to_all_for(scenario: Scenario,
                   folder: Path = PUBLISHED) -> tuple[InterconnectGuess | MeasuredAllToAll, str | None]:
    """The expert-parallel all-to-all's pricer: the published table the engine names
    (`engine.all_to_all`) where it measured the scenario's GPU count, else the guess; and, for an
    expert-parallel scenario, the warning that says what it is priced by when that is not its own
    hardware's measurement."""
    hw, engine, ranks = scenario.hardware_spec, scenario.engine_spec, scenario.gpus
    across = (f", the share bound beyond its {hw.nvlink_domain}-GPU domain over the {hw.network_gb_s:g} GB/s network"
              if ranks > hw.nvlink_domain else "")
    guess = InterconnectGuess(hw.interconnect_gb_s * 1e9, origin=f"roofline guess (8 us + the message at the "
                                                                  f"interconnect's datasheet rate{across}, each way)",
                              domain=hw.nvlink_domain, network_bytes_s=hw.network_gb_s * 1e9)
    if not scenario.expert_parallel or ranks == 1:
        return guess, None
    if not engine.all_to_all:
        return guess, (f"all-to-all priced by the roofline's guess: engine {engine.name} names no published "
                       f"all-to-all table (engine.all_to_all)")
    profile = load_published(folder / engine.all_to_all)
    missing = [op for op in ALL_TO_ALL_OPS if op not in profile.meta.get("element_bytes", {})]
    if missing:
        raise InputError("engine.all_to_all", f"{engine.all_to_all} states no single element width for "
                                              f"{' and '.join(missing)} (its source's dtype_bytes)")
    measured = [int(r) for r in profile.tables["dispatch"].axes[0]]
    if not measured[0] <= ranks <= measured[-1]:
        return guess, (f"all-to-all priced by the roofline's guess: {engine.all_to_all} measured {measured} GPUs, "
                       f"the scenario runs {ranks}")
    m = profile.meta
    other = (f"all-to-all priced by {engine.all_to_all}, measured on {m['hardware']} over {m['interconnect']}; "
             f"the scenario's GPUs are {hw.name}") if m["hardware"] != hw.name else None
    return MeasuredAllToAll(profile), other


def all_reduce_ranks(scenario: Scenario) -> int:
    """The widest all-reduce a step runs: an attention rank's tensor-parallel group, or with attention
    data parallel and the experts split (not placed whole) the MoE's gather over every GPU; 1: none."""
    wide = scenario.data_parallel > 1 and not scenario.expert_parallel
    return scenario.gpus if wide else scenario.tensor_parallel


def collectives_for(scenario: Scenario,
                    folder: Path = PUBLISHED) -> tuple[InterconnectGuess | MeasuredCollectives, str | None]:
    """The scenario's all-reduce pricer and, where it is the guess though the scenario runs tensor
    parallel, the warning that says why."""
    hw, engine, ranks = scenario.hardware_spec, scenario.engine_spec, all_reduce_ranks(scenario)
    guess = InterconnectGuess(hw.interconnect_gb_s * 1e9, domain=hw.nvlink_domain, network_bytes_s=hw.network_gb_s * 1e9)
    if ranks == 1:
        return guess, None
    tables = published_metas(folder, "collectives", ("all_reduce",))
    matching = [load_published(folder / name) for name, m in tables.items()
                if m.get("interconnect") == hw.interconnect and m.get("library") == engine.collectives]
    if not matching:
        return guess, (f"all-reduce priced by the roofline's guess: no published {engine.collectives} table of "
                       f"{hw.interconnect} (engine {engine.name}) in calibration/published")
    covering = [p for p in matching
                if p.tables["all_reduce"].axes[0][0] <= ranks <= p.tables["all_reduce"].axes[0][-1]]
    if not covering:
        measured = sorted({int(r) for p in matching for r in p.tables["all_reduce"].axes[0]})
        return guess, (f"all-reduce priced by the roofline's guess: the published {engine.collectives} tables of "
                       f"{hw.interconnect} measured {measured} GPUs, the scenario runs {ranks}")
    # The table measured on the scenario's own hardware first (an H200 shares an H100's NVLink 4).
    covering.sort(key=lambda p: p.meta["hardware"] != hw.name)
    return MeasuredCollectives(covering[0]), None
