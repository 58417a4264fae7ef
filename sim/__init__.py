"""Predict what speculative decoding buys a deployment: a SimPy model of the serving pipeline.

    >>> import sim
    >>> result = sim.simulate("scenarios/eagle-h100.yaml")
    >>> result.speedup

sim never imports torch: it must start fast on machines with no GPU stack.
"""
from sim.errors import InputError
from sim.result import Result
from sim.scenario.load import load_scenario
from sim.scenario.schema import Scenario
from sim.simulate import simulate

__all__ = ["Result", "Scenario", "InputError", "load_scenario", "simulate"]
