"""Which scenarios the measured operator tables price (sim/cost/model.py builds their cost model),
where each priced term came from, and the engine's measured all-reduce.

`cost: auto` (the default) prices a scenario without a calibration from aiconfigurator-core's
tables wherever they hold its GPU and engine, and by the roofline elsewhere, with one line in the
result's warnings naming what was missing; `cost: measured` makes that missing piece bad input,
`cost: roofline` keeps the roofline. A scenario's `operator_tables: DIR` lays a user's own tables
(`profiler calibrate`'s BUNDLE/operator_tables, sim/formats/operator_layout.py) over the package's
for the GPU they were timed on, one table at a time; with them a GPU or engine the package lacks is
priced too. The host work stays the engine preset's (sim/cost/host.py).
"""
from __future__ import annotations

from sim.cost.log_grid import LogGrid
from sim.cost.measured_tables import OperatorTables, operator_tables
from sim.cost.operator_tables import FRAMEWORKS, data_root
from sim.errors import InputError
from sim.formats.operator_layout import user_tables_root
from sim.formats.provenance import repo_relative
from sim.scenario.schema import Scenario


def measured_tables_for(scenario: Scenario) -> tuple[OperatorTables | None, str | None]:
    """The measured tables that price `scenario`, else None and the line that says why the
    roofline does (None where the scenario asked for the roofline). A user's own tables
    (`operator_tables`) are laid over the package's for the GPU they were timed on. Under
    `cost: measured` a missing piece is bad input; a named engine.version the tables lack always is."""
    if scenario.cost == "roofline":
        return None, None
    hw, engine = scenario.hardware_spec, scenario.engine_spec
    base = engine.name.split("+", 1)[0]      # a preset with overrides: "sglang+custom"
    framework = FRAMEWORKS.get(base)
    user_root = None if scenario.operator_tables is None else user_tables_root(scenario.operator_tables)
    # A user's folder may cover what the package lacks: only the package's own gaps end it here.
    missing = None if user_root is not None else package_gap(hw, engine, framework)
    if missing is None:
        tables = operator_tables(hw.tables_system, framework or base, engine.version or None, user_root)
        if tables is not None:
            return tables, None
        missing = f"the measured operator tables hold no {engine.name} on {hw.name}" + \
            (f" and {repo_relative(user_root)} none of {hw.tables_system}" if user_root is not None else "")
    if scenario.cost == "measured":
        raise InputError("cost", f"measured: {missing}")
    return None, f"GPU kernels priced by the roofline: {missing}"


def package_gap(hw, engine, framework: str | None) -> str | None:
    """What keeps the package's tables from the GPU and engine, or None where nothing does."""
    if data_root() is None:
        return "aiconfigurator-core is not installed"
    if hw.operator_tables is None:
        return f"the measured operator tables hold no {hw.name}"
    if framework is None:
        return f"the measured operator tables hold no engine {engine.name} (they hold {', '.join(FRAMEWORKS)})"
    return None


class TermOrigins:
    """Where one stack's terms came from: term -> origin -> lookups."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, term: str, origin: str) -> None:
        by_origin = self.counts.setdefault(term, {})
        by_origin[origin] = by_origin.get(origin, 0) + 1


def describe(tables: OperatorTables) -> str:
    """The tables as a term's origin names them: the package's collection, and a user's folder over it."""
    user = f" with {', '.join(sorted(tables.overrides))} from {tables.user_folder}" if tables.overrides else ""
    return (f"aiconfigurator-core {tables.provenance['package'].get('version')} "
            f"{tables.system} {tables.framework} {tables.version}{user}")


class MeasuredAllReduce:
    """The engine's custom all-reduce, measured at the scenario's GPU count (sim/cost/collectives.py's
    interface); beyond the table's messages, its nearest size scaled linearly in bytes."""
    kind = "measured"

    def __init__(self, grid: LogGrid, tables: OperatorTables):
        self.grid = grid
        self.origin = f"measured: {describe(tables)} custom all-reduce"
        self._seconds: dict[float, float] = {}

    def all_reduce_s(self, message_bytes: float, ranks: int) -> float:
        s = self._seconds.get(message_bytes)
        if s is None:
            s, clamped = self.grid.lookup(message_bytes)
            if clamped is not None and message_bytes > clamped[0]:
                s *= message_bytes / clamped[0]
            self._seconds[message_bytes] = s
        return s


class MeasuredDeepEP:
    """DeepEP's measured dispatch and combine at the scenario's GPU count (sim/cost/collectives.py's
    all-to-all interface): the low-latency kernels while each GPU sends no more tokens than they
    were timed at (decode and verification; the engines' low-latency buffers hold a few hundred
    tokens a GPU), the high-throughput ones beyond (prompts); beyond a grid, its nearest point
    scaled linearly in tokens."""

    def __init__(self, low_latency: tuple[LogGrid, ...], high_throughput: tuple[LogGrid, ...] | None, top_k: int,
                 hidden: int, origin: str):
        self.low_latency, self.high_throughput = low_latency, high_throughput
        self.values_per_token = top_k * hidden
        self.low_latency_tokens = float(low_latency[0].axes[0][-1])
        self.origin = origin
        self._seconds: dict[float, float] = {}

    def exchange_s(self, elements: float, ranks: int, element_bytes: float) -> float:
        """Dispatch and combine of `elements` values a GPU sends (tokens x top-k x hidden); the
        kernels send at their own widths (the table's), whatever `element_bytes`."""
        tokens = max(elements / self.values_per_token, 1.0)
        s = self._seconds.get(tokens)
        if s is None:
            grids = self.low_latency if tokens <= self.low_latency_tokens or self.high_throughput is None \
                else self.high_throughput
            s = 0.0
            for grid in grids:
                seconds, clamped = grid.lookup(tokens)
                s += seconds * tokens / clamped[0] if clamped is not None and tokens > clamped[0] else seconds
            if len(self._seconds) < 1 << 16:
                self._seconds[tokens] = s
        return s


def measured_all_to_all(scenario: Scenario, tables: OperatorTables) -> MeasuredDeepEP | None:
    """DeepEP's measured all-to-all for an expert-parallel mixture of experts at the scenario's GPU
    count and expert shape: from the engine's own tables, else from vLLM's collection of the same
    GPU (the same DeepEP kernels); None where neither timed that shape and GPU count."""
    experts = scenario.model_spec.experts
    if experts is None or not scenario.expert_parallel or scenario.gpus == 1:
        return None
    shape = (scenario.model_spec.hidden, experts.top_k, experts.routed, scenario.gpus)
    for source in (tables, operator_tables(tables.system, "vllm") if tables.framework != "vllm" else None):
        if source is None:
            continue
        low_latency = source.all_to_all("deepep_ll", *shape)
        if low_latency is not None:
            borrowed = "" if source is tables else f" (the {tables.framework} tables time none)"
            return MeasuredDeepEP(low_latency, source.all_to_all("deepep_ht", *shape), experts.top_k, shape[0],
                                  f"measured: {describe(source)} DeepEP dispatch and combine{borrowed}")
    return None

