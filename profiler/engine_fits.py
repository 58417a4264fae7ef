"""The live engine's costs that no single operator shows, fitted on whole forwards and steps for a
calibration bundle (`profiler calibrate`, step 2; `--refit` redoes only these).

- forward_factor: whole forwards run slower than their operators timed one by one (Python between
  operators, the matmul library's threads sleeping between them): measured / composed, against the
  forward's query tokens and KV tokens.
- selection_factor: SpecPV's block selection (Quest scores, top-k, the partial index: some twenty
  small operators per layer) timed inside partial-verification forwards against the selection
  table: between a layer's large matmuls it runs 1.5-2.5 times slower than in a loop of its own on
  this CPU (the whole-forward factor, about 1.1 at five tokens, is the large operators' ratio and
  did not cover it: the six SpecPV runs of the validation study measured 26-35% more selection
  time per token than that predicted).
- step_overhead_s + request_overhead_s: the engine's host time per decoding step, fixed and per
  request.
Every fit goes in meta.json's "fits"; sim/cost/bundle.py reads them.
"""
from __future__ import annotations

from pathlib import Path


def _scenario(model_name: str, dtype_name: str, bundle: Path, hardware: str):
    """A scenario of this model on this device, reading the bundle (for its composed forwards)."""
    from sim.scenario import load_scenario

    return load_scenario({"model": model_name, "dtype": dtype_name, "hardware": hardware, "calibration": str(bundle),
                          "engine": "gpt-fast"})


