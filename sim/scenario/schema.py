"""The scenario: one deployment question, validated.

A scenario is a YAML mapping (docs/scenario.md documents every field); its speculation section is
in speculation.py. `load_scenario` (load.py) turns a path, a mapping or a Scenario into a validated
Scenario, or raises InputError with one line naming the field and the reason. Presets are resolved
here (presets/resolve.py), once, into plain specs (`Scenario.hardware_spec`,
`.model_spec`, `.engine_spec`, `.draft_spec`), so nothing downstream looks a name up again.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from sim.scenario.disaggregation import Disaggregation
from sim.scenario.presets import EngineSpec, HardwareSpec, ModelSpec
from sim.scenario.presets.resolve import resolve_engine, resolve_hardware, resolve_model
from sim.scenario.speculation import Speculation
from sim.scenario.strict import Strict

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
# Weight-only int4 (AWQ / GPTQ): 4 bits plus a 16-bit scale and a 4-bit zero per group of 128.
INT4_WEIGHT_BYTES = 0.5 + (2 + 0.5) / 128
# The dtype activations, norms and attention run in, per weight dtype: fp8 checkpoints (W8A8)
# quantize GEMM inputs on the fly and keep everything else in bf16; int4 ones run fp16 GEMMs on
# dequantized tiles (Marlin, AWQ kernels).
ACTIVATION_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8": "bf16", "int4": "fp16"}


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
    # GPUs that split one attention rank's heads and every dense linear (a rank's tensor-parallel group).
    tensor_parallel: PositiveInt = 1
    # Attention data-parallel ranks (SGLang's --dp with --enable-dp-attention, vLLM's
    # --data-parallel-size): each holds its own requests and their KV and runs its own attention;
    # the MoE layers see every rank's tokens, in lockstep. GPUs = tensor_parallel x data_parallel.
    data_parallel: PositiveInt = 1
    # Mixtures of experts: false splits every expert across all the GPUs; true places whole experts,
    # routed / GPUs on each (attention stays tensor parallel within a rank).
    expert_parallel: bool = False
    # Expert parallelism's redundant copies of the most used experts (SGLang's
    # --ep-num-redundant-experts with EPLB): routed + redundant experts are placed, evenly over the GPUs.
    redundant_experts: NonNegativeInt = 0
    engine: Union[str, dict[str, Any]] = "vllm"
    calibration: Path | None = None
    # What prices the GPU's kernels without a calibration: auto takes the measured operator tables
    # (aiconfigurator-core) where they cover the GPU and engine and the roofline elsewhere;
    # measured or roofline forces one (sim/cost/model.py).
    cost: Literal["auto", "measured", "roofline"] = "auto"
    # A user's own measured tables (`profiler calibrate`'s BUNDLE/operator_tables, or the bundle),
    # laid over the package's for the GPU they were timed on (sim/cost/measured_model.py).
    operator_tables: Path | None = None
    # Prefill on a pool of its own, the KV cache sent to this scenario's layout, the decode pool
    # (sim/scenario/disaggregation.py); null: one pool does both.
    disaggregation: Disaggregation | None = None
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
    def gpus(self) -> int:
        """GPUs the deployment runs on: each attention rank's tensor-parallel group, times the ranks."""
        return self.tensor_parallel * self.data_parallel

    @property
    def deployment_gpus(self) -> int:
        """Every GPU the deployment holds: the decode pool's (or the one pool's) and the prefill pool's."""
        return self.gpus + (self.disaggregation.prefill_gpus if self.disaggregation is not None else 0)

    @property
    def layout(self) -> str:
        """The parallel layout in a few characters: TP8; DP8 x TP1 attention with EP8 (or MoE TP8);
        with disaggregation, the prefill pool's and the decode pool's."""
        layout = layout_name(self.tensor_parallel, self.data_parallel, self.expert_parallel)
        if self.disaggregation is None:
            return layout
        prefill = self.disaggregation.prefill
        if prefill == "unlimited":
            return f"decode {layout}, prefill unlimited"
        server = layout_name(prefill.tensor_parallel, prefill.data_parallel, prefill.expert_parallel)
        return f"prefill {prefill.instances} x {server}, decode {layout}"

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


def layout_name(tensor_parallel: int, data_parallel: int, expert_parallel: bool) -> str:
    """TP8; DP8 x TP1 attention with EP8 (or MoE TP8)."""
    if data_parallel == 1:
        return f"TP{tensor_parallel}"
    gpus = tensor_parallel * data_parallel
    experts = f"EP{gpus}" if expert_parallel else f"MoE TP{gpus}"
    return f"DP{data_parallel} x TP{tensor_parallel} attention, {experts}"
