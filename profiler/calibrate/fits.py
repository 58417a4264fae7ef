"""The live engine's costs that no single operator shows, measured on whole forwards and decoding
steps and fitted against a bundle's operator tables (`profiler calibrate`, step 2).

- forward_factor: whole forwards run slower than their operators timed one by one (Python between
  operators, the matmul library's threads sleeping between them): measured / composed, against the
  forward's query tokens and KV tokens.
- selection_factor: SpecPV's block selection (Quest scores, top-k, the partial index: some twenty
  small operators per layer) timed inside partial-verification forwards against the selection
  table: between a layer's large matmuls it runs slower than in a loop of their own (1.05-1.84
  times on the 2-core CPU), most at batch 1 and short contexts, which the whole-forward factor
  (the large operators' ratio) does not carry.
- step_overhead_s + request_overhead_s: the engine's host time per decoding step, fixed and per
  request.
- machine_probe: the two probe forwards of probe.py, the median over the rounds: the machine's
  speed during this calibration, for `sim validate`'s predictions at a run's speed.

On CUDA the whole forwards and decoding steps are the engine's there: decode and verify forwards
(at most 64 new tokens a row) in the attention kernel's layout replayed from CUDA graphs
(profiler/engine/graphs.py), prompts eagerly; the host time per step is then what the host adds to
the replays.

`EngineProbe` measures one round of everything at a time; calibrate runs a round after each round
of operator timing, so whole forwards and operators are timed over the same minutes and their
ratio is not one spell of a shared machine's. The decode forwards (the factor's rows of at most 16
tokens, what autoregressive decoding pays, and the level that moves most from one burst to the
next) are also timed in DECODE_BURSTS_WITHIN_ROUND more bursts spread through each round of
operators (`measure_decode_burst`), about 20 s a burst on the 2-core CPU. `--refit` runs the rounds
back to back, each with its extra bursts right after it. Every fit goes in meta.json's "fits" (the
decode bursts too, `bursts_s`); sim/formats/bundle.py reads them.
"""
from __future__ import annotations

from pathlib import Path

# A step of SpecPV partial verification, as the selection operator is timed (operators.py).
SELECTION_BUDGETS = [256, 1024]
# Bursts of the decode forwards per round besides the round's own (see the module docstring).
DECODE_BURSTS_WITHIN_ROUND = 2
DECODE_TOKENS = 16          # forwards of at most this many tokens are decode batches (forward_shape)


