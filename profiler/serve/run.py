"""`python -m profiler serve-live`: a real engine's server (vLLM's or llama.cpp's), driven as users
run it, recorded as run folders (sim/formats/run_folder.py).

A study is every drafter (n-gram at each --k, and with --baseline no speculation) at every setting
(context x load). Each drafter's server starts once and serves every setting in turn, or with
--interleave starts afresh for each setting, the drafters of one setting back to back (paired
measurements where the machine's speed drifts over minutes). A server is started and warmed up on
its first setting's shape (warm_up_prompts), and per setting its speculative counters are read,
the client runs (closed loop at --batch concurrent requests, or Poisson arrivals at --rate) and
the counters are read again. Every drafter
of a setting gets the same prompts; a later setting takes prompts after the earlier ones', so no
prefix cache holds them. A run folder holds, per request, prompt and output tokens, TTFT, TPOT and
the inter-step latencies; the counters' difference (drafts, draft tokens, accepted, accepted per
position); the server's log of the run; and the outputs. A server sees its steps, the client does
not: steps.parquet is empty, and `tokens_per_step` comes from the counters.
"""
from __future__ import annotations

import contextlib
import json
import platform
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from profiler.live.config import DEFAULT_PROMPTS
from profiler.serve import llama_cpp, vllm
from profiler.serve.client import RequestRecord, run_closed_loop, run_poisson
from profiler.serve.metrics import SpecCounters, scrape_spec_counters
from profiler.serve.server import HOST, SERVED_NAME, EngineServerConfig, ServerProcess
from sim.errors import InputError
from sim.formats.provenance import REPO_ROOT, git_revision, repo_relative

# A server's first forwards of a shape run slower (about a quarter for vLLM's first wave of four
# 512-token prompts, 2026-12-02), so it first serves the first setting's shape: its first wave's
# prompt lengths at its concurrency, up to this many prompt tokens, with tokens of their own.
WARM_UP_PROMPT_TOKENS = 4096
WARM_UP_NEW_TOKENS = 8
POISSON_SLOTS = 16           # llama.cpp's slots for a study of Poisson runs only


