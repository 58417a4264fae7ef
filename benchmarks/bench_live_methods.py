"""Speedup of each live method over autoregressive decoding at batch 1, per Spec-Bench category.

    python benchmarks/bench_live_methods.py --prompts ../shared/data/spec_bench_questions.jsonl \
        --categories coding math_reasoning qa translation --per-category 2 --max-new-tokens 64

For each category, the first `--per-category` questions are run one at a time (batch 1) with every
method and with plain autoregressive decoding; the speedup is the ratio of decode throughputs
(generated tokens over the whole wall time, prefill included, as `profiler live` reports it).
Greedy fp32 by default, so every method's output equals autoregressive output (checked here).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

METHODS = {
    "ngram k=4": dict(method="ngram", k=4),
    "ngram tree 3x3": dict(method="ngram", tree=(3, 3)),
    "shadow int8 k=4": dict(method="shadow", bits=8, k=4),
    "shadow int4 k=4": dict(method="shadow", bits=4, k=4),
    "layerskip 8 k=2": dict(method="layerskip", exit_layer=8, k=2),
    "streaming 16+64 k=4": dict(method="streaming", sink=16, window=64, k=4),
    "draft_model 10 layers k=3": dict(method="draft_model", layers=10, k=3),
    "ngram + SpecPV 64 rectify": dict(method="ngram", k=4, budget=64, rectify=True),
}


def make(spec: dict, model):
    import copy

    from profiler.engine.drafters import DraftModelDrafter, NgramDrafter, SelfDrafter, ShadowDrafter

    method = spec["method"]
    if method == "ngram":
        return NgramDrafter()
    if method == "shadow":
        return ShadowDrafter(model, bits=spec["bits"])
    if method == "layerskip":
        return SelfDrafter(exit_layer=spec["exit_layer"])
    if method == "streaming":
        return SelfDrafter(sink=spec["sink"], window=spec["window"])
    draft = copy.deepcopy(model)
    draft.layers = draft.layers[:spec["layers"]]
    return DraftModelDrafter(draft)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench questions JSONL")
    parser.add_argument("--categories", nargs="+", default=["coding", "math_reasoning", "qa", "translation"])
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    import gguf

    from profiler.engine.gguf_loader import load_gguf, smollm2_path
    from profiler.engine.partial import PartialSpec
    from profiler.engine.serving import speculative_generate
    from profiler.engine.tokenizer import tokenizer_from_gguf
    from profiler.engine.tree import TreeShape

    torch.set_num_threads(args.threads)
    loaded = load_gguf(smollm2_path(), torch.float32 if args.dtype == "fp32" else torch.bfloat16)
    model, tok = loaded.model, tokenizer_from_gguf(gguf.GGUFReader(loaded.path))
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    table = {}
    for category in args.categories:
        prompts = [tok.encode_chat(r["turns"][0]) for r in rows if r["category"] == category][:args.per_category]

        def timed(drafter=None, **kwargs):
            outputs, tokens, seconds, steps = [], 0, 0.0, 0
            for prompt in prompts:            # batch 1
                start = time.perf_counter()
                gen = speculative_generate(model, [prompt], args.max_new_tokens, drafter, eos_id=tok.eos_id, **kwargs)
                seconds += time.perf_counter() - start
                outputs += gen.outputs
                tokens += len(gen.outputs[0])
                steps += len({s.step for s in gen.steps})
            return outputs, tokens / seconds, tokens / max(steps, 1)

        ar_outputs, ar_tok_s, _ = timed()
        table[category] = {"prompt_tokens": [len(p) for p in prompts], "autoregressive_tok_s": round(ar_tok_s, 2)}
        for label, spec in METHODS.items():
            kwargs = {"k": spec.get("k", 4)}
            if "tree" in spec:
                kwargs["tree"] = TreeShape(*spec["tree"])
            if "budget" in spec:
                kwargs["partial"] = PartialSpec(spec["budget"], sink=16, window=32, period=16, rectify=spec["rectify"])
            outputs, tok_s, per_step = timed(make(spec, model), **kwargs)
            table[category][label] = {"speedup": round(tok_s / ar_tok_s, 3), "tokens_per_step": round(per_step, 2),
                                      "lossless": outputs == ar_outputs}
        print(json.dumps({category: table[category]}), flush=True)
    print(json.dumps({"dtype": args.dtype, "threads": args.threads, "torch": torch.__version__,
                      "max_new_tokens": args.max_new_tokens, "results": table}, indent=1))


if __name__ == "__main__":
    main()
