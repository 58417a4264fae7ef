"""The names both sides use: drafting methods, the phases an engine's time is split into, and the
scenario dtype of the weights an engine reports."""
from __future__ import annotations

from sim.errors import InputError

# Every method a scenario can speculate with; the live engine runs LIVE_METHODS of them (EAGLE with
# a head trained by `python -m profiler train-eagle`; EAGLE-3, MTP and Medusa are simulated only),
# and one more: `synthetic`, a drafter of set acceptance paying a stated draft's cost, which
# validation predicts as the scenario method of that cost (sim/validate/compare.py).
METHODS = ("none", "ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa", "shadow", "layerskip",
           "streaming")
LIVE_METHODS = ("none", "ngram", "shadow", "layerskip", "streaming", "draft_model", "eagle", "synthetic")

# The simulator's phases, in the order of Result.time_share (sim/cost/batch.py indexes them).
PHASES = ("prefill", "decode", "verify", "partial_verify", "full_verify", "draft", "selection",
          "transfer", "overhead")
# The groups `sim validate` compares measured and predicted time shares in.
SHARE_GROUPS = {"prefill": ("prefill",), "target": ("decode", "verify", "partial_verify", "full_verify"),
                "draft": ("draft",), "selection": ("selection",), "other": ("overhead", "transfer")}


def share_group(phase: str) -> str:
    """The SHARE_GROUPS group of one of the simulator's phases."""
    return next(group for group, phases in SHARE_GROUPS.items() if phase in phases)


# The weights' dtype a run records (the engine's name for it) as a scenario's dtype: llama.cpp's
# 4-bit GGUF types are int4 weights.
SCENARIO_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "q4_0": "int4", "q4_1": "int4",
                   "q4_k_m": "int4"}


def scenario_dtype(recorded: str) -> str:
    if recorded not in SCENARIO_DTYPES:
        raise InputError("RUN_DIR", f"weights of dtype {recorded} have no scenario dtype "
                                    f"({', '.join(SCENARIO_DTYPES)} do)")
    return SCENARIO_DTYPES[recorded]
