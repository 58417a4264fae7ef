"""Continuous batching against static batches in the live engine, on ragged outputs.

    python benchmarks/bench_serving.py --prompts ../shared/data/spec_bench_questions.jsonl \
        --requests 24 --batch 8 --max-new-tokens 128 --repeats 3

Chat prompts from across Spec-Bench (every 20th question) answered greedily up to
`--max-new-tokens`: some answers end at EOS after a few tokens, others run to the limit, so a
static batch spends its last steps on a few long answers while continuous batching refills the
rows. Both serve the same requests at `--batch` rows (continuous: a closed loop of `--batch`
clients, 512-token prefill chunks), autoregressive and n-gram k = 4, interleaved
(static, continuous, continuous, static, ...), and print the median output tokens per second
over the repeats with their spread (fastest / slowest - 1). Outputs are checked equal.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench questions JSONL")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import gguf

    from profiler.engine.drafters import NgramDrafter
    from profiler.engine.gguf_loader import load_gguf, smollm2_path
    from profiler.engine.serving import ServeSpec, serve
    from profiler.engine.tokenizer import tokenizer_from_gguf

    torch.set_num_threads(args.threads)
    loaded = load_gguf(smollm2_path())
    model, tok = loaded.model, tokenizer_from_gguf(gguf.GGUFReader(loaded.path))
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    prompts = [tok.encode_chat(row["turns"][0]) for row in rows[::20][:args.requests]]
    specs = {"static": ServeSpec(max_batch=args.batch, static=True, concurrency=args.batch),
             "continuous": ServeSpec(max_batch=args.batch, concurrency=args.batch)}
    drafters = {"autoregressive": lambda: None, "ngram k=4": NgramDrafter}
    rates: dict[tuple[str, str], list[float]] = {}
    outputs: dict[tuple[str, str], list[list[int]]] = {}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        order = list(specs) if repeat % 2 == 0 else list(reversed(specs))
        for method, make in drafters.items():
            for mode in order:
                served = serve(model, prompts, args.max_new_tokens, make(), specs[mode], k=4, eos_id=tok.eos_id)
                tokens = sum(len(o) for o in served.outputs)
                rates.setdefault((method, mode), []).append(tokens / served.wall_s)
                outputs.setdefault((method, mode), served.outputs)
                assert served.outputs == outputs[(method, mode)] == outputs[("autoregressive", "static")]
    lengths = [len(o) for o in outputs[("autoregressive", "static")]]
    print(f"{len(prompts)} requests, batch {args.batch}, outputs {min(lengths)}-{max(lengths)} tokens "
          f"(median {statistics.median(lengths):.0f}), {args.repeats} repeats, {time.perf_counter() - started:.0f} s")
    print(f"{'method':<16} {'mode':<11} {'tok/s':>7} {'spread':>7} {'vs static':>9}")
    for method in drafters:
        static = statistics.median(rates[(method, "static")])
        for mode in specs:
            values = rates[(method, mode)]
            median = statistics.median(values)
            print(f"{method:<16} {mode:<11} {median:7.1f} {max(values) / min(values) - 1:7.1%} "
                  f"{median / static - 1:+9.1%}")


if __name__ == "__main__":
    main()
