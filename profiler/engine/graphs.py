"""Decode, verify and draft forwards replayed from CUDA graphs, per batch bucket and query length.

An eager forward of a Llama issues a dozen launches per layer; at batch 1 an 8B's step reads its
16 GB of weights in about 4 ms on an H100, while the host takes longer than that to issue 32
layers' launches, so the GPU waits on Python. Serving engines capture each step shape once as a
CUDA graph and replay it in one launch (vLLM, SGLang); this does the same for the live engine:
  - a forward's shape is (rows, new tokens T per row, logits L per row). Rows are padded up to the
    next capture size (vLLM's: 1, 2, 4, then multiples of 8, then of 16), so a batch that shrinks
    as requests finish replays a captured graph instead of capturing anew;
  - every input lives in a static buffer the graph reads (tokens, positions, cache slots, each
    row's KV length and the new tokens' mask); a step copies its rows in and resets the padding
    rows, whose K/V go to the cache's last slot (the trash slot no query reads) and whose logits
    are dropped;
  - the graph is bound to the model's KV cache tensors: a new cache (Llama.setup_cache with other
    rows, or longer) drops the graphs, and with graphs on, setup_cache keeps a cache that is large
    enough, so a warm-up and the timed run share one;
  - the first use of a (T, L) shape captures every capture size up to the cache's rows at once
    (a warm-up pass takes that time; the timed run replays).
Only forwards the attention kernel (spec_kernels.attention) expresses as "T new tokens at
consecutive slots ending at kv_len, this T x T mask among them" are captured: decode, chain and
tree verification, chain drafts. SpecPV's partial verification and re-fed full verifications read
their shapes off the data and run eagerly.

On the CPU the same code pads and runs the forward on the static buffers without a graph (what
the tests check: padding and buffers give the unpadded forward's logits).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from profiler.engine.model import KernelLayout, Llama


def capture_sizes(rows: int) -> list[int]:
    """Batch buckets up to `rows` (vLLM's default capture sizes: 1, 2, 4, 8, 16, ... 256 by 8,
    then by 16), the last one `rows` itself when it falls between two."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 4097, 16))
    kept = [s for s in sizes if s < rows]
    return kept + [rows]


@dataclass
class _Captured:
    """One captured shape: its static inputs, its output, and the graph (None on the CPU)."""
    rows: int
    tokens: Tensor            # [R, T] int64
    positions: Tensor         # [R, T] int64
    slots: Tensor             # [R, T] int64
    kv_lens: Tensor           # [R] int32
    tree_mask: Tensor         # [R, T, T] bool
    logits_at: Tensor         # [R, L] int64
    logits: Tensor | None = None      # [R, L, V] fp32: the graph's output
    hidden: Tensor | None = None      # [R, T, hidden]: the last layer's states, when the model keeps them
    graph: object = None              # torch.cuda.CUDAGraph


