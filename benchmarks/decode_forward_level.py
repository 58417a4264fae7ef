"""Does calibration's way of timing a decode forward see the level a decoding run sees?

    python benchmarks/decode_forward_level.py [--batch 1 8] [--kv 576] [--rounds 4]

`profiler calibrate` prices a decode forward from bursts of the same forward (about 0.3 s of
calls on a cache of random values, `EngineProbe.time_forward`), in rounds minutes apart.
A live run decodes step after step, its cache sized for the whole generation and growing, with
sampling and bookkeeping between forwards. This benchmark alternates, in one process and over a
few minutes, a calibration burst at (batch, 1 query token, KV) and a greedy decoding run at the
same batch whose prompts are KV tokens long (the forwards timed by hooks, as `profiler live` times
them), `--rounds` times per batch size, and prints both medians per round: a gap that persists
round after round is a difference of method; one that changes sign is the machine. SmolLM2's
shapes with random weights (fp32, the CPU).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from profiler.calibrate import resolve_config
    from profiler.engine_fits import EngineProbe
    from profiler.speculative import speculative_generate
    from profiler.timing import timed_forwards

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--kv", type=int, default=576)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if min(args.batch) < 1 or args.kv < 2 or args.rounds < 1 or args.new_tokens < 2:
        print("error: --batch, --kv, --rounds and --new-tokens must be positive (--kv and --new-tokens at least 2)",
              file=sys.stderr)
        return 2
    config, _ = resolve_config("smollm2")
    probe = EngineProbe(config, torch.float32, "cpu", args.seed, quick=True, selection=False)
    generator = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    print("batch | round | burst median (ms) | decoding-run forward median (ms) | run / burst")
    ratios: dict[int, list[float]] = {b: [] for b in args.batch}
    for round_index in range(args.rounds):
        for batch in args.batch:
            burst_s = probe.time_forward(batch, 1, args.kv)
            prompt = args.kv - args.new_tokens // 2     # the run's median step reads about --kv tokens
            prompts = torch.randint(0, config.vocab, (batch, prompt), generator=generator).tolist()
            with torch.inference_mode(), timed_forwards(probe.model) as forward_s:
                speculative_generate(probe.model, prompts, args.new_tokens, None)
            run_s = statistics.median(forward_s[1:])     # the first forward is the prefill
            ratios[batch].append(run_s / burst_s)
            print(f"{batch} | {round_index + 1} | {burst_s * 1e3:.1f} | {run_s * 1e3:.1f} | {run_s / burst_s:.3f}")
    for batch, values in ratios.items():
        print(f"batch {batch}: run / burst median {statistics.median(values):.3f} "
              f"({min(values):.3f}-{max(values):.3f} over {len(values)} rounds)")
    print(f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
