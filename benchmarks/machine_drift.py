"""How much does this machine's speed move between runs, and does a short fixed probe see it?

    python benchmarks/machine_drift.py --text ../shared/data/pride_and_prejudice.txt --out validation/drift-cpu

Alternates `profiler live --method none` at batch 1 (2 requests) and batch 8 (8 requests) on
prompts of exactly --context tokens, --iterations times, each with `--probe`: just before and
after the run, two fixed forwards of the same model are timed (profiler/machine_probe.py: a decode
forward at 512 KV tokens, the bandwidth-bound work of decoding, and a whole 256-token prompt, the
compute-bound work of prefill). Prints, per batch size, the runs' spread (median |run / median run - 1|), the
correlation of throughput with each probe's speed, and the spread left after scaling each run by
the probes measured around it: if a probe tracked the machine, scaling by it would shrink the
spread. With --bundle, also each batch size's median error of the calibrated prediction, plain and
put at the machine's speed measured by the probes (`python -m sim validate`, predictions
"cost model" and "cost model @ probe"; sim/machine_speed.py).

With --out the runs and probes.json are kept; run again on the same folder, it reads them instead
of running again. Results carry provenance (the run folders' meta.json; probes.json's own).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

def live(out: Path, batch: int, requests: int, args) -> None:
    argv = [sys.executable, "-m", "profiler", "live", "--method", "none", "--model", args.model, "--batch", str(batch),
            "--limit", str(requests), "--max-new-tokens", str(args.max_new_tokens), "--context", str(args.context),
            "--text", str(args.text), "--probe", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"machine_drift: profiler live failed: {proc.stderr.strip().splitlines()[-1:]}")


def provenance() -> dict:
    import torch

    from profiler.calibrate import _cpu_model
    from sim.simulate import git_revision, versions

    return {"device": "cpu", "cpu": _cpu_model(), "threads": torch.get_num_threads(), "dtype": "float32",
            "seed": 0, "git_revision": git_revision(), "versions": {**versions(), "torch": torch.__version__},
            "date_unix_s": time.time()}


def run_experiment(root: Path, args) -> list[dict]:
    rows = []
    for i in range(args.iterations):
        for batch, requests in ((1, 2), (8, 8)):
            run = root / f"i{i}-b{batch}"
            started = time.time()
            live(run, batch, requests, args)
            ended = time.time()
            summary = json.loads((run / "summary.json").read_text())
            probe = json.loads((run / "meta.json").read_text())["machine_probe"]
            before, after = probe["before"], probe["after"]
            rows.append({"run": run.name, "batch": batch, "started_unix_s": started, "ended_unix_s": ended,
                         "before": before, "after": after, "tok_s": summary["throughput_tok_s"]})
            print(f"{run.name}: {summary['throughput_tok_s']:.2f} tok/s, decode probe "
                  f"{before['decode_s'] * 1e3:.1f}/{after['decode_s'] * 1e3:.1f} ms, prompt probe "
                  f"{before['prompt_s'] * 1e3:.0f}/{after['prompt_s'] * 1e3:.0f} ms", file=sys.stderr, flush=True)
    document = {"provenance": {**provenance(), "model": args.model, "arguments": {
        "iterations": args.iterations, "context": args.context, "max_new_tokens": args.max_new_tokens}},
        "runs": rows}
    tmp = root / "probes.json.tmp"
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, root / "probes.json")
    return rows


def report(rows: list[dict]) -> dict:
    """Per batch size: the runs' spread, the correlation with each probe's speed, and the spread
    after scaling each run by that probe (throughput x probe seconds / their median)."""
    import numpy as np

    spread = lambda x: float(np.median(np.abs(x / np.median(x) - 1)))
    out = {}
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        tok_s = np.array([r["tok_s"] for r in mine])
        entry = {"runs": len(mine), "tok_s_median": float(np.median(tok_s)), "spread": spread(tok_s)}
        for probe in ("decode_s", "prompt_s"):
            seconds = np.array([(r["before"][probe] + r["after"][probe]) / 2 for r in mine])
            entry[probe] = {
                "correlation_with_speed": float(np.corrcoef(1 / seconds, tok_s)[0, 1]) if len(mine) > 2 else None,
                "spread_scaled": spread(tok_s * seconds / np.median(seconds)),
                "probe_spread": spread(seconds)}
        out[str(batch)] = entry
    return out


def predicted_errors(root: Path, runs: list[str], bundle: Path) -> dict:
    """Median signed and absolute error of the bundle's predictions (plain, and at the probes'
    speed) per batch size."""
    import pandas as pd

    proc = subprocess.run([sys.executable, "-m", "sim", "validate", *(str(root / r) for r in runs),
                           "--calibration", str(bundle), "--out", str(root / "validation")],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"machine_drift: sim validate failed: {proc.stderr.strip().splitlines()[-1:]}")
    frame = pd.read_csv(root / "validation" / "validation.csv", comment="#")
    out: dict = {}
    for (batch, prediction), g in frame.groupby(["batch", "prediction"]):
        out.setdefault(str(batch), {})[prediction] = {
            "median_error": float(g.tok_s_error.median()), "median_abs_error": float(g.tok_s_error.abs().median()),
            "worst_abs_error": float(g.tok_s_error.abs().max())}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", type=Path, required=True, help="a long text for the fixed-length prompts")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--bundle", type=Path, help="also predict the runs with this calibration bundle")
    parser.add_argument("--out", type=Path, help="keep the runs and probes here (default: a temporary folder)")
    args = parser.parse_args()
    if args.iterations < 1:
        parser.error("--iterations must be at least 1")
    if not args.text.is_file():
        parser.error(f"--text {args.text}: no such file")

    with tempfile.TemporaryDirectory() as scratch:
        root = args.out or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        saved = root / "probes.json"
        rows = json.loads(saved.read_text())["runs"] if saved.exists() else run_experiment(root, args)
        result = {"per_batch": report(rows)}
        if args.bundle is not None:
            for batch, errors in predicted_errors(root, [r["run"] for r in rows], args.bundle).items():
                result["per_batch"][batch]["prediction"] = errors
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
