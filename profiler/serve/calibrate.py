"""`python -m profiler calibrate --engine vllm | llama.cpp`: a real engine priced as a black box,
through its own server (vLLM's `vllm serve`, llama.cpp's `llama-server`).

Nothing inside the engine is timed; what is timed is what a client sees, on the server users run:
  engine_forward  (batch, query, kv): one engine step of `batch` requests that each verify `query`
                  tokens with `kv` tokens of context: the mean gap between a request's streamed
                  chunks while every request of the point is decoding (one chunk a step), pooled
                  over the rounds. The mean, because a run's TPOT is a mean gap and a server's gaps
                  have a long upper tail (vLLM at batch 1: mean 8-15% above the median); pooled,
                  because keeping the fastest round picks the machine's fast minutes. It holds the
                  whole step: scheduling, the forward, sampling, the n-gram proposer, streaming
                  (llama.cpp streams a chunk per token; the client merges a step's tokens).
                  A point at query 1 comes from a server without speculation; a point at query k + 1
                  from a server with n-gram k on prompts whose history always matches (an English
                  phrase repeated, which the model goes on repeating), so that every step drafts k
                  tokens and keeps them. The measured mean query
                  tokens per request-step (1 + draft tokens / steps, from /metrics) may fall short of
                  k + 1 where a proposal is cut; the step times of one (batch, kv) are put on the
                  grid's query axis by a piecewise-linear line through the measured (query, time).
  engine_prefill  (batch 1, tokens): time to first token of a single fresh prompt (no prefix-cache
                  hit), one output token; more requests scale it linearly (the table's extrapolation).
                  Every server without a head times the same prompts when it starts (a drafter
                  does not change the prompt's forward), and each point is the median over all of
                  them: the prefill is priced over the calibration's hour, as the decode points
                  are, not by its first minutes.
With `--head DIR` (vLLM: an EAGLE-1 checkpoint folder), one more server per k drafts with that head,
on the same decode points and prefill points:
  engine_draft          (batch, query, kv): a step's drafting of k = query - 1 tokens (each step
                        verifies query tokens per request): k head forwards, each the slope over
                        k = 2, 4, 6 of what an EAGLE server's mean gap adds to the steps without
                        the head at the same (batch, kv) and measured query (an EAGLE head drafts k
                        tokens every step, so it verifies k + 1): the head's catch-up and its k
                        forwards, and whatever else EAGLE adds to a step;
  engine_draft_prefill  (batch 1, tokens): the EAGLE servers' time to first token (the median over
                        all of them, as above) less the servers' without a head, the same prompts:
                        the head's prefill (and its first drafts).
The bundle has the operator bundle's format (`engine: vllm` or `llama.cpp`, the engine's version in
`versions`); its fits say the steps already hold the host work (no step overhead, no separate n-gram
time). Decode points reuse each server's prompts, so the prefix cache serves their prefill; every
prefill point sends a prompt never seen before. llama.cpp runs with as many slots as the largest
batch.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from profiler.serve import llama_cpp, vllm
from profiler.serve.client import CompletionApi, RequestRecord, run_closed_loop, stream_completion
from profiler.serve.metrics import SpecCounters, scrape_spec_counters
from profiler.serve.server import HOST, SERVED_NAME, EngineServerConfig, ServerProcess
from sim.errors import InputError

BATCH = [1, 2, 4, 8, 16]
PROMPT_TOKENS = [128, 512, 2048]
SPEC_K = [2, 4, 6]
PREFILL_TOKENS = [16, 64, 256, 1024, 2048]
NEW_TOKENS = 96                   # each decode point's output per request
PREFILL_REPEATS = 2               # fresh prompts a server times at each prefill point, over its passes
PHRASE_WORDS = ("time year people way day man thing woman life child world school state family student group "
                "country problem hand part place case week company system program question work number night "
                "point home water room mother area money story fact month book eye job word business side kind "
                "head house friend father power hour game line end member city name team minute idea").split()
QUICK = {"batch": [1, 4, 16], "prompt": [128, 2048], "k": [4], "prefill": [64, 512, 2048]}


@dataclass(frozen=True)
class ServerCalibrateConfig:
    model: Path                      # vllm: a Hugging Face folder (profiler export-hf); llama.cpp: a GGUF file
    engine: str = "vllm"             # vllm | llama.cpp
    venv: Path = Path(".vllm-venv")
    server_bin: Path = llama_cpp.DEFAULT_BINARY
    dtype: str = "fp32"              # vllm's weights (llama.cpp: the GGUF's own)
    threads: int = 2
    port: int = 8391
    quick: bool = False
    rounds: int | None = None        # passes, each starting every server once; their gaps pooled
    head: Path | None = None         # vllm: an EAGLE-1 checkpoint folder, its drafting timed too
    seed: int = 0
    out: Path | None = None


@dataclass
class StepPoint:
    batch: int
    prompt_tokens: int
    k: int                           # the server's drafted tokens per step (0: no speculation)
    method: str                      # the server's drafter: none, ngram or eagle
    step_s: float                    # mean gap between chunks while all requests decode
    query: float                     # mean tokens verified per request-step
    gaps: int                        # gaps the mean is over


def decode_prompts(tok, count: int, tokens: int, seed: int) -> list[list[int]]:
    """`count` prompts of `tokens` ids (`tok`: the model's ChatTokenizer), each a six-word English
    phrase of its own repeated: the model goes on repeating it, so an n-gram drafter proposes k
    tokens at every step and they are kept (random token ids are not repeated: the model writes text
    of its own and n-gram rarely drafts)."""
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(count):
        ids = tok.encode(" " + " ".join(rng.choice(PHRASE_WORDS, 6)) + ".")
        prompts.append((ids * (tokens // len(ids) + 1))[:tokens])
    return prompts


def fresh_prompt(tokens: int, seed: int, vocab_low: int = 1000, vocab_high: int = 30000) -> list[int]:
    """A prompt of random ordinary tokens: no prefix any earlier request had (no cache hit)."""
    return [int(x) for x in np.random.default_rng(seed).integers(vocab_low, vocab_high, tokens)]


def all_decoding_gaps(records: list[RequestRecord]) -> list[float]:
    """Gaps between consecutive chunks of each request that lie inside the window where every
    request has had its first token and none has had its last: steps of exactly this batch."""
    start = max(r.chunk_s[0] for r in records)
    end = min(r.chunk_s[-1] for r in records)
    gaps = []
    for r in records:
        times = np.asarray(r.chunk_s)
        inside = times[(times >= start) & (times <= end)]
        gaps += list(np.diff(inside))
    return gaps


def measure_step(server: EngineServerConfig, url: str, prompts: list[list[int]], batch: int, prompt_tokens: int,
                 k: int, method: str) -> StepPoint:
    """One decode point: `batch` requests at once, each of `prompt_tokens` tokens, NEW_TOKENS out."""
    chosen = [p[:prompt_tokens] for p in prompts[:batch]]
    # The prompts prefilled first (one output token each), so that the timed requests find them
    # cached (vLLM's prefix cache; llama.cpp's slot that just served the prompt) and all decode
    # within a step of each other: 16 prefills of 2,048 tokens take over a minute on this CPU,
    # and the first requests would finish before the last started.
    run_closed_loop(HOST, server.port, chosen, batch, 1, SERVED_NAME, server.api)
    before = scrape_spec_counters(url, server.metrics_prefix) if k else SpecCounters()
    records, _ = run_closed_loop(HOST, server.port, chosen, batch, NEW_TOKENS, SERVED_NAME, server.api)
    failed = [r for r in records if r.error or not r.chunk_s]
    if failed:
        raise InputError("--model", f"a calibration request failed ({failed[0].error or 'no output'})")
    counters = scrape_spec_counters(url, server.metrics_prefix).minus(before) if k else SpecCounters()
    request_steps = sum(len(r.chunk_s) - 1 for r in records)
    query = 1.0 + counters.draft_tokens / max(request_steps, 1)
    gaps = all_decoding_gaps(records)
    if not gaps:
        # A point whose requests never all decoded together (too few steps): the steps of each.
        gaps = [g for r in records for g in r.itl_s]
    return StepPoint(batch, prompt_tokens, k, method, float(np.mean(gaps)), float(query), len(gaps))


def measure_prefill(port: int, api: CompletionApi, tokens: int, seed: int, repeats: int) -> list[float]:
    """Times to first token of `repeats` single fresh prompts of `tokens` tokens."""
    times = []
    for r in range(repeats):
        record = RequestRecord(0, tokens)
        started = time.perf_counter()
        stream_completion(HOST, port, fresh_prompt(tokens, seed + r), 1, record, started, SERVED_NAME, api)
        if record.error or record.ttft_s is None:
            raise InputError("--model", f"a prefill request failed ({record.error or 'no output'})")
        times.append(record.ttft_s)
    return times


def server_passes(servers: list[tuple[str, int]], rounds: int) -> list[list[tuple[str, int]]]:
    """The servers each pass starts, every one once, in turn in their order and reversed: a
    calibration takes an hour on a CPU whose speed drifts by tens of percent over minutes, and in a
    fixed order the first server would price the plain engine by the hour's start and the last the
    drafters by its end. Balanced, each server's starts average to the middle of the order (over an
    even number of passes), which cancels a linear drift where the servers take equal times."""
    return [list(servers) if r % 2 == 0 else list(reversed(servers)) for r in range(rounds)]


def prefill_prompts_per_start(rounds: int) -> int:
    """Fresh prompts a server times at each prefill point when it starts: PREFILL_REPEATS a server
    over its passes, at least one a start."""
    return max(1, -(-PREFILL_REPEATS // rounds))


def prefill_drafter(method: str) -> str:
    """Whose prefill a server times: an EAGLE head adds its own forward over the prompt; an n-gram
    drafter adds nothing to it."""
    return "eagle" if method == "eagle" else "none"


def pooled_prefill(samples: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    """Each prefill point's median over every server's prompts, by drafter."""
    return {drafter: {t: float(np.median(times)) for t, times in sorted(points.items())}
            for drafter, points in samples.items()}


def pooled(rounds: list[StepPoint]) -> StepPoint:
    """One point's rounds as one: the mean gap and mean query over all their gaps."""
    weights = np.array([p.gaps for p in rounds], dtype=float)
    weights = weights if weights.sum() > 0 else np.ones(len(rounds))
    first = rounds[0]
    return StepPoint(first.batch, first.prompt_tokens, first.k, first.method,
                     float(np.average([p.step_s for p in rounds], weights=weights)),
                     float(np.average([p.query for p in rounds], weights=weights)), int(sum(p.gaps for p in rounds)))


