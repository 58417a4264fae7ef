"""The scenario: one deployment question, validated.

A scenario is a YAML mapping (docs/scenario.md documents every field). `load_scenario` turns a path,
a mapping or a Scenario into a validated Scenario, or raises InputError with one line naming the
field and the reason. Presets are resolved here, once, into plain specs (`Scenario.hardware_spec`,
`.model_spec`, `.engine_spec`, `.draft_spec`), so nothing downstream looks a name up again.
"""
from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                      ValidationError, model_validator)

from sim.errors import InputError
from sim.formats.names import METHODS
from sim.scenario.presets import ENGINES, HARDWARE, MODELS, EngineSpec, HardwareSpec, ModelSpec, load_hf_config

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
# Weight-only int4 (AWQ / GPTQ): 4 bits plus a 16-bit scale and a 4-bit zero per group of 128.
INT4_WEIGHT_BYTES = 0.5 + (2 + 0.5) / 128
# The dtype activations, norms and attention run in, per weight dtype: fp8 checkpoints (W8A8)
# quantize GEMM inputs on the fly and keep everything else in bf16; int4 ones run fp16 GEMMs on
# dequantized tiles (Marlin, AWQ kernels).
ACTIVATION_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8": "bf16", "int4": "fp16"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LengthDist(Strict):
    """A distribution of token counts, sampled per request and rounded, then clipped to [min, max]."""
    dist: Literal["lognormal", "normal", "uniform"]
    mean: PositiveFloat
    std: NonNegativeFloat = 0.0
    min: PositiveInt = 1
    max: PositiveInt | None = None

    @model_validator(mode="after")
    def _check_range(self):
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


Lengths = Union[PositiveInt, LengthDist, Annotated[list[PositiveInt], Field(min_length=1)]]


class Workload(Strict):
    arrival: Literal["closed", "poisson", "trace"] = "closed"
    concurrency: PositiveInt | None = 16
    rate_qps: PositiveFloat | None = None
    requests: PositiveInt = 200
    prompt_tokens: Lengths = 94
    output_tokens: Lengths = 166
    trace: Path | None = None
    # arrival trace without a file: each request's arrival time, seconds (sorted), its prompt and
    # output lengths from prompt_tokens and output_tokens (lists, in the same order)
    arrival_s: Annotated[list[Annotated[float, Field(ge=0)]], Field(min_length=1)] | None = None
    # Request categories (what a route policy keys on): each request draws one with these weights
    # (normalized); a trace file may carry a `category` column instead.
    categories: dict[str, PositiveFloat] | None = None

    @model_validator(mode="after")
    def _check_arrival(self):
        if self.arrival == "poisson" and self.rate_qps is None:
            raise ValueError("arrival poisson needs rate_qps")
        if self.arrival == "trace" and (self.trace is None) == (self.arrival_s is None):
            raise ValueError("arrival trace needs trace (a CSV/Parquet/JSONL file) or arrival_s, not both")
        if self.arrival_s is not None:
            if self.arrival != "trace":
                raise ValueError("arrival_s goes with arrival: trace")
            if any(b < a for a, b in zip(self.arrival_s, self.arrival_s[1:])):
                raise ValueError("arrival_s must be sorted")
        if self.arrival == "closed" and self.concurrency is None:
            raise ValueError("arrival closed needs concurrency")
        return self


class Tree(Strict):
    """A static tree: `width` candidates at each of `depth` levels, or `tokens` spread over `depth`.

    topk (with tokens): EAGLE-2/3 and SGLang's form: each of `depth` draft forwards expands the
    `topk` best branches (topk query tokens per request), and the best `tokens` of the candidates
    are verified."""
    width: PositiveInt | None = None
    depth: PositiveInt
    tokens: PositiveInt | None = None
    topk: PositiveInt | None = None

    @model_validator(mode="after")
    def _check_form(self):
        if (self.width is None) == (self.tokens is None):
            raise ValueError("give exactly one of width or tokens (with depth)")
        if self.tokens is not None and self.tokens < self.depth:
            raise ValueError(f"tokens ({self.tokens}) must be at least depth ({self.depth})")
        if self.topk is not None and self.tokens is None:
            raise ValueError("topk goes with tokens (width already is the per-level count)")
        return self

    @property
    def draft_tokens(self) -> int:
        """Drafted tokens in the tree, root excluded."""
        return self.width * self.depth if self.width is not None else self.tokens

    @property
    def tokens_per_draft_forward(self) -> int:
        if self.width is not None:
            return self.width
        return self.topk if self.topk is not None else math.ceil(self.tokens / self.depth)


