"""The simulator against an engine nobody here wrote: Hugging Face transformers' own prompt-lookup
decoding on SmolLM2, predicted from a black-box calibration of transformers and the acceptance
transformers itself measured.

1. `python -m profiler calibrate --engine hf` (skipped with --calibration): transformers' forward
   timed against batch, query tokens and KV, its generate() host time per step;
2. `python -m profiler hf-live --method none` and `--method ngram --k K` (greedy, batch 1) on the
   same long-context prompts, every step recorded (proposal length, accepted count, forward time);
3. `python -m sim validate` on both runs with that bundle: the prompt-lookup run's acceptance is
   replayed, so the predicted speedup rests on the black-box timings alone.

    python benchmarks/validate_hf_prompt_lookup.py --text ../shared/data/pride_and_prejudice.txt
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", type=Path, required=True, help="plain text the prompts are cut from")
    parser.add_argument("--calibration", type=Path, help="an existing hf bundle (default: calibrate into --out)")
    parser.add_argument("--out", type=Path, default=REPO / "validation" / "hf-prompt-lookup")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, nargs="+", default=[4, 10], help="prompt_lookup_num_tokens values")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    python = [sys.executable, "-m"]
    started = time.perf_counter()
    calibration = args.calibration
    if calibration is None:
        calibration = args.out / "calibration"
        subprocess.run([*python, "profiler", "calibrate", "--engine", "hf", "--threads", str(args.threads),
                        "--out", str(calibration)], cwd=REPO, check=True)
    runs = []
    for method, k in [("none", 1)] + [("ngram", k) for k in args.k]:
        out = args.out / (f"hf-{method}" + (f"-k{k}" if method == "ngram" else ""))
        if out.exists():
            shutil.rmtree(out)
        subprocess.run([*python, "profiler", "hf-live", "--method", method, "--k", str(k), "--context",
                        str(args.context), "--text", str(args.text), "--limit", str(args.limit),
                        "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads),
                        "--out", str(out)], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        runs.append(out)
    subprocess.run([*python, "sim", "validate", *map(str, runs), "--calibration", str(calibration),
                    "--out", str(args.out)], cwd=REPO, check=True)
    print(f"\n{len(runs)} transformers runs and their predictions in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