def on_query_axis(points: list[StepPoint], query_axis: list[int]) -> list[float]:
    """Step times of one (batch, kv) at the grid's query values: a piecewise-linear line through the
    measured (mean query, time), extended past the ends by its end segments."""
    points = sorted(points, key=lambda p: p.query)
    q = np.array([p.query for p in points])
    t = np.array([p.step_s for p in points])
    out = []
    for x in query_axis:
        if len(q) == 1:
            out.append(float(t[0]))
            continue
        i = int(np.clip(np.searchsorted(q, x) - 1, 0, len(q) - 2))
        slope = (t[i + 1] - t[i]) / max(q[i + 1] - q[i], 1e-9)
        out.append(float(max(t[i] + slope * (x - q[i]), 1e-6)))
    return out


def head_forward_s(eagle: list[StepPoint], plain: list[StepPoint]) -> float:
    """One EAGLE head forward's time at one (batch, kv): the least-squares slope through the origin
    of what the EAGLE steps add over the steps without the head (`plain`, at the same mean query)
    against k. A chain of k runs k head forwards a step, and one server's difference alone is the
    size of the drift between servers at k = 2 (0-48 ms on steps of 40-500 ms, 2026-12-04)."""
    ks = np.array([e.k for e in eagle], dtype=float)
    added = np.array([e.step_s - on_query_axis(plain, [e.query])[0] for e in eagle])
    return float(max((ks * added).sum() / (ks * ks).sum(), 1e-6))