class Acceptance(Strict):
    """How many drafted tokens the target keeps. Exactly one of the four forms."""
    tokens_per_step: float | None = Field(default=None, ge=1.0)
    rate: float | None = Field(default=None, ge=0.0, lt=1.0)
    per_position: Annotated[list[Annotated[float, Field(ge=0.0, le=1.0)]], Field(min_length=1)] | None = None
    trace: Path | None = None
    request_spread: NonNegativeFloat = 0.0   # std of the per-request rate across requests (Beta)
    context_slope: float = 0.0               # change of the rate per doubling of context past 1024
    # Share of a request's steps at which the drafter proposes at all (an n-gram drafter only where
    # the history matches); at the others the request verifies and commits one token.
    draft_share: float = Field(default=1.0, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _check_one_form(self):
        forms = [name for name in ("tokens_per_step", "rate", "per_position", "trace")
                 if getattr(self, name) is not None]
        if len(forms) != 1:
            got = ", ".join(forms) if forms else "none"
            raise ValueError(f"give exactly one of tokens_per_step, rate, per_position, trace (got {got})")
        if (self.request_spread or self.context_slope) and forms[0] not in ("rate", "per_position"):
            raise ValueError("request_spread and context_slope apply to rate or per_position")
        if self.draft_share < 1.0 and forms[0] == "trace":
            raise ValueError("draft_share does not apply to a trace (it records every step)")
        return self


STREAMING_KV_BUDGET = 512     # a streaming self-draft's KV tokens where draft.kv_budget is unset


class Draft(Strict):
    model: str | None = None          # draft_model: preset or config.json
    bits: Literal[4, 8] = 4           # shadow: weight-only quantization of the target's layers
    group_size: PositiveInt = 64      # shadow
    exit_layer: PositiveInt | None = None   # layerskip
    # streaming: sink + recent window the self-draft attends to (unset: 512); draft_model: set, the
    # draft model's own KV is a StreamingLLM cache of this many tokens (MagicDec), unset, the whole context.
    kv_budget: PositiveInt | None = None
    sink: PositiveInt = 32            # streaming / draft_model with kv_budget: of kv_budget, the sink part
    layers: PositiveInt = 1           # eagle / eagle3 / mtp / medusa head depth
    vocab: PositiveInt | None = None  # head vocabulary; default 32000 for eagle3, the target's otherwise


class Disagreement(Strict):
    """SpecPV: probability that a token accepted under partial attention differs from full attention.

    p = per_token * (at_budget / budget) ** budget_exponent * (context / at_context) ** context_exponent,
    clipped to [0, 1]; zero while the whole context fits in the partial cache.
    """
    per_token: float = Field(default=0.002, ge=0.0, le=1.0)
    at_budget: PositiveInt = 4096
    at_context: PositiveInt = 32768
    budget_exponent: NonNegativeFloat = 1.0
    context_exponent: NonNegativeFloat = 0.5


class PartialVerify(Strict):
    budget: PositiveInt
    sink: PositiveInt = 32
    window: PositiveInt = 128
    block: PositiveInt = 16
    period: PositiveInt = 20
    period_unit: Literal["tokens", "steps"] = "tokens"
    rectify: bool = False
    # When blocks are chosen: at each full verification, for the partial steps until the next one
    # (SpecPV), or at every partial step from the step's own queries (Quest; the live engine).
    reselect: Literal["refresh", "step"] = "refresh"
    disagreement: Disagreement = Disagreement()

    @property
    def static_tokens(self) -> int:
        """Partial-cache tokens besides the buffer of tokens accepted since the last refresh."""
        return self.sink + self.budget + self.window


class Goodput(Strict):
    """k chosen each iteration for the whole batch, to maximize expected committed tokens per second."""
    allow_off: bool = True            # k = 0 (a plain decode step) is one of the choices


class SecondDrafter(Strict):
    """A drafter beside the scenario's method (route, combine): prompt lookup on the host, whose
    acceptance (draft_share: the share of steps at which its history matches) is its own, or, in a
    route, `none` (those requests decode without speculation) or the scenario's own method with
    the category's acceptance."""
    method: Literal[METHODS] = "ngram"
    num_speculative_tokens: PositiveInt | None = None     # unset: the scenario's
    acceptance: Acceptance | None = None

    @model_validator(mode="after")
    def _check_form(self):
        if self.method == "none" and (self.acceptance is not None or self.num_speculative_tokens is not None):
            raise ValueError("method none takes no acceptance or num_speculative_tokens")
        if self.method != "none" and self.acceptance is None:
            raise ValueError(f"method {self.method} needs acceptance")
        if self.acceptance is not None and self.acceptance.trace is not None:
            raise ValueError("a second drafter's acceptance takes rate, per_position or tokens_per_step, not a trace")
        return self


class Combine(Strict):
    """Two drafters propose at every step; per request, one proposal is verified. `proposes`: the
    second drafter's wherever it has one (its history matches), the method's elsewhere (suffix or
    prompt lookup first, a model drafter as the fallback); `confident`: the second's where it has
    one and expects to have more drafts accepted than the method does (each from its own
    acceptance: mean survival, per request where the acceptance has a request spread)."""
    drafter: SecondDrafter
    rule: Literal["proposes", "confident"] = "proposes"

    @model_validator(mode="after")
    def _check_host(self):
        if self.drafter.method != "ngram":
            raise ValueError(f"combine's drafter is prompt lookup (method ngram), got {self.drafter.method}")
        return self


POLICIES = ("static", "off_above_batch", "k_by_batch", "goodput", "oracle", "route", "combine")
BatchRange = Annotated[list[NonNegativeInt], Field(min_length=3, max_length=3)]


class Policy(Strict):
    """How many tokens each iteration drafts: at most one field (none: static, the scenario's k
    at every step). Written `policy: static`, `policy: goodput`, `policy: oracle`,
    `policy: {off_above_batch: 8}`, `policy: {k_by_batch: [[1, 4, 5], [5, 32, 2], [33, 256, 0]]}`
    or `policy: {goodput: {allow_off: false}}`."""
    off_above_batch: NonNegativeInt | None = None   # no drafting while more requests than this run
    # [first batch, last batch, k] ranges (inclusive; batch: requests in the running batch), the
    # first from 1, sorted, without gaps; past the last range its k holds. vLLM's
    # num_speculative_tokens_per_batch_size.
    k_by_batch: Annotated[list[BatchRange], Field(min_length=1)] | None = None
    goodput: Goodput | None = None
    oracle: bool = False      # a bound: each step proposes exactly what will be accepted
    # category -> the drafter its requests use (categories from workload.categories or the trace);
    # categories not named keep the scenario's method.
    route: Annotated[dict[str, SecondDrafter], Field(min_length=1)] | None = None
    combine: Combine | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value):
        if isinstance(value, str):
            if value == "static":
                return {}
            if value == "goodput":
                return {"goodput": {}}
            if value == "oracle":
                return {"oracle": True}
            if value == "off_above_batch":
                raise ValueError("off_above_batch needs a batch size: {off_above_batch: N}")
            if value == "k_by_batch":
                raise ValueError("k_by_batch needs ranges: {k_by_batch: [[1, LAST, K], [LAST + 1, ..., K2], ...]}")
            if value in ("route", "combine"):
                raise ValueError(f"{value} needs its drafters (docs/scenario.md, speculation.policy)")
            raise ValueError(f"unknown policy {value!r} (known: {', '.join(POLICIES)})")
        return value

    @model_validator(mode="after")
    def _check_one(self):
        if sum((self.off_above_batch is not None, self.k_by_batch is not None, self.goodput is not None,
                self.oracle, self.route is not None, self.combine is not None)) > 1:
            raise ValueError("give at most one of off_above_batch, k_by_batch, goodput, oracle, route, combine")
        if self.k_by_batch is not None:
            expected = 1
            for first, last, _ in self.k_by_batch:
                if first != expected or last < first:
                    raise ValueError(f"k_by_batch ranges must run from batch 1 without gaps or overlaps "
                                     f"(expected [{expected}, last >= {expected}, k], got [{first}, {last}, ...])")
                expected = last + 1
        return self

    @property
    def kind(self) -> str:
        if self.off_above_batch is not None:
            return "off_above_batch"
        if self.k_by_batch is not None:
            return "k_by_batch"
        if self.route is not None:
            return "route"
        if self.combine is not None:
            return "combine"
        return "goodput" if self.goodput else "oracle" if self.oracle else "static"

    @property
    def second_drafters(self) -> list[SecondDrafter]:
        """The drafters besides the scenario's method that route or combine runs."""
        if self.route is not None:
            return list(self.route.values())
        return [self.combine.drafter] if self.combine is not None else []


