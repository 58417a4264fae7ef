"""Clients of an engine's server: every request a streamed greedy completion of token ids, timed on
arrival of each streamed chunk; a closed loop at a fixed concurrency, or Poisson arrivals.

Prompts go as token ids, so the server sees exactly the tokens the simulator is given; the
generated ids come back in the stream, and EOS is ignored so that each output's length is fixed as
the live engine's `--max-new-tokens` fixes it. Two APIs: the OpenAI-compatible /v1/completions
(vLLM: `return_token_ids`, one chunk per engine step) and llama.cpp's own /completion
(`return_tokens`, one chunk per token: the tokens of one step arrive back to back and are merged
into one chunk, so a chunk is a step for both engines).
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field

import numpy as np


# Chunks of one request closer than this are one engine step's tokens (sent in one loop); engine
# steps of the models served here take milliseconds.
STEP_BURST_S = 1e-3


@dataclass(frozen=True)
class CompletionApi:
    """How a server is asked for a streamed greedy completion of token ids, and where a streamed
    chunk holds its token ids and text."""
    path: str
    openai: bool                 # OpenAI-compatible /v1/completions, else llama.cpp's /completion
    chunk_per_token: bool        # tokens of one step arrive as separate chunks

    def body(self, prompt: list[int], max_tokens: int, model: str) -> dict:
        if self.openai:
            return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                    "ignore_eos": True, "stream": True, "return_token_ids": True}
        return {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
                "return_tokens": True, "cache_prompt": True}

    def tokens_of(self, data: dict) -> tuple[list[int], str]:
        if self.openai:
            choice = data["choices"][0]
            return choice.get("token_ids") or [], choice.get("text") or ""
        return data.get("tokens") or [], data.get("content") or ""


OPENAI_COMPLETIONS = CompletionApi("/v1/completions", openai=True, chunk_per_token=False)
LLAMA_COMPLETION = CompletionApi("/completion", openai=False, chunk_per_token=True)


@dataclass
class RequestRecord:
    request: int
    prompt_tokens: int
    sent_s: float = 0.0                              # since the client started
    chunk_s: list[float] = field(default_factory=list)   # arrival of each streamed chunk with tokens
    chunk_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_s[0] - self.sent_s if self.chunk_s else None

    @property
    def finish_s(self) -> float:
        return self.chunk_s[-1] if self.chunk_s else self.sent_s

    @property
    def tpot_s(self) -> float | None:
        """Decode time per output token after the first."""
        if len(self.tokens) < 2:
            return None
        return (self.chunk_s[-1] - self.chunk_s[0]) / (len(self.tokens) - 1)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between streamed chunks (a chunk may carry several tokens of one speculative step)."""
        return list(np.diff(self.chunk_s)) if len(self.chunk_s) > 1 else []


def stream_completion(host: str, port: int, prompt: list[int], max_tokens: int, record: RequestRecord,
                      started: float, model: str, api: CompletionApi = OPENAI_COMPLETIONS,
                      timeout_s: float = 600.0) -> None:
    """One streamed greedy completion, filled into `record` (its error set on failure)."""
    body = json.dumps(api.body(prompt, max_tokens, model))
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        record.sent_s = time.perf_counter() - started
        connection.request("POST", api.path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            record.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ids, text = api.tokens_of(json.loads(data))
            if ids:
                now = time.perf_counter() - started
                if api.chunk_per_token and record.chunk_s and now - record.chunk_s[-1] < STEP_BURST_S:
                    record.chunk_tokens[-1] += len(ids)        # the same step's next token
                else:
                    record.chunk_s.append(now)
                    record.chunk_tokens.append(len(ids))
                record.tokens.extend(ids)
                record.text += text
    except Exception as exc:      # a broken stream (an error event, no choices) is this request's failure
        record.error = f"{exc.__class__.__name__}: {exc}"
    finally:
        connection.close()


def run_closed_loop(host: str, port: int, prompts: list[list[int]], concurrency: int, max_tokens: int,
                    model: str, api: CompletionApi = OPENAI_COMPLETIONS) -> tuple[list[RequestRecord], float]:
    """`concurrency` clients, each sending its next prompt when its last one finished, until every
    prompt is served; returns the records (in prompt order) and the wall time."""
    records = [RequestRecord(i, len(p)) for i, p in enumerate(prompts)]
    pending = iter(range(len(prompts)))
    lock = threading.Lock()
    started = time.perf_counter()

    def client() -> None:
        while True:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            stream_completion(host, port, prompts[i], max_tokens, records[i], started, model, api)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(concurrency, len(prompts)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, time.perf_counter() - started


def run_poisson(host: str, port: int, prompts: list[list[int]], rate_qps: float, max_tokens: int, model: str,
                seed: int, api: CompletionApi = OPENAI_COMPLETIONS) -> tuple[list[RequestRecord], float]:
    """Requests sent at Poisson arrivals of `rate_qps` (exponential gaps drawn from `seed`), each on
    its own connection whatever is still running; returns the records and the wall time."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_qps, size=len(prompts))
    arrivals = np.cumsum(gaps) - gaps[0]
    records = [RequestRecord(i, len(p)) for i, p in enumerate(prompts)]
    started = time.perf_counter()
    threads = []
    for i, at in enumerate(arrivals):
        delay = at - (time.perf_counter() - started)
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=stream_completion, args=(host, port, prompts[i], max_tokens, records[i],
                                                              started, model, api), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return records, time.perf_counter() - started
