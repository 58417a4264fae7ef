"""A live run's settings, typed and checked: what `python -m profiler live` parses, what a campaign's
YAML gives each run, and what meta.json records as the run's `arguments`."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from sim.errors import InputError
from sim.formats.names import LIVE_METHODS
from sim.formats.provenance import repo_relative

DEFAULT_PROMPTS = Path(__file__).resolve().parent / "prompts.jsonl"


class LiveConfig(BaseModel):
    """One live run. Field names are the command line's flags (underscored)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "smollm2"               # smollm2, a .gguf, a Hugging Face folder, a config.json or preset (random weights)
    tokenizer: Path | None = None        # a tokenizer saved by ChatTokenizer.save
    method: Literal[LIVE_METHODS] = "ngram"
    k: int = 4                           # drafted tokens per step (chain)
    tree: tuple[int, int] | None = None  # a static tree instead of the chain: W branches of D tokens
    draft_model: str = "smollm2"         # draft_model: the draft (same forms as model)
    draft_layers: int | None = None      # draft_model: keep only the draft's first N layers
    head: Path | None = None             # eagle: the head folder (python -m profiler train-eagle)
    acceptance: tuple[float, ...] | None = None   # synthetic: the chance a draft position keeps the target's
                                         # token, one rate or one a position (past the last: the last)
    draft_shape: str | None = None       # synthetic: what drafting costs: head, none or a model preset (default head)
    bits: Literal[4, 8] = 4              # shadow: weight bits of the draft
    group_size: int = 64                 # shadow: quantization group (input columns)
    exit_layer: int = 8                  # layerskip: layers the draft runs
    sink: int = 16                       # streaming: sink tokens the draft attends
    window: int = 64                     # streaming: recent tokens the draft attends
    budget: int | None = None            # SpecPV partial verification: KV tokens selected in blocks
    period: int = 20                     # SpecPV: full verification every P tokens or steps
    period_unit: Literal["tokens", "steps"] = "tokens"
    rectify: bool = False                # SpecPV: full verifications re-check partial-mode tokens (lossless)
    partial_sink: int = 32               # SpecPV: sink tokens always read
    partial_window: int = 128            # SpecPV: recent tokens always read
    block: int = 16                      # SpecPV: selection block, tokens
    policy: str = "static"               # static, off_above_batch:N or goodput: k per step (sim's speculation.policy)
    calibration: Path | None = None      # goodput: the bundle whose cost model prices each step's k
    batch: int = 1                       # requests per static batch; continuous: cache rows (requests at once)
    serving: Literal["static", "continuous"] = "static"   # static batches, or continuous batching with arrivals
    concurrency: int | None = None       # continuous: closed-loop clients (default: batch)
    rate: float | None = None            # continuous: Poisson arrivals per second instead of a closed loop
    arrivals: Path | None = None         # continuous: a file of arrival times in seconds, one a line, instead
    prefill_chunk: int = 512             # continuous: prompt tokens prefilled per iteration
    kv_budget: int | None = None         # continuous: KV tokens admission reserves (prompt + max_new_tokens each)
    prompts: Path = DEFAULT_PROMPTS      # JSONL with `prompt` or `turns`, optional `category`
    limit: int | None = None             # the first N prompts
    per_category: int | None = None      # the first N prompts of each category, the categories in turn
    context: int | None = None           # long-context mode: prompts of this many tokens cut from `text`
    text: Path | None = None             # long-context mode: a plain-text file
    max_new_tokens: int = 64
    temperature: float = 0.0             # 0: greedy verification; > 0: rejection sampling
    top_p: float = 1.0
    baseline: bool = False               # also run autoregressive decoding: speedup
    check_lossless: bool = False         # compare with autoregressive output (implies baseline)
    probe: bool = False                  # time the machine probe before and after the run
    warmup_tokens: int | None = None     # an untimed first pass of one batch, this many tokens long
                                         # (default: 8 on cuda, where Triton compiles each new shape; 0 on cpu)
    threads: int | None = None           # torch CPU threads
    device: Literal["cpu", "cuda"] = "cpu"
    cuda_graphs: bool = True             # on cuda: replay decode / verify / chain-draft forwards from CUDA graphs
    dtype: Literal["fp32", "bf16"] = "fp32"
    seed: int = 0
    out: Path                            # the run folder to write (must not exist)

    @field_validator("acceptance", mode="before")
    @classmethod
    def _rates(cls, value):
        """A campaign's YAML may give one rate as a number, or rates as "0.9,0.8"."""
        if isinstance(value, (int, float)):
            return (value,)
        return parse_rates(value) if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _synthetic_draft_shape(cls, values):
        # Recorded runs of the synthetic drafter always name their draft shape: validation groups by it.
        if isinstance(values, dict) and values.get("method") == "synthetic" and values.get("draft_shape") is None:
            values = {**values, "draft_shape": "head"}
        return values

    def recorded(self) -> dict:
        """The settings as meta.json records them (`arguments`): paths relative to the repository;
        no prompts file in long-context mode, which cuts its prompts from `text`."""
        values = self.model_dump(mode="json")
        for name in ("tokenizer", "head", "prompts", "text", "arrivals", "calibration", "out"):
            values[name] = repo_relative(getattr(self, name))
        if self.context is not None:
            values["prompts"] = None
        return values


