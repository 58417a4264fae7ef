"""A catalogue case as the scenario that reproduces it.

The mapping is fixed, the same for every case, and nothing in it is set per case:
- engine: vLLM, SGLang and TensorRT-LLM batch continuously; Hugging Face eager code and gpt-fast
  run static batches (prefill the batch, decode until its last request ends, or until its first
  does where the source's harness stops there), padded to the longest row as they are;
- workload: a closed loop at the case's batch (4 x batch requests, so a continuous engine reaches
  its steady state; one batch for a static engine) or Poisson arrivals at its rate; the stated
  prompt and output lengths (drawn uniformly below them where the case gives a benchmark tool's
  range_ratio), else the dataset's lengths in catalogue.yaml;
- parallelism: tensor parallel as stated; pipeline-split layers (Hugging Face device_map) cost
  what one GPU with the GPUs' memory would;
- acceptance: the measured tokens per step; else the per-token rate solved on the case's anchor.
"""
from __future__ import annotations

import math

from sim.validate.published.catalogue import Catalogue, Entry

STATIC_ENGINES = ("hf-eager", "gpt-fast")


# Preset fields set for a prediction instead of the presets' own: {("hardware" | "engine", preset,
# field): value}. `sim validate --published --fit` searches them on the fit half (fit.py).
Settings = dict[tuple[str, str, str], float]


def case_scenario(entry: Entry, catalogue: Catalogue, acceptance: dict, settings: Settings | None = None,
                  cost: str = "auto") -> dict:
    """The scenario mapping of one case with the given acceptance block (tokens_per_step or rate),
    its presets' fields replaced by `settings` where they name them; `cost` as the scenario field
    (a case with published kernel tables is priced by them whatever it says)."""
    case = entry.case
    w = case.workload
    lengths = catalogue.halves.lengths.get(w.dataset)
    prompt: int | dict = w.prompt_tokens or lengths.prompt_tokens
    output: int | dict = w.output_tokens or lengths.output_tokens
    if w.range_ratio is not None:
        prompt, output = uniform_lengths(prompt, w.range_ratio), uniform_lengths(output, w.range_ratio)
    static = case.engine in STATIC_ENGINES
    if w.batch is not None:
        workload = {"arrival": "closed", "concurrency": w.batch, "requests": w.batch if static else max(4 * w.batch, 8)}
    else:
        workload = {"arrival": "poisson", "rate_qps": w.rate_qps, "requests": 200}
    workload.update(prompt_tokens=prompt, output_tokens=output)
    hardware: str | dict = case.hardware
    tp = case.tensor_parallel
    if case.parallelism == "pipeline" and case.gpus > 1:
        from sim.scenario.presets import HARDWARE

        hardware = {"preset": case.hardware, "memory_gb": HARDWARE[case.hardware].memory_gb * case.gpus}
        tp = 1
    engine: str | dict = case.engine
    for (kind, preset, field), value in (settings or {}).items():
        if kind == "hardware" and preset == case.hardware:
            hardware = (hardware if isinstance(hardware, dict) else {"preset": hardware}) | {field: value}
        elif kind == "engine" and preset == case.engine:
            engine = (engine if isinstance(engine, dict) else {"preset": engine}) | {field: value}
    kernels = measured_kernels(case.hardware, case.model, case.dtype, tp)
    return {
        **({"calibration": kernels} if kernels else {}),
        "hardware": hardware, "model": case.model, "dtype": case.dtype, "tensor_parallel": tp,
        "engine": engine, "workload": workload, "speculation": speculation(case, acceptance),
        **({"cost": cost} if cost != "auto" and not kernels else {}),
        "scheduler": {"batching": "static" if static else "continuous", "pad_ragged": static,
                      "max_batch": w.batch or 256, "prefill_chunk": 8192 if static else 2048}
                     | ({"static_end": case.static_end} if case.static_end != "last" else {}),
        "seed": 0,
    }


def uniform_lengths(length: int, ratio: float) -> dict:
    """Token counts drawn uniformly from [max(1, ratio x length), length], as a benchmark tool's
    random dataset draws them: a uniform distribution of that width (std = width / sqrt(12)),
    clipped to the range."""
    low = max(1, int(length * ratio))
    return {"dist": "uniform", "mean": (low + length) / 2, "std": (length - low) / (2 * math.sqrt(3)),
            "min": low, "max": length}


def speculation(case, acceptance: dict) -> dict:
    p = case.parameters
    spec: dict = {"method": case.method, "acceptance": acceptance}
    if p.tree is not None and (p.tree.tokens or 0) > p.tree.depth:
        tree = {"depth": p.tree.depth, "tokens": p.tree.tokens}
        if p.tree.topk is not None:
            tree["topk"] = p.tree.topk
        spec["tree"] = tree
    else:
        spec["num_speculative_tokens"] = depth(case)
    draft = {}
    if p.draft_model is not None:
        draft["model"] = p.draft_model
    if p.draft_kv_budget is not None:
        draft["kv_budget"] = p.draft_kv_budget
    if p.draft_layers is not None:
        draft["layers"] = p.draft_layers
    if draft:
        spec["draft"] = draft
    return spec


def depth(case) -> int:
    """The longest chain a step of the case can accept (a tree's depth; 3 where nothing is stated)."""
    p = case.parameters
    return (p.tree.depth if p.tree is not None else p.num_speculative_tokens) or 3


def measured_kernels(hardware: str, model: str, dtype: str, tp: int) -> str | None:
    """The published kernel table that times this model's layers on this hardware at this
    tensor-parallel size, if one is committed (calibration/published), as a scenario names it."""
    from sim.formats.published import PUBLISHED, layer_shape, published_metas, timed_layer_shape
    from sim.scenario.presets import MODELS

    spec = MODELS.get(model)
    if spec is None or dtype not in ("bf16", "fp16") or spec.experts is not None or spec.latent is not None:
        return None
    for name, meta in published_metas(PUBLISHED, "kernels", ("linear.qkv",)).items():
        if meta["hardware"] == hardware and tp in meta["grid"]["linear.qkv"]["axes"]["ranks"] \
                and timed_layer_shape(meta) == layer_shape(spec):
            return str(PUBLISHED / name)
    return None