def server_for(config: ServerCalibrateConfig, k: int, max_model_len: int, slots: int,
               method: str = "ngram") -> EngineServerConfig:
    """The engine's server drafting k tokens by n-gram or (vLLM) the EAGLE head (k 0: no speculation)."""
    if config.engine == "vllm":
        speculative = None if not k else vllm.eagle_config(config.head, k) if method == "eagle" else vllm.ngram_config(k)
        return vllm.VllmServerConfig(model=config.model, venv=config.venv, port=config.port,
                                     dtype=vllm.DTYPES[config.dtype], max_model_len=max_model_len,
                                     threads=config.threads, seed=config.seed, speculative=speculative)
    return llama_cpp.LlamaServerConfig(model=config.model, binary=config.server_bin, port=config.port,
                                       parallel=slots, max_model_len=max_model_len, threads=config.threads,
                                       seed=config.seed, speculative=llama_cpp.ngram_simple(k) if k else None)


def server_tables(steps: list[StepPoint], prefill: dict[str, dict[int, float]], batches: list[int],
                  prompt_axis: list[int], ks: list[int], prefill_axis: list[int], rounds: int):
    """The bundle's profile (one row a grid point) and grid from the measured decode points and
    prefill times: engine_forward on the grid's query axis (on_query_axis), engine_prefill, and
    with EAGLE points engine_draft and engine_draft_prefill."""
    import pandas as pd

    from sim.formats.bundle import COLUMNS

    query_axis = [1, *[k + 1 for k in ks]]
    kv_axis = [p + NEW_TOKENS // 2 for p in prompt_axis]
    rows = []
    for b in batches:
        for p, kv in zip(prompt_axis, kv_axis):
            mine = [s for s in steps if s.batch == b and s.prompt_tokens == p and s.method != "eagle"]
            for q, seconds in zip(query_axis, on_query_axis(mine, query_axis)):
                rows.append({"op": "engine_forward", "batch": b, "query": q, "kv": kv, "seconds": seconds})
            eagle = [s for s in steps if s.batch == b and s.prompt_tokens == p and s.method == "eagle"]
            if eagle:
                forward_s = head_forward_s(eagle, mine)
                rows += [{"op": "engine_draft", "batch": b, "query": e.k + 1, "kv": kv, "seconds": e.k * forward_s}
                         for e in eagle]
    rows += [{"op": "engine_prefill", "batch": 1, "tokens": t, "seconds": s} for t, s in prefill["none"].items()]
    rows += [{"op": "engine_draft_prefill", "batch": 1, "tokens": t, "seconds": max(s - prefill["none"][t], 1e-6)}
             for t, s in prefill.get("eagle", {}).items()]
    frame = pd.DataFrame([{**{c: np.nan for c in COLUMNS}, "spread": np.nan, "runs": rounds, "held_out": False, **r}
                          for r in rows])[list(COLUMNS)]
    grid = {"engine_forward": {"batch": batches, "query": query_axis, "kv": kv_axis},
            "engine_prefill": {"batch": [1], "tokens": prefill_axis}}
    if prefill.get("eagle"):
        grid |= {"engine_draft": {"batch": batches, "query": query_axis[1:], "kv": kv_axis},
                 "engine_draft_prefill": {"batch": [1], "tokens": prefill_axis}}
    return frame, grid


def calibrate_server(config: ServerCalibrateConfig) -> Path:
    """Start one server per speculative setting (none, n-gram k for each k, EAGLE k with a head) in
    every pass, in counterbalanced order (server_passes), time its prefill and decode points, pool
    each point over the passes, and write the bundle."""
    from tqdm import tqdm

    from profiler.calibrate.run import bundle_meta
    from profiler.device import cpu_model
    from profiler.serve.run import stopped_by_sigterm, read_engine_model
    from sim.formats.bundle import write_bundle
    from sim.formats.provenance import repo_relative
    from sim.scenario.presets.models import preset_with_shape
    from sim.formats.names import scenario_dtype

    if config.engine == "vllm" and config.dtype not in vllm.DTYPES:
        raise InputError("--dtype", f"vLLM's CPU build is calibrated in {', '.join(vllm.DTYPES)} (got {config.dtype})")
    if config.rounds is not None and config.rounds < 1:
        raise InputError("--rounds", f"must be at least 1 (got {config.rounds})")
    if config.head is not None and config.engine != "vllm":
        raise InputError("--head", "an EAGLE head is calibrated on vLLM's server only")
    out = config.out or Path("calibration") / f"cpu-{config.engine.replace('.', '-')}" / config.model.stem
    if out.exists() and any(out.iterdir()):
        raise InputError("--out", f"{out} exists; give a new folder")
    batches, prompt_axis, ks, prefill_axis = BATCH, PROMPT_TOKENS, SPEC_K, PREFILL_TOKENS
    if config.quick:
        batches, prompt_axis, ks, prefill_axis = QUICK["batch"], QUICK["prompt"], QUICK["k"], QUICK["prefill"]
    rounds = config.rounds or (1 if config.quick else 2)
    longest = max(prompt_axis[-1], prefill_axis[-1]) + NEW_TOKENS + max(ks) + 1
    max_model_len = int(2 ** np.ceil(np.log2(longest)))
    servers = [("none", 0), *[("ngram", k) for k in ks], *[("eagle", k) for k in (ks if config.head else [])]]
    for method, k in servers:
        server_for(config, k, max_model_len, max(batches), method).check()    # every server's input, before any starts
    base = server_for(config, 0, max_model_len, max(batches))
    tok, shape, dtype, _ = read_engine_model(config.engine, config.model, config.dtype)
    bundle_dtype = scenario_dtype(dtype)

    started = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    prompts = decode_prompts(tok, max(batches), prompt_axis[-1], config.seed)
    prefill_samples: dict[str, dict[int, list[float]]] = {}
    decode_points = [(b, p) for b in batches for p in prompt_axis]
    per_start = prefill_prompts_per_start(rounds)
    total = rounds * len(servers) * (len(decode_points) + len(prefill_axis))
    by_point: dict[tuple, list[StepPoint]] = {}
    with stopped_by_sigterm(), tqdm(total=total, desc=f"{config.engine} engine", unit="point") as bar:
        for pass_index, order in enumerate(server_passes(servers, rounds)):
            for method, k in order:
                server_config = server_for(config, k, max_model_len, max(batches), method)
                with ServerProcess(server_config) as server:
                    measure_step(server_config, server.url, prompts, 1, 32, k, method)          # warm-up
                    samples = prefill_samples.setdefault(prefill_drafter(method), {})
                    for i, tokens in enumerate(prefill_axis):
                        # The same fresh prompts on every server in a pass (the difference with a
                        # head is the head's), new ones each pass.
                        seed = config.seed + 1000 * (i + 1) + 100 * pass_index
                        samples.setdefault(tokens, []).extend(
                            measure_prefill(config.port, server_config.api, tokens, seed, per_start))
                        bar.update()
                    for i in rng.permutation(len(decode_points)):
                        b, p = decode_points[int(i)]
                        by_point.setdefault((method, k, b, p), []).append(
                            measure_step(server_config, server.url, prompts, b, p, k, method))
                        bar.update()
    steps = [pooled(measured) for measured in by_point.values()]

    prefill = pooled_prefill(prefill_samples)
    frame, grid = server_tables(steps, prefill, batches, prompt_axis, ks, prefill_axis, rounds)
    model_name = preset_with_shape(shape.__dict__) or repo_relative(config.model)
    meta = bundle_meta(shape, model_name, bundle_dtype, "cpu", cpu_model(), grid, rounds, config.quick, config.seed)
    meta["engine"] = config.engine
    meta["versions"][config.engine] = base.version()
    meta["cpu"]["threads"] = config.threads
    meta["weights"] = dtype
    meta["fits"] = {"step_overhead_s": 0.0, "request_overhead_s": 0.0, "host_work_in_steps": True}
    meta["measured_steps"] = [s.__dict__ for s in steps]
    if config.head is not None:
        meta["draft_head"] = repo_relative(config.head)
        meta["draft_estimator"] = "k x the least-squares slope over k of what the EAGLE steps add (head_forward_s)"
    meta["measured_prefill"] = {method: {str(t): s for t, s in points.items()} for method, points in prefill.items()}
    meta["prefill_estimator"] = (f"median time to first token over every server's {per_start * rounds} fresh prompts, "
                                 f"{per_start} a start over {rounds} counterbalanced passes "
                                 f"({sum(1 for m, _ in servers if prefill_drafter(m) == 'none')} servers without a head)")
    meta["step_estimator"] = "mean gap, pooled over passes"
    meta["server_order"] = [f"{m} k{k}" if k else m for m, k in servers]
    meta["server_order_note"] = "each pass starts every server once; passes alternate this order and its reverse"
    meta.update(held_out={}, new_tokens=NEW_TOKENS, max_model_len=max_model_len,
                duration_s=round(time.perf_counter() - started, 1))
    if config.engine == "llama.cpp":
        meta["slots"] = max(batches)
    write_bundle(out, frame, meta)
    print(f"{out}: {config.engine} {meta['versions'][config.engine]} black box, {len(steps)} decode points and {len(prefill['none'])} prefill "
          f"points in {meta['duration_s']:.0f} s")
    print(json.dumps({f"b{s.batch} p{s.prompt_tokens} {s.method} k{s.k}": f"{s.step_s * 1e3:.1f} ms at q {s.query:.2f}"
                      for s in steps}, indent=1))
    return out