def parse_rates(text: str) -> tuple[float, ...]:
    """--acceptance: `A` or `A1,A2,...` as rates (ValueError if not numbers; their range is check_config's)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise ValueError(f"expects a rate or comma-separated rates, e.g. 0.8 or 0.9,0.8,0.7 (got {text!r})")
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"expects a rate or comma-separated rates, e.g. 0.8 or 0.9,0.8,0.7 (got {text!r})") from None


def check_synthetic(settings: LiveConfig) -> None:
    """The synthetic drafter's flags: --acceptance with it and only with it, each rate in [0, 1];
    --draft-shape head, none or a dense model preset."""
    if settings.method != "synthetic":
        for flag, value in (("--acceptance", settings.acceptance), ("--draft-shape", settings.draft_shape)):
            if value is not None:
                raise InputError(flag, "belongs to the synthetic drafter; give --method synthetic")
        return
    if settings.acceptance is None:
        raise InputError("--acceptance", "the synthetic drafter keeps each draft position with a set chance: give "
                                         "--acceptance A or A1,A2,... (each in [0, 1])")
    for rate in settings.acceptance:
        if not 0.0 <= rate <= 1.0:
            raise InputError("--acceptance", f"each rate must be in [0, 1] (got {rate})")
    if settings.temperature > 0:
        raise InputError("--temperature", "the synthetic drafter drafts the target's greedy continuation; "
                                          "it takes no --temperature")
    from sim.scenario.presets.models import MODELS

    shape = settings.draft_shape
    if shape not in ("head", "none") and shape not in MODELS:
        raise InputError("--draft-shape", f"unknown draft shape {shape!r} (head, none, or a model preset: "
                                          f"{', '.join(sorted(MODELS))})")
    if shape in MODELS and (MODELS[shape].experts is not None or MODELS[shape].latent is not None):
        raise InputError("--draft-shape", f"{shape} is a mixture of experts or uses latent attention; the live "
                                          f"engine runs dense Llama-family drafts only")


def parse_policy(text: str) -> tuple[str, int | None]:
    """--policy: `static`, `off_above_batch:N` (N >= 0) or `goodput`, as (kind, N)."""
    if text in ("static", "goodput"):
        return text, None
    kind, _, value = text.partition(":")
    if kind == "off_above_batch":
        if value.isdigit():
            return kind, int(value)
        raise InputError("--policy", f"off_above_batch needs a batch size >= 0: off_above_batch:N (got {text!r})")
    raise InputError("--policy", f"unknown policy {text!r} (known: static, off_above_batch:N, goodput)")


def check_config(settings: LiveConfig) -> None:
    """Every rule a run's settings must meet before anything loads, as one-line errors naming the flag."""
    for name in ("k", "batch", "max_new_tokens", "exit_layer", "sink", "window", "group_size", "period",
                 "partial_sink", "partial_window", "block", "prefill_chunk", "concurrency", "kv_budget",
                 "per_category"):
        if getattr(settings, name) is not None and getattr(settings, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}", f"must be >= 1 (got {getattr(settings, name)})")
    arrivals = [name for name in ("concurrency", "rate", "arrivals") if getattr(settings, name) is not None]
    if arrivals and settings.serving != "continuous":
        raise InputError(f"--{arrivals[0]}", "needs --serving continuous (static batches start together)")
    if len(arrivals) > 1:
        raise InputError(f"--{arrivals[1]}", f"give one of --concurrency, --rate, --arrivals (got {', '.join(arrivals)})")
    if settings.rate is not None and not settings.rate > 0:
        raise InputError("--rate", f"must be > 0 requests per second (got {settings.rate})")
    if settings.arrivals is not None and not settings.arrivals.is_file():
        raise InputError("--arrivals", f"{settings.arrivals} is not a file")
    if settings.temperature < 0:
        raise InputError("--temperature", f"must be >= 0 (got {settings.temperature})")
    if not 0 < settings.top_p <= 1:
        raise InputError("--top-p", f"must be in (0, 1] (got {settings.top_p})")
    if (settings.context is None) != (settings.text is None):
        raise InputError("--context", "long-context mode needs both --context and --text")
    if settings.context is not None and settings.context < 64:
        raise InputError("--context", f"must be >= 64 tokens (got {settings.context})")
    if settings.warmup_tokens is not None and settings.warmup_tokens < 0:
        raise InputError("--warmup-tokens", f"must be >= 0 (got {settings.warmup_tokens})")
    if settings.limit is not None and settings.limit < 1:
        raise InputError("--limit", f"must be >= 1 (got {settings.limit})")
    if settings.draft_layers is not None and settings.draft_layers < 1:
        raise InputError("--draft-layers", f"must be >= 1 (got {settings.draft_layers})")
    if settings.budget is not None:
        if settings.method == "none":
            raise InputError("--budget", "partial verification needs a drafter (--method other than none)")
        if settings.budget < settings.block or settings.budget % settings.block:
            raise InputError("--budget", f"must be a positive multiple of --block {settings.block} (got {settings.budget})")
        if settings.rectify and settings.temperature > 0:
            raise InputError("--rectify", "re-checks greedy choices; it takes no --temperature")
    elif settings.rectify:
        raise InputError("--rectify", "needs --budget (partial verification)")
    files = [("--model", settings.model)] + ([("--draft-model", settings.draft_model)]
                                             if settings.method == "draft_model" else [])
    for flag, name in files:
        # A missing file is named before the target (seconds to load) is read.
        if Path(name).suffix == ".gguf" and not Path(name).is_file():
            raise InputError(flag, f"no such model file: {name}")
    if (settings.method == "eagle") != (settings.head is not None):
        raise InputError("--head", "--method eagle drafts with a head: give --head DIR (python -m profiler train-eagle)"
                         if settings.method == "eagle" else "is the eagle method's head; give --method eagle")
    check_synthetic(settings)
    if settings.tree is not None and settings.method == "none":
        raise InputError("--tree", "needs a drafter (--method other than none)")
    kind, _ = parse_policy(settings.policy)
    if kind != "static":
        if settings.method == "none":
            raise InputError("--policy", f"{kind} needs a drafter (--method other than none)")
        if settings.budget is not None:
            raise InputError("--policy", f"{kind} does not combine with --budget (SpecPV verifies at every step)")
    if kind == "goodput":
        if settings.tree is not None:
            raise InputError("--policy", "goodput chooses a chain's k; a tree takes static or off_above_batch")
        if settings.method == "synthetic":
            raise InputError("--policy", "goodput does not price the synthetic drafter's steps yet; use static or "
                                         "off_above_batch")
        if settings.calibration is None:
            raise InputError("--policy", "goodput prices each step's k with a calibration bundle: give --calibration")
        if not (settings.calibration / "meta.json").is_file():
            raise InputError("--calibration", f"{settings.calibration} is not a calibration bundle (no meta.json)")
    elif settings.calibration is not None:
        raise InputError("--calibration", "only --policy goodput prices steps with a bundle")
    if settings.out.exists():
        raise InputError("--out", f"{settings.out} exists; give a new folder")