class Speculation(Strict):
    method: Literal[METHODS] = "none"
    num_speculative_tokens: PositiveInt = 3
    tree: Tree | None = None
    acceptance: Acceptance | None = None
    draft: Draft = Draft()
    partial_verify: PartialVerify | None = None
    policy: Policy = Policy()

    @model_validator(mode="after")
    def _check_method(self):
        if self.method == "none":
            if self.acceptance is not None or self.tree is not None or self.partial_verify is not None:
                raise ValueError("method none takes no acceptance, tree or partial_verify")
            if self.policy.kind != "static":
                raise ValueError(f"policy {self.policy.kind} needs a speculation method")
        elif self.acceptance is None:
            raise ValueError(f"method {self.method} needs acceptance")
        if self.method == "draft_model" and self.draft.model is None:
            raise ValueError("method draft_model needs draft.model")
        if self.method == "layerskip" and self.draft.exit_layer is None:
            raise ValueError("method layerskip needs draft.exit_layer")
        if self.method == "medusa" and self.draft_depth > 8:
            raise ValueError("medusa has one head per draft position; more than 8 heads is unsupported")
        if self.draft_kv_window is not None and self.draft.sink >= self.draft_kv_window:
            raise ValueError("draft.sink must be below draft.kv_budget")
        if self.acceptance is not None and self.acceptance.tokens_per_step is not None:
            if self.acceptance.tokens_per_step > self.max_tokens_per_step:
                raise ValueError(f"acceptance.tokens_per_step {self.acceptance.tokens_per_step} exceeds "
                                 f"the {self.max_tokens_per_step} a step can commit")
        if self.policy.kind != "static" and self.partial_verify is not None:
            raise ValueError(f"policy {self.policy.kind} does not combine with partial_verify "
                             "(SpecPV verifies at every step)")
        if self.policy.kind in ("goodput", "oracle", "k_by_batch", "route", "combine") and self.tree is not None:
            raise ValueError(f"policy {self.policy.kind} takes a chain; a tree takes static or off_above_batch")
        for category, drafter in (self.policy.route or {}).items():
            if drafter.method not in ("ngram", "none", self.method):
                raise ValueError(f"route {category}: method {drafter.method} is neither ngram, none nor the "
                                 f"scenario's {self.method} (one model drafter per step)")
            if drafter.method == self.method and drafter.num_speculative_tokens not in (None, self.num_speculative_tokens):
                raise ValueError(f"route {category}: the scenario's method drafts its num_speculative_tokens "
                                 f"({self.num_speculative_tokens}) in every category")
        if self.policy.combine is not None and self.method in ("ngram", "none"):
            raise ValueError("combine pairs prompt lookup with a model drafter: the scenario's method must be one")
        for second in self.policy.second_drafters:
            a, k = second.acceptance, second.num_speculative_tokens or self.num_speculative_tokens
            if a is not None and a.tokens_per_step is not None and a.tokens_per_step > k + 1:
                raise ValueError(f"a second drafter's acceptance.tokens_per_step {a.tokens_per_step} exceeds "
                                 f"the {k + 1} a step of {k} drafts can commit")
            if a is not None and a.per_position is not None and len(a.per_position) < k:
                raise ValueError(f"a second drafter's acceptance.per_position has {len(a.per_position)} rates "
                                 f"for {k} drafts")
        if self.policy.k_by_batch is not None:
            most = max(k for _, _, k in self.policy.k_by_batch)
            if most > self.num_speculative_tokens:
                raise ValueError(f"policy k_by_batch drafts up to {most}, above num_speculative_tokens "
                                 f"{self.num_speculative_tokens} (the most a step drafts)")
        if self.acceptance is not None and self.acceptance.per_position is not None:
            if len(self.acceptance.per_position) < self.draft_depth:
                raise ValueError(f"acceptance.per_position has {len(self.acceptance.per_position)} rates; "
                                 f"the draft is {self.draft_depth} deep")
        return self

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def draft_kv_window(self) -> int | None:
        """KV tokens per request the draft attends to, None for the whole context: streaming's
        kv_budget, and a draft model's where the scenario sets one."""
        if self.method == "streaming":
            return self.draft.kv_budget or STREAMING_KV_BUDGET
        return self.draft.kv_budget if self.method == "draft_model" else None

    @property
    def draft_depth(self) -> int:
        """Longest chain of drafted tokens a step can accept."""
        return self.tree.depth if self.tree is not None else self.num_speculative_tokens

    @property
    def max_tokens_per_step(self) -> int:
        return self.draft_depth + 1

    @property
    def verify_tokens(self) -> int:
        """Query tokens per request in a verification forward: the drafts plus the last committed token."""
        drafted = self.tree.draft_tokens if self.tree is not None else self.num_speculative_tokens
        for second in self.policy.second_drafters:     # route, combine: the longest proposal
            drafted = max(drafted, second.num_speculative_tokens or 0)
        return drafted + 1


