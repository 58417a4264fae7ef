"""The scenario: what is deployed (hardware, model, dtype, engine preset), what it serves (workload),
how it speculates; validated in one pass with one-line errors (schema.py), datasheet presets
(presets/) and command-line overrides (overrides.py)."""
from sim.scenario.load import load_scenario, read_mapping, resolve_relative_paths
from sim.scenario.schema import Scenario

__all__ = ["Scenario", "load_scenario", "read_mapping", "resolve_relative_paths"]
