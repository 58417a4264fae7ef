"""Autoregressive greedy decoding of SmolLM2-135M at batch 1 on this CPU (issue 3's target:
>= 20 tokens/s), beside the memory-bandwidth roofline of the weights read per token.

Roofline: every decode step reads all weights once (4 bytes per parameter in fp32, 2 in bf16; the
tied embedding counted once, as the LM head); bandwidth is measured here with a numpy streaming
read of a buffer much larger than the caches. Run: python benchmarks/bench_ar_decode.py --dtype bf16
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from profiler.engine.gguf_loader import load_gguf, smollm2_path


def measured_read_bandwidth_gb_s(repeats: int = 5) -> float:
    buffer = np.ones(256 * 2**20 // 8)     # 256 MiB
    best = min(_timed(buffer.sum) for _ in range(repeats))
    return buffer.nbytes / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_gguf(smollm2_path(), dtype=torch.float32 if args.dtype == "fp32" else torch.bfloat16)
    model = loaded.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())   # tied: counted once
    prompt = list(range(1000, 1064))
    model.setup_cache(1, len(prompt) + args.tokens + 1)
    per_token = []
    with torch.inference_mode():
        model(torch.tensor([prompt]), torch.arange(len(prompt))[None], logits_from=len(prompt) - 1)
        for _ in range(args.repeats):
            token = torch.tensor([[prompt[-1]]])
            start = time.perf_counter()
            for i in range(args.tokens):
                logits = model(token, torch.tensor([[len(prompt) + i]]))
                token = logits[:, -1:].argmax(-1)
            per_token.append((time.perf_counter() - start) / args.tokens)
    bandwidth = measured_read_bandwidth_gb_s()
    roofline_tok_s = bandwidth * 1e9 / weight_bytes
    best = min(per_token)
    print(json.dumps({
        "model": loaded.path.name, "dtype": str(next(model.parameters()).dtype), "threads": args.threads,
        "torch": torch.__version__, "weight_bytes": weight_bytes,
        "tokens_per_s_best": 1 / best, "tokens_per_s_median": 1 / float(np.median(per_token)),
        "measured_read_gb_s": bandwidth, "roofline_tokens_per_s": roofline_tok_s,
        "fraction_of_roofline": (1 / best) / roofline_tok_s,
    }, indent=2))


if __name__ == "__main__":
    main()