class EngineProbe:
    def __init__(self, config, dtype, device: str, seed: int, quick: bool, selection: bool):
        """selection: also time SpecPV's selection in partial-verification forwards (the grid has
        the summaries and selection operators that price it; CPU only, see `fit_selection_factor`)."""
        import torch

        from profiler.engine.loaders import random_model

        self.config, self.device, self.quick, self.seed = config, device, quick, seed
        self.model = random_model(config, dtype, device, seed).model
        self.generator = torch.Generator().manual_seed(seed)
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        # In a forward, attention also runs slower than alone, more so the more KV it reads: the
        # factor is a table over (query tokens, KV tokens), decode and verification at three KV
        # lengths, prompts along the tokens.
        # Every token count to 8 (a chain's verification of k <= 7): on the 2-core CPU forwards of 5
        # and 7 tokens do not lie between their neighbours (the matmul library's kernels for small
        # row counts: 3 and 7 tokens run slower than 4 and 8), so the ratio is measured, not
        # interpolated, there.
        tokens_axis = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64, 128, 256, 512, 1024]
        kv_axis = [256, 1024, 4096]
        checks = [(5, 1, 700), (10, 1, 300), (3, 4, 900), (8, 3, 200), (2, 1, 1500), (6, 8, 128), (1, 384, 384)]
        if quick:
            tokens_axis, kv_axis, checks = [1, 3, 6, 16, 64, 128], [256, 2048], checks[::2]
        fits_context = lambda n: n < config.max_context
        self.tokens_axis = [t for t in tokens_axis if t <= 64 or fits_context(t)]
        self.kv_axis = [kv for kv in kv_axis if fits_context(kv)] or [config.max_context // 2]
        shapes = {forward_shape(t, kv) for t in self.tokens_axis for kv in self.kv_axis}
        self.forward_s: dict[tuple, list[float]] = {shape: [] for shape in sorted(shapes)}
        # The shapes measure_decode_burst times again within each round of operators.
        self.decode_shapes = [shape for shape in self.forward_s if shape[0] <= DECODE_TOKENS and shape[1] == 1]
        self.check_s: dict[tuple, list[float]] = {c: [] for c in checks if fits_context(c[2])}
        self.batches = [1, 4, 16] if quick else [1, 2, 4, 8, 16]
        self.host_s: dict[int, list[float]] = {b: [] for b in self.batches}
        self.selection_batches = [1, 4] if quick else [1, 4, 16]
        self.selection_contexts = [c for c in ([512, 2048] if quick else [512, 2048, 6144])
                                   if c + 8 <= config.max_context] if selection and device != "cuda" else []
        self.selection_s: dict[tuple, list[float]] = {
            (b, c, k): [] for b in self.selection_batches for c in self.selection_contexts for k in SELECTION_BUDGETS}
        # The machine probe (probe.py) once a round: the speed this bundle was
        # measured at, which a live run's own probe is compared with (sim/validate/machine_speed.py).
        self.machine_probe: list[dict] = []
        self.timing_cache: list[tuple] | None = None      # install_timing_cache

    def measure_round(self) -> None:
        """One round: every whole-forward shape and check, a decoding run per batch, and selection
        in partial-verification forwards."""
        import torch

        from profiler.engine.serving import needed_cache_tokens, speculative_generate
        from profiler.calibrate.timing import timed_forwards

        seconds = self.time_forwards([*self.forward_s, *self.check_s])
        for shape, times in [*self.forward_s.items(), *self.check_s.items()]:
            times.append(seconds[shape])
        # Host time per step: a decoding run's wall time minus its forwards (timed by hooks on the
        # model, synchronized); the acceptance the cost model adds on its own comes off in `fit`.
        prompt_tokens, new_tokens = 128, 12 if self.quick else 24
        if self.device == "cuda":       # the engine's decoding replays graphs there; their replays are timed
            from profiler.engine.graphs import enable_graphs

            enable_graphs(self.model, exact_rows=True)
        with timed_forwards(self.model, self.sync) as forward_s:
            for batch in self.batches:
                prompts = torch.randint(0, self.config.vocab, (batch, prompt_tokens), generator=self.generator).tolist()
                cache_tokens = needed_cache_tokens(prompts, new_tokens, 0, None)
                if self.device == "cuda":     # untimed: the decode shapes' graphs captured on the run's cache
                    speculative_generate(self.model, prompts, 2, None, cache_tokens=cache_tokens)
                forward_s.clear()
                gen = speculative_generate(self.model, prompts, new_tokens, None, cache_tokens=cache_tokens)
                steps = len({s.step for s in gen.steps})
                self.host_s[batch].append((gen.wall_s - gen.prefill_s - sum(forward_s[1:])) / steps)
        for batch in self.selection_batches:
            for context in self.selection_contexts:
                fill_partial_cache(self.model, self.config, batch, context, self.generator, self.device)
                for budget in SELECTION_BUDGETS:     # 30 layers' selections per forward
                    self.selection_s[(batch, context, budget)] += time_selection_in_forward(
                        self.model, self.config, batch, context, budget, self.generator, self.device,
                        forwards=2 if self.quick else 1)
        from profiler.calibrate.probe import measure_probe

        self.machine_probe.append(measure_probe(self.model, self.config, self.device, self.seed))
        self.model.setup_cache(1, 1)     # the decoding runs' and selection's caches released

    def measure_decode_burst(self) -> None:
        """One more burst of every decode forward of the factor's table (batch = tokens <= 16, one
        query token, each KV column), added to their rounds: each is the median over all bursts."""
        seconds = self.time_forwards(self.decode_shapes)
        for shape in self.decode_shapes:
            self.forward_s[shape].append(seconds[shape])

    def time_forwards(self, shapes: list[tuple[int, int, int]]) -> dict[tuple, float]:
        """Seconds of a whole forward at each (batch, query, kv), all on the probe's one timing
        cache (`install_timing_cache`): a forward reads only its own rows and slots of it, as in
        the live engine, whose cache is sized for a whole run. A zeroed cache allocated per shape
        had taken 18 s of a 237 s calibration round here (under cProfile), most of it the first
        touch of new pages."""
        self.install_timing_cache(max(b for b, _, _ in shapes), max(kv for _, _, kv in shapes) + 1)
        # By KV length: on CUDA each length times on a cache of its own length, and its graphs stay
        # captured while the length does (time_forward).
        return {shape: self.time_forward(*shape) for shape in sorted(shapes, key=lambda s: (s[2], s[0], s[1]))}

    def install_timing_cache(self, batch: int, slots: int) -> None:
        """Point every layer at the probe's KV caches [rows, H_kv, slots, D], made once (of the
        largest batch and KV the probe times, or larger when asked) and kept for the whole
        calibration, holding random values: the same in every layer, since only where a forward
        reads them matters to its time. Held throughout, they take what the largest shape took
        at its peak before: 3.0 GB for SmolLM2 in fp32 at batch 16 and 4,096 tokens (1.5 GB
        quick)."""
        import torch

        model = self.model
        if slots > self.config.max_context:
            raise ValueError(f"context {slots} is beyond the model's maximum {self.config.max_context}")
        have = self.timing_cache[0][0].shape if self.timing_cache else None
        if have is None or have[0] < batch or have[2] < slots:
            self.timing_cache = None
            model.setup_cache(1, 1)              # the rotary table; the old cache released first
            shapes = [*self.forward_s, *self.check_s]
            rows = max([batch, *(b for b, _, _ in shapes)])
            slots = max([slots, *(kv + 1 for _, _, kv in shapes)])
            c, weight = self.config, model.lm_head.weight
            shape = (rows, c.kv_heads, slots, c.head_dim)
            values = torch.randn(shape, generator=self.generator).to(weight.device, weight.dtype)
            self.timing_cache = [(values.clone(), values.clone()) for _ in model.layers]
        for layer, (k_cache, v_cache) in zip(model.layers, self.timing_cache):
            layer.attention.k_cache, layer.attention.v_cache = k_cache, v_cache
            layer.attention.block_max = layer.attention.block_min = None

    def time_forward(self, batch: int, query: int, kv: int) -> float:
        """Seconds of one whole forward on the probe's timing cache (see time_forwards)."""
        import torch

        from profiler.calibrate.timing import time_call

        config, device = self.config, self.device
        self.install_timing_cache(batch, kv + 1)
        tokens = torch.randint(0, config.vocab, (batch, query), generator=self.generator).to(device)
        positions = (kv - query + torch.arange(query)).expand(batch, query).to(device)
        logits_at = torch.full((batch,), query - 1, device=device) if query > 64 else None
        prompt = query > 64 and kv == query      # a whole prompt: the engine's prefill path
        forward = lambda: self.model(tokens, positions, logits_at=logits_at, prompt=prompt)    # noqa: E731
        if device == "cuda" and query <= 64:       # decode and verification (the engine's small queries)
            # The attention kernel splits a request's keys by its cache's length (a split per 256
            # slots), which a graph fixes at capture: time it on a cache of kv + 1 slots, as long as
            # the KV it reads, not on the probe's longest (2,049 slots made 8 splits at batch 1 where
            # a live run's 590-slot cache makes 2). A live cache also holds the run's later tokens
            # and its room (some 80 slots at 64 new tokens), which changes the count only where kv
            # lies that close below a multiple of 256.
            for layer in self.model.layers:
                attention = layer.attention
                attention.k_cache, attention.v_cache = attention.k_cache[:, :, :kv + 1], attention.v_cache[:, :, :kv + 1]
            forward = self.graphed_forward(tokens, positions, kv)
        with torch.inference_mode():
            return time_call(forward, device, 0.3).median_s

    def graphed_forward(self, tokens, positions, kv: int):
        """A decode or verify forward as the engine runs it on CUDA: the query's tokens at the
        consecutive slots below kv, in the attention kernel's layout, its layers replayed from a
        CUDA graph of exactly `batch` rows (the engine pads to its capture sizes; the tables price
        the batch as it is), captured on first use and again whenever the timing cache is replaced."""
        import torch

        from profiler.engine.graphs import chain_mask, enable_graphs, forward_new_tokens
        from profiler.engine.model import KernelLayout

        enable_graphs(self.model, exact_rows=True)
        batch, query = tokens.shape
        device = tokens.device
        kernel = KernelLayout(torch.full((batch,), kv, dtype=torch.int32, device=device),
                              chain_mask(query, device).expand(batch, query, query))
        logits_at = torch.arange(query, device=device).expand(batch, query)
        return lambda: forward_new_tokens(self.model, tokens, positions, positions, kernel, logits_at)

    def fit(self, model_name: str, dtype_name: str, hardware: str, bundle: Path) -> tuple[dict, list[dict]]:
        """The fits for meta.json, against the operator tables of `bundle` (the provisional one),
        and the whole forwards at off-grid shapes against the composed prediction."""
        import numpy as np

        from sim.cost.model import calibrated_cost_model
        from sim.cost.stack import build_stacks
        from sim.formats.bundle import load_bundle
        from sim.formats.table import OperatorTable

        cost = calibrated_cost_model(_scenario(model_name, dtype_name, bundle, hardware), load_bundle(bundle))
        # The median over rounds: the operators' median rounds give each term's shape, whole
        # forwards as the engine meets them (the machine's usual state, not its best) the level.
        target = build_stacks(cost.scenario).target
        ratio = {shape: float(np.median(times)) / predicted_forward(cost, target, *shape)
                 for shape, times in self.forward_s.items()}
        factor = [[ratio[forward_shape(t, kv)] for kv in self.kv_axis] for t in self.tokens_axis]
        # The held-out forwards below are priced with the factor just fitted.
        cost.pricer(target).forward_factor = OperatorTable("forward_factor", ("tokens", "kv"),
                                                           [np.asarray(self.tokens_axis, dtype=float),
                                                            np.asarray(self.kv_axis, dtype=float)],
                                                           np.asarray(factor), power_above=0.0)
        forward_checks = [{"batch": b, "query": q, "kv": kv, "measured_s": float(np.median(times)),
                           "predicted_s": predicted_forward(cost, target, b, q, kv)}
                          for (b, q, kv), times in self.check_s.items()]
        accept = cost.bundle.table("accept")
        host = [float(np.median(self.host_s[b])) - (accept(b, 1) if accept is not None else 0.0) for b in self.batches]
        slope, intercept = np.polyfit(self.batches, host, 1)
        # Every burst's seconds per shape, kept for study: decode shapes have more than the others.
        bursts_s = [[self.forward_s[forward_shape(t, kv)] for kv in self.kv_axis] for t in self.tokens_axis]
        fits = {"forward_factor": {"tokens": self.tokens_axis, "kv": self.kv_axis, "factor": factor,
                                   "bursts_s": bursts_s},
                "step_overhead_s": max(0.0, float(intercept)), "request_overhead_s": max(0.0, float(slope)),
                "step_host_s": dict(zip(map(str, self.batches), host))}
        selection = self.fit_selection_factor(cost)
        if selection is not None:
            fits["selection_factor"] = selection
        if self.machine_probe:
            fits["machine_probe"] = {
                "decode_s": float(np.median([r["decode_s"] for r in self.machine_probe])),
                "prompt_s": float(np.median([r["prompt_s"] for r in self.machine_probe])),
                "shapes": self.machine_probe[0]["shapes"],
                "rounds": [{k: r[k] for k in ("decode_s", "prompt_s")} for r in self.machine_probe]}
        return fits, forward_checks

    def fit_selection_factor(self, cost) -> dict | None:
        """SpecPV's selection per layer timed inside partial-verification forwards over the
        selection table's value at the same shape, the median over the budgets, against (batch,
        context). None without the measurements: on CUDA the live engine builds its partial index
        for the attention kernel instead, and its host clock around selection is not synchronized."""
        import numpy as np

        table = cost.bundle.table("selection")
        if not self.selection_contexts or table is None:
            return None
        ratio = {key: float(np.median(times)) / table(*key) for key, times in self.selection_s.items()}
        factor = [[float(np.median([ratio[(b, c, k)] for k in SELECTION_BUDGETS])) for c in self.selection_contexts]
                  for b in self.selection_batches]
        return {"batch": self.selection_batches, "context": self.selection_contexts, "budgets": SELECTION_BUDGETS,
                "factor": factor}


def forward_shape(tokens: int, kv: int) -> tuple[int, int, int]:
    """(batch, query, kv) of the whole forward measured for a forward of `tokens` query tokens."""
    if tokens <= DECODE_TOKENS:
        return tokens, 1, kv                 # decode batches
    if tokens <= 64:
        return 16, tokens // 16, kv          # verification of 16 requests
    return 1, tokens, tokens                 # a prompt (reads itself whatever the KV column)


def predicted_forward(cost, target, batch: int, query: int, kv: int) -> float:
    """The cost model's composed forward of the `target` stack at one shape."""
    from sim.cost.batch import DECODE, PHASES, PREFILL, VERIFY, Group

    if query > 64:      # a prompt: one request's chunk each, logits of its last token
        group = Group(phase=PREFILL, requests=batch, tokens=batch * query, query_max=query, kv_tokens_sum=batch * kv,
                      logits_tokens=batch, query_tokens=[query] * batch, kv_tokens=[kv] * batch)
    else:
        group = Group(phase=DECODE if query == 1 else VERIFY, requests=batch, tokens=batch * query, query_max=query,
                      kv_tokens_sum=batch * kv, logits_tokens=batch * query)
    return cost.forward(target, [group], [0.0] * len(PHASES))


def _scenario(model_name: str, dtype_name: str, bundle: Path, hardware: str):
    """A scenario of this model on this device, reading the bundle (for its composed forwards)."""
    from sim.scenario.load import load_scenario

    return load_scenario({"model": model_name, "dtype": dtype_name, "hardware": hardware, "calibration": str(bundle),
                          "engine": "gpt-fast"})


def fill_partial_cache(model, config, batch: int, context: int, generator, device: str) -> None:
    """A KV cache for `batch` requests with `context` random keys and values each, and every layer's
    block summaries taken at `context`. One cache serves every layer: selection reads its own
    layer's summaries and the step's queries, never the cache, so sharing it changes nothing timed
    and keeps a 16 x 6,144-token setup to one allocation (30 of them took 15 s here)."""
    import torch

    from profiler.calibrate.operators import PARTIAL_BLOCK, SELECTION_QUERY

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
    `context` (the selection operator's own shape, operators.py)."""
    import torch

    from profiler.calibrate.operators import PARTIAL_BLOCK, PARTIAL_SINK, PARTIAL_WINDOW, SELECTION_QUERY
    from profiler.engine.partial import PartialSpec, PartialStep

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
