"""Prefill of SmolLM2-135M on this CPU: the engine's prompt forward (SDPA's causal kernel, no mask)
against the same forward with an explicit causal mask (the engine's prefill before it), one prompt
of each length, median of the repeats, both outputs compared.

Run: python benchmarks/bench_prefill.py [--lengths 512 2048 6144] [--repeats 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from profiler.engine.generate import prefill_logits
from profiler.engine.gguf_loader import load_gguf, smollm2_path
from profiler.engine.model import causal_mask


def timed_s(fn) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def masked_prefill_logits(model, prompt: list[int]) -> torch.Tensor:
    """The same prompt through the masked path: [1, V] logits of its last token."""
    n = len(prompt)
    positions = torch.arange(n)[None]
    return model(torch.tensor([prompt]), positions, mask=causal_mask(positions, n),
                 logits_at=torch.tensor([n - 1]))[:, -1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 6144])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_gguf(smollm2_path(), dtype=torch.float32).model
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    with torch.inference_mode():
        for n in args.lengths:
            prompt = torch.randint(0, model.config.vocab, (n,), generator=generator).tolist()
            causal, masked = [], []
            for _ in range(args.repeats):      # alternate, so both see the machine's same spells
                model.setup_cache(1, n + 2)
                seconds, fast = timed_s(lambda: prefill_logits(model, [prompt]))
                causal.append(seconds)
                model.setup_cache(1, n + 2)
                seconds, slow = timed_s(lambda: masked_prefill_logits(model, prompt))
                masked.append(seconds)
            difference = float((fast - slow).abs().max())
            row = {"prompt_tokens": n, "prompt_path_s": sorted(causal)[len(causal) // 2],
                   "masked_path_s": sorted(masked)[len(masked) // 2], "max_abs_logit_difference": difference}
            rows.append(row)
            print(f"{n:6d} tokens: prompt path {row['prompt_path_s']:6.2f} s, masked {row['masked_path_s']:6.2f} s "
                  f"({row['masked_path_s'] / row['prompt_path_s']:.2f}x), logits differ by at most {difference:.1e}")
    print(json.dumps({"torch": torch.__version__, "threads": args.threads, "dtype": "fp32", "seed": args.seed,
                      "repeats": args.repeats, "rows": rows}))


if __name__ == "__main__":
    main()