class Offload(Strict):
    weights: Union[Literal["auto"], Annotated[float, Field(ge=0.0, le=1.0)], dict[Literal["layers"], Annotated[int, Field(ge=0)]]] = "auto"
    kv: bool = False
    link_gb_s: PositiveFloat | None = None
    overlap: bool = True


class Scheduler(Strict):
    max_batch: PositiveInt = 256
    prefill_chunk: PositiveInt = 512
    kv_memory_fraction: float = Field(default=0.9, gt=0.0, le=1.0)
    # Static-shape engines (gpt-fast, profiler live) run every row of a forward at the longest row's
    # token count and attend over the longest row's context (one dense cache tensor, the shorter rows
    # masked), and prefill the prompts of one forward at the longest prompt's length; ragged-batch
    # engines (vLLM, SGLang) run each row's own tokens over its own context.
    pad_ragged: bool = False
    # Whether the decoding requests' tokens (their verification's, with speculation) come out of
    # prefill_chunk first, prompts taking what is left: vLLM's max_num_batched_tokens and llama.cpp's
    # batch size count every token of an iteration; false: prompts get prefill_chunk of their own.
    budget_includes_decode: bool = False
    # mixed: an iteration's prompt chunks ride in the decoding requests' target forward (vLLM,
    # SGLang, llama.cpp); per_request: each prefilling request's chunk is a target forward of its
    # own, before the decode step (`profiler live --serving continuous`, whose padded rows would
    # otherwise run every decode row at the chunk's length).
    prefill_forward: Literal["mixed", "per_request"] = "mixed"
    # continuous: requests join and leave the running batch at any iteration (vLLM, SGLang);
    # static: a batch of up to max_batch (or the closed loop's concurrency) is admitted together,
    # its prompts prefilled in one forward, and decoded until its last request finishes before the
    # next batch starts (gpt-fast, Hugging Face generate, the papers' own loops, `profiler live`).
    batching: Literal["continuous", "static"] = "continuous"
    # How a static batch ends. last: when its last request is done, finished rows running on as
    # padding (Hugging Face generate, gpt-fast, EAGLE's batch loop). first: as soon as one request
    # reaches its output length, every row keeping what it committed so far (benchmark loops that
    # time a fixed number of new tokens per batch: MagicDec's and TriForce's).
    static_end: Literal["last", "first"] = "last"

    @model_validator(mode="after")
    def _check_static_end(self):
        if self.static_end != "last" and self.batching != "static":
            raise ValueError("static_end applies to batching: static")
        return self