class ServeConfig(BaseModel):
    """One serve-live run. Field names are the command line's flags (underscored)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["vllm", "llama.cpp"] = "vllm"
    model: Path                          # vllm: a Hugging Face folder (profiler export-hf); llama.cpp: a GGUF file
    venv: Path = Path(".vllm-venv")      # vllm: its virtual environment
    server_bin: Path = llama_cpp.DEFAULT_BINARY   # llama.cpp: its llama-server
    parallel: int | None = None          # llama.cpp: slots (default: the study's largest batch)
    method: Literal["none", "ngram", "eagle"] = "ngram"
    head: Path | None = None             # eagle (vllm): EAGLE-1's checkpoint folder (profiler export-hf --head)
    k: int = 4                           # drafted tokens per step
    prompt_lookup_min: int = 2           # ngram: shortest n-gram matched (llama.cpp: the n-gram looked up)
    prompt_lookup_max: int = 4           # ngram: longest n-gram matched (vllm only)
    batch: int | None = 1                # closed loop: requests in flight
    rate: float | None = None            # open loop: Poisson arrivals per second (instead of batch)
    prompts: Path = DEFAULT_PROMPTS      # JSONL with `prompt` or `turns`, optional `category`
    limit: int | None = None             # the first N prompts
    first_prompt: int = 0                # JSONL: prompts skipped before the first one used
    text_start: int = 0                  # long-context: tokens of the text skipped before the first excerpt
    context: int | None = None           # long-context mode: prompts of this many tokens cut from `text`
    text: Path | None = None
    max_new_tokens: int = 64
    baseline: bool = False               # also run the server without speculation: speedup
    interleave: bool = False             # a server start per setting, the drafters of a setting back to back
    bracket: bool = False                # the baseline runs before the speculative servers and again after
    after: bool = False                  # this run is a bracket's second baseline (folder none-after-...)
    dtype: Literal["fp32", "bf16"] = "fp32"      # vllm: the weights' dtype (llama.cpp: the GGUF's own)
    threads: int = 2
    max_model_len: int = 2048
    port: int = 8391
    server_args: tuple[str, ...] = ()    # more arguments for the server's command line, as given
    seed: int = 0
    out: Path

    def recorded(self) -> dict:
        values = self.model_dump(mode="json")
        for name in ("model", "venv", "server_bin", "prompts", "text", "head", "out"):
            values[name] = repo_relative(getattr(self, name))
        if self.model == smollm2_gguf():
            values["model"] = "smollm2"          # the package's file, wherever it is installed
        if self.context is not None:
            values["prompts"] = None
        if self.engine == "vllm":
            values.update(server_bin=None, parallel=None)
        else:
            values.update(venv=None, dtype=None)
        return values

    @property
    def drafter(self) -> str:
        if self.method == "none":
            return "none-after" if self.after else "none"
        return f"{self.method}-k{self.k}"

    def server_config(self, log: Path | None = None) -> EngineServerConfig:
        """The engine's server for this run's drafter."""
        drafting = self.method != "none"
        if self.engine == "vllm":
            speculative = None
            if self.method == "ngram":
                speculative = vllm.ngram_config(self.k, self.prompt_lookup_min, self.prompt_lookup_max)
            elif self.method == "eagle":
                speculative = vllm.eagle_config(self.head, self.k)
            return vllm.VllmServerConfig(model=self.model, venv=self.venv, port=self.port, dtype=vllm.DTYPES[self.dtype],
                                         max_model_len=self.max_model_len, threads=self.threads, seed=self.seed,
                                         speculative=speculative, extra_args=self.server_args, log=log)
        speculative = llama_cpp.ngram_simple(self.k, self.prompt_lookup_min) if drafting else None
        return llama_cpp.LlamaServerConfig(model=self.model, binary=self.server_bin, port=self.port,
                                           parallel=self.parallel or 1, max_model_len=self.max_model_len,
                                           threads=self.threads, seed=self.seed, speculative=speculative,
                                           extra_args=self.server_args, log=log)


def smollm2_gguf() -> Path | None:
    from profiler.engine.gguf_loader import ModelLoadError, smollm2_path

    try:
        return smollm2_path()
    except ModelLoadError:
        return None


def check_serve_config(config: ServeConfig) -> None:
    for name in ("k", "max_new_tokens", "threads", "prompt_lookup_min", "prompt_lookup_max", "max_model_len"):
        if getattr(config, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}", f"must be at least 1 (got {getattr(config, name)})")
    if config.prompt_lookup_min > config.prompt_lookup_max:
        raise InputError("--prompt-lookup-min", "must not exceed --prompt-lookup-max")
    if config.text_start < 0:
        raise InputError("--text-start", f"must be non-negative (got {config.text_start})")
    if config.limit is not None and config.limit < 1:
        raise InputError("--limit", f"must be at least 1 (got {config.limit})")
    if config.seed < 0:
        raise InputError("--seed", f"must be non-negative (got {config.seed})")
    if (config.batch is None) == (config.rate is None):
        raise InputError("--rate", "give either --batch (closed loop) or --rate (Poisson arrivals), not both")
    if config.batch is not None and config.batch < 1:
        raise InputError("--batch", f"must be at least 1 (got {config.batch})")
    if config.rate is not None and not config.rate > 0:
        raise InputError("--rate", f"must be positive (got {config.rate})")
    if (config.context is None) != (config.text is None):
        raise InputError("--context", "long-context mode needs both --context and --text")
    if config.out.exists():
        raise InputError("--out", f"{config.out} exists; give a new folder")
    if config.method == "eagle" and config.engine != "vllm":
        raise InputError("--method", "eagle runs on vLLM's server only (llama.cpp's server drafts with n-grams here)")
    if config.method == "eagle" and config.head is None:
        raise InputError("--head", "--method eagle needs --head DIR: an EAGLE-1 checkpoint folder "
                                   "(python -m profiler export-hf --head HEAD --out DIR writes one)")
    if config.parallel is not None and config.parallel < 1:
        raise InputError("--parallel", f"must be at least 1 (got {config.parallel})")
    if config.engine == "llama.cpp" and config.batch is not None and config.batch > (config.parallel or 1):
        raise InputError("--parallel", f"{config.parallel} slots cannot serve {config.batch} requests at once")


def settings_of(values: dict) -> list[ServeConfig]:
    """The command line's runs: every drafter (n-gram at each --k, and with --baseline none) at every
    context (or none) with every batch or rate, drafter by drafter. One run is written to --out
    (its baseline only into its summary); several to --out/NAME each (NAME: drafter, context, load,
    e.g. ngram-k4-c512-b8: unique across a study), and then --limit must say how many prompts each
    setting takes."""
    loads = [("batch", b) for b in values.pop("batch") or []] + [("rate", r) for r in values.pop("rate") or []]
    loads = loads or [("batch", 1)]
    contexts = values.pop("context") or [None]
    out = values.pop("out")
    limits = values.pop("limit") or [None]
    ks = values.pop("k")
    ks = [ks] if isinstance(ks, int) else list(ks)
    if len(limits) not in (1, len(loads)):
        raise InputError("--limit", f"give one value or one per load ({len(loads)}), not {len(limits)}")
    limits = limits * len(loads) if len(limits) == 1 else limits
    settings = [(c, kind, v, n) for c in contexts for (kind, v), n in zip(loads, limits)]
    if values.get("bracket") and (not values.get("baseline") or values["method"] == "none"):
        raise InputError("--bracket", "brackets speculative runs with their baseline: give --baseline and a drafter")
    baseline = ("none", ks[0], False)            # (method, k, a bracket's second pass)
    drafters = [baseline] if values["method"] == "none" else [(values["method"], k, False) for k in ks]
    several = len(settings) * len(drafters) > 1
    if values.get("bracket"):
        # The baseline first and last, so a speedup is over the mean of two baselines around it:
        # the machine's drift over the setting's minutes cancels to first order.
        drafters = [baseline] + drafters + [("none", ks[0], True)]
        several = True
    elif several and values.get("baseline") and values["method"] != "none":
        drafters.append(baseline)      # the baseline's runs are folders of their own
    if several and limits[0] is None:
        raise InputError("--limit", "several runs need --limit: the prompts each run takes")
    if several and Path(out).exists():
        raise InputError("--out", f"{out} exists; give a new folder")
    if values.get("parallel") is None and values.get("engine") == "llama.cpp":
        batches = [v for kind, v in loads if kind == "batch"]
        values["parallel"] = max(batches + ([POISSON_SLOTS] if len(batches) < len(loads) else []))
    configs = []
    for method, k, after in drafters:
        for context, kind, value, limit in settings:
            load = {"batch": value, "rate": None} if kind == "batch" else {"batch": None, "rate": value}
            config = ServeConfig(**{**values, "method": method}, k=k, after=after, **load, context=context, limit=limit,
                                 out=out)
            name = f"{config.drafter}-" + (f"c{context}-" if context is not None else "") + \
                (f"b{value}" if kind == "batch" else f"r{value:g}")
            configs.append(config.model_copy(update={"out": Path(out) / name}) if several else config)
    return configs


def build_prompts(config: ServeConfig, tok) -> tuple[list[list[int]], list[dict]]:
    """Token-id prompts and their rows, as `profiler live` builds them."""
    from profiler.live.prompts import long_context_prompts, read_prompts

    if config.context is not None:
        count = config.limit or 4
        prompts = long_context_prompts(tok, config.text, config.context, count, config.text_start)
        rows = [{"text": None, "category": f"context-{config.context}"} for _ in prompts]
    else:
        rows = read_prompts(config.prompts, None)[config.first_prompt:]
        rows = rows[:config.limit] if config.limit is not None else rows
        if not rows:
            raise InputError("--prompts", f"{config.prompts} has no prompts past the first {config.first_prompt}")
        prompts = [tok.encode_chat(r["text"]) for r in rows]
    longest = max(len(p) for p in prompts) + config.max_new_tokens + config.k + 1
    if longest > config.max_model_len:
        raise InputError("--max-model-len", f"{config.max_model_len} is below the longest request "
                                            f"({longest} tokens with its output and drafts)")
    return prompts, rows


def serve_settings(configs: list[ServeConfig]) -> list[dict]:
    """A study (settings_of): every drafter's server serves every setting, each setting on prompts
    of its own shared by its drafters; each run is written to its own folder. Returns the summaries
    of the runs written."""
    import pandas as pd

    from sim.formats.run_folder import write_run_folder

    for config in configs:
        check_serve_config(config)
    first = configs[0]
    for config in {c.drafter: c for c in configs}.values():
        config.server_config().check()                 # every drafter's server, before any starts
    tok, meta = engine_model(first)
    drafters = list(dict.fromkeys(c.drafter for c in configs))
    settings = [c for c in configs if c.drafter == drafters[0]]
    placed, prompt_sets = place_prompts(settings, tok)
    starts = {"first_prompt": [c.first_prompt for c in placed], "text_start": [c.text_start for c in placed]}
    configs = [c.model_copy(update={name: starts[name][i % len(settings)] for name in starts})
               for i, c in enumerate(configs)]
    baseline_only = len(configs) == 1 and first.baseline and first.method != "none"
    if baseline_only:
        configs.append(first.model_copy(update={"method": "none"}))     # the baseline, into the summary only
        drafters.append("none")
    by_drafter = {d: [c for c in configs if c.drafter == d] for d in drafters}

    # The servers' logs stay here until the folders are written; a failed run keeps them for its message.
    scratch = Path(tempfile.mkdtemp(prefix="serve-live-"))
    results: dict[str, list] = {d: [None] * len(settings) for d in drafters}
    summaries = []

    def write_setting(i: int) -> None:
        """Setting i's run folders, one per drafter (a single run's baseline only in its summary)."""
        for d in drafters:
            if baseline_only and d == "none":
                continue
            config = by_drafter[d][i]
            records, wall_s, counters, log_text = results[d][i]
            baselines = [results[b][i] for b in ("none", "none-after") if b in results] if config.method != "none" else []
            summary = summarize(config, records, wall_s, counters, baselines)
            rows = prompt_sets[i][1]
            requests = pd.DataFrame([request_row(r, rows[r.request]) for r in records])
            outputs = [{"request": r.request, "text": r.text, "tokens": r.tokens} for r in records]
            logs = {"server.log": repo_relative_text(log_text)}
            if baseline_only:
                logs["server-baseline.log"] = repo_relative_text(baselines[0][3])
            write_run_folder(config.out, pd.DataFrame(columns=["run", "request", "step"]), requests, summary, outputs,
                             {**meta, "arguments": config.recorded()}, extra_files=logs)
            print(json.dumps({"out": repo_relative(config.out),
                              **{k: v for k, v in summary.items() if k != "spec_decode"}}, indent=2))
            summaries.append(summary)

    with stopped_by_sigterm():
        if first.interleave:
            # A setting's folders are written as soon as its drafters have run: a later failure keeps them.
            for i in range(len(settings)):
                for d in drafters:
                    results[d][i] = run_server([by_drafter[d][i]], [prompt_sets[i]], scratch / f"server-{d}.log")[0]
                write_setting(i)
        else:
            for d in drafters:
                results[d] = run_server(by_drafter[d], prompt_sets, scratch / f"server-{d}.log")
            for i in range(len(settings)):
                write_setting(i)
    shutil.rmtree(scratch, ignore_errors=True)
    return summaries


def repo_relative_text(text: str) -> str:
    """A server's log with this machine's absolute paths taken out (its warnings name the venv's
    files and the Python installation's), as every path a result records is relative to the
    repository: the checkout's prefix dropped, the installation's written <python>."""
    import sys

    return text.replace(f"{REPO_ROOT}/", "").replace(f"{sys.base_prefix}/", "<python>/")


def place_prompts(configs: list[ServeConfig], tok) -> tuple[list[ServeConfig], list[tuple]]:
    """Each setting's prompts, a later setting's after the earlier ones' (JSONL lines, or tokens of
    the text), and the configs with where theirs start."""
    from profiler.live.prompts import long_context_frame

    frame = sum(len(part) for part in long_context_frame(tok))
    placed, prompt_sets = [], []
    line, text_token = configs[0].first_prompt, configs[0].text_start
    for config in configs:
        config = config.model_copy(update={"first_prompt": line, "text_start": text_token})
        prompts, rows = build_prompts(config, tok)
        if config.context is not None:
            text_token += len(prompts) * (config.context - frame)
        else:
            line += len(prompts)
        placed.append(config)
        prompt_sets.append((prompts, rows))
    return placed, prompt_sets


def warm_up_prompts(config: ServeConfig, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """The warm-up's prompts and concurrency: the setting's first wave (its concurrency, or two
    for Poisson arrivals) at its prompts' lengths, within WARM_UP_PROMPT_TOKENS, of seeded random
    tokens no timed prompt shares a prefix with (prefix caching stays cold for them)."""
    concurrency = config.batch if config.rate is None else 2
    lengths, total = [], 0
    for prompt in prompts[:concurrency]:
        if lengths and total + len(prompt) > WARM_UP_PROMPT_TOKENS:
            break
        lengths.append(len(prompt))
        total += len(prompt)
    rng = np.random.default_rng(config.seed + 1)
    return [rng.integers(1000, 30000, n).tolist() for n in lengths], len(lengths)


def warm_up(server_config: EngineServerConfig, config: ServeConfig, prompts: list[list[int]], log: Path) -> None:
    """The warm-up wave (warm_up_prompts), untimed and uncounted: the counters are read after it."""
    warm, concurrency = warm_up_prompts(config, prompts)
    records, _ = run_closed_loop(HOST, server_config.port, warm, concurrency, WARM_UP_NEW_TOKENS, SERVED_NAME,
                                 server_config.api)
    failed = [r.error for r in records if r.error]
    if failed:
        raise InputError("--model", f"the server's warm-up requests failed ({failed[0]}); log: {log}")


def run_server(configs: list[ServeConfig], prompt_sets: list[tuple], log: Path) -> list[tuple]:
    """One server (configs[0]'s drafter) serving every setting in turn: start, warm up, then per
    setting counters, client, counters; stop. Returns per setting (records, wall seconds, counters,
    the log written since the previous setting, the server's start for the first). A request that
    fails or comes back short is one line naming the server's log."""
    server_config = configs[0].server_config(log)
    api, prefix = server_config.api, server_config.metrics_prefix
    results = []
    log_start = log.stat().st_size if log.exists() else 0
    with ServerProcess(server_config) as server:
        warm_up(server_config, configs[0], prompt_sets[0][0], log)
        for config, (prompts, _) in zip(configs, prompt_sets):
            before = scrape_counters(server.url, prefix, log)
            if config.rate is not None:
                records, wall_s = run_poisson(HOST, config.port, prompts, config.rate, config.max_new_tokens,
                                              SERVED_NAME, config.seed, api)
            else:
                records, wall_s = run_closed_loop(HOST, config.port, prompts, config.batch, config.max_new_tokens,
                                                  SERVED_NAME, api)
            counters = scrape_counters(server.url, prefix, log).minus(before)
            for r in records:
                if r.error is None and len(r.tokens) != config.max_new_tokens:
                    r.error = f"{len(r.tokens)} of {config.max_new_tokens} tokens came back"
            failed = [r for r in records if r.error]
            if failed:
                raise InputError("--model", f"{len(failed)} of {len(records)} requests failed (first: {failed[0].error}); "
                                            f"log: {log}")
            log_end = log.stat().st_size
            results.append([records, wall_s, counters, log_start, log_end])
            log_start = log_end
    # The server's last lines (its shutdown) go with the last setting.
    results[-1][4] = log.stat().st_size
    with log.open("rb") as handle:
        texts = []
        for *_, start, end in results:
            handle.seek(start)
            texts.append(handle.read(end - start).decode(errors="replace"))
    return [(records, wall_s, counters, text) for (records, wall_s, counters, _, _), text in zip(results, texts)]


def scrape_counters(url: str, prefix: str, log: Path) -> SpecCounters:
    try:
        return scrape_spec_counters(url, prefix)
    except OSError as exc:
        raise InputError("--model", f"the server's /metrics could not be read ({exc}); log: {log}") from None


@contextlib.contextmanager
def stopped_by_sigterm():
    """SIGTERM (a CI cancel, `timeout`) raises SystemExit here, so every server is stopped on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def request_row(r: RequestRecord, row: dict) -> dict:
    itl = r.itl_s
    return {"request": r.request, "category": row["category"], "prompt_tokens": r.prompt_tokens,
            "output_tokens": len(r.tokens), "ttft_s": r.ttft_s, "tpot_s": r.tpot_s, "tokens_per_step": None,
            "sent_s": r.sent_s, "finish_s": r.finish_s, "chunks": len(r.chunk_s),
            "itl_mean_s": float(np.mean(itl)) if itl else None, "itl_p50_s": float(np.median(itl)) if itl else None,
            "itl_p90_s": float(np.percentile(itl, 90)) if itl else None}


def throughput_tok_s(records: list[RequestRecord], wall_s: float) -> float:
    return sum(len(r.tokens) for r in records) / wall_s


def decode_steps(records: list[RequestRecord], counters: SpecCounters) -> tuple[int, int]:
    """(decode tokens, decode steps) over the requests: the first token is the prefill's, and a
    greedy step commits 1 + its accepted drafts, so the steps are the decode tokens less the
    accepted ones."""
    tokens = sum(max(len(r.tokens) - 1, 0) for r in records)
    return tokens, max(tokens - int(counters.accepted), 1)


def latency_p50_ms(records: list[RequestRecord]) -> dict:
    tpot = [r.tpot_s for r in records if r.tpot_s is not None]
    return {"ttft_p50_ms": 1e3 * float(np.median([r.ttft_s for r in records])),
            "tpot_p50_ms": 1e3 * float(np.median(tpot)) if tpot else None}


def summarize(config: ServeConfig, records, wall_s: float, counters: SpecCounters, baselines: list) -> dict:
    """The run's summary.json. A speculative run's speedup is over its baselines' mean throughput
    (one, or with --bracket the one before and the one after); latencies and agreement against the
    first."""
    spec = counters.summary() if config.method != "none" else None
    summary = {"engine": config.engine, "method": config.method, "k": config.k if spec else None,
               "tree": None, "batch": config.batch, "rate_qps": config.rate, "requests": len(records),
               "throughput_tok_s": throughput_tok_s(records, wall_s), "wall_s": wall_s, "tokens_per_step": None,
               **latency_p50_ms(records), "time_share": {}}
    if spec is not None:
        tokens, steps = decode_steps(records, counters)
        summary["tokens_per_step"] = tokens / steps
        spec["drafted_step_share"] = counters.drafts / steps
        summary["spec_decode"] = spec
    if baselines:
        base_records = baselines[0][0]
        passes = [throughput_tok_s(b[0], b[1]) for b in baselines]
        summary["baseline_throughput_tok_s"] = float(np.mean(passes))
        if len(passes) > 1:
            summary["baseline_passes_tok_s"] = passes
        summary["speedup"] = summary["throughput_tok_s"] / summary["baseline_throughput_tok_s"]
        summary.update({f"baseline_{k}": v for k, v in latency_p50_ms(base_records).items()})
        same = [a.tokens == b.tokens for a, b in zip(records, base_records)]
        matching = sum(sum(x == y for x, y in zip(a.tokens, b.tokens)) for a, b in zip(records, base_records))
        summary["agreement"] = {"identical_requests": sum(same) / len(same),
                                "token_agreement": matching / max(sum(len(b.tokens) for b in base_records), 1)}
    return summary


def read_engine_model(engine: str, model: Path, dtype: str) -> tuple[object, object, str, str]:
    """The served model's tokenizer (prompts are its token ids), shape (LlamaConfig), weights' dtype
    as the engine runs them (vllm: `dtype`; llama.cpp: the GGUF's) and hash."""
    from profiler.engine.gguf_loader import ModelLoadError
    from profiler.engine.loaders import _hf_tokenizer, hf_folder_hash, hf_llama_config

    if engine == "llama.cpp":
        return llama_cpp.gguf_model(model)
    try:
        raw = json.loads((model / "config.json").read_text())
        shape = hf_llama_config(model / "config.json")
    except (OSError, ValueError, KeyError, ModelLoadError) as exc:
        raise InputError("--model", f"{model}/config.json: {exc}") from None
    tok = _hf_tokenizer(model, raw)
    if tok is None:
        raise InputError("--model", f"{model} has no tokenizer.json (python -m profiler export-hf writes one)")
    return tok, shape, vllm.DTYPES[dtype], hf_folder_hash(model)


def engine_model(config: ServeConfig) -> tuple[object, dict]:
    """The model's tokenizer and the run folder's meta: the engine, its version, the model's shape,
    dtype and hash, where and how it ran."""
    tok, shape, dtype, model_hash = read_engine_model(config.engine, config.model, config.dtype)
    recorded = config.recorded()
    meta = {"device": "cpu", "cpu": platform.processor() or platform.machine(), "threads": config.threads,
            "engine": config.engine, "engine_version": config.server_config().version(),
            "python": platform.python_version(), "dtype": dtype, "model": recorded["model"], "model_hash": model_hash,
            "random_weights": False, "config": shape.__dict__, "arguments": recorded, "git_revision": git_revision(),
            "seed": config.seed}
    return tok, meta
