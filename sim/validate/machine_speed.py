"""The machine's speed at a live run, against the speed its calibration bundle was measured at.

A bundle prices operators at the machine's state during its calibration, and a shared machine
moves (by tens of percent over hours on the CI's CPU VMs: docs/validation.md). `profiler live
--probe` times two fixed forwards of the run's model just before and after the run (the shapes in
sim/formats/run_folder.py) and records them in meta.json; `profiler calibrate` times the same two
in each of its rounds and keeps the median in the bundle (fits.machine_probe). The run's probe over
the calibration's is the machine's speed at the run relative to the bundle's. A prediction scaled
by it (prefill time by the prompt probe's ratio, everything else by the decode probe's) is the
bundle's prediction at the speed the machine ran at: `sim validate` reports it beside the plain
one, so the model's error and the machine's drift are told apart. The probe is measured outside
the run, never from it.

A bundle without a probe of its own gives the ratio of the run's probe over the bundle's price of
the two forwards (`priced_probe`). That ratio also takes out the model's own error at those two
shapes, so it flatters the shapes near them (batch-1 decoding above all), and `sim validate` says
so in the row's note.
"""
from __future__ import annotations


def measured_probe(meta: dict) -> dict | None:
    """The run's probe (meta.json "machine_probe"): the mean of before and after, with its shapes;
    None for a run recorded without --probe."""
    probe = meta.get("machine_probe")
    if not probe:
        return None
    mean = lambda key: (probe["before"][key] + probe["after"][key]) / 2
    return {"decode_s": mean("decode_s"), "prompt_s": mean("prompt_s"), "shapes": probe["shapes"]}


def calibration_probe(bundle_meta: dict, shapes: dict) -> dict | None:
    """The probe timed during the bundle's calibration (fits.machine_probe), if it has one of the
    same shapes."""
    probe = bundle_meta.get("fits", {}).get("machine_probe")
    if not probe or probe.get("shapes") != shapes:
        return None
    return {"decode_s": probe["decode_s"], "prompt_s": probe["prompt_s"]}


def priced_probe(scenario: dict, shapes: dict) -> dict | None:
    """The two probe forwards priced by the scenario's cost model (None without a calibration)."""
    from sim.cost.batch import DECODE, PHASES, Group, prompt_group
    from sim.cost.model import cost_model_for
    from sim.cost.stack import build_stacks
    from sim.scenario.load import load_scenario

    loaded = load_scenario(scenario)
    if loaded.calibration is None:
        return None
    cost = cost_model_for(loaded)
    target = build_stacks(loaded).target
    kv, prompt = shapes["decode_kv"], shapes["prompt_tokens"]
    decode = Group(phase=DECODE, requests=1, tokens=1, query_max=1, kv_tokens_sum=kv, logits_tokens=1)
    whole_prompt = prompt_group(prompt)
    return {"decode_s": cost.forward(target, [decode], [0.0] * len(PHASES)),
            "prompt_s": cost.forward(target, [whole_prompt], [0.0] * len(PHASES))}


def speed_ratios(measured: dict, reference: dict) -> dict:
    """The run's probe seconds over the reference's (the calibration's probe, or its price): above
    1, the machine ran slower than calibrated."""
    return {"decode": measured["decode_s"] / reference["decode_s"],
            "prompt": measured["prompt_s"] / reference["prompt_s"]}


# A run whose probe reads this far from its bundle's (either way) ran on another machine state than
# the one calibrated: on this project's CPU VMs the probes of one machine's runs and calibration
# stayed within 1.2x of each other over an hour and 1.3x across hours, while two VMs reporting the
# same CPU read 1.4-1.8x apart (docs/validation.md).
OTHER_STATE_RATIO = 1.3


def other_machine_state(ratios: dict) -> str | None:
    """A note when the run's probe is more than OTHER_STATE_RATIO from the calibration's, else None."""
    worst = max(ratios["decode"], ratios["prompt"], 1 / ratios["decode"], 1 / ratios["prompt"])
    if worst <= OTHER_STATE_RATIO:
        return None
    return (f"the run's probe read {ratios['decode']:.2f}x (decode) and {ratios['prompt']:.2f}x (prompt) the "
            f"calibration's: another machine state than the bundle's")


def scaled_seconds(seconds: float, prefill_s: float, ratios: dict) -> float:
    """A predicted run time at the measured speed: prefill by the prompt probe, the rest by the
    decode probe."""
    return prefill_s * ratios["prompt"] + (seconds - prefill_s) * ratios["decode"]


def at_run_speed(guess: dict, ratios: dict, base_ratios: dict, decode_base_ratios: dict | None = None) -> dict:
    """A prediction put at the machine's measured speed: its time and TPOT scaled by the probes'
    ratios (prefill by the prompt probe's, the rest by the decode probe's), its speedup by the run's
    and its baseline's own (`decode_base_ratios`: those of the run the decode speedup was measured
    against, when it is not the speedup's baseline); tokens per step and time shares as predicted."""
    seconds = scaled_seconds(guess["seconds"], guess["prefill_s"], ratios)
    out = {**guess, "tok_s": guess["tok_s"] * guess["seconds"] / seconds,
           "tpot_ms": guess["tpot_ms"] * ratios["decode"], "tpot_p50_ms": guess["tpot_p50_ms"] * ratios["decode"],
           "ttft_p50_ms": guess["ttft_p50_ms"] * ratios["prompt"], "seconds": seconds}
    if guess["speedup"] is not None:
        base_seconds = scaled_seconds(guess["base_seconds"], guess["base_prefill_s"], base_ratios)
        out["speedup"] = base_seconds / seconds
        decode_s = guess["seconds"] - guess["prefill_s"]
        if guess["decode_speedup"] is not None and decode_s > 0:
            out["decode_speedup"] = guess["decode_speedup"] * (decode_base_ratios or base_ratios)["decode"] / ratios["decode"]
    return out