class Slo(Strict):
    ttft_ms_p90: PositiveFloat | None = None
    tpot_ms_p90: PositiveFloat | None = None


class Scenario(Strict):
    hardware: Union[str, dict[str, Any]] = "h100-sxm"
    model: str = "llama-3.1-8b"
    dtype: Literal["bf16", "fp16", "fp32", "fp8", "int4"] = "bf16"
    kv_dtype: Literal["auto", "bf16", "fp16", "fp32", "fp8"] = "auto"   # auto: the activation dtype
    tensor_parallel: PositiveInt = 1
    # Mixtures of experts: false splits every expert across the tensor-parallel GPUs; true places
    # whole experts, routed / tensor_parallel on each GPU (attention stays tensor parallel).
    expert_parallel: bool = False
    engine: Union[str, dict[str, Any]] = "vllm"
    calibration: Path | None = None
    workload: Workload = Workload()
    speculation: Speculation = Speculation()
    offload: Offload = Offload()
    scheduler: Scheduler = Scheduler()
    slo: Slo = Slo()
    seed: NonNegativeInt = 0

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True, allow_inf_nan=False)

    # Presets resolved once. pydantic keeps cached_property values out of validation.
    @cached_property
    def hardware_spec(self) -> HardwareSpec:
        return resolve_hardware(self.hardware)

    @cached_property
    def model_spec(self) -> ModelSpec:
        return resolve_model(self.model, "model")

    @cached_property
    def engine_spec(self) -> EngineSpec:
        return resolve_engine(self.engine)

    @cached_property
    def draft_spec(self) -> ModelSpec | None:
        if self.speculation.method != "draft_model":
            return None
        return resolve_model(self.speculation.draft.model, "speculation.draft.model")

    @property
    def activation_dtype(self) -> str:
        return ACTIVATION_DTYPE[self.dtype]

    @property
    def dtype_bytes(self) -> int:
        """Bytes of an activation element (hidden states, logits workspace)."""
        return DTYPE_BYTES[self.activation_dtype]

    @property
    def weight_bytes(self) -> float:
        """Bytes per weight of the decoder layers, embeddings and LM head."""
        return INT4_WEIGHT_BYTES if self.dtype == "int4" else DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes(self) -> int:
        """Bytes per cached K or V element."""
        return DTYPE_BYTES[self.activation_dtype if self.kv_dtype == "auto" else self.kv_dtype]

    @property
    def gemm_dtype(self) -> str:
        """The tensor-core rate GEMMs run at: fp8 where the hardware has fp8 tensor cores (else the
        weights are only stored as fp8 and dequantized to bf16), fp16 for int4 weights."""
        if self.dtype == "fp8":
            return "fp8" if self.hardware_spec.fp8_tflops else "bf16"
        return self.activation_dtype

    def with_method_none(self) -> "Scenario":
        """The same scenario without speculation: the baseline every result is divided by."""
        return self.model_copy(update={"speculation": Speculation()})


