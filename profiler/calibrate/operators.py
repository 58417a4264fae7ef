"""The operators of one engine iteration, each built at one grid point as a callable to time.

Every operator is the live engine's own code at that shape (profiler.engine.model's modules and functions,
kernels.* on CUDA), on random data (never zeros: a zero matrix can take faster paths), so a bundle
prices what `profiler live` runs. An operator's dims name its grid axes; `work` gives the FLOPs and
bytes it must move at a point, for `profiler inspect`'s achieved rates.

Operators (per decoder layer unless noted; tokens = query tokens of the whole batch):
  linear.{qkv,o,gate_up,down}   nn.Linear of the layer's shapes                 (tokens)
  int8.*, int4.*                the shadow draft's weight-only quantized linears (tokens)
  elementwise                   two RMSNorms, RoPE on Q and K, the KV-cache write, SiLU x up,
                                residual adds: everything of a layer but linears and attention (tokens)
  attention                     decode / chain / tree verification attention (batch, query, kv)
  attention_prefill             one request's chunk of query > 64 tokens at the end of kv, masked (a
                                prompt chunk after a cached prefix; the engine's prefill never runs one) (query, kv)
  attention_prompt              one whole prompt's causal attention over itself, no mask: the engine's
                                prefill (query)
  attention_partial             SpecPV partial verification: attention over kv selected positions of a
                                cache twice as long, gathered on the CPU, by index in the kernel (batch, query, kv)
  lm_head                       final norm + LM head + fp32 logits, once per forward (tokens)
  forward_base                  a forward's shared inputs: embedding, causal mask, rotations,
                                cache index, once per forward (batch, query, kv)
  summaries                     SpecPV block key max/min at a refresh (batch, context)
  selection                     SpecPV Quest scores, top-k, partial index of a 5-token step (batch, context, budget)
  ngram                         prompt lookup over one request's history, host (context)
  accept                        greedy acceptance of a batch's chains from logits (batch, tokens)
  h2d_pinned, h2d_pageable      host-to-device copy, CUDA only (bytes)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from profiler.engine.model import Attention, LlamaConfig, RMSNorm, apply_rope, causal_mask, fp32_logits, rope_table

# The SpecPV settings selection is timed with; the sim's defaults (sim.scenario.schema PartialVerify).
PARTIAL_SINK, PARTIAL_WINDOW, PARTIAL_BLOCK, SELECTION_QUERY = 32, 128, 16, 5


@dataclass
class Bench:
    """What every builder needs: the model's shape, dtype, device and a seeded generator.

    Tensors are copies of slices of one shared pool of random values, so building many copies of
    an operator (to overflow the CPU caches, profiler.calibrate.run.build_cold) costs a memory copy,
    not random generation. Each is an allocation of its own, as the model's weights are: views
    into one huge pool time faster than the model runs (one mapping, adjacent copies)."""
    config: LlamaConfig
    dtype: torch.dtype
    device: str
    generator: torch.Generator
    pool: torch.Tensor | None = None
    offset: int = 0
    # What a builder made once for this bench and hands out copies of (build_cold calls a builder
    # up to 64 times on one bench).
    built: dict = field(default_factory=dict)

    def randn(self, *shape: int) -> torch.Tensor:
        numel = 1
        for n in shape:
            numel *= n
        if self.pool is None and self.device != "cpu":
            # Drawn on the device from a generator seeded by this bench's: an 8B's LM head drawn on
            # the host and copied over took seconds a point (2.5 points a second on an H200).
            seed = int(torch.randint(2 ** 62, (1,), generator=self.generator))
            device_generator = torch.Generator(device=self.device).manual_seed(seed)
            return torch.randn(*shape, generator=device_generator, device=self.device, dtype=self.dtype)
        if self.pool is None or numel > self.pool.numel() // 2:
            return torch.randn(*shape, generator=self.generator).to(self.device, self.dtype)
        self.offset -= self.offset % 64
        if self.offset + numel > self.pool.numel():
            self.offset = 0
        view = self.pool[self.offset:self.offset + numel].view(*shape).clone()
        self.offset += -(-numel // 64) * 64        # 256-byte aligned (fp32), as an allocator's
        return view

    def linear(self, n_in: int, n_out: int) -> nn.Linear:
        layer = nn.Linear(n_in, n_out, bias=False, device="meta")
        layer.weight = nn.Parameter(self.randn(n_out, n_in), requires_grad=False)
        return layer


def random_pool(numel: int, dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    """A flat tensor of standard normal values (never zeros: a zero operand can take fast paths)."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


