"""The names both sides use: drafting methods and the phases an engine's time is split into."""
from __future__ import annotations

# Every method a scenario can speculate with; the live engine runs LIVE_METHODS of them (the heads,
# EAGLE, MTP and Medusa, are simulated only).
METHODS = ("none", "ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa", "shadow", "layerskip",
           "streaming")
LIVE_METHODS = ("none", "ngram", "shadow", "layerskip", "streaming", "draft_model")

# The simulator's phases, in the order of Result.time_share (sim/cost/batch.py indexes them).
PHASES = ("prefill", "decode", "verify", "partial_verify", "full_verify", "draft", "selection",
          "transfer", "overhead")
# The groups `sim validate` compares measured and predicted time shares in.
SHARE_GROUPS = {"prefill": ("prefill",), "target": ("decode", "verify", "partial_verify", "full_verify"),
                "draft": ("draft",), "selection": ("selection",), "other": ("overhead", "transfer")}


def share_group(phase: str) -> str:
    """The SHARE_GROUPS group of one of the simulator's phases."""
    return next(group for group, phases in SHARE_GROUPS.items() if phase in phases)
