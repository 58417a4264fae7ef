"""A live run folder: what `python -m profiler live` (and `hf-live`) writes and `sim validate` reads.

  steps.parquet     one row per request per engine step: run ("speculative" or "baseline"),
                    request, step, mode (decode, verify, partial, full), query_tokens, kv_tokens,
                    drafted, accepted, accept_flags, committed, refed, rolled_back, and the batch
                    step's wall times draft_s, verify_s, selection_s, other_s, and end_s (when its
                    tokens were committed, since the batch's or the served run's start)
  requests.parquet  request, category, prompt_tokens, output_tokens, ttft_s (from arrival), tpot_s,
                    tokens_per_step, arrival_s, queue_s (arrival to admission), finish_s,
                    itl_mean_s, itl_p50_s, itl_p90_s (gaps between steps that emitted its tokens)
  summary.json      method, k, tree, batch, serving, requests, throughput_tok_s, tokens_per_step,
                    time_share (RUN_PHASES), and with a baseline its throughput, speedup, agreement
  outputs.jsonl     each request's output text and token ids
  meta.json         device, threads, versions, dtype, model and its hash, config, arguments (the
                    run's LiveConfig), git revision, seed, and with --probe machine_probe
"""
from __future__ import annotations

import json
from pathlib import Path

from sim.formats.files import write_folder_atomic

STEPS, REQUESTS, SUMMARY, OUTPUTS, META = "steps.parquet", "requests.parquet", "summary.json", "outputs.jsonl", "meta.json"

# The phases of a live run's summary time_share, each with the simulator's phase it corresponds to
# (sim/formats/names.py). A batch step whose requests verified in different SpecPV modes is one
# target forward, "mixed"; "other" is host time outside the forwards.
RUN_PHASES = {"prefill": "prefill", "draft": "draft", "verify": "verify", "partial": "partial_verify",
              "full": "full_verify", "mixed": "verify", "selection": "selection", "other": "overhead"}

# The machine probe (`profiler live --probe`, and once a calibration round): a decode forward at
# PROBE_DECODE_KV cached tokens (bandwidth-bound like decoding) and a whole PROBE_PROMPT_TOKENS-token
# prompt (compute-bound like prefill), timed before and after a run (meta.json machine_probe).
PROBE_DECODE_KV = 512
PROBE_PROMPT_TOKENS = 256


def probe_shapes(max_context: int) -> dict:
    """The probe forwards for a model of this maximum context (smaller for a short-context model)."""
    return {"decode_kv": min(PROBE_DECODE_KV, max_context // 2),
            "prompt_tokens": min(PROBE_PROMPT_TOKENS, max_context // 2)}


def write_run_folder(out: Path, steps, requests, summary: dict, outputs: list[dict], meta: dict,
                     extra_files: dict[str, str] | None = None) -> None:
    """A run folder's five files (steps and requests as DataFrames), and any `extra_files` (name ->
    text: a server's log), written into a temporary folder renamed to `out` once complete; `out`
    must not exist."""
    def fill(folder: Path) -> None:
        for name, text in (extra_files or {}).items():
            (folder / name).write_text(text)
        steps.to_parquet(folder / STEPS, index=False)
        requests.to_parquet(folder / REQUESTS, index=False)
        (folder / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
        (folder / OUTPUTS).write_text("".join(json.dumps(o) + "\n" for o in outputs))
        (folder / META).write_text(json.dumps(meta, indent=2) + "\n")
    write_folder_atomic(out, fill)
