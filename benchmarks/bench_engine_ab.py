"""The live engine's autoregressive decoding against another revision's, interleaved (issue 55's
target: batch-1 bf16 tokens/s on SmolLM2 not below the revision before the change).

Checks the base revision out into a temporary git worktree and times the same decoding with each
revision's engine in turn (A B A B ...), each in a fresh process: SmolLM2-135M from its GGUF, the
engine's static-batch path (`speculative_generate` with no drafter), greedy, fixed prompts. A
machine that drifts by tens of percent over minutes decides nothing alone: the figure is the
median of the paired ratios (this revision over the base), with their range.

    python benchmarks/bench_engine_ab.py --base HEAD --pairs 5 --dtype bf16 --batch 1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# One timing in a fresh process: load, one untimed pass, then the timed passes' decode tokens/s.
TIMING = """
import json, sys, time, torch
from profiler.engine.gguf_loader import load_gguf, smollm2_path
from profiler.engine.serving import speculative_generate
dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[1]]
batch, tokens, passes = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(int(sys.argv[5]))
model = load_gguf(smollm2_path(), dtype=dtype).model
prompts = [[(1000 + 37 * i + 11 * j) % 49000 + 100 for j in range(64)] for i in range(batch)]
speculative_generate(model, prompts, 4, None)
rates = []
for _ in range(passes):
    gen = speculative_generate(model, prompts, tokens, None)
    decoded = sum(len(o) - 1 for o in gen.outputs)
    rates.append(decoded / (gen.wall_s - gen.prefill_s))
print(json.dumps({"decode_tok_s": sorted(rates)[len(rates) // 2]}))
"""


def time_revision(root: Path, dtype: str, batch: int, tokens: int, passes: int, threads: int) -> float:
    """Median decode tokens/s of `passes` timed passes with the engine in `root`."""
    done = subprocess.run([sys.executable, "-c", TIMING, dtype, str(batch), str(tokens), str(passes), str(threads)],
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
                          text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["decode_tok_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the revision to compare the working tree with")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.base],
                       check=True, capture_output=True)
        try:
            pairs = []
            for i in range(args.pairs):
                # Alternate which goes first, so neither always meets the machine's state second.
                order = [("base", base), ("this", REPO)] if i % 2 == 0 else [("this", REPO), ("base", base)]
                rates = {name: time_revision(root, args.dtype, args.batch, args.tokens, args.passes, args.threads)
                         for name, root in order}
                pairs.append(rates)
                print(f"pair {i + 1}: base {rates['base']:.2f} tok/s, this {rates['this']:.2f} tok/s", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
    ratios = [p["this"] / p["base"] for p in pairs]
    base_rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.base], capture_output=True,
                              text=True).stdout.strip()
    print(json.dumps({"base": base_rev, "dtype": args.dtype, "batch": args.batch, "tokens": args.tokens,
                      "pairs": len(pairs), "base_tok_s_median": round(statistics.median(p["base"] for p in pairs), 2),
                      "this_tok_s_median": round(statistics.median(p["this"] for p in pairs), 2),
                      "ratio_median": round(statistics.median(ratios), 4),
                      "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4)}, indent=2))


if __name__ == "__main__":
    main()
