"""Engine presets: how much of the hardware an inference engine achieves, and its host overheads.

These are the only knobs of the roofline model that are not datasheet facts. They are set once per
engine from public measurements of that engine, never tuned to a scenario, and a calibration bundle
(`calibration:`) replaces them with measured times.

- mem_efficiency: fraction of datasheet memory bandwidth that weight and KV streaming achieves
  (well-tuned decode GEMV / paged attention kernels reach 70-90% on H100/A100).
- compute_efficiency: fraction of dense tensor-core peak that large GEMMs and prefill attention reach.
- step_overhead_s: host time per engine iteration outside the forwards (scheduling, sampling,
  detokenization, input preparation) that the GPU does not overlap.
- request_overhead_s: host time per running request per iteration (block tables, sampling metadata).
- forward_overhead_s: fixed cost of launching one model forward (a CUDA-graph replay, or the Python
  call chain of an eager model).
- layer_overhead_s: per decoder layer per forward: kernel launch gaps that CUDA graphs remove and an
  eager engine pays (about a dozen kernels a layer).
- ngram_lookup_s: host time of one prompt-lookup draft for one request.
- link_efficiency: fraction of the theoretical host link a pinned host-to-device copy reaches.
- speculation_step_overhead_s: host time a speculative step adds to an iteration (proposal
  bookkeeping, rejection sampling, tree masks and positions, accepted-token bookkeeping).
- speculation_request_overhead_s: the same per request in the batch (per-request proposal,
  acceptance and KV bookkeeping that grows with the batch).
- draft_forward_overhead_s: host time per draft forward besides its launch (top-k, tree expansion,
  sampling the proposals) in an engine that drafts step by step.
- int4_mem_efficiency: the fraction of memory bandwidth weight-only int4 GEMMs reach, where the
  engine's int4 kernel falls short of its 16-bit one (0: mem_efficiency).
- graph_max_tokens: the largest forward (query tokens) the engine replays as a CUDA graph; larger
  forwards run eagerly and pay eager_layer_overhead_s per decoder layer (0: no cap).
- collectives: the library of its tensor-parallel all-reduce, which picks the published table
  that prices it (sim/cost/collectives.py): nccl (torch.distributed: gpt-fast, transformers),
  vllm-custom, sglang-custom and trtllm-custom (the engines' own one- and two-shot kernels for
  small messages within a node), or custom (llama.cpp's peer copies).
- all_to_all: a published all-to-all table (calibration/published/NAME, ops dispatch and combine)
  that prices a mixture of experts' token exchange under expert parallelism; "" for the
  roofline's guess (sim/cost/collectives.py).
- host_profile: a published host table (calibration/published/NAME, `table: host`) that times the
  engine's iterations by batch and tensor-parallel size; where set, it prices each step's host work
  instead of step_overhead_s and request_overhead_s (sim/cost/host.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

# The libraries an engine's tensor-parallel all-reduce may use (EngineSpec.collectives).
COLLECTIVES_LIBRARIES = ("nccl", "rccl", "vllm-custom", "sglang-custom", "trtllm-custom", "custom")
# The libraries of a mixture of experts' all-to-all under expert parallelism (EngineSpec.all_to_all
# names one of their published tables).
ALL_TO_ALL_LIBRARIES = ("deepep",)


@dataclass(frozen=True)
class EngineSpec:
    name: str
    mem_efficiency: float
    compute_efficiency: float
    step_overhead_s: float
    request_overhead_s: float
    forward_overhead_s: float
    layer_overhead_s: float
    ngram_lookup_s: float
    link_efficiency: float = 0.8
    speculation_step_overhead_s: float = 0.0
    speculation_request_overhead_s: float = 0.0
    draft_forward_overhead_s: float = 0.0
    int4_mem_efficiency: float = 0.0
    graph_max_tokens: int = 0
    eager_layer_overhead_s: float = 0.0
    collectives: str = "nccl"
    all_to_all: str = ""
    host_profile: str = ""
    # The engine's version whose measured operator tables price it (sim/cost/measured_tables.py);
    # empty: the newest complete collection the tables hold.
    version: str = ""
    # Two-batch overlap (SGLang's --enable-two-batch-overlap): with attention data parallel, each
    # rank's batch runs as two micro-batches, one's all-to-all hidden behind the other's compute.
    two_batch_overlap: bool = False

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


ENGINES: dict[str, EngineSpec] = {
    # vLLM V1 with CUDA graphs: decode kernels at about 80% of HBM bandwidth. Host work and drafting's
    # floor from Liu et al.'s measurement study (arXiv 2601.11580; its simulator's constants fitted on
    # vLLM 0.10.1, Llama-3.1-8B, one H100, batch 1-64, SpecDecode-Bench/simulator predictor.py
    # Llama8BH100): 1.207 ms of host work a step (overhead_constant_per_step), and EAGLE-3's drafting at
    # k = 3 2.135 ms a step whatever the batch (draft_c_fixed), of which the roofline prices 0.97 ms
    # (three forwards of the head at batch 1): (2.135 - 0.97) / 3 = 0.39 ms a draft forward more
    # (launches, sampling, the proposer's bookkeeping). Checked against the study's Figure 4 shares
    # in docs/validation-published.md.
    "vllm": EngineSpec("vllm", mem_efficiency=0.80, compute_efficiency=0.65, step_overhead_s=1.207e-3,
                       request_overhead_s=6e-6, forward_overhead_s=30e-6, layer_overhead_s=0.0,
                       ngram_lookup_s=15e-6, collectives="vllm-custom", draft_forward_overhead_s=0.39e-3),
    # vLLM's engine before V1 (0.2-0.5: a synchronous scheduler, workers as Ray actors), whose host
    # work per iteration Vidur timed in Sarathi-Serve, the vLLM fork it profiled with, on an A100
    # host (calibration/published/vidur-a100-host): 1.4 ms a step at batch 8 to 7.2 ms at 128 on
    # one GPU (its Ray round trip 0.2-1 ms of that), 8.1-13.4 ms on 2-4 (the round trip about 6 ms).
    # Kernels and drafting as vLLM's.
    "vllm-v0": EngineSpec("vllm-v0", mem_efficiency=0.80, compute_efficiency=0.65, step_overhead_s=1.207e-3,
                          request_overhead_s=6e-6, forward_overhead_s=30e-6, layer_overhead_s=0.0,
                          ngram_lookup_s=15e-6, collectives="vllm-custom", draft_forward_overhead_s=0.39e-3,
                          host_profile="vidur-a100-host"),
    # SGLang with CUDA graphs and an overlapped scheduler: slightly less host time per step.
    # speculation_request_overhead_s and speculation_step_overhead_s set on the published
    # catalogue's fit half (EAGLE-3's SGLang table, batch 2-64 on an H100, its kernels priced from
    # the measured operator tables) by `python -m sim validate --published --fit` (2026-12-06).
    "sglang": EngineSpec("sglang", mem_efficiency=0.82, compute_efficiency=0.65, step_overhead_s=200e-6,
                         request_overhead_s=4e-6, forward_overhead_s=30e-6, layer_overhead_s=0.0,
                         ngram_lookup_s=15e-6, speculation_request_overhead_s=80e-6, speculation_step_overhead_s=0.5e-3,
                         collectives="sglang-custom"),
    # TensorRT-LLM with in-flight batching and CUDA graphs: no public per-step host figure was found,
    # so its host terms are SGLang's.
    "tensorrt-llm": EngineSpec("tensorrt-llm", mem_efficiency=0.82, compute_efficiency=0.65, step_overhead_s=200e-6,
                               request_overhead_s=4e-6, forward_overhead_s=30e-6, layer_overhead_s=0.0,
                               ngram_lookup_s=15e-6, collectives="trtllm-custom"),
    # gpt-fast: torch.compile'd single-request loop; its README measures Llama-2-7B on an A100 at
    # 1,397 GB/s in bf16 (~70% of 2,039) and 863 GB/s with int4 weights in groups of 32 (torch's
    # tinygemm kernel; 0.625 bytes a weight with its bf16 scale and zero). In the bytes `int4`
    # prices (0.52 a weight, groups of 128) that is 863 x 0.52 / 0.625 / 2,039 = 0.35.
    "gpt-fast": EngineSpec("gpt-fast", mem_efficiency=0.70, compute_efficiency=0.60, step_overhead_s=40e-6,
                           request_overhead_s=0.0, forward_overhead_s=20e-6, layer_overhead_s=0.0,
                           ngram_lookup_s=20e-6, int4_mem_efficiency=0.35),
    # llama.cpp's llama-server: quantized GGUF kernels, CUDA graphs for small decode batches, a C++
    # server loop (slots, sampling, n-gram lookup) between forwards. Rough figures: no published
    # llama.cpp measurement is in the catalogue yet, so without a calibration bundle (`profiler
    # calibrate --engine llama.cpp`, which replaces every one of them) its absolute times are unvalidated.
    "llama.cpp": EngineSpec("llama.cpp", mem_efficiency=0.65, compute_efficiency=0.50, step_overhead_s=500e-6,
                            request_overhead_s=10e-6, forward_overhead_s=50e-6, layer_overhead_s=0.0,
                            ngram_lookup_s=10e-6, int4_mem_efficiency=0.60, collectives="custom"),
    # Hugging Face transformers in eager mode: every kernel launched from Python, so each decoder layer
    # costs a few hundred microseconds of launch time at small batch; generate() adds per-step work.
    # `sim validate --published --fit` searches layer_overhead_s and both efficiencies on the fit half
    # and keeps these values.
    "hf-eager": EngineSpec("hf-eager", mem_efficiency=0.60, compute_efficiency=0.65, step_overhead_s=1.5e-3,
                           request_overhead_s=20e-6, forward_overhead_s=300e-6, layer_overhead_s=100e-6,
                           ngram_lookup_s=50e-6, link_efficiency=0.75,
                       # Set on the published catalogue's fit half (Spec-Bench at batch 1 on an A100 and an
                       # RTX 3090) by `sim validate --published --fit`: the Python tree, candidate and
                       # acceptance code of the papers' loops.
                       speculation_step_overhead_s=1e-3, draft_forward_overhead_s=1e-3),
}
