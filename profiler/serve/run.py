"""`python -m profiler serve-live`: a real engine's server, driven as users run it, recorded as a run
folder (sim/formats/run_folder.py).

For each configuration (the speculative one, and with --baseline the same server without
speculation) the command starts the server, sends one warm-up request, reads the speculative
counters, runs the client (closed loop at --batch concurrent requests, or Poisson arrivals at
--rate), reads the counters again and stops the server. The folder holds, per request, prompt and
output tokens, TTFT, TPOT and the inter-chunk latencies; the counters' difference (drafts, draft
tokens, accepted, accepted per position); each server's log; and the outputs. A server sees its
steps, the client does not: steps.parquet is empty, and `tokens_per_step` comes from the counters.
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
from profiler.serve.client import RequestRecord, run_closed_loop, run_poisson, stream_completion
from profiler.serve.metrics import SpecCounters, scrape_spec_counters
from profiler.serve.server import HOST, SERVED_NAME, ServerConfig, VllmServer, vllm_version
from sim.errors import InputError
from sim.formats.provenance import REPO_ROOT, git_revision, repo_relative

VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
WARM_UP_TOKENS = 32


class ServeConfig(BaseModel):
    """One serve-live run. Field names are the command line's flags (underscored)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["vllm"] = "vllm"
    model: Path                          # a Hugging Face folder (python -m profiler export-hf)
    venv: Path = Path(".vllm-venv")      # the engine's virtual environment
    method: Literal["none", "ngram"] = "ngram"
    k: int = 4                           # drafted tokens per step
    prompt_lookup_min: int = 2           # ngram: shortest n-gram matched
    prompt_lookup_max: int = 4           # ngram: longest n-gram matched
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
    dtype: Literal["fp32", "bf16"] = "fp32"
    threads: int = 2
    max_model_len: int = 2048
    port: int = 8391
    seed: int = 0
    out: Path

    def recorded(self) -> dict:
        values = self.model_dump(mode="json")
        for name in ("model", "venv", "prompts", "text", "out"):
            values[name] = repo_relative(getattr(self, name))
        if self.context is not None:
            values["prompts"] = None
        return values

    def speculative_config(self) -> dict | None:
        if self.method == "none":
            return None
        return {"method": "ngram", "num_speculative_tokens": self.k, "prompt_lookup_min": self.prompt_lookup_min,
                "prompt_lookup_max": self.prompt_lookup_max}


def check_serve_config(config: ServeConfig) -> None:
    for name in ("k", "max_new_tokens", "threads", "prompt_lookup_min", "prompt_lookup_max", "max_model_len"):
        if getattr(config, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}", f"must be at least 1 (got {getattr(config, name)})")
    if config.prompt_lookup_min > config.prompt_lookup_max:
        raise InputError("--prompt-lookup-min", "must not exceed --prompt-lookup-max")
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
    if not 1 <= config.port <= 65535:
        raise InputError("--port", f"must be a TCP port (got {config.port})")


def settings_of(values: dict) -> list[ServeConfig]:
    """The command line's runs: every context (or none) with every batch or rate. One run is written
    to --out; several to --out/NAME each (NAME: drafter, context, load, e.g. ngram-k4-c512-b8: unique
    across a study's servers), and then --limit must say how many prompts each takes."""
    loads = [("batch", b) for b in values.pop("batch") or []] + [("rate", r) for r in values.pop("rate") or []]
    loads = loads or [("batch", 1)]
    contexts = values.pop("context") or [None]
    out = values.pop("out")
    limits = values.pop("limit") or [None]
    if len(limits) not in (1, len(loads)):
        raise InputError("--limit", f"give one value or one per load ({len(loads)}), not {len(limits)}")
    limits = limits * len(loads) if len(limits) == 1 else limits
    runs = [(c, kind, v, n) for c in contexts for (kind, v), n in zip(loads, limits)]
    if len(runs) > 1 and limits[0] is None:
        raise InputError("--limit", "several runs need --limit: the prompts each run takes")
    if len(runs) > 1 and Path(out).exists():
        raise InputError("--out", f"{out} exists; give a new folder")
    configs = []
    for context, kind, value, limit in runs:
        drafter = "none" if values["method"] == "none" else f"{values['method']}-k{values['k']}"
        name = f"{drafter}-" + (f"c{context}-" if context is not None else "") + \
            (f"b{value}" if kind == "batch" else f"r{value:g}")
        load = {"batch": value, "rate": None} if kind == "batch" else {"batch": None, "rate": value}
        configs.append(ServeConfig(**values, **load, context=context, limit=limit,
                                   out=out if len(runs) == 1 else Path(out) / name))
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


