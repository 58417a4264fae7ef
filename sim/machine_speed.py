"""The machine's speed at a live run, against the speed its calibration bundle was measured at.

A bundle prices operators at the machine's state during its calibration. A shared machine moves:
this CPU VM ran the same forwards 12-14% faster at 22:50 than during the committed bundle's
calibration four hours earlier, and every autoregressive run of that hour was predicted 11-13% slow
(docs/validation.md, `benchmarks/machine_drift.py`). `profiler live --probe` times two fixed
forwards of the run's model just before and after the run (the probe: a decode forward at
PROBE_DECODE_KV cached tokens, bandwidth-bound like decoding, and a whole PROBE_PROMPT_TOKENS-token
prompt, compute-bound like prefill) and records them in meta.json. The calibrated cost model prices
the same two forwards; measured over priced is the machine's speed at the run relative to the
bundle's. A prediction scaled by it (prefill time by the prompt probe's ratio, everything else by
the decode probe's) is the bundle's prediction at the speed the machine ran at: `sim validate`
reports it beside the plain one, so the model's error and the machine's drift are told apart.
The probe is measured outside the run, never from it.
"""
from __future__ import annotations

PROBE_DECODE_KV = 512
PROBE_PROMPT_TOKENS = 256


def probe_shapes(max_context: int) -> dict:
    """The probe forwards for a model of this maximum context (smaller for a short-context model)."""
    return {"decode_kv": min(PROBE_DECODE_KV, max_context // 2),
            "prompt_tokens": min(PROBE_PROMPT_TOKENS, max_context // 2)}


def measured_probe(meta: dict) -> dict | None:
    """The run's probe (meta.json "machine_probe"): the mean of before and after, with its shapes;
    None for a run recorded without --probe."""
    probe = meta.get("machine_probe")
    if not probe:
        return None
    mean = lambda key: (probe["before"][key] + probe["after"][key]) / 2
    return {"decode_s": mean("decode_s"), "prompt_s": mean("prompt_s"), "shapes": probe["shapes"]}


def priced_probe(scenario: dict, shapes: dict) -> dict | None:
    """The two probe forwards priced by the scenario's cost model (None without a calibration)."""
    from sim.cost.batch import DECODE, PHASES, PREFILL, Group
    from sim.cost.calibrated import cost_model_for
    from sim.cost.stack import build_stacks
    from sim.scenario import load_scenario

    loaded = load_scenario(scenario)
    if loaded.calibration is None:
        return None
    cost = cost_model_for(loaded)
    target = build_stacks(loaded).target
    kv, prompt = shapes["decode_kv"], shapes["prompt_tokens"]
    decode = Group(DECODE, 1, 1, 1, kv, 1)
    whole_prompt = Group(PREFILL, 1, prompt, prompt, prompt, 1, [prompt], [prompt])
    return {"decode_s": cost.forward(target, [decode], [0.0] * len(PHASES)),
            "prompt_s": cost.forward(target, [whole_prompt], [0.0] * len(PHASES))}


def speed_ratios(measured: dict, priced: dict) -> dict:
    """Measured over priced seconds per probe: above 1, the machine ran slower than calibrated."""
    return {"decode": measured["decode_s"] / priced["decode_s"], "prompt": measured["prompt_s"] / priced["prompt_s"]}


def scaled_seconds(seconds: float, prefill_s: float, ratios: dict) -> float:
    """A predicted run time at the measured speed: prefill by the prompt probe, the rest by the
    decode probe."""
    return prefill_s * ratios["prompt"] + (seconds - prefill_s) * ratios["decode"]
