"""The machine probe: two fixed forwards of the run's own model, timed just before and after a live
run (`profiler live --probe`) and in every calibration round, so a prediction can be put at the
speed the machine ran at (sim/validate/machine_speed.py).

A decode forward (batch 1, one query token at sim.validate.machine_speed.PROBE_DECODE_KV cached tokens:
weight-bandwidth-bound, like decoding) and a whole prompt of PROBE_PROMPT_TOKENS tokens on the
engine's prefill path (compute-bound, like prefill), each the median of about PROBE_S seconds of
calls (profiler.calibrate.timing.time_call, after its warm-up calls). On this CPU they take 50-70 ms and
0.45-0.6 s: about 3.5 s for the pair, 7 s around a run. `profiler calibrate` times the same pair
once a round (fits.py), so a bundle carries the speed it was measured at.
"""
from __future__ import annotations

PROBE_S = 1.0


def measure_probe(model, config, device: str, seed: int = 0) -> dict:
    """Seconds of the two probe forwards now, and their shapes. Leaves the model's caches small."""
    import torch

    from profiler.calibrate.timing import time_call
    from sim.formats.run_folder import probe_shapes

    shapes = probe_shapes(config.max_context)
    kv, prompt = shapes["decode_kv"], shapes["prompt_tokens"]
    generator = torch.Generator().manual_seed(seed)
    out = {}
    with torch.inference_mode():
        model.setup_cache(1, kv + 1)
        token = torch.randint(0, config.vocab, (1, 1), generator=generator).to(device)
        position = torch.full((1, 1), kv - 1, device=device)
        out["decode_s"] = time_call(lambda: model(token, position), device, PROBE_S).median_s
        model.setup_cache(1, prompt + 1)
        tokens = torch.randint(0, config.vocab, (1, prompt), generator=generator).to(device)
        positions = torch.arange(prompt, device=device).unsqueeze(0)
        logits_at = torch.full((1,), prompt - 1, device=device)
        out["prompt_s"] = time_call(lambda: model(tokens, positions, logits_at=logits_at, prompt=True), device,
                                    PROBE_S).median_s
    model.setup_cache(1, 1)          # the probe's caches released before the run
    return {**out, "shapes": shapes}