@dataclass(frozen=True)
class Operator:
    name: str
    dims: tuple[str, ...]
    build: Callable[[Bench, dict], Callable[[], object]]
    work: Callable[[LlamaConfig, int, dict], tuple[float, float]]   # (FLOPs, bytes) at a point
    cuda_only: bool = False
    # Work on the host alone (prompt lookup): timed by the host's clock on every device. CUDA events
    # time the GPU's stream, which such an operator leaves idle: do_bench's events recorded around it
    # read about zero whenever the GPU is still flushing the L2 when the host's work ends.
    host: bool = False


def linear_shapes(config: LlamaConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of a decoder layer's linears, named as the simulator's Stack.linears."""
    c = config
    return {"qkv": (c.hidden, (c.heads + 2 * c.kv_heads) * c.head_dim), "o": (c.heads * c.head_dim, c.hidden),
            "gate_up": (c.hidden, 2 * c.ffn), "down": (c.ffn, c.hidden)}


def _linear_op(name: str) -> Operator:
    def build(bench: Bench, p: dict):
        n_in, n_out = linear_shapes(bench.config)[name]
        layer, x = bench.linear(n_in, n_out), bench.randn(1, p["tokens"], n_in)
        return lambda: layer(x)

    def work(config, eb, p):
        n_in, n_out = linear_shapes(config)[name]
        return 2.0 * p["tokens"] * n_in * n_out, eb * (n_in * n_out + p["tokens"] * (n_in + n_out))
    return Operator(f"linear.{name}", ("tokens",), build, work)


def _quant_op(name: str, bits: int, group_size: int = 64) -> Operator:
    def build(bench: Bench, p: dict):
        from profiler.engine.shadow import QuantLinear

        n_in, n_out = linear_shapes(bench.config)[name]
        # Quantizing is most of a build's time (21 s of a 237 s calibration round here, under
        # cProfile, when each of build_cold's copies quantized its own weights): the copies of one
        # point are clones of the first, each its own allocation, which is what the copies are for.
        key = (bits, name)
        if key in bench.built:
            layer = bench.built[key].clone()
        else:
            layer = bench.built[key] = QuantLinear(bench.linear(n_in, n_out), bits, group_size,
                                                   use_kernel=bench.device == "cuda")
        x = bench.randn(1, p["tokens"], n_in)
        return lambda: layer(x)

    def work(config, eb, p):
        n_in, n_out = linear_shapes(config)[name]
        weight_bytes = n_in * n_out * (bits / 8 + 4 / group_size)
        return 2.0 * p["tokens"] * n_in * n_out, weight_bytes + eb * p["tokens"] * (n_in + n_out)
    return Operator(f"int{bits}.{name}", ("tokens",), build, work)


def _build_elementwise(bench: Bench, p: dict):
    c, T = bench.config, p["tokens"]
    norm1, norm2 = RMSNorm(c.hidden, c.norm_eps).to(bench.device), RMSNorm(c.hidden, c.norm_eps).to(bench.device)
    x, attn_out, down = bench.randn(1, T, c.hidden), bench.randn(1, T, c.hidden), bench.randn(1, T, c.hidden)
    qkv = bench.randn(1, T, c.heads + 2 * c.kv_heads, c.head_dim)
    gate_up = bench.randn(1, T, 2 * c.ffn)
    rotation = rope_table(c, bench.device)[torch.arange(T, device=bench.device) % c.max_context][None, :, None]
    cache = bench.randn(1, c.kv_heads, T + 1, c.head_dim)
    index = torch.arange(T, device=bench.device)[None, None, :, None].expand(1, c.kv_heads, T, c.head_dim)

    def layer_elementwise():
        # Block.forward and Attention.forward without their linears and attention.
        norm1(x)
        qk = apply_rope(qkv[:, :, :c.heads + c.kv_heads], rotation).transpose(1, 2)
        k = qk[:, c.heads:]
        cache.scatter_(2, index, k)
        cache.scatter_(2, index, qkv[:, :, c.heads + c.kv_heads:].transpose(1, 2))
        h = x + attn_out
        norm2(h)
        gate, up = gate_up.chunk(2, dim=-1)
        return h + down, torch.nn.functional.silu(gate) * up
    return layer_elementwise


def _elementwise_work(config, eb, p):
    c, T = config, p["tokens"]
    moved = T * (10 * c.hidden + 2 * (c.heads + c.kv_heads) * c.head_dim + 3 * c.ffn + 2 * c.kv_heads * c.head_dim)
    return float(T * (8 * c.hidden + 3 * c.ffn)), float(eb * moved)


def _build_attention(bench: Bench, p: dict):
    """The engine's attention of B requests, each with `query` new tokens at the end of `kv`."""
    c = bench.config
    B, T, S = p.get("batch", 1), p["query"], p["kv"]
    attn = _attention_module(c)
    attn.k_cache = bench.randn(B, c.kv_heads, S + 1, c.head_dim)
    attn.v_cache = bench.randn(B, c.kv_heads, S + 1, c.head_dim)
    q = bench.randn(B, c.heads, T, c.head_dim)
    if bench.device == "cuda":
        import spec_kernels

        kv_lens = torch.full((B,), S, dtype=torch.int32, device=bench.device)
        tree = torch.ones(T, T, dtype=torch.bool, device=bench.device).tril().expand(B, T, T).contiguous()
        return lambda: spec_kernels.attention(q, attn.k_cache, attn.v_cache, kv_lens, tree_mask=tree)
    mask = _causal_mask(B, T, S, bench.device)
    return lambda: attn.attend_full(q, mask)


def _build_partial_attention(bench: Bench, p: dict):
    """Attention of B requests' `query` tokens over `kv` selected slots of a 2 x kv cache."""
    from profiler.engine.model import attend_small_query
    from profiler.engine.partial import attend_selected

    c = bench.config
    B, T, N = p["batch"], p["query"], p["kv"]
    S = 2 * N + T
    k_cache, v_cache = bench.randn(B, c.kv_heads, S, c.head_dim), bench.randn(B, c.kv_heads, S, c.head_dim)
    q = bench.randn(B, c.heads, T, c.head_dim)
    # Selected slots: sorted distinct positions below the new tokens, per request and KV head.
    index = torch.rand(B, c.kv_heads, S - T, generator=bench.generator).argsort(-1)[..., :N].sort(-1).values
    index = index.to(bench.device)
    if bench.device == "cuda":
        import spec_kernels

        kv_lens = torch.full((B,), S, dtype=torch.int32, device=bench.device)
        tree = torch.ones(T, T, dtype=torch.bool, device=bench.device).tril().expand(B, T, T).contiguous()
        lens = torch.full((B,), N, dtype=torch.int32, device=bench.device)
        index32 = index.to(torch.int32)
        return lambda: spec_kernels.attention(q, k_cache, v_cache, kv_lens, tree_mask=tree, kv_index=index32,
                                         kv_index_lens=lens)
    mask = _causal_mask(B, T, S, bench.device)
    rows = torch.arange(B, device=bench.device)
    valid = torch.ones_like(index, dtype=torch.bool)
    return lambda: attend_selected(q, k_cache, v_cache, mask, rows, index, valid, attend_small_query)


def _attention_module(config: LlamaConfig) -> Attention:
    """An Attention without weights (its linears on the meta device): attend_full only reads the
    caches set on it. A shallow copy of one per config: building a module (its linears' meta
    initialisation) cost more than timing a small attention, once per cache-busting copy."""
    key = repr(config)
    if key not in _ATTENTION_TEMPLATES:
        with torch.device("meta"):
            _ATTENTION_TEMPLATES[key] = Attention(config)
    return copy.copy(_ATTENTION_TEMPLATES[key])


_ATTENTION_TEMPLATES: dict[str, Attention] = {}
_MASKS: dict[tuple, torch.Tensor] = {}


def _build_prompt_attention(bench: Bench, p: dict):
    """One prompt's attention over itself, as the engine's prefill runs it (Attention.attend_full
    with no mask: SDPA's causal kernel, on every device)."""
    c = bench.config
    T = p["query"]
    attn = _attention_module(c)
    attn.k_cache = bench.randn(1, c.kv_heads, T + 1, c.head_dim)
    attn.v_cache = bench.randn(1, c.kv_heads, T + 1, c.head_dim)
    q = bench.randn(1, c.heads, T, c.head_dim)
    return lambda: attn.attend_full(q, None)


def _causal_mask(B: int, T: int, S: int, device: str) -> torch.Tensor:
    """[B, 1, T, S]: the T new tokens at the end of S slots (shared by an operator's copies)."""
    key = (B, T, S, device)
    if key not in _MASKS:
        _MASKS.clear()
        positions = (S - T + torch.arange(T, device=device)).expand(B, T)
        _MASKS[key] = causal_mask(positions, S)
    return _MASKS[key]


def _attention_work(config, eb, p):
    c = config
    B, T, S = p.get("batch", 1), p["query"], p["kv"]
    flops = 4.0 * B * c.heads * c.head_dim * T * (S - (T - 1) / 2)
    return flops, float(eb * B * (2 * c.kv_heads * S + 2 * c.heads * T) * c.head_dim)


def _build_summaries(bench: Bench, p: dict):
    c = bench.config
    B, S = p["batch"], p["context"]
    attn = _attention_module(c)
    attn.k_cache = bench.randn(B, c.kv_heads, S + 1, c.head_dim)
    rows = torch.arange(B, device=bench.device)
    lengths = torch.full((B,), S, device=bench.device)
    return lambda: attn.refresh_summaries(rows, lengths, PARTIAL_BLOCK)


def _summaries_work(config, eb, p):
    moved = p["batch"] * config.kv_heads * config.head_dim * p["context"] * (1 + 2 / PARTIAL_BLOCK)
    return float(2 * p["batch"] * config.kv_heads * config.head_dim * p["context"]), float(eb * moved)


def _build_selection(bench: Bench, p: dict):
    from profiler.engine.partial import PartialSpec, PartialStep, select_kv_index

    c = bench.config
    B, S, T = p["batch"], p["context"], SELECTION_QUERY
    spec = PartialSpec(p["budget"], PARTIAL_SINK, PARTIAL_WINDOW, PARTIAL_BLOCK)
    blocks = S // PARTIAL_BLOCK
    k_max, k_min = bench.randn(B, c.kv_heads, blocks, c.head_dim), bench.randn(B, c.kv_heads, blocks, c.head_dim)
    q = bench.randn(B, c.heads, T, c.head_dim)
    dev = bench.device
    step = PartialStep(spec, torch.arange(B, device=dev), torch.full((B,), max(S - PARTIAL_WINDOW, 0), device=dev),
                       torch.full((B,), S + T, device=dev), torch.ones(B, T, dtype=torch.bool, device=dev))
    return lambda: select_kv_index(q, k_max, k_min, step)


def _selection_work(config, eb, p):
    blocks = p["context"] / PARTIAL_BLOCK
    flops = 4.0 * p["batch"] * config.heads * SELECTION_QUERY * blocks * config.head_dim
    return flops, float(eb * p["batch"] * 2 * config.kv_heads * blocks * config.head_dim)


def _build_ngram(bench: Bench, p: dict):
    from profiler.engine.drafters import NgramDrafter

    # Random tokens rarely repeat: the lookup scans the whole history for every n-gram length, the
    # worst case of prompt lookup (text with repetitions finds a match sooner).
    history = torch.randint(0, bench.config.vocab, (p["context"],), generator=bench.generator).tolist()
    drafter = NgramDrafter()
    return lambda: drafter.lookup_many(history, 4, 1)


def _build_accept(bench: Bench, p: dict):
    from profiler.engine.speculative import _verify_chains

    B, L = p["batch"], p["tokens"]
    if bench.device == "cpu":
        logits = torch.randn(B, L, bench.config.vocab, generator=bench.generator)
    else:                                  # drawn on the device (Bench.randn), as the engine's fp32 logits
        logits = bench.randn(B, L, bench.config.vocab).float()
    nodes = torch.randint(0, bench.config.vocab, (B, L - 1), generator=bench.generator).to(bench.device) \
        if L > 1 else None
    return lambda: _verify_chains(logits, nodes, None, None)


def _build_h2d(pinned: bool):
    def build(bench: Bench, p: dict):
        host = torch.randn(p["bytes"] // 4, generator=bench.generator)
        if pinned:
            host = host.pin_memory()
        device_buffer = torch.empty_like(host, device="cuda")
        return lambda: device_buffer.copy_(host, non_blocking=pinned)
    return build


def _lm_head_build(bench: Bench, p: dict):
    c = bench.config
    norm, head = RMSNorm(c.hidden, c.norm_eps).to(bench.device), bench.linear(c.hidden, c.vocab)
    x = bench.randn(1, p["tokens"], c.hidden)
    return lambda: fp32_logits(norm(x), head.weight)


_BASE_MODELS: dict[tuple, nn.Module] = {}


def _build_forward_base(bench: Bench, p: dict):
    from dataclasses import replace

    from profiler.engine.loaders import random_model

    B, T, S = p["batch"], p["query"], p["kv"]
    key = (bench.config, bench.dtype, bench.device)
    if key not in _BASE_MODELS:      # the embedding is too large to build for every point
        _BASE_MODELS.clear()
        _BASE_MODELS[key] = random_model(replace(bench.config, layers=0), bench.dtype, bench.device).model
    model = _BASE_MODELS[key]
    model.setup_cache(B, S)
    tokens = torch.randint(0, bench.config.vocab, (B, T), generator=bench.generator).to(bench.device)
    positions = (S - T + torch.arange(T)).expand(B, T).to(bench.device)
    return lambda: model.embed_inputs(tokens, positions)


def _no_flops(bytes_of):
    return lambda config, eb, p: (0.0, float(bytes_of(config, eb, p)))


OPERATORS: dict[str, Operator] = {op.name: op for op in [
    *(_linear_op(n) for n in ("qkv", "o", "gate_up", "down")),
    *(_quant_op(n, bits) for bits in (8, 4) for n in ("qkv", "o", "gate_up", "down")),
    Operator("elementwise", ("tokens",), _build_elementwise, _elementwise_work),
    Operator("attention", ("batch", "query", "kv"), _build_attention, _attention_work),
    Operator("attention_prefill", ("query", "kv"), _build_attention, _attention_work),
    Operator("attention_prompt", ("query",), _build_prompt_attention, lambda c, eb, p: _attention_work(c, eb, {**p, "kv": p["query"]})),
    Operator("attention_partial", ("batch", "query", "kv"), _build_partial_attention, _attention_work),
    Operator("lm_head", ("tokens",), _lm_head_build,
             lambda c, eb, p: (2.0 * p["tokens"] * c.hidden * c.vocab,
                               eb * (c.hidden * c.vocab + p["tokens"] * c.hidden) + 4 * p["tokens"] * c.vocab)),
    Operator("forward_base", ("batch", "query", "kv"), _build_forward_base,
             _no_flops(lambda c, eb, p: eb * p["batch"] * p["query"] * c.hidden + p["batch"] * p["query"] * p["kv"])),
    Operator("summaries", ("batch", "context"), _build_summaries, _summaries_work),
    Operator("selection", ("batch", "context", "budget"), _build_selection, _selection_work),
    Operator("ngram", ("context",), _build_ngram, lambda c, eb, p: (0.0, 0.0), host=True),
    Operator("accept", ("batch", "tokens"), _build_accept, _no_flops(lambda c, eb, p: 4 * p["batch"] * p["tokens"] * c.vocab)),
    Operator("h2d_pinned", ("bytes",), _build_h2d(True), _no_flops(lambda c, eb, p: p["bytes"]), cuda_only=True),
    Operator("h2d_pageable", ("bytes",), _build_h2d(False), _no_flops(lambda c, eb, p: p["bytes"]), cuda_only=True),
]}
