"""How much a calibration's decode-forward price depends on which bursts it happened to time.

    python benchmarks/decode_burst_sampling.py [BUNDLE ...]     (default: calibration/cpu/smollm2-135m)

`profiler calibrate` times each decode forward of the whole-forward factor (batch 1-16, one query
token, KV 256/1,024/4,096) in the engine round after each round of operators and in
DECODE_BURSTS_WITHIN_ROUND more bursts spread through the round, and keeps the median of all of
them; meta.json keeps every burst (fits.forward_factor.bursts_s, bundles made since 2026-12-01
10:00). Before, each shape had one burst a round. This prints, per decode shape, the median of all
bursts and how far the median of one burst a round lands from it over every choice of one burst in
each round (3 rounds of 3: 27 choices; the rounds are meta.json's, the refit's where the fits were
redone), then the median of those deviations over the shapes: the
sampling error the extra bursts take out. No timing is done; it reads the bundles.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one_burst_a_round_medians(bursts_s: list[float], per_round: int) -> list[float]:
    """The median of one burst from each round, for every choice of one burst per round."""
    rounds = [bursts_s[i:i + per_round] for i in range(0, len(bursts_s), per_round)]
    return [statistics.median(choice) for choice in itertools.product(*rounds)]


def main() -> int:
    from profiler.engine_fits import DECODE_TOKENS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundles", nargs="*", type=Path, default=[ROOT / "calibration" / "cpu" / "smollm2-135m"])
    args = parser.parse_args()
    for bundle in args.bundles:
        try:
            meta = json.loads((bundle / "meta.json").read_text())
            factor = meta["fits"]["forward_factor"]
            # The engine rounds the bursts came in: the refit's if the fits were redone.
            rounds = int(meta["refit"]["rounds"] if "refit" in meta else meta["rounds"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {bundle}: cannot read its forward factor ({exc.__class__.__name__})", file=sys.stderr)
            return 2
        if "bursts_s" not in factor:
            print(f"error: {bundle} keeps no bursts (made before 2026-12-01 10:00)", file=sys.stderr)
            return 2
        print(f"{bundle}: decode forwards, all bursts against one burst a round")
        print("batch | KV | bursts | all bursts: median ms (range) | one a round: median |deviation| (range)")
        deviations = []
        for tokens, row in zip(factor["tokens"], factor["bursts_s"]):
            if tokens > DECODE_TOKENS:
                continue
            for kv, bursts_s in zip(factor["kv"], row):
                per_round = len(bursts_s) // rounds
                if per_round < 1 or len(bursts_s) % rounds:
                    print(f"error: {bundle}: {len(bursts_s)} bursts at batch {tokens}, KV {kv} are not "
                          f"{rounds} equal rounds", file=sys.stderr)
                    return 2
                every = statistics.median(bursts_s)
                off = [m / every - 1 for m in one_burst_a_round_medians(bursts_s, per_round)]
                typical = statistics.median(abs(d) for d in off)
                deviations.append(typical)
                print(f"{tokens:>5} | {kv:>5} | {len(bursts_s):>6} | {every * 1e3:7.1f} ({min(bursts_s) * 1e3:.1f}-"
                      f"{max(bursts_s) * 1e3:.1f}) | {typical:5.1%} ({min(off):+.1%} to {max(off):+.1%})")
        print(f"median over {len(deviations)} shapes: one burst a round lands {statistics.median(deviations):.1%} "
              f"from the median of all of them (worst shape {max(deviations):.1%})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
