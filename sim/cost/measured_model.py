"""Which scenarios the measured operator tables price (sim/cost/model.py builds their cost model),
where each priced term came from, and the engine's measured all-reduce.

`cost: auto` (the default) prices a scenario without a calibration from aiconfigurator-core's
tables wherever they hold its GPU and engine, and by the roofline elsewhere, with one line in the
result's warnings naming what was missing; `cost: measured` makes that missing piece bad input,
`cost: roofline` keeps the roofline. The host work stays the engine preset's (sim/cost/host.py).
"""
from __future__ import annotations

from sim.cost.log_grid import LogGrid
from sim.cost.measured_tables import OperatorTables, operator_tables
from sim.cost.operator_tables import FRAMEWORKS, data_root
from sim.errors import InputError
from sim.scenario.schema import Scenario


def measured_tables_for(scenario: Scenario) -> tuple[OperatorTables | None, str | None]:
    """The measured tables that price `scenario`, else None and the line that says why the
    roofline does (None where the scenario asked for the roofline). Under `cost: measured` a
    missing piece is bad input; a named engine.version the tables lack always is."""
    if scenario.cost == "roofline":
        return None, None
    hw, engine = scenario.hardware_spec, scenario.engine_spec
    missing = None
    framework = FRAMEWORKS.get(engine.name.split("+", 1)[0])     # a preset with overrides: "sglang+custom"
    if data_root() is None:
        missing = "aiconfigurator-core is not installed"
    elif hw.operator_tables is None:
        missing = f"the measured operator tables hold no {hw.name}"
    elif framework is None:
        missing = f"the measured operator tables hold no engine {engine.name} (they hold {', '.join(FRAMEWORKS)})"
    else:
        tables = operator_tables(hw.operator_tables, framework, engine.version or None)
        if tables is not None:
            return tables, None
        missing = f"the measured operator tables hold no {engine.name} on {hw.name}"
    if scenario.cost == "measured":
        raise InputError("cost", f"measured: {missing}")
    return None, f"GPU kernels priced by the roofline: {missing}"


class TermOrigins:
    """Where one stack's terms came from: term -> origin -> lookups."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, term: str, origin: str) -> None:
        by_origin = self.counts.setdefault(term, {})
        by_origin[origin] = by_origin.get(origin, 0) + 1


def describe(tables: OperatorTables) -> str:
    return (f"aiconfigurator-core {tables.provenance['package'].get('version')} "
            f"{tables.system} {tables.framework} {tables.version}")


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