def resolve_hardware(value: str | dict) -> HardwareSpec:
    if not isinstance(value, (str, dict)):
        raise InputError("hardware", f"must be a preset name or a mapping (got {value!r})")
    if isinstance(value, dict) and "preset" in value and not isinstance(value["preset"], str):
        raise InputError("hardware.preset", f"must be a preset name (got {value['preset']!r})")
    if isinstance(value, str):
        if value not in HARDWARE:
            raise InputError("hardware", f"unknown preset {value!r} (known: {', '.join(HARDWARE)})")
        return HARDWARE[value]
    known = set(HardwareSpec.__dataclass_fields__)
    unknown = set(value) - known - {"preset"}
    if unknown:
        raise InputError(f"hardware.{sorted(unknown)[0]}", "unknown field")
    if "preset" in value:
        base = resolve_hardware(value["preset"])
        overrides = {k: v for k, v in value.items() if k != "preset"}
        _check_positive_numbers("hardware", overrides)
        return _check_link(base.with_overrides(**overrides))
    missing = [f for f, spec in HardwareSpec.__dataclass_fields__.items()
               if f not in value and spec.default is spec.default_factory]
    missing = [f for f in missing if f not in ("name", "host_memory_gb", "link_gb_s")]
    if missing:
        raise InputError(f"hardware.{missing[0]}", "missing (give a preset or every datasheet field)")
    _check_positive_numbers("hardware", value)
    return _check_link(HardwareSpec(**{"name": "custom", **value}))


def _check_link(spec: HardwareSpec) -> HardwareSpec:
    from sim.scenario.presets.hardware import PCIE_X16_GB_S
    if spec.link_gb_s is None and spec.pcie_gen not in PCIE_X16_GB_S:
        raise InputError("hardware.pcie_gen", f"{spec.pcie_gen} is not one of {sorted(PCIE_X16_GB_S)} "
                                                 f"(or give link_gb_s)")
    return spec


