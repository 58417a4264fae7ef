"""Decode, verify and draft forwards replayed from CUDA graphs, per batch bucket and query length.

An eager forward of a Llama issues a dozen launches per layer; at batch 1 an 8B's step reads its
16 GB of weights in about 4 ms on an H100, while the host takes longer than that to issue 32
layers' launches, so the GPU waits on Python. Serving engines capture each step shape once as a
CUDA graph and replay it in one launch (vLLM, SGLang); this does the same for the live engine:
  - a graph holds the decoder layers of one shape: (rows, T new tokens per row). Rows are padded
    up to the next capture size (vLLM's: 1, 2, 4, then multiples of 8, then of 16), so a batch
    that shrinks as requests finish replays a captured graph instead of capturing anew; the final
    norm and LM head run eagerly on the real rows' selected tokens, as vLLM computes logits
    outside its graphs (a [rows, T, vocab] output per graph would hold gigabytes);
  - every input lives in a static buffer the graph reads (tokens, positions, cache slots, each
    row's KV length and the new tokens' mask); a step copies its rows in and resets the padding
    rows, whose K/V go to the cache's last slot (the trash slot no query reads);
  - a graph is bound to the memory it read and wrote at capture (every layer's KV cache, the
    rotary table: `bound_memory`); when that changes the graphs are dropped. With graphs on,
    Llama.setup_cache keeps a cache of exactly the asked shape, so a warm-up and the timed run of
    the same cache size share one, and the warm-up captures;
  - the first use of a T captures every capture size up to the cache's rows at once (`prepare`),
    under inference mode whoever calls it (the layers write a KV cache made under `serve`'s), with
    one synchronize and one emptying of the allocator's cache before the batch of captures, not one
    per capture (as vLLM patches torch.cuda.graph's per-capture ones out); `exact_rows` captures the
    one size asked instead (calibration times exactly its batch);
  - nothing of Python runs at a replay: the model's module hooks never fire inside a capture (the
    layers are called through `hidden_states`, not the module's __call__), and what callers of a
    replay need (kept_hidden) is set by `forward` after it. `replay_hooks` stand for the forward
    hooks a timer (profiler.calibrate.timing.timed_forwards) would put on the model.
Only forwards the attention kernel (spec_kernels.attention) expresses as "T new tokens at
consecutive slots ending at kv_len, this T x T mask among them" are captured: decode, chain and
tree verification, chain drafts. SpecPV's partial verification and re-fed full verifications read
their shapes off the data and run eagerly.

On the CPU the same code pads and runs the layers on the static buffers without a graph (what the
tests check: padding and buffers give the unpadded forward's tokens); a "capture" there sets the
buffers up and runs the layers once, as a CUDA capture's warm-up does, and is counted like one.

A StepGraphs holds its model weakly: the model holds it (Llama.step_graphs), and a strong link back
would keep a discarded model (a draft head, 0.5 GB and its graphs' memory on an 8B) alive until the
cyclic garbage collector happened to run.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from profiler.engine.model import KernelLayout, Llama


# The profiler range around a capture (what a launch count excludes).
CAPTURE_RANGE = "graph_capture"


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
    hidden: Tensor | None = None      # [R, T, hidden]: the layers' output (the graph's)
    graph: object = None              # torch.cuda.CUDAGraph


@dataclass
class StepGraphs:
    """The captured forwards of one model over its current KV cache (module docstring)."""
    model_ref: weakref.ref               # the Llama (held weakly: module docstring)
    cuda: bool
    exact_rows: bool = False           # capture sizes: vLLM's buckets, or exactly the rows asked
    captured: dict[tuple[int, int], _Captured] = field(default_factory=dict)    # (rows, T) ->
    bound_to: tuple = ()               # the memory the graphs read and write (bound_memory)
    sizes: list[int] = field(default_factory=list)     # capture sizes of the bound cache's rows
    pool: object = None                # the graphs' shared memory pool (they replay one at a time)
    captures: int = 0                  # graphs captured so far, and their seconds
    capture_s: float = 0.0
    # Called before and after each forward (copy-in, replay, logits), as a module's forward hooks
    # around a forward: what profiler.calibrate.timing.timed_forwards times.
    replay_hooks: list[tuple[Callable[[], None], Callable[[], None]]] = field(default_factory=list)
    stream: object = None              # the side stream captures run on (CUDA)

    @property
    def model(self) -> Llama:
        return self.model_ref()

    def __deepcopy__(self, memo) -> "StepGraphs":
        """A copied model's graphs: none captured yet, bound to the copy (a graph replays the memory
        it captured, the original's), which `copy.deepcopy` has made before it copies this."""
        copy = memo.get(id(self.model))
        if copy is None:
            raise ValueError("StepGraphs are copied with their model (copy.deepcopy of the model)")
        return StepGraphs(weakref.ref(copy), cuda=self.cuda, exact_rows=self.exact_rows)

    @torch.inference_mode()
    def forward(self, tokens: Tensor, positions: Tensor, slots: Tensor, kernel: KernelLayout,
                logits_at: Tensor) -> Tensor | None:
        """Logits [M, L, V] of the model's forward over these inputs (tokens, positions, slots:
        [M, T]; kernel: kv_lens [M], tree_mask [M, T, T]; logits_at [M, L]), its layers replayed;
        None when no capture size holds M rows (the caller runs it eagerly)."""
        M, T = tokens.shape
        entry = self.entry(M, T)
        if entry is None:
            return None
        for before, _ in self.replay_hooks:
            before()
        entry.tokens[:M].copy_(tokens)
        entry.positions[:M].copy_(positions)
        entry.slots[:M].copy_(slots)
        entry.kv_lens[:M].copy_(kernel.kv_lens)
        entry.tree_mask[:M].copy_(kernel.tree_mask)
        if M < entry.rows:
            self.pad(entry, M)
        if entry.graph is not None:
            entry.graph.replay()
        else:                              # the CPU: the same buffers, no graph
            self.run(entry)
        hidden = entry.hidden[:M]
        if self.model.keep_hidden:
            self.model.kept_hidden = hidden
        logits = self.model.logits(hidden, logits_at=logits_at)
        for _, after in self.replay_hooks:
            after()
        return logits

    def entry(self, M: int, T: int) -> _Captured | None:
        """The captured shape that replays M rows of T tokens (capturing what is missing), or None."""
        self.bind()
        if M > self.sizes[-1]:
            return None
        size = M if self.exact_rows else next(s for s in self.sizes if s >= M)
        if (size, T) not in self.captured:
            self.prepare(T, [size] if self.exact_rows else None)
        return self.captured[(size, T)]

    @torch.inference_mode()
    def prepare(self, T: int, sizes: list[int] | None = None) -> None:
        """Capture the forwards of T new tokens per row at `sizes` (default: every capture size of
        the bound cache) that are not captured yet, largest first."""
        self.bind()
        missing = [size for size in sorted(sizes or self.sizes, reverse=True) if (size, T) not in self.captured]
        if missing and self.cuda:
            # What torch.cuda.graph does before every capture, done once for the batch of them.
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        for size in missing:
            self.captured[(size, T)] = self.capture(size, T)
        if missing and self.cuda:
            torch.cuda.synchronize()

    def bind(self) -> None:
        """Follow the model's current cache: graphs bound to other memory are dropped."""
        memory = bound_memory(self.model)
        if memory != self.bound_to:
            self.drop()
            self.bound_to, self.sizes = memory, capture_sizes(self.model.layers[0].attention.k_cache.shape[0])

    def pad(self, entry: _Captured, first: int) -> None:
        """Padding rows first..: their K/V to the trash slot, a KV length of T (the kernel reads
        keys below it), position 0; what a padding row computes is dropped."""
        T = entry.tokens.shape[1]
        entry.slots[first:].fill_(self.model.layers[0].attention.k_cache.shape[2] - 1)
        entry.positions[first:].zero_()
        entry.kv_lens[first:].fill_(T)

    def run(self, entry: _Captured) -> None:
        # The layers alone, not the module's __call__: no hook fires (a timer's synchronize inside a
        # capture would end it).
        entry.hidden = self.model.hidden_states(entry.tokens, entry.positions, slots=entry.slots,
                                                kernel=KernelLayout(entry.kv_lens, entry.tree_mask))

    def capture(self, rows: int, T: int) -> _Captured:
        """Static buffers for (rows, T), every row padding at first, and the layers run on them: on
        CUDA twice on a side stream (Triton compiles, cuBLAS sizes its workspaces) and then captured
        there; on the CPU once."""
        device = self.model.lm_head.weight.device
        long = dict(dtype=torch.long, device=device)
        entry = _Captured(rows, torch.zeros(rows, T, **long), torch.zeros(rows, T, **long),
                          torch.zeros(rows, T, **long), torch.zeros(rows, dtype=torch.int32, device=device),
                          torch.ones(rows, T, T, dtype=torch.bool, device=device).tril())
        self.pad(entry, 0)
        started = time.perf_counter()
        # A profiler range of its own: a launch count leaves the capture's launches out
        # (profiler.live.launches).
        with torch.profiler.record_function(CAPTURE_RANGE):
            if self.cuda:
                self.capture_on_side_stream(entry)
            else:
                self.run(entry)
        self.captures += 1
        self.capture_s += time.perf_counter() - started
        return entry

    def capture_on_side_stream(self, entry: _Captured) -> None:
        """torch.cuda.graph's capture without its synchronize and cache flush (`prepare` does those
        once for all the captures it makes): the warm-up and the capture on one side stream, into
        the graphs' shared pool."""
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        self.stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            for _ in range(2):
                self.run(entry)
            graph.capture_begin(self.pool)
            try:
                self.run(entry)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(self.stream)
        entry.graph = graph

    def drop(self) -> None:
        """The memory the graphs are bound to is gone: release them (and their pool)."""
        self.captured.clear()
        self.pool = None
        self.bound_to = ()