def serve_live(config: ServeConfig) -> dict:
    """One setting; returns its summary (also written to its folder)."""
    return serve_settings([config])[0]


def serve_settings(configs: list[ServeConfig]) -> list[dict]:
    """Several settings (load, context) of one server configuration: each server (speculative, and
    with --baseline the same without speculation) starts once and serves every setting in turn, each
    on prompts of its own (a later setting starts where the earlier ones' prompts ended, so vLLM's
    prefix cache never holds them); each setting is written to its own run folder."""
    import pandas as pd

    from profiler.engine.gguf_loader import ModelLoadError
    from profiler.engine.loaders import _hf_tokenizer
    from profiler.serve.server import check_server_config
    from sim.formats.run_folder import write_run_folder

    for config in configs:
        check_serve_config(config)
    first = configs[0]
    server_base = ServerConfig(model=first.model, venv=first.venv, port=first.port, dtype=VLLM_DTYPES[first.dtype],
                               max_model_len=first.max_model_len, threads=first.threads, seed=first.seed)
    check_server_config(server_base)
    try:
        raw = json.loads((first.model / "config.json").read_text())
        meta = serve_meta(first)
    except (ValueError, ModelLoadError) as exc:
        raise InputError("--model", f"{first.model}/config.json: {exc}") from None
    tok = _hf_tokenizer(first.model, raw)
    if tok is None:
        raise InputError("--model", f"{first.model} has no tokenizer.json")
    configs, prompt_sets = place_prompts(configs, tok)
    plans = [("speculative", first.speculative_config())]
    if first.baseline and first.method != "none":
        plans.append(("baseline", None))

    # The servers' logs stay here until the folders are written; a failed run keeps them for its message.
    scratch = Path(tempfile.mkdtemp(prefix="serve-live-"))
    with _stopped_by_sigterm():
        results = {name: run_server(configs, server_base, speculative, prompt_sets, scratch / f"server-{name}.log")
                   for name, speculative in plans}
    logs = {f"server-{name}.log": repo_relative_text((scratch / f"server-{name}.log").read_text(errors="replace"))
            for name, _ in plans}

    summaries = []
    for i, (config, (_, rows)) in enumerate(zip(configs, prompt_sets)):
        records, wall_s, counters = results["speculative"][i]
        baseline = results["baseline"][i] if "baseline" in results else None
        summary = summarize(config, records, wall_s, counters, baseline)
        requests = pd.DataFrame([request_row(r, rows[r.request]) for r in records])
        outputs = [{"request": r.request, "text": r.text, "tokens": r.tokens} for r in records]
        run_meta = {**meta, "arguments": config.recorded()}
        write_run_folder(config.out, pd.DataFrame(columns=["run", "request", "step"]), requests, summary, outputs,
                         run_meta, extra_files=logs)
        print(json.dumps({"out": repo_relative(config.out), **{k: v for k, v in summary.items() if k != "spec_decode"}},
                         indent=2))
        summaries.append(summary)
    shutil.rmtree(scratch, ignore_errors=True)
    return summaries