def resolve_engine(value: str | dict) -> EngineSpec:
    if not isinstance(value, (str, dict)):
        raise InputError("engine", f"must be a preset name or a mapping (got {value!r})")
    if isinstance(value, dict) and not isinstance(value.get("preset", "vllm"), str):
        raise InputError("engine.preset", f"must be a preset name (got {value['preset']!r})")
    if isinstance(value, str):
        if value not in ENGINES:
            raise InputError("engine", f"unknown preset {value!r} (known: {', '.join(ENGINES)})")
        return ENGINES[value]
    known = set(EngineSpec.field_names())
    unknown = set(value) - known - {"preset"}
    if unknown:
        raise InputError(f"engine.{sorted(unknown)[0]}", "unknown field")
    base = resolve_engine(value.get("preset", "vllm"))
    overrides = {k: v for k, v in value.items() if k != "preset"}
    for key, number in overrides.items():
        if key != "name" and (not _is_finite_number(number) or number < 0):
            raise InputError(f"engine.{key}", f"must be a non-negative number (got {number!r})")
    for key in ("mem_efficiency", "compute_efficiency", "link_efficiency"):
        if key in overrides and not 0 < overrides[key] <= 1:
            raise InputError(f"engine.{key}", f"must be in (0, 1] (got {overrides[key]})")
    if overrides.get("int4_mem_efficiency", 0) > 1:
        raise InputError("engine.int4_mem_efficiency", f"must be in [0, 1] (got {overrides['int4_mem_efficiency']})")
    return EngineSpec(**{**base.__dict__, **overrides, "name": value.get("name", f"{base.name}+custom")})


def resolve_model(value: str, field: str) -> ModelSpec:
    if value in MODELS:
        return MODELS[value]
    path = Path(value)
    if path.suffix == ".json" or path.exists():
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise InputError(field, f"no such config.json: {path}")
        try:
            return load_hf_config(path)
        except ValueError as exc:
            raise InputError(field, str(exc)) from None
    raise InputError(field, f"unknown preset {value!r} and not a config.json path "
                               f"(known: {', '.join(MODELS)})")


# Hardware fields that may be null (gemm_corner: the plain roofline) or 0 (fp8_tflops: no FP8
# tensor cores) besides a positive number.
NULLABLE = {"gemm_corner"}
ZERO_OK = {"fp8_tflops"}


def _check_positive_numbers(prefix: str, mapping: dict) -> None:
    for key, number in mapping.items():
        if key in ("name", "interconnect") or (number is None and key in NULLABLE) or (key in ZERO_OK and _is_finite_number(number) and number == 0):
            continue
        if not _is_finite_number(number) or number <= 0:
            raise InputError(f"{prefix}.{key}", f"must be a positive number (got {number!r})")


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_scenario(source: "Scenario | dict | str | Path") -> Scenario:
    """Validate a scenario from a YAML path, a mapping or a Scenario; InputError on bad input."""
    if isinstance(source, Scenario):
        scenario = source
    else:
        if isinstance(source, (str, Path)):
            mapping = resolve_relative_paths(read_mapping(source), Path(source).parent)
        else:
            mapping = source
        try:
            scenario = Scenario.model_validate(mapping)
        except ValidationError as exc:
            raise _one_line(exc) from None
    _check_semantics(scenario)
    return scenario


def resolve_relative_paths(mapping: dict, base: Path) -> dict:
    """Files a scenario names (traces, config.json) are relative to the scenario's own folder when
    they exist there; otherwise they are left as given (relative to the working directory)."""
    def fix(node: dict, key: str, only_paths: bool = False) -> None:
        value = node.get(key) if isinstance(node, dict) else None
        if not isinstance(value, str) or Path(value).is_absolute():
            return
        if only_paths and value in MODELS:
            return
        candidate = base / value
        if candidate.exists():
            node[key] = str(candidate)

    mapping = dict(mapping)
    fix(mapping, "model", only_paths=True)
    fix(mapping, "calibration")
    for section, keys in (("workload", ("trace",)), ("speculation", ())):
        if isinstance(mapping.get(section), dict):
            mapping[section] = dict(mapping[section])
            for key in keys:
                fix(mapping[section], key)
    spec = mapping.get("speculation")
    if isinstance(spec, dict):
        for sub, key, only in (("acceptance", "trace", False), ("draft", "model", True)):
            if isinstance(spec.get(sub), dict):
                spec[sub] = dict(spec[sub])
                fix(spec[sub], key, only)
    return mapping


