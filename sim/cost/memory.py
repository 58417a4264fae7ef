"""Device memory: which weights stay resident, what streams from the host, how much KV fits.

The plan is made per configuration, so the no-speculation baseline (no draft weights, no draft KV)
may keep more target layers resident than the speculative run on the same card (SubSpec's setting).
Budget = device memory x scheduler.kv_memory_fraction (vLLM's gpu_memory_utilization), per GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sim.cost.stack import Stacks
from sim.errors import InputError
from sim.scenario.schema import Scenario

GB = 1e9


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: float
    fixed_bytes: float             # embeddings, LM head, draft weights, activation workspace
    resident_layers: int
    offloaded_layers: int
    layer_bytes: float             # one target decoder layer, this GPU's shard
    kv_bytes_per_token: float      # target + draft KV of one token, this GPU's shard
    partial_cache_tokens: int      # SpecPV: extra tokens of partial cache held per request
    kv_capacity_tokens: int        # KV tokens the scheduler may hold (device, or host with kv offload)
    max_running: int | None = None  # with KV on the host, the SpecPV partial caches that fit the device
    draft_window_kv_bytes: float = 0.0  # a windowed draft's KV (window x its bytes per running request)

    @property
    def weight_bytes_resident(self) -> float:
        return self.fixed_bytes + self.resident_layers * self.layer_bytes


def kv_bytes_per_token(shape, tp: int, kv_bytes: float) -> float:
    """K and V of one token over a model's (or draft stack's) layers, on one GPU of `tp`; a KV head
    is replicated, not split, when TP exceeds the KV head count. With multi-head latent attention
    a token caches one latent (kv_rank + rope_dim values) per layer, replicated on every rank."""
    latent = getattr(shape, "latent", None)
    if latent is not None:
        return shape.layers * (latent.kv_rank + latent.rope_dim) * kv_bytes
    return 2 * shape.layers * max(shape.kv_heads / tp, 1) * shape.head_dim * kv_bytes


def plan_memory(scenario: Scenario, stacks: Stacks, max_request_tokens: int, concurrency_hint: int) -> MemoryPlan:
    """Place the weights and size the KV cache for one configuration of a scenario.

    max_request_tokens: the longest request's prompt + output (+ one verification's tokens).
    concurrency_hint: how many requests run at once in this workload; when the weights must be
    offloaded, `offload.weights: auto` keeps resident as many layers as fit beside that many of the
    longest requests' KV.
    """
    model = scenario.model_spec
    tp = scenario.tensor_parallel
    ab = scenario.dtype_bytes
    spec = scenario.speculation
    budget = scenario.hardware_spec.memory_gb * GB * scenario.scheduler.kv_memory_fraction

    layer_bytes = stacks.target.layer_weight_bytes() / tp
    embeddings = model.embedding_params * ab / tp
    draft_weights = stacks.draft_weights_resident_bytes / tp
    running = min(concurrency_hint, scenario.scheduler.max_batch)
    ranks = scenario.data_parallel
    if ranks > 1 or scenario.redundant_experts:
        # Attention data parallel: each rank holds the attention, dense and shared weights (split by
        # its tensor-parallel group) and its own requests' KV; the routed experts are spread over
        # every GPU. The plan is one GPU's; the scheduler's KV capacity is every rank's.
        gpus = scenario.gpus
        experts = stacks.target.layer_expert_bytes()
        moe = scenario.model_spec.experts
        if scenario.redundant_experts and moe is not None:      # the redundant copies' weights too
            experts *= (moe.routed + scenario.redundant_experts) / moe.routed
        layer_bytes = (stacks.target.layer_weight_bytes() - experts) / tp + experts / gpus
        draft_weights = ((stacks.draft_weights_resident_bytes - stacks.draft_expert_bytes) / tp
                         + stacks.draft_expert_bytes / gpus)
        concurrency_hint = math.ceil(concurrency_hint / ranks)
        running = math.ceil(running / ranks)
    workspace = _workspace_bytes(scenario, running)
    fixed = embeddings + draft_weights + workspace

    kv_per_token = kv_bytes_per_token(model, tp, scenario.kv_bytes)
    window_bytes = 0.0
    if stacks.draft_owns_kv:
        draft = stacks.draft
        assert draft is not None        # a draft that owns KV (build_stacks)
        draft_kv = kv_bytes_per_token(draft, tp, scenario.kv_bytes)
        if draft.kv_window is None:
            kv_per_token += draft_kv
        else:
            # A draft with a StreamingLLM cache holds at most its window per running request:
            # reserved up front for the requests the workload runs at once.
            window_bytes = running * draft.kv_window * draft_kv
    partial_tokens = 0
    if spec.partial_verify is not None:
        pv = spec.partial_verify
        buffer = pv.period + spec.max_tokens_per_step if pv.period_unit == "tokens" \
            else pv.period * spec.max_tokens_per_step
        partial_tokens = pv.static_tokens + buffer + spec.verify_tokens
    one_request_bytes = (max_request_tokens + partial_tokens) * kv_per_token

    offloaded = _offloaded_layers(scenario, budget, fixed + window_bytes, layer_bytes, concurrency_hint * one_request_bytes,
                                  one_request_bytes, model.layers)
    resident = model.layers - offloaded
    free_device = budget - fixed - window_bytes - resident * layer_bytes
    host_weights = offloaded * layer_bytes * tp      # every rank's shard of the offloaded layers
    host_memory = scenario.hardware_spec.host_memory_gb * GB
    if host_weights > host_memory:
        raise InputError("hardware.host_memory_gb",
                            f"{scenario.hardware_spec.host_memory_gb:g} GB cannot hold the {offloaded} offloaded "
                            f"layers ({host_weights / GB:.1f} GB)")
    max_running = None
    if scenario.offload.kv:
        kv_capacity = (host_memory - host_weights) / tp / kv_per_token   # host shared by the ranks
        device_needed = partial_tokens * kv_per_token
        if partial_tokens:
            max_running = max(1, math.floor(free_device / device_needed))
    else:
        kv_capacity = free_device / kv_per_token
        device_needed = one_request_bytes
    if free_device < device_needed or kv_capacity < max_request_tokens + partial_tokens:
        raise InputError(
            "hardware.memory_gb",
            f"{scenario.hardware_spec.memory_gb:g} GB x {scenario.scheduler.kv_memory_fraction:g} cannot hold "
            f"{fixed / GB:.2f} GB of embeddings, draft and workspace"
            f"{f', {window_bytes / GB:.2f} GB of draft KV windows' if window_bytes else ''} plus {resident} resident layers "
            f"plus one request's KV ({one_request_bytes / GB:.2f} GB)")
    return MemoryPlan(budget, fixed, resident, offloaded, layer_bytes, kv_per_token, partial_tokens,
                      int(kv_capacity) * ranks,
                      max_running * ranks if max_running else None, window_bytes)


def draft_offloaded_layers(scenario: Scenario, memory: MemoryPlan) -> int:
    """Offloaded target layers a self-draft reads. The first `resident_layers` layers stay on the
    device, so LayerSkip's early exit streams only the offloaded ones among its first layers; a
    streaming self-draft runs every layer; other drafters have weights of their own."""
    method = scenario.speculation.method
    if method == "streaming":
        return memory.offloaded_layers
    if method == "layerskip":
        exit_layer = scenario.speculation.draft.exit_layer
        assert exit_layer is not None   # layerskip needs it (sim/scenario/speculation.py checks)
        return max(0, exit_layer - memory.resident_layers)
    return 0


def _offloaded_layers(scenario: Scenario, budget: float, fixed: float, layer_bytes: float,
                      kv_reserve: float, one_request_kv: float, layers: int) -> int:
    """Target layers whose weights live on the host.

    Offloaded layers are the last ones (a forward streams them after computing the resident first).
    auto: none while all weights fit beside one request's KV (the scheduler then runs as large a
    batch as the remaining KV allows, as vLLM does); otherwise keep resident as many layers as fit
    beside the KV of the workload's concurrency (SubSpec's consumer-GPU setting).
    """
    weights = scenario.offload.weights
    if isinstance(weights, dict):
        if weights["layers"] > layers:
            raise InputError("offload.weights.layers", f"{weights['layers']} exceeds the model's {layers} layers")
        return weights["layers"]
    if isinstance(weights, float | int) and not isinstance(weights, bool):
        return round(weights * layers)
    kv_on_device = 0.0 if scenario.offload.kv else one_request_kv
    if fixed + layers * layer_bytes + kv_on_device <= budget:
        return 0
    kv_on_device = 0.0 if scenario.offload.kv else max(kv_reserve, one_request_kv)
    fit = math.floor(max(0.0, budget - fixed - kv_on_device) / layer_bytes)
    return layers - min(layers, fit)


def _workspace_bytes(scenario: Scenario, batch: int) -> float:
    """Activations of the largest forward of `batch` requests: hidden states, MLP intermediates and
    fp32 logits of every verified token."""
    model = scenario.model_spec
    spec = scenario.speculation
    tokens = scenario.scheduler.prefill_chunk + batch * spec.verify_tokens
    per_token = (4 * model.hidden + 2 * model.ffn + (model.heads + 2 * model.kv_heads) * model.head_dim)
    logits_tokens = batch * spec.verify_tokens
    return (tokens * per_token * scenario.dtype_bytes + logits_tokens * model.vocab * 4) / scenario.tensor_parallel