def repo_relative_text(text: str) -> str:
    """A server's log with this checkout's absolute path taken out (its warnings name the venv's
    files), as every path a result records is relative to the repository."""
    return text.replace(f"{REPO_ROOT}/", "")


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


def run_server(configs: list[ServeConfig], server_base: ServerConfig, speculative: dict | None,
               prompt_sets: list[tuple], log: Path) -> list[tuple[list[RequestRecord], float, SpecCounters]]:
    """One server serving every setting in turn: start, warm up, then per setting counters, client,
    counters; stop. A request that fails or comes back short is one line naming the server's log."""
    server_config = ServerConfig(**{**server_base.__dict__, "speculative": speculative, "log": log})
    results = []
    with VllmServer(server_config) as server:
        # A warm-up prompt no setting shares a prefix with (prefix caching stays cold for them).
        warm = RequestRecord(-1, WARM_UP_TOKENS)
        stream_completion(HOST, server_config.port, list(range(1000, 1000 + WARM_UP_TOKENS)), 4, warm, 0.0, SERVED_NAME)
        if warm.error:
            raise InputError("--model", f"the server's warm-up request failed ({warm.error}); log: {log}")
        for config, (prompts, _) in zip(configs, prompt_sets):
            before = scrape_counters(server.url, log)
            if config.rate is not None:
                records, wall_s = run_poisson(HOST, config.port, prompts, config.rate, config.max_new_tokens,
                                              SERVED_NAME, config.seed)
            else:
                records, wall_s = run_closed_loop(HOST, config.port, prompts, config.batch, config.max_new_tokens,
                                                  SERVED_NAME)
            counters = scrape_counters(server.url, log).minus(before)
            for r in records:
                if r.error is None and len(r.tokens) != config.max_new_tokens:
                    r.error = f"{len(r.tokens)} of {config.max_new_tokens} tokens came back"
            failed = [r for r in records if r.error]
            if failed:
                raise InputError("--model", f"{len(failed)} of {len(records)} requests failed (first: {failed[0].error}); "
                                            f"log: {log}")
            results.append((records, wall_s, counters))
    return results


def scrape_counters(url: str, log: Path) -> SpecCounters:
    try:
        return scrape_spec_counters(url)
    except OSError as exc:
        raise InputError("--model", f"the server's /metrics could not be read ({exc}); log: {log}") from None


@contextlib.contextmanager
def _stopped_by_sigterm():
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


def summarize(config: ServeConfig, records, wall_s: float, counters: SpecCounters, baseline) -> dict:
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
    if baseline is not None:
        base_records, base_wall_s, _ = baseline
        summary["baseline_throughput_tok_s"] = throughput_tok_s(base_records, base_wall_s)
        summary["speedup"] = summary["throughput_tok_s"] / summary["baseline_throughput_tok_s"]
        summary.update({f"baseline_{k}": v for k, v in latency_p50_ms(base_records).items()})
        same = [a.tokens == b.tokens for a, b in zip(records, base_records)]
        matching = sum(sum(x == y for x, y in zip(a.tokens, b.tokens)) for a, b in zip(records, base_records))
        summary["agreement"] = {"identical_requests": sum(same) / len(same),
                                "token_agreement": matching / max(sum(len(b.tokens) for b in base_records), 1)}
    return summary


def serve_meta(config: ServeConfig) -> dict:
    from profiler.engine.loaders import hf_folder_hash, hf_llama_config

    shape = hf_llama_config(config.model / "config.json")
    return {"device": "cpu", "cpu": platform.processor() or platform.machine(), "threads": config.threads,
            "engine": config.engine, "engine_version": vllm_version(config.venv), "python": platform.python_version(),
            "dtype": VLLM_DTYPES[config.dtype], "model": repo_relative(config.model),
            "model_hash": hf_folder_hash(config.model), "random_weights": False, "config": shape.__dict__,
            "arguments": config.recorded(), "git_revision": git_revision(), "seed": config.seed}

