"""`python -m sim run SCENARIO [--json] [--out FILE]`."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from sim.errors import ScenarioError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="simulate one scenario and its no-speculation baseline")
    run.add_argument("scenario", type=Path, help="scenario YAML (docs/scenario.md)")
    run.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    run.add_argument("--out", type=Path, help="also write the JSON object to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return run_command(args)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1


def run_command(args) -> int:
    from sim.simulate import simulate

    result = simulate(args.scenario)
    payload = result.to_dict()
    if args.out is not None:
        write_atomic(args.out, json.dumps(payload, indent=2) + "\n")
    if args.json:
        print(json.dumps(payload))
    else:
        print(format_summary(result))
    return 0


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def format_summary(result) -> str:
    s = result.scenario
    run, base = result.run, result.baseline
    spec = s.speculation
    method = spec.method if spec.enabled else "none"
    lines = [
        f"{s.model_spec.name} on {s.hardware_spec.name} ({s.dtype}, TP{s.tensor_parallel}, {s.engine_spec.name}), "
        f"method {method}, {len(run.ttft_s)} requests, seed {s.seed}",
        f"  throughput      {run.throughput_tok_s:10.1f} tok/s   baseline {base.throughput_tok_s:10.1f}   "
        f"speedup {result.speedup:.3f}x",
        f"  decode only     {run.decode_throughput_tok_s:10.1f} tok/s   baseline {base.decode_throughput_tok_s:10.1f}   "
        f"speedup {result.decode_speedup:.3f}x",
        f"  tokens/step     {run.tokens_per_step:10.3f}",
        "  latency (ms)         p50       p90       p99",
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        q = getattr(run, name)
        lines.append(f"    {name[:-3]:<12} {q['p50']:9.2f} {q['p90']:9.2f} {q['p99']:9.2f}")
    shares = ", ".join(f"{k} {v:.1%}" for k, v in run.time_share.items() if v >= 0.0005)
    lines.append(f"  time share      {shares}")
    mem = result.memory
    lines.append(f"  memory          {mem['resident_layers']} layers resident, {mem['offloaded_layers']} offloaded "
                 f"(baseline {mem['baseline_offloaded_layers']}); peak KV {mem['peak_kv_gb']:.2f} GB")
    if run.goodput_tok_s is not None:
        lines.append(f"  goodput         {run.goodput_tok_s:10.1f} tok/s   SLO met by {run.slo_attainment:.1%} "
                     f"(baseline {base.goodput_tok_s:.1f} tok/s, {base.slo_attainment:.1%})")
    if result.partial_verify is not None:
        pv = result.partial_verify
        lines.append(f"  partial verify  {pv['divergence_rate']:.4%} of output tokens diverge from full "
                     f"verification; {pv['rolled_back_tokens']} rolled back")
    return "\n".join(lines)