def read_mapping(path: str | Path) -> dict:
    """The scenario file's mapping, unvalidated; InputError when it cannot be read as one."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError("scenario", f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError("scenario", f"{path} is not valid YAML{where}") from None
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise InputError("scenario", f"{path} must hold a mapping of fields")
    return mapping


def _one_line(exc: ValidationError) -> InputError:
    """The first pydantic error as `dotted.field: reason`."""
    error = exc.errors()[0]
    # Union members add their type names to the location; keep only the scenario's own keys.
    loc = [str(part) for part in error["loc"]
           if not (isinstance(part, str) and ("[" in part or part in _TYPE_TAGS))]
    field = ".".join(loc) or "scenario"
    if error["type"] == "extra_forbidden":
        return InputError(field, "unknown field")
    message = error["msg"].removeprefix("Value error, ")
    message = message[0].lower() + message[1:]
    if error["type"] not in ("value_error", "missing") and "input" in error:
        message += f" (got {error['input']!r})"
    return InputError(field, message)


_TYPE_TAGS = {"int", "float", "str", "bool", "list", "dict", "LengthDist", "function-after", "constrained-int",
              "constrained-float", "literal", "is-instance"}


def _check_semantics(scenario: Scenario) -> None:
    """Cross-field checks that need resolved presets; each raises InputError on its field."""
    model = scenario.model_spec
    scenario.hardware_spec, scenario.engine_spec, scenario.draft_spec  # resolve now, fail early
    tp = scenario.tensor_parallel
    if scenario.expert_parallel and model.experts is None:
        raise InputError("expert_parallel", f"{model.name} has no experts")
    if scenario.expert_parallel and model.experts.routed % tp:
        raise InputError("expert_parallel", f"tensor_parallel {tp} does not divide {model.name}'s "
                                            f"{model.experts.routed} routed experts")
    for shaped in filter(None, (model, scenario.draft_spec)):
        if shaped.heads % tp or (shaped.kv_heads % tp and tp % shaped.kv_heads):
            raise InputError("tensor_parallel", f"{tp} does not divide {shaped.name}'s {shaped.heads} heads "
                                                   f"and {shaped.kv_heads} KV heads")
    draft = scenario.draft_spec
    # Families pad their embeddings differently (Qwen2.5: 151936 vs 152064), so allow a little slack.
    if draft is not None and abs(draft.vocab - model.vocab) > 0.01 * model.vocab:
        raise InputError("speculation.draft.model",
                            f"{draft.name}'s vocabulary ({draft.vocab}) is not {model.name}'s ({model.vocab}); "
                            f"a draft model must share the target's tokenizer")
    spec = scenario.speculation
    if spec.method == "layerskip" and spec.draft.exit_layer >= model.layers:
        raise InputError("speculation.draft.exit_layer",
                            f"{spec.draft.exit_layer} must be below {model.name}'s {model.layers} layers")
    if scenario.calibration is not None:
        from sim.formats.bundle import check_bundle, load_bundle

        check_bundle(load_bundle(scenario.calibration), scenario)     # unreadable, other model or dtype: fail now
        if tp != 1:
            raise InputError("calibration", "a bundle times one device; tensor_parallel must be 1 with calibration")
    pv = spec.partial_verify
    if pv is not None and pv.budget % pv.block:
        raise InputError("speculation.partial_verify.budget",
                            f"{pv.budget} is not a multiple of block {pv.block}")
    if pv is not None and pv.static_tokens >= model.max_context:
        raise InputError("speculation.partial_verify.budget",
                            f"sink + budget + window {spec.partial_verify.static_tokens} is not below "
                            f"{model.name}'s maximum context {model.max_context}")
    if scenario.workload.trace is not None and not scenario.workload.trace.exists():
        raise InputError("workload.trace", f"no such file: {scenario.workload.trace}")
    if spec.policy.route is not None:
        known = scenario.workload.categories
        if known is None and scenario.workload.trace is None:
            raise InputError("speculation.policy.route", "needs request categories: workload.categories, "
                                                         "or a workload.trace with a category column")
        unknown = sorted(set(spec.policy.route) - set(known or spec.policy.route))
        if unknown:
            raise InputError("speculation.policy.route", f"category {unknown[0]!r} is not among workload.categories "
                                                         f"({', '.join(known)})")
    if spec.acceptance is not None and spec.acceptance.trace is not None and not spec.acceptance.trace.exists():
        raise InputError("speculation.acceptance.trace", f"no such file: {spec.acceptance.trace}")
    a = spec.acceptance
    if a is not None and a.request_spread and (a.rate is not None or a.per_position is not None):
        mean = a.rate if a.rate is not None else sum(a.per_position[:spec.draft_depth]) / spec.draft_depth
        if a.request_spread ** 2 >= mean * (1 - mean):
            raise InputError("speculation.acceptance.request_spread",
                                f"{a.request_spread} is too wide for a Beta with mean {mean:g} "
                                f"(needs spread^2 < mean (1 - mean))")