def fit_engine_overheads(config, dtype, device, model_name, dtype_name, hardware, bundle: Path, seed: int,
                         quick: bool):
    """The live engine's host time per decoding step, fitted as fixed + per request, and whole
    forwards at off-grid shapes against the provisional bundle's composed prediction."""
    import numpy as np
    import torch

    from profiler.loaders import random_model
    from profiler.speculative import speculative_generate
    from profiler.timing import time_call, timed_forwards
    from sim.cost.batch import DECODE, PHASES, PREFILL, VERIFY, Group
    from sim.cost.bundle import load_bundle
    from sim.cost.calibrated import CalibratedCostModel
    from sim.cost.table import OperatorTable

    cost = CalibratedCostModel(_scenario(model_name, dtype_name, bundle, hardware), load_bundle(bundle))
    target = _target_stack(cost)
    model = random_model(config, dtype, device, seed).model
    generator = torch.Generator().manual_seed(seed)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def predicted_forward(batch, query, kv):
        if query > 64:      # a prompt: one request's chunk each, logits of its last token
            group = Group(PREFILL, batch, batch * query, query, batch * kv, batch, [query] * batch, [kv] * batch)
        else:
            group = Group(DECODE if query == 1 else VERIFY, batch, batch * query, query, batch * kv, batch * query)
        return cost.forward(target, [group], [0.0] * len(PHASES))

    def measured_forward(batch, query, kv):
        model.setup_cache(batch, kv + 1)
        tokens = torch.randint(0, config.vocab, (batch, query), generator=generator).to(device)
        positions = (kv - query + torch.arange(query)).expand(batch, query).to(device)
        logits_at = torch.full((batch,), query - 1, device=device) if query > 64 else None
        with torch.inference_mode():
            return time_call(lambda: model(tokens, positions, logits_at=logits_at), device, 0.3).median_s

    # Whole forwards run slower than their operators timed one by one (Python between operators,
    # the matmul library's threads sleeping between them), by a factor that depends on the tokens:
    # measure it on whole forwards (decode batches, then prompts), the median of interleaved
    # repeats: the operators' median rounds give each term's shape, whole forwards as the engine
    # meets them (the machine's usual state, not its best) give the level.
    # In a forward, attention also runs slower than alone, more so the more KV it reads: the factor
    # is a table over (query tokens, KV tokens), decode and verification at three KV lengths.
    tokens_axis = [1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256, 512, 1024]
    kv_axis = [256, 1024, 4096]
    checks = [(5, 1, 700), (10, 1, 300), (3, 4, 900), (8, 3, 200), (2, 1, 1500), (6, 8, 128), (1, 384, 384)]
    if quick:
        tokens_axis, kv_axis, checks = [1, 3, 6, 16, 64, 128], [256, 2048], checks[::2]
    fits_context = lambda n: n < config.max_context
    tokens_axis = [t for t in tokens_axis if t <= 64 or fits_context(t)]
    kv_axis = [kv for kv in kv_axis if fits_context(kv)] or [config.max_context // 2]
    checks = [c for c in checks if fits_context(c[2])]

    def shape_of(tokens: int, kv: int) -> tuple[int, int, int]:
        if tokens <= 16:
            return tokens, 1, kv                 # decode batches
        if tokens <= 64:
            return 16, tokens // 16, kv          # verification of 16 requests
        return 1, tokens, tokens                 # a prompt (reads itself whatever the KV column)

    shapes = {shape_of(t, kv) for t in tokens_axis for kv in kv_axis}
    measured: dict[tuple, list[float]] = {shape: [] for shape in sorted(shapes)}
    for _ in range(1 if quick else 3):
        for shape in measured:
            measured[shape].append(measured_forward(*shape))
    ratio = {shape: float(np.median(m)) / predicted_forward(*shape) for shape, m in measured.items()}
    factor = [[ratio[shape_of(t, kv)] for kv in kv_axis] for t in tokens_axis]
    cost.forward_factor = OperatorTable("forward_factor", ("tokens", "kv"),
                                        [np.asarray(tokens_axis, dtype=float), np.asarray(kv_axis, dtype=float)],
                                        np.asarray(factor), linear_above=False)
    forward_checks = [{"batch": b, "query": q, "kv": kv,
                       "measured_s": float(np.median([measured_forward(b, q, kv) for _ in range(1 if quick else 3)])),
                       "predicted_s": predicted_forward(b, q, kv)} for b, q, kv in checks]

    # Host time per step: a decoding run's wall time minus its forwards (timed by hooks on the
    # model, synchronized) minus the acceptance the cost model adds on its own.
    accept = cost.bundle.table("accept")
    batches, host = ([1, 4, 16], []) if quick else ([1, 2, 4, 8, 16], [])
    prompt_tokens, new_tokens = 128, 12 if quick else 24
    with timed_forwards(model, sync) as forward_s:
        for batch in batches:
            prompts = torch.randint(0, config.vocab, (batch, prompt_tokens), generator=generator).tolist()
            per_step = []
            for _ in range(1 if quick else 3):
                forward_s.clear()
                gen = speculative_generate(model, prompts, new_tokens, None)
                steps = len({s.step for s in gen.steps})
                per_step.append((gen.wall_s - gen.prefill_s - sum(forward_s[1:])) / steps)
            host.append(float(np.median(per_step)) - (accept(batch, 1) if accept is not None else 0.0))
    slope, intercept = np.polyfit(batches, host, 1)
    fits = {"forward_factor": {"tokens": tokens_axis, "kv": kv_axis, "factor": factor},
            "step_overhead_s": max(0.0, float(intercept)), "request_overhead_s": max(0.0, float(slope)),
            "step_host_s": dict(zip(map(str, batches), host))}
    selection = fit_selection_factor(model, config, cost, device, generator, quick)
    if selection is not None:
        fits["selection_factor"] = selection
    model.setup_cache(1, 1)     # frees the largest caches before the bundle is written
    return fits, forward_checks


def _target_stack(cost):
    from sim.cost.stack import build_stacks

    return build_stacks(cost.scenario).target




def fit_selection_factor(model, config, cost, device: str, generator, quick: bool) -> dict | None:
    """SpecPV's selection per layer timed inside partial-verification forwards of the model, over
    the selection table's value at the same shape, against (batch, context); None without the
    summaries and selection tables, and on CUDA, where the live engine builds its partial index
    for the attention kernel instead and its host clock around selection is not synchronized."""
    import numpy as np

    if device == "cuda" or cost.bundle.table("selection") is None or cost.bundle.table("summaries") is None:
        return None
    table = cost.bundle.table("selection")
    batch_axis = [1, 4] if quick else [1, 4, 16]
    budgets = [256, 1024]
    context_axis = [c for c in ([512, 2048] if quick else [512, 2048, 6144]) if c + 8 <= config.max_context]
    if not context_axis:
        return None
    shapes = [(b, c) for b in batch_axis for c in context_axis]
    per_layer: dict[tuple, list[float]] = {(b, c, k): [] for b, c in shapes for k in budgets}
    for _ in range(1 if quick else 2):       # rounds interleaved, as the other fits
        for batch, context in shapes:
            fill_partial_cache(model, config, batch, context, generator, device)
            for budget in budgets:      # 30 layers' selections per forward
                per_layer[(batch, context, budget)] += time_selection_in_forward(
                    model, config, batch, context, budget, generator, device, forwards=2)
    ratio = {key: float(np.median(times)) / table(*key) for key, times in per_layer.items()}
    factor = [[float(np.median([ratio[(b, c, k)] for k in budgets])) for c in context_axis] for b in batch_axis]
    return {"batch": batch_axis, "context": context_axis, "budgets": budgets, "factor": factor}


def fill_partial_cache(model, config, batch: int, context: int, generator, device: str) -> None:
    """A KV cache for `batch` requests with `context` random keys and values each, and every layer's
    block summaries taken at `context`. One cache serves every layer: selection reads its own
    layer's summaries and the step's queries, never the cache, so sharing it changes nothing timed
    and keeps a 16 x 6,144-token setup to one allocation (30 of them took 15 s here)."""
    import torch

    from profiler.operators import PARTIAL_BLOCK, SELECTION_QUERY

    model.setup_cache(1, 1)      # the rotary table, and the previous shape's caches released
    shape = (batch, config.kv_heads, context + SELECTION_QUERY + 1, config.head_dim)
    keys = torch.randn(shape, generator=generator).to(device, model.lm_head.weight.dtype)
    values = torch.randn(shape, generator=generator).to(device, model.lm_head.weight.dtype)
    for layer in model.layers:
        layer.attention.k_cache, layer.attention.v_cache = keys, values
    rows = torch.arange(batch, device=device)
    model.refresh_summaries(rows, torch.full((batch,), context, device=device), PARTIAL_BLOCK)


def time_selection_in_forward(model, config, batch: int, context: int, budget: int, generator, device: str,
                              forwards: int) -> list[float]:
    """Seconds per layer of the block selection in each of `forwards` partial-verification forwards:
    every request verifies SELECTION_QUERY tokens after `context` cached ones, its refresh point at
    `context` (the selection operator's own shape, profiler/operators.py)."""
    import torch

    from profiler.operators import PARTIAL_BLOCK, PARTIAL_SINK, PARTIAL_WINDOW, SELECTION_QUERY
    from profiler.partial import PartialSpec, PartialStep

    T = SELECTION_QUERY
    spec = PartialSpec(budget, PARTIAL_SINK, PARTIAL_WINDOW, PARTIAL_BLOCK)
    tokens = torch.randint(0, config.vocab, (batch, T), generator=generator).to(device)
    positions = (context + torch.arange(T)).expand(batch, T).to(device)
    rows = torch.arange(batch, device=device)
    seconds = []
    with torch.inference_mode():
        for _ in range(forwards):
            step = PartialStep(spec, rows, torch.full((batch,), max(context - PARTIAL_WINDOW, 0), device=device),
                               torch.full((batch,), context + T, device=device),
                               torch.ones(batch, T, dtype=torch.bool, device=device))
            model(tokens, positions, partial=step)
            seconds.append(step.selection_s / config.layers)
    return seconds