@dataclass
class StepGraphs:
    """The captured forwards of one model over its current KV cache (module docstring)."""
    model: Llama
    cuda: bool
    captured: dict[tuple[int, int, int], _Captured] = field(default_factory=dict)
    bound_to: tuple = ()               # the memory the graphs read and write (bound_memory)
    pool: object = None                # the graphs' shared memory pool (they replay one at a time)
    captures: int = 0                  # graphs captured so far, and their seconds
    capture_s: float = 0.0
    # Called before and after each graph replay, as a module's forward hooks around a forward (a
    # replay does not call the model): what profiler.calibrate.timing.timed_forwards times.
    replay_hooks: list[tuple[Callable[[], None], Callable[[], None]]] = field(default_factory=list)

    def forward(self, tokens: Tensor, positions: Tensor, slots: Tensor, kernel: KernelLayout,
                logits_at: Tensor) -> Tensor | None:
        """Logits [M, L, V] of the model's forward over these inputs (tokens, positions, slots:
        [M, T]; kernel: kv_lens [M], tree_mask [M, T, T]; logits_at [M, L]), replayed; None when
        no capture size holds M rows (the caller runs it eagerly)."""
        M, T = tokens.shape
        L = logits_at.shape[1]
        rows = self.model.layers[0].attention.k_cache.shape[0]
        if M > rows:
            return None
        memory = bound_memory(self.model)
        if memory != self.bound_to:
            self.drop()
            self.bound_to = memory
        bucket = next(s for s in capture_sizes(rows) if s >= M)
        if (bucket, T, L) not in self.captured:
            for size in capture_sizes(rows):
                self.captured[(size, T, L)] = self.capture(size, T, L)
        entry = self.captured[(bucket, T, L)]
        entry.tokens[:M].copy_(tokens)
        entry.positions[:M].copy_(positions)
        entry.slots[:M].copy_(slots)
        entry.kv_lens[:M].copy_(kernel.kv_lens)
        entry.tree_mask[:M].copy_(kernel.tree_mask)
        entry.logits_at[:M].copy_(logits_at)
        if M < bucket:
            self.pad(entry, M)
        if entry.graph is not None:
            for before, _ in self.replay_hooks:
                before()
            entry.graph.replay()
            for _, after in self.replay_hooks:
                after()
        else:                              # the CPU: the model runs, its own hooks with it
            self.run(entry)
        if entry.hidden is not None:
            self.model.kept_hidden = entry.hidden[:M]
        return entry.logits[:M]

    def pad(self, entry: _Captured, first: int) -> None:
        """Padding rows first..: their one K/V to the trash slot, a KV length of T (the kernel reads
        keys below it), position 0 and a causal mask; what a padding row computes is dropped."""
        T = entry.tokens.shape[1]
        entry.slots[first:].fill_(self.model.layers[0].attention.k_cache.shape[2] - 1)
        entry.positions[first:].zero_()
        entry.kv_lens[first:].fill_(T)

    def run(self, entry: _Captured) -> None:
        entry.logits = self.model(entry.tokens, entry.positions, slots=entry.slots, logits_at=entry.logits_at,
                                  kernel=KernelLayout(entry.kv_lens, entry.tree_mask))
        entry.hidden = self.model.kept_hidden if self.model.keep_hidden else None

    def capture(self, rows: int, T: int, L: int) -> _Captured:
        """Static buffers for (rows, T, L), every row padding at first; on CUDA the forward warmed up
        on a side stream (Triton compiles there) and captured."""
        device = self.model.lm_head.weight.device
        long = dict(dtype=torch.long, device=device)
        entry = _Captured(rows, torch.zeros(rows, T, **long), torch.zeros(rows, T, **long),
                          torch.zeros(rows, T, **long), torch.zeros(rows, dtype=torch.int32, device=device),
                          torch.ones(rows, T, T, dtype=torch.bool, device=device).tril(),
                          torch.zeros(rows, L, **long))
        self.pad(entry, 0)
        if not self.cuda:
            return entry
        started = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.run(entry)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.run(entry)
        entry.graph = graph
        torch.cuda.synchronize()
        self.captures += 1
        self.capture_s += time.perf_counter() - started
        return entry

    def drop(self) -> None:
        """The cache the graphs write is gone: release them (and their memory)."""
        self.captured.clear()
        self.pool = None


def bound_memory(model: Llama) -> tuple:
    """What a captured forward reads and writes besides its weights and static buffers: every
    layer's KV cache and the rotary table, by address and shape. A graph replays raw addresses, so
    it stays valid exactly while these are the same (a shadow draft's caches are the target's,
    re-linked at every run; the caching allocator may hand a new cache the old one's address)."""
    caches = [t for layer in model.layers for t in (layer.attention.k_cache, layer.attention.v_cache)]
    return (tuple(t.data_ptr() for t in caches), tuple(caches[0].shape), model.rope.data_ptr())


def enable_graphs(model: Llama) -> StepGraphs:
    """Capture and replay `model`'s kernel-path forwards from now on (idempotent); with graphs on,
    Llama.setup_cache keeps a large enough cache (module docstring)."""
    if model.step_graphs is None:
        model.step_graphs = StepGraphs(model, cuda=model.lm_head.weight.is_cuda)
    return model.step_graphs


def disable_graphs(model: Llama) -> None:
    if model.step_graphs is not None:
        model.step_graphs.drop()
    model.step_graphs = None


def forward_new_tokens(model: Llama, tokens: Tensor, positions: Tensor, slots: Tensor, kernel: KernelLayout,
                       logits_at: Tensor) -> Tensor:
    """Logits [M, L, V] of a forward whose T new tokens per row sit at consecutive cache slots ending
    at kernel.kv_lens - 1 (the attention kernel's layout): replayed from a graph when the model has
    them on and one holds the rows, else eager."""
    if model.step_graphs is not None:
        logits = model.step_graphs.forward(tokens, positions, slots, kernel, logits_at)
        if logits is not None:
            return logits
    return model(tokens, positions, slots=slots, logits_at=logits_at, kernel=kernel)


def chain_mask(T: int, device) -> Tensor:
    """[T, T] bool: T consecutive new tokens, each seeing itself and those before it."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()
