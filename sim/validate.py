"""The simulator against live runs: a `profiler live` run directory turned into the scenario that
reproduces it, predicted, and compared.

A live run decodes its prompts in static batches (`--batch`): each batch is prefilled in one
forward, decoded until its last request finishes, then the next batch starts. The matching
simulation runs each batch on its own (a closed workload of exactly those requests, every prompt
prefilled in the first iteration) and adds the batches' times, so the prediction prices the
same forwards the run timed. Throughput is output tokens over the summed times, as
`profiler live` reports it.

So far this covers autoregressive runs (`--method none`), which test the cost model alone;
replaying and fitting acceptance for speculative runs is the validation harness's next part.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sim.errors import ScenarioError


@dataclass(frozen=True)
class Comparison:
    run: str
    method: str
    batch: int
    requests: int
    measured_tok_s: float
    predicted_tok_s: float

    @property
    def error(self) -> float:
        return self.predicted_tok_s / self.measured_tok_s - 1


def read_run(run_dir: Path) -> tuple[dict, dict, "object"]:
    """(meta, summary, requests table) of a live run; a one-line error when it is not one."""
    import pandas as pd

    try:
        meta = json.loads((run_dir / "meta.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
        requests = pd.read_parquet(run_dir / "requests.parquet")
    except FileNotFoundError as exc:
        raise ScenarioError("RUN_DIR", f"{run_dir} is not a profiler live run ({Path(exc.filename).name} missing)") from None
    except (OSError, ValueError) as exc:
        raise ScenarioError("RUN_DIR", f"{run_dir} cannot be read ({exc.__class__.__name__})") from None
    return meta, summary, requests


def model_preset_of(config: dict) -> str:
    """The simulator's model preset with the run's dimensions."""
    from sim.presets.models import MODELS

    keys = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "tied_embeddings")
    for name, spec in MODELS.items():
        if all(getattr(spec, k) == config.get(k) for k in keys):
            return name
    raise ScenarioError("RUN_DIR", f"no model preset has the run's dimensions ({config.get('name')})")


def batch_scenarios(run_dir: Path, run: tuple, calibration: Path | None, hardware: str | None = None) -> list[dict]:
    """One scenario mapping per static batch of the run (`read_run`'s (meta, summary, requests)),
    in order."""
    meta, summary, requests = run
    if summary.get("method") != "none":
        raise ScenarioError("RUN_DIR", f"{run_dir} ran method {summary.get('method')}; validation covers "
                                       f"autoregressive runs (--method none) so far")
    args = meta["arguments"]
    batch = int(args["batch"])
    requests = requests.sort_values("request")
    if hardware is None:
        if calibration is not None:
            from sim.cost.bundle import load_bundle

            hardware = load_bundle(calibration).meta["device"].get("hardware", "cpu")
        else:
            hardware = "cpu" if meta["device"] == "cpu" else "h100-sxm"
    scenarios = []
    for first in range(0, len(requests), batch):
        chunk = requests.iloc[first:first + batch]
        prompts = [int(x) for x in chunk.prompt_tokens]
        outputs = [int(x) for x in chunk.output_tokens]
        scenarios.append({
            "hardware": hardware, "model": model_preset_of(meta["config"]),
            "dtype": {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[meta["dtype"]],
            "calibration": str(calibration) if calibration is not None else None,
            "workload": {"arrival": "closed", "concurrency": len(chunk), "requests": len(chunk),
                         "prompt_tokens": prompts, "output_tokens": outputs},
            # The live engine prefills a whole batch in one forward.
            "scheduler": {"max_batch": len(chunk), "prefill_chunk": sum(prompts)},
            "seed": int(meta.get("seed", 0))})
    return scenarios


def compare_run(run_dir: Path, calibration: Path | None) -> Comparison:
    from sim.simulate import simulate

    run = meta, summary, requests = read_run(run_dir)
    seconds, tokens = 0.0, 0
    for scenario in batch_scenarios(run_dir, run, calibration):
        result = simulate(scenario)
        seconds += result.baseline.makespan_s
        tokens += result.baseline.output_tokens
    return Comparison(str(run_dir), summary["method"], int(meta["arguments"]["batch"]), len(requests),
                      float(summary["throughput_tok_s"]), tokens / seconds)


def format_comparisons(rows: list[Comparison]) -> str:
    lines = [f"{'run':<36} {'method':<7} {'batch':>5} {'requests':>8} {'measured tok/s':>14} "
             f"{'predicted tok/s':>15} {'error':>7}"]
    for r in rows:
        lines.append(f"{r.run:<36} {r.method:<7} {r.batch:>5} {r.requests:>8} {r.measured_tok_s:>14.2f} "
                     f"{r.predicted_tok_s:>15.2f} {r.error:>+7.1%}")
    return "\n".join(lines)