def bound_memory(model: Llama) -> tuple:
    """What a captured forward reads and writes besides its weights and static buffers: every
    layer's KV cache and the rotary table, by address and shape. A graph replays raw addresses, so
    it stays valid exactly while these are the same (a shadow draft's caches are the target's,
    re-linked at every run; the caching allocator may hand a new cache the old one's address)."""
    caches = [t for layer in model.layers for t in (layer.attention.k_cache, layer.attention.v_cache)]
    return (tuple(t.data_ptr() for t in caches), tuple(caches[0].shape), model.rope.data_ptr())


def enable_graphs(model: Llama, exact_rows: bool | None = None) -> StepGraphs:
    """Capture and replay `model`'s kernel-path forwards from now on (idempotent); with graphs on,
    Llama.setup_cache keeps a cache of the asked shape (module docstring). exact_rows: capture
    exactly the rows each forward has, no padding to vLLM's sizes (None: as set before, else no)."""
    if model.step_graphs is None:
        model.step_graphs = StepGraphs(weakref.ref(model), cuda=model.lm_head.weight.is_cuda)
    if exact_rows is not None and model.step_graphs.exact_rows != exact_rows:
        model.step_graphs.drop()
        model.step_graphs.exact_rows = exact_rows
    return model.step_graphs


def disable_graphs(model: Llama) -> None:
    if model.step_graphs is not None:
        model.step_graphs.drop()
    model.step_graphs = None


def forward_new_tokens(model: Llama, tokens: Tensor, positions: Tensor, slots: Tensor, kernel: KernelLayout,
                       logits_at: Tensor) -> Tensor:
    """Logits [M, L, V] of a forward whose T new tokens per row sit at consecutive cache slots ending
    at kernel.kv_lens - 1 (the attention kernel's layout): its layers replayed from a graph when the
    model has them on and one holds the rows, else eager."""
    if model.step_graphs is not None:
        logits = model.step_graphs.forward(tokens, positions, slots, kernel, logits_at)
        if logits is not None:
            return logits
    return model(tokens, positions, slots=slots, logits_at=logits_at, kernel=kernel)


def chain_mask(T: int, device) -> Tensor:
    """[T, T] bool: T consecutive new tokens, each seeing itself and those before it."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()
